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
  SCRATCH_READS,        /* blocks read from other ranks (shared-memory allreduce) */
  SCRATCH_STASH,        /* an in-place input the others read (shared-memory allreduce) */
  SCRATCH_COUNT,
};

enum { OPS_SHM_FIGURES = 4 };
struct ops_shm_figures;

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
  struct ops_shm_figures *figures[OPS_SHM_FIGURES]; /* shm_choice.c, member 0's */
  int next_figures;
};

/* A scratch buffer of at least `bytes` (64-byte aligned), or NULL with an error set. */
void *ops_scratch(struct ops_ctx *o, int which, size_t bytes);
/* At least n request slots. */
struct net_req *ops_requests(struct ops_ctx *o, size_t n);
/* At least n size_t slots. */
size_t *ops_sizes(struct ops_ctx *o, size_t n);
/* The equal shares of count elements over n ranks (ops_share_offset and
 * ops_share_count): offsets in [0, n), counts in [n, 2n) of ops_sizes. */
size_t *ops_equal_shares(struct ops_ctx *o, size_t count, int n);

/*
 * n ranks that are not a power of two (fold.c): the largest power of two
 * p <= n runs the algorithm, and the first 2 * rem = 2 * (n - p) ranks pair
 * up. The even rank of a pair hands its data to the odd one and sits out;
 * the odd one reduces (even's data) op (its own), so that every rank
 * computes each combination in the same order, takes part as virtual rank
 * r / 2, and in the end hands the result back.
 */
struct ops_fold {
  int p, rem;
  int vrank;     /* this rank's place among the p */
  bool sits_out; /* the even rank of a pair */
  bool takes_in; /* the odd rank of a pair */
};
void ops_fold_plan(int n, int r, struct ops_fold *f);
/* The real rank of virtual rank v. */
int ops_fold_rank(const struct ops_fold *f, int v);
/* Folds in: an even rank sends in and receives the final result into buf
 * (then it is done); an odd rank receives into scratch (bytes) and leaves
 * scratch op in in buf; the others do nothing. in may be buf. */
hvd_status ops_fold_in(struct net_comm *c, const struct ops_fold *f, const void *in, void *buf,
                       void *scratch, size_t count, hvd_dtype dtype, hvd_reduce_op op);
/* Folds out: an odd rank of a pair hands the result in buf to its even one. */
hvd_status ops_fold_out(struct net_comm *c, const struct ops_fold *f, const void *buf,
                        size_t bytes);
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

/* Whether the layout runs the hierarchical variants: the same number of
 * ranks (*per) on every host, consecutive, and more than one host
 * (hierarchical.c; it warns once when the layout is not uniform). */
bool ops_use_hierarchical(struct ops_ctx *o, const struct ops_layout *l, int *per);

/* Allreduce without scaling, in place on buf (allreduce.c). */
hvd_status ops_allreduce_raw(struct ops_ctx *o, struct net_comm *c, void *buf, size_t count,
                             hvd_dtype dtype, hvd_reduce_op op);
/*
 * Shared memory (shm.c). ops_shm_group gives the communicator's segment when
 * HVD_SHM allows it and every member is on this host (set up on first use:
 * a collective), else NULL. The collectives take offsets and counts in
 * elements; reducescatterv leaves this rank's share in out; allgatherv
 * expects this rank's block in its place in out already; none scales.
 */
enum { OPS_SHM_MAX_MEMBERS = 256 };
hvd_status ops_shm_group(struct ops_ctx *o, struct net_comm *c, struct net_shm **out);
hvd_status ops_shm_allreduce(struct ops_ctx *o, struct net_shm *s, const void *in, void *out,
                             size_t count, hvd_dtype dtype, hvd_reduce_op op);
hvd_status ops_shm_reducescatterv(struct ops_ctx *o, struct net_shm *s, const void *in,
                                  void *out, const size_t *offsets, const size_t *counts,
                                  hvd_dtype dtype, hvd_reduce_op op);
hvd_status ops_shm_allgatherv(struct ops_ctx *o, struct net_shm *s, const void *in, void *out,
                              const size_t *offsets, const size_t *counts, size_t esize);
/*
 * Copy through the segment or single-copy reads, for an allgather, a
 * broadcast or an allreduce of `bytes` whose outputs take host_bytes on the host
 * (shm_choice.c): ops_shm_choose says which (w->reads), the same on every
 * member; ops_shm_chosen_done, after the operation, lets member 0 learn
 * from how long it took.
 */
enum { OPS_SHM_ALLGATHER, OPS_SHM_BROADCAST, OPS_SHM_ALLREDUCE, OPS_SHM_KINDS };
struct ops_shm_way {
  int kind, size_class;
  size_t bytes;
  bool stream; /* the outputs outgrow the cache: copies into them stream (ops_streams) */
  bool timed;  /* either way may run: member 0 times it */
  bool reads;
  int64_t start_ns;
};
hvd_status ops_shm_choose(struct ops_ctx *o, struct net_shm *s, struct ops_shm_way *w,
                          int kind, size_t bytes, size_t host_bytes);
void ops_shm_chosen_done(struct ops_ctx *o, struct net_shm *s, const struct ops_shm_way *w);
/* A copy that bypasses the cache (stream.c), and whether copies into
 * outputs that take host_bytes on this host in all (every local rank's)
 * should use it: they do not fit in the cache. */
void ops_copy_streaming(void *dst, const void *src, size_t bytes);
bool ops_streams(size_t host_bytes);
hvd_status ops_shm_broadcast(struct ops_ctx *o, struct net_shm *s, void *buf, size_t bytes,
                             int root);
hvd_status ops_shm_alltoallv(struct net_shm *s, const void *in, const size_t *send_offsets,
                             const size_t *send_counts, void *out, const size_t *recv_offsets,
                             const size_t *recv_counts, size_t esize);
hvd_status ops_shm_barrier(struct net_shm *s);

/* Copies count elements from src to dst scaled by factor (a plain copy for 1). */
void ops_copy_scaled(void *dst, const void *src, size_t count, hvd_dtype dtype, double factor);

#endif
