/*
 * The etcd backend of the rendezvous client against real etcd clusters
 * (tests/etcd_cluster.h), for what hvd's own store has no counterpart of
 * (the cases both stores pass are in test_store_api.c). One suite each:
 *   config     bad URLs and settings (no cluster): HVD_ERR_INVALID_ARGUMENT
 *              naming HVD_RENDEZVOUS; scope names etcd refuses
 *   failover   3 members: kill -9 of the leader while clients wait for keys
 *              (they get them once the keys are put under the next leader),
 *              and while a client writes (no write lost or failed)
 *   partition  3 members: a frozen (SIGSTOP) member its client was talking
 *              to (the client moves on), a lost quorum (a clear error within
 *              the client's timeout, never a hang; then the same client
 *              again once the members are back)
 *   lease      the job's lease at its minimum (5 s): keys of a job whose
 *              clients are gone or quiet expire, those of a job in use stay;
 *              a quiet job's client goes on under a new lease
 *   auth       etcd's users: no user, a wrong password, an unknown user
 *              (HVD_ERR_UNAUTHORIZED naming the variables), the right one;
 *              a token lost with a member's restart is renewed
 *   tls        etcds:// with certificates made here by openssl: a client
 *              certificate accepted; none, or an unknown CA, refused clearly
 *   lead       leadership: one of two candidates leads, the other takes over
 *              when the first stops renewing, resigns or is destroyed;
 *              wait_change wakes at a change of its scope only
 * Every suite but config exits 77 (ctest's skip) where etcd is missing,
 * tls also where openssl is. Each case starts its own cluster, before any
 * thread exists (the harness forks); threads are joined before a member is
 * restarted. A waiter is known to be waiting from etcd's watcher gauge,
 * never from a sleep; what expiry takes is awaited by reading the store
 * with a deadline.
 */
#include <arpa/inet.h>
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "etcd_cluster.h"
#include "rendezvous/rendezvous.h"

#define S(x) (x), strlen(x)

/* A call's status, with the call and its message where it is not want. */
#define EXPECT(call, want)                                                                         \
  do {                                                                                             \
    hvd_status got_ = (call);                                                                      \
    ck_assert_msg(got_ == (want), "%s: %s, want %s: %s", #call, hvd_strerror(got_),               \
                  hvd_strerror(want), hvd_last_error_message());                                   \
  } while (0)

enum {
  TIMEOUT_MS = 20000, /* a call that should succeed, failures included */
  SHORT_MS = 300,     /* a call that should time out */
};

static struct etcd_cluster cluster;
static char tmp_dir[200]; /* tls: the certificates */

static const char *const settings[] = {
    "HVD_ETCD_LEASE_SECONDS", "HVD_ETCD_USER", "HVD_ETCD_PASSWORD", "HVD_ETCD_CACERT",
    "HVD_ETCD_CERT",          "HVD_ETCD_KEY",  "HVD_RENDEZVOUS",
};

static void clear_settings(void) {
  for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
    unsetenv(settings[i]);
}

static void teardown(void) {
  etcd_cluster_stop(&cluster);
  clear_settings();
}

/* "etcd://<the cluster's members>/hvdtest/<name>" */
static const char *url_for(const char *name) {
  static char url[512];
  snprintf(url, sizeof(url), "etcd://%s/hvdtest/%s", etcd_cluster_endpoints(&cluster), name);
  return url;
}

static struct rdzv_client *client_at(const char *url, int64_t timeout_ms) {
  struct rdzv_client *c = NULL;
  ck_assert_msg(rdzv_client_create_url(url, timeout_ms, &c) == HVD_OK, "%s: %s", url,
                hvd_last_error_message());
  return c;
}

static void expect_message(const char *needle) {
  ck_assert_msg(strstr(hvd_last_error_message(), needle) != NULL, "'%s' not in: %s", needle,
                hvd_last_error_message());
}

static void expect_value(struct rdzv_client *c, const char *scope, const char *key,
                         const char *want) {
  struct hvd_buf v;
  hvd_buf_init(&v, 0);
  EXPECT(rdzv_client_get(c, scope, key, &v, NULL), HVD_OK);
  ck_assert_str_eq(v.data, want);
  hvd_buf_fini(&v);
}

/* The raw key's value in etcd (NULL: absent), read past the client. */
static char *raw_get(const char *name, const char *key) {
  char path[256];
  snprintf(path, sizeof(path), "/hvdtest/%s/%s", name, key);
  return etcd_cluster_get(&cluster, -1, path);
}

/* Until the cluster holds at least n watchers (waiting calls). */
static void await_watchers(long n) {
  int64_t deadline = hvd_deadline_after_ms(TIMEOUT_MS);
  long now;
  while ((now = etcd_cluster_watchers(&cluster)) < n && hvd_now_ns() < deadline)
    hvd_sleep_ns(5000000);
  ck_assert_msg(now >= n, "%ld etcd watchers, want %ld", now, n);
}

/* ==== calls on threads of their own ========================================= */

enum op { OP_WAIT, OP_SCOPE, OP_LEAD, OP_CHANGE };

struct op_thread {
  pthread_t thread;
  struct rdzv_client *client; /* made by the test thread */
  enum op op;
  const char *scope, *key;
  const char *value; /* OP_LEAD */
  size_t n;          /* OP_SCOPE: the count */
  uint64_t after;    /* OP_CHANGE; then the version it returned */
  int ttl_s;         /* OP_LEAD */
  int64_t timeout_ms;
  hvd_status status;
  atomic_bool done;
  struct hvd_buf value_out;
  size_t entries;
  char message[512];
};

