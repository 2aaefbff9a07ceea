/*
 * hvdrun's horovodrun flags for the ranks' tuning, stall check and
 * autotuner, its config file (--config-file, read with libyaml) and
 * --check-build: what the ranks receive, which of flag and file wins,
 * and every mistake's one-line message. test_launcher.c runs this suite;
 * the file has no main of its own.
 */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

Suite *config_suite(void);

/* ---- helpers --------------------------------------------------------------- */

static char dir[] = "/tmp/hvd-config-XXXXXX";
static char files[8][PATH_MAX];
static int nfiles;

static void dir_setup(void) { ck_assert_ptr_nonnull(mkdtemp(dir)); }

static void dir_teardown(void) {
  for (int i = 0; i < nfiles; i++)
    unlink(files[i]);
  nfiles = 0;
  rmdir(dir);
  strcpy(dir, "/tmp/hvd-config-XXXXXX");
}

/* Writes text to dir/name; returns the path (valid until the teardown). */
static const char *write_file(const char *name, const char *text) {
  char *path = NULL;
  FILE *f;
  for (int i = 0; i < nfiles && path == NULL; i++) {
    if (strcmp(strrchr(files[i], '/') + 1, name) == 0)
      path = files[i];
  }
  if (path == NULL) {
    ck_assert_int_lt(nfiles, 8);
    path = files[nfiles++];
    snprintf(path, PATH_MAX, "%s/%s", dir, name);
  }
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  return path;
}

static hvd_status parse(struct hvdrun_options *o, const char *const *args) {
  static char *argv[40]; /* o->command points into it */
  bool help;
  int argc = 0;
  argv[argc++] = "hvdrun";
  for (; *args != NULL; args++)
    argv[argc++] = (char *)*args;
  argv[argc] = NULL;
  return hvdrun_parse(argc, argv, o, &help);
}

/* The ranks' variables for these options. */
static void job_vars(const struct hvdrun_options *o, struct hvdrun_env *e) {
  ck_assert_int_eq(hvdrun_job_vars(o, "127.0.0.1", 1, "token", e), HVD_OK);
}

static const char *var(const struct hvdrun_env *e, const char *name) {
  size_t n = strlen(name);
  for (size_t i = 0; i < e->n; i++) {
    if (strncmp(e->vars[i], name, n) == 0 && e->vars[i][n] == '=')
      return e->vars[i] + n + 1;
  }
  return NULL;
}

static void var_is(const struct hvdrun_env *e, const char *name, const char *expect) {
  const char *v = var(e, name);
  if (expect == NULL)
    ck_assert_msg(v == NULL, "%s=%s, expected unset", name, v);
  else
    ck_assert_msg(v != NULL && strcmp(v, expect) == 0, "%s=%s, expected %s", name,
                  v != NULL ? v : "(unset)", expect);
}

/* A failed parse: one line that says `says` (and, for a file, names it). */
static void fails(const char *const *args, const char *says, const char *file) {
  struct hvdrun_options o;
  const char *msg;
  ck_assert_int_eq(parse(&o, args), HVD_ERR_INVALID_ARGUMENT);
  msg = hvd_last_error_message();
  ck_assert_msg(strstr(msg, says) != NULL, "expected '%s' in: %s", says, msg);
  ck_assert_msg(file == NULL || strstr(msg, file) != NULL, "expected '%s' in: %s", file, msg);
  ck_assert_msg(strchr(msg, '\n') == NULL, "more than one line: %s", msg);
  hvdrun_options_fini(&o);
}

/* ---- flags ------------------------------------------------------------------ */

START_TEST(flags_reach_the_ranks) {
  struct hvdrun_options o;
  struct hvdrun_env e = {0};
  const char *args[] = {"--no-stall-check",
                        "--stall-check-warning-time-seconds", "30",
                        "--stall-check-shutdown-time-seconds=120.5",
                        "--autotune",
                        "--autotune-log-file", "tune.csv",
                        "--autotune-warmup-samples", "4",
                        "--autotune-steps-per-sample", "12",
                        "--autotune-bayes-opt-max-samples", "0",
                        "--autotune-gaussian-process-noise", "0.25",
                        "--timeline-filename", "t.json",
                        "--timeline-mark-cycles",
                        "--log-without-timestamp",
                        "--disable-cache",
                        "--gloo",
                        "-np", "2", "train", NULL};

  ck_assert_int_eq(parse(&o, args), HVD_OK);
  ck_assert_str_eq(o.settings[HVD_SET_STALL_CHECK_DISABLE], "1");
  ck_assert(hvdrun_setting_on(&o, HVD_SET_AUTOTUNE) &&
            hvdrun_setting_on(&o, HVD_SET_TIMELINE_MARK_CYCLES) &&
            hvdrun_setting_on(&o, HVD_SET_LOG_HIDE_TIME) && !o.check_build);
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_STALL_CHECK_DISABLE", "1");
  var_is(&e, "HOROVOD_STALL_CHECK_TIME_SECONDS", "30");
  var_is(&e, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "120.5");
  var_is(&e, "HOROVOD_AUTOTUNE", "1");
  var_is(&e, "HOROVOD_AUTOTUNE_LOG", "tune.csv");
  var_is(&e, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "4");
  var_is(&e, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "12");
  var_is(&e, "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "0");
  var_is(&e, "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.25");
  var_is(&e, "HOROVOD_TIMELINE", "t.json");
  var_is(&e, "HOROVOD_TIMELINE_MARK_CYCLES", "1");
  var_is(&e, "HOROVOD_LOG_HIDE_TIME", "1");
  /* horovodrun's --disable-cache is about its own cache of host checks,
   * not the ranks' response cache. */
  var_is(&e, "HOROVOD_CACHE_CAPACITY", NULL);
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);
}
END_TEST

