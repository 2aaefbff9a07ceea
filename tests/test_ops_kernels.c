/*
 * Unit tests of the reduction kernels (src/ops/reduce.c, scale.c, half.c)
 * and of the dtype and op names (src/common/dtype.c). tests/test_ops.c runs
 * them as its "kernels" suite.
 *
 * The kernels are compared with straightforward per-element references
 * written here, including float16/bfloat16 rounding computed in double from
 * first principles, on counts that exercise the vector bodies and their
 * scalar tails, at element offsets 0 and 1, and in every aliasing form.
 * Results must match bit for bit; a NaN only has to stay a NaN.
 */
#include <check.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"

Suite *kernels_suite(void);

/* ==== helpers ===================================================================== */

static uint64_t rng_state;

static void rng_seed(uint64_t seed) { rng_state = seed * 0x9e3779b97f4a7c15u + 1; }

static uint64_t rng_next(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545f4914f6cdd1du;
}

static uint32_t f32_bits(float f) {
  uint32_t w;
  memcpy(&w, &f, sizeof(w));
  return w;
}

static float f32_from_bits(uint32_t w) {
  float f;
  memcpy(&f, &w, sizeof(f));
  return f;
}

static uint64_t f64_bits(double d) {
  uint64_t w;
  memcpy(&w, &d, sizeof(w));
  return w;
}

static const hvd_dtype all_dtypes[] = {HVD_UINT8,   HVD_INT8,    HVD_UINT16,  HVD_INT16,
                                       HVD_INT32,   HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                       HVD_FLOAT32, HVD_FLOAT64, HVD_BOOL};
static const hvd_reduce_op all_ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX, HVD_PRODUCT};

/* ---- reference float16 / bfloat16, in double ------------------------------------ */

/* A binary format with `mant` explicit mantissa bits and `exp` exponent bits. */
struct fmt {
  int mant;
  int exp;
};

static const struct fmt F16 = {10, 5};
static const struct fmt BF16 = {7, 8};

static int fmt_bias(struct fmt f) { return (1 << (f.exp - 1)) - 1; }

static bool ref_is_nan(struct fmt f, uint16_t bits) {
  unsigned e = (bits >> f.mant) & ((1u << f.exp) - 1);
  return e == (1u << f.exp) - 1 && (bits & ((1u << f.mant) - 1)) != 0;
}

static double ref_decode(struct fmt f, uint16_t bits) {
  unsigned emax = (1u << f.exp) - 1;
  unsigned e = (bits >> f.mant) & emax;
  unsigned m = bits & ((1u << f.mant) - 1);
  double sign = (bits >> 15) ? -1.0 : 1.0;
  if (e == emax)
    return m ? NAN : sign * INFINITY;
  if (e == 0)
    return sign * ldexp(m, 1 - fmt_bias(f) - f.mant);
  return sign * ldexp((double)((1u << f.mant) + m), (int)e - fmt_bias(f) - f.mant);
}

/* Round to nearest even: the value divided by the quantum at its exponent is
 * exact in double, nearbyint rounds it (ties to even), and the code is the
 * biased exponent above the minimum times 2^mant plus that integer, so a
 * carry moves into the exponent by itself. */
static uint16_t ref_encode(struct fmt f, float value) {
  uint16_t sign = signbit(value) ? 0x8000 : 0;
  uint16_t inf = (uint16_t)(((1u << f.exp) - 1) << f.mant);
  int emin = 1 - fmt_bias(f);
  double a = fabs((double)value);
  double overflow = ldexp(2.0 - ldexp(1.0, -(f.mant + 1)), fmt_bias(f));
  int e;

  if (isnan(value))
    return (uint16_t)(sign | inf | (1u << (f.mant - 1)));
  if (a >= overflow)
    return sign | inf;
  if (a == 0.0)
    return sign;
  frexp(a, &e);
  e -= 1; /* a = 1.x * 2^e */
  if (e < emin)
    e = emin;
  double n = nearbyint(a / ldexp(1.0, e - f.mant));
  return (uint16_t)(sign | (unsigned)(((e - emin) << f.mant) + (int)n));
}

/* ---- reference reduction ---------------------------------------------------------- */

#define REF_INT(T, UT)                                                                             \
  do {                                                                                             \
    T x, y, r;                                                                                     \
    memcpy(&x, a, sizeof(x));                                                                      \
    memcpy(&y, b, sizeof(y));                                                                      \
    switch (op) {                                                                                  \
    case HVD_SUM:                                                                                  \
    case HVD_AVERAGE: r = (T)(UT)((uint64_t)(UT)x + (uint64_t)(UT)y); break;                       \
    case HVD_PRODUCT: r = (T)(UT)((uint64_t)(UT)x * (uint64_t)(UT)y); break;                       \
    case HVD_MIN: r = x <= y ? x : y; break;                                                       \
    default: r = x >= y ? x : y; break;                                                            \
    }                                                                                              \
    memcpy(out, &r, sizeof(r));                                                                    \
  } while (0)

/* The documented operand order: min is b < a ? b : a, max b > a ? b : a. */
#define REF_FLOAT(T, x, y, r)                                                                      \
  switch (op) {                                                                                    \
  case HVD_SUM:                                                                                    \
  case HVD_AVERAGE: r = x + y; break;                                                              \
  case HVD_PRODUCT: r = x * y; break;                                                              \
  case HVD_MIN: r = y < x ? y : x; break;                                                          \
  default: r = y > x ? y : x; break;                                                               \
  }

static void ref_reduce_one(hvd_dtype dtype, hvd_reduce_op op, const void *a, const void *b,
                           void *out) {
  switch (dtype) {
  case HVD_UINT8: REF_INT(uint8_t, uint8_t); return;
  case HVD_INT8: REF_INT(int8_t, uint8_t); return;
  case HVD_UINT16: REF_INT(uint16_t, uint16_t); return;
  case HVD_INT16: REF_INT(int16_t, uint16_t); return;
  case HVD_INT32: REF_INT(int32_t, uint32_t); return;
  case HVD_INT64: REF_INT(int64_t, uint64_t); return;
  case HVD_FLOAT32: {
    float x, y, r;
    memcpy(&x, a, 4);
    memcpy(&y, b, 4);
    REF_FLOAT(float, x, y, r);
    memcpy(out, &r, 4);
    return;
  }
  case HVD_FLOAT64: {
    double x, y, r;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    REF_FLOAT(double, x, y, r);
    memcpy(out, &r, 8);
    return;
  }
  case HVD_FLOAT16:
  case HVD_BFLOAT16: {
    struct fmt f = dtype == HVD_FLOAT16 ? F16 : BF16;
    uint16_t hx, hy, hr;
    float x, y, r;
    memcpy(&hx, a, 2);
    memcpy(&hy, b, 2);
    x = (float)ref_decode(f, hx);
    y = (float)ref_decode(f, hy);
    REF_FLOAT(float, x, y, r);
    hr = ref_encode(f, r);
    memcpy(out, &hr, 2);
    return;
  }
  case HVD_BOOL: {
    bool x = *(const uint8_t *)a != 0, y = *(const uint8_t *)b != 0;
    bool any = op == HVD_SUM || op == HVD_AVERAGE || op == HVD_MAX;
    *(uint8_t *)out = (uint8_t)(any ? (x || y) : (x && y));
    return;
  }
  }
  ck_abort_msg("bad dtype %d", (int)dtype);
}

