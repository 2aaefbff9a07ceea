/*
 * IEEE binary16 and bfloat16 conversions, one value at a time, for callers
 * outside the reduction loops. DESIGN: the arithmetic lives in kernels.h as
 * branch-free inline functions shared with reduce.c and scale.c, whose loops
 * need it inlined to vectorize; this file only gives it linkable names.
 */
#include "kernels.h"
#include "ops.h"

float ops_half_to_float(uint16_t h) { return ops_f16_decode(h); }

uint16_t ops_float_to_half(float f) { return ops_f16_encode(f); }

float ops_bf16_to_float(uint16_t b) { return ops_bf16_decode(b); }

uint16_t ops_float_to_bf16(float f) { return ops_bf16_encode(f); }
