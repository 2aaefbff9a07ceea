/*
 * The rendezvous HTTP server: libmicrohttpd in front of the store.
 *
 * DESIGN. libmicrohttpd runs a small pool of epoll event loops (no thread per
 * connection), so thousands of clients can wait at once. A request is parsed
 * and authorised when its headers arrive, before any body is read, so bad
 * paths, missing tokens and oversized values are refused without buffering.
 * A long-poll that cannot be answered at once registers a waiter in the store
 * and suspends its connection; whoever satisfies the waiter (a PUT on another
 * loop, the store's deadline thread, shutdown) resumes it, and the loop calls
 * us again to send the answer. Values and scope bodies are sent straight from
 * the store's reference-counted blobs, without copies. The connection limits,
 * in all and per address, are the guard's (guard.c): a connection that shows
 * the token is trusted, and strangers over a limit make room for newcomers
 * instead of locking them out.
 * The protocol is docs/rendezvous-protocol.md.
 */
#include <errno.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "guard.h"
#include "listen.h"
#include "rendezvous.h"

enum {
  WAIT_MAX_MS = 3600 * 1000,
  COUNT_MAX = 1 << 24,
  FD_RESERVE = 64, /* descriptors kept for everything but connections */
  /* Connections libmicrohttpd may hold beyond ours: those the guard evicted
   * that their event loop has not closed yet (guard.c). */
  EVICT_SLACK = 256,
};

#define ALLOWED_METHODS "GET, HEAD, PUT, POST, DELETE"
#define HEALTH_PATH "/_health"

struct rdzv_server {
  struct MHD_Daemon *daemon;
  struct rdzv_guard *guard; /* deadlines of slow connections (guard.c) */
  struct rdzv_store *store;
  int listen_fd;  /* ours until the daemon starts, then the daemon's (it closes it) */
  atomic_bool stopping; /* new connections are refused */
  int port;
  char address[80];
  char *token;
  size_t token_len;
  char *blocking_scope; /* see rdzv_server_config */
  rdzv_admit_cb admit;
  void *admit_arg;
  char *job;
  struct rdzv_store_limits limits;
  int64_t started_ns;
  atomic_ulong requests;
  /* Requests that were parked in the store and have not completed yet: stop
   * waits for their answers to go out. Protected by parked_mu. */
  pthread_mutex_t parked_mu;
  pthread_cond_t parked_cond;
  unsigned parked;
};

enum { STOP_DRAIN_MS = 2000 }; /* how long stop waits for the 503s to be sent */

enum op {
  OP_HEALTH,
  OP_METRICS,
  OP_ADMIT,
  OP_GET,
  OP_GET_SCOPE,
  OP_PUT,
  OP_ADD,
  OP_DELETE,
  OP_DELETE_SCOPE,
};

/* One HTTP request; libmicrohttpd keeps it in the connection's context. */
struct request {
  struct rdzv_server *srv;
  struct MHD_Connection *conn;
  enum op op;
  const char *method;
  char *scope;
  size_t scope_len;
  char *key; /* NULL for whole-scope operations */
  size_t key_len;
  int64_t wait_ms; /* -1: no wait */
  int64_t count;
  int64_t delta;
  enum rdzv_set_condition cond;
  uint64_t expected_version;
  struct hvd_buf body;
  size_t reserved; /* body bytes charged to the store's limit */
  bool body_too_large;
  bool store_full; /* the body did not fit in the store's limit */
  bool answered; /* a response is queued */
  bool close;    /* the connection cannot be trusted with another request */
  uint64_t reply_bytes; /* the answer's length, for its deadline */
  bool has_length;         /* a Content-Length that parses, in declared_length */
  int64_t declared_length;
  bool parked;   /* suspended in the store's waiter list */
  bool counted;  /* counted in srv->parked until the request completes */
  struct rdzv_waiter waiter;
};

/* ---- responses --------------------------------------------------------------- */

static enum MHD_Result queue(struct request *req, unsigned code, struct MHD_Response *resp) {
  enum MHD_Result ret;

  if (resp == NULL)
    return MHD_NO; /* out of memory: drop the connection */
  if (req->close)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  rdzv_guard_enter(req->conn, RDZV_GUARD_REPLY, req->reply_bytes);
  if (code == MHD_HTTP_UNAUTHORIZED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"hvd\"");
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
                            req->op == OP_HEALTH || req->op == OP_METRICS ? "GET, HEAD"
                                                                          : ALLOWED_METHODS);
  ret = MHD_queue_response(req->conn, code, resp);
  MHD_destroy_response(resp);
  req->answered = true;
  HVD_LOG_TRACE("%s /%.*s%s%.*s -> %u", req->method, (int)req->scope_len,
                req->scope ? req->scope : "", req->key ? "/" : "", (int)req->key_len,
                req->key ? req->key : "", code);
  return ret;
}

/* A one-line text answer, used for every error except a plain 404. */
static enum MHD_Result HVD_PRINTF(3, 4) answer_text(struct request *req, unsigned code,
                                                    const char *fmt, ...) {
  char text[512];
  struct MHD_Response *resp;
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(text, sizeof(text) - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    n = 0;
  if ((size_t)n > sizeof(text) - 2)
    n = (int)sizeof(text) - 2;
  text[n++] = '\n';
  resp = MHD_create_response_from_buffer((size_t)n, text, MHD_RESPMEM_MUST_COPY);
  if (resp != NULL)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
  return queue(req, code, resp);
}

static enum MHD_Result answer_empty(struct request *req, unsigned code) {
  return queue(req, code, MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT));
}

