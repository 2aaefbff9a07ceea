/*
 * The progress engine: moves the bytes of posted requests.
 *
 * DESIGN. Each connection keeps two FIFOs, sends and receives, which advance
 * independently, so both directions of a link are busy at once and two
 * members sending to each other never deadlock. Sockets are non-blocking;
 * every message is one sendmsg/recvmsg stream of [16-byte header, payload
 * iovecs], so a receive lands straight in the caller's buffer. The header
 * carries a per-direction sequence number and the length, which catches two
 * ranks that disagree about what they are exchanging.
 * The waiting thread drives everything, including the context's accepts:
 * it spins for HVD_SPIN_US after the last progress (a round trip on this
 * kind of machine costs ~50 us through a sleep, ~9 us when polled), then
 * sleeps in poll(). No progress for the timeout, or a broken connection,
 * poisons the communicator: every connection is closed, so that peers
 * notice at once, and every pending and later request fails.
 * A connection to a member of the same host may be a link through a shared
 * segment instead (shm_link.c): the same FIFOs, headers and checks, with
 * the bytes moved through rings; while only links have work, spinning
 * makes no system call, and sleeping polls their doorbell and the peers'
 * pidfds.
 */
#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport_private.h"

/* How long the engine sleeps instead of spinning once a spin turn lost the
 * core (HVD_SPIN_LOST_CORE_NS). */
#define SPIN_BACKOFF_NS INT64_C(100000000)

/* ---- poisoning --------------------------------------------------------------------- */

static void fail_queue(struct net_req **head, struct net_req **tail, hvd_status st) {
  for (struct net_req *r = *head; r != NULL; r = r->next) {
    r->done = true;
    r->status = st;
  }
  *head = *tail = NULL;
}

hvd_status net_comm_poison(struct net_comm *comm, hvd_status st) {
  if (comm->poison != HVD_OK)
    return comm->poison;
  snprintf(comm->poison_msg, sizeof(comm->poison_msg), "%s", hvd_last_error_message());
  comm->poison = st;
  HVD_LOG_ERROR("communicator %s: %s; failing its operations", comm->scope, comm->poison_msg);
  for (int i = 0; i < comm->size; i++) {
    struct net_conn *c = &comm->conns[i];
    net_conn_close(c);
    fail_queue(&c->send_head, &c->send_tail, st);
    fail_queue(&c->recv_head, &c->recv_tail, st);
  }
  return st;
}

/* The poison status, with its message restored for this caller. */
static hvd_status poisoned(const struct net_comm *comm) {
  return hvd_error(comm->poison, "%s", comm->poison_msg);
}

/* Isolation: one peer fails, with this thread's current message. */
static void conn_fail(struct net_comm *comm, struct net_conn *c, hvd_status st) {
  const char *msg = hvd_last_error_message();
  if (c->failed != HVD_OK)
    return;
  c->failed = st;
  c->fail_msg = hvd_strndup(msg, strlen(msg));
  /* The owner of an isolating communicator reports what matters (a peer
   * closing after an orderly shutdown does not). */
  HVD_LOG_DEBUG("communicator %s: %s; failing that peer's operations", comm->scope, msg);
  net_conn_close(c);
  fail_queue(&c->send_head, &c->send_tail, st);
  fail_queue(&c->recv_head, &c->recv_tail, st);
}

/* The status of a failed request, with its message restored. */
static hvd_status req_failure(const struct net_comm *comm, const struct net_req *r) {
  const struct net_conn *c = &comm->conns[r->peer];
  if (comm->poison != HVD_OK)
    return poisoned(comm);
  return hvd_error(r->status, "%s", c->fail_msg != NULL ? c->fail_msg : hvd_strerror(r->status));
}

void net_comm_isolate_failures(struct net_comm *comm, bool on) { comm->isolate = on; }

hvd_status net_req_result(const struct net_comm *comm, const struct net_req *req) {
  return req->status == HVD_OK ? HVD_OK : req_failure(comm, req);
}

