/*
 * hvd-bench-rendezvous: how long N ranks take to meet in the rendezvous store.
 *
 * DESIGN. Every simulated rank is a thread with its own client, hence its own
 * keep-alive connection, as a real rank has. The ranks wait at a start gate
 * and then do what a rank does at hvd_init: PUT its 100-byte address record
 * into scope bench_<run> under key <rank>, and fetch the whole scope with
 * count=N (one long-poll, answered once the last rank has written). The clock
 * starts when the gate opens; a rank's latency ends when its fetch returns,
 * and the run's wall time ends with the slowest rank. Each rank then checks
 * that it got exactly N entries holding the expected records, against a table
 * built before the gate opened, so checking costs memcmp only. Connections
 * are opened after the gate, as at a real job start, so the numbers include
 * N simultaneous TCP connects.
 *
 * The server is hvd-rendezvous spawned from the bench binary's directory
 * (default), one already running (--server), or one inside this process
 * (--in-process); or the store is an etcd cluster (--etcd URL), where each
 * rank's fetch is a range read and, until all N are there, a watch.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rendezvous/rendezvous.h"

extern char **environ;

enum {
  EXIT_FAILED = 1,
  EXIT_USAGE = 2,
  RECORD_BYTES = 100,
  KEY_MAX = 24,
  RANK_STACK_BYTES = 256 * 1024,
  MAX_RANK_COUNTS = 32,
  MAX_RANKS = 1 << 20,
  MAX_REPEAT = 1000,
  FD_RESERVE = 64,              /* descriptors for everything but connections */
  SERVER_START_TIMEOUT_MS = 10000,
  SERVER_STOP_TIMEOUT_MS = 10000,
};

static const char usage_text[] =
    "usage: hvd-bench-rendezvous [options]\n"
    "\n"
    "Simulates N ranks as threads meeting in the rendezvous store: each rank PUTs a\n"
    "100-byte address record, then fetches the whole scope once it holds N keys\n"
    "(2 requests per rank), and checks every entry it got.\n"
    "\n"
    "options:\n"
    "  --ranks N,N,...     rank counts to run (default 64,512,4096)\n"
    "  --repeat K          runs per rank count (default 3)\n"
    "  --server HOST:PORT  use this running server instead of spawning one\n"
    "  --in-process        run the server inside this process\n"
    "  --etcd URL          meet in an etcd cluster instead (etcd://HOST:PORT,...[/PREFIX])\n"
    "  --threads T         server event loops (spawned or in-process server;\n"
    "                      default: the server's own, one per CPU, at most 4)\n"
    "  --timeout S         per-rank deadline for each request, seconds (default 60)\n"
    "  -h, --help          print this help and exit\n"
    "\n"
    "Exits 0 when every run verified, 1 when any rank failed, 2 on bad flags.\n";

struct options {
  size_t ranks[MAX_RANK_COUNTS];
  size_t nranks;
  unsigned repeat;
  const char *server; /* HOST:PORT, or NULL */
  const char *etcd;   /* an etcd cluster's URL, or NULL */
  bool in_process;
  unsigned threads; /* 0: the server's default */
  int64_t timeout_ms;
};

/* One run of N ranks. */
struct run {
  const char *host;
  int port;
  size_t n;
  int64_t timeout_ms;
  char scope[64];
  char (*records)[RECORD_BYTES]; /* records[r]: rank r's value */
  char (*keys)[KEY_MAX];         /* keys[r]: "r" */

  pthread_mutex_t mu;
  pthread_cond_t cond;
  /* protected by mu */
  size_t ready;     /* ranks at the gate */
  bool go;          /* the gate is open */
  bool abort;       /* not every rank started: leave without requests */
  int64_t start_ns; /* when the gate opened; read-only once go is set */
  char first_error[HVD_ERROR_MESSAGE_MAX + 64];

  atomic_size_t failures;
};

struct rank {
  struct run *run;
  size_t index;
  int64_t done_ns; /* 0: never started its requests */
  pthread_t thread;
};

struct result {
  double wall_s;
  double req_per_s;
  double lat_med_ms;
  double lat_max_ms;
  size_t failures;
};

