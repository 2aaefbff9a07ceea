/*
 * The rendezvous module: the key-value store every rank of a job meets in,
 * its HTTP server (libmicrohttpd) and its HTTP client (libcurl).
 * The wire protocol is documented in docs/rendezvous-protocol.md.
 *
 * Only this module includes libmicrohttpd, libcurl or cJSON headers.
 */
#ifndef HVD_RENDEZVOUS_H
#define HVD_RENDEZVOUS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/common.h"

/* ==== values ================================================================
 * An immutable, reference-counted byte string: a stored value or a serialized
 * scope. Readers take a reference under the store lock and send it without
 * copying; the last unref frees it. data[len] is always '\0'.
 */
struct rdzv_ledger;

struct rdzv_blob {
  atomic_size_t refs;
  uint64_t version; /* store-wide write counter at creation (the ETag) */
  size_t len;
  struct rdzv_ledger *ledger; /* set once its owner let go while others held it */
  unsigned char data[];
};

struct rdzv_blob *rdzv_blob_create(const void *data, size_t len, uint64_t version);
struct rdzv_blob *rdzv_blob_ref(struct rdzv_blob *b);
void rdzv_blob_unref(struct rdzv_blob *b);
/* The owner drops its reference; while others still hold b, its length is
 * counted in l (until the last reference goes). */
void rdzv_blob_release_to(struct rdzv_blob *b, struct rdzv_ledger *l);

/* Bytes held outside a store on its behalf: values it let go of that readers
 * still hold, request bodies being received. Thread-safe, lock-free. */
struct rdzv_ledger *rdzv_ledger_create(void);
void rdzv_ledger_unref(struct rdzv_ledger *l);
size_t rdzv_ledger_bytes(struct rdzv_ledger *l);
void rdzv_ledger_charge(struct rdzv_ledger *l, size_t bytes);
void rdzv_ledger_discharge(struct rdzv_ledger *l, size_t bytes);

/* ==== whole-scope body (scope_codec.c) ======================================
 * A scope travels as a sequence of entries, each
 *   "<key bytes> <value bytes>\n" <key> "\n" <value> "\n"
 * ordered by key (decimal keys numerically first, then bytewise).
 */
struct rdzv_entry {
  const char *key; /* NUL-terminated, points into the decoded body */
  size_t key_len;
  const unsigned char *value; /* NUL-terminated too, may hold any bytes */
  size_t value_len;
};

struct rdzv_scope_view {
  struct rdzv_entry *entries;
  size_t count;
  char *body; /* owns the bytes entries point into */
};

/* Orders keys as the scope body does; a strcmp-style result. */
int rdzv_key_compare(const char *a, size_t a_len, const char *b, size_t b_len);
hvd_status rdzv_scope_encode_entry(struct hvd_buf *out, const char *key, size_t key_len,
                                   const void *value, size_t value_len);
/* Takes ownership of body (malloc'ed, len bytes) whatever the result. */
hvd_status rdzv_scope_decode(char *body, size_t len, struct rdzv_scope_view *out);
/* The value of key in the view, or NULL. */
const struct rdzv_entry *rdzv_scope_find(const struct rdzv_scope_view *v, const char *key);
void rdzv_scope_view_fini(struct rdzv_scope_view *v);

/* ==== peer records (record.c) ==============================================
 * What a rank publishes about itself in a scope so that its peers can reach
 * it: JSON, e.g.
 *   {"v":1,"rank":3,"global_rank":3,"host":"node1","local_rank":1,"pid":4242,
 *    "gen":"0","port":40123,"addrs":["10.0.0.5","127.0.0.1"]}
 * Decoding checks every field's type and range.
 */
enum { RDZV_RECORD_MAX_ADDRS = 8, RDZV_RECORD_ADDR_MAX = 64, RDZV_RECORD_HOST_MAX = 256 };

struct rdzv_record {
  int rank;        /* in the scope */
  int global_rank;
  char host[RDZV_RECORD_HOST_MAX];
  int local_rank; /* -1: unknown */
  int pid;
  uint64_t generation;
  int port;
  char addrs[RDZV_RECORD_MAX_ADDRS][RDZV_RECORD_ADDR_MAX];
  size_t naddrs;
  int shm; /* the rank's HVD_SHM, 0 or 1; -1: the record does not say (optional) */
};

/* What the elastic driver writes in place of the records that never came
 * when it abandons a round (a worker failed while the others met): the
 * ranks waiting for them give up at once instead of at their timeout. */
#define RDZV_RECORD_ABANDONED "hvd:round-abandoned"

