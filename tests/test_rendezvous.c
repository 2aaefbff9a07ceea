/*
 * Tests of the rendezvous module: the store (direct calls), the scope body
 * codec, the HTTP server and client together, raw-socket robustness, a
 * concurrency stress, and the hvd-rendezvous binary.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "rendezvous/rendezvous.h"

extern char **environ;

#define S(x) (x), strlen(x)

/* ==== shared helpers ======================================================== */

static struct rdzv_server *start_server_with(const char *token,
                                             void (*tweak)(struct rdzv_server_config *)) {
  struct rdzv_server_config cfg;
  struct rdzv_server *srv = NULL;

  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  cfg.token = token;
  if (tweak != NULL)
    tweak(&cfg);
  ck_assert_msg(rdzv_server_start(&cfg, &srv) == HVD_OK, "%s", hvd_last_error_message());
  return srv;
}

static struct rdzv_server *start_server(void) { return start_server_with(NULL, NULL); }

static struct rdzv_client *client_for(struct rdzv_server *srv, const char *token,
                                      int64_t timeout_ms) {
  struct rdzv_client *c = NULL;
  ck_assert_msg(rdzv_client_create("127.0.0.1", rdzv_server_port(srv), token, timeout_ms, &c) ==
                    HVD_OK,
                "%s", hvd_last_error_message());
  return c;
}

/* A port on which nothing listens (bound, then released). */
static int free_port(void) {
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sin);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;

  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &len), 0);
  close(fd);
  return ntohs(sin.sin_port);
}

/* A connection to the loopback port, from the loopback address source
 * (NULL: any). */
static int connect_from(const char *source, int port) {
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct timeval tv = {.tv_sec = 10};
  int fd = socket(AF_INET, SOCK_STREAM, 0);

  ck_assert_int_ge(fd, 0);
  if (source != NULL) {
    struct sockaddr_in from = {.sin_family = AF_INET};
    ck_assert_int_eq(inet_pton(AF_INET, source, &from.sin_addr), 1);
    ck_assert_msg(bind(fd, (struct sockaddr *)&from, sizeof(from)) == 0, "bind: %s",
                  strerror(errno));
  }
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ck_assert_msg(connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0, "connect: %s",
                strerror(errno));
  return fd;
}

static int connect_to(int port) { return connect_from(NULL, port); }

static void send_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* the server may close early; the reply tells */
    data += n;
    len -= (size_t)n;
  }
}

/*
 * Reads one HTTP response: headers, then Content-Length bytes of body.
 * Returns the status code, 0 if the connection closed before a status line.
 * headers/body may be NULL.
 */
struct response {
  int code;
  char headers[4096];
  char body[8192];
  size_t body_len;
  bool has_length;
};

static int read_response_body(int fd, struct response *r, bool body) {
  char buf[16384];
  size_t len = 0;
  char *end = NULL;
  long content_length = -1;

  memset(r, 0, sizeof(*r));
  while (end == NULL) {
    ssize_t n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
    if (n <= 0)
      return 0;
    len += (size_t)n;
    buf[len] = '\0';
    end = strstr(buf, "\r\n\r\n");
    if (len == sizeof(buf) - 1)
      return 0;
  }
  *end = '\0';
  size_t header_len = strlen(buf);
  if (header_len >= sizeof(r->headers))
    header_len = sizeof(r->headers) - 1;
  memcpy(r->headers, buf, header_len);
  r->headers[header_len] = '\0';
  if (sscanf(buf, "HTTP/1.%*d %d", &r->code) != 1)
    return 0;
  for (char *line = strstr(r->headers, "\r\n"); line != NULL; line = strstr(line + 2, "\r\n")) {
    if (strncasecmp(line + 2, "Content-Length:", 15) == 0) {
      content_length = strtol(line + 2 + 15, NULL, 10);
      r->has_length = true;
    }
  }
  size_t have = len - (size_t)(end + 4 - buf);
  memcpy(r->body, end + 4, have < sizeof(r->body) ? have : sizeof(r->body));
  r->body_len = have;
  while (body && content_length >= 0 && r->body_len < (size_t)content_length &&
         r->body_len < sizeof(r->body)) {
    ssize_t n = recv(fd, r->body + r->body_len, sizeof(r->body) - r->body_len, 0);
    if (n <= 0)
      break;
    r->body_len += (size_t)n;
  }
  r->body[r->body_len < sizeof(r->body) ? r->body_len : sizeof(r->body) - 1] = '\0';
  return r->code;
}

static int read_response(int fd, struct response *r) { return read_response_body(fd, r, true); }

/* One request on a fresh connection; returns the status code. */
static int raw_exchange(int port, const char *request, struct response *r) {
  int fd = connect_to(port);
  int code;
  send_all(fd, request, strlen(request));
  code = read_response(fd, r);
  close(fd);
  return code;
}

/* Whether the peer closes the connection within 10 s (recv returns 0/error). */
static bool closed_by_peer(int fd) {
  char c;
  struct pollfd p = {.fd = fd, .events = POLLIN};
  if (poll(&p, 1, 10000) <= 0)
    return false;
  return recv(fd, &c, 1, 0) <= 0;
}

/* Whether fd, turned away to make room for another connection, reads a 503
 * with Retry-After (its request was not run) and is then closed. */
static bool turned_away(int fd) {
  struct response r;
  return read_response(fd, &r) == 503 && strstr(r.headers, "\r\nRetry-After: ") != NULL &&
         strstr(r.body, "not run") != NULL && closed_by_peer(fd);
}

/* Whether fd is closed within 10 s, answered or not. */
static bool ends(int fd) {
  char buf[4096];
  struct pollfd p = {.fd = fd, .events = POLLIN};
  ssize_t n = 1;
  while (n > 0 && poll(&p, 1, 10000) > 0)
    n = recv(fd, buf, sizeof(buf), 0);
  return n <= 0;
}

/* A number from the server's /_health on port (-1 if it cannot be read). */
static double health_number(int port, const char *name) {
  struct response r;
  double value = -1;
  if (raw_exchange(port, "GET /_health HTTP/1.1\r\nHost: x\r\n\r\n", &r) == 200) {
    cJSON *doc = cJSON_Parse(r.body);
    cJSON *item = cJSON_GetObjectItem(doc, name);
    if (cJSON_IsNumber(item))
      value = item->valuedouble;
    cJSON_Delete(doc);
  }
  return value;
}

/* Waits (10 s at most) until /_health's number name equals want. */
static void await_health(int port, const char *name, double want) {
  int64_t deadline = hvd_deadline_after_ms(10000);
  double value;
  while ((value = health_number(port, name)) != want && hvd_now_ns() < deadline)
    hvd_sleep_ns(5000000);
  ck_assert_msg(value == want, "/_health %s is %g, not %g", name, value, want);
}

/* ==== store ================================================================= */

struct fired_log {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  int count;
  struct rdzv_waiter *last;
};

static struct fired_log fired;

static void test_fire_cb(struct rdzv_waiter *w, void *arg) {
  (void)arg;
  pthread_mutex_lock(&fired.mu);
  fired.count++;
  fired.last = w;
  pthread_cond_broadcast(&fired.cond);
  pthread_mutex_unlock(&fired.mu);
}

static int parked;
static void test_park_cb(struct rdzv_waiter *w, void *arg) {
  (void)w;
  (void)arg;
  parked++;
}

/* Waits (10 s at most) until the fire callback ran `n` times in total. */
static bool wait_fired(int n) {
  int64_t deadline = hvd_deadline_after_ms(10000);
  bool ok;
  pthread_mutex_lock(&fired.mu);
  while (fired.count < n && hvd_cond_wait_until(&fired.cond, &fired.mu, deadline) == 0) {
  }
  ok = fired.count >= n;
  pthread_mutex_unlock(&fired.mu);
  return ok;
}

static struct rdzv_store *store;

static void store_setup(void) {
  pthread_mutex_init(&fired.mu, NULL);
  hvd_cond_init(&fired.cond);
  fired.count = 0;
  fired.last = NULL;
  parked = 0;
  ck_assert_int_eq(rdzv_store_create(NULL, test_fire_cb, NULL, &store), HVD_OK);
}

static void store_teardown(void) {
  rdzv_store_destroy(store);
  store = NULL;
}

static void put(const char *scope, const char *key, const char *value) {
  ck_assert_int_eq(rdzv_store_set(store, S(scope), S(key), S(value), RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_OK);
}

static bool present(const char *scope, const char *key) {
  struct rdzv_blob *b = NULL;
  hvd_status st = rdzv_store_get(store, S(scope), S(key), &b);
  rdzv_blob_unref(b);
  return st == HVD_OK;
}

START_TEST(store_set_get_versions) {
  struct rdzv_blob *b = NULL;
  uint64_t v1 = 0, v2 = 0;

  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("k"), S("one"), RDZV_SET_ALWAYS, 0, &v1, NULL),
                   HVD_OK);
  ck_assert_int_eq(rdzv_store_get(store, S("s"), S("k"), &b), HVD_OK);
  ck_assert_uint_eq(b->len, 3);
  ck_assert_str_eq((char *)b->data, "one");
  ck_assert_uint_eq(b->version, v1);
  rdzv_blob_unref(b);
  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("k"), S("one"), RDZV_SET_ALWAYS, 0, &v2, NULL),
                   HVD_OK);
  ck_assert_uint_gt(v2, v1); /* same bytes, new version */
  ck_assert_int_eq(rdzv_store_get(store, S("s"), S("nope"), &b), HVD_ERR_NOT_FOUND);
  ck_assert_int_eq(rdzv_store_get(store, S("nope"), S("k"), &b), HVD_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "nope"));
}
END_TEST

START_TEST(store_binary_and_empty_values) {
  static const char bin[] = {'a', '\0', '\n', (char)0xff};
  struct rdzv_blob *b = NULL;

  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("bin"), bin, sizeof(bin), RDZV_SET_ALWAYS, 0,
                                  NULL, NULL),
                   HVD_OK);
  ck_assert_int_eq(rdzv_store_get(store, S("s"), S("bin"), &b), HVD_OK);
  ck_assert_uint_eq(b->len, sizeof(bin));
  ck_assert_mem_eq(b->data, bin, sizeof(bin));
  rdzv_blob_unref(b);
  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("empty"), NULL, 0, RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_OK);
  ck_assert_int_eq(rdzv_store_get(store, S("s"), S("empty"), &b), HVD_OK);
  ck_assert_uint_eq(b->len, 0);
  rdzv_blob_unref(b);
}
END_TEST

START_TEST(store_compare_and_set) {
  struct rdzv_blob *cur = NULL;
  uint64_t v1 = 0, v2 = 0;

  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("k"), S("a"), RDZV_SET_IF_VERSION, 7, &v1,
                                  &cur),
                   HVD_ERR_CONFLICT);
  ck_assert_ptr_null(cur);
  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("k"), S("a"), RDZV_SET_IF_ABSENT, 0, &v1, NULL),
                   HVD_OK);
  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("k"), S("b"), RDZV_SET_IF_ABSENT, 0, &v2, &cur),
                   HVD_ERR_CONFLICT);
  ck_assert_ptr_nonnull(cur);
  ck_assert_str_eq((char *)cur->data, "a");
  ck_assert_uint_eq(cur->version, v1);
  rdzv_blob_unref(cur);
  cur = NULL;
  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("k"), S("c"), RDZV_SET_IF_VERSION, v1 + 100,
                                  &v2, &cur),
                   HVD_ERR_CONFLICT);
  ck_assert_str_eq((char *)cur->data, "a");
  rdzv_blob_unref(cur);
  ck_assert_int_eq(rdzv_store_set(store, S("s"), S("k"), S("d"), RDZV_SET_IF_VERSION, v1, &v2,
                                  NULL),
                   HVD_OK);
  ck_assert_uint_gt(v2, v1);
  /* A failed create leaves no empty scope behind. */
  struct rdzv_store_stats stats;
  rdzv_store_get_stats(store, &stats);
  ck_assert_uint_eq(stats.scopes, 1);
}
END_TEST

START_TEST(store_atomic_add) {
  int64_t r = 0;
  ck_assert_int_eq(rdzv_store_add(store, S("c"), S("n"), 5, &r, NULL), HVD_OK);
  ck_assert_int_eq(r, 5);
  ck_assert_int_eq(rdzv_store_add(store, S("c"), S("n"), -7, &r, NULL), HVD_OK);
  ck_assert_int_eq(r, -2);
  put("c", "text", "hello");
  ck_assert_int_eq(rdzv_store_add(store, S("c"), S("text"), 1, &r, NULL), HVD_ERR_CONFLICT);
  put("c", "big", "9223372036854775807");
  ck_assert_int_eq(rdzv_store_add(store, S("c"), S("big"), 1, &r, NULL), HVD_ERR_CONFLICT);
  ck_assert_int_eq(rdzv_store_add(store, S("c"), S("big"), -1, &r, NULL), HVD_OK);
  ck_assert_int_eq(r, INT64_MAX - 1);
  put("c", "small", "-9223372036854775808");
  ck_assert_int_eq(rdzv_store_add(store, S("c"), S("small"), -1, &r, NULL), HVD_ERR_CONFLICT);
}
END_TEST

START_TEST(store_delete_and_delete_scope) {
  struct rdzv_store_stats stats;
  put("s", "a", "1");
  put("s", "b", "2");
  put("t", "a", "3");
  ck_assert_int_eq(rdzv_store_delete(store, S("s"), S("a")), HVD_OK);
  ck_assert(!present("s", "a"));
  ck_assert(present("s", "b"));
  ck_assert_int_eq(rdzv_store_delete(store, S("s"), S("zzz")), HVD_OK);
  ck_assert_int_eq(rdzv_store_delete(store, S("nope"), S("a")), HVD_OK);
  ck_assert_int_eq(rdzv_store_delete_scope(store, S("s")), HVD_OK);
  ck_assert(!present("s", "b"));
  ck_assert(present("t", "a"));
  rdzv_store_get_stats(store, &stats);
  ck_assert_uint_eq(stats.scopes, 1);
  ck_assert_uint_eq(stats.keys, 1);
  ck_assert_int_eq(rdzv_store_delete(store, S("t"), S("a")), HVD_OK);
  rdzv_store_get_stats(store, &stats);
  ck_assert_uint_eq(stats.scopes, 0);
  ck_assert_uint_eq(stats.keys, 0);
}
END_TEST

