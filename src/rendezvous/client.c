/*
 * The rendezvous HTTP client (libcurl).
 *
 * DESIGN. One curl easy handle per client keeps one keep-alive connection to
 * the server. Every call carries an absolute deadline. A request the server
 * never saw (connection refused, name not resolvable yet: the server or its
 * Kubernetes Service may still be starting) is retried with jittered
 * exponential backoff until that deadline; a request that may have reached
 * the server is retried only when repeating it is harmless. Waiting is done
 * by the server (long-poll), in chunks, so a client never polls in a loop.
 * Every failure leaves a message that names the server, the request, the
 * HTTP code or curl error, and what to check.
 */
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous.h"

enum {
  RESPONSE_MAX = 256u << 20,  /* a whole scope of a very large job still fits */
  LONG_POLL_CHUNK_MS = 30000, /* re-issue long-polls this often */
  GRACE_MS = 10000,           /* transfer time allowed beyond a long-poll */
  BACKOFF_FIRST_MS = 10,
  BACKOFF_MAX_MS = 1000,
};

struct rdzv_client {
  CURL *curl;
  char base_url[300]; /* http://host:port */
  char *auth_header;  /* "Authorization: Bearer ...", or NULL */
  int64_t timeout_ms;
  uint64_t rng;
  struct hvd_buf response;
  char curl_error[CURL_ERROR_SIZE];
  int cancel_fd; /* readable: the call in progress gives up (-1: none) */
  CURLM *multi;  /* drives transfers while cancel_fd is set */
  bool cancelled;
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

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void curl_init_once(void) { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

hvd_status rdzv_client_create(const char *host, int port, const char *token, int64_t timeout_ms,
                              struct rdzv_client **out) {
  struct rdzv_client *c;
  bool v6 = host != NULL && strchr(host, ':') != NULL && host[0] != '[';

  if (host == NULL || host[0] == '\0' || strlen(host) > 253 + 2)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: bad server host '%s'",
                     host ? host : "(null)");
  if (port < 1 || port > 65535)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: port %d is not in 1-65535",
                     port);
  if (timeout_ms < 0)
    timeout_ms = RDZV_DEFAULT_TIMEOUT_MS;
  pthread_once(&curl_once, curl_init_once);
  if (curl_init_result != CURLE_OK)
    return hvd_error(HVD_ERR_INTERNAL, "rendezvous client: curl_global_init: %s",
                     curl_easy_strerror(curl_init_result));
  c = calloc(1, sizeof(*c));
  if (c == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "rendezvous client: out of memory");
  snprintf(c->base_url, sizeof(c->base_url), v6 ? "http://[%s]:%d" : "http://%s:%d", host, port);
  c->timeout_ms = timeout_ms;
  c->cancel_fd = -1;
  c->rng = (uint64_t)hvd_now_ns() ^ (uint64_t)(uintptr_t)c;
  hvd_buf_init(&c->response, RESPONSE_MAX);
  c->curl = curl_easy_init();
  if (token != NULL && token[0] != '\0') {
    size_t len = strlen(token) + 32;
    c->auth_header = malloc(len);
    if (c->auth_header != NULL)
      snprintf(c->auth_header, len, "Authorization: Bearer %s", token);
  }
  if (c->curl == NULL || (token != NULL && token[0] != '\0' && c->auth_header == NULL)) {
    rdzv_client_destroy(c);
    return hvd_error(HVD_ERR_NO_MEMORY, "rendezvous client: cannot create a curl handle");
  }
  *out = c;
  return HVD_OK;
}

hvd_status rdzv_client_create_from_env(struct rdzv_client **out) {
  const char *addr = NULL, *token = NULL;
  int64_t port, timeout_s;
  hvd_status st = hvd_setting_text(HVD_SET_RENDEZVOUS_ADDR, &addr);

  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_TOKEN, &token);
  if (st != HVD_OK)
    return st;
  if (addr == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_GLOO_RENDEZVOUS_ADDR is not set: start ranks with hvdrun, or set "
                     "it to the rendezvous server's address");
  st = hvd_setting_int(HVD_SET_RENDEZVOUS_PORT, &port);
  if (st == HVD_OK && port < 0)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HOROVOD_GLOO_RENDEZVOUS_PORT is not set (the rendezvous server's port)");
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_TIMEOUT, &timeout_s);
  if (st != HVD_OK)
    return st;
  return rdzv_client_create(addr, (int)port, token, timeout_s * 1000, out);
}

void rdzv_client_destroy(struct rdzv_client *c) {
  if (c == NULL)
    return;
  if (c->curl != NULL)
    curl_easy_cleanup(c->curl);
  if (c->multi != NULL)
    curl_multi_cleanup(c->multi);
  free(c->auth_header);
  hvd_buf_fini(&c->response);
  free(c);
}