static void blob_free_cb(void *cls) { rdzv_blob_unref(cls); }

static void add_etag(struct MHD_Response *resp, uint64_t version) {
  char etag[32];
  snprintf(etag, sizeof(etag), "\"%" PRIu64 "\"", version);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
}

/* Sends a stored value or scope body; takes the caller's reference. */
static enum MHD_Result answer_blob(struct request *req, unsigned code, struct rdzv_blob *blob,
                                   bool scope_body, size_t count) {
  struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback_cls(
      blob->len, blob->data, blob_free_cb, blob);
  char text[32];

  if (resp == NULL) {
    rdzv_blob_unref(blob);
    return MHD_NO;
  }
  if (scope_body) {
    snprintf(text, sizeof(text), "%zu", count);
    MHD_add_response_header(resp, "X-Hvd-Count", text);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-hvd-scope");
  } else {
    add_etag(resp, blob->version);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
  }
  req->reply_bytes = blob->len;
  return queue(req, code, resp);
}

/* Maps a store failure to its HTTP answer. */
static enum MHD_Result answer_store_error(struct request *req, hvd_status st) {
  const char *msg = hvd_last_error_message();
  switch (st) {
  case HVD_ERR_TOO_LARGE:
    /* Names and values were checked against their limits before the store
     * was called; what is left is a full store. */
    return answer_text(req, MHD_HTTP_INSUFFICIENT_STORAGE, "%s", msg);
  case HVD_ERR_INVALID_ARGUMENT:
    return answer_text(req, MHD_HTTP_BAD_REQUEST, "%s", msg);
  case HVD_ERR_CONFLICT:
    return answer_text(req, MHD_HTTP_CONFLICT, "%s", msg);
  default:
    HVD_LOG_ERROR("rendezvous server: %s %s: %s", req->method, req->scope, msg);
    return answer_text(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "%s", msg);
  }
}

/* ---- request parsing (headers have arrived, no body yet) --------------------- */

/* Query parameters, each allowed only where it means something. */
enum { PARAM_WAIT = 1, PARAM_COUNT = 2, PARAM_ADD = 4 };

static const struct param {
  const char *name;
  unsigned bit;
  int64_t min, max;
  const char *range;
} params[] = {
    {"wait", PARAM_WAIT, 0, WAIT_MAX_MS, "0..3600000 (milliseconds)"},
    {"count", PARAM_COUNT, 0, COUNT_MAX, "0..16777216"},
    {"add", PARAM_ADD, INT64_MIN, INT64_MAX, "the signed 64-bit range"},
};

struct query_check {
  struct request *req;
  unsigned allowed; /* PARAM_* bits */
  unsigned seen;
  char bad[160]; /* the first problem found */
};

static int64_t *param_slot(struct request *req, unsigned bit) {
  return bit == PARAM_WAIT ? &req->wait_ms : bit == PARAM_COUNT ? &req->count : &req->delta;
}

static enum MHD_Result query_cb(void *cls, enum MHD_ValueKind kind, const char *name,
                                const char *value) {
  struct query_check *qc = cls;
  const struct param *p = NULL;
  int64_t v;
  (void)kind;

  for (size_t i = 0; i < HVD_ARRAY_SIZE(params); i++) {
    if ((qc->allowed & params[i].bit) && strcmp(name, params[i].name) == 0)
      p = &params[i];
  }
  if (p == NULL) {
    size_t n = (size_t)snprintf(qc->bad, sizeof(qc->bad),
                                "unknown query parameter '%.40s' (allowed here:", name);
    for (size_t i = 0; i < HVD_ARRAY_SIZE(params) && n < sizeof(qc->bad); i++) {
      if (qc->allowed & params[i].bit)
        n += (size_t)snprintf(qc->bad + n, sizeof(qc->bad) - n, " %s", params[i].name);
    }
    if (n < sizeof(qc->bad))
      snprintf(qc->bad + n, sizeof(qc->bad) - n, "%s)", qc->allowed ? "" : " none");
    return MHD_NO;
  }
  if (value == NULL || !hvd_parse_int64(value, strlen(value), &v) || v < p->min || v > p->max) {
    snprintf(qc->bad, sizeof(qc->bad), "query parameter %s='%.40s' is not an integer in %s",
             p->name, value ? value : "", p->range);
    return MHD_NO;
  }
  *param_slot(qc->req, p->bit) = v;
  qc->seen |= p->bit;
  return MHD_YES;
}

static bool authorized(struct request *req) {
  const char *auth;
  static const char bearer[] = "Bearer ";

  if (req->srv->token == NULL)
    return true;
  auth = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (auth == NULL || strncmp(auth, bearer, sizeof(bearer) - 1) != 0)
    return false;
  auth += sizeof(bearer) - 1;
  return hvd_secure_equal(auth, strlen(auth), req->srv->token, req->srv->token_len);
}

/* GET /metrics: with the token (if the job has one), or with no
 * credentials at all from a loopback address. A wrong token is refused
 * wherever it comes from. */
static bool metrics_readable(struct request *req) {
  const union MHD_ConnectionInfo *info;
  const struct sockaddr *sa;

  if (authorized(req))
    return true;
  if (MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION) !=
      NULL)
    return false;
  info = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  sa = info != NULL ? info->client_addr : NULL;
  if (sa != NULL && sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const void *)sa;
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa != NULL && sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
  }
  return false;
}