/* Element i of got and want agree: bitwise, or both NaN. */
static bool same_element(hvd_dtype dtype, const uint8_t *got, const uint8_t *want) {
  size_t es = hvd_dtype_size(dtype);
  if (memcmp(got, want, es) == 0)
    return true;
  if (dtype == HVD_FLOAT16 || dtype == HVD_BFLOAT16) {
    uint16_t g, w;
    struct fmt f = dtype == HVD_FLOAT16 ? F16 : BF16;
    memcpy(&g, got, 2);
    memcpy(&w, want, 2);
    return ref_is_nan(f, g) && ref_is_nan(f, w);
  }
  if (dtype == HVD_FLOAT32) {
    float g, w;
    memcpy(&g, got, 4);
    memcpy(&w, want, 4);
    return isnan(g) && isnan(w);
  }
  if (dtype == HVD_FLOAT64) {
    double g, w;
    memcpy(&g, got, 8);
    memcpy(&w, want, 8);
    return isnan(g) && isnan(w);
  }
  return false;
}

static void assert_elements(hvd_dtype dtype, const uint8_t *got, const uint8_t *want, size_t count,
                            const char *what) {
  size_t es = hvd_dtype_size(dtype);
  for (size_t i = 0; i < count; i++) {
    if (!same_element(dtype, got + i * es, want + i * es)) {
      uint64_t g = 0, w = 0;
      memcpy(&g, got + i * es, es);
      memcpy(&w, want + i * es, es);
      ck_abort_msg("%s, %s: element %zu of %zu is 0x%" PRIx64 ", expected 0x%" PRIx64, what,
                   hvd_dtype_name(dtype), i, count, g, w);
    }
  }
}

/* Random inputs: for floats, a mix of small integers (ties in min/max,
 * exact sums, signed zeros) and arbitrary bit patterns (NaN, inf,
 * subnormals, overflow); for bool, zeros and arbitrary non-zero bytes. */
static void fill_random(hvd_dtype dtype, uint8_t *p, size_t count) {
  size_t es = hvd_dtype_size(dtype);
  for (size_t i = 0; i < count; i++) {
    uint64_t r = rng_next();
    int small = (int)(r >> 60) - 8; /* -8..7 */
    bool raw = (r & 3) == 0;
    uint8_t *e = p + i * es;
    switch (dtype) {
    case HVD_FLOAT16:
    case HVD_BFLOAT16: {
      uint16_t h = raw ? (uint16_t)(r >> 20)
                       : (dtype == HVD_FLOAT16 ? ops_float_to_half : ops_float_to_bf16)(
                             small == -8 ? -0.0f : (float)small);
      memcpy(e, &h, 2);
      break;
    }
    case HVD_FLOAT32: {
      float f = raw ? f32_from_bits((uint32_t)(r >> 16)) : small == -8 ? -0.0f : (float)small;
      memcpy(e, &f, 4);
      break;
    }
    case HVD_FLOAT64: {
      double d;
      uint64_t bits = rng_next();
      if (raw)
        memcpy(&d, &bits, 8);
      else
        d = small == -8 ? -0.0 : (double)small;
      memcpy(e, &d, 8);
      break;
    }
    case HVD_BOOL: *e = (r & 4) ? 0 : (uint8_t)(r >> 24); break;
    default:
      /* Integers: half small values, half arbitrary bits. */
      if (raw || (r & 8)) {
        memcpy(e, &r, es);
      } else {
        int64_t v = small;
        memcpy(e, &v, es); /* little-endian: the low bytes */
      }
      break;
    }
  }
}

/* ==== names and sizes ============================================================= */

START_TEST(test_dtype_names) {
  static const size_t sizes[] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
  static const char *const names[] = {"uint8",   "int8",     "uint16",  "int16",   "int32", "int64",
                                      "float16", "bfloat16", "float32", "float64", "bool"};
  static const char *const op_names[] = {"sum", "average", "min", "max", "product"};

  ck_assert_int_eq(HVD_ARRAY_SIZE(all_dtypes), HVD_DTYPE_COUNT);
  for (size_t i = 0; i < HVD_ARRAY_SIZE(all_dtypes); i++) {
    ck_assert_int_eq((int)all_dtypes[i], (int)i);
    ck_assert_uint_eq(hvd_dtype_size(all_dtypes[i]), sizes[i]);
    ck_assert_str_eq(hvd_dtype_name(all_dtypes[i]), names[i]);
  }
  for (size_t i = 0; i < HVD_ARRAY_SIZE(all_ops); i++)
    ck_assert_str_eq(hvd_reduce_op_name(all_ops[i]), op_names[i]);

  ck_assert_uint_eq(hvd_dtype_size((hvd_dtype)HVD_DTYPE_COUNT), 0);
  ck_assert_uint_eq(hvd_dtype_size((hvd_dtype)-1), 0);
  ck_assert_str_eq(hvd_dtype_name((hvd_dtype)HVD_DTYPE_COUNT), "unknown");
  ck_assert_str_eq(hvd_dtype_name((hvd_dtype)-1), "unknown");
  ck_assert_str_eq(hvd_reduce_op_name(HVD_ADASUM), "adasum");
  ck_assert_str_eq(hvd_reduce_op_name((hvd_reduce_op)6), "unknown");
  ck_assert_str_eq(hvd_reduce_op_name((hvd_reduce_op)-1), "unknown");
}
END_TEST

/* ==== ops_check_reduce ============================================================= */

START_TEST(test_check_reduce_valid) {
  for (size_t d = 0; d < HVD_ARRAY_SIZE(all_dtypes); d++) {
    for (size_t o = 0; o < HVD_ARRAY_SIZE(all_ops); o++) {
      hvd_dtype dt = all_dtypes[d];
      hvd_reduce_op op = all_ops[o];
      if (dt == HVD_BOOL && op == HVD_AVERAGE)
        continue;
      ck_assert_int_eq(ops_check_reduce(dt, op, 1.0, 1.0), HVD_OK);
      if (dt == HVD_BOOL)
        continue;
      ck_assert_int_eq(ops_check_reduce(dt, op, 0.5, 2.0), HVD_OK);
      ck_assert_int_eq(ops_check_reduce(dt, op, -3.0, 0.0), HVD_OK);
      ck_assert_int_eq(ops_check_reduce(dt, op, DBL_MAX, DBL_MIN), HVD_OK);
    }
  }
}
END_TEST

static void expect_rejected(hvd_dtype dtype, hvd_reduce_op op, double prescale, double postscale,
                            const char *needle1, const char *needle2) {
  const char *msg;
  hvd_error_clear();
  ck_assert_int_eq(ops_check_reduce(dtype, op, prescale, postscale), HVD_ERR_INVALID_ARGUMENT);
  msg = hvd_last_error_message();
  ck_assert_msg(strstr(msg, needle1) != NULL, "'%s' does not contain '%s'", msg, needle1);
  ck_assert_msg(strstr(msg, needle2) != NULL, "'%s' does not contain '%s'", msg, needle2);
}

