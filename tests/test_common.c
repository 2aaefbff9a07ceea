/*
 * Unit tests for the common layer (src/common): status messages, logging,
 * strict parsing, environment knobs, clocks, the capped buffer, the map and
 * the small helpers. Every suite is its own ctest entry (CK_RUN_SUITE).
 *
 * Tests that touch process-wide state (environment, log settings, fd 2)
 * restore it before they return, so the file also passes with CK_FORK=no.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <regex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"

/* ---- helpers ------------------------------------------------------------ */

/* A sentinel that no call under test would write. */
enum { UNTOUCHED = 777 };

static bool contains(const char *haystack, const char *needle) {
  return strstr(haystack, needle) != NULL;
}

#define ck_assert_contains(h, n)                                                  \
  ck_assert_msg(contains((h), (n)), "'%s' does not contain '%s'", (h), (n))

/* Redirects fd 2 into a temporary file until capture_end. */
struct capture {
  FILE *file;
  int saved_fd;
};

static void capture_begin(struct capture *c) {
  fflush(stderr);
  c->file = tmpfile();
  ck_assert_ptr_nonnull(c->file);
  c->saved_fd = dup(STDERR_FILENO);
  ck_assert_int_ge(c->saved_fd, 0);
  ck_assert_int_eq(dup2(fileno(c->file), STDERR_FILENO), STDERR_FILENO);
}

/* Restores fd 2 and returns what was written there (the caller frees it). */
static char *capture_end(struct capture *c, size_t *len) {
  long size;
  char *text;

  fflush(stderr);
  ck_assert_int_eq(dup2(c->saved_fd, STDERR_FILENO), STDERR_FILENO);
  close(c->saved_fd);
  ck_assert_int_eq(fseek(c->file, 0, SEEK_END), 0);
  size = ftell(c->file);
  ck_assert_int_ge(size, 0);
  rewind(c->file);
  text = malloc((size_t)size + 1);
  ck_assert_ptr_nonnull(text);
  ck_assert_uint_eq(fread(text, 1, (size_t)size, c->file), (size_t)size);
  text[size] = '\0';
  fclose(c->file);
  if (len != NULL)
    *len = (size_t)size;
  return text;
}

static size_t count_char(const char *s, size_t len, char ch) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++)
    n += s[i] == ch;
  return n;
}

/* A heap string of `len` copies of `ch` (the caller frees it). */
static char *repeat(char ch, size_t len) {
  char *s = malloc(len + 1);
  ck_assert_ptr_nonnull(s);
  memset(s, ch, len);
  s[len] = '\0';
  return s;
}

/* ---- errors ------------------------------------------------------------- */

START_TEST(test_strerror_every_status) {
  const hvd_status first = HVD_OK, last = HVD_ERR_EXISTS;
  for (int i = first; i <= (int)last; i++) {
    const char *s = hvd_strerror((hvd_status)i);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_gt(strlen(s), 0);
    ck_assert_str_ne(s, "unknown status");
    for (int j = first; j < i; j++)
      ck_assert_str_ne(s, hvd_strerror((hvd_status)j));
  }
}
END_TEST

START_TEST(test_strerror_elastic_statuses) {
  ck_assert_str_eq(hvd_strerror(HVD_ERR_HOSTS_UPDATED),
                   "hosts were added or removed (elastic reset)");
  ck_assert_str_eq(hvd_strerror(HVD_ERR_REMOVED), "this worker was removed from the elastic job");
}
END_TEST

START_TEST(test_strerror_unknown) {
  ck_assert_str_eq(hvd_strerror((hvd_status)(HVD_ERR_EXISTS + 1)), "unknown status");
  ck_assert_str_eq(hvd_strerror((hvd_status)1000), "unknown status");
}
END_TEST

START_TEST(test_error_sets_status_and_message) {
  hvd_error_clear();
  ck_assert_int_eq(hvd_error_status(), HVD_OK);
  ck_assert_str_eq(hvd_last_error_message(), "");

  ck_assert_int_eq(hvd_error(HVD_ERR_IO, "open %s: %s", "/x", "No such file"), HVD_ERR_IO);
  ck_assert_int_eq(hvd_error_status(), HVD_ERR_IO);
  ck_assert_str_eq(hvd_last_error_message(), "open /x: No such file");

  /* A later failure replaces the earlier one entirely. */
  ck_assert_int_eq(hvd_error(HVD_ERR_TIMEOUT, "late"), HVD_ERR_TIMEOUT);
  ck_assert_int_eq(hvd_error_status(), HVD_ERR_TIMEOUT);
  ck_assert_str_eq(hvd_last_error_message(), "late");

  hvd_error_clear();
  ck_assert_int_eq(hvd_error_status(), HVD_OK);
  ck_assert_str_eq(hvd_last_error_message(), "");
}
END_TEST

START_TEST(test_error_prefix) {
  hvd_error(HVD_ERR_NETWORK, "connection refused");
  ck_assert_int_eq(hvd_error_prefix("rendezvous %s:%d", "10.0.0.5", 29500), HVD_ERR_NETWORK);
  ck_assert_int_eq(hvd_error_status(), HVD_ERR_NETWORK);
  ck_assert_str_eq(hvd_last_error_message(), "rendezvous 10.0.0.5:29500: connection refused");

  /* Prefixes nest outermost-last. */
  ck_assert_int_eq(hvd_error_prefix("init"), HVD_ERR_NETWORK);
  ck_assert_str_eq(hvd_last_error_message(),
                   "init: rendezvous 10.0.0.5:29500: connection refused");
}
END_TEST

START_TEST(test_error_long_message_truncated) {
  char *big = repeat('m', 5 * HVD_ERROR_MESSAGE_MAX);
  const char *msg;

  hvd_error(HVD_ERR_PROTOCOL, "%s", big);
  msg = hvd_last_error_message();
  ck_assert_uint_eq(strlen(msg), HVD_ERROR_MESSAGE_MAX - 1);
  ck_assert_int_eq(memcmp(msg, big, HVD_ERROR_MESSAGE_MAX - 1), 0);

  /* Prefixing a full message keeps the total within bounds. */
  ck_assert_int_eq(hvd_error_prefix("ctx"), HVD_ERR_PROTOCOL);
  msg = hvd_last_error_message();
  ck_assert_uint_eq(strlen(msg), HVD_ERROR_MESSAGE_MAX - 1);
  ck_assert_int_eq(strncmp(msg, "ctx: mmm", 8), 0);
  free(big);
}
END_TEST

START_TEST(test_error_long_prefix_truncated) {
  char *big = repeat('p', 5 * HVD_ERROR_MESSAGE_MAX);
  const char *msg;

  hvd_error(HVD_ERR_CONFLICT, "the original failure");
  ck_assert_int_eq(hvd_error_prefix("%s", big), HVD_ERR_CONFLICT);
  ck_assert_int_eq(hvd_error_status(), HVD_ERR_CONFLICT);
  msg = hvd_last_error_message();
  ck_assert_uint_lt(strlen(msg), HVD_ERROR_MESSAGE_MAX);
  ck_assert_int_eq(strncmp(msg, "pppp", 4), 0);
  /* A runaway context must not push the actual failure out of the message. */
  ck_assert_contains(msg, ": the original failure");

  /* Both long: still bounded and terminated. */
  hvd_error(HVD_ERR_CONFLICT, "%s", big);
  hvd_error_prefix("%s", big);
  ck_assert_uint_eq(strlen(hvd_last_error_message()), HVD_ERROR_MESSAGE_MAX - 1);
  free(big);
}
END_TEST

struct error_thread_result {
  hvd_status initial_status;
  char initial_message[64];
  hvd_status status;
  char message[64];
};

static void *error_thread_main(void *arg) {
  struct error_thread_result *r = arg;
  r->initial_status = hvd_error_status();
  snprintf(r->initial_message, sizeof(r->initial_message), "%s", hvd_last_error_message());
  hvd_error(HVD_ERR_NETWORK, "thread failure");
  hvd_error_prefix("worker");
  r->status = hvd_error_status();
  snprintf(r->message, sizeof(r->message), "%s", hvd_last_error_message());
  return NULL;
}

START_TEST(test_error_per_thread) {
  struct error_thread_result r;
  pthread_t thread;

  memset(&r, 0, sizeof(r));
  hvd_error(HVD_ERR_IO, "main failure");
  ck_assert_int_eq(pthread_create(&thread, NULL, error_thread_main, &r), 0);
  ck_assert_int_eq(pthread_join(thread, NULL), 0);

  ck_assert_int_eq(r.initial_status, HVD_OK);
  ck_assert_str_eq(r.initial_message, "");
  ck_assert_int_eq(r.status, HVD_ERR_NETWORK);
  ck_assert_str_eq(r.message, "worker: thread failure");

  ck_assert_int_eq(hvd_error_status(), HVD_ERR_IO);
  ck_assert_str_eq(hvd_last_error_message(), "main failure");
}
END_TEST

