/*
 * hvdrun's elastic driver: keeps a job running while workers fail and
 * hosts come and go (docs/elastic.md).
 *
 * DESIGN. The driver works in rounds. A round assigns ranks over the
 * usable hosts (discovered, not blacklisted), hosts that still run a
 * worker first and otherwise oldest first, so that rank 0 is a worker
 * that holds the latest state; it has min(slots, --max-np) ranks and at
 * least --min-np. Publishing round N writes every slot's
 * "rank,size,local_rank,local_size,cross_rank,cross_size" (-1s for a
 * worker that lost its place) under rank_and_size.<N> and the Horovod
 * scope rank_and_size, then elastic/round.<N> and elastic/latest, and only
 * then starts workers for the new slots (HVD_ELASTIC_ROUND=N): a slot is
 * (HOROVOD_HOSTNAME, HOROVOD_LOCAL_RANK), the same for its worker in every
 * round. A new round is needed when a worker fails (its host is
 * blacklisted and the host's other workers stopped), when a worker says
 * it left the round (elastic_ready/<slot>), or when discovery changes the
 * plan (announced as elastic/update.<k>, which rank 0's watch pushes to
 * every worker at its next commit). The round is published once every
 * live worker has left the current one (the barrier Horovod's
 * rank_and_size answers wait for) and there are enough slots; workers
 * that do not leave within --elastic-timeout are stopped. When a round is
 * abandoned before its workers met, the records that never came are
 * written as RDZV_RECORD_ABANDONED so that nobody waits for them. The job
 * succeeds when workers exit 0 (the first success ends new rounds; the
 * rest are waited for), and fails when every worker failed, when the
 * resets reach --reset-limit, or when --min-np slots are missing for
 * --elastic-timeout, each said in one line.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "elastic_driver.h"

enum {
  /* The longest the driver sleeps. What workers write to the scopes it
   * reads wakes it at once (scope watches); the timeouts it keeps (the
   * elastic timeout, a removed worker's grace, a pod's silence) are
   * seconds long. */
  TICK_MS = 250,
  LEAD_RENEW_MS = 500, /* a third or less of hvd-rendezvous's leadership lease */
  DISCOVERY_EVERY_MS = 1000,
  DISCOVERY_TIMEOUT_MS = 30000,
};

static int64_t ms_ns(int64_t ms) { return ms * 1000000; }

/* ==== stopping ============================================================= */

/* SIGTERM (SIGKILL after the grace) or SIGKILL now, through the supervisor. */
static void stop_worker(struct driver *d, struct worker *w, int sig) {
  w->stopped = true;
  if (w->proc < 0)
    w->running = false; /* a pod: no process to stop, it is just out */
  else if (sig == SIGKILL)
    hvdrun_sup_kill(&d->sup, (size_t)w->proc);
  else
    hvdrun_sup_stop(&d->sup, (size_t)w->proc);
}

static void stop_job(struct driver *d, int code, const char *why) {
  if (d->stopping)
    return;
  if (why != NULL)
    driver_say(d, "%s", why);
  d->stopping = true;
  d->exit_code = code;
  for (size_t i = 0; i < d->nw; i++)
    stop_worker(d, &d->w[i], SIGTERM);
}

static size_t live_workers(const struct driver *d) {
  size_t n = 0;
  for (size_t i = 0; i < d->nw; i++)
    n += worker_live(&d->w[i]);
  return n;
}

struct worker *driver_live_worker(struct driver *d, const char *host, size_t host_len,
                                  int local_rank) {
  for (size_t i = 0; i < d->nw; i++) {
    struct worker *w = &d->w[i];
    if (worker_live(w) && w->local_rank == local_rank && strlen(w->host) == host_len &&
        memcmp(w->host, host, host_len) == 0)
      return w;
  }
  return NULL;
}

static struct worker *find_worker(struct driver *d, const char *host, int local_rank) {
  return driver_live_worker(d, host, strlen(host), local_rank);
}

/* ==== the store's scopes =================================================== */