hvd_status rdzv_record_encode(const struct rdzv_record *r, struct hvd_buf *out);
hvd_status rdzv_record_decode(const void *text, size_t len, struct rdzv_record *out);

/* ==== the store (store.c, store_wait.c) =====================================
 * Scopes of keys to values, planned scopes that clear themselves once all
 * their ranks have finished, atomic add and compare-and-set, and waiters
 * that long-poll for a key or for a scope to reach a number of keys.
 * All calls are thread-safe (one mutex).
 */
struct rdzv_store;

struct rdzv_store_limits {
  size_t max_name_bytes;  /* per scope name and per key */
  size_t max_value_bytes; /* per value */
  size_t max_total_bytes; /* keys, values, scope bodies, overheads, and what readers hold */
};

void rdzv_store_limits_default(struct rdzv_store_limits *limits);

enum rdzv_wait_result {
  RDZV_WAIT_PENDING = 0,
  RDZV_WAIT_READY,     /* value holds the key's value or the scope's body */
  RDZV_WAIT_TIMEOUT,   /* the deadline passed first */
  RDZV_WAIT_CANCELLED, /* the store is closing */
  RDZV_WAIT_ABANDONED, /* its requester went away (rdzv_store_abandon_wait) */
};

/*
 * A long-poll request. The caller fills the request fields, owns the memory
 * and must keep it alive until the store hands it back through the fire
 * callback (once registered, the store is the only one who may finish it).
 */
struct rdzv_waiter;

/* Called, without the store lock, once for every waiter that finishes after
 * registering: when its key or count arrives, its deadline passes, or the
 * store closes. Runs on the thread that caused it (or the deadline thread). */
typedef void (*rdzv_fire_cb)(struct rdzv_waiter *w, void *arg);

struct rdzv_waiter {
  /* request */
  const char *scope;
  size_t scope_len;
  const char *key; /* NULL: wait until the scope holds min_count keys */
  size_t key_len;
  size_t min_count;
  /* With key NULL: wait instead until the scope changes (a key set, added
   * to, deleted or cleared) after it was at version `after` (0: any
   * change, or a scope that exists already). */
  bool changes;
  uint64_t after;
  int64_t deadline_ns;
  void *owner;
  rdzv_fire_cb fire; /* NULL: the store's; else this one, with fire_arg */
  void *fire_arg;
  /* result, valid once result != RDZV_WAIT_PENDING */
  enum rdzv_wait_result result;
  struct rdzv_blob *value; /* a reference the caller releases */
  size_t count;            /* scope waits: entries in value */
  uint64_t version;        /* change waits: the scope's version now (the next `after`) */
  /* store-private */
  struct rdzv_scope *scope_obj;
  struct rdzv_waiter *prev, *next;
  struct rdzv_waiter *fired_next;
  size_t heap_index;
  bool abandoned;
};
/* Called with the store lock held right after a waiter registers, so that the
 * owner can park it before anybody can fire it. Must not call the store. */
typedef void (*rdzv_park_cb)(struct rdzv_waiter *w, void *arg);

enum rdzv_set_condition {
  RDZV_SET_ALWAYS = 0,
  RDZV_SET_IF_ABSENT,  /* create only */
  RDZV_SET_IF_VERSION, /* replace only the version given */
};

struct rdzv_store_stats {
  size_t scopes;
  size_t keys;
  size_t bytes;      /* charged by what the store holds */
  size_t held_bytes; /* charged by what readers and uploads hold (also limited) */
  size_t waiters;
  size_t planned_scopes;
};

hvd_status rdzv_store_create(const struct rdzv_store_limits *limits, rdzv_fire_cb fire,
                             void *fire_arg, struct rdzv_store **out);
/* Fires every waiter as cancelled; later waits are cancelled at once.
 * Returns once no thread is handing finished waiters to the fire callback,
 * or HVD_ERR_TIMEOUT after 10 s if one still is (a callback that blocks). */
hvd_status rdzv_store_close(struct rdzv_store *s);
/* Closes if needed and frees everything (except after a close that timed
 * out: the store is then left allocated, and the error logged). NULL is a
 * no-op. */
void rdzv_store_destroy(struct rdzv_store *s);

/* Drops every key and plan (a new job or an elastic round). Waiters stay. */
void rdzv_store_reset(struct rdzv_store *s);
/* Declares that `scope` has `size` ranks (0 removes the plan): once each of
 * the keys "0".."size-1" has been deleted, the scope is cleared. */
