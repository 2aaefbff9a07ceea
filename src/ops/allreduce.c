/*
 * Allreduce: recursive doubling for small buffers (latency: log2(n)
 * exchanges), halving-doubling for medium ones (halving_doubling.c), the
 * pipelined ring for large ones (bandwidth: each rank sends and receives
 * 2(n-1)/n of the buffer, to and from its neighbours only). The switch
 * points are HVD_ALLREDUCE_SMALL_BYTES and HVD_ALLREDUCE_RING_BYTES,
 * measured on loopback (docs/PERFORMANCE.md); HVD_ALLREDUCE_ALGORITHM forces
 * one. Ranks that share a host use shared memory instead (shm.c), unless
 * an algorithm is forced.
 *
 * Recursive doubling with n not a power of two: the first 2*rem ranks pair
 * up, the even one of each pair hands its data to the odd one and sits out;
 * the other p = n - rem ranks run log2(p) exchanges; the odd ranks finally
 * hand the result back. Every combination is computed as
 * (lower rank's data) op (higher rank's data), on both partners, so every
 * rank ends with the same bits.
 */
#include <string.h>

#include "ops_private.h"

static hvd_status recursive_doubling(struct ops_ctx *o, struct net_comm *c, void *buf,
                                     size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int r = net_comm_rank(c);
  size_t bytes = count * hvd_dtype_size(dtype);
  void *tmp = ops_scratch(o, SCRATCH_TMP, bytes);
  struct ops_fold f;
  hvd_status st;

  if (tmp == NULL)
    return hvd_error_status();
  ops_fold_plan(net_comm_size(c), r, &f);
  if ((st = ops_fold_in(c, &f, buf, buf, tmp, count, dtype, op)) != HVD_OK || f.sits_out)
    return st;
  for (int mask = 1; mask < f.p && st == HVD_OK; mask <<= 1) {
    int partner = ops_fold_rank(&f, f.vrank ^ mask);
    st = net_sendrecv(c, partner, buf, bytes, partner, tmp, bytes);
    if (st != HVD_OK)
      break;
    if (partner < r)
      ops_reduce(buf, tmp, buf, count, dtype, op);
    else
      ops_reduce(buf, buf, tmp, count, dtype, op);
  }
  return st == HVD_OK ? ops_fold_out(c, &f, buf, bytes) : st;
}

static hvd_status ring_allreduce(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                                 size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int n = net_comm_size(c);
  size_t *sizes = ops_equal_shares(o, count, n);
  struct ring_args a = {.in = in, .work = out, .dtype = dtype, .op = op, .shift = 0,
                        .reduce_scatter = true, .allgather = true};

  if (sizes == NULL)
    return hvd_error_status();
  a.offsets = sizes;
  a.counts = sizes + n;
  return ops_ring(o, c, &a);
}

/* Which algorithm: recursive doubling for small buffers (and whenever
 * there are fewer elements than ranks), halving-doubling for medium ones,
 * the ring from HVD_ALLREDUCE_RING_BYTES. */
static int pick(const struct ops_ctx *o, struct net_comm *c, size_t count, size_t bytes) {
  if (o->t.allreduce_algorithm != OPS_ALGO_AUTO)
    return o->t.allreduce_algorithm;
  if (bytes < o->t.allreduce_small_bytes || count < (size_t)net_comm_size(c))
    return OPS_ALGO_RECURSIVE_DOUBLING;
  if (bytes < o->t.allreduce_ring_bytes)
    return OPS_ALGO_HALVING_DOUBLING;
  return OPS_ALGO_RING;
}

/* Reduces in (this rank's scaled input) into out; they may be the same. */
static hvd_status run(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                      size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  size_t bytes = count * hvd_dtype_size(dtype);
  int algo = pick(o, c, count, bytes);
  struct net_shm *shm = NULL;
  hvd_status st;

  if (o->t.allreduce_algorithm == OPS_ALGO_AUTO) {
    if ((st = ops_shm_group(o, c, &shm)) != HVD_OK)
      return st;
    if (shm != NULL)
      return ops_shm_allreduce(o, shm, in, out, count, dtype, op);
  }
  if (algo == OPS_ALGO_RING)
    return ring_allreduce(o, c, in, out, count, dtype, op);
  if (algo == OPS_ALGO_HALVING_DOUBLING)
    return ops_halving_doubling(o, c, in, out, count, dtype, op);
  if (in != out)
    memcpy(out, in, bytes);
  return recursive_doubling(o, c, out, count, dtype, op);
}

hvd_status ops_allreduce_raw(struct ops_ctx *o, struct net_comm *c, void *buf, size_t count,
                             hvd_dtype dtype, hvd_reduce_op op) {
  if (net_comm_size(c) == 1 || count == 0)
    return HVD_OK;
  return run(o, c, buf, buf, count, dtype, op);
}

hvd_status ops_allreduce(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                         size_t count, hvd_dtype dtype, hvd_reduce_op op, double prescale,
                         double postscale) {
  int n = net_comm_size(c);
  size_t bytes;
  hvd_status st = ops_check_reduce(dtype, op, prescale, postscale);

  if (st == HVD_OK && op == HVD_ADASUM)
    return ops_adasum(o, c, in, out, count, dtype, &count, 1, prescale, postscale);
  if (st == HVD_OK)
    st = ops_bytes(count, dtype, &bytes);
  if (st != HVD_OK)
    return st;
  if (op == HVD_AVERAGE)
    postscale /= n;
  if (count == 0)
    return HVD_OK;
  if (prescale != 1.0) {
    /* Scale into the output and reduce there: the input stays untouched. */
    ops_scale(out, in, count, dtype, prescale);
    in = out;
  }
  if (n > 1)
    st = run(o, c, in, out, count, dtype, op);
  else if (in != out)
    memcpy(out, in, bytes);
  if (st == HVD_OK && postscale != 1.0)
    ops_scale(out, out, count, dtype, postscale);
  return st;
}
