/*
 * Scaling and batched copies on the GPU.
 *
 * DESIGN. Scaling is one grid-stride kernel per dtype whose element
 * function is ops_scale's (src/ops/scale.c) written for the device, so a
 * GPU tensor gets the bits a CPU tensor would: the same multiply in the
 * same precision (float, or double for integers), the same clamps and
 * truncation, round-to-nearest-even narrowing through cuda_fp16/cuda_bf16.
 * Where the GPU differs from x86 the kernels follow x86 explicitly: its
 * float multiply returns a canonical NaN, where x86 returns a NaN operand
 * quieted (payload kept) or, for 0 * inf, the negative default NaN; so a
 * NaN element is passed through quieted instead of multiplied and a NaN
 * product is replaced by the NaN x86 would give, worked out once on the
 * host (ops_scale's float16/bfloat16 encoders keep its top bits). And a NaN
 * check comes before the integer clamps, so no max/min instruction can turn
 * NaN into a bound. AVERAGE is a scale by 1/divisor, as on the CPU.
 *
 * Batched copies follow Horovod's BatchedD2DMemcpy: up to
 * GPU_BATCHED_COPY_MAX descriptors are passed by value as one kernel's
 * parameter (under 4 KiB, the classic limit), each region getting
 * ceil(bytes / COPY_BLOCK_BYTES) blocks, capped so that one huge region
 * does not make a huge grid (its blocks then stride). A block finds its
 * region by binary search over the regions' first block numbers. Within a
 * region the word size is the largest of 16, 8, 4, 2, 1 bytes at which src
 * and dst are equally misaligned; the unaligned head and the tail, each
 * shorter than a word, are copied bytewise by the region's first block.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

enum {
  SCALE_THREADS = 256,
  SCALE_MAX_BLOCKS = 4096, /* a few waves on any GPU; more only adds scheduling */
  COPY_THREADS = 256,
  COPY_UNROLL = 4,          /* loads in flight per thread before its stores */
  COPY_BLOCK_BYTES = 16384, /* 256 threads x 16 bytes x COPY_UNROLL: one pass */
  COPY_MAX_BLOCKS_PER_REGION = 1024,
};
static_assert(COPY_THREADS >= 16, "a block copies a region's head and tail, up to 15 bytes each");

/* A launch failure: our own mistakes (a bad configuration or argument) are
 * internal, anything from the device or driver is I/O. */
static hvd_status launch_status(cudaError_t err) {
  switch (err) {
  case cudaErrorInvalidValue:
  case cudaErrorInvalidConfiguration:
  case cudaErrorInvalidResourceHandle:
  case cudaErrorLaunchOutOfResources:
  case cudaErrorInvalidDeviceFunction: return HVD_ERR_INTERNAL;
  default: return HVD_ERR_IO;
  }
}

/* ==== scaling ================================================================== */

template <typename T, typename Op>
static __global__ void __launch_bounds__(SCALE_THREADS) scale_kernel(T *buf, size_t n, Op op) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    buf[i] = op(buf[i]);
}

/* Integers narrower than 53 bits: both bounds are doubles. */
template <typename T> struct scale_int {
  double f, lo, hi;
  __device__ T operator()(T x) const {
    double v = __dmul_rn((double)x, f);
    if (v != v)
      return 0;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return (T)v;
  }
};

/* int64: 2^63 - 1 is not a double, so the top is compared as v >= 2^63. */
struct scale_i64 {
  double f;
  __device__ int64_t operator()(int64_t x) const {
    double v = __dmul_rn((double)x, f);
    if (v >= 0x1p63)
      return INT64_MAX;
    if (v <= -0x1p63)
      return INT64_MIN;
    return v == v ? (int64_t)v : 0;
  }
};

/* nan: what x86 gives for a NaN product of a non-NaN element (x86_nan). */
struct scale_f32 {
  float f;
  uint32_t nan;
  __device__ float operator()(float x) const {
    uint32_t w = __float_as_uint(x);
    if ((w & 0x7fffffffu) > 0x7f800000u)
      return __uint_as_float(w | 0x00400000u);
    float r = __fmul_rn(x, f);
    return r == r ? r : __uint_as_float(nan);
  }
};