void driver_say(const struct driver *d, const char *fmt, ...) {
  char line[HVD_ERROR_MESSAGE_MAX + 256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s\n", d->name, line);
}

/* The transport scopes of the latest round (round n), through fn. */
static void for_each_scope(const struct driver *d, uint64_t n,
                           void (*fn)(void *, const char *, size_t)) {
  hvdrun_each_scope(d->plan_hosts, d->plan, d->plan_size, n, fn, (void *)d);
}

static void plan_scope(void *arg, const char *scope, size_t size) {
  driver_plan_scope(arg, scope, size);
}

/* A round whose ranks never all met: the missing records say so. */
static void abandon_scope(void *arg, const char *scope, size_t size) {
  const struct driver *d = arg;
  if (driver_scope_met(d, scope))
    return; /* everybody met there */
  for (size_t r = 0; r < size; r++) {
    char key[24];
    snprintf(key, sizeof(key), "%zu", r);
    driver_put_new(d, scope, key, RDZV_RECORD_ABANDONED);
  }
  driver_scope_filled(d, scope, size);
}

/* ==== planning a round ===================================================== */

/* Whether a live worker of the host had a place in the latest round, so
 * holds the training state. A worker that has not been in a round (a pod
 * just restarted under its old name) holds none, even on an old host. */
static bool host_holds_state(struct driver *d, const char *host) {
  for (size_t i = 0; i < d->nw; i++) {
    if (worker_live(&d->w[i]) && d->w[i].assigned && strcmp(d->w[i].host, host) == 0)
      return true;
  }
  return false;
}

/* The next round's hosts and slots; HVD_ERR_NOT_FOUND when there are fewer
 * than need slots (*have says how many). */
static hvd_status make_plan(struct driver *d, int need, struct hvdrun_host **hosts, size_t *nhosts,
                            struct hvdrun_slot **slots, int *size, int *have) {
  size_t cap = d->view.n + 1, n, k = 0;
  struct hvdrun_host *usable = calloc(cap, sizeof(*usable));
  struct hvdrun_host *ordered = calloc(cap, sizeof(*ordered));
  int total = 0, np;
  hvd_status st;

  if (usable == NULL || ordered == NULL) {
    free(usable);
    free(ordered);
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  }
  n = hvdrun_hosts_view_usable(&d->view, usable, cap);
  /* Hosts with a worker that holds the state first: rank 0 among them. */
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      if (host_holds_state(d, usable[i].name) == (pass == 0))
        ordered[k++] = usable[i];
    }
  }
  for (size_t i = 0; i < n; i++)
    total += usable[i].slots;
  free(usable);
  *have = total;
  np = total;
  if (d->o->max_np > 0 && np > d->o->max_np)
    np = d->o->max_np;
  if (np > HVDRUN_MAX_RANKS)
    np = HVDRUN_MAX_RANKS;
  if (np < need || np == 0) {
    free(ordered);
    return HVD_ERR_NOT_FOUND;
  }
  st = hvdrun_assign(ordered, n, np, slots, size);
  if (st != HVD_OK) {
    free(ordered);
    return st;
  }
  *hosts = ordered;
  *nhosts = n;
  return HVD_OK;
}

/* Whether the plan gives every slot the place the latest round gave it. */
static bool same_plan(const struct driver *d, const struct hvdrun_host *hosts,
                      const struct hvdrun_slot *slots, int size) {
  if (!d->published || size != d->plan_size)
    return false;
  for (int r = 0; r < size; r++) {
    const struct hvdrun_slot *a = &slots[r], *b = &d->plan[r];
    if (strcmp(hosts[a->host].name, d->plan_hosts[b->host].name) != 0 ||
        a->local_rank != b->local_rank || a->local_size != b->local_size ||
        a->cross_rank != b->cross_rank || a->cross_size != b->cross_size)
      return false;
  }
  return true;
}

/* ==== publishing a round and starting its new workers ========================= */

struct worker *driver_add_worker(struct driver *d) {
  struct worker *w;
  if (hvd_array_reserve(&d->w, &d->capw, d->nw + 1, sizeof(*d->w), 16) != HVD_OK)
    return NULL;
  w = &d->w[d->nw];
  memset(w, 0, sizeof(*w));
  w->label = (int)d->nw;
  w->proc = -1;
  w->left = -1;
  d->nw++;
  return w;
}

