/*
 * The worker's side of the elastic driver's protocol, all through the
 * rendezvous store (docs/elastic.md has the whole protocol):
 *   elastic_ready/<host>:<local_rank>  = N   this worker has left round N
 *   elastic/round.<N>                  = U   round N is published; U host
 *                                            updates were announced before it
 *   elastic/latest                     = N   the newest published round
 *   rank_and_size.<N>/<host>:<lr>      = "rank,size,local_rank,local_size,
 *                                        cross_rank,cross_size" (-1s: removed)
 *   elastic/update.<k>                 = added|removed|mixed, k = 1, 2, ...
 * A slot is named by the HOROVOD_HOSTNAME and HOROVOD_LOCAL_RANK the worker
 * was started with: the driver's key for it in every round.
 *
 * DESIGN. Rounds are published in order and every one leaves its
 * round.<N> key, so a worker leaving round N long-polls round.<N+1> and
 * then jumps to the latest round (an older one is already abandoned).
 * Host updates are pushed: rank 0 keeps one long-poll open on the next
 * update key in a thread of its own (the watch), which an eventfd ends at
 * once when hvd shuts down. Commits read what the watch saw: no request
 * to the store per step.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "elastic.h"

enum { WAIT_MARGIN_MS = 60000 };

hvd_status elastic_read_env(struct elastic_env *out) {
  int64_t timeout_s, limit, round, updates, local_rank;
  const char *host = NULL;
  hvd_status st;

  memset(out, 0, sizeof(*out));
  st = hvd_setting_bool(HVD_SET_ELASTIC, &out->elastic);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_POD, &out->pod);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_ELASTIC_TIMEOUT, &timeout_s);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_ELASTIC_RESET_LIMIT, &limit);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_ELASTIC_ROUND, &round);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_ELASTIC_UPDATES, &updates);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_LOCAL_RANK, &local_rank);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_HOSTNAME, &host);
  if (st != HVD_OK)
    return st;
  out->timeout_ms = timeout_s * 1000;
  out->reset_limit = limit;
  out->round = (uint64_t)round;
  out->updates = (uint64_t)updates;
  out->local_rank = local_rank < 0 ? 0 : (int)local_rank; /* unset: the host's only rank */
  out->pod = out->pod && out->elastic;
  snprintf(out->host, sizeof(out->host), "%s", host != NULL ? host : "");
  /* A pod is named by its host name, as the transport names it. */
  if (out->pod && out->host[0] == '\0' && gethostname(out->host, sizeof(out->host) - 1) != 0)
    snprintf(out->host, sizeof(out->host), "localhost");
  if (out->elastic && out->host[0] == '\0')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_ELASTIC is set but HOROVOD_HOSTNAME is not: the elastic driver "
                     "names each worker by its host and local rank");
  return HVD_OK;
}

/* A decimal value of the store, as the driver writes it. */
static hvd_status get_number(struct rdzv_client *c, const char *scope, const char *key,
                             int64_t timeout_ms, uint64_t *out) {
  struct hvd_buf v;
  int64_t n;
  hvd_status st;

  hvd_buf_init(&v, 64);
  st = timeout_ms > 0 ? rdzv_client_wait(c, scope, key, timeout_ms, &v)
                      : rdzv_client_get(c, scope, key, &v, NULL);
  if (st == HVD_OK && (!hvd_parse_int64((const char *)v.data, v.len, &n) || n < 0))
    st = hvd_error(HVD_ERR_PROTOCOL, "the store's %s/%s is '%.*s', not a round number", scope,
                   key, (int)(v.len < 40 ? v.len : 40), (const char *)v.data);
  if (st == HVD_OK)
    *out = (uint64_t)n;
  hvd_buf_fini(&v);
  return st;
}

/* "rank,size,local_rank,local_size,cross_rank,cross_size". */
static hvd_status parse_assignment(const char *text, size_t len, struct coord_round *r) {
  int *fields[6] = {&r->rank,       &r->size,       &r->local_rank,
                    &r->local_size, &r->cross_rank, &r->cross_size};
  size_t pos = 0;

  for (int i = 0; i < 6; i++) {
    size_t end = pos;
    int64_t v;
    while (end < len && text[end] != ',')
      end++;
    if (!hvd_parse_int64(text + pos, end - pos, &v) || v < -1 || v > (1 << 24) ||
        (i < 5 && end >= len))
      return hvd_error(HVD_ERR_PROTOCOL,
                       "the driver's assignment '%.*s' is not six comma-separated integers",
                       (int)(len < 80 ? len : 80), text);
    *fields[i] = (int)v;
    pos = end + 1;
  }
  if (pos <= len)
    return hvd_error(HVD_ERR_PROTOCOL, "the driver's assignment '%.*s' has more than six fields",
                     (int)(len < 80 ? len : 80), text);
  return HVD_OK;
}