START_TEST(test_version) {
  char expected[64];
  snprintf(expected, sizeof(expected), "%d.%d.%d", HVD_VERSION_MAJOR, HVD_VERSION_MINOR,
           HVD_VERSION_PATCH);
  ck_assert_ptr_nonnull(hvd_version());
  ck_assert_str_eq(hvd_version(), expected);
}
END_TEST

/* ---- log ---------------------------------------------------------------- */

/* Puts the log settings back to their start-up values. */
static void log_defaults(void) {
  hvd_log_set_level(HVD_LOG_WARNING);
  hvd_log_set_hide_time(false);
  hvd_log_set_rank(-1);
  hvd_log_set_name("hvd");
  unsetenv("HOROVOD_LOG_LEVEL");
  unsetenv("HOROVOD_LOG_HIDE_TIME");
  hvd_error_clear();
}

/* A level as hvd-rendezvous's --log-level reads it: HOROVOD_LOG_LEVEL's
 * words from the settings table. */
static hvd_status level_of(const char *text, enum hvd_log_level *out) {
  int level;
  hvd_status st = hvd_setting_word_of(HVD_SET_LOG_LEVEL, text, "--log-level", &level);
  if (st == HVD_OK)
    *out = (enum hvd_log_level)level;
  return st;
}

START_TEST(test_log_parse_level_accepts) {
  static const struct {
    const char *text;
    enum hvd_log_level level;
  } cases[] = {
      {"trace", HVD_LOG_TRACE},     {"TRACE", HVD_LOG_TRACE},   {"debug", HVD_LOG_DEBUG},
      {"Debug", HVD_LOG_DEBUG},     {"info", HVD_LOG_INFO},     {"iNfO", HVD_LOG_INFO},
      {"warning", HVD_LOG_WARNING}, {"WARNING", HVD_LOG_WARNING}, {"warn", HVD_LOG_WARNING},
      {"Warn", HVD_LOG_WARNING},    {"error", HVD_LOG_ERROR},   {"ERROR", HVD_LOG_ERROR},
      {"fatal", HVD_LOG_FATAL},     {"FaTaL", HVD_LOG_FATAL},
      /* surrounding blanks are tolerated, as for every variable */
      {"info ", HVD_LOG_INFO},      {" debug\n", HVD_LOG_DEBUG},
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++) {
    enum hvd_log_level level = (enum hvd_log_level)UNTOUCHED;
    ck_assert_msg(level_of(cases[i].text, &level) == HVD_OK, "'%s' rejected",
                  cases[i].text);
    ck_assert_int_eq(level, cases[i].level);
  }
}
END_TEST

START_TEST(test_log_parse_level_rejects) {
  static const char *const bad[] = {"verbose", "", "  ", "warnings", "in fo", "err", "5"};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    enum hvd_log_level level = (enum hvd_log_level)UNTOUCHED;
    hvd_error_clear();
    ck_assert_msg(level_of(bad[i], &level) == HVD_ERR_INVALID_ARGUMENT,
                  "'%s' accepted", bad[i]);
    ck_assert_int_eq(level, UNTOUCHED);
    ck_assert_int_eq(hvd_error_status(), HVD_ERR_INVALID_ARGUMENT);
    ck_assert_uint_gt(strlen(hvd_last_error_message()), 0);
  }
  level_of("verbose", &(enum hvd_log_level){HVD_LOG_INFO});
  ck_assert_contains(hvd_last_error_message(), "verbose");
}
END_TEST

