/*
 * Reducescatter: the reduce-scatter phase of the pipelined ring, arranged
 * (shift -1) so that rank r ends owning chunk r, which is its share
 * (ops_share_*: the first count%n ranks get one element more). The ring
 * reduces into a work buffer the size of the input, so the input is never
 * written; the share is then copied out, scaled. Ranks that share a host
 * reduce in shared memory instead, straight into their output.
 */
#include <stdint.h>
#include <string.h>

#include "ops_private.h"

/* The ring over shares sizes[0..n) (offsets) and sizes[n..2n) (counts). */
static hvd_status reducescatter(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                                size_t count, size_t *sizes, hvd_dtype dtype, hvd_reduce_op op,
                                double prescale, double postscale) {
  int n = net_comm_size(c), r = net_comm_rank(c);
  size_t esize = hvd_dtype_size(dtype);
  size_t bytes;
  char *work;
  struct ring_args a = {.dtype = dtype, .op = op, .shift = -1, .reduce_scatter = true};
  struct net_shm *shm = NULL;
  hvd_status st = ops_check_reduce(dtype, op, prescale, postscale);

  if (st == HVD_OK)
    st = ops_bytes(count, dtype, &bytes);
  if (st == HVD_OK && n > 1 && count > 0)
    st = ops_shm_group(o, c, &shm);
  if (st != HVD_OK)
    return st;
  if (op == HVD_AVERAGE)
    postscale /= n;
  /* The ring works in a scratch buffer; shared memory needs one only to
   * scale the input into. */
  work = NULL;
  if ((shm == NULL || prescale != 1.0) &&
      (work = ops_scratch(o, SCRATCH_WORK, bytes + 64)) == NULL)
    return hvd_error_status();
  if (prescale != 1.0) {
    ops_scale(work, in, count, dtype, prescale);
    in = work;
  }
  if (shm != NULL) {
    st = ops_shm_reducescatterv(o, shm, in, out, sizes, sizes + n, dtype, op);
    if (st == HVD_OK && postscale != 1.0)
      ops_scale(out, out, sizes[n + r], dtype, postscale);
    return st;
  }
  if (n == 1 && in != work)
    memcpy(work, in, bytes);
  a.in = in;
  a.work = work;
  a.offsets = sizes;
  a.counts = sizes + n;
  st = ops_ring(o, c, &a);
  if (st == HVD_OK)
    ops_copy_scaled(out, work + sizes[r] * esize, sizes[n + r], dtype, postscale);
  return st;
}

hvd_status ops_reducescatter(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                             size_t count, hvd_dtype dtype, hvd_reduce_op op, double prescale,
                             double postscale) {
  int n = net_comm_size(c);
  size_t *sizes = ops_equal_shares(o, count, n);

  if (sizes == NULL)
    return hvd_error_status();
  return reducescatter(o, c, in, out, count, sizes, dtype, op, prescale, postscale);
}

hvd_status ops_reducescatterv(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                              const size_t *counts, hvd_dtype dtype, hvd_reduce_op op,
                              double prescale, double postscale) {
  int n = net_comm_size(c);
  size_t *sizes = ops_sizes(o, 2 * (size_t)n);
  size_t total = 0;

  if (sizes == NULL)
    return hvd_error_status();
  for (int i = 0; i < n; i++) {
    if (counts[i] > SIZE_MAX - total)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "reducescatter counts overflow");
    sizes[i] = total;
    sizes[n + i] = counts[i];
    total += counts[i];
  }
  return reducescatter(o, c, in, out, total, sizes, dtype, op, prescale, postscale);
}
