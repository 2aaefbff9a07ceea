/*
 * The transport module: which address a rank advertises, the listening
 * socket, the connection handshake, and communicators (ordered groups of
 * ranks) with blocking and asynchronous send/recv between any two members.
 *
 * Threading: a context and its communicators are driven by one thread at a
 * time (in hvd, the background thread). Nothing here blocks without a
 * deadline.
 */
#ifndef HVD_TRANSPORT_H
#define HVD_TRANSPORT_H

#include <net/if.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/common.h"
#include "rendezvous/rendezvous.h"

/* ==== addresses and interfaces (iface.c) ====================================== */

struct net_addr {
  struct sockaddr_storage ss; /* port 0 unless said otherwise */
  socklen_t len;
};

struct net_iface {
  char name[IF_NAMESIZE];
  struct net_addr addr;
  bool loopback;
};

enum { NET_MAX_IFACES = 64, NET_MAX_ADDRS = 8 };

/* "10.0.0.5" or "fe80::1%eth0" (no port). */
void net_addr_format(const struct net_addr *a, char *out, size_t size);
/* "10.0.0.5:4000" or "[fe80::1%eth0]:4000". */
void net_addr_format_port(const struct net_addr *a, int port, char *out, size_t size);
/* Parses a numeric IPv4/IPv6 address (IPv6 may carry %scope). */
hvd_status net_addr_parse(const char *text, struct net_addr *out);
bool net_addr_is_loopback(const struct net_addr *a);
/* Same family, address and scope; ports are ignored. */
bool net_addr_equal(const struct net_addr *a, const struct net_addr *b);
void net_addr_set_port(struct net_addr *a, int port);

/*
 * The host's interface addresses that are up: IPv4 and IPv6, loopback
 * included, IPv6 link-local excluded, in getifaddrs order.
 */
hvd_status net_iface_list(struct net_iface *out, size_t max, size_t *n);

/*
 * Applies an interface spec (HOROVOD_GLOO_IFACE) to a list of interfaces.
 * The spec is a comma list of entries; an entry names an interface exactly
 * if one has that name and is otherwise a prefix (NCCL style: "eth" selects
 * eth0 and eth1); "=name" is always exact; a leading '^' makes the whole
 * spec a list of exclusions ("^docker,lo"). selected[i] says whether ifs[i]
 * is chosen. A spec that selects nothing is HVD_ERR_NOT_FOUND with a message
 * naming the spec and listing the interfaces that exist; a malformed spec is
 * HVD_ERR_INVALID_ARGUMENT.
 */
hvd_status net_iface_match(const char *spec, const struct net_iface *ifs, size_t n,
                           bool *selected);

/*
 * The addresses this rank advertises to its peers, best first.
 * - spec (HOROVOD_GLOO_IFACE) not NULL: the addresses of the interfaces it
 *   selects, in interface order, IPv4 before IPv6 unless the rendezvous
 *   server is reached over IPv6.
 * - otherwise: the local address of the route to route_host:route_port (the
 *   rendezvous server). If that is a loopback address, the host's other
 *   addresses follow it, so that peers on other hosts can still reach this
 *   rank; a loopback address is only ever used by peers on the same host.
 * - route_host NULL (no server: a single-process job): loopback only.
 */
hvd_status net_select_addresses(const char *spec, const char *route_host, int route_port,
                                struct net_addr *out, size_t max, size_t *n);

/* ==== listening socket (listener.c) ============================================ */

/*
 * Opens the process's listening socket on every address of `family`
 * (AF_INET, or AF_INET6 dual-stack), non-blocking and close-on-exec.
 * port_range is HVD_PORT_RANGE ("40000-40100" or "40000"); NULL or "" means
 * an ephemeral port. Within a range, ports are tried from a random start so
 * that ranks on one host do not all race for the same port.
 */
hvd_status net_listen(int family, const char *port_range, int *fd, int *port);
/* The same, never taking port `avoid` (the store's, which rank 0 may bind
 * after this rank's listener; 0: none). */
hvd_status net_listen_avoiding(int family, const char *port_range, int avoid, int *fd,
                               int *port);

/* ==== peer records (the rendezvous module encodes them: rdzv_record) ========== */

/* ==== context and communicators (ctx.c, conn.c, engine.c, comm.c) ============== */

struct net_ctx;
struct net_comm;

