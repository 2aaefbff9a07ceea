/*
 * The rendezvous client's front: argument checks, the choice of backend
 * (hvd's HTTP store or etcd), and what both backends share.
 *
 * DESIGN. One curl easy handle per client keeps one keep-alive connection.
 * Every call carries an absolute deadline. A request the server never saw
 * (connection refused, name not resolvable yet: the server or its
 * Kubernetes Service may still be starting) is retried with jittered
 * exponential backoff until that deadline; a request that may have reached
 * the server is retried only when repeating it is harmless. Waiting is done
 * by the server (a long-poll, or an etcd watch), so a client never polls in
 * a loop. Every failure leaves a message that names the server, the
 * request, the error, and what to check.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_private.h"

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result;

static void curl_init_once(void) { curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

struct rdzv_client *rdzv_client_alloc(int64_t timeout_ms) {
  struct rdzv_client *c;

  pthread_once(&curl_once, curl_init_once);
  if (curl_init_result != CURLE_OK) {
    hvd_error(HVD_ERR_INTERNAL, "rendezvous client: curl_global_init: %s",
              curl_easy_strerror(curl_init_result));
    return NULL;
  }
  if ((c = calloc(1, sizeof(*c))) == NULL) {
    hvd_error(HVD_ERR_NO_MEMORY, "rendezvous client: out of memory");
    return NULL;
  }
  c->timeout_ms = timeout_ms < 0 ? RDZV_DEFAULT_TIMEOUT_MS : timeout_ms;
  c->cancel_fd = -1;
  c->rng = (uint64_t)hvd_now_ns() ^ (uint64_t)(uintptr_t)c;
  hvd_buf_init(&c->response, RDZV_RESPONSE_MAX);
  if ((c->curl = curl_easy_init()) == NULL) {
    free(c);
    hvd_error(HVD_ERR_NO_MEMORY, "rendezvous client: cannot create a curl handle");
    return NULL;
  }
  return c;
}

/* "etcd://..." (or "etcds://...") selects etcd; anything else must be left
 * to HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT. */
static bool is_etcd_url(const char *url) {
  return strncmp(url, "etcd://", 7) == 0 || strncmp(url, "etcds://", 8) == 0;
}

hvd_status rdzv_client_create_url(const char *url, int64_t timeout_ms, struct rdzv_client **out) {
  if (url != NULL && is_etcd_url(url))
    return rdzv_client_create_etcd(url, timeout_ms, out);
  return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_RENDEZVOUS='%s': expected etcd://HOST:PORT[,HOST:PORT...][/PREFIX] or "
                   "etcds://... (hvd's own store is named by HOROVOD_GLOO_RENDEZVOUS_ADDR and "
                   "_PORT)",
                   url != NULL ? url : "");
}

hvd_status rdzv_client_create_from_env(struct rdzv_client **out) {
  const char *addr = NULL, *token = NULL, *url = NULL;
  int64_t port, timeout_s;
  hvd_status st = hvd_setting_text(HVD_SET_RENDEZVOUS_ADDR, &addr);

  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_TOKEN, &token);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_RENDEZVOUS, &url);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_TIMEOUT, &timeout_s);
  if (st != HVD_OK)
    return st;
  if (url != NULL)
    return rdzv_client_create_url(url, timeout_s * 1000, out);
  if (addr == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_GLOO_RENDEZVOUS_ADDR is not set: start ranks with hvdrun, or set "
                     "it to the rendezvous server's address (or HVD_RENDEZVOUS to an etcd "
                     "cluster)");
  st = hvd_setting_int(HVD_SET_RENDEZVOUS_PORT, &port);
  if (st == HVD_OK && port < 0)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HOROVOD_GLOO_RENDEZVOUS_PORT is not set (the rendezvous server's port)");
  if (st != HVD_OK)
    return st;
  return rdzv_client_create(addr, (int)port, token, timeout_s * 1000, out);
}

void rdzv_client_destroy(struct rdzv_client *c) {
  if (c == NULL)
    return;
  if (c->ops != NULL)
    c->ops->destroy(c);
  if (c->curl != NULL)
    curl_easy_cleanup(c->curl);
  if (c->multi != NULL)
    curl_multi_cleanup(c->multi);
  hvd_buf_fini(&c->response);
  free(c);
}

const char *rdzv_client_where(const struct rdzv_client *c) { return c->where; }

bool rdzv_client_plans_scopes(const struct rdzv_client *c) { return c->ops->plans_scopes; }

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

size_t rdzv_client_collect(char *data, size_t size, size_t n, void *arg) {
  struct rdzv_client *c = arg;
  return hvd_buf_append(&c->response, data, size * n) == HVD_OK ? size * n : 0;
}

/* With a cancel fd, a multi handle drives the transfer so that the wait
 * can also watch that fd. */
