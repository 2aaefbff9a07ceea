/*
 * hvdrun's pieces without processes: the command line, hosts and slots,
 * output prefixing, shell quoting. The job itself is tested end to end
 * (tests/e2e/hvdrun.sh).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hvdrun.h"

/* ==== options ============================================================== */

static hvd_status parse(struct hvdrun_options *o, bool *help, const char *const *args) {
  static char *argv[32]; /* o->command points into it */
  int argc = 0;
  argv[argc++] = "hvdrun";
  for (; *args != NULL; args++)
    argv[argc++] = (char *)*args;
  argv[argc] = NULL;
  return hvdrun_parse(argc, argv, o, help);
}

START_TEST(options_horovodrun_names) {
  struct hvdrun_options o;
  bool help;
  const char *args[] = {"-np", "4", "-H", "a:2,b:2", "-p", "2222", "-i", "key",
                        "--network-interface=eth", "--fusion-threshold-mb", "64",
                        "--cycle-time-ms", "0.5", "--cache-capacity", "0", "-x", "FOO=1", "-x",
                        "BAR", "--hierarchical-allreduce", "--", "train", "--steps", "3", NULL};
  ck_assert_int_eq(parse(&o, &help, args), HVD_OK);
  ck_assert(!help);
  ck_assert_int_eq(o.np, 4);
  ck_assert_str_eq(o.hosts, "a:2,b:2");
  ck_assert_int_eq(o.ssh_port, 2222);
  ck_assert_str_eq(o.ssh_identity, "key");
  ck_assert_str_eq(o.iface, "eth");
  ck_assert_str_eq(o.fusion_mb, "64");
  ck_assert_str_eq(o.cycle_ms, "0.5");
  ck_assert_str_eq(o.cache_capacity, "0");
  ck_assert_uint_eq(o.nexports, 2);
  ck_assert_str_eq(o.exports[1], "BAR");
  ck_assert(o.hier_allreduce && !o.hier_allgather);
  ck_assert_int_eq(o.ncommand, 3);
  ck_assert_str_eq(o.command[0], "train");
  ck_assert_str_eq(o.command[1], "--steps"); /* the command's own options stay its own */
  ck_assert(o.prefix);
  ck_assert_int_eq(o.start_timeout_s, 30);
  hvdrun_options_fini(&o);
}
END_TEST

