/*
 * Tests of the launch module: Slurm's compressed lists, which launcher a
 * process's variables name and the job they describe, admission to a
 * store rank 0 hosts (a process of another uid refused), and whole jobs
 * started with the variables Slurm, torchrun and a Kubernetes Indexed Job
 * set, without them (the real Slurm runs in tests/slurm/).
 */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch/launch.h"

/* ==== host lists ============================================================ */

static void expect_hosts(const char *text, const char *const *want, size_t n) {
  struct launch_hostlist l;
  ck_assert_msg(launch_hostlist_parse(text, 1000, &l) == HVD_OK, "%s: %s", text,
                hvd_last_error_message());
  ck_assert_msg(l.count == n, "%s: %zu names, want %zu", text, l.count, n);
  for (size_t i = 0; i < n; i++)
    ck_assert_str_eq(launch_hostlist_get(&l, i), want[i]);
  ck_assert_ptr_null(launch_hostlist_get(&l, n));
  launch_hostlist_fini(&l);
}

#define HOSTS(text, ...)                                                 \
  do {                                                                   \
    static const char *const want_[] = {__VA_ARGS__};                    \
    expect_hosts(text, want_, sizeof(want_) / sizeof(want_[0]));         \
  } while (0)

START_TEST(hostlist_expands) {
  HOSTS("node1", "node1");
  HOSTS("a,b,c", "a", "b", "c");
  HOSTS("gpu[01-04,07],cpu-a[1-2]", "gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu-a1",
        "cpu-a2");
  HOSTS("n[8-11]", "n8", "n9", "n10", "n11");
  HOSTS("n[098-101]", "n098", "n099", "n100", "n101");
  HOSTS("n[5]", "n5");
  HOSTS("[1-2]", "1", "2");
  HOSTS("rack[1-2]-n[1-2]", "rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2");
  HOSTS("n[1-2].cluster,login", "n1.cluster", "n2.cluster", "login");
  HOSTS("node-10.example.org", "node-10.example.org");
}
END_TEST