static hvd_status start_worker(struct driver *d, const struct hvdrun_slot *s, const char *host) {
  struct hvdrun_env vars = {0};
  struct worker *w = driver_add_worker(d);
  struct hvdrun_proc *p;
  size_t proc;
  hvd_status st;

  if (w == NULL || hvdrun_sup_add(&d->sup, 1, &proc) != HVD_OK)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  snprintf(w->host, sizeof(w->host), "%s", host);
  w->local_rank = s->local_rank;
  w->assigned = true;
  w->proc = (long)proc;
  p = hvdrun_sup_proc(&d->sup, proc);
  st = hvdrun_proc_init(p, d->o, w->label, d->digits);
  if (st == HVD_OK)
    st = hvdrun_store_vars(d->o, &d->rdzv, &vars);
#define SET(...) \
  if (st == HVD_OK) \
  st = hvdrun_env_set(&vars, __VA_ARGS__)
  SET("HOROVOD_ELASTIC", "1");
  SET("HVD_ELASTIC_ROUND", "%llu", (unsigned long long)d->round);
  SET("HVD_ELASTIC_UPDATES", "%llu", (unsigned long long)d->updates);
  SET(hvd_setting_name(HVD_SET_ELASTIC_TIMEOUT), "%d", d->o->elastic_timeout_s);
#undef SET
  if (st == HVD_OK)
    st = hvdrun_slot_vars(host, s, &vars);
  if (st == HVD_OK)
    st = hvdrun_proc_start(p, d->o, host, !hvdrun_host_is_local(host), &vars, w->label);
  hvdrun_env_fini(&vars);
  if (st != HVD_OK)
    return hvd_error_prefix("starting a worker on %s", host);
  w->running = true;
  if (d->o->verbose)
    driver_say(d, "worker %d started on %s[%d] as rank %d of %d (round %llu)", w->label, host,
               s->local_rank, s->rank, s->size, (unsigned long long)d->round);
  return HVD_OK;
}

static void assignment_text(const struct hvdrun_slot *s, char *out, size_t size) {
  if (s == NULL)
    snprintf(out, size, "-1,-1,-1,-1,-1,-1");
  else
    snprintf(out, size, "%d,%d,%d,%d,%d,%d", s->rank, s->size, s->local_rank, s->local_size,
             s->cross_rank, s->cross_size);
}

/* Makes the plan the next round: store first, then the new workers. */
static hvd_status publish(struct driver *d, struct hvdrun_host *hosts, size_t nhosts,
                          struct hvdrun_slot *slots, int size) {
  char scope[48], key[HVDRUN_HOST_MAX + 16], value[96];
  uint64_t n = d->published ? d->round + 1 : 0;
  hvd_status st = HVD_OK;

  free(d->plan);
  free(d->plan_hosts);
  d->plan = slots;
  d->plan_hosts = hosts;
  d->plan_size = size;
  d->round = n;
  snprintf(scope, sizeof(scope), "rank_and_size.%llu", (unsigned long long)n);
  driver_delete_scope(d, "rank_and_size");
  for (size_t i = 0; i < d->nw; i++)
    d->w[i].assigned = false;
  for (int r = 0; r < size; r++) {
    const char *host = hosts[slots[r].host].name;
    struct worker *w = find_worker(d, host, slots[r].local_rank);
    if (w != NULL)
      w->assigned = true;
    snprintf(key, sizeof(key), "%s:%d", host, slots[r].local_rank);
    assignment_text(&slots[r], value, sizeof(value));
    driver_put(d, scope, key, value);
    driver_put(d, "rank_and_size", key, value);
  }
  for (size_t i = 0; i < d->nw; i++) {
    struct worker *w = &d->w[i];
    if (!worker_live(w) || w->assigned)
      continue;
    w->removed_at = hvd_now_ns();
    snprintf(key, sizeof(key), "%s:%d", w->host, w->local_rank);
    assignment_text(NULL, value, sizeof(value));
    driver_put(d, scope, key, value);
    driver_put(d, "rank_and_size", key, value);
    if (d->o->verbose)
      driver_say(d, "worker %d (%s) has no place in round %llu", w->label, key,
                 (unsigned long long)n);
  }
  for_each_scope(d, n, plan_scope);
  /* latest before round.<n>: a worker that sees round.<n> reads latest next. */
  snprintf(value, sizeof(value), "%llu", (unsigned long long)n);
  driver_put(d, "elastic", "latest", value);
  snprintf(scope, sizeof(scope), "round.%llu", (unsigned long long)n);
  snprintf(value, sizeof(value), "%llu", (unsigned long long)d->updates);
  driver_put(d, "elastic", scope, value);
  d->published = true;
  d->pending = false;
  for (int r = 0; r < size && st == HVD_OK && !d->pods; r++) { /* pods are there */
    const char *host = hosts[slots[r].host].name;
    if (find_worker(d, host, slots[r].local_rank) == NULL)
      st = start_worker(d, &slots[r], host);
  }
  driver_say(d, "round %llu: %d workers on %zu hosts", (unsigned long long)n, size, nhosts);
  return st;
}

