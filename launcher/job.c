/*
 * One static hvdrun job: the store, the ranks, and what their ends mean.
 *
 * DESIGN. hvdrun serves the job's rendezvous store in-process (store.c)
 * with the planned scope sizes, starts every rank (proc.c), and leaves
 * their output, reaping and stopping to the supervisor (supervise.c); this
 * file is the static job's policy over it. The first rank to fail
 * (non-zero exit, or a signal) is named, with its host and code, and every
 * rank is stopped; hvdrun exits with the failed rank's code (128 + signal
 * for a signal). A signal to hvdrun stops the job the same way, and a
 * second one kills the ranks at once. Until every rank has reached the
 * store (its record is in the `global` scope, or that scope has
 * completed), ranks still running after --start-timeout are named and the
 * job stops.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous/rendezvous.h"
#include "supervise.h"

enum {
  ARRIVAL_POLL_MS = 100,
  /* One look at who reached an etcd cluster: the supervisor waits for it
   * (a rank's exit, a signal), so it must not take the client's 30 s. */
  ARRIVAL_READ_MS = 1000,
};

struct job {
  const struct hvdrun_options *o;
  const struct hvdrun_host *hosts;
  size_t nhosts;
  bool *remote; /* per host */
  const struct hvdrun_slot *slots;
  int size;
  struct hvdrun_store store;
  struct hvdrun_sup sup; /* entry r is rank r */
  bool *arrived;         /* per rank: reached the store (sticky) */
  bool stopping;
  bool said_overdue;
  int exit_code; /* the first failure's */
  bool all_arrived;
  int64_t start_deadline;
};

static const char *host_of(const struct job *j, int r) { return j->hosts[j->slots[r].host].name; }

static struct hvdrun_proc *rank(struct job *j, int r) {
  return hvdrun_sup_proc(&j->sup, (size_t)r);
}

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
  struct hvdrun_store_config cfg = {0};
  const char **remote = calloc(j->nhosts + 1, sizeof(*remote));
  struct plan plan;
  hvd_status st;

  if (remote == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  for (size_t h = 0; h < j->nhosts; h++) {
    if (j->remote[h])
      remote[cfg.nremote++] = j->hosts[h].name;
  }
  cfg.remote = remote;
  st = hvdrun_store_start(j->o, &cfg, &j->store);
  free(remote);
  if (st != HVD_OK)
    return st;
  if (j->store.server == NULL) { /* etcd: the job's keys go with its lease */
    if (j->o->verbose)
      fprintf(stderr, "hvdrun: rendezvous in %s\n", j->store.url);
    return HVD_OK;
  }
  /* Planned scopes clear themselves once every rank has finished with them. */
  plan.store = rdzv_server_store(j->store.server);
  plan.st = HVD_OK;
  hvdrun_each_scope(j->hosts, j->slots, j->size, 0, plan_scope, &plan);
  if (plan.st != HVD_OK)
    return hvd_error_prefix("planning the store's scopes");
  if (j->o->verbose)
    fprintf(stderr, "hvdrun: rendezvous store on %s:%d (ranks use %s:%d)\n",
            j->store.loopback ? "127.0.0.1" : "*", j->store.port, j->store.addr, j->store.port);
  return HVD_OK;
}

/* ==== a rank ================================================================= */

static hvd_status spawn(struct job *j, int r) {
  const struct hvdrun_slot *s = &j->slots[r];
  struct hvdrun_env vars = {0};
  hvd_status st = hvdrun_store_vars(j->o, &j->store, &vars);

  if (st == HVD_OK)
    st = hvdrun_slot_vars(j->hosts[s->host].name, s, &vars);
  if (st == HVD_OK)
    st = hvdrun_proc_start(rank(j, r), j->o, j->hosts[s->host].name, j->remote[s->host], &vars, r);
  hvdrun_env_fini(&vars);
  return st;
}

/* ==== the policy ============================================================= */

/* Stops every rank: SIGTERM now, SIGKILL after the grace period. */
static void stop_job(struct job *j, int exit_code) {
  if (j->stopping)
    return;
  j->stopping = true;
  j->exit_code = exit_code;
  for (int r = 0; r < j->size; r++)
    hvdrun_sup_stop(&j->sup, (size_t)r);
}

