/*
 * Hosts, slots and which rank goes where.
 *
 * DESIGN. Horovod's assignment, so that users get the ranks they expect:
 * hosts in the order given, each host's slots in order, consecutive global
 * ranks; a rank's cross rank is its host's position among the hosts that
 * have its local rank, so hosts with fewer slots make smaller cross groups.
 * -np caps the ranks (the last host may be partly used); asking for more
 * ranks than slots is an error. A host may appear once.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvdrun.h"
#include "transport/transport.h"

static bool name_ok(const char *name, size_t len) {
  /* A leading '-' would reach ssh as an option (found by tests/fuzz;
   * discovery.c refuses it too). */
  if (len == 0 || len > HVDRUN_HOST_MAX || name[0] == '-')
    return false;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)name[i];
    if (!(isalnum(c) || c == '.' || c == '-' || c == '_'))
      return false;
  }
  return true;
}

static hvd_status add_host(struct hvdrun_host **hosts, size_t *n, size_t *cap, const char *name,
                           size_t len, int slots, const char *where) {
  struct hvdrun_host *h;

  if (!name_ok(name, len))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s: '%.*s' is not a host name (letters, digits, '.', '-', '_', not "
                     "starting with '-')",
                     where, (int)(len > 300 ? 300 : len), name);
  for (size_t i = 0; i < *n; i++) {
    if (strlen((*hosts)[i].name) == len && strncmp((*hosts)[i].name, name, len) == 0)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: host '%.*s' is listed twice", where,
                       (int)len, name);
  }
  if (hvd_array_reserve(hosts, cap, *n + 1, sizeof(**hosts), 8) != HVD_OK)
    return hvd_error_prefix("%s", where);
  h = &(*hosts)[(*n)++];
  memcpy(h->name, name, len);
  h->name[len] = '\0';
  h->slots = slots;
  return HVD_OK;
}

/* A slot count: a whole number 1 .. HVDRUN_MAX_RANKS. */
static bool slots_ok(const char *text, size_t len, int *out) {
  long v = 0;
  if (len == 0 || len > 6)
    return false;
  for (size_t i = 0; i < len; i++) {
    if (!isdigit((unsigned char)text[i]))
      return false;
    v = v * 10 + (text[i] - '0');
  }
  if (v < 1 || v > HVDRUN_MAX_RANKS)
    return false;
  *out = (int)v;
  return true;
}

hvd_status hvdrun_parse_hosts(const char *text, struct hvdrun_host **out, size_t *n) {
  struct hvdrun_host *hosts = NULL;
  size_t count = 0, cap = 0;
  const char *p = text;
  hvd_status st = HVD_OK;

  if (*text == '\0')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "-H: empty host list");
  while (st == HVD_OK) {
    size_t len = strcspn(p, ",");
    const char *colon = memchr(p, ':', len);
    int slots = 1;
    if (colon != NULL && !slots_ok(colon + 1, len - (size_t)(colon + 1 - p), &slots))
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "-H: '%.*s': the slots after ':' must be a number from 1 to %d (as in "
                     "host1:2,host2:2)",
                     (int)len, p, HVDRUN_MAX_RANKS);
    else
      st = add_host(&hosts, &count, &cap, p, colon != NULL ? (size_t)(colon - p) : len, slots,
                    "-H");
    if (p[len] == '\0')
      break;
    p += len + 1;
  }
  if (st != HVD_OK) {
    free(hosts);
    return st;
  }
  *out = hosts;
  *n = count;
  return HVD_OK;
}

hvd_status hvdrun_read_hostfile(const char *path, struct hvdrun_host **out, size_t *n) {
  FILE *f = fopen(path, "r");
  struct hvdrun_host *hosts = NULL;
  size_t count = 0, cap = 0;
  char line[1024], where[64 + 1024];
  int lineno = 0;
  hvd_status st = HVD_OK;

  if (f == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "--hostfile: cannot open '%s': %s", path,
                     strerror(errno));
  while (st == HVD_OK && fgets(line, sizeof(line), f) != NULL) {
    char *p = line, *name, *rest;
    size_t len;
    int slots = 1;
    lineno++;
    snprintf(where, sizeof(where), "%s line %d", path, lineno);
    if (strchr(line, '\n') == NULL && !feof(f)) {
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: line too long", where);
      break;
    }
    p[strcspn(p, "#\r\n")] = '\0';
    p += strspn(p, " \t");
    if (*p == '\0')
      continue;
    name = p;
    len = strcspn(p, " \t");
    rest = p + len;
    rest += strspn(rest, " \t");
    if (*rest != '\0') {
      size_t vlen;
      if (strncmp(rest, "slots=", 6) != 0) {
        st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: expected 'host slots=N', got '%s'", where,
                       name);
        break;
      }
      rest += 6;
      vlen = strcspn(rest, " \t");
      if (!slots_ok(rest, vlen, &slots) || rest[vlen + strspn(rest + vlen, " \t")] != '\0') {
        st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: slots must be a number from 1 to %d",
                       where, HVDRUN_MAX_RANKS);
        break;
      }
    }
    st = add_host(&hosts, &count, &cap, name, len, slots, where);
  }
  fclose(f);
  if (st == HVD_OK && count == 0)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "--hostfile: '%s' lists no hosts", path);
  if (st != HVD_OK) {
    free(hosts);
    return st;
  }
  *out = hosts;
  *n = count;
  return HVD_OK;
}

