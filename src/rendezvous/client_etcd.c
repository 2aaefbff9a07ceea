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

#include "client_private.h"
#include "etcd_wire.h"

enum {
  MAX_ENDPOINTS = 16,
  ENDPOINT_MAX = 272,         /* "[v6 address]:port" */
  ATTEMPT_MS = 3000,          /* a member that takes longer is passed over */
  WATCH_CHUNK_MS = 10000,     /* a watch is re-issued this often (a frozen member) */
  LINE_MAX_BYTES = 256u << 20, /* one watch message */
};

/* gRPC status codes etcd's gateway answers errors with. */
enum {
  GRPC_INVALID_ARGUMENT = 3,
  GRPC_DEADLINE_EXCEEDED = 4,
  GRPC_NOT_FOUND = 5,
  GRPC_PERMISSION_DENIED = 7,
  GRPC_RESOURCE_EXHAUSTED = 8,
  GRPC_FAILED_PRECONDITION = 9,
  GRPC_UNAVAILABLE = 14,
  GRPC_UNAUTHENTICATED = 16,
};

/* Handles one watch event; returns true when the wait is over. */
typedef bool (*event_fn)(const cJSON *event, int64_t revision, void *arg);

struct etcd {
  char endpoints[MAX_ENDPOINTS][ENDPOINT_MAX];
  size_t nendpoints;
  size_t current; /* the member asked first */
  bool tls;
  char *prefix;
  char *cacert, *cert, *key;
  char *user, *password;
  char *auth_header; /* "Authorization: <token>" once authenticated */
  int64_t lease;     /* 0: none yet (or lost) */
  int64_t lease_ttl_s;
  int64_t lease_renewed_ns;
  struct hvd_buf keybuf, endbuf, value;
  cJSON *answer; /* the last answer, parsed */
  /* a watch in progress */
  struct hvd_buf line;
  event_fn on_event;
  void *event_arg;
  bool watch_done;     /* on_event said so: the transfer was ended on purpose */
  bool watch_canceled; /* etcd ended the watch (compaction, no leader) */
  int64_t watch_revision; /* the newest revision the watch reported */
};

static struct etcd *E(struct rdzv_client *c) { return c->backend; }

static size_t etcd_stream_cb(char *data, size_t size, size_t n, void *arg);

/* ---- requests ---------------------------------------------------------------------- */

static struct curl_slist *etcd_headers(struct etcd *e) {
  struct curl_slist *list = curl_slist_append(NULL, "Expect:");
  struct curl_slist *more;

  if (list == NULL)
    return NULL;
  if ((more = curl_slist_append(list, "Content-Type: application/json")) != NULL)
    list = more;
  /* A member that loses its leader ends our watches instead of keeping
   * them open and silent. */
  if (more != NULL && (more = curl_slist_append(list, "Grpc-Metadata-hasleader: true")) != NULL)
    list = more;
  if (more != NULL && e->auth_header != NULL &&
      (more = curl_slist_append(list, e->auth_header)) != NULL)
    list = more;
  if (more == NULL) {
    curl_slist_free_all(list);
    return NULL;
  }
  return list;
}

static void configure(struct rdzv_client *c, const char *url, struct curl_slist *headers,
                      const char *body, int64_t timeout_ms, bool stream) {
  struct etcd *e = E(c);
  CURL *h = c->curl;

  curl_easy_reset(h); /* keeps the connection cache */
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->curl_error);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stream ? etcd_stream_cb : rdzv_client_collect);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_ms < 1 ? 1 : timeout_ms));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(timeout_ms < 1 ? 1 : timeout_ms > ATTEMPT_MS ? ATTEMPT_MS : timeout_ms));
  if (e->tls) {
    if (e->cacert != NULL)
      curl_easy_setopt(h, CURLOPT_CAINFO, e->cacert);
    if (e->cert != NULL)
      curl_easy_setopt(h, CURLOPT_SSLCERT, e->cert);
    if (e->key != NULL)
      curl_easy_setopt(h, CURLOPT_SSLKEY, e->key);
  }
}

/* What one attempt came to. */
enum outcome {
  OUT_OK,      /* 200, c->response holds the answer */
  OUT_RETRY,   /* this member could not answer now: try the next one */
  OUT_FAILED,  /* an error to return (set) */
};

/* The error etcd answered: {"error": ..., "code": N, "message": ...}. */
static void answer_error(struct rdzv_client *c, int *code, char *message, size_t size) {
  cJSON *doc = cJSON_ParseWithLength(c->response.data ? c->response.data : "", c->response.len);
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(doc, "message");
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(doc, "code");
  const cJSON *inner = cJSON_GetObjectItemCaseSensitive(doc, "error");

  if (cJSON_IsObject(inner)) { /* a watch stream's error */
    m = cJSON_GetObjectItemCaseSensitive(inner, "message");
    k = cJSON_GetObjectItemCaseSensitive(inner, "grpc_code");
  }
  *code = cJSON_IsNumber(k) ? k->valueint : -1;
  hvd_printable(cJSON_IsString(m) ? m->valuestring : c->response.len ? "(not JSON)" : "(no body)",
                message, size);
  cJSON_Delete(doc);
}

