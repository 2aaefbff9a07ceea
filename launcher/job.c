/*
 * One hvdrun job: the store, the ranks, their output, and their end.
 *
 * DESIGN. hvdrun serves the job's rendezvous store in-process (on loopback
 * when every host is this one, else on every interface), with a random job
 * token and the planned scope sizes, then starts each rank: a local one by
 * fork and exec with hvdrun's environment plus the rank's, a remote one
 * through ssh (or --ssh-command) with `cd` to this directory and the
 * rank's variables on an `env` command line. Every rank runs in a process
 * group of its own, so that stopping it stops everything it started. One
 * thread then polls the ranks' pipes and a signalfd (SIGCHLD, SIGINT,
 * SIGTERM, SIGHUP): lines are prefixed and forwarded, exits are collected.
 * The first rank to fail (non-zero exit, or a signal) is named, with its
 * host and code; every other rank's group gets SIGTERM, and SIGKILL after
 * GRACE_S; hvdrun exits with the failed rank's code (128 + signal for a
 * signal). A signal to hvdrun stops the job the same way. Until every
 * rank has reached the store (its record is in the `global` scope, or that
 * scope has completed), ranks still running after --start-timeout are
 * named and the job stops. Between fork and exec the child only makes
 * async-signal-safe calls: the store's threads exist by then.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hvdrun.h"
#include "rendezvous/rendezvous.h"
#include "transport/transport.h"

extern char **environ;

enum { GRACE_S = 5, DRAIN_MS = 1000, ARRIVAL_POLL_MS = 100, READ_CHUNK = 64 * 1024 };

struct rank_proc {
  pid_t pid;    /* the process group too; 0 before the start */
  bool running; /* not reaped yet */
  int fds[2];   /* stdout, stderr pipes; -1 at EOF */
  struct hvdrun_stream streams[2];
  FILE *files[2]; /* --output-filename copies */
  bool arrived;   /* reached the store */
};

struct job {
  const struct hvdrun_options *o;
  const struct hvdrun_host *hosts;
  size_t nhosts;
  bool *remote; /* per host */
  const struct hvdrun_slot *slots;
  int size;
  struct rdzv_server *server;
  char token[65];
  char addr[128]; /* the store's address as ranks reach it */
  int port;
  struct rank_proc *procs;
  int sigfd;
  int running;
  bool stopping;
  int64_t kill_at;      /* SIGKILL the groups left at this time (stopping) */
  int exit_code;        /* the first failure's */
  bool all_arrived;
  int64_t start_deadline;
};

/* ==== the store ============================================================= */

static hvd_status make_token(char *out, size_t size) {
  unsigned char raw[24];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0 && errno != EINTR)
      return hvd_error(HVD_ERR_IO, "cannot make a job token: getrandom: %s", strerror(errno));
    if (n > 0)
      got += (size_t)n;
  }
  for (size_t i = 0; i < sizeof(raw) && 2 * i + 2 < size; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
  return HVD_OK;
}

/* Where ranks on other hosts reach this one: the interface the user named,
 * else the route to the first remote host. */
static hvd_status store_address(struct job *j) {
  const char *remote = NULL;
  struct net_addr addrs[NET_MAX_ADDRS];
  size_t n = 0;
  hvd_status st;

  for (size_t h = 0; h < j->nhosts && remote == NULL; h++) {
    if (j->remote[h])
      remote = j->hosts[h].name;
  }
  if (remote == NULL) {
    snprintf(j->addr, sizeof(j->addr), "127.0.0.1");
    return HVD_OK;
  }
  st = net_select_addresses(j->o->iface, remote, j->o->ssh_port > 0 ? j->o->ssh_port : 22, addrs,
                            NET_MAX_ADDRS, &n);
  if (st != HVD_OK && j->o->iface == NULL) {
    /* A host name only the remote shell knows (a pod behind kubectl exec):
     * this host's first address that is not loopback. */
    struct net_iface ifs[NET_MAX_IFACES];
    size_t nifs = 0;
    char why[HVD_ERROR_MESSAGE_MAX];
    snprintf(why, sizeof(why), "%s", hvd_last_error_message());
    if (net_iface_list(ifs, NET_MAX_IFACES, &nifs) == HVD_OK) {
      for (size_t i = 0; i < nifs && n == 0; i++) {
        if (!ifs[i].loopback && ifs[i].addr.ss.ss_family == AF_INET)
          addrs[n++] = ifs[i].addr;
      }
    }
    if (n == 0)
      return hvd_error(HVD_ERR_NOT_FOUND,
                       "choosing the address remote ranks reach the store at: %s, and this host "
                       "has no other IPv4 address (use --network-interface)",
                       why);
    st = HVD_OK;
  }
  if (st != HVD_OK)
    return hvd_error_prefix("choosing the address remote ranks reach the store at");
  if (n == 0)
    return hvd_error(HVD_ERR_NOT_FOUND, "no address of this host reaches %s", remote);
  net_addr_format(&addrs[0], j->addr, sizeof(j->addr));
  return HVD_OK;
}

