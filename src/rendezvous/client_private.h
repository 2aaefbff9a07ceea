/*
 * Inside the rendezvous client: what its two backends share. client.c is
 * the front (checks, dispatch, the curl handle, cancelling, backoff);
 * client_http.c speaks to hvd's own store (server.c), client_etcd.c to an
 * etcd cluster's v3 JSON gateway. Both hold one keep-alive connection and
 * honour the same deadlines, retries and cancel fd.
 */
#ifndef HVD_RENDEZVOUS_CLIENT_PRIVATE_H
#define HVD_RENDEZVOUS_CLIENT_PRIVATE_H

#include <curl/curl.h>

#include "rendezvous.h"

enum {
  RDZV_RESPONSE_MAX = 256u << 20, /* a whole scope of a very large job still fits */
  RDZV_BACKOFF_FIRST_MS = 10,
  RDZV_BACKOFF_MAX_MS = 1000,
};

/* One backend's operations. Names are checked and timeouts turned into
 * deadlines before they are called; key NULL in del is the whole scope. */
struct rdzv_client_ops {
  bool plans_scopes; /* see rdzv_client_plans_scopes */
  void (*destroy)(struct rdzv_client *c);
  hvd_status (*set)(struct rdzv_client *c, const char *scope, const char *key, const void *value,
                    size_t len);
  hvd_status (*get)(struct rdzv_client *c, const char *scope, const char *key,
                    struct hvd_buf *value, uint64_t *version);
  hvd_status (*wait)(struct rdzv_client *c, const char *scope, const char *key, int64_t deadline_ns,
                     struct hvd_buf *value);
  hvd_status (*get_scope)(struct rdzv_client *c, const char *scope, size_t min_count,
                          int64_t deadline_ns, struct rdzv_scope_view *out);
  hvd_status (*wait_change)(struct rdzv_client *c, const char *scope, uint64_t after,
                            int64_t deadline_ns, uint64_t *version);
  hvd_status (*add)(struct rdzv_client *c, const char *scope, const char *key, int64_t delta,
                    int64_t *result);
  hvd_status (*cas)(struct rdzv_client *c, const char *scope, const char *key,
                    uint64_t expected_version, const void *value, size_t len, uint64_t *new_version,
                    struct hvd_buf *current, uint64_t *current_version);
  hvd_status (*del)(struct rdzv_client *c, const char *scope, const char *key);
  hvd_status (*admit)(struct rdzv_client *c, const char *credential, struct hvd_buf *job,
                      struct hvd_buf *token);
  hvd_status (*health)(struct rdzv_client *c, struct hvd_buf *json);
  /* etcd only (NULL for hvd's store): see rdzv_client_lead */
  hvd_status (*lead)(struct rdzv_client *c, const char *scope, const char *key, const char *value,
                     int ttl_s, int64_t deadline_ns);
  hvd_status (*lead_renew)(struct rdzv_client *c);
  void (*lead_resign)(struct rdzv_client *c);
};

struct rdzv_client {
  const struct rdzv_client_ops *ops;
  void *backend;   /* the backend's own state */
  char where[300]; /* the server, for messages: "http://host:port", "etcd://..." */
  CURL *curl;
  int64_t timeout_ms;
  uint64_t rng;
  struct hvd_buf response;
  char curl_error[CURL_ERROR_SIZE];
  int cancel_fd; /* readable: the call in progress gives up (-1: none) */
  CURLM *multi;  /* drives transfers while cancel_fd is set */
  bool cancelled;
};

/* A client with a curl handle and no backend yet (the caller sets ops and
 * backend), or NULL with the error set. */
struct rdzv_client *rdzv_client_alloc(int64_t timeout_ms);
/* curl's write callback appending to c->response (the data is c). */
size_t rdzv_client_collect(char *data, size_t size, size_t n, void *arg);
/* Runs the configured transfer on c->curl, watching the cancel fd;
 * CURLE_ABORTED_BY_CALLBACK with c->cancelled set when it fired. */
CURLcode rdzv_client_transfer(struct rdzv_client *c);
/* Sleeps a jittered *backoff_ms (doubled for next time, up to the maximum)
 * but not past the deadline; false when no time is left for another try. */
bool rdzv_client_pause(struct rdzv_client *c, int64_t *backoff_ms, int64_t deadline_ns);

hvd_status rdzv_client_create_etcd(const char *url, int64_t timeout_ms, struct rdzv_client **out);

#endif
