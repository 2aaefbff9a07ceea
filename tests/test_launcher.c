/*
 * hvdrun's pieces: the command line, hosts and slots, the elastic view of
 * hosts, output prefixing, shell quoting, the ranks' Python path, the
 * store's start-up, and the supervisor with small processes of its own.
 * The tuning flags, the config file and --check-build are in
 * test_launcher_config.c. The jobs themselves are tested end to end
 * (tests/e2e/hvdrun.sh).
 */
#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rendezvous/rendezvous.h"
#include "supervise.h"

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
  ck_assert_str_eq(o.settings[HVD_SET_FUSION_THRESHOLD], "67108864"); /* MiB to bytes */
  ck_assert_str_eq(o.settings[HVD_SET_CYCLE_TIME], "0.5");
  ck_assert_str_eq(o.settings[HVD_SET_CACHE_CAPACITY], "0");
  ck_assert_uint_eq(o.nexports, 2);
  ck_assert_str_eq(o.exports[1], "BAR");
  ck_assert(hvdrun_setting_on(&o, HVD_SET_HIERARCHICAL_ALLREDUCE));
  ck_assert_ptr_null(o.settings[HVD_SET_HIERARCHICAL_ALLGATHER]);
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
      {{"--cache-capacity", "1048577", "x", NULL}, "from 0 to 1048576"},
      {{"--cycle-time-ms", "60001", "x", NULL}, "'60001' is not a number of ms from 0 to 60000"},
      {{"--jsrun", "-np", "2", "x", NULL}, "--jsrun: hvd does not launch through jsrun"},
      {{"--log-level", "loud", "x", NULL}, "'loud' is not one of trace, debug"},
      {{"-x", "=v", "x", NULL}, "variable name"},
      {{"--mpi", "-np", "2", "x", NULL}, "--mpi: hvd has no MPI; drop --mpi"},
      {{"--gloo=yes", "x", NULL}, "--gloo takes no value"},
      {{"--horovod-compat=1", "x", NULL}, "--horovod-compat takes no value"},
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

