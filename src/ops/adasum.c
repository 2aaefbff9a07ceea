/*
 * Adasum: combines gradients so that their common part is not counted
 * twice. For two vectors a and b,
 *
 *     adasum(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
 *
 * (a coefficient is 1 where its vector's squared norm is below 1e-8), so
 * orthogonal gradients add and identical ones give the gradient itself.
 * Over n ranks it is applied pairwise up a binary tree: virtual ranks v and
 * v ^ 1 first, then the pairs' results with distance 2, and so on.
 *
 * Below HVD_ALLREDUCE_SMALL_BYTES partners swap whole vectors instead
 * (adasum_doubling). Otherwise the schedule is vector halving, distance
 * doubling. At distance d, rank v and its partner v ^ d hold the same
 * slice of their groups' vectors; the lower keeps the first half of it and
 * the upper the second, each sending the other half, so the slice halves
 * at every level. The dot products and
 * squared norms the coefficients need are over whole tensors: each rank
 * computes them over its slice, and the 2d ranks that together hold both
 * groups' vectors sum them by recursive doubling (the lower partner's sum
 * first, so every rank of the group gets the same bits). Each element is
 * combined by exactly one rank at each level and copied around in the end
 * (an allgather by distance halving), so every rank ends with the same
 * bits. Sums and coefficients are in float64 whatever the dtype; float16
 * and bfloat16 elements are combined in float and rounded once.
 *
 * A fused buffer holds several tensors: each gets its own dot products and
 * coefficients, so fusion does not change the result.
 *
 * n not a power of two: the first 2 * rem ranks fold in pairs (fold.c). The
 * odd rank of a pair combines the even one's whole vector with its own
 * (adasum(even, odd), dot products local), and the pair then takes part as
 * one virtual rank; so the tree's leaves at the lowest level are those
 * pairs. With n a power of two this is the plain tree.
 */
#include <math.h>
#include <string.h>

#include "ops_private.h"

enum { MAX_LEVELS = 32 };

/* The part of each tensor that a range of the buffer holds. */
struct tensors {
  const size_t *counts;
  size_t n;
};

static double load(const void *p, size_t i, hvd_dtype dtype) {
  switch (dtype) {
  case HVD_FLOAT16: return ops_half_to_float(((const uint16_t *)p)[i]);
  case HVD_BFLOAT16: return ops_bf16_to_float(((const uint16_t *)p)[i]);
  case HVD_FLOAT32: return ((const float *)p)[i];
  default: return ((const double *)p)[i];
  }
}

static void store(void *p, size_t i, hvd_dtype dtype, double v) {
  switch (dtype) {
  case HVD_FLOAT16: ((uint16_t *)p)[i] = ops_float_to_half((float)v); break;
  case HVD_BFLOAT16: ((uint16_t *)p)[i] = ops_float_to_bf16((float)v); break;
  case HVD_FLOAT32: ((float *)p)[i] = (float)v; break;
  default: ((double *)p)[i] = v; break;
  }
}

/* The three sums over n elements; float32 and float64 get loops of their
 * own (no conversion call per element). */
static void sums_of(const void *a, const void *b, size_t n, hvd_dtype dtype, double *out) {
  double dot = 0, aa = 0, bb = 0;
  if (dtype == HVD_FLOAT32) {
    const float *x = a, *y = b;
    for (size_t i = 0; i < n; i++) {
      double u = x[i], v = y[i];
      dot += u * v;
      aa += u * u;
      bb += v * v;
    }
  } else if (dtype == HVD_FLOAT64) {
    const double *x = a, *y = b;
    for (size_t i = 0; i < n; i++) {
      dot += x[i] * y[i];
      aa += x[i] * x[i];
      bb += y[i] * y[i];
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      double u = load(a, i, dtype), v = load(b, i, dtype);
      dot += u * v;
      aa += u * u;
      bb += v * v;
    }
  }
  out[0] = dot;
  out[1] = aa;
  out[2] = bb;
}

