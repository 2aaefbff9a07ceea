/*
 * The rendezvous client's backend for an etcd cluster (v3 API, through its
 * JSON gateway: POST /v3/kv/range|put|txn|deleterange, /v3/watch,
 * /v3/lease/grant|keepalive, /v3/auth/authenticate), with libcurl and cJSON.
 *
 * DESIGN. A key is "<prefix>/<scope>/<key>"; a scope is the range of its
 * prefix, read whole in one range request. Every key is written under the
 * job's lease, whose id the first writer publishes at "<prefix>/_lease"
 * (attached to the lease itself, so it goes when the lease does); every
 * process of the job keeps that lease alive while it uses the store, so
 * the keys of a dead job expire by themselves. Waits are watches from the
 * revision a read saw: nothing polls. A request goes to one member; one
 * that cannot be reached, has no leader or does not answer in time is
 * retried on the next member until the call's deadline, so a cluster that
 * lost its leader costs a pause and one that lost its quorum a clear
 * error at the deadline, never a hang. Compare-and-set and add are
 * transactions on a key's mod revision, which is its version.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_private.h"

/* ---- the operations ------------------------------------------------------------------ */

static int64_t call_deadline(const struct rdzv_client *c) {
  return hvd_deadline_after_ms(c->timeout_ms);
}

/* e->keybuf = the key (or the scope's range start, key NULL); with a
 * scope, e->endbuf = the range's end. */
hvd_status rdzv_etcd_name_key(struct rdzv_client *c, const char *scope, const char *key) {
  struct etcd *e = etcd_of(c);
  hvd_status st;

  if (strchr(scope, '/') != NULL || scope[0] == '_')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "rendezvous %s: scope '%s': a scope name in etcd must not hold '/' nor start "
                     "with '_' (the job's own keys)",
                     c->where, scope);
  if ((st = rdzv_etcd_key(&e->keybuf, e->prefix, scope, key)) != HVD_OK || key != NULL)
    return st;
  hvd_buf_reset(&e->endbuf);
  if ((st = hvd_buf_reserve(&e->endbuf, e->keybuf.len)) != HVD_OK)
    return st;
  rdzv_etcd_range_end(e->keybuf.data, e->keybuf.len, e->endbuf.data);
  e->endbuf.len = e->keybuf.len;
  e->endbuf.data[e->endbuf.len] = '\0';
  return HVD_OK;
}

static void describe(char *out, size_t size, const char *verb, const char *scope, const char *key) {
  snprintf(out, size, "%s /%s%s%s", verb, scope, key != NULL ? "/" : "", key != NULL ? key : "");
}

/* A put of e->keybuf under the job's lease; once more with a new lease if
 * the job's expired meanwhile. */
static hvd_status put(struct rdzv_client *c, const char *what, const void *value, size_t len,
                      int64_t deadline_ns) {
  struct etcd *e = etcd_of(c);
  hvd_status st = HVD_ERR_INTERNAL;

  for (int attempt = 0; attempt < 2; attempt++) {
    char id[24];
    cJSON *body = cJSON_CreateObject();
    if ((st = rdzv_etcd_keep_lease(c, what, true, deadline_ns)) != HVD_OK) {
      cJSON_Delete(body);
      return st;
    }
    snprintf(id, sizeof(id), "%" PRId64, e->lease);
    if (body == NULL ||
        rdzv_etcd_json_add_bytes(body, "key", e->keybuf.data, e->keybuf.len) != HVD_OK ||
        rdzv_etcd_json_add_bytes(body, "value", value, len) != HVD_OK ||
        cJSON_AddStringToObject(body, "lease", id) == NULL) {
      cJSON_Delete(body);
      return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
    }
    st = rdzv_etcd_call(c, "kv/put", what, body, deadline_ns, true);
    cJSON_Delete(body);
    if (st != HVD_ERR_NOT_FOUND) /* lease not found: it expired */
      return st;
    e->lease = 0;
  }
  return st;
}

