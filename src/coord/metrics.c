/*
 * Metrics of this rank: counters and latency histograms, and the thread
 * that sends them to the job's store (docs/observability.md).
 *
 * DESIGN. Everything counted on the hot path is counted by the loop's
 * driver, one thread at a time (the drive lock orders them), so a counter
 * is a relaxed load and store of its own: plain moves, no lock, no atomic
 * read-modify-write, no allocation. Any thread may read them (relaxed
 * loads); a reader sees each counter whole, and builds a histogram's
 * cumulative buckets and count from the same loads, so what it prints is
 * consistent even while the driver counts. The rare counts from other
 * threads (errors, resets) are atomic additions.
 * Sending is a thread of its own at the lowest priority, never the
 * background thread: an HTTP call to a slow store must not delay a
 * collective. It wakes every HVD_METRICS_PUSH_MS, formats the snapshot
 * (a few KiB of text) into a buffer it reuses and PUTs it as
 * hvd_metrics/<rank> over its own keep-alive connection: at 1,000 ranks
 * that is 1,000 small PUTs a second to one store, well within what its
 * event loop serves. The store's GET /metrics merges the snapshots
 * (rendezvous/server_metrics.c). An etcd rendezvous gets none: nothing
 * serves them there yet, and a write a second per rank into etcd's log
 * is not negligible.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coord.h"

enum {
  SIZES = 5,    /* size classes of a collective's bytes */
  BUCKETS = 13, /* latency bounds below; one more for +Inf */
  TYPES = COORD_REDUCESCATTER + 1,
  SNAPSHOT_MAX = 256 * 1024,
};

/* Half decades from 10 us to 10 s: few lines per histogram in a snapshot. */
static const int64_t bounds_us[BUCKETS] = {10,     30,      100,     300,     1000,
                                           3000,   10000,   30000,   100000,  300000,
                                           1000000, 3000000, 10000000};
static const uint64_t size_max[SIZES - 1] = {1024, 64 * 1024, 1024 * 1024, 16 * 1024 * 1024};
static const char *const size_names[SIZES] = {"1KiB", "64KiB", "1MiB", "16MiB", "larger"};
static const char *const path_names[COORD_PATH_COUNT] = {"",     "local",  "shm", "tcp",
                                                         "nccl", "inline", "lane"};

struct histogram {
  _Atomic uint64_t counts[BUCKETS + 1]; /* per bucket, not cumulative */
  _Atomic uint64_t sum_ns;
};

/* The process's counters (see the top of the file for who writes them). */
static struct {
  _Atomic uint64_t ops[TYPES][COORD_PATH_COUNT];
  _Atomic uint64_t bytes[TYPES][COORD_PATH_COUNT];
  _Atomic uint64_t tensors[TYPES];
  _Atomic uint64_t fused_tensors;
  _Atomic uint64_t failed_tensors;
  _Atomic uint64_t cache_hits, cache_misses;
  _Atomic uint64_t stall_warnings;
  _Atomic uint64_t job_errors;
  _Atomic uint64_t resets;
  struct histogram wait;                  /* taken from the queue -> the collective starts */
  struct histogram latency[TYPES][SIZES]; /* the collective on this rank */
} g_m;

/* The driver's addition: it alone writes these counters. */
static inline void bump(_Atomic uint64_t *c, uint64_t n) {
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                        memory_order_relaxed);
}

static inline uint64_t get(_Atomic uint64_t *c) {
  return atomic_load_explicit(c, memory_order_relaxed);
}

static void observe(struct histogram *h, int64_t ns) {
  int b = 0;
  if (ns < 0)
    ns = 0;
  while (b < BUCKETS && ns > bounds_us[b] * 1000)
    b++;
  bump(&h->counts[b], 1);
  bump(&h->sum_ns, (uint64_t)ns);
}

static int size_class(uint64_t bytes) {
  int c = 0;
  while (c < SIZES - 1 && bytes > size_max[c])
    c++;
  return c;
}

/* Whether the set's members share one host (looked at once per set). */
static int set_path(struct coord_state *s, struct coord_set *set) {
  if (set->path == 0) {
    const char *first = set->comm != NULL ? net_comm_hostname(set->comm, 0) : NULL;
    bool one_host = first != NULL;
    for (int r = 1; r < set->size && one_host; r++) {
      const char *h = net_comm_hostname(set->comm, r);
      one_host = h != NULL && strcmp(h, first) == 0;
    }
    if (set->size <= 1)
      set->path = COORD_PATH_LOCAL;
    else
      set->path = one_host && ops_ctx_tunables(s->ops)->shm ? COORD_PATH_SHM : COORD_PATH_TCP;
  }
  return set->path;
}

