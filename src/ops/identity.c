/*
 * The identity element of each reduction, for ranks that contribute no
 * data (joined ranks): x op identity == x for every x.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ops.h"

/* One element of the identity into out (at most 8 bytes). */
static void identity_element(hvd_dtype dtype, hvd_reduce_op op, unsigned char *out) {
  bool smallest = op == HVD_MAX, largest = op == HVD_MIN;

  memset(out, 0, 8);
  if (op == HVD_SUM || op == HVD_AVERAGE || op == HVD_ADASUM) /* adasum(0, b) = b */
    return;
  switch (dtype) {
#define INT_CASE(D, T, LO, HI)                                                                     \
  case D: {                                                                                        \
    T v = op == HVD_PRODUCT ? (T)1 : smallest ? (T)(LO) : (T)(HI);                                 \
    memcpy(out, &v, sizeof(v));                                                                    \
    break;                                                                                         \
  }
    INT_CASE(HVD_UINT8, uint8_t, 0, UINT8_MAX)
    INT_CASE(HVD_INT8, int8_t, INT8_MIN, INT8_MAX)
    INT_CASE(HVD_UINT16, uint16_t, 0, UINT16_MAX)
    INT_CASE(HVD_INT16, int16_t, INT16_MIN, INT16_MAX)
    INT_CASE(HVD_INT32, int32_t, INT32_MIN, INT32_MAX)
    INT_CASE(HVD_INT64, int64_t, INT64_MIN, INT64_MAX)
#undef INT_CASE
  case HVD_FLOAT32: {
    float v = op == HVD_PRODUCT ? 1.0f : smallest ? -INFINITY : INFINITY;
    memcpy(out, &v, sizeof(v));
    break;
  }
  case HVD_FLOAT64: {
    double v = op == HVD_PRODUCT ? 1.0 : smallest ? -(double)INFINITY : (double)INFINITY;
    memcpy(out, &v, sizeof(v));
    break;
  }
  case HVD_FLOAT16: {
    uint16_t v = op == HVD_PRODUCT ? 0x3c00 : smallest ? 0xfc00 : 0x7c00;
    memcpy(out, &v, sizeof(v));
    break;
  }
  case HVD_BFLOAT16: {
    uint16_t v = op == HVD_PRODUCT ? 0x3f80 : smallest ? 0xff80 : 0x7f80;
    memcpy(out, &v, sizeof(v));
    break;
  }
  case HVD_BOOL:
    /* or (max) starts from false; and (min, product) from true */
    out[0] = (unsigned char)(largest || op == HVD_PRODUCT);
    break;
  }
}

void ops_fill_identity(void *buf, size_t count, hvd_dtype dtype, hvd_reduce_op op) {
  unsigned char one[8];
  size_t esize = hvd_dtype_size(dtype), filled, total = count * esize;

  if (count == 0 || esize == 0)
    return;
  identity_element(dtype, op, one);
  memcpy(buf, one, esize);
  /* Doubling copies: a memset-speed fill for any element size. */
  for (filled = esize; filled < total; filled *= 2)
    memcpy((char *)buf + filled, buf, filled < total - filled ? filled : total - filled);
}