START_TEST(options_python) {
  struct hvdrun_options o;
  bool help;
  const char *plain[] = {"-np", "2", "x", NULL};
  const char *compat[] = {"--horovod-compat", "--gloo", "-np", "2", "x", NULL};
  ck_assert_int_eq(parse(&o, &help, plain), HVD_OK);
  ck_assert(!o.horovod_compat);
  ck_assert_ptr_null(o.pythonpath); /* hvdrun_python_setup's */
  hvdrun_options_fini(&o);
  ck_assert_int_eq(parse(&o, &help, compat), HVD_OK);
  ck_assert(o.horovod_compat);
  ck_assert_int_eq(o.np, 2);
  ck_assert_str_eq(o.command[0], "x");
  hvdrun_options_fini(&o);
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

START_TEST(options_elastic) {
  struct hvdrun_options o;
  bool help;
  const char *args[] = {"--min-np", "2", "--max-num-proc", "8", "-np", "4", "-H", "a:4,b:4",
                        "--reset-limit", "3", "--blacklist-cooldown-range", "10", "90.5",
                        "--elastic-timeout=60", "train", NULL};
  ck_assert_int_eq(parse(&o, &help, args), HVD_OK);
  ck_assert(o.elastic);
  ck_assert_int_eq(o.min_np, 2);
  ck_assert_int_eq(o.np, 4);
  ck_assert_int_eq(o.max_np, 8);
  ck_assert_int_eq(o.reset_limit, 3);
  ck_assert(o.cooldown_min_s == 10 && o.cooldown_max_s == 90.5);
  ck_assert_int_eq(o.elastic_timeout_s, 60);
  ck_assert_ptr_null(o.discovery_script);
  ck_assert_int_eq(o.ncommand, 1);
  hvdrun_options_fini(&o);

  /* A script alone: -np gives min_np; defaults elsewhere. */
  const char *script[] = {"--host-discovery-script", "./hosts.sh", "-np", "3", "--slots", "2",
                          "train", NULL};
  ck_assert_int_eq(parse(&o, &help, script), HVD_OK);
  ck_assert(o.elastic);
  ck_assert_str_eq(o.discovery_script, "./hosts.sh");
  ck_assert_int_eq(o.min_np, 3);
  ck_assert_int_eq(o.np, 3);
  ck_assert_int_eq(o.max_np, -1); /* no limit, as Horovod's code has it */
  ck_assert_int_eq(o.slots_per_host, 2);
  ck_assert_int_eq(o.reset_limit, -1);
  ck_assert(o.cooldown_min_s == 0 && o.cooldown_max_s == 0);
  ck_assert_int_eq(o.elastic_timeout_s, 600);
  hvdrun_options_fini(&o);

  /* --min-np alone: -np follows it; the timeout from the environment. */
  setenv("HOROVOD_ELASTIC_TIMEOUT", "42", 1);
  const char *min_only[] = {"--min-num-proc", "2", "--host-discovery-script", "d", "x", NULL};
  ck_assert_int_eq(parse(&o, &help, min_only), HVD_OK);
  ck_assert_int_eq(o.np, 2);
  ck_assert_int_eq(o.min_np, 2);
  ck_assert_int_eq(o.slots_per_host, 1);
  ck_assert_int_eq(o.elastic_timeout_s, 42);
  hvdrun_options_fini(&o);
  const char *flag_wins[] = {"--elastic-timeout", "7", "--min-np", "1", "x", NULL};
  ck_assert_int_eq(parse(&o, &help, flag_wins), HVD_OK);
  ck_assert_int_eq(o.elastic_timeout_s, 7);
  hvdrun_options_fini(&o);
  setenv("HOROVOD_ELASTIC_TIMEOUT", "soon", 1);
  ck_assert_int_eq(parse(&o, &help, min_only), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(hvd_last_error_message(), "HOROVOD_ELASTIC_TIMEOUT") != NULL, "%s",
                hvd_last_error_message());
  unsetenv("HOROVOD_ELASTIC_TIMEOUT");

  /* Not elastic: the fields keep their "not given" values. */
  const char *plain[] = {"-np", "2", "x", NULL};
  ck_assert_int_eq(parse(&o, &help, plain), HVD_OK);
  ck_assert(!o.elastic);
  ck_assert_int_eq(o.min_np, -1);
  ck_assert_int_eq(o.max_np, -1);
  hvdrun_options_fini(&o);
}
END_TEST

START_TEST(options_elastic_errors) {
  static const struct {
    const char *args[10];
    const char *says;
  } cases[] = {
      {{"--min-np", "0", "x", NULL}, "--min-np: '0'"},
      {{"--max-np", "-1", "--min-np", "1", "x", NULL}, "--max-np: '-1'"},
      {{"--slots", "0", "--host-discovery-script", "d", "x", NULL}, "--slots: '0'"},
      {{"--reset-limit", "-2", "--min-np", "1", "x", NULL}, "--reset-limit"},
      {{"--elastic-timeout", "0", "--min-np", "1", "x", NULL}, "--elastic-timeout"},
      {{"--host-discovery-script", "", "x", NULL}, "--host-discovery-script: empty"},
      {{"--host-discovery-script", "d", "x", NULL}, "elastic mode needs -np or --min-np"},
      {{"--min-np", "4", "-np", "2", "x", NULL}, "--min-np 4 is more than -np 2"},
      {{"--min-np", "2", "--max-np", "3", "-np", "4", "x", NULL}, "--max-np 3 is less than -np 4"},
      {{"--max-np", "4", "-np", "2", "x", NULL}, "--max-np is for elastic mode"},
      {{"--reset-limit", "1", "x", NULL}, "--reset-limit is for elastic mode"},
      {{"--slots-per-host", "2", "x", NULL}, "--slots-per-host is for elastic mode"},
      {{"--elastic-timeout", "5", "x", NULL}, "--min-np or --host-discovery-script"},
      {{"--blacklist-cooldown-range", "1", "2", "x", NULL}, "--blacklist-cooldown-range is for"},
      {{"--min-np", "2", "-H", "a:2,b:2", "--slots", "2", "x", NULL}, "--slots applies to"},
      {{"--host-discovery-script", "d", "-H", "a:1", "-np", "1", "x", NULL},
       "--host-discovery-script and -H exclude"},
      {{"--hostfile", "f", "--host-discovery-script", "d", "-np", "1", "x", NULL},
       "--host-discovery-script and --hostfile exclude"},
      {{"--min-np", "1", "--blacklist-cooldown-range", "5", NULL}, "needs two values"},
      {{"--min-np", "1", "--blacklist-cooldown-range", NULL}, "needs two values"},
      {{"--min-np", "1", "--blacklist-cooldown-range=5", "10", "x", NULL}, "without '='"},
      {{"--min-np", "1", "--blacklist-cooldown-range", "0.5", "10", "x", NULL}, "MIN '0.5'"},
      {{"--min-np", "1", "--blacklist-cooldown-range", "5", "3601", "x", NULL}, "MAX '3601'"},
      {{"--min-np", "1", "--blacklist-cooldown-range", "5", "1e2", "x", NULL}, "MAX '1e2'"},
      {{"--min-np", "1", "--blacklist-cooldown-range", "5", "x", NULL}, "MAX 'x'"},
      {{"--min-np", "1", "--blacklist-cooldown-range", "20", "10", "x", NULL},
       "MIN 20 is more than MAX 10"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct hvdrun_options o;
    bool help;
    ck_assert_msg(parse(&o, &help, cases[i].args) == HVD_ERR_INVALID_ARGUMENT, "case %zu", i);
    ck_assert_msg(strstr(hvd_last_error_message(), cases[i].says) != NULL, "case %zu: %s", i,
                  hvd_last_error_message());
    ck_assert(strchr(hvd_last_error_message(), '\n') == NULL);
    hvdrun_options_fini(&o);
  }
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

/* ==== elastic hosts ========================================================= */

static hvd_status parse_text(const char *text, int default_slots, struct hvdrun_host **h,
                             size_t *n) {
  return hvdrun_parse_discovery(text, strlen(text), default_slots, h, n);
}

START_TEST(discovery_output_parsed) {
  struct hvdrun_host *h = NULL;
  size_t n = 99;

  ck_assert_int_eq(parse_text("  b:4 \r\n\na\n\t\nb:4\nc:1\na:2\n  \n", 2, &h, &n), HVD_OK);
  ck_assert_uint_eq(n, 3); /* "b:4" twice counts once; "a" is "a:2" */
  ck_assert_str_eq(h[0].name, "b");
  ck_assert_int_eq(h[0].slots, 4);
  ck_assert_str_eq(h[1].name, "a");
  ck_assert_int_eq(h[1].slots, 2);
  ck_assert_str_eq(h[2].name, "c");
  ck_assert_int_eq(h[2].slots, 1);
  free(h);
  ck_assert_int_eq(parse_text("worker-7.example:4096", 1, &h, &n), HVD_OK); /* no newline */
  ck_assert_uint_eq(n, 1);
  ck_assert_int_eq(h[0].slots, HVDRUN_MAX_RANKS);
  free(h);
  h = NULL;
  ck_assert_int_eq(parse_text("\n \n", 1, &h, &n), HVD_OK); /* no hosts is fine here */
  ck_assert_uint_eq(n, 0);
  free(h);
  ck_assert_int_eq(hvdrun_parse_discovery("a:1\nb:2", 3, 1, &h, &n), HVD_OK); /* len counts */
  ck_assert_uint_eq(n, 1);
  free(h);
}
END_TEST

START_TEST(discovery_output_rejected) {
  static const struct {
    const char *text;
    const char *says;
  } cases[] = {
      {"a:2\nb\na:3\n", "line 3: host 'a' is listed with 2 slots and with 3"},
      {"a\na:2\n", "host 'a'"}, /* default 1 */
      {"a:0\n", "line 1"},
      {"a:\n", "slots after ':'"},
      {"a:-1\n", "slots after ':'"},
      {"a:4097\n", "1 to 4096"},
      {"a:99999999999999999999\n", "slots after ':'"},
      {"a:2x\n", "slots after ':'"},
      {"x\n a:b:2\n", "line 2"},
      {":3\n", "the host name has 0 bytes"},
      {"a b:2\n", "'a b' is not a host name"},
      {"a\tb\n", "is not a host name"},
      {"-oProxyCommand=x\n", "starts with '-'"},
  };
  struct hvdrun_host *h = NULL;
  size_t n = 0;
  char *long_name = malloc(HVDRUN_HOST_MAX + 4);

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    ck_assert_msg(parse_text(cases[i].text, 1, &h, &n) == HVD_ERR_INVALID_ARGUMENT, "case %zu",
                  i);
    ck_assert_msg(strstr(hvd_last_error_message(), cases[i].says) != NULL, "case %zu: %s", i,
                  hvd_last_error_message());
  }
  memset(long_name, 'h', HVDRUN_HOST_MAX);
  strcpy(long_name + HVDRUN_HOST_MAX, "\n");
  ck_assert_int_eq(parse_text(long_name, 1, &h, &n), HVD_OK); /* just fits */
  ck_assert_uint_eq(strlen(h[0].name), HVDRUN_HOST_MAX);
  free(h);
  strcpy(long_name + HVDRUN_HOST_MAX, "h\n");
  ck_assert_int_eq(parse_text(long_name, 1, &h, &n), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strstr(hvd_last_error_message(), "256 bytes") != NULL, "%s",
                hvd_last_error_message());
  ck_assert_int_eq(parse_text("a\n", 0, &h, &n), HVD_ERR_INVALID_ARGUMENT);
  free(long_name);
}
END_TEST

/* Writes an executable script into dir; returns its path (static). */
static const char *script(const char *dir, const char *name, const char *body) {
  static char path[4096];
  FILE *f;
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#!/bin/sh\n%s", body);
  fclose(f);
  ck_assert_int_eq(chmod(path, 0755), 0);
  return path;
}

/* No child of ours is left, running or unreaped. */
static void assert_no_children(void) {
  ck_assert_int_eq(waitpid(-1, NULL, WNOHANG), -1);
}

START_TEST(discovery_script_runs) {
  char dir[] = "/tmp/hvd-discovery-XXXXXX", cmd[8192];
  char *out = NULL;
  size_t len = 0;
  sigset_t chld;

  /* As in hvdrun: SIGCHLD blocked (its signalfd's). */
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  ck_assert_ptr_nonnull(mkdtemp(dir));

  ck_assert_int_eq(hvdrun_run_discovery(script(dir, "ok.sh", "echo a:2\necho b\n"), 10000, &out,
                                        &len),
                   HVD_OK);
  ck_assert_str_eq(out, "a:2\nb\n");
  ck_assert_uint_eq(len, 6);
  free(out);
  assert_no_children();

  /* Through the shell: arguments work, and nothing printed is fine. */
  snprintf(cmd, sizeof(cmd), "%s/args.sh one two", dir);
  script(dir, "args.sh", "echo \"$2\"\n");
  ck_assert_int_eq(hvdrun_run_discovery(cmd, 10000, &out, &len), HVD_OK);
  ck_assert_str_eq(out, "two\n");
  free(out);
  ck_assert_int_eq(hvdrun_run_discovery("true", 10000, &out, &len), HVD_OK);
  ck_assert_uint_eq(len, 0);
  ck_assert_str_eq(out, "");
  free(out);

  const char *fails = script(dir, "fail.sh", "echo a:1\necho 'no cluster' >&2\necho 'ask ops' >&2\n"
                                           "exit 3\n");
  ck_assert_int_eq(hvdrun_run_discovery(fails, 10000, &out, &len), HVD_ERR_IO);
  ck_assert_msg(strstr(hvd_last_error_message(), "exited with code 3: no cluster ask ops") != NULL,
                "%s", hvd_last_error_message());
  ck_assert_msg(strstr(hvd_last_error_message(), fails) != NULL, "%s", hvd_last_error_message());
  assert_no_children();

  ck_assert_int_eq(hvdrun_run_discovery("kill -9 $$", 10000, &out, &len), HVD_ERR_IO);
  ck_assert_msg(strstr(hvd_last_error_message(), "signal 9") != NULL, "%s",
                hvd_last_error_message());

  /* A long stderr: only its end is kept, on one line. */
  script(dir, "noisy.sh", "i=0; while [ $i -lt 200 ]; do echo \"line $i\" >&2; i=$((i+1)); done\n"
                          "echo THE-END >&2; exit 1\n");
  snprintf(cmd, sizeof(cmd), "%s/noisy.sh", dir);
  ck_assert_int_eq(hvdrun_run_discovery(cmd, 10000, &out, &len), HVD_ERR_IO);
  ck_assert_msg(strstr(hvd_last_error_message(), "line 199 THE-END") != NULL, "%s",
                hvd_last_error_message());
  ck_assert(strstr(hvd_last_error_message(), "line 1 ") == NULL);
  ck_assert(strchr(hvd_last_error_message(), '\n') == NULL);

  snprintf(cmd, sizeof(cmd), "%s/no-such-script", dir);
  ck_assert_int_eq(hvdrun_run_discovery(cmd, 10000, &out, &len), HVD_ERR_IO);
  ck_assert_msg(strstr(hvd_last_error_message(), "exited with code 127") != NULL, "%s",
                hvd_last_error_message());
  assert_no_children();

  /* Too slow: killed, with what it started. The timeout is small, the
   * sleep long: the test would hang, not pass, if the kill did not work. */
  const char *slow = script(dir, "slow.sh", "echo a:1\nsleep 600 &\nsleep 600\n");
  ck_assert_int_eq(hvdrun_run_discovery(slow, 200, &out, &len), HVD_ERR_TIMEOUT);
  ck_assert_msg(strstr(hvd_last_error_message(), "slow.sh") != NULL, "%s",
                hvd_last_error_message());
  assert_no_children();

  /* Exits while something it started holds its stdout: done all the same. */
  snprintf(cmd, sizeof(cmd), "%s/leaves.sh", dir);
  script(dir, "leaves.sh", "echo a:1\nsleep 600 &\nexit 0\n");
  ck_assert_int_eq(hvdrun_run_discovery(cmd, 60000, &out, &len), HVD_OK);
  ck_assert_str_eq(out, "a:1\n");
  free(out);
  assert_no_children();

  /* Closes its pipes but goes on: waited for until it exits. */
  snprintf(cmd, sizeof(cmd), "%s/closes.sh", dir);
  script(dir, "closes.sh", "exec >&- 2>&-\nsleep 0.2\nexit 4\n");
  ck_assert_int_eq(hvdrun_run_discovery(cmd, 60000, &out, &len), HVD_ERR_IO);
  ck_assert_msg(strstr(hvd_last_error_message(), "code 4") != NULL, "%s",
                hvd_last_error_message());

  snprintf(cmd, sizeof(cmd), "%s/big.sh", dir);
  script(dir, "big.sh", "yes a:1 | head -c 2000000\n");
  ck_assert_int_eq(hvdrun_run_discovery(cmd, 60000, &out, &len), HVD_ERR_TOO_LARGE);
  assert_no_children();

  snprintf(cmd, sizeof(cmd), "rm -r %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static void found(struct hvdrun_host *h, size_t i, const char *name, int slots) {
  snprintf(h[i].name, sizeof(h[i].name), "%s", name);
  h[i].slots = slots;
}

/* The usable hosts as "name:slots,..." (static). */
static const char *usable(const struct hvdrun_hosts_view *v) {
  static char text[1024];
  struct hvdrun_host h[16];
  size_t n = hvdrun_hosts_view_usable(v, h, 16), len = 0;
  text[0] = '\0';
  for (size_t i = 0; i < n; i++)
    len += (size_t)snprintf(text + len, sizeof(text) - len, "%s%s:%d", i > 0 ? "," : "",
                            h[i].name, h[i].slots);
  return text;
}

START_TEST(hosts_view_changes_and_order) {
  struct hvdrun_hosts_view v;
  struct hvdrun_host h[4], one[1];
  int change = -1;

  hvdrun_hosts_view_init(&v, 0, 0);
  found(h, 0, "a", 2);
  found(h, 1, "b", 2);
  found(h, 2, "c", 1);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 3, 0, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_ADDED);
  ck_assert_str_eq(usable(&v), "a:2,b:2,c:1");
  ck_assert_int_eq(hvdrun_hosts_view_slots(&v), 5);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 3, 1, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_SAME);
  ck_assert_uint_eq(hvdrun_hosts_view_usable(&v, one, 1), 1); /* cap respected */
  ck_assert_str_eq(one[0].name, "a");

  /* The discovery's order does not reorder known hosts. */
  found(h, 0, "c", 1);
  found(h, 1, "b", 2);
  found(h, 2, "a", 2);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 3, 2, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_SAME);
  ck_assert_str_eq(usable(&v), "a:2,b:2,c:1");

  /* a goes: removed. */
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 2, 3, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_REMOVED);
  ck_assert_str_eq(usable(&v), "b:2,c:1");
  /* b has fewer slots and d comes: both. */
  found(h, 0, "c", 1);
  found(h, 1, "b", 1);
  found(h, 2, "d", 3);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 3, 4, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_MIXED);
  ck_assert_str_eq(usable(&v), "b:1,c:1,d:3");
  /* b has more slots again: added. */
  found(h, 1, "b", 2);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 3, 5, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_ADDED);
  /* a is back: after the hosts that stayed (its ranks start afresh, and
   * rank 0 stays on b, which has the state). Newcomers together keep the
   * discovery's order. */
  found(h, 0, "e", 1);
  found(h, 1, "a", 2);
  found(h, 2, "b", 2);
  found(h, 3, "c", 1);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 4, 6, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_MIXED); /* d went, e and a came */
  ck_assert_str_eq(usable(&v), "b:2,c:1,e:1,a:2");
  ck_assert_int_eq(hvdrun_hosts_view_slots(&v), 6);
  /* Nothing at all: every host removed. */
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 0, 7, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_REMOVED);
  ck_assert_str_eq(usable(&v), "");
  ck_assert_int_eq(hvdrun_hosts_view_slots(&v), 0);
  hvdrun_hosts_view_fini(&v);
  hvdrun_hosts_view_fini(&v); /* safe twice (zeroed) */
}
END_TEST