hvd_status rdzv_store_plan(struct rdzv_store *s, const char *scope, size_t scope_len, size_t size);
/* How many times every rank of the planned scope has finished (and the
 * scope cleared itself): hvdrun's proof that all ranks came, even after
 * their records are gone. */
size_t rdzv_store_plan_rounds(struct rdzv_store *s, const char *scope, size_t scope_len);

hvd_status rdzv_store_get(struct rdzv_store *s, const char *scope, size_t scope_len,
                          const char *key, size_t key_len, struct rdzv_blob **out);
/*
 * Stores a copy of data. With a condition that does not hold, returns
 * HVD_ERR_CONFLICT and (if current is not NULL) a reference to the current
 * value or NULL when the key is absent. *version gets the new value's version.
 */
hvd_status rdzv_store_set(struct rdzv_store *s, const char *scope, size_t scope_len,
                          const char *key, size_t key_len, const void *data, size_t len,
                          enum rdzv_set_condition cond, uint64_t expected_version,
                          uint64_t *version, struct rdzv_blob **current);
/* Adds delta to a decimal int64 value (a missing key counts as 0). A value
 * that is not an integer, or an overflow, is HVD_ERR_CONFLICT. */
hvd_status rdzv_store_add(struct rdzv_store *s, const char *scope, size_t scope_len,
                          const char *key, size_t key_len, int64_t delta, int64_t *result,
                          uint64_t *version);
/* Removes the key; in a planned scope, rank keys are marked finished instead
 * and the scope is cleared when every rank has finished. Absent keys are fine. */
hvd_status rdzv_store_delete(struct rdzv_store *s, const char *scope, size_t scope_len,
                             const char *key, size_t key_len);
hvd_status rdzv_store_delete_scope(struct rdzv_store *s, const char *scope, size_t scope_len);
/* A reference to the serialized scope (see scope_codec) and its entry count. */
hvd_status rdzv_store_snapshot(struct rdzv_store *s, const char *scope, size_t scope_len,
                               struct rdzv_blob **out, size_t *count);
/*
 * Starts a long-poll. If it can finish at once (ready, deadline passed, store
 * closing) w->result says how, and no callback is made. Otherwise park(w) is
 * called under the lock and fire(w) later.
 */
hvd_status rdzv_store_wait(struct rdzv_store *s, struct rdzv_waiter *w, rdzv_park_cb park,
                           void *park_arg);
/* The waiter's requester went away: if it is still pending, the deadline
 * thread soon finishes it as RDZV_WAIT_ABANDONED (through the fire
 * callback, as always) and true is returned; false if it is not pending
 * (not registered yet, or finished). w must stay valid during the call;
 * this takes only the store lock, so it may be called under other locks. */
bool rdzv_store_abandon_wait(struct rdzv_store *s, struct rdzv_waiter *w);
void rdzv_store_get_stats(struct rdzv_store *s, struct rdzv_store_stats *out);
/* Charges bytes held outside the store (a request body being received) to
 * its limit; HVD_ERR_TOO_LARGE when they do not fit. */
hvd_status rdzv_store_reserve(struct rdzv_store *s, size_t bytes);
void rdzv_store_unreserve(struct rdzv_store *s, size_t bytes);

/* ==== the HTTP server (server.c) ============================================ */
struct rdzv_server;
struct sockaddr;

/*
 * Admission (POST /_admit): a process without the job token proves who it
 * is, and the server answers with the job's name and token. The server
 * only gathers the evidence; the callback (the launch module's) decides.
 * It runs on an event loop: it must be quick (one round trip to a local
 * daemon at most) and must not call the server.
 */
struct rdzv_admit_request {
  const char *credential;     /* the X-Hvd-Credential header, or NULL */
  const struct sockaddr *peer; /* where the connection comes from */
  const struct sockaddr *local; /* the address of ours it reached */
};
/* Returns true to admit; otherwise writes the reason (one line) to why. */
typedef bool (*rdzv_admit_cb)(const struct rdzv_admit_request *req, void *arg, char *why,
                              size_t why_size);

#define RDZV_ADMIT_SCOPE "_admit"
#define RDZV_ADMIT_PATH "/" RDZV_ADMIT_SCOPE
#define RDZV_CREDENTIAL_HEADER "X-Hvd-Credential"

enum { RDZV_MIN_PER_ADDRESS = 1024 };

