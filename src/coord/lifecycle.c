/*
 * The lifecycle of hvd's state: building it (rendezvous, connections, the
 * control handshake, the background thread), publishing it, tearing it
 * down. hvd_init and hvd_shutdown themselves (elastic/init.c) choose how
 * to start; this file does the starting.
 *
 * DESIGN. The process has at most one coord_state, published in g_state
 * under g_rw: every public call holds the read lock only while it looks at
 * the state (to queue an operation or read a field), and hvd_shutdown
 * takes the write lock just to unpublish it, so no call can see a state
 * being torn down, and shutdown never waits for a user callback that calls
 * hvd. g_life serializes hvd_init and hvd_shutdown, but only around their
 * bookkeeping: building a state (rendezvous, connections: up to the
 * timeout) runs without it, marked by g_starting, so that hvd_shutdown on
 * another thread can ask the start to give up (an eventfd its store client
 * watches) instead of waiting for it to time out.
 */
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "coord.h"

static pthread_mutex_t g_life = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_life_cond = PTHREAD_COND_INITIALIZER; /* a start ended */
/* Under g_life: a thread is building a state; hvd_shutdown asked it to
 * give up; the eventfd that tells its store client so. */
static bool g_starting, g_stop_start;
static int g_start_cancel_fd = -1;
static pthread_rwlock_t g_rw = PTHREAD_RWLOCK_INITIALIZER;
static struct coord_state *g_state; /* under g_rw */
/* Successful hvd_init calls so far (under g_life): the nth init of every
 * rank meets the others' nth in a generation of its own, away from the
 * records the earlier ones left in the store. */
static uint64_t g_inits;
/* A worker the elastic driver removed (under g_life; read under g_rw too). */
static bool g_removed;
static char g_removed_msg[HVD_ERROR_MESSAGE_MAX];

struct coord_state *coord_acquire(void) {
  pthread_rwlock_rdlock(&g_rw);
  if (g_state == NULL) {
    pthread_rwlock_unlock(&g_rw);
    if (g_removed)
      hvd_error(HVD_ERR_REMOVED, "%s", g_removed_msg);
    else
      hvd_error(HVD_ERR_PRECONDITION, "hvd is not initialized (call hvd_init first)");
    return NULL;
  }
  return g_state;
}

struct coord_state *coord_acquire_quiet(void) {
  pthread_rwlock_rdlock(&g_rw);
  if (g_state == NULL) {
    pthread_rwlock_unlock(&g_rw);
    return NULL;
  }
  return g_state;
}

void coord_release(void) { pthread_rwlock_unlock(&g_rw); }

struct coord_state *coord_try_acquire(void) {
  if (pthread_rwlock_tryrdlock(&g_rw) != 0)
    return NULL;
  if (g_state == NULL || atomic_load(&g_state->closing)) {
    pthread_rwlock_unlock(&g_rw);
    return NULL;
  }
  return g_state;
}

/* ==== building and tearing down ======================================================= */

