/*
 * Shared by the kernel files (half.c, reduce.c, scale.c) only: the
 * multi-versioning attribute of their hot loops, and inline float16 /
 * bfloat16 conversions, which the loops need inlined to vectorize. Everyone
 * else calls the ops_half_* / ops_bf16_* functions of ops.h.
 *
 * OPS_HOT marks a loop function to be compiled twice, for AVX2 and for the
 * baseline (SSE2 on x86-64), the choice made once at load time by an ifunc
 * resolver. Only on x86-64 with GNU C and glibc (ifunc); elsewhere, or with
 * -DOPS_NO_MULTIVERSIONING, it is empty. OPS_X86_DISPATCH says whether
 * code for instruction-set extensions may be compiled and picked at run
 * time (reduce.c's F16C float16 loops).
 *
 * DESIGN. The conversions are branch-free (selects and max only), so that a
 * loop of them vectorizes. They use float arithmetic for the normalisation
 * and the rounding (the technique of Maratyszcza's FP16 library):
 *
 * - binary16 -> float. A normal or infinite/NaN half is moved into the float
 *   field by a shift and rebiased by multiplying with 2^-112 (exact: the
 *   result is a normal float, or inf/NaN, which the multiply keeps). A
 *   subnormal half m * 2^-24 is made exact by building 0.5 + m * 2^-24 from
 *   bits and subtracting 0.5.
 * - float -> binary16. |f| * 2^112 * 2^-110 turns overflow into infinity and
 *   keeps the rest exact; adding a power of two picked from f's exponent
 *   (at least 2^-14, the subnormal quantum's scale) makes the FPU round the
 *   mantissa to 10 bits with the current rounding mode, i.e. to nearest even.
 *   The half's exponent and mantissa are then read from the sum's bits. NaN
 *   keeps its top mantissa bits and gets the quiet bit.
 * - bfloat16 is the upper half of a float: rounding adds 0x7fff plus the
 *   lowest kept bit (ties to even), in integers; NaN is truncated and made
 *   quiet instead, so that rounding cannot carry it into infinity.
 *
 * They assume the default floating-point environment (round to nearest);
 * flush-to-zero / denormals-are-zero only affect floats below 2^-126,
 * which round to a zero half anyway.
 */
#ifndef HVD_OPS_KERNELS_H
#define HVD_OPS_KERNELS_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(OPS_NO_MULTIVERSIONING)
#define OPS_X86_DISPATCH 1
/* ThreadSanitizer instruments the clones' ifunc resolvers, which the dynamic
 * loader runs before the sanitizer's runtime is up: they would crash at load
 * time, so a thread-sanitized build keeps the baseline loops only. */
#if defined(__GLIBC__) && defined(__has_attribute) && !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define OPS_HOT __attribute__((target_clones("avx2", "default")))
#endif
#endif
#else
#define OPS_X86_DISPATCH 0
#endif
#ifndef OPS_HOT
#define OPS_HOT
#endif

static inline uint32_t ops_f32_bits(float f) {
  uint32_t w;
  memcpy(&w, &f, sizeof(w));
  return w;
}

static inline float ops_f32_from_bits(uint32_t w) {
  float f;
  memcpy(&f, &w, sizeof(f));
  return f;
}

/* All ones if c, else zero. The conversions blend with masks instead of
 * `c ? a : b`: GCC would otherwise move the float arithmetic of the unused
 * side into a branch (it may trap, under the default -ftrapping-math), and
 * a loop with a branch does not vectorize. */
static inline uint32_t ops_mask(int c) { return (uint32_t)0 - (uint32_t)(c != 0); }

static inline float ops_f16_decode(uint16_t h) {
  uint32_t w = (uint32_t)h << 16;
  uint32_t sign = w & UINT32_C(0x80000000);
  uint32_t two_w = w + w; /* exponent and mantissa, sign shifted out */
  /* Normal, inf and NaN: rebias the exponent by (127 - 15), in two steps so
   * that exponent 31 lands on 255 (0xe0 << 23 then * 2^-112). */
  float normal = ops_f32_from_bits((two_w >> 4) + (UINT32_C(0xe0) << 23)) * 0x1.0p-112f;
  /* Subnormal: (0.5 + m * 2^-24) - 0.5, both steps exact. */
  float subnormal = ops_f32_from_bits((two_w >> 17) | (UINT32_C(126) << 23)) - 0.5f;
  uint32_t is_sub = ops_mask(two_w < (UINT32_C(1) << 27));
  return ops_f32_from_bits(sign | (ops_f32_bits(subnormal) & is_sub) |
                           (ops_f32_bits(normal) & ~is_sub));
}

static inline uint16_t ops_f16_encode(float f) {
  uint32_t w = ops_f32_bits(f);
  uint32_t shl1_w = w + w;
  uint32_t sign = w & UINT32_C(0x80000000);
  /* Overflow (|f| >= 65520 after rounding) becomes inf in the first
   * multiply; the second brings the rest back, both exact otherwise. */
  float base = (ops_f32_from_bits(w & UINT32_C(0x7fffffff)) * 0x1.0p+112f) * 0x1.0p-110f;
  /* base is 4|f|, with f = 1.m * 2^e. Adding 2^(e+15) leaves an ulp of
   * 2^(e-8) = 4 * 2^(e-10), the half's quantum at e (e at least -14: the
   * subnormals' quantum), so the FPU rounds exactly as binary16 would. The
   * sum's low exponent bits plus its 10+1 mantissa bits then spell the half,
   * a rounding carry moving into the exponent (up to infinity). */
  uint32_t bias = shl1_w & UINT32_C(0xff000000);
  bias = bias < UINT32_C(0x71000000) ? UINT32_C(0x71000000) : bias;
  base = ops_f32_from_bits((bias >> 1) + UINT32_C(0x07800000)) + base;
  uint32_t bits = ops_f32_bits(base);
  uint32_t exp_bits = (bits >> 13) & UINT32_C(0x7c00);
  uint32_t mantissa_bits = bits & UINT32_C(0x0fff);
  uint32_t nonsign = exp_bits + mantissa_bits;
  uint32_t nan = UINT32_C(0x7e00) | ((w >> 13) & UINT32_C(0x3ff));
  uint32_t is_nan = ops_mask(shl1_w > UINT32_C(0xff000000));
  return (uint16_t)((sign >> 16) | (nan & is_nan) | (nonsign & ~is_nan));
}

static inline float ops_bf16_decode(uint16_t b) { return ops_f32_from_bits((uint32_t)b << 16); }

static inline uint16_t ops_bf16_encode(float f) {
  uint32_t w = ops_f32_bits(f);
  uint32_t rounded = (w + UINT32_C(0x7fff) + ((w >> 16) & 1)) >> 16;
  uint32_t nan = (w >> 16) | UINT32_C(0x40);
  uint32_t is_nan = (w & UINT32_C(0x7fffffff)) > UINT32_C(0x7f800000);
  return (uint16_t)(is_nan ? nan : rounded);
}

#endif /* HVD_OPS_KERNELS_H */