/* ==== events =============================================================== */

static void need_round(struct driver *d) {
  if (d->pending || !d->published)
    return;
  d->pending = true;
  d->pending_since = hvd_now_ns();
  for_each_scope(d, d->round, abandon_scope);
  /* Horovod's GET /rank_and_size/<slot> now waits for the next round. */
  driver_delete_scope(d, "rank_and_size");
}

static void on_failure(struct driver *d, struct worker *w, const char *why, int code) {
  d->last_failure = code;
  if (d->pods) {
    /* A pod that failed comes back (if it does) as a new registration:
     * nothing to blacklist, and its pod's other workers are left alone. */
    driver_say(d, "worker %d (pod %s:%d) %s", w->label, w->host, w->local_rank, why);
    stop_worker(d, w, SIGTERM);
    need_round(d);
    return;
  }
  driver_say(d, "worker %d on %s[%d] %s; blacklisting host %s", w->label, w->host, w->local_rank,
             why, w->host);
  hvdrun_hosts_view_blacklist(&d->view, w->host, hvd_now_ns());
  for (size_t i = 0; i < d->nw; i++) {
    if (worker_live(&d->w[i]) && strcmp(d->w[i].host, w->host) == 0)
      stop_worker(d, &d->w[i], SIGTERM);
  }
  need_round(d);
}

void driver_worker_ended(struct driver *d, struct worker *w, const char *why, int code) {
  w->running = false;
  if (d->o->verbose && w->proc >= 0)
    driver_say(d, "worker %d on %s[%d] (pid %d) %s", w->label, w->host, w->local_rank,
               (int)hvdrun_sup_proc(&d->sup, (size_t)w->proc)->pid, why);
  else if (d->o->verbose && w->assigned && code == 0) /* a pod's failure is said below */
    driver_say(d, "worker %d (pod %s:%d) %s", w->label, w->host, w->local_rank, why);
  if (w->stopped || !w->assigned || d->stopping)
    return; /* stopped by the driver, or had no place any more */
  if (code == 0) {
    d->finishing = true;
    return;
  }
  if (d->finishing) {
    if (d->finish_code == 0)
      d->finish_code = code;
    driver_say(d, "worker %d on %s[%d] %s after others finished", w->label, w->host,
               w->local_rank, why);
    return;
  }
  on_failure(d, w, why, code);
}

/* A worker says it left a round: elastic_ready/<host>:<lr> = N. */
static void on_ready(struct driver *d, const char *key, const char *value, size_t len) {
  const char *colon = strrchr(key, ':');
  int64_t left, lr;
  if (colon == NULL || !hvd_parse_int64(colon + 1, strlen(colon + 1), &lr) ||
      !hvd_parse_int64(value, len, &left))
    return;
  for (size_t i = 0; i < d->nw; i++) {
    struct worker *w = &d->w[i];
    if (w->local_rank == lr && (size_t)(colon - key) == strlen(w->host) &&
        memcmp(w->host, key, strlen(w->host)) == 0 && left > w->left)
      w->left = left;
  }
}

static const char *change_name(int change) {
  return change == HVDRUN_HOSTS_ADDED     ? "added"
         : change == HVDRUN_HOSTS_REMOVED ? "removed"
                                          : "mixed";
}

/* Runs discovery (or takes the fixed hosts once) and announces a change
 * that alters the plan. */
