/*
 * The ops module: reduction kernels per dtype, and collective algorithms on
 * a transport communicator. Buffers belong to the caller; every rank of the
 * communicator must make the same call with the same counts, dtype, op and
 * root. Results are bitwise identical on every rank.
 *
 * Threading: like the transport, one thread drives a context at a time.
 */
#ifndef HVD_OPS_H
#define HVD_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "transport/transport.h"

/* ==== kernels (reduce.c, scale.c, half.c) ===================================== */

/* Whether op is defined for dtype with these scale factors: AVERAGE and
 * factors other than 1 are not defined for bool. HVD_ERR_INVALID_ARGUMENT
 * with a message otherwise. */
hvd_status ops_check_reduce(hvd_dtype dtype, hvd_reduce_op op, double prescale, double postscale);

/*
 * dst[i] = a[i] op b[i] for i < count. dst may be a or b. AVERAGE reduces
 * like SUM (the caller scales). Integers wrap on overflow; float16 and
 * bfloat16 are computed in float and rounded to nearest even; bool treats
 * any non-zero byte as true and writes 0 or 1. For NaNs and signed zeros the
 * result depends on the operand order, so callers keep that order the same
 * on every rank.
 */
void ops_reduce(void *dst, const void *a, const void *b, size_t count, hvd_dtype dtype,
                hvd_reduce_op op);

/* dst[i] = src[i] * factor (dst may be src). Integers: computed in double,
 * truncated toward zero and clamped to the type's range; float16/bfloat16
 * through float with round-to-nearest-even. Not for bool. */
void ops_scale(void *dst, const void *src, size_t count, hvd_dtype dtype, double factor);

/* Fills count elements with op's identity (0 for sum and average, 1 for
 * product, the largest value for min and the smallest for max; infinities
 * for floats): what a rank that has no data contributes. */
void ops_fill_identity(void *buf, size_t count, hvd_dtype dtype, hvd_reduce_op op);

/* IEEE binary16 and bfloat16 conversions, round-to-nearest-even, NaN kept NaN. */
float ops_half_to_float(uint16_t h);
uint16_t ops_float_to_half(float f);
float ops_bf16_to_float(uint16_t b);
uint16_t ops_float_to_bf16(float f);

/* ==== shares of an uneven split ================================================ */

/* Rank r of n gets count/n elements, the first count%n ranks one more (Horovod's
 * reducescatter split). */
size_t ops_share_count(size_t count, int n, int r);
size_t ops_share_offset(size_t count, int n, int r);

/* ==== collectives (ctx.c, allreduce.c, ring.c, ...) ================================= */

struct ops_ctx;

/* Tunables, from the environment (see ops_ctx_create). */
struct ops_tunables {
  size_t segment_bytes;        /* HVD_RING_SEGMENT_BYTES: pipeline unit of rings and chains */
  unsigned window;             /* HVD_RING_WINDOW: segments in flight per ring direction */
  size_t allreduce_small_bytes; /* HVD_ALLREDUCE_SMALL_BYTES: below, recursive doubling */
  size_t allreduce_ring_bytes;  /* HVD_ALLREDUCE_RING_BYTES: from here, the ring; between,
                                   halving-doubling */
  size_t broadcast_small_bytes; /* HVD_BROADCAST_SMALL_BYTES: below, a binomial tree */
  int allreduce_algorithm;     /* HVD_ALLREDUCE_ALGORITHM: auto, ring, recursive_doubling,
                                  halving_doubling */
  bool shm;                    /* HVD_SHM: ranks of one host meet in shared memory */
  size_t shm_buffer_bytes;     /* HVD_SHM_BUFFER_BYTES: each rank's buffer (two of them) */
  int shm_single_copy;          /* HVD_SHM_SINGLE_COPY: OPS_SINGLE_COPY_AUTO, _ALWAYS, _NEVER */
  size_t shm_single_copy_bytes; /* HVD_SHM_SINGLE_COPY_BYTES: the smallest allgather,
                                   broadcast or allreduce that may read the others'
                                   memory directly */
};

/* How shared-memory allgathers, broadcasts and allreduces from
 * HVD_SHM_SINGLE_COPY_BYTES up move their bytes: the faster of copies through the segment and
 * single-copy reads, as timed; reads always (where the host allows); never. */
enum { OPS_SINGLE_COPY_AUTO = 0, OPS_SINGLE_COPY_ALWAYS = 1, OPS_SINGLE_COPY_NEVER = 2 };