/* dst = ca * a + cb * b over n elements (dst may be a or b). */
static void scaled_add(void *dst, const void *a, const void *b, size_t n, hvd_dtype dtype,
                       double ca, double cb) {
  if (dtype == HVD_FLOAT32) {
    const float *x = a, *y = b;
    float *d = dst;
    for (size_t i = 0; i < n; i++)
      d[i] = (float)(ca * x[i] + cb * y[i]);
  } else if (dtype == HVD_FLOAT64) {
    const double *x = a, *y = b;
    double *d = dst;
    for (size_t i = 0; i < n; i++)
      d[i] = ca * x[i] + cb * y[i];
  } else {
    for (size_t i = 0; i < n; i++)
      store(dst, i, dtype, ca * load(a, i, dtype) + cb * load(b, i, dtype));
  }
}

/* For each tensor t that meets elements [lo, hi) of the buffer:
 * sums[3t..3t+2] = (a.b, |a|^2, |b|^2) over that part, where a and b hold
 * the range's elements (a[0] is element lo). */
static void partial_sums(const struct tensors *ts, size_t lo, size_t hi, const void *a,
                         const void *b, hvd_dtype dtype, double *sums) {
  size_t start = 0;
  for (size_t t = 0; t < ts->n; t++) {
    size_t end = start + ts->counts[t], from = start > lo ? start : lo, to = end < hi ? end : hi;
    size_t es = hvd_dtype_size(dtype), at = (from - lo) * es;
    sums_of((const char *)a + at, (const char *)b + at, to > from ? to - from : 0, dtype,
            sums + 3 * t);
    start = end;
  }
}

/* dst = ca * a + cb * b per tensor over elements [lo, hi), with each
 * tensor's coefficients from its whole-tensor sums. dst may be a or b. */
static void combine(const struct tensors *ts, size_t lo, size_t hi, void *dst, const void *a,
                    const void *b, hvd_dtype dtype, const double *sums) {
  size_t start = 0;
  for (size_t t = 0; t < ts->n; t++) {
    size_t end = start + ts->counts[t], from = start > lo ? start : lo, to = end < hi ? end : hi;
    double dot = sums[3 * t], aa = sums[3 * t + 1], bb = sums[3 * t + 2];
    double ca = aa >= 1e-8 ? 1.0 - dot / (2.0 * aa) : 1.0;
    double cb = bb >= 1e-8 ? 1.0 - dot / (2.0 * bb) : 1.0;
    size_t at = (from - lo) * hvd_dtype_size(dtype);
    if (to > from)
      scaled_add((char *)dst + at, (const char *)a + at, (const char *)b + at, to - from, dtype,
                 ca, cb);
    start = end;
  }
}

/* Sums n doubles over the 2^levels ranks that share this virtual rank's
 * bits from `levels` up, by recursive doubling; the lower partner's value
 * goes first, so every rank of the group ends with the same bits. */
static hvd_status group_sum(struct net_comm *c, const struct ops_fold *f, int levels,
                            double *sums, double *theirs, size_t n) {
  size_t bytes = n * sizeof(double);
  for (int k = 0; k < levels; k++) {
    int vpartner = f->vrank ^ (1 << k), partner = ops_fold_rank(f, vpartner);
    hvd_status st = net_sendrecv(c, partner, sums, bytes, partner, theirs, bytes);
    if (st != HVD_OK)
      return st;
    for (size_t i = 0; i < n; i++)
      sums[i] = vpartner < f->vrank ? theirs[i] + sums[i] : sums[i] + theirs[i];
  }
  return HVD_OK;
}

/* The odd rank of a fold pair: buf = adasum(even's vector, its own). */
static hvd_status fold_in(struct ops_ctx *o, struct net_comm *c, const struct ops_fold *f,
                          const struct tensors *ts, void *buf, size_t count, hvd_dtype dtype,
                          double *sums) {
  int r = net_comm_rank(c);
  size_t bytes = count * hvd_dtype_size(dtype);
  void *even;
  hvd_status st;

  if (f->sits_out) {
    st = net_send(c, r + 1, buf, bytes);
    return st == HVD_OK ? net_recv(c, r + 1, buf, bytes) : st;
  }
  if (!f->takes_in)
    return HVD_OK;
  if ((even = ops_scratch(o, SCRATCH_WORK, bytes + 64)) == NULL)
    return hvd_error_status();
  if ((st = net_recv(c, r - 1, even, bytes)) != HVD_OK)
    return st;
  partial_sums(ts, 0, count, even, buf, dtype, sums);
  combine(ts, 0, count, buf, even, buf, dtype, sums);
  return HVD_OK;
}

