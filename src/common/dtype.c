/* Names and sizes of the public dtype and reduce-op enums, and of shapes. */
#include "common.h"

HVD_API size_t hvd_dtype_size(hvd_dtype dtype) {
  switch (dtype) {
  case HVD_UINT8:
  case HVD_INT8:
  case HVD_BOOL: return 1;
  case HVD_UINT16:
  case HVD_INT16:
  case HVD_FLOAT16:
  case HVD_BFLOAT16: return 2;
  case HVD_INT32:
  case HVD_FLOAT32: return 4;
  case HVD_INT64:
  case HVD_FLOAT64: return 8;
  }
  return 0;
}

HVD_API const char *hvd_dtype_name(hvd_dtype dtype) {
  switch (dtype) {
  case HVD_UINT8: return "uint8";
  case HVD_INT8: return "int8";
  case HVD_UINT16: return "uint16";
  case HVD_INT16: return "int16";
  case HVD_INT32: return "int32";
  case HVD_INT64: return "int64";
  case HVD_FLOAT16: return "float16";
  case HVD_BFLOAT16: return "bfloat16";
  case HVD_FLOAT32: return "float32";
  case HVD_FLOAT64: return "float64";
  case HVD_BOOL: return "bool";
  }
  return "unknown";
}

HVD_API const char *hvd_reduce_op_name(hvd_reduce_op op) {
  switch (op) {
  case HVD_SUM: return "sum";
  case HVD_AVERAGE: return "average";
  case HVD_MIN: return "min";
  case HVD_MAX: return "max";
  case HVD_PRODUCT: return "product";
  case HVD_ADASUM: return "adasum";
  }
  return "unknown";
}

bool hvd_shape_elements(const int64_t *shape, int ndims, int64_t *out) {
  int64_t n = 1;
  for (int i = 0; i < ndims; i++) {
    if (shape[i] < 0 || (shape[i] > 0 && n > INT64_MAX / shape[i]))
      return false;
    n *= shape[i];
  }
  *out = n;
  return true;
}