START_TEST(hostlist_refuses) {
  static const char *const bad[] = {"",       ",",          "a,",      ",a",       "a,,b",
                                    "n[",     "n[1",        "n[1-",    "n[1-2",    "n[]",
                                    "n[,1]",  "n[1,]",      "n[2-1]",  "n]",       "n[1]]",
                                    "n[a]",   "n[1-b]",     "a b",     "n[-1]",    "n[1--2]",
                                    "n[1234567890]", "n[[1]]", "a\tb",   "n[1-2]x]"};
  struct launch_hostlist l;
  char longname[400];

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    ck_assert_msg(launch_hostlist_parse(bad[i], 1000, &l) != HVD_OK, "'%s' accepted", bad[i]);
  /* Bounds before allocation: names, and a name's length. */
  ck_assert_int_eq(launch_hostlist_parse("n[1-1001]", 1000, &l), HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(launch_hostlist_parse("n[1-500],m[1-501]", 1000, &l), HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(launch_hostlist_parse("a[1-100]b[1-100]", 1000, &l), HVD_ERR_TOO_LARGE);
  memset(longname, 'x', 256);
  longname[256] = '\0';
  ck_assert_int_eq(launch_hostlist_parse(longname, 1000, &l), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "255"));
  longname[255] = '\0';
  ck_assert_int_eq(launch_hostlist_parse(longname, 1000, &l), HVD_OK);
  launch_hostlist_fini(&l);
}
END_TEST

START_TEST(tasks_per_node) {
  int counts[8];
  size_t n = 0;

  ck_assert_int_eq(launch_tasks_per_node_parse("2(x3),1", counts, 8, &n), HVD_OK);
  ck_assert_uint_eq(n, 4);
  ck_assert(counts[0] == 2 && counts[1] == 2 && counts[2] == 2 && counts[3] == 1);
  ck_assert_int_eq(launch_tasks_per_node_parse("4", counts, 8, &n), HVD_OK);
  ck_assert(n == 1 && counts[0] == 4);
  ck_assert_int_eq(launch_tasks_per_node_parse("1,3(x2)", counts, 8, &n), HVD_OK);
  ck_assert(n == 3 && counts[0] == 1 && counts[2] == 3);
  ck_assert_int_eq(launch_tasks_per_node_parse("1(x9)", counts, 8, &n), HVD_ERR_TOO_LARGE);
  static const char *const bad[] = {"", "0", "2(x0)", "2(x)", "2(3)", "2(x3", "2,", ",2",
                                    "a", "2 ,1", "-1", "2(x3)1"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    ck_assert_msg(launch_tasks_per_node_parse(bad[i], counts, 8, &n) != HVD_OK, "'%s'", bad[i]);
}
END_TEST

/* ==== detection ============================================================== */

/* Every variable detection reads, cleared (each test runs in its own
 * process). */
static void clean_env(void) {
  static const char *const vars[] = {
      "HVD_LAUNCHER", "HOROVOD_RANK", "HOROVOD_SIZE", "HVD_POD", "HOROVOD_ELASTIC",
      "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID",
      "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_STEP_NODELIST", "SLURM_NODELIST",
      "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURMD_NODENAME", "RANK",
      "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
      "JOB_COMPLETION_INDEX", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
      "HVD_PORT_RANGE", "HVD_TOKEN"};
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
    unsetenv(vars[i]);
}

/* Task `rank` of an srun step of 5 tasks on node[1-3] (2, 2, 1). */
static void slurm_env(int rank) {
  static const int node_of[] = {0, 0, 1, 1, 2}, local_of[] = {0, 1, 0, 1, 0};
  char text[16];
  clean_env();
  setenv("SLURM_JOB_ID", "4242", 1);
  setenv("SLURM_STEP_ID", "3", 1);
  setenv("SLURM_STEP_NUM_TASKS", "5", 1);
  setenv("SLURM_STEP_NODELIST", "node[1-3]", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2),1", 1);
  snprintf(text, sizeof(text), "%d", rank);
  setenv("SLURM_PROCID", text, 1);
  snprintf(text, sizeof(text), "%d", node_of[rank]);
  setenv("SLURM_NODEID", text, 1);
  snprintf(text, sizeof(text), "%d", local_of[rank]);
  setenv("SLURM_LOCALID", text, 1);
  snprintf(text, sizeof(text), "node%d", node_of[rank] + 1);
  setenv("SLURMD_NODENAME", text, 1);
}

static struct launch_job detect_ok(void) {
  struct launch_job job;
  ck_assert_msg(launch_detect(&job) == HVD_OK, "%s", hvd_last_error_message());
  return job;
}

/* launch_detect fails naming `what`. */
static void detect_fails(const char *what) {
  struct launch_job job;
  ck_assert_int_ne(launch_detect(&job), HVD_OK);
  ck_assert_msg(strstr(hvd_last_error_message(), what) != NULL, "'%s' not in: %s", what,
                hvd_last_error_message());
}

START_TEST(detect_slurm) {
  struct launch_job job, job4;

  slurm_env(3);
  job = detect_ok();
  ck_assert_int_eq(job.kind, LAUNCH_SLURM);
  ck_assert_ptr_nonnull(strstr(job.why, "SLURM_PROCID=3"));
  ck_assert(job.rank == 3 && job.size == 5);
  ck_assert(job.local_rank == 1 && job.local_size == 2);
  /* local rank 1 runs on nodes 1 and 2: this is the second */
  ck_assert(job.cross_rank == 1 && job.cross_size == 2);
  ck_assert_str_eq(job.host, "node2");
  ck_assert_str_eq(job.store_host, "node1");
  ck_assert_str_eq(job.job, "slurm:4242.3");
  ck_assert(job.store_port >= 20000 && job.store_port <= 29999);
  ck_assert(!job.same_host);
  slurm_env(4);
  job4 = detect_ok();
  ck_assert(job4.local_rank == 0 && job4.local_size == 1 && job4.cross_rank == 2 &&
            job4.cross_size == 3);
  ck_assert_int_eq(job4.store_port, job.store_port); /* every task derives the same */
  setenv("HVD_PORT_RANGE", "41000-41003", 1);
  job = detect_ok();
  ck_assert(job.store_port >= 41000 && job.store_port <= 41003);
  setenv("SLURM_STEP_ID", "4", 1); /* another step, most likely another port */
  ck_assert_int_eq(detect_ok().kind, LAUNCH_SLURM);
}
END_TEST

START_TEST(detect_slurm_errors) {
  slurm_env(1);
  setenv("SLURM_PROCID", "x", 1);
  detect_fails("SLURM_PROCID='x'");
  slurm_env(1);
  setenv("SLURM_PROCID", "5", 1);
  detect_fails("SLURM_PROCID='5' is not an integer in 0 to 4");
  slurm_env(1);
  unsetenv("SLURM_STEP_NUM_TASKS");
  detect_fails("SLURM_STEP_NUM_TASKS is not set");
  slurm_env(1);
  setenv("SLURM_STEP_NODELIST", "node[1-3", 1);
  detect_fails("SLURM_STEP_NODELIST: host list 'node[1-3'");
  slurm_env(1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x3)", 1);
  detect_fails("SLURM_STEP_TASKS_PER_NODE='2(x3)' adds up to 6 tasks, not 5");
  slurm_env(1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "1(x5)", 1);
  detect_fails("name more than 3 nodes");
  slurm_env(1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2,2", 1);
  detect_fails("counts 2 nodes");
  slurm_env(1);
  setenv("SLURM_LOCALID", "2", 1);
  detect_fails("SLURM_LOCALID=2 but node 0 runs 2 tasks");
  slurm_env(0);
  setenv("SLURMD_NODENAME", "node3", 1);
  detect_fails("task 0 runs on node3, not on the step's first node node1");
  slurm_env(1);
  setenv("HVD_PORT_RANGE", "9-8", 1);
  detect_fails("HVD_PORT_RANGE='9-8'");
}
END_TEST

static void torchrun_env(int rank, int size, int local_size) {
  char text[16];
  clean_env();
  setenv("MASTER_ADDR", "trainer-0", 1);
  setenv("MASTER_PORT", "29500", 1);
  snprintf(text, sizeof(text), "%d", rank);
  setenv("RANK", text, 1);
  snprintf(text, sizeof(text), "%d", size);
  setenv("WORLD_SIZE", text, 1);
  if (local_size > 0) {
    snprintf(text, sizeof(text), "%d", rank % local_size);
    setenv("LOCAL_RANK", text, 1);
    snprintf(text, sizeof(text), "%d", local_size);
    setenv("LOCAL_WORLD_SIZE", text, 1);
    snprintf(text, sizeof(text), "%d", rank / local_size);
    setenv("GROUP_RANK", text, 1);
    snprintf(text, sizeof(text), "%d", size / local_size);
    setenv("GROUP_WORLD_SIZE", text, 1);
  }
}

START_TEST(detect_torchrun) {
  struct launch_job job;

  torchrun_env(5, 8, 4);
  job = detect_ok();
  ck_assert_int_eq(job.kind, LAUNCH_TORCHRUN);
  ck_assert(job.rank == 5 && job.size == 8 && job.local_rank == 1 && job.local_size == 4 &&
            job.cross_rank == 1 && job.cross_size == 2);
  ck_assert_str_eq(job.store_host, "trainer-0");
  ck_assert_int_eq(job.store_port, 29501);
  ck_assert_str_eq(job.job, "torchrun:trainer-0:29500");
  setenv("TORCHELASTIC_RUN_ID", "abc", 1);
  setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
  ck_assert_str_eq(detect_ok().job, "torchrun:trainer-0:29500/abc.2");
  /* PyTorchJob without torchrun: no local ranks, derived later. */
  torchrun_env(2, 3, 0);
  job = detect_ok();
  ck_assert(job.rank == 2 && job.size == 3 && job.local_rank == -1 && job.cross_rank == -1);
  torchrun_env(1, 2, 2);
  ck_assert(detect_ok().same_host);
  torchrun_env(1, 2, 2);
  unsetenv("LOCAL_WORLD_SIZE");
  detect_fails("LOCAL_RANK is set but LOCAL_WORLD_SIZE is not");
  torchrun_env(1, 2, 2);
  setenv("MASTER_PORT", "65535", 1);
  detect_fails("MASTER_PORT='65535'");
  torchrun_env(1, 2, 2);
  setenv("HVD_LAUNCHER", "torchrun", 1);
  unsetenv("MASTER_ADDR");
  detect_fails("MASTER_ADDR is not set");
}
END_TEST

START_TEST(detect_k8s) {
  struct launch_job job;

  clean_env();
  setenv("JOB_COMPLETION_INDEX", "3", 1);
  detect_fails("HOROVOD_SIZE is not set");
  setenv("HOROVOD_SIZE", "4", 1);
  setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "train-0.train", 1);
  job = detect_ok();
  ck_assert_int_eq(job.kind, LAUNCH_K8S);
  ck_assert(job.rank == 3 && job.size == 4 && job.local_rank == -1);
  ck_assert_str_eq(job.store_host, "train-0.train");
  ck_assert_int_eq(job.store_port, 29400);
  setenv("JOB_COMPLETION_INDEX", "4", 1);
  detect_fails("JOB_COMPLETION_INDEX='4'");
}
END_TEST

START_TEST(detect_order_and_forcing) {
  struct launch_job job;

  clean_env();
  ck_assert_int_eq(detect_ok().kind, LAUNCH_NONE);
  /* hvdrun's ranks started by srun carry both: hvdrun's win. */
  slurm_env(1);
  setenv("HOROVOD_RANK", "1", 1);
  ck_assert_int_eq(detect_ok().kind, LAUNCH_HVDRUN);
  /* Slurm before torchrun's variables (a user's sbatch may export them). */
  slurm_env(1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  setenv("MASTER_ADDR", "x", 1);
  setenv("MASTER_PORT", "1", 1);
  ck_assert_int_eq(detect_ok().kind, LAUNCH_SLURM);
  /* ... but the workers of `srun torchrun ...` are torchrun's. */
  setenv("TORCHELASTIC_RUN_ID", "none", 1);
  ck_assert_int_eq(detect_ok().kind, LAUNCH_TORCHRUN);
  unsetenv("TORCHELASTIC_RUN_ID");
  setenv("HVD_LAUNCHER", "none", 1);
  job = detect_ok();
  ck_assert_int_eq(job.kind, LAUNCH_NONE);
  ck_assert_str_eq(job.why, "HVD_LAUNCHER=none");
  setenv("HVD_LAUNCHER", "TorchRun", 1);
  ck_assert_int_eq(detect_ok().kind, LAUNCH_TORCHRUN);
  setenv("HVD_LAUNCHER", "mpi", 1);
  detect_fails("HVD_LAUNCHER='mpi' is not one of slurm, torchrun, k8s, hvdrun, none");
  /* The batch script of sbatch, an salloc shell: no step, no detection. */
  slurm_env(0);
  unsetenv("SLURM_STEP_ID");
  ck_assert_int_eq(detect_ok().kind, LAUNCH_NONE);
}
END_TEST

/* ==== admission ================================================================ */

#define TOKEN "0123456789abcdef0123456789abcdef0123456789abcdef"

static struct rdzv_server *admitting_server(const char *job) {
  static char job_copy[64];
  struct rdzv_server_config cfg;
  struct rdzv_server *srv = NULL;

  snprintf(job_copy, sizeof(job_copy), "%s", job);
  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  cfg.token = TOKEN;
  cfg.admit = launch_admit_cb;
  cfg.admit_arg = job_copy;
  cfg.job = job_copy;
  ck_assert_msg(rdzv_server_start(&cfg, &srv) == HVD_OK, "%s", hvd_last_error_message());
  return srv;
}

START_TEST(admit_same_uid_local) {
  struct rdzv_server *srv = admitting_server("test:1");
  char token[HVD_TOKEN_HEX_DIGITS + 1];
  struct rdzv_client *c = NULL;
  struct hvd_buf job, tok;

  setenv("HVD_MUNGE_SOCKET", "/nonexistent/munge.socket", 1); /* no MUNGE: the socket decides */
  ck_assert_msg(launch_admission("127.0.0.1", rdzv_server_port(srv), "test:1", 5000, token,
                                 sizeof(token)) == HVD_OK,
                "%s", hvd_last_error_message());
  ck_assert_str_eq(token, TOKEN);
  /* Another job's store: refused by the rank, naming both. */
  ck_assert_int_eq(launch_admission("127.0.0.1", rdzv_server_port(srv), "test:2", 5000, token,
                                    sizeof(token)),
                   HVD_ERR_CONFLICT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "belongs to job 'test:1'"));
  /* A credential that is not one, and an unknown kind. */
  ck_assert_int_eq(rdzv_client_create("127.0.0.1", rdzv_server_port(srv), NULL, 5000, &c), HVD_OK);
  hvd_buf_init(&job, 0);
  hvd_buf_init(&tok, 0);
  ck_assert_int_eq(rdzv_client_admit(c, "munge:AAAA", &job, &tok), HVD_ERR_UNAUTHORIZED);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HTTP 403"));
  ck_assert_int_eq(rdzv_client_admit(c, "password:x", &job, &tok), HVD_ERR_UNAUTHORIZED);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "unknown kind of credential"));
  ck_assert_int_eq(tok.len, 0);
  /* The store itself stays closed without the token. */
  ck_assert_int_eq(rdzv_client_set(c, "global", "0", "x", 1), HVD_ERR_UNAUTHORIZED);
  hvd_buf_fini(&job);
  hvd_buf_fini(&tok);
  rdzv_client_destroy(c);
  rdzv_server_stop(srv);
}
END_TEST