int64_t rdzv_client_timeout_ms(const struct rdzv_client *c) { return c->timeout_ms; }

void rdzv_client_set_timeout_ms(struct rdzv_client *c, int64_t timeout_ms) {
  c->timeout_ms = timeout_ms;
}

hvd_status rdzv_client_set_cancel_fd(struct rdzv_client *c, int fd) {
  if (fd >= 0 && c->multi == NULL && (c->multi = curl_multi_init()) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "rendezvous client: cannot create a curl multi handle");
  c->cancel_fd = fd;
  return HVD_OK;
}

static int64_t deadline_for(const struct rdzv_client *c, int64_t timeout_ms) {
  return hvd_deadline_after_ms(timeout_ms < 0 ? c->timeout_ms : timeout_ms);
}

/* ---- one HTTP exchange ----------------------------------------------------------- */

static size_t write_cb(char *data, size_t size, size_t n, void *arg) {
  struct rdzv_client *c = arg;
  return hvd_buf_append(&c->response, data, size * n) == HVD_OK ? size * n : 0;
}

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
    st = hvd_buf_printf(url, "%s/%s%s%s%s%s", c->base_url, scope, key ? "/" : "", key ? key : "",
                        call->query[0] ? "?" : "", call->query);
  curl_free(scope);
  curl_free(key);
  return st;
}

static struct curl_slist *build_headers(struct rdzv_client *c, const struct call *call) {
  struct curl_slist *list = curl_slist_append(NULL, "Expect:");
  if (list != NULL && c->auth_header != NULL)
    list = curl_slist_append(list, c->auth_header);
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

static int64_t jittered(struct rdzv_client *c, int64_t ms) {
  /* xorshift64: enough randomness to spread thousands of ranks apart */
  c->rng ^= c->rng << 13;
  c->rng ^= c->rng >> 7;
  c->rng ^= c->rng << 17;
  return ms / 2 + (int64_t)(c->rng % (uint64_t)(ms / 2 + 1));
}

static hvd_status configure(struct rdzv_client *c, const struct call *call, const char *url,
                            struct curl_slist *headers) {
  int64_t remaining = hvd_remaining_ms(call->deadline_ns);
  int64_t total = remaining + (call->server_wait_ms > 0 ? GRACE_MS : 0);
  CURL *h = c->curl;

  curl_easy_reset(h); /* keeps the connection cache */
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
  /* The server closes a connection that sends no request for 5 s
   * (guard.c): do not reuse one idle that long. */
  curl_easy_setopt(h, CURLOPT_MAXAGE_CONN, 3L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, c->curl_error);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
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

/* One transfer. With a cancel fd, a multi handle drives it so that the
 * wait can also watch that fd; CURLE_ABORTED_BY_CALLBACK then says it
 * became readable. */
static CURLcode transfer(struct rdzv_client *c) {
  CURLcode rc = CURLE_OK;
  CURLMsg *msg;
  int running = 1, left;

  if (c->cancel_fd < 0)
    return curl_easy_perform(c->curl);
  if (curl_multi_add_handle(c->multi, c->curl) != CURLM_OK)
    return CURLE_OUT_OF_MEMORY;
  while (running > 0) {
    struct curl_waitfd cancel = {.fd = c->cancel_fd, .events = CURL_WAIT_POLLIN};
    if (curl_multi_perform(c->multi, &running) != CURLM_OK) {
      rc = CURLE_RECV_ERROR;
      break;
    }
    if (running == 0)
      break;
    if (curl_multi_poll(c->multi, &cancel, 1, 1000, NULL) != CURLM_OK) {
      rc = CURLE_RECV_ERROR;
      break;
    }
    if (cancel.revents != 0) {
      c->cancelled = true;
      rc = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
  }
  while ((msg = curl_multi_info_read(c->multi, &left)) != NULL) {
    if (msg->msg == CURLMSG_DONE && msg->easy_handle == c->curl && rc == CURLE_OK)
      rc = msg->data.result;
  }
  curl_multi_remove_handle(c->multi, c->curl);
  return rc;
}

/*
 * Runs the call until the server answers or the deadline passes. On success
 * *code is the HTTP status and c->response holds the body.
 */
static hvd_status perform(struct rdzv_client *c, const struct call *call, long *code) {
  struct hvd_buf url;
  struct curl_slist *headers = NULL;
  char what[256];
  int64_t backoff = BACKOFF_FIRST_MS;
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
    c->cancelled = false;
    rc = transfer(c);
    if (rc == CURLE_OK) {
      curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, code);
      if (!turned_away(c, *code) || hvd_now_ns() >= call->deadline_ns)
        break;
      HVD_LOG_DEBUG("rendezvous %s: %s: turned away (the server is at its connection limit); "
                    "retrying", c->base_url, what);
    } else if (!retryable(rc, call->idempotent) || hvd_now_ns() >= call->deadline_ns) {
      break;
    } else {
      HVD_LOG_DEBUG("rendezvous %s: %s: %s; retrying", c->base_url, what,
                    c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc));
    }
    int64_t pause = jittered(c, backoff);
    int64_t left = hvd_remaining_ms(call->deadline_ns);
    hvd_sleep_ns((pause < left ? pause : left) * 1000000);
    backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    /* A pause that ran to the deadline leaves no time for another attempt:
     * one with a 1 ms budget would only turn the real cause (say, a refused
     * connection) into a timeout. */
    if (hvd_now_ns() >= call->deadline_ns)
      break;
  }
  curl_slist_free_all(headers);
  hvd_buf_fini(&url);
  if (st != HVD_OK || rc == CURLE_OK)
    return st;

