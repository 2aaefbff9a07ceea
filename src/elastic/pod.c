/*
 * A pod's membership in the elastic driver that hvd-rendezvous runs
 * (hvd-rendezvous --min-np): pods that start on their own join and leave
 * an elastic job without a launcher (docs/elastic.md, "Pods").
 *   elastic_pods/<host>:<lr>      = "<incarnation> <n>"  a heartbeat, every second
 *                                 = "<incarnation> done" hvd_elastic_run succeeded
 *                                 = "<incarnation> exit" left otherwise
 *   elastic_admitted/<incarnation> = N          the first round it may be in
 *                                  = "finished" the job is over: no place
 *
 * DESIGN. The incarnation (random, per registration) tells the driver a
 * restarted pod from the process it replaces, which has the same host name
 * and so the same slot. The heartbeat runs on a thread of its own for as
 * long as the membership lasts, across resets, so that the driver sees a
 * pod that died (no heartbeat for its --pod-timeout) without any process
 * supervision; peers see it sooner, through the transport, and reset.
 */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "elastic.h"

enum {
  HEARTBEAT_MS = 1000,
  HEARTBEAT_REQUEST_MS = 5000, /* one heartbeat's request, retries included */
  LEAVE_REQUEST_MS = 2000,
  ADMIT_WAIT_MS = 30000, /* at most: a driver admits within a tick; this is for none at all */
  INCARNATION_HEX = 16,
};

/* One registration: its slot, incarnation and heartbeat thread. */
struct membership {
  struct elastic_store_thread heartbeat;
  char slot[RDZV_RECORD_HOST_MAX + 16];
  char incarnation[INCARNATION_HEX + 1];
};

/* The pod's membership, if any. The lock guards only these fields: the
 * store's requests (registering, the last word) run without it, so
 * hvd_elastic_done never waits for one. */
static struct {
  pthread_mutex_t lock;
  struct membership *active;
  bool done; /* hvd_elastic_run succeeded: the last word is "done" */
} g_pod = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void make_incarnation(char *out) {
  unsigned char bytes[INCARNATION_HEX / 2];
  if (getrandom(bytes, sizeof(bytes), 0) != (ssize_t)sizeof(bytes)) {
    uint64_t x = (uint64_t)hvd_now_ns() ^ ((uint64_t)getpid() << 32);
    memcpy(bytes, &x, sizeof(bytes));
  }
  for (size_t i = 0; i < sizeof(bytes); i++)
    snprintf(out + 2 * i, 3, "%02x", bytes[i]);
}

static hvd_status beat(const struct membership *m, struct rdzv_client *c, const char *state) {
  char value[INCARNATION_HEX + 32];
  int n = snprintf(value, sizeof(value), "%s %s", m->incarnation, state);
  return rdzv_client_set(c, "elastic_pods", m->slot, value, (size_t)n);
}

static void *heartbeat_main(void *arg) {
  struct membership *m = arg;
  unsigned long long n = 0;
  bool failing = false;
  for (;;) {
    struct pollfd stop = {.fd = m->heartbeat.stop_fd, .events = POLLIN};
    char count[24];
    hvd_status st;
    if (poll(&stop, 1, HEARTBEAT_MS) != 0)
      break; /* leaving (or poll failed: no busy loop either way) */
    snprintf(count, sizeof(count), "%llu", ++n);
    st = beat(m, m->heartbeat.client, count);
    if (st == HVD_ERR_ABORTED)
      break;
    if (st != HVD_OK && !failing) /* once per outage: the store may be restarting */
      HVD_LOG_WARN("elastic pod: heartbeat to the store failed: %s", hvd_last_error_message());
    failing = st != HVD_OK;
  }
  return NULL;
}

