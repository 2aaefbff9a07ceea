/*
 * hvd: Horovod-style distributed-training collectives over TCP, without MPI.
 *
 * This header is the whole public API. Every function that can fail returns
 * an hvd_status; on failure, hvd_last_error_message() on the same thread
 * says what failed and what to check.
 */
#ifndef HVD_HVD_H
#define HVD_HVD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(HVD_BUILDING_LIBRARY)
#define HVD_API __attribute__((visibility("default")))
#else
#define HVD_API
#endif

#define HVD_VERSION_MAJOR 0
#define HVD_VERSION_MINOR 1
#define HVD_VERSION_PATCH 0

/*
 * Status codes. Values are stable: new codes are only ever appended.
 */
typedef enum hvd_status {
  HVD_OK = 0,
  HVD_ERR_INVALID_ARGUMENT = 1, /* a bad argument, flag or environment value */
  HVD_ERR_NO_MEMORY = 2,        /* an allocation failed */
  HVD_ERR_TIMEOUT = 3,          /* a deadline passed before the operation completed */
  HVD_ERR_NOT_FOUND = 4,        /* a key, scope, interface or object does not exist */
  HVD_ERR_IO = 5,               /* an operating-system call failed */
  HVD_ERR_NETWORK = 6,          /* a connection could not be made or was lost */
  HVD_ERR_PROTOCOL = 7,         /* a peer or server sent something malformed or unexpected */
  HVD_ERR_UNAUTHORIZED = 8,     /* the job token was missing or wrong */
  HVD_ERR_TOO_LARGE = 9,        /* a value or message exceeds a configured limit */
  HVD_ERR_CONFLICT = 10,        /* a compare-and-set lost, or a value was not what was expected */
  HVD_ERR_UNSUPPORTED = 11,     /* the build or platform does not support this */
  HVD_ERR_PRECONDITION = 12,    /* called in the wrong state (not initialized, already running) */
  HVD_ERR_ABORTED = 13,         /* cancelled by shutdown or by a failure elsewhere */
  HVD_ERR_INTERNAL = 14,        /* a broken invariant inside hvd: please report it */
  HVD_ERR_MISMATCH = 15,        /* ranks submitted incompatible operations under one name */
  HVD_ERR_HOSTS_UPDATED = 16,   /* elastic: hosts were added or removed; reset and go on */
  HVD_ERR_REMOVED = 17,         /* elastic: this worker is no longer part of the job */
  HVD_ERR_EXISTS = 18           /* it exists already (a process set with the same ranks) */
} hvd_status;

/* Element types of tensors. Values are stable. */
typedef enum hvd_dtype {
  HVD_UINT8 = 0,
  HVD_INT8 = 1,
  HVD_UINT16 = 2,
  HVD_INT16 = 3,
  HVD_INT32 = 4,
  HVD_INT64 = 5,
  HVD_FLOAT16 = 6,  /* IEEE 754 binary16 */
  HVD_BFLOAT16 = 7, /* the upper half of a binary32 */
  HVD_FLOAT32 = 8,
  HVD_FLOAT64 = 9,
  HVD_BOOL = 10, /* one byte, 0 or 1 */
} hvd_dtype;

#define HVD_DTYPE_COUNT 11

/*
 * Reduction operations. For HVD_BOOL, SUM and MAX are logical or, MIN and
 * PRODUCT logical and; AVERAGE is not defined for bool. AVERAGE divides the
 * sum by the number of ranks (integers truncate toward zero, as Horovod does).
 * ADASUM (allreduce only; float16, bfloat16, float32, float64) combines the
 * ranks' tensors pairwise up a binary tree, each pair a and b as
 * (1 - a.b/(2|a|^2)) a + (1 - a.b/(2|b|^2)) b, with each tensor's dot
 * products over the whole tensor also when tensors are fused; with
 * HOROVOD_HIERARCHICAL_ALLREDUCE it averages within each host and combines
 * the hosts' averages (docs/adasum.md).
 */
typedef enum hvd_reduce_op {
  HVD_SUM = 0,
  HVD_AVERAGE = 1,
  HVD_MIN = 2,
  HVD_MAX = 3,
  HVD_PRODUCT = 4,
  HVD_ADASUM = 5,
} hvd_reduce_op;