START_TEST(test_log_configure_bad_level) {
  hvd_log_set_level(HVD_LOG_ERROR);
  setenv("HOROVOD_LOG_LEVEL", "bogus", 1);
  ck_assert_int_eq(hvd_log_configure_from_env(), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_contains(hvd_last_error_message(), "HOROVOD_LOG_LEVEL");
  ck_assert_contains(hvd_last_error_message(), "bogus");
  ck_assert_int_eq(hvd_log_get_level(), HVD_LOG_ERROR);
}
END_TEST

START_TEST(test_log_configure_bad_hide_time) {
  hvd_log_set_level(HVD_LOG_ERROR);
  setenv("HOROVOD_LOG_LEVEL", "debug", 1);
  setenv("HOROVOD_LOG_HIDE_TIME", "maybe", 1);
  ck_assert_int_eq(hvd_log_configure_from_env(), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_contains(hvd_last_error_message(), "HOROVOD_LOG_HIDE_TIME");
  ck_assert_contains(hvd_last_error_message(), "maybe");
  /* A rejected configuration changes nothing, not even the valid half. */
  ck_assert_int_eq(hvd_log_get_level(), HVD_LOG_ERROR);
}
END_TEST

START_TEST(test_log_configure_applies) {
  struct capture c;
  char *out;

  setenv("HOROVOD_LOG_LEVEL", "Info", 1);
  setenv("HOROVOD_LOG_HIDE_TIME", "1", 1);
  ck_assert_int_eq(hvd_log_configure_from_env(), HVD_OK);
  ck_assert_int_eq(hvd_log_get_level(), HVD_LOG_INFO);
  ck_assert(hvd_log_enabled(HVD_LOG_INFO));
  ck_assert(!hvd_log_enabled(HVD_LOG_DEBUG));

  hvd_log_set_rank(0);
  capture_begin(&c);
  HVD_LOG_INFO("hidden time");
  out = capture_end(&c, NULL);
  ck_assert_int_eq(strncmp(out, "[I rank 0 ", 10), 0);
  free(out);

  /* Unset variables bring back the defaults: warning, with timestamps. */
  unsetenv("HOROVOD_LOG_LEVEL");
  unsetenv("HOROVOD_LOG_HIDE_TIME");
  ck_assert_int_eq(hvd_log_configure_from_env(), HVD_OK);
  ck_assert_int_eq(hvd_log_get_level(), HVD_LOG_WARNING);
  capture_begin(&c);
  HVD_LOG_WARN("shown time");
  out = capture_end(&c, NULL);
  ck_assert_msg(out[0] == '[' && out[1] >= '0' && out[1] <= '9', "no timestamp in '%s'", out);
  free(out);
}
END_TEST

START_TEST(test_log_format_rank) {
  struct capture c;
  char expected[256];
  char *out;
  int line;

  hvd_log_set_hide_time(true);
  hvd_log_set_rank(3);
  capture_begin(&c);
  line = __LINE__ + 1;
  HVD_LOG_WARN("peer %d is slow: %s", 7, "retrying");
  out = capture_end(&c, NULL);
  snprintf(expected, sizeof(expected), "[W rank 3 test_common.c:%d] peer 7 is slow: retrying\n",
           line);
  ck_assert_str_eq(out, expected);
  free(out);
}
END_TEST

START_TEST(test_log_format_name) {
  struct capture c;
  char expected[256];
  char *out;
  int line;

  hvd_log_set_hide_time(true);
  hvd_log_set_rank(-1);
  hvd_log_set_name("hvd-rendezvous");
  capture_begin(&c);
  line = __LINE__ + 1;
  HVD_LOG_ERROR("listening");
  out = capture_end(&c, NULL);
  snprintf(expected, sizeof(expected), "[E hvd-rendezvous test_common.c:%d] listening\n", line);
  ck_assert_str_eq(out, expected);
  free(out);
}
END_TEST

START_TEST(test_log_long_name_truncated) {
  char *name = repeat('n', 500);
  struct capture c;
  size_t len;
  char *out;
  const char *space;

  hvd_log_set_hide_time(true);
  hvd_log_set_name(name);
  capture_begin(&c);
  HVD_LOG_WARN("x");
  out = capture_end(&c, &len);
  ck_assert_int_eq(strncmp(out, "[W nnn", 6), 0);
  space = strchr(out + 3, ' ');
  ck_assert_ptr_nonnull(space);
  ck_assert_uint_lt((size_t)(space - (out + 3)), 500);
  ck_assert_int_eq(strncmp(space, " test_common.c:", 15), 0);
  ck_assert_uint_eq(count_char(out, len, '\n'), 1);
  free(out);
  free(name);
}
END_TEST

START_TEST(test_log_format_timestamp) {
  static const char pattern[] =
      "^\\[[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{6}: "
      "W rank 3 test_common\\.c:[0-9]+\\] stamped\n$";
  struct capture c;
  regex_t re;
  char *out;

  hvd_log_set_hide_time(false);
  hvd_log_set_rank(3);
  capture_begin(&c);
  HVD_LOG_WARN("stamped");
  out = capture_end(&c, NULL);
  ck_assert_int_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
  ck_assert_msg(regexec(&re, out, 0, NULL, 0) == 0, "bad line '%s'", out);
  regfree(&re);
  free(out);
}
END_TEST

START_TEST(test_log_threshold) {
  struct capture c;
  size_t len;
  char *out;

  hvd_log_set_hide_time(true);
  hvd_log_set_level(HVD_LOG_ERROR);
  ck_assert(!hvd_log_enabled(HVD_LOG_WARNING));
  ck_assert(hvd_log_enabled(HVD_LOG_ERROR));
  ck_assert(hvd_log_enabled(HVD_LOG_FATAL));
  capture_begin(&c);
  HVD_LOG_TRACE("t");
  HVD_LOG_DEBUG("d");
  HVD_LOG_INFO("i");
  HVD_LOG_WARN("w");
  out = capture_end(&c, &len);
  ck_assert_uint_eq(len, 0);
  free(out);

  /* Every level prints with its own letter once enabled. */
  hvd_log_set_level(HVD_LOG_TRACE);
  hvd_log_set_rank(1);
  capture_begin(&c);
  HVD_LOG_TRACE("t");
  HVD_LOG_DEBUG("d");
  HVD_LOG_INFO("i");
  HVD_LOG_WARN("w");
  HVD_LOG_ERROR("e");
  HVD_LOG_FATAL("f");
  out = capture_end(&c, &len);
  ck_assert_uint_eq(count_char(out, len, '\n'), 6);
  {
    static const char letters[] = "TDIWEF";
    const char *p = out;
    for (size_t i = 0; i < 6; i++) {
      ck_assert_int_eq(p[0], '[');
      ck_assert_int_eq(p[1], letters[i]);
      ck_assert_int_eq(strncmp(p + 2, " rank 1 test_common.c:", 22), 0);
      p = strchr(p, '\n') + 1;
    }
  }
  free(out);
}
END_TEST

START_TEST(test_log_long_message_truncated) {
  char *big = repeat('a', 10000);
  struct capture c;
  size_t len;
  char *out;

  hvd_log_set_hide_time(true);
  hvd_log_set_rank(3);
  capture_begin(&c);
  HVD_LOG_WARN("%s", big);
  out = capture_end(&c, &len);
  ck_assert_uint_gt(len, 1000);
  ck_assert_uint_lt(len, 10000);
  ck_assert_int_eq(strncmp(out, "[W rank 3 test_common.c:", 24), 0);
  ck_assert_int_eq(out[len - 1], '\n');
  ck_assert_int_eq(out[len - 2], 'a');
  ck_assert_uint_eq(count_char(out, len, '\n'), 1);
  ck_assert_uint_eq(strlen(out), len); /* no stray NUL written */
  free(out);
  free(big);
}
END_TEST

/* ---- parse -------------------------------------------------------------- */

static bool parse_int(const char *text, int64_t *out) {
  return hvd_parse_int64(text, strlen(text), out);
}

START_TEST(test_parse_int64_accepts) {
  static const struct {
    const char *text;
    int64_t value;
  } cases[] = {
      {"0", 0},
      {"-1", -1},
      {"+5", 5},
      {"-0", 0},
      {"0042", 42},
      {"9223372036854775807", INT64_MAX},
      {"-9223372036854775808", INT64_MIN},
      {"+9223372036854775807", INT64_MAX},
      {"00000000000000000000000000009223372036854775807", INT64_MAX},
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++) {
    int64_t v = UNTOUCHED;
    ck_assert_msg(parse_int(cases[i].text, &v), "'%s' rejected", cases[i].text);
    ck_assert_int_eq(v, cases[i].value);
  }
}
END_TEST

START_TEST(test_parse_int64_rejects) {
  static const char *const bad[] = {
      "", "-", "+", "1x", " 1", "1 ", "0x10", "1.0", "--1", "+-1", "1e3", "abc",
      "9223372036854775808", "-9223372036854775809", "18446744073709551616",
      "99999999999999999999999999",
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    int64_t v = UNTOUCHED;
    ck_assert_msg(!parse_int(bad[i], &v), "'%s' accepted", bad[i]);
    ck_assert_int_eq(v, UNTOUCHED);
  }
}
END_TEST

START_TEST(test_parse_int64_len) {
  /* Not NUL-terminated: the parser must stop at len (ASan checks the reads). */
  char *digits = malloc(3);
  int64_t v = UNTOUCHED;

  ck_assert_ptr_nonnull(digits);
  memcpy(digits, "456", 3);
  ck_assert(hvd_parse_int64(digits, 3, &v));
  ck_assert_int_eq(v, 456);
  free(digits);

  ck_assert(hvd_parse_int64("123", 2, &v));
  ck_assert_int_eq(v, 12);
  ck_assert(hvd_parse_int64("7,8", 1, &v));
  ck_assert_int_eq(v, 7);
  v = UNTOUCHED;
  ck_assert(!hvd_parse_int64("123", 0, &v));
  ck_assert(!hvd_parse_int64("-5", 1, &v));
  ck_assert(!hvd_parse_int64("1\0002", 3, &v));
  ck_assert_int_eq(v, UNTOUCHED);
}
END_TEST

START_TEST(test_parse_double) {
  static const char *const bad[] = {"",    "abc", "1.5x", "inf", "-inf", "nan",
                                    "1e999", " 1.5", "1.5 ", "--1", "."};
  double v = UNTOUCHED;

  ck_assert(hvd_parse_double("1.5", &v));
  ck_assert_double_eq(v, 1.5);
  ck_assert(hvd_parse_double("-2e3", &v));
  ck_assert_double_eq(v, -2000.0);
  ck_assert(hvd_parse_double("0", &v));
  ck_assert_double_eq(v, 0.0);
  ck_assert(hvd_parse_double("+.25", &v));
  ck_assert_double_eq(v, 0.25);

  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    v = UNTOUCHED;
    ck_assert_msg(!hvd_parse_double(bad[i], &v), "'%s' accepted", bad[i]);
    ck_assert_double_eq(v, UNTOUCHED);
  }
}
END_TEST

START_TEST(test_parse_bool) {
  static const char *const yes[] = {"1", "true", "TRUE", "True", "yes", "YES", "on", "On", "y", "Y"};
  static const char *const no[] = {"0", "false", "FALSE", "no", "No", "off", "OFF", "n", "N"};
  static const char *const bad[] = {"2", "", "ye", "tru", "onn", "yes ", " no", "-1", "enable"};

  for (size_t i = 0; i < HVD_ARRAY_SIZE(yes); i++) {
    bool v = false;
    ck_assert_msg(hvd_parse_bool(yes[i], &v), "'%s' rejected", yes[i]);
    ck_assert_msg(v, "'%s' gave false", yes[i]);
  }
  for (size_t i = 0; i < HVD_ARRAY_SIZE(no); i++) {
    bool v = true;
    ck_assert_msg(hvd_parse_bool(no[i], &v), "'%s' rejected", no[i]);
    ck_assert_msg(!v, "'%s' gave true", no[i]);
  }
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    bool v = true;
    ck_assert_msg(!hvd_parse_bool(bad[i], &v), "'%s' accepted", bad[i]);
    ck_assert(v);
    v = false;
    ck_assert(!hvd_parse_bool(bad[i], &v));
    ck_assert(!v);
  }
}
END_TEST

/* ---- env and settings ---------------------------------------------------- */

/* Real settings of each type (src/common/settings.def), and a name of none. */
#define ENV_NAME "HVD_TEST_COMMON_KNOB"
#define INT_VAR "HVD_RING_WINDOW"                      /* 1 … 64, default 4 */
#define WIDE_VAR "HVD_ELASTIC_ROUND"                   /* 0 … 2^63-1 */
#define NUMBER_VAR "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE" /* 0 … 1, default 0.8 */
#define BOOL_VAR "HVD_SPIN_YIELD"                      /* default 1 */
#define WORD_VAR "HVD_ALLREDUCE_ALGORITHM"             /* auto ring rd|… hd|… */

static void env_clear(void) {
  static const char *const names[] = {ENV_NAME, INT_VAR, WIDE_VAR, NUMBER_VAR, BOOL_VAR,
                                      WORD_VAR};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(names); i++)
    unsetenv(names[i]);
  hvd_error_clear();
}

START_TEST(test_env_int_values) {
  static const struct {
    const char *text;
    int64_t value;
  } cases[] = {{"42", 42}, {" 42 ", 42}, {"\t42\n", 42}, {"+3", 3}, {"64", 64}, {"1", 1}};
  int64_t v = UNTOUCHED;

  ck_assert_int_eq(hvd_setting_int(HVD_SET_RING_WINDOW, &v), HVD_OK);
  ck_assert_int_eq(v, 4);
  setenv(INT_VAR, "", 1);
  v = UNTOUCHED;
  ck_assert_int_eq(hvd_setting_int(HVD_SET_RING_WINDOW, &v), HVD_OK);
  ck_assert_int_eq(v, 4);

  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++) {
    setenv(INT_VAR, cases[i].text, 1);
    v = UNTOUCHED;
    ck_assert_int_eq(hvd_setting_int(HVD_SET_RING_WINDOW, &v), HVD_OK);
    ck_assert_int_eq(v, cases[i].value);
  }
  setenv(WIDE_VAR, "9223372036854775807", 1);
  ck_assert_int_eq(hvd_setting_int(HVD_SET_ELASTIC_ROUND, &v), HVD_OK);
  ck_assert_int_eq(v, INT64_MAX);
}
END_TEST