START_TEST(store_planned_scope_cleanup) {
  struct rdzv_store_stats stats;

  ck_assert_int_eq(rdzv_store_plan(store, S("global"), 3), HVD_OK);
  ck_assert_int_eq(rdzv_store_plan(store, S("local_h"), 2), HVD_OK);
  put("global", "0", "a0");
  put("global", "1", "a1");
  put("global", "2", "a2");
  put("global", "extra", "x");
  put("local_h", "0", "b0");
  put("local_h", "1", "b1");

  /* Rank keys are marked finished, not removed; duplicates count once. */
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("0")), HVD_OK);
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("1")), HVD_OK);
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("1")), HVD_OK);
  ck_assert(present("global", "0"));
  ck_assert(present("global", "1"));
  /* A non-rank key, or a rank outside the plan, is removed as usual. */
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("extra")), HVD_OK);
  ck_assert(!present("global", "extra"));
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("3")), HVD_OK);
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("01")), HVD_OK);
  ck_assert(present("global", "2"));

  /* Another scope finishing does not disturb global's count. */
  ck_assert_int_eq(rdzv_store_delete(store, S("local_h"), S("0")), HVD_OK);
  ck_assert_int_eq(rdzv_store_delete(store, S("local_h"), S("1")), HVD_OK);
  ck_assert(!present("local_h", "0"));
  ck_assert(present("global", "0"));
  ck_assert_uint_eq(rdzv_store_plan_rounds(store, S("local_h")), 1);
  ck_assert_uint_eq(rdzv_store_plan_rounds(store, S("global")), 0);

  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("2")), HVD_OK);
  ck_assert_uint_eq(rdzv_store_plan_rounds(store, S("global")), 1);
  ck_assert(!present("global", "0"));
  ck_assert(!present("global", "1"));
  ck_assert(!present("global", "2"));
  rdzv_store_get_stats(store, &stats);
  ck_assert_uint_eq(stats.keys, 0);
  ck_assert_uint_eq(stats.scopes, 0);
  ck_assert_uint_eq(stats.planned_scopes, 2);

  /* The plan stays: the next round is counted afresh. */
  put("global", "0", "r2");
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("0")), HVD_OK);
  ck_assert(present("global", "0"));
}
END_TEST

START_TEST(store_reset_drops_keys_and_plans) {
  struct rdzv_store_stats stats;
  ck_assert_int_eq(rdzv_store_plan(store, S("global"), 2), HVD_OK);
  put("global", "0", "x");
  put("other", "k", "y");
  rdzv_store_reset(store);
  rdzv_store_get_stats(store, &stats);
  ck_assert_uint_eq(stats.keys, 0);
  ck_assert_uint_eq(stats.scopes, 0);
  ck_assert_uint_eq(stats.planned_scopes, 0);
  ck_assert_uint_eq(stats.bytes, 0);
  put("global", "0", "x");
  ck_assert_int_eq(rdzv_store_delete(store, S("global"), S("0")), HVD_OK);
  ck_assert(!present("global", "0")); /* no plan any more: plain delete */
}
END_TEST

START_TEST(store_limits) {
  struct rdzv_store_limits limits = {.max_name_bytes = 8, .max_value_bytes = 16,
                                     .max_total_bytes = 2000};
  struct rdzv_store *small = NULL;
  char value[16] = {0};
  char key[8];
  hvd_status st = HVD_OK;
  int stored = 0;

  ck_assert_int_eq(rdzv_store_create(&limits, test_fire_cb, NULL, &small), HVD_OK);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("k"), value, 17, RDZV_SET_ALWAYS, 0, NULL, NULL),
                   HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("123456789"), value, 1, RDZV_SET_ALWAYS, 0,
                                  NULL, NULL),
                   HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(rdzv_store_set(small, "", 0, S("k"), value, 1, RDZV_SET_ALWAYS, 0, NULL, NULL),
                   HVD_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 100 && st == HVD_OK; i++) {
    snprintf(key, sizeof(key), "%d", i);
    st = rdzv_store_set(small, S("s"), S(key), value, 16, RDZV_SET_ALWAYS, 0, NULL, NULL);
    if (st == HVD_OK)
      stored++;
  }
  ck_assert_int_eq(st, HVD_ERR_TOO_LARGE);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "full"));
  ck_assert_int_gt(stored, 5);
  /* Deleting frees room again. */
  ck_assert_int_eq(rdzv_store_delete(small, S("s"), S("0")), HVD_OK);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("x"), value, 16, RDZV_SET_ALWAYS, 0, NULL, NULL),
                   HVD_OK);
  rdzv_store_destroy(small);
}
END_TEST

/* Values and scope bodies the store let go of while a reader still holds
 * them count against its limit until the reader lets go. */
START_TEST(store_held_values_count_against_the_limit) {
  struct rdzv_store_limits limits = {.max_name_bytes = 8, .max_value_bytes = 40000,
                                     .max_total_bytes = 60000};
  struct rdzv_store *small = NULL;
  struct rdzv_store_stats stats;
  struct rdzv_blob *held = NULL, *body = NULL;
  static char value[40000];
  size_t count;

  ck_assert_int_eq(rdzv_store_create(&limits, test_fire_cb, NULL, &small), HVD_OK);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("k"), value, 20000, RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_OK);
  ck_assert_int_eq(rdzv_store_get(small, S("s"), S("k"), &held), HVD_OK);
  /* Overwritten while a reader holds the old value: both are in memory. */
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("k"), value, 20000, RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_OK);
  rdzv_store_get_stats(small, &stats);
  ck_assert_uint_eq(stats.held_bytes, 20000);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("k2"), value, 30000, RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_ERR_TOO_LARGE);
  rdzv_blob_unref(held);
  rdzv_store_get_stats(small, &stats);
  ck_assert_uint_eq(stats.held_bytes, 0);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("k2"), value, 30000, RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_OK);

  /* A cached scope body is charged while cached, and while held once stale. */
  ck_assert_int_eq(rdzv_store_delete(small, S("s"), S("k2")), HVD_OK);
  rdzv_store_get_stats(small, &stats);
  size_t before = stats.bytes;
  ck_assert_int_eq(rdzv_store_snapshot(small, S("s"), &body, &count), HVD_OK);
  rdzv_store_get_stats(small, &stats);
  ck_assert_uint_eq(stats.bytes, before + body->len);
  ck_assert_int_eq(rdzv_store_delete(small, S("s"), S("k")), HVD_OK);
  rdzv_store_get_stats(small, &stats);
  ck_assert_uint_eq(stats.held_bytes, body->len);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("k3"), value, 40000, RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_ERR_TOO_LARGE);
  rdzv_blob_unref(body);
  rdzv_store_get_stats(small, &stats);
  ck_assert_uint_eq(stats.held_bytes, 0);
  ck_assert_int_eq(rdzv_store_set(small, S("s"), S("k3"), value, 40000, RDZV_SET_ALWAYS, 0, NULL,
                                  NULL),
                   HVD_OK);
  /* A reader may outlive the store. */
  ck_assert_int_eq(rdzv_store_get(small, S("s"), S("k3"), &held), HVD_OK);
  rdzv_store_destroy(small);
  ck_assert_uint_eq(held->len, 40000);
  rdzv_blob_unref(held);
}
END_TEST

static atomic_bool stuck_entered, stuck_release;

static void stuck_fire_cb(struct rdzv_waiter *w, void *arg) {
  (void)w;
  (void)arg;
  atomic_store(&stuck_entered, true);
  while (!atomic_load(&stuck_release))
    hvd_sleep_ns(1000000);
}

static void *put_later(void *arg) {
  (void)rdzv_store_set(arg, S("s"), S("k"), "v", 1, RDZV_SET_ALWAYS, 0, NULL, NULL);
  return NULL;
}