  const char *detail = c->curl_error[0] ? c->curl_error : curl_easy_strerror(rc);
  double waited = (double)(hvd_now_ns() - started) / 1e9;
  if (c->cancelled)
    return hvd_error(HVD_ERR_ABORTED, "rendezvous %s: %s: cancelled", c->base_url, what);
  if (rc == CURLE_WRITE_ERROR && hvd_error_status() == HVD_ERR_TOO_LARGE)
    return hvd_error(HVD_ERR_TOO_LARGE, "rendezvous %s: %s: the answer exceeds %u bytes",
                     c->base_url, what, (unsigned)RESPONSE_MAX);
  if (rc == CURLE_OPERATION_TIMEDOUT)
    return hvd_error(HVD_ERR_TIMEOUT,
                     "rendezvous %s: %s: no answer within %.1f s (%s); check that the server is "
                     "alive and reachable, or raise HOROVOD_GLOO_TIMEOUT_SECONDS",
                     c->base_url, what, waited, detail);
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST)
    return hvd_error(HVD_ERR_NETWORK,
                     "rendezvous %s: %s: cannot reach the server after %u attempts over %.1f s "
                     "(%s); check that the rendezvous server is running and that "
                     "HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT point to it, or raise "
                     "HOROVOD_GLOO_TIMEOUT_SECONDS to wait longer",
                     c->base_url, what, attempts, waited, detail);
  return hvd_error(HVD_ERR_NETWORK, "rendezvous %s: %s: %s (curl error %d)", c->base_url, what,
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
    hint = c->auth_header != NULL ? " (the job token was rejected: check HVD_TOKEN)"
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
  return hvd_error(st, "rendezvous %s: %s: HTTP %ld%s%s%s", c->base_url, what, code,
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

static hvd_status check_names(const char *scope, const char *key, bool key_required) {
  if (scope == NULL || scope[0] == '\0' || (key_required && (key == NULL || key[0] == '\0')))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: empty scope or key");
  return HVD_OK;
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

hvd_status rdzv_client_set(struct rdzv_client *c, const char *scope, const char *key,
                           const void *value, size_t len) {
  struct call call = make_call("PUT", scope, key, deadline_for(c, -1));
  hvd_status st = check_names(scope, key, true);

  call.body = value != NULL ? value : "";
  call.body_len = len;
  return st == HVD_OK ? exchange(c, &call) : st;
}

hvd_status rdzv_client_get(struct rdzv_client *c, const char *scope, const char *key,
                           struct hvd_buf *value, uint64_t *version) {
  struct call call = make_call("GET", scope, key, deadline_for(c, -1));
  hvd_status st = check_names(scope, key, true);

  if (st == HVD_OK)
    st = exchange(c, &call);
  if (st != HVD_OK)
    return st;
  if (version != NULL)
    *version = response_version(c);
  return take_response(c, value);
}

/* Long-polls `call` (a GET with a wait query) until 200 or the deadline. */
static hvd_status long_poll(struct rdzv_client *c, struct call *call, const char *count_param,
                            int64_t timeout_ms) {
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
                     c->base_url, what, call->key ? "the key" : "enough keys",
                     (double)(timeout_ms < 0 ? c->timeout_ms : timeout_ms) / 1000.0);
  }
  return http_error(c, call, code);
}

hvd_status rdzv_client_wait(struct rdzv_client *c, const char *scope, const char *key,
                            int64_t timeout_ms, struct hvd_buf *value) {
  struct call call = make_call("GET", scope, key, deadline_for(c, timeout_ms));
  hvd_status st = check_names(scope, key, true);

  if (st == HVD_OK)
    st = long_poll(c, &call, "", timeout_ms);
  if (st == HVD_OK)
    st = take_response(c, value);
  return st;
}

hvd_status rdzv_client_wait_keys(struct rdzv_client *c, const char *scope,
                                 const char *const *keys, size_t n, int64_t timeout_ms) {
  int64_t deadline = deadline_for(c, timeout_ms);

  for (size_t i = 0; i < n; i++) {
    struct call call = make_call("GET", scope, keys[i], deadline);
    hvd_status st = check_names(scope, keys[i], true);
    if (st == HVD_OK)
      st = long_poll(c, &call, "", timeout_ms);
    if (st != HVD_OK)
      return st;
  }
  return HVD_OK;
}

hvd_status rdzv_client_get_scope(struct rdzv_client *c, const char *scope, size_t min_count,
                                 int64_t timeout_ms, struct rdzv_scope_view *out) {
  struct call call = make_call("GET", scope, NULL, deadline_for(c, timeout_ms));
  char count_param[40];
  hvd_status st = check_names(scope, NULL, false);
  char *body;
  size_t len;

  snprintf(count_param, sizeof(count_param), "count=%zu&", min_count);
  if (st == HVD_OK)
    st = long_poll(c, &call, count_param, timeout_ms);
  if (st != HVD_OK)
    return st;
  body = hvd_buf_detach(&c->response, &len);
  st = rdzv_scope_decode(body, len, out);
  if (st != HVD_OK)
    hvd_error_prefix("rendezvous %s: GET /%s", c->base_url, scope);
  return st;
}

hvd_status rdzv_client_add(struct rdzv_client *c, const char *scope, const char *key,
                           int64_t delta, int64_t *result) {
  struct call call = make_call("POST", scope, key, deadline_for(c, -1));
  int64_t value;
  hvd_status st = check_names(scope, key, true);

  call.idempotent = false; /* repeating an add that arrived would add twice */
  snprintf(call.query, sizeof(call.query), "add=%" PRId64, delta);
  if (st == HVD_OK)
    st = exchange(c, &call);
  if (st != HVD_OK)
    return st;
  if (!hvd_parse_int64(c->response.data ? c->response.data : "", c->response.len, &value))
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: POST /%s/%s: answer is not an integer",
                     c->base_url, scope, key);
  *result = value;
  return HVD_OK;
}

