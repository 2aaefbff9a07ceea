/*
 * Real etcd clusters for the tests of the etcd rendezvous store (issue 34):
 * 1 to ETCD_CLUSTER_MAX members started from the Check test process, each
 * an `etcd` child on free 127.0.0.1 ports with its data and its log under
 * one mkdtemp directory, tuned for tests (50 ms heartbeats, 500 ms
 * elections). Tests kill -9 a member, restart it from its data, stop and
 * continue it (a partition without namespaces), turn on user/password auth,
 * serve clients over TLS too, and read and write keys through etcd's v3
 * JSON gateway.
 *
 * The test process stays free of threads (the HTTP calls are synchronous
 * libcurl calls to numeric addresses, which start no resolver thread), so
 * forking ranks from it after etcd_cluster_start is safe (reap ranks by
 * pid: a waitpid(-1) would take a member's keeper). Each member runs
 * under a keeper, a forked child of the test process that kills it after
 * ETCD_CLUSTER_LIFETIME_S; keeper and etcd both die when their parent dies
 * (PR_SET_PDEATHSIG), so nothing outlives a killed test.
 *
 * Every function below except etcd_cluster_missing, etcd_cluster_post and
 * etcd_cluster_wait_leader ck_asserts on failure, with the members' logs on
 * stderr: call them from a Check test (not from a forked rank). Member
 * indices run from 0 to size - 1.
 *
 * HVD_TEST_ETCD names another etcd binary (a 3.5 or 3.6 release, say;
 * default /usr/bin/etcd); HVD_TEST_ETCD_KEEP=1 keeps the temporary
 * directory (data and logs) at etcd_cluster_stop and prints where it is.
 */
#ifndef HVD_TEST_ETCD_CLUSTER_H
#define HVD_TEST_ETCD_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum {
  ETCD_CLUSTER_MAX = 5,
  ETCD_CLUSTER_LIFETIME_S = 900, /* a member's keeper kills it after this */
  ETCD_CLUSTER_WAIT_MS = 30000,  /* how long start, restart and leader wait */
};

struct etcd_member {
  pid_t keeper;    /* our child, etcd's parent; 0 while the member is down */
  pid_t pid;       /* etcd itself */
  int client_port; /* on 127.0.0.1: gRPC and the JSON gateway */
  int peer_port;
  int tls_port;    /* with TLS: the client API over HTTPS on 127.0.0.1; else 0 */
  uint64_t id;     /* raft member id, 0 until the member first answered */
  bool paused;     /* stopped with SIGSTOP */
};

/* Files (PEM) for members that serve clients over TLS too. */
struct etcd_cluster_tls {
  char cert[256], key[256]; /* the members' certificate and its key */
  char ca[256];             /* the CA that clients' certificates must be signed by */
};

struct etcd_cluster {
  int size;            /* 0: not started (etcd_cluster_stop is then a no-op) */
  char dir[256];       /* mkdtemp: member i's data in mI/, its log in mI.log */
  char endpoints[ETCD_CLUSTER_MAX * 16]; /* "127.0.0.1:P0,127.0.0.1:P1,..." */
  char tls_endpoints[ETCD_CLUSTER_MAX * 16]; /* the same for tls_port; "" without TLS */
  char password[64];   /* root's once auth is on: the helpers then log in */
  struct etcd_member members[ETCD_CLUSTER_MAX];
  struct etcd_cluster_tls tls; /* cert[0] == '\0': no TLS */
};

/* NULL where an etcd cluster can be started here, else why not (for the
 * test's "skipped: ..." line before main returns 77). */
const char *etcd_cluster_missing(void);

/* Starts a cluster of size members (1..ETCD_CLUSTER_MAX) in *c and returns
 * once every member answers and they agree on a leader. Ports taken by
 * someone else between choosing and binding are retried with new ones. */
void etcd_cluster_start(struct etcd_cluster *c, int size);

/* etcd_cluster_start where each member also serves its client API over
 * HTTPS on its tls_port (tls_endpoints), with tls's certificate and
 * --client-cert-auth: clients there must present a certificate that
 * tls->ca signed. client_port stays plain HTTP, for the helpers below.
 * The certificate must name IP 127.0.0.1 and allow serverAuth and
 * clientAuth (etcd's gateway dials the member with it). */
void etcd_cluster_start_tls(struct etcd_cluster *c, int size, const struct etcd_cluster_tls *tls);

/* SIGKILLs every member (paused ones too), reaps them and removes the
 * directory. Safe on a zeroed struct and twice. */
void etcd_cluster_stop(struct etcd_cluster *c);

/* "127.0.0.1:P0,127.0.0.1:P1,...": every member, down or not, in index
 * order, for etcd://ENDPOINTS URLs. Borrowed from *c. */
const char *etcd_cluster_endpoints(const struct etcd_cluster *c);

/* Waits up to timeout_ms for the running, unpaused members to agree on a
 * leader that is one of them; returns its index, or -1 at the deadline
 * (quorum lost, say). 0 takes one look, which waits up to 5 s for a member
 * that is starting (its gateway answers only once it has joined). A member
 * that exited on its own is marked down (keeper 0) on the way. */
int etcd_cluster_wait_leader(struct etcd_cluster *c, int timeout_ms);
/* The same with ETCD_CLUSTER_WAIT_MS, asserting that there is one. */
int etcd_cluster_leader(struct etcd_cluster *c);

/* kill -9 of a running member; returns once it is reaped (its ports are
 * free). A paused member may be killed. */
void etcd_cluster_kill(struct etcd_cluster *c, int member);
/* Starts a killed member again on its ports from its data directory
 * (--initial-cluster-state existing) and waits until it answers and knows
 * the cluster's leader. */
void etcd_cluster_restart(struct etcd_cluster *c, int member);

/* SIGSTOP and SIGCONT of a running member: while paused it neither answers
 * clients nor its peers, as if partitioned away. */
void etcd_cluster_pause(struct etcd_cluster *c, int member);
void etcd_cluster_resume(struct etcd_cluster *c, int member);

/* Adds user root with password (role root granted) and enables auth; from
 * then on the helpers below authenticate as root. Needs a leader. */
void etcd_cluster_enable_auth(struct etcd_cluster *c, const char *password);

/* One JSON gateway call to a member (-1: the first running, unpaused one):
 * POST of body to path ("/v3/kv/range"), or GET where body is NULL, within
 * timeout_ms, with root's token once auth is on. Returns the HTTP status,
 * or -1 where no answer came (refused, timed out) or root's login failed;
 * *reply gets the body, or else why (malloc'd, NUL-terminated, the caller
 * frees it; NULL only out of memory). */
int etcd_cluster_post(struct etcd_cluster *c, int member, const char *path, const char *body,
                      int timeout_ms, char **reply);

/* key = value (plain text, base64'd here) through a member (-1: any). */
void etcd_cluster_put(struct etcd_cluster *c, int member, const char *key, const char *value);
/* key's value (malloc'd; the caller frees it), or NULL where the key is
 * absent. A linearizable read: it needs a quorum. */
char *etcd_cluster_get(struct etcd_cluster *c, int member, const char *key);
/* The watchers (waiting calls) of the running, unpaused members, summed
 * from their /metrics; -1 where one did not answer. */
long etcd_cluster_watchers(struct etcd_cluster *c);

#endif
