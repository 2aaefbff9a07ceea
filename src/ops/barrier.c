/*
 * Barrier: dissemination, ceil(log2(n)) rounds; in round k every rank
 * signals rank + 2^k and waits for rank - 2^k, so nobody leaves before
 * everybody has arrived.
 */
#include "ops_private.h"

hvd_status ops_barrier(struct ops_ctx *o, struct net_comm *c) {
  int n = net_comm_size(c), r = net_comm_rank(c);
  hvd_status st = HVD_OK;
  (void)o;

  for (int d = 1; d < n && st == HVD_OK; d <<= 1)
    st = net_sendrecv(c, (r + d) % n, NULL, 0, (r - d + n) % n, NULL, 0);
  return st;
}