static hvd_status discover(struct driver *d) {
  struct hvdrun_host *found = NULL, *hosts = NULL;
  struct hvdrun_slot *slots = NULL;
  size_t n = 0, nhosts = 0;
  int change = HVDRUN_HOSTS_SAME, size = 0, have = 0;
  char *out = NULL;
  size_t len = 0;
  hvd_status st;

  /* Pods' heartbeats are read at every tick: reading the store is cheap. */
  d->next_discovery = hvd_now_ns() + (d->pods ? 0 : ms_ns(DISCOVERY_EVERY_MS));
  if (d->pods) {
    st = pods_discover(d, &found, &n);
    if (st == HVD_OK)
      st = hvdrun_hosts_view_update(&d->view, found, n, hvd_now_ns(), &change);
    free(found);
  } else if (d->fixed != NULL) {
    st = hvdrun_hosts_view_update(&d->view, d->fixed, d->nfixed, hvd_now_ns(), &change);
  } else {
    int64_t timeout = (int64_t)d->o->elastic_timeout_s * 1000;
    st = hvdrun_run_discovery(d->o->discovery_script,
                              timeout < DISCOVERY_TIMEOUT_MS ? timeout : DISCOVERY_TIMEOUT_MS,
                              &out, &len);
    if (st == HVD_OK)
      st = hvdrun_parse_discovery(out, len, d->o->slots_per_host, &found, &n);
    if (st == HVD_OK)
      st = hvdrun_hosts_view_update(&d->view, found, n, hvd_now_ns(), &change);
    free(out);
    free(found);
  }
  if (st != HVD_OK) {
    if (!d->discovered_once)
      return st;
    driver_say(d, "host discovery failed (retrying): %s", hvd_last_error_message());
    return HVD_OK;
  }
  d->discovered_once = true;
  if (change == HVDRUN_HOSTS_SAME || !d->published || d->pending || d->finishing)
    return HVD_OK;
  if (make_plan(d, d->o->min_np, &hosts, &nhosts, &slots, &size, &have) != HVD_OK)
    return HVD_OK; /* not enough slots for a round: nothing to announce */
  if (!same_plan(d, hosts, slots, size)) {
    char key[32];
    d->updates++;
    snprintf(key, sizeof(key), "update.%llu", (unsigned long long)d->updates);
    driver_put(d, "elastic", key, change_name(change));
    driver_say(d, "%s %s: the workers reset at their next commit", d->pods ? "pods" : "hosts",
               change_name(change));
    need_round(d);
  }
  free(hosts);
  free(slots);
  return HVD_OK;
}

/* Whether a worker that holds the state keeps a place (it becomes rank 0). */
static bool keeps_a_worker(struct driver *d, const struct hvdrun_host *hosts,
                           const struct hvdrun_slot *slots, int size) {
  for (int r = 0; r < size; r++) {
    const struct worker *w = find_worker(d, hosts[slots[r].host].name, slots[r].local_rank);
    if (w != NULL && w->assigned)
      return true;
  }
  return false;
}

