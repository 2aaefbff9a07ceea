/*
 * Allgather with a different count per rank: every block travels around
 * the ring, in segments, straight into the output (the allgather phase of
 * the pipelined ring, with each rank owning its own block); in shared memory
 * when the ranks share a host.
 */
#include <string.h>

#include "ops_private.h"

hvd_status ops_allgatherv(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                          const size_t *counts, hvd_dtype dtype) {
  int n = net_comm_size(c), r = net_comm_rank(c);
  size_t esize = hvd_dtype_size(dtype);
  size_t *sizes = ops_sizes(o, 2 * (size_t)n);
  size_t total = 0, bytes;
  struct ring_args a = {.work = out, .dtype = dtype, .shift = -1, .allgather = true};
  struct net_shm *shm = NULL;
  hvd_status st;

  if (esize == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%d is not a dtype", (int)dtype);
  if (sizes == NULL)
    return hvd_error_status();
  for (int i = 0; i < n; i++) {
    if (counts[i] > SIZE_MAX / esize - total)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "allgather counts overflow");
    sizes[i] = total;
    sizes[n + i] = counts[i];
    total += counts[i];
  }
  st = ops_bytes(total, dtype, &bytes);
  if (st == HVD_OK && n > 1 && total > 0)
    st = ops_shm_group(o, c, &shm);
  if (st != HVD_OK)
    return st;
  if (shm != NULL)
    return ops_shm_allgatherv(o, shm, in, out, sizes, sizes + n, esize);
  /* This rank's block goes to its place first (it may already be there). */
  if ((const char *)in != (char *)out + sizes[r] * esize && counts[r] > 0)
    memmove((char *)out + sizes[r] * esize, in, counts[r] * esize);
  if (n == 1 || total == 0)
    return HVD_OK;
  a.offsets = sizes;
  a.counts = sizes + n;
  return ops_ring(o, c, &a);
}