/* Closing waits for a fire callback for 10 s at most, and says so. */
START_TEST(store_close_gives_up_on_a_stuck_callback) {
  struct rdzv_store *s = NULL;
  struct rdzv_waiter w;
  pthread_t writer;

  atomic_store(&stuck_entered, false);
  atomic_store(&stuck_release, false);
  ck_assert_int_eq(rdzv_store_create(NULL, stuck_fire_cb, NULL, &s), HVD_OK);
  memset(&w, 0, sizeof(w));
  w.scope = "s";
  w.scope_len = 1;
  w.key = "k";
  w.key_len = 1;
  w.deadline_ns = hvd_deadline_after_ms(60000);
  ck_assert_int_eq(rdzv_store_wait(s, &w, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(pthread_create(&writer, NULL, put_later, s), 0);
  while (!atomic_load(&stuck_entered))
    hvd_sleep_ns(1000000);
  ck_assert_int_eq(rdzv_store_close(s), HVD_ERR_TIMEOUT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "still handing out"));
  atomic_store(&stuck_release, true);
  pthread_join(writer, NULL);
  ck_assert_int_eq(rdzv_store_close(s), HVD_OK);
  rdzv_blob_unref(w.value);
  rdzv_store_destroy(s);
}
END_TEST

START_TEST(store_snapshot_order_and_cache) {
  struct rdzv_blob *a = NULL, *b = NULL, *c = NULL;
  struct rdzv_scope_view view;
  size_t count = 0;

  put("s", "10", "ten");
  put("s", "2", "two");
  put("s", "b", "bee");
  put("s", "a", "ay");
  ck_assert_int_eq(rdzv_store_snapshot(store, S("s"), &a, &count), HVD_OK);
  ck_assert_uint_eq(count, 4);
  ck_assert_int_eq(rdzv_store_snapshot(store, S("s"), &b, &count), HVD_OK);
  ck_assert_ptr_eq(a, b); /* unchanged scope: one serialization shared */
  put("s", "a", "changed");
  ck_assert_int_eq(rdzv_store_snapshot(store, S("s"), &c, &count), HVD_OK);
  ck_assert_ptr_ne(a, c);

  ck_assert_int_eq(rdzv_scope_decode(hvd_strndup((char *)a->data, a->len), a->len, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 4);
  ck_assert_str_eq(view.entries[0].key, "2");
  ck_assert_str_eq(view.entries[1].key, "10");
  ck_assert_str_eq(view.entries[2].key, "a");
  ck_assert_str_eq(view.entries[3].key, "b");
  ck_assert_str_eq((char *)view.entries[1].value, "ten");
  rdzv_scope_view_fini(&view);
  rdzv_blob_unref(a);
  rdzv_blob_unref(b);
  rdzv_blob_unref(c);

  ck_assert_int_eq(rdzv_store_snapshot(store, S("empty"), &a, &count), HVD_OK);
  ck_assert_uint_eq(count, 0);
  ck_assert_uint_eq(a->len, 0);
  rdzv_blob_unref(a);
}
END_TEST

static void init_waiter(struct rdzv_waiter *w, const char *scope, const char *key, size_t count,
                        int64_t timeout_ms) {
  memset(w, 0, sizeof(*w));
  w->scope = scope;
  w->scope_len = strlen(scope);
  w->key = key;
  w->key_len = key ? strlen(key) : 0;
  w->min_count = count;
  w->deadline_ns = hvd_deadline_after_ms(timeout_ms);
}

static atomic_int own_fired;
static void own_fire_cb(struct rdzv_waiter *w, void *arg) {
  (void)w;
  atomic_fetch_add((atomic_int *)arg, 1);
}

/* A change wait fires on the scope's next write, delete or clear after the
 * version it saw, through the waiter's own callback. */
START_TEST(store_wait_for_changes) {
  struct rdzv_waiter w;
  int before = fired.count;

  atomic_store(&own_fired, 0);
  init_waiter(&w, "s", NULL, 0, 10000);
  w.changes = true;
  w.fire = own_fire_cb;
  w.fire_arg = &own_fired;
  ck_assert_int_eq(rdzv_store_wait(store, &w, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(w.result, RDZV_WAIT_PENDING);
  put("other", "k", "v");
  ck_assert_int_eq(atomic_load(&own_fired), 0);
  put("s", "a", "1");
  ck_assert_int_eq(atomic_load(&own_fired), 1);
  ck_assert_int_eq(w.result, RDZV_WAIT_READY);
  ck_assert_uint_eq(w.count, 1);
  ck_assert_uint_gt(w.version, 0);
  rdzv_blob_unref(w.value);

  /* Seen: the same version waits; a delete is a change. */
  uint64_t seen = w.version;
  init_waiter(&w, "s", NULL, 0, 10000);
  w.changes = true;
  w.after = seen;
  w.fire = own_fire_cb;
  w.fire_arg = &own_fired;
  ck_assert_int_eq(rdzv_store_wait(store, &w, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(w.result, RDZV_WAIT_PENDING);
  ck_assert_int_eq(rdzv_store_delete(store, S("s"), S("a")), HVD_OK);
  ck_assert_int_eq(atomic_load(&own_fired), 2);
  ck_assert_int_eq(w.result, RDZV_WAIT_READY);
  ck_assert_uint_eq(w.count, 0);
  ck_assert_uint_gt(w.version, seen);
  rdzv_blob_unref(w.value);

  /* A scope changed since the version given is ready at once, without a
   * callback. */
  init_waiter(&w, "other", NULL, 0, 10000);
  w.changes = true;
  ck_assert_int_eq(rdzv_store_wait(store, &w, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(w.result, RDZV_WAIT_READY);
  rdzv_blob_unref(w.value);
  ck_assert_int_eq(fired.count, before); /* the store's own callback never ran */
}
END_TEST

START_TEST(store_wait_ready_now_and_later) {
  struct rdzv_waiter now, later;

  put("s", "k", "v");
  init_waiter(&now, "s", "k", 0, 10000);
  ck_assert_int_eq(rdzv_store_wait(store, &now, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(now.result, RDZV_WAIT_READY);
  ck_assert_int_eq(parked, 0);
  ck_assert_str_eq((char *)now.value->data, "v");
  rdzv_blob_unref(now.value);

  init_waiter(&later, "s", "k2", 0, 10000);
  ck_assert_int_eq(rdzv_store_wait(store, &later, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(parked, 1);
  put("s", "other", "x");
  ck_assert_int_eq(fired.count, 0);
  put("s", "k2", "v2");
  ck_assert(wait_fired(1));
  ck_assert_ptr_eq(fired.last, &later);
  ck_assert_int_eq(later.result, RDZV_WAIT_READY);
  ck_assert_str_eq((char *)later.value->data, "v2");
  rdzv_blob_unref(later.value);
}
END_TEST

START_TEST(store_wait_scope_count) {
  struct rdzv_waiter w;
  struct rdzv_scope_view view;

  init_waiter(&w, "peers", NULL, 3, 10000);
  ck_assert_int_eq(rdzv_store_wait(store, &w, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(parked, 1);
  put("peers", "0", "a");
  put("peers", "1", "b");
  ck_assert_int_eq(fired.count, 0);
  int64_t r;
  ck_assert_int_eq(rdzv_store_add(store, S("peers"), S("2"), 1, &r, NULL), HVD_OK);
  ck_assert(wait_fired(1));
  ck_assert_int_eq(w.result, RDZV_WAIT_READY);
  ck_assert_uint_eq(w.count, 3);
  ck_assert_int_eq(rdzv_scope_decode(hvd_strndup((char *)w.value->data, w.value->len),
                                     w.value->len, &view),
                   HVD_OK);
  ck_assert_uint_eq(view.count, 3);
  ck_assert_str_eq((char *)view.entries[2].value, "1");
  rdzv_scope_view_fini(&view);
  rdzv_blob_unref(w.value);
}
END_TEST

START_TEST(store_wait_deadlines) {
  struct rdzv_waiter past, soon, late;
  struct rdzv_store_stats stats;

  init_waiter(&past, "s", "k", 0, 0);
  ck_assert_int_eq(rdzv_store_wait(store, &past, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(past.result, RDZV_WAIT_TIMEOUT);
  ck_assert_int_eq(parked, 0);

  init_waiter(&late, "s", "k", 0, 60000);
  init_waiter(&soon, "s", "k", 0, 50);
  ck_assert_int_eq(rdzv_store_wait(store, &late, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(rdzv_store_wait(store, &soon, test_park_cb, NULL), HVD_OK);
  ck_assert(wait_fired(1));
  ck_assert_ptr_eq(fired.last, &soon);
  ck_assert_int_eq(soon.result, RDZV_WAIT_TIMEOUT);
  ck_assert_ptr_null(soon.value);
  ck_assert_int_eq(late.result, RDZV_WAIT_PENDING);
  rdzv_store_get_stats(store, &stats);
  ck_assert_uint_eq(stats.waiters, 1);

  /* Closing answers the rest, and later waits at once. */
  rdzv_store_close(store);
  ck_assert(wait_fired(2));
  ck_assert_int_eq(late.result, RDZV_WAIT_CANCELLED);
  init_waiter(&past, "s", "k", 0, 60000);
  ck_assert_int_eq(rdzv_store_wait(store, &past, test_park_cb, NULL), HVD_OK);
  ck_assert_int_eq(past.result, RDZV_WAIT_CANCELLED);
}
END_TEST

/* Many waiters with random deadlines all time out, earliest first. */
START_TEST(store_wait_many_deadlines) {
  enum { N = 200 };
  static struct rdzv_waiter w[N];

  for (int i = 0; i < N; i++) {
    init_waiter(&w[i], "s", "never", 0, 20 + (i * 37) % 150);
    ck_assert_int_eq(rdzv_store_wait(store, &w[i], test_park_cb, NULL), HVD_OK);
  }
  ck_assert(wait_fired(N));
  for (int i = 0; i < N; i++)
    ck_assert_int_eq(w[i].result, RDZV_WAIT_TIMEOUT);
}
END_TEST

/* ==== codec ================================================================= */

static struct rdzv_scope_view decode_text(const char *text, hvd_status expect) {
  struct rdzv_scope_view v;
  memset(&v, 0, sizeof(v));
  ck_assert_int_eq(rdzv_scope_decode(hvd_strndup(text, strlen(text)), strlen(text), &v), expect);
  return v;
}

START_TEST(codec_roundtrip_binary) {
  static const char bin[] = {'x', '\n', '\0', 'y'};
  struct hvd_buf b;
  struct rdzv_scope_view v;

  hvd_buf_init(&b, 0);
  ck_assert_int_eq(rdzv_scope_encode_entry(&b, S("0"), S("10.0.0.1:4000")), HVD_OK);
  ck_assert_int_eq(rdzv_scope_encode_entry(&b, S("1"), bin, sizeof(bin)), HVD_OK);
  ck_assert_int_eq(rdzv_scope_encode_entry(&b, S("key with space"), "", 0), HVD_OK);
  ck_assert_str_eq(b.data, "1 13\n0\n10.0.0.1:4000\n1 4\n1\nx\n\0y\n");
  size_t len = b.len;
  ck_assert_int_eq(rdzv_scope_decode(hvd_buf_detach(&b, NULL), len, &v), HVD_OK);
  ck_assert_uint_eq(v.count, 3);
  ck_assert_str_eq(v.entries[0].key, "0");
  ck_assert_str_eq((char *)v.entries[0].value, "10.0.0.1:4000");
  ck_assert_uint_eq(v.entries[1].value_len, 4);
  ck_assert_mem_eq(v.entries[1].value, bin, 4);
  ck_assert_uint_eq(v.entries[2].value_len, 0);
  ck_assert_ptr_eq(rdzv_scope_find(&v, "1"), &v.entries[1]);
  ck_assert_ptr_eq(rdzv_scope_find(&v, "key with space"), &v.entries[2]);
  ck_assert_ptr_null(rdzv_scope_find(&v, "2"));
  rdzv_scope_view_fini(&v);

  v = decode_text("", HVD_OK);
  ck_assert_uint_eq(v.count, 0);
  rdzv_scope_view_fini(&v);
}
END_TEST

START_TEST(codec_rejects_malformed) {
  static const char *const bad[] = {
      "1 1\n0\nx",            /* missing final separator */
      "1 1\n0\nxy",           /* value longer than declared */
      "1 5\n0\nx\n",          /* value shorter than declared */
      "2 1\n0\nx\n",          /* key length runs into the value */
      "1 1 \n0\nx\n",         /* extra blank */
      "a 1\n0\nx\n",          /* not a number */
      "1\n0\nx\n",            /* one length */
      "-1 1\n0\nx\n",         /* negative */
      "99999999999999999999 1\n0\nx\n", /* too many digits */
      "1 18446744073709551615\n0\nx\n", /* length past the body */
      "1 1\n1\nx\n1 1\n0\ny\n",          /* out of order */
      "1 1\n0\nx\n1 1\n0\ny\n",          /* duplicate */
      "1 1\n0?x\n",           /* wrong key separator */
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    struct rdzv_scope_view v;
    ck_assert_msg(rdzv_scope_decode(hvd_strndup(bad[i], strlen(bad[i])), strlen(bad[i]), &v) ==
                      HVD_ERR_PROTOCOL,
                  "accepted case %zu", i);
  }
}
END_TEST

START_TEST(codec_key_order) {
  ck_assert_int_lt(rdzv_key_compare(S("2"), S("10")), 0);
  ck_assert_int_gt(rdzv_key_compare(S("10"), S("9")), 0);
  ck_assert_int_lt(rdzv_key_compare(S("99999999999999999999999"), S("a")), 0);
  ck_assert_int_lt(rdzv_key_compare(S("9"), S("10000000000000000000000")), 0);
  ck_assert_int_lt(rdzv_key_compare(S("007"), S("7")), 0); /* same number: bytes decide */
  ck_assert_int_ne(rdzv_key_compare(S("007"), S("7")), 0);
  ck_assert_int_lt(rdzv_key_compare(S("a"), S("ab")), 0);
  ck_assert_int_eq(rdzv_key_compare(S("host:1"), S("host:1")), 0);
}
END_TEST

/* ==== records ================================================================ */

START_TEST(record_roundtrip) {
  struct rdzv_record r = {.rank = 3, .global_rank = 7, .local_rank = 1, .pid = 4242,
                          .generation = 18446744073709551615ull / 2, .port = 40123, .naddrs = 2};
  struct rdzv_record back;
  struct hvd_buf text;

  snprintf(r.host, sizeof(r.host), "node-\"1\"");
  snprintf(r.addrs[0], sizeof(r.addrs[0]), "10.0.0.5");
  snprintf(r.addrs[1], sizeof(r.addrs[1]), "fe80::1%%eth0");
  hvd_buf_init(&text, 0);
  ck_assert_int_eq(rdzv_record_encode(&r, &text), HVD_OK);
  ck_assert_int_eq(rdzv_record_decode(text.data, text.len, &back), HVD_OK);
  ck_assert_int_eq(back.rank, 3);
  ck_assert_int_eq(back.global_rank, 7);
  ck_assert_int_eq(back.local_rank, 1);
  ck_assert_int_eq(back.pid, 4242);
  ck_assert(back.generation == 18446744073709551615ull / 2);
  ck_assert_int_eq(back.port, 40123);
  ck_assert_str_eq(back.host, "node-\"1\"");
  ck_assert_uint_eq(back.naddrs, 2);
  ck_assert_str_eq(back.addrs[1], "fe80::1%eth0");
  hvd_buf_fini(&text);
}
END_TEST

START_TEST(record_rejects_bad_fields) {
  static const char *const bad[] = {
      "",
      "[]",
      "{\"v\":2,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"rank\":-1,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"rank\":0.5,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":70000,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"rank\":0,\"global_rank\":0,\"host\":\"\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[]}",
      "{\"v\":1,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[7]}",
      "{\"v\":1,\"rank\":\"0\",\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      /* Numbers beyond any integer type (undefined to convert unchecked). */
      "{\"v\":1e300,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"rank\":-1e300,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
      "{\"v\":1,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":0,\"pid\":1e19,"
      "\"gen\":\"0\",\"port\":1,\"addrs\":[\"a\"]}",
  };
  struct rdzv_record r;
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++)
    ck_assert_msg(rdzv_record_decode(bad[i], strlen(bad[i]), &r) == HVD_ERR_PROTOCOL,
                  "accepted case %zu", i);
  ck_assert_int_eq(rdzv_record_decode(bad[2], strlen(bad[2]), &r), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "version 2"));
}
END_TEST

/* ==== http ================================================================== */

static struct rdzv_server *srv;
static struct rdzv_client *cli;

static void http_setup(void) {
  srv = start_server();
  cli = client_for(srv, NULL, 10000);
}

static void http_teardown(void) {
  rdzv_client_destroy(cli);
  rdzv_server_stop(srv);
}

START_TEST(http_set_get_delete) {
  struct hvd_buf v;
  uint64_t version = 0;

  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_client_set(cli, "global", "0", S("10.0.0.1:4000")), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(cli, "global", "0", &v, &version), HVD_OK);
  ck_assert_str_eq(v.data, "10.0.0.1:4000");
  ck_assert_uint_gt(version, 0);
  ck_assert_int_eq(rdzv_client_get(cli, "global", "1", &v, NULL), HVD_ERR_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "404"));
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "/global/1"));
  /* Keys with bytes that need escaping survive the trip. */
  ck_assert_int_eq(rdzv_client_set(cli, "rank_and_size", "host-a:0", S("1,2,3")), HVD_OK);
  ck_assert_int_eq(rdzv_client_set(cli, "s p", "k?&=#%", S("odd")), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(cli, "s p", "k?&=#%", &v, NULL), HVD_OK);
  ck_assert_str_eq(v.data, "odd");
  ck_assert_int_eq(rdzv_client_delete(cli, "global", "0"), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(cli, "global", "0", &v, NULL), HVD_ERR_NOT_FOUND);
  ck_assert_int_eq(rdzv_client_delete(cli, "global", "0"), HVD_OK);
  hvd_buf_fini(&v);
}
END_TEST

START_TEST(http_scope_add_cas) {
  struct rdzv_scope_view view;
  struct hvd_buf cur;
  uint64_t v1 = 0, v2 = 0, seen = 0;
  int64_t n = 0;

  hvd_buf_init(&cur, 0);
  ck_assert_int_eq(rdzv_client_get_scope(cli, "none", 0, 1000, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 0);
  rdzv_scope_view_fini(&view);
  for (int i = 0; i < 12; i++) {
    char key[8], value[32];
    snprintf(key, sizeof(key), "%d", i);
    snprintf(value, sizeof(value), "addr-%d", i);
    ck_assert_int_eq(rdzv_client_set(cli, "peers", key, S(value)), HVD_OK);
  }
  ck_assert_int_eq(rdzv_client_get_scope(cli, "peers", 12, 1000, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 12);
  ck_assert_str_eq(view.entries[11].key, "11");
  ck_assert_str_eq((char *)rdzv_scope_find(&view, "7")->value, "addr-7");
  rdzv_scope_view_fini(&view);
  ck_assert_int_eq(rdzv_client_get_scope(cli, "peers", 13, 0, &view), HVD_ERR_TIMEOUT);

  ck_assert_int_eq(rdzv_client_add(cli, "ctr", "n", 3, &n), HVD_OK);
  ck_assert_int_eq(n, 3);
  ck_assert_int_eq(rdzv_client_add(cli, "ctr", "n", -10, &n), HVD_OK);
  ck_assert_int_eq(n, -7);
  ck_assert_int_eq(rdzv_client_add(cli, "peers", "0", 1, &n), HVD_ERR_CONFLICT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "409"));

  ck_assert_int_eq(rdzv_client_cas(cli, "lock", "owner", 0, S("rank0"), &v1, NULL, NULL), HVD_OK);
  ck_assert_int_eq(rdzv_client_cas(cli, "lock", "owner", 0, S("rank1"), NULL, &cur, &seen),
                   HVD_ERR_CONFLICT);
  ck_assert_str_eq(cur.data, "rank0");
  ck_assert_uint_eq(seen, v1);
  ck_assert_int_eq(rdzv_client_cas(cli, "lock", "owner", v1 + 1000, S("rank1"), NULL, &cur, &seen),
                   HVD_ERR_CONFLICT);
  ck_assert_int_eq(rdzv_client_cas(cli, "lock", "owner", v1, S("rank1"), &v2, NULL, NULL), HVD_OK);
  ck_assert_uint_gt(v2, v1);
  ck_assert_int_eq(rdzv_client_cas(cli, "lock", "absent", 5, S("x"), NULL, &cur, &seen),
                   HVD_ERR_CONFLICT);
  ck_assert_uint_eq(seen, 0);
  ck_assert_uint_eq(cur.len, 0);

  ck_assert_int_eq(rdzv_client_delete_scope(cli, "peers"), HVD_OK);
  ck_assert_int_eq(rdzv_client_get_scope(cli, "peers", 0, 1000, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 0);
  rdzv_scope_view_fini(&view);
  hvd_buf_fini(&cur);
}
END_TEST

struct waiter_thread {
  pthread_t thread;
  int64_t timeout_ms; /* 0: 20 s */
  const char *scope;
  const char *key;
  size_t count;
  int port;
  hvd_status status;
  char value[64];
  size_t entries;
};

static void *waiter_main(void *arg) {
  struct waiter_thread *t = arg;
  struct rdzv_client *c = NULL;
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  t->status = rdzv_client_create("127.0.0.1", t->port, NULL,
                                 t->timeout_ms > 0 ? t->timeout_ms : 20000, &c);
  if (t->status == HVD_OK && t->key != NULL) {
    t->status = rdzv_client_wait(c, t->scope, t->key, -1, &v);
    if (t->status == HVD_OK)
      snprintf(t->value, sizeof(t->value), "%s", v.data);
  } else if (t->status == HVD_OK) {
    struct rdzv_scope_view view;
    t->status = rdzv_client_get_scope(c, t->scope, t->count, -1, &view);
    if (t->status == HVD_OK) {
      t->entries = view.count;
      rdzv_scope_view_fini(&view);
    }
  }
  hvd_buf_fini(&v);
  rdzv_client_destroy(c);
  return NULL;
}

START_TEST(http_long_poll_gets_value_put_later) {
  struct waiter_thread key_waiter = {.scope = "s", .key = "late", .port = rdzv_server_port(srv)};
  struct waiter_thread scope_waiter = {.scope = "s", .count = 2, .port = rdzv_server_port(srv)};
  struct rdzv_store_stats stats;

  pthread_create(&key_waiter.thread, NULL, waiter_main, &key_waiter);
  pthread_create(&scope_waiter.thread, NULL, waiter_main, &scope_waiter);
  /* Both are parked on the server before anything is written. */
  for (int i = 0; i < 1000; i++) {
    rdzv_store_get_stats(rdzv_server_store(srv), &stats);
    if (stats.waiters == 2)
      break;
    hvd_sleep_ns(5000000);
  }
  ck_assert_uint_eq(stats.waiters, 2);
  ck_assert_int_eq(rdzv_client_set(cli, "s", "late", S("arrived")), HVD_OK);
  pthread_join(key_waiter.thread, NULL);
  ck_assert_int_eq(key_waiter.status, HVD_OK);
  ck_assert_str_eq(key_waiter.value, "arrived");
  ck_assert_int_eq(rdzv_client_set(cli, "s", "second", S("x")), HVD_OK);
  pthread_join(scope_waiter.thread, NULL);
  ck_assert_int_eq(scope_waiter.status, HVD_OK);
  ck_assert_uint_eq(scope_waiter.entries, 2);
}
END_TEST

START_TEST(http_wait_deadline) {
  struct hvd_buf v;
  const char *keys[] = {"a", "b"};

  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_client_wait(cli, "s", "never", 200, &v), HVD_ERR_TIMEOUT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "did not appear"));
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HOROVOD_GLOO_TIMEOUT_SECONDS"));
  ck_assert_int_eq(rdzv_client_set(cli, "s", "a", S("1")), HVD_OK);
  ck_assert_int_eq(rdzv_client_wait_keys(cli, "s", keys, 2, 200), HVD_ERR_TIMEOUT);
  ck_assert_int_eq(rdzv_client_set(cli, "s", "b", S("2")), HVD_OK);
  ck_assert_int_eq(rdzv_client_wait_keys(cli, "s", keys, 2, 200), HVD_OK);
  hvd_buf_fini(&v);
}
END_TEST

START_TEST(http_planned_scope_over_http) {
  struct hvd_buf v;
  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_store_plan(rdzv_server_store(srv), S("global"), 2), HVD_OK);
  ck_assert_int_eq(rdzv_client_set(cli, "global", "0", S("a")), HVD_OK);
  ck_assert_int_eq(rdzv_client_set(cli, "global", "1", S("b")), HVD_OK);
  ck_assert_int_eq(rdzv_client_delete(cli, "global", "0"), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(cli, "global", "0", &v, NULL), HVD_OK);
  ck_assert_int_eq(rdzv_client_delete(cli, "global", "1"), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(cli, "global", "0", &v, NULL), HVD_ERR_NOT_FOUND);
  ck_assert_int_eq(rdzv_client_get(cli, "global", "1", &v, NULL), HVD_ERR_NOT_FOUND);
  hvd_buf_fini(&v);
}
END_TEST

/* Health requests that arrive while the server is still starting: the
 * first one may be served before rdzv_server_start returns (a data race on
 * the daemon's pointer once, which ThreadSanitizer saw). */
static int race_port;
static atomic_int race_ok;
static atomic_bool race_stop;

static void *health_hammer(void *arg) {
  static const char req[] = "GET /_health HTTP/1.1\r\nHost: x\r\n\r\n";
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  (void)arg;
  sin.sin_port = htons((uint16_t)race_port);
  while (!atomic_load(&race_stop)) {
    struct response r;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      break;
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0) {
      send_all(fd, req, sizeof(req) - 1);
      if (read_response(fd, &r) == 200)
        atomic_fetch_add(&race_ok, 1);
    }
    close(fd);
  }
  return NULL;
}

static void race_port_cfg(struct rdzv_server_config *cfg) { cfg->port = race_port; }

START_TEST(http_health_while_starting) {
  pthread_t th;
  struct rdzv_server *s;
  race_port = free_port();
  atomic_store(&race_ok, 0);
  atomic_store(&race_stop, false);
  ck_assert_int_eq(pthread_create(&th, NULL, health_hammer, NULL), 0);
  s = start_server_with(NULL, race_port_cfg);
  for (int i = 0; i < 1000 && atomic_load(&race_ok) == 0; i++)
    hvd_sleep_ns(10 * 1000000LL);
  atomic_store(&race_stop, true);
  pthread_join(th, NULL);
  ck_assert_int_gt(atomic_load(&race_ok), 0);
  rdzv_server_stop(s);
}
END_TEST

/* Slow clients (a byte at a time, never a whole request) fill every
 * connection slot; each is closed at its header deadline, so a rank still
 * gets in and completes its rendezvous. */
enum { SLOW_CLIENTS = 600, SLOTS = 500 };
static atomic_bool trickle_stop;

static void *trickle(void *arg) {
  int *fds = arg;
  while (!atomic_load(&trickle_stop)) {
    for (int i = 0; i < SLOW_CLIENTS; i++)
      (void)send(fds[i], "G", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    hvd_sleep_ns(200 * 1000000LL);
  }
  return NULL;
}

static void few_slots(struct rdzv_server_config *cfg) {
  cfg->max_connections = SLOTS;
  cfg->max_connections_per_address = SLOTS; /* every client is 127.0.0.1 here */
  cfg->header_timeout_ms = 1000;
}

START_TEST(http_slow_clients_do_not_lock_ranks_out) {
  struct rdzv_server *s = start_server_with(NULL, few_slots);
  int port = rdzv_server_port(s), *fds = calloc(SLOW_CLIENTS, sizeof(int)), closed = 0;
  struct rdzv_client *c;
  struct hvd_buf v, health;
  pthread_t th;
  cJSON *doc;

  ck_assert_ptr_nonnull(fds);
  for (int i = 0; i < SLOW_CLIENTS; i++)
    fds[i] = connect_to(port);
  atomic_store(&trickle_stop, false);
  ck_assert_int_eq(pthread_create(&th, NULL, trickle, fds), 0);
  hvd_sleep_ns(300 * 1000000LL); /* every slot taken */
  c = client_for(s, NULL, 30000);
  hvd_buf_init(&v, 0);
  hvd_buf_init(&health, 0);
  ck_assert_msg(rdzv_client_set(c, "job", "rank0", S("here")) == HVD_OK, "%s",
                hvd_last_error_message());
  ck_assert_int_eq(rdzv_client_get(c, "job", "rank0", &v, NULL), HVD_OK);
  ck_assert_str_eq(v.data, "here");
  atomic_store(&trickle_stop, true);
  pthread_join(th, NULL);
  /* Those past the slots made room (a 503) for later ones, the rest missed
   * their deadline. */
  for (int i = 0; i < SLOW_CLIENTS; i++) {
    closed += ends(fds[i]);
    close(fds[i]);
  }
  ck_assert_int_eq(closed, SLOW_CLIENTS);
  ck_assert_int_eq(rdzv_client_health(c, &health), HVD_OK);
  doc = cJSON_Parse(health.data);
  ck_assert_ptr_nonnull(doc);
  ck_assert_int_ge(cJSON_GetObjectItem(doc, "slow_connections_closed")->valueint, SLOTS - 10);
  ck_assert_int_ge(cJSON_GetObjectItem(doc, "connections_evicted")->valueint,
                   SLOW_CLIENTS - SLOTS);
  cJSON_Delete(doc);
  rdzv_client_destroy(c);
  rdzv_server_stop(s);
  hvd_buf_fini(&v);
  hvd_buf_fini(&health);
  free(fds);
}
END_TEST

/* Silent connections that squat on the connection limits without the
 * token, and reopen at once each one the server closes (issue 38): from
 * 127.0.0.1 they used to hold a one-host job's ranks out of the store. */
enum { SQUAT_QUOTA = 64, SQUAT_RANKS = 4, SQUAT_REQUESTS = 12 };

struct squatter {
  int port;
  const char *sources[2];
  int nsources;
  atomic_bool stop;
  atomic_int connected; /* connections open now */
  atomic_long reopened; /* connections opened after the server closed one */
};

/* A connection from source, or -1; no assertions (it runs on a thread). */
static int squat_connect(int port, const char *source) {
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  struct sockaddr_in from = {.sin_family = AF_INET};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  if (fd < 0)
    return -1;
  if (inet_pton(AF_INET, source, &from.sin_addr) != 1 ||
      bind(fd, (struct sockaddr *)&from, sizeof(from)) != 0 ||
      connect(fd, (struct sockaddr *)&to, sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void *squatter_main(void *arg) {
  struct squatter *sq = arg;
  enum { N = 2 * SQUAT_QUOTA };
  struct pollfd p[N];
  int n = sq->nsources * SQUAT_QUOTA;
  bool filled = false;

  for (int i = 0; i < n; i++)
    p[i] = (struct pollfd){.fd = -1, .events = POLLIN | POLLRDHUP};
  while (!atomic_load(&sq->stop)) {
    int open = 0;
    for (int i = 0; i < n; i++) {
      /* It sends nothing, so anything it reads (a 503, the end) means the
       * server let go of it. */
      if (p[i].fd >= 0 && p[i].revents == 0)
        continue;
      if (p[i].fd >= 0) {
        close(p[i].fd);
        atomic_fetch_add(&sq->reopened, 1);
      }
      p[i].fd = squat_connect(sq->port, sq->sources[i % sq->nsources]);
      p[i].revents = 0;
    }
    for (int i = 0; i < n; i++)
      open += p[i].fd >= 0;
    if (!filled && open == n)
      filled = true;
    atomic_store(&sq->connected, filled ? open : 0);
    if (poll(p, (nfds_t)n, 20) < 0 && errno != EINTR)
      break;
  }
  for (int i = 0; i < n; i++) {
    if (p[i].fd >= 0)
      close(p[i].fd);
  }
  return NULL;
}

struct squat_rank {
  int port, id;
  int served;        /* requests answered as they should be */
  char error[256];   /* the first failure */
};

/* Each request on a fresh connection, which has not shown the token until
 * its request arrives: the case the squatters could crowd out. */
static void *squat_rank_main(void *arg) {
  struct squat_rank *r = arg;
  char key[16], want[16];
  struct hvd_buf v;
  int64_t sum = 0;

  hvd_buf_init(&v, 0);
  snprintf(key, sizeof(key), "r%d", r->id);
  for (int i = 0; i < SQUAT_REQUESTS; i++) {
    struct rdzv_client *c = NULL;
    hvd_status st = rdzv_client_create("127.0.0.1", r->port, "tok", 20000, &c);
    if (st == HVD_OK) {
      switch (i % 3) {
      case 0:
        snprintf(want, sizeof(want), "v%d", i);
        st = rdzv_client_set(c, "squat", key, S(want));
        break;
      case 1:
        st = rdzv_client_get(c, "squat", key, &v, NULL);
        if (st == HVD_OK && (v.len != strlen(want) || memcmp(v.data, want, v.len) != 0))
          st = HVD_ERR_INTERNAL;
        break;
      default:
        st = rdzv_client_add(c, "squat", "sum", 1, &sum);
        break;
      }
    }
    if (st == HVD_OK)
      r->served++;
    else if (r->error[0] == '\0')
      snprintf(r->error, sizeof(r->error), "rank %d request %d: %s", r->id, i,
               hvd_last_error_message());
    rdzv_client_destroy(c);
  }
  hvd_buf_fini(&v);
  return NULL;
}

static unsigned squat_max_connections;

static void squat_limits(struct rdzv_server_config *cfg) {
  cfg->max_connections = squat_max_connections;
  cfg->max_connections_per_address = SQUAT_QUOTA;
}

/* Squatters from sources fill a limit; ranks from 127.0.0.1 meanwhile make
 * requests, each on a new connection, and every one must be served. */
static void squat_and_serve(const char *const *sources, int nsources, unsigned max_connections) {
  struct squatter sq = {.nsources = nsources};
  struct squat_rank ranks[SQUAT_RANKS];
  pthread_t sq_thread, rank_threads[SQUAT_RANKS];
  struct rdzv_server *s;
  struct rdzv_client *c;
  struct hvd_buf v;
  int64_t deadline;
  double held;
  int served = 0;

  squat_max_connections = max_connections;
  s = start_server_with("tok", squat_limits);
  sq.port = rdzv_server_port(s);
  for (int i = 0; i < nsources; i++)
    sq.sources[i] = sources[i];
  ck_assert_int_eq(pthread_create(&sq_thread, NULL, squatter_main, &sq), 0);
  /* Every squatter connected, and the server holding them all. */
  deadline = hvd_deadline_after_ms(20000);
  while (atomic_load(&sq.connected) < nsources * SQUAT_QUOTA && hvd_now_ns() < deadline)
    hvd_sleep_ns(10 * 1000000LL);
  ck_assert_int_eq(atomic_load(&sq.connected), nsources * SQUAT_QUOTA);
  /* (The probe counts itself, in a slot it took from a squatter; it may
   * itself be displaced by the squatters' reopening: -1.) */
  while ((held = health_number(sq.port, "connections")) < nsources * SQUAT_QUOTA &&
         hvd_now_ns() < deadline)
    hvd_sleep_ns(10 * 1000000LL);
  ck_assert_int_ge(held, nsources * SQUAT_QUOTA);

  for (int i = 0; i < SQUAT_RANKS; i++) {
    ranks[i] = (struct squat_rank){.port = sq.port, .id = i};
    ck_assert_int_eq(pthread_create(&rank_threads[i], NULL, squat_rank_main, &ranks[i]), 0);
  }
  for (int i = 0; i < SQUAT_RANKS; i++) {
    pthread_join(rank_threads[i], NULL);
    ck_assert_msg(ranks[i].served == SQUAT_REQUESTS, "%d of %d served; %s", ranks[i].served,
                  SQUAT_REQUESTS, ranks[i].error);
    served += ranks[i].served;
  }
  ck_assert_int_eq(served, SQUAT_RANKS * SQUAT_REQUESTS);
  /* The squatters were displaced, not the ranks, and kept coming back. */
  deadline = hvd_deadline_after_ms(10000);
  while (atomic_load(&sq.reopened) == 0 && hvd_now_ns() < deadline)
    hvd_sleep_ns(10 * 1000000LL);
  ck_assert_int_gt(atomic_load(&sq.reopened), 0);
  atomic_store(&sq.stop, true);
  pthread_join(sq_thread, NULL);
  c = client_for(s, "tok", 20000);
  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_client_get(c, "squat", "sum", &v, NULL), HVD_OK);
  ck_assert_int_eq(atoi(v.data), SQUAT_RANKS * (SQUAT_REQUESTS / 3));
  ck_assert_int_ge(health_number(sq.port, "connections_evicted"), 1);
  hvd_buf_fini(&v);
  rdzv_client_destroy(c);
  rdzv_server_stop(s);
}

/* The per-address quota full of squatters from the ranks' own address. */
START_TEST(http_squatters_on_the_address_quota) {
  static const char *const local[] = {"127.0.0.1"};
  squat_and_serve(local, 1, 1024);
}
END_TEST

/* Every connection slot full of squatters from other loopback addresses
 * (each within its quota), none from the ranks' address. */
START_TEST(http_squatters_on_every_slot) {
  static const char *const others[] = {"127.0.0.2", "127.0.0.3"};
  squat_and_serve(others, 2, 2 * SQUAT_QUOTA);
}
END_TEST

START_TEST(http_health) {
  struct hvd_buf json;
  cJSON *doc;

  hvd_buf_init(&json, 0);
  ck_assert_int_eq(rdzv_client_set(cli, "s", "k", S("v")), HVD_OK);
  ck_assert_int_eq(rdzv_client_health(cli, &json), HVD_OK);
  doc = cJSON_Parse(json.data);
  ck_assert_ptr_nonnull(doc);
  ck_assert_str_eq(cJSON_GetObjectItem(doc, "status")->valuestring, "ok");
  ck_assert_int_eq(cJSON_GetObjectItem(doc, "keys")->valueint, 1);
  ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(doc, "token_required")));
  cJSON_Delete(doc);
  hvd_buf_fini(&json);
}
END_TEST

START_TEST(http_client_reuses_its_connection) {
  struct hvd_buf json;
  struct hvd_buf v;
  cJSON *doc;

  hvd_buf_init(&json, 0);
  hvd_buf_init(&v, 0);
  for (int i = 0; i < 20; i++) {
    ck_assert_int_eq(rdzv_client_set(cli, "s", "k", S("v")), HVD_OK);
    ck_assert_int_eq(rdzv_client_get(cli, "s", "k", &v, NULL), HVD_OK);
    ck_assert_int_eq(rdzv_client_get(cli, "s", "missing", &v, NULL), HVD_ERR_NOT_FOUND);
  }
  ck_assert_int_eq(rdzv_client_wait(cli, "s", "missing", 10, &v), HVD_ERR_TIMEOUT);
  ck_assert_int_eq(rdzv_client_health(cli, &json), HVD_OK);
  doc = cJSON_Parse(json.data);
  ck_assert_ptr_nonnull(doc);
  /* 62 requests so far, all over one keep-alive connection. */
  ck_assert_int_eq(cJSON_GetObjectItem(doc, "connections")->valueint, 1);
  ck_assert_int_ge(cJSON_GetObjectItem(doc, "requests")->valueint, 62);
  cJSON_Delete(doc);
  hvd_buf_fini(&json);
  hvd_buf_fini(&v);
}
END_TEST

START_TEST(http_no_server_fails_with_clear_message) {
  struct rdzv_client *c = NULL;
  int port = free_port();
  char where[64];

  ck_assert_int_eq(rdzv_client_create("127.0.0.1", port, NULL, 300, &c), HVD_OK);
  ck_assert_int_eq(rdzv_client_set(c, "s", "k", S("v")), HVD_ERR_NETWORK);
  snprintf(where, sizeof(where), "127.0.0.1:%d", port);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), where));
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "PUT /s/k"));
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HOROVOD_GLOO_TIMEOUT_SECONDS"));
  rdzv_client_destroy(c);
}
END_TEST

struct late_client {
  int port;
  hvd_status set, get;
  char value[16];
};

static void *late_client_main(void *arg) {
  struct late_client *lc = arg;
  struct rdzv_client *c = NULL;
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  lc->set = rdzv_client_create("127.0.0.1", lc->port, NULL, 20000, &c);
  if (lc->set == HVD_OK)
    lc->set = rdzv_client_set(c, "s", "k", S("v"));
  if (lc->set == HVD_OK && (lc->get = rdzv_client_get(c, "s", "k", &v, NULL)) == HVD_OK)
    snprintf(lc->value, sizeof(lc->value), "%s", v.data);
  rdzv_client_destroy(c);
  hvd_buf_fini(&v);
  return NULL;
}

/* A client whose server is not up yet retries until it is: the server
 * starts only once the client has logged a refused attempt. */
START_TEST(http_client_waits_for_late_server) {
  struct late_client lc = {.port = free_port(), .get = HVD_ERR_INTERNAL};
  enum hvd_log_level level = hvd_log_get_level();
  struct rdzv_server_config cfg;
  struct rdzv_server *late = NULL;
  int logs[2], saved_stderr = dup(2);
  char seen[4096];
  size_t len = 0;
  pthread_t t;

  ck_assert_int_eq(pipe(logs), 0);
  ck_assert_int_eq(dup2(logs[1], 2), 2);
  hvd_log_set_level(HVD_LOG_DEBUG);
  pthread_create(&t, NULL, late_client_main, &lc);
  seen[0] = '\0';
  while (strstr(seen, "retrying") == NULL && len < sizeof(seen) - 1) {
    struct pollfd p = {.fd = logs[0], .events = POLLIN};
    ssize_t n;
    if (poll(&p, 1, 20000) <= 0 || (n = read(logs[0], seen + len, sizeof(seen) - 1 - len)) <= 0)
      break;
    len += (size_t)n;
    seen[len] = '\0';
  }
  hvd_log_set_level(level);
  dup2(saved_stderr, 2);
  close(saved_stderr);
  close(logs[1]);
  ck_assert_msg(strstr(seen, "retrying") != NULL, "the client logged no retry: %s", seen);

  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  cfg.port = lc.port;
  ck_assert_msg(rdzv_server_start(&cfg, &late) == HVD_OK, "%s", hvd_last_error_message());
  pthread_join(t, NULL);
  close(logs[0]);
  ck_assert_int_eq(lc.set, HVD_OK);
  ck_assert_int_eq(lc.get, HVD_OK);
  ck_assert_str_eq(lc.value, "v");
  rdzv_server_stop(late);
}
END_TEST

START_TEST(http_token) {
  struct rdzv_server *secured = start_server_with("s3cret", NULL);
  struct rdzv_client *none = client_for(secured, NULL, 2000);
  struct rdzv_client *wrong = client_for(secured, "guess", 2000);
  struct rdzv_client *right = client_for(secured, "s3cret", 2000);
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_client_set(none, "s", "k", S("v")), HVD_ERR_UNAUTHORIZED);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "401"));
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HVD_TOKEN"));
  ck_assert_int_eq(rdzv_client_set(wrong, "s", "k", S("v")), HVD_ERR_UNAUTHORIZED);
  ck_assert_int_eq(rdzv_client_get(wrong, "s", "k", &v, NULL), HVD_ERR_UNAUTHORIZED);
  ck_assert_int_eq(rdzv_client_set(right, "s", "k", S("v")), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(right, "s", "k", &v, NULL), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(none, "s", "k", &v, NULL), HVD_ERR_UNAUTHORIZED);
  /* Health probes need no token. */
  ck_assert_int_eq(rdzv_client_health(none, &v), HVD_OK);
  ck_assert_ptr_nonnull(strstr(v.data, "\"token_required\":true"));
  rdzv_client_destroy(none);
  rdzv_client_destroy(wrong);
  rdzv_client_destroy(right);
  rdzv_server_stop(secured);
  hvd_buf_fini(&v);

  /* A server without a token accepts requests that carry one. */
  ck_assert_int_eq(rdzv_client_set(cli, "s", "k", S("v")), HVD_OK);
}
END_TEST

static void small_limits(struct rdzv_server_config *cfg) {
  cfg->limits.max_value_bytes = 1024;
  cfg->limits.max_total_bytes = 8192;
}

START_TEST(http_limits) {
  struct rdzv_server *small = start_server_with(NULL, small_limits);
  struct rdzv_client *c = client_for(small, NULL, 2000);
  char big[2000];
  hvd_status st = HVD_OK;

  memset(big, 'x', sizeof(big));
  ck_assert_int_eq(rdzv_client_set(c, "s", "k", big, sizeof(big)), HVD_ERR_TOO_LARGE);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "413"));
  ck_assert_int_eq(rdzv_client_set(c, "s", "k", big, 1024), HVD_OK);
  for (int i = 0; i < 20 && st == HVD_OK; i++) {
    char key[8];
    snprintf(key, sizeof(key), "%d", i);
    st = rdzv_client_set(c, "s", key, big, 1000);
  }
  ck_assert_int_eq(st, HVD_ERR_TOO_LARGE);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "507"));
  /* Still serving. */
  ck_assert_int_eq(rdzv_client_delete_scope(c, "s"), HVD_OK);
  ck_assert_int_eq(rdzv_client_set(c, "s", "k", "v", 1), HVD_OK);
  rdzv_client_destroy(c);
  rdzv_server_stop(small);
}
END_TEST

