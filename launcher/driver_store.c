/*
 * The elastic driver's store (elastic_driver.h): hvdrun's own, in-process,
 * or an etcd cluster through a client (hvdrun --rendezvous etcd://...).
 *
 * DESIGN. The driver reads and writes on its one thread. What workers
 * write in the scopes it watches must wake it at once: in hvdrun's store
 * a waiter whose callback wakes the supervisor; in etcd, a thread per
 * scope with a client of its own that waits for the scope's next change
 * (an etcd watch) and wakes the supervisor the same way. A failed write
 * or read is said and left to the next turn, which reads again.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "elastic_driver.h"

enum {
  WATCH_MS = 3600 * 1000, /* a watch's wait, armed again when it ends */
  RETIRE_MS = 2000,       /* how long the end waits for a watch to come back */
  RETRY_MS = 1000,        /* an etcd watch that failed is tried again after this */
  FILLED_READ_MS = 1000,  /* the read that wakes a filled scope's waiters in etcd */
};

/* ==== reads and writes ========================================================= */

static void put(const struct driver *d, const char *scope, const char *key, const char *value,
                bool only_new) {
  hvd_status st;

  if (d->store != NULL)
    st = rdzv_store_set(d->store, scope, strlen(scope), key, strlen(key), value, strlen(value),
                        only_new ? RDZV_SET_IF_ABSENT : RDZV_SET_ALWAYS, 0, NULL, NULL);
  else if (only_new)
    st = rdzv_client_cas(d->client, scope, key, 0, value, strlen(value), NULL, NULL, NULL);
  else
    st = rdzv_client_set(d->client, scope, key, value, strlen(value));
  if (st != HVD_OK && !(only_new && st == HVD_ERR_CONFLICT))
    driver_say(d, "cannot write %s/%s in the store: %s", scope, key, hvd_last_error_message());
}

void driver_put(const struct driver *d, const char *scope, const char *key, const char *value) {
  put(d, scope, key, value, false);
}

void driver_put_new(const struct driver *d, const char *scope, const char *key,
                    const char *value) {
  put(d, scope, key, value, true);
}

void driver_delete_scope(const struct driver *d, const char *scope) {
  hvd_status st = d->store != NULL ? rdzv_store_delete_scope(d->store, scope, strlen(scope))
                                   : rdzv_client_delete_scope(d->client, scope);
  if (st != HVD_OK)
    driver_say(d, "cannot clear scope %s in the store: %s", scope, hvd_last_error_message());
}

void driver_scope_filled(const struct driver *d, const char *scope, size_t size) {
  struct rdzv_scope_view view;

  /* hvd's store wakes its waiters itself; in etcd, a read that finds the
   * count reached puts the marker the waiters watch (client_etcd.c). */
  if (d->store != NULL)
    return;
  if (rdzv_client_get_scope(d->client, scope, size, FILLED_READ_MS, &view) == HVD_OK)
    rdzv_scope_view_fini(&view);
  else
    HVD_LOG_DEBUG("waking the waiters of scope %s: %s", scope, hvd_last_error_message());
}

void driver_plan_scope(const struct driver *d, const char *scope, size_t size) {
  if (d->store != NULL && rdzv_store_plan(d->store, scope, strlen(scope), size) != HVD_OK)
    driver_say(d, "cannot plan scope %s: %s", scope, hvd_last_error_message());
}

bool driver_scope_met(const struct driver *d, const char *scope) {
  return d->store != NULL && rdzv_store_plan_rounds(d->store, scope, strlen(scope)) > 0;
}

void driver_scope_each(const struct driver *d, const char *scope,
                       void (*fn)(struct driver *, const char *, const char *, size_t),
                       struct driver *arg) {
  struct rdzv_blob *body = NULL;
  struct rdzv_scope_view view;
  size_t count = 0;
  char *copy;

  if (d->store == NULL) {
    if (rdzv_client_get_scope(d->client, scope, 0, -1, &view) != HVD_OK) {
      driver_say(d, "cannot read scope %s in the store: %s", scope, hvd_last_error_message());
      return;
    }
    for (size_t e = 0; e < view.count; e++)
      fn(arg, view.entries[e].key, (const char *)view.entries[e].value,
         view.entries[e].value_len);
    rdzv_scope_view_fini(&view);
    return;
  }
  if (rdzv_store_snapshot(d->store, scope, strlen(scope), &body, &count) != HVD_OK ||
      count == 0) {
    rdzv_blob_unref(body);
    return;
  }
  if ((copy = malloc(body->len + 1)) != NULL) {
    memcpy(copy, body->data, body->len + 1);
    if (rdzv_scope_decode(copy, body->len, &view) == HVD_OK) {
      for (size_t e = 0; e < view.count; e++)
        fn(arg, view.entries[e].key, (const char *)view.entries[e].value,
           view.entries[e].value_len);
      rdzv_scope_view_fini(&view);
    }
  }
  rdzv_blob_unref(body);
}


/* ==== watches in etcd ========================================================== */

/* One scope's watch thread: wakes the driver at each change until stopped. */
static void *etcd_watch_main(void *arg) {
  struct scope_watch *sw = arg;
  struct rdzv_client *c = NULL;
  uint64_t seen = 0;
  hvd_status st = rdzv_client_create_url(sw->url, WATCH_MS, &c);

  if (st == HVD_OK)
    st = rdzv_client_set_cancel_fd(c, sw->stop[0]);
  while (st == HVD_OK) {
    st = rdzv_client_wait_change(c, sw->scope, seen, WATCH_MS, &seen);
    if (st == HVD_OK) {
      atomic_store(&sw->fired, true);
      hvdrun_sup_wake(atomic_load(&sw->sup));
    } else if (st != HVD_ERR_ABORTED) {
      /* the cluster may be electing a leader: the driver's turns read on */
      struct pollfd stop = {.fd = sw->stop[0], .events = POLLIN};
      HVD_LOG_DEBUG("watching scope %s: %s", sw->scope, hvd_last_error_message());
      st = poll(&stop, 1, RETRY_MS) == 0 ? HVD_OK : HVD_ERR_ABORTED;
      seen = 0;
    }
  }
  rdzv_client_destroy(c);
  return NULL;
}

