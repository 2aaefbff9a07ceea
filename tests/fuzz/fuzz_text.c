/*
 * The small text parsers that read environment variables and flags: the
 * strict numbers and booleans of src/common (hvd_parse_*, and the
 * settings table's readers through a real variable, which add the
 * trimming and the ranges), log levels, numeric
 * addresses (net_addr_parse) and interface specs (net_iface_match, for
 * HOROVOD_GLOO_IFACE, against a made-up host), and Slurm's compressed
 * host lists and task counts (src/launch/hostlist.c). Each input is given
 * to all of them, and each answer is checked against a property: an
 * independent reading of the same text, or a round trip through the
 * formatter.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/common.h"
#include "fuzz.h"
#include "launch/launch.h"
#include "transport/transport.h"

/* Real settings of three types (src/common/settings.def). */
#define VAR "HOROVOD_ELASTIC_RESET_LIMIT"
#define VAR2 "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"
#define VAR3 "HVD_SPIN_YIELD"

static struct net_iface ifs[8];
static size_t nifs;

static void add_iface(const char *name, const char *addr) {
  struct net_iface *i = &ifs[nifs++];
  snprintf(i->name, sizeof(i->name), "%s", name);
  if (net_addr_parse(addr, &i->addr) != HVD_OK) {
    fprintf(stderr, "fuzz_text: %s\n", hvd_last_error_message());
    exit(1);
  }
  i->loopback = net_addr_is_loopback(&i->addr);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  hvd_log_set_level(HVD_LOG_FATAL);
  /* "ib" and "ib0": an entry that names one exactly is not a prefix. */
  add_iface("lo", "127.0.0.1");
  add_iface("eth0", "10.0.0.5");
  add_iface("eth0", "fd00::5");
  add_iface("eth1", "10.1.0.5");
  add_iface("docker0", "172.17.0.1");
  add_iface("ib", "192.168.7.1");
  add_iface("ib0", "192.168.8.1");
  return 0;
}

/* The reading hvd_parse_int64 must agree with, done another way. */
static bool reference_int64(const char *t, size_t n, int64_t *out) {
  size_t i = 0;
  bool negative = false;
  __int128 v = 0;

  if (n > 0 && (t[0] == '+' || t[0] == '-')) {
    negative = t[0] == '-';
    i = 1;
  }
  if (i == n)
    return false;
  for (; i < n; i++) {
    if (t[i] < '0' || t[i] > '9')
      return false;
    if (v <= (__int128)INT64_MAX + 1) /* past that it stays out of range */
      v = v * 10 + (t[i] - '0');
  }
  if (negative)
    v = -v;
  if (v < INT64_MIN || v > INT64_MAX)
    return false;
  *out = (int64_t)v;
  return true;
}

static void check_int64(const uint8_t *data, size_t size) {
  int64_t got = 0, want = 0;
  bool ok = hvd_parse_int64((const char *)data, size, &got);
  FUZZ_CHECK(ok == reference_int64((const char *)data, size, &want), "accepted: %d", ok);
  FUZZ_CHECK(!ok || got == want, "%lld, not %lld", (long long)got, (long long)want);
}

static void check_double(const char *text) {
  double v, again;
  char printed[64];
  if (!hvd_parse_double(text, &v))
    return;
  FUZZ_CHECK(isfinite(v), "a non-finite number was accepted");
  /* Subnormals print inexactly, and strtod reports their underflow. */
  if (fpclassify(v) != FP_NORMAL && v != 0)
    return;
  snprintf(printed, sizeof(printed), "%.17g", v);
  FUZZ_CHECK(hvd_parse_double(printed, &again) && again == v, "%s does not read back", printed);
}

static void check_bool(const char *text) {
  static const char *const words[] = {"1", "true", "yes", "on", "y",
                                      "0", "false", "no", "off", "n"};
  bool v, known = false;
  for (size_t i = 0; i < HVD_ARRAY_SIZE(words); i++)
    known |= strcasecmp(text, words[i]) == 0;
  FUZZ_CHECK(hvd_parse_bool(text, &v) == known, "'%s' read wrongly", text);
}

/* Values are trimmed into a buffer of this many bytes (settings.c): a
 * longer one is refused whatever it holds. */
enum { ENV_VALUE_MAX = 256 };