static hvd_status authenticate(struct rdzv_client *c, int64_t deadline_ns);

/* Which errors another attempt may cure. */
static bool retryable_code(int code, const char *message, bool idempotent) {
  if (code == GRPC_UNAVAILABLE || code == GRPC_DEADLINE_EXCEEDED)
    /* "no leader" was never applied; a timed-out request may have been */
    return idempotent || strstr(message, "no leader") != NULL;
  return false;
}

static hvd_status status_of(int code, const char *message) {
  if (strstr(message, "lease not found") != NULL)
    return HVD_ERR_NOT_FOUND;
  switch (code) {
  case GRPC_INVALID_ARGUMENT:
    /* etcd answers a missing or wrong password, and a missing user, so */
    if (strstr(message, "auth") != NULL || strstr(message, "user") != NULL ||
        strstr(message, "password") != NULL)
      return HVD_ERR_UNAUTHORIZED;
    return HVD_ERR_INVALID_ARGUMENT;
  case GRPC_PERMISSION_DENIED:
  case GRPC_UNAUTHENTICATED:
    return HVD_ERR_UNAUTHORIZED;
  case GRPC_RESOURCE_EXHAUSTED:
    return HVD_ERR_TOO_LARGE;
  case GRPC_NOT_FOUND:
    return HVD_ERR_NOT_FOUND;
  case GRPC_UNAVAILABLE:
  case GRPC_DEADLINE_EXCEEDED:
    return HVD_ERR_NETWORK;
  case GRPC_FAILED_PRECONDITION:
    return HVD_ERR_CONFLICT;
  default:
    return HVD_ERR_PROTOCOL;
  }
}

static const char *auth_hint(const struct etcd *e, hvd_status st) {
  if (st != HVD_ERR_UNAUTHORIZED)
    return "";
  return e->user == NULL ? " (the cluster has authentication on: set HVD_ETCD_USER and "
                           "HVD_ETCD_PASSWORD)"
                         : " (check HVD_ETCD_USER, HVD_ETCD_PASSWORD and the user's role)";
}

/*
 * POSTs body to /v3/<path> on the members in turn until one answers or the
 * deadline passes. A stream (a watch) goes to etcd_stream_cb and may end
 * at WATCH_CHUNK_MS. On success c->response holds the answer (not for a
 * stream).
 */
static hvd_status request(struct rdzv_client *c, const char *path, const char *what,
                          const char *body, int64_t deadline_ns, bool idempotent, bool stream) {
  struct etcd *e = E(c);
  struct curl_slist *headers = NULL;
  char url[ENDPOINT_MAX + 64], last[300] = "";
  int64_t backoff = RDZV_BACKOFF_FIRST_MS, started = hvd_now_ns();
  unsigned attempts = 0;
  bool reauthenticated = false, answered = false;

  for (;;) {
    int64_t left = hvd_remaining_ms(deadline_ns);
    int64_t limit = stream ? (left < WATCH_CHUNK_MS ? left : WATCH_CHUNK_MS)
                           : (left < ATTEMPT_MS ? left : ATTEMPT_MS);
    enum outcome out = OUT_RETRY;
    hvd_status st = HVD_OK;
    long http = 0;
    CURLcode rc;

    snprintf(url, sizeof(url), "%s://%s/v3/%s", e->tls ? "https" : "http",
             e->endpoints[e->current], path);
    if ((headers = etcd_headers(e)) == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd request");
    hvd_buf_reset(&c->response);
    hvd_buf_reset(&e->line);
    c->curl_error[0] = '\0';
    e->watch_done = e->watch_canceled = false;
    configure(c, url, headers, body, limit, stream);
    attempts++;
    rc = rdzv_client_transfer(c);
    curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &http);
    curl_slist_free_all(headers);
    if (c->cancelled)
      return hvd_error(HVD_ERR_ABORTED, "rendezvous %s: %s: cancelled", c->where, what);
    if (stream && (e->watch_done || e->watch_canceled ||
                   (rc == CURLE_OPERATION_TIMEDOUT && http == 200)))
      return HVD_OK; /* the caller looks at what the watch saw */
    if (rc == CURLE_WRITE_ERROR && hvd_error_status() == HVD_ERR_TOO_LARGE)
      return hvd_error(HVD_ERR_TOO_LARGE, "rendezvous %s: %s: the answer exceeds %u bytes",
                       c->where, what, (unsigned)RDZV_RESPONSE_MAX);
    if (rc != CURLE_OK) {
      snprintf(last, sizeof(last), "%s: %s", e->endpoints[e->current],
               c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc));
      /* a request never sent may always be repeated */
      if (!idempotent && rc != CURLE_COULDNT_CONNECT && rc != CURLE_COULDNT_RESOLVE_HOST) {
        st = HVD_ERR_NETWORK;
        out = OUT_FAILED;
      }
    } else if (http == 200) {
      out = OUT_OK;
    } else {
      answered = true;
      int code;
      char message[200];
      answer_error(c, &code, message, sizeof(message));
      snprintf(last, sizeof(last), "%s: %s", e->endpoints[e->current], message);
      if (code == GRPC_UNAUTHENTICATED && e->user != NULL && !reauthenticated) {
        /* the token expired (or the member restarted): a new one, once */
        reauthenticated = true;
        free(e->auth_header);
        e->auth_header = NULL;
        if ((st = authenticate(c, deadline_ns)) != HVD_OK)
          return st;
        continue;
      }
      if (!retryable_code(code, message, idempotent)) {
        st = status_of(code, message);
        return hvd_error(st, "rendezvous %s: %s: %s%s", c->where, what, last, auth_hint(e, st));
      }
    }
    if (out == OUT_OK)
      return HVD_OK;
    if (out == OUT_FAILED)
      return hvd_error(st, "rendezvous %s: %s: %s; not repeated, as it may have been applied",
                       c->where, what, last);
    HVD_LOG_DEBUG("rendezvous %s: %s: %s; trying the next member", c->where, what, last);
    e->current = (e->current + 1) % e->nendpoints;
    /* the next member at once, a pause once all were tried */
    if (attempts % e->nendpoints != 0 && hvd_now_ns() < deadline_ns)
      continue;
    if (!rdzv_client_pause(c, &backoff, deadline_ns))
      return hvd_error(answered ? HVD_ERR_TIMEOUT : HVD_ERR_NETWORK,
                       "rendezvous %s: %s: %s within %.1f s (%u attempts; last: %s); check that "
                       "a majority of the etcd cluster's members is up and reachable, or raise "
                       "HOROVOD_GLOO_TIMEOUT_SECONDS",
                       c->where, what, answered ? "no member could serve it" : "no member reached",
                       (double)(hvd_now_ns() - started) / 1e9, attempts, last);
  }
}