bool net_comm_peer_failed(const struct net_comm *comm, int peer) {
  return comm->poison != HVD_OK ||
         (peer >= 0 && peer < comm->size && comm->conns[peer].failed != HVD_OK);
}

void net_comm_describe_peer(const struct net_comm *comm, int peer, char *out, size_t size) {
  if (comm->records != NULL)
    snprintf(out, size, "rank %d (global rank %d on %s)", peer, comm->records[peer].global_rank,
             comm->records[peer].host);
  else
    snprintf(out, size, "rank %d", peer);
}

/* ---- posting ----------------------------------------------------------------------- */

static void push(struct net_req **head, struct net_req **tail, struct net_req *r) {
  r->next = NULL;
  if (*tail != NULL)
    (*tail)->next = r;
  else
    *head = r;
  *tail = r;
}

static bool is_peer(const struct net_comm *comm, int p) {
  return p >= 0 && p < comm->size && p != comm->rank;
}

static hvd_status send_once(struct net_comm *comm, struct net_conn *c, bool *moved);

/* A message to a link with nothing queued ahead of it goes into the ring
 * at once: a memory copy, no system call, and the peer sees it without
 * waiting for this thread's next pass (the control channel's round trips
 * are made of such messages). A ring that is full, or an error, is left
 * to the passes, which report it as usual. */
static void send_eagerly(struct net_comm *comm, struct net_conn *c) {
  bool moved = true;
  while (moved && c->send_head != NULL && send_once(comm, c, &moved) == HVD_OK)
    ;
}

static hvd_status post(struct net_comm *comm, int peer, const struct iovec *iov, int iovcnt,
                       bool is_send, struct net_req *r) {
  struct net_conn *c;
  size_t payload = 0;

  memset(r, 0, sizeof(*r));
  r->done = true;
  if (!is_peer(comm, peer))
    return r->status = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                                 "communicator %s: peer %d is not another member (size %d, "
                                 "this rank %d)",
                                 comm->scope, peer, comm->size, comm->rank);
  if (iovcnt < 0 || iovcnt > NET_MAX_IOV)
    return r->status = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%d iovecs; at most %d", iovcnt,
                                 NET_MAX_IOV);
  if (comm->poison != HVD_OK)
    return r->status = poisoned(comm);
  c = &comm->conns[peer];
  if (c->failed != HVD_OK)
    return r->status = hvd_error(c->failed, "%s", c->fail_msg);
  r->peer = peer;
  r->is_send = is_send;
  r->done = false;
  r->iov[0] = (struct iovec){.iov_base = r->header, .iov_len = NET_HEADER_BYTES};
  r->iovcnt = 1;
  for (int i = 0; i < iovcnt; i++) {
    if (iov[i].iov_len == 0)
      continue;
    r->iov[r->iovcnt++] = iov[i];
    payload += iov[i].iov_len;
  }
  r->payload = payload;
  r->total = NET_HEADER_BYTES + payload;
  if (is_send) {
    r->seq = c->send_seq++;
    net_header_encode(r->seq, payload, r->header);
    push(&c->send_head, &c->send_tail, r);
  } else {
    r->seq = c->recv_seq++;
    push(&c->recv_head, &c->recv_tail, r);
  }
  if (is_send)
    net_conn_start_tx(comm, c);
  net_comm_activate(comm, c);
  if (is_send && c->ring_tx != NULL && c->tx == TX_READY && c->send_head == r)
    send_eagerly(comm, c);
  return HVD_OK;
}

hvd_status net_isendv(struct net_comm *comm, int peer, const struct iovec *iov, int iovcnt,
                      struct net_req *req) {
  return post(comm, peer, iov, iovcnt, true, req);
}

hvd_status net_isend(struct net_comm *comm, int peer, const void *buf, size_t len,
                     struct net_req *req) {
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  return post(comm, peer, &iov, 1, true, req);
}

hvd_status net_irecv(struct net_comm *comm, int peer, void *buf, size_t len, struct net_req *req) {
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  return post(comm, peer, &iov, 1, false, req);
}