static void state_destroy(struct coord_state *s) {
  if (s == NULL)
    return;
  coord_loop_join(s);
  coord_metrics_stop(s); /* after the loop: its last counts go out */
  /* NCCL communicators of a failed job are aborted: a dead peer would
   * hold a clean destroy forever. */
  if (s->gpu != NULL)
    s->gpu_backend->close(s->gpu, !s->clean_stop);
  coord_timeline_destroy(s->timeline);
  coord_autotune_fini(s);
  coord_controller_destroy(s->controller);
  coord_cache_fini(&s->cache);
  coord_lanes_fini(s);
  coord_lanes_destroy(s->lanes);
  coord_sets_fini(&s->sets);
  ops_ctx_destroy(s->ops);
  net_comm_destroy(s->control);
  net_comm_destroy(s->control_host); /* after the links it lent control */
  net_world_destroy(s->world);
  rdzv_client_destroy(s->store);
  if (s->wake_fd >= 0)
    close(s->wake_fd);
  hvd_map_fini(&s->inflight);
  hvd_map_fini(&s->noname);
  free(s->fusion);
  free(s->identity);
  free(s->fused_counts);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

/* The start-up handshake: a worker's hello is its local size, then its
 * values of the handshake's settings (coord_handshake_settings); rank 0's
 * answer is its values of the same settings, then whether every host runs
 * as many ranks. */
enum { HANDSHAKE_MAX = HVD_SETTING_COUNT, HELLO_MAX = 8 + 8 * HANDSHAKE_MAX };

/* The control channel's segment: no collectives run on it (its data
 * buffers hold the lanes, lanes.c), and rings that hold a long response
 * list. */
enum { CONTROL_SHM_BUFFER = 64 * 1024, CONTROL_SHM_RING = 256 * 1024 };

/* On several hosts, rank 0's control messages to the ranks of its own host
 * go through rings all the same: those ranks make a communicator of their
 * own, whose segment lends control its rings. A host that cannot share
 * memory leaves them on TCP, as net_shm_get says. */
static hvd_status control_rings_on_host(struct coord_state *s) {
  const char *host0 = net_comm_hostname(s->control, 0);
  int *members, n = 0;
  struct net_shm *shm = NULL;
  hvd_status st;

  if (strcmp(net_comm_hostname(s->control, s->rank), host0) != 0)
    return HVD_OK;
  if ((members = malloc((size_t)s->size * sizeof(*members))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot list the ranks of rank 0's host");
  for (int r = 0; r < s->size; r++) {
    if (strcmp(net_comm_hostname(s->control, r), host0) == 0)
      members[n++] = r;
  }
  st = n < 2 ? HVD_OK
             : net_comm_derive(s->control, NET_COMM_CONTROL_HOST, members, n, &s->control_host);
  if (st == HVD_OK && s->control_host != NULL)
    st = net_shm_get(s->control_host, CONTROL_SHM_BUFFER, CONTROL_SHM_RING, &shm);
  if (st == HVD_OK && shm != NULL)
    net_shm_lend_links(shm, s->control, members);
  free(members);
  return st;
}

/* Each handshake setting's value here, 8 bytes each, from out on. */
static hvd_status put_settings(const enum hvd_setting *ids, size_t n, unsigned char *out) {
  hvd_status st = HVD_OK;
  for (size_t i = 0; i < n && st == HVD_OK; i++) {
    uint64_t v = 0;
    st = hvd_setting_bits(ids[i], &v);
    hvd_put_le64(out + 8 * i, v);
  }
  return st;
}

/* Compares another rank's handshake values with this one's: a difference
 * in a setting every rank must have alike fails; otherwise, on a worker,
 * rank 0's value is taken with a warning. `who` names the other rank. */
static hvd_status compare_settings(struct coord_config *c, const enum hvd_setting *ids, size_t n,
                                   const unsigned char *mine, const unsigned char *theirs,
                                   int who, bool adopt) {
  for (size_t i = 0; i < n; i++) {
    uint64_t a = hvd_get_le64(mine + 8 * i), b = hvd_get_le64(theirs + 8 * i);
    char here[64], there[64];
    if (a == b)
      continue;
    hvd_setting_format_bits(ids[i], a, here, sizeof(here));
    hvd_setting_format_bits(ids[i], b, there, sizeof(there));
    if (hvd_setting_info(ids[i])->scope == HVD_SCOPE_SAME)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s is %s here but %s on rank %d: every rank must have the same value",
                       hvd_setting_name(ids[i]), here, there, who);
    if (adopt) {
      HVD_LOG_WARN("%s is %s here but %s on rank 0; using rank 0's (every rank must agree)",
                   hvd_setting_name(ids[i]), here, there);
      coord_config_adopt(c, ids[i], b);
    }
  }
  return HVD_OK;
}

/* Workers say hello (with their host's rank count and their settings) to
 * rank 0 and rank 0 answers everybody with its settings and whether the
 * hosts are homogeneous: every control connection exists before the loop
 * starts (a peer that dies is then seen as a closed connection), and
 * nobody starts before everybody has. Rank 0 answers every worker even
 * when one differs where all must agree, so each of them can say which. */
static hvd_status control_handshake(struct coord_state *s) {
  enum hvd_setting ids[HANDSHAKE_MAX];
  size_t n = coord_handshake_settings(ids, HANDSHAKE_MAX);
  unsigned char hello[HELLO_MAX], answer[HELLO_MAX], mine[HELLO_MAX];
  char differs[HVD_ERROR_MESSAGE_MAX] = ""; /* why rank 0 refuses a worker's settings */
  size_t hello_bytes = 8 + 8 * n, answer_bytes = 8 * n + 8;
  bool homogeneous = true;
  hvd_status st;

  s->homogeneous = true;
  if (s->size == 1)
    return HVD_OK;
  if ((st = put_settings(ids, n, mine)) != HVD_OK)
    return st;
  if (s->rank != 0) {
    hvd_put_le64(hello, (uint64_t)s->world->local_size);
    memcpy(hello + 8, mine, 8 * n);
    st = net_send(s->control, 0, hello, hello_bytes);
    if (st == HVD_OK)
      st = net_recv(s->control, 0, answer, answer_bytes);
    if (st == HVD_OK)
      st = compare_settings(&s->cfg, ids, n, mine, answer, 0, true);
    if (st == HVD_OK)
      s->homogeneous = hvd_get_le64(answer + 8 * n) != 0;
    return st;
  }
  for (int r = 1; r < s->size && st == HVD_OK; r++) {
    st = net_recv(s->control, r, hello, hello_bytes);
    if (st == HVD_OK && hvd_get_le64(hello) != (uint64_t)s->world->local_size)
      homogeneous = false;
    if (st == HVD_OK && differs[0] == '\0' &&
        compare_settings(&s->cfg, ids, n, mine, hello + 8, r, false) != HVD_OK)
      snprintf(differs, sizeof(differs), "%s", hvd_last_error_message());
  }
  memcpy(answer, mine, 8 * n);
  hvd_put_le64(answer + 8 * n, homogeneous ? 1 : 0);
  for (int r = 1; r < s->size && st == HVD_OK; r++)
    st = net_send(s->control, r, answer, answer_bytes);
  s->homogeneous = homogeneous;
  if (st == HVD_OK && differs[0] != '\0') /* the first worker that differs, after every answer */
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s", differs);
  return st;
}

/* Which ranks and generation this state takes: the round given (a reset),
 * else the environment's, in the generation of the driver's round for an
 * elastic worker and of this process's nth init otherwise. */
static void take_round(struct coord_state *s, const struct coord_start *how, uint64_t nth,
                       struct net_world_config *wcfg) {
  const struct coord_round *given = how->round;
  if (given != NULL) {
    s->round = *given;
    wcfg->ctx.rank = given->rank;
    wcfg->size = given->size;
    wcfg->local_rank = given->local_rank;
    wcfg->local_size = given->local_size;
    wcfg->cross_rank = given->cross_rank;
    wcfg->cross_size = given->cross_size;
  } else {
    s->round.round = how->elastic ? how->generation : nth;
    s->round.updates = how->elastic ? how->updates : 0;
  }
  wcfg->ctx.generation = s->round.round;
}

/* The first member of HVD_RENDEZVOUS=etcd://HOST:PORT,...: with no
 * HOROVOD_GLOO_RENDEZVOUS_ADDR, ranks route to it to choose the address
 * they advertise, as they route to hvd's own store (else they would
 * advertise loopback and never meet across hosts). false if there is none. */
static bool etcd_member(char *host, size_t size, int64_t *port) {
  const char *url = NULL, *p, *end, *colon = NULL, *h, *h_end;

  if (hvd_setting_text(HVD_SET_RENDEZVOUS, &url) != HVD_OK || url == NULL ||
      strncmp(url, "etcd", 4) != 0 || (p = strstr(url, "://")) == NULL)
    return false;
  p += 3;
  end = p + strcspn(p, ",/");
  for (const char *q = p; q < end; q++)
    if (*q == ':')
      colon = q;
  if (colon == NULL)
    return false;
  h = p;
  h_end = colon;
  if (*h == '[' && h_end > h + 1 && h_end[-1] == ']') { /* [v6]:port */
    h++;
    h_end--;
  }
  if (h_end <= h || (size_t)(h_end - h) >= size ||
      !hvd_parse_int64(colon + 1, (size_t)(end - colon - 1), port))
    return false;
  memcpy(host, h, (size_t)(h_end - h));
  host[h_end - h] = '\0';
  return true;
}

/* nth: earlier successful starts of this process; cancel_fd: an eventfd
 * that ends the store client's waits (hvd_shutdown during the start). */
static hvd_status state_create(const struct coord_start *how, uint64_t nth, int cancel_fd,
                               struct coord_state **out) {
  struct coord_state *s = calloc(1, sizeof(*s));
  struct net_world_config wcfg;
  int *all = NULL;
  int64_t port = 0;
  char member[256];
  hvd_status st;

  if (s == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate hvd's state");
  s->wake_fd = -1;
  pthread_mutex_init(&s->lock, NULL);
  hvd_map_init(&s->inflight);
  hvd_map_init(&s->noname);
  atomic_init(&s->queued, false);
  atomic_init(&s->sleeping, false);
  atomic_init(&s->closing, false);
  atomic_init(&s->gpu_device, -1);

  st = net_world_config_from_env(&wcfg);
  if (st == HVD_OK)
    take_round(s, how, nth, &wcfg);
  if (st == HVD_OK && wcfg.size > 1)
    st = rdzv_client_create_from_env(&s->store);
  if (st == HVD_OK && s->store != NULL && cancel_fd >= 0)
    st = rdzv_client_set_cancel_fd(s->store, cancel_fd);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_RENDEZVOUS_PORT, &port);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_RENDEZVOUS_ADDR, &wcfg.ctx.store_host);
  if (st != HVD_OK)
    goto fail;
  if (wcfg.ctx.store_host == NULL && s->store != NULL && etcd_member(member, sizeof(member), &port))
    wcfg.ctx.store_host = member;
  wcfg.ctx.store = s->store;
  wcfg.ctx.store_port = port > 0 ? (int)port : 0;
  /* A pod learns its rank from the store: until then it has none to show. */
  hvd_log_set_rank(wcfg.rank_from_store ? -1 : wcfg.ctx.rank);
  if ((st = net_world_create(&wcfg, &s->world)) != HVD_OK)
    goto fail;
  s->rank = s->world->rank;
  s->size = s->world->size;
  hvd_log_set_rank(s->rank); /* pod mode learns it only now */
  s->round.rank = s->rank;
  s->round.size = s->size;
  s->round.local_rank = s->world->local_rank;
  s->round.local_size = s->world->local_size;
  s->round.cross_rank = s->world->cross_rank;
  s->round.cross_size = s->world->cross_size;
  if ((all = malloc((size_t)s->size * sizeof(*all))) == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the control communicator");
    goto fail;
  }
  for (int r = 0; r < s->size; r++)
    all[r] = r;
  st = net_comm_derive(s->world->global, NET_COMM_CONTROL, all, s->size, &s->control);
  free(all);
  if (st != HVD_OK)
    goto fail;
  net_comm_isolate_failures(s->control, true);
  st = coord_config_from_env(s->world->local_rank, s->world->local_size, &s->cfg);
  s->gpu_backend = coord_gpu_backend();
  if (st == HVD_OK)
    st = ops_ctx_create(&s->ops);
  /* Ranks of one host exchange control messages through shared memory. */
  if (st == HVD_OK && ops_ctx_tunables(s->ops)->shm) {
    struct net_shm *shm;
    st = net_shm_get(s->control, CONTROL_SHM_BUFFER, CONTROL_SHM_RING, &shm);
    if (st == HVD_OK && shm == NULL)
      st = control_rings_on_host(s);
    else if (st == HVD_OK)
      st = coord_lanes_create(shm, s->rank, s->size, &s->lanes);
  }
  coord_lanes_init(s);
  if (st == HVD_OK)
    st = coord_sets_init(&s->sets, s->world->global, s->size);
  if (st == HVD_OK)
    st = coord_timeline_create(&s->timeline, s->cfg.timeline_max_bytes);
  if (st != HVD_OK)
    goto fail;
  coord_cache_init(&s->cache, s->cfg.cache_capacity);
  if (s->rank == 0 && (st = coord_controller_create(s, &s->controller)) != HVD_OK)
    goto fail;
  s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->wake_fd < 0) {
    st = hvd_error(HVD_ERR_IO, "eventfd failed");
    goto fail;
  }
  if ((st = control_handshake(s)) != HVD_OK)
    goto fail;
  s->cache.capacity = s->cfg.cache_capacity; /* rank 0's (entries come on first use) */
  /* After the handshake: the tuner starts from the settings every rank took. */
  if ((st = coord_autotune_init(s)) != HVD_OK)
    goto fail;
  if (s->rank == 0 && s->cfg.timeline[0] != '\0' && strcmp(s->cfg.timeline, "DYNAMIC") != 0 &&
      (st = coord_timeline_start(s->timeline, s->cfg.timeline, s->cfg.timeline_mark_cycles)) !=
          HVD_OK) {
    st = hvd_error_prefix("HOROVOD_TIMELINE"); /* the variable that named the file */
    goto fail;
  }
  if ((st = coord_loop_start(s)) != HVD_OK)
    goto fail;
  if ((st = coord_metrics_start(s)) != HVD_OK)
    goto fail;
  if (s->store != NULL)
    (void)rdzv_client_set_cancel_fd(s->store, -1); /* the start's eventfd goes with it */
  *out = s;
  return HVD_OK;
fail: {
  /* Tearing down notes failures of its own (a peer that has left): the
   * cause reported stays the one that stopped the start. */
  char cause[HVD_ERROR_MESSAGE_MAX];
  snprintf(cause, sizeof(cause), "%s", hvd_last_error_message());
  state_destroy(s);
  return hvd_error(st, "%s", cause);
}
}