struct net_ctx_config {
  int rank;             /* global rank, for messages */
  const char *hostname; /* HOROVOD_HOSTNAME */
  const char *token;    /* the job token, or NULL */
  uint64_t generation;  /* elastic round */
  int64_t timeout_ms;   /* no progress for this long is a timeout */
  const char *iface_spec; /* HOROVOD_GLOO_IFACE, or NULL */
  const char *port_range; /* HVD_PORT_RANGE, or NULL */
  struct rdzv_client *store; /* borrowed; NULL: single process, no peers */
  const char *store_host;    /* for the route-based address choice */
  int store_port;
};

hvd_status net_ctx_create(const struct net_ctx_config *cfg, struct net_ctx **out);
void net_ctx_destroy(struct net_ctx *ctx);
int net_ctx_port(const struct net_ctx *ctx);
/* Closes the listener and every connection that has not been claimed by a
 * communicator: later dials are refused. For when no communicator of this
 * context will take a connection again (its owner stopped talking to other
 * ranks); established connections stay as they are. Not thread-safe with
 * anything else on the context. Idempotent. */
void net_ctx_stop_listening(struct net_ctx *ctx);

/* Well-known communicator ids; the coordinator's process sets use
 * NET_COMM_PROCESS_SET + a registration number. */
enum {
  NET_COMM_GLOBAL = 1,
  NET_COMM_LOCAL = 2,
  NET_COMM_CROSS = 3,
  NET_COMM_CONTROL = 4,
  NET_COMM_CONTROL_HOST = 5,
  NET_COMM_PROCESS_SET = 16,
};

/*
 * Builds a communicator: publishes this rank's record under key <rank> of
 * `scope`, fetches all `size` records with one long-poll, connects to its
 * ring neighbours (other pairs connect lazily on first use), then deletes
 * its key so that the server can drop the scope. Every member must call it
 * with the same scope, comm_id and size.
 */
hvd_status net_comm_create(struct net_ctx *ctx, const char *scope, uint32_t comm_id, int rank,
                           int size, struct net_comm **out);
/*
 * A communicator over some members of `parent`, without the store: members
 * lists parent ranks (n of them, each once); member i becomes rank i. This
 * rank must be among them. Connections are made on first use. Every member
 * must derive it with the same comm_id and list, and comm_id must not be in
 * use by another communicator of the context.
 */
hvd_status net_comm_derive(struct net_comm *parent, uint32_t comm_id, const int *members, int n,
                           struct net_comm **out);
void net_comm_destroy(struct net_comm *comm);

/*
 * With isolation on, a failed connection (a peer that closed, reset, or made
 * no progress for the timeout) fails only that peer's requests, and later
 * ones to or from it, with a message naming it; the other peers carry on.
 * Without it (the default, right for collectives), any failure poisons the
 * whole communicator. net_comm_peer_failed says whether a peer has failed.
 */
void net_comm_isolate_failures(struct net_comm *comm, bool on);
bool net_comm_peer_failed(const struct net_comm *comm, int peer);
int net_comm_rank(const struct net_comm *comm);
int net_comm_size(const struct net_comm *comm);
/* The hostname member r published. */
const char *net_comm_hostname(const struct net_comm *comm, int r);

/*
 * Asynchronous operations. A request describes one message to or from one
 * peer; messages between two members arrive in the order they were posted,
 * and a receive must be posted with exactly the length the peer sends.
 * Buffers are borrowed until the request completes. Requests live in
 * caller memory and must not move while pending.
 */
enum { NET_MAX_IOV = 8 };

struct net_req {
  /* private */
  struct net_req *next;
  int peer;
  bool is_send;
  bool done;
  bool header_checked;
  bool up_to; /* a receive of at most `payload` bytes (net_irecv_max) */
  hvd_status status;
  uint32_t seq;
  struct iovec iov[NET_MAX_IOV + 1]; /* [0] is the message header */
  int iovcnt;
  int iov_pos; /* first entry not fully transferred */
  size_t total;
  size_t offset;
  size_t payload; /* bytes after the header */
  unsigned char header[16];
};

hvd_status net_isend(struct net_comm *comm, int peer, const void *buf, size_t len,
                     struct net_req *req);
/* Scatter-gather send: iovcnt entries, at most NET_MAX_IOV. */
hvd_status net_isendv(struct net_comm *comm, int peer, const struct iovec *iov, int iovcnt,
                      struct net_req *req);
hvd_status net_irecv(struct net_comm *comm, int peer, void *buf, size_t len, struct net_req *req);
/* A receive of a message of any length up to cap (a longer one is a
 * protocol error); net_req_length says how long it was once done. */
hvd_status net_irecv_max(struct net_comm *comm, int peer, void *buf, size_t cap,
                         struct net_req *req);