START_TEST(hosts_view_blacklist_for_good) {
  struct hvdrun_hosts_view v;
  struct hvdrun_host h[3];
  int change;

  hvdrun_hosts_view_init(&v, 0, 0);
  found(h, 0, "a", 2);
  found(h, 1, "b", 2);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 2, 0, &change), HVD_OK);
  hvdrun_hosts_view_blacklist(&v, "a", 1);
  hvdrun_hosts_view_blacklist(&v, "later", 1); /* not discovered yet */
  ck_assert_str_eq(usable(&v), "b:2");
  ck_assert_int_eq(hvdrun_hosts_view_slots(&v), 2);
  /* Blacklisted hosts come and go without a change. */
  found(h, 2, "later", 4);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 3, 2, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_SAME);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h + 1, 1, 3, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_SAME);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 3, INT64_MAX - 1, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_SAME); /* for good */
  ck_assert_str_eq(usable(&v), "b:2");
  hvdrun_hosts_view_fini(&v);
}
END_TEST

START_TEST(hosts_view_cooldown) {
  const int64_t s = 1000000000;
  struct hvdrun_hosts_view v;
  struct hvdrun_host h[2];
  struct hvdrun_known_host *a;
  int64_t t = 1000 * s, until;
  int change;

  hvdrun_hosts_view_init(&v, 10, 100);
  found(h, 0, "a", 2);
  found(h, 1, "b", 2);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 2, t, &change), HVD_OK);
  a = &v.hosts[0];
  ck_assert_str_eq(a->name, "a");
  hvdrun_hosts_view_blacklist(&v, "a", t);
  ck_assert(a->blacklisted);
  ck_assert_int_eq(a->blacklist_count, 1);
  /* The first cooldown: min + U(0,1) * min, within [10, 20] s. */
  ck_assert_int_ge(a->cooldown_until_ns, t + 10 * s);
  ck_assert_int_le(a->cooldown_until_ns, t + 20 * s);
  until = a->cooldown_until_ns;
  hvdrun_hosts_view_blacklist(&v, "a", t + s); /* still in effect: no change */
  ck_assert_int_eq(a->cooldown_until_ns, until);
  ck_assert_int_eq(a->blacklist_count, 1);
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 2, until - 1, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_SAME);
  ck_assert_str_eq(usable(&v), "b:2");
  /* Over: whitelisted, added, and after b now. */
  ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 2, until, &change), HVD_OK);
  ck_assert_int_eq(change, HVDRUN_HOSTS_ADDED);
  ck_assert_str_eq(usable(&v), "b:2,a:2");
  /* Again and again: the cooldown doubles, capped at max. */
  for (int k = 1; k < 6; k++) {
    int64_t lo = (10LL << k) < 100 ? (10LL << k) : 100, hi = lo + 10 < 100 ? lo + 10 : 100;
    t = until + s;
    hvdrun_hosts_view_blacklist(&v, "a", t);
    a = &v.hosts[1];
    ck_assert_str_eq(a->name, "a");
    ck_assert_int_eq(a->blacklist_count, k + 1);
    ck_assert_int_ge(a->cooldown_until_ns, t + lo * s);
    ck_assert_int_le(a->cooldown_until_ns, t + hi * s);
    until = a->cooldown_until_ns;
    /* Absent when its cooldown ends: whitelisted, but nothing is added. */
    ck_assert_int_eq(hvdrun_hosts_view_update(&v, h + 1, 1, until, &change), HVD_OK);
    ck_assert_int_eq(change, HVDRUN_HOSTS_SAME);
    ck_assert(!v.hosts[1].blacklisted);
    ck_assert_int_eq(hvdrun_hosts_view_update(&v, h, 2, until, &change), HVD_OK);
    ck_assert_int_eq(change, HVDRUN_HOSTS_ADDED);
  }
  hvdrun_hosts_view_fini(&v);
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