static hvd_status etcd_set(struct rdzv_client *c, const char *scope, const char *key,
                           const void *value, size_t len) {
  char what[256];
  int64_t deadline = call_deadline(c);
  hvd_status st;

  describe(what, sizeof(what), "PUT", scope, key);
  if ((st = rdzv_etcd_ready(c, deadline)) != HVD_OK ||
      (st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK)
    return st;
  return put(c, what, value, len, deadline);
}

enum {
  /* A scope's body that a marker may hold: etcd refuses requests above
   * 1.5 MiB by default (--max-request-bytes), base64 adds a third. */
  MARKER_BODY_MAX = 1024 * 1024,
};

enum range_of {
  RANGE_KEY,   /* e->keybuf alone */
  RANGE_SCOPE, /* [e->keybuf, e->endbuf) */
  RANGE_COUNT, /* the same, counted only */
};

/* A range read, renewing the job's lease on the way. */
static hvd_status range(struct rdzv_client *c, const char *what, enum range_of of,
                        int64_t deadline_ns) {
  struct etcd *e = etcd_of(c);
  cJSON *body;
  hvd_status st;

  if ((st = rdzv_etcd_keep_lease(c, what, false, deadline_ns)) != HVD_OK)
    return st;
  body = rdzv_etcd_range_body(&e->keybuf, of != RANGE_KEY ? &e->endbuf : NULL);
  if (body == NULL || (of == RANGE_COUNT && cJSON_AddTrueToObject(body, "count_only") == NULL)) {
    cJSON_Delete(body);
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  }
  st = rdzv_etcd_call(c, "kv/range", what, body, deadline_ns, true);
  cJSON_Delete(body);
  return st;
}

static hvd_status take_value(struct etcd *e, struct hvd_buf *out) {
  if (out == NULL)
    return HVD_OK;
  hvd_buf_reset(out);
  return hvd_buf_append(out, e->value.data ? e->value.data : "", e->value.len);
}

static hvd_status etcd_get(struct rdzv_client *c, const char *scope, const char *key,
                           struct hvd_buf *value, uint64_t *version) {
  struct etcd *e = etcd_of(c);
  char what[256];
  int64_t deadline = call_deadline(c), mod = 0;
  const cJSON *kv;
  hvd_status st;

  describe(what, sizeof(what), "GET", scope, key);
  if ((st = rdzv_etcd_ready(c, deadline)) != HVD_OK ||
      (st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK ||
      (st = range(c, what, RANGE_KEY, deadline)) != HVD_OK)
    return st;
  if ((kv = rdzv_etcd_first_kv(e->answer)) == NULL)
    return hvd_error(HVD_ERR_NOT_FOUND, "rendezvous %s: %s: no such key", c->where, what);
  if (!rdzv_etcd_kv_value(&e->value, kv) || !rdzv_etcd_json_int64(kv, "mod_revision", &mod))
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer", c->where,
                     what);
  if (version != NULL)
    *version = (uint64_t)mod;
  return take_value(e, value);
}

/* The wait for one key: done at its first put. */
static bool key_put(const cJSON *event, int64_t revision, void *arg) {
  struct etcd *e = arg;
  (void)revision;
  return rdzv_etcd_event_is_put(event) &&
         rdzv_etcd_kv_value(&e->value, cJSON_GetObjectItemCaseSensitive(event, "kv"));
}

static hvd_status timed_out(struct rdzv_client *c, const char *what, const char *missing,
                            int64_t started_ns, int64_t deadline_ns) {
  return hvd_error(HVD_ERR_TIMEOUT,
                   "rendezvous %s: %s: %s did not appear within %.1f s; check that the ranks "
                   "that publish it are running, or raise HOROVOD_GLOO_TIMEOUT_SECONDS",
                   c->where, what, missing, (double)(deadline_ns - started_ns) / 1e9);
}

static hvd_status etcd_wait(struct rdzv_client *c, const char *scope, const char *key,
                            int64_t deadline_ns, struct hvd_buf *value) {
  struct etcd *e = etcd_of(c);
  char what[256];
  int64_t started = hvd_now_ns();
  hvd_status st;

  describe(what, sizeof(what), "GET (wait)", scope, key);
  if ((st = rdzv_etcd_ready(c, deadline_ns)) != HVD_OK)
    return st;
  for (;;) {
    int64_t revision = 0;
    bool resync;
    const cJSON *kv;
    if ((st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK ||
        (st = range(c, what, RANGE_KEY, deadline_ns)) != HVD_OK)
      return st;
    if ((kv = rdzv_etcd_first_kv(e->answer)) != NULL) {
      if (!rdzv_etcd_kv_value(&e->value, kv))
        return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer",
                         c->where, what);
      return take_value(e, value);
    }
    rdzv_etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision",
                         &revision);
    st = rdzv_etcd_watch(c, what, e->keybuf.data, e->keybuf.len, NULL, 0, revision + 1, deadline_ns,
                         key_put, e, &resync);
    if (st == HVD_ERR_TIMEOUT)
      return timed_out(c, what, "the key", started, deadline_ns);
    if (st != HVD_OK)
      return st;
    if (e->watch_done)
      return take_value(e, value);
  }
}