/* Size in bytes of one element, 0 for a value that is not a dtype. */
HVD_API size_t hvd_dtype_size(hvd_dtype dtype);
/* "float32", "bfloat16", ...; "unknown" otherwise. */
HVD_API const char *hvd_dtype_name(hvd_dtype dtype);
/* "sum", "average", "min", "max", "product", "adasum"; "unknown" otherwise. */
HVD_API const char *hvd_reduce_op_name(hvd_reduce_op op);

/*
 * A short, static, English description of a status ("timed out").
 * Never NULL; unknown values give "unknown status". Thread-safe.
 */
HVD_API const char *hvd_strerror(hvd_status status);

/*
 * The detailed message of the last failure on the calling thread, e.g.
 * "rendezvous 10.0.0.5:29500: GET /global/3 timed out after 30 s (...)".
 * Empty string if nothing has failed on this thread. The pointer stays valid
 * until the next hvd call on this thread. Thread-safe (per-thread storage).
 */
HVD_API const char *hvd_last_error_message(void);

/* The library version as "MAJOR.MINOR.PATCH". Never NULL. */
HVD_API const char *hvd_version(void);

/*
 * The binary interface, for bindings that declare this header's structures
 * themselves (Python's ctypes) and must notice a library whose layout is not
 * the one they know. HVD_ABI_VERSION changes whenever a structure, an enum
 * value or a function's parameters change incompatibly; appending a
 * function or a status does not change it.
 */
#define HVD_ABI_VERSION 1

/* HVD_ABI_VERSION of the header the library was built from. */
HVD_API int hvd_abi_version(void);
/* sizeof of a public structure named by its type name ("hvd_tensor",
 * "hvd_options", "hvd_elastic_hooks"); 0 for any other name. */
HVD_API size_t hvd_abi_sizeof(const char *type_name);

/* ==== lifecycle and topology ================================================
 *
 * Every function below is safe to call from several threads at once.
 */

/*
 * Joins the job: reads the environment hvdrun sets (HOROVOD_RANK,
 * HOROVOD_SIZE, HOROVOD_LOCAL_RANK/SIZE, HOROVOD_CROSS_RANK/SIZE,
 * HOROVOD_HOSTNAME, HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HVD_TOKEN and the
 * tunables listed in the README), meets the other ranks through the
 * rendezvous store, connects the rings and starts the background thread.
 * A process without that environment is a job of one rank. Blocks until
 * every rank has arrived or HOROVOD_GLOO_TIMEOUT_SECONDS pass.
 * Returns HVD_ERR_PRECONDITION if already initialized, HVD_ERR_INVALID_ARGUMENT
 * for a malformed variable (the message names it), HVD_ERR_TIMEOUT or
 * HVD_ERR_NETWORK when the store or a peer cannot be reached.
 * hvd_init after hvd_shutdown starts afresh (elastic jobs rely on it):
 * every rank must do so, as a rank's nth init meets the others' nth.
 */
HVD_API hvd_status hvd_init(void);

/*
 * Leaves the job: tells the other ranks (their pending and later operations
 * then fail with HVD_ERR_ABORTED, as this rank's pending ones do), stops the
 * background thread and closes every connection. Blocks until done, at most
 * about HOROVOD_GLOO_TIMEOUT_SECONDS. Handles stay valid until released.
 * An hvd_init running on another thread gives up (it returns
 * HVD_ERR_ABORTED) and is waited for. Returns HVD_OK, also when hvd is not
 * initialized; HVD_ERR_PRECONDITION, doing nothing, in a completion
 * callback.
 */
HVD_API hvd_status hvd_shutdown(void);

/* 1 between a successful hvd_init and hvd_shutdown, else 0. */
HVD_API int hvd_is_initialized(void);

/* This rank's place in the job; -1 when hvd is not initialized. */
HVD_API int hvd_rank(void);
HVD_API int hvd_size(void);
HVD_API int hvd_local_rank(void); /* among the ranks on this host */
HVD_API int hvd_local_size(void);
HVD_API int hvd_cross_rank(void); /* among the ranks with this local rank, one per host */
HVD_API int hvd_cross_size(void);
/* 1 when every host runs the same number of ranks, 0 when they differ, -1
 * when hvd is not initialized. */