static void check_level(const char *text) {
  static const char *const names[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  int level;
  size_t start = 0, len = strlen(text);
  int want = -1;

  /* Blanks around it go, as around every setting's value. */
  while (isspace((unsigned char)text[start]))
    start++;
  len -= start;
  while (len > 0 && isspace((unsigned char)text[start + len - 1]))
    len--;
  for (int i = 0; i < 6 && len < ENV_VALUE_MAX; i++) {
    if (strlen(names[i]) == len && strncasecmp(text + start, names[i], len) == 0)
      want = i;
  }
  if (len == 4 && strncasecmp(text + start, "warn", 4) == 0)
    want = HVD_LOG_WARNING;
  if (hvd_setting_word_of(HVD_SET_LOG_LEVEL, text, "--log-level", &level) == HVD_OK)
    FUZZ_CHECK((int)level == want, "level %d, not %d", (int)level, want);
  else
    FUZZ_CHECK(want < 0, "level %d refused", want);
}

/* A variable set to fuzzed text. Not setenv: glibc keeps every value ever
 * set (so that old pointers stay valid), which over millions of inputs is
 * gigabytes. putenv keeps our buffer itself, which is then rewritten in
 * place. */
struct fuzz_var {
  const char *name;
  char *buf;
  size_t cap;
};

static bool set_one(struct fuzz_var *v, const char *text) {
  size_t need = strlen(v->name) + 1 + strlen(text) + 1;

  if (need > v->cap) {
    char *grown = malloc(2 * need);
    if (grown == NULL)
      return false;
    snprintf(grown, 2 * need, "%s=%s", v->name, text);
    if (putenv(grown) != 0) {
      free(grown);
      return false;
    }
    free(v->buf); /* no longer in the environment */
    v->buf = grown;
    v->cap = 2 * need;
    return true;
  }
  snprintf(v->buf, v->cap, "%s=%s", v->name, text);
  return true;
}

/* Sets VAR, VAR2 and VAR3 to text. */
static bool set_var(const char *text) {
  static struct fuzz_var vars[] = {{VAR, NULL, 0}, {VAR2, NULL, 0}, {VAR3, NULL, 0}};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(vars); i++) {
    if (!set_one(&vars[i], text))
      return false;
  }
  return true;
}

/* hvd_setting_* read the variable and trim blanks (ENV_VALUE_MAX bytes
 * are left at most, or the value is refused), then parse and check the
 * range: VAR is -1 to 2^31-1 (unset: -1), VAR2 0 to 1, VAR3 a boolean
 * (unset: true). */

static void check_env(const char *text) {
  size_t start = 0, len = strlen(text);
  char trimmed[ENV_VALUE_MAX];
  int64_t i = 0, want_i = 0;
  double d = 0;
  bool b = false, want_b = false, fits;
  hvd_status st;

  if (!set_var(text))
    return;
  while (isspace((unsigned char)text[start]))
    start++;
  while (len > start && isspace((unsigned char)text[len - 1]))
    len--;
  fits = len - start < ENV_VALUE_MAX;
  if (fits) {
    memcpy(trimmed, text + start, len - start);
    trimmed[len - start] = '\0';
  }
  st = hvd_setting_int(HVD_SET_ELASTIC_RESET_LIMIT, &i);
  if (text[0] == '\0')
    FUZZ_CHECK(st == HVD_OK && i == -1, "an empty variable is not the default");
  else if (fits && reference_int64(trimmed, len - start, &want_i) && want_i >= -1 &&
           want_i <= INT32_MAX)
    FUZZ_CHECK(st == HVD_OK && i == want_i, "'%s' read as %lld", text, (long long)i);
  else
    FUZZ_CHECK(st == HVD_ERR_INVALID_ARGUMENT, "'%s' accepted as %lld", text, (long long)i);
  st = hvd_setting_number(HVD_SET_AUTOTUNE_NOISE, &d);
  FUZZ_CHECK(st == HVD_OK || st == HVD_ERR_INVALID_ARGUMENT, "status %d", st);
  FUZZ_CHECK(st != HVD_OK || (d >= 0 && d <= 1), "%g out of range", d);
  st = hvd_setting_bool(HVD_SET_SPIN_YIELD, &b);
  if (text[0] == '\0')
    FUZZ_CHECK(st == HVD_OK && b, "an empty variable is not the default");
  else if (fits && hvd_parse_bool(trimmed, &want_b))
    FUZZ_CHECK(st == HVD_OK && b == want_b, "'%s' read wrongly as a boolean", text);
  else
    FUZZ_CHECK(st == HVD_ERR_INVALID_ARGUMENT, "'%s' accepted as a boolean", text);
}

