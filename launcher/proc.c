/*
 * What every hvdrun job does with its ranks, static or elastic: the
 * variables every rank gets, starting a rank on its host, forwarding its
 * output, and naming how it ended.
 *
 * DESIGN. A local rank starts by fork and exec with hvdrun's environment
 * plus the rank's; a remote one through ssh (or --ssh-command) with `cd`
 * to this directory and the rank's variables on an `env` command line,
 * except the job token: command lines are visible to every user of both
 * hosts (ps), so the token travels as the first line of the remote
 * command's standard input, which a small `sh -c` reads into HVD_TOKEN
 * before it execs the rank.
 * Every rank runs in a process group of its own, so that stopping it stops
 * everything it started, and dies with hvdrun (PR_SET_PDEATHSIG). Between
 * fork and exec the child only makes async-signal-safe calls: the store's
 * threads exist by then.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

extern char **environ;

enum { READ_CHUNK = 64 * 1024 };

/* ==== a rank's command ====================================================== */

static bool exported_remotely(const char *kv) {
  return strncmp(kv, "HOROVOD_", 8) == 0 || strncmp(kv, "HVD_", 4) == 0 ||
         strncmp(kv, "NCCL_", 5) == 0;
}

hvd_status hvdrun_job_vars(const struct hvdrun_options *o, const char *addr, int port,
                           const char *token, struct hvdrun_env *e) {
  hvd_status st = HVD_OK;

#define SET(...) \
  if (st == HVD_OK) \
  st = hvdrun_env_set(e, __VA_ARGS__)
  if (port != 0) {
    SET("HOROVOD_GLOO_RENDEZVOUS_ADDR", "%s", addr);
    SET("HOROVOD_GLOO_RENDEZVOUS_PORT", "%d", port);
  }
  SET("HOROVOD_CONTROLLER", "gloo");
  SET("HOROVOD_CPU_OPERATIONS", "gloo");
  SET("HVD_TOKEN", "%s", token);
  /* The settings given, as horovodrun passes its flags: a setting that
   * needs another (the autotuner's parts, the timeline's marks) only with it. */
  for (int id = 1; id < HVD_SETTING_COUNT; id++) {
    const struct hvd_setting_info *info = hvd_setting_info((enum hvd_setting)id);
    if (o->settings[id] != NULL && info->scope != HVD_SCOPE_HVDRUN &&
        (info->needs == HVD_SET_NONE || hvdrun_setting_on(o, info->needs)))
      SET(info->env, "%s", o->settings[id]);
  }
  if (port == 0) /* after the settings: the job's prefix, not the one given */
    SET("HVD_RENDEZVOUS", "%s", addr);
  if (o->iface != NULL)
    SET("NCCL_SOCKET_IFNAME", "%s", o->iface);
  for (size_t i = 0; i < o->nexports && st == HVD_OK; i++) {
    const char *x = o->exports[i];
    if (strchr(x, '=') != NULL)
      st = hvdrun_env_put(e, x);
    else if (getenv(x) != NULL)
      SET(x, "%s", getenv(x));
  }
  /* After the exports: it replaces -x PYTHONPATH=VALUE, whose value it ends with. */
  if (o->pythonpath != NULL)
    SET("PYTHONPATH", "%s", o->pythonpath);
  if (o->horovod_compat)
    SET("HVD_HOROVOD_COMPAT", "1");
#undef SET
  return st;
}

hvd_status hvdrun_store_vars(const struct hvdrun_options *o, const struct hvdrun_store *s,
                             struct hvdrun_env *e) {
  return s->url != NULL ? hvdrun_job_vars(o, s->url, 0, s->token, e)
                        : hvdrun_job_vars(o, s->addr, s->port, s->token, e);
}

hvd_status hvdrun_slot_vars(const char *host, const struct hvdrun_slot *s, struct hvdrun_env *e) {
  hvd_status st = hvdrun_env_set(e, "HOROVOD_HOSTNAME", "%s", host);
  const struct {
    const char *name;
    int value;
  } ranks[] = {{"HOROVOD_RANK", s->rank},
               {"HOROVOD_SIZE", s->size},
               {"HOROVOD_LOCAL_RANK", s->local_rank},
               {"HOROVOD_LOCAL_SIZE", s->local_size},
               {"HOROVOD_CROSS_RANK", s->cross_rank},
               {"HOROVOD_CROSS_SIZE", s->cross_size}};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(ranks) && st == HVD_OK; i++)
    st = hvdrun_env_set(e, ranks[i].name, "%d", ranks[i].value);
  return st;
}