START_TEST(flags_not_given_set_nothing) {
  static const char *const names[] = {
      "HOROVOD_STALL_CHECK_DISABLE",         "HOROVOD_AUTOTUNE",
      "HOROVOD_HIERARCHICAL_ALLREDUCE",      "HOROVOD_LOG_HIDE_TIME",
      "HOROVOD_STALL_CHECK_TIME_SECONDS",    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
      "HOROVOD_AUTOTUNE_LOG",                "HOROVOD_TIMELINE_MARK_CYCLES"};
  struct hvdrun_options o;
  struct hvdrun_env e = {0};
  const char *plain[] = {"-np", "1", "x", NULL};
  /* Switches turned off say so (over a variable hvdrun's environment may
   * have); the timeline's marks stay home without a timeline. */
  const char *off[] = {"--stall-check", "--no-autotune", "--no-hierarchical-allreduce",
                       "--log-with-timestamp", "--no-timeline-mark-cycles", "x", NULL};

  ck_assert_int_eq(parse(&o, plain), HVD_OK);
  job_vars(&o, &e);
  for (size_t i = 0; i < HVD_ARRAY_SIZE(names); i++)
    var_is(&e, names[i], NULL);
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);

  ck_assert_int_eq(parse(&o, off), HVD_OK);
  job_vars(&o, &e);
  for (size_t i = 0; i < 4; i++)
    var_is(&e, names[i], "0");
  for (size_t i = 4; i < HVD_ARRAY_SIZE(names); i++)
    var_is(&e, names[i], NULL);
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);

  /* The last of a switch's spellings counts, as in horovodrun. */
  const char *last[] = {"--no-stall-check", "--stall-check", "--log-hide-timestamp",
                        "--hierarchical-allgather", "--no-hierarchical-allgather",
                        "--hierarchical-allgather", "x", NULL};
  ck_assert_int_eq(parse(&o, last), HVD_OK);
  ck_assert_str_eq(o.settings[HVD_SET_STALL_CHECK_DISABLE], "0");
  ck_assert(hvdrun_setting_on(&o, HVD_SET_LOG_HIDE_TIME) &&
            hvdrun_setting_on(&o, HVD_SET_HIERARCHICAL_ALLGATHER));
  hvdrun_options_fini(&o);
}
END_TEST

/* horovodrun's library and interface flags: --network-interface(s) add up
 * as horovodrun's set of them does, --tcp is TCP only, and the spellings
 * hvdrun had no use for run. */
START_TEST(horovodrun_library_flags) {
  struct hvdrun_options o;
  struct hvdrun_env e = {0};
  const char *args[] = {"--network-interface", "eth0",
                        "--network-interface=eth1,eth0",
                        "--network-interfaces", "ib,=eth1,eth1",
                        "--tcp",
                        "--thread-affinity", "0,8",
                        "--num-nccl-streams", "1",
                        "--log-hide-timestamp",
                        "--no-log-hide-timestamp",
                        "x", NULL};
  const char *one[] = {"--network-interfaces", "lo,eth0", "--tcp", "-x", "NCCL_IB_DISABLE=0",
                       "x", NULL};
  const char *file[] = {"--no-log-hide-timestamp", "--config-file",
                        write_file("hide.yaml", "logging:\n  hide_timestamp: true\n"), "x",
                        NULL};

  ck_assert_int_eq(parse(&o, args), HVD_OK);
  ck_assert_str_eq(o.iface, "eth0,eth1,ib,=eth1");
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_GLOO_IFACE", "eth0,eth1,ib,=eth1");
  var_is(&e, "NCCL_SOCKET_IFNAME", "eth0,eth1,ib,=eth1");
  var_is(&e, "HVD_SHM", "0");
  var_is(&e, "NCCL_IB_DISABLE", "1");
  var_is(&e, "HOROVOD_THREAD_AFFINITY", "0,8");
  var_is(&e, "HOROVOD_NUM_NCCL_STREAMS", NULL); /* hvd reads none */
  var_is(&e, "HOROVOD_LOG_HIDE_TIME", "0");     /* the last spelling wins */
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);

  /* One list as it is; a later -x of NCCL_IB_DISABLE wins over --tcp's. */
  ck_assert_int_eq(parse(&o, one), HVD_OK);
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_GLOO_IFACE", "lo,eth0");
  var_is(&e, "NCCL_IB_DISABLE", "0");
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);

  /* --no-log-hide-timestamp is the command line's word over the file's. */
  ck_assert_int_eq(parse(&o, file), HVD_OK);
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_LOG_HIDE_TIME", "0");
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);
}
END_TEST