HVD_API int hvd_is_homogeneous(void);

/* ==== tensors, options and handles ========================================== */

#define HVD_MAX_DIMS 32
#define HVD_PROCESS_SET_GLOBAL 0
#define HVD_DEVICE_CPU (-1)

/*
 * A tensor handed to a collective. Buffers are borrowed until the
 * operation's handle completes: do not free or change them before.
 * name identifies the operation across ranks: every rank must submit the
 * same name for the same operation, and a name may be in flight only once
 * per rank. NULL generates "<collective>.noname.<n>", n counting that
 * collective's calls in the process set on this rank (so ranks must call
 * in the same order). shape has ndims entries (0 <= ndims <= HVD_MAX_DIMS,
 * each >= 0) and is copied; elements are stored row-major and contiguous.
 */
typedef struct hvd_tensor {
  const char *name;
  hvd_dtype dtype;
  int ndims;
  const int64_t *shape;
  const void *input;
  void *output;
} hvd_tensor;

typedef struct hvd_handle_s *hvd_handle;

/* Called once when an operation completes, on the thread that runs hvd's
 * loop at that moment: hvd's background thread, or a user thread inside
 * hvd_handle_wait (see there). That thread holds hvd's loop while the
 * callback runs (no hvd lock that other threads' calls take, so the
 * callback may start operations, poll and release completed handles, and
 * query ranks). It must not block for long (the next operation waits for
 * it), must not wait on or release a handle that has not completed, its
 * own included (hvd_handle_wait returns HVD_ERR_PRECONDITION there), and
 * cannot shut hvd down (hvd_shutdown returns HVD_ERR_PRECONDITION there,
 * doing nothing). */
typedef void (*hvd_callback)(hvd_handle handle, hvd_status status, void *arg);

/*
 * Options of a collective; NULL means HVD_OPTIONS_INIT.
 * - op: allreduce and reducescatter (default HVD_SUM).
 * - prescale / postscale: every input is multiplied by prescale before the
 *   reduction, the result by postscale after (HVD_AVERAGE divides on top).
 *   Not for HVD_BOOL.
 * - process_set: an id from hvd_process_set_add, or HVD_PROCESS_SET_GLOBAL.
 * - root: broadcast only, the root's rank within the process set.
 * - device: HVD_DEVICE_CPU, or the CUDA ordinal of the GPU whose memory
 *   holds input and output (a build with CUDA: see hvd_cuda_built). Every
 *   GPU tensor of a rank is on one device, and ranks must agree on CPU
 *   versus GPU per operation (else HVD_ERR_MISMATCH), not on the ordinal.
 * - ready_event: GPU only, a cudaEvent_t recorded after the work that
 *   produces input; hvd's stream waits for it, no host thread blocks on
 *   it. NULL: the input must already be complete on the device (hvd's
 *   stream does not wait for other streams, the legacy default one
 *   included).
 * A GPU operation's outputs are complete when its handle completes.
 */
typedef struct hvd_options {
  hvd_reduce_op op;
  double prescale;
  double postscale;
  int process_set;
  int root;
  int device;
  hvd_callback callback;
  void *callback_arg;
  void *ready_event;
} hvd_options;

#define HVD_OPTIONS_INIT \
  {HVD_SUM, 1.0, 1.0, HVD_PROCESS_SET_GLOBAL, 0, HVD_DEVICE_CPU, NULL, NULL, NULL}

/*
 * Asynchronous collectives. Each checks its arguments at once (a bad one is
 * HVD_ERR_INVALID_ARGUMENT, as is a name already in flight on this rank, or
 * a process set that does not exist or does not include this rank), queues
 * the operation for the background thread and returns a handle in *handle.
 * Disagreements between ranks (shapes, dtypes, ops, roots, scale factors)
 * are found by the coordinator: the handle then completes on every rank
 * with HVD_ERR_MISMATCH and a message naming the ranks, and the job goes
 * on. A failed peer completes pending handles with HVD_ERR_NETWORK or
 * HVD_ERR_TIMEOUT, a shutdown with HVD_ERR_ABORTED; once either happened,
 * new calls fail at once with that status. All are thread-safe; ops of one
 * process set run in the order the coordinator decides, which may differ
 * from submission order.
 */

