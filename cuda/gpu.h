/*
 * The cuda module: hvd's GPU backend (struct coord_gpu_backend). GPU
 * tensors are reduced with NCCL on one stream of hvd's own per process;
 * communicators are made on first use per process set and kind (global,
 * local, cross), their unique ids travelling through the rendezvous store.
 * The only module that includes CUDA or NCCL headers.
 *
 * Every wait on the device is a poll with a deadline that also watches
 * NCCL's asynchronous errors, so a dead peer fails the operation (and
 * aborts the communicator) instead of hanging it.
 */
#ifndef HVD_CUDA_GPU_H
#define HVD_CUDA_GPU_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>

#include "coord/gpu_backend.h"
#include "kernels.h"

/* A communicator of this process, by name ("global", "local_<host>",
 * "cross_<local rank>", "set<comm id>"). */
struct gpu_comm {
  char name[RDZV_RECORD_HOST_MAX + 16];
  ncclComm_t nccl;
  int rank, size;
  struct gpu_comm *next;
};

struct coord_gpu {
  struct coord_state *s;
  int device;
  cudaStream_t stream;
  int64_t timeout_ns;     /* no completion for this long is a timeout */
  bool failed;            /* a communicator was aborted: every later call fails */
  struct gpu_comm *comms; /* made on first use */
  void *fusion;           /* device memory */
  size_t fusion_cap;
  void *host;             /* pinned host memory: hierarchical allreduce, identities */
  size_t host_cap;
};

/* A CUDA or NCCL failure as a status naming the call. */
hvd_status cuda_cuda_error(cudaError_t err, const char *call);
hvd_status cuda_nccl_error(ncclResult_t r, const char *call);

/* Makes the device current on the calling thread (the loop's driver may
 * be any thread). */
hvd_status cuda_use_device(struct coord_gpu *g);
/* Queues a copy of bytes on hvd's stream (0 bytes: nothing). */
hvd_status cuda_copy_async(struct coord_gpu *g, void *dst, const void *src, size_t bytes,
                          enum cudaMemcpyKind kind);
/* Device and pinned host scratch buffers that grow as needed. */
hvd_status cuda_fusion_buffer(struct coord_gpu *g, size_t bytes, void **out);
hvd_status cuda_host_buffer(struct coord_gpu *g, size_t bytes, void **out);

/* ==== communicators (comm.c) ==================================================== */

/* The communicator `name` of size ranks, this process being `rank`: made
 * on first use (rank 0 publishes the unique id in the store, the others
 * long-poll for it), cached after. */
hvd_status cuda_comm_get(struct coord_gpu *g, const char *name, int rank, int size,
                        struct gpu_comm **out);
/* The communicator of a process set. */
hvd_status cuda_comm_for_set(struct coord_gpu *g, const struct coord_set *set,
                            struct gpu_comm **out);
/* Destroys every communicator, or aborts them (a failed job). */
void cuda_comms_close(struct coord_gpu *g, bool abort);
/* Waits until what was queued on the stream (through c, may be NULL) is
 * done: polls the stream and c's asynchronous error until the deadline.
 * A failure aborts every communicator. what names the operation. */
hvd_status cuda_wait(struct coord_gpu *g, struct gpu_comm *c, const char *what);
/* Checks an NCCL call's result on a non-blocking communicator: a failure
 * aborts every communicator; ncclInProgress is waited out (with the
 * deadline) before the call returns. */
hvd_status cuda_nccl_check(struct coord_gpu *g, ncclResult_t r, const char *call);

/* ==== collectives (collectives.c, hierarchical.c) ================================= */

/* The backend's execute. */
hvd_status cuda_execute(struct coord_gpu *g, const struct coord_set *set,
                       const struct coord_response *r, struct coord_entry **entries);
/* NCCL's type and op for hvd's; false where NCCL has none. */
bool cuda_nccl_type(hvd_dtype dtype, ncclDataType_t *out);
bool cuda_nccl_op(hvd_dtype dtype, hvd_reduce_op op, ncclRedOp_t *out);
/* Whether the hierarchical allreduce applies to this response. */
bool cuda_hierarchical_applies(const struct coord_gpu *g, const struct coord_set *set);
/* Reduces count elements of buf (device) in place over every rank: NCCL
 * reduce-scatter within the host, allreduce across hosts over the TCP
 * cross ring through pinned host memory, NCCL allgather within the host.
 * No scaling (the caller's). */
hvd_status cuda_allreduce_hierarchical(struct coord_gpu *g, void *buf, size_t count,
                                      hvd_dtype dtype, hvd_reduce_op op);

#endif /* HVD_CUDA_GPU_H */
