/*
 * The rendezvous client's backend for hvd's own store (server.c): its HTTP
 * protocol (docs/rendezvous-protocol.md) through libcurl. Long waits are
 * the server's long-polls, re-issued in chunks.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_private.h"

enum {
  LONG_POLL_CHUNK_MS = 30000, /* re-issue long-polls this often */
  GRACE_MS = 10000,           /* transfer time allowed beyond a long-poll */
};

struct http {
  char *auth_header; /* "Authorization: Bearer ...", or NULL */
};

/* What to send; the helpers below fill one per call. */
struct call {
  const char *method;
  const char *scope;
  const char *key; /* NULL: the whole scope */
  char query[64];
  const void *body;
  size_t body_len;
  char condition[64]; /* an If-Match / If-None-Match header, or "" */
  const char *header;  /* one more header line, or NULL */
  bool idempotent;
  int64_t deadline_ns;
  int64_t server_wait_ms; /* how long the server may hold the request */
};

/* ---- one HTTP exchange ----------------------------------------------------------- */

/* "PUT /scope/key" for messages. */
static void describe(const struct call *call, char *out, size_t size) {
  snprintf(out, size, "%s /%s%s%s%s%s", call->method, call->scope, call->key ? "/" : "",
           call->key ? call->key : "", call->query[0] ? "?" : "", call->query);
}

static hvd_status build_url(struct rdzv_client *c, const struct call *call, struct hvd_buf *url) {
  char *scope = curl_easy_escape(c->curl, call->scope, 0);
  char *key = call->key ? curl_easy_escape(c->curl, call->key, 0) : NULL;
  hvd_status st;

  if (scope == NULL || (call->key != NULL && key == NULL))
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot escape a URL");
  else
    st = hvd_buf_printf(url, "%s/%s%s%s%s%s", c->where, scope, key ? "/" : "", key ? key : "",
                        call->query[0] ? "?" : "", call->query);
  curl_free(scope);
  curl_free(key);
  return st;
}

static struct curl_slist *build_headers(struct rdzv_client *c, const struct call *call) {
  struct curl_slist *list = curl_slist_append(NULL, "Expect:");
  const struct http *h = c->backend;
  if (list != NULL && h->auth_header != NULL)
    list = curl_slist_append(list, h->auth_header);
  if (list != NULL && call->body != NULL)
    list = curl_slist_append(list, "Content-Type: application/octet-stream");
  if (list != NULL && call->condition[0] != '\0')
    list = curl_slist_append(list, call->condition);
  if (list != NULL && call->header != NULL)
    list = curl_slist_append(list, call->header);
  return list;
}

/* Whether a failed attempt may be repeated. */
static bool retryable(CURLcode rc, bool idempotent) {
  switch (rc) {
  case CURLE_COULDNT_CONNECT:
  case CURLE_COULDNT_RESOLVE_HOST:
    return true; /* the server never saw the request */
  case CURLE_GOT_NOTHING:
  case CURLE_SEND_ERROR:
  case CURLE_RECV_ERROR:
  case CURLE_PARTIAL_FILE:
    return idempotent;
  default:
    return false;
  }
}

/* A 503 with Retry-After: the server closed the connection to make room
 * (over its connection limits, guard.c) and did not run the request, so
 * any request may be repeated. Its shutdown 503 has no Retry-After. */
static bool turned_away(struct rdzv_client *c, long code) {
  struct curl_header *h;
  return code == 503 &&
         curl_easy_header(c->curl, "Retry-After", 0, CURLH_HEADER, -1, &h) == CURLHE_OK;
}

