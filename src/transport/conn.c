/*
 * Setting up the connections of a communicator.
 *
 * DESIGN. Each direction of a pair has its own TCP connection, dialled by
 * the rank that sends on it; the receiving rank gets it from the context,
 * which accepted it and checked its HELLO. So a rank dials when it first
 * sends to a peer and waits for the peer's dial when it first receives, and
 * the two never race. One socket per direction matters on a shared machine:
 * with one socket, this rank's sendmsg and the peer's incoming segments
 * contend for the same socket lock, and a 512 KiB exchange between two
 * processes on two cores took ~200 us instead of ~100-130 us.
 * Dialling is non-blocking: connect(), HELLO, ACK. Failed attempts (one of
 * the peer's addresses may be unreachable from here) are retried with
 * backoff, cycling through the peer's advertised addresses, until the
 * communicator's progress timeout; an address that silently drops the
 * attempt (a firewall) is given up after CONNECT_ATTEMPT_MS when the peer
 * has others to try. A peer that refuses on every one of its addresses in a
 * row is gone (it listens before it publishes its record, and until it
 * leaves), and the dial fails at once. A
 * peer on another host is dialled on its non-loopback addresses first: a
 * loopback address only works between ranks on one host.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "transport_private.h"

enum { BACKOFF_FIRST_MS = 10, BACKOFF_MAX_MS = 1000, CONNECT_ATTEMPT_MS = 2000 };

void net_conn_start_tx(struct net_comm *comm, struct net_conn *c) {
  struct net_ctx *ctx = comm->ctx;
  struct net_hello h;

  if (c->tx != TX_IDLE)
    return;
  memset(&h, 0, sizeof(h));
  h.version = NET_PROTOCOL_VERSION;
  h.token_len = (uint16_t)ctx->token_len;
  memcpy(h.token, ctx->token, ctx->token_len);
  h.comm_id = comm->id;
  h.from = (uint32_t)comm->rank;
  h.to = (uint32_t)c->peer;
  h.from_global = (uint32_t)ctx->rank;
  h.generation = ctx->generation;
  c->hello_len = net_hello_encode(&h, c->hello);
  c->hello_sent = 0;
  c->ack_have = 0;
  c->tx = TX_CONNECTING;
  c->tx_fd = -1;
  c->retry_at_ns = 0;
  c->attempts = 0;
  c->refusals = 0;
  c->backoff_ms = BACKOFF_FIRST_MS;
}

short net_conn_tx_events(const struct net_conn *c) {
  switch (c->tx) {
  case TX_CONNECTING: return c->tx_fd >= 0 ? POLLOUT : 0;
  case TX_HELLO: return POLLOUT;
  case TX_ACK: return POLLIN;
  default: return 0;
  }
}

void net_conn_claim_rx(struct net_comm *comm, struct net_conn *c, bool *progressed) {
  if (c->rx_fd >= 0)
    return;
  c->rx_fd = net_ctx_claim(comm->ctx, comm->id, (uint32_t)c->peer, (uint32_t)comm->rank);
  if (c->rx_fd >= 0)
    *progressed = true;
}

hvd_status net_conn_check_peer_alive(struct net_comm *comm, struct net_conn *c) {
  char who[NET_WHO_MAX], byte;
  ssize_t n;

  if (c->tx != TX_READY || c->tx_fd < 0)
    return HVD_OK;
  n = recv(c->tx_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
    return HVD_OK;
  net_comm_describe_peer(comm, c->peer, who, sizeof(who));
  return hvd_error(HVD_ERR_NETWORK,
                   "%s closed the connection this rank dialled before dialling back (%s): it "
                   "has exited or left the round",
                   who, n == 0 ? "end of stream" : strerror(errno));
}

void net_conn_close(struct net_conn *c) {
  net_link_close(c);
  if (c->tx_fd >= 0)
    close(c->tx_fd);
  if (c->rx_fd >= 0)
    close(c->rx_fd);
  c->tx_fd = c->rx_fd = -1;
}

/* The address to dial on this attempt: same-host peers in the order they
 * advertised, others with loopback addresses moved last. */
static hvd_status pick_address(struct net_comm *comm, struct net_conn *c, struct net_addr *out,
                               char *text, size_t size, size_t *count) {
  const struct rdzv_record *r = &comm->records[c->peer];
  bool same_host = strcmp(r->host, comm->ctx->hostname) == 0;
  size_t order[RDZV_RECORD_MAX_ADDRS];
  size_t n = 0;

  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < r->naddrs; i++) {
      struct net_addr a;
      if (net_addr_parse(r->addrs[i], &a) != HVD_OK)
        continue;
      bool late = !same_host && net_addr_is_loopback(&a);
      if (late == (pass == 1))
        order[n++] = i;
    }
  }
  if (n == 0)
    return hvd_error(HVD_ERR_PROTOCOL, "no usable address in its record");
  size_t pick = order[c->attempts % n];
  *count = n;
  net_addr_parse(r->addrs[pick], out);
  net_addr_set_port(out, r->port);
  net_addr_format_port(out, r->port, text, size);
  return HVD_OK;
}

static void close_fd(struct net_conn *c) {
  if (c->tx_fd >= 0)
    close(c->tx_fd);
  c->tx_fd = -1;
}

/* A failed attempt: retry later if the error can pass, otherwise fail.
 * naddrs: how many addresses the peer has (0: unknown). A peer publishes
 * its record only once it listens and listens until it leaves, so when
 * every one of its addresses refused in a row, it is gone: waiting for the
 * timeout would only hold up everyone who waits for this rank. */