START_TEST(test_env_int_malformed) {
  static const char *const bad[] = {"abc", "4 2", "42abc", "0x10", "1.5", "99999999999999999999"};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    int64_t v = UNTOUCHED;
    setenv(INT_VAR, bad[i], 1);
    hvd_error_clear();
    ck_assert_msg(hvd_setting_int(HVD_SET_RING_WINDOW, &v) == HVD_ERR_INVALID_ARGUMENT,
                  "'%s' accepted", bad[i]);
    ck_assert_int_eq(v, UNTOUCHED);
    ck_assert_int_eq(hvd_error_status(), HVD_ERR_INVALID_ARGUMENT);
    ck_assert_contains(hvd_last_error_message(), INT_VAR);
    ck_assert_contains(hvd_last_error_message(), bad[i]);
  }
}
END_TEST

START_TEST(test_env_int_out_of_range) {
  static const char *const bad[] = {"65", "0", "-7"};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    int64_t v = UNTOUCHED;
    setenv(INT_VAR, bad[i], 1);
    ck_assert_int_eq(hvd_setting_int(HVD_SET_RING_WINDOW, &v), HVD_ERR_INVALID_ARGUMENT);
    ck_assert_int_eq(v, UNTOUCHED);
    ck_assert_contains(hvd_last_error_message(), INT_VAR "='");
    ck_assert_contains(hvd_last_error_message(), bad[i]);
    ck_assert_contains(hvd_last_error_message(), "from 1 to 64");
  }
}
END_TEST

START_TEST(test_env_int_huge_value) {
  /* Longer than any buffer the parser might use: rejected, not truncated. */
  char *big = repeat('1', 1000);
  int64_t v = UNTOUCHED;

  setenv(WIDE_VAR, big, 1);
  ck_assert_int_eq(hvd_setting_int(HVD_SET_ELASTIC_ROUND, &v), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(v, UNTOUCHED);
  ck_assert_contains(hvd_last_error_message(), WIDE_VAR);
  ck_assert_uint_lt(strlen(hvd_last_error_message()), HVD_ERROR_MESSAGE_MAX);
  free(big);
}
END_TEST

START_TEST(test_env_double) {
  static const char *const bad[] = {"abc", "1.5x", "1 .5", "nan", "inf", "1.5", "-0.1"};
  double v = UNTOUCHED;

  ck_assert_int_eq(hvd_setting_number(HVD_SET_AUTOTUNE_NOISE, &v), HVD_OK);
  ck_assert_double_eq(v, 0.8);
  setenv(NUMBER_VAR, " 0.75 ", 1);
  ck_assert_int_eq(hvd_setting_number(HVD_SET_AUTOTUNE_NOISE, &v), HVD_OK);
  ck_assert_double_eq(v, 0.75);
  setenv(NUMBER_VAR, "1e0", 1);
  ck_assert_int_eq(hvd_setting_number(HVD_SET_AUTOTUNE_NOISE, &v), HVD_OK);
  ck_assert_double_eq(v, 1.0);

  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    setenv(NUMBER_VAR, bad[i], 1);
    v = UNTOUCHED;
    ck_assert_msg(hvd_setting_number(HVD_SET_AUTOTUNE_NOISE, &v) == HVD_ERR_INVALID_ARGUMENT,
                  "'%s' accepted", bad[i]);
    ck_assert_double_eq(v, UNTOUCHED);
    ck_assert_contains(hvd_last_error_message(), NUMBER_VAR);
    ck_assert_contains(hvd_last_error_message(), bad[i]);
    ck_assert_contains(hvd_last_error_message(), "from 0 to 1");
  }
}
END_TEST

START_TEST(test_env_bool) {
  static const char *const bad[] = {"maybe", "2", "y e s"};
  bool v = false;

  ck_assert_int_eq(hvd_setting_bool(HVD_SET_SPIN_YIELD, &v), HVD_OK);
  ck_assert(v);
  setenv(BOOL_VAR, " No ", 1);
  ck_assert_int_eq(hvd_setting_bool(HVD_SET_SPIN_YIELD, &v), HVD_OK);
  ck_assert(!v);
  setenv(BOOL_VAR, "ON", 1);
  ck_assert_int_eq(hvd_setting_bool(HVD_SET_SPIN_YIELD, &v), HVD_OK);
  ck_assert(v);

  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    setenv(BOOL_VAR, bad[i], 1);
    v = false;
    ck_assert_msg(hvd_setting_bool(HVD_SET_SPIN_YIELD, &v) == HVD_ERR_INVALID_ARGUMENT,
                  "'%s' accepted", bad[i]);
    ck_assert(!v);
    ck_assert_contains(hvd_last_error_message(), BOOL_VAR);
    ck_assert_contains(hvd_last_error_message(), bad[i]);
  }
}
END_TEST

