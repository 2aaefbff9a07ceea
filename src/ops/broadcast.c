/*
 * Broadcast: a binomial tree for small buffers (log2(n) steps), a pipelined
 * chain for large ones (root -> root+1 -> ... in segments, so every link
 * carries data at once and the time approaches one buffer transfer); in
 * shared memory when the ranks share a host.
 */
#include "ops_private.h"

static hvd_status tree(struct net_comm *c, void *buf, size_t bytes, int root) {
  int n = net_comm_size(c), r = net_comm_rank(c);
  int v = (r - root + n) % n;
  int mask = 1;
  hvd_status st = HVD_OK;

  while (mask < n) {
    if (v & mask) {
      st = net_recv(c, (v - mask + root) % n, buf, bytes);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0 && st == HVD_OK; mask >>= 1) {
    if (v + mask < n)
      st = net_send(c, (v + mask + root) % n, buf, bytes);
  }
  return st;
}

/* The chain: each rank receives segment u from its predecessor and passes
 * it on; the root only sends, the last rank only receives. */
struct chain {
  struct net_comm *c;
  char *buf;
  size_t bytes, seg, nseg;
  int prev, next;
  bool root;
};

static void span(const struct chain *ch, size_t u, size_t *lo, size_t *len) {
  *lo = u * ch->seg;
  *len = *lo + ch->seg < ch->bytes ? ch->seg : ch->bytes - *lo;
}

static hvd_status chain_recv(void *arg, size_t u, struct net_req *req) {
  struct chain *ch = arg;
  size_t lo, len;
  span(ch, u, &lo, &len);
  return net_irecv(ch->c, ch->prev, ch->buf + lo, len, req);
}

static hvd_status chain_send(void *arg, size_t u, struct net_req *req) {
  struct chain *ch = arg;
  size_t lo, len;
  span(ch, u, &lo, &len);
  return net_isend(ch->c, ch->next, ch->buf + lo, len, req);
}

static size_t chain_ready(void *arg, size_t done) {
  const struct chain *ch = arg;
  return ch->root ? ch->nseg : done; /* forward what has arrived */
}

static hvd_status chain(struct ops_ctx *o, struct net_comm *c, char *buf, size_t bytes,
                        int root) {
  int n = net_comm_size(c), r = net_comm_rank(c);
  int v = (r - root + n) % n;
  struct chain ch = {.c = c, .buf = buf, .bytes = bytes, .seg = o->t.segment_bytes,
                     .prev = (r - 1 + n) % n, .next = (r + 1) % n, .root = v == 0};
  struct pipeline p = {.post_recv = chain_recv, .post_send = chain_send,
                       .send_ready = chain_ready};

  ch.nseg = (bytes + ch.seg - 1) / ch.seg;
  p.recv_units = v > 0 ? ch.nseg : 0;
  p.send_units = v < n - 1 ? ch.nseg : 0;
  return ops_pipeline_run(o, c, &p, &ch);
}

hvd_status ops_broadcast(struct ops_ctx *o, struct net_comm *c, void *buf, size_t count,
                         hvd_dtype dtype, int root) {
  int n = net_comm_size(c);
  size_t bytes;
  struct net_shm *shm = NULL;
  hvd_status st = ops_bytes(count, dtype, &bytes);

  if (st != HVD_OK)
    return st;
  if (root < 0 || root >= n)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "broadcast root %d is not a rank of %d", root, n);
  if (n == 1 || bytes == 0)
    return HVD_OK;
  if ((st = ops_shm_group(o, c, &shm)) != HVD_OK)
    return st;
  if (shm != NULL)
    return ops_shm_broadcast(o, shm, buf, bytes, root);
  if (bytes < o->t.broadcast_small_bytes)
    return tree(c, buf, bytes, root);
  return chain(o, c, buf, bytes, root);
}