static void *op_main(void *arg) {
  struct op_thread *t = arg;
  struct rdzv_scope_view view;
  switch (t->op) {
  case OP_WAIT:
    t->status = rdzv_client_wait(t->client, t->scope, t->key, t->timeout_ms, &t->value_out);
    break;
  case OP_SCOPE:
    t->status = rdzv_client_get_scope(t->client, t->scope, t->n, t->timeout_ms, &view);
    if (t->status == HVD_OK) {
      t->entries = view.count;
      rdzv_scope_view_fini(&view);
    }
    break;
  case OP_LEAD:
    t->status = rdzv_client_lead(t->client, t->scope, t->key, t->value, t->ttl_s, t->timeout_ms);
    break;
  case OP_CHANGE:
    t->status = rdzv_client_wait_change(t->client, t->scope, t->after, t->timeout_ms, &t->after);
    break;
  }
  snprintf(t->message, sizeof(t->message), "%s", hvd_last_error_message());
  atomic_store(&t->done, true);
  return NULL;
}

/* t is zero-initialized, or was started before. */
static void op_start(struct op_thread *t) {
  hvd_buf_fini(&t->value_out);
  hvd_buf_init(&t->value_out, 0);
  atomic_store(&t->done, false);
  if (t->timeout_ms == 0)
    t->timeout_ms = TIMEOUT_MS;
  ck_assert_int_eq(pthread_create(&t->thread, NULL, op_main, t), 0);
}

static void op_join(struct op_thread *t, hvd_status want) {
  ck_assert_int_eq(pthread_join(t->thread, NULL), 0);
  ck_assert_msg(t->status == want, "%s, want %s: %s", hvd_strerror(t->status), hvd_strerror(want),
                t->message);
}

static void op_fini(struct op_thread *t) {
  hvd_buf_fini(&t->value_out);
  rdzv_client_destroy(t->client);
  t->client = NULL;
}

/* ==== config ================================================================= */

static void expect_bad_url(const char *url, const char *needle) {
  struct rdzv_client *c = NULL;
  hvd_status st = rdzv_client_create_url(url, 1000, &c);
  ck_assert_msg(st == HVD_ERR_INVALID_ARGUMENT, "%s: %s, want invalid argument", url,
                hvd_strerror(st));
  ck_assert_ptr_null(c);
  expect_message("HVD_RENDEZVOUS");
  expect_message(needle);
}

START_TEST(bad_urls) {
  char many[17 * 24 + 16] = "etcd://";
  size_t off = strlen(many);

  expect_bad_url("etcd://", "no member");
  expect_bad_url("etcd:///jobs/x", "no member");
  expect_bad_url("etcds://", "no member");
  expect_bad_url("etcd://127.0.0.1", "'127.0.0.1'");
  expect_bad_url("etcd://127.0.0.1:0", "'127.0.0.1:0'");
  expect_bad_url("etcd://127.0.0.1:65536/p", "'127.0.0.1:65536'");
  expect_bad_url("etcd://127.0.0.1:http", "'127.0.0.1:http'");
  expect_bad_url("etcd://:2379", "':2379'");
  expect_bad_url("etcd://127.0.0.1:2379,,127.0.0.1:2380", "''");
  /* a bare IPv6 address: which colon starts the port? */
  expect_bad_url("etcd://::1:2379", "'::1:2379'");
  expect_bad_url("etcd://fd00::1", "brackets");
  expect_bad_url("etcd://[::1]2379", "'[::1]2379'");
  expect_bad_url("etcd://127.0.0.1:2379/a\tb", "control character");
  expect_bad_url("http://127.0.0.1:2379", "etcd://");
  expect_bad_url("127.0.0.1:2379", "etcd://");
  for (int i = 0; i < 17; i++)
    off += (size_t)snprintf(many + off, sizeof(many) - off, "%s127.0.0.1:%d", i ? "," : "",
                            2379 + i);
  expect_bad_url(many, "more than 16");
}
END_TEST

START_TEST(good_urls) {
  char many[16 * 24 + 16] = "etcd://";
  size_t off = strlen(many);
  struct rdzv_client *c;

  c = client_at("etcd://127.0.0.1:2379", 1000);
  ck_assert_str_eq(rdzv_client_where(c), "etcd://127.0.0.1:2379/hvd/default");
  ck_assert(!rdzv_client_plans_scopes(c));
  rdzv_client_destroy(c);
  c = client_at("etcd://[::1]:2379,127.0.0.1:2380/jobs/x//", 1000);
  ck_assert_str_eq(rdzv_client_where(c), "etcd://[::1]:2379,.../jobs/x");
  rdzv_client_destroy(c);
  c = client_at("etcds://etcd-0.example:2379/", 1000);
  ck_assert_str_eq(rdzv_client_where(c), "etcds://etcd-0.example:2379/hvd/default");
  rdzv_client_destroy(c);
  for (int i = 0; i < 16; i++)
    off += (size_t)snprintf(many + off, sizeof(many) - off, "%s127.0.0.1:%d", i ? "," : "",
                            2379 + i);
  rdzv_client_destroy(client_at(many, 1000));
  /* HVD_RENDEZVOUS chooses etcd for a client made from the environment */
  setenv("HVD_RENDEZVOUS", "etcd://127.0.0.1:2379/jobs/env", 1);
  EXPECT(rdzv_client_create_from_env(&c), HVD_OK);
  ck_assert_str_eq(rdzv_client_where(c), "etcd://127.0.0.1:2379/jobs/env");
  rdzv_client_destroy(c);
  setenv("HVD_RENDEZVOUS", "consul://127.0.0.1:8500", 1);
  EXPECT(rdzv_client_create_from_env(&c), HVD_ERR_INVALID_ARGUMENT);
  expect_message("HVD_RENDEZVOUS");
  clear_settings();
}
END_TEST