struct scale_f64 {
  double f;
  uint64_t nan;
  __device__ double operator()(double x) const {
    uint64_t w = (uint64_t)__double_as_longlong(x);
    if ((w & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
      return __longlong_as_double((long long)(w | 0x0008000000000000ull));
    double r = __dmul_rn(x, f);
    return r == r ? r : __longlong_as_double((long long)nan);
  }
};

/* float16 and bfloat16 are handled as their bits: a NaN element keeps sign
 * and payload and gets the quiet bit, as ops_f16_encode / ops_bf16_encode
 * give it after an x86 multiply; nan is the encoded NaN product. */
struct scale_f16 {
  float f;
  uint16_t nan;
  __device__ uint16_t operator()(uint16_t h) const {
    if ((h & 0x7fffu) > 0x7c00u)
      return (uint16_t)(h | 0x0200u);
    float r = __fmul_rn(__half2float(__ushort_as_half(h)), f);
    return r == r ? __half_as_ushort(__float2half_rn(r)) : nan;
  }
};

struct scale_bf16 {
  float f;
  uint16_t nan;
  __device__ uint16_t operator()(uint16_t b) const {
    if ((b & 0x7fffu) > 0x7f80u)
      return (uint16_t)(b | 0x0040u);
    float r = __fmul_rn(__bfloat162float(__ushort_as_bfloat16(b)), f);
    return r == r ? __bfloat16_as_ushort(__float2bfloat16_rn(r)) : nan;
  }
};

/* The NaN an x86 multiply gives when only the factor is NaN (the factor,
 * quieted) or for 0 * inf (the default NaN, sign bit set). */
static uint32_t x86_nan32(float f) {
  uint32_t w;
  memcpy(&w, &f, sizeof(w));
  return (w & 0x7fffffffu) > 0x7f800000u ? w | 0x00400000u : 0xffc00000u;
}

static uint64_t x86_nan64(double f) {
  uint64_t w;
  memcpy(&w, &f, sizeof(w));
  return (w & 0x7fffffffffffffffull) > 0x7ff0000000000000ull ? w | 0x0008000000000000ull
                                                             : 0xfff8000000000000ull;
}

/* ops_f16_encode's and ops_bf16_encode's NaNs. */
static uint16_t f16_nan(uint32_t w) {
  return (uint16_t)(((w >> 16) & 0x8000u) | 0x7e00u | ((w >> 13) & 0x3ffu));
}

static uint16_t bf16_nan(uint32_t w) { return (uint16_t)((w >> 16) | 0x0040u); }

template <typename T, typename Op>
static hvd_status launch_scale(void *buf, size_t count, hvd_dtype dtype, Op op,
                               cudaStream_t stream) {
  size_t blocks = count / SCALE_THREADS + (count % SCALE_THREADS != 0);
  if (blocks > SCALE_MAX_BLOCKS)
    blocks = SCALE_MAX_BLOCKS;
  scale_kernel<T, Op><<<(unsigned)blocks, SCALE_THREADS, 0, stream>>>((T *)buf, count, op);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return hvd_error(launch_status(err), "scale_kernel<%s> launch failed: %s",
                     hvd_dtype_name(dtype), cudaGetErrorString(err));
  return HVD_OK;
}

template <typename T>
static hvd_status launch_scale_int(void *buf, size_t count, hvd_dtype dtype, double factor,
                                   double lo, double hi, cudaStream_t stream) {
  return launch_scale<T>(buf, count, dtype, scale_int<T>{factor, lo, hi}, stream);
}

/* Everything but the argument checks; dtype is one of hvd_dtype's values. */
static hvd_status scale(void *buf, size_t count, hvd_dtype dtype, double factor,
                        cudaStream_t stream) {
  float f = (float)factor;
  uint32_t nan32 = x86_nan32(f);

  if (count == 0 || factor == 1.0)
    return HVD_OK;
  switch (dtype) {
  case HVD_UINT8: return launch_scale_int<uint8_t>(buf, count, dtype, factor, 0.0, 255.0, stream);
  case HVD_INT8: return launch_scale_int<int8_t>(buf, count, dtype, factor, -128.0, 127.0, stream);
  case HVD_UINT16:
    return launch_scale_int<uint16_t>(buf, count, dtype, factor, 0.0, 65535.0, stream);
  case HVD_INT16:
    return launch_scale_int<int16_t>(buf, count, dtype, factor, -32768.0, 32767.0, stream);
  case HVD_INT32:
    return launch_scale_int<int32_t>(buf, count, dtype, factor, -2147483648.0, 2147483647.0,
                                     stream);
  case HVD_INT64: return launch_scale<int64_t>(buf, count, dtype, scale_i64{factor}, stream);
  case HVD_FLOAT16:
    return launch_scale<uint16_t>(buf, count, dtype, scale_f16{f, f16_nan(nan32)}, stream);
  case HVD_BFLOAT16:
    return launch_scale<uint16_t>(buf, count, dtype, scale_bf16{f, bf16_nan(nan32)}, stream);
  case HVD_FLOAT32: return launch_scale<float>(buf, count, dtype, scale_f32{f, nan32}, stream);
  case HVD_FLOAT64:
    return launch_scale<double>(buf, count, dtype, scale_f64{factor, x86_nan64(factor)}, stream);
  case HVD_BOOL: return HVD_OK; /* not scaled: ops_scale copies it unchanged */
  }
  return HVD_OK;
}

static bool valid_dtype(hvd_dtype dtype) { return (int)dtype >= 0 && (int)dtype < HVD_DTYPE_COUNT; }

hvd_status cuda_scale(void *buf, size_t count, hvd_dtype dtype, double factor, cudaStream_t stream) {
  if (!valid_dtype(dtype))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cuda_scale: %d is not a dtype (%s)", (int)dtype,
                     hvd_dtype_name(dtype));
  if (buf == NULL && count > 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cuda_scale: NULL buffer for %zu %s elements", count,
                     hvd_dtype_name(dtype));
  return scale(buf, count, dtype, factor, stream);
}

hvd_status cuda_divide(void *buf, size_t count, hvd_dtype dtype, int divisor, cudaStream_t stream) {
  if (!valid_dtype(dtype))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cuda_divide: %d is not a dtype (%s)", (int)dtype,
                     hvd_dtype_name(dtype));
  if (dtype == HVD_BOOL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cuda_divide: average is not defined for %s",
                     hvd_dtype_name(dtype));
  if (divisor < 1)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cuda_divide: average over %d ranks", divisor);
  if (buf == NULL && count > 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cuda_divide: NULL buffer for %zu %s elements", count,
                     hvd_dtype_name(dtype));
  /* The CPU path's postscale /= n, bit for bit. */
  return scale(buf, count, dtype, 1.0 / divisor, stream);
}