static enum MHD_Result answer_metrics(struct request *req) {
  struct hvd_buf text;
  struct MHD_Response *resp;
  size_t len = 0;
  char *data;

  hvd_buf_init(&text, 0);
  if (rdzv_metrics_render(req->srv->store, &text) != HVD_OK) {
    hvd_buf_fini(&text);
    return answer_text(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "%s", hvd_last_error_message());
  }
  data = hvd_buf_detach(&text, &len);
  resp = MHD_create_response_from_buffer_with_free_callback(len, data, free);
  if (resp == NULL) {
    free(data);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "text/plain; version=0.0.4; charset=utf-8");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  req->reply_bytes = len;
  return queue(req, MHD_HTTP_OK, resp);
}

/* Reads If-Match / If-None-Match; false (with a reason) when malformed. */
static bool parse_condition(struct request *req, const char **reason) {
  const char *match =
      MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_MATCH);
  const char *none = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_IF_NONE_MATCH);
  int64_t version;
  size_t len;

  req->cond = RDZV_SET_ALWAYS;
  if (match != NULL && none != NULL) {
    *reason = "send If-Match or If-None-Match, not both";
    return false;
  }
  if (none != NULL) {
    if (strcmp(none, "*") != 0) {
      *reason = "If-None-Match supports only '*' (create if absent)";
      return false;
    }
    req->cond = RDZV_SET_IF_ABSENT;
  } else if (match != NULL) {
    len = strlen(match);
    if (len < 3 || match[0] != '"' || match[len - 1] != '"' ||
        !hvd_parse_int64(match + 1, len - 2, &version) || version <= 0) {
      *reason = "If-Match must be one ETag from this server, e.g. \"42\"";
      return false;
    }
    req->cond = RDZV_SET_IF_VERSION;
    req->expected_version = (uint64_t)version;
  }
  return true;
}

/* Splits "/scope" or "/scope/key" into copies. Returns 0, or the HTTP code
 * of the problem with a reason in `why`. */
static unsigned parse_path(struct request *req, const char *url, char *why, size_t why_size) {
  const char *scope = url + 1;
  const char *slash = strchr(scope, '/');
  size_t max = req->srv->limits.max_name_bytes;

  req->scope_len = slash != NULL ? (size_t)(slash - scope) : strlen(scope);
  if (slash != NULL)
    req->key_len = strlen(slash + 1);
  if (url[0] != '/' || req->scope_len == 0 ||
      (slash != NULL && (req->key_len == 0 || strchr(slash + 1, '/') != NULL))) {
    snprintf(why, why_size,
             "malformed path '%.100s': use /<scope>/<key> or /<scope> (scope and key are not "
             "empty and hold no '/')",
             url);
    return MHD_HTTP_BAD_REQUEST;
  }
  for (const char *c = scope; *c != '\0'; c++) {
    if ((unsigned char)*c < 0x20 || *c == 0x7f) {
      snprintf(why, why_size,
               "scope and key names hold no control characters, percent-encoded or not (one "
               "at offset %zu of '/%.*s')",
               (size_t)(c - scope), (int)(c - scope), scope);
      return MHD_HTTP_BAD_REQUEST;
    }
  }
  if (scope[0] == '_') {
    snprintf(why, why_size, "scope names starting with '_' are reserved for the server");
    return MHD_HTTP_BAD_REQUEST;
  }
  if (req->scope_len > max || req->key_len > max) {
    bool scope_long = req->scope_len > max;
    snprintf(why, why_size, "%s of %zu bytes exceeds the limit of %zu bytes",
             scope_long ? "scope" : "key", scope_long ? req->scope_len : req->key_len, max);
    return MHD_HTTP_URI_TOO_LONG;
  }
  req->scope = hvd_strndup(scope, req->scope_len);
  if (slash != NULL)
    req->key = hvd_strndup(slash + 1, req->key_len);
  if (req->scope == NULL || (slash != NULL && req->key == NULL)) {
    snprintf(why, why_size, "out of memory");
    return MHD_HTTP_SERVICE_UNAVAILABLE;
  }
  return 0;
}

/* libmicrohttpd's decoding, except that a decoded control character (a NUL
 * above all, which would cut the name short) becomes DEL, which every check
 * of a path or parameter then refuses. */
static size_t unescape_cb(void *cls, struct MHD_Connection *conn, char *text) {
  size_t len = MHD_http_unescape(text);
  (void)cls;
  (void)conn;
  for (size_t i = 0; i < len; i++) {
    if ((unsigned char)text[i] < 0x20)
      text[i] = 0x7f;
  }
  return len;
}

/* Header-level framing problems (RFC 9112 6.3): more than one Content-Length,
 * or one beside Transfer-Encoding, would let the body be read two ways. */
struct framing {
  unsigned content_lengths;
  bool transfer_encoding;
};