/* A scope's wait for a count of keys ends at the put of its marker, whose
 * value (the scope's body, if it fitted) goes to e->value. */
static bool marker_put(const cJSON *event, int64_t revision, void *arg) {
  struct etcd *e = arg;
  (void)revision;
  if (!rdzv_etcd_event_is_put(event))
    return false;
  if (!rdzv_etcd_kv_value(&e->value, cJSON_GetObjectItemCaseSensitive(event, "kv")))
    hvd_buf_reset(&e->value);
  return true;
}

struct sorted_kv {
  const char *key; /* after the scope's prefix */
  size_t key_len;
  const cJSON *kv;
  struct hvd_buf raw; /* the decoded key */
};

static int by_key(const void *a, const void *b) {
  const struct sorted_kv *x = a, *y = b;
  return rdzv_key_compare(x->key, x->key_len, y->key, y->key_len);
}

/* The range answer in e->answer as a scope view, in the store's order;
 * with copy, its encoded body in copy too. */
static hvd_status scope_view(struct rdzv_client *c, const char *what, struct rdzv_scope_view *out,
                             struct hvd_buf *copy) {
  struct etcd *e = etcd_of(c);
  const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(e->answer, "kvs"), *kv;
  size_t n = (size_t)cJSON_GetArraySize(kvs), i = 0, skip = e->keybuf.len;
  struct sorted_kv *items = calloc(n ? n : 1, sizeof(*items));
  struct hvd_buf body;
  hvd_status st = items != NULL ? HVD_OK : hvd_error(HVD_ERR_NO_MEMORY, "out of memory");

  hvd_buf_init(&body, 0);
  cJSON_ArrayForEach(kv, kvs) {
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(kv, "key");
    if (st != HVD_OK)
      break;
    hvd_buf_init(&items[i].raw, 0);
    if (!cJSON_IsString(k) || !rdzv_etcd_base64_decode(k->valuestring, &items[i].raw) ||
        items[i].raw.len < skip || memcmp(items[i].raw.data, e->keybuf.data, skip) != 0)
      st =
          hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a key outside the scope", c->where, what);
    items[i].key = items[i].raw.data ? items[i].raw.data + skip : "";
    items[i].key_len = items[i].raw.len - skip;
    items[i].kv = kv;
    i++;
  }
  if (st == HVD_OK)
    qsort(items, n, sizeof(*items), by_key);
  for (i = 0; st == HVD_OK && i < n; i++) {
    if (!rdzv_etcd_kv_value(&e->value, items[i].kv))
      st = hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed value", c->where, what);
    else
      st = rdzv_scope_encode_entry(&body, items[i].key, items[i].key_len, e->value.data,
                                   e->value.len);
  }
  for (i = 0; items != NULL && i < n; i++)
    hvd_buf_fini(&items[i].raw);
  free(items);
  if (st != HVD_OK) {
    hvd_buf_fini(&body);
    return st;
  }
  size_t len;
  if (copy != NULL) {
    hvd_buf_reset(copy);
    if (hvd_buf_append(copy, body.data ? body.data : "", body.len) != HVD_OK)
      hvd_buf_reset(copy); /* no copy: the marker goes without the scope */
  }
  char *text = hvd_buf_detach(&body, &len);
  if (text == NULL && (text = calloc(1, 1)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  return rdzv_scope_decode(text, len, out);
}

/* e->keybuf = the marker of a scope's count: "<prefix>/_full/<scope>/<count>". */
static hvd_status name_marker(struct rdzv_client *c, const char *scope, size_t count) {
  struct etcd *e = etcd_of(c);
  hvd_buf_reset(&e->keybuf);
  return hvd_buf_printf(&e->keybuf, "%s/_full/%s/%zu", e->prefix, scope, count);
}

/* Puts the marker of a scope's count, holding the scope's body when it
 * fits in one etcd request. A put, not a creation: the marker of an
 * earlier fill of the scope (emptied since) may still be there, and its
 * waiters watch for a put after their count. */
static void put_marker(struct rdzv_client *c, const char *what, const char *scope, size_t count,
                       const struct hvd_buf *body, int64_t deadline_ns) {
  size_t len = body->len <= MARKER_BODY_MAX ? body->len : 0;

  if (name_marker(c, scope, count) != HVD_OK ||
      put(c, what, len ? body->data : "", len, deadline_ns) != HVD_OK)
    HVD_LOG_DEBUG("%s (the others read the scope after a watch chunk)", hvd_last_error_message());
}

/*
 * Waiting for a scope to hold min_count keys, as a rendezvous of N ranks
 * does, without N^2 work: if every waiter watched the scope, each would
 * see every put, and each would then read all N records. Instead a client
 * whose count (a count-only read) falls short watches one marker key for
 * that scope and count; the client whose first count finds enough (the
 * last rank to arrive) reads the scope and puts the marker, holding the
 * scope's body, so that the others take the scope from the watch's event.
 * A marker without a body (too large for one request) sends the others
 * to read the scope; each watch chunk counts again, so a marker that never
 * came (its writer died) costs a chunk at most.
 */
static hvd_status etcd_get_scope(struct rdzv_client *c, const char *scope, size_t min_count,
                                 int64_t deadline_ns, struct rdzv_scope_view *out) {
  struct etcd *e = etcd_of(c);
  struct hvd_buf body;
  char what[256];
  int64_t started = hvd_now_ns();
  bool first = true;
  hvd_status st;

  describe(what, sizeof(what), "GET", scope, NULL);
  if ((st = rdzv_etcd_ready(c, deadline_ns)) != HVD_OK)
    return st;
  hvd_buf_init(&body, 0);
  for (;; first = false) {
    int64_t revision = 0, count = 0, chunk_end;
    bool resync;
    if ((st = rdzv_etcd_name_key(c, scope, NULL)) != HVD_OK ||
        (st = range(c, what, min_count > 0 ? RANGE_COUNT : RANGE_SCOPE, deadline_ns)) != HVD_OK)
      break;
    rdzv_etcd_json_int64(e->answer, "count", &count);
    if (count >= (int64_t)min_count && min_count > 0 &&
        (st = range(c, what, RANGE_SCOPE, deadline_ns)) != HVD_OK)
      break;
    rdzv_etcd_json_int64(e->answer, "count", &count);
    if (count >= (int64_t)min_count) {
      st = scope_view(c, what, out, first && min_count > 0 ? &body : NULL);
      if (st == HVD_OK && first && min_count > 0)
        put_marker(c, what, scope, min_count, &body, deadline_ns);
      break;
    }
    rdzv_etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision",
                         &revision);
    if ((st = name_marker(c, scope, min_count)) != HVD_OK)
      break;
    hvd_buf_reset(&e->value);
    /* One chunk, then count again: rdzv_etcd_watch itself would go on
     * until the deadline, and a marker may never come (the keys' writers
     * do not read the scope with this count, or died). */
    chunk_end = hvd_deadline_after_ms(ETCD_WATCH_CHUNK_MS);
    st = rdzv_etcd_watch(c, what, e->keybuf.data, e->keybuf.len, NULL, 0, revision + 1,
                         chunk_end < deadline_ns ? chunk_end : deadline_ns, marker_put, e, &resync);
    if (st == HVD_OK && e->watch_done && e->value.len > 0) {
      size_t len;
      char *text = hvd_buf_detach(&e->value, &len);
      if ((st = rdzv_scope_decode(text, len, out)) == HVD_OK && out->count >= min_count)
        break;
      rdzv_scope_view_fini(out);
      st = HVD_OK; /* a marker that does not hold the scope: read it */
    }
    if (st == HVD_ERR_TIMEOUT && hvd_now_ns() >= deadline_ns) {
      st = timed_out(c, what, "enough keys", started, deadline_ns);
      break;
    }
    if (st != HVD_OK && st != HVD_ERR_TIMEOUT)
      break;
    /* the marker came, a chunk ended, or etcd ended the watch: count again */
  }
  hvd_buf_fini(&body);
  return st;
}

/* A scope's change wait: done at the first event. */
static bool any_event(const cJSON *event, int64_t revision, void *arg) {
  (void)event;
  *(int64_t *)arg = revision;
  return true;
}

static hvd_status etcd_wait_change(struct rdzv_client *c, const char *scope, uint64_t after,
                                   int64_t deadline_ns, uint64_t *version) {
  struct etcd *e = etcd_of(c);
  char what[256];
  int64_t from = (int64_t)after + 1, seen = 0;
  bool resync;
  hvd_status st;

  describe(what, sizeof(what), "WATCH", scope, NULL);
  if ((st = rdzv_etcd_ready(c, deadline_ns)) != HVD_OK ||
      (st = rdzv_etcd_name_key(c, scope, NULL)) != HVD_OK)
    return st;
  if (after == 0) { /* from now on */
    if ((st = range(c, what, RANGE_COUNT, deadline_ns)) != HVD_OK)
      return st;
    rdzv_etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision", &from);
    from++;
  }
  st = rdzv_etcd_watch(c, what, e->keybuf.data, e->keybuf.len, e->endbuf.data, e->endbuf.len, from,
                       deadline_ns, any_event, &seen, &resync);
  if (st == HVD_ERR_TIMEOUT)
    return hvd_error(HVD_ERR_TIMEOUT, "rendezvous %s: %s: no change", c->where, what);
  if (st == HVD_OK)
    *version = (uint64_t)(seen > 0 ? seen : e->watch_revision);
  return st;
}

/* Compare-and-set on one key's mod revision (0: only if absent). */
static hvd_status txn_put(struct rdzv_client *c, const char *what, int64_t expected,
                          const void *value, size_t len, int64_t deadline_ns, bool *won) {
  struct etcd *e = etcd_of(c);
  cJSON *body;
  hvd_status st;

  if ((st = rdzv_etcd_keep_lease(c, what, true, deadline_ns)) != HVD_OK)
    return st;
  body = rdzv_etcd_txn_body(&e->keybuf, expected == 0 ? "CREATE" : "MOD", expected, value, len,
                            e->lease);
  if (body == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  /* Not repeated: a transaction that was applied would then fail its
   * compare, and look lost. */
  st = rdzv_etcd_call(c, "kv/txn", what, body, deadline_ns, false);
  cJSON_Delete(body);
  *won = st == HVD_OK && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e->answer, "succeeded"));
  return st;
}

