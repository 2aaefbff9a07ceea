/* The transport's internals, shared by ctx.c, handshake.c, conn.c, engine.c and comm.c. */
#ifndef HVD_TRANSPORT_PRIVATE_H
#define HVD_TRANSPORT_PRIVATE_H

#include <poll.h>

#include "transport.h"

/* ---- wire formats (handshake.c) ------------------------------------------------
 * HELLO, sent by the connecting side, 36 bytes then the token:
 *   magic u32 "HVDT" | version u16 | token_len u16 | comm_id u32 | from u32 |
 *   to u32 | from_global u32 | generation u64 | reserved u32 (0)
 * ACK, the accepting side's answer, 8 bytes:
 *   magic u32 "HVDA" | version u16 | status u16
 * Message header, before every message on an established connection:
 *   seq u32 | magic u32 "HVDM" | length u64
 * Magic and version keep their place in every future version.
 */
#define NET_HELLO_MAGIC 0x54445648u  /* "HVDT" */
#define NET_ACK_MAGIC 0x41445648u    /* "HVDA" */
#define NET_MSG_MAGIC 0x4d445648u    /* "HVDM" */
#define NET_PROTOCOL_VERSION 1

enum {
  NET_HELLO_FIXED = 36,
  NET_TOKEN_MAX = 256,
  NET_HELLO_MAX = NET_HELLO_FIXED + NET_TOKEN_MAX,
  NET_ACK_BYTES = 8,
  NET_HEADER_BYTES = 16,
  NET_WHO_MAX = 320, /* "rank 3 (global rank 7 on <host>)" */
};

enum net_ack_status {
  NET_ACK_OK = 0,
  NET_ACK_BAD_VERSION = 1,
  NET_ACK_BAD_TOKEN = 2,
  NET_ACK_BAD_GENERATION = 3,
};

struct net_hello {
  uint16_t version;
  uint16_t token_len;
  uint32_t comm_id;
  uint32_t from;
  uint32_t to;
  uint32_t from_global;
  uint64_t generation;
  char token[NET_TOKEN_MAX];
};

/* Returns the encoded size (NET_HELLO_FIXED + token_len). */
size_t net_hello_encode(const struct net_hello *h, unsigned char *out);
/* Checks the magic and reads the fixed part; the token follows separately. */
hvd_status net_hello_decode_fixed(const unsigned char *in, struct net_hello *out);
void net_ack_encode(enum net_ack_status status, unsigned char *out);
hvd_status net_ack_decode(const unsigned char *in, uint16_t *version, uint16_t *status);
const char *net_ack_status_text(uint16_t status);
void net_header_encode(uint32_t seq, uint64_t len, unsigned char *out);

/* ---- the context (ctx.c) ----------------------------------------------------------- */

/* An accepted socket whose HELLO is being read, or a validated one waiting
 * for its communicator to claim it. */
struct net_incoming {
  struct net_incoming *prev, *next; /* in its list, oldest first */
  int fd;
  bool validated;
  bool want_write;     /* registered for EPOLLOUT: the ACK did not fit at once */
  int64_t deadline_ns; /* handshaking: the HELLO's; parked: a communicator's claim */
  unsigned char buf[NET_HELLO_MAX];
  size_t have;
  size_t need;
  unsigned char ack[NET_ACK_BYTES];
  size_t ack_sent;
  struct net_hello hello;
  char from_text[80]; /* the peer's address, for messages */
};

struct net_ctx {
  int rank;
  char hostname[RDZV_RECORD_HOST_MAX];
  char token[NET_TOKEN_MAX];
  size_t token_len;
  uint64_t generation;
  int64_t timeout_ms;
  int64_t spin_ns;
  bool spin_yield; /* sched_yield() between spins (HVD_SPIN_YIELD) */
  bool shm;        /* HVD_SHM: published in this rank's records, compared with the peers' */
  int cpus;        /* online CPUs: members of one host beyond this share cores */
  int64_t spin_resume_ns; /* no spinning before this: the core was contended (engine.c) */
  int socket_buffer; /* SO_SNDBUF/SO_RCVBUF, 0: the kernel's autotuning */
  size_t io_chunk;   /* bytes per sendmsg/recvmsg at most (HVD_IO_CHUNK_BYTES) */
  struct rdzv_client *store;