START_TEST(environment_long_values) {
  /* A long PYTHONPATH or exported variable arrives whole. */
  struct hvdrun_env e = {0};
  char *value = malloc(20001);
  ck_assert_ptr_nonnull(value);
  memset(value, 'p', 20000);
  value[20000] = '\0';
  ck_assert_int_eq(hvdrun_env_set(&e, "PYTHONPATH", "%s:/u", value), HVD_OK);
  ck_assert_uint_eq(strlen(e.vars[0]), strlen("PYTHONPATH=") + 20000 + 3);
  ck_assert_str_eq(e.vars[0] + strlen("PYTHONPATH=") + 20000, ":/u");
  free(value);
  hvdrun_env_fini(&e);
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

/* ==== the ranks' Python path ================================================ */

static void candidates_are(const char *exe, const char *libdir, const char *first,
                           const char *second) {
  char *c[HVDRUN_PYTHON_CANDIDATES] = {NULL};
  size_t n = 0;
  ck_assert_int_eq(hvdrun_python_candidates(exe, libdir, c, &n), HVD_OK);
  ck_assert_uint_eq(n, second != NULL ? 2 : 1);
  ck_assert_str_eq(c[0], first);
  if (second != NULL)
    ck_assert_str_eq(c[1], second);
  for (size_t i = 0; i < n; i++)
    free(c[i]);
}

START_TEST(python_candidates) {
  char *c[HVDRUN_PYTHON_CANDIDATES] = {NULL};
  size_t n = 7;
  candidates_are("/opt/hvd/bin/hvdrun", "lib64", "/opt/hvd/lib/hvd/python",
                 "/opt/hvd/lib64/hvd/python");
  candidates_are("/opt/hvd/bin/hvdrun", "lib", "/opt/hvd/lib/hvd/python", NULL);
  candidates_are("/usr/bin/hvdrun", "lib/x86_64-linux-gnu", "/usr/lib/hvd/python",
                 "/usr/lib/x86_64-linux-gnu/hvd/python");
  candidates_are("/usr/bin/hvdrun", "/usr/lib64", "/usr/lib/hvd/python",
                 "/usr/lib64/hvd/python");
  candidates_are("/bin/hvdrun", "lib", "/lib/hvd/python", NULL);
  ck_assert_int_eq(hvdrun_python_candidates("bin/hvdrun", "lib", c, &n),
                   HVD_ERR_INVALID_ARGUMENT);
  ck_assert_uint_eq(n, 7);
}
END_TEST

/* "base/name" in one of two static buffers. */
static const char *path_of(const char *base, const char *name) {
  static char paths[2][PATH_MAX];
  static int next;
  char *p = paths[next++ % 2];
  int n = snprintf(p, PATH_MAX, "%s/%s", base, name);
  ck_assert(n > 0 && n < PATH_MAX);
  return p;
}

static void make_dir(const char *base, const char *name) {
  ck_assert_int_eq(mkdir(path_of(base, name), 0755), 0);
}

static void make_file(const char *base, const char *name) {
  FILE *f = fopen(path_of(base, name), "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
}

/* hvdrun_python_path's value for candidates a and b (NULL: only a). */
static char *python_path(const char *a, const char *b, bool compat, const char *current,
                         const char **dir) {
  const char *c[] = {a, b};
  char *value = NULL;
  ck_assert_int_eq(hvdrun_python_path(c, b != NULL ? 2 : 1, compat, current, dir, &value),
                   HVD_OK);
  return value;
}

static void python_path_is(const char *a, const char *b, bool compat, const char *current,
                           const char *expect) {
  const char *dir = NULL;
  char *value = python_path(a, b, compat, current, &dir), head[3 * PATH_MAX];
  ck_assert_str_eq(value, expect);
  /* *dir is the candidate the value starts with (after its compat tree). */
  snprintf(head, sizeof(head), "%s%s%s", compat ? dir : "", compat ? "/compat:" : "", dir);
  ck_assert_int_eq(strncmp(value, head, strlen(head)), 0);
  free(value);
}

/* Compat missing: one line naming where it looked; outputs untouched. */
static void no_compat(const char *a, const char *b, const char *names, const char *not_named) {
  const char *c[] = {a, b}, *dir = "untouched";
  char *value = (char *)"untouched";
  ck_assert_int_eq(hvdrun_python_path(c, b != NULL ? 2 : 1, true, "/u", &dir, &value),
                   HVD_ERR_NOT_FOUND);
  ck_assert_str_eq(dir, "untouched");
  ck_assert_str_eq(value, "untouched");
  ck_assert_msg(strncmp(hvd_last_error_message(), "--horovod-compat: ", 18) == 0, "%s",
                hvd_last_error_message());
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), names));
  ck_assert(not_named == NULL || strstr(hvd_last_error_message(), not_named) == NULL);
  ck_assert(strchr(hvd_last_error_message(), '\n') == NULL);
}