/* The bytes a response moves through this rank's output. */
static uint64_t response_bytes(const struct coord_response *r, struct coord_entry *const *entries) {
  uint64_t elems = 0, esize = hvd_dtype_size((hvd_dtype)r->dtype);
  switch (r->type) {
  case COORD_ALLREDUCE:
  case COORD_BROADCAST:
  case COORD_REDUCESCATTER:
  case COORD_ALLGATHER:
    for (uint32_t i = 0; i < r->ncounts; i++)
      elems += r->counts[i] > 0 ? (uint64_t)r->counts[i] : 0;
    return elems * esize;
  case COORD_ALLTOALL:
    if (entries[0] == NULL)
      return 0;
    elems = 1;
    for (int d = 0; d < entries[0]->req.ndims; d++)
      elems *= (uint64_t)(entries[0]->req.shape[d] > 0 ? entries[0]->req.shape[d] : 0);
    return elems * esize;
  default:
    return 0;
  }
}

void coord_metrics_op(struct coord_state *s, struct coord_set *set,
                      const struct coord_response *r, struct coord_entry *const *entries,
                      int64_t start, int64_t end, bool ok) {
  int path;
  uint64_t bytes;

  if (r->type == COORD_ERROR)
    bump(&g_m.failed_tensors, r->ntensors);
  if (r->type >= TYPES || r->type == COORD_JOIN)
    return;
  if (r->data_len > 0)
    path = COORD_PATH_INLINE;
  else if (r->device != HVD_DEVICE_CPU && !s->cfg.gpu_host_staged)
    path = COORD_PATH_NCCL;
  else
    path = set_path(s, set);
  bytes = response_bytes(r, entries);
  bump(&g_m.ops[r->type][path], 1);
  bump(&g_m.bytes[r->type][path], bytes);
  bump(&g_m.tensors[r->type], r->ntensors);
  if (r->ntensors > 1)
    bump(&g_m.fused_tensors, r->ntensors);
  if (!ok)
    bump(&g_m.failed_tensors, r->ntensors);
  for (uint32_t i = 0; i < r->ntensors; i++) {
    if (entries[i] != NULL) { /* the earliest taken is the first */
      observe(&g_m.wait, start - entries[i]->taken_ns);
      break;
    }
  }
  if (end >= 0)
    observe(&g_m.latency[r->type][size_class(bytes)], end - start);
}

void coord_metrics_lane(const struct coord_entry *e, int64_t now) {
  uint64_t bytes = (uint64_t)e->req.inline_len;
  bump(&g_m.ops[COORD_ALLREDUCE][COORD_PATH_LANE], 1);
  bump(&g_m.bytes[COORD_ALLREDUCE][COORD_PATH_LANE], bytes);
  bump(&g_m.tensors[COORD_ALLREDUCE], 1);
  observe(&g_m.latency[COORD_ALLREDUCE][size_class(bytes)], now - e->taken_ns);
}

void coord_metrics_cache(bool hit) { bump(hit ? &g_m.cache_hits : &g_m.cache_misses, 1); }

void coord_metrics_stalls(int tensors) {
  atomic_fetch_add_explicit(&g_m.stall_warnings, (uint64_t)tensors, memory_order_relaxed);
}

void coord_metrics_job_error(void) {
  atomic_fetch_add_explicit(&g_m.job_errors, 1, memory_order_relaxed);
}

void coord_metrics_reset(void) { atomic_fetch_add_explicit(&g_m.resets, 1, memory_order_relaxed); }

/* ==== the exposition ==================================================================== */