static void check_addr(const char *text) {
  struct net_addr a, b;
  char printed[128];
  if (net_addr_parse(text, &a) != HVD_OK)
    return;
  FUZZ_CHECK(a.ss.ss_family == AF_INET || a.ss.ss_family == AF_INET6, "family %d",
             a.ss.ss_family);
  net_addr_format(&a, printed, sizeof(printed));
  FUZZ_CHECK(net_addr_parse(printed, &b) == HVD_OK, "'%s' (from '%s') does not read back: %s",
             printed, text, hvd_last_error_message());
  FUZZ_CHECK(net_addr_equal(&a, &b), "'%s' read back as another address", printed);
}

static void check_iface(const char *text) {
  bool selected[HVD_ARRAY_SIZE(ifs)];
  size_t count = 0;
  hvd_status st = net_iface_match(text, ifs, nifs, selected);

  if (st != HVD_OK) {
    FUZZ_CHECK(st == HVD_ERR_INVALID_ARGUMENT || st == HVD_ERR_NOT_FOUND, "status %d", st);
    return;
  }
  for (size_t i = 0; i < nifs; i++)
    count += selected[i];
  FUZZ_CHECK(count > 0, "'%s' selected nothing but succeeded", text);
}

/* Names of a host list: 1 to 255 bytes of what a name may hold; without
 * brackets, the list is just its names joined by commas. */
static void check_hostlist(const char *text) {
  struct launch_hostlist l;
  size_t at = 0;
  bool brackets = strchr(text, '[') != NULL;

  if (launch_hostlist_parse(text, 4096, &l) != HVD_OK)
    return;
  FUZZ_CHECK(l.count >= 1 && l.count <= 4096, "%zu names", l.count);
  for (size_t i = 0; i < l.count; i++) {
    const char *name = launch_hostlist_get(&l, i);
    size_t len = strlen(name);
    FUZZ_CHECK(len >= 1 && len <= 255, "name %zu of %zu bytes", i, len);
    for (size_t k = 0; k < len; k++) {
      unsigned char c = (unsigned char)name[k];
      FUZZ_CHECK(c > ' ' && c < 0x7f && c != ',' && c != '[' && c != ']', "name '%s'", name);
    }
    if (!brackets) {
      FUZZ_CHECK(strncmp(text + at, name, len) == 0 &&
                     (text[at + len] == ',' || text[at + len] == '\0'),
                 "name '%s' is not the list's item at %zu", name, at);
      at += len + 1;
    }
  }
  FUZZ_CHECK(launch_hostlist_get(&l, l.count) == NULL, "a name past the end");
  launch_hostlist_fini(&l);
}

/* Task counts read back the same from their plain form. */
static void check_tasks(const char *text) {
  static int counts[64], again[64];
  char plain[64 * 12];
  size_t n = 0, m = 0, len = 0;

  if (launch_tasks_per_node_parse(text, counts, 64, &n) != HVD_OK)
    return;
  FUZZ_CHECK(n >= 1 && n <= 64, "%zu nodes", n);
  for (size_t i = 0; i < n; i++) {
    FUZZ_CHECK(counts[i] >= 1, "count %d", counts[i]);
    len += (size_t)snprintf(plain + len, sizeof(plain) - len, "%s%d", i ? "," : "", counts[i]);
  }
  FUZZ_CHECK(launch_tasks_per_node_parse(plain, again, 64, &m) == HVD_OK && m == n &&
                 memcmp(again, counts, n * sizeof(*counts)) == 0,
             "'%s' reads back differently", plain);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);

  FUZZ_CHECK(text != NULL, "out of memory");
  memcpy(text, data, size);
  text[size] = '\0'; /* the C-string parsers see the text up to its first NUL */
  check_int64(data, size);
  check_double(text);
  check_bool(text);
  check_level(text);
  check_env(text);
  check_addr(text);
  check_iface(text);
  check_hostlist(text);
  check_tasks(text);
  free(text);
  return 0;
}