static hvd_status attempt_failed(struct net_comm *comm, struct net_conn *c, int err,
                                 const char *where, size_t naddrs) {
  char who[NET_WHO_MAX];

  close_fd(c);
  c->attempts++;
  c->refusals = err == ECONNREFUSED ? c->refusals + 1 : 0;
  if (naddrs > 0 && c->refusals >= naddrs) {
    net_comm_describe_peer(comm, c->peer, who, sizeof(who));
    return hvd_error(HVD_ERR_NETWORK,
                     "%s refused the connection on %s (%s): it has exited or left the round",
                     who, naddrs > 1 ? "all its addresses" : "its address", where);
  }
  switch (err) {
  case ECONNREFUSED:
  case ETIMEDOUT:
  case EHOSTUNREACH:
  case ENETUNREACH:
  case ECONNRESET:
  case ECONNABORTED:
  case EADDRNOTAVAIL:
  case EAGAIN:
    c->retry_at_ns = hvd_deadline_after_ms(c->backoff_ms);
    c->backoff_ms = c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
    HVD_LOG_DEBUG("transport: connect to %s: %s; retrying", where, strerror(err));
    return HVD_OK;
  default:
    net_comm_describe_peer(comm, c->peer, who, sizeof(who));
    return hvd_error(HVD_ERR_NETWORK, "cannot connect to %s at %s: %s", who, where,
                     strerror(err));
  }
}

static hvd_status dial(struct net_comm *comm, struct net_conn *c, bool *progressed) {
  struct net_addr addr;
  char where[96];
  size_t count = 0;
  hvd_status st;

  st = pick_address(comm, c, &addr, where, sizeof(where), &count);
  if (st != HVD_OK) {
    char who[NET_WHO_MAX];
    net_comm_describe_peer(comm, c->peer, who, sizeof(who));
    return hvd_error_prefix("cannot connect to %s", who);
  }
  if (c->tx_fd < 0) {
    if (hvd_now_ns() < c->retry_at_ns)
      return HVD_OK;
    c->tx_fd = socket(addr.ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->tx_fd < 0)
      return hvd_error(HVD_ERR_IO, "socket for %s: %s", where, strerror(errno));
    c->attempt_deadline_ns = count > 1 ? hvd_deadline_after_ms(CONNECT_ATTEMPT_MS) : INT64_MAX;
  }
  /* connect() again tells how a pending attempt went: EISCONN once done. */
  if (connect(c->tx_fd, (struct sockaddr *)&addr.ss, addr.len) != 0 && errno != EISCONN) {
    int err = errno;
    if ((err == EINPROGRESS || err == EALREADY) && hvd_now_ns() >= c->attempt_deadline_ns)
      return attempt_failed(comm, c, ETIMEDOUT, where, count); /* the next address, then */
    if (err == EINPROGRESS || err == EALREADY || err == EINTR)
      return HVD_OK;
    return attempt_failed(comm, c, err, where, count);
  }
  *progressed = true;
  net_ctx_tune_socket(comm->ctx, c->tx_fd);
  c->tx = TX_HELLO;
  return HVD_OK;
}

static hvd_status send_hello(struct net_comm *comm, struct net_conn *c, bool *progressed) {
  while (c->hello_sent < c->hello_len) {
    ssize_t n =
        send(c->tx_fd, c->hello + c->hello_sent, c->hello_len - c->hello_sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return HVD_OK;
      c->tx = TX_CONNECTING;
      c->hello_sent = 0;
      return attempt_failed(comm, c, errno, "the peer", 0);
    }
    *progressed = true;
    c->hello_sent += (size_t)n;
  }
  c->tx = TX_ACK;
  return HVD_OK;
}

static hvd_status read_ack(struct net_comm *comm, struct net_conn *c, bool *progressed) {
  uint16_t version, status;
  char who[NET_WHO_MAX];

  while (c->ack_have < NET_ACK_BYTES) {
    ssize_t n = recv(c->tx_fd, c->ack + c->ack_have, NET_ACK_BYTES - c->ack_have, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return HVD_OK;
    if (n <= 0) {
      net_comm_describe_peer(comm, c->peer, who, sizeof(who));
      return hvd_error(HVD_ERR_NETWORK,
                       "%s closed the connection during the handshake (%s); is something else "
                       "listening on its port?",
                       who, n == 0 ? "end of stream" : strerror(errno));
    }
    *progressed = true;
    c->ack_have += (size_t)n;
  }
  net_comm_describe_peer(comm, c->peer, who, sizeof(who));
  if (net_ack_decode(c->ack, &version, &status) != HVD_OK)
    return hvd_error_prefix("handshake with %s", who);
  if (status != NET_ACK_OK)
    return hvd_error(status == NET_ACK_BAD_TOKEN ? HVD_ERR_UNAUTHORIZED : HVD_ERR_PROTOCOL,
                     "%s refused the connection: %s (the ranks of a job need the same HVD_TOKEN, "
                     "elastic generation and transport protocol: it speaks version %u, this "
                     "rank %u)",
                     who, net_ack_status_text(status), version, NET_PROTOCOL_VERSION);
  c->tx = TX_READY;
  return HVD_OK;
}

hvd_status net_conn_progress_tx(struct net_comm *comm, struct net_conn *c, bool *progressed) {
  switch (c->tx) {
  case TX_CONNECTING:
    return dial(comm, c, progressed);
  case TX_HELLO:
    return send_hello(comm, c, progressed);
  case TX_ACK:
    return read_ack(comm, c, progressed);
  default:
    return HVD_OK;
  }
}
