/*
 * The rendezvous key-value store.
 *
 * DESIGN. Two levels of maps: scope name -> scope, key -> value. Values are
 * reference-counted blobs so readers can send them after the lock is gone.
 * Every write bumps a store-wide version that becomes the value's ETag.
 * Each scope caches its serialized form (the body of a whole-scope GET)
 * until it next changes, so thousands of ranks fetching the same scope cost
 * one serialization. A planned scope knows how many ranks it has; ranks
 * announce they are done by deleting their rank key ("0".."size-1"), and the
 * last one clears the scope, counted per scope. Memory is bounded by
 * max_total_bytes, which charges keys, values, cached scope bodies and a
 * per-entry overhead, plus what is held outside the store on its behalf:
 * values and bodies it let go of that slow readers still hold, and request
 * bodies on their way in (the ledger, blob.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_private.h"

enum {
  CLOSE_DRAIN_MS = 10000, /* how long closing waits for fire callbacks to return */
  ENTRY_OVERHEAD = 64,  /* map slot, blob header, allocator slack */
  SCOPE_OVERHEAD = 256, /* scope struct, its maps' first tables */
};

void rdzv_store_limits_default(struct rdzv_store_limits *limits) {
  limits->max_name_bytes = 512;
  limits->max_value_bytes = 4u << 20;
  limits->max_total_bytes = 256u << 20;
}

static hvd_status check_name(const struct rdzv_store *s, const char *what, const char *name,
                             size_t len) {
  if (len == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "empty %s", what);
  if (len > s->limits.max_name_bytes)
    return hvd_error(HVD_ERR_TOO_LARGE, "%s of %zu bytes exceeds the limit of %zu bytes", what,
                     len, s->limits.max_name_bytes);
  (void)name;
  return HVD_OK;
}

static hvd_status check_names(const struct rdzv_store *s, const char *scope, size_t scope_len,
                              const char *key, size_t key_len) {
  hvd_status st = check_name(s, "scope", scope, scope_len);
  if (st == HVD_OK && key != NULL)
    st = check_name(s, "key", key, key_len);
  return st;
}