static void family(struct hvd_buf *b, const char *name, const char *type, const char *help) {
  hvd_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void histogram_lines(struct hvd_buf *b, const char *name, const char *labels,
                            struct histogram *h) {
  uint64_t counts[BUCKETS + 1], total = 0, sum = get(&h->sum_ns);
  const char *sep = labels[0] != '\0' ? "," : "";

  for (int i = 0; i <= BUCKETS; i++)
    counts[i] = get(&h->counts[i]);
  for (int i = 0; i <= BUCKETS; i++) {
    total += counts[i];
    if (i < BUCKETS)
      hvd_buf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep,
                     (double)bounds_us[i] / 1e6, (unsigned long long)total);
    else
      hvd_buf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                     (unsigned long long)total);
  }
  hvd_buf_printf(b, "%s_sum%s%s%s %.9f\n", name, labels[0] ? "{" : "", labels,
                 labels[0] ? "}" : "", (double)sum / 1e9);
  hvd_buf_printf(b, "%s_count%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
                 labels[0] ? "}" : "", (unsigned long long)total);
}

static bool histogram_empty(struct histogram *h) {
  for (int i = 0; i <= BUCKETS; i++)
    if (get(&h->counts[i]) != 0)
      return false;
  return true;
}

static void counter(struct hvd_buf *b, const char *name, const char *help, _Atomic uint64_t *c) {
  family(b, name, "counter", help);
  hvd_buf_printf(b, "%s %llu\n", name, (unsigned long long)get(c));
}

hvd_status coord_metrics_format(struct hvd_buf *b, uint64_t round, const char *host) {
  char labels[96];

  hvd_buf_reset(b);
  hvd_buf_printf(b, "# hvd-metrics round=%llu host=%s\n", (unsigned long long)round, host);
  family(b, "hvd_operations_total", "counter",
         "Collectives this rank ran (a fused one counts once), by operation and path.");
  for (int t = 0; t < TYPES; t++)
    for (int p = 1; p < COORD_PATH_COUNT; p++)
      if (get(&g_m.ops[t][p]) != 0)
        hvd_buf_printf(b, "hvd_operations_total{op=\"%s\",path=\"%s\"} %llu\n",
                       coord_type_name(t), path_names[p], (unsigned long long)get(&g_m.ops[t][p]));
  family(b, "hvd_bytes_total", "counter",
         "Bytes of the collectives' outputs on this rank, by operation and path.");
  for (int t = 0; t < TYPES; t++)
    for (int p = 1; p < COORD_PATH_COUNT; p++)
      if (get(&g_m.ops[t][p]) != 0)
        hvd_buf_printf(b, "hvd_bytes_total{op=\"%s\",path=\"%s\"} %llu\n", coord_type_name(t),
                       path_names[p], (unsigned long long)get(&g_m.bytes[t][p]));
  family(b, "hvd_tensors_total", "counter", "Tensors completed on this rank, by operation.");
  for (int t = 0; t < TYPES; t++)
    if (get(&g_m.tensors[t]) != 0)
      hvd_buf_printf(b, "hvd_tensors_total{op=\"%s\"} %llu\n", coord_type_name(t),
                     (unsigned long long)get(&g_m.tensors[t]));
  counter(b, "hvd_fused_tensors_total",
          "Tensors that ran fused with others in one collective.", &g_m.fused_tensors);
  counter(b, "hvd_failed_tensors_total", "Tensors whose operation failed.", &g_m.failed_tensors);
  counter(b, "hvd_cache_hits_total",
          "Submissions that matched the response cache (sent as a bit, or through a lane).",
          &g_m.cache_hits);
  counter(b, "hvd_cache_misses_total", "Submissions sent to rank 0 in full.", &g_m.cache_misses);
  counter(b, "hvd_stall_warnings_total",
          "Tensors the stall inspector warned about (rank 0 only).", &g_m.stall_warnings);
  counter(b, "hvd_job_errors_total", "Times this rank's job failed (a peer lost, a timeout).",
          &g_m.job_errors);
  counter(b, "hvd_elastic_resets_total", "Elastic resets this process went through.",
          &g_m.resets);
  family(b, "hvd_negotiation_seconds", "histogram",
         "From the background thread taking a tensor to its collective's start: negotiation "
         "with rank 0 and waiting for the other ranks.");
  histogram_lines(b, "hvd_negotiation_seconds", "", &g_m.wait);
  family(b, "hvd_operation_seconds", "histogram",
         "A collective's time on this rank, by operation and size class of its bytes.");
  for (int t = 0; t < TYPES; t++) {
    for (int c = 0; c < SIZES; c++) {
      if (histogram_empty(&g_m.latency[t][c]))
        continue;
      snprintf(labels, sizeof(labels), "op=\"%s\",size=\"%s\"", coord_type_name(t),
               size_names[c]);
      histogram_lines(b, "hvd_operation_seconds", labels, &g_m.latency[t][c]);
    }
  }
  return b->len < SNAPSHOT_MAX ? HVD_OK : hvd_error(HVD_ERR_TOO_LARGE, "metrics snapshot");
}

