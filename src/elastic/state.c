/*
 * Elastic state and the elastic run helper: the public hvd_elastic_* API.
 *
 * DESIGN. The state is a list of caller buffers with a snapshot each.
 * commit copies buffers to snapshots, restore copies back, sync broadcasts
 * the buffers from rank 0 (all at once, then waits). In an elastic job,
 * commit also broadcasts rank 0's count of host updates (what its watch
 * has seen), so every rank compares the same number with the count its
 * round started with and all of them interrupt at the same commit.
 * hvd_elastic_reset = hvd_shutdown (which does not wait on peers that are
 * already gone: a failed loop has stopped) + the driver's next round +
 * init with its ranks. The run helper always syncs after a reset, also
 * after an interrupt for removed hosts only: syncing costs one broadcast
 * and a survivor that skipped it while a new worker waited in it would
 * hang both.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "elastic.h"

enum { NAME_MAX_BYTES = 200 };

struct buffer {
  char name[NAME_MAX_BYTES + 1];
  void *data;
  size_t bytes;
  void *saved;
};

struct reset_callback {
  hvd_elastic_reset_callback fn;
  void *arg;
};

struct hvd_elastic_state_s {
  struct buffer *bufs;
  size_t n, cap;
  struct reset_callback *resets;
  size_t nresets, resets_cap;
  hvd_elastic_hooks hooks;
  void *user;
};

static atomic_int g_resets;

/* Rank 0's watch for host updates while a state of an elastic job runs. */
static pthread_mutex_t g_watch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct elastic_watch *g_watch;

/* Whether this process is a worker of an elastic job. */
static bool in_elastic_job(void) {
  struct elastic_env env;
  return elastic_read_env(&env) == HVD_OK && env.elastic;
}

hvd_status elastic_started(void) {
  struct coord_round round;
  struct elastic_watch *w = NULL, *old;
  hvd_status st;

  if (coord_current_round(&round) != HVD_OK || round.rank != 0)
    return HVD_OK;
  if ((st = elastic_watch_start(round.updates, &w)) != HVD_OK)
    return st;
  pthread_mutex_lock(&g_watch_lock);
  old = g_watch;
  g_watch = w;
  pthread_mutex_unlock(&g_watch_lock);
  elastic_watch_stop(old);
  return HVD_OK;
}

void elastic_stopping(void) {
  struct elastic_watch *w;
  pthread_mutex_lock(&g_watch_lock);
  w = g_watch;
  g_watch = NULL;
  pthread_mutex_unlock(&g_watch_lock);
  elastic_watch_stop(w);
}

/* Rank 0: the number of host updates the watch has seen and their kinds
 * (HVD_HOSTS_*) since the round began; elsewhere the round's count and 0.
 * HVD_ERR_PRECONDITION when hvd is not initialized. */
static hvd_status updates_seen(uint64_t *count, int *kinds) {
  struct coord_round round;
  hvd_status st = coord_current_round(&round);

  if (st != HVD_OK)
    return st;
  pthread_mutex_lock(&g_watch_lock);
  *count = g_watch != NULL ? elastic_watch_updates(g_watch) : round.updates;
  *kinds = g_watch != NULL ? elastic_watch_kinds(g_watch) : 0;
  pthread_mutex_unlock(&g_watch_lock);
  return HVD_OK;
}