hvd_status net_irecv_max(struct net_comm *comm, int peer, void *buf, size_t cap,
                         struct net_req *req) {
  struct iovec iov = {.iov_base = buf, .iov_len = cap};
  hvd_status st = post(comm, peer, &iov, 1, false, req);
  req->up_to = st == HVD_OK;
  return st;
}

size_t net_req_length(const struct net_req *req) { return req->payload; }

/* ---- moving bytes ------------------------------------------------------------------- */

static void advance(struct net_req *r, size_t n) {
  r->offset += n;
  while (n > 0) {
    struct iovec *v = &r->iov[r->iov_pos];
    if (n >= v->iov_len) {
      n -= v->iov_len;
      r->iov_pos++;
    } else {
      v->iov_base = (char *)v->iov_base + n;
      v->iov_len -= n;
      n = 0;
    }
  }
}

static void pop_done(struct net_req **head, struct net_req **tail) {
  struct net_req *r = *head;
  *head = r->next;
  if (*head == NULL)
    *tail = NULL;
  r->next = NULL;
  r->status = HVD_OK;
  r->done = true;
}

static hvd_status io_error(struct net_comm *comm, int peer, bool sending, int err) {
  char who[NET_WHO_MAX];
  net_comm_describe_peer(comm, peer, who, sizeof(who));
  if (err == 0)
    return hvd_error(HVD_ERR_NETWORK,
                     "%s closed the connection (it exited or failed; check its output)", who);
  return hvd_error(HVD_ERR_NETWORK, "%s to %s failed: %s", sending ? "sending" : "receiving", who,
                   strerror(err));
}

/* A message header's payload length (net_header_encode's layout). */
static uint64_t header_payload(const unsigned char *h) { return hvd_get_le64(h + 8); }

static hvd_status check_header(struct net_comm *comm, struct net_req *r) {
  uint32_t seq = hvd_get_le32(r->header);
  uint32_t magic = hvd_get_le32(r->header + 4);
  uint64_t len = header_payload(r->header);
  char who[NET_WHO_MAX];

  r->header_checked = true;
  if (magic == NET_MSG_MAGIC && seq == r->seq && r->up_to && len <= r->payload) {
    /* The header has been read, and from a ring maybe some of the message
     * after it, never more (see recv_once): shrink to the message. */
    size_t past = r->offset - NET_HEADER_BYTES;
    r->payload = (size_t)len;
    r->total = NET_HEADER_BYTES + r->payload;
    r->iovcnt = r->iov_pos + (r->offset < r->total ? 1 : 0);
    if (r->offset < r->total)
      r->iov[r->iov_pos].iov_len = (size_t)len - past;
    return HVD_OK;
  }
  if (magic == NET_MSG_MAGIC && seq == r->seq && len == r->payload)
    return HVD_OK;
  net_comm_describe_peer(comm, r->peer, who, sizeof(who));
  if (magic != NET_MSG_MAGIC || seq != r->seq)
    return hvd_error(HVD_ERR_PROTOCOL,
                     "corrupt stream from %s (message %u: magic 0x%08x, sequence %u)", who, r->seq,
                     magic, seq);
  if (r->up_to)
    return hvd_error(HVD_ERR_PROTOCOL,
                     "%s sent a message of %" PRIu64 " bytes, more than the %zu this rank accepts",
                     who, len, r->payload);
  return hvd_error(HVD_ERR_PROTOCOL,
                   "%s sent a message of %" PRIu64 " bytes where this rank expected %zu (the ranks "
                   "disagree on the operation they run)",
                   who, len, r->payload);
}

/* The next at most `limit` bytes of a request, as iovecs in out. */
static size_t clip(const struct net_req *r, size_t limit, struct iovec *out) {
  size_t n = 0, bytes = 0;
  for (int i = r->iov_pos; i < r->iovcnt && bytes < limit; i++) {
    out[n] = r->iov[i];
    if (out[n].iov_len > limit - bytes)
      out[n].iov_len = limit - bytes;
    bytes += out[n++].iov_len;
  }
  return n;
}