/* A child of another uid: admission, then the store without the token;
 * exit code 0 when both were refused. */
static int outsider(int port) {
  char token[HVD_TOKEN_HEX_DIGITS + 1];
  struct rdzv_client *c = NULL;
  struct hvd_buf value;
  int refused = 0;

  if (setgid(65534) != 0 || setuid(65534) != 0)
    return 10;
  if (launch_admission("127.0.0.1", port, "test:1", 5000, token, sizeof(token)) ==
          HVD_ERR_UNAUTHORIZED &&
      strstr(hvd_last_error_message(), "process of uid 65534") != NULL)
    refused++;
  hvd_buf_init(&value, 0);
  if (rdzv_client_create("127.0.0.1", port, NULL, 5000, &c) == HVD_OK &&
      rdzv_client_get(c, "secrets", "k", &value, NULL) == HVD_ERR_UNAUTHORIZED &&
      rdzv_client_set(c, "secrets", "k", "evil", 4) == HVD_ERR_UNAUTHORIZED)
    refused++;
  rdzv_client_destroy(c);
  hvd_buf_fini(&value);
  return refused == 2 ? 0 : 20 + refused;
}

START_TEST(admit_refuses_another_uid) {
  struct rdzv_server *srv;
  struct rdzv_client *c = NULL;
  struct hvd_buf value;
  pid_t pid;
  int status;

  setenv("HVD_MUNGE_SOCKET", "/nonexistent/munge.socket", 1);
  srv = admitting_server("test:1");
  ck_assert_int_eq(rdzv_client_create("127.0.0.1", rdzv_server_port(srv), TOKEN, 5000, &c),
                   HVD_OK);
  ck_assert_int_eq(rdzv_client_set(c, "secrets", "k", "v", 1), HVD_OK);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    alarm(30);
    _exit(outsider(rdzv_server_port(srv)));
  }
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "outsider: status %d", status);
  hvd_buf_init(&value, 0);
  ck_assert_int_eq(rdzv_client_get(c, "secrets", "k", &value, NULL), HVD_OK);
  ck_assert_str_eq(value.data, "v"); /* untouched */
  hvd_buf_fini(&value);
  rdzv_client_destroy(c);
  rdzv_server_stop(srv);
}
END_TEST

