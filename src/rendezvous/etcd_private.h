/*
 * Inside the etcd backend of the rendezvous client: its state, and what
 * its three files share. etcd_call.c sends requests to the members in turn
 * and reads watch streams; etcd_lease.c keeps the job's lease;
 * client_etcd.c maps the client's calls onto keys, ranges and
 * transactions. etcd_wire.h has the wire encodings.
 */
#ifndef HVD_RENDEZVOUS_ETCD_PRIVATE_H
#define HVD_RENDEZVOUS_ETCD_PRIVATE_H

#include "client_private.h"
#include "etcd_wire.h"

enum {
  ETCD_MAX_ENDPOINTS = 16,
  ETCD_ENDPOINT_MAX = 272,          /* "[v6 address]:port" */
  ETCD_ATTEMPT_MS = 3000,           /* a member that takes longer is passed over */
  ETCD_ATTEMPT_MIN_MS = 250, /* ... and for a client of short calls, an eighth of them */
  ETCD_WATCH_CHUNK_MS = 10000,      /* a watch is re-issued this often (a frozen member) */
  ETCD_LINE_MAX_BYTES = 256u << 20, /* one watch message */
};

/* Handles one watch event (revision: its own, the kv's mod revision);
 * returns true when the wait is over. */
typedef bool (*etcd_event_fn)(const cJSON *event, int64_t revision, void *arg);

struct etcd {
  char endpoints[ETCD_MAX_ENDPOINTS][ETCD_ENDPOINT_MAX];
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
  int64_t lead_lease; /* a leadership's own lease (etcd_elect.c); 0: none */
  int64_t lead_ttl_s;
  struct hvd_buf keybuf, endbuf, value;
  cJSON *answer; /* the last answer, parsed */
  /* a watch in progress */
  struct hvd_buf line;
  etcd_event_fn on_event;
  void *event_arg;
  bool watch_done;        /* on_event said so: the transfer was ended on purpose */
  bool watch_canceled;    /* etcd ended the watch (compaction, no leader) */
  int64_t watch_revision; /* the newest revision the watch reported */
};
static inline struct etcd *etcd_of(struct rdzv_client *c) { return c->backend; }

/* ---- etcd_call.c ---- */
/* POSTs body to /v3/<path> on the members in turn until one answers or
 * the deadline passes; the answer, parsed, in e->answer. `what` names the
 * call in messages; a call that is not idempotent is repeated only when
 * it cannot have been applied. */
hvd_status rdzv_etcd_call(struct rdzv_client *c, const char *path, const char *what, cJSON *body,
                          int64_t deadline_ns, bool idempotent);
/* Watches the keys [key, end) (end NULL: the one key) from revision
 * `from` on, handing each event to fn until it says done (then
 * e->watch_done) or the deadline passes (HVD_ERR_TIMEOUT, no message
 * set). Reconnects, to the next member, after the last revision seen.
 * With *resync set, etcd ended the watch (say, compacted history): the
 * caller reads again. */
hvd_status rdzv_etcd_watch(struct rdzv_client *c, const char *what, const char *key, size_t key_len,
                           const char *end, size_t end_len, int64_t from, int64_t deadline_ns,
                           etcd_event_fn fn, void *arg, bool *resync);
/* Authenticates first if a user is configured and no token is held. */
hvd_status rdzv_etcd_ready(struct rdzv_client *c, int64_t deadline_ns);

/* ---- client_etcd.c ---- */
/* e->keybuf = the key (or the scope's range start, key NULL); with a
 * scope, e->endbuf = the range's end. */
hvd_status rdzv_etcd_name_key(struct rdzv_client *c, const char *scope, const char *key);

/* ---- etcd_elect.c ---- */
hvd_status rdzv_etcd_lead(struct rdzv_client *c, const char *scope, const char *key,
                          const char *value, int ttl_s, int64_t deadline_ns);
hvd_status rdzv_etcd_lead_renew(struct rdzv_client *c);
void rdzv_etcd_lead_resign(struct rdzv_client *c);

/* ---- etcd_lease.c ---- */
/* Grants a lease of ttl_s seconds (etcd may raise it to its minimum). */
hvd_status rdzv_etcd_lease_grant(struct rdzv_client *c, const char *what, int64_t ttl_s,
                                 int64_t deadline_ns, int64_t *id);
/* Renews lease id; *alive false when it had expired. */
hvd_status rdzv_etcd_lease_renew(struct rdzv_client *c, const char *what, int64_t id,
                                 int64_t deadline_ns, bool *alive);
/* The job's lease, renewed when a third of its time has passed: for a
 * write, found or else granted and published; a reader renews one it
 * finds and makes none. */
hvd_status rdzv_etcd_keep_lease(struct rdzv_client *c, const char *what, bool write,
                                int64_t deadline_ns);

#endif
