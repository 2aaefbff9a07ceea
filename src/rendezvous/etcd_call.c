/*
 * The etcd backend's requests (etcd_private.h): one member at a time, the
 * next one when it cannot answer, watch streams read as they come, and
 * authentication.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_private.h"

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

static size_t etcd_stream_cb(char *data, size_t size, size_t n, void *arg);

/* ---- requests ---------------------------------------------------------------------- */

/* The time a first attempt may take at one member: ETCD_ATTEMPT_MS, less
 * for a client whose calls are short (a pod's heartbeat, 5 s: a member
 * cut off must not hold it past the driver's 2 s of silence). */
static int64_t first_attempt_ms(const struct rdzv_client *c) {
  int64_t ms = c->timeout_ms / 8;
  if (ms < ETCD_ATTEMPT_MIN_MS)
    ms = ETCD_ATTEMPT_MIN_MS;
  return ms < ETCD_ATTEMPT_MS ? ms : ETCD_ATTEMPT_MS;
}

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
  struct etcd *e = etcd_of(c);
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
                   (long)(timeout_ms < 1                 ? 1
                          : timeout_ms > ETCD_ATTEMPT_MS ? ETCD_ATTEMPT_MS
                                                         : timeout_ms));
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
  OUT_OK,     /* 200, c->response holds the answer */
  OUT_RETRY,  /* this member could not answer now: try the next one */
  OUT_FAILED, /* an error to return (set) */
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
  hvd_printable(cJSON_IsString(m) ? m->valuestring
                : c->response.len ? "(not JSON)"
                                  : "(no body)",
                message, size);
  cJSON_Delete(doc);
}

static hvd_status authenticate(struct rdzv_client *c, int64_t deadline_ns);

/* Whether a TLS connection failed as a member refuses one: a certificate
 * that does not verify, or a connection dropped at the handshake (etcd's
 * answer to a client without the certificate it requires: an alert, or
 * a connection closed before the request could be sent). */
static bool tls_refusal(CURLcode rc) {
  switch (rc) {
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_PEER_FAILED_VERIFICATION:
  case CURLE_SSL_CERTPROBLEM:
  case CURLE_SSL_CIPHER:
  case CURLE_SSL_CACERT_BADFILE:
  case CURLE_SSL_ISSUER_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_GOT_NOTHING:
    return true;
  default:
    return false;
  }
}

