/*
 * Rank counts that are not a power of two, for the algorithms that pair
 * ranks by XOR of their numbers (recursive doubling, halving-doubling):
 * the first 2 * rem ranks fold in pairwise before and out after, so that
 * the algorithm itself runs on a power of two (ops_private.h).
 */
#include "ops_private.h"

void ops_fold_plan(int n, int r, struct ops_fold *f) {
  f->p = 1;
  while (f->p * 2 <= n)
    f->p *= 2;
  f->rem = n - f->p;
  f->sits_out = r < 2 * f->rem && r % 2 == 0;
  f->takes_in = r < 2 * f->rem && r % 2 == 1;
  f->vrank = r < 2 * f->rem ? r / 2 : r - f->rem;
}

int ops_fold_rank(const struct ops_fold *f, int v) { return v < f->rem ? v * 2 + 1 : v + f->rem; }

hvd_status ops_fold_in(struct net_comm *c, const struct ops_fold *f, const void *in, void *buf,
                       void *scratch, size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  int r = net_comm_rank(c);
  size_t bytes = count * hvd_dtype_size(dtype);
  hvd_status st;

  if (!f->sits_out && !f->takes_in)
    return HVD_OK;
  if (f->sits_out) {
    st = net_send(c, r + 1, in, bytes);
    return st == HVD_OK ? net_recv(c, r + 1, buf, bytes) : st;
  }
  if ((st = net_recv(c, r - 1, scratch, bytes)) == HVD_OK)
    ops_reduce(buf, scratch, in, count, dtype, op); /* the lower rank's data first */
  return st;
}

hvd_status ops_fold_out(struct net_comm *c, const struct ops_fold *f, const void *buf,
                        size_t bytes) {
  return f->takes_in ? net_send(c, net_comm_rank(c) - 1, buf, bytes) : HVD_OK;
}
