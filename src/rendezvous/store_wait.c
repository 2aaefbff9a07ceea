/*
 * Long-poll waiters of the rendezvous store.
 *
 * DESIGN. A waiter asks for one key of a scope, for a scope to hold at
 * least N keys, or for the scope's next change. Pending waiters sit on one
 * of their scope's three lists (so a write only looks at the waiters of the
 * scope it touched, and count waiters only once the scope could satisfy
 * one) and on a min-heap ordered by
 * deadline, which one thread watches: it sleeps until the earliest deadline
 * and times out whatever is due. A waiter leaves both structures under the
 * lock when it finishes, is chained onto a local "fired" list, and is handed
 * to the fire callback only after the lock is released, so the callback may
 * take other locks (the HTTP server's) without any ordering concern. An
 * abandoned waiter (its client left) is moved to the top of the heap, so
 * the deadline thread finishes it like a timed-out one.
 */
#include <stdlib.h>
#include <string.h>

#include "store_private.h"

/* ---- deadline heap (lock held) -------------------------------------------- */

static void heap_set(struct rdzv_store *s, size_t i, struct rdzv_waiter *w) {
  s->heap[i] = w;
  w->heap_index = i;
}

static void heap_up(struct rdzv_store *s, size_t i) {
  struct rdzv_waiter *w = s->heap[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (s->heap[parent]->deadline_ns <= w->deadline_ns)
      break;
    heap_set(s, i, s->heap[parent]);
    i = parent;
  }
  heap_set(s, i, w);
}

static void heap_down(struct rdzv_store *s, size_t i) {
  struct rdzv_waiter *w = s->heap[i];
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= s->heap_len)
      break;
    if (child + 1 < s->heap_len && s->heap[child + 1]->deadline_ns < s->heap[child]->deadline_ns)
      child++;
    if (w->deadline_ns <= s->heap[child]->deadline_ns)
      break;
    heap_set(s, i, s->heap[child]);
    i = child;
  }
  heap_set(s, i, w);
}

static hvd_status heap_push(struct rdzv_store *s, struct rdzv_waiter *w) {
  hvd_status st = hvd_array_reserve(&s->heap, &s->heap_cap, s->heap_len + 1, sizeof(*s->heap), 64);
  if (st != HVD_OK)
    return st;
  s->heap[s->heap_len] = w;
  w->heap_index = s->heap_len++;
  heap_up(s, w->heap_index);
  return HVD_OK;
}

static void heap_remove(struct rdzv_store *s, struct rdzv_waiter *w) {
  size_t i = w->heap_index;
  struct rdzv_waiter *last = s->heap[--s->heap_len];

  if (i == s->heap_len)
    return;
  heap_set(s, i, last);
  if (i > 0 && s->heap[(i - 1) / 2]->deadline_ns > last->deadline_ns)
    heap_up(s, i);
  else
    heap_down(s, i);
}

/* ---- registration and firing (lock held) ---------------------------------- */

static struct rdzv_waiter **list_of(struct rdzv_scope *scope, const struct rdzv_waiter *w) {
  if (w->key != NULL)
    return &scope->key_waiters;
  return w->changes ? &scope->change_waiters : &scope->count_waiters;
}

/* Takes a pending waiter off every structure and chains it onto *fired. */
static void detach(struct rdzv_store *s, struct rdzv_waiter *w, enum rdzv_wait_result result,
                   struct rdzv_waiter **fired) {
  struct rdzv_scope *scope = w->scope_obj;

  heap_remove(s, w);
  if (w->prev != NULL)
    w->prev->next = w->next;
  else
    *list_of(scope, w) = w->next;
  if (w->next != NULL)
    w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->scope_obj = NULL;
  w->result = result;
  w->fired_next = *fired;
  *fired = w;
}