  int listen_fd;
  int port;
  struct net_addr addrs[NET_MAX_ADDRS];
  size_t naddrs;
  /* Accepted sockets (ctx.c): the epoll set holds the listener and every
   * socket still in its handshake, so the engine's poll() sees one
   * descriptor however many strangers connect. */
  int epoll_fd;
  int reserve_fd; /* given up to accept (and close) a connection at EMFILE */
  struct net_incoming_list {
    struct net_incoming *head, *tail;
    size_t n;
  } handshaking, parked;
  struct net_log_limit {
    int64_t next_ns;
    unsigned suppressed;
  } drop_log, accept_log;
};

/* Accepts what is waiting on the listener and advances incoming handshakes. */
void net_ctx_progress_incoming(struct net_ctx *ctx, bool *progressed);
/* Adds the context's one descriptor (listener and handshakes) to a poll set. */
void net_ctx_poll_fds(struct net_ctx *ctx, struct pollfd *fds, size_t *n, size_t max);
/* The earliest deadline of a handshake or a parked socket (HVD_NO_DEADLINE if none). */
int64_t net_ctx_next_deadline(const struct net_ctx *ctx);
/* Takes the validated socket that rank `from` of communicator comm_id opened
 * to rank `to` (the oldest still open, if there are several), or returns -1. */
int net_ctx_claim(struct net_ctx *ctx, uint32_t comm_id, uint32_t from, uint32_t to);
/* Socket options of an established connection. */
void net_ctx_tune_socket(const struct net_ctx *ctx, int fd);

/* ---- connections (conn.c) and the engine (engine.c) ------------------------------- */

/* The sending side of a pair: the connection this rank dials to the peer. */
enum net_tx_state {
  TX_IDLE = 0,   /* nothing sent yet */
  TX_CONNECTING, /* connect() in progress, or waiting to retry */
  TX_HELLO,      /* sending HELLO */
  TX_ACK,        /* waiting for the ACK */
  TX_READY,
};

/*
 * One peer of a communicator. Each direction has its own TCP connection,
 * dialled by the side that sends on it: a rank's sends and the peer's data
 * then never contend for one socket's lock, which on a loopback exchange
 * across two cores halves the time (see conn.c).
 */
struct net_conn {
  int peer;
  /* sending: dialled by this rank */
  int tx_fd;
  enum net_tx_state tx;
  int64_t retry_at_ns;
  int64_t attempt_deadline_ns; /* a pending connect() to one of several addresses gives up then */
  unsigned attempts;
  unsigned refusals; /* ECONNREFUSED in a row */
  int64_t backoff_ms;
  unsigned char hello[NET_HELLO_MAX];
  size_t hello_len, hello_sent;
  unsigned char ack[NET_ACK_BYTES];
  size_t ack_have;
  /* receiving: dialled by the peer, handed over by the context (-1 until then) */
  int rx_fd;
  /* FIFOs of requests, and the next sequence numbers */
  struct net_req *send_head, *send_tail;
  struct net_req *recv_head, *recv_tail;
  uint32_t send_seq, recv_seq;
  bool listed; /* on the communicator's active list */
  /* A link through the shared segment (shm_link.c) instead of sockets:
   * both NULL for TCP. gone: the peer's process has ended. */
  struct net_shm_ring *ring_tx, *ring_rx;
  uint64_t tx_tail_seen; /* ring_tx's tail when this side last looked (it only grows) */
  /* The segment that holds the rings (this communicator's, or one lent by a
   * communicator of this host's ranks; its size, the peer's doorbell and
   * pidfd) and the peer's member index there. */
  struct net_shm *link_shm;
  int link_peer;
  bool gone;
  hvd_status failed; /* isolated failure of this peer (HVD_OK: none) */
  char *fail_msg;
};