START_TEST(admit_path_rules) {
  struct rdzv_server_config cfg;
  struct rdzv_server *srv = NULL;
  struct rdzv_client *c = NULL;
  struct hvd_buf job, tok;

  /* A store without an admission callback refuses admission. */
  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  cfg.token = TOKEN;
  ck_assert_int_eq(rdzv_server_start(&cfg, &srv), HVD_OK);
  ck_assert_int_eq(rdzv_client_create("127.0.0.1", rdzv_server_port(srv), NULL, 5000, &c), HVD_OK);
  hvd_buf_init(&job, 0);
  hvd_buf_init(&tok, 0);
  ck_assert_int_eq(rdzv_client_admit(c, NULL, &job, &tok), HVD_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "by the job token only"));
  hvd_buf_fini(&job);
  hvd_buf_fini(&tok);
  rdzv_client_destroy(c);
  rdzv_server_stop(srv);
}
END_TEST

/* ==== whole jobs with a launcher's variables ================================== */

typedef void (*env_fn)(int rank, int size);

/* A rank: hvd_init, its place, one allreduce of the ranks; 0 when right. */
static int run_rank(int rank, int size, int want_local, int want_local_size) {
  int64_t shape[1] = {1};
  float in, out = 0;
  hvd_tensor t = {NULL, HVD_FLOAT32, 1, shape, &in, &out};
  hvd_options o = HVD_OPTIONS_INIT;

  if (hvd_init() != HVD_OK) {
    fprintf(stderr, "rank %d: hvd_init: %s\n", rank, hvd_last_error_message());
    return 10;
  }
  if (hvd_rank() != rank || hvd_size() != size) {
    fprintf(stderr, "rank %d: hvd says %d of %d\n", rank, hvd_rank(), hvd_size());
    return 11;
  }
  if (hvd_local_rank() != want_local || hvd_local_size() != want_local_size) {
    fprintf(stderr, "rank %d: local %d of %d\n", rank, hvd_local_rank(), hvd_local_size());
    return 12;
  }
  in = (float)(rank + 1);
  if (hvd_allreduce(&t, &o) != HVD_OK || out != (float)(size * (size + 1) / 2)) {
    fprintf(stderr, "rank %d: allreduce: %s (%g)\n", rank, hvd_last_error_message(), out);
    return 13;
  }
  return hvd_shutdown() == HVD_OK ? 0 : 14;
}