#define TOKEN_VAR "HVD_TOKEN"
/* The remote side's first step, single-quoted for any login shell: the
 * token from the first line of stdin, then the rank. */
#define READ_TOKEN                                                                             \
  "'IFS= read -r HVD_TOKEN && [ -n \"$HVD_TOKEN\" ] || { echo \"hvdrun: no job token on "      \
  "standard input (the remote shell must pass its stdin on, as ssh and kubectl exec -i do)\" "  \
  ">&2; exit 126; }; export HVD_TOKEN; exec \"$@\"'"

static bool is_token(const char *kv) { return strncmp(kv, TOKEN_VAR "=", sizeof(TOKEN_VAR)) == 0; }

/* ssh as horovodrun runs it, or --ssh-command's snippet: the words before
 * HOST and the command. */
static hvd_status remote_shell_argv(const struct hvdrun_options *o, struct hvdrun_argv *argv) {
  hvd_status st = HVD_OK;
  char port[16];

  if (strcmp(o->ssh_command, "ssh") == 0) {
    /* As horovodrun runs it (stdin carries the token, then ends). */
    const char *fixed[] = {"ssh", "-o", "PasswordAuthentication=no", "-o",
                           "StrictHostKeyChecking=no"};
    for (size_t i = 0; i < HVD_ARRAY_SIZE(fixed) && st == HVD_OK; i++)
      st = hvdrun_argv_add(argv, fixed[i]);
    snprintf(port, sizeof(port), "%d", o->ssh_port);
    if (st == HVD_OK && o->ssh_port > 0 && (st = hvdrun_argv_add(argv, "-p")) == HVD_OK)
      st = hvdrun_argv_add(argv, port);
    if (st == HVD_OK && o->ssh_identity != NULL && (st = hvdrun_argv_add(argv, "-i")) == HVD_OK)
      st = hvdrun_argv_add(argv, o->ssh_identity);
  } else {
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
  return st;
}

/* What to exec: argv, and env for a local rank (a remote one carries its
 * variables on its command line, and its token on stdin). */
static hvd_status command(const struct hvdrun_options *o, const char *host, bool remote,
                          const struct hvdrun_env *rank_vars, struct hvdrun_argv *argv,
                          struct hvdrun_env *env) {
  struct hvdrun_env vars = {0};
  char cwd[4096], *text = NULL;
  size_t len = 0, cap = 0;
  hvd_status st = HVD_OK;

  for (char **e = environ; *e != NULL && st == HVD_OK; e++) {
    if (!remote || (exported_remotely(*e) && !is_token(*e)))
      st = hvdrun_env_put(&vars, *e);
  }
  for (size_t i = 0; i < rank_vars->n && st == HVD_OK; i++) {
    if (!remote || !is_token(rank_vars->vars[i]))
      st = hvdrun_env_put(&vars, rank_vars->vars[i]);
  }
  if (st != HVD_OK || !remote) {
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
  if (st == HVD_OK)
    st = hvdrun_append(&text, &len, &cap, " sh -c " READ_TOKEN " hvdrun-rank");
  for (int i = 0; i < o->ncommand && st == HVD_OK; i++) {
    st = hvdrun_append(&text, &len, &cap, " ");
    if (st == HVD_OK)
      st = hvdrun_shell_quote(o->command[i], &text, &len, &cap);
  }
  hvdrun_env_fini(&vars);
  if (st == HVD_OK && o->srun) {
    /* srun ... --nodelist=HOST /bin/sh -c TEXT */
    st = hvdrun_srun_argv(host, text, argv);
  } else if (st == HVD_OK) {
    st = remote_shell_argv(o, argv); /* then HOST TEXT */
    if (st == HVD_OK)
      st = hvdrun_argv_add(argv, host);
    if (st == HVD_OK)
      st = hvdrun_argv_add(argv, text);
  }
  free(text);
  for (char **e = environ; *e != NULL && st == HVD_OK; e++) /* the remote shell itself: hvdrun's */
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

void hvdrun_child_setup(pid_t parent, int in, int out, int err) {
  sigset_t none;
  if (in < 0)
    in = open("/dev/null", O_RDONLY);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_DFL);
  setpgid(0, 0);
  /* If hvdrun itself is killed (SIGKILL leaves it no say), the child goes
   * too instead of running on unsupervised. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent)
    _exit(128 + SIGKILL);
  if (in >= 0)
    dup2(in, 0);
  dup2(out, 1);
  dup2(err, 2);
}

/* A pipe that already holds the token's line and its end: a remote rank's
 * stdin (in[0]); the kernel's buffer keeps the few bytes, so nobody has to
 * write while the rank starts. */
static hvd_status token_pipe(const struct hvdrun_env *vars, int in[2]) {
  const char *token = NULL;
  size_t len;
  for (size_t i = 0; i < vars->n; i++) {
    if (is_token(vars->vars[i]))
      token = vars->vars[i] + sizeof(TOKEN_VAR);
  }
  if (token == NULL)
    return hvd_error(HVD_ERR_INTERNAL, "a remote rank's variables hold no job token");
  len = strlen(token);
  if (pipe2(in, O_CLOEXEC) != 0)
    return hvd_error(HVD_ERR_IO, "pipe: %s", strerror(errno));
  if (write(in[1], token, len) != (ssize_t)len || write(in[1], "\n", 1) != 1)
    return hvd_error(HVD_ERR_IO, "cannot write the job token to a pipe: %s", strerror(errno));
  close(in[1]);
  in[1] = -1;
  return HVD_OK;
}

hvd_status hvdrun_proc_start(struct hvdrun_proc *p, const struct hvdrun_options *o,
                             const char *host, bool remote, const struct hvdrun_env *vars,
                             int label) {
  struct hvdrun_argv argv = {0};
  struct hvdrun_env env = {0};
  char **envp = NULL;
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  hvd_status st = command(o, host, remote, vars, &argv, &env);

  if (st == HVD_OK && (envp = hvdrun_env_array(&env)) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot build rank %d's environment", label);
  if (st == HVD_OK && (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0))
    st = hvd_error(HVD_ERR_IO, "pipe: %s", strerror(errno));
  if (st == HVD_OK && remote)
    st = token_pipe(vars, in);
  if (st == HVD_OK && o->verbose) {
    fprintf(stderr, "hvdrun: [%d] on %s:", label, host);
    for (size_t i = 0; i < argv.n; i++)
      fprintf(stderr, " %s", argv.v[i]);
    fputc('\n', stderr);
  }
  if (st == HVD_OK) {
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
      st = hvd_error(HVD_ERR_IO, "fork: %s", strerror(errno));
    } else if (pid == 0) {
      hvdrun_child_setup(parent, in[0], out[1], err[1]);
      execvpe(argv.v[0], argv.v, envp);
      child_fail("cannot run ", argv.v[0]);
      _exit(127);
    } else {
      setpgid(pid, pid); /* (also in the child: whichever runs first) */
      p->pid = pid;
      p->running = true;
      p->fds[0] = out[0];
      p->fds[1] = err[0];
      out[0] = err[0] = -1;
    }
  }
  for (int k = 0; k < 2; k++) {
    if (in[k] >= 0)
      close(in[k]);
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

static hvd_status open_files(struct hvdrun_proc *p, const struct hvdrun_options *o, int label,
                             int digits) {
  char path[4096];
  int n;

  if (mkdir(o->output_dir, 0777) != 0 && errno != EEXIST)
    return hvd_error(HVD_ERR_IO, "--output-filename: cannot make '%s': %s", o->output_dir,
                     strerror(errno));
  n = snprintf(path, sizeof(path), "%s/rank.%0*d", o->output_dir, digits, label);
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

/* ==== a rank ================================================================ */

hvd_status hvdrun_proc_init(struct hvdrun_proc *p, const struct hvdrun_options *o, int label,
                            int digits) {
  hvd_status st = HVD_OK;
  memset(p, 0, sizeof(*p));
  p->fds[0] = p->fds[1] = -1;
  if (o->output_dir != NULL)
    st = open_files(p, o, label, digits);
  hvdrun_stream_init(&p->streams[0], label, false, stdout, p->files[0], o->prefix, o->timestamp);
  hvdrun_stream_init(&p->streams[1], label, true, stderr, p->files[1], o->prefix, o->timestamp);
  return st;
}

void hvdrun_proc_fini(struct hvdrun_proc *p) {
  for (int k = 0; k < 2; k++) {
    if (p->fds[k] >= 0) {
      hvdrun_stream_finish(&p->streams[k]);
      close(p->fds[k]);
      p->fds[k] = -1;
    }
    hvdrun_stream_fini(&p->streams[k]);
    if (p->files[k] != NULL)
      fclose(p->files[k]);
    p->files[k] = NULL;
  }
}

void hvdrun_proc_forward(struct hvdrun_proc *p, int k) {
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

void hvdrun_describe_end(int status, char *out, size_t size, int *code) {
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