START_TEST(flags_rejected) {
  static const struct {
    const char *args[6];
    const char *says;
  } cases[] = {
      {{"--stall-check-warning-time-seconds", "0", "x", NULL},
       "--stall-check-warning-time-seconds: '0' is not a number of seconds from 0.001"},
      {{"--stall-check-warning-time-seconds", "soon", "x", NULL},
       "--stall-check-warning-time-seconds: 'soon'"},
      {{"--stall-check-warning-time-seconds", "-5", "x", NULL},
       "--stall-check-warning-time-seconds: '-5'"},
      {{"--stall-check-shutdown-time-seconds", "-1", "x", NULL},
       "--stall-check-shutdown-time-seconds: '-1' is not a number of seconds from 0"},
      {{"--stall-check-shutdown-time-seconds", "", "x", NULL},
       "--stall-check-shutdown-time-seconds: ''"},
      {{"--autotune", "--autotune-warmup-samples", "1.5", "x", NULL},
       "--autotune-warmup-samples: '1.5' is not a whole number from 0 to 1000000"},
      {{"--autotune", "--autotune-steps-per-sample", "-1", "x", NULL},
       "--autotune-steps-per-sample: '-1'"},
      {{"--autotune", "--autotune-steps-per-sample", "0", "x", NULL},
       "--autotune-steps-per-sample: '0' is not a whole number from 1 to 1000000"},
      {{"--autotune", "--autotune-bayes-opt-max-samples", "65", "x", NULL},
       "--autotune-bayes-opt-max-samples: '65' is not a whole number from 0 to 64"},
      {{"--autotune", "--autotune-bayes-opt-max-samples", "many", "x", NULL},
       "--autotune-bayes-opt-max-samples: 'many'"},
      {{"--autotune", "--autotune-gaussian-process-noise", "1.5", "x", NULL},
       "--autotune-gaussian-process-noise: '1.5' is not a number from 0 to 1"},
      {{"--autotune", "--autotune-gaussian-process-noise", "-0.1", "x", NULL},
       "--autotune-gaussian-process-noise: '-0.1'"},
      {{"--autotune", "--autotune-log-file", "", "x", NULL}, "--autotune-log-file: '' is no value"},
      {{"--autotune-log-file", "t.csv", "x", NULL},
       "--autotune-log-file has no effect without HOROVOD_AUTOTUNE: add --autotune"},
      {{"--autotune-warmup-samples", "3", "--no-autotune", "x", NULL},
       "--autotune-warmup-samples has no effect without HOROVOD_AUTOTUNE"},
      {{"--timeline-mark-cycles", "x", NULL}, "add --timeline-filename"},
      {{"--no-stall-check=1", "x", NULL}, "--no-stall-check takes no value"},
      {{"--disable-cache=yes", "x", NULL}, "--disable-cache takes no value"},
      {{"--check-build=1", NULL}, "--check-build takes no value"},
      {{"--config-file", "", "x", NULL}, "--config-file: empty file name"},
      {{"--config-file", NULL}, "--config-file needs a value"},
      {{"--mpi", NULL}, "--mpi: hvd has no MPI"},
      {{"--network-interface", "eth0", "--network-interfaces", "^lo", "x", NULL},
       "--network-interfaces '^lo': an exclusion ('^') cannot be added to other interfaces"},
      {{"--network-interface", "^lo", "--network-interface", "eth0", "x", NULL},
       "('^lo'); give one list"},
      {{"--network-interface", "", "x", NULL}, "--network-interface: '' is no value"},
      {{"--tcp=1", "x", NULL}, "--tcp takes no value"},
      {{"--num-nccl-streams", "two", "x", NULL},
       "--num-nccl-streams: 'two' is not a whole number >= 0"},
      {{"--num-nccl-streams", "-1", "x", NULL}, "--num-nccl-streams: '-1'"},
      {{"--num-nccl-streams", NULL}, "--num-nccl-streams needs a value"},
      {{"--thread-affinity", "", "x", NULL}, "--thread-affinity: '' is no value"},
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++)
    fails(cases[i].args, cases[i].says, NULL);
}
END_TEST

/* ---- the config file --------------------------------------------------------- */