/* request() for a JSON answer, parsed into e->answer. */
static hvd_status call(struct rdzv_client *c, const char *path, const char *what, cJSON *body,
                       int64_t deadline_ns, bool idempotent) {
  struct etcd *e = E(c);
  char *text = cJSON_PrintUnformatted(body);
  hvd_status st;

  cJSON_Delete(e->answer);
  e->answer = NULL;
  if (text == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd request");
  st = request(c, path, what, text, deadline_ns, idempotent, false);
  free(text);
  if (st == HVD_OK &&
      (e->answer = cJSON_ParseWithLength(c->response.data ? c->response.data : "",
                                         c->response.len)) == NULL)
    st = hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: the answer is not JSON", c->where,
                   what);
  return st;
}

/* ---- watch streams ----------------------------------------------------------------- */

/* One message of a watch stream: {"result": {"header": ..., "events": [...]}}. */
static bool watch_message(struct rdzv_client *c, const char *text, size_t len) {
  struct etcd *e = E(c);
  cJSON *doc = cJSON_ParseWithLength(text, len);
  const cJSON *result = cJSON_GetObjectItemCaseSensitive(doc, "result");
  const cJSON *header = cJSON_GetObjectItemCaseSensitive(result, "header");
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(result, "events");
  const cJSON *event;
  int64_t revision = 0;
  bool done = false;

  if (!cJSON_IsObject(result)) { /* {"error": ...}: the stream ends */
    e->watch_canceled = true;
    cJSON_Delete(doc);
    return true;
  }
  if (etcd_json_int64(header, "revision", &revision) && revision > e->watch_revision)
    e->watch_revision = revision;
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(result, "canceled")))
    e->watch_canceled = true;
  cJSON_ArrayForEach(event, events) {
    if (!done && e->on_event(event, revision, e->event_arg))
      done = true;
  }
  cJSON_Delete(doc);
  if (done)
    e->watch_done = true;
  return done || e->watch_canceled;
}

/* curl's write callback for a watch: messages are one JSON object a line. */
static size_t etcd_stream_cb(char *data, size_t size, size_t n, void *arg) {
  struct rdzv_client *c = arg;
  struct etcd *e = E(c);
  size_t total = size * n;
  long http = 0;

  curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &http);
  if (http != 200) /* an error answer: kept whole, as any other */
    return rdzv_client_collect(data, size, n, arg);
  if (hvd_buf_append(&e->line, data, total) != HVD_OK)
    return 0;
  for (;;) {
    char *nl = memchr(e->line.data, '\n', e->line.len);
    size_t used;
    if (nl == NULL)
      break;
    used = (size_t)(nl - e->line.data) + 1;
    if (watch_message(c, e->line.data, used - 1))
      return 0; /* ends the transfer: what we waited for came */
    memmove(e->line.data, e->line.data + used, e->line.len - used);
    e->line.len -= used;
  }
  return total;
}

/*
 * Watches the keys [key, end) (end NULL: the one key) from revision `from`
 * on, handing each event to fn until it says done or the deadline passes.
 * Reconnects (to the next member) and resumes after the last revision seen.
 * HVD_ERR_TIMEOUT (no message set) at the deadline; with *resync set the
 * caller should read again (etcd ended the watch: say, compacted history).
 */
