/*
 * Hierarchical allreduce and allgather over a host layout.
 *
 * Allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE): reduce-scatter within the host,
 * so local rank l holds the host's sum of share l; allreduce of that share
 * across hosts, among the ranks with local rank l; allgather within the host.
 * Only 1/local_size of the buffer crosses hosts per rank.
 *
 * Allgather (HOROVOD_HIERARCHICAL_ALLGATHER): each rank first gathers, across
 * hosts, the blocks of the ranks that share its local rank; then the ranks
 * of a host allgather those sets; the blocks are finally put in global rank
 * order. Each block crosses hosts once per host, not once per rank.
 *
 * Both need every host to run the same number of ranks with consecutive
 * global ranks (hvdrun's layout). Every rank decides that from the same
 * published hostnames, so all take the same path; otherwise, and with a
 * single host, the flat algorithm runs on the global communicator.
 */
#include <string.h>

#include "ops_private.h"

/* Ranks per host if the layout is uniform and consecutive, else 0. */
static int uniform_local_size(const struct ops_layout *l) {
  struct net_comm *g = l->global;
  int n = net_comm_size(g);
  int per = 1;

  if (l->local == NULL || l->cross == NULL)
    return 0;
  while (per < n && strcmp(net_comm_hostname(g, per), net_comm_hostname(g, 0)) == 0)
    per++;
  if (n % per != 0)
    return 0;
  for (int h = 0; h < n / per; h++) {
    const char *host = net_comm_hostname(g, h * per);
    for (int i = 1; i < per; i++) {
      if (strcmp(net_comm_hostname(g, h * per + i), host) != 0)
        return 0;
    }
    for (int k = 0; k < h; k++) {
      if (strcmp(net_comm_hostname(g, k * per), host) == 0)
        return 0; /* a host whose ranks are not consecutive */
    }
  }
  if (net_comm_size(l->local) != per || net_comm_size(l->cross) != n / per ||
      net_comm_rank(l->cross) * per + net_comm_rank(l->local) != net_comm_rank(g))
    return 0;
  return per;
}

bool ops_use_hierarchical(struct ops_ctx *o, const struct ops_layout *l, int *per) {
  *per = uniform_local_size(l);
  if (*per > 0 && *per < net_comm_size(l->global))
    return true;
  if (!o->warned_flat && net_comm_size(l->global) > 1 && *per == 0) {
    HVD_LOG_WARN("hierarchical collectives need the same number of ranks on every host, with "
                 "consecutive ranks per host; running the flat algorithms instead");
    o->warned_flat = true;
  }
  return false;
}

/* The local phases: rank l reduces share l of the host's inputs into its
 * place in work, or every rank gathers every share of work (in shared
 * memory when the host allows it). */
static hvd_status local_ring(struct ops_ctx *o, struct net_comm *local, void *work, const void *in,
                             size_t count, hvd_dtype dtype, hvd_reduce_op op, bool reduce) {
  int n = net_comm_size(local), r = net_comm_rank(local);
  size_t *sizes = ops_equal_shares(o, count, n);
  struct ring_args a = {.in = in, .work = work, .dtype = dtype, .op = op, .shift = -1,
                        .reduce_scatter = reduce, .allgather = !reduce};
  struct net_shm *shm = NULL;
  hvd_status st;

  if (sizes == NULL)
    return hvd_error_status();
  if ((st = ops_shm_group(o, local, &shm)) != HVD_OK)
    return st;
  if (shm != NULL) {
    char *mine = (char *)work + sizes[r] * hvd_dtype_size(dtype);
    if (reduce)
      return ops_shm_reducescatterv(o, shm, in, mine, sizes, sizes + n, dtype, op);
    return ops_shm_allgatherv(o, shm, mine, work, sizes, sizes + n, hvd_dtype_size(dtype));
  }
  a.offsets = sizes;
  a.counts = sizes + n;
  return ops_ring(o, local, &a);
}