static hvd_status start_store(struct job *j) {
  struct rdzv_server_config cfg;
  struct rdzv_store *store;
  char scope[HVDRUN_HOST_MAX + 32];
  bool any_remote = false;
  hvd_status st;

  for (size_t h = 0; h < j->nhosts; h++)
    any_remote = any_remote || j->remote[h];
  if ((st = make_token(j->token, sizeof(j->token))) != HVD_OK ||
      (st = store_address(j)) != HVD_OK)
    return st;
  rdzv_server_config_default(&cfg);
  cfg.bind_address = any_remote ? NULL : "127.0.0.1";
  cfg.port = j->o->rendezvous_port;
  cfg.token = j->token;
  cfg.threads = 1;
  if ((st = rdzv_server_start(&cfg, &j->server)) != HVD_OK)
    return hvd_error_prefix("starting the rendezvous store");
  j->port = rdzv_server_port(j->server);
  store = rdzv_server_store(j->server);
  /* Planned scopes clear themselves once every rank has finished with them. */
  st = rdzv_store_plan(store, "global", 6, (size_t)j->size);
  for (int r = 0; r < j->size && st == HVD_OK; r++) {
    const struct hvdrun_slot *s = &j->slots[r];
    if (s->local_rank == 0) {
      int n = snprintf(scope, sizeof(scope), "local_%s", j->hosts[s->host].name);
      st = rdzv_store_plan(store, scope, (size_t)n, (size_t)s->local_size);
    }
    if (s->cross_rank == 0) {
      int n = snprintf(scope, sizeof(scope), "cross_%d", s->local_rank);
      st = rdzv_store_plan(store, scope, (size_t)n, (size_t)s->cross_size);
    }
  }
  if (st != HVD_OK)
    return hvd_error_prefix("planning the store's scopes");
  if (j->o->verbose)
    fprintf(stderr, "hvdrun: rendezvous store on %s:%d (ranks use %s:%d)\n",
            any_remote ? "*" : "127.0.0.1", j->port, j->addr, j->port);
  return HVD_OK;
}

/* ==== a rank's command =================================================== */

static bool exported_remotely(const char *kv) {
  return strncmp(kv, "HOROVOD_", 8) == 0 || strncmp(kv, "HVD_", 4) == 0 ||
         strncmp(kv, "NCCL_", 5) == 0;
}