/* ==== batched copies ============================================================ */

/* Passed by value: must stay within the 4 KiB of kernel parameters that
 * every CUDA version and architecture accepts. */
struct copy_batch {
  const void *src[GPU_BATCHED_COPY_MAX];
  void *dst[GPU_BATCHED_COPY_MAX];
  size_t bytes[GPU_BATCHED_COPY_MAX];
  uint32_t first_block[GPU_BATCHED_COPY_MAX]; /* ascending; [0] is 0 */
  int n;                                      /* regions, each at least one block */
};
static_assert(sizeof(struct copy_batch) <= 4096, "copy_batch exceeds 4 KiB of parameters");

/* Copies a region as words W, this block being `block` of `nblocks`. src
 * and dst are equally misaligned modulo sizeof(W). */
template <typename W>
static __device__ void copy_words(const unsigned char *__restrict__ s,
                                  unsigned char *__restrict__ d, size_t bytes, unsigned block,
                                  unsigned nblocks) {
  const size_t w = sizeof(W);
  size_t head = (w - ((uintptr_t)s & (w - 1))) & (w - 1);
  if (head > bytes)
    head = bytes;
  size_t words = (bytes - head) / w;
  size_t body_end = head + words * w;
  size_t tail = bytes - body_end;

  if (block == 0) { /* head and tail are each under 16 bytes < COPY_THREADS */
    if (threadIdx.x < head)
      d[threadIdx.x] = s[threadIdx.x];
    if (threadIdx.x < tail)
      d[body_end + threadIdx.x] = s[body_end + threadIdx.x];
  }

  const W *__restrict__ ws = (const W *)(s + head);
  W *__restrict__ wd = (W *)(d + head);
  size_t stride = (size_t)nblocks * blockDim.x;
  size_t i = (size_t)block * blockDim.x + threadIdx.x;
  /* All loads of a pass are issued before its stores, for memory-level
   * parallelism. */
  for (; i + (COPY_UNROLL - 1) * stride < words; i += COPY_UNROLL * stride) {
    W v[COPY_UNROLL];
#pragma unroll
    for (int k = 0; k < COPY_UNROLL; k++)
      v[k] = ws[i + k * stride];
#pragma unroll
    for (int k = 0; k < COPY_UNROLL; k++)
      wd[i + k * stride] = v[k];
  }
  for (; i < words; i += stride)
    wd[i] = ws[i];
}