/* Under g_life: whether a start may begin; sets the error if not. */
static hvd_status may_start(void) {
  hvd_status st = HVD_OK;
  if (g_starting)
    return hvd_error(HVD_ERR_PRECONDITION, "hvd_init is already running on another thread");
  pthread_rwlock_rdlock(&g_rw);
  if (g_state != NULL)
    st = hvd_error(HVD_ERR_PRECONDITION, "hvd is already initialized");
  pthread_rwlock_unlock(&g_rw);
  if (st == HVD_OK && g_removed)
    st = hvd_error(HVD_ERR_REMOVED, "%s", g_removed_msg);
  return st;
}

/* Under g_life: publishes a started state, unless hvd_shutdown asked the
 * start to give up meanwhile (then it goes, and the start fails). */
static hvd_status publish(struct coord_state *s) {
  if (g_stop_start) {
    state_destroy(s);
    return hvd_error(HVD_ERR_ABORTED, "hvd_shutdown was called while hvd_init ran");
  }
  pthread_rwlock_wrlock(&g_rw);
  g_state = s;
  pthread_rwlock_unlock(&g_rw);
  g_inits++;
  HVD_LOG_DEBUG("hvd %s: rank %d of %d (local %d of %d, cross %d of %d)", hvd_version(), s->rank,
                s->size, s->world->local_rank, s->world->local_size, s->world->cross_rank,
                s->world->cross_size);
  return HVD_OK;
}