/* Removes what python_path_built makes, deepest first. */
static void remove_tree(const char *base) {
  static const char *const files[] = {"linked/hvd", "linked/compat", "full/hvd/__init__.py"};
  static const char *const dirs[] = {"full/hvd", "full/compat", "full",  "bare/hvd",
                                     "bare",     "none",        "linked"};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(files); i++)
    ck_assert_int_eq(unlink(path_of(base, files[i])), 0);
  for (size_t i = 0; i < HVD_ARRAY_SIZE(dirs); i++)
    ck_assert_int_eq(rmdir(path_of(base, dirs[i])), 0);
  ck_assert_int_eq(rmdir(base), 0);
}

START_TEST(python_path_built) {
  char base[] = "/tmp/hvd-python-XXXXXX", full[PATH_MAX], bare[PATH_MAX], none[PATH_MAX],
       linked[PATH_MAX], expect[4 * PATH_MAX];
  const char *dir = "untouched";

  ck_assert_ptr_nonnull(mkdtemp(base));
  /* full: the package and its compat tree; bare: a package directory still
   * empty; none: nothing; linked: symlinks to full's, as in the build tree. */
  snprintf(full, sizeof(full), "%s", path_of(base, "full"));
  snprintf(bare, sizeof(bare), "%s", path_of(base, "bare"));
  snprintf(none, sizeof(none), "%s", path_of(base, "none"));
  snprintf(linked, sizeof(linked), "%s", path_of(base, "linked"));
  make_dir(base, "full");
  make_dir(full, "hvd");
  make_file(full, "hvd/__init__.py");
  make_dir(full, "compat");
  make_dir(base, "bare");
  make_dir(bare, "hvd");
  make_dir(base, "none");
  make_dir(base, "linked");
  ck_assert_int_eq(symlink(path_of(full, "hvd"), path_of(linked, "hvd")), 0);
  ck_assert_int_eq(symlink(path_of(full, "compat"), path_of(linked, "compat")), 0);

  /* The user's path goes after hvd's, without a stray ':'. */
  python_path_is(full, NULL, false, NULL, full);
  python_path_is(full, NULL, false, "", full);
  snprintf(expect, sizeof(expect), "%s:/u:/v", full);
  python_path_is(full, NULL, false, "/u:/v", expect);
  /* The first candidate with the package; a finished one over a bare one. */
  python_path_is(none, bare, false, NULL, bare);
  python_path_is(bare, full, false, NULL, full);
  python_path_is(full, bare, false, NULL, full);
  python_path_is(linked, none, false, NULL, linked);
  /* --horovod-compat: the tree in front of the package. */
  snprintf(expect, sizeof(expect), "%s/compat:%s", full, full);
  python_path_is(full, NULL, true, "", expect);
  snprintf(expect, sizeof(expect), "%s/compat:%s:/u", linked, linked);
  python_path_is(linked, NULL, true, "/u", expect);
  /* No package anywhere: nothing to add, and not an error. */
  ck_assert_ptr_null(python_path(none, NULL, false, "/u", &dir));
  ck_assert_ptr_null(dir);
  /* Compat asked for but missing: where the package is, or everywhere. */
  snprintf(expect, sizeof(expect), "%s/compat (", bare);
  no_compat(none, bare, expect, "/none");
  snprintf(expect, sizeof(expect), "%s/compat or %s/compat", none, path_of(base, "none2"));
  no_compat(none, path_of(base, "none2"), expect, NULL);
  remove_tree(base);
}
END_TEST