/* output = op over ranks of input; output has input's size and may be
 * input. */
HVD_API hvd_status hvd_allreduce_async(const hvd_tensor *tensor, const hvd_options *options,
                                       hvd_handle *handle);

/* Allreduces n tensors as one group: they are negotiated together and
 * complete together, through one handle. They share the options. Name
 * every tensor of the group or none (names are then generated). */
HVD_API hvd_status hvd_grouped_allreduce_async(const hvd_tensor *tensors, size_t n,
                                               const hvd_options *options, hvd_handle *handle);

/* Concatenates every rank's input along the first dimension, in rank
 * order. Ranks may differ in the first dimension only. tensor->output is
 * ignored: hvd allocates the output, which hvd_handle_output returns and
 * hvd_handle_release frees (or hvd_handle_take_output hands over). A
 * scalar (ndims 0) is not allowed. */
HVD_API hvd_status hvd_allgather_async(const hvd_tensor *tensor, const hvd_options *options,
                                       hvd_handle *handle);

/* Allgathers n tensors as one group, negotiated together and completed
 * together through one handle, as hvd_grouped_allreduce_async does; each
 * tensor's output is hvd_handle_output_at(handle, i, ...). */
HVD_API hvd_status hvd_grouped_allgather_async(const hvd_tensor *tensors, size_t n,
                                               const hvd_options *options, hvd_handle *handle);

/* The root's input goes to every rank's output (output may be input; on
 * other ranks input is not read, only the shape must agree). */
HVD_API hvd_status hvd_broadcast_async(const hvd_tensor *tensor, const hvd_options *options,
                                       hvd_handle *handle);

/* Rank r of the process set sends splits[p] rows (first-dimension slices)
 * of its input to each rank p, in order; splits has one entry per rank of
 * the set and sums to at most the first dimension. NULL splits divide the
 * first dimension evenly (it must be a multiple of the set's size). Ranks
 * may differ in the first dimension only. hvd allocates the output (the
 * rows received, in rank order): see hvd_handle_output and
 * hvd_handle_received_splits. */
HVD_API hvd_status hvd_alltoall_async(const hvd_tensor *tensor, const int32_t *splits,
                                      const hvd_options *options, hvd_handle *handle);

/* Reduces the input over ranks and leaves rank r its share of the first
 * dimension: hvd_reducescatter_rows(shape[0], set) rows, written to
 * output, which the caller sizes accordingly (the first shape[0] % size
 * ranks get one row more than the others). A scalar is not allowed. */
HVD_API hvd_status hvd_reducescatter_async(const hvd_tensor *tensor, const hvd_options *options,
                                           hvd_handle *handle);

/* Reducescatters n tensors as one group (negotiated together, completed
 * together through one handle); each tensor's output is sized as for
 * hvd_reducescatter_async. */
HVD_API hvd_status hvd_grouped_reducescatter_async(const hvd_tensor *tensors, size_t n,
                                                   const hvd_options *options,
                                                   hvd_handle *handle);

/* The number of rows this rank receives from a reducescatter of dim0 rows
 * in the process set; -1 if the set is unknown or excludes this rank. */
HVD_API int64_t hvd_reducescatter_rows(int64_t dim0, int process_set);

/*
 * Blocking forms: the asynchronous call, then hvd_handle_wait and
 * hvd_handle_release. Returns the operation's status. (Allgather and
 * alltoall, whose outputs live in the handle, have no blocking form: call
 * the async form and hvd_handle_wait.)
 */
HVD_API hvd_status hvd_allreduce(const hvd_tensor *tensor, const hvd_options *options);
HVD_API hvd_status hvd_grouped_allreduce(const hvd_tensor *tensors, size_t n,
                                         const hvd_options *options);
HVD_API hvd_status hvd_broadcast(const hvd_tensor *tensor, const hvd_options *options);
HVD_API hvd_status hvd_reducescatter(const hvd_tensor *tensor, const hvd_options *options);
HVD_API hvd_status hvd_grouped_reducescatter(const hvd_tensor *tensors, size_t n,
                                             const hvd_options *options);