static enum MHD_Result framing_cb(void *cls, enum MHD_ValueKind kind, const char *name,
                                  const char *value) {
  struct framing *f = cls;
  (void)kind;
  (void)value;
  if (strcasecmp(name, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0)
    f->content_lengths++;
  else if (strcasecmp(name, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
    f->transfer_encoding = true;
  return MHD_YES;
}

static const char *framing_problem(struct MHD_Connection *conn) {
  struct framing f = {0};
  MHD_get_connection_values(conn, MHD_HEADER_KIND, framing_cb, &f);
  if (f.content_lengths > 1)
    return "more than one Content-Length header";
  if (f.content_lengths > 0 && f.transfer_encoding)
    return "both Content-Length and Transfer-Encoding";
  return NULL;
}

static enum op pick_op(const char *method, bool has_key, bool *known) {
  *known = true;
  if (strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0)
    return has_key ? OP_GET : OP_GET_SCOPE;
  if (strcmp(method, MHD_HTTP_METHOD_PUT) == 0)
    return OP_PUT;
  if (strcmp(method, MHD_HTTP_METHOD_POST) == 0)
    return OP_ADD;
  if (strcmp(method, MHD_HTTP_METHOD_DELETE) == 0)
    return has_key ? OP_DELETE : OP_DELETE_SCOPE;
  *known = false;
  return OP_GET;
}

static unsigned allowed_params(enum op op) {
  switch (op) {
  case OP_GET: return PARAM_WAIT;
  case OP_GET_SCOPE: return PARAM_COUNT | PARAM_WAIT;
  case OP_ADD: return PARAM_ADD;
  default: return 0;
  }
}

/* Everything that can be decided from the request line and headers. */
static enum MHD_Result begin(struct request *req, const char *url) {
  struct query_check qc = {.req = req};
  const char *reason = NULL;
  char why[256];
  unsigned code;
  bool known;

  req->wait_ms = -1;
  if ((reason = framing_problem(req->conn)) != NULL) {
    req->close = true;
    return answer_text(req, MHD_HTTP_BAD_REQUEST, "%s: the body's length is ambiguous", reason);
  }
  if (strcmp(url, HEALTH_PATH) == 0) {
    req->op = OP_HEALTH;
    if (strcmp(req->method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(req->method, MHD_HTTP_METHOD_HEAD) != 0)
      return answer_text(req, MHD_HTTP_METHOD_NOT_ALLOWED, "%s supports GET and HEAD only",
                         HEALTH_PATH);
    return MHD_YES;
  }
  if (strcmp(url, RDZV_METRICS_PATH) == 0) {
    req->op = OP_METRICS;
    if (strcmp(req->method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(req->method, MHD_HTTP_METHOD_HEAD) != 0)
      return answer_text(req, MHD_HTTP_METHOD_NOT_ALLOWED, "%s supports GET and HEAD only",
                         RDZV_METRICS_PATH);
    if (!metrics_readable(req))
      return answer_text(req, MHD_HTTP_UNAUTHORIZED,
                         "%s is readable from this host, or with the job token elsewhere "
                         "(docs/observability.md)",
                         RDZV_METRICS_PATH);
    return MHD_YES;
  }
  if (strcmp(url, RDZV_ADMIT_PATH) == 0) {
    req->op = OP_ADMIT;
    if (strcmp(req->method, MHD_HTTP_METHOD_POST) != 0)
      return answer_text(req, MHD_HTTP_METHOD_NOT_ALLOWED, "%s supports POST only",
                         RDZV_ADMIT_PATH);
    if (req->srv->admit == NULL || req->srv->token == NULL)
      return answer_text(req, MHD_HTTP_NOT_FOUND,
                         "this rendezvous server admits ranks by the job token only");
    return MHD_YES;
  }
  req->op = pick_op(req->method, strchr(url + (url[0] == '/'), '/') != NULL, &known);
  if (!known)
    return answer_text(req, MHD_HTTP_METHOD_NOT_ALLOWED, "method %.20s is not supported (use %s)",
                       req->method, ALLOWED_METHODS);
  if (!authorized(req))
    return answer_text(req, MHD_HTTP_UNAUTHORIZED,
                       "this rendezvous server needs the job token: send 'Authorization: Bearer "
                       "<token>' (hvd clients read it from HVD_TOKEN)");
  if (!rdzv_guard_trust(req->conn))
    return MHD_NO; /* closed meanwhile to make room, its client told to retry */
  code = parse_path(req, url, why, sizeof(why));
  if (code != 0)
    return answer_text(req, code, "%s", why);
  if ((req->op == OP_PUT || req->op == OP_ADD) && req->key == NULL)
    return answer_text(req, MHD_HTTP_BAD_REQUEST, "%s needs a key: /<scope>/<key>", req->method);

  qc.allowed = allowed_params(req->op);
  MHD_get_connection_values(req->conn, MHD_GET_ARGUMENT_KIND, query_cb, &qc);
  if (qc.bad[0] != '\0')
    return answer_text(req, MHD_HTTP_BAD_REQUEST, "%s", qc.bad);
  if (req->op == OP_ADD && !(qc.seen & PARAM_ADD))
    return answer_text(req, MHD_HTTP_BAD_REQUEST,
                       "POST is the atomic add: POST /<scope>/<key>?add=<delta>");

  if (req->op == OP_PUT) {
    if (!parse_condition(req, &reason))
      return answer_text(req, MHD_HTTP_BAD_REQUEST, "%s", reason);
    if (req->has_length && (uint64_t)req->declared_length > req->srv->limits.max_value_bytes)
      return answer_text(req, MHD_HTTP_CONTENT_TOO_LARGE,
                         "value of %" PRId64 " bytes exceeds the limit of %zu bytes",
                         req->declared_length, req->srv->limits.max_value_bytes);
  }
  return MHD_YES;
}

/* ---- execution (the whole body has arrived) ---------------------------------- */

static void park_cb(struct rdzv_waiter *w, void *arg) {
  struct request *req = w->owner;
  (void)arg;
  req->parked = true;
  req->counted = true;
  pthread_mutex_lock(&req->srv->parked_mu);
  req->srv->parked++;
  pthread_mutex_unlock(&req->srv->parked_mu);
  MHD_suspend_connection(req->conn);
}

static void fire_cb(struct rdzv_waiter *w, void *arg) {
  struct request *req = w->owner;
  (void)arg;
  MHD_resume_connection(req->conn);
}

/* The guard saw a parked request's client leave (under the guard's lock,
 * which keeps req alive: it is freed only after its connection leaves the
 * parked phase). */
static bool waiter_gone(void *arg, void *parked) {
  struct rdzv_server *srv = arg;
  struct request *req = parked;
  return rdzv_store_abandon_wait(srv->store, &req->waiter);
}

static enum MHD_Result answer_wait(struct request *req) {
  struct rdzv_waiter *w = &req->waiter;
  struct rdzv_blob *value = w->value;
  int64_t wait_ms = req->wait_ms < 0 ? 0 : req->wait_ms;

  req->parked = false;
  w->value = NULL;
  switch (w->result) {
  case RDZV_WAIT_READY:
    return answer_blob(req, MHD_HTTP_OK, value, w->key == NULL, w->count);
  case RDZV_WAIT_TIMEOUT:
    if (w->key != NULL)
      return answer_text(req, MHD_HTTP_REQUEST_TIMEOUT,
                         "timed out after %" PRId64 " ms waiting for key '%s' in scope '%s'",
                         wait_ms, req->key, req->scope);
    return answer_text(req, MHD_HTTP_REQUEST_TIMEOUT,
                       "timed out after %" PRId64 " ms waiting for scope '%s' to hold %" PRId64
                       " keys",
                       wait_ms, req->scope, req->count);
  case RDZV_WAIT_ABANDONED:
    rdzv_blob_unref(value); /* none: abandoned waiters get no value */
    HVD_LOG_DEBUG("rendezvous server: the client of a long-poll on scope '%s' left", req->scope);
    return MHD_NO; /* nobody to answer: close the connection */
  case RDZV_WAIT_CANCELLED:
  default:
    rdzv_blob_unref(value);
    return answer_text(req, MHD_HTTP_SERVICE_UNAVAILABLE, "the rendezvous server is shutting down");
  }
}

static enum MHD_Result start_wait(struct request *req) {
  struct rdzv_waiter *w = &req->waiter;
  hvd_status st;

  memset(w, 0, sizeof(*w));
  w->scope = req->scope;
  w->scope_len = req->scope_len;
  w->key = req->key;
  w->key_len = req->key_len;
  w->min_count = (size_t)req->count;
  w->deadline_ns = hvd_deadline_after_ms(req->wait_ms < 0 ? 0 : req->wait_ms);
  w->owner = req;
  /* The guard watches for the client leaving from now on; it enters the
   * parked phase here, not in park_cb, because park_cb runs under the store
   * lock and the guard calls into the store under its own. */
  rdzv_guard_park(req->conn, req);
  st = rdzv_store_wait(req->srv->store, w, park_cb, NULL);
  if (st != HVD_OK)
    return answer_store_error(req, st);
  /* Once parked, the result belongs to whoever fires the waiter; only
   * req->parked (set by park_cb on this thread) may be read here. */
  if (req->parked)
    return MHD_YES;
  return answer_wait(req);
}

static enum MHD_Result answer_health(struct request *req) {
  struct rdzv_server *srv = req->srv;
  struct rdzv_store_stats stats;
  struct rdzv_guard_counts counts;
  cJSON *doc = cJSON_CreateObject();
  struct MHD_Response *resp;
  char *text;

  rdzv_store_get_stats(srv->store, &stats);
  rdzv_guard_get_counts(srv->guard, &counts);
  if (doc == NULL)
    return MHD_NO;
  cJSON_AddStringToObject(doc, "status", "ok");
  cJSON_AddStringToObject(doc, "version", hvd_version());
  cJSON_AddNumberToObject(doc, "uptime_seconds",
                          (double)(hvd_now_ns() - srv->started_ns) / 1e9);
  /* The guard's count: libmicrohttpd's is per event loop. */
  cJSON_AddNumberToObject(doc, "connections", counts.connections);
  cJSON_AddNumberToObject(doc, "requests", (double)atomic_load(&srv->requests));
  cJSON_AddNumberToObject(doc, "scopes", (double)stats.scopes);
  cJSON_AddNumberToObject(doc, "planned_scopes", (double)stats.planned_scopes);
  cJSON_AddNumberToObject(doc, "keys", (double)stats.keys);
  cJSON_AddNumberToObject(doc, "bytes", (double)stats.bytes);
  cJSON_AddNumberToObject(doc, "held_bytes", (double)stats.held_bytes);
  cJSON_AddNumberToObject(doc, "max_bytes", (double)srv->limits.max_total_bytes);
  cJSON_AddNumberToObject(doc, "waiters", (double)stats.waiters);
  cJSON_AddBoolToObject(doc, "token_required", srv->token != NULL);
  cJSON_AddNumberToObject(doc, "slow_connections_closed", (double)counts.closed);
  cJSON_AddNumberToObject(doc, "connections_evicted", (double)counts.evicted);
  text = cJSON_PrintUnformatted(doc);
  cJSON_Delete(doc);
  if (text == NULL)
    return MHD_NO;
  resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_COPY);
  cJSON_free(text);
  if (resp != NULL)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  return queue(req, MHD_HTTP_OK, resp);
}

/* POST /_admit: the callback weighs the evidence; the answer is the job's
 * name and token, or why not. */
static enum MHD_Result answer_admit(struct request *req) {
  struct rdzv_server *srv = req->srv;
  const union MHD_ConnectionInfo *peer =
      MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const union MHD_ConnectionInfo *fd =
      MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct sockaddr_storage local;
  socklen_t local_len = sizeof(local);
  struct rdzv_admit_request ar = {0};
  struct MHD_Response *resp;
  char why[256] = "", *text;
  cJSON *doc;

  if (peer == NULL || fd == NULL || getsockname(fd->connect_fd, (struct sockaddr *)&local,
                                                &local_len) != 0)
    return answer_text(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot read the connection's "
                                                            "addresses");
  ar.credential = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, RDZV_CREDENTIAL_HEADER);
  ar.peer = peer->client_addr;
  ar.local = (const struct sockaddr *)&local;
  if (!srv->admit(&ar, srv->admit_arg, why, sizeof(why))) {
    HVD_LOG_WARN("rendezvous server: admission refused: %s", why);
    return answer_text(req, MHD_HTTP_FORBIDDEN, "admission refused: %s", why);
  }
  if (!rdzv_guard_trust(req->conn))
    return MHD_NO; /* closed meanwhile to make room: nobody to answer */
  if ((doc = cJSON_CreateObject()) == NULL)
    return MHD_NO;
  cJSON_AddStringToObject(doc, "job", srv->job != NULL ? srv->job : "");
  cJSON_AddStringToObject(doc, "token", srv->token);
  text = cJSON_PrintUnformatted(doc);
  cJSON_Delete(doc);
  if (text == NULL)
    return MHD_NO;
  resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_COPY);
  explicit_bzero(text, strlen(text));
  cJSON_free(text);
  if (resp != NULL) {
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  }
  return queue(req, MHD_HTTP_OK, resp);
}

static enum MHD_Result execute(struct request *req) {
  struct rdzv_store *store = req->srv->store;
  struct rdzv_blob *blob = NULL;
  uint64_t version = 0;
  int64_t sum = 0;
  size_t count = 0;
  hvd_status st;

  switch (req->op) {
  case OP_HEALTH:
    return answer_health(req);
  case OP_METRICS:
    return answer_metrics(req);
  case OP_ADMIT:
    return answer_admit(req);
  case OP_GET:
    if (req->wait_ms < 0 && req->srv->blocking_scope != NULL &&
        req->scope_len == strlen(req->srv->blocking_scope) &&
        memcmp(req->scope, req->srv->blocking_scope, req->scope_len) == 0)
      req->wait_ms = RDZV_BLOCKING_GET_MS;
    if (req->wait_ms >= 0)
      return start_wait(req);
    st = rdzv_store_get(store, req->scope, req->scope_len, req->key, req->key_len, &blob);
    if (st == HVD_ERR_NOT_FOUND)
      return answer_empty(req, MHD_HTTP_NOT_FOUND); /* empty, as Horovod's clients expect */
    if (st != HVD_OK)
      return answer_store_error(req, st);
    return answer_blob(req, MHD_HTTP_OK, blob, false, 0);
  case OP_GET_SCOPE:
    if (req->wait_ms >= 0 || req->count > 0)
      return start_wait(req);
    st = rdzv_store_snapshot(store, req->scope, req->scope_len, &blob, &count);
    if (st != HVD_OK)
      return answer_store_error(req, st);
    return answer_blob(req, MHD_HTTP_OK, blob, true, count);
  case OP_PUT:
    if (req->body_too_large)
      return answer_text(req, MHD_HTTP_CONTENT_TOO_LARGE,
                         "value exceeds the limit of %zu bytes", req->srv->limits.max_value_bytes);
    if (req->store_full)
      return answer_text(req, MHD_HTTP_INSUFFICIENT_STORAGE,
                         "the store is full: the request body does not fit in its limit of %zu "
                         "bytes",
                         req->srv->limits.max_total_bytes);
    /* The store charges the value itself from here on. */
    rdzv_store_unreserve(store, req->reserved);
    req->reserved = 0;
    st = rdzv_store_set(store, req->scope, req->scope_len, req->key, req->key_len, req->body.data,
                        req->body.len, req->cond, req->expected_version, &version, &blob);
    if (st == HVD_ERR_CONFLICT) {
      if (blob == NULL)
        return answer_text(req, MHD_HTTP_PRECONDITION_FAILED, "%s", hvd_last_error_message());
      return answer_blob(req, MHD_HTTP_PRECONDITION_FAILED, blob, false, 0);
    }
    if (st != HVD_OK)
      return answer_store_error(req, st);
    {
      struct MHD_Response *resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
      if (resp != NULL)
        add_etag(resp, version);
      return queue(req, MHD_HTTP_OK, resp);
    }
  case OP_ADD:
    st = rdzv_store_add(store, req->scope, req->scope_len, req->key, req->key_len, req->delta,
                        &sum, &version);
    if (st != HVD_OK)
      return answer_store_error(req, st);
    {
      char text[24];
      int n = snprintf(text, sizeof(text), "%" PRId64, sum);
      struct MHD_Response *resp =
          MHD_create_response_from_buffer((size_t)n, text, MHD_RESPMEM_MUST_COPY);
      if (resp != NULL)
        add_etag(resp, version);
      return queue(req, MHD_HTTP_OK, resp);
    }
  case OP_DELETE:
    st = rdzv_store_delete(store, req->scope, req->scope_len, req->key, req->key_len);
    return st == HVD_OK ? answer_empty(req, MHD_HTTP_OK) : answer_store_error(req, st);
  case OP_DELETE_SCOPE:
    st = rdzv_store_delete_scope(store, req->scope, req->scope_len);
    return st == HVD_OK ? answer_empty(req, MHD_HTTP_OK) : answer_store_error(req, st);
  }
  return answer_text(req, MHD_HTTP_INTERNAL_SERVER_ERROR, "unknown operation");
}

/* ---- libmicrohttpd callbacks ------------------------------------------------- */

/* Once stop has begun, new connections are closed at once. (Not
 * MHD_quiesce_daemon: with an epoll daemon on its own thread it races the
 * daemon's own removal of the listen socket from the epoll set and
 * libmicrohttpd aborts the process, "Failed to remove listen FD from epoll
 * set".) */
static enum MHD_Result accept_cb(void *cls, const struct sockaddr *addr, socklen_t addrlen) {
  const struct rdzv_server *srv = cls;
  (void)addr;
  (void)addrlen;
  return atomic_load(&srv->stopping) ? MHD_NO : MHD_YES;
}

static enum MHD_Result access_cb(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_data_size,
                                 void **con_cls) {
  struct request *req = *con_cls;
  (void)version;

  if (req == NULL) {
    /* First call: request line and headers only. */
    struct rdzv_server *srv = cls;
    const char *length = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
    req = calloc(1, sizeof(*req));
    if (req == NULL)
      return MHD_NO;
    req->has_length = length != NULL &&
                      hvd_parse_int64(length, strlen(length), &req->declared_length);
    rdzv_guard_enter(conn, RDZV_GUARD_BODY,
                     req->has_length && req->declared_length > 0 ? (uint64_t)req->declared_length
                                                                 : 0);
    *con_cls = req;
    req->srv = srv;
    req->conn = conn;
    req->method = method;
    hvd_buf_init(&req->body, srv->limits.max_value_bytes);
    atomic_fetch_add_explicit(&srv->requests, 1, memory_order_relaxed);
    return begin(req, url);
  }
  if (*upload_data_size > 0) {
    /* Only PUT keeps its body, charged to the store's limit while it
     * arrives; an oversized one, or one that does not fit, is drained, then
     * refused. */
    if (req->op == OP_PUT && !req->answered && !req->body_too_large && !req->store_full) {
      if (rdzv_store_reserve(req->srv->store, *upload_data_size) != HVD_OK) {
        req->store_full = true;
      } else {
        req->reserved += *upload_data_size;
        if (hvd_buf_append(&req->body, upload_data, *upload_data_size) != HVD_OK)
          req->body_too_large = true;
      }
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (req->answered)
    return MHD_YES;
  if (req->parked)
    return answer_wait(req); /* resumed by the store */
  return execute(req);
}

static void completed_cb(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  struct request *req = *con_cls;
  (void)cls;
  (void)toe;

  rdzv_guard_enter(conn, RDZV_GUARD_HEADERS, 0); /* the next request on this connection */
  if (req == NULL)
    return;
  *con_cls = NULL;
  if (req->parked && req->waiter.result == RDZV_WAIT_PENDING) {
    /* The store still points at this request; leaking it is the safe choice. */
    HVD_LOG_ERROR("rendezvous server: a connection closed while its long-poll was pending");
    return;
  }
  if (req->counted) {
    pthread_mutex_lock(&req->srv->parked_mu);
    if (--req->srv->parked == 0)
      pthread_cond_broadcast(&req->srv->parked_cond);
    pthread_mutex_unlock(&req->srv->parked_mu);
  }
  rdzv_blob_unref(req->waiter.value);
  rdzv_store_unreserve(req->srv->store, req->reserved);
  hvd_buf_fini(&req->body);
  free(req->scope);
  free(req->key);
  free(req);
}

static void mhd_log_cb(void *cls, const char *fmt, va_list ap) {
  char text[512];
  size_t len;
  (void)cls;
  vsnprintf(text, sizeof(text), fmt, ap);
  len = strlen(text);
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r'))
    text[--len] = '\0';
  HVD_LOG_DEBUG("libmicrohttpd: %s", text);
}

/* ---- life cycle ---------------------------------------------------------------- */

void rdzv_server_config_default(struct rdzv_server_config *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  rdzv_store_limits_default(&cfg->limits);
  cfg->idle_timeout_s = 60;
  cfg->header_timeout_ms = 5000;
  cfg->max_header_bytes = 32 * 1024;
}

static void destroy(struct rdzv_server *srv) {
  pthread_cond_destroy(&srv->parked_cond);
  pthread_mutex_destroy(&srv->parked_mu);
  free(srv->token);
  free(srv->blocking_scope);
  free(srv->job);
  free(srv);
}

/* Connections the file-descriptor limit allows, after raising it to the hard limit. */
static unsigned connection_capacity(void) {
  uint64_t limit = hvd_raise_fd_limit();
  if (limit == 0)
    return 1024;
  if (limit > 1u << 20)
    return 1u << 20;
  return limit > 2 * FD_RESERVE ? (unsigned)(limit - FD_RESERVE) : FD_RESERVE;
}

static unsigned default_threads(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 1)
    return 1;
  return cpus > 4 ? 4 : (unsigned)cpus;
}

hvd_status rdzv_server_start(const struct rdzv_server_config *cfg, struct rdzv_server **out) {
  struct rdzv_server *srv = calloc(1, sizeof(*srv));
  unsigned capacity = connection_capacity();
  unsigned max_conn = cfg->max_connections ? cfg->max_connections : capacity;
  unsigned threads = cfg->threads ? cfg->threads : default_threads();
  unsigned per_address = cfg->max_connections_per_address;
  unsigned slack = capacity / 8 < EVICT_SLACK ? capacity / 8 : EVICT_SLACK;
  hvd_status st;

  if (srv == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the rendezvous server");
  srv->listen_fd = -1;
  srv->limits = cfg->limits;
  pthread_mutex_init(&srv->parked_mu, NULL);
  hvd_cond_init(&srv->parked_cond);
  srv->started_ns = hvd_now_ns();
  if (cfg->token != NULL && cfg->token[0] != '\0') {
    srv->token = strdup(cfg->token);
    srv->token_len = strlen(cfg->token);
    if (srv->token == NULL) {
      st = hvd_error(HVD_ERR_NO_MEMORY, "cannot copy the token");
      goto fail;
    }
  }
  if (cfg->blocking_scope != NULL && (srv->blocking_scope = strdup(cfg->blocking_scope)) == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot copy the blocking scope's name");
    goto fail;
  }
  srv->admit = cfg->admit;
  srv->admit_arg = cfg->admit_arg;
  if (cfg->job != NULL && (srv->job = strdup(cfg->job)) == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot copy the job's name");
    goto fail;
  }
  if (max_conn > capacity - slack) {
    if (cfg->max_connections != 0)
      HVD_LOG_WARN("rendezvous server: %u connections requested but the open-file limit allows "
                   "%u", max_conn, capacity - slack);
    max_conn = capacity - slack;
  }
  if (per_address == 0)
    per_address = max_conn / 4 > RDZV_MIN_PER_ADDRESS ? max_conn / 4 : RDZV_MIN_PER_ADDRESS;
  if (per_address > max_conn)
    per_address = max_conn;
  if (max_conn < threads)
    threads = 1;
  st = rdzv_store_create(&cfg->limits, fire_cb, srv, &srv->store);
  if (st == HVD_OK)
    st = rdzv_guard_start(cfg->header_timeout_ms > 0 ? cfg->header_timeout_ms : 5000, max_conn,
                          per_address, waiter_gone, srv, &srv->guard);
  if (st != HVD_OK)
    goto fail;
  st = rdzv_listen(cfg->bind_address, cfg->port, &srv->listen_fd, srv->address,
                   sizeof(srv->address), &srv->port);
  if (st != HVD_OK) {
    hvd_error_prefix("rendezvous server");
    goto fail;
  }
  srv->daemon = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, accept_cb,
      srv, access_cb, srv, MHD_OPTION_EXTERNAL_LOGGER, mhd_log_cb, srv,
      MHD_OPTION_LISTEN_SOCKET, srv->listen_fd,
      MHD_OPTION_THREAD_POOL_SIZE, threads > 1 ? threads : 0,
      MHD_OPTION_CONNECTION_LIMIT, max_conn + slack, /* ours are the guard's */
      MHD_OPTION_CONNECTION_TIMEOUT, cfg->idle_timeout_s,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, cfg->max_header_bytes,
      MHD_OPTION_NOTIFY_COMPLETED, completed_cb, srv,
      MHD_OPTION_UNESCAPE_CALLBACK, unescape_cb, NULL,
      MHD_OPTION_NOTIFY_CONNECTION, rdzv_guard_notify, srv->guard, MHD_OPTION_END);
  if (srv->daemon == NULL) {
    st = hvd_error(HVD_ERR_IO,
                   "rendezvous server: libmicrohttpd could not start on %s (see debug log)",
                   srv->address);
    goto fail;
  }
  srv->listen_fd = -1; /* the daemon's now */
  HVD_LOG_INFO("rendezvous server listening on %s (%u event loops, up to %u connections, %u "
               "from one address%s)",
               srv->address, threads, max_conn, per_address, srv->token ? ", token required" : "");
  *out = srv;
  return HVD_OK;

fail:
  if (srv->listen_fd >= 0)
    close(srv->listen_fd);
  rdzv_guard_stop(srv->guard);
  rdzv_store_destroy(srv->store);
  destroy(srv);
  return st;
}

void rdzv_server_stop(struct rdzv_server *srv) {
  int64_t deadline = hvd_deadline_after_ms(STOP_DRAIN_MS);

  if (srv == NULL)
    return;
  /* Stop accepting, answer the waiting clients (503), give the event loops a
   * moment to send those answers, then close every connection and the
   * listening socket.
   * rdzv_store_close returns only once no thread can resume a connection. */
  atomic_store(&srv->stopping, true);
  (void)rdzv_store_close(srv->store); /* a timeout is logged by rdzv_store_destroy */
  pthread_mutex_lock(&srv->parked_mu);
  while (srv->parked > 0 &&
         hvd_cond_wait_until(&srv->parked_cond, &srv->parked_mu, deadline) == 0) {
  }
  pthread_mutex_unlock(&srv->parked_mu);
  MHD_stop_daemon(srv->daemon);
  rdzv_guard_stop(srv->guard);
  rdzv_store_destroy(srv->store);
  destroy(srv);
}

int rdzv_server_port(const struct rdzv_server *srv) { return srv->port; }
const char *rdzv_server_address(const struct rdzv_server *srv) { return srv->address; }
struct rdzv_store *rdzv_server_store(struct rdzv_server *srv) { return srv->store; }