static void ended_cb(void *arg, size_t i, const char *why, int code) {
  struct job *j = arg;
  int r = (int)i;

  if (j->o->verbose)
    fprintf(stderr, "hvdrun: rank %d on %s (pid %d) %s\n", r, host_of(j, r), (int)rank(j, r)->pid,
            why);
  if (code != 0 && !j->stopping) {
    fprintf(stderr, "hvdrun: rank %d on host %s %s; stopping the other ranks\n", r, host_of(j, r),
            why);
    stop_job(j, code);
  }
}

static void signal_cb(void *arg, int signo) {
  struct job *j = arg;

  if (!j->stopping) {
    fprintf(stderr, "hvdrun: got %s; stopping the job\n", strsignal(signo));
    stop_job(j, 128 + signo);
    return;
  }
  for (int r = 0; r < j->size; r++) /* a second one: no more grace */
    hvdrun_sup_kill(&j->sup, (size_t)r);
}

static void overdue_cb(void *arg, size_t i) {
  struct job *j = arg;
  (void)i;
  /* The ranks were stopped together: one line says it for all. */
  if (!j->said_overdue)
    fprintf(stderr, "hvdrun: ranks still running %d s after SIGTERM: sending SIGKILL\n",
            HVDRUN_GRACE_S);
  j->said_overdue = true;
}

static void failed_cb(void *arg) {
  struct job *j = arg;
  fprintf(stderr, "hvdrun: %s\n", hvd_last_error_message());
  stop_job(j, 1);
}

/* Marks the ranks whose records are in the etcd job's `global` scope,
 * where they stay (no plan clears it); true once every rank's is. */
static bool etcd_arrivals(struct job *j) {
  struct rdzv_scope_view view;

  if (rdzv_client_get_scope(j->store.client, "global", 0, ARRIVAL_READ_MS, &view) != HVD_OK) {
    HVD_LOG_DEBUG("hvdrun: reading who reached the store: %s", hvd_last_error_message());
    return false; /* the cluster may be electing a leader: next time */
  }
  for (size_t i = 0; i < view.count; i++) {
    int64_t r;
    if (hvd_parse_int64(view.entries[i].key, view.entries[i].key_len, &r) && r >= 0 &&
        r < j->size)
      j->arrived[r] = true;
  }
  rdzv_scope_view_fini(&view);
  for (int r = 0; r < j->size; r++) {
    if (!j->arrived[r])
      return false;
  }
  return true;
}