START_TEST(test_check_reduce_invalid) {
  expect_rejected(HVD_BOOL, HVD_AVERAGE, 1.0, 1.0, "average", "bool");
  expect_rejected(HVD_BOOL, HVD_SUM, 2.0, 1.0, "bool", "prescale 2");
  expect_rejected(HVD_BOOL, HVD_MAX, 1.0, 0.5, "bool", "postscale 0.5");
  expect_rejected(HVD_BOOL, HVD_PRODUCT, 0.0, 1.0, "product of bool", "scaled");
  expect_rejected((hvd_dtype)HVD_DTYPE_COUNT, HVD_SUM, 1.0, 1.0, "11", "dtype");
  expect_rejected((hvd_dtype)-1, HVD_SUM, 1.0, 1.0, "-1", "dtype");
  expect_rejected(HVD_FLOAT32, (hvd_reduce_op)6, 1.0, 1.0, "6", "reduce op");
  expect_rejected(HVD_INT32, HVD_ADASUM, 1.0, 1.0, "adasum", "int32");
  expect_rejected(HVD_BOOL, HVD_ADASUM, 1.0, 1.0, "adasum", "bool");
  expect_rejected(HVD_FLOAT32, (hvd_reduce_op)-1, 1.0, 1.0, "-1", "reduce op");
  expect_rejected(HVD_FLOAT32, HVD_SUM, NAN, 1.0, "finite", "float32");
  expect_rejected(HVD_INT32, HVD_AVERAGE, 1.0, NAN, "finite", "nan");
  expect_rejected(HVD_FLOAT64, HVD_MIN, INFINITY, 1.0, "finite", "inf");
  expect_rejected(HVD_FLOAT16, HVD_MAX, 1.0, -INFINITY, "finite", "float16");
  /* A bad dtype is reported before a bad op or factor. */
  expect_rejected((hvd_dtype)42, (hvd_reduce_op)42, NAN, NAN, "42", "dtype");
}
END_TEST

/* ==== ops_reduce against the reference ============================================ */

enum { GUARD = 16, GUARD_BYTE = 0xa5 };

/* A buffer of count elements at element offset off, with GUARD guard bytes
 * on both sides. */
struct buf {
  uint8_t *base;
  uint8_t *p;
  size_t bytes;
};

static void buf_init(struct buf *b, size_t count, size_t es, size_t off) {
  b->bytes = count * es;
  b->base = malloc(GUARD + off * es + b->bytes + GUARD);
  ck_assert_ptr_nonnull(b->base);
  memset(b->base, GUARD_BYTE, GUARD + off * es + b->bytes + GUARD);
  b->p = b->base + GUARD + off * es;
}

static void buf_check_guards(const struct buf *b, const char *what) {
  for (size_t i = 0; i < GUARD; i++) {
    ck_assert_msg(b->p[-1 - (ptrdiff_t)i] == GUARD_BYTE, "%s: wrote before the buffer", what);
    ck_assert_msg(b->p[b->bytes + i] == GUARD_BYTE, "%s: wrote past the buffer", what);
  }
}

static void buf_fini(struct buf *b) { free(b->base); }

static void ref_reduce(hvd_dtype dtype, hvd_reduce_op op, uint8_t *out, const uint8_t *a,
                       const uint8_t *b, size_t count) {
  size_t es = hvd_dtype_size(dtype);
  for (size_t i = 0; i < count; i++)
    ref_reduce_one(dtype, op, a + i * es, b + i * es, out + i * es);
}

static void check_reduce_case(hvd_dtype dtype, hvd_reduce_op op, size_t count, size_t off) {
  size_t es = hvd_dtype_size(dtype);
  size_t bytes = count * es;
  struct buf a, b, d, want, want_self;
  char what[96];

  snprintf(what, sizeof(what), "%s, count %zu, offset %zu", hvd_reduce_op_name(op), count, off);
  buf_init(&a, count, es, off);
  buf_init(&b, count, es, off);
  buf_init(&d, count, es, off);
  buf_init(&want, count, es, 0);
  buf_init(&want_self, count, es, 0);
  fill_random(dtype, a.p, count);
  fill_random(dtype, b.p, count);
  ref_reduce(dtype, op, want.p, a.p, b.p, count);
  ref_reduce(dtype, op, want_self.p, a.p, a.p, count);

  /* dst distinct; the inputs stay as they are. */
  {
    uint8_t *a0 = malloc(bytes + 1), *b0 = malloc(bytes + 1);
    ck_assert_ptr_nonnull(a0);
    ck_assert_ptr_nonnull(b0);
    memcpy(a0, a.p, bytes);
    memcpy(b0, b.p, bytes);
    ops_reduce(d.p, a.p, b.p, count, dtype, op);
    assert_elements(dtype, d.p, want.p, count, what);
    buf_check_guards(&d, what);
    ck_assert_msg(memcmp(a0, a.p, bytes) == 0 && memcmp(b0, b.p, bytes) == 0,
                  "%s: an input changed", what);
    free(a0);
    free(b0);
  }
  /* dst == a */
  memcpy(d.p, a.p, bytes);
  ops_reduce(d.p, d.p, b.p, count, dtype, op);
  assert_elements(dtype, d.p, want.p, count, what);
  buf_check_guards(&d, what);
  /* dst == b */
  memcpy(d.p, b.p, bytes);
  ops_reduce(d.p, a.p, d.p, count, dtype, op);
  assert_elements(dtype, d.p, want.p, count, what);
  buf_check_guards(&d, what);
  /* dst == a == b */
  memcpy(d.p, a.p, bytes);
  ops_reduce(d.p, d.p, d.p, count, dtype, op);
  assert_elements(dtype, d.p, want_self.p, count, what);
  buf_check_guards(&d, what);

  buf_fini(&want_self);
  buf_fini(&want);
  buf_fini(&d);
  buf_fini(&b);
  buf_fini(&a);
}

/* Loop test: _i is the dtype. */
START_TEST(test_reduce_reference) {
  static const size_t counts[] = {0, 1, 7, 1000, 1023};
  hvd_dtype dtype = (hvd_dtype)_i;
  rng_seed(1000 + (uint64_t)_i);
  for (size_t o = 0; o < HVD_ARRAY_SIZE(all_ops); o++) {
    if (dtype == HVD_BOOL && all_ops[o] == HVD_AVERAGE)
      continue;
    for (size_t c = 0; c < HVD_ARRAY_SIZE(counts); c++)
      for (size_t off = 0; off < 2; off++)
        check_reduce_case(dtype, all_ops[o], counts[c], off);
  }
}
END_TEST

/* ==== exact integer results ======================================================== */

/* Integers of any width as int64: stored truncated, loaded sign- or
 * zero-extended as the dtype is. */
static void store_int(hvd_dtype dtype, void *p, int64_t v) {
  uint8_t u8 = (uint8_t)v;
  uint16_t u16 = (uint16_t)v;
  uint32_t u32 = (uint32_t)v;
  switch (hvd_dtype_size(dtype)) {
  case 1: memcpy(p, &u8, 1); return;
  case 2: memcpy(p, &u16, 2); return;
  case 4: memcpy(p, &u32, 4); return;
  default: memcpy(p, &v, 8); return;
  }
}

static int64_t load_int(hvd_dtype dtype, const void *p) {
  uint8_t u8;
  int8_t i8;
  uint16_t u16;
  int16_t i16;
  int32_t i32;
  int64_t i64;
  switch (dtype) {
  case HVD_UINT8: memcpy(&u8, p, 1); return u8;
  case HVD_INT8: memcpy(&i8, p, 1); return i8;
  case HVD_UINT16: memcpy(&u16, p, 2); return u16;
  case HVD_INT16: memcpy(&i16, p, 2); return i16;
  case HVD_INT32: memcpy(&i32, p, 4); return i32;
  default: memcpy(&i64, p, 8); return i64;
  }
}