static hvd_status watch(struct rdzv_client *c, const char *what, const char *key, size_t key_len,
                        const char *end, size_t end_len, int64_t from, int64_t deadline_ns,
                        event_fn fn, void *arg, bool *resync) {
  struct etcd *e = E(c);
  hvd_status st = HVD_OK;

  *resync = false;
  e->on_event = fn;
  e->event_arg = arg;
  e->watch_revision = from - 1;
  while (hvd_now_ns() < deadline_ns) {
    cJSON *body = cJSON_CreateObject(), *create = cJSON_AddObjectToObject(body, "create_request");
    char *text;
    char rev[24];

    snprintf(rev, sizeof(rev), "%" PRId64, e->watch_revision + 1);
    if (create == NULL || etcd_json_add_bytes(create, "key", key, key_len) != HVD_OK ||
        (end != NULL && etcd_json_add_bytes(create, "range_end", end, end_len) != HVD_OK) ||
        cJSON_AddStringToObject(create, "start_revision", rev) == NULL ||
        (text = cJSON_PrintUnformatted(body)) == NULL) {
      cJSON_Delete(body);
      return hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd watch");
    }
    cJSON_Delete(body);
    st = request(c, "watch", what, text, deadline_ns, true, true);
    free(text);
    if (st != HVD_OK || e->watch_done)
      return st;
    if (e->watch_canceled) {
      *resync = true;
      return HVD_OK;
    }
  }
  return HVD_ERR_TIMEOUT;
}

/* ---- authentication and the job's lease ----------------------------------------------- */

static hvd_status authenticate(struct rdzv_client *c, int64_t deadline_ns) {
  struct etcd *e = E(c);
  cJSON *body = cJSON_CreateObject();
  const cJSON *token;
  hvd_status st = HVD_OK;

  if (cJSON_AddStringToObject(body, "name", e->user) == NULL ||
      cJSON_AddStringToObject(body, "password", e->password ? e->password : "") == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd request");
  if (st == HVD_OK)
    st = call(c, "auth/authenticate", "authenticate", body, deadline_ns, true);
  cJSON_Delete(body);
  if (st != HVD_OK)
    return st;
  token = cJSON_GetObjectItemCaseSensitive(e->answer, "token");
  if (!cJSON_IsString(token))
    return hvd_error(HVD_ERR_PROTOCOL,
                     "rendezvous %s: authenticate: the answer has no token (is authentication "
                     "enabled in the cluster? then leave HVD_ETCD_USER unset)",
                     c->where);
  free(e->auth_header);
  size_t len = strlen(token->valuestring) + 32;
  if ((e->auth_header = malloc(len)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  snprintf(e->auth_header, len, "Authorization: %s", token->valuestring);
  return HVD_OK;
}

static hvd_status ready(struct rdzv_client *c, int64_t deadline_ns) {
  struct etcd *e = E(c);
  return e->user != NULL && e->auth_header == NULL ? authenticate(c, deadline_ns) : HVD_OK;
}

static const cJSON *first_kv(const cJSON *range_answer) {
  return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(range_answer, "kvs"), 0);
}

/* A range request of one key or of [key, end). */
static cJSON *range_body(const struct hvd_buf *key, const struct hvd_buf *end) {
  cJSON *body = cJSON_CreateObject();
  if (body != NULL && (etcd_json_add_bytes(body, "key", key->data, key->len) != HVD_OK ||
                       (end != NULL &&
                        etcd_json_add_bytes(body, "range_end", end->data, end->len) != HVD_OK))) {
    cJSON_Delete(body);
    return NULL;
  }
  return body;
}

/*
 * A transaction on one key: if its `target` revision ("CREATE" or "MOD")
 * equals `revision`, put value (under the lease, if not 0); else read the
 * key. NULL when out of memory.
 */
static cJSON *txn_body(const struct hvd_buf *key, const char *target, int64_t revision,
                       const void *value, size_t len, int64_t lease) {
  cJSON *body = cJSON_CreateObject();
  cJSON *cmp = cJSON_CreateObject(), *yes = cJSON_CreateObject(), *no = cJSON_CreateObject();
  cJSON *put = cJSON_AddObjectToObject(yes, "request_put");
  cJSON *get = cJSON_AddObjectToObject(no, "request_range");
  char rev[24], id[24];
  bool ok = body != NULL && cmp != NULL && yes != NULL && no != NULL && put != NULL &&
            get != NULL;

  snprintf(rev, sizeof(rev), "%" PRId64, revision);
  snprintf(id, sizeof(id), "%" PRId64, lease);
  ok = ok && etcd_json_add_bytes(cmp, "key", key->data, key->len) == HVD_OK &&
       cJSON_AddStringToObject(cmp, "target", target) != NULL &&
       cJSON_AddStringToObject(cmp, "result", "EQUAL") != NULL &&
       cJSON_AddStringToObject(cmp, strcmp(target, "CREATE") == 0 ? "create_revision"
                                                                  : "mod_revision",
                               rev) != NULL &&
       etcd_json_add_bytes(put, "key", key->data, key->len) == HVD_OK &&
       etcd_json_add_bytes(put, "value", value, len) == HVD_OK &&
       (lease == 0 || cJSON_AddStringToObject(put, "lease", id) != NULL) &&
       etcd_json_add_bytes(get, "key", key->data, key->len) == HVD_OK;
  if (ok) {
    cJSON *compare = cJSON_AddArrayToObject(body, "compare");
    cJSON *success = cJSON_AddArrayToObject(body, "success");
    cJSON *failure = cJSON_AddArrayToObject(body, "failure");
    ok = compare != NULL && success != NULL && failure != NULL &&
         cJSON_AddItemToArray(compare, cmp) && cJSON_AddItemToArray(success, yes) &&
         cJSON_AddItemToArray(failure, no);
    if (ok)
      return body;
  }
  cJSON_Delete(body);
  cJSON_Delete(cmp);
  cJSON_Delete(yes);
  cJSON_Delete(no);
  return NULL;
}

/* The key a failed txn_body read: its kv object, or NULL when absent. */
static const cJSON *txn_current(const cJSON *answer) {
  const cJSON *resp = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(answer, "responses"), 0);
  return first_kv(cJSON_GetObjectItemCaseSensitive(resp, "response_range"));
}

/* A kv's value, decoded into e->value; false when it has none. */
static bool kv_value(struct etcd *e, const cJSON *kv) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
  if (kv == NULL)
    return false;
  if (v == NULL) { /* an empty value is left out */
    hvd_buf_reset(&e->value);
    return hvd_buf_reserve(&e->value, 0) == HVD_OK && (e->value.data[0] = '\0', true);
  }
  return cJSON_IsString(v) && etcd_base64_decode(v->valuestring, &e->value);
}