/* Whether the waiter can finish now; sets its value if so. */
static bool try_ready(struct rdzv_store *s, struct rdzv_scope *scope, struct rdzv_waiter *w) {
  if (w->key != NULL) {
    struct rdzv_blob *value = scope != NULL ? hvd_map_get(&scope->items, w->key, w->key_len) : NULL;
    if (value == NULL)
      return false;
    w->value = rdzv_blob_ref(value);
    return true;
  }
  if (w->changes ? scope == NULL || scope->changed <= w->after
                 : (scope != NULL ? scope->items.count : 0) < w->min_count)
    return false;
  w->version = scope != NULL ? scope->changed : 0;
  if (scope == NULL) {
    w->value = rdzv_blob_create(NULL, 0, s->version);
    w->count = 0;
    return w->value != NULL;
  }
  if (rdzv_store_scope_snapshot(s, scope, &w->value) != HVD_OK)
    return false; /* out of memory: let it time out rather than lie */
  w->count = scope->snapshot_count;
  return true;
}

void rdzv_store_wait_check(struct rdzv_store *s, struct rdzv_scope *scope, const char *key,
                      size_t key_len, struct rdzv_waiter **fired) {
  struct rdzv_waiter *w, *next;
  size_t bound = SIZE_MAX;

  for (w = scope->key_waiters; w != NULL; w = next) {
    next = w->next;
    if (w->key_len == key_len && memcmp(w->key, key, key_len) == 0 && try_ready(s, scope, w))
      detach(s, w, RDZV_WAIT_READY, fired);
  }
  rdzv_store_wait_changed(s, scope, fired);
  /* Count waiters only care once the scope is big enough for one of them;
   * skipping until then keeps N ranks' rendezvous linear, not quadratic. */
  if (scope->items.count < scope->min_count_bound)
    return;
  for (w = scope->count_waiters; w != NULL; w = next) {
    next = w->next;
    if (try_ready(s, scope, w))
      detach(s, w, RDZV_WAIT_READY, fired);
    else if (w->min_count < bound)
      bound = w->min_count;
  }
  scope->min_count_bound = bound;
}

void rdzv_store_wait_changed(struct rdzv_store *s, struct rdzv_scope *scope,
                             struct rdzv_waiter **fired) {
  struct rdzv_waiter *w, *next;
  for (w = scope->change_waiters; w != NULL; w = next) {
    next = w->next;
    if (try_ready(s, scope, w))
      detach(s, w, RDZV_WAIT_READY, fired);
  }
}

void rdzv_store_wait_cancel_all(struct rdzv_store *s, struct rdzv_waiter **fired) {
  while (s->heap_len > 0) {
    struct rdzv_waiter *w = s->heap[0];
    struct rdzv_scope *scope = w->scope_obj;
    detach(s, w, RDZV_WAIT_CANCELLED, fired);
    rdzv_store_maybe_drop_scope(s, scope);
  }
}

void rdzv_store_unlock_deliver(struct rdzv_store *s, struct rdzv_waiter *fired) {
  if (fired == NULL) {
    pthread_mutex_unlock(&s->mu);
    return;
  }
  s->delivering++;
  pthread_mutex_unlock(&s->mu);
  while (fired != NULL) {
    /* The callback may hand the waiter back to its owner, who may free it. */
    struct rdzv_waiter *next = fired->fired_next;
    if (fired->fire != NULL)
      fired->fire(fired, fired->fire_arg);
    else
      s->fire(fired, s->fire_arg);
    fired = next;
  }
  pthread_mutex_lock(&s->mu);
  if (--s->delivering == 0)
    pthread_cond_broadcast(&s->idle_cond);
  pthread_mutex_unlock(&s->mu);
}