START_TEST(options_errors_name_the_argument) {
  static const struct {
    const char *args[6];
    const char *says;
  } cases[] = {
      {{"-np", "0", "x", NULL}, "-np"},
      {{"-np", "two", "x", NULL}, "'two'"},
      {{"-n", "2", "x", NULL}, "unknown option '-n'"},
      {{"--verbose=1", "x", NULL}, "takes no value"},
      {{"-np", NULL}, "needs a value"},
      {{"-np", "2", NULL}, "no command"},
      {{"-H", "a:1", "--hostfile", "f", "x", NULL}, "exclude"},
      {{"-p", "70000", "x", NULL}, "port"},
      {{"--cache-capacity", "1.5", "x", NULL}, "whole number"},
      {{"--log-level", "loud", "x", NULL}, "log level"},
      {{"-x", "=v", "x", NULL}, "variable name"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct hvdrun_options o;
    bool help;
    ck_assert_int_eq(parse(&o, &help, cases[i].args), HVD_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(hvd_last_error_message(), cases[i].says) != NULL, "case %zu: %s", i,
                  hvd_last_error_message());
    ck_assert(strchr(hvd_last_error_message(), '\n') == NULL);
    hvdrun_options_fini(&o);
  }
}
END_TEST

START_TEST(options_help) {
  struct hvdrun_options o;
  bool help;
  const char *args[] = {"--help", NULL};
  ck_assert_int_eq(parse(&o, &help, args), HVD_OK);
  ck_assert(help);
  hvdrun_options_fini(&o);
}
END_TEST

/* ==== hosts and slots ======================================================= */

START_TEST(hosts_parse_and_reject) {
  struct hvdrun_host *h = NULL;
  size_t n = 0;
  ck_assert_int_eq(hvdrun_parse_hosts("worker-0:2,worker_1.x:4,solo", &h, &n), HVD_OK);
  ck_assert_uint_eq(n, 3);
  ck_assert_str_eq(h[1].name, "worker_1.x");
  ck_assert_int_eq(h[1].slots, 4);
  ck_assert_int_eq(h[2].slots, 1);
  free(h);
  const char *bad[] = {"", "a:0", "a:", "a:-1", "a:2,,b:1", "a b:1", "a:1,a:2", ":3", "a:1x"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    ck_assert_msg(hvdrun_parse_hosts(bad[i], &h, &n) == HVD_ERR_INVALID_ARGUMENT, "'%s'",
                  bad[i]);
}
END_TEST

START_TEST(hostfile_lines) {
  char path[] = "/tmp/hvd-hostfile-XXXXXX";
  int fd = mkstemp(path);
  struct hvdrun_host *h = NULL;
  size_t n = 0;
  FILE *f = fdopen(fd, "w");
  fputs("# the cluster\nnode1 slots=2\n\n  node2   slots=4  # big\nnode3\n", f);
  fclose(f);
  ck_assert_int_eq(hvdrun_read_hostfile(path, &h, &n), HVD_OK);
  ck_assert_uint_eq(n, 3);
  ck_assert_str_eq(h[1].name, "node2");
  ck_assert_int_eq(h[1].slots, 4);
  ck_assert_int_eq(h[2].slots, 1);
  free(h);
  f = fopen(path, "w");
  fputs("node1 slots=2\nnode2 slots=zero\n", f);
  fclose(f);
  ck_assert_int_eq(hvdrun_read_hostfile(path, &h, &n), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(hvd_last_error_message(), "line 2") != NULL, "%s", hvd_last_error_message());
  unlink(path);
  ck_assert_int_eq(hvdrun_read_hostfile(path, &h, &n), HVD_ERR_INVALID_ARGUMENT);
}
END_TEST

static void expect_slot(const struct hvdrun_slot *s, int host, int lr, int ls, int cr, int cs) {
  ck_assert_int_eq(s->host, host);
  ck_assert_int_eq(s->local_rank, lr);
  ck_assert_int_eq(s->local_size, ls);
  ck_assert_int_eq(s->cross_rank, cr);
  ck_assert_int_eq(s->cross_size, cs);
}

/* Horovod's own examples (horovod-spec.md 2.3). */
START_TEST(assignment_as_horovod) {
  struct hvdrun_host *h;
  struct hvdrun_slot *s;
  size_t n;
  int size;

  ck_assert_int_eq(hvdrun_parse_hosts("worker-0:2,worker-1:2", &h, &n), HVD_OK);
  ck_assert_int_eq(hvdrun_assign(h, n, 4, &s, &size), HVD_OK);
  ck_assert_int_eq(size, 4);
  expect_slot(&s[0], 0, 0, 2, 0, 2);
  expect_slot(&s[1], 0, 1, 2, 0, 2);
  expect_slot(&s[2], 1, 0, 2, 1, 2);
  expect_slot(&s[3], 1, 1, 2, 1, 2);
  free(s);
  /* -np caps: only the first host's slots. */
  ck_assert_int_eq(hvdrun_assign(h, n, 2, &s, &size), HVD_OK);
  ck_assert_int_eq(size, 2);
  expect_slot(&s[1], 0, 1, 2, 0, 1);
  free(s);
  ck_assert_int_eq(hvdrun_assign(h, n, 5, &s, &size), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvdrun_assign(h, n, -1, &s, &size), HVD_OK); /* every slot */
  ck_assert_int_eq(size, 4);
  free(s);
  free(h);

  ck_assert_int_eq(hvdrun_parse_hosts("worker-0:1,worker-1:2", &h, &n), HVD_OK);
  ck_assert_int_eq(hvdrun_assign(h, n, 3, &s, &size), HVD_OK);
  expect_slot(&s[0], 0, 0, 1, 0, 2);
  expect_slot(&s[1], 1, 0, 2, 1, 2);
  expect_slot(&s[2], 1, 1, 2, 0, 1);
  for (int r = 0; r < size; r++) {
    ck_assert_int_eq(s[r].rank, r);
    ck_assert_int_eq(s[r].size, 3);
  }
  free(s);
  free(h);
}
END_TEST

START_TEST(local_hosts) {
  char self[256];
  ck_assert(hvdrun_host_is_local("localhost"));
  ck_assert(hvdrun_host_is_local("127.0.0.1"));
  ck_assert_int_eq(gethostname(self, sizeof(self)), 0);
  ck_assert(hvdrun_host_is_local(self));
  ck_assert(!hvdrun_host_is_local("no-such-host.invalid"));
  ck_assert(!hvdrun_host_is_local("192.0.2.1")); /* TEST-NET-1 */
}
END_TEST

/* ==== output ================================================================ */

/* Feeds the chunks through a stream into a memory file; returns the text. */
static char *through(bool prefix, const char *const *chunks, char **copy) {
  static char out[4096], file[4096];
  FILE *o = fmemopen(out, sizeof(out), "w"), *f = fmemopen(file, sizeof(file), "w");
  struct hvdrun_stream s;
  hvdrun_stream_init(&s, 3, false, o, f, prefix, false);
  for (; *chunks != NULL; chunks++)
    hvdrun_stream_feed(&s, *chunks, strlen(*chunks));
  hvdrun_stream_finish(&s);
  hvdrun_stream_fini(&s);
  fclose(o);
  fclose(f);
  if (copy != NULL)
    *copy = file;
  return out;
}

START_TEST(output_lines_prefixed) {
  const char *chunks[] = {"one\ntw", "o\rthree\r", "\nfour\r\nfi", "ve", NULL};
  char *copy;
  ck_assert_str_eq(through(true, chunks, &copy),
                   "[3]<stdout>:one\n[3]<stdout>:two\n[3]<stdout>:three\n[3]<stdout>:four\n"
                   "[3]<stdout>:five\n");
  ck_assert_str_eq(copy, "one\ntwo\rthree\r\nfour\r\nfive"); /* the file: as written */
  const char *empty[] = {"\n\nx\n", NULL};
  ck_assert_str_eq(through(true, empty, NULL), "[3]<stdout>:\n[3]<stdout>:\n[3]<stdout>:x\n");
  const char *plain[] = {"a\rb\n", "c", NULL};
  ck_assert_str_eq(through(false, plain, NULL), "a\nb\nc\n");
  const char *utf8[] = {"caf\xc3", "\xa9 ok\n", NULL}; /* split inside a character */
  ck_assert_str_eq(through(true, utf8, NULL), "[3]<stdout>:caf\xc3\xa9 ok\n");
}
END_TEST

START_TEST(output_long_line_in_pieces) {
  static char out[300000];
  size_t big = 150000;
  char *line = malloc(big + 1);
  FILE *o = fmemopen(out, sizeof(out), "w");
  struct hvdrun_stream s;
  memset(line, 'x', big);
  line[big] = '\n';
  hvdrun_stream_init(&s, 0, true, o, NULL, true, false);
  for (size_t off = 0; off <= big; off += 1000) /* as a pipe delivers it */
    hvdrun_stream_feed(&s, line + off, off + 1000 <= big + 1 ? 1000 : big + 1 - off);
  hvdrun_stream_finish(&s);
  hvdrun_stream_fini(&s);
  fclose(o);
  free(line);
  /* A partial line is held only up to 64 KiB: then it goes out in pieces,
   * each with the prefix, and nothing is lost. */
  size_t lines = 0, xs = 0;
  for (char *p = out; *p != '\0'; p++) {
    if (strncmp(p, "[0]<stderr>:", 12) == 0) {
      lines++;
      p += 11;
    } else if (*p == 'x') {
      xs++;
    }
  }
  ck_assert_uint_eq(xs, big);
  ck_assert_uint_eq(lines, 3);
}
END_TEST

START_TEST(shell_quoting) {
  char *text = NULL;
  size_t len = 0, cap = 0;
  ck_assert_int_eq(hvdrun_append(&text, &len, &cap, "echo "), HVD_OK);
  ck_assert_int_eq(hvdrun_shell_quote("it's $HOME `x`", &text, &len, &cap), HVD_OK);
  ck_assert_str_eq(text, "echo 'it'\\''s $HOME `x`'");
  ck_assert_uint_eq(len, strlen(text));
  free(text);
}
END_TEST

START_TEST(environment_replaces) {
  struct hvdrun_env e = {0};
  char **a;
  ck_assert_int_eq(hvdrun_env_put(&e, "A=1"), HVD_OK);
  ck_assert_int_eq(hvdrun_env_set(&e, "B", "%d", 2), HVD_OK);
  ck_assert_int_eq(hvdrun_env_put(&e, "A=3"), HVD_OK);
  ck_assert_int_eq(hvdrun_env_put(&e, "AB=4"), HVD_OK);
  a = hvdrun_env_array(&e);
  ck_assert_str_eq(a[0], "A=3");
  ck_assert_str_eq(a[1], "B=2");
  ck_assert_str_eq(a[2], "AB=4");
  ck_assert_ptr_null(a[3]);
  free(a);
  hvdrun_env_fini(&e);
}
END_TEST

static Suite *launcher_suite(void) {
  Suite *s = suite_create("parts");
  TCase *tc = tcase_create("parts");
  tcase_add_test(tc, options_horovodrun_names);
  tcase_add_test(tc, options_errors_name_the_argument);
  tcase_add_test(tc, options_help);
  tcase_add_test(tc, hosts_parse_and_reject);
  tcase_add_test(tc, hostfile_lines);
  tcase_add_test(tc, assignment_as_horovod);
  tcase_add_test(tc, local_hosts);
  tcase_add_test(tc, output_lines_prefixed);
  tcase_add_test(tc, output_long_line_in_pieces);
  tcase_add_test(tc, shell_quoting);
  tcase_add_test(tc, environment_replaces);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(launcher_suite());
  int failed;
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