/*
 * hvd_allreduce for a caller that must regain control now and then (an
 * interpreter that runs signal handlers between calls): submits as
 * hvd_allreduce_async and waits as hvd_handle_wait_for, at most
 * timeout_ms. Then:
 * - completed: releases the handle, sets *pending to NULL and returns
 *   the operation's status (HVD_OK, or its failure with the message);
 * - still running: returns HVD_ERR_TIMEOUT with the handle in *pending,
 *   to wait on and release as any other (the operation goes on); called
 *   from a completion callback, which cannot wait, HVD_ERR_PRECONDITION
 *   with the handle in *pending;
 * - refused at submission: returns that status as hvd_allreduce_async
 *   does (HVD_ERR_INVALID_ARGUMENT, ...) and leaves *pending untouched,
 *   so a caller that presets it can tell a refusal from a failure.
 * HVD_ERR_INVALID_ARGUMENT without touching *pending for a NULL pending.
 * One call instead of three for a small allreduce. Thread-safe.
 */
HVD_API hvd_status hvd_allreduce_wait_for(const hvd_tensor *tensor, const hvd_options *options,
                                          int64_t timeout_ms, hvd_handle *pending);

/*
 * Join, for ranks that run out of data early: blocks until every rank has
 * joined. Meanwhile the other ranks' allreduces go on without this rank,
 * which contributes the reduction's identity (0 for sum: an average still
 * divides by the full size); their allgather, broadcast, alltoall and
 * reducescatter fail on every rank with HVD_ERR_PRECONDITION. Barriers and
 * process set additions and removals by the other ranks complete, the
 * joined rank taking part (it registers or removes the set too), and count
 * as its calls: after the join, unnamed operations match up again.
 * *last_joined_rank (if not NULL) receives the rank that joined last, the
 * same on every rank. Global process set only. Thread-safe; one join at a
 * time per rank; while a rank is joined, its other threads must not submit
 * unnamed operations.
 */
HVD_API hvd_status hvd_join(int *last_joined_rank);

/* Blocks until every rank of the process set has called it. */
HVD_API hvd_status hvd_barrier(int process_set);

/* 1 when the operation has completed (successfully or not), else 0.
 * Never blocks. */
HVD_API int hvd_handle_poll(hvd_handle handle);

/*
 * Blocks until the operation completes and returns its status; on failure
 * hvd_last_error_message() says why. Several threads may wait on one
 * handle. Waiting on a released handle is undefined.
 * While it waits, the calling thread runs hvd's loop itself (negotiation
 * and collectives, and the completion callbacks of whatever completes
 * meanwhile) unless another waiting thread already does, and hvd's
 * background thread rests: one thread per rank busy instead of two, and
 * no hand-off between threads when the operation completes. With
 * HOROVOD_THREAD_AFFINITY set, the pinned background thread keeps all of
 * that work.
 */
HVD_API hvd_status hvd_handle_wait(hvd_handle handle);

/* Waits like hvd_handle_wait, at most timeout_ms; HVD_ERR_TIMEOUT if the
 * operation is still running then (it goes on). */
HVD_API hvd_status hvd_handle_wait_for(hvd_handle handle, int64_t timeout_ms);

/*
 * The output hvd allocated for an allgather or alltoall that succeeded
 * (in the device memory of the input's GPU for a GPU tensor):
 * *data (valid until the handle is released), its size in bytes, and its
 * shape (ndims entries written to shape if not NULL: the input's shape with
 * the first dimension replaced). HVD_ERR_PRECONDITION if the operation has
 * not completed, failed, or has no such output.
 */
HVD_API hvd_status hvd_handle_output(hvd_handle handle, void **data, size_t *bytes,
                                     int64_t *shape);

/* hvd_handle_output for the index-th tensor of a grouped allgather (index
 * 0 is the only one of a single allgather or alltoall);
 * HVD_ERR_INVALID_ARGUMENT for an index the handle does not have. */
HVD_API hvd_status hvd_handle_output_at(hvd_handle handle, size_t index, void **data,
                                        size_t *bytes, int64_t *shape);