hvd_status coord_init_state(const struct coord_start *how) {
  struct coord_state *s = NULL;
  uint64_t nth;
  int cancel_fd;
  hvd_status st;

  pthread_mutex_lock(&g_life);
  if ((st = may_start()) != HVD_OK) {
    pthread_mutex_unlock(&g_life);
    return hvd_error_prefix("hvd_init");
  }
  g_starting = true;
  g_stop_start = false;
  g_start_cancel_fd = cancel_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  nth = g_inits;
  pthread_mutex_unlock(&g_life);

  if (cancel_fd < 0)
    st = hvd_error(HVD_ERR_IO, "eventfd failed");
  if (st == HVD_OK)
    st = hvd_log_configure_from_env();
  if (st == HVD_OK) {
    /* Writing to a closed socket must be an error, not a signal. */
    signal(SIGPIPE, SIG_IGN);
    st = state_create(how, nth, cancel_fd, &s);
  }

  pthread_mutex_lock(&g_life);
  if (st == HVD_OK)
    st = publish(s);
  else if (g_stop_start) {
    char why[HVD_ERROR_MESSAGE_MAX];
    snprintf(why, sizeof(why), "%s", hvd_last_error_message());
    st = hvd_error(HVD_ERR_ABORTED, "hvd_shutdown was called while hvd_init ran (%s)", why);
  }
  if (st == HVD_OK && how->round != NULL)
    coord_metrics_reset(); /* a later round of an elastic job */
  if (st != HVD_OK)
    hvd_error_prefix("hvd_init");
  g_starting = false;
  g_start_cancel_fd = -1;
  if (cancel_fd >= 0)
    close(cancel_fd);
  pthread_cond_broadcast(&g_life_cond);
  pthread_mutex_unlock(&g_life);
  return st;
}