/* The lease id a "<prefix>/_lease" kv holds, or 0. */
static int64_t lease_of(struct etcd *e, const cJSON *kv) {
  int64_t id = 0;
  if (!kv_value(e, kv) || !hvd_parse_int64(e->value.data, e->value.len, &id))
    return 0;
  return id;
}

/* Grants a lease and makes it the job's unless another process was first. */
static hvd_status establish_lease(struct rdzv_client *c, const char *what,
                                  const struct hvd_buf *key, int64_t deadline_ns) {
  struct etcd *e = E(c);
  cJSON *body = cJSON_CreateObject();
  char ttl[24], id[24];
  int64_t granted = 0;
  hvd_status st = HVD_OK;

  snprintf(ttl, sizeof(ttl), "%" PRId64, e->lease_ttl_s);
  if (body == NULL || cJSON_AddStringToObject(body, "TTL", ttl) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  if (st == HVD_OK)
    st = call(c, "lease/grant", what, body, deadline_ns, false);
  cJSON_Delete(body);
  if (st == HVD_OK && (!etcd_json_int64(e->answer, "ID", &granted) || granted == 0))
    st = hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: lease/grant: no lease id in the answer",
                   c->where);
  if (st != HVD_OK)
    return st;
  snprintf(id, sizeof(id), "%" PRId64, granted);
  if ((body = txn_body(key, "CREATE", 0, id, strlen(id), granted)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  st = call(c, "kv/txn", what, body, deadline_ns, true);
  cJSON_Delete(body);
  if (st != HVD_OK)
    return st;
  /* Another process was first: its lease is the job's (ours, unused,
   * expires by itself). */
  if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e->answer, "succeeded")) &&
      (granted = lease_of(e, txn_current(e->answer))) == 0)
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s does not hold a lease id", c->where,
                     key->data);
  e->lease = granted;
  e->lease_renewed_ns = hvd_now_ns();
  return HVD_OK;
}

/* The job's lease, known and renewed if a third of its time has passed. */
static hvd_status keep_lease(struct rdzv_client *c, const char *what, int64_t deadline_ns) {
  struct etcd *e = E(c);
  struct hvd_buf key;
  cJSON *body;
  int64_t ttl = 0;
  char text[24];
  hvd_status st;

  if (e->lease != 0 && hvd_now_ns() - e->lease_renewed_ns < e->lease_ttl_s * 1000000000 / 3)
    return HVD_OK;
  if (e->lease != 0) {
    snprintf(text, sizeof(text), "%" PRId64, e->lease);
    body = cJSON_CreateObject();
    if (body == NULL || cJSON_AddStringToObject(body, "ID", text) == NULL) {
      cJSON_Delete(body);
      return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
    }
    st = call(c, "lease/keepalive", what, body, deadline_ns, true);
    cJSON_Delete(body);
    if (st != HVD_OK)
      return st;
    if (etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "result"), "TTL", &ttl) &&
        ttl > 0) {
      e->lease_renewed_ns = hvd_now_ns();
      return HVD_OK;
    }
    e->lease = 0; /* it expired, and the job's keys with it: a new one */
  }
  hvd_buf_init(&key, 0);
  st = hvd_buf_printf(&key, "%s/_lease", e->prefix);
  body = st == HVD_OK ? range_body(&key, NULL) : NULL;
  if (st == HVD_OK && body == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  if (st == HVD_OK)
    st = call(c, "kv/range", what, body, deadline_ns, true);
  cJSON_Delete(body);
  if (st == HVD_OK && (e->lease = lease_of(e, first_kv(e->answer))) != 0) {
    e->lease_renewed_ns = 0; /* renew it now: it may be about to expire */
    st = keep_lease(c, what, deadline_ns);
  } else if (st == HVD_OK) {
    st = establish_lease(c, what, &key, deadline_ns);
  }
  hvd_buf_fini(&key);
  return st;
}

/* ---- the operations ------------------------------------------------------------------ */

static int64_t call_deadline(const struct rdzv_client *c) {
  return hvd_deadline_after_ms(c->timeout_ms);
}

