/*
 * The pipelined ring: reduce-scatter, allgather, or both (allreduce).
 *
 * DESIGN. The buffer is split into n chunks, one per rank, and every chunk
 * into the same number of segments (segment_bytes at most). A "unit" is one
 * segment at one ring step; units are numbered step by step, reduce-scatter
 * steps first, then allgather steps. Unit u is received from the left
 * neighbour and unit u is sent to the right one, so each link carries the
 * units in order, and both directions of every link are busy at once.
 * The data a rank sends at unit u is what it received (and, during the
 * reduce-scatter, reduced) at unit u - nseg: the same segment one step
 * earlier. That single rule also joins the two phases, so the allgather of a
 * segment leaves as soon as its last reduction is done, and the network,
 * the reduction and the next receive all overlap. Reduce-scatter receives
 * land in a window of `window` scratch slots (cache-sized), allgather
 * receives straight in the output. The driver (pipeline.c) keeps `window`
 * receives and 2*window sends in flight.
 */
#include <string.h>

#include "ops_private.h"

struct ring {
  struct net_comm *c;
  const struct ring_args *a;
  int n, rank, owner;
  size_t nseg;
  size_t esize;
  size_t units_rs; /* units of the reduce-scatter phase */
  size_t units;    /* all units */
  unsigned window;
  char *slots; /* `window` reduce-scatter slots of slot_bytes */
  size_t slot_bytes;
};

static int mod(int x, int n) { return ((x % n) + n) % n; }

/* The chunks unit u sends and receives. */
static void unit_chunks(const struct ring *g, size_t u, int *send, int *recv) {
  int s;
  if (u < g->units_rs) {
    s = (int)(u / g->nseg);
    *send = mod(g->rank - s + g->a->shift, g->n);
    *recv = mod(g->rank - s - 1 + g->a->shift, g->n);
  } else {
    s = (int)((u - g->units_rs) / g->nseg);
    *send = mod(g->owner - s, g->n);
    *recv = mod(g->owner - s - 1, g->n);
  }
}

/* Element range [*first, *first + *count) of segment j of chunk i. */
static void segment(const struct ring *g, int i, size_t j, size_t *first, size_t *count) {
  size_t cnt = g->a->counts[i];
  size_t lo = cnt * j / g->nseg;
  size_t hi = cnt * (j + 1) / g->nseg;
  *first = g->a->offsets[i] + lo;
  *count = hi - lo;
}

static hvd_status post_send(void *arg, size_t u, struct net_req *req) {
  struct ring *g = arg;
  int send, recv;
  size_t first, count;
  const char *base;

  unit_chunks(g, u, &send, &recv);
  segment(g, send, u % g->nseg, &first, &count);
  /* The reduce-scatter's first step sends this rank's own input. */
  base = (u < g->nseg && g->units_rs > 0) ? (const char *)g->a->in : (const char *)g->a->work;
  return net_isend(g->c, mod(g->rank + 1, g->n), base + first * g->esize, count * g->esize, req);
}

static hvd_status post_recv(void *arg, size_t u, struct net_req *req) {
  struct ring *g = arg;
  int send, recv;
  size_t first, count;
  char *dst;

  unit_chunks(g, u, &send, &recv);
  segment(g, recv, u % g->nseg, &first, &count);
  if (u < g->units_rs)
    dst = g->slots + (u % g->window) * g->slot_bytes;
  else
    dst = (char *)g->a->work + first * g->esize;
  return net_irecv(g->c, mod(g->rank - 1, g->n), dst, count * g->esize, req);
}

/* After receive u: in the reduce-scatter, work = own input op received. */
static void finish_recv(void *arg, size_t u) {
  struct ring *g = arg;
  int send, recv;
  size_t first, count;

  if (u >= g->units_rs)
    return;
  unit_chunks(g, u, &send, &recv);
  segment(g, recv, u % g->nseg, &first, &count);
  ops_reduce((char *)g->a->work + first * g->esize, (const char *)g->a->in + first * g->esize,
             g->slots + (u % g->window) * g->slot_bytes, count, g->a->dtype, g->a->op);
}

/* Unit u can be sent once unit u - nseg has been received. */
static size_t send_ready(void *arg, size_t done) {
  const struct ring *g = arg;
  return done + g->nseg < g->units ? done + g->nseg : g->units;
}

static hvd_status setup(struct ops_ctx *o, struct net_comm *c, const struct ring_args *a,
                        struct ring *g) {
  size_t seg = o->t.segment_bytes;
  size_t max_bytes = 0;

  memset(g, 0, sizeof(*g));
  g->c = c;
  g->a = a;
  g->n = net_comm_size(c);
  g->rank = net_comm_rank(c);
  g->owner = mod(g->rank + 1 + a->shift, g->n);
  g->esize = hvd_dtype_size(a->dtype);
  g->window = o->t.window;
  for (int i = 0; i < g->n; i++) {
    if (a->counts[i] * g->esize > max_bytes)
      max_bytes = a->counts[i] * g->esize;
  }
  g->nseg = max_bytes == 0 ? 1 : (max_bytes + seg - 1) / seg;
  if (g->nseg < 1)
    g->nseg = 1;
  g->units_rs = a->reduce_scatter ? (size_t)(g->n - 1) * g->nseg : 0;
  g->units = g->units_rs + (a->allgather ? (size_t)(g->n - 1) * g->nseg : 0);
  if (a->reduce_scatter) {
    size_t max_count = 0;
    for (int i = 0; i < g->n; i++) {
      if (a->counts[i] > max_count)
        max_count = a->counts[i];
    }
    g->slot_bytes = ((max_count + g->nseg - 1) / g->nseg) * g->esize;
    g->slot_bytes = (g->slot_bytes + 63) & ~(size_t)63;
    g->slots = ops_scratch(o, SCRATCH_SEGMENTS, g->slot_bytes * g->window + 64);
    if (g->slots == NULL)
      return hvd_error_status();
  }
  return HVD_OK;
}

hvd_status ops_ring(struct ops_ctx *o, struct net_comm *c, const struct ring_args *a) {
  struct ring g;
  struct pipeline p = {.post_recv = post_recv, .post_send = post_send, .recv_done = finish_recv,
                       .send_ready = send_ready};
  hvd_status st;

  if (net_comm_size(c) == 1) { /* the result is this rank's own data */
    size_t esize = hvd_dtype_size(a->dtype);
    if (a->in != NULL && a->in != a->work && a->counts[0] > 0)
      memcpy((char *)a->work + a->offsets[0] * esize,
             (const char *)a->in + a->offsets[0] * esize, a->counts[0] * esize);
    return HVD_OK;
  }
  st = setup(o, c, a, &g);
  if (st != HVD_OK)
    return st;
  p.recv_units = p.send_units = g.units;
  return ops_pipeline_run(o, c, &p, &g);
}
