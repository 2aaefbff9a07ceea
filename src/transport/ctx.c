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
 *
 * The listener faces the network, so strangers cost little and not for
 * long: the listener and every socket in its handshake sit in one epoll
 * set, which is a single descriptor in the engine's poll(); at most
 * HANDSHAKES_MAX handshakes run at once (the oldest is dropped for a new
 * one), each must finish within HANDSHAKE_TIMEOUT_MS, a parked socket
 * nobody claims within the job's timeout is closed, and at EMFILE a reserve
 * descriptor lets the listener accept and close what waits instead of
 * waking for it forever. Drops are logged at most once a second.
 *
 * The listener stays open, and serviced, for as long as the job runs,
 * even where every communicator so far meets in shared memory: a process
 * set added later, a segment a host refuses, a TCP algorithm asked for by
 * name, all dial on first use, and a shared segment is itself set up over
 * token-checked TCP links. Whoever waits on any communicator services it
 * (the loop does while idle), so a stranger is answered or dropped within
 * HANDSHAKE_TIMEOUT_MS. Once the owner stops talking to other ranks (the
 * coordinator's loop ended: the job stopped or failed), nobody would
 * service it again, so net_ctx_stop_listening closes it: a dial is then
 * refused, as it would be once the process exits, instead of hanging in
 * the backlog until hvd_shutdown.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "transport_private.h"

enum {
  HANDSHAKES_MAX = 256,        /* sockets in their handshake at once */
  PARKED_MAX = 4096,           /* validated sockets waiting for their communicator */
  HANDSHAKE_TIMEOUT_MS = 3000, /* a connector sends its HELLO at once; by then at the latest */
  EPOLL_BATCH = 64,
  ACCEPT_BATCH = 64, /* per call: a connection storm must not starve the collectives */
  LOG_INTERVAL_MS = 1000,
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
  ctx->epoll_fd = -1;
  ctx->reserve_fd = -1;
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
  st = hvd_setting_int(HVD_SET_SPIN_US, &spin_us);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_SOCKET_BUFFER_BYTES, &sockbuf);
  /* Smaller buffers cannot hold one loopback segment (64 KiB MTU): the
   * receiver drops it and TCP backs off for seconds between retransmits. */
  if (st == HVD_OK && sockbuf > 0 && sockbuf < SOCKET_BUFFER_MIN)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_SOCKET_BUFFER_BYTES is %lld; it must be 0 (the kernel's autotuning) or at "
                   "least %d",
                   (long long)sockbuf, SOCKET_BUFFER_MIN);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_SPIN_YIELD, &ctx->spin_yield);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_SHM, &ctx->shm);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_IO_CHUNK_BYTES, &chunk);
  ctx->io_chunk = (size_t)chunk;
  if (st != HVD_OK)
    goto fail;
  ctx->spin_ns = spin_us * 1000;
  ctx->cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
  ctx->socket_buffer = (int)sockbuf;

  st = net_select_addresses(cfg->iface_spec, cfg->store != NULL ? cfg->store_host : NULL,
                            cfg->store_port, ctx->addrs, NET_MAX_ADDRS, &ctx->naddrs);
  if (st != HVD_OK)
    goto fail;
  for (size_t i = 0; i < ctx->naddrs; i++) {
    if (ctx->addrs[i].ss.ss_family == AF_INET6)
      family = AF_INET6; /* dual-stack: serves the IPv4 addresses too */
  }
  st = net_listen_avoiding(family, cfg->port_range, cfg->store_port, &ctx->listen_fd, &ctx->port);
  if (st != HVD_OK)
    goto fail;
  (void)hvd_raise_fd_limit();
  ctx->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (ctx->epoll_fd < 0 ||
      epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, ctx->listen_fd,
                &(struct epoll_event){.events = EPOLLIN, .data.ptr = NULL}) != 0) {
    st = hvd_error(HVD_ERR_IO, "transport: epoll for the listener: %s", strerror(errno));
    goto fail;
  }
  ctx->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
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

static void list_push(struct net_incoming_list *l, struct net_incoming *in) {
  in->prev = l->tail;
  in->next = NULL;
  if (l->tail != NULL)
    l->tail->next = in;
  else
    l->head = in;
  l->tail = in;
  l->n++;
}

static void list_remove(struct net_incoming_list *l, struct net_incoming *in) {
  if (in->prev != NULL)
    in->prev->next = in->next;
  else
    l->head = in->next;
  if (in->next != NULL)
    in->next->prev = in->prev;
  else
    l->tail = in->prev;
  l->n--;
}