/* The variables every rank gets, then this rank's. */
static hvd_status rank_vars(const struct job *j, int r, struct hvdrun_env *e) {
  const struct hvdrun_options *o = j->o;
  const struct hvdrun_slot *s = &j->slots[r];
  hvd_status st = HVD_OK;

#define SET(...) \
  if (st == HVD_OK) \
  st = hvdrun_env_set(e, __VA_ARGS__)
  SET("HOROVOD_GLOO_RENDEZVOUS_ADDR", "%s", j->addr);
  SET("HOROVOD_GLOO_RENDEZVOUS_PORT", "%d", j->port);
  SET("HOROVOD_CONTROLLER", "gloo");
  SET("HOROVOD_CPU_OPERATIONS", "gloo");
  SET("HVD_TOKEN", "%s", j->token);
  if (o->iface != NULL) {
    SET("HOROVOD_GLOO_IFACE", "%s", o->iface);
    SET("NCCL_SOCKET_IFNAME", "%s", o->iface);
  }
  if (o->log_level != NULL)
    SET("HOROVOD_LOG_LEVEL", "%s", o->log_level);
  if (o->timeline != NULL)
    SET("HOROVOD_TIMELINE", "%s", o->timeline);
  if (o->fusion_mb != NULL)
    SET("HOROVOD_FUSION_THRESHOLD", "%.0f", strtod(o->fusion_mb, NULL) * 1024 * 1024);
  if (o->cycle_ms != NULL)
    SET("HOROVOD_CYCLE_TIME", "%s", o->cycle_ms);
  if (o->cache_capacity != NULL)
    SET("HOROVOD_CACHE_CAPACITY", "%s", o->cache_capacity);
  if (o->gloo_timeout_s != NULL)
    SET("HOROVOD_GLOO_TIMEOUT_SECONDS", "%s", o->gloo_timeout_s);
  if (o->hier_allreduce)
    SET("HOROVOD_HIERARCHICAL_ALLREDUCE", "1");
  if (o->hier_allgather)
    SET("HOROVOD_HIERARCHICAL_ALLGATHER", "1");
  for (size_t i = 0; i < o->nexports && st == HVD_OK; i++) {
    const char *x = o->exports[i];
    if (strchr(x, '=') != NULL)
      st = hvdrun_env_put(e, x);
    else if (getenv(x) != NULL)
      SET(x, "%s", getenv(x));
  }
  SET("HOROVOD_HOSTNAME", "%s", j->hosts[s->host].name);
  SET("HOROVOD_RANK", "%d", s->rank);
  SET("HOROVOD_SIZE", "%d", s->size);
  SET("HOROVOD_LOCAL_RANK", "%d", s->local_rank);
  SET("HOROVOD_LOCAL_SIZE", "%d", s->local_size);
  SET("HOROVOD_CROSS_RANK", "%d", s->cross_rank);
  SET("HOROVOD_CROSS_SIZE", "%d", s->cross_size);
#undef SET
  return st;
}

/* What to exec for rank r: argv, and env for a local rank (a remote one
 * carries its variables on its command line). */