hvd_status rdzv_store_create(const struct rdzv_store_limits *limits, rdzv_fire_cb fire,
                             void *fire_arg, struct rdzv_store **out) {
  struct rdzv_store *s = calloc(1, sizeof(*s));
  int rc;

  if (s == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the rendezvous store");
  if (limits != NULL)
    s->limits = *limits;
  else
    rdzv_store_limits_default(&s->limits);
  s->fire = fire;
  s->fire_arg = fire_arg;
  hvd_map_init(&s->scopes);
  hvd_map_init(&s->plans);
  hvd_map_init(&s->rounds);
  if ((s->held = rdzv_ledger_create()) == NULL) {
    free(s);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the rendezvous store");
  }
  if ((rc = pthread_mutex_init(&s->mu, NULL)) != 0 || (rc = hvd_cond_init(&s->deadline_cond)) != 0 ||
      (rc = hvd_cond_init(&s->idle_cond)) != 0) {
    rdzv_ledger_unref(s->held);
    free(s);
    return hvd_error(HVD_ERR_IO, "rendezvous store: cannot create a lock: %s", strerror(rc));
  }
  if (rdzv_store_wait_start(s) != HVD_OK) {
    hvd_status st = hvd_error_status();
    rdzv_store_destroy(s);
    return st;
  }
  *out = s;
  return HVD_OK;
}

hvd_status rdzv_store_close(struct rdzv_store *s) {
  struct rdzv_waiter *fired = NULL;
  int64_t deadline;
  unsigned busy;

  pthread_mutex_lock(&s->mu);
  s->closing = true;
  s->stop_thread = true; /* the deadline thread leaves once it is not delivering */
  pthread_cond_signal(&s->deadline_cond);
  rdzv_store_wait_cancel_all(s, &fired);
  rdzv_store_unlock_deliver(s, fired);
  /* Whoever is still handing out waiters (a writer, the deadline thread)
   * must finish before the store may go; a callback that blocks for good
   * leaves it allocated rather than freed under that thread. */
  deadline = hvd_deadline_after_ms(CLOSE_DRAIN_MS);
  pthread_mutex_lock(&s->mu);
  while (s->delivering > 0 && hvd_cond_wait_until(&s->idle_cond, &s->mu, deadline) == 0) {
  }
  busy = s->delivering;
  pthread_mutex_unlock(&s->mu);
  if (busy > 0)
    return hvd_error(HVD_ERR_TIMEOUT,
                     "rendezvous store: %u thread(s) still handing out finished waiters after "
                     "%d ms; the store is left allocated",
                     busy, CLOSE_DRAIN_MS);
  rdzv_store_wait_stop(s);
  return HVD_OK;
}

bool rdzv_store_fits(struct rdzv_store *s, size_t bytes, size_t freed) {
  size_t used = s->bytes - freed + rdzv_ledger_bytes(s->held);
  return used <= s->limits.max_total_bytes && bytes <= s->limits.max_total_bytes - used;
}

/* Drops the cached scope body (readers may still hold it: the ledger counts it then). */
static void invalidate(struct rdzv_store *s, struct rdzv_scope *scope) {
  if (scope->snapshot == NULL)
    return;
  s->bytes -= scope->snapshot->len;
  rdzv_blob_release_to(scope->snapshot, s->held);
  scope->snapshot = NULL;
}

/* Releases the scope's items, finished marks and snapshot; leaves it empty.
 * The caller settles s->bytes for the items (scope->bytes). */
static void drop_items(struct rdzv_store *s, struct rdzv_scope *scope) {
  struct hvd_map_iter it = {0};
  void *value;

  while (hvd_map_iter_next(&scope->items, &it, NULL, NULL, &value))
    rdzv_blob_release_to(value, s->held);
  hvd_map_fini(&scope->items);
  hvd_map_fini(&scope->finished);
  invalidate(s, scope);
  scope->bytes = 0;
}

static void free_scope(struct rdzv_store *s, struct rdzv_scope *scope) {
  drop_items(s, scope);
  free(scope->name);
  free(scope);
}

void rdzv_store_destroy(struct rdzv_store *s) {
  struct hvd_map_iter it = {0};
  void *value;

  if (s == NULL)
    return;
  if (rdzv_store_close(s) != HVD_OK) {
    /* A thread may still be inside the store: leaking it is the safe choice. */
    HVD_LOG_ERROR("%s", hvd_last_error_message());
    return;
  }
  while (hvd_map_iter_next(&s->scopes, &it, NULL, NULL, &value))
    free_scope(s, value);
  hvd_map_fini(&s->scopes);
  hvd_map_fini(&s->plans);
  hvd_map_fini(&s->rounds);
  rdzv_ledger_unref(s->held);
  free(s->heap);
  pthread_cond_destroy(&s->deadline_cond);
  pthread_cond_destroy(&s->idle_cond);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ---- scopes (called with the lock held) ---------------------------------- */

struct rdzv_scope *rdzv_store_find_scope(struct rdzv_store *s, const char *name, size_t len) {
  return hvd_map_get(&s->scopes, name, len);
}

struct rdzv_scope *rdzv_store_get_scope(struct rdzv_store *s, const char *name, size_t len) {
  struct rdzv_scope *scope = rdzv_store_find_scope(s, name, len);

  if (scope != NULL)
    return scope;
  if (!rdzv_store_fits(s, SCOPE_OVERHEAD + len, 0)) {
    hvd_error(HVD_ERR_TOO_LARGE, "the store is full (%zu of %zu bytes used)",
              s->bytes + rdzv_ledger_bytes(s->held), s->limits.max_total_bytes);
    return NULL;
  }
  scope = calloc(1, sizeof(*scope));
  if (scope == NULL || (scope->name = hvd_strndup(name, len)) == NULL) {
    free(scope);
    hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate a scope");
    return NULL;
  }
  scope->name_len = len;
  scope->min_count_bound = SIZE_MAX;
  hvd_map_init(&scope->items);
  hvd_map_init(&scope->finished);
  if (hvd_map_put(&s->scopes, name, len, scope, NULL) != HVD_OK) {
    free_scope(s, scope);
    return NULL;
  }
  s->bytes += SCOPE_OVERHEAD + len;
  return scope;
}

void rdzv_store_maybe_drop_scope(struct rdzv_store *s, struct rdzv_scope *scope) {
  if (scope->items.count > 0 || scope->finished.count > 0 || scope->key_waiters != NULL ||
      scope->count_waiters != NULL || scope->change_waiters != NULL)
    return;
  hvd_map_remove(&s->scopes, scope->name, scope->name_len);
  s->bytes -= SCOPE_OVERHEAD + scope->name_len;
  free_scope(s, scope);
}

static size_t entry_cost(size_t key_len, size_t value_len) {
  return key_len + value_len + ENTRY_OVERHEAD;
}

/* A write: a new store version, which is the scope's latest change. */
static void changed(struct rdzv_store *s, struct rdzv_scope *scope) {
  s->version++;
  scope->changed = s->version;
}

/* Removes every item (and finished mark) of the scope; its change waiters
 * go onto *fired. */
static void clear_scope(struct rdzv_store *s, struct rdzv_scope *scope,
                        struct rdzv_waiter **fired) {
  s->keys -= scope->items.count;
  s->bytes -= scope->bytes;
  changed(s, scope);
  drop_items(s, scope);
  rdzv_store_wait_changed(s, scope, fired);
}

struct sort_item {
  const char *key;
  size_t key_len;
  struct rdzv_blob *value;
};

static int sort_item_cmp(const void *a, const void *b) {
  const struct sort_item *x = a;
  const struct sort_item *y = b;
  return rdzv_key_compare(x->key, x->key_len, y->key, y->key_len);
}

hvd_status rdzv_store_scope_snapshot(struct rdzv_store *s, struct rdzv_scope *scope,
                                struct rdzv_blob **out) {
  struct hvd_map_iter it = {0};
  struct sort_item *items = NULL;
  struct hvd_buf body;
  size_t n = 0;
  size_t size = 0;
  hvd_status st = HVD_OK;

  if (scope->snapshot != NULL) {
    *out = rdzv_blob_ref(scope->snapshot);
    return HVD_OK;
  }
  hvd_buf_init(&body, 0);
  if (scope->items.count > 0) {
    items = malloc(scope->items.count * sizeof(*items));
    if (items == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "cannot serialize scope of %zu keys",
                       scope->items.count);
  }
  for (;;) {
    const char *key;
    size_t key_len;
    void *value;
    if (!hvd_map_iter_next(&scope->items, &it, &key, &key_len, &value))
      break;
    items[n] = (struct sort_item){key, key_len, value};
    size += key_len + items[n].value->len + 48; /* 48: two lengths and separators */
    n++;
  }
  if (n > 1)
    qsort(items, n, sizeof(*items), sort_item_cmp);
  st = hvd_buf_reserve(&body, size);
  for (size_t i = 0; i < n && st == HVD_OK; i++)
    st = rdzv_scope_encode_entry(&body, items[i].key, items[i].key_len, items[i].value->data,
                                 items[i].value->len);
  if (st == HVD_OK && !rdzv_store_fits(s, body.len, 0))
    st = hvd_error(HVD_ERR_TOO_LARGE,
                   "the store is full: %zu of %zu bytes used, a body of %zu bytes for scope "
                   "'%s' does not fit",
                   s->bytes + rdzv_ledger_bytes(s->held), s->limits.max_total_bytes, body.len,
                   scope->name);
  if (st == HVD_OK) {
    scope->snapshot = rdzv_blob_create(body.data, body.len, s->version);
    if (scope->snapshot == NULL) {
      st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate a scope body of %zu bytes", body.len);
    } else {
      scope->snapshot_count = n;
      s->bytes += body.len;
    }
  }
  hvd_buf_fini(&body);
  free(items);
  if (st == HVD_OK)
    *out = rdzv_blob_ref(scope->snapshot);
  return st;
}

/* ---- public operations ---------------------------------------------------- */

void rdzv_store_reset(struct rdzv_store *s) {
  struct rdzv_waiter *fired = NULL;
  struct hvd_map_iter it = {0};
  void *value;

  pthread_mutex_lock(&s->mu);
  while (hvd_map_iter_next(&s->scopes, &it, NULL, NULL, &value)) {
    struct rdzv_scope *scope = value;
    clear_scope(s, scope, &fired);
    if (scope->key_waiters == NULL && scope->count_waiters == NULL &&
        scope->change_waiters == NULL) {
      hvd_map_iter_remove(&s->scopes, &it);
      s->bytes -= SCOPE_OVERHEAD + scope->name_len;
      free_scope(s, scope);
    }
  }
  hvd_map_fini(&s->plans);
  hvd_map_fini(&s->rounds);
  rdzv_store_unlock_deliver(s, fired);
}

hvd_status rdzv_store_plan(struct rdzv_store *s, const char *scope, size_t scope_len,
                           size_t size) {
  hvd_status st = check_names(s, scope, scope_len, NULL, 0);

  if (st != HVD_OK)
    return st;
  pthread_mutex_lock(&s->mu);
  if (size == 0)
    hvd_map_remove(&s->plans, scope, scope_len);
  else
    st = hvd_map_put(&s->plans, scope, scope_len, (void *)(uintptr_t)size, NULL);
  pthread_mutex_unlock(&s->mu);
  return st;
}

size_t rdzv_store_plan_rounds(struct rdzv_store *s, const char *scope, size_t scope_len) {
  uintptr_t rounds;
  pthread_mutex_lock(&s->mu);
  rounds = (uintptr_t)hvd_map_get(&s->rounds, scope, scope_len);
  pthread_mutex_unlock(&s->mu);
  return (size_t)rounds;
}

hvd_status rdzv_store_get(struct rdzv_store *s, const char *scope, size_t scope_len,
                          const char *key, size_t key_len, struct rdzv_blob **out) {
  hvd_status st = check_names(s, scope, scope_len, key, key_len);
  struct rdzv_scope *sc;
  struct rdzv_blob *value = NULL;

  if (st != HVD_OK)
    return st;
  pthread_mutex_lock(&s->mu);
  sc = rdzv_store_find_scope(s, scope, scope_len);
  if (sc != NULL)
    value = rdzv_blob_ref(hvd_map_get(&sc->items, key, key_len));
  pthread_mutex_unlock(&s->mu);
  if (value == NULL)
    return hvd_error(HVD_ERR_NOT_FOUND, "no key '%.*s' in scope '%.*s'", (int)key_len, key,
                     (int)scope_len, scope);
  *out = value;
  return HVD_OK;
}

/* Replaces (or inserts) the value of key; the lock is held. */
static hvd_status put_locked(struct rdzv_store *s, struct rdzv_scope *scope, const char *key,
                             size_t key_len, const void *data, size_t len,
                             struct rdzv_blob *old, uint64_t *version) {
  size_t old_cost = old != NULL ? entry_cost(key_len, old->len) : 0;
  size_t new_cost = entry_cost(key_len, len);
  struct rdzv_blob *blob;

  if (!rdzv_store_fits(s, new_cost, old_cost))
    return hvd_error(HVD_ERR_TOO_LARGE,
                     "the store is full: %zu of %zu bytes used, storing %zu more does not fit",
                     s->bytes + rdzv_ledger_bytes(s->held), s->limits.max_total_bytes, len);
  blob = rdzv_blob_create(data, len, s->version + 1);
  if (blob == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate a value of %zu bytes", len);
  if (hvd_map_put(&scope->items, key, key_len, blob, NULL) != HVD_OK) {
    rdzv_blob_unref(blob);
    return hvd_error_status();
  }
  changed(s, scope);
  rdzv_blob_release_to(old, s->held);
  if (old == NULL)
    s->keys++;
  s->bytes = s->bytes - old_cost + new_cost;
  scope->bytes = scope->bytes - old_cost + new_cost;
  invalidate(s, scope);
  *version = blob->version;
  return HVD_OK;
}

hvd_status rdzv_store_set(struct rdzv_store *s, const char *scope, size_t scope_len,
                          const char *key, size_t key_len, const void *data, size_t len,
                          enum rdzv_set_condition cond, uint64_t expected_version,
                          uint64_t *version, struct rdzv_blob **current) {
  hvd_status st = check_names(s, scope, scope_len, key, key_len);
  struct rdzv_waiter *fired = NULL;
  struct rdzv_scope *sc;
  struct rdzv_blob *old;
  uint64_t new_version = 0;

  if (st != HVD_OK)
    return st;
  if (len > s->limits.max_value_bytes)
    return hvd_error(HVD_ERR_TOO_LARGE, "value of %zu bytes exceeds the limit of %zu bytes", len,
                     s->limits.max_value_bytes);
  pthread_mutex_lock(&s->mu);
  sc = rdzv_store_get_scope(s, scope, scope_len);
  if (sc == NULL) {
    st = hvd_error_status();
    goto out;
  }
  old = hvd_map_get(&sc->items, key, key_len);
  if ((cond == RDZV_SET_IF_ABSENT && old != NULL) ||
      (cond == RDZV_SET_IF_VERSION && (old == NULL || old->version != expected_version))) {
    if (current != NULL)
      *current = rdzv_blob_ref(old);
    st = hvd_error(HVD_ERR_CONFLICT, "'%.*s/%.*s' %s", (int)scope_len, scope, (int)key_len, key,
                   old == NULL ? "does not exist" : "has another version");
    rdzv_store_maybe_drop_scope(s, sc);
    goto out;
  }
  st = put_locked(s, sc, key, key_len, data, len, old, &new_version);
  if (st == HVD_OK)
    rdzv_store_wait_check(s, sc, key, key_len, &fired);
  else
    rdzv_store_maybe_drop_scope(s, sc);
out:
  rdzv_store_unlock_deliver(s, fired);
  if (st == HVD_OK && version != NULL)
    *version = new_version;
  return st;
}

hvd_status rdzv_store_add(struct rdzv_store *s, const char *scope, size_t scope_len,
                          const char *key, size_t key_len, int64_t delta, int64_t *result,
                          uint64_t *version) {
  hvd_status st = check_names(s, scope, scope_len, key, key_len);
  struct rdzv_waiter *fired = NULL;
  struct rdzv_scope *sc;
  struct rdzv_blob *old;
  int64_t current = 0;
  uint64_t new_version = 0;
  char text[24];
  int n;

  if (st != HVD_OK)
    return st;
  pthread_mutex_lock(&s->mu);
  sc = rdzv_store_get_scope(s, scope, scope_len);
  if (sc == NULL) {
    st = hvd_error_status();
    goto out;
  }
  old = hvd_map_get(&sc->items, key, key_len);
  if (old != NULL && !hvd_parse_int64((const char *)old->data, old->len, &current)) {
    st = hvd_error(HVD_ERR_CONFLICT, "'%.*s/%.*s' holds %zu bytes that are not a decimal integer",
                   (int)scope_len, scope, (int)key_len, key, old->len);
    goto out;
  }
  if ((delta > 0 && current > INT64_MAX - delta) || (delta < 0 && current < INT64_MIN - delta)) {
    st = hvd_error(HVD_ERR_CONFLICT, "adding %lld to '%.*s/%.*s' (%lld) overflows 64 bits",
                   (long long)delta, (int)scope_len, scope, (int)key_len, key,
                   (long long)current);
    goto out;
  }
  current += delta;
  n = snprintf(text, sizeof(text), "%lld", (long long)current);
  st = put_locked(s, sc, key, key_len, text, (size_t)n, old, &new_version);
  if (st == HVD_OK)
    rdzv_store_wait_check(s, sc, key, key_len, &fired);
out:
  if (sc != NULL && st != HVD_OK)
    rdzv_store_maybe_drop_scope(s, sc);
  rdzv_store_unlock_deliver(s, fired);
  if (st == HVD_OK) {
    *result = current;
    if (version != NULL)
      *version = new_version;
  }
  return st;
}

/* The planned size of a scope, or 0. */
static size_t planned_size(struct rdzv_store *s, const char *scope, size_t scope_len) {
  return (size_t)(uintptr_t)hvd_map_get(&s->plans, scope, scope_len);
}

/* Whether key is a canonical decimal rank below size ("0", "17"; not "017"). */
static bool is_rank_key(const char *key, size_t len, size_t size) {
  int64_t rank;
  if (len == 0 || (len > 1 && key[0] == '0') || key[0] == '-' || key[0] == '+')
    return false;
  return hvd_parse_int64(key, len, &rank) && rank >= 0 && (uint64_t)rank < size;
}

hvd_status rdzv_store_delete(struct rdzv_store *s, const char *scope, size_t scope_len,
                             const char *key, size_t key_len) {
  hvd_status st = check_names(s, scope, scope_len, key, key_len);
  struct rdzv_waiter *fired = NULL;
  struct rdzv_scope *sc;
  size_t size;

  if (st != HVD_OK)
    return st;
  pthread_mutex_lock(&s->mu);
  size = planned_size(s, scope, scope_len);
  if (size > 0 && is_rank_key(key, key_len, size)) {
    sc = rdzv_store_get_scope(s, scope, scope_len);
    if (sc == NULL) {
      st = hvd_error_status();
    } else if (hvd_map_get(&sc->finished, key, key_len) == NULL) {
      st = hvd_map_put(&sc->finished, key, key_len, sc, NULL);
      if (st == HVD_OK && sc->finished.count == size) {
        uintptr_t rounds = (uintptr_t)hvd_map_get(&s->rounds, scope, scope_len);
        HVD_LOG_DEBUG("scope '%.*s': all %zu ranks finished, clearing it", (int)scope_len, scope,
                      size);
        clear_scope(s, sc, &fired);
        (void)hvd_map_put(&s->rounds, scope, scope_len, (void *)(rounds + 1), NULL);
      }
    }
  } else {
    sc = rdzv_store_find_scope(s, scope, scope_len);
    struct rdzv_blob *old = sc != NULL ? hvd_map_remove(&sc->items, key, key_len) : NULL;
    if (old != NULL) {
      size_t cost = entry_cost(key_len, old->len);
      s->bytes -= cost;
      sc->bytes -= cost;
      s->keys--;
      changed(s, sc);
      invalidate(s, sc);
      rdzv_blob_release_to(old, s->held);
      rdzv_store_wait_changed(s, sc, &fired);
    }
  }
  if (sc != NULL)
    rdzv_store_maybe_drop_scope(s, sc);
  rdzv_store_unlock_deliver(s, fired);
  return st;
}

hvd_status rdzv_store_delete_scope(struct rdzv_store *s, const char *scope, size_t scope_len) {
  hvd_status st = check_names(s, scope, scope_len, NULL, 0);
  struct rdzv_waiter *fired = NULL;
  struct rdzv_scope *sc;

  if (st != HVD_OK)
    return st;
  pthread_mutex_lock(&s->mu);
  sc = rdzv_store_find_scope(s, scope, scope_len);
  if (sc != NULL) {
    clear_scope(s, sc, &fired);
    rdzv_store_maybe_drop_scope(s, sc);
  }
  rdzv_store_unlock_deliver(s, fired);
  return HVD_OK;
}

hvd_status rdzv_store_snapshot(struct rdzv_store *s, const char *scope, size_t scope_len,
                               struct rdzv_blob **out, size_t *count) {
  hvd_status st = check_names(s, scope, scope_len, NULL, 0);
  struct rdzv_scope *sc;

  if (st != HVD_OK)
    return st;
  pthread_mutex_lock(&s->mu);
  sc = rdzv_store_find_scope(s, scope, scope_len);
  if (sc == NULL) {
    *out = rdzv_blob_create(NULL, 0, s->version);
    *count = 0;
    if (*out == NULL)
      st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate an empty scope body");
  } else {
    st = rdzv_store_scope_snapshot(s, sc, out);
    if (st == HVD_OK)
      *count = sc->snapshot_count;
  }
  pthread_mutex_unlock(&s->mu);
  return st;
}

void rdzv_store_get_stats(struct rdzv_store *s, struct rdzv_store_stats *out) {
  pthread_mutex_lock(&s->mu);
  out->scopes = s->scopes.count;
  out->keys = s->keys;
  out->bytes = s->bytes;
  out->held_bytes = rdzv_ledger_bytes(s->held);
  out->waiters = s->heap_len;
  out->planned_scopes = s->plans.count;
  pthread_mutex_unlock(&s->mu);
}

hvd_status rdzv_store_reserve(struct rdzv_store *s, size_t bytes) {
  hvd_status st = HVD_OK;

  pthread_mutex_lock(&s->mu);
  if (rdzv_store_fits(s, bytes, 0))
    rdzv_ledger_charge(s->held, bytes);
  else
    st = hvd_error(HVD_ERR_TOO_LARGE,
                   "the store is full: %zu of %zu bytes used, %zu more bytes do not fit",
                   s->bytes + rdzv_ledger_bytes(s->held), s->limits.max_total_bytes, bytes);
  pthread_mutex_unlock(&s->mu);
  return st;
}

void rdzv_store_unreserve(struct rdzv_store *s, size_t bytes) {
  rdzv_ledger_discharge(s->held, bytes);
}