START_TEST(http_client_from_env) {
  struct rdzv_client *c = NULL;
  char port[16];

  unsetenv("HOROVOD_GLOO_RENDEZVOUS_ADDR");
  ck_assert_int_eq(rdzv_client_create_from_env(&c), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HOROVOD_GLOO_RENDEZVOUS_ADDR"));
  setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1", 1);
  unsetenv("HOROVOD_GLOO_RENDEZVOUS_PORT");
  ck_assert_int_eq(rdzv_client_create_from_env(&c), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HOROVOD_GLOO_RENDEZVOUS_PORT"));
  setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", "80x", 1);
  ck_assert_int_eq(rdzv_client_create_from_env(&c), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "80x"));
  snprintf(port, sizeof(port), "%d", rdzv_server_port(srv));
  setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", port, 1);
  setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "0", 1);
  ck_assert_int_eq(rdzv_client_create_from_env(&c), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HOROVOD_GLOO_TIMEOUT_SECONDS"));
  setenv("HOROVOD_GLOO_TIMEOUT_SECONDS", "7", 1);
  ck_assert_int_eq(rdzv_client_create_from_env(&c), HVD_OK);
  ck_assert_int_eq(rdzv_client_timeout_ms(c), 7000);
  ck_assert_int_eq(rdzv_client_set(c, "s", "k", S("v")), HVD_OK);
  rdzv_client_destroy(c);
}
END_TEST

START_TEST(http_shutdown_answers_waiters) {
  struct waiter_thread w = {
      .scope = "s", .key = "never", .port = rdzv_server_port(srv), .timeout_ms = 3000};
  struct rdzv_store_stats stats;

  pthread_create(&w.thread, NULL, waiter_main, &w);
  for (int i = 0; i < 1000; i++) {
    rdzv_store_get_stats(rdzv_server_store(srv), &stats);
    if (stats.waiters == 1)
      break;
    hvd_sleep_ns(5000000);
  }
  ck_assert_uint_eq(stats.waiters, 1);
  rdzv_client_destroy(cli);
  cli = NULL;
  rdzv_server_stop(srv);
  srv = start_server(); /* for the teardown */
  cli = client_for(srv, NULL, 1000);
  pthread_join(w.thread, NULL);
  /* The server answers its waiting clients before it closes. */
  ck_assert_msg(w.status == HVD_ERR_ABORTED, "%s", hvd_strerror(w.status));
}
END_TEST

/* ---- cancelling a call through a file descriptor ------------------------------ */

/* A client call in a thread of its own, on a client with a cancel fd. */
struct cancel_thread {
  pthread_t thread;
  struct rdzv_client *client;
  const char *op; /* "wait", "scope" or "set" */
  const char *key;
  int64_t timeout_ms;
  hvd_status status;
  char value[64];
  char message[HVD_ERROR_MESSAGE_MAX];
};

static void *cancel_main(void *arg) {
  struct cancel_thread *t = arg;
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  if (strcmp(t->op, "wait") == 0) {
    t->status = rdzv_client_wait(t->client, "c", t->key, t->timeout_ms, &v);
    if (t->status == HVD_OK)
      snprintf(t->value, sizeof(t->value), "%s", v.data);
  } else if (strcmp(t->op, "scope") == 0) {
    struct rdzv_scope_view view;
    t->status = rdzv_client_get_scope(t->client, "c", 1000, t->timeout_ms, &view);
    if (t->status == HVD_OK)
      rdzv_scope_view_fini(&view);
  } else {
    t->status = rdzv_client_set(t->client, "c", t->key, S("v"));
  }
  /* The message lives in this thread. */
  snprintf(t->message, sizeof(t->message), "%s", hvd_last_error_message());
  hvd_buf_fini(&v);
  return NULL;
}

static int cancel_eventfd(void) {
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ck_assert_int_ge(fd, 0);
  return fd;
}

static void fire(int fd) {
  uint64_t one = 1;
  ck_assert_int_eq(write(fd, &one, sizeof(one)), (ssize_t)sizeof(one));
}

static void drain(int fd) {
  uint64_t n;
  ck_assert_int_eq(read(fd, &n, sizeof(n)), (ssize_t)sizeof(n));
}

/* Until the server holds n parked long-polls (a generous deadline). */
static void await_waiters(size_t n) {
  struct rdzv_store_stats stats;
  int64_t deadline = hvd_deadline_after_ms(20000);
  do {
    rdzv_store_get_stats(rdzv_server_store(srv), &stats);
    if (stats.waiters == n)
      return;
    hvd_sleep_ns(5000000);
  } while (hvd_now_ns() < deadline);
  ck_assert_uint_eq(stats.waiters, n);
}

/* A long-poll that would last 30 s ends as cancelled when the fd becomes
 * readable, and the client is usable again afterwards. */
START_TEST(http_cancel_fd_ends_long_poll) {
  int efd = cancel_eventfd();
  struct cancel_thread t = {.op = "wait", .key = "never", .timeout_ms = 30000};
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  t.client = client_for(srv, NULL, 30000);
  ck_assert_int_eq(rdzv_client_set_cancel_fd(t.client, efd), HVD_OK);
  pthread_create(&t.thread, NULL, cancel_main, &t);
  await_waiters(1);
  fire(efd);
  pthread_join(t.thread, NULL);
  ck_assert_msg(t.status == HVD_ERR_ABORTED, "%s: %s", hvd_strerror(t.status), t.message);
  ck_assert_ptr_nonnull(strstr(t.message, "cancelled"));
  ck_assert_ptr_nonnull(strstr(t.message, "/c/never"));

  /* The same client, the fd drained: its connection was left mid-answer,
   * the next calls must not trip over it. */
  drain(efd);
  ck_assert_int_eq(rdzv_client_set(t.client, "c", "k", S("after")), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(t.client, "c", "k", &v, NULL), HVD_OK);
  ck_assert_str_eq(v.data, "after");
  ck_assert_int_eq(rdzv_client_wait(t.client, "c", "k", 1000, &v), HVD_OK);
  ck_assert_str_eq(v.data, "after");
  rdzv_client_destroy(t.client);
  close(efd);
  hvd_buf_fini(&v);
}
END_TEST

/* While the fd is set but not readable, every kind of call works as
 * without it (transfers run through the multi handle). */
START_TEST(http_cancel_fd_idle_calls_work) {
  int efd = cancel_eventfd();
  struct rdzv_client *c = client_for(srv, NULL, 10000);
  struct cancel_thread t = {.op = "wait", .key = "later", .timeout_ms = 20000};
  struct rdzv_scope_view view;
  struct hvd_buf v;
  uint64_t version = 0, v2 = 0;
  int64_t n = 0;

  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_client_set_cancel_fd(c, efd), HVD_OK);
  ck_assert_int_eq(rdzv_client_set(c, "c", "a", S("1")), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(c, "c", "a", &v, &version), HVD_OK);
  ck_assert_str_eq(v.data, "1");
  ck_assert_uint_gt(version, 0);
  ck_assert_int_eq(rdzv_client_get(c, "c", "missing", &v, NULL), HVD_ERR_NOT_FOUND);
  ck_assert_int_eq(rdzv_client_wait(c, "c", "a", 1000, &v), HVD_OK);
  ck_assert_str_eq(v.data, "1");
  /* A timeout is still a timeout, not a cancel. */
  ck_assert_int_eq(rdzv_client_wait(c, "c", "never", 200, &v), HVD_ERR_TIMEOUT);
  ck_assert_int_eq(rdzv_client_add(c, "c", "n", 5, &n), HVD_OK);
  ck_assert_int_eq(n, 5);
  ck_assert_int_eq(rdzv_client_cas(c, "c", "a", version, S("2"), &v2, NULL, NULL), HVD_OK);
  ck_assert_uint_gt(v2, version);
  ck_assert_int_eq(rdzv_client_get_scope(c, "c", 2, 1000, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 2);
  ck_assert_str_eq((char *)rdzv_scope_find(&view, "a")->value, "2");
  rdzv_scope_view_fini(&view);
  ck_assert_int_eq(rdzv_client_delete(c, "c", "a"), HVD_OK);
  ck_assert_int_eq(rdzv_client_get(c, "c", "a", &v, NULL), HVD_ERR_NOT_FOUND);

  /* A long-poll on a client with a cancel fd is answered by another
   * client's write. */
  t.client = c;
  pthread_create(&t.thread, NULL, cancel_main, &t);
  await_waiters(1);
  ck_assert_int_eq(rdzv_client_set(cli, "c", "later", S("arrived")), HVD_OK);
  pthread_join(t.thread, NULL);
  ck_assert_msg(t.status == HVD_OK, "%s: %s", hvd_strerror(t.status), t.message);
  ck_assert_str_eq(t.value, "arrived");

  /* Back to no fd: the plain path. */
  ck_assert_int_eq(rdzv_client_set_cancel_fd(c, -1), HVD_OK);
  fire(efd); /* no longer watched */
  ck_assert_int_eq(rdzv_client_get(c, "c", "later", &v, NULL), HVD_OK);
  ck_assert_str_eq(v.data, "arrived");
  rdzv_client_destroy(c);
  close(efd);
  hvd_buf_fini(&v);
}
END_TEST

/* An fd that is readable before the call starts aborts it. */
START_TEST(http_cancel_fd_already_readable) {
  int efd = cancel_eventfd();
  struct rdzv_client *c = client_for(srv, NULL, 30000);
  struct rdzv_scope_view view;
  const char *keys[] = {"x", "y"};
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_client_set_cancel_fd(c, efd), HVD_OK);
  fire(efd);
  ck_assert_int_eq(rdzv_client_wait(c, "c", "never", 30000, &v), HVD_ERR_ABORTED);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "cancelled"));
  ck_assert_int_eq(rdzv_client_wait(c, "c", "never", -1, &v), HVD_ERR_ABORTED);
  ck_assert_int_eq(rdzv_client_get_scope(c, "c", 1000, 30000, &view), HVD_ERR_ABORTED);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "cancelled"));
  ck_assert_int_eq(rdzv_client_wait_keys(c, "c", keys, 2, 30000), HVD_ERR_ABORTED);
  /* The fd is not read: it stays readable until its owner drains it. */
  drain(efd);
  ck_assert_int_eq(rdzv_client_set(c, "c", "x", S("1")), HVD_OK);
  ck_assert_int_eq(rdzv_client_wait(c, "c", "x", 1000, &v), HVD_OK);
  ck_assert_str_eq(v.data, "1");
  rdzv_client_destroy(c);
  close(efd);
  hvd_buf_fini(&v);
}
END_TEST

