/*
 * The contract between coord and a GPU backend (cuda/): the table of
 * functions a backend provides, and all it may read or do through coord.
 * A backend includes this header and never coord.h: it sees a response, an
 * entry, a process set and hvd's state only through the functions below.
 */
#ifndef HVD_COORD_GPU_BACKEND_H
#define HVD_COORD_GPU_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "ops/ops.h"
#include "rendezvous/rendezvous.h"
#include "transport/transport.h"

/* What a response asks for (it travels on the wire with these numbers). */
enum coord_type {
  COORD_ALLREDUCE = 0,
  COORD_ALLGATHER = 1,
  COORD_BROADCAST = 2,
  COORD_JOIN = 3,
  COORD_ALLTOALL = 4,
  COORD_BARRIER = 5,
  COORD_REDUCESCATTER = 6,
  COORD_SET_ADD = 7,    /* registers a process set (global set) */
  COORD_SET_REMOVE = 8, /* removes one (global set) */
  COORD_ERROR = 9,      /* responses only: the tensors fail */
  COORD_TYPE_COUNT = 10,
};

/* "allreduce", ...; "unknown" otherwise. */
const char *coord_type_name(int type);

struct coord_state;    /* hvd's state: opened once, handed back below */
struct coord_gpu;      /* a backend's per-process state: its device, streams, communicators */
struct coord_set;      /* a process set */
struct coord_response; /* one negotiated operation: one tensor, or several fused */
struct coord_entry;    /* this rank's tensor of a response (NULL where it joined) */

/*
 * What a GPU backend provides. coord runs every GPU response with the
 * backend's own collectives where it has them (NCCL), else on the
 * host-staged path (inputs copied to host memory, the CPU collectives over
 * TCP, outputs copied back): execute.c asks coord_gpu_run, then stages.
 * Device pointers are opaque to coord. Every function but device_count and
 * free runs on the thread that runs the loop (or tears the state down, for
 * close).
 */
struct coord_gpu_backend {
  const char *name;
  int nccl_version; /* NCCL_VERSION_CODE, 0: no NCCL */
  /* GPUs this process sees; HVD_ERR_NOT_FOUND with a reason when none. */
  hvd_status (*device_count)(int *n);
  /* Opens `device` for this process's state (on its first GPU response). */
  hvd_status (*open)(struct coord_state *s, int device, struct coord_gpu **out);
  /* abort: the job failed; communicators are aborted, not waited for. */
  void (*close)(struct coord_gpu *g, bool abort);
  /* Runs a response and leaves the outputs complete (entries[i] NULL where
   * this rank has none: it joined). HVD_ERR_UNSUPPORTED, with nothing
   * done, sends it through host staging instead. May be NULL. */
  hvd_status (*execute)(struct coord_gpu *g, const struct coord_set *set,
                        const struct coord_response *r, struct coord_entry **entries);
  /* Makes the stream wait for an input's ready event (the user's). */
  hvd_status (*wait_event)(struct coord_gpu *g, void *event);
  /* Synchronous copies between device memory and host memory. */
  hvd_status (*to_host)(struct coord_gpu *g, void *dst, const void *src, size_t bytes);
  hvd_status (*to_device)(struct coord_gpu *g, void *dst, const void *src, size_t bytes);
  /* Page-locked host memory of at least `bytes` for host staging, reused
   * by every call: valid until the next. *out NULL (or no function): the
   * staging copies go through malloc'd memory instead. May be NULL. */
  void (*staging_buffer)(struct coord_gpu *g, size_t bytes, void **out);
  /* Device memory for outputs hvd allocates (allgather, alltoall); free
   * may run on any thread (hvd_handle_release). */
  hvd_status (*alloc)(struct coord_gpu *g, size_t bytes, void **out);
  void (*free)(void *p);
};

/* The backend this build has (cuda/), or NULL when it has none. */
const struct coord_gpu_backend *coord_gpu_builtin(void);

/* ==== what a backend may read of hvd's state ====================================== */

/* No progress for this long is a failure (HOROVOD_GLOO_TIMEOUT_SECONDS). */
int64_t coord_gpu_timeout_ns(const struct coord_state *s);
/* The job's store client (NULL in a job of one rank) and the scope in
 * which NCCL unique ids travel in this generation. */
struct rdzv_client *coord_gpu_store(const struct coord_state *s);
void coord_gpu_id_scope(const struct coord_state *s, char *out, size_t size);
/* The CPU collectives' context and the world's communicators (the TCP
 * cross ring of the hierarchical allreduce). */
