/*
 * The transport context: one per process (per elastic generation). It picks
 * the addresses this rank advertises, owns the listening socket, and accepts
 * connections for every communicator.
 *
 * DESIGN. Peers may connect before the communicator they belong to exists
 * here (ranks build global, local and cross communicators at their own
 * pace), so an accepted socket lives on the context: its HELLO is read
 * without blocking, checked (magic, version, token, generation) and answered
 * with an ACK; a refused socket is closed with a logged reason and nothing
 * else is disturbed. An accepted one is parked until its communicator claims
 * it by (communicator id, sender, receiver). Whichever communicator is
 * waiting drives this, so no extra thread is needed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport_private.h"

enum {
  INCOMING_MAX = 4096,          /* sockets in handshake or parked */
  HANDSHAKE_TIMEOUT_MS = 10000, /* a connector must send its HELLO by then */
  SPIN_US_DEFAULT = 50,
  IO_CHUNK_DEFAULT = 1 << 20,
  SOCKET_BUFFER_MIN = 1 << 16,
};

hvd_status net_ctx_create(const struct net_ctx_config *cfg, struct net_ctx **out) {
  struct net_ctx *ctx = calloc(1, sizeof(*ctx));
  int64_t spin_us = 0, sockbuf = 0, chunk = 0;
  int family = AF_INET;
  hvd_status st;

  if (ctx == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the transport context");
  ctx->listen_fd = -1;
  ctx->rank = cfg->rank;
  ctx->generation = cfg->generation;
  ctx->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : RDZV_DEFAULT_TIMEOUT_MS;
  ctx->store = cfg->store;
  snprintf(ctx->hostname, sizeof(ctx->hostname), "%s",
           cfg->hostname != NULL ? cfg->hostname : "localhost");
  if (cfg->token != NULL) {
    ctx->token_len = strlen(cfg->token);
    if (ctx->token_len > NET_TOKEN_MAX) {
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "the job token is %zu bytes; at most %d are allowed",
                     ctx->token_len, NET_TOKEN_MAX);
      goto fail;
    }
    memcpy(ctx->token, cfg->token, ctx->token_len);
  }
  st = hvd_env_int("HVD_SPIN_US", SPIN_US_DEFAULT, 0, 1000000, &spin_us);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_SOCKET_BUFFER_BYTES", 0, 0, 1 << 30, &sockbuf);
  /* Smaller buffers cannot hold one loopback segment (64 KiB MTU): the
   * receiver drops it and TCP backs off for seconds between retransmits. */
  if (st == HVD_OK && sockbuf > 0 && sockbuf < SOCKET_BUFFER_MIN)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_SOCKET_BUFFER_BYTES is %lld; it must be 0 (the kernel's autotuning) or at "
                   "least %d",
                   (long long)sockbuf, SOCKET_BUFFER_MIN);
  if (st == HVD_OK)
    st = hvd_env_bool("HVD_SPIN_YIELD", true, &ctx->spin_yield);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_IO_CHUNK_BYTES", IO_CHUNK_DEFAULT, 4096, INT64_C(1) << 40, &chunk);
  ctx->io_chunk = (size_t)chunk;
  if (st != HVD_OK)
    goto fail;
  ctx->spin_ns = spin_us * 1000;
  ctx->socket_buffer = (int)sockbuf;

  st = net_select_addresses(cfg->iface_spec, cfg->store != NULL ? cfg->store_host : NULL,
                            cfg->store_port, ctx->addrs, NET_MAX_ADDRS, &ctx->naddrs);
  if (st != HVD_OK)
    goto fail;
  for (size_t i = 0; i < ctx->naddrs; i++) {
    if (ctx->addrs[i].ss.ss_family == AF_INET6)
      family = AF_INET6; /* dual-stack: serves the IPv4 addresses too */
  }
  st = net_listen(family, cfg->port_range, &ctx->listen_fd, &ctx->port);
  if (st != HVD_OK)
    goto fail;
  if (hvd_log_enabled(HVD_LOG_DEBUG)) {
    char first[80];
    net_addr_format(&ctx->addrs[0], first, sizeof(first));
    HVD_LOG_DEBUG("transport: listening on port %d, advertising %s%s", ctx->port, first,
                  ctx->naddrs > 1 ? " and more" : "");
  }
  *out = ctx;
  return HVD_OK;
fail:
  net_ctx_destroy(ctx);
  return st;
}