hvd_status rdzv_store_wait(struct rdzv_store *s, struct rdzv_waiter *w, rdzv_park_cb park,
                           void *park_arg) {
  struct rdzv_scope *scope;
  hvd_status st = HVD_OK;

  if (w->scope_len == 0 || w->scope_len > s->limits.max_name_bytes ||
      (w->key != NULL && (w->key_len == 0 || w->key_len > s->limits.max_name_bytes)))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "bad scope or key length");
  /* Under the lock: rdzv_store_abandon_wait may look at w from another thread. */
  pthread_mutex_lock(&s->mu);
  w->result = RDZV_WAIT_PENDING;
  w->value = NULL;
  w->count = 0;
  w->prev = w->next = w->fired_next = NULL;
  w->scope_obj = NULL;
  w->abandoned = false;
  w->version = 0;
  scope = rdzv_store_find_scope(s, w->scope, w->scope_len);
  if (s->closing) {
    w->result = RDZV_WAIT_CANCELLED;
  } else if (try_ready(s, scope, w)) {
    w->result = RDZV_WAIT_READY;
  } else if (w->deadline_ns <= hvd_now_ns()) {
    w->result = RDZV_WAIT_TIMEOUT;
  } else if ((scope = rdzv_store_get_scope(s, w->scope, w->scope_len)) == NULL) {
    st = hvd_error_status();
  } else if ((st = heap_push(s, w)) != HVD_OK) {
    rdzv_store_maybe_drop_scope(s, scope);
  } else {
    struct rdzv_waiter **list = list_of(scope, w);
    w->scope_obj = scope;
    w->next = *list;
    if (*list != NULL)
      (*list)->prev = w;
    *list = w;
    if (w->key == NULL && !w->changes && w->min_count < scope->min_count_bound)
      scope->min_count_bound = w->min_count;
    park(w, park_arg);
    if (w->heap_index == 0)
      pthread_cond_signal(&s->deadline_cond);
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

bool rdzv_store_abandon_wait(struct rdzv_store *s, struct rdzv_waiter *w) {
  bool pending;

  pthread_mutex_lock(&s->mu);
  pending = w->scope_obj != NULL; /* registered and not finished */
  if (pending && !w->abandoned) {
    w->abandoned = true;
    w->deadline_ns = INT64_MIN;
    heap_up(s, w->heap_index);
    pthread_cond_signal(&s->deadline_cond);
  }
  pthread_mutex_unlock(&s->mu);
  return pending;
}

/* ---- the deadline thread -------------------------------------------------- */

static void *deadline_main(void *arg) {
  struct rdzv_store *s = arg;

  pthread_mutex_lock(&s->mu);
  while (!s->stop_thread) {
    struct rdzv_waiter *fired = NULL;
    int64_t now = hvd_now_ns();

    if (s->heap_len == 0 || s->heap[0]->deadline_ns > now) {
      hvd_cond_wait_until(&s->deadline_cond, &s->mu,
                          s->heap_len > 0 ? s->heap[0]->deadline_ns : HVD_NO_DEADLINE);
      continue;
    }
    while (s->heap_len > 0 && s->heap[0]->deadline_ns <= now) {
      struct rdzv_waiter *w = s->heap[0];
      struct rdzv_scope *scope = w->scope_obj;
      detach(s, w, w->abandoned ? RDZV_WAIT_ABANDONED : RDZV_WAIT_TIMEOUT, &fired);
      rdzv_store_maybe_drop_scope(s, scope);
    }
    rdzv_store_unlock_deliver(s, fired);
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

hvd_status rdzv_store_wait_start(struct rdzv_store *s) {
  int rc = pthread_create(&s->deadline_thread, NULL, deadline_main, s);
  if (rc != 0)
    return hvd_error(HVD_ERR_IO, "rendezvous store: cannot start its deadline thread: %s",
                     strerror(rc));
  s->deadline_thread_started = true;
  return HVD_OK;
}

void rdzv_store_wait_stop(struct rdzv_store *s) {
  if (!s->deadline_thread_started)
    return;
  pthread_mutex_lock(&s->mu);
  s->stop_thread = true;
  pthread_cond_signal(&s->deadline_cond);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->deadline_thread, NULL);
  s->deadline_thread_started = false;
}