/*
 * Like hvd_handle_output_at, and the caller takes the output over, so that
 * a framework can adopt the buffer as its tensor's memory without a copy:
 * the handle no longer frees it (later calls for this index return
 * HVD_ERR_PRECONDITION), and the caller frees it with hvd_output_free
 * (host memory) or hvd_output_free_gpu (a GPU tensor's output, in device
 * memory), from any thread, also after hvd_shutdown. *data is valid for
 * *bytes bytes (never NULL, also for 0 bytes) and aligned for every dtype.
 */
HVD_API hvd_status hvd_handle_take_output(hvd_handle handle, size_t index, void **data,
                                          size_t *bytes, int64_t *shape);
/* Frees a host-memory output taken with hvd_handle_take_output. NULL is a no-op. */
HVD_API void hvd_output_free(void *data);
/* Frees a GPU tensor's output taken with hvd_handle_take_output (device
 * memory, freed by the GPU backend hvd was initialized with). NULL is a
 * no-op; so is every call in a build without GPU support. */
HVD_API void hvd_output_free_gpu(void *data);

/*
 * Wraps an output taken with hvd_handle_take_output as a DLPack tensor, for
 * a framework to adopt without a copy (in Python, a capsule named
 * "dltensor" over *managed, which torch.utils.dlpack.from_dlpack takes).
 * *managed receives a DLManagedTensor in the layout of dlpack.h 0.x (the
 * one every framework reads): one dimension of `bytes` uint8 elements at
 * data, in host memory (device HVD_DEVICE_CPU) or in GPU `device`'s.
 * Its deleter, which the consumer calls once, on any thread, frees the
 * output (as hvd_output_free or hvd_output_free_gpu would) and then the
 * structure. The deleter is C only: it never calls back into the caller's
 * language (it may run while an interpreter unwinds an exception or shuts
 * down) and takes no lock. To drop a structure nobody consumed, call its
 * deleter. On success the output belongs to *managed; on failure
 * (HVD_ERR_INVALID_ARGUMENT for a NULL data or managed or a device below
 * HVD_DEVICE_CPU, HVD_ERR_NO_MEMORY) it stays the caller's and *managed is
 * untouched. Thread-safe.
 */
HVD_API hvd_status hvd_output_dlpack(void *data, size_t bytes, int device, void **managed);
/* How many structures hvd_output_dlpack made are not deleted yet: a leak
 * check for bindings and their tests. Thread-safe. */
HVD_API size_t hvd_output_dlpack_live(void);

/* An alltoall's received splits, one per rank of the process set (rows
 * received from each), valid until the handle is released. */
HVD_API hvd_status hvd_handle_received_splits(hvd_handle handle, const int32_t **splits,
                                              size_t *n);

/* Frees the handle and the outputs hvd allocated for it. A pending
 * operation is waited for first. NULL is a no-op. */
HVD_API void hvd_handle_release(hvd_handle handle);

/* ==== GPUs =====================================================================
 *
 * GPU tensors (hvd_options.device) are reduced with NCCL on a stream of
 * hvd's own; NCCL's unique ids travel through the rendezvous store.
 * HVD_GPU_COLLECTIVES=host runs them through host memory and the TCP
 * collectives instead (ranks that share one GPU need that). A build
 * without CUDA compiles these too: they report that it has none.
 */

/* 1 when this build has the CUDA path, else 0. */
HVD_API int hvd_cuda_built(void);
/* The NCCL version this build uses (e.g. 22809 for 2.28.9), 0 without. */
HVD_API int hvd_nccl_built(void);
/* The number of GPUs this process can use in *count: HVD_ERR_UNSUPPORTED
 * in a build without CUDA, HVD_ERR_NOT_FOUND (naming why) when the
 * driver or a device is missing. */
HVD_API hvd_status hvd_cuda_device_count(int *count);

/* ==== process sets ============================================================
 *
 * A process set is a group of ranks with its own collectives. Id 0
 * (HVD_PROCESS_SET_GLOBAL) is every rank. Adding and removing are
 * collective: every rank of the job calls them, in the same order, with the
 * same arguments, and they block until every rank has.
 */

/* Registers the ranks (n of them, any order, no duplicates; stored
 * sorted) as a process set; *id receives its id, the same on every rank
 * (the lowest id not in use). A set with exactly these ranks already
 * registered (the global set included) fails on every rank with
 * HVD_ERR_EXISTS, ranks that differ between callers with HVD_ERR_MISMATCH;
 * no set is added then. */