size_t net_req_length(const struct net_req *req);
/* A done request's outcome: HVD_OK, or its failure with the message that
 * names the peer (set as this thread's error). */
hvd_status net_req_result(const struct net_comm *comm, const struct net_req *req);
/* Drives every pending request of the communicator until all n given ones
 * are done. The first failure is returned; the communicator is then
 * poisoned: pending and later requests fail at once with the same status. */
hvd_status net_wait(struct net_comm *comm, struct net_req *const *reqs, size_t n);
/* Like net_wait, but returns as soon as one of the n requests is done. */
hvd_status net_wait_any(struct net_comm *comm, struct net_req *const *reqs, size_t n);

/*
 * Waiting for something besides requests. A wait ends when one of the n
 * requests is done, when check(arg) says so (it is called between passes,
 * so it must be cheap: an atomic load), when fd (if >= 0) is readable (it is
 * not read), or at the deadline, and returns HVD_OK in all these cases; the
 * caller looks at what happened. Being idle is not a timeout here: the
 * progress timeout does not apply, but a failed connection still poisons
 * the communicator.
 */
struct net_wake {
  int fd;
  bool (*check)(void *arg);
  /* Called just before the thread blocks in poll() (may be NULL): it can
   * announce that it sleeps, then return true if check() became true
   * meanwhile, and the wait ends instead of blocking. */
  bool (*sleep)(void *arg);
  void *arg;
};
hvd_status net_wait_event(struct net_comm *comm, struct net_req *const *reqs, size_t n,
                          const struct net_wake *wake, int64_t deadline_ns);

/* Blocking forms. */
hvd_status net_send(struct net_comm *comm, int peer, const void *buf, size_t len);
hvd_status net_recv(struct net_comm *comm, int peer, void *buf, size_t len);
/* Sends to one member while receiving from another (or the same) at once. */
hvd_status net_sendrecv(struct net_comm *comm, int to, const void *sbuf, size_t slen, int from,
                        void *rbuf, size_t rlen);

/* ==== shared memory between the ranks of one host (shm.c, shm_sync.c) ========== */

/*
 * A communicator whose members all published the same host name can also
 * meet in one shared segment: a memfd that member 0 creates and hands to
 * the others over a Unix socket, after each proved (with a secret sent over
 * the job's authenticated TCP links) that it is the member it claims to be.
 * The segment holds a control line per member and `2 x buffer_bytes` of
 * data per member; the ops module's shared-memory collectives use it.
 * Segments have no name: when the last process that maps one ends, the
 * kernel frees it, so a killed job leaves nothing behind.
 */
struct net_shm;

/*
 * The communicator's segment, set up on the first call (a collective: every
 * member calls it at the same point). *out is NULL when the members are on
 * several hosts, the communicator has one member, or the host refuses
 * (memfd, Unix sockets, process namespaces): then the reason is logged once
 * and the TCP path stays. Errors are the TCP link's (a peer failing during
 * the setup). buffer_bytes: each member's data buffer (two of them).
 * ring_bytes (a power of two, or 0): messages between member 0 and each
 * other member then travel through rings of that size in the segment
 * instead of TCP (net_isend and the rest work as before; the coordinator's
 * control channel).
 */
hvd_status net_shm_get(struct net_comm *comm, size_t buffer_bytes, size_t ring_bytes,
                       struct net_shm **out);
/* Lends the segment's rings to another communicator `to` of the same
 * ranks or more: member m of the segment is rank to_ranks[m] there, and
 * the connections between `to`'s rank of member 0 and of each other member
 * move their messages through the rings (the control channel of a job on
 * several hosts, between rank 0 and the ranks of its host). The segment's
 * communicator must outlive `to`'s connections; nothing may have moved on
 * them yet. */
void net_shm_lend_links(struct net_shm *s, struct net_comm *to, const int *to_ranks);
/* Member r's data buffer b (0 or 1), buffer_bytes long, 64-byte aligned. */
void *net_shm_buffer(const struct net_shm *s, int r, unsigned b);
struct net_comm *net_shm_comm(const struct net_shm *s);
size_t net_shm_buffer_bytes(const struct net_shm *s);
/* Which buffer the next round writes: rounds alternate 0 and 1, so that a
 * member writes a buffer only after everybody has read it (a round is a
 * write, then a barrier, then reads; the next round's barrier comes after
 * those reads). */
unsigned net_shm_next_round(struct net_shm *s);
/* A number beside buffer b, under the same rules (written before the
 * round's barrier, read after it). */