/* One sendmsg of at most io_chunk bytes; *moved says whether bytes left. */
static hvd_status send_once(struct net_comm *comm, struct net_conn *c, bool *moved) {
  struct net_req *r = c->send_head;
  struct iovec iov[NET_MAX_IOV + 1];
  struct msghdr msg = {.msg_iov = iov, .msg_iovlen = clip(r, comm->ctx->io_chunk, iov)};
  ssize_t n;

  *moved = false;
  do {
    n = c->ring_tx != NULL ? net_link_send(c, iov, msg.msg_iovlen)
                           : sendmsg(c->tx_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK ? HVD_OK : io_error(comm, c->peer, true, errno);
  *moved = true;
  advance(r, (size_t)n);
  if (r->offset == r->total)
    pop_done(&c->send_head, &c->send_tail);
  return HVD_OK;
}

/* One recvmsg of at most io_chunk bytes; *moved says whether bytes came. */
static hvd_status recv_once(struct net_comm *comm, struct net_conn *c, bool *moved) {
  struct net_req *r = c->recv_head;
  struct iovec iov[NET_MAX_IOV + 1];
  /* A receive of unknown length reads its header alone: what follows may
   * belong to the next message. A ring shows the header before it is read,
   * so a message that fits is read whole, in one go. */
  size_t limit = r->up_to && !r->header_checked ? NET_HEADER_BYTES - r->offset : comm->ctx->io_chunk;
  struct msghdr msg;
  ssize_t n;

  if (c->ring_rx != NULL && r->up_to && r->offset == 0) {
    unsigned char h[NET_HEADER_BYTES];
    if (net_link_peek(c, h, sizeof(h)) == sizeof(h) && header_payload(h) <= r->payload)
      limit = NET_HEADER_BYTES + (size_t)header_payload(h);
  }
  msg = (struct msghdr){.msg_iov = iov, .msg_iovlen = clip(r, limit, iov)};
  *moved = false;
  do {
    n = c->ring_rx != NULL ? net_link_recv(c, iov, msg.msg_iovlen)
                           : recvmsg(c->rx_fd, &msg, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return HVD_OK;
  if (n <= 0)
    return io_error(comm, c->peer, false, n == 0 ? 0 : errno);
  *moved = true;
  advance(r, (size_t)n);
  if (!r->header_checked && r->offset >= NET_HEADER_BYTES) {
    hvd_status st = check_header(comm, r);
    if (st != HVD_OK)
      return st;
  }
  if (r->offset == r->total)
    pop_done(&c->recv_head, &c->recv_tail);
  return HVD_OK;
}

/*
 * Moves bytes both ways with a peer, alternating one bounded write with one
 * bounded read until neither moves anything: a huge write followed by a
 * huge read lets one direction stall while this rank is busy with the other.
 */
static hvd_status progress_io(struct net_comm *comm, struct net_conn *c, bool *progressed) {
  bool sent = true, got = true;
  hvd_status st = HVD_OK;

  while (st == HVD_OK && (sent || got)) {
    const struct net_req *send_head = c->send_head, *recv_head = c->recv_head;
    sent = got = false;
    if (c->send_head != NULL && c->tx == TX_READY)
      st = send_once(comm, c, &sent);
    if (st == HVD_OK && c->recv_head != NULL && (c->rx_fd >= 0 || c->ring_rx != NULL))
      st = recv_once(comm, c, &got);
    if (sent || got)
      *progressed = true;
    /* A request finished: the caller may be waiting for just that one, and
     * the next read would most likely find nothing (a syscall on the path
     * of every small message). */
    if (c->send_head != send_head || c->recv_head != recv_head)
      break;
  }
  return st;
}

/* ---- the loop -------------------------------------------------------------------------- */

static bool busy(const struct net_conn *c) {
  return c->send_head != NULL || c->recv_head != NULL;
}

/* A receive waits for the peer to dial. This rank dials the peer too (the
 * connection its own sends will need), so that a peer that died before
 * dialling is known at once: its dial is refused, or the connection ends
 * (net_conn_check_peer_alive), instead of a wait until the timeout. */
static bool awaits_dial(const struct net_conn *c) {
  return c->recv_head != NULL && c->rx_fd < 0 && c->ring_rx == NULL;
}

void net_comm_activate(struct net_comm *comm, struct net_conn *c) {
  if (!c->listed) {
    c->listed = true;
    comm->active[comm->nactive++] = c->peer;
  }
}

/* One pass over the active connections; idle ones leave the list. The
 * listener costs a syscall, so while spinning it is only checked when this
 * communicator waits for a peer to connect, or every 64th pass (a sleeping
 * pass always checks it). */
static hvd_status pass(struct net_comm *comm, bool *progressed) {
  hvd_status st = HVD_OK;
  bool accepting = (comm->passes++ & 63) == 0;

  for (int k = 0; k < comm->nactive && !accepting; k++)
    accepting = awaits_dial(&comm->conns[comm->active[k]]);
  if (accepting)
    net_ctx_progress_incoming(comm->ctx, progressed);
  for (int k = 0; k < comm->nactive && st == HVD_OK;) {
    struct net_conn *c = &comm->conns[comm->active[k]];
    if (!busy(c)) {
      c->listed = false;
      comm->active[k] = comm->active[--comm->nactive];
      continue;
    }
    if (st == HVD_OK && awaits_dial(c)) {
      net_conn_claim_rx(comm, c, progressed);
      if (c->rx_fd < 0)
        net_conn_start_tx(comm, c); /* nothing if it has started */
    }
    if ((c->send_head != NULL || awaits_dial(c)) && c->tx != TX_READY)
      st = net_conn_progress_tx(comm, c, progressed);
    if (st == HVD_OK && awaits_dial(c))
      st = net_conn_check_peer_alive(comm, c);
    if (st == HVD_OK)
      st = progress_io(comm, c, progressed);
    if (st != HVD_OK && comm->isolate) {
      conn_fail(comm, c, st);
      *progressed = true;
      st = HVD_OK;
    }
    k++;
  }
  return st;
}

/* Says what the communicator is stuck on, for the timeout message. */
static void describe_wait(const struct net_comm *comm, char *out, size_t size) {
  size_t len = 0;
  int shown = 0;

  out[0] = '\0';
  for (int k = 0; k < comm->nactive && shown < 3 && len < size; k++) {
    int i = comm->active[k];
    const struct net_conn *c = &comm->conns[i];
    char who[NET_WHO_MAX];
    if (!busy(c))
      continue;
    net_comm_describe_peer(comm, i, who, sizeof(who));
    if (c->send_head != NULL && c->tx != TX_READY)
      len += (size_t)snprintf(out + len, size - len, "%sconnecting to %s (%u failed attempts)",
                              shown ? "; " : "", who, c->attempts);
    else if (awaits_dial(c))
      len += (size_t)snprintf(out + len, size - len, "%swaiting for %s to connect",
                              shown ? "; " : "", who);
    else if (c->recv_head != NULL)
      len += (size_t)snprintf(out + len, size - len, "%sreceiving %zu bytes from %s (%zu arrived)",
                              shown ? "; " : "", c->recv_head->payload, who,
                              c->recv_head->offset > NET_HEADER_BYTES
                                  ? c->recv_head->offset - NET_HEADER_BYTES
                                  : 0);
    else
      len += (size_t)snprintf(out + len, size - len, "%ssending %zu bytes to %s", shown ? "; " : "",
                              c->send_head->payload, who);
    shown++;
  }
}

/* Whether every connection with work is a link through shared memory. */
static bool only_links(const struct net_comm *comm) {
  for (int k = 0; k < comm->nactive; k++) {
    if (comm->conns[comm->active[k]].ring_rx == NULL)
      return false;
  }
  return true;
}

static int poll_timeout_ms(const struct net_comm *comm, int64_t now, int64_t progress_deadline) {
  int64_t next = progress_deadline;
  int64_t handshake = net_ctx_next_deadline(comm->ctx);

  if (handshake < next)
    next = handshake;
  for (int k = 0; k < comm->nactive; k++) {
    const struct net_conn *c = &comm->conns[comm->active[k]];
    if (c->tx == TX_CONNECTING && c->tx_fd < 0 && c->retry_at_ns < next)
      next = c->retry_at_ns;
    if (c->tx == TX_CONNECTING && c->tx_fd >= 0 && c->attempt_deadline_ns < next)
      next = c->attempt_deadline_ns;
  }
  if (next <= now)
    return 0;
  return (next - now) / 1000000 + 1 > 60000 ? 60000 : (int)((next - now) / 1000000 + 1);
}

/* Waits in poll() for any socket the communicator needs, and wake_fd if it
 * is >= 0; *ready says whether one is ready (timeout 0 only checks), and
 * *woken whether wake_fd is readable. */
static hvd_status sleep_in_poll(struct net_comm *comm, int timeout_ms, int wake_fd, bool *ready,
                                bool *woken) {
  size_t need = 2 * (size_t)comm->nactive + 3;
  size_t n = 0;
  bool bell_added = false;

  if (hvd_array_reserve(&comm->pfds, &comm->pfds_cap, need, sizeof(*comm->pfds), 16) != HVD_OK)
    return hvd_error_prefix("the poll set of %zu entries", need);
  for (int k = 0; k < comm->nactive; k++) {
    struct net_conn *c = &comm->conns[comm->active[k]];
    if (c->ring_rx != NULL) {
      if (!net_link_prepare_sleep(c, comm->pfds, &n, &bell_added))
        timeout_ms = 0;
      continue;
    }
    if (c->tx_fd >= 0 && (c->send_head != NULL || (awaits_dial(c) && c->tx != TX_READY))) {
      short events = c->tx == TX_READY ? POLLOUT : net_conn_tx_events(c);
      if (events != 0)
        comm->pfds[n++] = (struct pollfd){.fd = c->tx_fd, .events = events};
    }
    if (c->rx_fd >= 0 && c->recv_head != NULL)
      comm->pfds[n++] = (struct pollfd){.fd = c->rx_fd, .events = POLLIN};
    else if (c->recv_head != NULL && c->tx == TX_READY && c->tx_fd >= 0 && c->send_head == NULL)
      comm->pfds[n++] = (struct pollfd){.fd = c->tx_fd, .events = POLLIN}; /* its end: see pass */
  }
  net_ctx_poll_fds(comm->ctx, comm->pfds, &n, comm->pfds_cap);
  if (wake_fd >= 0)
    comm->pfds[n++] = (struct pollfd){.fd = wake_fd, .events = POLLIN};
  int rc = poll(comm->pfds, n, timeout_ms);
  if (rc < 0 && errno != EINTR)
    return hvd_error(HVD_ERR_IO, "poll: %s", strerror(errno));
  if (bell_added)
    net_link_after_sleep(comm, comm->pfds, rc > 0 ? n : 0);
  *ready = rc != 0;
  *woken = wake_fd >= 0 && rc > 0 && (comm->pfds[n - 1].revents & (POLLIN | POLLERR | POLLHUP));
  return HVD_OK;
}

hvd_status net_engine_run(struct net_comm *comm, bool (*done)(void *arg), void *arg,
                      const struct engine_limits *limits) {
  struct net_ctx *ctx = comm->ctx;
  int wake_fd = limits != NULL ? limits->wake_fd : -1;
  int64_t until = limits != NULL ? limits->deadline_ns : HVD_NO_DEADLINE;
  bool idle = limits != NULL && limits->idle;
  bool ready = true; /* whether a socket may have something for us */
  bool woken = false;
  /* The clock (tens of ns in a virtual machine) is read once a turn, and
   * not at all when the first pass finishes the wait: a spin turn's
   * reading after its yield or poll serves the next turn. */
  int64_t now = 0, spin_until = 0;
  bool started = false, have_now = false;

  for (;;) {
    bool progressed = false;
    hvd_status st;
    int64_t deadline;

    if (comm->poison != HVD_OK)
      return poisoned(comm);
    if (ready) {
      st = pass(comm, &progressed);
      if (st != HVD_OK)
        return net_comm_poison(comm, st);
      if (done(arg))
        return HVD_OK;
    }
    if (woken)
      return HVD_OK;
    if (!have_now)
      now = hvd_now_ns();
    have_now = false;
    if (!started) {
      started = true;
      comm->last_progress_ns = now;
      spin_until = now + ctx->spin_ns;
    }
    if (progressed) {
      comm->last_progress_ns = now;
      spin_until = now + ctx->spin_ns;
      continue;
    }
    if (now >= until)
      return HVD_OK;
    deadline = idle ? until : comm->last_progress_ns + ctx->timeout_ms * 1000000;
    if (!idle && now >= deadline) {
      char what[512];
      describe_wait(comm, what, sizeof(what));
      hvd_error(HVD_ERR_TIMEOUT,
                "no progress for %.1f s: %s (a peer may have hung or lost its network; raise "
                "HOROVOD_GLOO_TIMEOUT_SECONDS if it is only slow)",
                (double)ctx->timeout_ms / 1000.0, what[0] ? what : "waiting");
      if (!comm->isolate)
        return net_comm_poison(comm, HVD_ERR_TIMEOUT);
      /* Isolated: the peers we wait for fail, the others go on. */
      for (int k = 0; k < comm->nactive; k++) {
        struct net_conn *c = &comm->conns[comm->active[k]];
        if (busy(c))
          conn_fail(comm, c, HVD_ERR_TIMEOUT);
      }
      comm->last_progress_ns = now;
      ready = true;
      continue;
    }
    if (now < spin_until && now >= ctx->spin_resume_ns) {
      /* Spin on a zero-timeout poll rather than on failing reads: a read
       * takes the socket lock that the kernel needs to deliver our data.
       * Yield too: when ranks outnumber cores, the peer we wait for may
       * need this core; with a core to spare that costs ~0.3 us. */
      bool links = only_links(comm);
      /* Ranks of one host that fit its cores have a core each: a yield
       * would only delay noticing the message. */
      if (ctx->spin_yield && !(links && comm->size <= ctx->cpus))
        sched_yield();
      /* The wake fd is only polled when sleeping: while spinning, done()
       * sees what it signals. Links through shared memory are read
       * directly: with nothing else to wait for, no system call. */
      if (links) {
        ready = true;
      } else {
        st = sleep_in_poll(comm, 0, -1, &ready, &woken);
        if (st != HVD_OK)
          return net_comm_poison(comm, st);
      }
      /* One turn of the spin took a scheduler slice: another process wants
       * this core, and each yield hands it a whole slice (milliseconds)
       * while a thread asleep in poll() is woken first when data comes.
       * Sleep instead of spinning for a while. */
      int64_t after = hvd_now_ns();
      if (after - now > HVD_SPIN_LOST_CORE_NS) {
        ctx->spin_resume_ns = after + SPIN_BACKOFF_NS;
        HVD_LOG_DEBUG("spinning lost the core for %.1f ms: sleeping in poll() instead for %d ms",
                      (double)(after - now) / 1e6, (int)(SPIN_BACKOFF_NS / 1000000));
      }
      now = after;
      have_now = true;
      ready = ready || done(arg);
      continue;
    }
    if (limits != NULL && limits->sleep != NULL && limits->sleep(limits->sleep_arg)) {
      ready = true;
      continue;
    }
    st = sleep_in_poll(comm, poll_timeout_ms(comm, now, deadline), wake_fd, &ready, &woken);
    if (st != HVD_OK)
      return net_comm_poison(comm, st);
    ready = true; /* timers (retries, handshake deadlines) need a pass too */
    comm->passes = 0; /* after sleeping, the next pass looks at the listener */
  }
}

/* ---- waiting ------------------------------------------------------------------------- */

struct wait_set {
  struct net_req *const *reqs;
  size_t n;
};

static bool all_done(void *arg) {
  const struct wait_set *w = arg;
  for (size_t i = 0; i < w->n; i++) {
    if (!w->reqs[i]->done)
      return false;
  }
  return true;
}

static bool any_done(void *arg) {
  const struct wait_set *w = arg;
  for (size_t i = 0; i < w->n; i++) {
    if (w->reqs[i]->done)
      return true;
  }
  return false;
}

hvd_status net_wait_any(struct net_comm *comm, struct net_req *const *reqs, size_t n) {
  struct wait_set w = {reqs, n};
  hvd_status st = HVD_OK;

  if (!any_done(&w))
    st = net_engine_run(comm, any_done, &w, NULL);
  for (size_t i = 0; i < n && st == HVD_OK; i++) {
    if (reqs[i]->done && reqs[i]->status != HVD_OK)
      st = req_failure(comm, reqs[i]);
  }
  return st;
}

struct event_set {
  struct wait_set w;
  const struct net_wake *wake;
};

static bool event_done(void *arg) {
  const struct event_set *e = arg;
  return any_done((void *)&e->w) || (e->wake->check != NULL && e->wake->check(e->wake->arg));
}

hvd_status net_wait_event(struct net_comm *comm, struct net_req *const *reqs, size_t n,
                          const struct net_wake *wake, int64_t deadline_ns) {
  static const struct net_wake none = {.fd = -1};
  struct event_set e = {{reqs, n}, wake != NULL ? wake : &none};
  struct engine_limits limits = {.wake_fd = e.wake->fd,
                                 .sleep = e.wake->sleep,
                                 .sleep_arg = e.wake->arg,
                                 .deadline_ns = deadline_ns,
                                 .idle = true};
  hvd_status st = HVD_OK;

  if (comm->poison != HVD_OK)
    return poisoned(comm);
  if (!event_done(&e))
    st = net_engine_run(comm, event_done, &e, &limits);
  for (size_t i = 0; i < n && st == HVD_OK; i++) {
    if (reqs[i]->done && reqs[i]->status != HVD_OK)
      st = req_failure(comm, reqs[i]);
  }
  return st;
}

hvd_status net_wait(struct net_comm *comm, struct net_req *const *reqs, size_t n) {
  struct wait_set w = {reqs, n};
  hvd_status st = HVD_OK;

  if (!all_done(&w))
    st = net_engine_run(comm, all_done, &w, NULL);
  for (size_t i = 0; i < n && st == HVD_OK; i++) {
    if (reqs[i]->status != HVD_OK)
      st = req_failure(comm, reqs[i]);
  }
  return st;
}

hvd_status net_send(struct net_comm *comm, int peer, const void *buf, size_t len) {
  struct net_req r;
  struct net_req *rs[] = {&r};
  hvd_status st = net_isend(comm, peer, buf, len, &r);
  return st == HVD_OK ? net_wait(comm, rs, 1) : st;
}

hvd_status net_recv(struct net_comm *comm, int peer, void *buf, size_t len) {
  struct net_req r;
  struct net_req *rs[] = {&r};
  hvd_status st = net_irecv(comm, peer, buf, len, &r);
  return st == HVD_OK ? net_wait(comm, rs, 1) : st;
}

hvd_status net_sendrecv(struct net_comm *comm, int to, const void *sbuf, size_t slen, int from,
                        void *rbuf, size_t rlen) {
  struct net_req s, r;
  struct net_req *rs[] = {&s, &r};
  hvd_status st;

  /* Check both peers first: a receive must never stay queued after we return
   * (once one is posted, the send can only fail with the receive). */
  if (!is_peer(comm, to) || !is_peer(comm, from))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "communicator %s: sendrecv peers %d and %d must be other members (size %d, "
                     "this rank %d)",
                     comm->scope, to, from, comm->size, comm->rank);
  st = net_irecv(comm, from, rbuf, rlen, &r);
  if (st == HVD_OK)
    st = net_isend(comm, to, sbuf, slen, &s);
  return st == HVD_OK ? net_wait(comm, rs, 2) : st;
}