struct net_comm {
  struct net_ctx *ctx;
  char scope[RDZV_RECORD_HOST_MAX + 32];
  uint32_t id;
  int rank;
  int size;
  struct rdzv_record *records; /* size entries, from the store */
  struct net_conn *conns;      /* size entries; conns[rank] unused */
  int *active;                 /* peers whose connection has work; the engine only looks there */
  int nactive;
  struct pollfd *pfds;         /* room for every active connection and the context's sockets */
  size_t pfds_cap;
  bool isolate;                /* failures stay with their peer (net_comm_isolate_failures) */
  hvd_status poison;           /* HVD_OK while healthy */
  char poison_msg[HVD_ERROR_MESSAGE_MAX];
  int64_t last_progress_ns;
  unsigned passes; /* engine passes since the last sleep */
  /* The shared segment (shm.c): decided on first use, then kept. */
  enum { SHM_UNDECIDED = 0, SHM_ON, SHM_OFF } shm_state;
  struct net_shm *shm;
};

/* ---- shared memory (shm.c sets it up, shm_sync.c waits in it, shm_link.c
 * carries messages) ------------------------------------------------------------------
 * The segment: a header, one cache line per member, then each member's two
 * data buffers, page aligned, then, for a communicator with links, a ring
 * each way between member 0 and every other member:
 *   [header][line 0 .. line n-1][pad][m0 b0][m0 b1][m1 b0]...[0->1][1->0][0->2]...
 */
#define NET_SHM_MAGIC 0x4d485348u /* "HSHM" */
enum { NET_SHM_LINE = 64, NET_SHM_REASON_MAX = 384, NET_SHM_FAIL_WRITING = -1 };

struct net_shm_header {
  uint32_t magic;
  uint32_t size;
  uint64_t buffer_bytes;
  _Alignas(NET_SHM_LINE) _Atomic uint32_t futex; /* bumped to wake sleepers */
  _Atomic uint32_t sleepers;
  /* 0 while healthy; NET_SHM_FAIL_WRITING while the first member to fail
   * writes the reason; then 1 + that member. */
  _Alignas(NET_SHM_LINE) _Atomic int32_t failed;
  char reason[NET_SHM_REASON_MAX];
};

struct net_shm_line {
  _Alignas(NET_SHM_LINE) _Atomic uint64_t arrived; /* barriers this member has entered */
  uint64_t value[2]; /* net_shm_post, per buffer */
  _Atomic uint64_t report; /* net_shm_report */
  /* Member 0's word, per barrier parity (net_shm_hint): in the line the
   * others read to see it arrive, so publishing it costs no extra line. */
  uint64_t hint[2];
};

/* A byte stream one way between two members: the writer advances head,
 * the reader tail; each may ask to be woken (the other writes its doorbell,
 * an eventfd). */
struct net_shm_ring {
  _Alignas(NET_SHM_LINE) _Atomic uint64_t head;
  _Atomic uint32_t reader_sleeps;
  _Alignas(NET_SHM_LINE) _Atomic uint64_t tail;
  _Atomic uint32_t writer_sleeps;
  _Alignas(NET_SHM_LINE) _Atomic uint32_t closed; /* either side stopped using it */
  _Alignas(NET_SHM_LINE) unsigned char data[];
};

struct net_shm {
  struct net_comm *comm;
  unsigned char *base;
  size_t len;
  struct net_shm_header *hdr;
  struct net_shm_line *lines;
  unsigned char *data;
  size_t buffer_bytes;
  int rank, size;
  uint64_t barriers; /* entered by this member */
  unsigned rounds;
  int *pidfds; /* per member, -1 for this one or where pidfd_open is missing */
  uint64_t hint_next, hint_seen; /* net_shm_hint: to publish (member 0), last published */
  int read_state;   /* 0 until net_shm_read_from agreed on read_from */
  size_t read_from; /* single-copy reads from this size (0: never) */
  /* Links (shm_link.c): ring_bytes per ring (0: none); bells[r] is member
   * r's doorbell where this member holds it (its own, and member 0's or,
   * on member 0, everybody's), else -1. */
  size_t ring_bytes;
  unsigned char *rings;
  int *bells;
};