static int64_t answer_revision(const struct etcd *e) {
  int64_t revision = 0;
  rdzv_etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision",
                       &revision);
  return revision;
}

static hvd_status etcd_cas(struct rdzv_client *c, const char *scope, const char *key,
                           uint64_t expected_version, const void *value, size_t len,
                           uint64_t *new_version, struct hvd_buf *current,
                           uint64_t *current_version) {
  struct etcd *e = etcd_of(c);
  char what[256];
  int64_t deadline = call_deadline(c), mod = 0;
  const cJSON *kv;
  bool won;
  hvd_status st;

  describe(what, sizeof(what), "PUT (compare-and-set)", scope, key);
  if ((st = rdzv_etcd_ready(c, deadline)) != HVD_OK ||
      (st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK ||
      (st = txn_put(c, what, (int64_t)expected_version, value, len, deadline, &won)) != HVD_OK)
    return st;
  if (won) {
    if (new_version != NULL)
      *new_version = (uint64_t)answer_revision(e);
    return HVD_OK;
  }
  kv = rdzv_etcd_txn_current(e->answer);
  if (kv != NULL &&
      (!rdzv_etcd_kv_value(&e->value, kv) || !rdzv_etcd_json_int64(kv, "mod_revision", &mod)))
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer", c->where,
                     what);
  if (current_version != NULL)
    *current_version = (uint64_t)mod;
  if (current != NULL) {
    hvd_buf_reset(current);
    if (kv != NULL)
      take_value(e, current);
  }
  return hvd_error(HVD_ERR_CONFLICT, "rendezvous %s: %s: compare-and-set lost (%s)", c->where, what,
                   kv == NULL ? "the key does not exist" : "the key has another version");
}

