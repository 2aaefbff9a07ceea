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
  HVD_ERR_INTERNAL = 14         /* a broken invariant inside hvd: please report it */
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
 */
typedef enum hvd_reduce_op {
  HVD_SUM = 0,
  HVD_AVERAGE = 1,
  HVD_MIN = 2,
  HVD_MAX = 3,
  HVD_PRODUCT = 4,
} hvd_reduce_op;

/* Size in bytes of one element, 0 for a value that is not a dtype. */
HVD_API size_t hvd_dtype_size(hvd_dtype dtype);
/* "float32", "bfloat16", ...; "unknown" otherwise. */
HVD_API const char *hvd_dtype_name(hvd_dtype dtype);
/* "sum", "average", "min", "max", "product"; "unknown" otherwise. */
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

#ifdef __cplusplus
}
#endif

#endif /* HVD_HVD_H */