/* __grid_constant__ guarantees that the descriptors, indexed by a runtime
 * value, are read in place from parameter memory, never copied per thread. */
static __global__ void __launch_bounds__(COPY_THREADS)
    batched_copy_kernel(const __grid_constant__ struct copy_batch b) {
  /* The last region whose first block is at or before this one. */
  int lo = 0, hi = b.n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (b.first_block[mid] <= blockIdx.x)
      lo = mid;
    else
      hi = mid - 1;
  }
  uint32_t first = b.first_block[lo];
  uint32_t end = lo + 1 < b.n ? b.first_block[lo + 1] : gridDim.x;
  unsigned block = blockIdx.x - first, nblocks = end - first;
  const unsigned char *s = (const unsigned char *)b.src[lo];
  unsigned char *d = (unsigned char *)b.dst[lo];
  size_t bytes = b.bytes[lo];
  uintptr_t mis = (uintptr_t)s ^ (uintptr_t)d;

  /* Uniform per block: no divergence. */
  if ((mis & 15) == 0)
    copy_words<uint4>(s, d, bytes, block, nblocks);
  else if ((mis & 7) == 0)
    copy_words<uint2>(s, d, bytes, block, nblocks);
  else if ((mis & 3) == 0)
    copy_words<uint32_t>(s, d, bytes, block, nblocks);
  else if ((mis & 1) == 0)
    copy_words<uint16_t>(s, d, bytes, block, nblocks);
  else
    copy_words<unsigned char>(s, d, bytes, block, nblocks);
}

static hvd_status launch_copy(const struct copy_batch *b, uint32_t blocks, cudaStream_t stream) {
  batched_copy_kernel<<<blocks, COPY_THREADS, 0, stream>>>(*b);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return hvd_error(launch_status(err), "batched_copy_kernel launch failed: %s",
                     cudaGetErrorString(err));
  return HVD_OK;
}

hvd_status cuda_batched_copy(const struct gpu_copy *copies, size_t n, cudaStream_t stream) {
  struct copy_batch b = {};
  uint32_t blocks = 0; /* at most GPU_BATCHED_COPY_MAX * COPY_MAX_BLOCKS_PER_REGION */

  if (copies == NULL && n > 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cuda_batched_copy: NULL array of %zu copies", n);
  /* Checked before anything is enqueued, so a bad call copies nothing. */
  for (size_t i = 0; i < n; i++)
    if (copies[i].bytes > 0 && (copies[i].src == NULL || copies[i].dst == NULL))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "cuda_batched_copy: copy %zu of %zu bytes has a NULL %s", i, copies[i].bytes,
                       copies[i].src == NULL ? "source" : "destination");
  for (size_t i = 0; i < n; i++) {
    const struct gpu_copy *c = &copies[i];
    if (c->bytes == 0)
      continue;
    size_t nb = c->bytes / COPY_BLOCK_BYTES + (c->bytes % COPY_BLOCK_BYTES != 0);
    if (nb > COPY_MAX_BLOCKS_PER_REGION)
      nb = COPY_MAX_BLOCKS_PER_REGION;
    b.src[b.n] = c->src;
    b.dst[b.n] = c->dst;
    b.bytes[b.n] = c->bytes;
    b.first_block[b.n] = blocks;
    blocks += (uint32_t)nb;
    if (++b.n == GPU_BATCHED_COPY_MAX) {
      hvd_status st = launch_copy(&b, blocks, stream);
      if (st != HVD_OK)
        return st;
      b.n = 0;
      blocks = 0;
    }
  }
  return b.n > 0 ? launch_copy(&b, blocks, stream) : HVD_OK;
}