/* ---- arguments ---------------------------------------------------------------- */

static int HVD_PRINTF(1, 2) usage_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "hvd-bench-rendezvous: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see hvd-bench-rendezvous --help)\n");
  return EXIT_USAGE;
}

static bool parse_number(const char *text, size_t len, int64_t min, int64_t max, int64_t *out) {
  return hvd_parse_int64(text, len, out) && *out >= min && *out <= max;
}

static int parse_ranks(struct options *o, const char *arg) {
  const char *p = arg;

  o->nranks = 0;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    int64_t n;

    if (o->nranks == MAX_RANK_COUNTS)
      return usage_error("--ranks '%s': at most %d rank counts", arg, MAX_RANK_COUNTS);
    if (!parse_number(p, len, 1, MAX_RANKS, &n))
      return usage_error("--ranks '%s' must be a comma list of rank counts in 1..%d", arg,
                         MAX_RANKS);
    o->ranks[o->nranks++] = (size_t)n;
    if (comma == NULL)
      return 0;
    p = comma + 1;
  }
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, struct options *o) {
  enum {
    OPT_RANKS = 256, OPT_REPEAT, OPT_SERVER, OPT_IN_PROCESS, OPT_THREADS, OPT_TIMEOUT, OPT_ETCD,
  };
  static const struct option longopts[] = {
      {"ranks", required_argument, NULL, OPT_RANKS},
      {"repeat", required_argument, NULL, OPT_REPEAT},
      {"server", required_argument, NULL, OPT_SERVER},
      {"etcd", required_argument, NULL, OPT_ETCD},
      {"in-process", no_argument, NULL, OPT_IN_PROCESS},
      {"threads", required_argument, NULL, OPT_THREADS},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int opt;
  int64_t n;

  opterr = 0;
  while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (opt) {
    case OPT_RANKS:
      if (parse_ranks(o, optarg) != 0)
        return EXIT_USAGE;
      break;
    case OPT_REPEAT:
      if (!parse_number(optarg, strlen(optarg), 1, MAX_REPEAT, &n))
        return usage_error("--repeat '%s' must be 1-%d", optarg, MAX_REPEAT);
      o->repeat = (unsigned)n;
      break;
    case OPT_ETCD:
      o->etcd = optarg;
      break;
    case OPT_SERVER:
      o->server = optarg;
      break;
    case OPT_IN_PROCESS:
      o->in_process = true;
      break;
    case OPT_THREADS:
      if (!parse_number(optarg, strlen(optarg), 1, 64, &n))
        return usage_error("--threads '%s' must be 1-64", optarg);
      o->threads = (unsigned)n;
      break;
    case OPT_TIMEOUT:
      if (!parse_number(optarg, strlen(optarg), 1, 3600, &n))
        return usage_error("--timeout '%s' must be 1-3600 seconds", optarg);
      o->timeout_ms = n * 1000;
      break;
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    case ':':
      return usage_error("option %s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if ((o->server != NULL) + o->in_process + (o->etcd != NULL) > 1)
    return usage_error("--server, --in-process and --etcd exclude each other");
  if (o->etcd != NULL && o->threads != 0)
    return usage_error("--threads applies to a spawned or in-process server, not to --etcd");
  if (o->server != NULL && o->threads != 0)
    return usage_error("--threads applies to a spawned or in-process server, not to --server");
  return -1;
}

/* Splits "HOST:PORT" or "[V6]:PORT" into host (brackets dropped) and port. */
static int parse_server(const char *arg, char *host, size_t host_size, int *port) {
  const char *colon = strrchr(arg, ':');
  const char *h = arg;
  size_t len;
  int64_t n;

  if (colon == NULL || !parse_number(colon + 1, strlen(colon + 1), 1, 65535, &n))
    return usage_error("--server '%s' must be HOST:PORT with PORT in 1-65535", arg);
  len = (size_t)(colon - arg);
  if (len >= 2 && h[0] == '[' && h[len - 1] == ']') {
    h++;
    len -= 2;
  }
  if (len == 0 || len >= host_size)
    return usage_error("--server '%s': bad host", arg);
  memcpy(host, h, len);
  host[len] = '\0';
  *port = (int)n;
  return 0;
}

/* --etcd's URL: every client is then an etcd cluster's (NULL: hvd's store). */
static const char *etcd_url;

static hvd_status new_client(const char *host, int port, int64_t timeout_ms,
                             struct rdzv_client **out) {
  return etcd_url != NULL ? rdzv_client_create_url(etcd_url, timeout_ms, out)
                          : rdzv_client_create(host, port, NULL, timeout_ms, out);
}

/* ---- resources ---------------------------------------------------------------- */

/* Raises the soft open-file limit to the hard one and checks that `needed` fit. */
static hvd_status ensure_files(size_t needed, size_t max_ranks, bool in_process) {
  struct rlimit rl;

  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return hvd_error(HVD_ERR_IO, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      return hvd_error(HVD_ERR_IO, "setrlimit(RLIMIT_NOFILE, %llu): %s",
                       (unsigned long long)rl.rlim_max, strerror(errno));
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < needed)
    return hvd_error(HVD_ERR_TOO_LARGE,
                     "%zu ranks need about %zu open files (%s) but the hard limit is %llu: "
                     "raise it (ulimit -Hn, limits.conf) or run fewer ranks",
                     max_ranks, needed,
                     in_process ? "one per client and one per server connection"
                                : "one per client connection",
                     (unsigned long long)rl.rlim_cur);
  return HVD_OK;
}

/* ---- the spawned server -------------------------------------------------------- */

struct child {
  pid_t pid; /* 0: none, or reaped */
  bool died; /* ended before the bench stopped it */
  int port;
  char address[256];
};

static hvd_status server_path(char *out, size_t size) {
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  char *slash;

  if (len < 0)
    return hvd_error(HVD_ERR_IO, "readlink /proc/self/exe: %s", strerror(errno));
  exe[len] = '\0';
  slash = strrchr(exe, '/');
  if (slash == NULL)
    return hvd_error(HVD_ERR_IO, "cannot tell the bench's directory from '%s'", exe);
  *slash = '\0';
  if ((size_t)snprintf(out, size, "%s/hvd-rendezvous", exe) >= size)
    return hvd_error(HVD_ERR_TOO_LARGE, "path of hvd-rendezvous is too long");
  if (access(out, X_OK) != 0)
    return hvd_error(HVD_ERR_NOT_FOUND,
                     "%s: %s (build the hvd-rendezvous target, or pass --server or --in-process)",
                     out, strerror(errno));
  return HVD_OK;
}

/* Reads the first stdout line of the server, "listening on ADDR:PORT". */
static hvd_status read_listen_line(int fd, struct child *ch) {
  static const char prefix[] = "listening on ";
  char line[256];
  size_t len = 0;
  int64_t deadline = hvd_deadline_after_ms(SERVER_START_TIMEOUT_MS);
  const char *colon;
  int64_t port;

  while (len < sizeof(line) - 1 && memchr(line, '\n', len) == NULL) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int rc = poll(&p, 1, (int)hvd_remaining_ms(deadline));
    ssize_t got;
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc < 0)
      return hvd_error(HVD_ERR_IO, "poll on hvd-rendezvous' stdout: %s", strerror(errno));
    if (rc == 0)
      return hvd_error(HVD_ERR_TIMEOUT, "hvd-rendezvous printed no 'listening on' line in %d s",
                       SERVER_START_TIMEOUT_MS / 1000);
    got = read(fd, line + len, sizeof(line) - 1 - len);
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return hvd_error(HVD_ERR_IO, "read hvd-rendezvous' stdout: %s", strerror(errno));
    if (got == 0)
      return hvd_error(HVD_ERR_IO, "hvd-rendezvous exited before listening (see its stderr)");
    len += (size_t)got;
  }
  line[len] = '\0';
  line[strcspn(line, "\r\n")] = '\0';
  colon = strrchr(line, ':');
  if (strncmp(line, prefix, sizeof(prefix) - 1) != 0 || colon == NULL ||
      !parse_number(colon + 1, strlen(colon + 1), 1, 65535, &port))
    return hvd_error(HVD_ERR_PROTOCOL, "unexpected first line from hvd-rendezvous: '%.100s'",
                     line);
  snprintf(ch->address, sizeof(ch->address), "%s", line + sizeof(prefix) - 1);
  ch->port = (int)port;
  return HVD_OK;
}

static hvd_status spawn_server(unsigned threads, struct child *ch) {
  char path[PATH_MAX + 32];
  char threads_text[16];
  char *argv[6];
  int argc = 0;
  int fds[2] = {-1, -1};
  posix_spawn_file_actions_t actions;
  bool actions_ready = false;
  hvd_status st;
  int rc;

  st = server_path(path, sizeof(path));
  if (st != HVD_OK)
    goto out;
  argv[argc++] = path;
  argv[argc++] = "--port";
  argv[argc++] = "0";
  if (threads != 0) {
    snprintf(threads_text, sizeof(threads_text), "%u", threads);
    argv[argc++] = "--threads";
    argv[argc++] = threads_text;
  }
  argv[argc] = NULL;
  if (pipe2(fds, O_CLOEXEC) != 0) {
    st = hvd_error(HVD_ERR_IO, "pipe2: %s", strerror(errno));
    goto out;
  }
  rc = posix_spawn_file_actions_init(&actions);
  if (rc == 0) {
    actions_ready = true;
    rc = posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  }
  if (rc == 0)
    rc = posix_spawn(&ch->pid, path, &actions, NULL, argv, environ);
  if (rc != 0) {
    ch->pid = 0;
    st = hvd_error(HVD_ERR_IO, "posix_spawn %s: %s", path, strerror(rc));
    goto out;
  }
  close(fds[1]);
  fds[1] = -1;
  st = read_listen_line(fds[0], ch);

out:
  if (actions_ready)
    posix_spawn_file_actions_destroy(&actions);
  if (fds[1] >= 0)
    close(fds[1]);
  if (fds[0] >= 0)
    close(fds[0]); /* the server prints nothing more; it ignores SIGPIPE */
  return st;
}

static void describe_status(int status, char *out, size_t size) {
  if (WIFEXITED(status))
    snprintf(out, size, "exit code %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(out, size, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(out, size, "status 0x%x", (unsigned)status);
}

/*
 * Whether the server is still running. A server that ended on its own
 * (a crash, or a SIGTERM/SIGINT from somebody else: it then exits 0) is
 * reaped and reported, so that failed runs name their cause.
 */
static bool server_alive(struct child *ch) {
  int status = 0;
  char how[64];
  pid_t got;

  if (ch->pid == 0)
    return false;
  got = waitpid(ch->pid, &status, WNOHANG);
  if (got == 0)
    return true;
  describe_status(status, how, sizeof(how));
  fprintf(stderr,
          "hvd-bench-rendezvous: hvd-rendezvous (pid %ld) ended on its own with %s before the "
          "bench stopped it%s\n",
          (long)ch->pid, how,
          WIFEXITED(status) && WEXITSTATUS(status) == 0
              ? " (exit code 0 means it received SIGTERM or SIGINT from another process)"
              : "");
  ch->pid = 0;
  ch->died = true;
  return false;
}

/* SIGTERM, then waits; SIGKILL if it does not stop in time. */
static hvd_status stop_server(struct child *ch) {
  int64_t deadline = hvd_deadline_after_ms(SERVER_STOP_TIMEOUT_MS);
  int status = 0;
  char how[64];
  pid_t got;

  if (ch->died)
    return hvd_error(HVD_ERR_ABORTED, "hvd-rendezvous ended during the benchmark");
  if (ch->pid == 0)
    return HVD_OK;
  if (!server_alive(ch))
    return hvd_error(HVD_ERR_ABORTED, "hvd-rendezvous ended during the benchmark");
  kill(ch->pid, SIGTERM);
  while ((got = waitpid(ch->pid, &status, WNOHANG)) == 0 && hvd_now_ns() < deadline)
    hvd_sleep_ns(10 * 1000 * 1000);
  if (got == 0) {
    kill(ch->pid, SIGKILL);
    waitpid(ch->pid, &status, 0);
    ch->pid = 0;
    return hvd_error(HVD_ERR_TIMEOUT, "hvd-rendezvous did not stop within %d s of SIGTERM",
                     SERVER_STOP_TIMEOUT_MS / 1000);
  }
  ch->pid = 0;
  if (got < 0)
    return hvd_error(HVD_ERR_IO, "waitpid hvd-rendezvous: %s", strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    describe_status(status, how, sizeof(how));
    return hvd_error(HVD_ERR_IO, "hvd-rendezvous ended with %s after SIGTERM", how);
  }
  return HVD_OK;
}

/* ---- one rank -------------------------------------------------------------------- */

/* A realistic, rank-specific transport record, space-padded to RECORD_BYTES. */
static void make_record(char *out, size_t rank, unsigned seq) {
  char text[160];
  int n = snprintf(text, sizeof(text),
                   "addr=10.%zu.%zu.%zu port=%zu host=node%04zu.bench.local pid=%zu gen=%u",
                   (rank / 62500) % 256, (rank / 250) % 250, rank % 250 + 1, 29500 + rank % 8,
                   rank / 8, 4000 + rank * 7 % 60000, seq);
  size_t len = n < 0 ? 0 : (size_t)n;

  memset(out, ' ', RECORD_BYTES);
  memcpy(out, text, len < RECORD_BYTES ? len : RECORD_BYTES);
}

static void rank_failed(struct run *run, size_t index, const char *what, const char *detail) {
  atomic_fetch_add(&run->failures, 1);
  pthread_mutex_lock(&run->mu);
  if (run->first_error[0] == '\0')
    snprintf(run->first_error, sizeof(run->first_error), "rank %zu: %s: %s", index, what, detail);
  pthread_mutex_unlock(&run->mu);
}

/* Whether the view is exactly the N records; why says what differs. */
static bool verify(const struct run *run, const struct rdzv_scope_view *v, char *why,
                   size_t why_size) {
  if (v->count != run->n) {
    snprintf(why, why_size, "got %zu entries, expected %zu", v->count, run->n);
    return false;
  }
  /* Numeric keys come in numeric order, so entry i must be rank i's. */
  for (size_t i = 0; i < v->count; i++) {
    const struct rdzv_entry *e = &v->entries[i];
    size_t key_len = strlen(run->keys[i]);
    if (e->key_len != key_len || memcmp(e->key, run->keys[i], key_len) != 0) {
      snprintf(why, why_size, "entry %zu has key '%.20s', expected '%s'", i, e->key,
               run->keys[i]);
      return false;
    }
    if (e->value_len != RECORD_BYTES || memcmp(e->value, run->records[i], RECORD_BYTES) != 0) {
      snprintf(why, why_size, "the value of key '%s' (%zu bytes) is not the record rank %zu PUT",
               run->keys[i], e->value_len, i);
      return false;
    }
  }
  return true;
}

static void *rank_main(void *arg) {
  struct rank *r = arg;
  struct run *run = r->run;
  struct rdzv_client *c = NULL;
  struct rdzv_scope_view view = {0};
  char why[256];
  bool go;
  hvd_status st = new_client(run->host, run->port, run->timeout_ms, &c);
  int64_t deadline = hvd_deadline_after_ms(run->timeout_ms);

  if (st != HVD_OK)
    rank_failed(run, r->index, "create client", hvd_last_error_message());
  pthread_mutex_lock(&run->mu);
  if (++run->ready == run->n)
    pthread_cond_broadcast(&run->cond);
  while (!run->go && hvd_cond_wait_until(&run->cond, &run->mu, deadline) != ETIMEDOUT) {
  }
  go = run->go && !run->abort;
  pthread_mutex_unlock(&run->mu);
  if (st != HVD_OK || !go)
    goto out;

  st = rdzv_client_set(c, run->scope, run->keys[r->index], run->records[r->index], RECORD_BYTES);
  if (st != HVD_OK) {
    rank_failed(run, r->index, "PUT", hvd_last_error_message());
    r->done_ns = hvd_now_ns();
    goto out;
  }
  st = rdzv_client_get_scope(c, run->scope, run->n, run->timeout_ms, &view);
  r->done_ns = hvd_now_ns();
  if (st != HVD_OK)
    rank_failed(run, r->index, "GET scope", hvd_last_error_message());
  else if (!verify(run, &view, why, sizeof(why)))
    rank_failed(run, r->index, "verify", why);

out:
  rdzv_scope_view_fini(&view);
  rdzv_client_destroy(c);
  return NULL;
}

/* ---- one run ------------------------------------------------------------------------ */

static int compare_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void summarize(const struct run *run, const struct rank *ranks, struct result *res) {
  int64_t *lat = malloc(run->n * sizeof(*lat));
  size_t m = 0;
  int64_t last = run->start_ns;

  for (size_t i = 0; i < run->n; i++) {
    if (ranks[i].done_ns == 0)
      continue;
    if (ranks[i].done_ns > last)
      last = ranks[i].done_ns;
    if (lat != NULL)
      lat[m++] = ranks[i].done_ns - run->start_ns;
  }
  res->wall_s = (double)(last - run->start_ns) / 1e9;
  res->req_per_s = res->wall_s > 0 ? 2.0 * (double)run->n / res->wall_s : 0;
  res->lat_med_ms = res->lat_max_ms = 0;
  if (m > 0) {
    qsort(lat, m, sizeof(*lat), compare_i64);
    res->lat_med_ms =
        (m % 2 ? (double)lat[m / 2] : ((double)lat[m / 2 - 1] + (double)lat[m / 2]) / 2) / 1e6;
    res->lat_max_ms = (double)lat[m - 1] / 1e6;
  }
  res->failures = atomic_load(&run->failures);
  free(lat);
}

/* Runs N ranks once. HVD_OK even when ranks failed (res->failures says so);
 * an error status means the run could not be set up. */
static hvd_status run_once(const char *host, int port, size_t n, unsigned seq, int64_t timeout_ms,
                           struct result *res) {
  struct run run;
  struct rank *ranks = NULL;
  pthread_attr_t attr;
  bool attr_ready = false, sync_ready = false;
  size_t created = 0;
  hvd_status st = HVD_OK;
  int rc;

  memset(&run, 0, sizeof(run));
  run.host = host;
  run.port = port;
  run.n = n;
  run.timeout_ms = timeout_ms;
  snprintf(run.scope, sizeof(run.scope), "bench_%ld_%u", (long)getpid(), seq);
  run.records = malloc(n * sizeof(*run.records));
  run.keys = malloc(n * sizeof(*run.keys));
  ranks = calloc(n, sizeof(*ranks));
  if (run.records == NULL || run.keys == NULL || ranks == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the state of %zu ranks", n);
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    make_record(run.records[i], i, seq);
    snprintf(run.keys[i], KEY_MAX, "%zu", i);
  }
  if (pthread_mutex_init(&run.mu, NULL) != 0 || hvd_cond_init(&run.cond) != 0) {
    st = hvd_error(HVD_ERR_IO, "cannot create the start gate");
    goto out;
  }
  sync_ready = true;
  if ((rc = pthread_attr_init(&attr)) != 0 ||
      (attr_ready = true, rc = pthread_attr_setstacksize(&attr, RANK_STACK_BYTES)) != 0) {
    st = hvd_error(HVD_ERR_IO, "pthread_attr: %s", strerror(rc));
    goto out;
  }

  for (; created < n; created++) {
    ranks[created].run = &run;
    ranks[created].index = created;
    rc = pthread_create(&ranks[created].thread, &attr, rank_main, &ranks[created]);
    if (rc != 0) {
      st = hvd_error(HVD_ERR_IO,
                     "cannot start rank thread %zu of %zu: pthread_create: %s (check ulimit -u and -v, "
                     "kernel.threads-max and the cgroup's pids.max)",
                     created, n, strerror(rc));
      break;
    }
  }

  /* Open the gate once every rank holds its client; if not every rank could
   * start, open it at once with abort set, so that the started ones leave. */
  pthread_mutex_lock(&run.mu);
  int64_t deadline = hvd_deadline_after_ms(timeout_ms);
  while (st == HVD_OK && run.ready < n &&
         hvd_cond_wait_until(&run.cond, &run.mu, deadline) != ETIMEDOUT) {
  }
  if (st == HVD_OK && run.ready < n)
    st = hvd_error(HVD_ERR_TIMEOUT, "only %zu of %zu ranks reached the start gate", run.ready,
                   created);
  run.abort = st != HVD_OK;
  run.start_ns = hvd_now_ns();
  run.go = true;
  pthread_cond_broadcast(&run.cond);
  pthread_mutex_unlock(&run.mu);

  for (size_t i = 0; i < created; i++)
    pthread_join(ranks[i].thread, NULL);
  if (st == HVD_OK) {
    summarize(&run, ranks, res);
    if (run.first_error[0] != '\0')
      fprintf(stderr, "# %zu ranks, run %u: %zu failed; first: %s\n", n, seq, res->failures,
              run.first_error);
  }

out:
  if (attr_ready)
    pthread_attr_destroy(&attr);
  if (sync_ready) {
    pthread_cond_destroy(&run.cond);
    pthread_mutex_destroy(&run.mu);
  }
  free(ranks);
  free(run.keys);
  free(run.records);
  return st;
}

/* ---- main ------------------------------------------------------------------------- */

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void print_row(size_t n, unsigned k, const struct result *r) {
  printf("%9zu %5u %10.4f %10zu %10.0f %12.2f %12.2f %7zu\n", n, k, r->wall_s, 2 * n,
         r->req_per_s, r->lat_med_ms, r->lat_max_ms, r->failures);
}

/* Runs every repeat of N ranks and prints rows and a summary; false if any failed. */
static bool bench_ranks(const struct options *o, const char *host, int port, size_t n,
                        unsigned *seq, struct rdzv_client *admin, struct child *ch) {
  struct result *results = calloc(o->repeat, sizeof(*results));
  double *walls = calloc(o->repeat, sizeof(*walls));
  size_t failures = 0;
  unsigned done = 0;
  bool ok = true;

  if (results == NULL || walls == NULL) {
    fprintf(stderr, "hvd-bench-rendezvous: out of memory\n");
    ok = false;
    goto out;
  }
  for (unsigned k = 0; k < o->repeat; k++) {
    unsigned s = ++*seq;
    char scope[64];
    if (run_once(host, port, n, s, o->timeout_ms, &results[k]) != HVD_OK) {
      fprintf(stderr, "hvd-bench-rendezvous: %zu ranks: %s\n", n, hvd_last_error_message());
      ok = false;
      break;
    }
    print_row(n, k + 1, &results[k]);
    fflush(stdout);
    walls[k] = results[k].wall_s;
    failures += results[k].failures;
    done++;
    if (ch != NULL && !server_alive(ch)) {
      ok = false;
      break;
    }
    /* Leave the server as we found it; not timed. */
    snprintf(scope, sizeof(scope), "bench_%ld_%u", (long)getpid(), s);
    if (rdzv_client_delete_scope(admin, scope) != HVD_OK)
      fprintf(stderr, "# warning: %s\n", hvd_last_error_message());
  }
  if (done > 0) {
    /* The run with the median wall time speaks for the rank count. */
    qsort(walls, done, sizeof(*walls), compare_double);
    double median = walls[done / 2];
    const struct result *mid = &results[0];
    for (unsigned k = 0; k < done; k++) {
      if (results[k].wall_s == median)
        mid = &results[k];
    }
    printf("# ranks %zu: median wall %.4f s over %u run%s (%.0f req/s, rank latency median "
           "%.2f ms, max %.2f ms), %zu failed rank%s\n",
           n, median, done, done == 1 ? "" : "s", mid->req_per_s, mid->lat_med_ms, mid->lat_max_ms, failures,
           failures == 1 ? "" : "s");
  }
  if (failures > 0)
    ok = false;

out:
  free(walls);
  free(results);
  return ok;
}

int main(int argc, char **argv) {
  struct options o = {.ranks = {64, 512, 4096}, .nranks = 3, .repeat = 3,
                      .timeout_ms = 60 * 1000};
  struct child child = {0};
  struct rdzv_server *srv = NULL;
  struct rdzv_client *admin = NULL;
  char host[256] = "127.0.0.1";
  char mode[400];
  char threads_text[48];
  int port = 0;
  size_t max_ranks = 0;
  unsigned seq = 0;
  bool ok = true;
  int rc;

  hvd_log_set_name("hvd-bench-rendezvous");
  if (hvd_log_configure_from_env() != HVD_OK) {
    fprintf(stderr, "hvd-bench-rendezvous: %s\n", hvd_last_error_message());
    return EXIT_USAGE;
  }
  rc = parse_args(argc, argv, &o);
  if (rc >= 0)
    return rc;
  if (o.server != NULL && parse_server(o.server, host, sizeof(host), &port) != 0)
    return EXIT_USAGE;
  signal(SIGPIPE, SIG_IGN);

  for (size_t i = 0; i < o.nranks; i++)
    max_ranks = o.ranks[i] > max_ranks ? o.ranks[i] : max_ranks;
  if (ensure_files(max_ranks * (o.in_process ? 2 : 1) + FD_RESERVE, max_ranks, o.in_process) !=
      HVD_OK) {
    fprintf(stderr, "hvd-bench-rendezvous: %s\n", hvd_last_error_message());
    return EXIT_FAILED;
  }

  etcd_url = o.etcd;
  if (o.etcd != NULL) {
    snprintf(mode, sizeof(mode), "etcd cluster %s", o.etcd);
  } else if (o.in_process) {
    struct rdzv_server_config cfg;
    rdzv_server_config_default(&cfg);
    cfg.port = 0;
    cfg.threads = o.threads;
    if (rdzv_server_start(&cfg, &srv) != HVD_OK) {
      fprintf(stderr, "hvd-bench-rendezvous: %s\n", hvd_last_error_message());
      return EXIT_FAILED;
    }
    port = rdzv_server_port(srv);
    snprintf(mode, sizeof(mode), "in-process server on %s", rdzv_server_address(srv));
  } else if (o.server == NULL) {
    if (spawn_server(o.threads, &child) != HVD_OK) {
      fprintf(stderr, "hvd-bench-rendezvous: %s\n", hvd_last_error_message());
      stop_server(&child);
      return EXIT_FAILED;
    }
    port = child.port;
    snprintf(mode, sizeof(mode), "spawned hvd-rendezvous (pid %ld) on %s", (long)child.pid,
             child.address);
  } else {
    snprintf(mode, sizeof(mode), "external server %s", o.server);
  }
  if (new_client(host, port, o.timeout_ms, &admin) != HVD_OK) {
    fprintf(stderr, "hvd-bench-rendezvous: %s\n", hvd_last_error_message());
    ok = false;
    goto out;
  }

  if (o.server != NULL || o.etcd != NULL)
    snprintf(threads_text, sizeof(threads_text), "as configured there");
  else if (o.threads == 0)
    snprintf(threads_text, sizeof(threads_text), "default (one per CPU, at most 4)");
  else
    snprintf(threads_text, sizeof(threads_text), "%u", o.threads);
  printf("# hvd-bench-rendezvous: %s, server event loops: %s\n", mode, threads_text);
  printf("# %u run%s per rank count; each rank: PUT a %d-byte record, GET the scope with "
         "count=N, verify N entries\n",
         o.repeat, o.repeat == 1 ? "" : "s", RECORD_BYTES);
  printf("#\n#%8s %5s %10s %10s %10s %12s %12s %7s\n", "ranks", "run", "wall(s)", "requests",
         "req/s", "lat_med(ms)", "lat_max(ms)", "errors");
  fflush(stdout);
  for (size_t i = 0; i < o.nranks; i++) {
    if (!bench_ranks(&o, host, port, o.ranks[i], &seq, admin, child.pid != 0 ? &child : NULL))
      ok = false;
    if (child.died)
      break;
  }
  printf("# %s\n", ok ? "every run verified" : "FAILED: see the errors above");

out:
  rdzv_client_destroy(admin);
  rdzv_server_stop(srv);
  if (stop_server(&child) != HVD_OK) {
    fprintf(stderr, "hvd-bench-rendezvous: %s\n", hvd_last_error_message());
    ok = false;
  }
  return ok ? 0 : EXIT_FAILED;
}