/* ==== sending =========================================================================== */

struct coord_metrics_pusher {
  pthread_t thread;
  pthread_mutex_t mu; /* protects stop and last */
  pthread_cond_t cv;
  bool stop;
  bool last; /* at the stop, send the final counts (not to a store that may be gone) */
  int64_t period_ns;
  struct rdzv_client *client; /* the thread's own (one per thread) */
  char key[24];               /* the rank */
  char host[256];
  uint64_t round;
  struct hvd_buf text;
  bool warned;
};

static void push(struct coord_metrics_pusher *p) {
  hvd_status st = coord_metrics_format(&p->text, p->round, p->host);
  if (st == HVD_OK)
    st = rdzv_client_set(p->client, RDZV_METRICS_SCOPE, p->key, p->text.data, p->text.len);
  if (st != HVD_OK && !p->warned) {
    HVD_LOG_INFO("metrics: cannot send this rank's snapshot to the store (%s); trying on",
                 hvd_last_error_message());
    p->warned = true;
  }
}

static void *push_main(void *arg) {
  struct coord_metrics_pusher *p = arg;
  int64_t next = hvd_now_ns() + p->period_ns;
  bool stop, last;

  (void)pthread_setname_np(pthread_self(), "hvd-metrics");
  /* Lowest priority: the thread must never take a core from the ranks. */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (!p->stop && hvd_cond_wait_until(&p->cv, &p->mu, next) != ETIMEDOUT) {
    }
    stop = p->stop;
    last = p->last;
    pthread_mutex_unlock(&p->mu);
    if (!stop || last) /* the final counts stay readable after a clean end */
      push(p);
    if (stop)
      break;
    next += p->period_ns;
    if (next < hvd_now_ns()) /* a slow store: no burst to catch up */
      next = hvd_now_ns() + p->period_ns;
    pthread_mutex_lock(&p->mu);
  }
  return NULL;
}

static void pusher_free(struct coord_metrics_pusher *p) {
  rdzv_client_destroy(p->client);
  hvd_buf_fini(&p->text);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

hvd_status coord_metrics_start(struct coord_state *s) {
  struct coord_metrics_pusher *p;
  const char *host;
  hvd_status st;

  if (!s->cfg.metrics || s->cfg.metrics_push_ms == 0 || s->store == NULL ||
      !rdzv_client_plans_scopes(s->store))
    return HVD_OK;
  if ((p = calloc(1, sizeof(*p))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the metrics' sender");
  pthread_mutex_init(&p->mu, NULL);
  hvd_cond_init(&p->cv);
  hvd_buf_init(&p->text, SNAPSHOT_MAX);
  p->period_ns = s->cfg.metrics_push_ms * 1000000;
  p->round = s->round.round;
  snprintf(p->key, sizeof(p->key), "%d", s->rank);
  host = net_comm_hostname(s->control, s->rank);
  snprintf(p->host, sizeof(p->host), "%s", host != NULL ? host : "");
  /* Short calls: a store that does not answer costs a snapshot, not a stall. */
  st = rdzv_client_create_from_env(&p->client);
  if (st == HVD_OK)
    rdzv_client_set_timeout_ms(p->client, 2000);
  if (st == HVD_OK && pthread_create(&p->thread, NULL, push_main, p) != 0)
    st = hvd_error(HVD_ERR_INTERNAL, "cannot start the metrics' thread");
  if (st != HVD_OK) { /* the job goes on: its metrics are not worth failing it */
    HVD_LOG_WARN("HVD_METRICS: this rank's metrics will not be sent: %s",
                 hvd_last_error_message());
    pusher_free(p);
    return HVD_OK;
  }
  s->metrics = p;
  return HVD_OK;
}

void coord_metrics_stop(struct coord_state *s) {
  struct coord_metrics_pusher *p = s->metrics;
  if (p == NULL)
    return;
  pthread_mutex_lock(&p->mu);
  p->stop = true;
  p->last = s->clean_stop;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  pthread_join(p->thread, NULL);
  pusher_free(p);
  s->metrics = NULL;
}