enum {
  OPS_ALGO_AUTO = 0,
  OPS_ALGO_RING = 1,
  OPS_ALGO_RECURSIVE_DOUBLING = 2,
  OPS_ALGO_HALVING_DOUBLING = 3,
};

/* Reads the tunables' variables (malformed values are errors naming them). */
hvd_status ops_ctx_create(struct ops_ctx **out);
void ops_ctx_destroy(struct ops_ctx *o);
const struct ops_tunables *ops_ctx_tunables(const struct ops_ctx *o);
/* The autotuner's knobs (every rank sets the same values at the same point
 * of the job): HVD_ALLREDUCE_RING_BYTES and HVD_RING_SEGMENT_BYTES; 0 (or
 * a segment under 4 KiB) leaves a value as it is. */
void ops_ctx_retune(struct ops_ctx *o, size_t allreduce_ring_bytes, size_t segment_bytes);

/* out = op over ranks of in (count elements each); in == out is allowed.
 * prescale multiplies every input, postscale the result; AVERAGE adds
 * 1/size to postscale. ADASUM treats the buffer as one tensor (ops_adasum). */
hvd_status ops_allreduce(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                         size_t count, hvd_dtype dtype, hvd_reduce_op op, double prescale,
                         double postscale);

/* out = the concatenation, in rank order, of every rank's in; rank r
 * contributes counts[r] elements (counts has size entries, the same on
 * every rank). in may point into out at this rank's place. */
hvd_status ops_allgatherv(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                          const size_t *counts, hvd_dtype dtype);

/* buf on root is sent to every rank's buf. */
hvd_status ops_broadcast(struct ops_ctx *o, struct net_comm *c, void *buf, size_t count,
                         hvd_dtype dtype, int root);

/* Rank r sends send_counts[p] elements to each p, in rank order from in, and
 * receives recv_counts[p] from each p into out, in rank order. */
hvd_status ops_alltoallv(struct ops_ctx *o, struct net_comm *c, const void *in,
                         const size_t *send_counts, void *out, const size_t *recv_counts,
                         hvd_dtype dtype);

/* Reduces count elements over ranks; rank r receives its share
 * (ops_share_count/offset) in out. */
hvd_status ops_reducescatter(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                             size_t count, hvd_dtype dtype, hvd_reduce_op op, double prescale,
                             double postscale);

/* Like ops_reducescatter, with rank r's share given: counts[r] elements,
 * consecutive in rank order (they sum to the input's count). */
hvd_status ops_reducescatterv(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                              const size_t *counts, hvd_dtype dtype, hvd_reduce_op op,
                              double prescale, double postscale);

hvd_status ops_barrier(struct ops_ctx *o, struct net_comm *c);

/* out = the Adasum of every rank's in (adasum.c): a buffer of ntensors
 * tensors, tensor_counts[t] elements each (they add up to count), each
 * combined with its own dot products. float16, bfloat16, float32, float64.
 * prescale multiplies every input, postscale the result. */
hvd_status ops_adasum(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                      size_t count, hvd_dtype dtype, const size_t *tensor_counts,
                      size_t ntensors, double prescale, double postscale);

/* Hierarchical variants over a host layout: `local` holds the ranks of this
 * host, `cross` one rank per host with this rank's local rank. They need
 * the same number of ranks on every host with consecutive global ranks per
 * host; otherwise (or with one host) they run the flat algorithm on global. */
struct ops_layout {
  struct net_comm *global;
  struct net_comm *local;
  struct net_comm *cross;
};

hvd_status ops_allreduce_hierarchical(struct ops_ctx *o, const struct ops_layout *l,
                                      const void *in, void *out, size_t count, hvd_dtype dtype,
                                      hvd_reduce_op op, double prescale, double postscale);
/* Average within each host, Adasum across hosts (by the hosts' first
 * ranks), the result broadcast within each host. */
hvd_status ops_adasum_hierarchical(struct ops_ctx *o, const struct ops_layout *l,
                                   const void *in, void *out, size_t count, hvd_dtype dtype,
                                   const size_t *tensor_counts, size_t ntensors,
                                   double prescale, double postscale);
hvd_status ops_allgatherv_hierarchical(struct ops_ctx *o, const struct ops_layout *l,
                                       const void *in, void *out, const size_t *counts,
                                       hvd_dtype dtype);

#endif /* HVD_OPS_H */