/* Waits for round `first` (or a later one) and reads the place of slot
 * `key` in the latest published round. */
static hvd_status wait_assignment(struct rdzv_client *c, const struct elastic_env *env,
                                  const char *key, uint64_t first, struct coord_round *out) {
  char scope[48];
  struct hvd_buf v;
  uint64_t latest = 0, ignored;
  hvd_status st;

  snprintf(scope, sizeof(scope), "round.%llu", (unsigned long long)first);
  /* The driver decides when rounds end (it fails the job after its own
   * --elastic-timeout); this wait only covers a driver that hangs. */
  st = get_number(c, "elastic", scope, env->timeout_ms + WAIT_MARGIN_MS, &ignored);
  if (st == HVD_ERR_TIMEOUT)
    hvd_error(HVD_ERR_TIMEOUT,
              "the elastic driver published no round %llu within %lld s "
              "(HOROVOD_ELASTIC_TIMEOUT and a minute)",
              (unsigned long long)first, (long long)(env->timeout_ms / 1000));
  if (st == HVD_OK)
    st = get_number(c, "elastic", "latest", 0, &latest);
  if (st == HVD_OK && latest < first)
    st = hvd_error(HVD_ERR_PROTOCOL,
                   "the store's elastic/latest says round %llu after round %llu was published",
                   (unsigned long long)latest, (unsigned long long)first);
  snprintf(scope, sizeof(scope), "round.%llu", (unsigned long long)latest);
  if (st == HVD_OK) /* (the driver writes latest just before it) */
    st = get_number(c, "elastic", scope, env->timeout_ms + WAIT_MARGIN_MS, &out->updates);
  snprintf(scope, sizeof(scope), "rank_and_size.%llu", (unsigned long long)latest);
  hvd_buf_init(&v, 256);
  if (st == HVD_OK) {
    st = rdzv_client_get(c, scope, key, &v, NULL);
    if (st == HVD_ERR_NOT_FOUND)
      st = HVD_OK; /* not in the round at all: removed */
    else if (st == HVD_OK)
      st = parse_assignment((const char *)v.data, v.len, out);
    if (st == HVD_OK && (v.len == 0 || out->rank < 0))
      st = hvd_error(HVD_ERR_REMOVED,
                     "this worker (%s) was removed from the elastic job in round %llu", key,
                     (unsigned long long)latest);
  }
  hvd_buf_fini(&v);
  if (st == HVD_OK && (out->size < 1 || out->rank >= out->size || out->local_rank < 0 ||
                       out->local_rank >= out->local_size || out->cross_rank < 0 ||
                       out->cross_rank >= out->cross_size))
    st = hvd_error(HVD_ERR_PROTOCOL, "the driver's assignment for %s in round %llu is inconsistent",
                   key, (unsigned long long)latest);
  out->round = latest;
  return st;
}

/* Joins from round `first`, after telling the driver this worker left
 * round `leaving` (when it was in one). */
static hvd_status join(const struct elastic_env *env, const uint64_t *leaving,
                       uint64_t first, struct coord_round *result) {
  struct coord_round round;
  struct rdzv_client *c = NULL;
  char key[RDZV_RECORD_HOST_MAX + 16], text[32];
  hvd_status st;

  memset(&round, 0, sizeof(round));
  snprintf(key, sizeof(key), "%s:%d", env->host, env->local_rank);
  st = rdzv_client_create_from_env(&c);
  if (st == HVD_OK && leaving != NULL) {
    snprintf(text, sizeof(text), "%llu", (unsigned long long)*leaving);
    st = rdzv_client_set(c, "elastic_ready", key, text, strlen(text));
  }
  if (st == HVD_OK)
    st = wait_assignment(c, env, key, first, &round);
  if (st == HVD_OK)
    *result = round;
  rdzv_client_destroy(c);
  if (st != HVD_OK && st != HVD_ERR_REMOVED)
    hvd_error_prefix("joining the next elastic round");
  return st;
}

hvd_status elastic_next_round(const struct elastic_env *env, uint64_t leaving,
                                    struct coord_round *out) {
  return join(env, &leaving, leaving + 1, out);
}