static hvd_status configure(struct rdzv_client *c, const struct call *call, const char *url,
                            struct curl_slist *headers) {
  int64_t remaining = hvd_remaining_ms(call->deadline_ns);
  int64_t total = remaining + (call->server_wait_ms > 0 ? GRACE_MS : 0);
  CURL *h = c->curl;

  curl_easy_reset(h); /* keeps the connection cache */
  curl_easy_setopt(h, CURLOPT_URL, url);
  /* A key "." or ".." is a name, not a dot segment for curl to resolve
   * (curl_easy_escape leaves dots as they are). */
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  /* The server closes a connection that sends no request for 5 s
   * (guard.c): do not reuse one idle that long. */
  curl_easy_setopt(h, CURLOPT_MAXAGE_CONN, 3L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->curl_error);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rdzv_client_collect);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(total < 1 ? 1 : total));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(remaining < 1 ? 1 : remaining));
  if (strcmp(call->method, "PUT") == 0) {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, call->body ? call->body : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)call->body_len);
  } else if (strcmp(call->method, "POST") == 0) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
  } else if (strcmp(call->method, "DELETE") == 0) {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
  }
  return HVD_OK;
}

/*
 * Runs the call until the server answers or the deadline passes. On success
 * *code is the HTTP status and c->response holds the body.
 */
static hvd_status perform(struct rdzv_client *c, const struct call *call, long *code) {
  struct hvd_buf url;
  struct curl_slist *headers = NULL;
  char what[256];
  int64_t backoff = RDZV_BACKOFF_FIRST_MS;
  int64_t started = hvd_now_ns();
  unsigned attempts = 0;
  CURLcode rc = CURLE_OK;
  hvd_status st;

  describe(call, what, sizeof(what));
  hvd_buf_init(&url, 0);
  st = build_url(c, call, &url);
  if (st == HVD_OK && (headers = build_headers(c, call)) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot build request headers");
  while (st == HVD_OK) {
    hvd_buf_reset(&c->response);
    c->curl_error[0] = '\0';
    configure(c, call, url.data, headers);
    attempts++;
    rc = rdzv_client_transfer(c);
    if (rc == CURLE_OK) {
      curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, code);
      if (!turned_away(c, *code) || hvd_now_ns() >= call->deadline_ns)
        break;
      HVD_LOG_DEBUG("rendezvous %s: %s: turned away (the server is at its connection limit); "
                    "retrying", c->where, what);
    } else if (!retryable(rc, call->idempotent) || hvd_now_ns() >= call->deadline_ns) {
      break;
    } else {
      HVD_LOG_DEBUG("rendezvous %s: %s: %s; retrying", c->where, what,
                    c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc));
    }
    if (!rdzv_client_pause(c, &backoff, call->deadline_ns))
      break;
  }
  curl_slist_free_all(headers);
  hvd_buf_fini(&url);
  if (st != HVD_OK || rc == CURLE_OK)
    return st;

  const char *detail = c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc);
  double waited = (double)(hvd_now_ns() - started) / 1e9;
  if (c->cancelled)
    return hvd_error(HVD_ERR_ABORTED, "rendezvous %s: %s: cancelled", c->where, what);
  if (rc == CURLE_WRITE_ERROR && hvd_error_status() == HVD_ERR_TOO_LARGE)
    return hvd_error(HVD_ERR_TOO_LARGE, "rendezvous %s: %s: the answer exceeds %u bytes",
                     c->where, what, (unsigned)RDZV_RESPONSE_MAX);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return hvd_error(HVD_ERR_TIMEOUT,
                     "rendezvous %s: %s: no answer within %.1f s (%s); check that the server is "
                     "alive and reachable, or raise HOROVOD_GLOO_TIMEOUT_SECONDS",
                     c->where, what, waited, detail);
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
    return hvd_error(HVD_ERR_NETWORK,
                     "rendezvous %s: %s: cannot reach the server after %u attempts over %.1f s "
                     "(%s); check that the rendezvous server is running and that "
                     "HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT point to it, or raise "
                     "HOROVOD_GLOO_TIMEOUT_SECONDS to wait longer",
                     c->where, what, attempts, waited, detail);
  return hvd_error(HVD_ERR_NETWORK, "rendezvous %s: %s: %s (curl error %d)", c->where, what,
                   detail, (int)rc);
}