/* Publishes the next round once every live worker left the current one. */
static void advance(struct driver *d) {
  int64_t now = hvd_now_ns(), timeout = (int64_t)d->o->elastic_timeout_s * 1000000000;
  struct hvdrun_host *hosts = NULL;
  struct hvdrun_slot *slots = NULL;
  size_t nhosts = 0;
  int size = 0, have = 0, need;
  bool settled = true;
  hvd_status st;
  char why[256];

  for (size_t i = 0; i < d->nw; i++) {
    struct worker *w = &d->w[i];
    if (!worker_live(w))
      continue;
    if (d->published && w->assigned && w->left >= (int64_t)d->round)
      need_round(d); /* a worker hit a failure hvdrun did not see */
    if (!w->assigned && w->removed_at > 0 &&
        now - w->removed_at > (int64_t)HVDRUN_GRACE_S * 1000000000)
      stop_worker(d, w, SIGTERM); /* removed, and still running */
  }
  if (d->published && !d->pending)
    return;
  for (size_t i = 0; i < d->nw && d->published; i++) {
    struct worker *w = &d->w[i];
    if (worker_live(w) && w->assigned && w->left < (int64_t)d->round)
      settled = false;
  }
  if (!settled) {
    if (now - d->pending_since < timeout)
      return;
    for (size_t i = 0; i < d->nw; i++) {
      struct worker *w = &d->w[i];
      if (worker_live(w) && w->assigned && w->left < (int64_t)d->round) {
        snprintf(why, sizeof(why), "did not leave round %llu within --elastic-timeout (%d s)",
                 (unsigned long long)d->round, d->o->elastic_timeout_s);
        stop_worker(d, w, SIGTERM);
        on_failure(d, w, why, 1);
      }
    }
  }
  if (d->published && live_workers(d) == 0 && d->pods && !d->afresh) {
    /* Pods that come back (restarted, or a new job's) start it again. */
    driver_say(d, "every worker is gone; the job starts again once %d pods have registered",
               d->o->np);
    d->afresh = true;
  }
  if (d->published && live_workers(d) == 0 && !d->pods) {
    snprintf(why, sizeof(why),
             "every worker has failed (or ran on a host blacklisted for a failure); stopping "
             "the job");
    stop_job(d, d->last_failure != 0 ? d->last_failure : 1, why);
    return;
  }
  if (d->published && d->o->reset_limit >= 0 && d->resets >= d->o->reset_limit) {
    snprintf(why, sizeof(why),
             "the job has reset %d times, the limit (--reset-limit %d); stopping the job",
             d->resets, d->o->reset_limit);
    stop_job(d, d->last_failure != 0 ? d->last_failure : 1, why);
    return;
  }
  need = d->published && !d->afresh ? d->o->min_np : d->o->np;
  st = make_plan(d, need, &hosts, &nhosts, &slots, &size, &have);
  if (st == HVD_ERR_NOT_FOUND) {
    if (now - d->pending_since >= timeout && d->pods) {
      /* Pods may still come: say so, and wait on. */
      driver_say(d, "still waiting after %d s (--elastic-timeout) for at least %d pods; %d "
                    "are registered",
                 d->o->elastic_timeout_s, need, have);
      d->pending_since = now;
    } else if (now - d->pending_since >= timeout) {
      snprintf(why, sizeof(why),
               "timed out after %d s (--elastic-timeout) waiting for at least %d slots; %d are "
               "available; stopping the job",
               d->o->elastic_timeout_s, need, have);
      stop_job(d, 1, why);
    }
    return;
  }
  if (st == HVD_OK && d->published && !d->afresh && !keeps_a_worker(d, hosts, slots, size)) {
    if (d->pods) {
      driver_say(d, "no worker of round %llu has a place in the next round; the job starts "
                    "again from its beginning",
                 (unsigned long long)d->round);
      d->afresh = true;
    } else {
      free(hosts);
      free(slots);
      snprintf(why, sizeof(why),
               "no worker of round %llu has a place in the next round (its hosts are gone), so "
               "the training state cannot be passed on; stopping the job",
               (unsigned long long)d->round);
      stop_job(d, 1, why);
      return;
    }
  }
  if (st == HVD_OK && d->published && !d->afresh)
    d->resets++;
  if (st == HVD_OK)
    d->afresh = false;
  if (st == HVD_OK)
    st = publish(d, hosts, nhosts, slots, size);
  if (st != HVD_OK) {
    snprintf(why, sizeof(why), "%s", hvd_last_error_message());
    stop_job(d, 1, why);
  }
}

/* ==== the policy over the supervisor ======================================= */

static struct worker *worker_of(struct driver *d, size_t proc) {
  for (size_t i = 0; i < d->nw; i++) {
    if (d->w[i].proc == (long)proc)
      return &d->w[i];
  }
  return NULL;
}

static void ended_cb(void *arg, size_t proc, const char *why, int code) {
  struct driver *d = arg;
  struct worker *w = worker_of(d, proc);
  if (w != NULL)
    driver_worker_ended(d, w, why, code);
}

static void signal_cb(void *arg, int signo) {
  struct driver *d = arg;
  char why[96];

  if (!d->stopping && d->pods) { /* the store stops, as a plain one does */
    snprintf(why, sizeof(why), "got %s; shutting down", strsignal(signo));
    stop_job(d, 0, why);
  } else if (!d->stopping) {
    snprintf(why, sizeof(why), "got %s; stopping the job", strsignal(signo));
    stop_job(d, 128 + signo, why);
  } else {
    for (size_t i = 0; i < d->nw; i++)
      stop_worker(d, &d->w[i], SIGKILL);
  }
}

