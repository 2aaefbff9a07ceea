/*
 * Alltoall with per-rank splits: n-1 pairwise exchanges; at step k rank r
 * sends to r+k and receives from r-k, so every rank sends and receives one
 * block per step and no link is used twice at once. In shared memory when
 * the ranks share a host.
 */
#include <string.h>

#include "ops_private.h"

hvd_status ops_alltoallv(struct ops_ctx *o, struct net_comm *c, const void *in,
                         const size_t *send_counts, void *out, const size_t *recv_counts,
                         hvd_dtype dtype) {
  int n = net_comm_size(c), r = net_comm_rank(c);
  size_t esize = hvd_dtype_size(dtype);
  size_t *off = ops_sizes(o, 2 * (size_t)n);
  size_t soff = 0, roff = 0;
  struct net_shm *shm = NULL;
  hvd_status st = HVD_OK;

  if (esize == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%d is not a dtype", (int)dtype);
  if (off == NULL)
    return hvd_error_status();
  for (int i = 0; i < n; i++) {
    if (send_counts[i] > SIZE_MAX / esize - soff || recv_counts[i] > SIZE_MAX / esize - roff)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "alltoall counts overflow");
    off[i] = soff;
    off[n + i] = roff;
    soff += send_counts[i];
    roff += recv_counts[i];
  }
  if (send_counts[r] != recv_counts[r])
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "alltoall: rank %d sends itself %zu elements but expects %zu", r,
                     send_counts[r], recv_counts[r]);
  memmove((char *)out + off[n + r] * esize, (const char *)in + off[r] * esize,
          send_counts[r] * esize);
  if (n > 1 && (st = ops_shm_group(o, c, &shm)) != HVD_OK)
    return st;
  if (shm != NULL)
    return ops_shm_alltoallv(shm, in, off, send_counts, out, off + n, recv_counts, esize);
  for (int k = 1; k < n && st == HVD_OK; k++) {
    int to = (r + k) % n, from = (r - k + n) % n;
    st = net_sendrecv(c, to, (const char *)in + off[to] * esize, send_counts[to] * esize, from,
                      (char *)out + off[n + from] * esize, recv_counts[from] * esize);
  }
  return st;
}