static hvd_status rank_command(const struct job *j, int r, struct hvdrun_argv *argv,
                               struct hvdrun_env *env) {
  const struct hvdrun_options *o = j->o;
  const char *host = j->hosts[j->slots[r].host].name;
  struct hvdrun_env vars = {0};
  char cwd[4096], *text = NULL, port[16];
  size_t len = 0, cap = 0;
  hvd_status st = HVD_OK;

  for (char **e = environ; *e != NULL && st == HVD_OK; e++) {
    if (!j->remote[j->slots[r].host] || exported_remotely(*e))
      st = hvdrun_env_put(&vars, *e);
  }
  if (st == HVD_OK)
    st = rank_vars(j, r, &vars);
  if (st != HVD_OK || !j->remote[j->slots[r].host]) {
    for (int i = 0; i < o->ncommand && st == HVD_OK; i++)
      st = hvdrun_argv_add(argv, o->command[i]);
    *env = vars;
    return st;
  }
  /* Remote: cd DIR >/dev/null 2>&1; exec env K=V ... COMMAND */
  if (getcwd(cwd, sizeof(cwd)) == NULL)
    st = hvd_error(HVD_ERR_IO, "getcwd: %s", strerror(errno));
  if (st == HVD_OK)
    st = hvdrun_append(&text, &len, &cap, "cd ");
  if (st == HVD_OK)
    st = hvdrun_shell_quote(cwd, &text, &len, &cap);
  if (st == HVD_OK)
    st = hvdrun_append(&text, &len, &cap, " >/dev/null 2>&1; exec env");
  for (size_t i = 0; i < vars.n && st == HVD_OK; i++) {
    st = hvdrun_append(&text, &len, &cap, " ");
    if (st == HVD_OK)
      st = hvdrun_shell_quote(vars.vars[i], &text, &len, &cap);
  }
  for (int i = 0; i < o->ncommand && st == HVD_OK; i++) {
    st = hvdrun_append(&text, &len, &cap, " ");
    if (st == HVD_OK)
      st = hvdrun_shell_quote(o->command[i], &text, &len, &cap);
  }
  hvdrun_env_fini(&vars);
  if (st == HVD_OK && strcmp(o->ssh_command, "ssh") == 0) {
    /* As horovodrun runs it; stdin is /dev/null anyway. */
    const char *fixed[] = {"ssh", "-o", "PasswordAuthentication=no", "-o",
                           "StrictHostKeyChecking=no"};
    for (size_t i = 0; i < HVD_ARRAY_SIZE(fixed) && st == HVD_OK; i++)
      st = hvdrun_argv_add(argv, fixed[i]);
    snprintf(port, sizeof(port), "%d", o->ssh_port);
    if (st == HVD_OK && o->ssh_port > 0 && (st = hvdrun_argv_add(argv, "-p")) == HVD_OK)
      st = hvdrun_argv_add(argv, port);
    if (st == HVD_OK && o->ssh_identity != NULL && (st = hvdrun_argv_add(argv, "-i")) == HVD_OK)
      st = hvdrun_argv_add(argv, o->ssh_identity);
  } else if (st == HVD_OK) {
    /* --ssh-command is a shell snippet: CMD HOST COMMAND. */
    char *snippet = NULL;
    size_t sl = 0, sc = 0;
    st = hvdrun_append(&snippet, &sl, &sc, o->ssh_command);
    if (st == HVD_OK)
      st = hvdrun_append(&snippet, &sl, &sc, " \"$@\"");
    if (st == HVD_OK)
      st = hvdrun_argv_add(argv, "/bin/sh");
    if (st == HVD_OK)
      st = hvdrun_argv_add(argv, "-c");
    if (st == HVD_OK)
      st = hvdrun_argv_add(argv, snippet);
    if (st == HVD_OK)
      st = hvdrun_argv_add(argv, "hvdrun-remote-shell");
    free(snippet);
  }
  if (st == HVD_OK)
    st = hvdrun_argv_add(argv, host);
  if (st == HVD_OK)
    st = hvdrun_argv_add(argv, text);
  free(text);
  for (char **e = environ; *e != NULL && st == HVD_OK; e++) /* ssh itself: hvdrun's */
    st = hvdrun_env_put(env, *e);
  return st;
}

/* ==== starting a rank ======================================================= */

static void child_fail(const char *what, const char *arg) {
  /* write(2) only: this runs between fork and exec. */
  const char *err = strerror(errno);
  (void)!write(2, "hvdrun: ", 8);
  (void)!write(2, what, strlen(what));
  (void)!write(2, arg, strlen(arg));
  (void)!write(2, ": ", 2);
  (void)!write(2, err, strlen(err));
  (void)!write(2, "\n", 1);
}

static hvd_status spawn(struct job *j, int r) {
  struct rank_proc *p = &j->procs[r];
  struct hvdrun_argv argv = {0};
  struct hvdrun_env env = {0};
  char **envp = NULL;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  hvd_status st = rank_command(j, r, &argv, &env);

  if (st == HVD_OK && (envp = hvdrun_env_array(&env)) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot build rank %d's environment", r);
  if (st == HVD_OK && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0))
    st = hvd_error(HVD_ERR_IO, "pipe: %s", strerror(errno));
  if (st == HVD_OK && j->o->verbose) {
    fprintf(stderr, "hvdrun: rank %d on %s:", r, j->hosts[j->slots[r].host].name);
    for (size_t i = 0; i < argv.n; i++)
      fprintf(stderr, " %s", argv.v[i]);
    fputc('\n', stderr);
  }
  if (st == HVD_OK) {
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
      st = hvd_error(HVD_ERR_IO, "fork: %s", strerror(errno));
    } else if (pid == 0) {
      sigset_t none;
      int in = open("/dev/null", O_RDONLY);
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, NULL);
      signal(SIGPIPE, SIG_DFL);
      setpgid(0, 0);
      /* If hvdrun itself is killed (SIGKILL leaves it no say), the rank
       * goes too instead of running on unsupervised. */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent)
        _exit(128 + SIGKILL);
      if (in >= 0)
        dup2(in, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execvpe(argv.v[0], argv.v, envp);
      child_fail("cannot run ", argv.v[0]);
      _exit(127);
    } else {
      setpgid(pid, pid); /* (also in the child: whichever runs first) */
      p->pid = pid;
      p->running = true;
      j->running++;
      p->fds[0] = out[0];
      p->fds[1] = err[0];
      out[0] = err[0] = -1;
    }
  }
  for (int k = 0; k < 2; k++) {
    if (out[k] >= 0)
      close(out[k]);
    if (err[k] >= 0)
      close(err[k]);
  }
  free(envp);
  hvdrun_env_fini(&env);
  hvdrun_argv_fini(&argv);
  return st;
}