/* x op y, replicated over 37 elements so that both the vector body and the
 * tail see it (all must agree). */
static int64_t reduce_pair(hvd_dtype dtype, hvd_reduce_op op, int64_t x, int64_t y) {
  enum { N = 37 };
  int64_t a[N], b[N], d[N]; /* storage, aligned for every width */
  uint8_t *pa = (uint8_t *)a, *pb = (uint8_t *)b, *pd = (uint8_t *)d;
  size_t es = hvd_dtype_size(dtype);
  for (size_t i = 0; i < N; i++) {
    store_int(dtype, pa + i * es, x);
    store_int(dtype, pb + i * es, y);
  }
  ops_reduce(d, a, b, N, dtype, op);
  for (size_t i = 1; i < N; i++)
    ck_assert_int_eq(load_int(dtype, pd + i * es), load_int(dtype, pd));
  return load_int(dtype, pd);
}

START_TEST(test_reduce_integer_wrap) {
  ck_assert_int_eq(reduce_pair(HVD_INT8, HVD_SUM, 100, 100), -56);
  ck_assert_int_eq(reduce_pair(HVD_INT8, HVD_SUM, -100, -100), 56);
  ck_assert_uint_eq(reduce_pair(HVD_UINT8, HVD_SUM, 200, 100), 44);
  ck_assert_uint_eq(reduce_pair(HVD_UINT16, HVD_AVERAGE, 65535, 1), 0);
  ck_assert_int_eq(reduce_pair(HVD_INT16, HVD_SUM, 32767, 1), -32768);
  ck_assert_int_eq(reduce_pair(HVD_INT32, HVD_SUM, INT32_MAX, 1), INT32_MIN);
  ck_assert_int_eq(reduce_pair(HVD_INT32, HVD_SUM, INT32_MIN, -1), INT32_MAX);
  ck_assert_int_eq(reduce_pair(HVD_INT64, HVD_SUM, INT64_MAX, 1), INT64_MIN);
  ck_assert_int_eq(reduce_pair(HVD_INT64, HVD_AVERAGE, INT64_MIN, INT64_MIN), 0);

  ck_assert_uint_eq(reduce_pair(HVD_UINT8, HVD_PRODUCT, 16, 17), 16);
  ck_assert_int_eq(reduce_pair(HVD_INT8, HVD_PRODUCT, -128, -1), -128);
  ck_assert_int_eq(reduce_pair(HVD_INT8, HVD_PRODUCT, 16, 16), 0);
  ck_assert_int_eq(reduce_pair(HVD_INT8, HVD_PRODUCT, -3, 50), 106);
  ck_assert_uint_eq(reduce_pair(HVD_UINT16, HVD_PRODUCT, 65535, 65535), 1);
  ck_assert_int_eq(reduce_pair(HVD_INT16, HVD_PRODUCT, -32768, -1), -32768);
  ck_assert_int_eq(reduce_pair(HVD_INT16, HVD_PRODUCT, 300, 300), 24464);
  ck_assert_int_eq(reduce_pair(HVD_INT32, HVD_PRODUCT, 65536, 65536), 0);
  ck_assert_int_eq(reduce_pair(HVD_INT32, HVD_PRODUCT, INT32_MIN, -1), INT32_MIN);
  ck_assert_int_eq(reduce_pair(HVD_INT32, HVD_PRODUCT, 100000, -100000),
                   -1410065408); /* -10^10 mod 2^32 */
  ck_assert_int_eq(reduce_pair(HVD_INT64, HVD_PRODUCT, INT64_MIN, -1), INT64_MIN);
  ck_assert_int_eq(
      reduce_pair(HVD_INT64, HVD_PRODUCT, (INT64_C(1) << 32) + 1, (INT64_C(1) << 32) + 1),
      (INT64_C(1) << 33) + 1);
  ck_assert_int_eq(reduce_pair(HVD_INT64, HVD_PRODUCT, -3, INT64_C(1) << 62), INT64_C(1) << 62);

  /* min and max follow the signedness of the type. */
  ck_assert_int_eq(reduce_pair(HVD_INT8, HVD_MIN, -1, 1), -1);
  ck_assert_uint_eq(reduce_pair(HVD_UINT8, HVD_MIN, 255, 1), 1);
  ck_assert_int_eq(reduce_pair(HVD_INT16, HVD_MAX, -32768, -32767), -32767);
  ck_assert_uint_eq(reduce_pair(HVD_UINT16, HVD_MAX, 65535, 1), 65535);
  ck_assert_int_eq(reduce_pair(HVD_INT32, HVD_MIN, INT32_MIN, INT32_MAX), INT32_MIN);
  ck_assert_int_eq(reduce_pair(HVD_INT64, HVD_MIN, INT64_MAX, INT64_MIN), INT64_MIN);
  ck_assert_int_eq(reduce_pair(HVD_INT64, HVD_MAX, INT64_MIN, -1), -1);
}
END_TEST

START_TEST(test_reduce_bool) {
  static const uint8_t a[] = {0, 0, 1, 1, 2, 255, 0, 128, 7, 0};
  static const uint8_t b[] = {0, 1, 0, 1, 255, 2, 7, 0, 0, 0};
  static const uint8_t any[] = {0, 1, 1, 1, 1, 1, 1, 1, 1, 0};
  static const uint8_t all[] = {0, 0, 0, 1, 1, 1, 0, 0, 0, 0};
  enum { N = 10, REPS = 13 }; /* 130 elements: vector bodies and a tail */
  uint8_t x[N * REPS], y[N * REPS], d[N * REPS];

  for (int r = 0; r < REPS; r++) {
    memcpy(x + r * N, a, N);
    memcpy(y + r * N, b, N);
  }
  for (size_t o = 0; o < HVD_ARRAY_SIZE(all_ops); o++) {
    hvd_reduce_op op = all_ops[o];
    const uint8_t *want = (op == HVD_MIN || op == HVD_PRODUCT) ? all : any;
    if (op == HVD_AVERAGE)
      continue;
    ops_reduce(d, x, y, N * REPS, HVD_BOOL, op);
    for (int i = 0; i < N * REPS; i++)
      ck_assert_msg(d[i] == want[i % N], "%s: %d op %d gave %d", hvd_reduce_op_name(op), x[i], y[i],
                    d[i]);
    memcpy(d, y, sizeof(d));
    ops_reduce(d, x, d, N * REPS, HVD_BOOL, op);
    for (int i = 0; i < N * REPS; i++)
      ck_assert_uint_eq(d[i], want[i % N]);
  }
}
END_TEST

/* ==== operand order of min and max ================================================= */

/* min is b < a ? b : a and max b > a ? b : a, also in the vector bodies: for
 * (+0, -0) and (x, NaN) the first operand wins, for (-0, +0) too. */
