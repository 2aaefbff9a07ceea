/*
 * The cuda module's own kernels (kernels.cu): scaling and averaging GPU
 * tensors as ops_scale does on the CPU, and batched device-to-device copies
 * for the fusion buffer. C callers (the backend's .c files) and nvcc both
 * include this header; it holds no C++.
 *
 * Every function only enqueues work on the given stream and returns without
 * waiting for it; the buffers must stay valid until the stream reaches that
 * work. The caller has made the right device current. Thread-safe (no
 * shared state). A launch failure is reported here; a failure while a kernel
 * runs surfaces at the caller's next synchronisation.
 */
#ifndef HVD_CUDA_KERNELS_H
#define HVD_CUDA_KERNELS_H

#include <cuda_runtime.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "hvd/hvd.h"
#include "common/common.h"

/* One region of a batched copy. */
struct gpu_copy {
  const void *src;
  void *dst;
  size_t bytes;
};

/*
 * buf[i] *= factor for i < count (device memory of dtype), on stream, with
 * ops_scale's results bit for bit: float32 multiplies by (float)factor,
 * float64 by factor; float16 and bfloat16 widen to float, multiply by
 * (float)factor and round to nearest even; integers multiply in double,
 * clamp to the type's range and truncate toward zero (NaN gives 0). A NaN
 * element stays that NaN, made quiet, as on x86. bool is left as it is.
 * factor 1.0 or count 0 enqueues nothing. Requires a build without
 * --use_fast_math / -ftz=true (subnormals must not flush).
 * Returns HVD_ERR_INVALID_ARGUMENT for a value that is not a dtype or a NULL
 * buf with count > 0; HVD_ERR_INTERNAL or HVD_ERR_IO if the launch fails.
 */
hvd_status cuda_scale(void *buf, size_t count, hvd_dtype dtype, double factor, cudaStream_t stream);

/*
 * Finishes HVD_AVERAGE over divisor ranks in place: exactly what the CPU path
 * does, i.e. cuda_scale by 1.0 / divisor (integers: multiplied by that double
 * and truncated toward zero, which is not always integer division: 49 / 49
 * gives 0). A caller that also has a postscale p must call
 * cuda_scale(p / divisor) instead of both, as ops_allreduce folds them.
 * divisor 1 or count 0 enqueues nothing.
 * Returns HVD_ERR_INVALID_ARGUMENT for divisor < 1, bool (average is not
 * defined for it), a value that is not a dtype or a NULL buf with count > 0;
 * HVD_ERR_INTERNAL or HVD_ERR_IO if the launch fails.
 */
hvd_status cuda_divide(void *buf, size_t count, hvd_dtype dtype, int divisor, cudaStream_t stream);

/* Regions per launch of cuda_batched_copy (its descriptors fill under the
 * 4 KiB of kernel parameters every CUDA version accepts). */
#define GPU_BATCHED_COPY_MAX 128

/*
 * Copies copies[i].bytes from copies[i].src to copies[i].dst (device memory
 * of the current device, any sizes and alignments; no two regions may
 * overlap) for i < n, on stream, with one kernel launch per
 * GPU_BATCHED_COPY_MAX non-empty regions. The descriptors travel as kernel
 * parameters, so the copies array may be reused once this returns. Empty
 * regions are skipped; n 0 enqueues nothing. Fastest where src and dst are
 * equally misaligned modulo 16; a pair that differs in its lowest address
 * bit is copied a byte per thread.
 * Returns HVD_ERR_INVALID_ARGUMENT, having enqueued nothing, for copies NULL
 * with n > 0 or a NULL pointer in a non-empty region; HVD_ERR_INTERNAL or
 * HVD_ERR_IO if a launch fails (earlier batches stay enqueued).
 */
hvd_status cuda_batched_copy(const struct gpu_copy *copies, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* HVD_CUDA_KERNELS_H */