hvd_status coord_current_round(struct coord_round *out) {
  struct coord_state *s = coord_acquire();
  if (s == NULL)
    return hvd_error_status();
  *out = s->round;
  coord_release();
  return HVD_OK;
}

void coord_mark_removed(const char *message) {
  pthread_mutex_lock(&g_life);
  pthread_rwlock_wrlock(&g_rw);
  g_removed = true;
  snprintf(g_removed_msg, sizeof(g_removed_msg), "%s", message);
  pthread_rwlock_unlock(&g_rw);
  pthread_mutex_unlock(&g_life);
}

bool coord_is_starting(void) {
  bool starting;
  pthread_mutex_lock(&g_life);
  starting = g_starting;
  pthread_mutex_unlock(&g_life);
  return starting;
}

bool coord_is_removed(void) {
  bool removed;
  pthread_mutex_lock(&g_life);
  removed = g_removed;
  pthread_mutex_unlock(&g_life);
  return removed;
}

hvd_status coord_shutdown_state(void) {
  struct coord_state *s;

  /* From a completion callback, this thread holds the loop that shutting
   * down would wait for. */
  if (coord_loop_driving())
    return hvd_error(HVD_ERR_PRECONDITION,
                     "hvd_shutdown cannot run in a completion callback (it waits for hvd's loop, "
                     "which runs the callback)");
  pthread_mutex_lock(&g_life);
  while (g_starting) { /* a start on another thread: it gives up at once */
    uint64_t one = 1;
    g_stop_start = true;
    (void)!write(g_start_cancel_fd, &one, sizeof(one));
    pthread_cond_wait(&g_life_cond, &g_life);
  }
  if (g_state != NULL) { /* (written only under g_life) */
    /* A user thread driving the loop holds the read lock: it lets go. */
    atomic_store(&g_state->closing, true);
    coord_wake(g_state);
  }
  pthread_rwlock_wrlock(&g_rw);
  s = g_state;
  g_state = NULL;
  pthread_rwlock_unlock(&g_rw);
  if (s != NULL) {
    pthread_mutex_lock(&s->lock);
    s->stop_requested = true;
    pthread_mutex_unlock(&s->lock);
    coord_wake(s);
    coord_loop_unpark(s);
    state_destroy(s); /* joins the background thread first */
  }
  pthread_mutex_unlock(&g_life);
  return HVD_OK;
}

HVD_API int hvd_is_initialized(void) {
  int r;
  pthread_rwlock_rdlock(&g_rw);
  r = g_state != NULL;
  pthread_rwlock_unlock(&g_rw);
  return r;
}