/* A call that keeps retrying a server that is not there (refused
 * connections, backoff) also ends when the fd becomes readable. */
START_TEST(http_cancel_fd_while_server_unreachable) {
  int efd = cancel_eventfd();
  struct cancel_thread t = {.op = "set", .key = "k"};

  ck_assert_int_eq(rdzv_client_create("127.0.0.1", free_port(), NULL, 30000, &t.client), HVD_OK);
  ck_assert_int_eq(rdzv_client_set_cancel_fd(t.client, efd), HVD_OK);
  pthread_create(&t.thread, NULL, cancel_main, &t);
  hvd_sleep_ns(300 * 1000000LL); /* some refused attempts first (not needed to pass) */
  fire(efd);
  pthread_join(t.thread, NULL);
  ck_assert_msg(t.status == HVD_ERR_ABORTED, "%s: %s", hvd_strerror(t.status), t.message);
  ck_assert_ptr_nonnull(strstr(t.message, "cancelled"));
  rdzv_client_destroy(t.client);
  close(efd);
}
END_TEST

/* ==== robustness (raw sockets) =============================================== */

START_TEST(raw_http10_and_keepalive) {
  struct response r;
  int fd, port = rdzv_server_port(srv);

  ck_assert_int_eq(rdzv_client_set(cli, "s", "k", S("hello")), HVD_OK);
  /* HTTP/1.0: one request, then the server closes. */
  fd = connect_to(port);
  send_all(fd, S("GET /s/k HTTP/1.0\r\n\r\n"));
  ck_assert_int_eq(read_response(fd, &r), 200);
  ck_assert(r.has_length);
  ck_assert_str_eq(r.body, "hello");
  ck_assert(closed_by_peer(fd));
  close(fd);
  /* HTTP/1.0 PUT without a Host header, as the simplest clients send it. */
  ck_assert_int_eq(raw_exchange(port, "PUT /s/k2 HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc", &r),
                   200);
  ck_assert(r.has_length);
  /* HTTP/1.1 keep-alive: several requests on one connection. */
  fd = connect_to(port);
  send_all(fd, S("GET /s/k2 HTTP/1.1\r\nHost: x\r\n\r\n"));
  ck_assert_int_eq(read_response(fd, &r), 200);
  ck_assert_str_eq(r.body, "abc");
  send_all(fd, S("PUT /s/k3 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nzz"));
  ck_assert_int_eq(read_response(fd, &r), 200);
  send_all(fd, S("GET /s/missing HTTP/1.1\r\nHost: x\r\n\r\n"));
  ck_assert_int_eq(read_response(fd, &r), 404);
  ck_assert(r.has_length);
  ck_assert_uint_eq(r.body_len, 0);
  send_all(fd, S("HEAD /s/k3 HTTP/1.1\r\nHost: x\r\n\r\n"));
  ck_assert_int_eq(read_response_body(fd, &r, false), 200);
  ck_assert_ptr_nonnull(strstr(r.headers, "Content-Length: 2"));
  ck_assert_uint_eq(r.body_len, 0);
  send_all(fd, S("DELETE /s/k3 HTTP/1.1\r\nHost: x\r\n\r\n"));
  ck_assert_int_eq(read_response(fd, &r), 200);
  close(fd);
}
END_TEST