/* The settings that go with the URL. */
START_TEST(bad_settings) {
  struct rdzv_client *c = NULL;

  setenv("HVD_ETCD_CERT", "/tmp/client.crt", 1);
  expect_bad_url("etcds://127.0.0.1:2379", "HVD_ETCD_KEY");
  unsetenv("HVD_ETCD_CERT");
  setenv("HVD_ETCD_KEY", "/tmp/client.key", 1);
  expect_bad_url("etcds://127.0.0.1:2379", "HVD_ETCD_CERT");
  setenv("HVD_ETCD_CERT", "/tmp/client.crt", 1);
  c = client_at("etcds://127.0.0.1:2379", 1000); /* both: fine */
  rdzv_client_destroy(c);
  /* certificates with a plain etcd:// URL would silently not be used */
  expect_bad_url("etcd://127.0.0.1:2379", "etcds://");
  clear_settings();
  setenv("HVD_ETCD_CACERT", "/tmp/ca.crt", 1);
  expect_bad_url("etcd://127.0.0.1:2379", "HVD_ETCD_CACERT");
  clear_settings();
  setenv("HVD_ETCD_LEASE_SECONDS", "2", 1); /* under the minimum, 5 */
  EXPECT(rdzv_client_create_url("etcd://127.0.0.1:2379", 1000, &c), HVD_ERR_INVALID_ARGUMENT);
  expect_message("HVD_ETCD_LEASE_SECONDS");
  clear_settings();
}
END_TEST

/* Names etcd refuses before any request (nothing listens at the URL). */
START_TEST(refused_scope_names) {
  struct rdzv_client *c = client_at("etcd://127.0.0.1:1/hvdtest", 1000);
  struct rdzv_scope_view view;
  uint64_t version;

  EXPECT(rdzv_client_set(c, "a/b", "k", S("v")), HVD_ERR_INVALID_ARGUMENT);
  expect_message("'a/b'");
  expect_message("'/'");
  EXPECT(rdzv_client_get_scope(c, "a/b", 0, 1000, &view), HVD_ERR_INVALID_ARGUMENT);
  EXPECT(rdzv_client_wait_change(c, "a/b", 0, 1000, &version), HVD_ERR_INVALID_ARGUMENT);
  EXPECT(rdzv_client_lead(c, "a/b", "leader", "me", 2, 1000), HVD_ERR_INVALID_ARGUMENT);
  EXPECT(rdzv_client_delete_scope(c, "_lease"), HVD_ERR_INVALID_ARGUMENT);
  expect_message("'_lease'");
  EXPECT(rdzv_client_get_scope(c, "_full", 0, 1000, &view), HVD_ERR_INVALID_ARGUMENT);
  rdzv_client_destroy(c);
}
END_TEST

/* ==== failover =============================================================== */

START_TEST(leader_killed_while_clients_wait) {
  enum { WAITERS = 4 };
  struct op_thread t[WAITERS];
  struct rdzv_client *w;
  struct rdzv_scope_view view;
  int leader, next;

  etcd_cluster_start(&cluster, 3);
  memset(t, 0, sizeof(t));
  for (int i = 0; i < WAITERS; i++) {
    t[i].client = client_at(url_for("failover"), TIMEOUT_MS);
    t[i].op = i % 2 == 0 ? OP_WAIT : OP_SCOPE;
    t[i].scope = i % 2 == 0 ? "s" : "ranks";
    t[i].key = "k";
    t[i].n = 2;
    op_start(&t[i]);
  }
  await_watchers(WAITERS);
  leader = etcd_cluster_leader(&cluster);
  etcd_cluster_kill(&cluster, leader);
  next = etcd_cluster_leader(&cluster);
  ck_assert_int_ne(next, leader);
  /* the keys come under the next leader, as the last rank to arrive
   * would write them and read its scope */
  w = client_at(url_for("failover"), TIMEOUT_MS);
  EXPECT(rdzv_client_set(w, "s", "k", S("after the election")), HVD_OK);
  EXPECT(rdzv_client_set(w, "ranks", "0", S("r0")), HVD_OK);
  EXPECT(rdzv_client_set(w, "ranks", "1", S("r1")), HVD_OK);
  EXPECT(rdzv_client_get_scope(w, "ranks", 2, TIMEOUT_MS, &view), HVD_OK);
  rdzv_scope_view_fini(&view);
  for (int i = 0; i < WAITERS; i++) {
    op_join(&t[i], HVD_OK);
    if (t[i].op == OP_WAIT)
      ck_assert_str_eq(t[i].value_out.data, "after the election");
    else
      ck_assert_uint_eq(t[i].entries, 2);
    op_fini(&t[i]);
  }
  rdzv_client_destroy(w);
}
END_TEST

struct writer {
  pthread_t thread;
  struct rdzv_client *client;
  atomic_int written;
  atomic_bool stop;
  int failures;
  char failure[512];
};

/* Writes keys 0, 1, 2, ... and reads each back until told to stop. */
static void *writer_main(void *arg) {
  struct writer *w = arg;
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  for (int i = 0; !atomic_load(&w->stop); i++) {
    char key[16], value[32];
    hvd_status st;
    snprintf(key, sizeof(key), "%d", i);
    snprintf(value, sizeof(value), "value %d", i);
    st = rdzv_client_set(w->client, "w", key, S(value));
    if (st == HVD_OK)
      st = rdzv_client_get(w->client, "w", key, &v, NULL);
    if (st == HVD_OK && strcmp(v.data, value) != 0)
      st = HVD_ERR_CONFLICT;
    if (st != HVD_OK && w->failures++ == 0)
      snprintf(w->failure, sizeof(w->failure), "key %d: %s: %s", i, hvd_strerror(st),
               hvd_last_error_message());
    atomic_store(&w->written, i + 1);
  }
  hvd_buf_fini(&v);
  return NULL;
}

