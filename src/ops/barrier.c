/*
 * Barrier: dissemination, ceil(log2(n)) rounds; in round k every rank
 * signals rank + 2^k and waits for rank - 2^k, so nobody leaves before
 * everybody has arrived. Ranks sharing a host meet in shared memory.
 */
#include "ops_private.h"

hvd_status ops_barrier(struct ops_ctx *o, struct net_comm *c) {
  int n = net_comm_size(c), r = net_comm_rank(c);
  struct net_shm *shm = NULL;
  hvd_status st = n > 1 ? ops_shm_group(o, c, &shm) : HVD_OK;

  if (shm != NULL)
    return ops_shm_barrier(shm);
  for (int d = 1; d < n && st == HVD_OK; d <<= 1)
    st = net_sendrecv(c, (r + d) % n, NULL, 0, (r - d + n) % n, NULL, 0);
  return st;
}