START_TEST(python_setup_from_own_executable) {
  /* This test runs from the build tree's bin, beside lib/hvd/python. */
  char py[PATH_MAX], self[PATH_MAX], expect[3 * PATH_MAX], saved_path[4096];
  struct hvdrun_options o;
  bool help;
  const char *user[] = {"--horovod-compat", "-np", "1", "x", NULL};
  const char *path[] = {"-x", "PATH=/x", "--horovod-compat", "-np", "1", "x", NULL};
  const char *exported[] = {"-x", "PYTHONPATH=/x1", "-x", "PYTHONPATH=/x2", "-np", "1", "x", NULL};

  ck_assert_ptr_nonnull(realpath(HVD_BIN_DIR "/../lib/hvd/python", py));
  ck_assert_ptr_nonnull(realpath("/proc/self/exe", self));
  snprintf(saved_path, sizeof(saved_path), "%s", getenv("PATH") != NULL ? getenv("PATH") : "");
  setenv("PYTHONPATH", "/u", 1);
  setenv("PATH", "/p1:/p2", 1);
  ck_assert_int_eq(parse(&o, &help, user), HVD_OK);
  ck_assert_int_eq(hvdrun_python_setup(&o), HVD_OK);
  snprintf(expect, sizeof(expect), "%s/compat:%s:/u", py, py);
  ck_assert_str_eq(o.pythonpath, expect);
  /* The compat tree's horovodrun first on the ranks' PATH, running this
   * executable (hvdrun, in a real job). */
  snprintf(expect, sizeof(expect), "PATH=%s/compat/bin:/p1:/p2", py);
  ck_assert_uint_eq(o.nexports, 1);
  ck_assert_str_eq(o.exports[0], expect);
  ck_assert_str_eq(o.settings[HVD_SET_HVDRUN], self);
  snprintf(expect, sizeof(expect), "%s/compat/bin/horovodrun", py);
  ck_assert_int_eq(access(expect, X_OK), 0);
  hvdrun_options_fini(&o);
  /* -x PATH=VALUE is the user's PATH. */
  ck_assert_int_eq(parse(&o, &help, path), HVD_OK);
  ck_assert_int_eq(hvdrun_python_setup(&o), HVD_OK);
  snprintf(expect, sizeof(expect), "PATH=%s/compat/bin:/x", py);
  ck_assert_uint_eq(o.nexports, 2);
  ck_assert_str_eq(o.exports[1], expect);
  hvdrun_options_fini(&o);
  setenv("PATH", saved_path, 1);
  /* -x PYTHONPATH=VALUE is the user's path (the last one, as for the
   * ranks); without --horovod-compat, PATH and HVD_HVDRUN stay as they are. */
  ck_assert_int_eq(parse(&o, &help, exported), HVD_OK);
  ck_assert_int_eq(hvdrun_python_setup(&o), HVD_OK);
  snprintf(expect, sizeof(expect), "%s:/x2", py);
  ck_assert_str_eq(o.pythonpath, expect);
  ck_assert_uint_eq(o.nexports, 2);
  ck_assert_ptr_null(o.settings[HVD_SET_HVDRUN]);
  hvdrun_options_fini(&o);
  unsetenv("PYTHONPATH");
}
END_TEST