/* Until the writer has written at least n keys. */
static void await_written(struct writer *w, int n) {
  int64_t deadline = hvd_deadline_after_ms(TIMEOUT_MS);
  while (atomic_load(&w->written) < n && hvd_now_ns() < deadline)
    hvd_sleep_ns(2000000);
  ck_assert_msg(atomic_load(&w->written) >= n, "%d keys written, want %d (%d failures: %s)",
                atomic_load(&w->written), n, w->failures, w->failure);
}

START_TEST(leader_killed_while_writing) {
  struct writer w = {0};
  struct rdzv_client *r;
  struct rdzv_scope_view view;
  int leader, n;

  etcd_cluster_start(&cluster, 3);
  w.client = client_at(url_for("writes"), TIMEOUT_MS);
  ck_assert_int_eq(pthread_create(&w.thread, NULL, writer_main, &w), 0);
  await_written(&w, 20);
  leader = etcd_cluster_leader(&cluster);
  etcd_cluster_kill(&cluster, leader);
  ck_assert_int_ne(etcd_cluster_leader(&cluster), leader);
  await_written(&w, atomic_load(&w.written) + 20); /* writes go on under the next leader */
  atomic_store(&w.stop, true);
  ck_assert_int_eq(pthread_join(w.thread, NULL), 0);
  ck_assert_msg(w.failures == 0, "%d failed writes, the first: %s", w.failures, w.failure);
  /* every write is there, once */
  n = atomic_load(&w.written);
  r = client_at(url_for("writes"), TIMEOUT_MS);
  EXPECT(rdzv_client_get_scope(r, "w", (size_t)n, TIMEOUT_MS, &view), HVD_OK);
  ck_assert_uint_eq(view.count, (size_t)n);
  for (int i = 0; i < n; i++) {
    char value[32];
    snprintf(value, sizeof(value), "value %d", i);
    ck_assert_str_eq((const char *)view.entries[i].value, value);
  }
  rdzv_scope_view_fini(&view);
  rdzv_client_destroy(r);
  rdzv_client_destroy(w.client);
}
END_TEST

/* ==== partition ============================================================== */

/* The member this process holds an established connection to (-1: none,
 * -2: more than one), from /proc/net/tcp and this process's sockets. */
static int connected_member(void) {
  char line[512], path[300], link[64];
  unsigned long inodes[256];
  int ninodes = 0, found = -1;
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  FILE *f;

  ck_assert_ptr_nonnull(d);
  while ((e = readdir(d)) != NULL && ninodes < 256) {
    ssize_t n;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    n = readlink(path, link, sizeof(link) - 1);
    if (n > 0) {
      link[n] = '\0';
      if (sscanf(link, "socket:[%lu]", &inodes[ninodes]) == 1)
        ninodes++;
    }
  }
  closedir(d);
  f = fopen("/proc/self/net/tcp", "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof(line), f) != NULL) {
    unsigned rport, state;
    unsigned long inode;
    /* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
    if (sscanf(line, " %*d: %*x:%*x %*x:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &rport, &state,
               &inode) != 3 ||
        state != 1 /* ESTABLISHED */)
      continue;
    for (int k = 0; k < ninodes; k++) {
      if (inodes[k] != inode)
        continue;
      for (int m = 0; m < cluster.size; m++)
        if (cluster.members[m].client_port == (int)rport)
          found = found == -1 || found == m ? m : -2;
    }
  }
  fclose(f);
  return found;
}