static void drop_incoming(struct net_ctx *ctx, struct net_incoming **link) {
  struct net_incoming *in = *link;
  *link = in->next;
  close(in->fd);
  free(in);
  ctx->nincoming--;
}

void net_ctx_destroy(struct net_ctx *ctx) {
  if (ctx == NULL)
    return;
  while (ctx->incoming != NULL)
    drop_incoming(ctx, &ctx->incoming);
  if (ctx->listen_fd >= 0)
    close(ctx->listen_fd);
  free(ctx);
}

int net_ctx_port(const struct net_ctx *ctx) { return ctx->port; }

void ctx_tune_socket(const struct net_ctx *ctx, int fd) {
  int one = 1;
  /* An idle connection to a host that vanished (power loss, a cut cable:
   * no FIN, no RST) must still fail within about the timeout: keepalive
   * probes after timeout/2 of silence, three more timeout/6 apart; and
   * data unacknowledged for the timeout fails the connection. */
  int secs = (int)(ctx->timeout_ms / 1000), idle = secs / 2 > 0 ? secs / 2 : 1;
  int intvl = secs / 6 > 0 ? secs / 6 : 1, count = 3;
  unsigned user_timeout = ctx->timeout_ms > UINT32_MAX ? UINT32_MAX : (unsigned)ctx->timeout_ms;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
  if (ctx->socket_buffer > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &ctx->socket_buffer, sizeof(ctx->socket_buffer));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &ctx->socket_buffer, sizeof(ctx->socket_buffer));
  }
}

/* ---- accepting ------------------------------------------------------------------- */

static void accept_new(struct net_ctx *ctx, bool *progressed) {
  for (;;) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(ctx->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    struct net_incoming *in;
    struct net_addr peer;

    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        HVD_LOG_WARN("transport: accept: %s", strerror(errno));
      return;
    }
    *progressed = true;
    if (ctx->nincoming >= INCOMING_MAX || (in = calloc(1, sizeof(*in))) == NULL) {
      HVD_LOG_WARN("transport: refusing a connection: %zu are already waiting", ctx->nincoming);
      close(fd);
      continue;
    }
    memcpy(&peer.ss, &ss, sizeof(ss));
    peer.len = len;
    net_addr_format_port(&peer, ntohs(((struct sockaddr_in *)&ss)->sin_port), in->from_text,
                         sizeof(in->from_text));
    in->fd = fd;
    in->need = NET_HELLO_FIXED;
    in->deadline_ns = hvd_deadline_after_ms(HANDSHAKE_TIMEOUT_MS < ctx->timeout_ms
                                                ? HANDSHAKE_TIMEOUT_MS
                                                : ctx->timeout_ms);
    in->next = ctx->incoming;
    ctx->incoming = in;
    ctx->nincoming++;
  }
}

/* Decides on a complete HELLO; prepares the ACK. */
static void judge(struct net_ctx *ctx, struct net_incoming *in) {
  const struct net_hello *h = &in->hello;
  enum net_ack_status status = NET_ACK_OK;

  if (h->version != NET_PROTOCOL_VERSION)
    status = NET_ACK_BAD_VERSION;
  else if (!hvd_secure_equal(h->token, h->token_len, ctx->token, ctx->token_len))
    status = NET_ACK_BAD_TOKEN;
  else if (h->generation != ctx->generation)
    status = NET_ACK_BAD_GENERATION;
  if (status != NET_ACK_OK)
    HVD_LOG_WARN("transport: refused a connection from %s (rank %u of communicator %u, protocol "
                 "version %u, generation %llu): %s",
                 in->from_text, h->from, h->comm_id, h->version,
                 (unsigned long long)h->generation, net_ack_status_text(status));
  net_ack_encode(status, in->ack);
  in->validated = status == NET_ACK_OK;
}