static void overdue_cb(void *arg, size_t proc) {
  struct driver *d = arg;
  struct worker *w = worker_of(d, proc);
  if (w != NULL)
    driver_say(d, "worker %d still running %d s after SIGTERM: sending SIGKILL", w->label,
               HVDRUN_GRACE_S);
}

static void failed_cb(void *arg) { stop_job(arg, 1, "poll failed"); }

/* Discovery when due, the workers that left the round, the next round. */
static void tick(struct driver *d) {
  if (d->stopping)
    return;
  if (hvd_now_ns() >= d->next_discovery && discover(d) != HVD_OK) {
    char why[HVD_ERROR_MESSAGE_MAX + 32];
    snprintf(why, sizeof(why), "host discovery: %s", hvd_last_error_message());
    stop_job(d, 1, why);
    return;
  }
  driver_scope_each(d, "elastic_ready", on_ready, d);
  if (!d->finishing)
    advance(d);
}

/* After a success, the job ends with the last worker; pods' store serves on. */
static void check_finished(struct driver *d) {
  if (d->stopping || !d->finishing || live_workers(d) > 0)
    return;
  if (d->pods && !d->finished) {
    /* The store serves on: pods that come now are told the job is over. */
    driver_say(d, "the job has finished (round %llu); new pods are not admitted",
               (unsigned long long)d->round);
    d->finished = true;
  } else if (!d->pods) {
    d->stopping = true; /* what hvdrun stopped may still be on its way out */
    d->exit_code = d->finish_code;
  }
}

/* A leader in etcd renews its leadership each turn; one that lapsed
 * stops driving at once: another candidate leads by now. */
static void renew_lead(struct driver *d) {
  if (!d->leading || d->stopping || hvd_now_ns() < d->renew_at)
    return;
  d->renew_at = hvd_now_ns() + ms_ns(LEAD_RENEW_MS);
  if (rdzv_client_lead_renew(d->client) == HVD_OK)
    return;
  d->lost_lead = true;
  driver_say(d, "%s; standing by", hvd_last_error_message());
  d->stopping = true;
}

static int64_t tick_cb(void *arg) {
  struct driver *d = arg;
  int64_t next = hvd_now_ns() + ms_ns(TICK_MS);
  bool quiet = true;

  renew_lead(d);
  tick(d);
  check_finished(d);
  if (d->stopping || (d->finishing && !d->pods))
    hvdrun_sup_end_when_idle(&d->sup);
  for (size_t i = 0; i < d->nwatches && !d->stopping; i++)
    quiet = driver_watch_arm(d, &d->watches[i]) && quiet;
  if (!quiet)
    return hvd_now_ns();
  return !d->pods && d->next_discovery < next ? d->next_discovery : next;
}

/* ==== the whole job ========================================================= */