START_TEST(raw_malformed_requests) {
  static const struct {
    const char *request;
    int code;
  } cases[] = {
      {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/b/c HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/ HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET //b HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /_secret/b HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"PUT /_health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405},
      {"GET /a/b?bogus=1 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/b?wait=abc HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/b?wait=-1 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/b?wait=99999999999 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/b?wait HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a?count=x HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"POST /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 400},
      {"POST /a/b?add=1.5 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 400},
      {"PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", 400},
      {"PUT /a/b HTTP/1.1\r\nHost: x\r\nIf-Match: 12\r\nContent-Length: 1\r\n\r\nx", 400},
      {"PUT /a/b HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"1\"\r\nContent-Length: 1\r\n\r\nx", 400},
      {"BREW /a/b HTTP/1.1\r\nHost: x\r\n\r\n", 405},
      {"OPTIONS /a/b HTTP/1.1\r\nHost: x\r\n\r\n", 405},
      /* Control characters, percent-encoded or not, in names and parameters. */
      {"GET /a/b%00evil HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a%0a/b HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/b%7f HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a%00 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"GET /a/b?wait=5%00 HTTP/1.1\r\nHost: x\r\n\r\n", 400},
      {"PUT /a/b%00 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", 400},
      /* Framing that lets a body be read two ways. */
      {"PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
       400},
      {"PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
       "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n",
       400},
  };
  struct response r;
  int port = rdzv_server_port(srv);

  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++) {
    ck_assert_msg(raw_exchange(port, cases[i].request, &r) == cases[i].code,
                  "case %zu (%s): got %d", i, cases[i].request, r.code);
    ck_assert_msg(r.has_length, "case %zu has no Content-Length", i);
    if (cases[i].code == 405)
      ck_assert_ptr_nonnull(strstr(r.headers, "Allow:"));
    ck_assert_msg(r.body_len > 0, "case %zu has no reason", i);
  }
  ck_assert_int_eq(rdzv_client_set(cli, "still", "ok", S("yes")), HVD_OK);
  /* Nothing was stored under a name cut short at the NUL. */
  ck_assert_int_eq(raw_exchange(port, "GET /a/b HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
}
END_TEST

/* Two Content-Length headers: refused, and the connection closed, so that
 * the rest of the body is never read as a request of its own. */
START_TEST(raw_conflicting_content_length_closes) {
  static const char smuggle[] = "PUT /c/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                                "Content-Length: 44\r\n\r\n"
                                "PUT /c/evil HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
  struct response r;
  int port = rdzv_server_port(srv), fd = connect_to(port);

  send_all(fd, smuggle, sizeof(smuggle) - 1);
  ck_assert_int_eq(read_response(fd, &r), 400);
  ck_assert_ptr_nonnull(strstr(r.body, "Content-Length"));
  ck_assert(closed_by_peer(fd));
  close(fd);
  ck_assert_int_eq(raw_exchange(port, "GET /c/evil HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
  ck_assert_int_eq(raw_exchange(port, "GET /c/k HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
}
END_TEST

static void short_idle(struct rdzv_server_config *cfg) { cfg->idle_timeout_s = 1; }

START_TEST(raw_garbage_and_truncation) {
  static const char garbage[] = "\x00\x01\x02garbage\xff\xfe\r\n\r\n";
  struct rdzv_server *impatient = start_server_with(NULL, short_idle);
  struct response r;
  struct hvd_buf v;
  int fd, port = rdzv_server_port(impatient);

  hvd_buf_init(&v, 0);
  /* Garbage: an error answer or a closed connection, never a crash. */
  fd = connect_to(port);
  send_all(fd, garbage, sizeof(garbage) - 1);
  int code = read_response(fd, &r);
  ck_assert(code == 0 || code == 400);
  close(fd);
  fd = connect_to(port);
  send_all(fd, S("\r\n\r\nGET\r\n\r\n"));
  code = read_response(fd, &r);
  ck_assert(code == 0 || code == 400);
  close(fd);
  /* A truncated body is not stored. */
  fd = connect_to(port);
  send_all(fd, S("PUT /t/k HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789"));
  close(fd);
  fd = connect_to(port);
  send_all(fd, S("PUT /t/k2 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabc"));
  close(fd);
  await_health(port, "connections", 1); /* both closed: only the health check's own */
  ck_assert_int_eq(raw_exchange(port, "GET /t/k HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
  ck_assert_int_eq(raw_exchange(port, "GET /t/k2 HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
  /* A complete chunked upload is stored. */
  ck_assert_int_eq(raw_exchange(port,
                                "PUT /t/k3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                                &r),
                   200);
  struct rdzv_client *c = client_for(impatient, NULL, 5000);
  ck_assert_int_eq(rdzv_client_get(c, "t", "k3", &v, NULL), HVD_OK);
  ck_assert_str_eq(v.data, "abcde");
  rdzv_client_destroy(c);
  rdzv_server_stop(impatient);
  hvd_buf_fini(&v);
}
END_TEST

static void tiny_limits(struct rdzv_server_config *cfg) {
  cfg->limits.max_value_bytes = 100;
  cfg->limits.max_name_bytes = 16;
  cfg->idle_timeout_s = 1;
}

START_TEST(raw_oversized_requests) {
  struct rdzv_server *small = start_server_with(NULL, tiny_limits);
  int port = rdzv_server_port(small);
  struct response r;
  char *big_header = malloc(64 * 1024);
  char chunked[512];
  int fd;

  /* Refused from Content-Length alone: the body is never sent. */
  fd = connect_to(port);
  send_all(fd, S("PUT /s/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"));
  ck_assert_int_eq(read_response(fd, &r), 413);
  ck_assert_ptr_nonnull(strstr(r.body, "100 bytes"));
  close(fd);
  /* Chunked bodies have no length up front: refused once they pass the limit. */
  snprintf(chunked, sizeof(chunked),
           "PUT /s/k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           "c8\r\n%0200d\r\n0\r\n\r\n", 0);
  ck_assert_int_eq(raw_exchange(port, chunked, &r), 413);
  ck_assert_int_eq(raw_exchange(port, "GET /s/12345678901234567 HTTP/1.1\r\nHost: x\r\n\r\n", &r),
                   414);
  ck_assert_int_eq(raw_exchange(port, "GET /12345678901234567/k HTTP/1.1\r\nHost: x\r\n\r\n", &r),
                   414);
  int n = snprintf(big_header, 64 * 1024, "GET /s/k HTTP/1.1\r\nHost: x\r\nX-Big: ");
  memset(big_header + n, 'a', 40000);
  strcpy(big_header + n + 40000, "\r\n\r\n");
  ck_assert_int_eq(raw_exchange(port, big_header, &r), 431);
  free(big_header);

  /* A client that stalls mid-request is dropped after the idle timeout. */
  fd = connect_to(port);
  send_all(fd, S("GET /s/k HTT"));
  ck_assert(closed_by_peer(fd));
  close(fd);
  ck_assert_int_eq(raw_exchange(port, "GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
  rdzv_server_stop(small);
}
END_TEST

/* A long-poll whose client hangs up is dropped at once (the guard polls
 * parked connections), not at the end of its wait. */
START_TEST(raw_long_poll_client_leaves) {
  int port = rdzv_server_port(srv);
  struct response r;
  int fd;

  fd = connect_to(port);
  send_all(fd, S("GET /s/never?wait=600000 HTTP/1.1\r\nHost: x\r\n\r\n"));
  await_waiters(1);
  close(fd);
  await_waiters(0);
  fd = connect_to(port);
  send_all(fd, S("GET /s?count=5&wait=600000 HTTP/1.1\r\nHost: x\r\n\r\n"));
  await_waiters(1);
  shutdown(fd, SHUT_RDWR);
  await_waiters(0);
  close(fd);
  ck_assert_int_eq(raw_exchange(port, "GET /s/never HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
  /* A waiter whose client stays is still answered. */
  fd = connect_to(port);
  send_all(fd, S("GET /s/later?wait=20000 HTTP/1.1\r\nHost: x\r\n\r\n"));
  await_waiters(1);
  hvd_sleep_ns(600000000); /* a few of the guard's ticks */
  ck_assert_int_eq(rdzv_client_set(cli, "s", "later", "v", 1), HVD_OK);
  ck_assert_int_eq(read_response(fd, &r), 200);
  ck_assert_str_eq(r.body, "v");
  close(fd);
}
END_TEST

static void bounded_total(struct rdzv_server_config *cfg) {
  cfg->limits.max_value_bytes = 250000;
  cfg->limits.max_total_bytes = 300000;
}

/* Request bodies on their way in count against the store's limit. */
START_TEST(raw_upload_counts_against_the_limit) {
  struct rdzv_server *small = start_server_with(NULL, bounded_total);
  struct rdzv_store *st_small = rdzv_server_store(small);
  int port = rdzv_server_port(small);
  size_t head = 96, size = 200000;
  char *put = malloc(head + size + 1);
  char *partial = malloc(head + size);
  struct rdzv_store_stats stats;
  struct response r;
  int64_t deadline = hvd_deadline_after_ms(20000);
  int n, fd;

  n = snprintf(put, head, "PUT /s/b HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", size);
  memset(put + n, 'b', size);
  put[n + size] = '\0';
  /* 200,000 of a 250,000-byte body, the rest never sent. */
  int m = snprintf(partial, head, "PUT /s/a HTTP/1.1\r\nHost: x\r\nContent-Length: 250000\r\n\r\n");
  memset(partial + m, 'a', size);
  fd = connect_to(port);
  send_all(fd, partial, (size_t)m + size);
  do {
    rdzv_store_get_stats(st_small, &stats);
    if (stats.held_bytes >= 150000)
      break;
    hvd_sleep_ns(5000000);
  } while (hvd_now_ns() < deadline);
  ck_assert_uint_ge(stats.held_bytes, 150000);
  ck_assert_int_eq(raw_exchange(port, put, &r), 507);
  ck_assert_ptr_nonnull(strstr(r.body, "full"));
  close(fd);
  deadline = hvd_deadline_after_ms(20000);
  do {
    rdzv_store_get_stats(st_small, &stats);
    if (stats.held_bytes == 0)
      break;
    hvd_sleep_ns(5000000);
  } while (hvd_now_ns() < deadline);
  ck_assert_uint_eq(stats.held_bytes, 0);
  ck_assert_int_eq(raw_exchange(port, put, &r), 200);
  free(put);
  free(partial);
  rdzv_server_stop(small);
}
END_TEST

static void ten_per_address(struct rdzv_server_config *cfg) {
  cfg->max_connections = 100;
  cfg->max_connections_per_address = 10;
}

/* One address cannot take every slot. Past its share, a newcomer takes the
 * place of its oldest connection that has not shown the token (here, with
 * no token, sent a request); once all have, it is turned away, while
 * another address is still served. */
START_TEST(raw_connections_per_address) {
  static const char get[] = "GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n";
  struct rdzv_server *limited = start_server_with(NULL, ten_per_address);
  int port = rdzv_server_port(limited);
  int held[10], extra, other, displaced = -1;
  struct pollfd p[10];
  struct response r;

  for (int i = 0; i < 10; i++)
    held[i] = connect_from("127.0.0.1", port);
  /* An 11th silent connection displaces one of the first ten. */
  extra = connect_from("127.0.0.1", port);
  for (int i = 0; i < 10; i++)
    p[i] = (struct pollfd){.fd = held[i], .events = POLLIN};
  ck_assert_int_eq(poll(p, 10, 10000), 1);
  for (int i = 0; i < 10; i++) {
    if (p[i].revents != 0)
      displaced = i;
  }
  ck_assert(turned_away(held[displaced]));
  close(held[displaced]);
  held[displaced] = extra;
  /* All ten send a request: none of them can be displaced now. */
  for (int i = 0; i < 10; i++) {
    send_all(held[i], get, strlen(get));
    ck_assert_int_eq(read_response(held[i], &r), 404);
  }
  extra = connect_from("127.0.0.1", port);
  ck_assert(turned_away(extra));
  close(extra);
  other = connect_from("127.0.0.2", port);
  send_all(other, S("GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n"));
  ck_assert_int_eq(read_response(other, &r), 404);
  close(other);
  /* A slot freed is a slot to use again. */
  close(held[0]);
  int64_t deadline = hvd_deadline_after_ms(10000);
  int code = 0;
  while (code != 404 && hvd_now_ns() < deadline) {
    int fd = connect_from("127.0.0.1", port);
    send_all(fd, S("GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n"));
    code = read_response(fd, &r);
    close(fd);
  }
  ck_assert_int_eq(code, 404);
  for (int i = 1; i < 10; i++)
    close(held[i]);
  rdzv_server_stop(limited);
}
END_TEST

START_TEST(raw_token_and_content_length_everywhere) {
  struct rdzv_server *secured = start_server_with("tok", NULL);
  int port = rdzv_server_port(secured);
  struct response r;

  ck_assert_int_eq(raw_exchange(port, "GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n", &r), 401);
  ck_assert(r.has_length);
  ck_assert_ptr_nonnull(strstr(r.headers, "WWW-Authenticate: Bearer"));
  ck_assert_int_eq(
      raw_exchange(port, "GET /s/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok2\r\n\r\n", &r),
      401);
  ck_assert_int_eq(
      raw_exchange(port, "GET /s/k HTTP/1.1\r\nHost: x\r\nAuthorization: Basic dG9r\r\n\r\n", &r),
      401);
  /* Refused before the body is read. */
  ck_assert_int_eq(raw_exchange(port,
                                "PUT /s/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
                                &r),
                   401);
  ck_assert_int_eq(
      raw_exchange(port, "GET /s/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\n\r\n", &r),
      404);
  ck_assert(r.has_length);
  ck_assert_int_eq(raw_exchange(port, "GET /_health HTTP/1.0\r\n\r\n", &r), 200);
  ck_assert_ptr_nonnull(strstr(r.headers, "application/json"));
  rdzv_server_stop(secured);
}
END_TEST

/* ==== stress =================================================================== */

enum { STRESS_THREADS = 64, STRESS_OPS = 1000, HOT_MAX = 300 };

struct stress_thread {
  pthread_t thread;
  int id;
  int port;
  int failures;
  char failure[256];
};

/* A self-describing value: "<id>:<i>:<len>:" then fill bytes derived from id and i. */
static size_t make_value(char *out, int id, int i) {
  size_t len = 16 + (size_t)((id * 131 + i * 17) % (HOT_MAX - 32));
  int n = snprintf(out, len + 1, "%d:%d:%zu:", id, i, len);
  for (size_t j = (size_t)n; j < len; j++)
    out[j] = (char)('a' + (id + i + (int)j) % 26);
  return len;
}

static bool value_consistent(const char *v, size_t len) {
  int id, i;
  size_t declared;
  char expect[HOT_MAX + 1];
  if (sscanf(v, "%d:%d:%zu:", &id, &i, &declared) != 3 || declared != len)
    return false;
  return make_value(expect, id, i) == len && memcmp(expect, v, len) == 0;
}

static void *stress_main(void *arg) {
  struct stress_thread *t = arg;
  struct rdzv_client *c = NULL;
  struct hvd_buf got;
  char key[32], value[HOT_MAX + 1];
  int64_t sum;

  hvd_buf_init(&got, 0);
  if (rdzv_client_create("127.0.0.1", t->port, NULL, 60000, &c) != HVD_OK) {
    t->failures = STRESS_OPS;
    return NULL;
  }
  for (int i = 0; i < STRESS_OPS; i++) {
    hvd_status st;
    size_t len = make_value(value, t->id, i);
    switch (i % 4) {
    case 0: /* own key, then read it back */
      snprintf(key, sizeof(key), "t%d-%d", t->id, i % 50);
      st = rdzv_client_set(c, "stress", key, value, len);
      if (st == HVD_OK)
        st = rdzv_client_get(c, "stress", key, &got, NULL);
      if (st == HVD_OK && (got.len != len || memcmp(got.data, value, len) != 0))
        st = HVD_ERR_CONFLICT;
      break;
    case 1: /* everybody writes the hot key */
      st = rdzv_client_set(c, "stress", "hot", value, len);
      break;
    case 2: /* whatever the hot key holds must be one whole write */
      st = rdzv_client_get(c, "stress", "hot", &got, NULL);
      if (st == HVD_OK && !value_consistent(got.data, got.len))
        st = HVD_ERR_CONFLICT;
      break;
    default:
      st = rdzv_client_add(c, "stress", "counter", 1, &sum);
      break;
    }
    if (st != HVD_OK) {
      if (t->failures++ == 0)
        snprintf(t->failure, sizeof(t->failure), "op %d: %s", i, hvd_last_error_message());
    }
  }
  /* Final state of this thread's keys: the last write of each. */
  snprintf(key, sizeof(key), "t%d-final", t->id);
  if (rdzv_client_set(c, "stress", key, "done", 4) != HVD_OK)
    t->failures++;
  hvd_buf_fini(&got);
  rdzv_client_destroy(c);
  return NULL;
}

START_TEST(stress_64_threads_no_lost_or_torn_writes) {
  static struct stress_thread t[STRESS_THREADS];
  struct rdzv_scope_view view;
  struct hvd_buf got;
  int64_t counter = 0;

  hvd_buf_init(&got, 0);
  for (int i = 0; i < STRESS_THREADS; i++) {
    t[i] = (struct stress_thread){.id = i, .port = rdzv_server_port(srv)};
    ck_assert_int_eq(pthread_create(&t[i].thread, NULL, stress_main, &t[i]), 0);
  }
  for (int i = 0; i < STRESS_THREADS; i++) {
    pthread_join(t[i].thread, NULL);
    ck_assert_msg(t[i].failures == 0, "thread %d: %d failures, first: %s", i, t[i].failures,
                  t[i].failure);
  }
  /* No lost adds. */
  ck_assert_int_eq(rdzv_client_add(cli, "stress", "counter", 0, &counter), HVD_OK);
  ck_assert_int_eq(counter, STRESS_THREADS * STRESS_OPS / 4);
  /* Every key holds the last value its thread wrote. */
  ck_assert_int_eq(rdzv_client_get_scope(cli, "stress", 0, 10000, &view), HVD_OK);
  size_t expected = (size_t)STRESS_THREADS + 2; /* final markers, hot, counter */
  for (int id = 0; id < STRESS_THREADS; id++) {
    for (int k = 0; k < 50; k++) {
      char key[32], value[HOT_MAX + 1];
      int last = -1;
      for (int i = 0; i < STRESS_OPS; i += 4)
        if (i % 50 == k)
          last = i;
      snprintf(key, sizeof(key), "t%d-%d", id, k);
      const struct rdzv_entry *e = rdzv_scope_find(&view, key);
      if (last < 0) {
        ck_assert_ptr_null(e);
        continue;
      }
      ck_assert_msg(e != NULL, "lost %s", key);
      expected++;
      size_t len = make_value(value, id, last);
      ck_assert_uint_eq(e->value_len, len);
      ck_assert(memcmp(e->value, value, len) == 0);
    }
  }
  ck_assert_uint_eq(view.count, expected);
  const struct rdzv_entry *hot = rdzv_scope_find(&view, "hot");
  ck_assert_ptr_nonnull(hot);
  ck_assert(value_consistent((const char *)hot->value, hot->value_len));
  rdzv_scope_view_fini(&view);
  hvd_buf_fini(&got);
}
END_TEST

/* N ranks: each publishes a record, then long-polls for the whole scope. */
struct rank_thread {
  pthread_t thread;
  int rank;
  int size;
  int port;
  hvd_status status;
  size_t seen;
};

static void *rank_main(void *arg) {
  struct rank_thread *t = arg;
  struct rdzv_client *c = NULL;
  struct rdzv_scope_view view;
  char key[16], value[64];

  t->status = rdzv_client_create("127.0.0.1", t->port, NULL, 60000, &c);
  snprintf(key, sizeof(key), "%d", t->rank);
  snprintf(value, sizeof(value), "10.0.%d.%d:%d", t->rank / 256, t->rank % 256, 40000 + t->rank);
  if (t->status == HVD_OK)
    t->status = rdzv_client_set(c, "global", key, S(value));
  if (t->status == HVD_OK)
    t->status = rdzv_client_get_scope(c, "global", (size_t)t->size, -1, &view);
  if (t->status == HVD_OK) {
    for (size_t i = 0; i < view.count; i++) {
      int r = atoi(view.entries[i].key);
      snprintf(value, sizeof(value), "10.0.%d.%d:%d", r / 256, r % 256, 40000 + r);
      if (strcmp((const char *)view.entries[i].value, value) == 0)
        t->seen++;
    }
    rdzv_scope_view_fini(&view);
    t->status = rdzv_client_delete(c, "global", key);
  }
  rdzv_client_destroy(c);
  return NULL;
}

START_TEST(stress_256_ranks_rendezvous) {
  enum { N = 256 };
  static struct rank_thread t[N];
  pthread_attr_t attr;
  struct rdzv_store_stats stats;

  ck_assert_int_eq(rdzv_store_plan(rdzv_server_store(srv), S("global"), N), HVD_OK);
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  for (int i = 0; i < N; i++) {
    t[i] = (struct rank_thread){.rank = i, .size = N, .port = rdzv_server_port(srv)};
    ck_assert_int_eq(pthread_create(&t[i].thread, &attr, rank_main, &t[i]), 0);
  }
  int failed = 0, first = -1;
  for (int i = 0; i < N; i++) {
    pthread_join(t[i].thread, NULL);
    if (t[i].status != HVD_OK && failed++ == 0)
      first = i;
  }
  /* How many failed tells a lost wake-up (one) from a stuck publish (all). */
  ck_assert_msg(failed == 0, "%d of %d ranks failed; rank %d: %s", failed, N, first,
                first >= 0 ? hvd_strerror(t[first].status) : "");
  for (int i = 0; i < N; i++)
    ck_assert_uint_eq(t[i].seen, N);
  pthread_attr_destroy(&attr);
  /* Every rank finished: the planned scope cleared itself. */
  rdzv_store_get_stats(rdzv_server_store(srv), &stats);
  ck_assert_uint_eq(stats.keys, 0);
  ck_assert_uint_eq(stats.waiters, 0);
}
END_TEST

/* ==== cli (the hvd-rendezvous binary) ============================================ */

struct child {
  pid_t pid;
  FILE *out;
  int err_fd;
  int port;
  char first_line[128];
};

/* Starts hvd-rendezvous with args (NULL-terminated); reads its first line. */
static void spawn(struct child *ch, const char *const *args, const char *env_token) {
  int out[2], err[2];
  const char *argv[32];
  size_t n = 0;

  const char *envp[256];
  char token_var[128];
  size_t m = 0;

  ck_assert_int_eq(pipe(out), 0);
  ck_assert_int_eq(pipe(err), 0);
  argv[n++] = HVD_BIN_DIR "/hvd-rendezvous";
  for (; args[n - 1] != NULL && n < 31; n++)
    argv[n] = args[n - 1];
  argv[n] = NULL;
  /* The environment is built here: between fork and exec the child of a
   * threaded process may only make async-signal-safe calls. */
  for (char **e = environ; *e != NULL && m < HVD_ARRAY_SIZE(envp) - 2; e++) {
    if (strncmp(*e, "HVD_TOKEN=", 10) != 0)
      envp[m++] = *e;
  }
  if (env_token != NULL) {
    snprintf(token_var, sizeof(token_var), "HVD_TOKEN=%s", env_token);
    envp[m++] = token_var;
  }
  envp[m] = NULL;
  ch->pid = fork();
  ck_assert_int_ge(ch->pid, 0);
  if (ch->pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(err[0]);
    alarm(60); /* never outlive a broken test */
    execve(argv[0], (char *const *)argv, (char *const *)envp);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  ch->out = fdopen(out[0], "r");
  ch->err_fd = err[0];
  ch->first_line[0] = '\0';
  ch->port = 0;
  if (fgets(ch->first_line, sizeof(ch->first_line), ch->out) != NULL) {
    char *colon = strrchr(ch->first_line, ':');
    if (colon != NULL)
      ch->port = atoi(colon + 1);
  }
}

/* Sends sig (0: none) and returns the exit code, or -1 if it had to be killed. */
static int finish(struct child *ch, int sig) {
  int status = 0;
  if (sig != 0)
    kill(ch->pid, sig);
  for (int i = 0; i < 200; i++) {
    if (waitpid(ch->pid, &status, WNOHANG) == ch->pid) {
      if (WIFSIGNALED(status)) {
        char said[4096];
        ssize_t n = read(ch->err_fd, said, sizeof(said) - 1);
        said[n > 0 ? n : 0] = '\0';
        fprintf(stderr, "hvd-rendezvous was killed by signal %d; it wrote: %s\n",
                WTERMSIG(status), said);
      }
      fclose(ch->out);
      close(ch->err_fd);
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    hvd_sleep_ns(50 * 1000000LL);
  }
  kill(ch->pid, SIGKILL);
  waitpid(ch->pid, &status, 0);
  fclose(ch->out);
  close(ch->err_fd);
  return -1;
}

/* Waits for the child to exit; returns its exit code and everything it wrote to stderr. */
static int finish_with_stderr(struct child *ch, char *buf, size_t size) {
  size_t len = 0;
  ssize_t n;
  int fd = dup(ch->err_fd);
  int code = finish(ch, 0);

  while (len < size - 1 && (n = read(fd, buf + len, size - 1 - len)) > 0)
    len += (size_t)n;
  buf[len] = '\0';
  close(fd);
  return code;
}

START_TEST(cli_put_get_and_clean_shutdown) {
  const char *args[] = {"--port", "0", "--bind", "127.0.0.1", NULL};
  struct child ch;
  struct response r;
  char expect[64];

  spawn(&ch, args, NULL);
  ck_assert_int_gt(ch.port, 0);
  snprintf(expect, sizeof(expect), "listening on 127.0.0.1:%d\n", ch.port);
  ck_assert_str_eq(ch.first_line, expect);
  ck_assert_int_eq(raw_exchange(ch.port, "PUT /s/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
                                &r),
                   200);
  ck_assert_int_eq(raw_exchange(ch.port, "GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n", &r), 200);
  ck_assert_str_eq(r.body, "x");
  ck_assert_int_eq(raw_exchange(ch.port, "GET /s/nope HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
  ck_assert_int_eq(finish(&ch, SIGTERM), 0);
}
END_TEST

START_TEST(cli_sigint_with_waiting_client) {
  const char *args[] = {NULL};
  struct child ch;
  struct waiter_thread w = {.scope = "s", .key = "never", .timeout_ms = 3000};

  spawn(&ch, args, NULL);
  ck_assert_ptr_nonnull(strstr(ch.first_line, "listening on "));
  ck_assert_int_gt(ch.port, 0);
  w.port = ch.port;
  pthread_create(&w.thread, NULL, waiter_main, &w);
  await_health(ch.port, "waiters", 1);
  ck_assert_int_eq(finish(&ch, SIGINT), 0);
  pthread_join(w.thread, NULL);
  ck_assert_int_ne(w.status, HVD_OK);
}
END_TEST

START_TEST(cli_token_file_and_env) {
  char path[] = "/tmp/hvd-token-XXXXXX";
  int fd = mkstemp(path);
  const char *args[] = {"--bind", "127.0.0.1", "--token-file", path, NULL};
  const char *plain[] = {"--bind", "127.0.0.1", NULL};
  struct child ch;
  struct response r;

  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, "filetoken\n", 10), 10);
  close(fd);
  spawn(&ch, args, "envtoken");
  ck_assert_int_eq(raw_exchange(ch.port, "GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n", &r), 401);
  ck_assert_int_eq(raw_exchange(ch.port,
                                "GET /s/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer envtoken\r\n\r\n",
                                &r),
                   401);
  ck_assert_int_eq(raw_exchange(ch.port,
                                "GET /s/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer filetoken\r\n\r\n",
                                &r),
                   404);
  ck_assert_int_eq(finish(&ch, SIGTERM), 0);

  spawn(&ch, plain, "envtoken");
  ck_assert_int_eq(raw_exchange(ch.port, "GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n", &r), 401);
  ck_assert_int_eq(raw_exchange(ch.port,
                                "GET /s/k HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer envtoken\r\n\r\n",
                                &r),
                   404);
  ck_assert_int_eq(finish(&ch, SIGTERM), 0);
  unlink(path);
}
END_TEST

START_TEST(cli_plan_flag) {
  const char *args[] = {"--bind", "127.0.0.1", "--plan", "global=2", NULL};
  struct child ch;
  struct response r;

  spawn(&ch, args, NULL);
  raw_exchange(ch.port, "PUT /global/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na", &r);
  raw_exchange(ch.port, "DELETE /global/0 HTTP/1.1\r\nHost: x\r\n\r\n", &r);
  ck_assert_int_eq(raw_exchange(ch.port, "GET /global/0 HTTP/1.1\r\nHost: x\r\n\r\n", &r), 200);
  raw_exchange(ch.port, "DELETE /global/1 HTTP/1.1\r\nHost: x\r\n\r\n", &r);
  ck_assert_int_eq(raw_exchange(ch.port, "GET /global/0 HTTP/1.1\r\nHost: x\r\n\r\n", &r), 404);
  ck_assert_int_eq(finish(&ch, SIGTERM), 0);
}
END_TEST

START_TEST(cli_ipv6_bind) {
  const char *args[] = {"--bind", "::1", NULL};
  struct child ch;

  spawn(&ch, args, NULL);
  if (strstr(ch.first_line, "listening on") == NULL) {
    /* No IPv6 loopback on this host: nothing to check. */
    finish(&ch, SIGTERM);
    return;
  }
  ck_assert_ptr_nonnull(strstr(ch.first_line, "listening on [::1]:"));
  struct rdzv_client *c = NULL;
  ck_assert_int_eq(rdzv_client_create("::1", ch.port, NULL, 5000, &c), HVD_OK);
  ck_assert_msg(rdzv_client_set(c, "s", "k", S("v6")) == HVD_OK, "%s", hvd_last_error_message());
  rdzv_client_destroy(c);
  ck_assert_int_eq(finish(&ch, SIGTERM), 0);
}
END_TEST

START_TEST(cli_bad_input) {
  static const struct {
    const char *args[4];
    const char *mention;
  } cases[] = {
      {{"--port", "abc", NULL}, "--port"},
      {{"--port", "70000", NULL}, "--port"},
      {{"--bogus", NULL}, "--bogus"},
      {{"--port", NULL}, "--port"},
      {{"--plan", "global", NULL}, "--plan"},
      {{"--plan", "global=0", NULL}, "--plan"},
      {{"--threads", "0", NULL}, "--threads"},
      {{"--log-level", "loud", NULL}, "loud"},
      {{"--token-file", "/nonexistent/token", NULL}, "/nonexistent/token"},
      {{"stray", NULL}, "stray"},
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++) {
    struct child ch;
    char err[1024];
    spawn(&ch, cases[i].args, NULL);
    ck_assert_msg(ch.first_line[0] == '\0', "case %zu printed '%s'", i, ch.first_line);
    ck_assert_int_eq(finish_with_stderr(&ch, err, sizeof(err)), 2);
    ck_assert_msg(strstr(err, cases[i].mention) != NULL, "case %zu: '%s'", i, err);
    ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "case %zu not one line: '%s'", i,
                  err);
  }
  /* Bad environment is refused too. */
  setenv("HOROVOD_LOG_LEVEL", "chatty", 1);
  {
    const char *args[] = {NULL};
    struct child ch;
    char err[1024];
    spawn(&ch, args, NULL);
    ck_assert_int_eq(finish_with_stderr(&ch, err, sizeof(err)), 2);
    ck_assert_ptr_nonnull(strstr(err, "HOROVOD_LOG_LEVEL"));
  }
  unsetenv("HOROVOD_LOG_LEVEL");
  /* A port in use is a runtime failure with a clear reason. */
  {
    struct rdzv_server *busy = start_server();
    char port[16];
    snprintf(port, sizeof(port), "%d", rdzv_server_port(busy));
    const char *args[] = {"--bind", "127.0.0.1", "--port", port, NULL};
    struct child ch;
    char err[1024];
    spawn(&ch, args, NULL);
    ck_assert_int_eq(finish_with_stderr(&ch, err, sizeof(err)), 1);
    ck_assert_ptr_nonnull(strstr(err, "in use"));
    rdzv_server_stop(busy);
  }
}
END_TEST

START_TEST(cli_help_and_version) {
  const char *help[] = {"--help", NULL};
  const char *version[] = {"--version", NULL};
  struct child ch;

  spawn(&ch, help, NULL);
  ck_assert_ptr_nonnull(strstr(ch.first_line, "usage: hvd-rendezvous"));
  ck_assert_int_eq(finish(&ch, 0), 0);
  spawn(&ch, version, NULL);
  ck_assert_ptr_nonnull(strstr(ch.first_line, hvd_version()));
  ck_assert_int_eq(finish(&ch, 0), 0);
}
END_TEST

/* ==== suites ===================================================================== */

/* GET /metrics' merge: families by name across ranks, rank and host
 * labels first, an earlier elastic round left out, and lines that would
 * break the exposition (or claim the rank and host labels) dropped. */
START_TEST(store_metrics_render) {
  struct hvd_buf out = {0};
  put(RDZV_METRICS_SCOPE, "1",
      "# hvd-metrics round=2 host=b\"x\n"
      "# HELP hvd_ops_total Ops.\n# TYPE hvd_ops_total counter\n"
      "hvd_ops_total{op=\"allreduce\"} 5\n"
      "hvd_ops_total{op=\"a\\\"} 1\n"              /* a backslash in a value */
      "hvd_ops_total{rank=\"7\"} 1\n"              /* ours */
      "hvd_other_total 3\n"                        /* not the current family */
      "hvd_ops_total 1 1700000000\n"               /* a timestamp */
      "# TYPE hvd_wait_seconds histogram\n"
      "hvd_wait_seconds_bucket{le=\"+Inf\"} 2\nhvd_wait_seconds_count 2\n"
      "hvd_wait_seconds_sum 0.5\n");
  put(RDZV_METRICS_SCOPE, "0",
      "# hvd-metrics round=2 host=a\n"
      "# TYPE hvd_ops_total counter\nhvd_ops_total{op=\"allreduce\"} 4\n");
  put(RDZV_METRICS_SCOPE, "9", "# hvd-metrics round=1 host=gone\n"
                               "# TYPE hvd_ops_total counter\nhvd_ops_total 9\n");
  ck_assert_int_eq(rdzv_metrics_render(store, &out), HVD_OK);
  ck_assert_str_eq(out.data,
                   "# HELP hvd_ops_total Ops.\n# TYPE hvd_ops_total counter\n"
                   "hvd_ops_total{rank=\"0\",host=\"a\",op=\"allreduce\"} 4\n"
                   "hvd_ops_total{rank=\"1\",host=\"b\\\"x\",op=\"allreduce\"} 5\n"
                   "# TYPE hvd_wait_seconds histogram\n"
                   "hvd_wait_seconds_bucket{rank=\"1\",host=\"b\\\"x\",le=\"+Inf\"} 2\n"
                   "hvd_wait_seconds_count{rank=\"1\",host=\"b\\\"x\"} 2\n"
                   "hvd_wait_seconds_sum{rank=\"1\",host=\"b\\\"x\"} 0.5\n");
  hvd_buf_fini(&out);
}
END_TEST

static Suite *store_suite(void) {
  Suite *s = suite_create("store");
  TCase *tc = tcase_create("store");
  tcase_add_checked_fixture(tc, store_setup, store_teardown);
  tcase_add_test(tc, store_set_get_versions);
  tcase_add_test(tc, store_binary_and_empty_values);
  tcase_add_test(tc, store_compare_and_set);
  tcase_add_test(tc, store_atomic_add);
  tcase_add_test(tc, store_delete_and_delete_scope);
  tcase_add_test(tc, store_planned_scope_cleanup);
  tcase_add_test(tc, store_reset_drops_keys_and_plans);
  tcase_add_test(tc, store_limits);
  tcase_add_test(tc, store_held_values_count_against_the_limit);
  tcase_add_test(tc, store_close_gives_up_on_a_stuck_callback);
  tcase_add_test(tc, store_snapshot_order_and_cache);
  tcase_add_test(tc, store_wait_ready_now_and_later);
  tcase_add_test(tc, store_wait_scope_count);
  tcase_add_test(tc, store_wait_deadlines);
  tcase_add_test(tc, store_wait_many_deadlines);
  tcase_add_test(tc, store_wait_for_changes);
  tcase_add_test(tc, store_metrics_render);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *codec_suite(void) {
  Suite *s = suite_create("codec");
  TCase *tc = tcase_create("codec");
  tcase_add_test(tc, codec_roundtrip_binary);
  tcase_add_test(tc, codec_rejects_malformed);
  tcase_add_test(tc, codec_key_order);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *record_suite(void) {
  Suite *s = suite_create("record");
  TCase *tc = tcase_create("record");
  tcase_add_test(tc, record_roundtrip);
  tcase_add_test(tc, record_rejects_bad_fields);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *http_suite(void) {
  Suite *s = suite_create("http");
  TCase *tc = tcase_create("http");
  tcase_add_checked_fixture(tc, http_setup, http_teardown);
  tcase_add_test(tc, http_set_get_delete);
  tcase_add_test(tc, http_scope_add_cas);
  tcase_add_test(tc, http_long_poll_gets_value_put_later);
  tcase_add_test(tc, http_wait_deadline);
  tcase_add_test(tc, http_planned_scope_over_http);
  tcase_add_test(tc, http_health);
  tcase_add_test(tc, http_health_while_starting);
  tcase_add_test(tc, http_slow_clients_do_not_lock_ranks_out);
  tcase_add_test(tc, http_squatters_on_the_address_quota);
  tcase_add_test(tc, http_squatters_on_every_slot);
  tcase_add_test(tc, http_client_reuses_its_connection);
  tcase_add_test(tc, http_no_server_fails_with_clear_message);
  tcase_add_test(tc, http_client_waits_for_late_server);
  tcase_add_test(tc, http_token);
  tcase_add_test(tc, http_limits);
  tcase_add_test(tc, http_client_from_env);
  tcase_add_test(tc, http_shutdown_answers_waiters);
  tcase_add_test(tc, http_cancel_fd_ends_long_poll);
  tcase_add_test(tc, http_cancel_fd_idle_calls_work);
  tcase_add_test(tc, http_cancel_fd_already_readable);
  tcase_add_test(tc, http_cancel_fd_while_server_unreachable);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *robustness_suite(void) {
  Suite *s = suite_create("robustness");
  TCase *tc = tcase_create("raw");
  tcase_add_checked_fixture(tc, http_setup, http_teardown);
  tcase_add_test(tc, raw_http10_and_keepalive);
  tcase_add_test(tc, raw_malformed_requests);
  tcase_add_test(tc, raw_conflicting_content_length_closes);
  tcase_add_test(tc, raw_garbage_and_truncation);
  tcase_add_test(tc, raw_oversized_requests);
  tcase_add_test(tc, raw_long_poll_client_leaves);
  tcase_add_test(tc, raw_upload_counts_against_the_limit);
  tcase_add_test(tc, raw_connections_per_address);
  tcase_add_test(tc, raw_token_and_content_length_everywhere);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *stress_suite(void) {
  Suite *s = suite_create("stress");
  TCase *tc = tcase_create("stress");
  tcase_add_checked_fixture(tc, http_setup, http_teardown);
  tcase_add_test(tc, stress_64_threads_no_lost_or_torn_writes);
  tcase_add_test(tc, stress_256_ranks_rendezvous);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *cli_suite(void) {
  Suite *s = suite_create("cli");
  TCase *tc = tcase_create("cli");
  tcase_add_test(tc, cli_put_get_and_clean_shutdown);
  tcase_add_test(tc, cli_sigint_with_waiting_client);
  tcase_add_test(tc, cli_token_file_and_env);
  tcase_add_test(tc, cli_plan_flag);
  tcase_add_test(tc, cli_ipv6_bind);
  tcase_add_test(tc, cli_bad_input);
  tcase_add_test(tc, cli_help_and_version);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(store_suite());
  int failed;

  signal(SIGPIPE, SIG_IGN);
  srunner_add_suite(sr, codec_suite());
  srunner_add_suite(sr, record_suite());
  srunner_add_suite(sr, http_suite());
  srunner_add_suite(sr, robustness_suite());
  srunner_add_suite(sr, stress_suite());
  srunner_add_suite(sr, cli_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