static hvd_status etcd_add(struct rdzv_client *c, const char *scope, const char *key, int64_t delta,
                           int64_t *result) {
  struct etcd *e = etcd_of(c);
  char what[256], text[24];
  int64_t deadline = call_deadline(c), mod = 0, value = 0;
  const cJSON *kv;
  bool won = false;
  hvd_status st;

  describe(what, sizeof(what), "POST (add)", scope, key);
  if ((st = rdzv_etcd_ready(c, deadline)) != HVD_OK ||
      (st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK ||
      (st = range(c, what, RANGE_KEY, deadline)) != HVD_OK)
    return st;
  kv = rdzv_etcd_first_kv(e->answer);
  for (;;) {
    value = mod = 0;
    if (kv != NULL &&
        (!rdzv_etcd_kv_value(&e->value, kv) || !rdzv_etcd_json_int64(kv, "mod_revision", &mod)))
      return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer",
                       c->where, what);
    if (kv != NULL && !hvd_parse_int64(e->value.data, e->value.len, &value))
      return hvd_error(HVD_ERR_CONFLICT, "rendezvous %s: %s: the value is not an integer", c->where,
                       what);
    if ((delta > 0 && value > INT64_MAX - delta) || (delta < 0 && value < INT64_MIN - delta))
      return hvd_error(HVD_ERR_CONFLICT, "rendezvous %s: %s: the sum overflows", c->where, what);
    snprintf(text, sizeof(text), "%" PRId64, value + delta);
    if ((st = txn_put(c, what, mod, text, strlen(text), deadline, &won)) != HVD_OK)
      return st;
    if (won) {
      *result = value + delta;
      return HVD_OK;
    }
    kv = rdzv_etcd_txn_current(e->answer); /* another writer was first: add to its value */
  }
}