static hvd_status open_files(struct job *j, int r) {
  struct rank_proc *p = &j->procs[r];
  char path[4096];
  int digits = 1, n;

  for (int v = j->size - 1; v >= 10; v /= 10)
    digits++;
  if (mkdir(j->o->output_dir, 0777) != 0 && errno != EEXIST)
    return hvd_error(HVD_ERR_IO, "--output-filename: cannot make '%s': %s", j->o->output_dir,
                     strerror(errno));
  n = snprintf(path, sizeof(path), "%s/rank.%0*d", j->o->output_dir, digits, r);
  if (n < 0 || (size_t)n + 8 >= sizeof(path))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "--output-filename: the path is too long");
  if (mkdir(path, 0777) != 0 && errno != EEXIST)
    return hvd_error(HVD_ERR_IO, "--output-filename: cannot make '%s': %s", path,
                     strerror(errno));
  for (int k = 0; k < 2; k++) {
    memcpy(path + n, k == 0 ? "/stdout" : "/stderr", 8);
    if ((p->files[k] = fopen(path, "we")) == NULL)
      return hvd_error(HVD_ERR_IO, "--output-filename: cannot write '%s': %s", path,
                       strerror(errno));
  }
  return HVD_OK;
}

/* ==== supervision =========================================================== */

static const char *host_of(const struct job *j, int r) { return j->hosts[j->slots[r].host].name; }

static void signal_groups(struct job *j, int sig) {
  for (int r = 0; r < j->size; r++) {
    if (j->procs[r].pid > 0)
      (void)kill(-j->procs[r].pid, sig);
  }
}

/* Stops every rank: SIGTERM now, SIGKILL after the grace period. */
static void stop_job(struct job *j, int exit_code) {
  if (j->stopping)
    return;
  j->stopping = true;
  j->exit_code = exit_code;
  j->kill_at = hvd_now_ns() + (int64_t)GRACE_S * 1000000000;
  signal_groups(j, SIGTERM);
}

static void describe_end(int status, char *out, size_t size, int *code) {
  if (WIFEXITED(status)) {
    *code = WEXITSTATUS(status);
    snprintf(out, size, "exited with code %d", *code);
  } else if (WIFSIGNALED(status)) {
    *code = 128 + WTERMSIG(status);
    snprintf(out, size, "was killed by signal %d (%s)", WTERMSIG(status),
             strsignal(WTERMSIG(status)));
  } else {
    *code = 1;
    snprintf(out, size, "ended with status 0x%x", (unsigned)status);
  }
}

static void reap(struct job *j) {
  for (;;) {
    int status, code;
    char why[128];
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0)
      return;
    for (int r = 0; r < j->size; r++) {
      struct rank_proc *p = &j->procs[r];
      if (p->pid != pid || !p->running)
        continue;
      p->running = false;
      j->running--;
      describe_end(status, why, sizeof(why), &code);
      if (j->o->verbose)
        fprintf(stderr, "hvdrun: rank %d on %s (pid %d) %s\n", r, host_of(j, r), (int)pid, why);
      if (code != 0 && !j->stopping) {
        fprintf(stderr, "hvdrun: rank %d on host %s %s; stopping the other ranks\n", r,
                host_of(j, r), why);
        stop_job(j, code);
      }
    }
  }
}