CURLcode rdzv_client_transfer(struct rdzv_client *c) {
  CURLcode rc = CURLE_OK;
  CURLMsg *msg;
  int running = 1, left;

  c->cancelled = false;
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

bool rdzv_client_pause(struct rdzv_client *c, int64_t *backoff_ms, int64_t deadline_ns) {
  int64_t ms = *backoff_ms, left = hvd_remaining_ms(deadline_ns);

  /* xorshift64: enough randomness to spread thousands of ranks apart */
  c->rng ^= c->rng << 13;
  c->rng ^= c->rng >> 7;
  c->rng ^= c->rng << 17;
  ms = ms / 2 + (int64_t)(c->rng % (uint64_t)(ms / 2 + 1));
  hvd_sleep_ns((ms < left ? ms : left) * 1000000);
  *backoff_ms = *backoff_ms * 2 > RDZV_BACKOFF_MAX_MS ? RDZV_BACKOFF_MAX_MS : *backoff_ms * 2;
  /* A pause that ran to the deadline leaves no time for another attempt:
   * one with a 1 ms budget would only turn the real cause (say, a refused
   * connection) into a timeout. */
  return hvd_now_ns() < deadline_ns;
}

/* ---- the operations ------------------------------------------------------------------ */

static hvd_status check_names(const char *scope, const char *key, bool key_required) {
  if (scope == NULL || scope[0] == '\0' || (key_required && (key == NULL || key[0] == '\0')))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: empty scope or key");
  return HVD_OK;
}

static int64_t deadline_for(const struct rdzv_client *c, int64_t timeout_ms) {
  return hvd_deadline_after_ms(timeout_ms < 0 ? c->timeout_ms : timeout_ms);
}

hvd_status rdzv_client_set(struct rdzv_client *c, const char *scope, const char *key,
                           const void *value, size_t len) {
  hvd_status st = check_names(scope, key, true);
  return st == HVD_OK ? c->ops->set(c, scope, key, value != NULL ? value : "", len) : st;
}

hvd_status rdzv_client_get(struct rdzv_client *c, const char *scope, const char *key,
                           struct hvd_buf *value, uint64_t *version) {
  hvd_status st = check_names(scope, key, true);
  return st == HVD_OK ? c->ops->get(c, scope, key, value, version) : st;
}

hvd_status rdzv_client_wait(struct rdzv_client *c, const char *scope, const char *key,
                            int64_t timeout_ms, struct hvd_buf *value) {
  hvd_status st = check_names(scope, key, true);
  return st == HVD_OK ? c->ops->wait(c, scope, key, deadline_for(c, timeout_ms), value) : st;
}

hvd_status rdzv_client_wait_keys(struct rdzv_client *c, const char *scope, const char *const *keys,
                                 size_t n, int64_t timeout_ms) {
  int64_t deadline = deadline_for(c, timeout_ms);

  for (size_t i = 0; i < n; i++) {
    hvd_status st = check_names(scope, keys[i], true);
    if (st == HVD_OK)
      st = c->ops->wait(c, scope, keys[i], deadline, NULL);
    if (st != HVD_OK)
      return st;
  }
  return HVD_OK;
}

hvd_status rdzv_client_get_scope(struct rdzv_client *c, const char *scope, size_t min_count,
                                 int64_t timeout_ms, struct rdzv_scope_view *out) {
  hvd_status st = check_names(scope, NULL, false);
  return st == HVD_OK ? c->ops->get_scope(c, scope, min_count, deadline_for(c, timeout_ms), out)
                      : st;
}

hvd_status rdzv_client_wait_change(struct rdzv_client *c, const char *scope, uint64_t after,
                                   int64_t timeout_ms, uint64_t *version) {
  hvd_status st = check_names(scope, NULL, false);
  if (st == HVD_OK && c->ops->wait_change == NULL)
    st = hvd_error(HVD_ERR_UNSUPPORTED,
                   "rendezvous %s: waiting for a scope to change needs an etcd store", c->where);
  return st == HVD_OK ? c->ops->wait_change(c, scope, after, deadline_for(c, timeout_ms), version)
                      : st;
}

hvd_status rdzv_client_lead(struct rdzv_client *c, const char *scope, const char *key,
                            const char *value, int ttl_s, int64_t timeout_ms) {
  hvd_status st = check_names(scope, key, true);
  if (st == HVD_OK && c->ops->lead == NULL)
    st = hvd_error(HVD_ERR_UNSUPPORTED, "rendezvous %s: leadership needs an etcd store",
                   c->where);
  return st == HVD_OK ? c->ops->lead(c, scope, key, value, ttl_s, deadline_for(c, timeout_ms))
                      : st;
}

hvd_status rdzv_client_lead_renew(struct rdzv_client *c) {
  if (c->ops->lead_renew == NULL)
    return hvd_error(HVD_ERR_UNSUPPORTED, "rendezvous %s: leadership needs an etcd store",
                     c->where);
  return c->ops->lead_renew(c);
}

void rdzv_client_lead_resign(struct rdzv_client *c) {
  if (c->ops->lead_resign != NULL)
    c->ops->lead_resign(c);
}

hvd_status rdzv_client_add(struct rdzv_client *c, const char *scope, const char *key, int64_t delta,
                           int64_t *result) {
  hvd_status st = check_names(scope, key, true);
  return st == HVD_OK ? c->ops->add(c, scope, key, delta, result) : st;
}

hvd_status rdzv_client_cas(struct rdzv_client *c, const char *scope, const char *key,
                           uint64_t expected_version, const void *value, size_t len,
                           uint64_t *new_version, struct hvd_buf *current,
                           uint64_t *current_version) {
  hvd_status st = check_names(scope, key, true);
  return st == HVD_OK ? c->ops->cas(c, scope, key, expected_version, value != NULL ? value : "",
                                    len, new_version, current, current_version)
                      : st;
}

hvd_status rdzv_client_delete(struct rdzv_client *c, const char *scope, const char *key) {
  hvd_status st;
  if (key == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous client: delete needs a key");
  st = check_names(scope, key, true);
  return st == HVD_OK ? c->ops->del(c, scope, key) : st;
}

hvd_status rdzv_client_delete_scope(struct rdzv_client *c, const char *scope) {
  hvd_status st = check_names(scope, NULL, false);
  return st == HVD_OK ? c->ops->del(c, scope, NULL) : st;
}

hvd_status rdzv_client_admit(struct rdzv_client *c, const char *credential, struct hvd_buf *job,
                             struct hvd_buf *token) {
  return c->ops->admit(c, credential, job, token);
}

hvd_status rdzv_client_health(struct rdzv_client *c, struct hvd_buf *json) {
  return c->ops->health(c, json);
}