/* Words: any other spelling counts as its first; the message lists them. */
START_TEST(test_env_word) {
  int w = -2;
  char text[32];

  ck_assert_int_eq(hvd_setting_word(HVD_SET_ALLREDUCE_ALGORITHM, &w), HVD_OK);
  ck_assert_int_eq(w, 0);
  setenv(WORD_VAR, "hd", 1);
  ck_assert_int_eq(hvd_setting_word(HVD_SET_ALLREDUCE_ALGORITHM, &w), HVD_OK);
  ck_assert_int_eq(w, 3);
  hvd_setting_format_bits(HVD_SET_ALLREDUCE_ALGORITHM, 3, text, sizeof(text));
  ck_assert_str_eq(text, "halving_doubling");
  setenv(WORD_VAR, "Ring", 1); /* exact case for this one */
  ck_assert_int_eq(hvd_setting_word(HVD_SET_ALLREDUCE_ALGORITHM, &w), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_contains(hvd_last_error_message(),
                     WORD_VAR "='Ring' is not one of auto, ring, recursive_doubling, "
                              "halving_doubling");
}
END_TEST

/* hvdrun's checks: the same rules, the flag named, its units scaled. */
START_TEST(test_setting_check) {
  char *out = NULL;

  ck_assert_int_eq(hvd_setting_check(HVD_SET_FUSION_THRESHOLD, "1.5", "--fusion-threshold-mb",
                                     true, &out),
                   HVD_OK);
  ck_assert_str_eq(out, "1572864");
  free(out);
  ck_assert_int_eq(hvd_setting_check(HVD_SET_FUSION_THRESHOLD, "1048577", "--fusion-threshold-mb",
                                     true, &out),
                   HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(out);
  ck_assert_str_eq(hvd_last_error_message(),
                   "--fusion-threshold-mb: '1048577' is not a number from 0 to 1048576");
  ck_assert_int_eq(hvd_setting_check(HVD_SET_SPIN_YIELD, "off", "x.yaml:2: k", true, &out), HVD_OK);
  ck_assert_str_eq(out, "0");
  free(out);
  ck_assert_int_eq(hvd_setting_check(HVD_SET_AUTOTUNE_LOG, "", "--autotune-log-file", true, &out),
                   HVD_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_env_str) {
  ck_assert_ptr_null(hvd_env_str(ENV_NAME));
  setenv(ENV_NAME, "", 1);
  ck_assert_ptr_null(hvd_env_str(ENV_NAME));
  setenv(ENV_NAME, " x ", 1);
  ck_assert_ptr_nonnull(hvd_env_str(ENV_NAME));
  ck_assert_str_eq(hvd_env_str(ENV_NAME), " x ");
}
END_TEST

/* A provided value stands in for an unset variable, never for a set one;
 * a value handed out stays readable after it is replaced. */
START_TEST(test_env_provided) {
  const char *first;
  int64_t v = 0;

  ck_assert_int_eq(hvd_setting_provide(HVD_SET_RING_WINDOW, "7"), HVD_OK);
  ck_assert_str_eq(hvd_setting_given(HVD_SET_RING_WINDOW), "7");
  ck_assert_ptr_null(hvd_setting_real(HVD_SET_RING_WINDOW));
  ck_assert_int_eq(hvd_setting_int(HVD_SET_RING_WINDOW, &v), HVD_OK);
  ck_assert_int_eq(v, 7);
  first = hvd_setting_given(HVD_SET_RING_WINDOW);
  ck_assert_int_eq(hvd_setting_provide(HVD_SET_RING_WINDOW, "8"), HVD_OK);
  ck_assert_str_eq(hvd_setting_given(HVD_SET_RING_WINDOW), "8");
  ck_assert_str_eq(first, "7");
  setenv(INT_VAR, "9", 1); /* the environment wins */
  ck_assert_str_eq(hvd_setting_given(HVD_SET_RING_WINDOW), "9");
  ck_assert_int_eq(hvd_setting_int(HVD_SET_RING_WINDOW, &v), HVD_OK);
  ck_assert_int_eq(v, 9);
  unsetenv(INT_VAR);
  ck_assert_str_eq(hvd_setting_given(HVD_SET_RING_WINDOW), "8");
}
END_TEST

/* ---- clock -------------------------------------------------------------- */

START_TEST(test_clock_monotonic) {
  int64_t prev = hvd_now_ns();
  ck_assert_int_gt(prev, 0);
  for (int i = 0; i < 100000; i++) {
    int64_t now = hvd_now_ns();
    ck_assert_int_ge(now, prev);
    prev = now;
  }
}
END_TEST

START_TEST(test_clock_sleep) {
  /* nanosleep guarantees a lower bound only; that is all this checks. */
  int64_t start = hvd_now_ns();
  hvd_sleep_ns(2000000);
  ck_assert_int_ge(hvd_now_ns() - start, 2000000);
  hvd_sleep_ns(0);
  hvd_sleep_ns(-5);
}
END_TEST

START_TEST(test_clock_deadlines) {
  int64_t before = hvd_now_ns();
  int64_t d = hvd_deadline_after_ms(1000);

  ck_assert_int_ge(d - before, 1000 * INT64_C(1000000));
  ck_assert_int_le(d - hvd_now_ns(), 1000 * INT64_C(1000000));

  ck_assert_int_eq(hvd_deadline_after_ms(-1), HVD_NO_DEADLINE);
  ck_assert_int_eq(hvd_deadline_after_ms(INT64_MIN), HVD_NO_DEADLINE);
  ck_assert_int_eq(hvd_deadline_after_ms(INT64_MAX), HVD_NO_DEADLINE);
  ck_assert_int_eq(hvd_deadline_after_ms(INT64_MAX / 1000), HVD_NO_DEADLINE);
  /* The largest finite deadline stays finite and does not wrap. */
  d = hvd_deadline_after_ms(INT64_C(1000) * 86400 * 365 * 100);
  ck_assert_int_gt(d, hvd_now_ns());

  d = hvd_deadline_after_ms(0);
  ck_assert_int_le(d, hvd_now_ns());
}
END_TEST

START_TEST(test_clock_remaining) {
  int64_t left;

  ck_assert_int_eq(hvd_remaining_ms(0), 0);
  ck_assert_int_eq(hvd_remaining_ms(hvd_now_ns() - 1), 0);
  ck_assert_int_eq(hvd_remaining_ms(hvd_now_ns() - INT64_C(5000000000)), 0);
  ck_assert_int_ge(hvd_remaining_ms(HVD_NO_DEADLINE), INT64_C(1000000000000));

  left = hvd_remaining_ms(hvd_deadline_after_ms(60000));
  ck_assert_int_le(left, 60000);
  ck_assert_int_gt(left, 0);

  left = hvd_remaining_ms(hvd_now_ns() + INT64_C(3600) * 1000000000);
  ck_assert_int_le(left, 3600000);
  ck_assert_int_gt(left, 3000000);
}
END_TEST

START_TEST(test_cond_past_deadline) {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cond;

  ck_assert_int_eq(hvd_cond_init(&cond), 0);
  pthread_mutex_lock(&mu);
  ck_assert_int_eq(hvd_cond_wait_until(&cond, &mu, hvd_now_ns() - 1), ETIMEDOUT);
  ck_assert_int_eq(hvd_cond_wait_until(&cond, &mu, 1), ETIMEDOUT);
  ck_assert_int_eq(hvd_cond_wait_until(&cond, &mu, hvd_deadline_after_ms(0)), ETIMEDOUT);
  pthread_mutex_unlock(&mu);
  pthread_cond_destroy(&cond);
}
END_TEST

struct signal_state {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool flag; /* protected by mu */
};

static void *signal_main(void *arg) {
  struct signal_state *s = arg;
  pthread_mutex_lock(&s->mu);
  s->flag = true;
  pthread_cond_signal(&s->cond);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Waits for another thread's signal; the deadline only guards against hangs. */
static void wait_for_signal(int64_t deadline) {
  struct signal_state s;
  pthread_t thread;
  int rc = 0;

  memset(&s, 0, sizeof(s));
  ck_assert_int_eq(pthread_mutex_init(&s.mu, NULL), 0);
  ck_assert_int_eq(hvd_cond_init(&s.cond), 0);
  /* Holding mu until the wait starts means the signal cannot come first. */
  pthread_mutex_lock(&s.mu);
  ck_assert_int_eq(pthread_create(&thread, NULL, signal_main, &s), 0);
  while (!s.flag && rc == 0)
    rc = hvd_cond_wait_until(&s.cond, &s.mu, deadline);
  pthread_mutex_unlock(&s.mu);
  ck_assert_int_eq(pthread_join(thread, NULL), 0);
  ck_assert_int_eq(rc, 0);
  ck_assert(s.flag);
  pthread_cond_destroy(&s.cond);
  pthread_mutex_destroy(&s.mu);
}

START_TEST(test_cond_signalled) {
  wait_for_signal(hvd_deadline_after_ms(60000));
}
END_TEST

START_TEST(test_cond_signalled_no_deadline) {
  wait_for_signal(HVD_NO_DEADLINE);
}
END_TEST

/* ---- buf ---------------------------------------------------------------- */

START_TEST(test_buf_zeroed) {
  struct hvd_buf b;
  memset(&b, 0, sizeof(b));
  hvd_buf_reset(&b);
  ck_assert_int_eq(hvd_buf_append(&b, NULL, 0), HVD_OK);
  ck_assert_ptr_nonnull(b.data);
  ck_assert_str_eq(b.data, "");
  ck_assert_int_eq(hvd_buf_append(&b, "abc", 3), HVD_OK);
  ck_assert_uint_eq(b.len, 3);
  ck_assert_str_eq(b.data, "abc");
  ck_assert_uint_eq(hvd_buf_room(&b), b.cap - 4); /* no cap: the allocation less the NUL */
  hvd_buf_fini(&b);
  ck_assert_ptr_null(b.data);
  ck_assert_uint_eq(b.len, 0);
  hvd_buf_fini(&b); /* twice is fine */

  memset(&b, 0, sizeof(b));
  hvd_buf_fini(&b);
}
END_TEST

START_TEST(test_buf_append_grows) {
  struct hvd_buf b;
  hvd_buf_init(&b, 0);
  for (int i = 0; i < 10000; i++) {
    char ch = (char)('a' + i % 26);
    ck_assert_int_eq(hvd_buf_append(&b, &ch, 1), HVD_OK);
    ck_assert_uint_eq(b.len, (size_t)i + 1);
    ck_assert_int_eq(b.data[b.len], '\0');
    ck_assert_uint_gt(b.cap, b.len);
  }
  for (int i = 0; i < 10000; i++)
    ck_assert_int_eq(b.data[i], 'a' + i % 26);
  ck_assert_uint_eq(strlen(b.data), 10000);

  /* Binary data with NUL bytes is kept as is. */
  hvd_buf_reset(&b);
  ck_assert_int_eq(hvd_buf_append(&b, "x\0y", 3), HVD_OK);
  ck_assert_uint_eq(b.len, 3);
  ck_assert_mem_eq(b.data, "x\0y", 4);
  hvd_buf_fini(&b);
}
END_TEST

START_TEST(test_buf_printf) {
  struct hvd_buf b;
  hvd_buf_init(&b, 0);
  ck_assert_int_eq(hvd_buf_printf(&b, "a=%d", 1), HVD_OK);
  ck_assert_int_eq(hvd_buf_printf(&b, ",b=%s", "two"), HVD_OK);
  ck_assert_int_eq(hvd_buf_append(&b, ";", 1), HVD_OK);
  ck_assert_int_eq(hvd_buf_printf(&b, "%s", ""), HVD_OK);
  ck_assert_uint_eq(b.len, 10);
  ck_assert_str_eq(b.data, "a=1,b=two;");
  hvd_buf_fini(&b);
}
END_TEST

START_TEST(test_buf_printf_long) {
  enum { BIG_LEN = 100000 };
  char *big = repeat('x', BIG_LEN);
  struct hvd_buf b;

  hvd_buf_init(&b, 0);
  ck_assert_int_eq(hvd_buf_printf(&b, "<%s>", "start"), HVD_OK);
  ck_assert_int_eq(hvd_buf_printf(&b, "%s-%d", big, 7), HVD_OK);
  ck_assert_uint_eq(b.len, 7 + BIG_LEN + 2);
  ck_assert_int_eq(strncmp(b.data, "<start>xxx", 10), 0);
  ck_assert_int_eq(memcmp(b.data + 7, big, BIG_LEN), 0);
  ck_assert_str_eq(b.data + 7 + BIG_LEN, "-7");
  hvd_buf_fini(&b);
  free(big);
}
END_TEST

START_TEST(test_buf_cap) {
  struct hvd_buf b;

  hvd_buf_init(&b, 8);
  /* Refused before anything is allocated. */
  ck_assert_int_eq(hvd_buf_reserve(&b, 9), HVD_ERR_TOO_LARGE);
  ck_assert_ptr_null(b.data);
  ck_assert_int_eq(hvd_buf_append(&b, "123456789", 9), HVD_ERR_TOO_LARGE);
  ck_assert_ptr_null(b.data);
  ck_assert_uint_eq(b.len, 0);
  ck_assert_uint_eq(hvd_buf_room(&b), 0); /* nothing allocated yet */

  ck_assert_int_eq(hvd_buf_append(&b, "12345", 5), HVD_OK);
  ck_assert_uint_eq(hvd_buf_room(&b), 3); /* the cap, not the allocation, limits it */
  ck_assert_int_eq(hvd_buf_printf(&b, "%d", 678), HVD_OK);
  ck_assert_str_eq(b.data, "12345678");
  ck_assert_uint_eq(hvd_buf_room(&b), 0);

  hvd_error_clear();
  ck_assert_int_eq(hvd_buf_append(&b, "9", 1), HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(hvd_error_status(), HVD_ERR_TOO_LARGE);
  ck_assert_contains(hvd_last_error_message(), "8");
  ck_assert_uint_eq(b.len, 8);
  ck_assert_str_eq(b.data, "12345678");
  ck_assert_int_eq(hvd_buf_printf(&b, "%s", "9"), HVD_ERR_TOO_LARGE);
  ck_assert_uint_eq(b.len, 8);
  ck_assert_str_eq(b.data, "12345678");
  /* Exactly at the cap, nothing more: still fine. */
  ck_assert_int_eq(hvd_buf_append(&b, "", 0), HVD_OK);
  ck_assert_int_eq(hvd_buf_reserve(&b, 0), HVD_OK);

  /* The cap survives reset. */
  hvd_buf_reset(&b);
  ck_assert_int_eq(hvd_buf_append(&b, "abcdefgh", 8), HVD_OK);
  ck_assert_int_eq(hvd_buf_append(&b, "i", 1), HVD_ERR_TOO_LARGE);
  ck_assert_str_eq(b.data, "abcdefgh");
  hvd_buf_fini(&b);
}
END_TEST

START_TEST(test_buf_reserve_overflow) {
  struct hvd_buf b;
  hvd_buf_init(&b, 0);
  ck_assert_int_eq(hvd_buf_append(&b, "abc", 3), HVD_OK);
  ck_assert_int_eq(hvd_buf_reserve(&b, SIZE_MAX), HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(hvd_buf_reserve(&b, SIZE_MAX - 3), HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(hvd_buf_append(&b, "x", SIZE_MAX - 2), HVD_ERR_TOO_LARGE);
  ck_assert_str_eq(b.data, "abc");
  ck_assert_uint_eq(b.len, 3);

  /* Reserved room is usable without further growth. */
  ck_assert_int_eq(hvd_buf_reserve(&b, 1000), HVD_OK);
  ck_assert_uint_ge(b.cap, 1004);
  {
    char *before = b.data;
    size_t cap = b.cap;
    char chunk[1000];
    memset(chunk, 'z', sizeof(chunk));
    ck_assert_int_eq(hvd_buf_append(&b, chunk, sizeof(chunk)), HVD_OK);
    ck_assert_ptr_eq(b.data, before);
    ck_assert_uint_eq(b.cap, cap);
  }
  hvd_buf_fini(&b);
}
END_TEST

START_TEST(test_buf_reset) {
  struct hvd_buf b;
  char *data;
  size_t cap;

  hvd_buf_init(&b, 0);
  for (int i = 0; i < 100; i++)
    ck_assert_int_eq(hvd_buf_printf(&b, "%08d", i), HVD_OK);
  data = b.data;
  cap = b.cap;
  hvd_buf_reset(&b);
  ck_assert_uint_eq(b.len, 0);
  ck_assert_ptr_eq(b.data, data);
  ck_assert_uint_eq(b.cap, cap);
  ck_assert_str_eq(b.data, "");
  ck_assert_int_eq(hvd_buf_append(&b, "new", 3), HVD_OK);
  ck_assert_str_eq(b.data, "new");
  hvd_buf_fini(&b);
}
END_TEST

START_TEST(test_buf_detach) {
  struct hvd_buf b;
  size_t len = 0;
  char *data;

  hvd_buf_init(&b, 64);
  ck_assert_int_eq(hvd_buf_printf(&b, "hello %s", "world"), HVD_OK);
  data = hvd_buf_detach(&b, &len);
  ck_assert_ptr_nonnull(data);
  ck_assert_uint_eq(len, 11);
  ck_assert_str_eq(data, "hello world");
  ck_assert_ptr_null(b.data);
  ck_assert_uint_eq(b.len, 0);
  ck_assert_uint_eq(b.cap, 0);

  /* The emptied buffer is reusable, keeps its cap, and owns new memory. */
  ck_assert_int_eq(hvd_buf_append(&b, "again", 5), HVD_OK);
  ck_assert_ptr_ne(b.data, data);
  ck_assert_str_eq(b.data, "again");
  ck_assert_int_eq(hvd_buf_reserve(&b, 100), HVD_ERR_TOO_LARGE);
  free(data);

  data = hvd_buf_detach(&b, NULL);
  ck_assert_str_eq(data, "again");
  free(data);
  hvd_buf_fini(&b);
}
END_TEST

/* ---- map ---------------------------------------------------------------- */

#define VAL(i) ((void *)(uintptr_t)(i))

static int key_of(char *buf, size_t size, int i) { return snprintf(buf, size, "key-%d", i); }

START_TEST(test_map_basic) {
  struct hvd_map m;
  void *old = VAL(UNTOUCHED);

  hvd_map_init(&m);
  ck_assert_ptr_null(hvd_map_get(&m, "a", 1));
  ck_assert_ptr_null(hvd_map_remove(&m, "a", 1));

  ck_assert_int_eq(hvd_map_put(&m, "a", 1, VAL(1), &old), HVD_OK);
  ck_assert_ptr_null(old);
  ck_assert_int_eq(hvd_map_put(&m, "b", 1, VAL(2), NULL), HVD_OK);
  ck_assert_uint_eq(m.count, 2);
  ck_assert_ptr_eq(hvd_map_get(&m, "a", 1), VAL(1));
  ck_assert_ptr_eq(hvd_map_get(&m, "b", 1), VAL(2));
  ck_assert_ptr_null(hvd_map_get(&m, "c", 1));

  /* Replace hands back the old value and does not add an entry. */
  old = NULL;
  ck_assert_int_eq(hvd_map_put(&m, "a", 1, VAL(10), &old), HVD_OK);
  ck_assert_ptr_eq(old, VAL(1));
  ck_assert_uint_eq(m.count, 2);
  ck_assert_ptr_eq(hvd_map_get(&m, "a", 1), VAL(10));
  ck_assert_int_eq(hvd_map_put(&m, "a", 1, VAL(11), NULL), HVD_OK);
  ck_assert_ptr_eq(hvd_map_get(&m, "a", 1), VAL(11));

  ck_assert_ptr_eq(hvd_map_remove(&m, "a", 1), VAL(11));
  ck_assert_ptr_null(hvd_map_get(&m, "a", 1));
  ck_assert_ptr_null(hvd_map_remove(&m, "a", 1));
  ck_assert_uint_eq(m.count, 1);

  /* Re-inserting a removed key is a fresh insert. */
  old = VAL(UNTOUCHED);
  ck_assert_int_eq(hvd_map_put(&m, "a", 1, VAL(12), &old), HVD_OK);
  ck_assert_ptr_null(old);
  ck_assert_uint_eq(m.count, 2);
  ck_assert_ptr_eq(hvd_map_get(&m, "a", 1), VAL(12));
  hvd_map_fini(&m);
  ck_assert_uint_eq(m.count, 0);
  ck_assert_ptr_null(m.slots);
}
END_TEST

START_TEST(test_map_key_is_copied) {
  struct hvd_map m;
  char key[8] = "mutable";
  hvd_map_init(&m);
  ck_assert_int_eq(hvd_map_put(&m, key, 7, VAL(1), NULL), HVD_OK);
  memset(key, 'X', sizeof(key));
  ck_assert_ptr_eq(hvd_map_get(&m, "mutable", 7), VAL(1));
  ck_assert_ptr_null(hvd_map_get(&m, key, 7));
  hvd_map_fini(&m);
}
END_TEST

START_TEST(test_map_binary_keys) {
  static const struct {
    const char *key;
    size_t len;
  } keys[] = {
      {"", 0},         {"a", 1},        {"a\0", 2},      {"a\0b", 3},   {"a\0c", 3},
      {"\0", 1},       {"\0\0", 2},     {"ab", 2},       {"abc", 3},    {"b\0a", 3},
  };
  struct hvd_map m;
  struct hvd_map_iter it = {0};
  const char *key;
  size_t key_len;
  void *value;
  size_t seen = 0;

  hvd_map_init(&m);
  for (size_t i = 0; i < HVD_ARRAY_SIZE(keys); i++) {
    void *old = VAL(UNTOUCHED);
    ck_assert_int_eq(hvd_map_put(&m, keys[i].key, keys[i].len, VAL(i + 1), &old), HVD_OK);
    ck_assert_msg(old == NULL, "key %zu collided with an earlier one", i);
  }
  ck_assert_uint_eq(m.count, HVD_ARRAY_SIZE(keys));
  for (size_t i = 0; i < HVD_ARRAY_SIZE(keys); i++)
    ck_assert_ptr_eq(hvd_map_get(&m, keys[i].key, keys[i].len), VAL(i + 1));

  /* Iteration hands back the exact bytes and length. */
  while (hvd_map_iter_next(&m, &it, &key, &key_len, &value)) {
    size_t i = (uintptr_t)value - 1;
    ck_assert_uint_lt(i, HVD_ARRAY_SIZE(keys));
    ck_assert_uint_eq(key_len, keys[i].len);
    ck_assert_int_eq(memcmp(key, keys[i].key, key_len), 0);
    seen++;
  }
  ck_assert_uint_eq(seen, HVD_ARRAY_SIZE(keys));

  ck_assert_ptr_eq(hvd_map_remove(&m, "a\0", 2), VAL(3));
  ck_assert_ptr_eq(hvd_map_get(&m, "a", 1), VAL(2));
  ck_assert_ptr_eq(hvd_map_get(&m, "a\0b", 3), VAL(4));
  ck_assert_ptr_null(hvd_map_get(&m, "a\0", 2));
  hvd_map_fini(&m);
}
END_TEST

START_TEST(test_map_many_keys) {
  enum { N = 100000 };
  struct hvd_map m;
  struct hvd_map_iter it = {0};
  unsigned char *seen = calloc(N, 1);
  const char *key;
  size_t key_len, visited = 0;
  void *value;
  char buf[32];

  ck_assert_ptr_nonnull(seen);
  hvd_map_init(&m);
  for (int i = 0; i < N; i++) {
    int len = key_of(buf, sizeof(buf), i);
    ck_assert_int_eq(hvd_map_put(&m, buf, (size_t)len, VAL(i + 1), NULL), HVD_OK);
  }
  ck_assert_uint_eq(m.count, N);
  for (int i = 0; i < N; i++) {
    int len = key_of(buf, sizeof(buf), i);
    ck_assert_ptr_eq(hvd_map_get(&m, buf, (size_t)len), VAL(i + 1));
  }
  for (int i = 0; i < N; i += 2) {
    int len = key_of(buf, sizeof(buf), i);
    ck_assert_ptr_eq(hvd_map_remove(&m, buf, (size_t)len), VAL(i + 1));
  }
  ck_assert_uint_eq(m.count, N / 2);
  for (int i = 0; i < N; i++) {
    int len = key_of(buf, sizeof(buf), i);
    if (i % 2 == 0)
      ck_assert_ptr_null(hvd_map_get(&m, buf, (size_t)len));
    else
      ck_assert_ptr_eq(hvd_map_get(&m, buf, (size_t)len), VAL(i + 1));
  }

  /* Each live entry exactly once, with its own value. */
  while (hvd_map_iter_next(&m, &it, &key, &key_len, &value)) {
    int i = (int)((uintptr_t)value - 1);
    int len;
    ck_assert_int_ge(i, 0);
    ck_assert_int_lt(i, N);
    ck_assert_int_eq(i % 2, 1);
    ck_assert_int_eq(seen[i], 0);
    seen[i] = 1;
    len = key_of(buf, sizeof(buf), i);
    ck_assert_uint_eq(key_len, (size_t)len);
    ck_assert_int_eq(memcmp(key, buf, key_len), 0);
    visited++;
  }
  ck_assert_uint_eq(visited, N / 2);
  hvd_map_fini(&m);
  free(seen);
}
END_TEST

START_TEST(test_map_iter_remove) {
  enum { N = 50 };
  struct hvd_map m;
  struct hvd_map_iter it = {0};
  int visits[N] = {0};
  const char *key;
  size_t key_len;
  void *value;
  char buf[32];

  hvd_map_init(&m);
  for (int i = 0; i < N; i++) {
    int len = key_of(buf, sizeof(buf), i);
    ck_assert_int_eq(hvd_map_put(&m, buf, (size_t)len, VAL(i + 1), NULL), HVD_OK);
  }
  /* Remove every multiple of 3 while walking; keys and values stay valid. */
  while (hvd_map_iter_next(&m, &it, &key, &key_len, &value)) {
    int i = (int)((uintptr_t)value - 1);
    visits[i]++;
    if (i % 3 == 0)
      hvd_map_iter_remove(&m, &it);
  }
  for (int i = 0; i < N; i++) {
    int len = key_of(buf, sizeof(buf), i);
    ck_assert_int_eq(visits[i], 1);
    if (i % 3 == 0)
      ck_assert_ptr_null(hvd_map_get(&m, buf, (size_t)len));
    else
      ck_assert_ptr_eq(hvd_map_get(&m, buf, (size_t)len), VAL(i + 1));
  }
  ck_assert_uint_eq(m.count, N - (N + 2) / 3);

  /* Removing everything during one walk empties the map. */
  memset(&it, 0, sizeof(it));
  while (hvd_map_iter_next(&m, &it, NULL, NULL, NULL))
    hvd_map_iter_remove(&m, &it);
  ck_assert_uint_eq(m.count, 0);
  memset(&it, 0, sizeof(it));
  ck_assert(!hvd_map_iter_next(&m, &it, &key, &key_len, &value));
  hvd_map_fini(&m);
}
END_TEST

START_TEST(test_map_tombstones) {
  struct hvd_map m;
  char buf[32];
  size_t max_cap = 0;

  hvd_map_init(&m);
  ck_assert_int_eq(hvd_map_put(&m, "anchor", 6, VAL(1), NULL), HVD_OK);
  /* Churn: many insert/remove rounds leave tombstones behind. */
  for (int round = 0; round < 200; round++) {
    for (int i = 0; i < 500; i++) {
      int len = key_of(buf, sizeof(buf), round * 1000 + i);
      ck_assert_int_eq(hvd_map_put(&m, buf, (size_t)len, VAL(i + 2), NULL), HVD_OK);
    }
    for (int i = 0; i < 500; i++) {
      int len = key_of(buf, sizeof(buf), round * 1000 + i);
      ck_assert_ptr_eq(hvd_map_remove(&m, buf, (size_t)len), VAL(i + 2));
    }
    ck_assert_uint_eq(m.count, 1);
    if (m.cap > max_cap)
      max_cap = m.cap;
  }
  /* Tombstones are reclaimed, not answered with endless growth. */
  ck_assert_uint_le(max_cap, 4096);
  ck_assert_uint_lt(m.count + m.tombstones, m.cap);
  ck_assert_ptr_eq(hvd_map_get(&m, "anchor", 6), VAL(1));

  /* Lookups of absent keys still terminate and inserts still work. */
  for (int i = 0; i < 2000; i++) {
    int len = key_of(buf, sizeof(buf), i);
    ck_assert_ptr_null(hvd_map_get(&m, buf, (size_t)len));
    ck_assert_int_eq(hvd_map_put(&m, buf, (size_t)len, VAL(i + 2), NULL), HVD_OK);
  }
  for (int i = 0; i < 2000; i++) {
    int len = key_of(buf, sizeof(buf), i);
    void *old = NULL;
    ck_assert_ptr_eq(hvd_map_get(&m, buf, (size_t)len), VAL(i + 2));
    /* A replace finds the one entry; no duplicate sits behind a tombstone. */
    ck_assert_int_eq(hvd_map_put(&m, buf, (size_t)len, VAL(i + 3), &old), HVD_OK);
    ck_assert_ptr_eq(old, VAL(i + 2));
  }
  ck_assert_uint_eq(m.count, 2001);
  hvd_map_fini(&m);
}
END_TEST

START_TEST(test_map_zeroed) {
  struct hvd_map m;
  struct hvd_map_iter it = {0};

  memset(&m, 0, sizeof(m));
  ck_assert_ptr_null(hvd_map_get(&m, "x", 1));
  ck_assert_ptr_null(hvd_map_remove(&m, "x", 1));
  ck_assert(!hvd_map_iter_next(&m, &it, NULL, NULL, NULL));
  hvd_map_fini(&m);
  hvd_map_fini(&m);

  /* A zeroed map accepts inserts too. */
  ck_assert_int_eq(hvd_map_put(&m, "x", 1, VAL(5), NULL), HVD_OK);
  ck_assert_ptr_eq(hvd_map_get(&m, "x", 1), VAL(5));
  hvd_map_fini(&m);
  ck_assert_ptr_null(hvd_map_get(&m, "x", 1));
}
END_TEST

/* ---- util --------------------------------------------------------------- */

START_TEST(test_strndup) {
  char *s = hvd_strndup("hello", 5);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(s, "hello");
  free(s);

  s = hvd_strndup("hello", 3);
  ck_assert_str_eq(s, "hel");
  free(s);

  s = hvd_strndup("", 0);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(s, "");
  free(s);

  /* Exactly len bytes, NUL bytes included, plus a terminator. */
  s = hvd_strndup("a\0b", 3);
  ck_assert_mem_eq(s, "a\0b\0", 4);
  free(s);

  /* The source need not be NUL-terminated. */
  {
    char *raw = malloc(4);
    ck_assert_ptr_nonnull(raw);
    memcpy(raw, "wxyz", 4);
    s = hvd_strndup(raw, 4);
    ck_assert_str_eq(s, "wxyz");
    ck_assert_ptr_ne(s, raw);
    free(s);
    free(raw);
  }
}
END_TEST

START_TEST(test_secure_equal) {
  ck_assert(hvd_secure_equal("secret", 6, "secret", 6));
  ck_assert(hvd_secure_equal("", 0, "", 0));
  ck_assert(hvd_secure_equal("a\0b", 3, "a\0b", 3));
  ck_assert(!hvd_secure_equal("secret", 6, "secreT", 6));
  ck_assert(!hvd_secure_equal("secret", 6, "Secret", 6));
  ck_assert(!hvd_secure_equal("a\0b", 3, "a\0c", 3));
  ck_assert(!hvd_secure_equal("secret", 6, "secret!", 7));
  ck_assert(!hvd_secure_equal("secret!", 7, "secret", 6));
  ck_assert(!hvd_secure_equal("secret", 6, "", 0));
  ck_assert(!hvd_secure_equal("", 0, "x", 1));
  /* Every bit of every byte counts. */
  for (int byte = 0; byte < 4; byte++) {
    for (int bit = 0; bit < 8; bit++) {
      unsigned char a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
      b[byte] ^= (unsigned char)(1u << bit);
      ck_assert(!hvd_secure_equal(a, 4, b, 4));
    }
  }
}
END_TEST

/* ---- main --------------------------------------------------------------- */

static Suite *errors_suite(void) {
  Suite *s = suite_create("errors");
  TCase *tc = tcase_create("errors");
  tcase_add_checked_fixture(tc, hvd_error_clear, hvd_error_clear);
  tcase_add_test(tc, test_strerror_every_status);
  tcase_add_test(tc, test_strerror_elastic_statuses);
  tcase_add_test(tc, test_strerror_unknown);
  tcase_add_test(tc, test_error_sets_status_and_message);
  tcase_add_test(tc, test_error_prefix);
  tcase_add_test(tc, test_error_long_message_truncated);
  tcase_add_test(tc, test_error_long_prefix_truncated);
  tcase_add_test(tc, test_error_per_thread);
  tcase_add_test(tc, test_version);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *log_suite(void) {
  Suite *s = suite_create("log");
  TCase *tc = tcase_create("log");
  tcase_add_checked_fixture(tc, log_defaults, log_defaults);
  tcase_add_test(tc, test_log_parse_level_accepts);
  tcase_add_test(tc, test_log_parse_level_rejects);
  tcase_add_test(tc, test_log_configure_bad_level);
  tcase_add_test(tc, test_log_configure_bad_hide_time);
  tcase_add_test(tc, test_log_configure_applies);
  tcase_add_test(tc, test_log_format_rank);
  tcase_add_test(tc, test_log_format_name);
  tcase_add_test(tc, test_log_long_name_truncated);
  tcase_add_test(tc, test_log_format_timestamp);
  tcase_add_test(tc, test_log_threshold);
  tcase_add_test(tc, test_log_long_message_truncated);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *parse_suite(void) {
  Suite *s = suite_create("parse");
  TCase *tc = tcase_create("parse");
  tcase_add_test(tc, test_parse_int64_accepts);
  tcase_add_test(tc, test_parse_int64_rejects);
  tcase_add_test(tc, test_parse_int64_len);
  tcase_add_test(tc, test_parse_double);
  tcase_add_test(tc, test_parse_bool);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *env_suite(void) {
  Suite *s = suite_create("env");
  TCase *tc = tcase_create("env");
  tcase_add_checked_fixture(tc, env_clear, env_clear);
  tcase_add_test(tc, test_env_int_values);
  tcase_add_test(tc, test_env_int_malformed);
  tcase_add_test(tc, test_env_int_out_of_range);
  tcase_add_test(tc, test_env_int_huge_value);
  tcase_add_test(tc, test_env_double);
  tcase_add_test(tc, test_env_bool);
  tcase_add_test(tc, test_env_word);
  tcase_add_test(tc, test_setting_check);
  tcase_add_test(tc, test_env_str);
  tcase_add_test(tc, test_env_provided);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *clock_suite(void) {
  Suite *s = suite_create("clock");
  TCase *tc = tcase_create("clock");
  tcase_add_test(tc, test_clock_monotonic);
  tcase_add_test(tc, test_clock_sleep);
  tcase_add_test(tc, test_clock_deadlines);
  tcase_add_test(tc, test_clock_remaining);
  tcase_add_test(tc, test_cond_past_deadline);
  tcase_add_test(tc, test_cond_signalled);
  tcase_add_test(tc, test_cond_signalled_no_deadline);
  suite_add_tcase(s, tc);
  return s;
}

START_TEST(test_array_reserve) {
  int *a = NULL;
  size_t cap = 0;
  ck_assert_int_eq(hvd_array_reserve(&a, &cap, 0, sizeof(*a), 4), HVD_OK);
  ck_assert_ptr_nonnull(a); /* never NULL once reserved, even for none */
  ck_assert_uint_eq(cap, 4);
  for (int i = 0; i < 4; i++)
    a[i] = i;
  ck_assert_int_eq(hvd_array_reserve(&a, &cap, 4, sizeof(*a), 4), HVD_OK);
  ck_assert_uint_eq(cap, 4); /* enough already */
  ck_assert_int_eq(hvd_array_reserve(&a, &cap, 9, sizeof(*a), 4), HVD_OK);
  ck_assert_uint_eq(cap, 16); /* doubled until it fits */
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(a[i], i);
  ck_assert_int_eq(hvd_array_reserve(&a, &cap, SIZE_MAX / 2, sizeof(*a), 4), HVD_ERR_TOO_LARGE);
  ck_assert_uint_eq(cap, 16); /* unchanged on failure */
  ck_assert_int_eq(a[3], 3);
  free(a);
}
END_TEST

static Suite *buf_suite(void) {
  Suite *s = suite_create("buf");
  TCase *tc = tcase_create("buf");
  tcase_add_test(tc, test_buf_zeroed);
  tcase_add_test(tc, test_buf_append_grows);
  tcase_add_test(tc, test_buf_printf);
  tcase_add_test(tc, test_buf_printf_long);
  tcase_add_test(tc, test_buf_cap);
  tcase_add_test(tc, test_buf_reserve_overflow);
  tcase_add_test(tc, test_array_reserve);
  tcase_add_test(tc, test_buf_reset);
  tcase_add_test(tc, test_buf_detach);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *map_suite(void) {
  Suite *s = suite_create("map");
  TCase *tc = tcase_create("map");
  tcase_add_test(tc, test_map_basic);
  tcase_add_test(tc, test_map_key_is_copied);
  tcase_add_test(tc, test_map_binary_keys);
  tcase_add_test(tc, test_map_many_keys);
  tcase_add_test(tc, test_map_iter_remove);
  tcase_add_test(tc, test_map_tombstones);
  tcase_add_test(tc, test_map_zeroed);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *util_suite(void) {
  Suite *s = suite_create("util");
  TCase *tc = tcase_create("util");
  tcase_add_test(tc, test_strndup);
  tcase_add_test(tc, test_secure_equal);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(errors_suite());
  int failed;

  srunner_add_suite(sr, log_suite());
  srunner_add_suite(sr, parse_suite());
  srunner_add_suite(sr, env_suite());
  srunner_add_suite(sr, clock_suite());
  srunner_add_suite(sr, buf_suite());
  srunner_add_suite(sr, map_suite());
  srunner_add_suite(sr, util_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
