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

#include "proc.h"
#include "rendezvous/rendezvous.h"
#include "transport/transport.h"

extern char **environ;

enum { GRACE_S = 5, DRAIN_MS = 1000, ARRIVAL_POLL_MS = 100, READ_CHUNK = 64 * 1024 };

struct rank_proc {
  struct hvdrun_proc p;
  bool arrived; /* reached the store */
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

struct plan {
  struct rdzv_store *store;
  hvd_status st; /* the first failure */
};

static void plan_scope(void *arg, const char *scope, size_t ranks) {
  struct plan *p = arg;
  if (p->st == HVD_OK)
    p->st = rdzv_store_plan(p->store, scope, strlen(scope), ranks);
}

static hvd_status start_store(struct job *j) {
  struct rdzv_server_config cfg;
  struct plan plan;
  bool any_remote = false;
  hvd_status st;

  for (size_t h = 0; h < j->nhosts; h++)
    any_remote = any_remote || j->remote[h];
  const char **remote = calloc(j->nhosts + 1, sizeof(*remote));
  size_t nremote = 0;
  if (remote == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  for (size_t h = 0; h < j->nhosts; h++) {
    if (j->remote[h])
      remote[nremote++] = j->hosts[h].name;
  }
  st = hvdrun_make_token(j->token, sizeof(j->token));
  if (st == HVD_OK)
    st = hvdrun_store_address(j->o, remote, nremote, j->addr, sizeof(j->addr));
  free(remote);
  if (st != HVD_OK)
    return st;
  rdzv_server_config_default(&cfg);
  cfg.bind_address = any_remote ? NULL : "127.0.0.1";
  cfg.port = j->o->rendezvous_port;
  cfg.token = j->token;
  cfg.threads = 1;
  if ((st = rdzv_server_start(&cfg, &j->server)) != HVD_OK)
    return hvd_error_prefix("starting the rendezvous store");
  j->port = rdzv_server_port(j->server);
  /* Planned scopes clear themselves once every rank has finished with them. */
  plan.store = rdzv_server_store(j->server);
  plan.st = HVD_OK;
  hvdrun_each_scope(j->hosts, j->slots, j->size, 0, plan_scope, &plan);
  if (plan.st != HVD_OK)
    return hvd_error_prefix("planning the store's scopes");
  if (j->o->verbose)
    fprintf(stderr, "hvdrun: rendezvous store on %s:%d (ranks use %s:%d)\n",
            any_remote ? "*" : "127.0.0.1", j->port, j->addr, j->port);
  return HVD_OK;
}

/* ==== a rank's command =================================================== */

/* ==== a rank ================================================================= */

static hvd_status spawn(struct job *j, int r) {
  const struct hvdrun_slot *s = &j->slots[r];
  struct hvdrun_env vars = {0};
  hvd_status st = hvdrun_job_vars(j->o, j->addr, j->port, j->token, &vars);

  if (st == HVD_OK)
    st = hvdrun_slot_vars(j->hosts[s->host].name, s, &vars);
  if (st == HVD_OK)
    st = hvdrun_proc_start(&j->procs[r].p, j->o, j->hosts[s->host].name, j->remote[s->host],
                           &vars, r);
  if (st == HVD_OK)
    j->running++;
  hvdrun_env_fini(&vars);
  return st;
}

/* ==== supervision =========================================================== */

static const char *host_of(const struct job *j, int r) { return j->hosts[j->slots[r].host].name; }

static void signal_groups(struct job *j, int sig) {
  for (int r = 0; r < j->size; r++) {
    if (j->procs[r].p.pid > 0)
      (void)kill(-j->procs[r].p.pid, sig);
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

static void reap(struct job *j) {
  for (;;) {
    int status, code;
    char why[128];
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0)
      return;
    for (int r = 0; r < j->size; r++) {
      struct hvdrun_proc *p = &j->procs[r].p;
      if (p->pid != pid || !p->running)
        continue;
      p->running = false;
      j->running--;
      hvdrun_describe_end(status, why, sizeof(why), &code);
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
    missing += !p->arrived && p->p.running;
  }
  if (missing == 0 && all) {
    j->all_arrived = true;
    return;
  }
  if (missing > 0 && hvd_now_ns() >= j->start_deadline && !j->stopping) {
    int shown = 0;
    for (int r = 0; r < j->size && shown < 8; r++) {
      if (j->procs[r].arrived || !j->procs[r].p.running)
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
        if (j->procs[r].p.fds[k] >= 0) {
          who[n] = r * 2 + k;
          pfds[n++] = (struct pollfd){.fd = j->procs[r].p.fds[k], .events = POLLIN};
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
        hvdrun_proc_forward(&j->procs[who[i] / 2].p, who[i] % 2);
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
  free(pfds);
  free(who);
  return j->exit_code;
}

/* A rank that stopped (SIGSTOP, a hung host) fails nobody itself: the
 * others time out waiting for it, and the first of them to exit is what
 * stops the job. Their messages name whom they waited for; say it last.
 * A rank that timed out itself was waiting too (for the stopped one,
 * maybe through others), so the ranks named are those waited for that did
 * not time out, when there are such. */
static void name_waited_on(const struct job *j) {
  bool any_silent = false;
  for (int r = 0; r < j->size && !any_silent; r++) {
    const struct hvdrun_stream *s = &j->procs[r].p.streams[1];
    for (int k = 0; k < s->nwaited; k++) {
      int t = s->waited_on[k];
      if (t >= 0 && t < j->size && j->procs[t].p.streams[1].nwaited == 0)
        any_silent = true;
    }
  }
  for (int target = 0; target < j->size; target++) {
    char waiters[256];
    size_t len = 0;
    int n = 0;
    if (any_silent && j->procs[target].p.streams[1].nwaited > 0)
      continue;
    waiters[0] = '\0';
    for (int r = 0; r < j->size; r++) {
      const struct hvdrun_stream *s = &j->procs[r].p.streams[1];
      for (int k = 0; k < s->nwaited; k++) {
        if (s->waited_on[k] != target)
          continue;
        if (len < sizeof(waiters))
          len += (size_t)snprintf(waiters + len, sizeof(waiters) - len, "%s%d", n ? ", " : "", r);
        n++;
        break;
      }
    }
    if (n > 0)
      fprintf(stderr,
              "hvdrun: rank%s %s timed out waiting for rank %d on host %s: it made no progress "
              "(stopped, hung, or cut off from the others?)\n",
              n > 1 ? "s" : "", waiters, target, host_of(j, target));
  }
}

/* ==== the whole job ========================================================= */

int hvdrun_run(const struct hvdrun_options *o, const struct hvdrun_host *hosts, size_t nhosts,
               const struct hvdrun_slot *slots, int size) {
  struct job j;
  hvd_status st = HVD_OK;
  int code, digits = 1;

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
  st = hvdrun_signal_fd(&j.sigfd);
  if (st == HVD_OK)
    st = start_store(&j);
  for (int v = size - 1; v >= 10; v /= 10)
    digits++;
  for (int r = 0; r < size; r++) {
    hvd_status opened = hvdrun_proc_init(&j.procs[r].p, o, r, digits);
    if (st == HVD_OK)
      st = opened;
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
  if (code != 0)
    name_waited_on(&j);
  rdzv_server_stop(j.server);
  for (int r = 0; r < size; r++)
    hvdrun_proc_fini(&j.procs[r].p);
  if (j.sigfd >= 0)
    close(j.sigfd);
  free(j.remote);
  free(j.procs);
  return code;
}