struct rdzv_server_config {
  const char *bind_address; /* NULL or "": all interfaces, IPv6 and IPv4 */
  int port;                 /* 0: ephemeral */
  const char *token;        /* NULL: no authentication */
  struct rdzv_store_limits limits;
  unsigned threads;           /* event loops; 0: one per CPU, at most 4 */
  unsigned max_connections;   /* 0: as many as the file limit allows */
  /* From one address, so one host cannot take every slot; 0: a quarter of
   * max_connections, at least RDZV_MIN_PER_ADDRESS (the ranks of a host
   * share its address). */
  unsigned max_connections_per_address;
  unsigned idle_timeout_s;    /* close connections idle this long */
  /* A connection must send a request's headers within this many ms of its
   * start or of its previous request's end, and bodies and answers must
   * move at 1 MiB/s after 10 s (guard.c); 0: 5000. */
  unsigned header_timeout_ms;
  size_t max_header_bytes;    /* per connection, request line and headers */
  /* A GET of one key of this scope (if not NULL) waits for the key, as a
   * long-poll of up to RDZV_BLOCKING_GET_MS, even without ?wait: how
   * Horovod's rank_and_size answers once the elastic round is settled. */
  const char *blocking_scope;
  /* With a token: admission by proof (see rdzv_admit_cb); NULL refuses
   * every POST /_admit. The job's name goes with the token in the answer,
   * so that a rank can tell its own job's store from another's. */
  rdzv_admit_cb admit;
  void *admit_arg;
  const char *job;
};

#define RDZV_BLOCKING_GET_MS 600000

/* GET /metrics (server_metrics.c): the Prometheus text exposition of the
 * snapshots ranks PUT as RDZV_METRICS_SCOPE/<rank> (coord/metrics.c), every
 * sample labelled rank and host; those of earlier elastic rounds are left
 * out. Readable with the job's token, or without one from a loopback
 * address (docs/observability.md). */
#define RDZV_METRICS_PATH "/metrics"
#define RDZV_METRICS_SCOPE "hvd_metrics"
hvd_status rdzv_metrics_render(struct rdzv_store *store, struct hvd_buf *out);

void rdzv_server_config_default(struct rdzv_server_config *cfg);
hvd_status rdzv_server_start(const struct rdzv_server_config *cfg, struct rdzv_server **out);
/* Stops accepting, answers waiting clients 503, closes everything. NULL is a no-op. */
void rdzv_server_stop(struct rdzv_server *srv);
int rdzv_server_port(const struct rdzv_server *srv);
/* "ADDR:PORT", IPv6 in brackets. */
const char *rdzv_server_address(const struct rdzv_server *srv);
struct rdzv_store *rdzv_server_store(struct rdzv_server *srv);

/*
 * A server in a forked child process (server_child.c), for programs that
 * then fork ranks: the caller stays free of the server's threads, so its
 * forks are safe. Call before creating any thread. The child serves until
 * rdzv_server_child_stop (or until this process exits), and at most
 * max_lifetime_s seconds if that is not 0 (a test's safety net).
 */
struct rdzv_server_child {
  pid_t pid;
  int ctl;  /* closing it stops the child */
  int port; /* where it listens */
};
hvd_status rdzv_server_child_start(const struct rdzv_server_config *cfg, unsigned max_lifetime_s,
                                   struct rdzv_server_child *out);
void rdzv_server_child_stop(struct rdzv_server_child *child);

/* ==== the client (client.c, client_http.c, client_etcd.c) ===================
 * One client per thread (it holds one keep-alive connection). Every call has
 * a deadline: the client's timeout unless the call takes one. While the
 * server is not up yet, refused connections are retried with backoff until
 * the deadline. Two backends answer the same calls: hvd's own store over
 * HTTP, and an etcd cluster (docs/etcd.md), whose keys are
 * <prefix>/<scope>/<key>, kept under a job lease.
 */
struct rdzv_client;

/* HOROVOD_GLOO_TIMEOUT_SECONDS' default. */
#define RDZV_DEFAULT_TIMEOUT_MS 30000

hvd_status rdzv_client_create(const char *host, int port, const char *token, int64_t timeout_ms,
                              struct rdzv_client **out);
/* An etcd cluster's client: "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]" or
 * "etcds://..." (TLS); the HVD_ETCD_* settings give credentials and the
 * lease. (hvd's own store has no URL form: see rdzv_client_create.) */
hvd_status rdzv_client_create_url(const char *url, int64_t timeout_ms, struct rdzv_client **out);
/* HVD_RENDEZVOUS's etcd cluster if it is set; else hvd's store at
 * HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT with HVD_TOKEN. Both with
 * HOROVOD_GLOO_TIMEOUT_SECONDS. */