static bool etcd_watch_arm(struct driver *d, struct scope_watch *sw) {
  if (!sw->started && !sw->armed) {
    sw->armed = true; /* tried once: a failure is said once */
    sw->url = d->rdzv.url;
    atomic_store(&sw->sup, &d->sup);
    if (pipe(sw->stop) != 0) {
      sw->stop[0] = sw->stop[1] = -1;
    } else if (pthread_create(&sw->thread, NULL, etcd_watch_main, sw) != 0) {
      close(sw->stop[0]);
      close(sw->stop[1]);
    } else {
      sw->started = true;
    }
    if (!sw->started)
      driver_say(d, "cannot start the watch of scope %s; reading it every turn instead",
                 sw->scope);
  }
  /* The turn that follows a change reads the scope: nothing more to do. */
  atomic_store(&sw->fired, false);
  return true;
}

static void etcd_watch_retire(struct scope_watch *sw) {
  close(sw->stop[1]); /* the thread's client gives up its watch at once */
  pthread_join(sw->thread, NULL);
  close(sw->stop[0]);
  sw->started = false;
}

/* ==== watches in hvdrun's store ================================================ */

static void watch_fired(struct rdzv_waiter *w, void *arg) {
  struct scope_watch *sw = arg;
  struct hvdrun_sup *sup = atomic_load(&sw->sup);
  (void)w;
  atomic_store(&sw->fired, true);
  if (sup != NULL) /* NULL: a watch the store kept past the driver's end */
    hvdrun_sup_wake(sup);
}

/* Under the store's lock, on the arming thread: the wait is registered, so
 * its result belongs to the fire callback from now on. */
static void watch_parked(struct rdzv_waiter *w, void *arg) {
  struct scope_watch *sw = arg;
  (void)w;
  sw->parked = true;
}

/* Arms the watch again once the store has handed it back (the driver's
 * turn reads the scope anyway); false when the scope changed meanwhile and
 * the driver should take another turn at once. */
static bool local_watch_arm(struct driver *d, struct scope_watch *sw) {
  if (sw->armed && !atomic_load(&sw->fired))
    return true; /* still waiting */
  if (sw->armed) {
    rdzv_blob_unref(sw->w.value);
    sw->w.value = NULL;
    if (sw->w.result == RDZV_WAIT_CANCELLED)
      return true; /* the store is closing */
    if (sw->w.result == RDZV_WAIT_READY)
      sw->seen = sw->w.version;
  }
  memset(&sw->w, 0, sizeof(sw->w));
  sw->w.scope = sw->scope;
  sw->w.scope_len = strlen(sw->scope);
  sw->w.changes = true;
  sw->w.after = sw->seen;
  sw->w.deadline_ns = hvd_deadline_after_ms(WATCH_MS);
  sw->w.fire = watch_fired;
  sw->w.fire_arg = sw;
  atomic_store(&sw->sup, &d->sup);
  sw->parked = false;
  atomic_store(&sw->fired, false);
  sw->armed = true;
  if (rdzv_store_wait(d->store, &sw->w, watch_parked, sw) != HVD_OK) {
    /* Not registered (the store is full, say): the next tick tries again. */
    atomic_store(&sw->fired, true);
    return true;
  }
  if (!sw->parked) {
    /* Finished at once: no callback comes, and the scope changed. */
    atomic_store(&sw->fired, true);
    return false;
  }
  return true;
}

/* The end: takes every watch back from the store, which outlives the
 * driver in pods mode. */
void driver_watches_retire(struct driver *d) {
  int64_t deadline = hvd_deadline_after_ms(RETIRE_MS);
  bool kept = false;

  for (size_t i = 0; i < d->nwatches; i++) {
    struct scope_watch *sw = &d->watches[i];
    if (sw->started) {
      etcd_watch_retire(sw);
      sw->armed = false;
      continue;
    }
    if (!sw->armed)
      continue;
    if (!atomic_load(&sw->fired))
      (void)rdzv_store_abandon_wait(d->store, &sw->w);
    while (!atomic_load(&sw->fired) && hvd_now_ns() < deadline)
      hvd_sleep_ns(1000000);
    if (!atomic_load(&sw->fired)) {
      driver_say(d, "the store kept the driver's watch on scope '%s'", sw->scope);
      atomic_store(&sw->sup, NULL);
      kept = true;
      continue;
    }
    rdzv_blob_unref(sw->w.value);
    sw->w.value = NULL;
    sw->armed = false;
  }
  if (!kept) /* else left allocated: the store may still hand a watch back */
    free(d->watches);
  d->watches = NULL;
  d->nwatches = 0;
}

bool driver_watches_init(struct driver *d, const char *const *scopes, size_t n) {
  if ((d->watches = calloc(n, sizeof(*d->watches))) == NULL)
    return false;
  d->nwatches = n;
  for (size_t i = 0; i < n; i++) {
    d->watches[i].scope = scopes[i];
    d->watches[i].stop[0] = d->watches[i].stop[1] = -1;
  }
  return true;
}

bool driver_watch_arm(struct driver *d, struct scope_watch *sw) {
  return d->store != NULL ? local_watch_arm(d, sw) : etcd_watch_arm(d, sw);
}