/* Adasum of buf (this rank's vector, count elements) over c, in place. */
static hvd_status adasum_flat(struct ops_ctx *o, struct net_comm *c, const struct tensors *ts,
                              void *buf, size_t count, hvd_dtype dtype) {
  size_t esize = hvd_dtype_size(dtype), lo = 0, hi = count;
  size_t stack_lo[MAX_LEVELS], stack_hi[MAX_LEVELS];
  int level = 0;
  double *sums = (double *)ops_scratch(o, SCRATCH_GATHER, 2 * 3 * ts->n * sizeof(double) + 64);
  char *tmp = ops_scratch(o, SCRATCH_TMP, (count / 2 + 1) * esize + 64), *b = buf;
  struct ops_fold f;
  hvd_status st;

  if (sums == NULL || tmp == NULL)
    return hvd_error_status();
  ops_fold_plan(net_comm_size(c), net_comm_rank(c), &f);
  if ((st = fold_in(o, c, &f, ts, buf, count, dtype, sums)) != HVD_OK || f.sits_out)
    return st;
  for (int d = 1; d < f.p && st == HVD_OK; d *= 2, level++) {
    int vpartner = f.vrank ^ d, partner = ops_fold_rank(&f, vpartner);
    bool low = f.vrank < vpartner;
    size_t mid = lo + (hi - lo) / 2;
    size_t keep_lo = low ? lo : mid, keep_hi = low ? mid : hi;
    size_t send_lo = low ? mid : lo, send_hi = low ? hi : mid;
    char *mine = b + keep_lo * esize;

    stack_lo[level] = lo;
    stack_hi[level] = hi;
    st = net_sendrecv(c, partner, b + send_lo * esize, (send_hi - send_lo) * esize, partner, tmp,
                      (keep_hi - keep_lo) * esize);
    if (st != HVD_OK)
      break;
    /* a is the lower group's vector, b the upper's. */
    partial_sums(ts, keep_lo, keep_hi, low ? mine : tmp, low ? tmp : mine, dtype, sums);
    st = group_sum(c, &f, level + 1, sums, sums + 3 * ts->n, 3 * ts->n);
    if (st == HVD_OK)
      combine(ts, keep_lo, keep_hi, mine, low ? mine : tmp, low ? tmp : mine, dtype, sums);
    lo = keep_lo;
    hi = keep_hi;
  }
  /* Allgather by distance halving: undo the last split first. */
  for (int d = f.p / 2; d >= 1 && st == HVD_OK; d /= 2) {
    int partner = ops_fold_rank(&f, f.vrank ^ d);
    size_t plo = stack_lo[--level], phi = stack_hi[level];
    size_t other_lo = lo == plo ? hi : plo, other_hi = lo == plo ? phi : lo;
    st = net_sendrecv(c, partner, b + lo * esize, (hi - lo) * esize, partner, b + other_lo * esize,
                      (other_hi - other_lo) * esize);
    lo = plo;
    hi = phi;
  }
  return st == HVD_OK ? ops_fold_out(c, &f, buf, count * esize) : st;
}

/* Small buffers: latency matters more than bytes. At distance d a rank
 * and its partner swap whole vectors and both compute adasum(lower's,
 * upper's) with the same operands in the same order, so they end with the
 * same bits: log2(p) exchanges and no separate sums. */
static hvd_status adasum_doubling(struct ops_ctx *o, struct net_comm *c,
                                  const struct tensors *ts, void *buf, size_t count,
                                  hvd_dtype dtype) {
  size_t bytes = count * hvd_dtype_size(dtype);
  double *sums = (double *)ops_scratch(o, SCRATCH_GATHER, 3 * ts->n * sizeof(double) + 64);
  char *theirs = ops_scratch(o, SCRATCH_TMP, bytes + 64);
  struct ops_fold f;
  hvd_status st;

  if (sums == NULL || theirs == NULL)
    return hvd_error_status();
  ops_fold_plan(net_comm_size(c), net_comm_rank(c), &f);
  if ((st = fold_in(o, c, &f, ts, buf, count, dtype, sums)) != HVD_OK || f.sits_out)
    return st;
  for (int d = 1; d < f.p && st == HVD_OK; d *= 2) {
    int vpartner = f.vrank ^ d, partner = ops_fold_rank(&f, vpartner);
    bool low = f.vrank < vpartner;
    if ((st = net_sendrecv(c, partner, buf, bytes, partner, theirs, bytes)) != HVD_OK)
      break;
    partial_sums(ts, 0, count, low ? buf : theirs, low ? theirs : buf, dtype, sums);
    combine(ts, 0, count, buf, low ? buf : theirs, low ? theirs : buf, dtype, sums);
  }
  return st == HVD_OK ? ops_fold_out(c, &f, buf, bytes) : st;
}

