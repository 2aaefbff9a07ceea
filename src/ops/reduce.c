/*
 * Elementwise reduction kernels: dst[i] = a[i] op b[i], per dtype and op.
 *
 * DESIGN. These are the hot loops of allreduce (a float32 sum over
 * megabytes), so each kernel is a straight loop the compiler can vectorize:
 *
 * - Aliasing. dst may be a or b (the ring reduces into its work buffer), so
 *   every kernel comes in four forms: distinct buffers, dst == a, dst == b
 *   (each with restrict pointers, so no runtime overlap checks or scalar
 *   fallbacks), and the rare dst == a == b without restrict. The operand
 *   order is the same in all forms: x is a[i], y is b[i]. Partial overlap is
 *   not supported.
 * - Integers. SUM and PRODUCT are computed in the unsigned type of the same
 *   width, which wraps without undefined behaviour and gives the same bits
 *   as two's-complement signed arithmetic; so signed and unsigned share them.
 *   uint16 products widen to unsigned int first (uint16 * uint16 would
 *   promote to int and could overflow).
 * - MIN is `y < x ? y : x` and MAX `y > x ? y : x`. With a NaN or with
 *   zeros of both signs the result depends on the operand order (it is x
 *   unless y compares smaller/larger); callers keep the order fixed on every
 *   rank. On x86 these are exactly minps/maxps, so they vectorize.
 * - float16 and bfloat16 are widened to float, combined in float and rounded
 *   back to nearest even with the branch-free conversions of kernels.h;
 *   float16 uses the F16C conversion instructions instead where the CPU has
 *   them (the same results, ten times faster).
 * - bool: any non-zero byte is true; SUM and MAX are or, MIN and PRODUCT
 *   are and; the result is 0 or 1.
 * - OPS_HOT compiles each loop for AVX2 and for the baseline and picks one
 *   at load time. src/CMakeLists.txt builds this file with -O3 (GCC's -O2
 *   does not vectorize loops of unknown length).
 *
 * AVERAGE reduces like SUM; the caller scales.
 */
#include <assert.h>
#include <math.h>

#include "kernels.h"
#include "ops.h"

typedef void (*kernel_fn)(void *dst, const void *a, const void *b, size_t n);

/* One kernel, name(dst, a, b, n), with its aliasing forms. EXPR computes
 * dst[i] of type T from x = a[i] and y = b[i]. */
#define KERNEL(name, T, EXPR)                                                                      \
  OPS_HOT static void name##_distinct(T *restrict d, const T *restrict a, const T *restrict b,     \
                                      size_t n) {                                                  \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = a[i], y = b[i];                                                                        \
      d[i] = (EXPR);                                                                               \
    }                                                                                              \
  }                                                                                                \
  OPS_HOT static void name##_into_a(T *restrict d, const T *restrict b, size_t n) {                \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = d[i], y = b[i];                                                                        \
      d[i] = (EXPR);                                                                               \
    }                                                                                              \
  }                                                                                                \
  OPS_HOT static void name##_into_b(T *restrict d, const T *restrict a, size_t n) {                \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = a[i], y = d[i];                                                                        \
      d[i] = (EXPR);                                                                               \
    }                                                                                              \
  }                                                                                                \
  static void name##_self(T *d, size_t n) {                                                        \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = d[i], y = d[i];                                                                        \
      d[i] = (EXPR);                                                                               \
    }                                                                                              \
  }                                                                                                \
  static void name(void *dst, const void *a, const void *b, size_t n) {                            \
    if (dst == a && dst == b)                                                                      \
      name##_self(dst, n);                                                                         \
    else if (dst == a)                                                                             \
      name##_into_a(dst, b, n);                                                                    \
    else if (dst == b)                                                                             \
      name##_into_b(dst, a, n);                                                                    \
    else                                                                                           \
      name##_distinct(dst, a, b, n);                                                               \
  }

#define MIN_EXPR (y < x ? y : x)
#define MAX_EXPR (y > x ? y : x)