static hvd_status start(struct driver *d) {
  struct hvdrun_store_config cfg = {0};
  const char **remote = calloc(d->view.n + 1, sizeof(*remote));
  int most = d->o->max_np > d->o->np ? d->o->max_np : d->o->np;
  hvd_status st;

  if (remote == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  for (int v = most - 1; v >= 10; v /= 10)
    d->digits++;
  /* Where ranks reach the store: chosen from the first hosts (use
   * --network-interface for a job that starts here and grows elsewhere). */
  for (size_t h = 0; h < d->view.n; h++) {
    if (!hvdrun_host_is_local(d->view.hosts[h].name))
      remote[cfg.nremote++] = d->view.hosts[h].name;
  }
  /* With --network-interface, its address even when every first host is
   * this one: hosts found later reach the store there. */
  if (cfg.nremote == 0 && d->o->iface != NULL)
    remote[cfg.nremote++] = "127.0.0.1";
  cfg.remote = remote;
  cfg.hosts_may_join = d->fixed == NULL;
  cfg.blocking_scope = "rank_and_size"; /* Horovod's GET waits for the next round */
  st = hvdrun_store_start(d->o, &cfg, &d->rdzv);
  free(remote);
  if (st != HVD_OK)
    return st;
  if (d->rdzv.server == NULL) { /* etcd */
    d->client = d->rdzv.client;
    if (d->o->verbose)
      driver_say(d, "elastic job; rendezvous in %s", d->rdzv.url);
    return HVD_OK;
  }
  d->store = rdzv_server_store(d->rdzv.server);
  if (d->o->verbose)
    driver_say(d, "elastic job; rendezvous store on port %d (ranks use %s:%d)", d->rdzv.port,
               d->rdzv.addr, d->rdzv.port);
  return HVD_OK;
}

static void driver_fini(struct driver *d) {
  hvdrun_sup_fini(&d->sup);
  free(d->w);
  free(d->plan);
  free(d->plan_hosts);
  hvdrun_hosts_view_fini(&d->view);
}

int hvdrun_run_elastic(const struct hvdrun_options *o, const struct hvdrun_host *hosts,
                       size_t nhosts) {
  struct driver d;
  struct hvdrun_sup_hooks hooks = {&d, ended_cb, signal_cb, overdue_cb, failed_cb, tick_cb};
  hvd_status st;
  int code = 1;

  memset(&d, 0, sizeof(d));
  d.o = o;
  d.name = "hvdrun";
  d.digits = 1;
  if (o->discovery_script == NULL) {
    d.fixed = hosts;
    d.nfixed = nhosts;
  }
  hvdrun_hosts_view_init(&d.view, o->cooldown_min_s, o->cooldown_max_s);
  st = hvdrun_sup_init(&d.sup, &hooks); /* before the store's threads */
  if (st == HVD_OK && !driver_watches_init(&d, (const char *const[]){"elastic_ready"}, 1))
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  if (st == HVD_OK && (st = discover(&d)) != HVD_OK)
    hvd_error_prefix("host discovery");
  if (st == HVD_OK)
    st = start(&d);
  d.pending_since = hvd_now_ns(); /* the first round waits for -np slots as long */
  if (st != HVD_OK) {
    driver_say(&d, "%s", hvd_last_error_message());
  } else {
    hvdrun_sup_run(&d.sup);
    code = d.exit_code;
  }
  driver_watches_retire(&d);
  hvdrun_store_stop(&d.rdzv);
  driver_fini(&d);
  return code;
}

int hvdrun_run_elastic_pods(const struct hvdrun_options *o, struct rdzv_server *server,
                            int pod_timeout_s) {
  return driver_run_pods(o, server, NULL, NULL, pod_timeout_s, NULL);
}

int driver_run_pods(const struct hvdrun_options *o, struct rdzv_server *server,
                    struct rdzv_client *client, const char *url, int pod_timeout_s,
                    bool *lost_lead) {
  struct driver d;
  struct hvdrun_sup_hooks hooks = {&d, ended_cb, signal_cb, overdue_cb, failed_cb, tick_cb};
  int code = 1;

  memset(&d, 0, sizeof(d));
  d.o = o;
  d.name = "hvd-rendezvous";
  d.pods = true;
  d.pod_timeout_s = pod_timeout_s;
  d.digits = 1;
  d.store = server != NULL ? rdzv_server_store(server) : NULL;
  d.client = client;
  d.rdzv.url = (char *)url; /* not ours: driver_fini leaves rdzv alone */
  d.leading = client != NULL;
  hvdrun_hosts_view_init(&d.view, 0, 0);
  if (client != NULL)
    driver_resume(&d);
  d.pending_since = hvd_now_ns();
  if (hvdrun_sup_init(&d.sup, &hooks) != HVD_OK) {
    driver_say(&d, "%s", hvd_last_error_message());
  } else if (!driver_watches_init(&d, (const char *const[]){"elastic_ready", "elastic_pods"}, 2)) {
    driver_say(&d, "out of memory");
  } else {
    hvdrun_sup_run(&d.sup);
    code = d.exit_code;
  }
  driver_watches_retire(&d);
  if (lost_lead != NULL)
    *lost_lead = d.lost_lead;
  rdzv_scope_view_fini(&d.admitted);
  driver_fini(&d);
  return code;
}