static void drop_incoming(struct net_incoming_list *l, struct net_incoming *in) {
  list_remove(l, in);
  close(in->fd); /* leaves the epoll set with it */
  free(in);
}

/* true at most once per LOG_INTERVAL_MS; *suppressed says how many were not. */
static bool log_due(struct net_log_limit *l, unsigned *suppressed) {
  int64_t now = hvd_now_ns();
  if (now < l->next_ns) {
    l->suppressed++;
    return false;
  }
  l->next_ns = now + (int64_t)LOG_INTERVAL_MS * 1000000;
  *suppressed = l->suppressed;
  l->suppressed = 0;
  return true;
}

void net_ctx_stop_listening(struct net_ctx *ctx) {
  while (ctx->handshaking.head != NULL)
    drop_incoming(&ctx->handshaking, ctx->handshaking.head);
  while (ctx->parked.head != NULL)
    drop_incoming(&ctx->parked, ctx->parked.head);
  if (ctx->listen_fd >= 0)
    close(ctx->listen_fd); /* leaves the epoll set with it */
  ctx->listen_fd = -1;
}

void net_ctx_destroy(struct net_ctx *ctx) {
  if (ctx == NULL)
    return;
  net_ctx_stop_listening(ctx);
  if (ctx->epoll_fd >= 0)
    close(ctx->epoll_fd);
  if (ctx->reserve_fd >= 0)
    close(ctx->reserve_fd);
  free(ctx);
}

int net_ctx_port(const struct net_ctx *ctx) { return ctx->port; }

void net_ctx_tune_socket(const struct net_ctx *ctx, int fd) {
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
  net_ctx_tune_socket(ctx, in->fd);
  return true;
}

/* A socket whose handshake is done leaves the epoll set for the parked
 * list, where its communicator will find it. */
static void park(struct net_ctx *ctx, struct net_incoming *in) {
  unsigned suppressed;
  list_remove(&ctx->handshaking, in);
  (void)epoll_ctl(ctx->epoll_fd, EPOLL_CTL_DEL, in->fd, NULL);
  if (ctx->parked.n >= PARKED_MAX) {
    if (log_due(&ctx->drop_log, &suppressed))
      HVD_LOG_WARN("transport: %d validated connections wait for a communicator; dropping the "
                   "oldest (%u more dropped since the last message)",
                   PARKED_MAX, suppressed);
    drop_incoming(&ctx->parked, ctx->parked.head);
  }
  in->deadline_ns = hvd_deadline_after_ms(ctx->timeout_ms);
  list_push(&ctx->parked, in);
}

/* Drops the handshakes and parked sockets whose time is up: each list is in
 * arrival order with one lifetime, so the expired ones are at its head. */
static void expire(struct net_ctx *ctx, int64_t now) {
  unsigned suppressed;
  while (ctx->handshaking.head != NULL && ctx->handshaking.head->deadline_ns <= now) {
    if (log_due(&ctx->drop_log, &suppressed))
      HVD_LOG_WARN("transport: dropped a connection from %s: no complete handshake in time "
                   "(%u more dropped since the last message)",
                   ctx->handshaking.head->from_text, suppressed);
    drop_incoming(&ctx->handshaking, ctx->handshaking.head);
  }
  while (ctx->parked.head != NULL && ctx->parked.head->deadline_ns <= now) {
    const struct net_hello *h = &ctx->parked.head->hello;
    if (log_due(&ctx->drop_log, &suppressed))
      HVD_LOG_WARN("transport: dropped a connection from %s (rank %u of communicator %u): no "
                   "communicator claimed it within %lld ms (%u more dropped since the last "
                   "message)",
                   ctx->parked.head->from_text, h->from, h->comm_id,
                   (long long)ctx->timeout_ms, suppressed);
    drop_incoming(&ctx->parked, ctx->parked.head);
  }
}

/* Advances a handshake and moves the socket on: dropped, parked, or
 * waiting for room to send its ACK. */
static void settle(struct net_ctx *ctx, struct net_incoming *in, bool *progressed) {
  if (!advance(ctx, in, progressed)) {
    drop_incoming(&ctx->handshaking, in);
  } else if (in->validated && in->ack_sent == NET_ACK_BYTES) {
    park(ctx, in);
  } else if (in->have == in->need && !in->want_write) {
    in->want_write = true;
    (void)epoll_ctl(ctx->epoll_fd, EPOLL_CTL_MOD, in->fd,
                    &(struct epoll_event){.events = EPOLLOUT, .data.ptr = in});
  }
}