/* horovodrun's own test file (test/single/data/config.test.yaml's layout). */
static const char FULL[] = "controller: gloo\n"
                           "\n"
                           "params:\n"
                           "  fusion_threshold_mb: 32\n"
                           "  cycle_time_ms: 10\n"
                           "  cache_capacity: 2048\n"
                           "  hierarchical_allreduce: true\n"
                           "  hierarchical_allgather: yes\n"
                           "\n"
                           "autotune:\n"
                           "  enabled: true\n"
                           "  log_file: 'horovod_autotune_log.txt'\n"
                           "  warmup_samples: 5\n"
                           "  steps_per_sample: 20\n"
                           "  bayes_opt_max_samples: 50\n"
                           "  gaussian_process_noise: 0.9\n"
                           "\n"
                           "timeline:\n"
                           "  filename: 'horovod_timeline.json'\n"
                           "  mark_cycles: true\n"
                           "\n"
                           "stall_check:\n"
                           "  enabled: false\n"
                           "  warning_time_seconds: 120\n"
                           "  shutdown_time_seconds: 240\n"
                           "\n"
                           "library_options:\n"
                           "  gloo_timeout_seconds: 60\n"
                           "\n"
                           "logging:\n"
                           "  level: INFO\n"
                           "  hide_timestamp: true\n";

START_TEST(file_reaches_the_ranks) {
  struct hvdrun_options o;
  struct hvdrun_env e = {0};
  const char *args[] = {"--config-file", write_file("full.yaml", FULL), "-np", "2", "x", NULL};

  ck_assert_int_eq(parse(&o, args), HVD_OK);
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_FUSION_THRESHOLD", "33554432");
  var_is(&e, "HOROVOD_CYCLE_TIME", "10");
  var_is(&e, "HOROVOD_CACHE_CAPACITY", "2048");
  var_is(&e, "HOROVOD_HIERARCHICAL_ALLREDUCE", "1");
  var_is(&e, "HOROVOD_HIERARCHICAL_ALLGATHER", "1");
  var_is(&e, "HOROVOD_AUTOTUNE", "1");
  var_is(&e, "HOROVOD_AUTOTUNE_LOG", "horovod_autotune_log.txt");
  var_is(&e, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "5");
  var_is(&e, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "20");
  var_is(&e, "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "50");
  var_is(&e, "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.9");
  var_is(&e, "HOROVOD_TIMELINE", "horovod_timeline.json");
  var_is(&e, "HOROVOD_TIMELINE_MARK_CYCLES", "1");
  var_is(&e, "HOROVOD_STALL_CHECK_DISABLE", "1");
  var_is(&e, "HOROVOD_STALL_CHECK_TIME_SECONDS", "120");
  var_is(&e, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "240");
  var_is(&e, "HOROVOD_GLOO_TIMEOUT_SECONDS", "60");
  var_is(&e, "HOROVOD_LOG_LEVEL", "INFO");
  var_is(&e, "HOROVOD_LOG_HIDE_TIME", "1");
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);
}
END_TEST