/* Forks `size` ranks, each with env(rank, size); all must exit 0. */
static void run_job(int size, env_fn env) {
  pid_t pids[8];
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      alarm(60);
      env(r, size);
      setenv("HVD_MUNGE_SOCKET", "/nonexistent/munge.socket", 1);
      setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "20", 1);
      _exit(run_rank(r, size, r, size));
    }
  }
  for (int r = 0; r < size; r++) {
    int status;
    ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status 0x%x", r,
                  status);
  }
}

/* A port for the job: the test runs next to others. */
static int job_port(void) {
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sin);
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  ck_assert(bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0);
  ck_assert(getsockname(fd, (struct sockaddr *)&sin, &len) == 0);
  port = ntohs(sin.sin_port);
  close(fd);
  return port;
}

static int g_port;

static void one_host_slurm(int rank, int size) {
  char text[32];
  clean_env();
  setenv("SLURM_JOB_ID", "77", 1);
  setenv("SLURM_STEP_ID", "0", 1);
  snprintf(text, sizeof(text), "%d", size);
  setenv("SLURM_STEP_NUM_TASKS", text, 1);
  setenv("SLURM_STEP_NODELIST", "localhost", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", text, 1);
  setenv("SLURMD_NODENAME", "localhost", 1);
  setenv("SLURM_NODEID", "0", 1);
  snprintf(text, sizeof(text), "%d", rank);
  setenv("SLURM_PROCID", text, 1);
  setenv("SLURM_LOCALID", text, 1);
  snprintf(text, sizeof(text), "%d", g_port);
  setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", text, 1);
}

static void one_host_torchrun(int rank, int size) {
  torchrun_env(rank, size, size);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  char text[16];
  snprintf(text, sizeof(text), "%d", g_port - 1);
  setenv("MASTER_PORT", text, 1);
}

START_TEST(job_under_slurm_variables) {
  g_port = job_port();
  run_job(3, one_host_slurm);
}
END_TEST

START_TEST(job_under_torchrun_variables) {
  g_port = job_port();
  run_job(4, one_host_torchrun);
}
END_TEST

/* The store's port is taken: rank 0 says which and why, at once. */
START_TEST(job_store_port_taken) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT};

  char range[16];

  g_port = job_port();
  sin6.sin6_port = htons((uint16_t)g_port);
  ck_assert(bind(fd, (struct sockaddr *)&sin6, sizeof(sin6)) == 0);
  ck_assert(listen(fd, 1) == 0);
  one_host_slurm(0, 2);
  unsetenv("HOROVOD_GLOO_RENDEZVOUS_PORT");
  snprintf(range, sizeof(range), "%d", g_port); /* the only port to derive */
  setenv("HVD_PORT_RANGE", range, 1);
  ck_assert_int_ne(hvd_init(), HVD_OK);
  ck_assert_msg(strstr(hvd_last_error_message(), "which another process holds") != NULL &&
                    strstr(hvd_last_error_message(), "derived from job 77 step 0") != NULL,
                "%s", hvd_last_error_message());
  close(fd);
}
END_TEST

