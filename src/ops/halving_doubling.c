/*
 * Halving-doubling allreduce (Rabenseifner): a reduce-scatter by recursive
 * halving, then an allgather by recursive doubling. Bandwidth-optimal like
 * the ring (each rank sends 2(p-1)/p of the buffer) but in 2*log2(p) steps
 * instead of 2(p-1), which wins for medium buffers, and when ranks share
 * cores, where every extra step costs a round of scheduling.
 *
 * With n not a power of two, the first 2*rem ranks fold in pairs first, as
 * in recursive doubling. Each exchange is cut into segments so that the
 * reduction of one segment overlaps the transfer of the next. An element is
 * reduced by exactly one rank at each level and then copied around, so
 * every rank ends with the same bits. The input is read directly by the
 * first step, so out-of-place calls need no copy.
 */
#include "ops_private.h"

enum { SPLIT_BYTES = 256 * 1024 };

struct exchange {
  struct net_comm *c;
  int partner;
  char *buf;
  const char *src; /* where this rank's data is read: the input, until reduced into buf */
  char *tmp;
  size_t esize;
  hvd_dtype dtype;
  hvd_reduce_op op;
  bool lower; /* this rank's data goes first in the reduction */
  size_t send_first, send_count;
  size_t recv_first, recv_count;
  size_t seg;   /* elements per segment */
  size_t nseg;
  bool reduce;  /* reduce-scatter step (else allgather: receive in place) */
};

static void piece(const struct exchange *x, size_t count, size_t u, size_t *lo, size_t *n) {
  *lo = u * x->seg;
  *n = *lo >= count ? 0 : (*lo + x->seg < count ? x->seg : count - *lo);
}

static hvd_status xsend(void *arg, size_t u, struct net_req *req) {
  struct exchange *x = arg;
  size_t lo, n;
  piece(x, x->send_count, u, &lo, &n);
  return net_isend(x->c, x->partner, x->src + (x->send_first + lo) * x->esize, n * x->esize,
                   req);
}

static hvd_status xrecv(void *arg, size_t u, struct net_req *req) {
  struct exchange *x = arg;
  size_t lo, n;
  char *dst;
  piece(x, x->recv_count, u, &lo, &n);
  dst = x->reduce ? x->tmp + lo * x->esize : x->buf + (x->recv_first + lo) * x->esize;
  return net_irecv(x->c, x->partner, dst, n * x->esize, req);
}

static void xreduce(void *arg, size_t u) {
  struct exchange *x = arg;
  size_t lo, n;
  char *mine, *theirs;
  const char *own;
  if (!x->reduce)
    return;
  piece(x, x->recv_count, u, &lo, &n);
  mine = x->buf + (x->recv_first + lo) * x->esize;
  own = x->src + (x->recv_first + lo) * x->esize;
  theirs = x->tmp + lo * x->esize;
  if (x->lower)
    ops_reduce(mine, own, theirs, n, x->dtype, x->op);
  else
    ops_reduce(mine, theirs, own, n, x->dtype, x->op);
}

static size_t xready(void *arg, size_t done) {
  (void)done;
  return ((const struct exchange *)arg)->nseg; /* everything sent goes out at once */
}

/* One pairwise step: send [send_first, +send_count), receive into (or
 * reduce onto) [recv_first, +recv_count). */
static hvd_status step(struct ops_ctx *o, struct exchange *x) {
  size_t longest = x->send_count > x->recv_count ? x->send_count : x->recv_count;
  struct pipeline p = {.post_recv = xrecv, .post_send = xsend, .recv_done = xreduce,
                       .send_ready = xready};

  x->seg = o->t.segment_bytes / x->esize;
  if (x->seg == 0)
    x->seg = 1;
  x->nseg = longest == 0 ? 1 : (longest + x->seg - 1) / x->seg;
  if (x->nseg == 1 && longest * x->esize >= SPLIT_BYTES) {
    /* At least two segments, so reducing the first overlaps receiving the
     * second (measured: 1 MiB at np=2 went from ~330 to ~250 us). */
    x->nseg = 2;
    x->seg = (longest + 1) / 2;
  }
  p.recv_units = p.send_units = x->nseg;
  return ops_pipeline_run(o, x->c, &p, x);
}

hvd_status ops_halving_doubling(struct ops_ctx *o, struct net_comm *c, const void *in, void *buf,
                                size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int levels = 0;
  size_t esize = hvd_dtype_size(dtype), bytes = count * esize;
  size_t lo = 0, hi = count;
  size_t stack_lo[32], stack_hi[32];
  struct exchange x = {.c = c, .buf = buf, .src = in, .esize = esize, .dtype = dtype, .op = op};
  struct ops_fold f;
  void *whole = NULL;
  hvd_status st;

  x.tmp = ops_scratch(o, SCRATCH_TMP, bytes / 2 + esize + 64);
  if (x.tmp == NULL)
    return hvd_error_status();
  ops_fold_plan(net_comm_size(c), net_comm_rank(c), &f);
  /* Folding in takes the partner's whole buffer: more than x.tmp holds. */
  if (f.takes_in && (whole = ops_scratch(o, SCRATCH_WORK, bytes + 64)) == NULL)
    return hvd_error_status();
  if ((st = ops_fold_in(c, &f, in, buf, whole, count, dtype, op)) != HVD_OK || f.sits_out)
    return st;
  if (f.takes_in)
    x.src = buf; /* this rank's data is now the pair's */
  /* Reduce-scatter by recursive halving: keep one half, reduce it with the
   * partner's copy of it, hand the partner the other half. */
  for (int mask = f.p / 2; mask >= 1 && st == HVD_OK; mask /= 2) {
    int vpartner = f.vrank ^ mask;
    size_t mid = lo + (hi - lo) / 2;
    bool low = f.vrank < vpartner;
    stack_lo[levels] = lo;
    stack_hi[levels] = hi;
    levels++;
    x.partner = ops_fold_rank(&f, vpartner);
    x.lower = low;
    x.reduce = true;
    x.send_first = low ? mid : lo;
    x.send_count = low ? hi - mid : mid - lo;
    x.recv_first = low ? lo : mid;
    x.recv_count = low ? mid - lo : hi - mid;
    st = step(o, &x);
    x.src = buf; /* from now on this rank's data is the partial result */
    lo = x.recv_first;
    hi = x.recv_first + x.recv_count;
  }
  /* Allgather by recursive doubling: undo the halvings in reverse. */
  x.src = buf;
  for (int mask = 1; mask < f.p && st == HVD_OK; mask *= 2) {
    int vpartner = f.vrank ^ mask;
    size_t plo = stack_lo[levels - 1], phi = stack_hi[levels - 1];
    levels--;
    x.partner = ops_fold_rank(&f, vpartner);
    x.reduce = false;
    x.send_first = lo;
    x.send_count = hi - lo;
    x.recv_first = lo == plo ? hi : plo; /* the other half of the level's range */
    x.recv_count = (phi - plo) - (hi - lo);
    st = step(o, &x);
    lo = plo;
    hi = phi;
  }
  return st == HVD_OK ? ops_fold_out(c, &f, buf, bytes) : st;
}
