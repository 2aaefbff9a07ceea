/*
 * hvdrun's host lists (launcher/hosts.c, discovery.c): -H's "h1:2,h2:4",
 * a hostfile's "host slots=N" lines, and a discovery script's output. Each
 * input is given to all three. Whatever parses must hold only valid names
 * and slot counts, each host once, and must read back the same from the
 * canonical text; a -H list must also assign its ranks.
 */
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "hvdrun.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  hvd_log_set_level(HVD_LOG_FATAL);
  return 0;
}

static void check_hosts(const struct hvdrun_host *h, size_t n, bool strict_names) {
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(h[i].name);
    FUZZ_CHECK(len >= 1 && len <= HVDRUN_HOST_MAX, "host %zu has a %zu-byte name", i, len);
    FUZZ_CHECK(h[i].slots >= 1 && h[i].slots <= HVDRUN_MAX_RANKS, "host %zu has %d slots", i,
               h[i].slots);
    FUZZ_CHECK(h[i].name[0] != '-', "host %zu looks like an option", i);
    for (size_t k = 0; k < len; k++) {
      unsigned char c = (unsigned char)h[i].name[k];
      FUZZ_CHECK(c > ' ' && c != 0x7f && c != ':' && (!strict_names || c != ','),
                 "host %zu has byte 0x%02x in its name", i, c);
    }
    for (size_t j = 0; j < i; j++)
      FUZZ_CHECK(strcmp(h[i].name, h[j].name) != 0, "host '%s' is listed twice", h[i].name);
  }
}

static bool same_hosts(const struct hvdrun_host *a, size_t na, const struct hvdrun_host *b,
                       size_t nb) {
  if (na != nb)
    return false;
  for (size_t i = 0; i < na; i++) {
    if (strcmp(a[i].name, b[i].name) != 0 || a[i].slots != b[i].slots)
      return false;
  }
  return true;
}

static void check_assign(const struct hvdrun_host *h, size_t n) {
  struct hvdrun_slot *slots = NULL;
  long total = 0;
  int size = 0;

  for (size_t i = 0; i < n; i++)
    total += h[i].slots;
  if (hvdrun_assign(h, n, -1, &slots, &size) != HVD_OK) {
    FUZZ_CHECK(total > HVDRUN_MAX_RANKS, "%ld slots were not assigned", total);
    return;
  }
  FUZZ_CHECK(size == total, "%d ranks for %ld slots", size, total);
  for (int r = 0; r < size; r++) {
    const struct hvdrun_slot *s = &slots[r];
    FUZZ_CHECK(s->rank == r && s->size == size && s->host >= 0 && (size_t)s->host < n &&
                   s->local_rank >= 0 && s->local_rank < s->local_size &&
                   s->local_size <= h[s->host].slots && s->cross_rank >= 0 &&
                   s->cross_rank < s->cross_size,
               "rank %d's place is inconsistent", r);
  }
  free(slots);
}

/* -H: "name[:slots],..." */
static void fuzz_dash_h(const char *text) {
  struct hvdrun_host *hosts = NULL, *again = NULL;
  size_t n = 0, m = 0;
  struct hvd_buf canon;

  if (hvdrun_parse_hosts(text, &hosts, &n) != HVD_OK)
    return;
  FUZZ_CHECK(n > 0, "an empty host list was accepted");
  check_hosts(hosts, n, true);
  check_assign(hosts, n);
  hvd_buf_init(&canon, 0);
  for (size_t i = 0; i < n; i++)
    FUZZ_CHECK(hvd_buf_printf(&canon, "%s%s:%d", i ? "," : "", hosts[i].name, hosts[i].slots) ==
                   HVD_OK,
               "out of memory");
  FUZZ_CHECK(hvdrun_parse_hosts(canon.data, &again, &m) == HVD_OK, "'%s': %s", canon.data,
             hvd_last_error_message());
  FUZZ_CHECK(same_hosts(hosts, n, again, m), "'%s' reads back differently", canon.data);
  hvd_buf_fini(&canon);
  free(again);
  free(hosts);
}

/* --hostfile: the parser reads a path, so the input goes in a memory file. */
static void fuzz_hostfile(const uint8_t *data, size_t size) {
  struct hvdrun_host *hosts = NULL;
  size_t n = 0;
  char path[64];
  int fd = memfd_create("hostfile", MFD_CLOEXEC);

  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  FUZZ_CHECK(write(fd, data, size) == (ssize_t)size, "short write");
  snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  if (hvdrun_read_hostfile(path, &hosts, &n) == HVD_OK) {
    FUZZ_CHECK(n > 0, "a hostfile without hosts was accepted");
    check_hosts(hosts, n, true);
    free(hosts);
  }
  close(fd);
}

/* A discovery script's output: "name[:slots]" lines. */
static void fuzz_discovery(const uint8_t *data, size_t size) {
  struct hvdrun_host *hosts = NULL, *again = NULL;
  size_t n = 0, m = 0;
  struct hvd_buf canon;

  if (hvdrun_parse_discovery((const char *)data, size, 3, &hosts, &n) != HVD_OK)
    return;
  check_hosts(hosts, n, false);
  hvd_buf_init(&canon, 0);
  for (size_t i = 0; i < n; i++)
    FUZZ_CHECK(hvd_buf_printf(&canon, "%s:%d\n", hosts[i].name, hosts[i].slots) == HVD_OK,
               "out of memory");
  FUZZ_CHECK(hvdrun_parse_discovery(canon.data != NULL ? canon.data : "", canon.len, 3, &again,
                                    &m) == HVD_OK,
             "'%s': %s", canon.data, hvd_last_error_message());
  FUZZ_CHECK(same_hosts(hosts, n, again, m), "'%s' reads back differently", canon.data);
  hvd_buf_fini(&canon);
  free(again);
  free(hosts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);

  FUZZ_CHECK(text != NULL, "out of memory");
  memcpy(text, data, size);
  text[size] = '\0';
  fuzz_dash_h(text);
  fuzz_hostfile(data, size);
  fuzz_discovery(data, size);
  free(text);
  return 0;
}