/* e->keybuf = the key (or the scope's range start, key NULL); with a
 * scope, e->endbuf = the range's end. */
static hvd_status name_key(struct rdzv_client *c, const char *scope, const char *key) {
  struct etcd *e = E(c);
  hvd_status st;

  if (strchr(scope, '/') != NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "rendezvous %s: scope '%s': a scope name in etcd must not hold '/'",
                     c->where, scope);
  if ((st = etcd_key(&e->keybuf, e->prefix, scope, key)) != HVD_OK || key != NULL)
    return st;
  hvd_buf_reset(&e->endbuf);
  if ((st = hvd_buf_reserve(&e->endbuf, e->keybuf.len)) != HVD_OK)
    return st;
  etcd_range_end(e->keybuf.data, e->keybuf.len, e->endbuf.data);
  e->endbuf.len = e->keybuf.len;
  e->endbuf.data[e->endbuf.len] = '\0';
  return HVD_OK;
}

static void describe(char *out, size_t size, const char *verb, const char *scope,
                     const char *key) {
  snprintf(out, size, "%s /%s%s%s", verb, scope, key != NULL ? "/" : "", key != NULL ? key : "");
}

/* A put of e->keybuf under the job's lease; once more with a new lease if
 * the job's expired meanwhile. */
static hvd_status put(struct rdzv_client *c, const char *what, const void *value, size_t len,
                      int64_t deadline_ns) {
  struct etcd *e = E(c);
  hvd_status st = HVD_ERR_INTERNAL;

  for (int attempt = 0; attempt < 2; attempt++) {
    char id[24];
    cJSON *body = cJSON_CreateObject();
    if ((st = keep_lease(c, what, deadline_ns)) != HVD_OK) {
      cJSON_Delete(body);
      return st;
    }
    snprintf(id, sizeof(id), "%" PRId64, e->lease);
    if (body == NULL ||
        etcd_json_add_bytes(body, "key", e->keybuf.data, e->keybuf.len) != HVD_OK ||
        etcd_json_add_bytes(body, "value", value, len) != HVD_OK ||
        cJSON_AddStringToObject(body, "lease", id) == NULL) {
      cJSON_Delete(body);
      return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
    }
    st = call(c, "kv/put", what, body, deadline_ns, true);
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
  if ((st = ready(c, deadline)) != HVD_OK || (st = name_key(c, scope, key)) != HVD_OK)
    return st;
  return put(c, what, value, len, deadline);
}

/* A range read of e->keybuf (to e->endbuf when whole), renewing the lease
 * on the way. */
static hvd_status range(struct rdzv_client *c, const char *what, bool whole, int64_t deadline_ns) {
  struct etcd *e = E(c);
  cJSON *body;
  hvd_status st;

  if ((st = keep_lease(c, what, deadline_ns)) != HVD_OK)
    return st;
  if ((body = range_body(&e->keybuf, whole ? &e->endbuf : NULL)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  st = call(c, "kv/range", what, body, deadline_ns, true);
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
  struct etcd *e = E(c);
  char what[256];
  int64_t deadline = call_deadline(c), mod = 0;
  const cJSON *kv;
  hvd_status st;

  describe(what, sizeof(what), "GET", scope, key);
  if ((st = ready(c, deadline)) != HVD_OK || (st = name_key(c, scope, key)) != HVD_OK ||
      (st = range(c, what, false, deadline)) != HVD_OK)
    return st;
  if ((kv = first_kv(e->answer)) == NULL)
    return hvd_error(HVD_ERR_NOT_FOUND, "rendezvous %s: %s: no such key", c->where, what);
  if (!kv_value(e, kv) || !etcd_json_int64(kv, "mod_revision", &mod))
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer",
                     c->where, what);
  if (version != NULL)
    *version = (uint64_t)mod;
  return take_value(e, value);
}

/* The wait for one key: done at its first put. */
static bool key_put(const cJSON *event, int64_t revision, void *arg) {
  struct etcd *e = arg;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(event, "type");
  (void)revision;
  if (type != NULL && !(cJSON_IsString(type) && strcmp(type->valuestring, "PUT") == 0))
    return false; /* a delete */
  return kv_value(e, cJSON_GetObjectItemCaseSensitive(event, "kv"));
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
  struct etcd *e = E(c);
  char what[256];
  int64_t started = hvd_now_ns();
  hvd_status st;

  describe(what, sizeof(what), "GET (wait)", scope, key);
  if ((st = ready(c, deadline_ns)) != HVD_OK)
    return st;
  for (;;) {
    int64_t revision = 0;
    bool resync;
    const cJSON *kv;
    if ((st = name_key(c, scope, key)) != HVD_OK || (st = range(c, what, false, deadline_ns)) != HVD_OK)
      return st;
    if ((kv = first_kv(e->answer)) != NULL) {
      if (!kv_value(e, kv))
        return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer",
                         c->where, what);
      return take_value(e, value);
    }
    etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision", &revision);
    st = watch(c, what, e->keybuf.data, e->keybuf.len, NULL, 0, revision + 1, deadline_ns,
               key_put, e, &resync);
    if (st == HVD_ERR_TIMEOUT)
      return timed_out(c, what, "the key", started, deadline_ns);
    if (st != HVD_OK)
      return st;
    if (e->watch_done)
      return take_value(e, value);
  }
}

/* A scope's wait for a count of keys: counts creations and deletions. */
struct counting {
  int64_t count, want;
};

static bool count_event(const cJSON *event, int64_t revision, void *arg) {
  struct counting *n = arg;
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(event, "type");
  int64_t version = 0;
  (void)revision;
  if (cJSON_IsString(type) && strcmp(type->valuestring, "DELETE") == 0)
    n->count--;
  else if (etcd_json_int64(cJSON_GetObjectItemCaseSensitive(event, "kv"), "version",
                           &version) && version == 1)
    n->count++; /* a key's first version: it was created */
  return n->count >= n->want;
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

/* The range answer in e->answer as a scope view, in the store's order. */
static hvd_status scope_view(struct rdzv_client *c, const char *what,
                             struct rdzv_scope_view *out) {
  struct etcd *e = E(c);
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
    if (!cJSON_IsString(k) || !etcd_base64_decode(k->valuestring, &items[i].raw) ||
        items[i].raw.len < skip || memcmp(items[i].raw.data, e->keybuf.data, skip) != 0)
      st = hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a key outside the scope", c->where,
                     what);
    items[i].key = items[i].raw.data ? items[i].raw.data + skip : "";
    items[i].key_len = items[i].raw.len - skip;
    items[i].kv = kv;
    i++;
  }
  if (st == HVD_OK)
    qsort(items, n, sizeof(*items), by_key);
  for (i = 0; st == HVD_OK && i < n; i++) {
    if (!kv_value(e, items[i].kv))
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
  char *text = hvd_buf_detach(&body, &len);
  if (text == NULL && (text = calloc(1, 1)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  return rdzv_scope_decode(text, len, out);
}

static hvd_status etcd_get_scope(struct rdzv_client *c, const char *scope, size_t min_count,
                                 int64_t deadline_ns, struct rdzv_scope_view *out) {
  struct etcd *e = E(c);
  char what[256];
  int64_t started = hvd_now_ns();
  hvd_status st;

  describe(what, sizeof(what), "GET", scope, NULL);
  if ((st = ready(c, deadline_ns)) != HVD_OK)
    return st;
  for (;;) {
    struct counting n = {0, (int64_t)min_count};
    int64_t revision = 0;
    bool resync;
    if ((st = name_key(c, scope, NULL)) != HVD_OK || (st = range(c, what, true, deadline_ns)) != HVD_OK)
      return st;
    etcd_json_int64(e->answer, "count", &n.count);
    if (n.count >= n.want)
      return scope_view(c, what, out);
    etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision", &revision);
    st = watch(c, what, e->keybuf.data, e->keybuf.len, e->endbuf.data, e->endbuf.len,
               revision + 1, deadline_ns, count_event, &n, &resync);
    if (st == HVD_ERR_TIMEOUT)
      return timed_out(c, what, "enough keys", started, deadline_ns);
    if (st != HVD_OK)
      return st;
    /* enough keys now, or etcd ended the watch: read the scope again */
  }
}

/* A scope's change wait: done at the first event. */
static bool any_event(const cJSON *event, int64_t revision, void *arg) {
  (void)event;
  *(int64_t *)arg = revision;
  return true;
}

static hvd_status etcd_wait_change(struct rdzv_client *c, const char *scope, uint64_t after,
                                   int64_t deadline_ns, uint64_t *version) {
  struct etcd *e = E(c);
  char what[256];
  int64_t from = (int64_t)after + 1, seen = 0;
  bool resync;
  hvd_status st;

  describe(what, sizeof(what), "WATCH", scope, NULL);
  if ((st = ready(c, deadline_ns)) != HVD_OK || (st = name_key(c, scope, NULL)) != HVD_OK)
    return st;
  if (after == 0) { /* from now on */
    if ((st = range(c, what, false, deadline_ns)) != HVD_OK)
      return st;
    etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision", &from);
    from++;
  }
  st = watch(c, what, e->keybuf.data, e->keybuf.len, e->endbuf.data, e->endbuf.len, from,
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
  struct etcd *e = E(c);
  cJSON *body;
  hvd_status st;

  if ((st = keep_lease(c, what, deadline_ns)) != HVD_OK)
    return st;
  body = txn_body(&e->keybuf, expected == 0 ? "CREATE" : "MOD", expected, value, len, e->lease);
  if (body == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  /* Not repeated: a transaction that was applied would then fail its
   * compare, and look lost. */
  st = call(c, "kv/txn", what, body, deadline_ns, false);
  cJSON_Delete(body);
  *won = st == HVD_OK && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e->answer, "succeeded"));
  return st;
}

static int64_t answer_revision(const struct etcd *e) {
  int64_t revision = 0;
  etcd_json_int64(cJSON_GetObjectItemCaseSensitive(e->answer, "header"), "revision", &revision);
  return revision;
}

static hvd_status etcd_cas(struct rdzv_client *c, const char *scope, const char *key,
                           uint64_t expected_version, const void *value, size_t len,
                           uint64_t *new_version, struct hvd_buf *current,
                           uint64_t *current_version) {
  struct etcd *e = E(c);
  char what[256];
  int64_t deadline = call_deadline(c), mod = 0;
  const cJSON *kv;
  bool won;
  hvd_status st;

  describe(what, sizeof(what), "PUT (compare-and-set)", scope, key);
  if ((st = ready(c, deadline)) != HVD_OK || (st = name_key(c, scope, key)) != HVD_OK ||
      (st = txn_put(c, what, (int64_t)expected_version, value, len, deadline, &won)) != HVD_OK)
    return st;
  if (won) {
    if (new_version != NULL)
      *new_version = (uint64_t)answer_revision(e);
    return HVD_OK;
  }
  kv = txn_current(e->answer);
  if (kv != NULL && (!kv_value(e, kv) || !etcd_json_int64(kv, "mod_revision", &mod)))
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer",
                     c->where, what);
  if (current_version != NULL)
    *current_version = (uint64_t)mod;
  if (current != NULL) {
    hvd_buf_reset(current);
    if (kv != NULL)
      take_value(e, current);
  }
  return hvd_error(HVD_ERR_CONFLICT, "rendezvous %s: %s: compare-and-set lost (%s)", c->where,
                   what, kv == NULL ? "the key does not exist" : "the key has another version");
}

static hvd_status etcd_add(struct rdzv_client *c, const char *scope, const char *key,
                           int64_t delta, int64_t *result) {
  struct etcd *e = E(c);
  char what[256], text[24];
  int64_t deadline = call_deadline(c), mod = 0, value = 0;
  const cJSON *kv;
  bool won = false;
  hvd_status st;

  describe(what, sizeof(what), "POST (add)", scope, key);
  if ((st = ready(c, deadline)) != HVD_OK || (st = name_key(c, scope, key)) != HVD_OK ||
      (st = range(c, what, false, deadline)) != HVD_OK)
    return st;
  kv = first_kv(e->answer);
  for (;;) {
    value = mod = 0;
    if (kv != NULL && (!kv_value(e, kv) || !etcd_json_int64(kv, "mod_revision", &mod)))
      return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer",
                       c->where, what);
    if (kv != NULL && !hvd_parse_int64(e->value.data, e->value.len, &value))
      return hvd_error(HVD_ERR_CONFLICT, "rendezvous %s: %s: the value is not an integer",
                       c->where, what);
    if ((delta > 0 && value > INT64_MAX - delta) || (delta < 0 && value < INT64_MIN - delta))
      return hvd_error(HVD_ERR_CONFLICT, "rendezvous %s: %s: the sum overflows", c->where, what);
    snprintf(text, sizeof(text), "%" PRId64, value + delta);
    if ((st = txn_put(c, what, mod, text, strlen(text), deadline, &won)) != HVD_OK)
      return st;
    if (won) {
      *result = value + delta;
      return HVD_OK;
    }
    kv = txn_current(e->answer); /* another writer was first: add to its value */
  }
}

static hvd_status etcd_del(struct rdzv_client *c, const char *scope, const char *key) {
  struct etcd *e = E(c);
  char what[256];
  int64_t deadline = call_deadline(c);
  cJSON *body;
  hvd_status st;

  describe(what, sizeof(what), "DELETE", scope, key);
  if ((st = ready(c, deadline)) != HVD_OK || (st = name_key(c, scope, key)) != HVD_OK)
    return st;
  if ((body = range_body(&e->keybuf, key == NULL ? &e->endbuf : NULL)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  st = call(c, "kv/deleterange", what, body, deadline, true);
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
  hvd_status st = body != NULL ? ready(c, deadline) : hvd_error(HVD_ERR_NO_MEMORY, "no memory");

  if (st == HVD_OK)
    st = call(c, "maintenance/status", "status", body, deadline, true);
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
};

/* ---- creation ---------------------------------------------------------------------- */

/* "host:port" or "[v6]:port", with a port in range. */
static bool valid_endpoint(const char *text, size_t len) {
  const char *colon = NULL;
  int64_t port;

  for (size_t i = 0; i < len; i++)
    if (text[i] == ':')
      colon = text + i;
  if (colon == NULL || colon == text || len >= ENDPOINT_MAX)
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
    if (e->nendpoints == MAX_ENDPOINTS)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "HVD_RENDEZVOUS='%s': more than %d members",
                       url, MAX_ENDPOINTS);
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
  hvd_buf_init(&e->line, LINE_MAX_BYTES);
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
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "HVD_ETCD_CERT and HVD_ETCD_KEY go together");
  if (st == HVD_OK && !e->tls && (e->cacert != NULL || e->cert != NULL))
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_ETCD_CACERT, HVD_ETCD_CERT and HVD_ETCD_KEY need an etcds:// URL");
  if (st != HVD_OK) {
    rdzv_client_destroy(c);
    return st;
  }
  /* the first member asked: spread a large job's ranks over the members */
  e->current = (size_t)(c->rng % e->nendpoints);
  snprintf(c->where, sizeof(c->where), "%s://%s%s%s", e->tls ? "etcds" : "etcd",
           e->endpoints[0], e->nendpoints > 1 ? ",..." : "", e->prefix);
  *out = c;
  return HVD_OK;
}