/* The segment's size for n members with buffers of buffer_bytes and rings
 * of ring_bytes (0: none); *data_offset and *rings_offset say where those
 * start. */
size_t net_shm_layout(int n, size_t buffer_bytes, size_t ring_bytes, size_t *data_offset,
                      size_t *rings_offset);
/* The ring from member `from` to member `to` (one of them is 0). */
struct net_shm_ring *net_shm_ring(const struct net_shm *s, int from, int to);
/* Makes the communicator's connections to the members it shares rings
 * with use them (shm_link.c). */
void net_shm_attach_links(struct net_shm *s);
/* Engine hooks for a linked connection (shm_link.c). send and recv act as
 * non-blocking sendmsg and recvmsg on the ring: bytes moved, or -1 with
 * errno EAGAIN (full, or empty); a send to a peer that closed or ended
 * drops its bytes, as a socket's first write does, and a recv returns 0
 * once nothing is left. Before a
 * sleep, prepare_sleep asks to be woken and adds this member's doorbell
 * (once) and the peer's pidfd to the poll set, or returns false when
 * something can move at once; after_sleep drains the doorbell and notes
 * peers whose process ended. */
ssize_t net_link_send(struct net_conn *c, const struct iovec *iov, size_t n);
ssize_t net_link_recv(struct net_conn *c, const struct iovec *iov, size_t n);
/* Copies the next n bytes without taking them; 0 when fewer are there. */
size_t net_link_peek(struct net_conn *c, void *buf, size_t n);
bool net_link_prepare_sleep(struct net_conn *c, struct pollfd *fds, size_t *n, bool *bell_added);
void net_link_after_sleep(struct net_comm *comm, const struct pollfd *fds, size_t n);
/* Tells the peer this side is done with the link (what it waits for fails)
 * and detaches the connection from it. */
void net_link_close(struct net_conn *c);
/* Records this thread's message as the group's failure, unless another
 * member failed first, and wakes every waiting member (shm_sync.c). */
void net_shm_mark_failed(struct net_shm *s);
/* Unmaps the communicator's segment; a member still waiting on it learns
 * that this one left. */
void net_shm_destroy(struct net_shm *s);

/* Starts dialling the peer's sending connection if not done yet. */
void net_conn_start_tx(struct net_comm *comm, struct net_conn *c);
/* Advances dialling (TX_CONNECTING..TX_ACK); may set *progressed. */
hvd_status net_conn_progress_tx(struct net_comm *comm, struct net_conn *c, bool *progressed);
/* What dialling waits for in poll(), 0 if nothing. */
short net_conn_tx_events(const struct net_conn *c);
/* Takes the peer's connection from the context if it has arrived. */
void net_conn_claim_rx(struct net_comm *comm, struct net_conn *c, bool *progressed);
/* While this rank waits for the peer's dial: an error if the connection
 * this rank dialled to it has ended (the peer is gone, and will not dial). */
hvd_status net_conn_check_peer_alive(struct net_comm *comm, struct net_conn *c);
/* Closes both connections. */
void net_conn_close(struct net_conn *c);
/* Puts the connection on the active list (idempotent). */
void net_comm_activate(struct net_comm *comm, struct net_conn *c);

/* Fails the communicator: records the error, closes every connection, and
 * fails pending requests. Returns the status. */
hvd_status net_comm_poison(struct net_comm *comm, hvd_status st);
/* "rank 3 (node2)" for messages. */
void net_comm_describe_peer(const struct net_comm *comm, int peer, char *out, size_t size);
/* Extra ways for net_engine_run to end (NULL: none, and the progress timeout
 * applies). */
struct engine_limits {
  int wake_fd;         /* readable ends the run; -1: none */
  bool (*sleep)(void *arg); /* before blocking in poll(): true ends the run */
  void *sleep_arg;
  int64_t deadline_ns; /* the run ends at this time */
  bool idle;           /* no progress timeout (the caller waits for events) */
};

/* Drives connections and requests until done(arg), a limit, or a failure. */
hvd_status net_engine_run(struct net_comm *comm, bool (*done)(void *arg), void *arg,
                      const struct engine_limits *limits);

#endif
