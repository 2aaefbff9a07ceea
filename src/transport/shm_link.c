/*
 * Links: messages between member 0 and the others through rings in the
 * shared segment, for the coordinator's control channel.
 *
 * DESIGN. A linked connection keeps the engine's requests, headers and
 * sequence checks; only the bytes move through a ring instead of a socket
 * (net_link_send and net_link_recv stand in for sendmsg and recvmsg). A
 * small message thus costs two copies and no system call while the reader
 * spins. A reader about to sleep sets reader_sleeps, then looks at the ring
 * once more; a writer that finds the flag set after publishing clears it
 * and writes the reader's doorbell, an eventfd in the reader's poll set.
 * Both sides use sequentially consistent operations, so one of them sees
 * the other (the same argument as the barrier's futex). A writer facing a
 * full ring does the same with writer_sleeps. The peer's pidfd sits in the
 * poll set too: a process that ends (killed, crashed) cannot mark its
 * rings, but its pidfd becomes readable and the link reads as closed.
 */
#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "transport_private.h"

struct net_shm_ring *net_shm_ring(const struct net_shm *s, int from, int to) {
  /* Member m > 0 has the pair (0 -> m, m -> 0) at index 2(m-1), 2(m-1)+1. */
  size_t i = from == 0 ? 2 * (size_t)(to - 1) : 2 * (size_t)(from - 1) + 1;
  size_t stride = sizeof(struct net_shm_ring) + s->ring_bytes;
  return (struct net_shm_ring *)(s->rings + i * stride);
}

/* Member m's connection in `comm` is conns[ranks ? ranks[m] : m]. */
static void attach(struct net_shm *s, struct net_comm *comm, const int *ranks) {
  for (int p = 0; p < s->size; p++) {
    struct net_conn *c = &comm->conns[ranks != NULL ? ranks[p] : p];
    if (p == s->rank || (p != 0 && s->rank != 0) || s->bells[p] < 0)
      continue;
    c->ring_tx = net_shm_ring(s, s->rank, p);
    c->ring_rx = net_shm_ring(s, p, s->rank);
    c->tx_tail_seen = atomic_load(&c->ring_tx->tail);
    c->link_shm = s;
    c->link_peer = p;
    c->tx = TX_READY;
  }
}

void net_shm_attach_links(struct net_shm *s) { attach(s, s->comm, NULL); }

void net_shm_lend_links(struct net_shm *s, struct net_comm *to, const int *to_ranks) {
  attach(s, to, to_ranks);
}

/* Wakes the peer of a linked connection. */
static void ring_bell(const struct net_conn *c) {
  uint64_t one = 1;
  ssize_t n = write(c->link_shm->bells[c->link_peer], &one, sizeof(one));
  (void)n; /* a full counter still wakes the reader */
}

/* Copies between iovecs and the ring's bytes [pos, pos + len), wrapping:
 * each iovec's piece is one copy, or two where it crosses the ring's end
 * (len is at most the ring's size, so a piece crosses it at most once). */
static size_t copy_ring(struct net_shm_ring *r, size_t size, uint64_t pos, const struct iovec *iov,
                        size_t n, size_t len, bool to_ring) {
  size_t done = 0;

  for (size_t i = 0; i < n && done < len; i++) {
    size_t take = iov[i].iov_len < len - done ? iov[i].iov_len : len - done;
    size_t at = (size_t)((pos + done) & (size - 1));
    size_t first = take < size - at ? take : size - at;
    char *mem = iov[i].iov_base;

    if (to_ring) {
      memcpy(r->data + at, mem, first);
      if (take > first)
        memcpy(r->data, mem + first, take - first);
    } else {
      memcpy(mem, r->data + at, first);
      if (take > first)
        memcpy(mem + first, r->data, take - first);
    }
    done += take;
  }
  return done;
}

static size_t iov_bytes(const struct iovec *iov, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += iov[i].iov_len;
  return total;
}