/* Integers: sum and product by width, min and max by signedness. */
KERNEL(sum_u8, uint8_t, (uint8_t)(x + y))
KERNEL(sum_u16, uint16_t, (uint16_t)(x + y))
KERNEL(sum_u32, uint32_t, x + y)
KERNEL(sum_u64, uint64_t, x + y)
KERNEL(prod_u8, uint8_t, (uint8_t)(x * y))
KERNEL(prod_u16, uint16_t, (uint16_t)((unsigned)x * y))
KERNEL(prod_u32, uint32_t, x * y)
KERNEL(prod_u64, uint64_t, x * y)

#define MINMAX(suffix, T)                                                                          \
  KERNEL(min_##suffix, T, MIN_EXPR)                                                                \
  KERNEL(max_##suffix, T, MAX_EXPR)

MINMAX(u8, uint8_t)
MINMAX(i8, int8_t)
MINMAX(u16, uint16_t)
MINMAX(i16, int16_t)
MINMAX(i32, int32_t)
MINMAX(i64, int64_t)

/* Floating point. */
#define FLOAT_KERNELS(suffix, T)                                                                   \
  KERNEL(sum_##suffix, T, x + y)                                                                   \
  KERNEL(prod_##suffix, T, x * y)                                                                  \
  MINMAX(suffix, T)

FLOAT_KERNELS(f32, float)
FLOAT_KERNELS(f64, double)

/* float16 and bfloat16 through float: FX and FY are the widened operands. */
#define FX DECODE(x)
#define FY DECODE(y)
#define NARROW_KERNELS(suffix)                                                                     \
  KERNEL(sum_##suffix, uint16_t, ENCODE(FX + FY))                                                  \
  KERNEL(prod_##suffix, uint16_t, ENCODE(FX * FY))                                                 \
  KERNEL(min_##suffix, uint16_t, ENCODE(FY < FX ? FY : FX))                                        \
  KERNEL(max_##suffix, uint16_t, ENCODE(FY > FX ? FY : FX))

#define DECODE ops_f16_decode
#define ENCODE ops_f16_encode
NARROW_KERNELS(f16_soft)
#undef DECODE
#undef ENCODE

/* float16 with F16C's conversion instructions where the CPU has them (every
 * x86-64 with AVX2 does): about ten times the software loop. They convert
 * exactly like kernels.h (round to nearest even, NaN quieted with its top
 * payload bits kept), so every rank gets the same bits with or without
 * them. One form serves every aliasing case: each block of 8 is loaded
 * before it is stored. The tail uses the software conversions. */
#if OPS_X86_DISPATCH && !defined(__clang__) /* clang 14 cannot test for "f16c" */
#include <immintrin.h>

#define F16C_KERNEL(name, VEXPR)                                                                   \
  __attribute__((target("avx,f16c"))) static void name##_f16c(void *dst, const void *a,            \
                                                              const void *b, size_t n) {           \
    uint16_t *d = dst;                                                                             \
    const uint16_t *pa = a, *pb = b;                                                               \
    size_t i = 0;                                                                                  \
    for (; i + 8 <= n; i += 8) {                                                                   \
      __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pa + i)));                      \
      __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pb + i)));                      \
      __m128i r = _mm256_cvtps_ph((VEXPR), _MM_FROUND_TO_NEAREST_INT);                             \
      _mm_storeu_si128((__m128i *)(d + i), r);                                                     \
    }                                                                                              \
    if (i < n)                                                                                     \
      name##_soft(d + i, pa + i, pb + i, n - i);                                                   \
  }                                                                                                \
  static void name(void *dst, const void *a, const void *b, size_t n) {                            \
    if (have_f16c())                                                                               \
      name##_f16c(dst, a, b, n);                                                                   \
    else                                                                                           \
      name##_soft(dst, a, b, n);                                                                   \
  }

/* libgcc's constructor has filled in the CPU model by the time anyone reduces. */
static bool have_f16c(void) {
  return __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
}
#else
#define F16C_KERNEL(name, VEXPR)                                                                   \
  static void name(void *dst, const void *a, const void *b, size_t n) { name##_soft(dst, a, b, n); }
#endif

/* minps(y, x) is y < x ? y : x, maxps(y, x) is y > x ? y : x. */
F16C_KERNEL(sum_f16, _mm256_add_ps(x, y))
F16C_KERNEL(prod_f16, _mm256_mul_ps(x, y))
F16C_KERNEL(min_f16, _mm256_min_ps(y, x))
F16C_KERNEL(max_f16, _mm256_max_ps(y, x))

#define DECODE ops_bf16_decode
#define ENCODE ops_bf16_encode
NARROW_KERNELS(bf16)
#undef DECODE
#undef ENCODE

/* bool. */
KERNEL(or_bool, uint8_t, (uint8_t)((x | y) != 0))
KERNEL(and_bool, uint8_t, (uint8_t)((x != 0) & (y != 0)))

/* [dtype][op]; AVERAGE is SUM. */
#define ROW(sum, min, max, prod)                                                                   \
  { sum, sum, min, max, prod }
static const kernel_fn kernels[HVD_DTYPE_COUNT][HVD_PRODUCT + 1] = {
    [HVD_UINT8] = ROW(sum_u8, min_u8, max_u8, prod_u8),
    [HVD_INT8] = ROW(sum_u8, min_i8, max_i8, prod_u8),
    [HVD_UINT16] = ROW(sum_u16, min_u16, max_u16, prod_u16),
    [HVD_INT16] = ROW(sum_u16, min_i16, max_i16, prod_u16),
    [HVD_INT32] = ROW(sum_u32, min_i32, max_i32, prod_u32),
    [HVD_INT64] = ROW(sum_u64, min_i64, max_i64, prod_u64),
    [HVD_FLOAT16] = ROW(sum_f16, min_f16, max_f16, prod_f16),
    [HVD_BFLOAT16] = ROW(sum_bf16, min_bf16, max_bf16, prod_bf16),
    [HVD_FLOAT32] = ROW(sum_f32, min_f32, max_f32, prod_f32),
    [HVD_FLOAT64] = ROW(sum_f64, min_f64, max_f64, prod_f64),
    [HVD_BOOL] = ROW(or_bool, and_bool, or_bool, and_bool),
};

static bool valid_dtype(hvd_dtype dtype) { return (int)dtype >= 0 && (int)dtype < HVD_DTYPE_COUNT; }

/* The element-wise ops (ADASUM is not element-wise: adasum.c). */
static bool valid_op(hvd_reduce_op op) { return (int)op >= 0 && (int)op <= HVD_PRODUCT; }

void ops_reduce(void *dst, const void *a, const void *b, size_t count, hvd_dtype dtype,
                hvd_reduce_op op) {
  /* Callers validate with ops_check_reduce first. */
  assert(valid_dtype(dtype) && valid_op(op));
  if (!valid_dtype(dtype) || !valid_op(op) || count == 0)
    return;
  kernels[dtype][op](dst, a, b, count);
}

hvd_status ops_check_reduce(hvd_dtype dtype, hvd_reduce_op op, double prescale, double postscale) {
  if (!valid_dtype(dtype))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%d is not a dtype (expected 0 to %d)", (int)dtype,
                     HVD_DTYPE_COUNT - 1);
  if (!valid_op(op) && op != HVD_ADASUM)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%d is not a reduce op (expected 0 to %d)", (int)op,
                     (int)HVD_ADASUM);
  if (op == HVD_ADASUM && dtype != HVD_FLOAT16 && dtype != HVD_BFLOAT16 &&
      dtype != HVD_FLOAT32 && dtype != HVD_FLOAT64)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "adasum is defined for float16, bfloat16, float32 and float64, not %s",
                     hvd_dtype_name(dtype));
  if (!isfinite(prescale) || !isfinite(postscale))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s of %s: scale factors must be finite (prescale %g, postscale %g)",
                     hvd_reduce_op_name(op), hvd_dtype_name(dtype), prescale, postscale);
  if (dtype == HVD_BOOL && op == HVD_AVERAGE)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "average is not defined for bool (use sum or max for a logical or, "
                     "min or product for a logical and)");
  if (dtype == HVD_BOOL && (prescale != 1.0 || postscale != 1.0))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s of bool cannot be scaled (prescale %g, postscale %g; use 1)",
                     hvd_reduce_op_name(op), prescale, postscale);
  return HVD_OK;
}