/* Which running ranks have reached the store (sticky). */
static void check_arrivals(struct job *j) {
  struct rdzv_store *store = j->store.server ? rdzv_server_store(j->store.server) : NULL;
  bool all = store != NULL ? rdzv_store_plan_rounds(store, "global", 6) > 0 : etcd_arrivals(j);
  int missing = 0;

  for (int r = 0; r < j->size; r++) {
    char key[16];
    struct rdzv_blob *b = NULL;
    int n = snprintf(key, sizeof(key), "%d", r);
    if (!j->arrived[r] && store != NULL &&
        (all || (rdzv_store_get(store, "global", 6, key, (size_t)n, &b) == HVD_OK && b != NULL)))
      j->arrived[r] = true;
    rdzv_blob_unref(b);
    missing += !j->arrived[r] && rank(j, r)->running;
  }
  if (missing == 0 && all) {
    j->all_arrived = true;
    return;
  }
  if (missing > 0 && hvd_now_ns() >= j->start_deadline && !j->stopping) {
    int shown = 0;
    for (int r = 0; r < j->size && shown < 8; r++) {
      if (j->arrived[r] || !rank(j, r)->running)
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

/* The store cannot tell us when a rank arrives: look now and then until
 * every rank has. */
static int64_t tick_cb(void *arg) {
  struct job *j = arg;
  if (j->stopping)
    return HVD_NO_DEADLINE; /* who arrived no longer matters */
  if (!j->all_arrived)
    check_arrivals(j);
  return j->all_arrived ? HVD_NO_DEADLINE : hvd_now_ns() + (int64_t)ARRIVAL_POLL_MS * 1000000;
}

/* A rank that stopped (SIGSTOP, a hung host) fails nobody itself: the
 * others time out waiting for it, and the first of them to exit is what
 * stops the job. So does a rank that shut hvd down (its script raised,
 * then exited) or failed: the others stop, and may exit before it. Their
 * messages name that rank (output.c); say it last. A rank that timed out
 * itself was waiting too (for the stopped one, maybe through others), so
 * the ranks named are those pointed at that point at nobody, when there
 * are such. */
static void name_waited_on(struct job *j) {
  static const struct {
    const char *verb, *tail;
  } SAID[] = {
      [HVDRUN_WAIT_TIMEOUT] = {"timed out waiting for",
                               ": it made no progress (stopped, hung, or cut off from the "
                               "others?)"},
      [HVDRUN_WAIT_SHUTDOWN] = {"stopped because",
                                " shut hvd down: its program ended or raised an exception (see "
                                "its output above)"},
      [HVDRUN_WAIT_FAILED] = {"stopped because", " failed first"},
  };
  bool any_silent = false;
  for (int r = 0; r < j->size && !any_silent; r++) {
    const struct hvdrun_stream *s = &rank(j, r)->streams[1];
    for (int k = 0; k < s->nwaited; k++) {
      int t = s->waited_on[k];
      if (t >= 0 && t < j->size && rank(j, t)->streams[1].nwaited == 0)
        any_silent = true;
    }
  }
  for (int target = 0; target < j->size; target++) {
    char waiters[256];
    size_t len = 0;
    int n = 0;
    enum hvdrun_wait_kind kind = HVDRUN_WAIT_TIMEOUT; /* the first waiter's */
    if (any_silent && rank(j, target)->streams[1].nwaited > 0)
      continue;
    waiters[0] = '\0';
    for (int r = 0; r < j->size; r++) {
      const struct hvdrun_stream *s = &rank(j, r)->streams[1];
      for (int k = 0; k < s->nwaited; k++) {
        if (s->waited_on[k] != target)
          continue;
        if (n == 0)
          kind = s->wait_kind;
        if (len < sizeof(waiters))
          len += (size_t)snprintf(waiters + len, sizeof(waiters) - len, "%s%d", n ? ", " : "", r);
        n++;
        break;
      }
    }
    if (n > 0)
      fprintf(stderr, "hvdrun: rank%s %s %s rank %d on host %s%s\n", n > 1 ? "s" : "", waiters,
              SAID[kind].verb, target, host_of(j, target), SAID[kind].tail);
  }
}

/* ==== the whole job ========================================================= */

int hvdrun_run(const struct hvdrun_options *o, const struct hvdrun_host *hosts, size_t nhosts,
               const struct hvdrun_slot *slots, int size) {
  struct job j;
  struct hvdrun_sup_hooks hooks = {&j, ended_cb, signal_cb, overdue_cb, failed_cb, tick_cb};
  hvd_status st, ready;
  size_t first;
  int digits = 1;

  memset(&j, 0, sizeof(j));
  j.o = o;
  j.hosts = hosts;
  j.nhosts = nhosts;
  j.slots = slots;
  j.size = size;
  j.remote = calloc(nhosts, sizeof(*j.remote));
  j.arrived = calloc((size_t)size, sizeof(*j.arrived));
  if (j.remote == NULL || j.arrived == NULL ||
      hvdrun_sup_add(&j.sup, (size_t)size, &first) != HVD_OK) {
    fprintf(stderr, "hvdrun: out of memory\n");
    hvdrun_sup_fini(&j.sup);
    free(j.remote);
    free(j.arrived);
    return 1;
  }
  for (size_t h = 0; h < nhosts; h++)
    j.remote[h] = !hvdrun_host_is_local(hosts[h].name);
  st = ready = hvdrun_sup_init(&j.sup, &hooks);
  if (st == HVD_OK)
    st = start_store(&j);
  for (int v = size - 1; v >= 10; v /= 10)
    digits++;
  for (int r = 0; r < size; r++) {
    hvd_status opened = hvdrun_proc_init(rank(&j, r), o, r, digits);
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
  hvdrun_sup_end_when_idle(&j.sup); /* the job is its ranks */
  if (ready == HVD_OK)
    hvdrun_sup_run(&j.sup);
  if (j.exit_code != 0)
    name_waited_on(&j);
  hvdrun_store_stop(&j.store);
  hvdrun_sup_fini(&j.sup);
  free(j.remote);
  free(j.arrived);
  return j.exit_code;
}