static hvd_status etcd_del(struct rdzv_client *c, const char *scope, const char *key) {
  struct etcd *e = etcd_of(c);
  char what[256];
  int64_t deadline = call_deadline(c);
  cJSON *body;
  hvd_status st;

  describe(what, sizeof(what), "DELETE", scope, key);
  if ((st = rdzv_etcd_ready(c, deadline)) != HVD_OK ||
      (st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK)
    return st;
  if ((body = rdzv_etcd_range_body(&e->keybuf, key == NULL ? &e->endbuf : NULL)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  st = rdzv_etcd_call(c, "kv/deleterange", what, body, deadline, true);
  cJSON_Delete(body);
  return st;
}

static hvd_status etcd_admit(struct rdzv_client *c, const char *credential, struct hvd_buf *job,
                             struct hvd_buf *token) {
  (void)credential;
  (void)job;
  (void)token;
  return hvd_error(HVD_ERR_UNSUPPORTED,
                   "rendezvous %s: admission is hvd's own store's; with etcd, every rank needs "
                   "the job token (HVD_TOKEN) and the cluster's credentials itself",
                   c->where);
}

static hvd_status etcd_health(struct rdzv_client *c, struct hvd_buf *json) {
  int64_t deadline = call_deadline(c);
  cJSON *body = cJSON_CreateObject();
  hvd_status st =
      body != NULL ? rdzv_etcd_ready(c, deadline) : hvd_error(HVD_ERR_NO_MEMORY, "no memory");

  if (st == HVD_OK)
    st = rdzv_etcd_call(c, "maintenance/status", "status", body, deadline, true);
  cJSON_Delete(body);
  if (st != HVD_OK || json == NULL)
    return st;
  hvd_buf_reset(json);
  return hvd_buf_append(json, c->response.data, c->response.len);
}

static void etcd_destroy(struct rdzv_client *c) {
  struct etcd *e = c->backend;
  if (e == NULL)
    return;
  rdzv_etcd_lead_resign(c);
  if (e->password != NULL)
    explicit_bzero(e->password, strlen(e->password));
  if (e->auth_header != NULL)
    explicit_bzero(e->auth_header, strlen(e->auth_header));
  free(e->prefix);
  free(e->cacert);
  free(e->cert);
  free(e->key);
  free(e->user);
  free(e->password);
  free(e->auth_header);
  hvd_buf_fini(&e->keybuf);
  hvd_buf_fini(&e->endbuf);
  hvd_buf_fini(&e->value);
  hvd_buf_fini(&e->line);
  cJSON_Delete(e->answer);
  free(e);
}

static const struct rdzv_client_ops etcd_ops = {
    .destroy = etcd_destroy,
    .set = etcd_set,
    .get = etcd_get,
    .wait = etcd_wait,
    .get_scope = etcd_get_scope,
    .wait_change = etcd_wait_change,
    .add = etcd_add,
    .cas = etcd_cas,
    .del = etcd_del,
    .admit = etcd_admit,
    .health = etcd_health,
    .lead = rdzv_etcd_lead,
    .lead_renew = rdzv_etcd_lead_renew,
    .lead_resign = rdzv_etcd_lead_resign,
};

/* ---- creation ---------------------------------------------------------------------- */

/* "host:port" or "[v6]:port", with a port in range. */
static bool valid_endpoint(const char *text, size_t len) {
  const char *colon = NULL;
  int64_t port;

  for (size_t i = 0; i < len; i++)
    if (text[i] == ':')
      colon = text + i;
  if (colon == NULL || colon == text || len >= ETCD_ENDPOINT_MAX)
    return false;
  if (text[0] == '[' && colon[-1] != ']')
    return false;
  if (text[0] != '[' && memchr(text, ':', (size_t)(colon - text)) != NULL)
    return false; /* a bare IPv6 address: its port cannot be told apart */
  return hvd_parse_int64(colon + 1, len - (size_t)(colon + 1 - text), &port) && port >= 1 &&
         port <= 65535;
}

static hvd_status parse_url(struct etcd *e, const char *url) {
  const char *rest = strstr(url, "://") + 3, *slash = strchr(rest, '/');
  size_t hosts_len = slash != NULL ? (size_t)(slash - rest) : strlen(rest);
  const char *p = rest, *end = rest + hosts_len;
  size_t plen;

  e->tls = strncmp(url, "etcds", 5) == 0;
  while (p < end) {
    const char *comma = memchr(p, ',', (size_t)(end - p));
    size_t len = comma != NULL ? (size_t)(comma - p) : (size_t)(end - p);
    if (!valid_endpoint(p, len))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "HVD_RENDEZVOUS='%s': '%.*s' is not HOST:PORT (an IPv6 address in "
                       "brackets)",
                       url, (int)len, p);
    if (e->nendpoints == ETCD_MAX_ENDPOINTS)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "HVD_RENDEZVOUS='%s': more than %d members", url,
                       ETCD_MAX_ENDPOINTS);
    memcpy(e->endpoints[e->nendpoints], p, len);
    e->endpoints[e->nendpoints++][len] = '\0';
    p += len + (comma != NULL);
  }
  if (e->nendpoints == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "HVD_RENDEZVOUS='%s': no member given", url);
  /* the prefix: "/hvd/default" unless given; no trailing '/' */
  if (slash == NULL || slash[1] == '\0')
    slash = "/hvd/default";
  plen = strlen(slash);
  while (plen > 1 && slash[plen - 1] == '/')
    plen--;
  for (size_t i = 0; i < plen; i++)
    if ((unsigned char)slash[i] < 0x20 || slash[i] == 0x7f)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "HVD_RENDEZVOUS: the prefix holds a control character");
  if ((e->prefix = strndup(slash, plen)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  return HVD_OK;
}

static hvd_status copy_setting(enum hvd_setting id, char **out) {
  const char *text = NULL;
  hvd_status st = hvd_setting_text(id, &text);
  if (st == HVD_OK && text != NULL && text[0] != '\0' && (*out = strdup(text)) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  return st;
}

hvd_status rdzv_client_create_etcd(const char *url, int64_t timeout_ms, struct rdzv_client **out) {
  struct rdzv_client *c = rdzv_client_alloc(timeout_ms);
  struct etcd *e;
  hvd_status st;

  if (c == NULL)
    return hvd_error_status();
  c->ops = &etcd_ops;
  if ((c->backend = e = calloc(1, sizeof(*e))) == NULL) {
    rdzv_client_destroy(c);
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  }
  hvd_buf_init(&e->keybuf, 0);
  hvd_buf_init(&e->endbuf, 0);
  hvd_buf_init(&e->value, 0);
  hvd_buf_init(&e->line, ETCD_LINE_MAX_BYTES);
  st = parse_url(e, url);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_ETCD_LEASE, &e->lease_ttl_s);
  if (st == HVD_OK)
    st = copy_setting(HVD_SET_ETCD_USER, &e->user);
  if (st == HVD_OK)
    st = copy_setting(HVD_SET_ETCD_PASSWORD, &e->password);
  if (st == HVD_OK)
    st = copy_setting(HVD_SET_ETCD_CACERT, &e->cacert);
  if (st == HVD_OK)
    st = copy_setting(HVD_SET_ETCD_CERT, &e->cert);
  if (st == HVD_OK)
    st = copy_setting(HVD_SET_ETCD_KEY, &e->key);
  if (st == HVD_OK && (e->cert != NULL) != (e->key != NULL))
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_RENDEZVOUS='%s': HVD_ETCD_CERT and HVD_ETCD_KEY go together (a client "
                   "certificate and its key); %s is not set",
                   url, e->cert != NULL ? "HVD_ETCD_KEY" : "HVD_ETCD_CERT");
  if (st == HVD_OK && !e->tls && (e->cacert != NULL || e->cert != NULL))
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_RENDEZVOUS='%s': HVD_ETCD_CACERT, HVD_ETCD_CERT and HVD_ETCD_KEY need an "
                   "etcds:// URL (TLS)",
                   url);
  if (st != HVD_OK) {
    rdzv_client_destroy(c);
    return st;
  }
  /* the first member asked: spread a large job's ranks over the members */
  e->current = (size_t)(c->rng % e->nendpoints);
  snprintf(c->where, sizeof(c->where), "%s://%s%s%s", e->tls ? "etcds" : "etcd", e->endpoints[0],
           e->nendpoints > 1 ? ",..." : "", e->prefix);
  *out = c;
  return HVD_OK;
}