hvd_status elastic_first_round(const struct elastic_env *env, uint64_t first,
                                     struct coord_round *out) {
  return join(env, NULL, first, out);
}

/* ==== threads that talk to the store =========================================== */

hvd_status elastic_store_thread_open(struct elastic_store_thread *t) {
  hvd_status st;

  memset(t, 0, sizeof(*t));
  t->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  st = t->stop_fd < 0 ? hvd_error(HVD_ERR_IO, "eventfd failed") : HVD_OK;
  if (st == HVD_OK)
    st = rdzv_client_create_from_env(&t->client);
  if (st == HVD_OK)
    st = rdzv_client_set_cancel_fd(t->client, t->stop_fd);
  if (st != HVD_OK)
    elastic_store_thread_close(t);
  return st;
}

hvd_status elastic_store_thread_start(struct elastic_store_thread *t, void *(*fn)(void *), void *arg) {
  if (pthread_create(&t->thread, NULL, fn, arg) != 0)
    return hvd_error(HVD_ERR_IO, "cannot start a thread");
  t->started = true;
  return HVD_OK;
}

void elastic_store_thread_close(struct elastic_store_thread *t) {
  uint64_t one = 1;
  if (t->started) {
    (void)!write(t->stop_fd, &one, sizeof(one));
    pthread_join(t->thread, NULL);
    t->started = false;
  }
  rdzv_client_destroy(t->client);
  t->client = NULL;
  if (t->stop_fd >= 0)
    close(t->stop_fd);
  t->stop_fd = -1;
}

/* ==== the watch ================================================================ */

struct elastic_watch {
  struct elastic_store_thread t;
  _Atomic uint64_t updates;
  atomic_int kinds; /* HVD_HOSTS_ADDED | HVD_HOSTS_REMOVED of the updates seen */
};

/* The kind of an update's value; one that says neither counts as both, so
 * that nobody skips a sync it needs. */
static int update_kind(const struct hvd_buf *v) {
  if (v->len == 5 && memcmp(v->data, "added", 5) == 0)
    return HVD_HOSTS_ADDED;
  if (v->len == 7 && memcmp(v->data, "removed", 7) == 0)
    return HVD_HOSTS_REMOVED;
  return HVD_HOSTS_ADDED | HVD_HOSTS_REMOVED;
}

static void *watch_main(void *arg) {
  struct elastic_watch *w = arg;
  char key[32];
  struct hvd_buf v;

  hvd_buf_init(&v, 64);
  for (;;) {
    uint64_t next = atomic_load(&w->updates) + 1;
    hvd_status st;
    snprintf(key, sizeof(key), "update.%llu", (unsigned long long)next);
    hvd_buf_reset(&v);
    st = rdzv_client_wait(w->t.client, "elastic", key, INT64_C(3600) * 1000, &v);
    if (st == HVD_OK) {
      HVD_LOG_DEBUG("elastic: the driver announced host update %llu (%.*s)",
                    (unsigned long long)next, (int)v.len, (const char *)v.data);
      atomic_fetch_or(&w->kinds, update_kind(&v)); /* before the count that announces it */
      atomic_store(&w->updates, next);
    } else if (st == HVD_ERR_ABORTED) {
      break; /* hvd is shutting down */
    } else if (st != HVD_ERR_TIMEOUT) {
      /* The store went away: the job is ending, or the next collective
       * will say what failed. */
      HVD_LOG_DEBUG("elastic: watching for host updates: %s", hvd_last_error_message());
      break;
    }
  }
  hvd_buf_fini(&v);
  return NULL;
}

hvd_status elastic_watch_start(uint64_t after, struct elastic_watch **out) {
  struct elastic_watch *w = calloc(1, sizeof(*w));
  hvd_status st;

  if (w == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the host-update watch");
  atomic_init(&w->updates, after);
  atomic_init(&w->kinds, 0);
  st = elastic_store_thread_open(&w->t);
  if (st == HVD_OK && (st = elastic_store_thread_start(&w->t, watch_main, w)) != HVD_OK)
    elastic_store_thread_close(&w->t);
  if (st != HVD_OK) {
    free(w);
    return hvd_error_prefix("the host-update watch");
  }
  *out = w;
  return HVD_OK;
}

uint64_t elastic_watch_updates(struct elastic_watch *w) { return atomic_load(&w->updates); }

int elastic_watch_kinds(struct elastic_watch *w) { return atomic_load(&w->kinds); }

void elastic_watch_stop(struct elastic_watch *w) {
  if (w == NULL)
    return;
  elastic_store_thread_close(&w->t);
  free(w);
}