struct ops_ctx *coord_gpu_ops(const struct coord_state *s);
const struct net_world *coord_gpu_world(const struct coord_state *s);
/* HOROVOD_HIERARCHICAL_ALLREDUCE, as rank 0 set it. */
bool coord_gpu_hierarchical(const struct coord_state *s);
/* Ends the tensors' current timeline phase and begins `phase` (NULL: none). */
void coord_execute_phase(struct coord_state *s, const struct coord_response *r,
                         const char *phase);

/* ==== a process set ================================================================ */

int coord_set_id(const struct coord_set *set);
/* Unique per registration in this generation (names its NCCL communicator). */
uint32_t coord_set_comm_id(const struct coord_set *set);
int coord_set_rank(const struct coord_set *set); /* -1: not a member */
int coord_set_size(const struct coord_set *set);
struct net_comm *coord_set_comm(const struct coord_set *set); /* its TCP communicator */

/* ==== a response ==================================================================== */

enum coord_type coord_response_type(const struct coord_response *r);
hvd_dtype coord_response_dtype(const struct coord_response *r);
hvd_reduce_op coord_response_op(const struct coord_response *r);
uint32_t coord_response_ntensors(const struct coord_response *r);
const char *coord_response_name(const struct coord_response *r, uint32_t t);
/* Elements: allreduce and reducescatter, per tensor (counts[t]); broadcast,
 * counts[0]; allgather, per tensor and set rank (counts[t * size + i]). */
const int64_t *coord_response_counts(const struct coord_response *r);
double coord_response_prescale(const struct coord_response *r);
double coord_response_postscale(const struct coord_response *r);
int coord_response_root(const struct coord_response *r); /* broadcast */

/* ==== an entry ======================================================================= */

const void *coord_entry_input(const struct coord_entry *e);
/* The caller's output buffer (allreduce, broadcast, reducescatter). */
void *coord_entry_output_buffer(const struct coord_entry *e);
const int64_t *coord_entry_shape(const struct coord_entry *e, int *ndims);
/* Alltoall: rows for each set rank. */
const int32_t *coord_entry_splits(const struct coord_entry *e);

/* An output hvd allocates (allgather, alltoall), kept in the entry's handle. */
struct coord_output {
  void *data;
  size_t bytes;
  void (*free)(void *); /* how data is freed: NULL for free(), or a GPU backend's */
  int ndims;
  int64_t shape[HVD_MAX_DIMS];
};
struct coord_output *coord_gpu_output(const struct coord_entry *e);
/* Sets a gathered output's size and shape in the entry's handle: total
 * elements, the input's shape with the first dimension to match. */
void coord_output_shape(struct coord_entry *e, int64_t total, size_t esize);

/* ==== plans the CPU path and a backend share (plans.c) =============================== */

/* An allgather of a response's tensors over n ranks, in elements. */
struct coord_gather_copy {
  uint32_t tensor; /* whose part */
  size_t src;      /* in the fused blocks */
  size_t dst;      /* in the tensor's output */
  size_t count;
};
struct coord_gather_plan {
  int n;
  size_t tensors;
  size_t *block_counts;  /* per rank: its parts of every tensor */
  size_t *block_offsets; /* per rank: where its block starts */
  size_t total;          /* every block */
  int64_t *sums;         /* per tensor: elements gathered */
  /* Rank by rank, tensor by tensor: rank i's part of tensor t is
   * copies[i * tensors + t]. A rank copies its own parts in (input to
   * src), and every part out (src to the output at dst). */
  struct coord_gather_copy *copies;
};
hvd_status coord_gather_plan_make(const struct coord_response *r, int n,
                                  struct coord_gather_plan *p);
void coord_gather_plan_free(struct coord_gather_plan *p);

/* An alltoall's splits exchange: every rank learns how many rows it
 * receives from each (over the set's TCP communicator), checked, and the
 * output's size. */
struct coord_alltoall_plan {
  int32_t *recv_splits; /* per set rank */
  int64_t row;          /* elements of one row */
  int64_t rows;         /* rows received */
};
hvd_status coord_alltoall_exchange(struct coord_state *s, const struct coord_set *set,
                                   const struct coord_response *r, const struct coord_entry *e,
                                   struct coord_alltoall_plan *out);
/* The exchange succeeded: the handle takes the received splits. */
void coord_alltoall_done(struct coord_alltoall_plan *p, struct coord_entry *e, int n);
void coord_alltoall_plan_free(struct coord_alltoall_plan *p);

#endif