START_TEST(python_reaches_the_ranks) {
  struct hvdrun_options o;
  struct hvdrun_env e = {0};
  bool help;
  const char *args[] = {"--horovod-compat", "-x", "PYTHONPATH=/x", "-np", "1", "x", NULL};
  char **a;
  int found = 0;

  ck_assert_int_eq(parse(&o, &help, args), HVD_OK);
  o.pythonpath = hvd_strndup("/p/compat:/p:/x", 15);
  ck_assert_int_eq(hvdrun_job_vars(&o, "127.0.0.1", 1, "token", &e), HVD_OK);
  a = hvdrun_env_array(&e);
  for (size_t i = 0; a[i] != NULL; i++) {
    if (strncmp(a[i], "PYTHONPATH=", 11) == 0) {
      ck_assert_str_eq(a[i], "PYTHONPATH=/p/compat:/p:/x"); /* over -x's */
      found++;
    }
    if (strncmp(a[i], "HVD_HOROVOD_COMPAT=", 19) == 0) {
      ck_assert_str_eq(a[i], "HVD_HOROVOD_COMPAT=1");
      found++;
    }
  }
  ck_assert_int_eq(found, 2);
  free(a);
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);
}
END_TEST

/* ==== the store's start-up ================================================= */

START_TEST(store_on_loopback_only_for_local_ranks) {
  struct hvdrun_store_config cfg = {0};
  struct hvdrun_store st;
  struct hvdrun_options o;
  bool help;
  const char *args[] = {"-np", "1", "x", NULL};

  ck_assert_int_eq(parse(&o, &help, args), HVD_OK);
  /* Every rank here, and no host can join: loopback alone. */
  ck_assert_int_eq(hvdrun_store_start(&o, &cfg, &st), HVD_OK);
  ck_assert_str_eq(st.addr, "127.0.0.1");
  ck_assert_uint_eq(strlen(st.token), 48);
  ck_assert(st.loopback);
  ck_assert_int_eq(strncmp(rdzv_server_address(st.server), "127.0.0.1:", 10), 0);
  hvdrun_store_stop(&st);
  /* Hosts may join later: every interface, though the first ranks use loopback. */
  cfg.hosts_may_join = true;
  cfg.blocking_scope = "rank_and_size";
  ck_assert_int_eq(hvdrun_store_start(&o, &cfg, &st), HVD_OK);
  ck_assert_str_eq(st.addr, "127.0.0.1");
  ck_assert(!st.loopback);
  ck_assert_int_ne(strncmp(rdzv_server_address(st.server), "127.0.0.1:", 10), 0);
  hvdrun_store_stop(&st);
  hvdrun_options_fini(&o);
}
END_TEST

/* ==== the supervisor ======================================================= */

/* A policy that records what the supervisor tells it; turn_cb is the
 * test's own tick. */
struct recorder {
  struct hvdrun_sup sup;
  struct hvdrun_options o;
  int codes[4]; /* per process: how it ended, -1 until then */
  char why[4][128];
  int signo, overdue, turns;
  int64_t (*turn_cb)(struct recorder *r);
  pthread_t waker;
};

static void rec_ended_cb(void *arg, size_t i, const char *why, int code) {
  struct recorder *r = arg;
  r->codes[i] = code;
  snprintf(r->why[i], sizeof(r->why[i]), "%s", why);
}

static void rec_signal_cb(void *arg, int signo) {
  struct recorder *r = arg;
  r->signo = signo;
  hvdrun_sup_end_when_idle(&r->sup);
}

static void rec_overdue_cb(void *arg, size_t i) {
  struct recorder *r = arg;
  (void)i;
  r->overdue++;
}

static void rec_failed_cb(void *arg) {
  (void)arg;
  ck_abort_msg("the loop failed: %s", hvd_last_error_message());
}

static int64_t rec_tick_cb(void *arg) {
  struct recorder *r = arg;
  r->turns++;
  return r->turn_cb(r);
}

static void rec_init(struct recorder *r, int64_t (*turn_cb)(struct recorder *r)) {
  struct hvdrun_sup_hooks hooks = {r,           rec_ended_cb,  rec_signal_cb,
                                   rec_overdue_cb, rec_failed_cb, rec_tick_cb};
  const char *args[] = {"-np", "1", "sh", "-c", "eval \"$SUP_CMD\"", NULL};
  bool help;

  memset(r, 0, sizeof(*r));
  for (size_t i = 0; i < HVD_ARRAY_SIZE(r->codes); i++)
    r->codes[i] = -1;
  r->turn_cb = turn_cb;
  ck_assert_int_eq(parse(&r->o, &help, args), HVD_OK);
  ck_assert_int_eq(hvdrun_sup_init(&r->sup, &hooks), HVD_OK);
}

static void rec_fini(struct recorder *r) {
  hvdrun_sup_fini(&r->sup);
  hvdrun_options_fini(&r->o);
}