static Suite *lists_suite(void) {
  Suite *s = suite_create("lists");
  TCase *tc = tcase_create("lists");
  tcase_add_test(tc, hostlist_expands);
  tcase_add_test(tc, hostlist_refuses);
  tcase_add_test(tc, tasks_per_node);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *detect_suite(void) {
  Suite *s = suite_create("detect");
  TCase *tc = tcase_create("detect");
  tcase_add_test(tc, detect_slurm);
  tcase_add_test(tc, detect_slurm_errors);
  tcase_add_test(tc, detect_torchrun);
  tcase_add_test(tc, detect_k8s);
  tcase_add_test(tc, detect_order_and_forcing);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *admit_suite(void) {
  Suite *s = suite_create("admit");
  TCase *tc = tcase_create("admit");
  tcase_add_test(tc, admit_same_uid_local);
  tcase_add_test(tc, admit_path_rules);
  suite_add_tcase(s, tc);
  return s;
}

/* A suite of its own: it needs root to become another uid, and main
 * reports it skipped (77) elsewhere. */
static Suite *outsider_suite(void) {
  Suite *s = suite_create("outsider");
  TCase *tc = tcase_create("outsider");
  tcase_add_test(tc, admit_refuses_another_uid);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *jobs_suite(void) {
  Suite *s = suite_create("jobs");
  TCase *tc = tcase_create("jobs");
  tcase_add_test(tc, job_under_slurm_variables);
  tcase_add_test(tc, job_under_torchrun_variables);
  tcase_add_test(tc, job_store_port_taken);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const char *only = getenv("CK_RUN_SUITE");
  SRunner *sr;
  int failed;

  if (only != NULL && strcmp(only, "outsider") == 0 && geteuid() != 0) {
    printf("skipped: not root, so the test cannot become another uid\n");
    return 77;
  }
  sr = srunner_create(lists_suite());
  signal(SIGPIPE, SIG_IGN);
  hvd_log_set_level(HVD_LOG_ERROR);
  srunner_add_suite(sr, detect_suite());
  srunner_add_suite(sr, admit_suite());
  if (geteuid() == 0)
    srunner_add_suite(sr, outsider_suite());
  srunner_add_suite(sr, jobs_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