START_TEST(test_reduce_minmax_order) {
  enum { N = 67 };
  float af[N], bf[N], df[N];
  double ad[N], bd[N], dd[N];
  uint16_t ah[N], bh[N], dh[N];
  /* pairs: a, b, min, max; NAN as expected means "a NaN". */
  static const float pairs[][4] = {
      {0.0f, -0.0f, 0.0f, 0.0f},  {-0.0f, 0.0f, -0.0f, -0.0f},
      {NAN, 1.0f, NAN, NAN},      {1.0f, NAN, 1.0f, 1.0f},
      {2.0f, -3.0f, -3.0f, 2.0f}, {-INFINITY, INFINITY, -INFINITY, INFINITY},
  };
  for (size_t p = 0; p < HVD_ARRAY_SIZE(pairs); p++) {
    for (int op = HVD_MIN; op <= HVD_MAX; op++) {
      float want = pairs[p][op == HVD_MIN ? 2 : 3];
      for (int i = 0; i < N; i++) {
        af[i] = pairs[p][0];
        bf[i] = pairs[p][1];
        ad[i] = pairs[p][0];
        bd[i] = pairs[p][1];
        ah[i] = ops_float_to_half(pairs[p][0]);
        bh[i] = ops_float_to_half(pairs[p][1]);
      }
      ops_reduce(df, af, bf, N, HVD_FLOAT32, (hvd_reduce_op)op);
      ops_reduce(dd, ad, bd, N, HVD_FLOAT64, (hvd_reduce_op)op);
      ops_reduce(dh, ah, bh, N, HVD_FLOAT16, (hvd_reduce_op)op);
      for (int i = 0; i < N; i++) {
        float h = ops_half_to_float(dh[i]);
        if (isnan(want)) {
          ck_assert_msg(isnan(df[i]) && isnan(dd[i]) && isnan(h), "pair %zu: not NaN", p);
        } else {
          ck_assert_msg(f32_bits(df[i]) == f32_bits(want), "pair %zu op %d: float32 %a", p, op,
                        (double)df[i]);
          ck_assert_msg(f64_bits(dd[i]) == f64_bits((double)want), "pair %zu: float64", p);
          ck_assert_msg(f32_bits(h) == f32_bits(want), "pair %zu: float16", p);
        }
      }
    }
  }
}
END_TEST

/* ==== float16 and bfloat16 in reductions ============================================ */

START_TEST(test_reduce_half_rounding) {
  /* {a, b, op, expected}: float16 bits. */
  static const uint16_t cases[][4] = {
      {0x3c00, 0x1000, HVD_SUM, 0x3c00},     /* 1 + 2^-11: a tie, to even 1 */
      {0x3c01, 0x1000, HVD_SUM, 0x3c02},     /* (1 + 2^-10) + 2^-11: a tie, up to even */
      {0x3c00, 0x1001, HVD_SUM, 0x3c01},     /* just above the tie */
      {0x6800, 0x3c00, HVD_SUM, 0x6800},     /* 2048 + 1 = 2049: tie, to 2048 */
      {0x6801, 0x3c00, HVD_SUM, 0x6802},     /* 2050 + 1 = 2051: tie, to 2052 */
      {0x7bff, 0x4c00, HVD_SUM, 0x7c00},     /* 65504 + 16 = 65520: overflows to inf */
      {0x7bff, 0x4bf8, HVD_SUM, 0x7bff},     /* 65504 + 15.9375 */
      {0x7bff, 0x7bff, HVD_AVERAGE, 0x7c00}, /* 65504 + 65504 */
      {0xfbff, 0xfbff, HVD_SUM, 0xfc00},     /* -inf */
      {0x0001, 0x0001, HVD_SUM, 0x0002},     /* subnormals add exactly */
      {0x03ff, 0x0001, HVD_SUM, 0x0400},     /* into the normals */
      {0x0001, 0x3800, HVD_PRODUCT, 0x0000}, /* 2^-24 * 0.5: tie, to even 0 */
      {0x0001, 0x3e00, HVD_PRODUCT, 0x0002}, /* 2^-24 * 1.5: tie, to even 2 */
      {0x0003, 0x3800, HVD_PRODUCT, 0x0002}, /* 3 * 2^-25: tie, to even 2 */
      {0x5c00, 0x5c00, HVD_PRODUCT, 0x7c00}, /* 256^2 */
      {0x3c00, 0xbc00, HVD_SUM, 0x0000},     /* 1 + -1 = +0 */
      {0x7c00, 0xfc00, HVD_SUM, 0x7e00},     /* inf - inf: NaN (checked as NaN) */
  };
  enum { N = 41 };
  uint16_t a[N], b[N], d[N];
  for (size_t c = 0; c < HVD_ARRAY_SIZE(cases); c++) {
    for (int i = 0; i < N; i++) {
      a[i] = cases[c][0];
      b[i] = cases[c][1];
    }
    ops_reduce(d, a, b, N, HVD_FLOAT16, (hvd_reduce_op)cases[c][2]);
    for (int i = 0; i < N; i++) {
      if (ref_is_nan(F16, cases[c][3]))
        ck_assert_msg(ref_is_nan(F16, d[i]), "case %zu: 0x%04x is not NaN", c, d[i]);
      else
        ck_assert_msg(d[i] == cases[c][3], "case %zu: 0x%04x, expected 0x%04x", c, d[i],
                      cases[c][3]);
    }
  }
}
END_TEST

START_TEST(test_reduce_bf16_rounding) {
  static const uint16_t cases[][4] = {
      {0x3f80, 0x3b80, HVD_SUM, 0x3f80},     /* 1 + 2^-8: a tie, to even 1 */
      {0x3f81, 0x3b80, HVD_SUM, 0x3f82},     /* (1 + 2^-7) + 2^-8: a tie, up to even */
      {0x3f80, 0x3b81, HVD_SUM, 0x3f81},     /* just above the tie */
      {0x7f7f, 0x7f7f, HVD_SUM, 0x7f80},     /* max + max: inf */
      {0x7f7f, 0x3f80, HVD_PRODUCT, 0x7f7f}, /* max * 1 */
      {0x4040, 0x3fc0, HVD_PRODUCT, 0x4090}, /* 3 * 1.5 = 4.5 */
      {0x0001, 0x0001, HVD_SUM, 0x0002},     /* subnormals */
      {0x7fc1, 0x3f80, HVD_SUM, 0x7fc1},     /* NaN stays NaN */
  };
  enum { N = 41 };
  uint16_t a[N], b[N], d[N];
  for (size_t c = 0; c < HVD_ARRAY_SIZE(cases); c++) {
    for (int i = 0; i < N; i++) {
      a[i] = cases[c][0];
      b[i] = cases[c][1];
    }
    ops_reduce(d, a, b, N, HVD_BFLOAT16, (hvd_reduce_op)cases[c][2]);
    for (int i = 0; i < N; i++) {
      if (ref_is_nan(BF16, cases[c][3]))
        ck_assert_msg(ref_is_nan(BF16, d[i]), "case %zu: 0x%04x is not NaN", c, d[i]);
      else
        ck_assert_msg(d[i] == cases[c][3], "case %zu: 0x%04x, expected 0x%04x", c, d[i],
                      cases[c][3]);
    }
  }
}
END_TEST

/* ==== conversions ================================================================== */