static void on_signal(struct job *j) {
  struct signalfd_siginfo si;
  while (read(j->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
    if (si.ssi_signo == SIGCHLD) {
      reap(j);
    } else if (!j->stopping) {
      fprintf(stderr, "hvdrun: got %s; stopping the job\n", strsignal((int)si.ssi_signo));
      stop_job(j, 128 + (int)si.ssi_signo);
    } else { /* a second one: no more grace */
      signal_groups(j, SIGKILL);
    }
  }
  reap(j); /* SIGCHLDs merge: look for every exit */
}

/* Which running ranks have reached the store (sticky). */
static void check_arrivals(struct job *j) {
  struct rdzv_store *store = rdzv_server_store(j->server);
  bool all = rdzv_store_plan_rounds(store, "global", 6) > 0;
  int missing = 0;

  for (int r = 0; r < j->size; r++) {
    struct rank_proc *p = &j->procs[r];
    char key[16];
    struct rdzv_blob *b = NULL;
    int n = snprintf(key, sizeof(key), "%d", r);
    if (!p->arrived && (all || (rdzv_store_get(store, "global", 6, key, (size_t)n, &b) == HVD_OK &&
                                b != NULL)))
      p->arrived = true;
    rdzv_blob_unref(b);
    missing += !p->arrived && p->running;
  }
  if (missing == 0 && all) {
    j->all_arrived = true;
    return;
  }
  if (missing > 0 && hvd_now_ns() >= j->start_deadline && !j->stopping) {
    int shown = 0;
    for (int r = 0; r < j->size && shown < 8; r++) {
      if (j->procs[r].arrived || !j->procs[r].running)
        continue;
      fprintf(stderr,
              "hvdrun: rank %d on host %s has not reached the rendezvous store within %d s "
              "(--start-timeout)\n",
              r, host_of(j, r), j->o->start_timeout_s);
      shown++;
    }
    if (missing > shown)
      fprintf(stderr, "hvdrun: ... and %d more ranks\n", missing - shown);
    stop_job(j, 1);
    j->all_arrived = true; /* reported once */
  }
}

static void forward(struct job *j, int r, int k) {
  struct rank_proc *p = &j->procs[r];
  char buf[READ_CHUNK];
  ssize_t n = read(p->fds[k], buf, sizeof(buf));

  if (n > 0) {
    hvdrun_stream_feed(&p->streams[k], buf, (size_t)n);
    return;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN))
    return;
  hvdrun_stream_finish(&p->streams[k]);
  close(p->fds[k]);
  p->fds[k] = -1;
}

static int supervise(struct job *j) {
  struct pollfd *pfds = calloc((size_t)j->size * 2 + 1, sizeof(*pfds));
  int *who = calloc((size_t)j->size * 2 + 1, sizeof(*who));
  int64_t drain_until = 0;

  if (pfds == NULL || who == NULL) {
    free(pfds);
    free(who);
    fprintf(stderr, "hvdrun: out of memory\n");
    stop_job(j, 1);
    signal_groups(j, SIGKILL);
    return 1;
  }
  for (;;) {
    int64_t now = hvd_now_ns(), wake = HVD_NO_DEADLINE;
    nfds_t n = 0;
    int open_fds = 0, timeout;

    if (j->running == 0) {
      /* Every rank has ended: nothing they started may outlive them. */
      if (drain_until == 0) {
        signal_groups(j, SIGKILL);
        drain_until = now + (int64_t)DRAIN_MS * 1000000;
      }
      wake = drain_until;
    }
    pfds[n++] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
    for (int r = 0; r < j->size; r++) {
      for (int k = 0; k < 2; k++) {
        if (j->procs[r].fds[k] >= 0) {
          who[n] = r * 2 + k;
          pfds[n++] = (struct pollfd){.fd = j->procs[r].fds[k], .events = POLLIN};
          open_fds++;
        }
      }
    }
    if (j->running == 0 && (open_fds == 0 || now >= drain_until))
      break;
    if (j->stopping && j->running > 0 && j->kill_at < wake)
      wake = j->kill_at;
    if (!j->all_arrived) {
      int64_t next = now + (int64_t)ARRIVAL_POLL_MS * 1000000;
      if (next < wake)
        wake = next;
    }
    timeout = wake == HVD_NO_DEADLINE ? -1 : (int)((wake - now + 999999) / 1000000);
    if (timeout < 0 && wake != HVD_NO_DEADLINE)
      timeout = 0;
    if (poll(pfds, n, timeout) < 0 && errno != EINTR) {
      fprintf(stderr, "hvdrun: poll: %s\n", strerror(errno));
      stop_job(j, 1);
    }
    if (pfds[0].revents & POLLIN)
      on_signal(j);
    for (nfds_t i = 1; i < n; i++) {
      if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR))
        forward(j, who[i] / 2, who[i] % 2);
    }
    if (!j->all_arrived)
      check_arrivals(j);
    if (j->stopping && j->running > 0 && hvd_now_ns() >= j->kill_at) {
      fprintf(stderr, "hvdrun: ranks still running %d s after SIGTERM: sending SIGKILL\n",
              GRACE_S);
      signal_groups(j, SIGKILL);
      j->kill_at = HVD_NO_DEADLINE;
    }
  }
  for (int r = 0; r < j->size; r++) {
    for (int k = 0; k < 2; k++) {
      if (j->procs[r].fds[k] >= 0) {
        hvdrun_stream_finish(&j->procs[r].streams[k]);
        close(j->procs[r].fds[k]);
        j->procs[r].fds[k] = -1;
      }
    }
  }
  free(pfds);
  free(who);
  return j->exit_code;
}