/* Out of descriptors: accept with the reserve one and close at once, so
 * that the waiting connection leaves the backlog instead of waking the
 * listener on every pass. */
static bool shed_one(struct net_ctx *ctx) {
  int fd;
  if (ctx->reserve_fd < 0)
    return false;
  close(ctx->reserve_fd);
  fd = accept4(ctx->listen_fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd >= 0)
    close(fd);
  ctx->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return fd >= 0;
}

static void accept_new(struct net_ctx *ctx, bool *progressed) {
  for (int k = 0; k < ACCEPT_BATCH; k++) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = accept4(ctx->listen_fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    struct net_incoming *in;
    struct net_addr peer;
    unsigned suppressed;

    if (fd < 0) {
      int err = errno;
      bool shed;
      if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR || err == ECONNABORTED)
        return;
      shed = (err == EMFILE || err == ENFILE) && shed_one(ctx);
      if (log_due(&ctx->accept_log, &suppressed))
        HVD_LOG_WARN("transport: accept: %s%s (%u more since the last message)", strerror(err),
                     shed ? "; closing the connections that wait" : "", suppressed);
      if (!shed)
        return;
      *progressed = true;
      continue;
    }
    *progressed = true;
    if ((in = calloc(1, sizeof(*in))) == NULL) {
      close(fd);
      continue;
    }
    if (ctx->handshaking.n >= HANDSHAKES_MAX) {
      struct net_incoming *oldest = ctx->handshaking.head;
      if (log_due(&ctx->drop_log, &suppressed))
        HVD_LOG_WARN("transport: %d connections are in their handshake; dropping the oldest, "
                     "from %s (%u more dropped since the last message)",
                     HANDSHAKES_MAX, oldest->from_text, suppressed);
      drop_incoming(&ctx->handshaking, oldest);
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
    if (epoll_ctl(ctx->epoll_fd, EPOLL_CTL_ADD, fd,
                  &(struct epoll_event){.events = EPOLLIN, .data.ptr = in}) != 0) {
      close(fd);
      free(in);
      continue;
    }
    list_push(&ctx->handshaking, in);
    /* A peer's HELLO is usually here already: finish it before a flood
     * behind it can push it out. */
    settle(ctx, in, progressed);
  }
}

void net_ctx_progress_incoming(struct net_ctx *ctx, bool *progressed) {
  struct epoll_event events[EPOLL_BATCH];
  int n = epoll_wait(ctx->epoll_fd, events, EPOLL_BATCH, 0);
  bool listener = false;

  /* Handshakes first: accepting may drop the oldest, which an event of
   * this batch could name. */
  for (int i = 0; i < n; i++) {
    if (events[i].data.ptr == NULL)
      listener = true;
    else
      settle(ctx, events[i].data.ptr, progressed);
  }
  if (listener && ctx->listen_fd >= 0)
    accept_new(ctx, progressed);
  if (ctx->handshaking.head != NULL || ctx->parked.head != NULL)
    expire(ctx, hvd_now_ns());
}

void net_ctx_poll_fds(struct net_ctx *ctx, struct pollfd *fds, size_t *n, size_t max) {
  if (*n < max)
    fds[(*n)++] = (struct pollfd){.fd = ctx->epoll_fd, .events = POLLIN};
}

int64_t net_ctx_next_deadline(const struct net_ctx *ctx) {
  int64_t next = HVD_NO_DEADLINE;
  if (ctx->handshaking.head != NULL)
    next = ctx->handshaking.head->deadline_ns;
  if (ctx->parked.head != NULL && ctx->parked.head->deadline_ns < next)
    next = ctx->parked.head->deadline_ns;
  return next;
}

/* Whether the peer has closed a parked socket (a connector that gave up
 * and dialled again leaves its first socket behind). */
static bool peer_closed(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

int net_ctx_claim(struct net_ctx *ctx, uint32_t comm_id, uint32_t from, uint32_t to) {
  for (struct net_incoming *in = ctx->parked.head, *next; in != NULL; in = next) {
    next = in->next;
    if (in->hello.comm_id != comm_id || in->hello.from != from || in->hello.to != to)
      continue;
    if (peer_closed(in->fd)) {
      drop_incoming(&ctx->parked, in);
      continue;
    }
    int fd = in->fd;
    list_remove(&ctx->parked, in);
    free(in);
    return fd;
  }
  return -1;
}