ssize_t net_link_send(struct net_conn *c, const struct iovec *iov, size_t n) {
  struct net_shm_ring *r = c->ring_tx;
  size_t size = c->link_shm->ring_bytes;
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
  size_t want = iov_bytes(iov, n), room = size - (size_t)(head - c->tx_tail_seen);

  /* The reader's tail is looked at only when the room last seen is short:
   * its line then stays in the reader's cache, and neither side pays a
   * transfer of it per message. */
  if (room < want) {
    c->tx_tail_seen = atomic_load_explicit(&r->tail, memory_order_acquire);
    room = size - (size_t)(head - c->tx_tail_seen);
  }

  /* Like a socket whose peer closed: what is written is lost, and the
   * receiving side reports the end (a worker's last acknowledgement after
   * member 0 shut down is no failure). */
  if (c->gone || atomic_load_explicit(&r->closed, memory_order_relaxed))
    return (ssize_t)want;
  if (room == 0) {
    errno = EAGAIN;
    return -1;
  }
  size_t len = copy_ring(r, size, head, iov, n, want < room ? want : room, true);
  atomic_store(&r->head, head + len);
  if (atomic_load(&r->reader_sleeps) && atomic_exchange(&r->reader_sleeps, 0))
    ring_bell(c);
  return (ssize_t)len;
}

ssize_t net_link_recv(struct net_conn *c, const struct iovec *iov, size_t n) {
  struct net_shm_ring *r = c->ring_rx;
  size_t size = c->link_shm->ring_bytes;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  size_t have = (size_t)(head - tail), want = iov_bytes(iov, n);

  if (have == 0) {
    if (c->gone || atomic_load(&r->closed))
      return 0;
    errno = EAGAIN;
    return -1;
  }
  size_t len = copy_ring(r, size, tail, iov, n, want < have ? want : have, false);
  atomic_store(&r->tail, tail + len);
  if (atomic_load(&r->writer_sleeps) && atomic_exchange(&r->writer_sleeps, 0))
    ring_bell(c);
  return (ssize_t)len;
}

size_t net_link_peek(struct net_conn *c, void *buf, size_t n) {
  struct net_shm_ring *r = c->ring_rx;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  struct iovec v = {.iov_base = buf, .iov_len = n};

  if (head - tail < n)
    return 0;
  return copy_ring(r, c->link_shm->ring_bytes, tail, &v, 1, n, false);
}

bool net_link_prepare_sleep(struct net_conn *c, struct pollfd *fds, size_t *n, bool *bell_added) {
  struct net_shm *s = c->link_shm;
  bool ready = false;

  if (c->recv_head != NULL) {
    atomic_store(&c->ring_rx->reader_sleeps, 1);
    ready = atomic_load(&c->ring_rx->head) != atomic_load(&c->ring_rx->tail) ||
            atomic_load(&c->ring_rx->closed);
  }
  if (c->send_head != NULL) {
    atomic_store(&c->ring_tx->writer_sleeps, 1);
    ready = ready || atomic_load(&c->ring_tx->head) - atomic_load(&c->ring_tx->tail) <
                         s->ring_bytes ||
            atomic_load(&c->ring_tx->closed);
  }
  if (!*bell_added) { /* a communicator's links all live in one segment */
    fds[(*n)++] = (struct pollfd){.fd = s->bells[s->rank], .events = POLLIN};
    *bell_added = true;
  }
  if (s->pidfds[c->link_peer] >= 0)
    fds[(*n)++] = (struct pollfd){.fd = s->pidfds[c->link_peer], .events = POLLIN};
  return !ready && !c->gone;
}

void net_link_after_sleep(struct net_comm *comm, const struct pollfd *fds, size_t n) {
  struct net_shm *s = NULL;

  /* Awake again: writers need not ring (this thread looks at the rings
   * before it sleeps again). */
  for (int k = 0; k < comm->nactive; k++) {
    struct net_conn *c = &comm->conns[comm->active[k]];
    if (c->ring_rx != NULL) {
      atomic_store(&c->ring_rx->reader_sleeps, 0);
      atomic_store(&c->ring_tx->writer_sleeps, 0);
      s = c->link_shm;
    }
  }
  for (size_t i = 0; i < n && s != NULL; i++) {
    if (fds[i].revents == 0)
      continue;
    if (fds[i].fd == s->bells[s->rank]) {
      uint64_t v;
      ssize_t got = read(fds[i].fd, &v, sizeof(v)); /* non-blocking: empty is fine */
      (void)got;
      continue;
    }
    for (int p = 0; p < comm->size; p++) {
      struct net_conn *c = &comm->conns[p];
      if (p != comm->rank && c->ring_rx != NULL && s->pidfds[c->link_peer] == fds[i].fd)
        c->gone = true;
    }
  }
}

void net_link_close(struct net_conn *c) {
  if (c->ring_tx == NULL)
    return;
  atomic_store(&c->ring_tx->closed, 1);
  atomic_store(&c->ring_rx->closed, 1);
  ring_bell(c);
  c->ring_tx = c->ring_rx = NULL;
  c->gone = true;
}