START_TEST(test_half_roundtrip_exhaustive) {
  for (uint32_t h = 0; h <= 0xffff; h++) {
    float f = ops_half_to_float((uint16_t)h);
    double want = ref_decode(F16, (uint16_t)h);
    uint16_t back = ops_float_to_half(f);
    if (ref_is_nan(F16, (uint16_t)h)) {
      ck_assert_msg(isnan(f), "0x%04x: not NaN as float", h);
      ck_assert_msg(ref_is_nan(F16, back), "0x%04x: came back as 0x%04x", h, back);
      ck_assert_msg((back & 0x8000) == (h & 0x8000), "0x%04x: NaN lost its sign", h);
      if (h & 0x0200) /* a quiet NaN comes back as it was */
        ck_assert_msg(back == h, "quiet NaN 0x%04x came back as 0x%04x", h, back);
    } else {
      ck_assert_msg(f32_bits(f) == f32_bits((float)want), "0x%04x: %a, expected %a", h, (double)f,
                    want);
      ck_assert_msg(back == h, "0x%04x came back as 0x%04x", h, back);
    }
  }
}
END_TEST

/* float -> half against the reference at every midpoint between adjacent
 * halves and one float either side of it, and on random floats. */
START_TEST(test_half_from_float) {
  for (uint32_t h = 0; h < 0x7c00; h++) {
    double lo = ref_decode(F16, (uint16_t)h);
    double hi = h + 1 < 0x7c00 ? ref_decode(F16, (uint16_t)(h + 1)) : 65536.0;
    float mid = (float)((lo + hi) / 2); /* exact: 12 significant bits */
    float probes[] = {(float)lo, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
    ck_assert(mid == (lo + hi) / 2);
    for (size_t p = 0; p < HVD_ARRAY_SIZE(probes); p++) {
      for (int s = 0; s < 2; s++) {
        float f = s ? -probes[p] : probes[p];
        uint16_t got = ops_float_to_half(f), want = ref_encode(F16, f);
        ck_assert_msg(got == want, "%a: 0x%04x, expected 0x%04x", (double)f, got, want);
      }
    }
  }
  rng_seed(7);
  for (int i = 0; i < 1 << 20; i++) {
    float f = f32_from_bits((uint32_t)rng_next());
    uint16_t got = ops_float_to_half(f), want = ref_encode(F16, f);
    if (isnan(f))
      ck_assert_msg(ref_is_nan(F16, got), "%a: 0x%04x", (double)f, got);
    else
      ck_assert_msg(got == want, "%a: 0x%04x, expected 0x%04x", (double)f, got, want);
  }
}
END_TEST

START_TEST(test_half_special_values) {
  static const struct {
    float f;
    uint16_t h;
  } cases[] = {
      {1.0f, 0x3c00},
      {-2.0f, 0xc000},
      {0.0f, 0x0000},
      {-0.0f, 0x8000},
      {2049.0f, 0x6800}, /* tie: to even 2048 */
      {2051.0f, 0x6802}, /* tie: to even 2052 */
      {2050.0f, 0x6801},
      {65504.0f, 0x7bff},
      {65519.0f, 0x7bff},
      {65519.996f, 0x7bff},
      {65520.0f, 0x7c00}, /* the overflow threshold: a tie, to even = inf */
      {-65520.0f, 0xfc00},
      {1e10f, 0x7c00},
      {FLT_MAX, 0x7c00},
      {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00},
      {0x1p-14f, 0x0400},        /* smallest normal */
      {0x1.ff8p-15f, 0x03ff},    /* largest subnormal */
      {0x1.ffcp-15f, 0x0400},    /* tie between them: to even, the normal */
      {0x1p-24f, 0x0001},        /* smallest subnormal */
      {0x1p-25f, 0x0000},        /* tie: to even 0 */
      {0x1.000002p-25f, 0x0001}, /* just above */
      {0x1.8p-24f, 0x0002},      /* 1.5 quanta: tie, to even 2 */
      {0x1.4p-23f, 0x0002},      /* 2.5 quanta: tie, to even 2 */
      {-0x1p-26f, 0x8000},       /* underflow keeps the sign */
      {FLT_TRUE_MIN, 0x0000},
      {FLT_MIN, 0x0000},
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++)
    ck_assert_msg(ops_float_to_half(cases[i].f) == cases[i].h, "%a: 0x%04x, expected 0x%04x",
                  (double)cases[i].f, ops_float_to_half(cases[i].f), cases[i].h);
  ck_assert(ref_is_nan(F16, ops_float_to_half(NAN)));
  ck_assert(ref_is_nan(F16, ops_float_to_half(f32_from_bits(0x7f800001)))); /* signalling */
  ck_assert(ref_is_nan(F16, ops_float_to_half(f32_from_bits(0xffffffff))));
  ck_assert(ref_is_nan(F16, ops_float_to_half(f32_from_bits(0x7f802000))));
  ck_assert_uint_eq(ops_float_to_half(f32_from_bits(0xffffffff)) & 0x8000, 0x8000);
  ck_assert(ops_half_to_float(0x0001) == 0x1p-24f);
  ck_assert(ops_half_to_float(0x03ff) == 0x1.ff8p-15f);
  ck_assert(ops_half_to_float(0x7bff) == 65504.0f);
  ck_assert(ops_half_to_float(0xfc00) == -INFINITY);
  ck_assert(isnan(ops_half_to_float(0x7c01)));
  ck_assert(isnan(ops_half_to_float(0xfe00)));
}
END_TEST

START_TEST(test_bf16_roundtrip_exhaustive) {
  for (uint32_t b = 0; b <= 0xffff; b++) {
    float f = ops_bf16_to_float((uint16_t)b);
    uint16_t back = ops_float_to_bf16(f);
    if (ref_is_nan(BF16, (uint16_t)b)) {
      ck_assert_msg(isnan(f), "0x%04x: not NaN as float", b);
      ck_assert_msg(ref_is_nan(BF16, back), "0x%04x: came back as 0x%04x", b, back);
      ck_assert_msg((back & 0x8000) == (b & 0x8000), "0x%04x: NaN lost its sign", b);
      if (b & 0x0040)
        ck_assert_msg(back == b, "quiet NaN 0x%04x came back as 0x%04x", b, back);
    } else {
      ck_assert_msg(f32_bits(f) == b << 16, "0x%04x: %a", b, (double)f);
      ck_assert_msg(back == b, "0x%04x came back as 0x%04x", b, back);
    }
  }
}
END_TEST

START_TEST(test_bf16_from_float) {
  static const struct {
    uint32_t f;
    uint16_t b;
  } cases[] = {
      {0x3f800000, 0x3f80}, {0x3f808000, 0x3f80}, /* 1 + 2^-8: a tie, to even */
      {0x3f808001, 0x3f81},                       /* just above it */
      {0x3f818000, 0x3f82},                       /* a tie, up to even */
      {0x3f817fff, 0x3f81},                       /* just below it */
      {0xbf808000, 0xbf80}, {0x7f7fffff, 0x7f80}, /* FLT_MAX: inf */
      {0x7f7f7fff, 0x7f7f}, {0x7f7f8000, 0x7f80}, /* a tie at the top: to even, inf */
      {0x7f800000, 0x7f80}, {0xff800000, 0xff80},
      {0x00008000, 0x0000}, /* a subnormal tie, to even */
      {0x00018000, 0x0002}, /* a subnormal tie, up to even */
      {0x80000000, 0x8000},
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++)
    ck_assert_msg(ops_float_to_bf16(f32_from_bits(cases[i].f)) == cases[i].b,
                  "0x%08x: 0x%04x, expected 0x%04x", cases[i].f,
                  ops_float_to_bf16(f32_from_bits(cases[i].f)), cases[i].b);
  /* NaNs whose rounding would carry into infinity or into the sign. */
  static const uint32_t nans[] = {0x7f800001, 0x7f80ffff, 0x7fffffff,
                                  0xffffffff, 0xff800001, 0x7fc00000};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(nans); i++) {
    uint16_t b = ops_float_to_bf16(f32_from_bits(nans[i]));
    ck_assert_msg(ref_is_nan(BF16, b), "0x%08x: 0x%04x is not NaN", nans[i], b);
    ck_assert_uint_eq(b & 0x8000, (nans[i] >> 16) & 0x8000);
  }
  rng_seed(8);
  for (int i = 0; i < 1 << 20; i++) {
    float f = f32_from_bits((uint32_t)rng_next());
    uint16_t got = ops_float_to_bf16(f), want = ref_encode(BF16, f);
    if (isnan(f))
      ck_assert_msg(ref_is_nan(BF16, got), "%a: 0x%04x", (double)f, got);
    else
      ck_assert_msg(got == want, "%a: 0x%04x, expected 0x%04x", (double)f, got, want);
  }
}
END_TEST