/* The status and message for an HTTP answer the caller did not expect. */
static hvd_status http_error(struct rdzv_client *c, const struct call *call, long code) {
  char what[256];
  char body[200];
  size_t n = c->response.len < sizeof(body) - 1 ? c->response.len : sizeof(body) - 1;
  hvd_status st;
  const char *hint = "";

  describe(call, what, sizeof(what));
  memcpy(body, c->response.data ? c->response.data : "", n);
  body[n] = '\0';
  while (n > 0 && (body[n - 1] == '\n' || body[n - 1] == '\r'))
    body[--n] = '\0';
  switch (code) {
  case 400: st = HVD_ERR_INVALID_ARGUMENT; break;
  case 401:
    st = HVD_ERR_UNAUTHORIZED;
    hint = ((const struct http *)c->backend)->auth_header != NULL
               ? " (the job token was rejected: check HVD_TOKEN)"
               : " (the server needs the job token: set HVD_TOKEN)";
    break;
  case 403: st = HVD_ERR_UNAUTHORIZED; break;
  case 404: st = HVD_ERR_NOT_FOUND; break;
  case 408: st = HVD_ERR_TIMEOUT; break;
  case 409:
  case 412: st = HVD_ERR_CONFLICT; break;
  case 413:
  case 414:
  case 431:
  case 507: st = HVD_ERR_TOO_LARGE; break;
  case 503:
    st = HVD_ERR_ABORTED;
    hint = turned_away(c, code) ? " (until the deadline: too many connections from this host, or "
                                  "in all, hold the server's connection limits)"
                                : " (the server is shutting down)";
    break;
  default:
    st = HVD_ERR_PROTOCOL;
    break;
  }
  return hvd_error(st, "rendezvous %s: %s: HTTP %ld%s%s%s", c->where, what, code,
                   body[0] ? ": " : "", body, hint);
}

/* Runs the call; any answer but 200 is an error. */
static hvd_status exchange(struct rdzv_client *c, const struct call *call) {
  long code = 0;
  hvd_status st = perform(c, call, &code);
  if (st == HVD_OK && code != 200)
    st = http_error(c, call, code);
  return st;
}

static struct call make_call(const char *method, const char *scope, const char *key,
                             int64_t deadline_ns) {
  struct call call;
  memset(&call, 0, sizeof(call));
  call.method = method;
  call.scope = scope;
  call.key = key;
  call.idempotent = true;
  call.deadline_ns = deadline_ns;
  return call;
}

static uint64_t response_version(struct rdzv_client *c) {
  struct curl_header *h = NULL;
  int64_t v = 0;
  if (curl_easy_header(c->curl, "ETag", 0, CURLH_HEADER, -1, &h) == CURLHE_OK) {
    size_t len = strlen(h->value);
    if (len >= 3 && h->value[0] == '"' && h->value[len - 1] == '"' &&
        hvd_parse_int64(h->value + 1, len - 2, &v) && v > 0)
      return (uint64_t)v;
  }
  return 0;
}

static hvd_status take_response(struct rdzv_client *c, struct hvd_buf *out) {
  if (out == NULL)
    return HVD_OK;
  hvd_buf_reset(out);
  return hvd_buf_append(out, c->response.data, c->response.len);
}

/* ---- the operations ------------------------------------------------------------------ */

static int64_t call_deadline(const struct rdzv_client *c) {
  return hvd_deadline_after_ms(c->timeout_ms);
}

static hvd_status http_set(struct rdzv_client *c, const char *scope, const char *key,
                           const void *value, size_t len) {
  struct call call = make_call("PUT", scope, key, call_deadline(c));

  call.body = value;
  call.body_len = len;
  return exchange(c, &call);
}

static hvd_status http_get(struct rdzv_client *c, const char *scope, const char *key,
                           struct hvd_buf *value, uint64_t *version) {
  struct call call = make_call("GET", scope, key, call_deadline(c));
  hvd_status st = exchange(c, &call);

  if (st != HVD_OK)
    return st;
  if (version != NULL)
    *version = response_version(c);
  return take_response(c, value);
}