/* ==== the whole job ========================================================= */

int hvdrun_run(const struct hvdrun_options *o, const struct hvdrun_host *hosts, size_t nhosts,
               const struct hvdrun_slot *slots, int size) {
  struct job j;
  sigset_t mask;
  hvd_status st = HVD_OK;
  int code;

  memset(&j, 0, sizeof(j));
  j.o = o;
  j.hosts = hosts;
  j.nhosts = nhosts;
  j.slots = slots;
  j.size = size;
  j.sigfd = -1;
  j.remote = calloc(nhosts, sizeof(*j.remote));
  j.procs = calloc((size_t)size, sizeof(*j.procs));
  if (j.remote == NULL || j.procs == NULL) {
    fprintf(stderr, "hvdrun: out of memory\n");
    free(j.remote);
    free(j.procs);
    return 1;
  }
  for (size_t h = 0; h < nhosts; h++)
    j.remote[h] = !hvdrun_host_is_local(hosts[h].name);
  /* Signals become events of the loop; the store's threads inherit the mask. */
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  signal(SIGPIPE, SIG_IGN);
  if ((j.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
    st = hvd_error(HVD_ERR_IO, "signalfd: %s", strerror(errno));
  if (st == HVD_OK)
    st = start_store(&j);
  for (int r = 0; r < size; r++) {
    struct rank_proc *p = &j.procs[r];
    p->fds[0] = p->fds[1] = -1;
    if (st == HVD_OK && o->output_dir != NULL)
      st = open_files(&j, r);
    hvdrun_stream_init(&p->streams[0], r, false, stdout, p->files[0], o->prefix, o->timestamp);
    hvdrun_stream_init(&p->streams[1], r, true, stderr, p->files[1], o->prefix, o->timestamp);
  }
  j.start_deadline = hvd_now_ns() + (int64_t)o->start_timeout_s * 1000000000;
  for (int r = 0; r < size && st == HVD_OK; r++) {
    if ((st = spawn(&j, r)) != HVD_OK)
      st = hvd_error_prefix("starting rank %d on %s", r, host_of(&j, r));
  }
  if (st != HVD_OK) {
    fprintf(stderr, "hvdrun: %s\n", hvd_last_error_message());
    stop_job(&j, 1);
  }
  code = supervise(&j);
  rdzv_server_stop(j.server);
  for (int r = 0; r < size; r++) {
    for (int k = 0; k < 2; k++) {
      hvdrun_stream_fini(&j.procs[r].streams[k]);
      if (j.procs[r].files[k] != NULL)
        fclose(j.procs[r].files[k]);
    }
  }
  if (j.sigfd >= 0)
    close(j.sigfd);
  free(j.remote);
  free(j.procs);
  return code;
}