void net_shm_post(struct net_shm *s, unsigned b, uint64_t v);
uint64_t net_shm_value(const struct net_shm *s, int r, unsigned b);
/*
 * Waits until every member has called it as often as this one: spins for
 * HVD_SPIN_US, then sleeps on a futex. A member whose process ended, a
 * member that failed (net_shm_fail), or no arrival for the communicator's
 * timeout fails it, on every member, with a message naming the member.
 */
hvd_status net_shm_barrier(struct net_shm *s);
/*
 * A word from member 0 to every member, carried by the barriers: member 0
 * sets it with net_shm_hint, each barrier publishes member 0's latest, and
 * net_shm_hint_seen returns what the last barrier this member passed
 * published: the same on every member between the same two barriers, so
 * decisions taken from it agree without a message of their own.
 */
void net_shm_hint(struct net_shm *s, uint64_t v);
uint64_t net_shm_hint_seen(const struct net_shm *s);
/* A word each member leaves for the others to look at whenever they like,
 * in no order with anything else (a figure, not a message). */
void net_shm_report(struct net_shm *s, uint64_t v);
uint64_t net_shm_report_of(const struct net_shm *s, int r);
/*
 * Single-copy reads and writes (shm_read.c). net_shm_read_from agrees, on
 * every member together (the same call at the same point of each), from
 * which size the members read and write each other's memory directly: each
 * passes the size it wants (0: never); the largest wins, and 0 when a
 * member wants none or cannot both read and write another's memory (the
 * reason is logged). Later calls return the agreed size at once.
 * net_shm_read copies bytes at addr (an address member r posted) in member
 * r's process to dst; net_shm_write copies src there.
 */
hvd_status net_shm_read_from(struct net_shm *s, size_t wanted, size_t *from);
hvd_status net_shm_read(struct net_shm *s, int r, void *dst, uint64_t addr, size_t bytes);
hvd_status net_shm_write(struct net_shm *s, int r, uint64_t addr, const void *src, size_t bytes);
/* Marks the group failed with this thread's message and wakes everybody;
 * the communicator is poisoned too. Returns st. */
hvd_status net_shm_fail(struct net_shm *s, hvd_status st);

/* ==== the three communicators of a job (world.c) ================================ */

struct net_world_config {
  struct net_ctx_config ctx;
  int size;
  bool rank_from_store; /* HVD_POD=1: ctx.rank is the caller's to find (pod mode) */
  /* -1: derive from the hostnames every rank published in `global` */
  int local_rank, local_size, cross_rank, cross_size;
};

/*
 * Reads HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK/SIZE,
 * HOROVOD_CROSS_RANK/SIZE, HOROVOD_HOSTNAME (default: this host's name),
 * HOROVOD_GLOO_IFACE, HVD_PORT_RANGE, HVD_TOKEN and
 * HOROVOD_GLOO_TIMEOUT_SECONDS, and HVD_POD (HOROVOD_SIZE without
 * HOROVOD_RANK: rank_from_store). Missing local/cross values are left at -1;
 * a local rank without its size (or the like) is an error naming both.
 * The store fields are left for the caller.
 */
hvd_status net_world_config_from_env(struct net_world_config *cfg);

/* The prefix of a generation's store scopes: "" for generation 0, else
 * "g<N>." (a later hvd_init or elastic round meets away from the records
 * of earlier ones). size >= 24 holds any. */
void net_generation_prefix(uint64_t generation, char *out, size_t size);

/* Pod mode (pod.c): registers this rank's name ("<host>", or
 * "<host>:<local rank>" when local_rank >= 0) in the store's pod scope of
 * this generation, waits for `size` names and returns this one's place in
 * their order as *rank. net_world_create calls it for rank_from_store. */
hvd_status net_pod_rank(struct rdzv_client *store, uint64_t generation, const char *host,
                        int local_rank, int size, int *rank);
/* The pod order: strings, except that names differing only in a trailing
 * number compare by it (StatefulSet ordinals: train-2 before train-10). */
int net_pod_compare(const char *a, const char *b);

struct net_world {
  struct net_ctx *ctx;
  struct net_comm *global; /* scope "global" */
  struct net_comm *local;  /* scope "local_<hostname>": the ranks on this host */
  struct net_comm *cross;  /* scope "cross_<local_rank>": one rank per host */
  int rank, size, local_rank, local_size, cross_rank, cross_size;
};

/* Builds the context, then the global, local and cross communicators, as
 * Horovod's Gloo path does; local and cross ranks come from the
 * configuration or, when it has none, from the published hostnames. */
hvd_status net_world_create(const struct net_world_config *cfg, struct net_world **out);
void net_world_destroy(struct net_world *w);

#endif /* HVD_TRANSPORT_H */