HVD_API hvd_status hvd_elastic_state_create(hvd_elastic_state **out) {
  if (out == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_elastic_state_create: out is NULL");
  if ((*out = calloc(1, sizeof(**out))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate an elastic state");
  return HVD_OK;
}

HVD_API void hvd_elastic_state_destroy(hvd_elastic_state *state) {
  if (state == NULL)
    return;
  for (size_t i = 0; i < state->n; i++)
    free(state->bufs[i].saved);
  free(state->bufs);
  free(state->resets);
  free(state);
}

HVD_API hvd_status hvd_elastic_state_add(hvd_elastic_state *state, const char *name, void *data,
                                         size_t bytes) {
  struct buffer *b;

  if (state == NULL || name == NULL || name[0] == '\0' || strlen(name) > NAME_MAX_BYTES ||
      (data == NULL && bytes > 0))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "hvd_elastic_state_add: needs a state, a name of 1-%d bytes and a buffer",
                     NAME_MAX_BYTES);
  for (size_t i = 0; i < state->n; i++) {
    if (strcmp(state->bufs[i].name, name) == 0)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "hvd_elastic_state_add: '%s' is already registered", name);
  }
  if (hvd_array_reserve(&state->bufs, &state->cap, state->n + 1, sizeof(*state->bufs), 8) !=
      HVD_OK)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot register '%s'", name);
  b = &state->bufs[state->n];
  memset(b, 0, sizeof(*b));
  snprintf(b->name, sizeof(b->name), "%s", name);
  b->data = data;
  b->bytes = bytes;
  if ((b->saved = malloc(bytes > 0 ? bytes : 1)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the snapshot of '%s' (%zu bytes)", name,
                     bytes);
  if (bytes > 0) /* registering counts as the first commit */
    memcpy(b->saved, data, bytes);
  state->n++;
  return HVD_OK;
}

HVD_API hvd_status hvd_elastic_state_set_hooks(hvd_elastic_state *state,
                                               const hvd_elastic_hooks *hooks, void *user) {
  if (state == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_elastic_state_set_hooks: no state");
  memset(&state->hooks, 0, sizeof(state->hooks));
  if (hooks != NULL)
    state->hooks = *hooks;
  state->user = user;
  return HVD_OK;
}

HVD_API hvd_status hvd_elastic_state_on_reset(hvd_elastic_state *state,
                                              hvd_elastic_reset_callback callback, void *arg) {
  if (state == NULL || callback == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "hvd_elastic_state_on_reset: needs a state and a callback");
  if (hvd_array_reserve(&state->resets, &state->resets_cap, state->nresets + 1,
                        sizeof(*state->resets), 4) != HVD_OK)
    return hvd_error_prefix("hvd_elastic_state_on_reset");
  state->resets[state->nresets++] = (struct reset_callback){callback, arg};
  return HVD_OK;
}

/* ==== commit, restore, sync ===================================================== */

/* A hook's failure, with its status (a hook may not have set a message). */
static hvd_status hook_failed(const char *call, const char *hook, hvd_status st) {
  return hvd_error(st, "%s: the %s hook failed (%s)", call, hook, hvd_strerror(st));
}

/* Rank 0's update count, the same on every rank afterwards. */
static hvd_status agree_on_updates(uint64_t *updates) {
  unsigned char bytes[8];
  int64_t shape[1] = {8};
  hvd_tensor t = {"hvd.elastic.updates", HVD_UINT8, 1, shape, bytes, bytes};
  uint64_t seen = 0;
  int kinds;
  hvd_status st;

  if ((st = updates_seen(&seen, &kinds)) != HVD_OK)
    return st;
  hvd_put_le64(bytes, seen);
  st = hvd_broadcast(&t, NULL);
  *updates = hvd_get_le64(bytes);
  return st;
}

HVD_API hvd_status hvd_elastic_commit(hvd_elastic_state *state) {
  struct coord_round round;
  uint64_t updates;
  hvd_status st;

  if (state == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_elastic_commit: no state");
  for (size_t i = 0; i < state->n; i++) {
    if (state->bufs[i].bytes > 0)
      memcpy(state->bufs[i].saved, state->bufs[i].data, state->bufs[i].bytes);
  }
  if (state->hooks.commit != NULL && (st = state->hooks.commit(state->user)) != HVD_OK)
    return hook_failed("hvd_elastic_commit", "commit", st);
  if (coord_current_round(&round) != HVD_OK || !in_elastic_job())
    return HVD_OK; /* nothing to check outside an elastic job (or before init) */
  if ((st = agree_on_updates(&updates)) != HVD_OK)
    return hvd_error_prefix("hvd_elastic_commit");
  if (updates > round.updates)
    return hvd_error(HVD_ERR_HOSTS_UPDATED,
                     "hvd_elastic_commit: the elastic driver announced host changes "
                     "(update %llu; this round started after update %llu)",
                     (unsigned long long)updates, (unsigned long long)round.updates);
  return HVD_OK;
}

HVD_API hvd_status hvd_elastic_restore(hvd_elastic_state *state) {
  if (state == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_elastic_restore: no state");
  hvd_status st;
  for (size_t i = 0; i < state->n; i++) {
    if (state->bufs[i].bytes > 0)
      memcpy(state->bufs[i].data, state->bufs[i].saved, state->bufs[i].bytes);
  }
  if (state->hooks.restore != NULL && (st = state->hooks.restore(state->user)) != HVD_OK)
    return hook_failed("hvd_elastic_restore", "restore", st);
  return HVD_OK;
}

HVD_API hvd_status hvd_elastic_sync(hvd_elastic_state *state) {
  hvd_handle *handles;
  hvd_status st = HVD_OK, first = HVD_OK;
  char first_msg[HVD_ERROR_MESSAGE_MAX] = "";

  if (state == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_elastic_sync: no state");
  if ((handles = calloc(state->n + 1, sizeof(*handles))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "hvd_elastic_sync: out of memory");
  for (size_t i = 0; i < state->n && st == HVD_OK; i++) {
    struct buffer *b = &state->bufs[i];
    char name[NAME_MAX_BYTES + 32];
    int64_t shape[1] = {(int64_t)b->bytes};
    hvd_tensor t = {name, HVD_UINT8, 1, shape, b->data, b->data};
    snprintf(name, sizeof(name), "hvd.elastic.sync.%s", b->name);
    st = hvd_broadcast_async(&t, NULL, &handles[i]);
  }
  if (st != HVD_OK) {
    first = st;
    snprintf(first_msg, sizeof(first_msg), "%s", hvd_last_error_message());
  }
  for (size_t i = 0; i < state->n; i++) {
    if (handles[i] == NULL)
      continue;
    st = hvd_handle_wait(handles[i]);
    if (st != HVD_OK && first == HVD_OK) {
      first = st;
      snprintf(first_msg, sizeof(first_msg), "%s", hvd_last_error_message());
    }
    hvd_handle_release(handles[i]);
  }
  free(handles);
  if (first != HVD_OK)
    return hvd_error(first, "hvd_elastic_sync: %s", first_msg);
  if (state->hooks.sync != NULL && (st = state->hooks.sync(state->user)) != HVD_OK)
    return hook_failed("hvd_elastic_sync", "sync", st);
  return HVD_OK;
}

/* ==== reset and run ============================================================== */

/* Failures a reset can cure: a peer that failed or went silent, or a
 * round that ended under this worker. */
bool elastic_recoverable(hvd_status st) {
  return st == HVD_ERR_NETWORK || st == HVD_ERR_TIMEOUT || st == HVD_ERR_ABORTED;
}

/* Whether this worker may reset once more (HOROVOD_ELASTIC_RESET_LIMIT). */
static bool within_reset_limit(const struct elastic_env *env) {
  return env->reset_limit < 0 || hvd_elastic_resets() < env->reset_limit;
}

HVD_API hvd_status hvd_elastic_reset(void) {
  struct elastic_env env;
  struct coord_round was;
  hvd_status st;

  if ((st = coord_current_round(&was)) != HVD_OK)
    return hvd_error_prefix("hvd_elastic_reset");
  if (!in_elastic_job())
    return hvd_error(HVD_ERR_PRECONDITION,
                     "hvd_elastic_reset: this is not an elastic job (start it with hvdrun "
                     "--min-np or --host-discovery-script)");
  if ((st = elastic_read_env(&env)) != HVD_OK)
    return hvd_error_prefix("hvd_elastic_reset");
  if (!within_reset_limit(&env))
    return hvd_error(HVD_ERR_PRECONDITION,
                     "hvd_elastic_reset: this worker has reset %d times, the limit "
                     "(HOROVOD_ELASTIC_RESET_LIMIT)",
                     hvd_elastic_resets());
  if ((st = coord_shutdown_state()) != HVD_OK) /* a pod stays a member */
    return hvd_error_prefix("hvd_elastic_reset");
  elastic_stopping();
  atomic_fetch_add(&g_resets, 1);
  return elastic_rejoin(&env, was.round);
}

/* Joins a round: the one after `round` (a worker leaving it), or for a
 * pod's first join round `round` itself; then the next ones while they
 * fail to start. */
static hvd_status join_rounds(const struct elastic_env *env, bool first, uint64_t round) {
  struct coord_round next;
  hvd_status st;

  for (;; round = next.round, first = false) {
    st = first ? elastic_first_round(env, round, &next)
               : elastic_next_round(env, round, &next);
    if (st == HVD_ERR_REMOVED) {
      coord_mark_removed(hvd_last_error_message());
      return HVD_ERR_REMOVED;
    }
    if (st == HVD_OK) {
      struct coord_start how = {.round = &next};
      st = coord_init_state(&how);
    }
    if (st == HVD_OK && (st = elastic_started()) != HVD_OK)
      (void)coord_shutdown_state(); /* as if it had failed to start */
    /* A round that fails while its workers meet (one of them died too)
     * is followed by another one: go on to it. */
    if (st == HVD_OK || !elastic_recoverable(st))
      break;
    HVD_LOG_INFO("elastic: round %llu failed to start (%s); waiting for the next one",
                 (unsigned long long)next.round, hvd_last_error_message());
  }
  if (st != HVD_OK)
    return st;
  HVD_LOG_INFO("elastic: round %llu: rank %d of %d", (unsigned long long)next.round, next.rank,
               next.size);
  return HVD_OK;
}

hvd_status elastic_rejoin(const struct elastic_env *env, uint64_t leaving) {
  return join_rounds(env, false, leaving);
}

hvd_status elastic_join_first(const struct elastic_env *env, uint64_t first) {
  return join_rounds(env, true, first);
}

HVD_API int hvd_elastic_resets(void) { return atomic_load(&g_resets); }

HVD_API int hvd_elastic_hosts_updated(void) {
  uint64_t count;
  int kinds;
  if (updates_seen(&count, &kinds) != HVD_OK)
    return -1;
  return kinds;
}

HVD_API hvd_status hvd_elastic_done(void) {
  struct elastic_env env;
  if (elastic_read_env(&env) == HVD_OK && env.pod)
    elastic_pod_mark_done();
  return HVD_OK;
}

HVD_API hvd_status hvd_elastic_run(hvd_elastic_state *state, hvd_elastic_train_fn train,
                                   void *arg) {
  struct elastic_env env;
  struct coord_round round;
  bool elastic;
  hvd_status st;

  if (state == NULL || train == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_elastic_run: needs a state and a function");
  if ((st = coord_current_round(&round)) != HVD_OK)
    return hvd_error_prefix("hvd_elastic_run");
  if ((st = elastic_read_env(&env)) != HVD_OK)
    return hvd_error_prefix("hvd_elastic_run");
  elastic = env.elastic;
  for (;;) {
    char why[HVD_ERROR_MESSAGE_MAX];
    st = hvd_elastic_sync(state);
    if (st == HVD_OK)
      st = train(state, arg);
    if (st == HVD_OK)
      hvd_elastic_done();
    if (st == HVD_OK || !elastic || (!elastic_recoverable(st) && st != HVD_ERR_HOSTS_UPDATED))
      return st;
    snprintf(why, sizeof(why), "%s", hvd_last_error_message());
    if (!within_reset_limit(&env))
      return hvd_error(st, "hvd_elastic_run: %d resets, the limit (HOROVOD_ELASTIC_RESET_LIMIT); "
                           "the last failure: %s",
                       hvd_elastic_resets(), why);
    HVD_LOG_INFO("elastic: resetting after: %s", why);
    if (st != HVD_ERR_HOSTS_UPDATED && (st = hvd_elastic_restore(state)) != HVD_OK)
      return st;
    if ((st = hvd_elastic_reset()) != HVD_OK)
      return st;
    for (size_t i = 0; i < state->nresets; i++)
      state->resets[i].fn(state->resets[i].arg);
  }
}
