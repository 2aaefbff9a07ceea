/*
 * Hierarchical GPU allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE): NCCL within
 * the host, hvd's TCP cross ring between hosts.
 *
 * DESIGN. The buffer is split into local_size equal chunks (the remainder
 * rides with local rank 0): an NCCL reduce-scatter leaves each local rank
 * its chunk reduced over the host; the chunk goes to pinned host memory
 * and is allreduced over the cross communicator of that local rank (every
 * local rank's cross ring runs at once, so hosts exchange local_size
 * streams in parallel); it comes back and an NCCL allgather within the
 * host assembles the result. Only the 1/local_size share of the data
 * crosses hosts and PCIe per rank. Hosts must have the same number of
 * ranks, as chunks must line up across hosts.
 */
#include "gpu.h"

bool cuda_hierarchical_applies(const struct coord_gpu *g, const struct coord_set *set) {
  const struct net_world *w = coord_gpu_world(g->s);
  return coord_set_id(set) == HVD_PROCESS_SET_GLOBAL && coord_gpu_hierarchical(g->s) &&
         w->local_size < w->size && w->local_size * w->cross_size == w->size;
}

hvd_status cuda_allreduce_hierarchical(struct coord_gpu *g, void *buf, size_t count,
                                      hvd_dtype dtype, hvd_reduce_op op) {
  const struct net_world *w = coord_gpu_world(g->s);
  int ls = w->local_size, lr = w->local_rank;
  size_t esize = hvd_dtype_size(dtype), chunk = count / (size_t)ls, rem = count % (size_t)ls;
  size_t mine = chunk + (lr == 0 ? rem : 0);
  char *b = buf, *tail = b + chunk * (size_t)ls * esize, *host;
  char name[RDZV_RECORD_HOST_MAX + 16];
  struct gpu_comm *local;
  ncclDataType_t type;
  ncclRedOp_t nop;
  hvd_status st;

  if (!cuda_nccl_type(dtype, &type) || !cuda_nccl_op(dtype, op, &nop))
    return hvd_error(HVD_ERR_UNSUPPORTED, "NCCL cannot %s %s", hvd_reduce_op_name(op),
                     hvd_dtype_name(dtype));
  snprintf(name, sizeof(name), "local_%s", net_comm_hostname(w->global, w->rank));
  if ((st = cuda_comm_get(g, name, lr, ls, &local)) != HVD_OK ||
      (st = cuda_host_buffer(g, mine * esize, (void **)&host)) != HVD_OK)
    return st;

  /* Within the host: chunk lr to local rank lr, the remainder to local rank 0. */
  if ((st = cuda_nccl_check(g, ncclGroupStart(), "ncclGroupStart")) != HVD_OK)
    return st;
  if (chunk > 0)
    st = cuda_nccl_check(g,
                        ncclReduceScatter(b, b + (size_t)lr * chunk * esize, chunk, type, nop,
                                          local->nccl, g->stream),
                        "ncclReduceScatter");
  if (st == HVD_OK && rem > 0)
    st = cuda_nccl_check(g, ncclReduce(tail, tail, rem, type, nop, 0, local->nccl, g->stream),
                        "ncclReduce");
  if (st == HVD_OK)
    st = cuda_nccl_check(g, ncclGroupEnd(), "ncclGroupEnd");
  if (st == HVD_OK)
    st = cuda_copy_async(g, host, b + (size_t)lr * chunk * esize, chunk * esize,
                         cudaMemcpyDeviceToHost);
  if (st == HVD_OK && mine > chunk)
    st = cuda_copy_async(g, host + chunk * esize, tail, rem * esize, cudaMemcpyDeviceToHost);
  if (st == HVD_OK)
    st = cuda_wait(g, local, "hierarchical allreduce: reduce-scatter within the host");
  if (st != HVD_OK)
    return st;

  /* Across hosts: the average's division is the caller's. */
  if (mine > 0 && (st = ops_allreduce(coord_gpu_ops(g->s), w->cross, host, host, mine, dtype,
                                      op == HVD_AVERAGE ? HVD_SUM : op, 1.0, 1.0)) != HVD_OK)
    return hvd_error_prefix("hierarchical allreduce across hosts");

  /* Within the host again: every rank gets every chunk. */
  st = cuda_copy_async(g, b + (size_t)lr * chunk * esize, host, chunk * esize,
                       cudaMemcpyHostToDevice);
  if (st == HVD_OK && mine > chunk)
    st = cuda_copy_async(g, tail, host + chunk * esize, rem * esize, cudaMemcpyHostToDevice);
  if (st == HVD_OK)
    st = cuda_nccl_check(g, ncclGroupStart(), "ncclGroupStart");
  if (st != HVD_OK)
    return st;
  if (chunk > 0)
    st = cuda_nccl_check(g,
                        ncclAllGather(b + (size_t)lr * chunk * esize, b, chunk, type, local->nccl,
                                      g->stream),
                        "ncclAllGather");
  if (st == HVD_OK && rem > 0)
    st = cuda_nccl_check(g, ncclBroadcast(tail, tail, rem, type, 0, local->nccl, g->stream),
                        "ncclBroadcast");
  if (st == HVD_OK)
    st = cuda_nccl_check(g, ncclGroupEnd(), "ncclGroupEnd");
  return st == HVD_OK ? cuda_wait(g, local, "hierarchical allreduce: allgather within the host")
                      : st;
}