HVD_API hvd_status hvd_process_set_add(const int *ranks, size_t n, int *id);

/* Removes a process set (not the global one); its id becomes free. */
HVD_API hvd_status hvd_process_set_remove(int id);

/* This rank's rank in the set, -1 if it is not a member or the set does
 * not exist. */
HVD_API int hvd_process_set_rank(int id);
/* The set's size, -1 if it does not exist. */
HVD_API int hvd_process_set_size(int id);
/* The set's global ranks, sorted: up to cap into ranks, the count in *n. */
HVD_API hvd_status hvd_process_set_ranks(int id, int *ranks, size_t cap, size_t *n);
/* The ids of every registered set, ascending (0, the global set, first):
 * up to cap into ids, the count in *n (which may exceed cap). */
HVD_API hvd_status hvd_process_set_ids(int *ids, size_t cap, size_t *n);

/* ==== timeline ==================================================================
 *
 * A Chrome trace (JSON, for Perfetto or chrome://tracing) of what rank 0
 * does per tensor: negotiation (each rank's submission on its own row),
 * queueing, fusion copies and the collective. HOROVOD_TIMELINE=<file>
 * starts one at hvd_init; HOROVOD_TIMELINE_MARK_CYCLES=1 marks each
 * coordination cycle. The file is a valid trace at every moment (events
 * reach it within a millisecond, whole; a reader closes it with "]"), and
 * past HVD_TIMELINE_MAX_BYTES it starts again, the full one kept as
 * <file>.1. Thread-safe; on other ranks these calls do nothing.
 * hvd_timeline_start: HVD_ERR_PRECONDITION while one is written, HVD_ERR_IO
 * for a file it cannot create; hvd_timeline_stop writes the rest and "]",
 * and returns HVD_ERR_IO if a write failed since the start (the file keeps
 * every whole event before it).
 */
HVD_API hvd_status hvd_timeline_start(const char *path, int mark_cycles);
HVD_API hvd_status hvd_timeline_stop(void);

/* ==== elastic jobs ==============================================================
 *
 * A job started by `hvdrun --min-np N ...` (or with --host-discovery-script)
 * keeps training when workers fail or hosts come and go. The program
 * registers the state that must survive (its parameters, optimizer state,
 * step counter: caller buffers) and hands its training function to
 * hvd_elastic_run. When a peer fails, every surviving worker's collectives
 * fail (HVD_ERR_NETWORK, HVD_ERR_TIMEOUT or HVD_ERR_ABORTED); the function
 * returns that status and hvd_elastic_run restores the last commit, leaves
 * the old communicators, meets the others in the driver's next round (new
 * rank and size: hvd_rank() and friends change), broadcasts the state from
 * the new rank 0 (a worker that was in the job before, so new workers get
 * it too) and calls the function again. When hosts are added or removed,
 * hvd_elastic_commit returns HVD_ERR_HOSTS_UPDATED on every rank at the
 * same commit, and the reset happens without a restore. A worker whose slot
 * the driver removed gets HVD_ERR_REMOVED from hvd_elastic_run (and from
 * any collective it tries after that) and should exit 0.
 * Outside an elastic job the same calls work: a failure is then returned.
 * The state is used by one thread at a time.
 */
typedef struct hvd_elastic_state_s hvd_elastic_state;

/* Optional steps for state that does not live in registered buffers; each
 * gets `user`, and a failure status fails the operation. sync runs after
 * the buffers were broadcast, on every rank, and may call collectives. */
typedef struct hvd_elastic_hooks {
  hvd_status (*commit)(void *user);
  hvd_status (*restore)(void *user);
  hvd_status (*sync)(void *user);
} hvd_elastic_hooks;

HVD_API hvd_status hvd_elastic_state_create(hvd_elastic_state **out);
/* NULL is a no-op. The registered buffers stay the caller's. */
HVD_API void hvd_elastic_state_destroy(hvd_elastic_state *state);
/* Registers bytes at data (borrowed until the state is destroyed) under a
 * name unique in the state. Every rank registers the same names and sizes
 * in the same order. */