/* Long-polls `call` (a GET with a wait query) until 200 or the deadline. */
static hvd_status long_poll(struct rdzv_client *c, struct call *call, const char *count_param,
                            int64_t started_ns) {
  long code = 0;
  hvd_status st;

  for (;;) {
    int64_t chunk = hvd_remaining_ms(call->deadline_ns);
    if (chunk > LONG_POLL_CHUNK_MS)
      chunk = LONG_POLL_CHUNK_MS;
    snprintf(call->query, sizeof(call->query), "%swait=%" PRId64, count_param, chunk);
    call->server_wait_ms = chunk;
    st = perform(c, call, &code);
    if (st != HVD_OK)
      return st;
    if (code == 200)
      return HVD_OK;
    if (code != 408 || hvd_now_ns() >= call->deadline_ns)
      break;
  }
  if (code == 408) {
    char what[256];
    describe(call, what, sizeof(what));
    return hvd_error(HVD_ERR_TIMEOUT,
                     "rendezvous %s: %s: %s did not appear within %.1f s; check that the ranks "
                     "that publish it are running, or raise HOROVOD_GLOO_TIMEOUT_SECONDS",
                     c->where, what, call->key ? "the key" : "enough keys",
                     (double)(call->deadline_ns - started_ns) / 1e9);
  }
  return http_error(c, call, code);
}

static hvd_status http_wait(struct rdzv_client *c, const char *scope, const char *key,
                            int64_t deadline_ns, struct hvd_buf *value) {
  struct call call = make_call("GET", scope, key, deadline_ns);
  hvd_status st = long_poll(c, &call, "", hvd_now_ns());

  return st == HVD_OK ? take_response(c, value) : st;
}

static hvd_status http_get_scope(struct rdzv_client *c, const char *scope, size_t min_count,
                                 int64_t deadline_ns, struct rdzv_scope_view *out) {
  struct call call = make_call("GET", scope, NULL, deadline_ns);
  char count_param[40];
  hvd_status st;
  char *body;
  size_t len;

  snprintf(count_param, sizeof(count_param), "count=%zu&", min_count);
  st = long_poll(c, &call, count_param, hvd_now_ns());
  if (st != HVD_OK)
    return st;
  body = hvd_buf_detach(&c->response, &len);
  st = rdzv_scope_decode(body, len, out);
  if (st != HVD_OK)
    hvd_error_prefix("rendezvous %s: GET /%s", c->where, scope);
  return st;
}

static hvd_status http_add(struct rdzv_client *c, const char *scope, const char *key,
                           int64_t delta, int64_t *result) {
  struct call call = make_call("POST", scope, key, call_deadline(c));
  int64_t value;
  hvd_status st;

  call.idempotent = false; /* repeating an add that arrived would add twice */
  snprintf(call.query, sizeof(call.query), "add=%" PRId64, delta);
  if ((st = exchange(c, &call)) != HVD_OK)
    return st;
  if (!hvd_parse_int64(c->response.data ? c->response.data : "", c->response.len, &value))
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: POST /%s/%s: answer is not an integer",
                     c->where, scope, key);
  *result = value;
  return HVD_OK;
}

static hvd_status http_cas(struct rdzv_client *c, const char *scope, const char *key,
                           uint64_t expected_version, const void *value, size_t len,
                           uint64_t *new_version, struct hvd_buf *current,
                           uint64_t *current_version) {
  struct call call = make_call("PUT", scope, key, call_deadline(c));
  long code = 0;
  hvd_status st;

  /* A repeated CAS that had succeeded would report a false conflict. */
  call.idempotent = false;
  call.body = value;
  call.body_len = len;
  if (expected_version == 0)
    snprintf(call.condition, sizeof(call.condition), "If-None-Match: *");
  else
    snprintf(call.condition, sizeof(call.condition), "If-Match: \"%" PRIu64 "\"",
             expected_version);
  if ((st = perform(c, &call, &code)) != HVD_OK)
    return st;
  if (code == 200) {
    if (new_version != NULL)
      *new_version = response_version(c);
    return HVD_OK;
  }
  if (code == 412) {
    uint64_t version = response_version(c);
    if (current_version != NULL)
      *current_version = version;
    if (current != NULL) {
      hvd_buf_reset(current);
      if (version != 0)
        take_response(c, current);
    }
    return hvd_error(HVD_ERR_CONFLICT, "rendezvous %s: PUT /%s/%s: compare-and-set lost (%s)",
                     c->where, scope, key,
                     version == 0 ? "the key does not exist" : "the key has another version");
  }
  return http_error(c, &call, code);
}

