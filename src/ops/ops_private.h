/* The ops module's internals, shared by its algorithm files. */
#ifndef HVD_OPS_PRIVATE_H
#define HVD_OPS_PRIVATE_H

#include "ops.h"

/* Scratch buffers, reused from call to call (no allocation in steady state). */
enum {
  SCRATCH_SEGMENTS = 0, /* ring receive slots */
  SCRATCH_WORK,         /* a whole-buffer work area (reducescatter, hierarchical) */
  SCRATCH_TMP,          /* recursive doubling's partner buffer */
  SCRATCH_GATHER,       /* hierarchical allgather's staging */
  SCRATCH_COUNT,
};

struct ops_ctx {
  struct ops_tunables t;
  struct {
    void *p;
    size_t cap;
  } scratch[SCRATCH_COUNT];
  struct net_req *reqs; /* request slots for pipelines */
  size_t nreqs;
  size_t *sizes; /* per-rank offsets and counts */
  size_t nsizes;
  bool warned_flat; /* said once that hierarchical fell back to flat */
};

/* A scratch buffer of at least `bytes` (64-byte aligned), or NULL with an error set. */
void *ops_scratch(struct ops_ctx *o, int which, size_t bytes);
/* At least n request slots. */
struct net_req *ops_requests(struct ops_ctx *o, size_t n);
/* At least n size_t slots. */
size_t *ops_sizes(struct ops_ctx *o, size_t n);
/* Checks that count * element size fits. */
hvd_status ops_bytes(size_t count, hvd_dtype dtype, size_t *bytes);

/*
 * The pipelined ring (ring.c). The buffer is split into `n` chunks (offsets
 * and counts in elements); each chunk into the same number of segments.
 * Reduce-scatter: after it, chunk `owner` (see below) of work holds the
 * reduction of every rank's chunk. Allgather: every chunk travels from its
 * owner to all others, straight into work. One call may do either or both;
 * both phases form one pipeline, so the allgather of a segment starts as
 * soon as its reduction is done.
 * In the reduce-scatter, rank r ends owning chunk (r + 1 + shift) mod n;
 * `in` is the local input (may equal work). In an allgather-only call, rank
 * r owns chunk (r + 1 + shift) mod n from the start.
 */
struct ring_args {
  const void *in;
  void *work;
  const size_t *offsets;
  const size_t *counts;
  hvd_dtype dtype;
  hvd_reduce_op op;
  int shift;
  bool reduce_scatter;
  bool allgather;
};

hvd_status ops_ring(struct ops_ctx *o, struct net_comm *c, const struct ring_args *a);

/*
 * The pipeline driver (pipeline.c): recv_units receives and send_units
 * sends, each posted in order; send_ready(arg, k) says how many sends may
 * be posted once k receives are done; recv_done(arg, u) (may be NULL) runs
 * when receive u completes, in order.
 */
struct pipeline {
  size_t recv_units;
  size_t send_units;
  hvd_status (*post_recv)(void *arg, size_t u, struct net_req *req);
  hvd_status (*post_send)(void *arg, size_t u, struct net_req *req);
  void (*recv_done)(void *arg, size_t u);
  size_t (*send_ready)(void *arg, size_t recvs_done);
};

hvd_status ops_pipeline_run(struct ops_ctx *o, struct net_comm *c, const struct pipeline *p,
                            void *arg);

/* Halving-doubling allreduce of in into buf (may be the same), no scaling
 * (halving_doubling.c). */
hvd_status ops_halving_doubling(struct ops_ctx *o, struct net_comm *c, const void *in, void *buf,
                                size_t count, hvd_dtype dtype, hvd_reduce_op op);

/* Allreduce without scaling, in place on buf (allreduce.c). */
hvd_status ops_allreduce_raw(struct ops_ctx *o, struct net_comm *c, void *buf, size_t count,
                             hvd_dtype dtype, hvd_reduce_op op);
/* Copies count elements from src to dst scaled by factor (a plain copy for 1). */
void ops_copy_scaled(void *dst, const void *src, size_t count, hvd_dtype dtype, double factor);

#endif