hvd_status rdzv_client_create_from_env(struct rdzv_client **out);
/* The server, for messages: "http://HOST:PORT" or "etcd://..." */
const char *rdzv_client_where(const struct rdzv_client *c);
/* Whether the store clears a planned scope once each rank deleted its key
 * (hvd's store); etcd's keys go with the job's lease instead. */
bool rdzv_client_plans_scopes(const struct rdzv_client *c);
void rdzv_client_destroy(struct rdzv_client *c);
int64_t rdzv_client_timeout_ms(const struct rdzv_client *c);
/* How long each later call may take (a heartbeat's is short). */
void rdzv_client_set_timeout_ms(struct rdzv_client *c, int64_t timeout_ms);
/* While fd >= 0, a call gives up with HVD_ERR_ABORTED as soon as fd is
 * readable (it is not read): another thread can end a long-poll at once. */
hvd_status rdzv_client_set_cancel_fd(struct rdzv_client *c, int fd);

hvd_status rdzv_client_set(struct rdzv_client *c, const char *scope, const char *key,
                           const void *value, size_t len);
/* HVD_ERR_NOT_FOUND when the key is absent. version may be NULL. */
hvd_status rdzv_client_get(struct rdzv_client *c, const char *scope, const char *key,
                           struct hvd_buf *value, uint64_t *version);
/* Long-polls until the key exists; timeout_ms < 0 uses the client's timeout. */
hvd_status rdzv_client_wait(struct rdzv_client *c, const char *scope, const char *key,
                            int64_t timeout_ms, struct hvd_buf *value);
/* Waits until every key exists. */
hvd_status rdzv_client_wait_keys(struct rdzv_client *c, const char *scope,
                                 const char *const *keys, size_t n, int64_t timeout_ms);
/* Every entry of the scope once it holds at least min_count keys. */
hvd_status rdzv_client_get_scope(struct rdzv_client *c, const char *scope, size_t min_count,
                                 int64_t timeout_ms, struct rdzv_scope_view *out);
/* Waits until the scope changes (a key set, added to or deleted) after its
 * version `after` (0: until the next change); *version is the version to
 * wait after next. etcd only (its revisions): HVD_ERR_UNSUPPORTED on hvd's
 * store, whose driver waits in-process. */
hvd_status rdzv_client_wait_change(struct rdzv_client *c, const char *scope, uint64_t after,
                                   int64_t timeout_ms, uint64_t *version);
/*
 * Leadership (etcd only; HVD_ERR_UNSUPPORTED on hvd's store): waits until
 * this client holds scope/key = value, created under a lease of its own
 * of ttl_s seconds, or the timeout ends (HVD_ERR_TIMEOUT). Whoever holds
 * the key leads; it stays while rdzv_client_lead_renew is called more
 * often than ttl_s, and goes (so another may lead) when it is not, or at
 * rdzv_client_lead_resign.
 */
hvd_status rdzv_client_lead(struct rdzv_client *c, const char *scope, const char *key,
                            const char *value, int ttl_s, int64_t timeout_ms);
/* Renews the leadership; HVD_ERR_NOT_FOUND once it was lost (its lease
 * expired: another may lead now). */
hvd_status rdzv_client_lead_renew(struct rdzv_client *c);
/* Gives the leadership up at once (its key goes with its lease). */
void rdzv_client_lead_resign(struct rdzv_client *c);
hvd_status rdzv_client_add(struct rdzv_client *c, const char *scope, const char *key,
                           int64_t delta, int64_t *result);
/*
 * Compare-and-set on versions: replaces the value only if its version is
 * expected_version, or creates it only if absent when expected_version is 0.
 * HVD_ERR_CONFLICT otherwise, with the current value and version (0: absent)
 * in *current / *current_version when those are not NULL.
 */
hvd_status rdzv_client_cas(struct rdzv_client *c, const char *scope, const char *key,
                           uint64_t expected_version, const void *value, size_t len,
                           uint64_t *new_version, struct hvd_buf *current,
                           uint64_t *current_version);
hvd_status rdzv_client_delete(struct rdzv_client *c, const char *scope, const char *key);
hvd_status rdzv_client_delete_scope(struct rdzv_client *c, const char *scope);
/* Admission (POST /_admit with the credential, NULL for none): the job's
 * name and token, as the server answers them. HVD_ERR_UNAUTHORIZED, with
 * the server's reason, when it refuses. */
hvd_status rdzv_client_admit(struct rdzv_client *c, const char *credential, struct hvd_buf *job,
                             struct hvd_buf *token);
/* The server's health document (JSON). */
hvd_status rdzv_client_health(struct rdzv_client *c, struct hvd_buf *json);

#endif /* HVD_RENDEZVOUS_H */