void hvdrun_each_scope(const struct hvdrun_host *hosts, const struct hvdrun_slot *slots, int size,
                       uint64_t generation,
                       void (*fn)(void *arg, const char *scope, size_t ranks), void *arg) {
  char prefix[32], scope[HVDRUN_HOST_MAX + 64];

  net_generation_prefix(generation, prefix, sizeof(prefix));
  snprintf(scope, sizeof(scope), "%sglobal", prefix);
  fn(arg, scope, (size_t)size);
  for (int r = 0; r < size; r++) {
    const struct hvdrun_slot *s = &slots[r];
    if (s->local_rank == 0) {
      snprintf(scope, sizeof(scope), "%slocal_%s", prefix, hosts[s->host].name);
      fn(arg, scope, (size_t)s->local_size);
    }
    if (s->cross_rank == 0) {
      snprintf(scope, sizeof(scope), "%scross_%d", prefix, s->local_rank);
      fn(arg, scope, (size_t)s->cross_size);
    }
  }
}

hvd_status hvdrun_assign(const struct hvdrun_host *hosts, size_t nhosts, int np,
                         struct hvdrun_slot **out, int *nslots) {
  long total = 0;
  int size, rank = 0, max_slots = 0;
  struct hvdrun_slot *slots;
  int *cross_count;

  for (size_t h = 0; h < nhosts; h++) {
    total += hosts[h].slots;
    if (hosts[h].slots > max_slots)
      max_slots = hosts[h].slots;
  }
  if (np > total)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "-np %d asks for more ranks than the %ld slots of the hosts", np, total);
  if (total > HVDRUN_MAX_RANKS && np < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "the hosts have %ld slots; at most %d ranks",
                     total, HVDRUN_MAX_RANKS);
  size = np < 0 ? (int)total : np;
  slots = calloc((size_t)size, sizeof(*slots));
  cross_count = calloc((size_t)max_slots + 1, sizeof(*cross_count));
  if (slots == NULL || cross_count == NULL) {
    free(slots);
    free(cross_count);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot assign %d ranks", size);
  }
  for (size_t h = 0; h < nhosts && rank < size; h++) {
    int local_size = hosts[h].slots < size - rank ? hosts[h].slots : size - rank;
    for (int lr = 0; lr < local_size; lr++, rank++) {
      slots[rank] = (struct hvdrun_slot){.host = (int)h,
                                         .rank = rank,
                                         .size = size,
                                         .local_rank = lr,
                                         .local_size = local_size,
                                         .cross_rank = cross_count[lr]++};
    }
  }
  for (int r = 0; r < size; r++)
    slots[r].cross_size = cross_count[slots[r].local_rank];
  free(cross_count);
  *out = slots;
  *nslots = size;
  return HVD_OK;
}

bool hvdrun_host_is_local(const char *name) {
  char self[HVDRUN_HOST_MAX + 1];
  struct net_iface ifs[NET_MAX_IFACES];
  struct addrinfo hints, *res = NULL;
  size_t nifs = 0;
  bool local = false;

  if (strcmp(name, "localhost") == 0)
    return true;
  if (gethostname(self, sizeof(self)) == 0) {
    self[sizeof(self) - 1] = '\0';
    if (strcmp(name, self) == 0)
      return true;
  }
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(name, NULL, &hints, &res) != 0)
    return false;
  if (net_iface_list(ifs, NET_MAX_IFACES, &nifs) != HVD_OK)
    nifs = 0;
  for (const struct addrinfo *ai = res; ai != NULL && !local; ai = ai->ai_next) {
    struct net_addr a;
    memset(&a, 0, sizeof(a));
    memcpy(&a.ss, ai->ai_addr, ai->ai_addrlen);
    a.len = ai->ai_addrlen;
    if (net_addr_is_loopback(&a)) {
      local = true;
      break;
    }
    for (size_t i = 0; i < nifs && !local; i++)
      local = net_addr_equal(&a, &ifs[i].addr);
  }
  freeaddrinfo(res);
  return local;
}