/* Which schedule: whole-vector doubling below HVD_ALLREDUCE_SMALL_BYTES
 * (and when there are fewer elements than ranks), else halving. */
static hvd_status adasum_run(struct ops_ctx *o, struct net_comm *c, const struct tensors *ts,
                             void *buf, size_t count, hvd_dtype dtype) {
  if (count * hvd_dtype_size(dtype) < o->t.allreduce_small_bytes ||
      count < (size_t)net_comm_size(c))
    return adasum_doubling(o, c, ts, buf, count, dtype);
  return adasum_flat(o, c, ts, buf, count, dtype);
}

/* The dtype, the scale factors, the size, and tensor counts that add up. */
static hvd_status check_args(size_t count, hvd_dtype dtype, const struct tensors *ts,
                             double prescale, double postscale) {
  size_t total = 0, bytes;
  hvd_status st = ops_check_reduce(dtype, HVD_ADASUM, prescale, postscale);
  if (st == HVD_OK)
    st = ops_bytes(count, dtype, &bytes);
  if (st != HVD_OK)
    return st;
  for (size_t t = 0; t < ts->n; t++)
    total += ts->counts[t];
  if (ts->n == 0 || total != count)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "adasum: the tensors' counts add up to %zu, the buffer holds %zu", total,
                     count);
  return HVD_OK;
}

/* out = prescale * in, the start of every variant. */
static void start(const void *in, void *out, size_t count, hvd_dtype dtype, double prescale) {
  if (prescale != 1.0)
    ops_scale(out, in, count, dtype, prescale);
  else if (in != out)
    memcpy(out, in, count * hvd_dtype_size(dtype));
}

hvd_status ops_adasum(struct ops_ctx *o, struct net_comm *c, const void *in, void *out,
                      size_t count, hvd_dtype dtype, const size_t *tensor_counts,
                      size_t ntensors, double prescale, double postscale) {
  struct tensors ts = {tensor_counts, ntensors};
  hvd_status st = check_args(count, dtype, &ts, prescale, postscale);

  if (st != HVD_OK || count == 0)
    return st;
  start(in, out, count, dtype, prescale);
  if (net_comm_size(c) > 1)
    st = adasum_run(o, c, &ts, out, count, dtype);
  if (st == HVD_OK && postscale != 1.0)
    ops_scale(out, out, count, dtype, postscale);
  return st;
}

/* The host's average (a plain allreduce, the same bits on every local
 * rank), Adasum across hosts among the local roots, and the result
 * broadcast within the host. */
hvd_status ops_adasum_hierarchical(struct ops_ctx *o, const struct ops_layout *l,
                                   const void *in, void *out, size_t count, hvd_dtype dtype,
                                   const size_t *tensor_counts, size_t ntensors,
                                   double prescale, double postscale) {
  struct tensors ts = {tensor_counts, ntensors};
  int per;
  hvd_status st = check_args(count, dtype, &ts, prescale, postscale);

  if (st != HVD_OK || count == 0)
    return st;
  if (!ops_use_hierarchical(o, l, &per))
    return ops_adasum(o, l->global, in, out, count, dtype, tensor_counts, ntensors, prescale,
                      postscale);
  st = ops_allreduce(o, l->local, in, out, count, dtype, HVD_AVERAGE, prescale, 1.0);
  if (st == HVD_OK && net_comm_rank(l->local) == 0)
    st = adasum_run(o, l->cross, &ts, out, count, dtype);
  if (st == HVD_OK)
    st = ops_broadcast(o, l->local, out, count, dtype, 0);
  if (st == HVD_OK && postscale != 1.0)
    ops_scale(out, out, count, dtype, postscale);
  return st;
}