hvd_status rdzv_client_cas(struct rdzv_client *c, const char *scope, const char *key,
                           uint64_t expected_version, const void *value, size_t len,
                           uint64_t *new_version, struct hvd_buf *current,
                           uint64_t *current_version) {
  struct call call = make_call("PUT", scope, key, deadline_for(c, -1));
  long code = 0;
  hvd_status st = check_names(scope, key, true);

  /* A repeated CAS that had succeeded would report a false conflict. */
  call.idempotent = false;
  call.body = value != NULL ? value : "";
  call.body_len = len;
  if (expected_version == 0)
    snprintf(call.condition, sizeof(call.condition), "If-None-Match: *");
  else
    snprintf(call.condition, sizeof(call.condition), "If-Match: \"%" PRIu64 "\"",
             expected_version);
  if (st == HVD_OK)
    st = perform(c, &call, &code);
  if (st != HVD_OK)
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
                     c->base_url, scope, key,
                     version == 0 ? "the key does not exist" : "the key has another version");
  }
  return http_error(c, &call, code);
}

static hvd_status simple_delete(struct rdzv_client *c, const char *scope, const char *key) {
  struct call call = make_call("DELETE", scope, key, deadline_for(c, -1));
  hvd_status st = check_names(scope, key, key != NULL);

  return st == HVD_OK ? exchange(c, &call) : st;
}

hvd_status rdzv_client_delete(struct rdzv_client *c, const char *scope, const char *key) {
  if (key == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: delete needs a key");
  return simple_delete(c, scope, key);
}

hvd_status rdzv_client_delete_scope(struct rdzv_client *c, const char *scope) {
  return simple_delete(c, scope, NULL);
}

/* Copies a string member of the admission answer. */
static hvd_status admit_field(const cJSON *doc, const char *name, struct hvd_buf *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(doc, name);
  if (!cJSON_IsString(item))
    return hvd_error(HVD_ERR_PROTOCOL, "the admission answer has no string '%s'", name);
  hvd_buf_reset(out);
  return hvd_buf_append(out, item->valuestring, strlen(item->valuestring));
}

hvd_status rdzv_client_admit(struct rdzv_client *c, const char *credential, struct hvd_buf *job,
                             struct hvd_buf *token) {
  struct call call = make_call("POST", RDZV_ADMIT_SCOPE, NULL, deadline_for(c, -1));
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
                   c->base_url, RDZV_ADMIT_PATH);
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

hvd_status rdzv_client_health(struct rdzv_client *c, struct hvd_buf *json) {
  struct call call = make_call("GET", "_health", NULL, deadline_for(c, -1));
  hvd_status st = exchange(c, &call);

  return st == HVD_OK ? take_response(c, json) : st;
}