/* ==== ops_scale ==================================================================== */

/* Scales n values of one type, also replicated over 35 elements (vector body
 * and tail), in place and out of place; checks each against want. */
#define CHECK_SCALE(T, dtype, factor, fmt_, ...)                                                   \
  do {                                                                                             \
    static const T in_[] = {__VA_ARGS__};                                                          \
    enum { N_ = HVD_ARRAY_SIZE(in_) / 2, R_ = 35, ALL_ = N_ * R_ };                                \
    T src_[ALL_], dst_[ALL_];                                                                      \
    for (int r_ = 0; r_ < R_; r_++)                                                                \
      for (int i_ = 0; i_ < N_; i_++)                                                              \
        src_[r_ * N_ + i_] = in_[2 * i_];                                                          \
    ops_scale(dst_, src_, ALL_, (dtype), (factor));                                                \
    for (int k_ = 0; k_ < ALL_; k_++)                                                              \
      ck_assert_msg(dst_[k_] == in_[2 * (k_ % N_) + 1],                                            \
                    "%s: " fmt_ " * %g = " fmt_ ", expected " fmt_, hvd_dtype_name(dtype),         \
                    src_[k_], (double)(factor), dst_[k_], in_[2 * (k_ % N_) + 1]);                 \
    ops_scale(src_, src_, ALL_, (dtype), (factor));                                                \
    ck_assert(memcmp(src_, dst_, sizeof(dst_)) == 0);                                              \
  } while (0)

START_TEST(test_scale_integers) {
  /* pairs: input, expected */
  CHECK_SCALE(int32_t, HVD_INT32, 0.5, "%d", 7, 3, -7, -3, 0, 0, 1, 0, -1, 0, INT32_MAX, 1073741823,
              INT32_MIN, -1073741824);
  CHECK_SCALE(int32_t, HVD_INT32, 2.0, "%d", INT32_MAX, INT32_MAX, INT32_MIN, INT32_MIN, 1073741823,
              2147483646, -1073741824, INT32_MIN, 5, 10);
  CHECK_SCALE(int32_t, HVD_INT32, 0.75, "%d", 9, 6, -9, -6, 3, 2, 1, 0);
  CHECK_SCALE(int32_t, HVD_INT32, NAN, "%d", 5, 0, -5, 0, 0, 0);
  CHECK_SCALE(int32_t, HVD_INT32, INFINITY, "%d", 5, INT32_MAX, -5, INT32_MIN, 0, 0);
  CHECK_SCALE(uint8_t, HVD_UINT8, 2.0, "%u", 200, 255, 100, 200, 127, 254, 128, 255, 0, 0);
  CHECK_SCALE(uint8_t, HVD_UINT8, 0.5, "%u", 7, 3, 255, 127, 1, 0);
  CHECK_SCALE(uint8_t, HVD_UINT8, -1.0, "%u", 3, 0, 0, 0);
  CHECK_SCALE(int8_t, HVD_INT8, 2.0, "%d", -100, -128, 100, 127, -64, -128, 63, 126);
  CHECK_SCALE(int8_t, HVD_INT8, 0.5, "%d", -7, -3, 7, 3, -128, -64, 127, 63);
  CHECK_SCALE(int8_t, HVD_INT8, -1.0, "%d", -128, 127, 127, -127);
  CHECK_SCALE(uint16_t, HVD_UINT16, 2.0, "%u", 40000, 65535, 30000, 60000);
  CHECK_SCALE(int16_t, HVD_INT16, 2.0, "%d", -20000, -32768, 20000, 32767, -7, -14);
  CHECK_SCALE(int16_t, HVD_INT16, 0.25, "%d", -7, -1, 7, 1, -32768, -8192);
  CHECK_SCALE(int64_t, HVD_INT64, 0.5, "%" PRId64, INT64_C(7), INT64_C(3), INT64_C(-7), INT64_C(-3),
              INT64_C(1) << 40, INT64_C(1) << 39, INT64_MIN, INT64_MIN / 2);
  CHECK_SCALE(int64_t, HVD_INT64, 2.0, "%" PRId64, INT64_MAX, INT64_MAX, INT64_MIN, INT64_MIN,
              INT64_C(1) << 61, INT64_C(1) << 62, -(INT64_C(1) << 62), INT64_MIN, INT64_C(1) << 62,
              INT64_MAX);
  CHECK_SCALE(int64_t, HVD_INT64, 1.0, "%" PRId64, INT64_MAX, INT64_MAX, INT64_MIN, INT64_MIN,
              INT64_C(-5), INT64_C(-5));
  CHECK_SCALE(int64_t, HVD_INT64, NAN, "%" PRId64, INT64_C(5), INT64_C(0));
  CHECK_SCALE(int64_t, HVD_INT64, -INFINITY, "%" PRId64, INT64_C(5), INT64_MIN, INT64_C(-5),
              INT64_MAX);
}
END_TEST