hvd_status ops_allreduce_hierarchical(struct ops_ctx *o, const struct ops_layout *l,
                                      const void *in, void *out, size_t count, hvd_dtype dtype,
                                      hvd_reduce_op op, double prescale, double postscale) {
  int per;
  size_t esize = hvd_dtype_size(dtype), bytes;
  hvd_status st;

  if (op == HVD_ADASUM)
    return ops_adasum_hierarchical(o, l, in, out, count, dtype, &count, 1, prescale, postscale);
  if (!ops_use_hierarchical(o, l, &per))
    return ops_allreduce(o, l->global, in, out, count, dtype, op, prescale, postscale);
  st = ops_check_reduce(dtype, op, prescale, postscale);
  if (st == HVD_OK)
    st = ops_bytes(count, dtype, &bytes);
  if (st != HVD_OK || count == 0)
    return st;
  if (op == HVD_AVERAGE)
    postscale /= net_comm_size(l->global);
  if (prescale != 1.0) {
    ops_scale(out, in, count, dtype, prescale);
    in = out;
  }
  int lr = net_comm_rank(l->local);
  size_t share = ops_share_count(count, per, lr);
  char *mine = (char *)out + ops_share_offset(count, per, lr) * esize;

  st = local_ring(o, l->local, out, in, count, dtype, op, true);
  if (st == HVD_OK)
    st = ops_allreduce_raw(o, l->cross, mine, share, dtype, op);
  if (st == HVD_OK)
    st = local_ring(o, l->local, out, out, count, dtype, op, false);
  if (st == HVD_OK && postscale != 1.0)
    ops_scale(out, out, count, dtype, postscale);
  return st;
}

hvd_status ops_allgatherv_hierarchical(struct ops_ctx *o, const struct ops_layout *l,
                                       const void *in, void *out, const size_t *counts,
                                       hvd_dtype dtype) {
  int per, hosts, lr;
  size_t esize = hvd_dtype_size(dtype);
  size_t total = 0, mine = 0, *cross_counts, *local_counts, *offsets;
  char *gathered, *sets, *p;
  hvd_status st;

  if (!ops_use_hierarchical(o, l, &per))
    return ops_allgatherv(o, l->global, in, out, counts, dtype);
  if (esize == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%d is not a dtype", (int)dtype);
  hosts = net_comm_size(l->global) / per;
  lr = net_comm_rank(l->local);
  /* Counts for the two steps, and global offsets, in a scratch buffer of
   * their own (the inner allgathers use the shared size slots). */
  cross_counts = ops_scratch(o, SCRATCH_TMP, sizeof(size_t) * (size_t)(hosts + per + hosts * per));
  if (cross_counts == NULL)
    return hvd_error_status();
  local_counts = cross_counts + hosts;
  offsets = local_counts + per;
  for (int g = 0; g < hosts * per; g++) {
    offsets[g] = total;
    if (counts[g] > SIZE_MAX / esize - total)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "allgather counts overflow");
    total += counts[g];
  }
  for (int h = 0; h < hosts; h++) {
    cross_counts[h] = counts[h * per + lr];
    mine += cross_counts[h];
  }
  for (int i = 0; i < per; i++) {
    local_counts[i] = 0;
    for (int h = 0; h < hosts; h++)
      local_counts[i] += counts[h * per + i];
  }
  gathered = ops_scratch(o, SCRATCH_GATHER, mine * esize + 64);
  sets = ops_scratch(o, SCRATCH_WORK, total * esize + 64);
  if (gathered == NULL || sets == NULL)
    return hvd_error_status();
  st = ops_allgatherv(o, l->cross, in, gathered, cross_counts, dtype);
  if (st == HVD_OK)
    st = ops_allgatherv(o, l->local, gathered, sets, local_counts, dtype);
  if (st != HVD_OK)
    return st;
  /* sets holds, per local rank i, the blocks of ranks (h, i) for every host h. */
  p = sets;
  for (int i = 0; i < per; i++) {
    for (int h = 0; h < hosts; h++) {
      int g = h * per + i;
      memcpy((char *)out + offsets[g] * esize, p, counts[g] * esize);
      p += counts[g] * esize;
    }
  }
  return HVD_OK;
}