/* Starts `sh -c CMD` as the next process. */
static void rec_start(struct recorder *r, const char *cmd) {
  struct hvdrun_env vars = {0};
  size_t i;

  ck_assert_int_eq(hvdrun_sup_add(&r->sup, 1, &i), HVD_OK);
  ck_assert_int_eq(hvdrun_proc_init(hvdrun_sup_proc(&r->sup, i), &r->o, (int)i, 1), HVD_OK);
  ck_assert_int_eq(hvdrun_env_set(&vars, "SUP_CMD", "%s", cmd), HVD_OK);
  ck_assert_int_eq(
      hvdrun_proc_start(hvdrun_sup_proc(&r->sup, i), &r->o, "localhost", false, &vars, (int)i),
      HVD_OK);
  hvdrun_env_fini(&vars);
}

static int64_t end_when_idle(struct recorder *r) {
  hvdrun_sup_end_when_idle(&r->sup);
  return HVD_NO_DEADLINE;
}

START_TEST(supervisor_reaps_every_process) {
  struct recorder r;
  rec_init(&r, end_when_idle);
  rec_start(&r, "exit 0");
  rec_start(&r, "exit 3");
  rec_start(&r, "kill -KILL $$");
  hvdrun_sup_run(&r.sup);
  ck_assert_int_eq(r.codes[0], 0);
  ck_assert_int_eq(r.codes[1], 3);
  ck_assert_str_eq(r.why[1], "exited with code 3");
  ck_assert_int_eq(r.codes[2], 128 + SIGKILL);
  ck_assert_uint_eq(hvdrun_sup_running(&r.sup), 0);
  ck_assert_int_eq(r.overdue, 0);
  rec_fini(&r);
}
END_TEST

static int64_t stop_first(struct recorder *r) {
  if (r->turns == 1)
    hvdrun_sup_stop(&r->sup, 0);
  return end_when_idle(r);
}

START_TEST(supervisor_stops_with_sigterm) {
  struct recorder r;
  rec_init(&r, stop_first);
  rec_start(&r, "exec sleep 30");
  hvdrun_sup_run(&r.sup);
  ck_assert_int_eq(r.codes[0], 128 + SIGTERM);
  ck_assert_int_eq(r.overdue, 0);
  rec_fini(&r);
}
END_TEST

START_TEST(supervisor_kills_after_the_grace) {
  struct recorder r;
  rec_init(&r, stop_first);
  /* It ignores SIGTERM from its first instruction on: an ignored
   * disposition survives fork and exec. */
  signal(SIGTERM, SIG_IGN);
  rec_start(&r, "exec sleep 30");
  signal(SIGTERM, SIG_DFL);
  hvdrun_sup_run(&r.sup);
  ck_assert_int_eq(r.overdue, 1);
  ck_assert_int_eq(r.codes[0], 128 + SIGKILL);
  rec_fini(&r);
}
END_TEST

static int64_t raise_hangup(struct recorder *r) {
  if (r->turns == 1)
    kill(getpid(), SIGHUP); /* blocked: it reaches the loop's signalfd */
  return HVD_NO_DEADLINE;
}

START_TEST(supervisor_passes_signals_on) {
  struct recorder r;
  rec_init(&r, raise_hangup);
  hvdrun_sup_run(&r.sup); /* the signal hook ends it */
  ck_assert_int_eq(r.signo, SIGHUP);
  rec_fini(&r);
}
END_TEST

static void *wake_main(void *arg) {
  struct recorder *r = arg;
  hvd_sleep_ns(20 * 1000000);
  hvdrun_sup_wake(&r->sup);
  return NULL;
}

/* The first turn asks for no other; only the other thread's wake-up
 * brings the second, which ends the loop. */
static int64_t wait_for_wake(struct recorder *r) {
  if (r->turns == 1)
    ck_assert_int_eq(pthread_create(&r->waker, NULL, wake_main, r), 0);
  else
    hvdrun_sup_end_when_idle(&r->sup);
  return HVD_NO_DEADLINE;
}

START_TEST(supervisor_woken_by_another_thread) {
  struct recorder r;
  rec_init(&r, wait_for_wake);
  hvdrun_sup_run(&r.sup);
  pthread_join(r.waker, NULL);
  ck_assert_int_eq(r.turns, 2);
  rec_fini(&r);
}
END_TEST

static Suite *launcher_suite(void) {
  Suite *s = suite_create("parts");
  TCase *tc = tcase_create("parts");
  tcase_add_test(tc, options_horovodrun_names);
  tcase_add_test(tc, options_errors_name_the_argument);
  tcase_add_test(tc, options_python);
  tcase_add_test(tc, options_help);
  tcase_add_test(tc, options_elastic);
  tcase_add_test(tc, options_elastic_errors);
  tcase_add_test(tc, hosts_parse_and_reject);
  tcase_add_test(tc, hostfile_lines);
  tcase_add_test(tc, assignment_as_horovod);
  tcase_add_test(tc, local_hosts);
  tcase_add_test(tc, output_lines_prefixed);
  tcase_add_test(tc, output_long_line_in_pieces);
  tcase_add_test(tc, shell_quoting);
  tcase_add_test(tc, environment_replaces);
  tcase_add_test(tc, environment_long_values);
  tcase_add_test(tc, python_candidates);
  tcase_add_test(tc, python_path_built);
  tcase_add_test(tc, python_setup_from_own_executable);
  tcase_add_test(tc, python_reaches_the_ranks);
  suite_add_tcase(s, tc);
  tc = tcase_create("elastic hosts");
  tcase_add_test(tc, discovery_output_parsed);
  tcase_add_test(tc, discovery_output_rejected);
  tcase_add_test(tc, discovery_script_runs);
  tcase_add_test(tc, hosts_view_changes_and_order);
  tcase_add_test(tc, hosts_view_blacklist_for_good);
  tcase_add_test(tc, hosts_view_cooldown);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  tc = tcase_create("supervisor");
  tcase_add_test(tc, store_on_loopback_only_for_local_ranks);
  tcase_add_test(tc, supervisor_reaps_every_process);
  tcase_add_test(tc, supervisor_stops_with_sigterm);
  tcase_add_test(tc, supervisor_kills_after_the_grace);
  tcase_add_test(tc, supervisor_passes_signals_on);
  tcase_add_test(tc, supervisor_woken_by_another_thread);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

Suite *config_suite(void); /* test_launcher_config.c */

int main(void) {
  SRunner *sr = srunner_create(launcher_suite());
  int failed;
  srunner_add_suite(sr, config_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