HVD_API hvd_status hvd_elastic_state_add(hvd_elastic_state *state, const char *name, void *data,
                                         size_t bytes);
HVD_API hvd_status hvd_elastic_state_set_hooks(hvd_elastic_state *state,
                                               const hvd_elastic_hooks *hooks, void *user);
/* Called after every reset, once hvd is initialized in the new round and
 * before the state is synchronized (in registration order). */
typedef void (*hvd_elastic_reset_callback)(void *arg);
HVD_API hvd_status hvd_elastic_state_on_reset(hvd_elastic_state *state,
                                              hvd_elastic_reset_callback callback, void *arg);

/* Snapshots the buffers (and runs the commit hook), then checks for host
 * changes: HVD_ERR_HOSTS_UPDATED when the driver announced some since this
 * round began. Collective in an elastic job: every rank commits at the
 * same step. */
HVD_API hvd_status hvd_elastic_commit(hvd_elastic_state *state);
/* Copies the last commit back into the buffers (then the restore hook). */
HVD_API hvd_status hvd_elastic_restore(hvd_elastic_state *state);
/* Broadcasts every buffer from rank 0, then runs the sync hook. Collective. */
HVD_API hvd_status hvd_elastic_sync(hvd_elastic_state *state);

/*
 * Leaves the current round and joins the next one: shuts hvd down without
 * waiting on dead peers, tells the driver this worker is ready, waits (up
 * to HOROVOD_ELASTIC_TIMEOUT seconds) for the driver's next assignment and
 * initializes hvd with it. HVD_ERR_REMOVED when the driver dropped this
 * worker; HVD_ERR_PRECONDITION outside an elastic job, and when this
 * worker has already reset HOROVOD_ELASTIC_RESET_LIMIT times (hvd stays
 * initialized then). hvd_elastic_run calls it; a program with its own loop
 * (a binding's) may too.
 */
HVD_API hvd_status hvd_elastic_reset(void);

/* Kinds of host updates (hvd_elastic_hosts_updated). */
#define HVD_HOSTS_ADDED 1
#define HVD_HOSTS_REMOVED 2

/*
 * The host updates the elastic driver has announced since this round
 * began, as this rank knows them: HVD_HOSTS_ADDED and/or HVD_HOSTS_REMOVED
 * ORed, 0 for none, -1 when hvd is not initialized. Rank 0 watches the
 * driver; the other ranks always see 0, so a program that acts on it
 * broadcasts rank 0's answer (hvd_elastic_commit does that for its
 * check). Local: never blocks, no collective; 0 outside an elastic job.
 */
HVD_API int hvd_elastic_hosts_updated(void);

/*
 * Says that this worker's training finished: a pod of an elastic job
 * (HVD_POD=1 under hvd-rendezvous --min-np) then tells the driver "done"
 * when it shuts down, instead of "exit", so that the driver ends the job
 * rather than waiting for the pod to come back. hvd_elastic_run calls it
 * when the training function succeeds; a program with its own loop calls
 * it there too. Elsewhere it does nothing. Returns HVD_OK.
 */
HVD_API hvd_status hvd_elastic_done(void);

/* The function hvd_elastic_run calls: it trains from the state's current
 * values and returns HVD_OK when done, or the status that stopped it. */
typedef hvd_status (*hvd_elastic_train_fn)(hvd_elastic_state *state, void *arg);

/*
 * Syncs the state and calls train until it returns HVD_OK (then HVD_OK),
 * resetting in between as described above: after HVD_ERR_NETWORK,
 * HVD_ERR_TIMEOUT or HVD_ERR_ABORTED it restores the last commit first,
 * after HVD_ERR_HOSTS_UPDATED it does not. Any other status is returned
 * as is, as is a reset's failure. HOROVOD_ELASTIC_RESET_LIMIT, if set,
 * bounds this worker's resets (hvdrun --reset-limit bounds the job's on
 * the driver's side). hvd_init must have succeeded.
 */
HVD_API hvd_status hvd_elastic_run(hvd_elastic_state *state, hvd_elastic_train_fn train,
                                   void *arg);

/* How many resets this process has made. */
HVD_API int hvd_elastic_resets(void);

#ifdef __cplusplus
}
#endif

#endif /* HVD_HVD_H */