/* Advances one handshake; returns false when the socket must be dropped. */
static bool advance(struct net_ctx *ctx, struct net_incoming *in, bool *progressed) {
  while (in->have < in->need) {
    ssize_t n = recv(in->fd, in->buf + in->have, in->need - in->have, 0);
    if (n == 0) {
      HVD_LOG_DEBUG("transport: %s closed before finishing its handshake", in->from_text);
      return false;
    }
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return true;
      HVD_LOG_DEBUG("transport: handshake from %s: %s", in->from_text, strerror(errno));
      return false;
    }
    *progressed = true;
    in->have += (size_t)n;
    if (in->have == NET_HELLO_FIXED) {
      if (net_hello_decode_fixed(in->buf, &in->hello) != HVD_OK) {
        HVD_LOG_WARN("transport: refused a connection from %s: %s", in->from_text,
                     hvd_last_error_message());
        return false;
      }
      in->need = NET_HELLO_FIXED + in->hello.token_len;
    }
    if (in->have == in->need) {
      memcpy(in->hello.token, in->buf + NET_HELLO_FIXED, in->hello.token_len);
      judge(ctx, in);
    }
  }
  while (in->ack_sent < NET_ACK_BYTES) {
    ssize_t n = send(in->fd, in->ack + in->ack_sent, NET_ACK_BYTES - in->ack_sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    *progressed = true;
    in->ack_sent += (size_t)n;
  }
  if (!in->validated)
    return false; /* the refusal has been sent; close */
  ctx_tune_socket(ctx, in->fd);
  return true;
}

static bool parked(const struct net_incoming *in) {
  return in->validated && in->ack_sent == NET_ACK_BYTES;
}

void ctx_progress_incoming(struct net_ctx *ctx, bool *progressed) {
  int64_t now = 0;

  accept_new(ctx, progressed);
  for (struct net_incoming **link = &ctx->incoming; *link != NULL;) {
    struct net_incoming *in = *link;
    if (parked(in)) {
      link = &in->next;
      continue;
    }
    if (!advance(ctx, in, progressed)) {
      drop_incoming(ctx, link);
      continue;
    }
    if (!parked(in)) {
      if (now == 0)
        now = hvd_now_ns();
      if (now > in->deadline_ns) {
        HVD_LOG_WARN("transport: dropped a connection from %s: no complete handshake in time",
                     in->from_text);
        drop_incoming(ctx, link);
        continue;
      }
    }
    link = &in->next;
  }
}

void ctx_poll_fds(struct net_ctx *ctx, struct pollfd *fds, size_t *n, size_t max) {
  if (*n < max)
    fds[(*n)++] = (struct pollfd){.fd = ctx->listen_fd, .events = POLLIN};
  for (struct net_incoming *in = ctx->incoming; in != NULL && *n < max; in = in->next) {
    if (parked(in))
      continue;
    fds[(*n)++] =
        (struct pollfd){.fd = in->fd, .events = in->have < in->need ? POLLIN : POLLOUT};
  }
}

int64_t ctx_next_deadline(const struct net_ctx *ctx) {
  int64_t next = HVD_NO_DEADLINE;
  for (const struct net_incoming *in = ctx->incoming; in != NULL; in = in->next) {
    if (!parked(in) && in->deadline_ns < next)
      next = in->deadline_ns;
  }
  return next;
}

int ctx_claim(struct net_ctx *ctx, uint32_t comm_id, uint32_t from, uint32_t to) {
  for (struct net_incoming **link = &ctx->incoming; *link != NULL; link = &(*link)->next) {
    struct net_incoming *in = *link;
    if (parked(in) && in->hello.comm_id == comm_id && in->hello.from == from &&
        in->hello.to == to) {
      int fd = in->fd;
      *link = in->next;
      free(in);
      ctx->nincoming--;
      return fd;
    }
  }
  return -1;
}