/* Registers with a fresh incarnation and starts the heartbeat. */
static hvd_status start(const struct elastic_env *env, struct membership **out) {
  struct membership *m = calloc(1, sizeof(*m));
  hvd_status st;

  if (m == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the pod's membership");
  snprintf(m->slot, sizeof(m->slot), "%s:%d", env->host, env->local_rank);
  make_incarnation(m->incarnation);
  if ((st = elastic_store_thread_open(&m->heartbeat)) != HVD_OK) {
    free(m);
    return st;
  }
  if ((st = beat(m, m->heartbeat.client, "0")) != HVD_OK)
    hvd_error_prefix("registering pod %s in the store", m->slot);
  rdzv_client_set_timeout_ms(m->heartbeat.client, HEARTBEAT_REQUEST_MS);
  if (st == HVD_OK && elastic_store_thread_start(&m->heartbeat, heartbeat_main, m) != HVD_OK)
    st = hvd_error_prefix("the pod's heartbeat");
  if (st != HVD_OK) {
    elastic_store_thread_close(&m->heartbeat);
    free(m);
    return st;
  }
  HVD_LOG_INFO("elastic pod: registered as %s (incarnation %s)", m->slot, m->incarnation);
  *out = m;
  return HVD_OK;
}

/* Stops the heartbeat and tells the driver the pod left. */
static void finish(struct membership *m, bool done) {
  struct rdzv_client *c = NULL;

  elastic_store_thread_close(&m->heartbeat);
  /* Best effort: without it the driver sees the heartbeat stop. */
  if (rdzv_client_create_from_env(&c) == HVD_OK) {
    rdzv_client_set_timeout_ms(c, LEAVE_REQUEST_MS);
    if (beat(m, c, done ? "done" : "exit") != HVD_OK)
      HVD_LOG_DEBUG("elastic pod: telling the driver %s left: %s", m->slot,
                    hvd_last_error_message());
  }
  rdzv_client_destroy(c);
  free(m);
}

/* The first round the driver lets this pod into. */
static hvd_status admitted(const struct elastic_env *env, const struct membership *m,
                           uint64_t *first) {
  int64_t wait_ms = env->timeout_ms < ADMIT_WAIT_MS ? env->timeout_ms : ADMIT_WAIT_MS;
  struct rdzv_client *c = NULL;
  struct hvd_buf v;
  int64_t n;
  hvd_status st;

  hvd_buf_init(&v, 32);
  st = rdzv_client_create_from_env(&c);
  if (st == HVD_OK) {
    st = rdzv_client_wait(c, "elastic_admitted", m->incarnation, wait_ms, &v);
    if (st == HVD_ERR_TIMEOUT)
      hvd_error(HVD_ERR_TIMEOUT,
                "no elastic driver admitted pod %s within %d s: HVD_POD=1 with "
                "HOROVOD_ELASTIC=1 needs a store run as 'hvd-rendezvous --min-np N' (with "
                "HVD_RENDEZVOUS in etcd: 'hvd-rendezvous --rendezvous %s --min-np N' running "
                "in some pod)",
                m->slot, (int)(wait_ms / 1000), rdzv_client_where(c));
  }
  if (st == HVD_OK && v.len == 8 && memcmp(v.data, "finished", 8) == 0)
    st = hvd_error(HVD_ERR_REMOVED,
                   "the elastic job has finished: the driver admits no more pods (start a "
                   "new job with a fresh hvd-rendezvous, or a new etcd prefix)");
  else if (st == HVD_OK && (!hvd_parse_int64((const char *)v.data, v.len, &n) || n < 0))
    st = hvd_error(HVD_ERR_PROTOCOL, "the driver admitted pod %s with '%.*s', not a round number",
                   m->slot, (int)(v.len < 40 ? v.len : 40), (const char *)v.data);
  if (st == HVD_OK)
    *first = (uint64_t)n;
  hvd_buf_fini(&v);
  rdzv_client_destroy(c);
  return st;
}

hvd_status elastic_pod_join(const struct elastic_env *env) {
  struct membership *m = NULL;
  uint64_t first = 0;
  hvd_status st;

  pthread_mutex_lock(&g_pod.lock);
  m = g_pod.active;
  pthread_mutex_unlock(&g_pod.lock);
  if (m == NULL) {
    if ((st = start(env, &m)) != HVD_OK)
      return st;
    pthread_mutex_lock(&g_pod.lock);
    if (g_pod.active == NULL) {
      g_pod.active = m;
      g_pod.done = false;
    } else { /* another thread registered meanwhile: keep its membership */
      struct membership *extra = m;
      m = g_pod.active;
      pthread_mutex_unlock(&g_pod.lock);
      finish(extra, false);
      pthread_mutex_lock(&g_pod.lock);
    }
    pthread_mutex_unlock(&g_pod.lock);
  }
  st = admitted(env, m, &first);
  if (st == HVD_ERR_REMOVED)
    coord_mark_removed(hvd_last_error_message());
  if (st == HVD_OK)
    st = elastic_join_first(env, first);
  if (st != HVD_OK) {
    char why[HVD_ERROR_MESSAGE_MAX];
    snprintf(why, sizeof(why), "%s", hvd_last_error_message());
    elastic_pod_leave(); /* the driver need not wait for a heartbeat to stop */
    return hvd_error(st, "%s", why);
  }
  return HVD_OK;
}

void elastic_pod_mark_done(void) {
  pthread_mutex_lock(&g_pod.lock);
  g_pod.done = true;
  pthread_mutex_unlock(&g_pod.lock);
}

void elastic_pod_leave(void) {
  struct membership *m;
  bool done;

  pthread_mutex_lock(&g_pod.lock);
  m = g_pod.active;
  done = g_pod.done;
  g_pod.active = NULL;
  pthread_mutex_unlock(&g_pod.lock);
  if (m != NULL)
    finish(m, done);
}