static hvd_status http_del(struct rdzv_client *c, const char *scope, const char *key) {
  struct call call = make_call("DELETE", scope, key, call_deadline(c));
  return exchange(c, &call);
}

/* Copies a string member of the admission answer. */
static hvd_status admit_field(const cJSON *doc, const char *name, struct hvd_buf *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(doc, name);
  if (!cJSON_IsString(item))
    return hvd_error(HVD_ERR_PROTOCOL, "the admission answer has no string '%s'", name);
  hvd_buf_reset(out);
  return hvd_buf_append(out, item->valuestring, strlen(item->valuestring));
}

static hvd_status http_admit(struct rdzv_client *c, const char *credential, struct hvd_buf *job,
                             struct hvd_buf *token) {
  struct call call = make_call("POST", RDZV_ADMIT_SCOPE, NULL, call_deadline(c));
  struct hvd_buf header;
  cJSON *doc = NULL;
  hvd_status st = HVD_OK;

  hvd_buf_init(&header, 0);
  /* A credential is good once: only a request the server never saw is
   * repeated. */
  call.idempotent = false;
  if (credential != NULL) {
    st = hvd_buf_printf(&header, "%s: %s", RDZV_CREDENTIAL_HEADER, credential);
    call.header = header.data;
  }
  if (st == HVD_OK)
    st = exchange(c, &call);
  if (st == HVD_OK && (doc = cJSON_ParseWithLength(c->response.data, c->response.len)) == NULL)
    st = hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: POST %s: the answer is not JSON",
                   c->where, RDZV_ADMIT_PATH);
  if (st == HVD_OK)
    st = admit_field(doc, "job", job);
  if (st == HVD_OK)
    st = admit_field(doc, "token", token);
  cJSON_Delete(doc);
  if (header.data != NULL)
    explicit_bzero(header.data, header.len);
  hvd_buf_fini(&header);
  if (c->response.data != NULL) /* the token, as it came */
    explicit_bzero(c->response.data, c->response.len);
  return st;
}

static hvd_status http_health(struct rdzv_client *c, struct hvd_buf *json) {
  struct call call = make_call("GET", "_health", NULL, call_deadline(c));
  hvd_status st = exchange(c, &call);

  return st == HVD_OK ? take_response(c, json) : st;
}

static void http_destroy(struct rdzv_client *c) {
  struct http *h = c->backend;
  if (h != NULL)
    free(h->auth_header);
  free(h);
}

static const struct rdzv_client_ops http_ops = {
    .plans_scopes = true,
    .destroy = http_destroy,
    .set = http_set,
    .get = http_get,
    .wait = http_wait,
    .get_scope = http_get_scope,
    .add = http_add,
    .cas = http_cas,
    .del = http_del,
    .admit = http_admit,
    .health = http_health,
};

hvd_status rdzv_client_create(const char *host, int port, const char *token, int64_t timeout_ms,
                              struct rdzv_client **out) {
  struct rdzv_client *c;
  struct http *h;
  bool v6 = host != NULL && strchr(host, ':') != NULL && host[0] != '[';

  if (host == NULL || host[0] == '\0' || strlen(host) > 253 + 2)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: bad server host '%s'",
                     host ? host : "(null)");
  if (port < 1 || port > 65535)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: port %d is not in 1-65535",
                     port);
  if ((c = rdzv_client_alloc(timeout_ms)) == NULL)
    return hvd_error_status();
  c->ops = &http_ops;
  snprintf(c->where, sizeof(c->where), v6 ? "http://[%s]:%d" : "http://%s:%d", host, port);
  c->backend = h = calloc(1, sizeof(*h));
  if (h != NULL && token != NULL && token[0] != '\0') {
    size_t len = strlen(token) + 32;
    if ((h->auth_header = malloc(len)) != NULL)
      snprintf(h->auth_header, len, "Authorization: Bearer %s", token);
  }
  if (h == NULL || (token != NULL && token[0] != '\0' && h->auth_header == NULL)) {
    rdzv_client_destroy(c);
    return hvd_error(HVD_ERR_NO_MEMORY, "rendezvous client: out of memory");
  }
  *out = c;
  return HVD_OK;
}