START_TEST(command_line_wins) {
  struct hvdrun_options o;
  struct hvdrun_env e = {0};
  const char *path = write_file("full.yaml", FULL);
  /* Before and after --config-file alike. */
  const char *args[] = {"--cache-capacity", "16",
                        "--no-hierarchical-allreduce",
                        "--stall-check",
                        "--config-file", path,
                        "--autotune-warmup-samples", "7",
                        "--log-level", "error",
                        "--log-with-timestamp",
                        "--stall-check-warning-time-seconds", "9",
                        "--timeline-filename", "mine.json",
                        "x", NULL};
  const char *no_autotune[] = {"--config-file", path, "--no-autotune", "x", NULL};

  ck_assert_int_eq(parse(&o, args), HVD_OK);
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_CACHE_CAPACITY", "16");
  var_is(&e, "HOROVOD_HIERARCHICAL_ALLREDUCE", "0");
  var_is(&e, "HOROVOD_HIERARCHICAL_ALLGATHER", "1"); /* the file's */
  var_is(&e, "HOROVOD_STALL_CHECK_DISABLE", "0");
  var_is(&e, "HOROVOD_STALL_CHECK_TIME_SECONDS", "9");
  var_is(&e, "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "240");
  var_is(&e, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "7");
  var_is(&e, "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "20");
  var_is(&e, "HOROVOD_LOG_LEVEL", "error");
  var_is(&e, "HOROVOD_LOG_HIDE_TIME", "0");
  var_is(&e, "HOROVOD_TIMELINE", "mine.json");
  var_is(&e, "HOROVOD_TIMELINE_MARK_CYCLES", "1");
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);

  /* --no-autotune keeps the file's autotune section from the ranks. */
  ck_assert_int_eq(parse(&o, no_autotune), HVD_OK);
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_AUTOTUNE", "0");
  var_is(&e, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", NULL);
  var_is(&e, "HOROVOD_CACHE_CAPACITY", "2048");
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);
}
END_TEST

START_TEST(file_details) {
  struct hvdrun_options o;
  struct hvdrun_env e = {0};
  /* Nulls set nothing, as in horovodrun; with_timestamp is hide_timestamp
   * turned round; the autotuner's values stay home when it is off; a
   * switch turned off needs nothing. The last of the two timestamp keys
   * wins. */
  const char *path = write_file("details.yaml", "params:\n"
                                                "  cache_capacity: ~\n"
                                                "  cycle_time_ms:\n"
                                                "autotune:\n"
                                                "  enabled: false\n"
                                                "  warmup_samples: 3\n"
                                                "timeline:\n"
                                                "  mark_cycles: false\n"
                                                "stall_check:\n"
                                                "logging:\n"
                                                "  hide_timestamp: true\n"
                                                "  with_timestamp: true\n");
  const char *args[] = {"--config-file", path, "x", NULL};
  const char *empty[] = {"--config-file", write_file("empty.yaml", "# nothing\n"), "x", NULL};

  ck_assert_int_eq(parse(&o, args), HVD_OK);
  ck_assert(!hvdrun_setting_on(&o, HVD_SET_AUTOTUNE) &&
            !hvdrun_setting_on(&o, HVD_SET_TIMELINE_MARK_CYCLES) &&
            !hvdrun_setting_on(&o, HVD_SET_LOG_HIDE_TIME));
  ck_assert_ptr_null(o.settings[HVD_SET_CACHE_CAPACITY]);
  ck_assert_ptr_null(o.settings[HVD_SET_CYCLE_TIME]);
  job_vars(&o, &e);
  var_is(&e, "HOROVOD_AUTOTUNE", "0");
  var_is(&e, "HOROVOD_AUTOTUNE_WARMUP_SAMPLES", NULL);
  var_is(&e, "HOROVOD_TIMELINE_MARK_CYCLES", NULL);
  var_is(&e, "HOROVOD_STALL_CHECK_DISABLE", NULL);
  var_is(&e, "HOROVOD_LOG_HIDE_TIME", "0");
  hvdrun_env_fini(&e);
  hvdrun_options_fini(&o);

  ck_assert_int_eq(parse(&o, empty), HVD_OK);
  ck_assert_uint_eq(o.nowned, 0);
  hvdrun_options_fini(&o);
}
END_TEST

/* What hvdrun_config_read hands on, one "flag=value" per call. */
struct recorded {
  char text[1024];
};

static hvd_status record_cb(void *arg, const char *flag, const char *value, const char *where) {
  struct recorded *r = arg;
  size_t len = strlen(r->text);
  ck_assert_ptr_nonnull(strstr(where, ".yaml:"));
  snprintf(r->text + len, sizeof(r->text) - len, "%s%s=%s", len > 0 ? " " : "", flag,
           value != NULL ? value : "");
  return HVD_OK;
}

START_TEST(horovods_default_file_warns) {
  /* horovodrun's config.default.yaml carries keys horovodrun ignores:
   * warnings, not errors, so that the file works as it is. */
  const char *path = write_file("default.yaml", "controller: gloo\n"
                                                "params:\n"
                                                "  fusion_threshold_mb: 64\n"
                                                "  hierarchical_allreduce: false\n"
                                                "autotune:\n"
                                                "  enabled: false\n"
                                                "  cycles_per_sample: 10\n"
                                                "timeline:\n"
                                                "  enabled: false\n"
                                                "  filename: 'horovod_timeline.json'\n"
                                                "stall_check:\n"
                                                "  enabled: true\n"
                                                "library_options:\n"
                                                "  mpi_threads_disabled: false\n"
                                                "  num_nccl_streams: 1\n"
                                                "  mlsl_bgt_affinity: 0\n"
                                                "logging:\n"
                                                "  with_timestamp: false\n");
  struct recorded r = {{0}};
  char *warned = NULL;
  size_t len = 0;
  FILE *warn = open_memstream(&warned, &len);

  ck_assert_ptr_nonnull(warn);
  ck_assert_int_eq(hvdrun_config_read(path, warn, record_cb, &r), HVD_OK);
  fclose(warn);
  ck_assert_str_eq(r.text, "--gloo= --fusion-threshold-mb=64 --hierarchical-allreduce=0 "
                           "--autotune=0 --timeline-filename=horovod_timeline.json "
                           "--no-stall-check=0 --log-without-timestamp=1");
  ck_assert_ptr_nonnull(strstr(warned, "default.yaml:7: autotune.cycles_per_sample is ignored"));
  ck_assert_ptr_nonnull(strstr(warned, "steps_per_sample"));
  ck_assert_ptr_nonnull(strstr(warned, "default.yaml:9: timeline.enabled is ignored"));
  ck_assert_ptr_nonnull(strstr(warned, "library_options.mpi_threads_disabled is ignored"));
  ck_assert_ptr_nonnull(strstr(warned, "library_options.num_nccl_streams is ignored"));
  ck_assert_ptr_nonnull(strstr(warned, "library_options.mlsl_bgt_affinity is ignored"));
  free(warned);
}
END_TEST

START_TEST(file_errors) {
  static const struct {
    const char *text;
    const char *says;
  } cases[] = {
      /* libyaml's own complaints, with its line and column */
      {"params:\n  cache_capacity: 5\n  fusion_threshold_mb: [1\n",
       "bad.yaml:4:1: invalid YAML: did not find expected ',' or ']'"},
      {"params:\n  cache_capacity: 5\n x: 1\n", "bad.yaml:3:2: invalid YAML:"},
      {"params:\n  cycle_time_ms: 'open\n", "bad.yaml:3:1: invalid YAML: found unexpected end"},
      {"params:\n  cycle_time_ms: \xc3\x28\n",
       "bad.yaml:2:19: invalid YAML: invalid trailing UTF-8"},
      {"a: 1\n---\nb: 2\n", "bad.yaml:2: a second YAML document"},
      /* unknown names: the key, and what is known */
      {"params:\n  cache_capacty: 5\n",
       "bad.yaml:2: unknown key 'params.cache_capacty' (params has fusion_threshold_mb, "
       "cycle_time_ms, cache_capacity,"},
      {"parms:\n  cache_capacity: 5\n", "bad.yaml:1: unknown section 'parms' (horovodrun's"},
      {"stall_check:\n  warning_time: 5\n", "unknown key 'stall_check.warning_time'"},
      {"logging:\n  level: info\n  colour: true\n", "bad.yaml:3: unknown key 'logging.colour'"},
      /* wrong types */
      {"params:\n  cache_capacity: \"5\"\n",
       "bad.yaml:2: params.cache_capacity: expected a number, not the string '5'"},
      {"params:\n  fusion_threshold_mb: lots\n", "expected a number, not the string 'lots'"},
      {"params:\n  cycle_time_ms: true\n", "expected a number, not the boolean true"},
      {"params:\n  hierarchical_allreduce: 1\n",
       "params.hierarchical_allreduce: expected true or false, not the number 1"},
      {"stall_check:\n  enabled: 'no'\n", "expected true or false, not the string 'no'"},
      {"stall_check:\n  warning_time_seconds: [1, 2]\n", "expected a number, not a list"},
      {"timeline:\n  filename: {a: 1}\n",
       "timeline.filename: expected a single value, not a mapping"},
      {"params: 5\n", "bad.yaml:1: params: expected a mapping of keys, not the number 5"},
      {"- params\n", "bad.yaml:1: expected a mapping of sections"},
      {"params:\n  cache_capacity: 1\n  cache_capacity: 2\n",
       "bad.yaml:3: 'cache_capacity' is given twice (also on line 2)"},
      {"? [a]\n: 1\n", "bad.yaml:1: expected a key name, not a list"},
      /* values the flags would refuse, named by key */
      {"params:\n  cache_capacity: -5\n", "bad.yaml:2: params.cache_capacity: '-5' is not a whole"},
      {"params:\n  cache_capacity: 1.5\n", "params.cache_capacity: '1.5' is not a whole number"},
      {"autotune:\n  gaussian_process_noise: 2\n",
       "bad.yaml:2: autotune.gaussian_process_noise: '2' is not a number from 0 to 1"},
      {"autotune:\n  warmup_samples: -1\n", "autotune.warmup_samples: '-1'"},
      {"stall_check:\n  warning_time_seconds: 0\n",
       "stall_check.warning_time_seconds: '0' is not a number of seconds"},
      {"stall_check:\n  shutdown_time_seconds: -3\n", "stall_check.shutdown_time_seconds: '-3'"},
      {"library_options:\n  gloo_timeout_seconds: 0\n", "library_options.gloo_timeout_seconds"},
      {"logging:\n  level: loud\n", "bad.yaml:2: logging.level: 'loud' is not one of trace, debug"},
      {"timeline:\n  mark_cycles: true\n",
       "bad.yaml:2: timeline.mark_cycles has no effect without HOROVOD_TIMELINE: add "
       "--timeline-filename FILE"},
      {"controller: mpi\n", "bad.yaml:1: controller is mpi, but hvd has no MPI"},
      {"controller: jsrun\n", "bad.yaml:1: controller: expected gloo"},
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++) {
    const char *args[] = {"--config-file", write_file("bad.yaml", cases[i].text), "-np", "1", "x",
                          NULL};
    fails(args, cases[i].says, "bad.yaml");
  }
}
END_TEST

/* A file's size and depth are bounded before anything is built from it,
 * and its text reaches the terminal without control characters. */
START_TEST(file_bounded) {
  enum { BIG = 256 * 1024 + 1, DEEP = 200 * 1024 };
  char *text = malloc(BIG + 1);
  const char *big[] = {"--config-file", NULL, "x", NULL};
  const char *deep[] = {"--config-file", NULL, "x", NULL};
  const char *escape[] = {"--config-file", write_file("esc.yaml", "params:\n  \"\\e[31mred\": 1\n"),
                          "x", NULL};
  struct hvdrun_options o;

  ck_assert_ptr_nonnull(text);
  memset(text, '#', BIG); /* a comment: valid YAML, only too long */
  text[BIG] = '\0';
  big[1] = write_file("big.yaml", text);
  fails(big, "is larger than 256 KiB", "big.yaml");
  memset(text, '[', DEEP); /* libyaml alone takes tens of seconds on this */
  text[DEEP] = '\0';
  deep[1] = write_file("deep.yaml", text);
  fails(deep, "nested more than 16 deep", "deep.yaml:1:");
  free(text);
  ck_assert_int_eq(parse(&o, escape), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_msg(strchr(hvd_last_error_message(), '\x1b') == NULL, "%s", hvd_last_error_message());
  ck_assert_msg(strstr(hvd_last_error_message(), "unknown key 'params.?[31mred'") != NULL, "%s",
                hvd_last_error_message());
  hvdrun_options_fini(&o);
}
END_TEST

/* A pipe is read once (no second pass from the start). */
START_TEST(file_from_pipe) {
  static const char yaml[] = "params:\n  cache_capacity: 5\n";
  struct hvdrun_options o;
  char path[32];
  const char *args[] = {"--config-file", path, "x", NULL};
  int fds[2];

  ck_assert_int_eq(pipe(fds), 0);
  ck_assert_int_eq(write(fds[1], yaml, sizeof(yaml) - 1), (ssize_t)sizeof(yaml) - 1);
  close(fds[1]);
  snprintf(path, sizeof(path), "/dev/fd/%d", fds[0]);
  ck_assert_int_eq(parse(&o, args), HVD_OK);
  ck_assert_str_eq(o.settings[HVD_SET_CACHE_CAPACITY], "5");
  hvdrun_options_fini(&o);
  close(fds[0]);
}
END_TEST

START_TEST(file_missing_or_unreadable) {
  char path[PATH_MAX];
  const char *missing[] = {"--config-file", path, "x", NULL};
  const char *a_dir[] = {"--config-file", dir, "x", NULL};
  snprintf(path, sizeof(path), "%s/none.yaml", dir);
  fails(missing, "--config-file: cannot open '", "none.yaml': No such file or directory");
  fails(a_dir, "--config-file: '", "' is a directory");
}
END_TEST

START_TEST(file_controller) {
  struct hvdrun_options o;
  const char *mpi = write_file("mpi.yaml", "controller: mpi\n");
  /* --gloo on the command line leaves the file's controller unread, as in
   * horovodrun; a file's gloo is fine (any case). */
  const char *gloo_wins[] = {"--gloo", "--config-file", mpi, "x", NULL};
  const char *gloo[] = {"--config-file", write_file("gloo.yaml", "controller: Gloo\n"), "x", NULL};
  ck_assert_int_eq(parse(&o, gloo_wins), HVD_OK);
  hvdrun_options_fini(&o);
  ck_assert_int_eq(parse(&o, gloo), HVD_OK);
  hvdrun_options_fini(&o);
}
END_TEST

/* ---- --check-build ----------------------------------------------------------- */

static char *check_build(const char *python_dir, int nccl) {
  char *text = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&text, &len);
  ck_assert_ptr_nonnull(out);
  hvdrun_check_build(out, python_dir, nccl);
  fclose(out);
  return text;
}

START_TEST(check_build_layout) {
  char torch[PATH_MAX], init[PATH_MAX + 16];
  char *text;
  FILE *f;

  /* horovodrun's layout, with what hvd lacks unchecked */
  text = check_build(NULL, 0);
  ck_assert_msg(strncmp(text, "hvd v", 5) == 0, "%s", text);
  ck_assert_ptr_nonnull(
      strstr(text, "\nAvailable Frameworks:\n    [ ] TensorFlow\n    [ ] PyTorch\n"));
  ck_assert_ptr_nonnull(strstr(text, "\nAvailable Controllers:\n    [ ] MPI\n    [X] Gloo"));
  ck_assert_ptr_nonnull(strstr(text, "\nAvailable Tensor Operations:\n    [ ] NCCL\n    [ ] DDL\n"
                                     "    [ ] CCL\n    [ ] MPI\n    [X] Gloo"));
  free(text);

  /* PyTorch with hvd's torch package; NCCL with its version. */
  snprintf(torch, sizeof(torch), "%s/hvd", dir);
  ck_assert_int_eq(mkdir(torch, 0755), 0);
  snprintf(torch, sizeof(torch), "%s/hvd/torch", dir);
  ck_assert_int_eq(mkdir(torch, 0755), 0);
  snprintf(init, sizeof(init), "%s/__init__.py", torch);
  ck_assert_ptr_nonnull(f = fopen(init, "w"));
  fclose(f);
  text = check_build(dir, 22809);
  ck_assert_ptr_nonnull(strstr(text, "    [X] PyTorch\n"));
  ck_assert_ptr_nonnull(strstr(text, "    [X] NCCL (2.28.9)\n"));
  free(text);
  unlink(init);
  rmdir(torch);
  snprintf(torch, sizeof(torch), "%s/hvd", dir);
  rmdir(torch);
}
END_TEST

START_TEST(check_build_needs_no_command) {
  struct hvdrun_options o;
  const char *alone[] = {"--check-build", NULL};
  const char *short_name[] = {"-cb", "-np", "2", "--config-file",
                              write_file("ok.yaml", "params:\n  cache_capacity: 3\n"), NULL};
  const char *bad_file[] = {"-cb", "--config-file", write_file("no.yaml", "params: [\n"), NULL};
  ck_assert_int_eq(parse(&o, alone), HVD_OK);
  ck_assert(o.check_build);
  ck_assert_int_eq(o.ncommand, 0);
  hvdrun_options_fini(&o);
  ck_assert_int_eq(parse(&o, short_name), HVD_OK);
  ck_assert(o.check_build);
  ck_assert_str_eq(o.settings[HVD_SET_CACHE_CAPACITY], "3");
  hvdrun_options_fini(&o);
  /* As horovodrun: the config file is still checked first. */
  fails(bad_file, "invalid YAML", "no.yaml");
}
END_TEST

/* ---- hvdrun itself: exit codes ----------------------------------------------- */

/* Runs hvdrun with args (shell words) in dir; returns its exit code and
 * its stdout and stderr, together, in out. */
static int run_hvdrun(const char *args, char *out, size_t size) {
  char cmd[2 * PATH_MAX + 256], log[PATH_MAX];
  FILE *f;
  size_t n;
  int status;
  snprintf(log, sizeof(log), "%s/out.txt", dir);
  snprintf(cmd, sizeof(cmd), "cd %s && %s/hvdrun %s >%s 2>&1", dir, HVD_BIN_DIR, args, log);
  status = system(cmd);
  ck_assert(status != -1 && WIFEXITED(status));
  ck_assert_ptr_nonnull(f = fopen(log, "r"));
  n = fread(out, 1, size - 1, f);
  out[n] = '\0';
  fclose(f);
  unlink(log);
  return WEXITSTATUS(status);
}

START_TEST(hvdrun_exit_codes) {
  char out[4096];
  write_file("bad.yaml", "stall_check:\n  enabled: maybe\n");
  ck_assert_int_eq(run_hvdrun("--check-build", out, sizeof(out)), 0);
  ck_assert_ptr_nonnull(strstr(out, "Available Controllers:"));
  ck_assert_ptr_nonnull(strstr(out, "[X] Gloo"));
  ck_assert_int_eq(run_hvdrun("--version", out, sizeof(out)), 0);
  ck_assert_msg(strncmp(out, hvd_version(), strlen(hvd_version())) == 0 &&
                    strcmp(out + strlen(hvd_version()), "\n") == 0,
                "hvdrun --version printed '%s'", out);
  ck_assert_int_eq(run_hvdrun("-v -np 2", out, sizeof(out)), 0);
  ck_assert_int_eq(run_hvdrun("--config-file missing.yaml -np 1 true", out, sizeof(out)), 2);
  ck_assert_str_eq(out, "hvdrun: --config-file: cannot open 'missing.yaml': No such file or "
                        "directory\n");
  ck_assert_int_eq(run_hvdrun("--config-file bad.yaml -np 1 true", out, sizeof(out)), 2);
  ck_assert_str_eq(out, "hvdrun: bad.yaml:2: stall_check.enabled: expected true or false, not "
                        "the string 'maybe'\n");
  /* --num-nccl-streams: 1 is what hvd does; another count runs, with one line. */
  ck_assert_int_eq(run_hvdrun("--num-nccl-streams 1 -np 1 true", out, sizeof(out)), 0);
  ck_assert_str_eq(out, "");
  ck_assert_int_eq(run_hvdrun("--num-nccl-streams 4 -np 1 true", out, sizeof(out)), 0);
  ck_assert_str_eq(out, "hvdrun: warning: --num-nccl-streams 4 changes nothing: hvd runs NCCL "
                        "on one stream per GPU\n");
}
END_TEST

Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("config");
  tcase_add_checked_fixture(tc, dir_setup, dir_teardown);
  tcase_add_test(tc, flags_reach_the_ranks);
  tcase_add_test(tc, flags_not_given_set_nothing);
  tcase_add_test(tc, horovodrun_library_flags);
  tcase_add_test(tc, flags_rejected);
  tcase_add_test(tc, file_reaches_the_ranks);
  tcase_add_test(tc, command_line_wins);
  tcase_add_test(tc, file_details);
  tcase_add_test(tc, horovods_default_file_warns);
  tcase_add_test(tc, file_errors);
  tcase_add_test(tc, file_missing_or_unreadable);
  tcase_add_test(tc, file_bounded);
  tcase_add_test(tc, file_from_pipe);
  tcase_add_test(tc, file_controller);
  tcase_add_test(tc, check_build_layout);
  tcase_add_test(tc, check_build_needs_no_command);
  tcase_add_test(tc, hvdrun_exit_codes);
  suite_add_tcase(s, tc);
  return s;
}