/* Which errors another attempt may cure. */
static bool retryable_code(int code, const char *message, bool idempotent) {
  if (code == GRPC_UNAVAILABLE || code == GRPC_DEADLINE_EXCEEDED)
    /* "no leader" was never applied; a timed-out request may have been */
    return idempotent || strstr(message, "no leader") != NULL;
  /* "too many requests": the member applies what it committed too slowly
   * and turned the request away (etcd's back-pressure): later, then */
  return code == GRPC_RESOURCE_EXHAUSTED && strstr(message, "too many requests") != NULL;
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
 * at ETCD_WATCH_CHUNK_MS. On success c->response holds the answer (not for a
 * stream).
 */
static hvd_status request(struct rdzv_client *c, const char *path, const char *what,
                          const char *body, int64_t deadline_ns, bool idempotent, bool stream) {
  struct etcd *e = etcd_of(c);
  struct curl_slist *headers = NULL;
  char url[ETCD_ENDPOINT_MAX + 64], last[300] = "";
  int64_t backoff = RDZV_BACKOFF_FIRST_MS, started = hvd_now_ns();
  unsigned attempts = 0;
  /* answered: a member answered with an error; slow: one had the request
   * and did not answer in time (a member without quorum, or frozen) */
  bool reauthenticated = false, answered = false, slow = false;
  /* with TLS, a member refused the connection (a certificate problem) */
  bool refused = false;

  for (;;) {
    int64_t left = hvd_remaining_ms(deadline_ns);
    /* A request that is not repeated has the call's whole time: cut at
     * ETCD_ATTEMPT_MS, it failed on a member that was merely slow. */
    /* Each round over the members doubles the time one may take: a frozen
     * member is passed over in 3 s, and a cluster slow with load is not
     * flooded with requests repeated every 3 s. */
    int64_t attempt_ms = first_attempt_ms(c) << (attempts / e->nendpoints < 6
                                                     ? attempts / e->nendpoints
                                                     : 6);
    int64_t limit = stream        ? (left < ETCD_WATCH_CHUNK_MS ? left : ETCD_WATCH_CHUNK_MS)
                    : !idempotent ? left
                                  : (left < attempt_ms ? left : attempt_ms);
    enum outcome out = OUT_RETRY;
    hvd_status st = HVD_OK;
    long http = 0, sent = 0;
    CURLcode rc;

    snprintf(url, sizeof(url), "%s://%s/v3/%s", e->tls ? "https" : "http", e->endpoints[e->current],
             path);
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
    curl_easy_getinfo(c->curl, CURLINFO_REQUEST_SIZE, &sent);
    curl_slist_free_all(headers);
    if (c->cancelled)
      return hvd_error(HVD_ERR_ABORTED, "rendezvous %s: %s: cancelled", c->where, what);
    /* A watch that reached the deadline before its member's first answer
     * (a busy one) is a wait that timed out, not a member out of reach. */
    if (stream && (e->watch_done || e->watch_canceled ||
                   (rc == CURLE_OPERATION_TIMEDOUT &&
                    (http == 200 || (sent > 0 && hvd_now_ns() >= deadline_ns)))))
      return HVD_OK; /* the caller looks at what the watch saw */
    if (rc == CURLE_WRITE_ERROR && hvd_error_status() == HVD_ERR_TOO_LARGE)
      return hvd_error(HVD_ERR_TOO_LARGE, "rendezvous %s: %s: the answer exceeds %u bytes",
                       c->where, what, (unsigned)RDZV_RESPONSE_MAX);
    if (rc != CURLE_OK) {
      snprintf(last, sizeof(last), "%s: %s", e->endpoints[e->current],
               c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc));
      slow = slow || (rc == CURLE_OPERATION_TIMEDOUT && sent > 0);
      refused = refused || (e->tls && tls_refusal(rc));
      /* a request never sent may always be repeated */
      if (!idempotent && rc != CURLE_COULDNT_CONNECT && rc != CURLE_COULDNT_RESOLVE_HOST) {
        st = rc == CURLE_OPERATION_TIMEDOUT ? HVD_ERR_TIMEOUT : HVD_ERR_NETWORK;
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
      return hvd_error(answered || slow ? HVD_ERR_TIMEOUT : HVD_ERR_NETWORK,
                       "rendezvous %s: %s: %s within %.1f s (%u attempts; last: %s); check that "
                       "a majority of the etcd cluster's members is up and reachable%s, or raise "
                       "HOROVOD_GLOO_TIMEOUT_SECONDS",
                       c->where, what,
                       answered  ? "no member could serve it"
                       : slow    ? "no member answered in time"
                       : refused ? "no member accepted the TLS connection"
                                 : "no member reached",
                       (double)(hvd_now_ns() - started) / 1e9, attempts, last,
                       refused ? ", that HVD_ETCD_CACERT holds the CA of the members' "
                                 "certificates and, where the members require client "
                                 "certificates (--client-cert-auth), that HVD_ETCD_CERT and "
                                 "HVD_ETCD_KEY give one"
                               : "");
  }
}

/* request() for a JSON answer, parsed into e->answer. */
hvd_status rdzv_etcd_call(struct rdzv_client *c, const char *path, const char *what, cJSON *body,
                          int64_t deadline_ns, bool idempotent) {
  struct etcd *e = etcd_of(c);
  char *text = cJSON_PrintUnformatted(body);
  hvd_status st;

  cJSON_Delete(e->answer);
  e->answer = NULL;
  if (text == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd request");
  st = request(c, path, what, text, deadline_ns, idempotent, false);
  free(text);
  if (st == HVD_OK && (e->answer = cJSON_ParseWithLength(c->response.data ? c->response.data : "",
                                                         c->response.len)) == NULL)
    st = hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: the answer is not JSON", c->where, what);
  return st;
}

/* ---- watch streams ----------------------------------------------------------------- */

/* One message of a watch stream: {"result": {"header": ..., "events": [...]}}.
 * Only events move the watch on (a resumed watch starts after the last
 * one seen): a header's revision may be ahead of events still to come. */
static bool watch_message(struct rdzv_client *c, const char *text, size_t len) {
  struct etcd *e = etcd_of(c);
  cJSON *doc = cJSON_ParseWithLength(text, len);
  const cJSON *result = cJSON_GetObjectItemCaseSensitive(doc, "result");
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(result, "events");
  const cJSON *event;
  bool done = false;

  if (!cJSON_IsObject(result)) { /* {"error": ...}: the stream ends */
    e->watch_canceled = true;
    cJSON_Delete(doc);
    return true;
  }
  if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(result, "canceled")))
    e->watch_canceled = true;
  cJSON_ArrayForEach(event, events) {
    int64_t revision = 0;
    rdzv_etcd_json_int64(cJSON_GetObjectItemCaseSensitive(event, "kv"), "mod_revision",
                         &revision);
    if (revision > e->watch_revision)
      e->watch_revision = revision;
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
  struct etcd *e = etcd_of(c);
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
hvd_status rdzv_etcd_watch(struct rdzv_client *c, const char *what, const char *key, size_t key_len,
                           const char *end, size_t end_len, int64_t from, int64_t deadline_ns,
                           etcd_event_fn fn, void *arg, bool *resync) {
  struct etcd *e = etcd_of(c);
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
    if (create == NULL || rdzv_etcd_json_add_bytes(create, "key", key, key_len) != HVD_OK ||
        (end != NULL && rdzv_etcd_json_add_bytes(create, "range_end", end, end_len) != HVD_OK) ||
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
  struct etcd *e = etcd_of(c);
  cJSON *body = cJSON_CreateObject();
  const cJSON *token;
  hvd_status st = HVD_OK;

  if (cJSON_AddStringToObject(body, "name", e->user) == NULL ||
      cJSON_AddStringToObject(body, "password", e->password ? e->password : "") == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd request");
  if (st == HVD_OK)
    st = rdzv_etcd_call(c, "auth/authenticate", "authenticate", body, deadline_ns, true);
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

hvd_status rdzv_etcd_ready(struct rdzv_client *c, int64_t deadline_ns) {
  struct etcd *e = etcd_of(c);
  return e->user != NULL && e->auth_header == NULL ? authenticate(c, deadline_ns) : HVD_OK;
}
