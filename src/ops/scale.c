/*
 * dst[i] = src[i] * factor, per dtype: the prescale and postscale of
 * allreduce and AVERAGE's division by the number of ranks.
 *
 * DESIGN. Like reduce.c, one straight loop per dtype in two forms (in place
 * with one pointer, distinct with restrict pointers), multi-versioned with
 * OPS_HOT. float32 multiplies by (float)factor, float64 by factor, float16
 * and bfloat16 widen to float, multiply by (float)factor and round back to
 * nearest even. Integers are multiplied in double, then clamped to the
 * type's range and truncated toward zero; NaN gives 0. The clamps come
 * before the conversion, so no out-of-range conversion (undefined in C) is
 * ever evaluated. int64 values beyond 2^53 lose precision in double, and
 * its bounds are compared as +-2^63 (INT64_MAX is not a double). bool is not
 * scaled (ops_check_reduce rejects it): a plain copy. The float16 loop uses
 * the software conversions (scaling is one pass per collective, reducing
 * one per peer).
 */
#include <string.h>

#include "kernels.h"
#include "ops.h"

/* One scale kernel, name(dst, src, n, factor), with its two aliasing forms.
 * EXPR computes dst[i] of type T from x = src[i] and f, the factor as F. */
#define SCALE_KERNEL(name, T, F, EXPR)                                                             \
  OPS_HOT static void name##_distinct(T *restrict d, const T *restrict s, size_t n, F f) {         \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = s[i];                                                                                  \
      d[i] = (EXPR);                                                                               \
    }                                                                                              \
  }                                                                                                \
  OPS_HOT static void name##_inplace(T *d, size_t n, F f) {                                        \
    for (size_t i = 0; i < n; i++) {                                                               \
      T x = d[i];                                                                                  \
      d[i] = (EXPR);                                                                               \
    }                                                                                              \
  }                                                                                                \
  static void name(void *dst, const void *src, size_t n, double factor) {                          \
    if (dst == src)                                                                                \
      name##_inplace(dst, n, (F)factor);                                                           \
    else                                                                                           \
      name##_distinct(dst, src, n, (F)factor);                                                     \
  }

/* Integers narrower than 53 bits: both bounds are doubles. NaN fails both
 * comparisons and is replaced last. */
static inline double clamp_nan0(double v, double lo, double hi) {
  v = v < lo ? lo : v;
  v = v > hi ? hi : v;
  return v == v ? v : 0.0;
}

#define SCALE_INT(suffix, T, LO, HI)                                                               \
  SCALE_KERNEL(scale_##suffix, T, double, (T)clamp_nan0((double)x * f, LO, HI))

SCALE_INT(u8, uint8_t, 0.0, 255.0)
SCALE_INT(i8, int8_t, -128.0, 127.0)
SCALE_INT(u16, uint16_t, 0.0, 65535.0)
SCALE_INT(i16, int16_t, -32768.0, 32767.0)
SCALE_INT(i32, int32_t, -2147483648.0, 2147483647.0)

/* int64: 2^63 - 1 is not a double, so the top is compared as v >= 2^63. */
static inline int64_t to_i64(double v) {
  if (v >= 0x1p63)
    return INT64_MAX;
  if (v <= -0x1p63)
    return INT64_MIN;
  return v == v ? (int64_t)v : 0;
}
SCALE_KERNEL(scale_i64, int64_t, double, to_i64((double)x * f))

SCALE_KERNEL(scale_f32, float, float, x * f)
SCALE_KERNEL(scale_f64, double, double, x * f)
SCALE_KERNEL(scale_f16, uint16_t, float, ops_f16_encode(ops_f16_decode(x) * f))
SCALE_KERNEL(scale_bf16, uint16_t, float, ops_bf16_encode(ops_bf16_decode(x) * f))

void ops_scale(void *dst, const void *src, size_t count, hvd_dtype dtype, double factor) {
  if (count == 0)
    return;
  switch (dtype) {
  case HVD_UINT8: scale_u8(dst, src, count, factor); return;
  case HVD_INT8: scale_i8(dst, src, count, factor); return;
  case HVD_UINT16: scale_u16(dst, src, count, factor); return;
  case HVD_INT16: scale_i16(dst, src, count, factor); return;
  case HVD_INT32: scale_i32(dst, src, count, factor); return;
  case HVD_INT64: scale_i64(dst, src, count, factor); return;
  case HVD_FLOAT16: scale_f16(dst, src, count, factor); return;
  case HVD_BFLOAT16: scale_bf16(dst, src, count, factor); return;
  case HVD_FLOAT32: scale_f32(dst, src, count, factor); return;
  case HVD_FLOAT64: scale_f64(dst, src, count, factor); return;
  case HVD_BOOL:
    if (dst != src)
      memmove(dst, src, count);
    return;
  }
}