START_TEST(test_scale_floats) {
  CHECK_SCALE(float, HVD_FLOAT32, 0.5, "%g", 1.5f, 0.75f, -2.0f, -1.0f, 0.0f, 0.0f, FLT_MAX,
              FLT_MAX / 2, INFINITY, INFINITY);
  CHECK_SCALE(float, HVD_FLOAT32, 2.0, "%g", FLT_MAX, INFINITY, -3.0f, -6.0f);
  CHECK_SCALE(double, HVD_FLOAT64, 0.25, "%g", 1.0, 0.25, -8.0, -2.0, DBL_MAX, DBL_MAX / 4);
  /* float32 multiplies by (float)factor, float64 by factor. */
  CHECK_SCALE(float, HVD_FLOAT32, 0.1, "%a", 3.0f, 3.0f * 0.1f, 7.0f, 7.0f * 0.1f);
  CHECK_SCALE(double, HVD_FLOAT64, 0.1, "%a", 3.0, 3.0 * 0.1, 7.0, 7.0 * 0.1);
  /* float16 (pairs of bits) */
  CHECK_SCALE(uint16_t, HVD_FLOAT16, 0.5, "0x%04x", 0x4200, 0x3e00, /* 3 -> 1.5 */
              0x0001, 0x0000,                                       /* 2^-25: tie to 0 */
              0x0003, 0x0002,                                       /* 1.5 q: tie to 2 */
              0xfc00, 0xfc00, 0x8000, 0x8000);
  CHECK_SCALE(uint16_t, HVD_FLOAT16, 2.0, "0x%04x", 0x7bff, 0x7c00, 0x3c00, 0x4000);
  CHECK_SCALE(uint16_t, HVD_FLOAT16, 1.0 + 0x1p-11, "0x%04x", 0x3c00, 0x3c00, /* tie */
              0x3c01, 0x3c02);
  CHECK_SCALE(uint16_t, HVD_BFLOAT16, 0.5, "0x%04x", 0x4040, 0x3fc0, 0xc000, 0xbf80);
  CHECK_SCALE(uint16_t, HVD_BFLOAT16, 2.0, "0x%04x", 0x7f7f, 0x7f80, 0x0001, 0x0002);
  CHECK_SCALE(uint16_t, HVD_BFLOAT16, 1.0 + 0x1p-8, "0x%04x", 0x3f80, 0x3f80, 0x3f81, 0x3f82);
  {
    uint16_t h[40], b[40];
    for (int i = 0; i < 40; i++) {
      h[i] = 0x7e00;
      b[i] = 0x7fc0;
    }
    ops_scale(h, h, 40, HVD_FLOAT16, 3.0);
    ops_scale(b, b, 40, HVD_BFLOAT16, 3.0);
    for (int i = 0; i < 40; i++) {
      ck_assert(ref_is_nan(F16, h[i]));
      ck_assert(ref_is_nan(BF16, b[i]));
    }
  }
}
END_TEST

/* The reference of ops_scale for one element. */
static void ref_scale_one(hvd_dtype dtype, const uint8_t *src, uint8_t *dst, double factor) {
  int64_t lo = 0, hi = 0, iv = 0;
  switch (dtype) {
  case HVD_FLOAT32: {
    float x;
    memcpy(&x, src, 4);
    x = x * (float)factor;
    memcpy(dst, &x, 4);
    return;
  }
  case HVD_FLOAT64: {
    double x;
    memcpy(&x, src, 8);
    x = x * factor;
    memcpy(dst, &x, 8);
    return;
  }
  case HVD_FLOAT16:
  case HVD_BFLOAT16: {
    struct fmt f = dtype == HVD_FLOAT16 ? F16 : BF16;
    uint16_t h;
    memcpy(&h, src, 2);
    h = ref_encode(f, (float)ref_decode(f, h) * (float)factor);
    memcpy(dst, &h, 2);
    return;
  }
  case HVD_BOOL: *dst = *src; return;
  case HVD_UINT8: lo = 0, hi = UINT8_MAX, iv = *src; break;
  case HVD_INT8: lo = INT8_MIN, hi = INT8_MAX, iv = (int8_t)*src; break;
  case HVD_UINT16: {
    uint16_t v;
    memcpy(&v, src, 2);
    lo = 0, hi = UINT16_MAX, iv = v;
    break;
  }
  case HVD_INT16: {
    int16_t v;
    memcpy(&v, src, 2);
    lo = INT16_MIN, hi = INT16_MAX, iv = v;
    break;
  }
  case HVD_INT32: {
    int32_t v;
    memcpy(&v, src, 4);
    lo = INT32_MIN, hi = INT32_MAX, iv = v;
    break;
  }
  case HVD_INT64: memcpy(&iv, src, 8), lo = INT64_MIN, hi = INT64_MAX; break;
  }
  double v = (double)iv * factor;
  int64_t r;
  if (isnan(v))
    r = 0;
  else if (v <= (double)lo)
    r = lo;
  else if (v >= (double)hi)
    r = hi;
  else
    r = (int64_t)trunc(v);
  memcpy(dst, &r, hvd_dtype_size(dtype)); /* little-endian: the low bytes */
}

/* Every dtype, random data, several factors, both aliasing forms, guards. */
START_TEST(test_scale_reference) {
  static const double factors[] = {0.5, -0.37, 3.0, 1e6, -1e-3, 0.0};
  static const size_t counts[] = {1, 7, 1023};
  rng_seed(11);
  for (size_t d = 0; d < HVD_ARRAY_SIZE(all_dtypes); d++) {
    hvd_dtype dtype = all_dtypes[d];
    size_t es = hvd_dtype_size(dtype);
    for (size_t f = 0; f < HVD_ARRAY_SIZE(factors); f++) {
      for (size_t c = 0; c < HVD_ARRAY_SIZE(counts); c++) {
        size_t count = counts[c];
        struct buf src, dst, want;
        char what[64];
        snprintf(what, sizeof(what), "scale by %g, count %zu", factors[f], count);
        buf_init(&src, count, es, 1);
        buf_init(&dst, count, es, 1);
        buf_init(&want, count, es, 0);
        fill_random(dtype, src.p, count);
        for (size_t i = 0; i < count; i++)
          ref_scale_one(dtype, src.p + i * es, want.p + i * es, factors[f]);
        if (dtype == HVD_BOOL) /* not scaled: a copy */
          memcpy(want.p, src.p, count);
        ops_scale(dst.p, src.p, count, dtype, factors[f]);
        assert_elements(dtype, dst.p, want.p, count, what);
        buf_check_guards(&dst, what);
        ops_scale(src.p, src.p, count, dtype, factors[f]);
        assert_elements(dtype, src.p, want.p, count, what);
        buf_check_guards(&src, what);
        buf_fini(&want);
        buf_fini(&dst);
        buf_fini(&src);
      }
    }
  }
}
END_TEST

START_TEST(test_scale_zero_count) {
  uint8_t x = 9;
  for (size_t d = 0; d < HVD_ARRAY_SIZE(all_dtypes); d++)
    ops_scale(&x, &x, 0, all_dtypes[d], 2.0);
  ck_assert_uint_eq(x, 9);
}
END_TEST

/* ==== the suite ==================================================================== */

Suite *kernels_suite(void) {
  Suite *s = suite_create("kernels");
  TCase *tc = tcase_create("names");
  tcase_add_test(tc, test_dtype_names);
  tcase_add_test(tc, test_check_reduce_valid);
  tcase_add_test(tc, test_check_reduce_invalid);
  suite_add_tcase(s, tc);

  tc = tcase_create("reduce");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_reduce_reference, 0, HVD_DTYPE_COUNT);
  tcase_add_test(tc, test_reduce_integer_wrap);
  tcase_add_test(tc, test_reduce_bool);
  tcase_add_test(tc, test_reduce_minmax_order);
  tcase_add_test(tc, test_reduce_half_rounding);
  tcase_add_test(tc, test_reduce_bf16_rounding);
  suite_add_tcase(s, tc);

  tc = tcase_create("conversions");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_half_roundtrip_exhaustive);
  tcase_add_test(tc, test_half_from_float);
  tcase_add_test(tc, test_half_special_values);
  tcase_add_test(tc, test_bf16_roundtrip_exhaustive);
  tcase_add_test(tc, test_bf16_from_float);
  suite_add_tcase(s, tc);

  tc = tcase_create("scale");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_scale_integers);
  tcase_add_test(tc, test_scale_floats);
  tcase_add_test(tc, test_scale_reference);
  tcase_add_test(tc, test_scale_zero_count);
  suite_add_tcase(s, tc);
  return s;
}