/* The member a client talks to freezes: its calls go to another member. */
START_TEST(paused_member_is_passed_over) {
  struct rdzv_client *c;
  struct rdzv_scope_view view;
  int member;

  etcd_cluster_start(&cluster, 3);
  c = client_at(url_for("pause"), TIMEOUT_MS);
  EXPECT(rdzv_client_set(c, "s", "before", S("1")), HVD_OK);
  member = connected_member();
  ck_assert_msg(member >= 0, "the client's member not found (%d)", member);
  etcd_cluster_pause(&cluster, member);
  EXPECT(rdzv_client_set(c, "s", "during", S("2")), HVD_OK);
  ck_assert_int_ne(connected_member(), member);
  expect_value(c, "s", "before", "1");
  EXPECT(rdzv_client_get_scope(c, "s", 2, TIMEOUT_MS, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 2);
  rdzv_scope_view_fini(&view);
  etcd_cluster_resume(&cluster, member);
  etcd_cluster_leader(&cluster);
  EXPECT(rdzv_client_set(c, "s", "after", S("3")), HVD_OK);
  rdzv_client_destroy(c);
}
END_TEST

/* Two of three members gone: each call fails within the client's timeout,
 * saying that a majority is needed; with them back, the same client
 * works again. */
START_TEST(quorum_lost_and_regained) {
  enum { TIMEOUT = 2000 };
  struct rdzv_client *c;
  struct hvd_buf v;
  int64_t started;
  hvd_status st;
  int leader, other;

  hvd_buf_init(&v, 0);
  etcd_cluster_start(&cluster, 3);
  c = client_at(url_for("quorum"), TIMEOUT);
  EXPECT(rdzv_client_set(c, "s", "k", S("kept")), HVD_OK);
  leader = etcd_cluster_leader(&cluster);
  other = (leader + 1) % 3;
  etcd_cluster_kill(&cluster, leader);
  etcd_cluster_kill(&cluster, other);
  started = hvd_now_ns();
  st = rdzv_client_set(c, "s", "lost", S("x"));
  ck_assert_msg(st == HVD_ERR_TIMEOUT || st == HVD_ERR_NETWORK, "%s: %s", hvd_strerror(st),
                hvd_last_error_message());
  expect_message("majority");
  expect_message("PUT /s/lost");
  /* a bound that only a hang breaks, not a measurement */
  ck_assert_msg(hvd_now_ns() - started < (int64_t)(TIMEOUT + 10000) * 1000000,
                "the call took %.1f s with a %d ms timeout", (hvd_now_ns() - started) / 1e9,
                TIMEOUT);
  st = rdzv_client_get(c, "s", "k", &v, NULL);
  ck_assert_msg(st == HVD_ERR_TIMEOUT || st == HVD_ERR_NETWORK, "%s: %s", hvd_strerror(st),
                hvd_last_error_message());
  expect_message("majority");
  st = rdzv_client_wait(c, "s", "never", -1, &v);
  ck_assert_msg(st == HVD_ERR_TIMEOUT || st == HVD_ERR_NETWORK, "%s: %s", hvd_strerror(st),
                hvd_last_error_message());
  etcd_cluster_restart(&cluster, leader);
  etcd_cluster_restart(&cluster, other);
  etcd_cluster_leader(&cluster);
  rdzv_client_set_timeout_ms(c, TIMEOUT_MS);
  EXPECT(rdzv_client_set(c, "s", "regained", S("y")), HVD_OK);
  expect_value(c, "s", "k", "kept");
  expect_value(c, "s", "regained", "y");
  rdzv_client_destroy(c);
  hvd_buf_fini(&v);
}
END_TEST

/* ==== lease ================================================================== */

/* Whether every raw key is gone, reading until the deadline. */
static bool await_gone(const char *const *names, const char *key, int64_t deadline_ns,
                       struct rdzv_client *busy) {
  for (;;) {
    bool all = true;
    for (size_t i = 0; names[i] != NULL; i++) {
      char *v = raw_get(names[i], key);
      all = all && v == NULL;
      free(v);
    }
    if (all || hvd_now_ns() >= deadline_ns)
      return all;
    /* the busy job keeps using the store meanwhile */
    EXPECT(rdzv_client_get(busy, "s", "k", NULL, NULL), HVD_OK);
    hvd_sleep_ns(200000000);
  }
}

START_TEST(lease_expires_with_its_job) {
  static const char *const idle[] = {"gone", "quiet", NULL};
  struct rdzv_client *busy, *gone, *quiet, *late;
  char *first, *second, *v;

  setenv("HVD_ETCD_LEASE_SECONDS", "5", 1);
  etcd_cluster_start(&cluster, 1);
  /* the busy job first: its lease would expire before the others' */
  busy = client_at(url_for("busy"), TIMEOUT_MS);
  EXPECT(rdzv_client_set(busy, "s", "k", S("busy")), HVD_OK);
  gone = client_at(url_for("gone"), TIMEOUT_MS);
  EXPECT(rdzv_client_set(gone, "s", "k", S("gone")), HVD_OK);
  EXPECT(rdzv_client_set(gone, "t", "k", S("gone")), HVD_OK);
  rdzv_client_destroy(gone);
  quiet = client_at(url_for("quiet"), TIMEOUT_MS);
  EXPECT(rdzv_client_set(quiet, "s", "k", S("quiet")), HVD_OK);
  first = raw_get("quiet", "_lease");
  ck_assert_ptr_nonnull(first);
  /* the keys of the job whose client is gone and of the quiet one expire
   * (5 s, and etcd's checks), while the busy job's stay */
  ck_assert_msg(await_gone(idle, "s/k", hvd_deadline_after_ms(30000), busy),
                "keys of idle jobs still there 30 s after a lease of 5 s");
  ck_assert_ptr_null(v = raw_get("gone", "t/k"));
  ck_assert_ptr_null(v = raw_get("gone", "_lease"));
  ck_assert_ptr_nonnull(v = raw_get("busy", "s/k"));
  ck_assert_str_eq(v, "busy");
  free(v);
  ck_assert_ptr_nonnull(v = raw_get("busy", "_lease"));
  free(v);
  expect_value(busy, "s", "k", "busy");
  /* the quiet job's client goes on, under a new lease */
  EXPECT(rdzv_client_set(quiet, "s", "k2", S("again")), HVD_OK);
  expect_value(quiet, "s", "k2", "again");
  EXPECT(rdzv_client_get(quiet, "s", "k", NULL, NULL), HVD_ERR_NOT_FOUND);
  second = raw_get("quiet", "_lease");
  ck_assert_ptr_nonnull(second);
  ck_assert_str_ne(first, second);
  /* a new client of the gone job finds nothing */
  late = client_at(url_for("gone"), TIMEOUT_MS);
  EXPECT(rdzv_client_get(late, "s", "k", NULL, NULL), HVD_ERR_NOT_FOUND);
  free(first);
  free(second);
  rdzv_client_destroy(late);
  rdzv_client_destroy(quiet);
  rdzv_client_destroy(busy);
}
END_TEST

/* ==== auth =================================================================== */

/* A client as user (NULL: none) with password, and its first write's
 * status. */
static hvd_status write_as(const char *user, const char *password) {
  struct rdzv_client *c;
  hvd_status st;
  clear_settings();
  if (user != NULL)
    setenv("HVD_ETCD_USER", user, 1);
  if (password != NULL)
    setenv("HVD_ETCD_PASSWORD", password, 1);
  c = client_at(url_for("auth"), 5000);
  st = rdzv_client_set(c, "s", "k", S("v"));
  rdzv_client_destroy(c);
  return st;
}

START_TEST(wrong_credentials_refused) {
  struct rdzv_client *c;
  struct rdzv_scope_view view;
  struct hvd_buf v;
  int64_t n;

  hvd_buf_init(&v, 0);
  etcd_cluster_start(&cluster, 1);
  etcd_cluster_enable_auth(&cluster, "s3cret");
  /* no user: etcd's 'user name is empty', with what to set */
  EXPECT(write_as(NULL, NULL), HVD_ERR_UNAUTHORIZED);
  expect_message("set HVD_ETCD_USER and HVD_ETCD_PASSWORD");
  EXPECT(write_as("root", "wrong"), HVD_ERR_UNAUTHORIZED);
  expect_message("HVD_ETCD_USER");
  expect_message("HVD_ETCD_PASSWORD");
  EXPECT(write_as("nobody", "s3cret"), HVD_ERR_UNAUTHORIZED);
  expect_message("HVD_ETCD_USER");
  EXPECT(write_as("root", NULL), HVD_ERR_UNAUTHORIZED);
  /* the right one: every kind of call */
  EXPECT(write_as("root", "s3cret"), HVD_OK);
  c = client_at(url_for("auth"), TIMEOUT_MS);
  expect_value(c, "s", "k", "v");
  EXPECT(rdzv_client_wait(c, "s", "k", TIMEOUT_MS, &v), HVD_OK);
  EXPECT(rdzv_client_add(c, "s", "n", 2, &n), HVD_OK);
  EXPECT(rdzv_client_cas(c, "s", "c", 0, S("x"), NULL, NULL, NULL), HVD_OK);
  EXPECT(rdzv_client_get_scope(c, "s", 3, TIMEOUT_MS, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 3);
  rdzv_scope_view_fini(&view);
  rdzv_client_destroy(c);
  hvd_buf_fini(&v);
}
END_TEST

/* etcd keeps its tokens in memory: a restarted member refuses the client's
 * token, and the client logs in again. */
START_TEST(token_renewed_after_restart) {
  struct rdzv_client *c;

  etcd_cluster_start(&cluster, 1);
  etcd_cluster_enable_auth(&cluster, "s3cret");
  setenv("HVD_ETCD_USER", "root", 1);
  setenv("HVD_ETCD_PASSWORD", "s3cret", 1);
  c = client_at(url_for("auth"), TIMEOUT_MS);
  EXPECT(rdzv_client_set(c, "s", "k", S("before")), HVD_OK);
  etcd_cluster_kill(&cluster, 0);
  etcd_cluster_restart(&cluster, 0);
  EXPECT(rdzv_client_set(c, "s", "k", S("after")), HVD_OK);
  expect_value(c, "s", "k", "after");
  rdzv_client_destroy(c);
}
END_TEST

/* ==== tls ==================================================================== */

static int remove_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

/* A CA, a server certificate for IP 127.0.0.1 (serverAuth and clientAuth:
 * etcd's gateway dials its member with it) and a client certificate, made
 * by openssl in tmp_dir. */
static void make_certificates(void) {
  static const char script[] =
      "set -e\n"
      "cd \"$1\"\n"
      "req() { /usr/bin/openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "\"$@\"; }\n"
      "sign() { /usr/bin/openssl x509 -req -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 "
      "\"$@\"; }\n"
      "req -x509 -days 2 -keyout ca.key -out ca.crt -subj /CN=hvd-test-ca\n"
      "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' "
      "> server.ext\n"
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n"
      "req -keyout server.key -out server.csr -subj /CN=127.0.0.1\n"
      "sign -in server.csr -out server.crt -extfile server.ext\n"
      "req -keyout client.key -out client.csr -subj /CN=hvd-client\n"
      "sign -in client.csr -out client.crt -extfile client.ext\n";
  const char *tmp = getenv("TMPDIR");
  char log[300];
  int status;
  pid_t pid;

  snprintf(tmp_dir, sizeof(tmp_dir), "%s/hvd-tls-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
  ck_assert_msg(mkdtemp(tmp_dir) != NULL, "mkdtemp: %s", strerror(errno));
  snprintf(log, sizeof(log), "%s/openssl.log", tmp_dir);
  pid = fork();
  if (pid == 0) {
    FILE *out = freopen(log, "w", stderr);
    if (out == NULL || dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
      _exit(126);
    execl("/bin/sh", "sh", "-c", script, "sh", tmp_dir, (char *)NULL);
    _exit(127);
  }
  ck_assert_int_gt(pid, 0);
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    char text[4096] = "";
    FILE *f = fopen(log, "r");
    size_t n = f != NULL ? fread(text, 1, sizeof(text) - 1, f) : 0;
    text[n] = '\0';
    if (f != NULL)
      fclose(f);
    ck_abort_msg("openssl failed (status %d):\n%s", status, text);
  }
}

static void tls_setup(void) {
  struct etcd_cluster_tls tls;
  make_certificates();
  snprintf(tls.cert, sizeof(tls.cert), "%s/server.crt", tmp_dir);
  snprintf(tls.key, sizeof(tls.key), "%s/server.key", tmp_dir);
  snprintf(tls.ca, sizeof(tls.ca), "%s/ca.crt", tmp_dir);
  etcd_cluster_start_tls(&cluster, 1, &tls);
}

static void tls_teardown(void) {
  teardown();
  if (tmp_dir[0] != '\0')
    nftw(tmp_dir, remove_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void set_file(const char *name, const char *file) {
  char path[300];
  snprintf(path, sizeof(path), "%s/%s", tmp_dir, file);
  setenv(name, path, 1);
}

static const char *tls_url(void) {
  static char url[512];
  snprintf(url, sizeof(url), "etcds://%s/hvdtest/tls", cluster.tls_endpoints);
  return url;
}

START_TEST(client_certificate_accepted) {
  struct op_thread t = {.op = OP_WAIT, .scope = "s", .key = "late"};
  struct rdzv_client *c;
  struct rdzv_scope_view view;
  int64_t n;

  set_file("HVD_ETCD_CACERT", "ca.crt");
  set_file("HVD_ETCD_CERT", "client.crt");
  set_file("HVD_ETCD_KEY", "client.key");
  c = client_at(tls_url(), TIMEOUT_MS);
  ck_assert_msg(strncmp(rdzv_client_where(c), "etcds://", 8) == 0, "%s", rdzv_client_where(c));
  EXPECT(rdzv_client_set(c, "s", "k", S("over TLS")), HVD_OK);
  expect_value(c, "s", "k", "over TLS");
  EXPECT(rdzv_client_add(c, "s", "n", 5, &n), HVD_OK);
  ck_assert_int_eq(n, 5);
  /* a watch stream over TLS */
  t.client = client_at(tls_url(), TIMEOUT_MS);
  op_start(&t);
  await_watchers(1);
  EXPECT(rdzv_client_set(c, "s", "late", S("came")), HVD_OK);
  op_join(&t, HVD_OK);
  ck_assert_str_eq(t.value_out.data, "came");
  EXPECT(rdzv_client_get_scope(c, "s", 3, TIMEOUT_MS, &view), HVD_OK);
  ck_assert_uint_eq(view.count, 3);
  rdzv_scope_view_fini(&view);
  op_fini(&t);
  rdzv_client_destroy(c);
}
END_TEST

/* The members require a client certificate: without one, a clear error
 * about certificates (not a hang, not 'no member reached'). */
START_TEST(missing_client_certificate_refused) {
  struct rdzv_client *c;
  hvd_status st;

  set_file("HVD_ETCD_CACERT", "ca.crt");
  c = client_at(tls_url(), 3000);
  st = rdzv_client_set(c, "s", "k", S("v"));
  ck_assert_msg(st != HVD_OK, "a write without a client certificate");
  expect_message("HVD_ETCD_CERT");
  rdzv_client_destroy(c);
}
END_TEST

/* The members' certificate from a CA the client does not trust. */
START_TEST(unknown_ca_refused) {
  struct rdzv_client *c;
  hvd_status st;

  set_file("HVD_ETCD_CERT", "client.crt");
  set_file("HVD_ETCD_KEY", "client.key");
  c = client_at(tls_url(), 3000); /* the system's CAs */
  st = rdzv_client_set(c, "s", "k", S("v"));
  ck_assert_msg(st != HVD_OK, "a write to a member whose CA is unknown");
  expect_message("HVD_ETCD_CACERT");
  rdzv_client_destroy(c);
}
END_TEST

/* ==== lead =================================================================== */

static struct op_thread candidate(const char *value, int ttl_s, int64_t timeout_ms) {
  struct op_thread t = {.op = OP_LEAD, .scope = "elect", .key = "leader", .value = value,
                        .ttl_s = ttl_s, .timeout_ms = timeout_ms};
  t.client = client_at(url_for("lead"), TIMEOUT_MS);
  return t;
}

static void expect_leader(const char *value) {
  char *v = raw_get("lead", "elect/leader");
  ck_assert_msg(v != NULL, "nobody leads, want %s", value);
  ck_assert_str_eq(v, value);
  free(v);
}

/* The leader stops renewing: its lease (2 s) expires and the other, which
 * waited, leads well within its own timeout. */
START_TEST(lead_passes_when_the_leader_stops_renewing) {
  struct op_thread b = {0};
  struct rdzv_client *a;

  etcd_cluster_start(&cluster, 1);
  a = client_at(url_for("lead"), TIMEOUT_MS);
  EXPECT(rdzv_client_lead(a, "elect", "leader", "A", 2, TIMEOUT_MS), HVD_OK);
  EXPECT(rdzv_client_lead_renew(a), HVD_OK);
  expect_leader("A");
  b = candidate("B", 2, 2000 + 8000);
  op_start(&b);
  await_watchers(1);
  EXPECT(rdzv_client_lead_renew(a), HVD_OK); /* A still leads, B still waits */
  expect_leader("A");
  ck_assert(!atomic_load(&b.done));
  /* A does nothing more */
  op_join(&b, HVD_OK);
  expect_leader("B");
  EXPECT(rdzv_client_lead_renew(b.client), HVD_OK);
  EXPECT(rdzv_client_lead_renew(a), HVD_ERR_NOT_FOUND);
  expect_message("expired");
  /* A is a candidate again, and waits */
  EXPECT(rdzv_client_lead(a, "elect", "leader", "A", 2, SHORT_MS), HVD_ERR_TIMEOUT);
  expect_message("another holds it");
  op_fini(&b);
  rdzv_client_destroy(a);
}
END_TEST

/* Resigning, or being destroyed, hands the leadership over at once: the
 * leases are 30 s, the waiting candidates' timeouts 10 s. */
START_TEST(lead_passes_at_resign_and_destroy) {
  struct op_thread b = {0}, c = {0};
  struct rdzv_client *a;

  etcd_cluster_start(&cluster, 1);
  a = client_at(url_for("lead"), TIMEOUT_MS);
  EXPECT(rdzv_client_lead(a, "elect", "leader", "A", 30, TIMEOUT_MS), HVD_OK);
  b = candidate("B", 30, 10000);
  op_start(&b);
  await_watchers(1);
  rdzv_client_lead_resign(a);
  op_join(&b, HVD_OK);
  expect_leader("B");
  EXPECT(rdzv_client_lead_renew(a), HVD_ERR_NOT_FOUND);
  c = candidate("C", 30, 10000);
  op_start(&c);
  await_watchers(1);
  op_fini(&b); /* destroyed while leading */
  op_join(&c, HVD_OK);
  expect_leader("C");
  op_fini(&c);
  rdzv_client_destroy(a);
}
END_TEST

START_TEST(wait_change_wakes_at_its_scope_only) {
  struct op_thread t = {.op = OP_CHANGE, .scope = "w"};
  struct rdzv_client *c;
  uint64_t v1 = 0, v2 = 0, seen = 0;

  etcd_cluster_start(&cluster, 1);
  c = client_at(url_for("change"), TIMEOUT_MS);
  EXPECT(rdzv_client_set(c, "w", "a", S("1")), HVD_OK);
  EXPECT(rdzv_client_get(c, "w", "a", NULL, &v1), HVD_OK);
  /* after v1: the next change, whenever the waiter starts */
  t.client = client_at(url_for("change"), TIMEOUT_MS);
  t.after = v1;
  op_start(&t);
  EXPECT(rdzv_client_set(c, "w", "b", S("2")), HVD_OK);
  op_join(&t, HVD_OK);
  EXPECT(rdzv_client_get(c, "w", "b", NULL, &v2), HVD_OK);
  ck_assert_uint_eq(t.after, v2);
  /* changes of other scopes, one named alike included, do not count */
  EXPECT(rdzv_client_set(c, "w2", "a", S("x")), HVD_OK);
  EXPECT(rdzv_client_set(c, "x", "a", S("x")), HVD_OK);
  EXPECT(rdzv_client_wait_change(c, "w", v2, SHORT_MS, &seen), HVD_ERR_TIMEOUT);
  expect_message("/w");
  /* a deletion is a change, seen even when it came before the call */
  EXPECT(rdzv_client_delete(c, "w", "a"), HVD_OK);
  EXPECT(rdzv_client_wait_change(c, "w", v2, TIMEOUT_MS, &seen), HVD_OK);
  ck_assert_uint_gt(seen, v2);
  /* 0: the first change after the call began, whichever of these puts
   * that is (the waiter's start is not observable) */
  EXPECT(rdzv_client_get(c, "w", "b", NULL, &v1), HVD_OK);
  t.after = 0;
  op_start(&t);
  for (int i = 0; !atomic_load(&t.done); i++) {
    char value[16];
    snprintf(value, sizeof(value), "%d", i);
    ck_assert_msg(i < 1000, "wait_change(0) saw none of %d changes", i);
    EXPECT(rdzv_client_set(c, "w", "tick", S(value)), HVD_OK);
    EXPECT(rdzv_client_get(c, "w", "tick", NULL, &v2), HVD_OK);
    hvd_sleep_ns(10000000);
  }
  op_join(&t, HVD_OK);
  ck_assert_uint_gt(t.after, v1);
  ck_assert_uint_le(t.after, v2);
  op_fini(&t);
  rdzv_client_destroy(c);
}
END_TEST

/* ==== suites ================================================================= */

/* A suite of one test case whose fixture runs around each case. */
static TCase *case_of(Suite *s, const char *name, void (*setup)(void), void (*down)(void)) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, setup, down);
  suite_add_tcase(s, tc);
  return tc;
}

static Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = case_of(s, "config", NULL, clear_settings);
  tcase_add_test(tc, bad_urls);
  tcase_add_test(tc, good_urls);
  tcase_add_test(tc, bad_settings);
  tcase_add_test(tc, refused_scope_names);
  return s;
}

static Suite *failover_suite(void) {
  Suite *s = suite_create("failover");
  TCase *tc = case_of(s, "failover", NULL, teardown);
  tcase_add_test(tc, leader_killed_while_clients_wait);
  tcase_add_test(tc, leader_killed_while_writing);
  return s;
}

static Suite *partition_suite(void) {
  Suite *s = suite_create("partition");
  TCase *tc = case_of(s, "partition", NULL, teardown);
  tcase_add_test(tc, paused_member_is_passed_over);
  tcase_add_test(tc, quorum_lost_and_regained);
  return s;
}

static Suite *lease_suite(void) {
  Suite *s = suite_create("lease");
  TCase *tc = case_of(s, "lease", NULL, teardown);
  tcase_add_test(tc, lease_expires_with_its_job);
  return s;
}

static Suite *auth_suite(void) {
  Suite *s = suite_create("auth");
  TCase *tc = case_of(s, "auth", NULL, teardown);
  tcase_add_test(tc, wrong_credentials_refused);
  tcase_add_test(tc, token_renewed_after_restart);
  return s;
}

static Suite *tls_suite(void) {
  Suite *s = suite_create("tls");
  TCase *tc = case_of(s, "tls", tls_setup, tls_teardown);
  tcase_add_test(tc, client_certificate_accepted);
  tcase_add_test(tc, missing_client_certificate_refused);
  tcase_add_test(tc, unknown_ca_refused);
  return s;
}

static Suite *lead_suite(void) {
  Suite *s = suite_create("lead");
  TCase *tc = case_of(s, "lead", NULL, teardown);
  tcase_add_test(tc, lead_passes_when_the_leader_stops_renewing);
  tcase_add_test(tc, lead_passes_at_resign_and_destroy);
  tcase_add_test(tc, wait_change_wakes_at_its_scope_only);
  return s;
}

int main(void) {
  const char *only = getenv("CK_RUN_SUITE");
  const char *missing = etcd_cluster_missing();
  SRunner *sr;
  int failed;

  if (missing == NULL && access("/usr/bin/openssl", X_OK) != 0 && only != NULL &&
      strcmp(only, "tls") == 0)
    missing = "no /usr/bin/openssl to make the certificates with";
  if (missing != NULL && only != NULL && strcmp(only, "config") != 0) {
    printf("skipped: %s\n", missing);
    return 77;
  }
  clear_settings();
  sr = srunner_create(config_suite());
  if (missing == NULL) {
    srunner_add_suite(sr, failover_suite());
    srunner_add_suite(sr, partition_suite());
    srunner_add_suite(sr, lease_suite());
    srunner_add_suite(sr, auth_suite());
    srunner_add_suite(sr, tls_suite());
    srunner_add_suite(sr, lead_suite());
  } else {
    printf("etcd suites skipped: %s\n", missing);
  }
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
