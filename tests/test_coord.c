/*
 * Multi-process tests of the public API and the coordinator: forked ranks
 * (see coord_harness.h) call hvd's collectives through include/hvd/hvd.h
 * and check every value against a reference computed from every rank's
 * input. Inputs are small integers, so every reduction order gives the
 * same bits. Suites: collectives, async, errors, join, sets, lifecycle.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "coord_harness.h"
#include "stranger.h"
#include "transport/transport_private.h" /* the control connections */

Suite *coord_units_suite(void);
Suite *coord_timeline_suite(void);

/* ==== values ====================================================================== */

static const hvd_dtype all_dtypes[] = {HVD_UINT8,    HVD_INT8,    HVD_UINT16,  HVD_INT16,
                                       HVD_INT32,    HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                       HVD_FLOAT32,  HVD_FLOAT64, HVD_BOOL};

static bool is_float(hvd_dtype t) {
  return t == HVD_FLOAT16 || t == HVD_BFLOAT16 || t == HVD_FLOAT32 || t == HVD_FLOAT64;
}

/* Rank r's element i: small enough that sums and products stay exact in
 * every dtype (bool: 0 or 1; products: 1 or 2). */
static double value(hvd_dtype t, hvd_reduce_op op, int r, size_t i) {
  if (t == HVD_BOOL)
    return (double)((r + i) % 3 == 0);
  if (op == HVD_PRODUCT)
    return (double)(1 + (r + i) % 2);
  return (double)((r + 1) * (int)(i % 7 + 1) % 23);
}

static double reduce(hvd_dtype t, hvd_reduce_op op, int size, size_t i, int skip) {
  double acc = 0;
  bool first = true;
  int n = 0;
  for (int r = 0; r < size; r++) {
    double v = value(t, op, r, i);
    if (r == skip)
      continue;
    n++;
    if (first) {
      acc = v;
      first = false;
      continue;
    }
    switch (op) {
    case HVD_SUM:
    case HVD_AVERAGE: acc = t == HVD_BOOL ? (acc != 0 || v != 0) : acc + v; break;
    case HVD_MIN: acc = v < acc ? v : acc; break;
    case HVD_MAX: acc = v > acc ? v : acc; break;
    case HVD_PRODUCT: acc = t == HVD_BOOL ? (acc != 0 && v != 0) : acc * v; break;
    case HVD_ADASUM: ck_abort_msg("adasum is not element-wise (see the adasum suite)"); break;
    }
  }
  (void)n;
  if (op == HVD_AVERAGE)
    acc = is_float(t) ? acc / size : (double)(int64_t)(acc / size);
  return acc;
}

static size_t elements(const int64_t *shape, int ndims) {
  size_t n = 1;
  for (int i = 0; i < ndims; i++)
    n *= (size_t)shape[i];
  return n;
}

/* A global allreduce of one int (for agreement checks). */
static hvd_status allreduce_int(int v, hvd_reduce_op op, int *out) {
  int64_t shape[1] = {1};
  int32_t in = v, res = 0;
  hvd_tensor t = {NULL, HVD_INT32, 1, shape, &in, &res};
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_status st;
  o.op = op;
  st = hvd_allreduce(&t, &o);
  *out = res;
  return st;
}

/* ==== collectives ===================================================================== */

static int check_allreduce(int rank, int size, hvd_dtype t, hvd_reduce_op op, const int64_t *shape,
                           int ndims, bool in_place) {
  size_t n = elements(shape, ndims), es = hvd_dtype_size(t);
  unsigned char *in = malloc(n * es + 1), *out = malloc(n * es + 1);
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_tensor tensor = {NULL, t, ndims, shape, in, in_place ? in : out};
  int code = 0;
  hvd_status st;

  for (size_t i = 0; i < n; i++)
    element_put(t, in, i, value(t, op, rank, i));
  o.op = op;
  st = hvd_allreduce(&tensor, &o);
  if (st != HVD_OK)
    code = report(EXIT_FAILED, "allreduce %s %s ndims %d: %s", hvd_dtype_name(t),
                  hvd_reduce_op_name(op), ndims, hvd_last_error_message());
  for (size_t i = 0; i < n && code == 0; i++) {
    double want = reduce(t, op, size, i, -1);
    double got = element_get(t, tensor.output, i);
    if (got != want)
      code = report(EXIT_WRONG, "allreduce %s %s ndims %d%s: element %zu is %g, want %g",
                    hvd_dtype_name(t), hvd_reduce_op_name(op), ndims, in_place ? " in place" : "",
                    i, got, want);
  }
  free(in);
  free(out);
  return code;
}

static int allreduce_values(int rank, int size, void *arg) {
  static const int64_t shapes[][3] = {{1, 1, 1}, {17, 1, 1}, {3, 4, 5}, {2, 0, 3}};
  static const int ndims[] = {0, 1, 3, 3};
  static const hvd_reduce_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX, HVD_PRODUCT};
  int code;
  (void)arg;

  for (size_t d = 0; d < HVD_ARRAY_SIZE(all_dtypes); d++) {
    for (size_t s = 0; s < HVD_ARRAY_SIZE(ndims); s++) {
      for (size_t o = 0; o < HVD_ARRAY_SIZE(ops); o++) {
        if (all_dtypes[d] == HVD_BOOL && ops[o] == HVD_AVERAGE)
          continue;
        code = check_allreduce(rank, size, all_dtypes[d], ops[o], shapes[s], ndims[s], s == 1);
        if (code != 0)
          return code;
      }
    }
  }
  return 0;
}

/* Prescale and postscale on floats: (v * 0.5) summed, times 4; 33
 * elements go through a collective, 8 are reduced inline by rank 0. */
static int allreduce_scaled(int rank, int size, void *arg) {
  static const hvd_dtype floats[] = {HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_FLOAT64};
  int64_t shape[1] = {33};
  (void)arg;

  for (size_t d = 0; d < 2 * HVD_ARRAY_SIZE(floats); d++) {
    hvd_dtype t = floats[d % HVD_ARRAY_SIZE(floats)];
    shape[0] = d < HVD_ARRAY_SIZE(floats) ? 33 : 8;
    unsigned char in[33 * 8], out[33 * 8];
    hvd_tensor tensor = {"scaled", t, 1, shape, in, out};
    hvd_options o = HVD_OPTIONS_INIT;
    o.prescale = 0.5;
    o.postscale = 4.0;
    for (size_t i = 0; i < (size_t)shape[0]; i++)
      element_put(t, in, i, value(t, HVD_SUM, rank, i));
    CALL(hvd_allreduce(&tensor, &o));
    for (size_t i = 0; i < (size_t)shape[0]; i++) {
      double want = 2.0 * reduce(t, HVD_SUM, size, i, -1);
      EXPECT(element_get(t, out, i) == want, "scaled %s element %zu: %g, want %g", hvd_dtype_name(t), i,
             element_get(t, out, i), want);
    }
  }
  return 0;
}

/* Small named allreduces every step, as a training loop's metrics: after
 * the first step they travel as cache bits with their values, and each
 * step's result must be that step's. */
static int metrics_each_step(int rank, int size, void *arg) {
  static const hvd_reduce_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX};
  static const char *const names[] = {"metric.sum", "metric.avg", "metric.min", "metric.max"};
  int64_t shape[1] = {2};
  (void)arg;

  for (int step = 0; step < 6; step++) {
    double in[4][2], out[4][2];
    hvd_handle h[4];
    for (int k = 0; k < 4; k++) {
      hvd_tensor t = {names[k], HVD_FLOAT64, 1, shape, in[k], out[k]};
      hvd_options o = HVD_OPTIONS_INIT;
      o.op = ops[k];
      in[k][0] = step * 10 + rank;
      in[k][1] = -step - rank * 3;
      CALL(hvd_allreduce_async(&t, &o, &h[k]));
    }
    for (int k = 0; k < 4; k++) {
      double sum0 = step * 10.0 * size + size * (size - 1) / 2.0;
      double sum1 = -(double)step * size - 3.0 * size * (size - 1) / 2.0;
      double want[4][2] = {{sum0, sum1},
                           {sum0 / size, sum1 / size},
                           {step * 10.0, -step - 3.0 * (size - 1)},
                           {step * 10.0 + size - 1, -(double)step}};
      CALL(hvd_handle_wait(h[k]));
      hvd_handle_release(h[k]);
      EXPECT(out[k][0] == want[k][0] && out[k][1] == want[k][1],
             "step %d %s: [%g, %g], want [%g, %g]", step, names[k], out[k][0], out[k][1],
             want[k][0], want[k][1]);
    }
  }
  return 0;
}

/* A loop of small allreduces (three dtypes; sum, scaled average, max) in a
 * one-host job: after the first steps they complete through lanes, with
 * the results rank 0 would give. Now and then one rank falls behind by
 * longer than HVD_SPIN_US: that step goes to rank 0 on every rank, and the
 * lanes come back. With HVD_SHM_LANES=0 none is used. */
static int lanes_steps(int rank, int size, void *arg) {
  bool lanes = *(const bool *)arg;
  int64_t s3[1] = {3}, s2[1] = {2}, s5[1] = {5};

  for (int step = 0; step < 300; step++) {
    float f[3], fo[3];
    double d[2], dout[2];
    int32_t n[5], nout[5];
    hvd_tensor t[3] = {{"lanes.f32", HVD_FLOAT32, 1, s3, f, fo},
                       {"lanes.f64", HVD_FLOAT64, 1, s2, d, dout},
                       {"lanes.i32", HVD_INT32, 1, s5, n, nout}};
    hvd_options o[3] = {HVD_OPTIONS_INIT, HVD_OPTIONS_INIT, HVD_OPTIONS_INIT};
    hvd_handle h[3];

    o[1].op = HVD_AVERAGE;
    o[1].prescale = 2.0;
    o[1].postscale = 0.5;
    o[2].op = HVD_MAX;
    for (int i = 0; i < 5; i++) {
      if (i < 3)
        f[i] = (float)(rank + step + i);
      if (i < 2)
        d[i] = rank * 0.25 + i;
      n[i] = rank * 10 + step % 7 + i;
    }
    if (step % 60 == 30 && rank == (step / 60) % size)
      usleep(5000); /* longer than a lane waits */
    for (int k = 0; k < 3; k++)
      CALL(hvd_allreduce_async(&t[k], &o[k], &h[k]));
    for (int k = 0; k < 3; k++) {
      CALL(hvd_handle_wait(h[k]));
      hvd_handle_release(h[k]);
    }
    for (int i = 0; i < 5; i++) {
      if (i < 3)
        EXPECT(fo[i] == (float)(size * (step + i) + size * (size - 1) / 2),
               "step %d: f32[%d] is %g", step, i, (double)fo[i]);
      if (i < 2)
        EXPECT(fabs(dout[i] - (0.125 * (size - 1) + i)) < 1e-12, "step %d: f64[%d] is %.17g",
               step, i, dout[i]);
      EXPECT(nout[i] == (size - 1) * 10 + step % 7 + i, "step %d: i32[%d] is %d", step, i,
             (int)nout[i]);
    }
  }
  /* How many depends on the machine's load. Ranks that outnumber the
   * cores may never meet within a lane's wait: there only the results
   * count. */
  if (!lanes)
    EXPECT(lane_completions() == 0, "%llu submissions went through lanes with HVD_SHM_LANES=0",
           (unsigned long long)lane_completions());
  else if (size <= sysconf(_SC_NPROCESSORS_ONLN))
    EXPECT(lane_completions() > 0, "no submission went through lanes");
  return 0;
}

START_TEST(small_allreduces_through_lanes) {
  bool lanes = _i < 5;
  /* A lane waits HVD_SPIN_US for the others: more than the default, for
   * ranks that outnumber the cores or run under a sanitizer. */
  job.env[0] = "HVD_SPIN_US=2000";
  if (!lanes)
    job.env[1] = "HVD_SHM_LANES=0";
  run_ok(lanes ? _i : 2, lanes_steps, &lanes);
}
END_TEST

static int allgather_values(int rank, int size, void *arg) {
  static const hvd_dtype types[] = {HVD_UINT8, HVD_INT64, HVD_FLOAT16, HVD_FLOAT32};
  (void)arg;

  for (size_t d = 0; d < HVD_ARRAY_SIZE(types); d++) {
    for (int variant = 0; variant < 2; variant++) {
      hvd_dtype t = types[d];
      /* rank r gives r + 1 rows (variant 1: rank 0 gives none) of 2 x 3 */
      int64_t rows = variant == 1 && rank == 0 ? 0 : rank + 1;
      int64_t shape[3] = {rows, 2, 3}, got_shape[HVD_MAX_DIMS];
      size_t n = (size_t)rows * 6, es = hvd_dtype_size(t), bytes = 0, total_rows = 0, at = 0;
      unsigned char *in = malloc(n * es + 1);
      hvd_tensor tensor = {NULL, t, 3, shape, in, NULL};
      hvd_handle h;
      void *out;
      for (size_t i = 0; i < n; i++)
        element_put(t, in, i, (double)((rank * 7 + (int)i) % 50));
      CALL(hvd_allgather_async(&tensor, NULL, &h));
      CALL(hvd_handle_wait(h));
      CALL(hvd_handle_output(h, &out, &bytes, got_shape));
      for (int r = 0; r < size; r++)
        total_rows += variant == 1 && r == 0 ? 0 : (size_t)r + 1;
      EXPECT(got_shape[0] == (int64_t)total_rows && got_shape[1] == 2 && got_shape[2] == 3,
             "allgather shape [%lld, %lld, %lld], want [%zu, 2, 3]", (long long)got_shape[0],
             (long long)got_shape[1], (long long)got_shape[2], total_rows);
      EXPECT(bytes == total_rows * 6 * es, "allgather output of %zu bytes", bytes);
      for (int r = 0; r < size; r++) {
        size_t rn = (variant == 1 && r == 0 ? 0 : (size_t)r + 1) * 6;
        for (size_t i = 0; i < rn; i++, at++) {
          double want = (double)((r * 7 + (int)i) % 50);
          EXPECT(element_get(t, out, at) == want, "allgather %s: element %zu of rank %d: %g, want %g",
                 hvd_dtype_name(t), i, r, element_get(t, out, at), want);
        }
      }
      hvd_handle_release(h);
      free(in);
    }
  }
  return 0;
}

static int broadcast_values(int rank, int size, void *arg) {
  int64_t shape[2] = {5, 7};
  (void)arg;

  for (int root = 0; root < size; root++) {
    for (int in_place = 0; in_place < 2; in_place++) {
      double in[35], out[35];
      hvd_tensor t = {NULL, HVD_FLOAT64, 2, shape, in, in_place ? in : out};
      hvd_options o = HVD_OPTIONS_INIT;
      o.root = root;
      for (int i = 0; i < 35; i++)
        in[i] = rank * 1000 + i;
      CALL(hvd_broadcast(&t, &o));
      for (int i = 0; i < 35; i++)
        EXPECT(((double *)t.output)[i] == root * 1000 + i, "broadcast from %d: element %d is %g",
               root, i, ((double *)t.output)[i]);
    }
  }
  return 0;
}

static int alltoall_values(int rank, int size, void *arg) {
  (void)arg;
  for (int even = 0; even < 2; even++) {
    int32_t splits[16];
    int64_t rows = 0, shape[2], got_shape[HVD_MAX_DIMS];
    /* rank r sends (r + p) % 3 rows to rank p; even: 2 rows to everybody */
    for (int p = 0; p < size; p++) {
      splits[p] = even ? 2 : (rank + p) % 3;
      rows += splits[p];
    }
    rows += even ? 0 : 1; /* a row nobody gets */
    shape[0] = rows;
    shape[1] = 2;
    int32_t *in = malloc((size_t)rows * 2 * sizeof(int32_t) + 1);
    hvd_tensor t = {NULL, HVD_INT32, 2, shape, in, NULL};
    int64_t at = 0;
    for (int p = 0; p < size; p++) {
      for (int k = 0; k < splits[p]; k++, at++) {
        in[at * 2] = rank * 1000 + p * 100 + k;
        in[at * 2 + 1] = -(rank * 1000 + p * 100 + k);
      }
    }
    if (!even) {
      in[at * 2] = 99999;
      in[at * 2 + 1] = 99999;
    }
    hvd_handle h;
    const int32_t *recv;
    size_t nrecv, bytes;
    int32_t *out;
    CALL(hvd_alltoall_async(&t, even ? NULL : splits, NULL, &h));
    CALL(hvd_handle_wait(h));
    CALL(hvd_handle_output(h, (void **)&out, &bytes, got_shape));
    CALL(hvd_handle_received_splits(h, &recv, &nrecv));
    EXPECT(nrecv == (size_t)size, "%zu received splits", nrecv);
    at = 0;
    for (int r = 0; r < size; r++) {
      int want = even ? 2 : (r + rank) % 3;
      EXPECT(recv[r] == want, "received %d rows from rank %d, want %d", recv[r], r, want);
      for (int k = 0; k < want; k++, at++) {
        EXPECT(out[at * 2] == r * 1000 + rank * 100 + k && out[at * 2 + 1] == -out[at * 2],
               "alltoall row %lld: %d %d", (long long)at, out[at * 2], out[at * 2 + 1]);
      }
    }
    EXPECT(got_shape[0] == at && got_shape[1] == 2, "alltoall shape [%lld, %lld]",
           (long long)got_shape[0], (long long)got_shape[1]);
    EXPECT(bytes == (size_t)at * 2 * sizeof(int32_t), "alltoall output of %zu bytes", bytes);
    hvd_handle_release(h);
    free(in);
  }
  return 0;
}

static int reducescatter_values(int rank, int size, void *arg) {
  (void)arg;
  for (int dim0 = 1; dim0 <= 2 * size + 1; dim0 += size) {
    for (int avg = 0; avg < 2; avg++) {
      int64_t shape[2] = {dim0, 3};
      int64_t mine = hvd_reducescatter_rows(dim0, HVD_PROCESS_SET_GLOBAL);
      int64_t first = 0;
      float *in = malloc((size_t)dim0 * 3 * sizeof(float));
      float *out = malloc((size_t)(mine > 0 ? mine : 1) * 3 * sizeof(float));
      hvd_tensor t = {NULL, HVD_FLOAT32, 2, shape, in, out};
      hvd_options o = HVD_OPTIONS_INIT;
      o.op = avg ? HVD_AVERAGE : HVD_SUM;
      for (int r = 0; r < rank; r++)
        first += dim0 / size + (r < dim0 % size);
      EXPECT(mine == dim0 / size + (rank < dim0 % size), "rank gets %lld rows of %d",
             (long long)mine, dim0);
      for (int i = 0; i < dim0 * 3; i++)
        in[i] = (float)value(HVD_FLOAT32, HVD_SUM, rank, (size_t)i);
      CALL(hvd_reducescatter(&t, &o));
      for (int64_t i = 0; i < mine * 3; i++) {
        double want = reduce(HVD_FLOAT32, o.op, size, (size_t)(first * 3 + i), -1);
        EXPECT(out[i] == (float)want, "reducescatter %d rows: element %lld is %g, want %g", dim0,
               (long long)i, out[i], want);
      }
      free(in);
      free(out);
    }
  }
  return 0;
}

static int grouped_values(int rank, int size, void *arg) {
  enum { N = 6 };
  hvd_tensor ts[N];
  int64_t shapes[N];
  float *bufs[N];
  char names[N][32];
  (void)arg;

  for (int step = 0; step < 3; step++) {
    for (int k = 0; k < N; k++) {
      shapes[k] = k * 1000 + 1;
      bufs[k] = malloc((size_t)shapes[k] * sizeof(float));
      for (int64_t i = 0; i < shapes[k]; i++)
        bufs[k][i] = (float)value(HVD_FLOAT32, HVD_SUM, rank, (size_t)(i + k));
      snprintf(names[k], sizeof(names[k]), "group.%d", k);
      ts[k] = (hvd_tensor){names[k], HVD_FLOAT32, 1, &shapes[k], bufs[k], bufs[k]};
    }
    CALL(hvd_grouped_allreduce(ts, N, NULL));
    for (int k = 0; k < N; k++) {
      for (int64_t i = 0; i < shapes[k]; i++) {
        double want = reduce(HVD_FLOAT32, HVD_SUM, size, (size_t)(i + k), -1);
        EXPECT(bufs[k][i] == (float)want, "group tensor %d element %lld: %g, want %g", k,
               (long long)i, bufs[k][i], want);
      }
      free(bufs[k]);
    }
  }
  return 0;
}

/* Rank r gives r + k rows of 2 to tensor k (rank 0 none to tensor 0); the
 * second step uses generated names. Tensor 1's output is taken over. */
static int grouped_gather_values(int rank, int size, void *arg) {
  enum { N = 3 };
  static const hvd_dtype types[N] = {HVD_FLOAT32, HVD_INT64, HVD_BFLOAT16};
  (void)arg;

  for (int step = 0; step < 2; step++) {
    hvd_tensor ts[N];
    int64_t shapes[N][2], got[HVD_MAX_DIMS];
    unsigned char *in[N];
    char names[N][32];
    void *taken = NULL, *out;
    size_t bytes;
    hvd_handle h;
    for (int k = 0; k < N; k++) {
      size_t es = hvd_dtype_size(types[k]);
      shapes[k][0] = rank + k;
      shapes[k][1] = 2;
      in[k] = malloc((size_t)(rank + k) * 2 * es + 1);
      for (int i = 0; i < (rank + k) * 2; i++)
        element_put(types[k], in[k], (size_t)i, rank * 10 + k + i);
      snprintf(names[k], sizeof(names[k]), "gathered.%d", k);
      ts[k] = (hvd_tensor){step == 0 ? names[k] : NULL, types[k], 2, shapes[k], in[k], NULL};
    }
    CALL(hvd_grouped_allgather_async(ts, N, NULL, &h));
    CALL(hvd_handle_wait(h));
    for (int k = 0; k < N; k++) {
      size_t at = 0, want_rows = 0;
      if (k == 1) {
        CALL(hvd_handle_take_output(h, (size_t)k, &taken, &bytes, got));
        out = taken;
      } else {
        CALL(hvd_handle_output_at(h, (size_t)k, &out, &bytes, got));
      }
      for (int r = 0; r < size; r++)
        want_rows += (size_t)(r + k);
      EXPECT(got[0] == (int64_t)want_rows && got[1] == 2 &&
                 bytes == want_rows * 2 * hvd_dtype_size(types[k]),
             "grouped allgather tensor %d: shape [%lld, %lld], %zu bytes", k, (long long)got[0],
             (long long)got[1], bytes);
      for (int r = 0; r < size; r++) {
        for (int i = 0; i < (r + k) * 2; i++, at++)
          EXPECT(element_get(types[k], out, at) == r * 10 + k + i,
                 "grouped allgather tensor %d, rank %d, element %d: %g", k, r, i,
                 element_get(types[k], out, at));
      }
    }
    EXPECT(hvd_handle_output_at(h, N, &out, NULL, NULL) == HVD_ERR_INVALID_ARGUMENT,
           "an output past the group");
    EXPECT(hvd_handle_output_at(h, 1, &out, NULL, NULL) == HVD_ERR_PRECONDITION,
           "an output that was taken");
    hvd_handle_release(h);
    hvd_output_free(taken); /* still valid after the release */
    for (int k = 0; k < N; k++)
      free(in[k]);
  }
  return 0;
}

/* Tensor k has k * size + 1 rows of 3 floats; every tensor's share checked. */
static int grouped_scatter_values(int rank, int size, void *arg) {
  enum { N = 3 };
  hvd_tensor ts[N];
  int64_t shapes[N][2], mine[N], first[N];
  float *in[N], *out[N];
  hvd_options o = HVD_OPTIONS_INIT;
  (void)arg;

  o.op = HVD_AVERAGE;
  for (int k = 0; k < N; k++) {
    int64_t dim0 = k * size + 1;
    shapes[k][0] = dim0;
    shapes[k][1] = 3;
    mine[k] = hvd_reducescatter_rows(dim0, HVD_PROCESS_SET_GLOBAL);
    first[k] = 0;
    for (int r = 0; r < rank; r++)
      first[k] += dim0 / size + (r < dim0 % size);
    in[k] = malloc((size_t)dim0 * 3 * sizeof(float));
    out[k] = malloc((size_t)(mine[k] > 0 ? mine[k] : 1) * 3 * sizeof(float));
    for (int i = 0; i < dim0 * 3; i++)
      in[k][i] = (float)value(HVD_FLOAT32, HVD_SUM, rank, (size_t)(i + k));
    ts[k] = (hvd_tensor){NULL, HVD_FLOAT32, 2, shapes[k], in[k], out[k]};
  }
  CALL(hvd_grouped_reducescatter(ts, N, &o));
  for (int k = 0; k < N; k++) {
    for (int64_t i = 0; i < mine[k] * 3; i++) {
      double want = reduce(HVD_FLOAT32, HVD_AVERAGE, size, (size_t)(first[k] * 3 + i + k), -1);
      EXPECT(out[k][i] == (float)want, "grouped reducescatter tensor %d element %lld: %g, want %g",
             k, (long long)i, out[k][i], want);
    }
    free(in[k]);
    free(out[k]);
  }
  return 0;
}

/* Empty tensors come without buffers (NULL, as hvd.h allows) and travel
 * with others: fused into an allreduce, alone in an alltoall and an
 * allgather. Under the sanitizers, no copy may touch NULL. */
static int empty_without_buffers(int rank, int size, void *arg) {
  int64_t big_shape[1] = {300}, empty_shape[2] = {0, 5};
  float big[300];
  hvd_tensor ts[2] = {{"empty.big", HVD_FLOAT32, 1, big_shape, big, big},
                      {"empty.none", HVD_FLOAT32, 2, empty_shape, NULL, NULL}};
  int32_t splits[16] = {0};
  hvd_handle h[2];
  void *out;
  size_t bytes;
  int64_t shape[HVD_MAX_DIMS];
  (void)arg;

  for (int i = 0; i < 300; i++)
    big[i] = (float)(rank + i);
  CALL(hvd_allreduce_async(&ts[0], NULL, &h[0]));
  CALL(hvd_allreduce_async(&ts[1], NULL, &h[1]));
  CALL(hvd_handle_wait(h[0]));
  CALL(hvd_handle_wait(h[1]));
  hvd_handle_release(h[0]);
  hvd_handle_release(h[1]);
  EXPECT(big[7] == (float)(size * 7 + size * (size - 1) / 2), "fused with an empty tensor: %g",
         big[7]);
  CALL(hvd_alltoall_async(&ts[1], splits, NULL, &h[0]));
  CALL(hvd_handle_wait(h[0]));
  CALL(hvd_handle_output(h[0], &out, &bytes, shape));
  EXPECT(bytes == 0 && out != NULL && shape[0] == 0 && shape[1] == 5, "empty alltoall output");
  hvd_handle_release(h[0]);
  CALL(hvd_allgather_async(&ts[1], NULL, &h[0]));
  CALL(hvd_handle_wait(h[0]));
  CALL(hvd_handle_output(h[0], &out, &bytes, shape));
  EXPECT(bytes == 0 && shape[0] == 0, "empty allgather output");
  hvd_handle_release(h[0]);
  return 0;
}

START_TEST(empty_tensors_without_buffers) { run_ok(_i, empty_without_buffers, NULL); }
END_TEST

/* hvd_allreduce_wait_for's four outcomes: completed in time (released, no
 * handle), still running (its handle), refused (the preset pointer kept)
 * and failed (the operation's message, no handle). */
static int allreduce_waits_for(int rank, int size, void *arg) {
  hvd_handle sentinel = (hvd_handle)&sentinel, pending = sentinel;
  int64_t shape[1] = {3};
  int32_t in[3], out[3] = {0};
  hvd_tensor t = {"wait_for", HVD_INT32, 1, shape, in, out};
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_status st;
  (void)arg;

  for (int step = 0; step < 20; step++) { /* repeated: cached, then through lanes */
    for (int i = 0; i < 3; i++)
      in[i] = (rank + 1) * (i + step);
    pending = sentinel;
    st = hvd_allreduce_wait_for(&t, &o, 60000, &pending);
    EXPECT(st == HVD_OK && pending == NULL, "step %d: %s, pending %p: %s", step,
           hvd_strerror(st), (void *)pending, hvd_last_error_message());
    for (int i = 0; i < 3; i++)
      EXPECT(out[i] == size * (size + 1) / 2 * (i + step), "step %d element %d: %d", step, i,
             out[i]);
  }
  /* Still running: the last rank comes 300 ms late. */
  if (rank == size - 1)
    usleep(300 * 1000);
  t.name = "wait_for.late";
  pending = sentinel;
  st = hvd_allreduce_wait_for(&t, &o, rank == 0 ? 10 : 60000, &pending);
  if (rank == 0) {
    EXPECT(st == HVD_ERR_TIMEOUT && pending != NULL && pending != sentinel,
           "late: %s, pending %p (want a timeout and the handle)", hvd_strerror(st),
           (void *)pending);
    CALL(hvd_handle_wait(pending));
    hvd_handle_release(pending);
  } else {
    EXPECT(st == HVD_OK && pending == NULL, "late: %s: %s", hvd_strerror(st),
           hvd_last_error_message());
  }
  /* Refused: nothing submitted, the pointer untouched. */
  pending = sentinel;
  st = hvd_allreduce_wait_for(NULL, &o, 1000, &pending);
  EXPECT(st == HVD_ERR_INVALID_ARGUMENT && pending == sentinel, "no tensor: %s, pending %p",
         hvd_strerror(st), (void *)pending);
  EXPECT(hvd_allreduce_wait_for(&t, &o, 1000, NULL) == HVD_ERR_INVALID_ARGUMENT,
         "no pending pointer accepted");
  /* Failed: ranks disagree on the shape. */
  t.name = "wait_for.disputed";
  shape[0] = rank == size - 1 ? 2 : 3;
  pending = sentinel;
  st = hvd_allreduce_wait_for(&t, &o, 60000, &pending);
  EXPECT(st == HVD_ERR_MISMATCH && pending == NULL &&
             strstr(hvd_last_error_message(), "wait_for.disputed") != NULL,
         "disputed: %s, pending %p: %s", hvd_strerror(st), (void *)pending,
         hvd_last_error_message());
  return 0;
}

START_TEST(allreduce_wait_for_outcomes) { run_ok(_i, allreduce_waits_for, NULL); }
END_TEST

START_TEST(allreduce_all_types) { run_ok(_i, allreduce_values, NULL); }
END_TEST
START_TEST(allreduce_scale_factors) { run_ok(_i, allreduce_scaled, NULL); }
END_TEST

/* Without inline reduction, small allreduces run their collectives. */
START_TEST(allreduce_all_types_no_inline) {
  job.env[0] = "HVD_INLINE_BYTES=0";
  run_ok(_i, allreduce_values, NULL);
}
END_TEST

START_TEST(small_allreduces_each_step) { run_ok(_i, metrics_each_step, NULL); }
END_TEST

START_TEST(small_allreduces_each_step_no_cache) {
  job.env[0] = "HOROVOD_CACHE_CAPACITY=0";
  run_ok(_i, metrics_each_step, NULL);
}
END_TEST
START_TEST(allgather_variable) { run_ok(_i, allgather_values, NULL); }
END_TEST
START_TEST(broadcast_every_root) { run_ok(_i, broadcast_values, NULL); }
END_TEST
START_TEST(alltoall_splits) { run_ok(_i, alltoall_values, NULL); }
END_TEST
START_TEST(reducescatter_shares) { run_ok(_i, reducescatter_values, NULL); }
END_TEST
START_TEST(grouped_allreduce) { run_ok(_i, grouped_values, NULL); }
END_TEST

START_TEST(grouped_allgather) { run_ok(_i, grouped_gather_values, NULL); }
END_TEST

START_TEST(grouped_reducescatter) { run_ok(_i, grouped_scatter_values, NULL); }
END_TEST

/* ==== many tensors in flight ============================================================ */

enum { ASYNC_TENSORS = 120, ASYNC_STEPS = 4 };

struct async_run {
  int rank;
  int step;
  int first, stride; /* this thread submits order[first], order[first + stride], ... */
  const int *order;
  float **bufs;
  hvd_handle *handles;
  atomic_int *callbacks;
  hvd_status status;
  char message[512];
};

static int64_t async_elements(int k) { return (k * 7919) % 20000 + (k % 5 == 0 ? 300000 : 1); }

static void count_callback(hvd_handle h, hvd_status st, void *arg) {
  (void)h;
  if (st == HVD_OK)
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void *submit_some(void *arg) {
  struct async_run *a = arg;
  for (int j = a->first; j < ASYNC_TENSORS; j += a->stride) {
    int k = a->order[j];
    char name[32];
    int64_t shape[1] = {async_elements(k)};
    hvd_tensor t = {name, HVD_FLOAT32, 1, shape, a->bufs[k], a->bufs[k]};
    hvd_options o = HVD_OPTIONS_INIT;
    o.callback = count_callback;
    o.callback_arg = a->callbacks;
    snprintf(name, sizeof(name), "grad.%d", k);
    a->status = hvd_allreduce_async(&t, &o, &a->handles[k]);
    if (a->status != HVD_OK) {
      snprintf(a->message, sizeof(a->message), "%s: %s", name, hvd_last_error_message());
      break;
    }
  }
  return NULL;
}

static int async_out_of_order(int rank, int size, void *arg) {
  float *bufs[ASYNC_TENSORS];
  hvd_handle handles[ASYNC_TENSORS];
  int order[ASYNC_TENSORS];
  atomic_int callbacks;
  (void)arg;

  for (int step = 0; step < ASYNC_STEPS; step++) {
    unsigned seed = (unsigned)(rank * 7907 + step * 104729 + 1);
    pthread_t threads[2];
    struct async_run runs[2];
    atomic_init(&callbacks, 0);
    for (int k = 0; k < ASYNC_TENSORS; k++) {
      int64_t n = async_elements(k);
      order[k] = k;
      bufs[k] = malloc((size_t)n * sizeof(float));
      for (int64_t i = 0; i < n; i++)
        bufs[k][i] = (float)value(HVD_FLOAT32, HVD_SUM, rank, (size_t)(i + k + step));
    }
    for (int k = ASYNC_TENSORS - 1; k > 0; k--) { /* a different order on every rank */
      int j = (int)(rand_r(&seed) % (unsigned)(k + 1)), tmp = order[k];
      order[k] = order[j];
      order[j] = tmp;
    }
    for (int t = 0; t < 2; t++) {
      runs[t] = (struct async_run){rank, step, t, 2, order, bufs, handles, &callbacks, HVD_OK, ""};
      EXPECT(pthread_create(&threads[t], NULL, submit_some, &runs[t]) == 0, "pthread_create");
    }
    for (int t = 0; t < 2; t++) {
      pthread_join(threads[t], NULL);
      EXPECT(runs[t].status == HVD_OK, "step %d: enqueue failed: %s", step, runs[t].message);
    }
    for (int k = 0; k < ASYNC_TENSORS; k++) {
      hvd_status st = hvd_handle_wait(handles[k]);
      EXPECT(st == HVD_OK, "step %d: grad.%d: %s", step, k, hvd_last_error_message());
      EXPECT(hvd_handle_poll(handles[k]) == 1, "a completed handle polls 0");
      hvd_handle_release(handles[k]);
      for (int64_t i = 0; i < async_elements(k); i++) {
        double want = reduce(HVD_FLOAT32, HVD_SUM, size, (size_t)(i + k + step), -1);
        EXPECT(bufs[k][i] == (float)want, "step %d grad.%d element %lld: %g, want %g", step, k,
               (long long)i, bufs[k][i], want);
      }
      free(bufs[k]);
    }
    EXPECT(atomic_load(&callbacks) == ASYNC_TENSORS, "step %d: %d callbacks for %d tensors", step,
           atomic_load(&callbacks), ASYNC_TENSORS);
  }
  return 0;
}

/* Settings the async test runs under, one per loop index. */
static const char *const async_settings[][3] = {
    {NULL},
    {"HOROVOD_FUSION_THRESHOLD=0", NULL},
    {"HOROVOD_CACHE_CAPACITY=0", NULL},
    {"HOROVOD_CACHE_CAPACITY=7", "HOROVOD_FUSION_THRESHOLD=65536", NULL}, /* evictions */
    {"HOROVOD_CYCLE_TIME=0", "HVD_FUSION_INPLACE_BYTES=0", NULL},
    {"HOROVOD_CYCLE_TIME=5", "HVD_SPIN_US=0", NULL},
};

START_TEST(async_in_flight) {
  for (int i = 0; async_settings[_i][i] != NULL; i++)
    job.env[i] = async_settings[_i][i];
  run_ok(3, async_out_of_order, NULL);
}
END_TEST

/* Settings that must agree come from rank 0: a worker that differs warns
 * and follows (without that, cache bits and fused layouts would differ). */
START_TEST(settings_follow_rank_0) {
  job.rank_env[1][0] = "HOROVOD_CACHE_CAPACITY=0";
  job.rank_env[1][1] = "HVD_FUSION_INPLACE_BYTES=0";
  job.rank_env[1][2] = "HVD_INLINE_BYTES=0";
  job.rank_env[2][0] = "HOROVOD_CACHE_CAPACITY=3";
  run_ok(3, async_out_of_order, NULL);
}
END_TEST

static int never_runs(int rank, int size, void *arg) {
  (void)arg;
  return report(1, "rank %d of %d started although the settings differ", rank, size);
}

/* Settings every rank must have alike (how the collectives cut and order
 * their messages) fail hvd_init on the ranks that differ, naming the
 * variable and both values, instead of a hang or a wrong sum later. */
/* Runs a job of two ranks whose hvd_init must fail on both, and returns
 * what they wrote on stderr. */
static void both_fail_to_start(char *text, size_t size) {
  char path[] = "/tmp/hvd-test-settings-XXXXXX";
  int codes[2], saved = dup(STDERR_FILENO), fd = mkstemp(path);
  ssize_t n;

  ck_assert_int_ge(fd, 0);
  fflush(stderr);
  dup2(fd, STDERR_FILENO); /* the ranks' messages, to read back */
  run_ranks(2, never_runs, NULL, codes, 30);
  fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  n = pread(fd, text, size - 1, 0);
  close(fd);
  unlink(path);
  ck_assert_int_gt(n, 0);
  text[n] = '\0';
  ck_assert_int_eq(codes[0], EXIT_SETUP);
  ck_assert_int_eq(codes[1], EXIT_SETUP);
}

START_TEST(settings_must_match) {
  char text[4096];
  job.rank_env[1][0] = "HVD_RING_WINDOW=8";
  both_fail_to_start(text, sizeof(text));
  ck_assert_msg(strstr(text, "HVD_RING_WINDOW is 4 here but 8 on rank 1: every rank must have "
                             "the same value") != NULL,
                "%s", text);
  ck_assert_msg(strstr(text, "HVD_RING_WINDOW is 8 here but 4 on rank 0") != NULL, "%s", text);
}
END_TEST

/* HVD_SHM differing is said by every rank when they meet in the store,
 * before any of them waits for a shared-memory set-up (it was a timeout
 * on one side and a generic message on the other), whichever rank has it
 * off. */
START_TEST(shm_must_match) {
  char text[4096], here[64], there[64];
  int off = _i; /* the rank with HVD_SHM=0 */
  job.timeout_s = 60; /* a wait for the set-up would outlast the test's deadline */
  job.rank_env[off][0] = "HVD_SHM=0";
  both_fail_to_start(text, sizeof(text));
  snprintf(here, sizeof(here), "HVD_SHM is 1 here but 0 on rank %d", off);
  snprintf(there, sizeof(there), "HVD_SHM is 0 here but 1 on rank %d", 1 - off);
  ck_assert_msg(strstr(text, here) != NULL && strstr(text, there) != NULL, "%s", text);
}
END_TEST

/* Long request and response lists cross at once (small socket buffers,
 * long names): neither side may block the other. */
static int long_lists(int rank, int size, void *arg) {
  enum { N = 600 };
  static char names[N][2048];
  static float vals[N];
  hvd_handle handles[N];
  int64_t shape[1] = {1};
  (void)arg;
  for (int step = 0; step < 2; step++) {
    for (int k = 0; k < N; k++) {
      int j = (k * 7 + rank * 13 + step) % N; /* a different order per rank */
      hvd_tensor t = {names[j], HVD_FLOAT32, 1, shape, &vals[j], &vals[j]};
      memset(names[j], 'a' + j % 26, sizeof(names[j]) - 16);
      snprintf(names[j] + sizeof(names[j]) - 16, 16, ".%d.%d", j, step);
      vals[j] = (float)(rank + j);
      CALL(hvd_allreduce_async(&t, NULL, &handles[j]));
    }
    for (int j = 0; j < N; j++) {
      CALL(hvd_handle_wait(handles[j]));
      hvd_handle_release(handles[j]);
      EXPECT(vals[j] == (float)(size * j + size * (size - 1) / 2), "tensor %d: %g", j, vals[j]);
    }
  }
  return 0;
}

START_TEST(long_lists_cross) {
  job.env[0] = "HVD_SOCKET_BUFFER_BYTES=65536";
  job.env[1] = "HOROVOD_CYCLE_TIME=20";
  job.timeout_s = 10;
  run_ok(3, long_lists, NULL);
}
END_TEST

/* Generated names: each rank calls in the same order; several user threads
 * use names of their own at the same time. */
struct thread_arg {
  int rank, size, id;
  int code;
};

static void *blocking_calls(void *arg) {
  struct thread_arg *a = arg;
  for (int k = 0; k < 40 && a->code == 0; k++) {
    char name[32];
    int64_t shape[1] = {100 + a->id};
    double buf[104];
    hvd_tensor t = {name, HVD_FLOAT64, 1, shape, buf, buf};
    snprintf(name, sizeof(name), "thread%d.%d", a->id, k);
    for (int i = 0; i < shape[0]; i++)
      buf[i] = a->rank + i + k;
    if (hvd_allreduce(&t, NULL) != HVD_OK) {
      a->code = report(EXIT_FAILED, "%s: %s", name, hvd_last_error_message());
      break;
    }
    for (int i = 0; i < shape[0]; i++) {
      double want = (double)a->size * (i + k) + a->size * (a->size - 1) / 2.0;
      if (buf[i] != want) {
        a->code = report(EXIT_WRONG, "%s element %d: %g, want %g", name, i, buf[i], want);
        break;
      }
    }
    if (hvd_rank() != a->rank || hvd_size() != a->size)
      a->code = report(EXIT_WRONG, "rank or size changed");
  }
  return NULL;
}

static int many_threads(int rank, int size, void *arg) {
  struct thread_arg args[4];
  pthread_t threads[4];
  (void)arg;
  for (int t = 0; t < 4; t++) {
    args[t] = (struct thread_arg){rank, size, t, 0};
    EXPECT(pthread_create(&threads[t], NULL, blocking_calls, &args[t]) == 0, "pthread_create");
  }
  for (int t = 0; t < 4; t++) {
    pthread_join(threads[t], NULL);
    if (args[t].code != 0)
      return args[t].code;
  }
  return 0;
}

START_TEST(user_threads) { run_ok(3, many_threads, NULL); }
END_TEST

/* ==== errors ============================================================================ */

enum mismatch {
  MM_SHAPE,
  MM_NDIMS,
  MM_DTYPE,
  MM_OP,
  MM_PRESCALE,
  MM_POSTSCALE,
  MM_ROOT,
  MM_TYPE,
  MM_ALLGATHER_DIMS,
  MM_COUNT
};

static const char *const mismatch_words[] = {
    "mismatched shapes",       "mismatched shapes",         "mismatched data types",
    "mismatched reduction",    "mismatched scale factors",  "mismatched scale factors",
    "mismatched broadcast roots", "mismatched operations",  "mismatched shapes"};

static int mismatches(int rank, int size, void *arg) {
  int odd = size - 1; /* the rank that disagrees */
  (void)arg;

  for (int m = 0; m < MM_COUNT; m++) {
    float in[24] = {0}, out[24];
    int64_t shape[2] = {4, 1};
    hvd_tensor t = {"disputed", HVD_FLOAT32, 1, shape, in, out};
    hvd_options o = HVD_OPTIONS_INIT;
    hvd_handle h;
    hvd_status st;
    char want_a[32];
    const char *msg;
    bool me = rank == odd;

    switch (m) {
    case MM_SHAPE: shape[0] = me ? 5 : 4; break;
    case MM_NDIMS: t.ndims = me ? 2 : 1; break;
    case MM_DTYPE: t.dtype = me ? HVD_INT32 : HVD_FLOAT32; break;
    case MM_OP: o.op = me ? HVD_MAX : HVD_SUM; break;
    case MM_PRESCALE: o.prescale = me ? 2.0 : 1.0; break;
    case MM_POSTSCALE: o.postscale = me ? 0.5 : 1.0; break;
    case MM_ROOT: o.root = me ? 1 : 0; break;
    default: break;
    }
    if (m == MM_ROOT)
      st = hvd_broadcast_async(&t, &o, &h);
    else if (m == MM_TYPE)
      st = me ? hvd_broadcast_async(&t, &o, &h) : hvd_allreduce_async(&t, &o, &h);
    else if (m == MM_ALLGATHER_DIMS) {
      t.ndims = 2;
      shape[1] = me ? 3 : 2;
      st = hvd_allgather_async(&t, &o, &h);
    } else
      st = hvd_allreduce_async(&t, &o, &h);
    CALL(st);
    st = hvd_handle_wait(h);
    msg = hvd_last_error_message();
    EXPECT(st == HVD_ERR_MISMATCH, "case %d: status %s (%s), want a mismatch", m, hvd_strerror(st),
           msg);
    /* It names the rank that disagrees (and the first one that submitted). */
    snprintf(want_a, sizeof(want_a), "rank %d", odd);
    EXPECT(strstr(msg, mismatch_words[m]) != NULL && strstr(msg, want_a) != NULL &&
               strstr(msg, "disputed") != NULL,
           "case %d: the message does not name the mismatch, the tensor and the ranks: %s", m,
           msg);
    hvd_handle_release(h);
    /* The job goes on. */
    int sum = 0;
    CALL(allreduce_int(1, HVD_SUM, &sum));
    EXPECT(sum == size, "after case %d: allreduce gave %d", m, sum);
  }
  return 0;
}

START_TEST(mismatch_reported_everywhere) { run_ok(_i, mismatches, NULL); }
END_TEST

/* The broadcast through which the last rank learns that rank 0 has the
 * others' requests of step 2: each rank's requests reach rank 0 in the
 * order it made them, so once every rank's broadcast is in, so are their
 * cache hits (unless a lane holds one back: then the order is open). */
static int broadcast_go(void) {
  int64_t shape[1] = {1};
  int32_t go = 1;
  hvd_tensor t = {"cached.then.changed.go", HVD_INT32, 1, shape, &go, &go};
  CALL(hvd_broadcast(&t, NULL));
  return 0;
}

/* A cached operation one rank submits with another shape, after the others
 * submitted it as cache hits (the last rank waits for broadcast_go, so
 * theirs are in): rank 0 moves their submissions out of the bit it retires,
 * and every rank fails with the mismatch instead of waiting for each
 * other. Then the name runs again with the new shape everywhere. */
static int changed_after_cached(int rank, int size, void *arg) {
  int odd = size - 1, code;
  (void)arg;

  for (int step = 0; step < 4; step++) {
    float in[8], out[8];
    int64_t shape[1] = {step == 2 && rank == odd ? 8 : step == 3 ? 8 : 4};
    hvd_tensor t = {"cached.then.changed", HVD_FLOAT32, 1, shape, in, out};
    hvd_handle h;
    hvd_status st;

    for (int i = 0; i < 8; i++)
      in[i] = (float)(rank + i);
    if (step == 2 && rank == odd && (code = broadcast_go()) != 0)
      return code;
    CALL(hvd_allreduce_async(&t, NULL, &h));
    if (step == 2 && rank != odd && (code = broadcast_go()) != 0)
      return code;
    st = hvd_handle_wait(h);
    if (step == 2) {
      EXPECT(st == HVD_ERR_MISMATCH && strstr(hvd_last_error_message(), "mismatched shapes"),
             "step 2: status %s (%s), want a mismatch", hvd_strerror(st),
             hvd_last_error_message());
    } else {
      EXPECT(st == HVD_OK, "step %d: %s", step, hvd_last_error_message());
      for (int i = 0; i < (int)shape[0]; i++)
        EXPECT(out[i] == (float)(size * i + size * (size - 1) / 2), "step %d element %d: %g",
               step, i, out[i]);
    }
    hvd_handle_release(h);
  }
  return 0;
}

/* Sizes 2 and 3, with lanes and without (where the order is certain). */
START_TEST(cached_then_changed_fails_everywhere) {
  if (_i >= 2)
    job.env[0] = "HVD_SHM_LANES=0";
  run_ok(2 + _i % 2, changed_after_cached, NULL);
}
END_TEST

static int duplicates(int rank, int size, void *arg) {
  int64_t shape[1] = {3};
  float in[3] = {1, 2, 3}, out[3], out2[3];
  hvd_tensor t = {"dup", HVD_FLOAT32, 1, shape, in, out};
  hvd_tensor t2 = {"dup", HVD_FLOAT32, 1, shape, in, out2};
  hvd_handle h, h2 = NULL;
  hvd_status st;
  (void)arg;

  /* Rank 0's "dup" cannot complete before the others submit theirs, which
   * they do only after a barrier that rank 0 enters once it has tried the
   * duplicate: the first is surely in flight then. */
  if (rank != 0)
    CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL));
  CALL(hvd_allreduce_async(&t, NULL, &h));
  if (rank == 0) {
    st = hvd_allreduce_async(&t2, NULL, &h2);
    EXPECT(st == HVD_ERR_INVALID_ARGUMENT && h2 == NULL, "a duplicate name in flight gave %s",
           hvd_strerror(st));
    EXPECT(strstr(hvd_last_error_message(), "dup") != NULL, "message: %s",
           hvd_last_error_message());
    CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL));
  }
  CALL(hvd_handle_wait(h));
  hvd_handle_release(h);
  EXPECT(out[2] == 3.0f * (float)size, "dup: %g", out[2]);
  /* Once done, the name can be used again. */
  CALL(hvd_allreduce(&t2, NULL));
  EXPECT(out2[2] == 3.0f * (float)size, "dup again: %g", out2[2]);
  return 0;
}

START_TEST(duplicate_name_rejected) { run_ok(2, duplicates, NULL); }
END_TEST

#define EXPECT_INVALID(expr)                                                                      \
  do {                                                                                             \
    hvd_status s_ = (expr);                                                                        \
    EXPECT(s_ == HVD_ERR_INVALID_ARGUMENT && hvd_last_error_message()[0] != '\0',                  \
           "%s gave %s", #expr, hvd_strerror(s_));                                                 \
  } while (0)

static int bad_arguments(int rank, int size, void *arg) {
  int64_t shape[2] = {4, 2}, neg[1] = {-1};
  float buf[8] = {0};
  uint8_t flags[8] = {0};
  int32_t splits[4] = {0}, badsplits[4] = {-1, 0, 0, 0};
  char long_name[COORD_NAME_MAX + 10];
  hvd_tensor t = {"t", HVD_FLOAT32, 2, shape, buf, buf};
  hvd_tensor x;
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_handle h = NULL;
  (void)arg;
  (void)rank;

  EXPECT_INVALID(hvd_allreduce_async(NULL, NULL, &h));
  EXPECT_INVALID(hvd_allreduce_async(&t, NULL, NULL));
  x = t, x.ndims = -1;
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  x = t, x.ndims = HVD_MAX_DIMS + 1;
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  x = t, x.ndims = 1, x.shape = neg;
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  x = t, x.dtype = (hvd_dtype)99;
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  x = t, x.input = NULL;
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  x = t, x.output = NULL;
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  x = t, x.name = "";
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  memset(long_name, 'n', sizeof(long_name) - 1);
  long_name[sizeof(long_name) - 1] = '\0';
  x = t, x.name = long_name;
  EXPECT_INVALID(hvd_allreduce_async(&x, NULL, &h));
  o.op = (hvd_reduce_op)42;
  EXPECT_INVALID(hvd_allreduce_async(&t, &o, &h));
  o = (hvd_options)HVD_OPTIONS_INIT, o.op = HVD_AVERAGE;
  x = t, x.dtype = HVD_BOOL, x.input = x.output = flags;
  EXPECT_INVALID(hvd_allreduce_async(&x, &o, &h));
  o = (hvd_options)HVD_OPTIONS_INIT, o.prescale = 2.0;
  EXPECT_INVALID(hvd_allreduce_async(&x, &o, &h));
  o = (hvd_options)HVD_OPTIONS_INIT, o.process_set = 77;
  EXPECT_INVALID(hvd_allreduce_async(&t, &o, &h));
  o = (hvd_options)HVD_OPTIONS_INIT, o.device = 3;
  EXPECT(hvd_allreduce_async(&t, &o, &h) != HVD_OK, "a GPU device without CUDA was accepted");
  o = (hvd_options)HVD_OPTIONS_INIT, o.root = size;
  EXPECT_INVALID(hvd_broadcast_async(&t, &o, &h));
  o.root = -1;
  EXPECT_INVALID(hvd_broadcast_async(&t, &o, &h));
  x = t, x.ndims = 0;
  EXPECT_INVALID(hvd_allgather_async(&x, NULL, &h));
  EXPECT_INVALID(hvd_reducescatter_async(&x, NULL, &h));
  EXPECT_INVALID(hvd_alltoall_async(&x, NULL, NULL, &h));
  for (int p = 0; p < size; p++)
    splits[p] = 5; /* more rows than the tensor has */
  EXPECT_INVALID(hvd_alltoall_async(&t, splits, NULL, &h));
  EXPECT_INVALID(hvd_alltoall_async(&t, badsplits, NULL, &h));
  x = t, shape[0] = 4;
  if (size == 3) /* 4 rows do not divide evenly */
    EXPECT_INVALID(hvd_alltoall_async(&x, NULL, NULL, &h));
  EXPECT_INVALID(hvd_grouped_allreduce_async(&t, 0, NULL, &h));
  EXPECT_INVALID(hvd_grouped_allreduce_async(NULL, 2, NULL, &h));
  hvd_tensor pair[2] = {t, t};
  pair[1].name = NULL; /* named and unnamed in one group */
  EXPECT_INVALID(hvd_grouped_allreduce_async(pair, 2, NULL, &h));
  EXPECT_INVALID(hvd_barrier(77));
  EXPECT(hvd_process_set_rank(77) == -1 && hvd_process_set_size(77) == -1, "set 77 exists");
  EXPECT(hvd_reducescatter_rows(10, 77) == -1, "rows of set 77");
  EXPECT(h == NULL, "a failed call returned a handle");
  EXPECT_INVALID(hvd_process_set_remove(HVD_PROCESS_SET_GLOBAL));
  /* Nothing above reached the coordinator: the job works. */
  int sum = 0;
  CALL(allreduce_int(2, HVD_SUM, &sum));
  EXPECT(sum == 2 * size, "allreduce after bad calls gave %d", sum);
  return 0;
}

START_TEST(bad_arguments_rejected) { run_ok(_i, bad_arguments, NULL); }
END_TEST

/* Outside a job: no initialization, every call fails cleanly. */
START_TEST(not_initialized) {
  int64_t shape[1] = {1};
  float v = 1;
  hvd_tensor t = {"t", HVD_FLOAT32, 1, shape, &v, &v};
  hvd_handle h = NULL;
  ck_assert_int_eq(hvd_is_initialized(), 0);
  ck_assert_int_eq(hvd_rank(), -1);
  ck_assert_int_eq(hvd_size(), -1);
  ck_assert_int_eq(hvd_local_rank(), -1);
  ck_assert_int_eq(hvd_cross_size(), -1);
  ck_assert_int_eq(hvd_allreduce_async(&t, NULL, &h), HVD_ERR_PRECONDITION);
  ck_assert_ptr_null(h);
  ck_assert_int_eq(hvd_allreduce(&t, NULL), HVD_ERR_PRECONDITION);
  ck_assert_int_eq(hvd_barrier(0), HVD_ERR_PRECONDITION);
  ck_assert_int_eq(hvd_join(NULL), HVD_ERR_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "hvd_init"));
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
  hvd_handle_release(NULL);
}
END_TEST

/* Malformed settings are named by hvd_init (run as a job of one). */
START_TEST(bad_environment) {
  static const char *const bad[] = {
      "HOROVOD_FUSION_THRESHOLD=lots", "HOROVOD_CYCLE_TIME=-1",  "HOROVOD_CACHE_CAPACITY=1e99x",
      "HOROVOD_STALL_CHECK_TIME_SECONDS=soon", "HOROVOD_TIMELINE_MARK_CYCLES=maybe",
      "HVD_SPIN_US=-5", "HVD_SOCKET_BUFFER_BYTES=16384", "HVD_INLINE_BYTES=65",
      "HOROVOD_SIZE=0", "HOROVOD_RANK=3"};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    char name[64];
    const char *eq = strchr(bad[i], '=');
    snprintf(name, sizeof(name), "%.*s", (int)(eq - bad[i]), bad[i]);
    if (strcmp(name, "HOROVOD_RANK") == 0)
      setenv("HOROVOD_SIZE", "2", 1);
    setenv(name, eq + 1, 1);
    ck_assert_int_eq(hvd_init(), HVD_ERR_INVALID_ARGUMENT);
    ck_assert_msg(strstr(hvd_last_error_message(), name) != NULL, "%s: %s", bad[i],
                  hvd_last_error_message());
    ck_assert_int_eq(hvd_is_initialized(), 0);
    unsetenv(name);
    unsetenv("HOROVOD_SIZE");
  }
}
END_TEST

/* A timeline that cannot be opened is named by its variable, its path and why. */
START_TEST(timeline_unopenable) {
  const char *msg;
  setenv("HOROVOD_TIMELINE", "/nonexistent-hvd-dir/t.json", 1);
  ck_assert_int_eq(hvd_init(), HVD_ERR_IO);
  msg = hvd_last_error_message();
  ck_assert_msg(strstr(msg, "HOROVOD_TIMELINE") != NULL &&
                    strstr(msg, "/nonexistent-hvd-dir/t.json") != NULL,
                "%s", msg);
  ck_assert_int_eq(hvd_is_initialized(), 0);
  unsetenv("HOROVOD_TIMELINE");
}
END_TEST

/* ==== join =================================================================================== */

struct join_arg {
  int first; /* the rank that joins at once */
};

static int join_uneven(int rank, int size, void *arg) {
  const struct join_arg *j = arg;
  int last = -2, hi = 0, lo = 0;

  if (rank != j->first) {
    for (int step = 0; step < 4; step++) {
      int64_t shape[1] = {10};
      float in[10], sum[10], avg[10];
      hvd_tensor ts = {"join.sum", HVD_FLOAT32, 1, shape, in, sum};
      hvd_tensor ta = {"join.avg", HVD_FLOAT32, 1, shape, in, avg};
      hvd_options o = HVD_OPTIONS_INIT;
      hvd_handle hs, ha;
      o.op = HVD_AVERAGE;
      for (int i = 0; i < 10; i++)
        in[i] = (float)value(HVD_FLOAT32, HVD_SUM, rank, (size_t)i);
      CALL(hvd_allreduce_async(&ts, NULL, &hs));
      CALL(hvd_allreduce_async(&ta, &o, &ha));
      CALL(hvd_handle_wait(hs));
      CALL(hvd_handle_wait(ha));
      hvd_handle_release(hs);
      hvd_handle_release(ha);
      for (int i = 0; i < 10; i++) {
        double want = reduce(HVD_FLOAT32, HVD_SUM, size, (size_t)i, j->first);
        EXPECT(sum[i] == (float)want, "step %d: sum without rank %d: %g, want %g", step,
               j->first, sum[i], want);
        /* hvd may multiply by 1/size: the last bit may differ */
        EXPECT(fabs(avg[i] - want / size) <= 1e-6 * want,
               "step %d: average divides by %d: %.9g, want %.9g", step, size, avg[i], want / size);
      }
    }
    /* A joined rank's identity is not prescaled: a product of the others. */
    int64_t pshape[1] = {9};
    float pin[9], pout[9];
    hvd_tensor tp = {"join.prod", HVD_FLOAT32, 1, pshape, pin, pout};
    hvd_options po = HVD_OPTIONS_INIT;
    po.op = HVD_PRODUCT;
    po.prescale = 2.0;
    for (int i = 0; i < 9; i++)
      pin[i] = (float)value(HVD_FLOAT32, HVD_PRODUCT, rank, (size_t)i);
    CALL(hvd_allreduce(&tp, &po));
    for (int i = 0; i < 9; i++) {
      double want = reduce(HVD_FLOAT32, HVD_PRODUCT, size, (size_t)i, j->first) *
                    (double)(1 << (size - 1));
      EXPECT(pout[i] == (float)want, "prescaled product without rank %d: %g, want %g", j->first,
             pout[i], want);
    }
    /* Anything but an allreduce fails while a rank has joined. */
    int64_t shape[1] = {2};
    float b[2] = {1, 2};
    hvd_tensor tb = {"join.bcast", HVD_FLOAT32, 1, shape, b, b};
    hvd_status st = hvd_broadcast(&tb, NULL);
    EXPECT(st == HVD_ERR_PRECONDITION && strstr(hvd_last_error_message(), "join") != NULL,
           "broadcast with a joined rank gave %s: %s", hvd_strerror(st), hvd_last_error_message());
  }
  CALL(hvd_join(&last));
  EXPECT(last >= 0 && last < size, "last joined rank %d", last);
  EXPECT(size == 1 || last != j->first, "rank %d joined first but is reported last", last);
  /* Every rank names the same one, and the job goes on. */
  CALL(allreduce_int(last, HVD_MAX, &hi));
  CALL(allreduce_int(last, HVD_MIN, &lo));
  EXPECT(hi == last && lo == last, "ranks disagree on the last joined rank: %d..%d", lo, hi);
  return 0;
}

START_TEST(join_each_rank_first) {
  struct join_arg a = {_i % 3};
  if (_i >= 3)
    job.env[0] = "HOROVOD_CACHE_CAPACITY=0";
  run_ok(3, join_uneven, &a);
}
END_TEST

static int join_all(int rank, int size, void *arg) {
  int last = -1;
  (void)arg;
  (void)size;
  usleep((useconds_t)rank * 20000);
  CALL(hvd_join(&last));
  EXPECT(last >= 0 && last < size, "last %d", last);
  CALL(hvd_join(&last)); /* again: a second round works */
  return 0;
}

START_TEST(join_twice) { run_ok(_i, join_all, NULL); }
END_TEST

/* Operations without names are numbered per rank; a joined rank runs the
 * others' without calling them, and must still agree on the next numbers.
 * A stall shuts the job down quickly, so a mismatch fails instead of hanging. */
static int join_keeps_numbers(int rank, int size, void *arg) {
  const int one[1] = {1}; /* a set that is not the global one at any size */
  int last = -1, sum = 0, id = -1;
  (void)arg;

  if (rank != 0) {
    int64_t shape[1] = {2};
    int32_t v[2] = {1, 2}, out[2];
    hvd_tensor group[2] = {{NULL, HVD_INT32, 1, shape, v, out},
                           {NULL, HVD_INT32, 1, shape, v, out}};
    hvd_tensor b = {NULL, HVD_INT32, 1, shape, v, v};
    CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL));
    CALL(allreduce_int(1, HVD_SUM, &sum));
    EXPECT(sum == size - 1, "allreduce beside a joined rank: %d", sum);
    CALL(hvd_grouped_allreduce(group, 2, NULL));
    CALL(hvd_process_set_add(one, 1, &id));
    CALL(hvd_process_set_remove(id));
    EXPECT(hvd_broadcast(&b, NULL) == HVD_ERR_PRECONDITION, "broadcast beside a joined rank");
  }
  CALL(hvd_join(&last));
  CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL));
  CALL(allreduce_int(rank, HVD_SUM, &sum));
  EXPECT(sum == size * (size - 1) / 2, "allreduce after the join: %d", sum);
  CALL(hvd_process_set_add(one, 1, &id));
  if (rank == 1)
    CALL(hvd_barrier(id));
  CALL(hvd_process_set_remove(id));
  CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL));
  return 0;
}

START_TEST(join_keeps_generated_names) {
  job.env[0] = "HOROVOD_STALL_CHECK_TIME_SECONDS=1";
  job.env[1] = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3";
  run_ok(_i, join_keeps_numbers, NULL);
}
END_TEST

/* ==== barrier ================================================================================== */

static int barrier_counts(int rank, int size, void *arg) {
  const char *path = arg;
  struct stat sb;
  for (int round = 1; round <= 3; round++) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    EXPECT(fd >= 0, "open %s", path);
    usleep((useconds_t)((size - rank) * 15000));
    EXPECT(write(fd, "x", 1) == 1, "write");
    close(fd);
    CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL));
    /* Everybody wrote before anybody passed. */
    EXPECT(stat(path, &sb) == 0 && sb.st_size >= (off_t)size * round,
           "round %d: %lld bytes after the barrier, want %d", round, (long long)sb.st_size,
           size * round);
    CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL)); /* nobody starts the next round early */
  }
  return 0;
}

START_TEST(barrier_waits_for_all) {
  char path[] = "/tmp/hvd-barrier-XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  run_ok(_i, barrier_counts, path);
  unlink(path);
}
END_TEST

/* ==== process sets ============================================================================= */

static int set_collectives(int rank, int size, void *arg) {
  const int even_ranks[2] = {2, 0}, odd_ranks[2] = {3, 1};
  int even = -1, odd = -1, lo, hi, got[4];
  size_t n = 0;
  (void)arg;

  for (int round = 0; round < 2; round++) {
    CALL(hvd_process_set_add(even_ranks, 2, &even));
    CALL(hvd_process_set_add(odd_ranks, 2, &odd));
    EXPECT(even > 0 && odd > 0 && even != odd, "ids %d %d", even, odd);
    CALL(allreduce_int(even * 100 + odd, HVD_MAX, &hi));
    CALL(allreduce_int(even * 100 + odd, HVD_MIN, &lo));
    EXPECT(hi == lo, "ranks disagree about the set ids");
    int mine = rank % 2 == 0 ? even : odd, other = rank % 2 == 0 ? odd : even;
    EXPECT(hvd_process_set_size(mine) == 2 && hvd_process_set_rank(mine) == rank / 2,
           "set %d: size %d, rank %d", mine, hvd_process_set_size(mine),
           hvd_process_set_rank(mine));
    EXPECT(hvd_process_set_rank(other) == -1 && hvd_process_set_size(other) == 2,
           "the other set: rank %d", hvd_process_set_rank(other));
    CALL(hvd_process_set_ranks(mine, got, 4, &n));
    EXPECT(n == 2 && got[0] == rank % 2 && got[1] == rank % 2 + 2, "ranks of set %d", mine);
    for (int step = 0; step < 3; step++) {
      int64_t shape[1] = {50};
      float in[50], out[50];
      hvd_tensor t = {"in.set", HVD_FLOAT32, 1, shape, in, out};
      hvd_options o = HVD_OPTIONS_INIT;
      o.process_set = mine;
      for (int i = 0; i < 50; i++)
        in[i] = (float)(rank + i);
      CALL(hvd_allreduce(&t, &o));
      for (int i = 0; i < 50; i++) {
        float want = (float)(rank % 2 + rank % 2 + 2 + 2 * i);
        EXPECT(out[i] == want, "set allreduce element %d: %g, want %g", i, out[i], want);
      }
      o.root = 1; /* global rank 2 or 3 */
      CALL(hvd_broadcast(&t, &o));
      EXPECT(out[0] == (float)(rank % 2 + 2), "set broadcast: %g", out[0]);
      /* Non-members cannot use it. */
      o.process_set = other;
      EXPECT(hvd_allreduce(&t, &o) == HVD_ERR_INVALID_ARGUMENT, "a non-member used a set");
    }
    CALL(hvd_barrier(mine));
    EXPECT(hvd_reducescatter_rows(5, mine) == (rank < 2 ? 3 : 2), "set reducescatter rows");
    /* Every rank lists the same ids. */
    int ids[8];
    CALL(hvd_process_set_ids(ids, 8, &n));
    EXPECT(n == 3 && ids[0] == 0 && ids[1] == (even < odd ? even : odd) &&
               ids[2] == (even < odd ? odd : even),
           "process set ids: %zu of them", n);
    /* A set with the same ranks (the global one too) is refused on every rank. */
    int dup = -1, all[4] = {3, 2, 1, 0};
    hvd_status st = hvd_process_set_add(odd_ranks, 2, &dup);
    EXPECT(st == HVD_ERR_EXISTS, "adding a set twice gave %s", hvd_strerror(st));
    st = hvd_process_set_add(all, 4, &dup);
    EXPECT(st == HVD_ERR_EXISTS, "adding the global set gave %s", hvd_strerror(st));
    CALL(hvd_process_set_remove(even));
    EXPECT(hvd_process_set_size(even) == -1, "a removed set still has a size");
    CALL(hvd_process_set_remove(odd));
  }
  /* Ranks that disagree about the set. */
  int mixed[2] = {0, rank == 3 ? 2 : 1}, id = -1;
  hvd_status st = hvd_process_set_add(mixed, 2, &id);
  EXPECT(st == HVD_ERR_MISMATCH, "ranks adding different sets gave %s", hvd_strerror(st));
  int sum = 0;
  CALL(allreduce_int(1, HVD_SUM, &sum));
  EXPECT(sum == size, "global allreduce after the sets: %d", sum);
  return 0;
}

START_TEST(process_sets_even_odd) { run_ok(4, set_collectives, NULL); }
END_TEST

/* ==== lifecycle ================================================================================ */

static int reinit(int rank, int size, void *arg) {
  (void)arg;
  for (int round = 0; round < 3; round++) {
    int sum = 0;
    CALL(allreduce_int(rank + round, HVD_SUM, &sum));
    EXPECT(sum == size * (size - 1) / 2 + size * round, "round %d: %d", round, sum);
    CALL(hvd_shutdown());
    EXPECT(!hvd_is_initialized() && hvd_rank() == -1, "still initialized after shutdown");
    EXPECT(allreduce_int(1, HVD_SUM, &sum) == HVD_ERR_PRECONDITION, "a call after shutdown");
    CALL(hvd_init());
    EXPECT(hvd_rank() == rank && hvd_size() == size, "rank %d of %d after re-init", hvd_rank(),
           hvd_size());
  }
  return 0;
}

static int homogeneity(int rank, int size, void *arg) {
  int want = *(const int *)arg;
  (void)rank;
  (void)size;
  EXPECT(hvd_is_homogeneous() == want, "hvd_is_homogeneous() is %d, want %d",
         hvd_is_homogeneous(), want);
  return 0;
}

/* 0: three ranks on one host; 1: two hosts of 2 ranks; 2: two ranks on
 * one host and one on another. */
START_TEST(homogeneous_hosts) {
  static const char *layouts[3][4] = {
      {NULL, NULL, NULL, NULL}, {"a", "a", "b", "b"}, {"a", "a", "b", NULL}};
  int size = _i == 1 ? 4 : 3, want = _i == 2 ? 0 : 1;
  for (int r = 0; r < size; r++)
    job.hosts[r] = layouts[_i][r];
  run_ok(size, homogeneity, &want);
  ck_assert_int_eq(hvd_is_homogeneous(), -1);
}
END_TEST

START_TEST(init_after_shutdown) { run_ok(_i, reinit, NULL); }
END_TEST

/* Whether this rank's control connection to rank r goes through a ring. */
static bool control_ring_to(int r) {
  struct coord_state *s = coord_acquire();
  bool ring = s != NULL && s->control->conns[r].ring_rx != NULL;
  if (s != NULL)
    coord_release();
  return ring;
}

/* Ranks 0-2 on host "a", rank 3 on "b": rank 0's control messages to 1 and
 * 2 go through rings, to 3 over TCP (or all over TCP with HVD_SHM=0), and
 * small and large operations agree either way. */
static int control_on_two_hosts(int rank, int size, void *arg) {
  bool shm = *(const bool *)arg;
  float in[300], out[300];
  int64_t shape[1] = {300};

  for (int r = 0; r < size; r++) {
    bool want = shm && r != rank && r < 3 && rank < 3 && (rank == 0 || r == 0);
    EXPECT(control_ring_to(r) == want, "control to rank %d: ring %d, want %d", r,
           control_ring_to(r), want);
  }
  for (int k = 0; k < 200; k++) {
    char name[32];
    int64_t n = k % 2 == 0 ? 1 : 300;
    hvd_tensor t = {name, HVD_FLOAT32, 1, shape, in, out};
    shape[0] = n;
    snprintf(name, sizeof(name), "two_hosts.%d", k % 5);
    for (int64_t i = 0; i < n; i++)
      in[i] = (float)(rank + k + i);
    CALL(hvd_allreduce(&t, NULL));
    for (int64_t i = 0; i < n; i++)
      EXPECT(out[i] == (float)(size * (k + i) + size * (size - 1) / 2), "op %d: element %lld is %g",
             k, (long long)i, out[i]);
  }
  return 0;
}

START_TEST(control_rings_on_rank0_host) {
  static const char *layout[4] = {"a", "a", "a", "b"};
  bool shm = _i == 0;
  for (int r = 0; r < 4; r++)
    job.hosts[r] = layout[r];
  if (!shm)
    job.env[0] = "HVD_SHM=0";
  run_ok(4, control_on_two_hosts, &shm);
}
END_TEST

/* Pipes between the two ranks of listener_answers_or_refuses, made before
 * they fork. */
struct listener_pipes {
  int port[2];    /* rank 0 -> 1: rank 0's transport port */
  int stopped[2]; /* rank 0 -> 1: the job has stopped on rank 0 */
  int probed[2];  /* rank 1 -> 0: done with rank 0's listener */
};

static bool read_int_within(int fd, int *v, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, ms) == 1 && read(fd, v, sizeof(*v)) == (ssize_t)sizeof(*v);
}

/* Rank 1 plays a stranger at rank 0's transport listener in a job on one
 * host whose control channel runs through shared memory: while the job
 * runs, a wrong token is refused and a silent connection dropped at the
 * handshake deadline (3 s); once the job stopped, a dial is refused or
 * closed. Neither may hang: 10 s is a bound, not a wait. */
static int listener_ranks(int rank, int size, void *arg) {
  const struct listener_pipes *p = arg;
  int port = 0, one = 1;
  hvd_status st;
  (void)size;

  if (rank == 0) {
    struct coord_state *s = coord_acquire();
    port = net_ctx_port(s->world->ctx);
    coord_release();
    EXPECT(write(p->port[1], &port, sizeof(port)) == (ssize_t)sizeof(port), "write: %s",
           strerror(errno));
    CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL)); /* idle here while rank 1 looks */
    st = hvd_barrier(HVD_PROCESS_SET_GLOBAL);  /* rank 1 shuts down instead */
    EXPECT(st == HVD_ERR_ABORTED, "a barrier after rank 1's shutdown gave %s", hvd_strerror(st));
    EXPECT(write(p->stopped[1], &one, sizeof(one)) == (ssize_t)sizeof(one), "write: %s",
           strerror(errno));
    EXPECT(read_int_within(p->probed[0], &one, 30000), "rank 1 did not say it was done");
    return 0;
  }
  struct net_hello h = {.version = NET_PROTOCOL_VERSION, .comm_id = NET_COMM_GLOBAL, .from = 1,
                        .to = 0, .token = "wrongtoken", .token_len = 10};
  int silent, status, fd;

  EXPECT(control_ring_to(0), "the control channel to rank 0 is not in shared memory");
  EXPECT(read_int_within(p->port[0], &port, 30000), "rank 0 did not say its port");
  silent = stranger_dial(port);
  EXPECT(silent >= 0, "connect to rank 0's port %d: %s", port, strerror(errno));
  status = stranger_hello(port, &h, NULL, 0, 10000);
  EXPECT(status == NET_ACK_BAD_TOKEN, "a wrong token got %d, not a refusal", status);
  EXPECT(stranger_closed_within(silent, 10000),
         "a silent connection to a running rank was not dropped");
  close(silent);
  CALL(hvd_barrier(HVD_PROCESS_SET_GLOBAL));
  CALL(hvd_shutdown());
  EXPECT(read_int_within(p->stopped[0], &one, 30000), "rank 0 did not see the job stop");
  fd = stranger_dial(port);
  EXPECT(fd < 0 ? errno == ECONNREFUSED : stranger_closed_within(fd, 10000),
         "a dial to a stopped rank was %s", fd < 0 ? strerror(errno) : "left hanging");
  if (fd >= 0)
    close(fd);
  EXPECT(write(p->probed[1], &one, sizeof(one)) == (ssize_t)sizeof(one), "write: %s",
         strerror(errno));
  return 0;
}

START_TEST(listener_answers_or_refuses) {
  struct listener_pipes p;
  ck_assert_int_eq(pipe(p.port), 0);
  ck_assert_int_eq(pipe(p.stopped), 0);
  ck_assert_int_eq(pipe(p.probed), 0);
  run_ok(2, listener_ranks, &p);
  for (int i = 0; i < 2; i++) {
    close(p.port[i]);
    close(p.stopped[i]);
    close(p.probed[i]);
  }
}
END_TEST

/* Shuts hvd down once the other thread waits in hvd_handle_wait, driving
 * the loop (it announces itself before it drives). */
static void *shutdown_later(void *arg) {
  int64_t deadline = hvd_deadline_after_ms(10000);
  (void)arg;
  for (;;) {
    struct coord_state *s = coord_acquire_quiet();
    int drivers = s != NULL ? coord_loop_drivers(s) : 0;
    if (s != NULL)
      coord_release();
    if (drivers > 0 || hvd_now_ns() >= deadline)
      break;
    hvd_sleep_ns(1000000);
  }
  (void)hvd_shutdown();
  return NULL;
}

struct shutdown_arg {
  bool thread;      /* rank 0 shuts down from another thread while it waits */
  int submitted[2]; /* each worker -> rank 0: its operation is submitted */
};

/* Rank 0 shuts down once every worker has submitted an operation of its
 * own: pending everywhere, they all end with HVD_ERR_ABORTED. */
static int shutdown_pending(int rank, int size, void *arg) {
  const struct shutdown_arg *a = arg;
  int64_t shape[1] = {4};
  float in[4] = {0}, out[4];
  hvd_tensor t = {rank == 0 ? "only.on.0" : "never.on.0", HVD_FLOAT32, 1, shape, in, out};
  hvd_handle h = NULL;
  hvd_status st;

  CALL(hvd_allreduce_async(&t, NULL, &h));
  if (rank != 0)
    EXPECT(write(a->submitted[1], &rank, sizeof(rank)) == (ssize_t)sizeof(rank), "write: %s",
           strerror(errno));
  for (int r = 1; r < size && rank == 0; r++) {
    int who;
    EXPECT(read_int_within(a->submitted[0], &who, 30000), "%d workers did not submit", size - r);
  }
  if (rank == 0 && a->thread) { /* shut down while this thread waits (and runs the loop) */
    pthread_t th;
    EXPECT(pthread_create(&th, NULL, shutdown_later, NULL) == 0, "pthread_create");
    st = hvd_handle_wait(h);
    pthread_join(th, NULL);
    EXPECT(st == HVD_ERR_ABORTED, "a waited-for operation ended with %s (%s) after a shutdown",
           hvd_strerror(st), hvd_last_error_message());
  } else if (rank == 0) {
    CALL(hvd_shutdown());
  }
  st = hvd_handle_wait(h);
  EXPECT(st == HVD_ERR_ABORTED, "a pending operation ended with %s (%s) after a shutdown",
         hvd_strerror(st), hvd_last_error_message());
  hvd_handle_release(h);
  if (rank != 0) {
    int sum;
    st = allreduce_int(1, HVD_SUM, &sum);
    EXPECT(st == HVD_ERR_ABORTED, "a call after rank 0 shut down gave %s", hvd_strerror(st));
  }
  return 0;
}

static void run_shutdown_pending(int size, bool thread) {
  struct shutdown_arg a = {.thread = thread};
  ck_assert_int_eq(pipe(a.submitted), 0);
  run_ok(size, shutdown_pending, &a);
  close(a.submitted[0]);
  close(a.submitted[1]);
}

/* The last rank shuts down at once: the others' collective, which needs
 * it, ends with HVD_ERR_ABORTED and a message that names that rank (a
 * Python rank's atexit shutdown after an exception is this case). */
static int last_rank_shuts_down(int rank, int size, void *arg) {
  int sum;
  hvd_status st;
  (void)arg;
  if (rank == size - 1) {
    CALL(hvd_shutdown());
    return 0;
  }
  st = allreduce_int(1, HVD_SUM, &sum);
  EXPECT(st == HVD_ERR_ABORTED, "the allreduce ended with %s", hvd_strerror(st));
  char want[64];
  snprintf(want, sizeof(want), "rank %d called hvd_shutdown", size - 1);
  EXPECT(strstr(hvd_last_error_message(), want) != NULL, "'%s' does not say '%s'",
         hvd_last_error_message(), want);
  return 0;
}

START_TEST(shutdown_names_the_rank) { run_ok(_i, last_rank_shuts_down, NULL); }
END_TEST

START_TEST(shutdown_aborts_pending) { run_shutdown_pending(_i, false); }
END_TEST
START_TEST(shutdown_while_waiting) { run_shutdown_pending(_i, true); }
END_TEST

/* A completion callback runs on the thread that runs the loop: waiting
 * there for an operation that has not completed is refused, not a hang. */
struct callback_wait {
  hvd_handle other;
  atomic_int status;
};

static void wait_in_callback(hvd_handle h, hvd_status st, void *arg) {
  struct callback_wait *w = arg;
  (void)h;
  (void)st;
  atomic_store(&w->status, (int)hvd_handle_wait(w->other));
}

struct late_init {
  pthread_t thread;
  hvd_status status;
  char message[256];
};

static void *init_main(void *arg) {
  struct late_init *li = arg;
  li->status = hvd_init();
  snprintf(li->message, sizeof(li->message), "%s", hvd_last_error_message());
  return NULL;
}

/* Rank 0 starts again alone, so its hvd_init waits for peers that never
 * come; hvd_shutdown on another thread makes it give up at once (it used
 * to wait behind hvd_init's lock until the start timed out). */
static int shutdown_during_init(int rank, int size, void *arg) {
  struct late_init li = {.status = HVD_ERR_INTERNAL};
  int64_t deadline = hvd_deadline_after_ms(20000);
  (void)size;
  (void)arg;

  CALL(hvd_shutdown());
  if (rank != 0)
    return 0;
  EXPECT(pthread_create(&li.thread, NULL, init_main, &li) == 0, "pthread_create");
  while (!coord_is_starting() && hvd_now_ns() < deadline)
    hvd_sleep_ns(1000000);
  EXPECT(coord_is_starting(), "hvd_init did not start");
  CALL(hvd_shutdown());
  pthread_join(li.thread, NULL);
  EXPECT(li.status == HVD_ERR_ABORTED, "hvd_init ended with %s (%s), not HVD_ERR_ABORTED",
         hvd_strerror(li.status), li.message);
  EXPECT(strstr(li.message, "hvd_shutdown") != NULL, "%s", li.message);
  EXPECT(!hvd_is_initialized(), "initialized after an aborted start");
  return 0;
}

START_TEST(shutdown_ends_a_waiting_init) { run_ok(2, shutdown_during_init, NULL); }
END_TEST

/* A completion callback cannot shut hvd down (it runs on hvd's loop). */
static void shutdown_in_callback(hvd_handle h, hvd_status st, void *arg) {
  (void)h;
  (void)st;
  atomic_store((atomic_int *)arg, (int)hvd_shutdown());
}

static int callback_shuts_down(int rank, int size, void *arg) {
  int64_t shape[1] = {1};
  float in = 1, out = 0;
  hvd_tensor t = {"cb.shutdown", HVD_FLOAT32, 1, shape, &in, &out};
  hvd_options o = HVD_OPTIONS_INIT;
  atomic_int status;
  hvd_handle h;
  (void)rank;
  (void)arg;

  atomic_init(&status, -1);
  o.callback = shutdown_in_callback;
  o.callback_arg = &status;
  CALL(hvd_allreduce_async(&t, &o, &h));
  CALL(hvd_handle_wait(h));
  hvd_handle_release(h);
  EXPECT(atomic_load(&status) == HVD_ERR_PRECONDITION,
         "hvd_shutdown in a callback gave %d, not HVD_ERR_PRECONDITION", atomic_load(&status));
  EXPECT(hvd_is_initialized(), "a refused shutdown shut hvd down");
  EXPECT(out == (float)size, "%g", (double)out);
  return 0;
}

START_TEST(shutdown_in_a_callback_is_refused) { run_ok(_i, callback_shuts_down, NULL); }
END_TEST

static int callback_waits(int rank, int size, void *arg) {
  int64_t shape[1] = {1};
  float in = 1, out = 0, lone_in = 0, lone_out;
  char lone_name[32];
  hvd_tensor t = {"cb.first", HVD_FLOAT32, 1, shape, &in, &out};
  hvd_tensor lone = {lone_name, HVD_FLOAT32, 1, shape, &lone_in, &lone_out};
  struct callback_wait w;
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_handle h;
  hvd_status st;
  (void)arg;

  snprintf(lone_name, sizeof(lone_name), "cb.only.on.%d", rank); /* never completes */
  atomic_init(&w.status, -1);
  CALL(hvd_allreduce_async(&lone, NULL, &w.other));
  o.callback = wait_in_callback;
  o.callback_arg = &w;
  CALL(hvd_allreduce_async(&t, &o, &h));
  CALL(hvd_handle_wait(h));
  hvd_handle_release(h);
  EXPECT(out == (float)size, "%g", (double)out);
  EXPECT(atomic_load(&w.status) == HVD_ERR_PRECONDITION,
         "hvd_handle_wait in a callback gave %d, not HVD_ERR_PRECONDITION", atomic_load(&w.status));
  CALL(hvd_shutdown());
  st = hvd_handle_wait(w.other);
  EXPECT(st == HVD_ERR_ABORTED, "the lone operation ended with %s", hvd_strerror(st));
  hvd_handle_release(w.other);
  return 0;
}

START_TEST(wait_in_a_callback_is_refused) { run_ok(_i, callback_waits, NULL); }
END_TEST

/* One rank is killed (its connections close) or frozen (they stay open:
 * the others notice its silence within the timeout); the others' pending
 * operations fail either way. */
struct victim {
  int rank;
  int sig;   /* SIGKILL or SIGSTOP */
  bool lane; /* the pending operation is a small one, in its lane on the others */
};

static int lose_a_rank(int rank, int size, void *arg) {
  const struct victim *v = arg;
  int64_t shape[1] = {1000};
  float buf[1000];
  hvd_tensor t = {"before", HVD_FLOAT32, 1, shape, buf, buf};
  hvd_handle h;
  hvd_status st;
  int sum;
  (void)size;

  for (int i = 0; i < 1000; i++)
    buf[i] = 1;
  CALL(hvd_allreduce(&t, NULL));
  t.name = "after";
  if (v->lane) { /* a scalar every step: its lane opens */
    shape[0] = 1;
    t.name = "scalar";
    for (int i = 0; i < 50; i++)
      CALL(hvd_allreduce(&t, NULL));
  }
  if (rank == v->rank)
    raise(v->sig);
  /* Fails at enqueue when the loss was already noticed, else pending. */
  st = hvd_allreduce_async(&t, NULL, &h);
  if (st == HVD_OK) {
    st = hvd_handle_wait(h);
    hvd_handle_release(h);
  }
  if (v->sig == SIGSTOP) {
    EXPECT(st == HVD_ERR_TIMEOUT || st == HVD_ERR_ABORTED,
           "the pending operation ended with %s after rank %d froze", hvd_strerror(st), v->rank);
    EXPECT(v->rank != 0 || rank == 0 || strstr(hvd_last_error_message(), "rank 0") != NULL,
           "the message does not name rank 0: %s", hvd_last_error_message());
  } else {
    EXPECT(st == HVD_ERR_NETWORK || st == HVD_ERR_TIMEOUT || st == HVD_ERR_ABORTED,
           "the pending operation ended with %s after rank %d died", hvd_strerror(st), v->rank);
  }
  EXPECT(hvd_last_error_message()[0] != '\0', "no message");
  st = allreduce_int(1, HVD_SUM, &sum); /* fails at once */
  EXPECT(st != HVD_OK, "a call after the failure succeeded");
  return 0;
}

static void lose_rank_job(int victim, int sig, bool lane, int timeout_s) {
  struct victim v = {victim, sig, lane};
  int codes[16];
  job.timeout_s = timeout_s;
  if (lane)
    job.env[0] = "HVD_SPIN_US=2000"; /* lanes stay open on busy cores */
  run_ranks(3, lose_a_rank, &v, codes, 60);
  for (int r = 0; r < 3; r++) {
    if (r == v.rank)
      ck_assert_msg(codes[r] == -SIGKILL, "the lost rank exited with %d", codes[r]);
    else
      ck_assert_msg(codes[r] == 0, "rank %d exited with %d", r, codes[r]);
  }
}

/* _i 2 and 3: the others wait for the lost rank in a lane. */
START_TEST(killed_rank_fails_pending) { lose_rank_job(_i % 2 == 0 ? 0 : 2, SIGKILL, _i >= 2, 5); }
END_TEST

START_TEST(frozen_rank_fails_pending) { lose_rank_job(_i % 2 == 0 ? 0 : 2, SIGSTOP, _i >= 2, 2); }
END_TEST

static int stall(int rank, int size, void *arg) {
  const char *log = arg;
  int64_t shape[1] = {4};
  float in[4] = {0}, out[4];
  hvd_tensor t = {rank == 1 ? "only.on.1" : "stuck", HVD_FLOAT32, 1, shape, in, out};
  hvd_handle h;
  hvd_status st;
  (void)size;

  if (rank == 0) {
    int fd = open(log, O_WRONLY | O_TRUNC | O_CREAT, 0600);
    EXPECT(fd >= 0 && dup2(fd, 2) == 2, "redirecting stderr");
    close(fd);
  }
  CALL(hvd_allreduce_async(&t, NULL, &h));
  st = hvd_handle_wait(h);
  EXPECT(st != HVD_OK, "a stalled tensor completed");
  hvd_handle_release(h);
  return 0;
}

START_TEST(stall_warns_then_shuts_down) {
  char path[] = "/tmp/hvd-stall-XXXXXX", text[8192];
  int fd = mkstemp(path);
  ssize_t n;
  ck_assert_int_ge(fd, 0);
  close(fd);
  job.env[0] = "HOROVOD_STALL_CHECK_TIME_SECONDS=1";
  job.env[1] = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=3";
  run_ok(3, stall, path);
  fd = open(path, O_RDONLY);
  ck_assert_int_ge(fd, 0);
  n = read(fd, text, sizeof(text) - 1);
  close(fd);
  unlink(path);
  ck_assert_int_gt(n, 0);
  text[n] = '\0';
  /* The warning names the tensor and the rank that did not submit it. */
  ck_assert_msg(strstr(text, "stuck") != NULL && strstr(text, "1") != NULL, "log: %s", text);
  ck_assert_msg(strstr(text, "only.on.1") != NULL, "log: %s", text);
}
END_TEST

static int timeline_steps(int rank, int size, void *arg) {
  (void)arg;
  for (int k = 0; k < 5; k++) {
    int sum = 0;
    CALL(allreduce_int(rank, HVD_SUM, &sum));
    EXPECT(sum == size * (size - 1) / 2, "%d", sum);
  }
  return 0;
}

/* _i 0: the small allreduces are reduced inline by rank 0 (the timeline
 * shows INLINE_ALLREDUCE, no collective); _i 1: HVD_INLINE_BYTES=0, they
 * run the collective. */
START_TEST(timeline_is_a_chrome_trace) {
  char path[] = "/tmp/hvd-timeline-XXXXXX", env[64];
  int fd = mkstemp(path);
  struct stat sb;
  char *text;
  cJSON *doc;
  int negotiate = 0, reduce_seen = 0, inline_seen = 0, queue = 0;

  ck_assert_int_ge(fd, 0);
  close(fd);
  snprintf(env, sizeof(env), "HOROVOD_TIMELINE=%s", path);
  job.env[0] = env;
  job.env[1] = "HOROVOD_TIMELINE_MARK_CYCLES=1";
  job.env[2] = _i == 1 ? "HVD_INLINE_BYTES=0" : NULL;
  run_ok(2, timeline_steps, NULL);
  ck_assert_int_eq(stat(path, &sb), 0);
  text = calloc(1, (size_t)sb.st_size + 1);
  fd = open(path, O_RDONLY);
  ck_assert_int_eq(read(fd, text, (size_t)sb.st_size), sb.st_size);
  close(fd);
  unlink(path);
  doc = cJSON_Parse(text);
  ck_assert_msg(doc != NULL, "the timeline is not JSON: %.300s", text);
  ck_assert(cJSON_IsArray(doc) || cJSON_IsObject(doc));
  cJSON *events = cJSON_IsArray(doc) ? doc : cJSON_GetObjectItem(doc, "traceEvents");
  ck_assert(cJSON_IsArray(events));
  cJSON *e;
  cJSON_ArrayForEach(e, events) {
    cJSON *name = cJSON_GetObjectItem(e, "name"), *ph = cJSON_GetObjectItem(e, "ph");
    if (!cJSON_IsString(name) || !cJSON_IsString(ph) || strcmp(ph->valuestring, "B") != 0)
      continue; /* phases counted where they begin (their E events carry the name too) */
    negotiate += strcmp(name->valuestring, "NEGOTIATE_ALLREDUCE") == 0;
    reduce_seen += strcmp(name->valuestring, "ALLREDUCE") == 0;
    inline_seen += strcmp(name->valuestring, "INLINE_ALLREDUCE") == 0;
    queue += strcmp(name->valuestring, "QUEUE") == 0;
  }
  ck_assert_msg(negotiate == 5 && queue == 5, "the timeline lacks events: %.500s", text);
  ck_assert_msg(strstr(text, "\"start_time_since_epoch_in_micros\":") != NULL,
                "the timeline lacks its start time: %.300s", text);
  ck_assert_msg(reduce_seen == (_i == 1 ? 5 : 0) && inline_seen == (_i == 1 ? 0 : 5),
                "%d ALLREDUCE and %d INLINE_ALLREDUCE events (inline %s): %.500s", reduce_seen,
                inline_seen, _i == 1 ? "off" : "on", text);
  cJSON_Delete(doc);
  free(text);
}
END_TEST

/* ==== suites ================================================================================== */

static TCase *mp_case(Suite *s, const char *name, int timeout) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_set_timeout(tc, timeout);
  suite_add_tcase(s, tc);
  return tc;
}

/* ==== the autotuner ================================================================== */

enum { TUNE_OPS = 80, TUNE_SAMPLES = 10 };

static char tune_log[64];

/* HOROVOD_AUTOTUNE with a sample per list: the setting changes every few
 * operations, moving the ring's switch point across these sizes among
 * others. A rank that applied a setting at another operation than the
 * others would run another algorithm: the sums would be wrong or the job
 * would hang. Rank 0's log must hold every scored sample, and the job
 * must end with the tuner's final setting. */
static int tuned_allreduces(int rank, int size, void *arg) {
  (void)arg;
  for (int k = 0; k < TUNE_OPS; k++) {
    int64_t n = 1 + (k * 7919) % 200000, tshape[1] = {n};
    float *in = malloc((size_t)n * sizeof(float));
    hvd_tensor t = {NULL, HVD_FLOAT32, 1, tshape, in, in};
    hvd_options o = HVD_OPTIONS_INIT;
    EXPECT(in != NULL, "no memory");
    for (int64_t i = 0; i < n; i++)
      in[i] = (float)(rank + 1 + i % 3);
    o.op = HVD_SUM;
    CALL(hvd_allreduce(&t, &o));
    for (int64_t i = 0; i < n; i++)
      EXPECT(in[i] == (float)(size * (size + 1) / 2 + size * (i % 3)),
             "op %d element %lld: %g", k, (long long)i, in[i]);
    free(in);
  }
  if (rank == 0) {
    FILE *f = fopen(tune_log, "r");
    char line[512];
    int rows = 0;
    EXPECT(f != NULL, "rank 0 wrote no log at %s", tune_log);
    while (fgets(line, sizeof(line), f) != NULL)
      rows++;
    fclose(f);
    EXPECT(rows >= 1 + TUNE_SAMPLES, "the log has %d lines, fewer than %d samples", rows,
           TUNE_SAMPLES);
  }
  return 0;
}

START_TEST(autotune_keeps_every_rank_in_step) {
  static char log_env[96];
  int fd;
  snprintf(tune_log, sizeof(tune_log), "/tmp/hvd-tune-XXXXXX");
  fd = mkstemp(tune_log);
  ck_assert_int_ge(fd, 0);
  close(fd);
  snprintf(log_env, sizeof(log_env), "HOROVOD_AUTOTUNE_LOG=%s", tune_log);
  job.env[0] = "HOROVOD_AUTOTUNE=1";
  job.env[1] = "HOROVOD_AUTOTUNE_WARMUP_SAMPLES=1";
  job.env[2] = "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=1";
  job.env[3] = "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=10";
  job.env[4] = "HVD_INLINE_BYTES=0";
  job.env[5] = log_env;
  run_ok(3, tuned_allreduces, NULL);
  unlink(tune_log);
}
END_TEST

static Suite *collectives_suite(void) {
  Suite *s = suite_create("collectives");
  TCase *tc = mp_case(s, "values", 300);
  tcase_add_loop_test(tc, allreduce_all_types, 1, 4);
  tcase_add_loop_test(tc, allreduce_scale_factors, 2, 4);
  tcase_add_loop_test(tc, allreduce_all_types_no_inline, 2, 4);
  tcase_add_loop_test(tc, small_allreduces_each_step, 1, 5);
  tcase_add_loop_test(tc, small_allreduces_each_step_no_cache, 2, 4);
  tcase_add_loop_test(tc, small_allreduces_through_lanes, 2, 6);
  tcase_add_loop_test(tc, allgather_variable, 1, 5);
  tcase_add_loop_test(tc, broadcast_every_root, 2, 4);
  tcase_add_loop_test(tc, alltoall_splits, 1, 5);
  tcase_add_loop_test(tc, reducescatter_shares, 1, 5);
  tcase_add_loop_test(tc, grouped_allreduce, 2, 4);
  tcase_add_loop_test(tc, grouped_allgather, 1, 4);
  tcase_add_loop_test(tc, grouped_reducescatter, 1, 4);
  tcase_add_loop_test(tc, empty_tensors_without_buffers, 1, 4);
  tcase_add_loop_test(tc, allreduce_wait_for_outcomes, 2, 4);
  return s;
}

static Suite *async_suite(void) {
  Suite *s = suite_create("async");
  TCase *tc = mp_case(s, "in_flight", 300);
  tcase_add_loop_test(tc, async_in_flight, 0, (int)HVD_ARRAY_SIZE(async_settings));
  tcase_add_test(tc, user_threads);
  tcase_add_test(tc, settings_follow_rank_0);
  tcase_add_test(tc, settings_must_match);
  tcase_add_loop_test(tc, shm_must_match, 0, 2);
  tcase_add_test(tc, long_lists_cross);
  tcase_add_test(tc, autotune_keeps_every_rank_in_step);
  return s;
}

static Suite *errors_suite(void) {
  Suite *s = suite_create("errors");
  TCase *tc = mp_case(s, "errors", 120);
  tcase_add_loop_test(tc, mismatch_reported_everywhere, 2, 4);
  tcase_add_loop_test(tc, cached_then_changed_fails_everywhere, 0, 4);
  tcase_add_test(tc, duplicate_name_rejected);
  tcase_add_loop_test(tc, bad_arguments_rejected, 1, 4);
  TCase *alone = tcase_create("alone");
  tcase_add_test(alone, not_initialized);
  tcase_add_test(alone, bad_environment);
  tcase_add_test(alone, timeline_unopenable);
  suite_add_tcase(s, alone);
  return s;
}

static Suite *join_suite(void) {
  Suite *s = suite_create("join");
  TCase *tc = mp_case(s, "join", 120);
  tcase_add_loop_test(tc, join_each_rank_first, 0, 6);
  tcase_add_loop_test(tc, join_twice, 1, 4);
  tcase_add_loop_test(tc, join_keeps_generated_names, 2, 4);
  tcase_add_loop_test(tc, barrier_waits_for_all, 2, 4);
  return s;
}

static Suite *sets_suite(void) {
  Suite *s = suite_create("sets");
  TCase *tc = mp_case(s, "sets", 120);
  tcase_add_test(tc, process_sets_even_odd);
  return s;
}

static Suite *lifecycle_suite(void) {
  Suite *s = suite_create("lifecycle");
  TCase *tc = mp_case(s, "lifecycle", 120);
  tcase_add_loop_test(tc, init_after_shutdown, 1, 4);
  tcase_add_loop_test(tc, homogeneous_hosts, 0, 3);
  tcase_add_loop_test(tc, control_rings_on_rank0_host, 0, 2);
  tcase_add_test(tc, listener_answers_or_refuses);
  tcase_add_loop_test(tc, shutdown_aborts_pending, 2, 4);
  tcase_add_loop_test(tc, shutdown_names_the_rank, 2, 4);
  tcase_add_loop_test(tc, shutdown_while_waiting, 2, 3);
  tcase_add_loop_test(tc, wait_in_a_callback_is_refused, 2, 3);
  tcase_add_test(tc, shutdown_ends_a_waiting_init);
  tcase_add_loop_test(tc, shutdown_in_a_callback_is_refused, 1, 3);
  tcase_add_loop_test(tc, killed_rank_fails_pending, 0, 4);
  tcase_add_loop_test(tc, frozen_rank_fails_pending, 0, 4);
  tcase_add_test(tc, stall_warns_then_shuts_down);
  tcase_add_loop_test(tc, timeline_is_a_chrome_trace, 0, 2);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(coord_units_suite());
  int failed;
  srunner_add_suite(sr, collectives_suite());
  srunner_add_suite(sr, async_suite());
  srunner_add_suite(sr, errors_suite());
  srunner_add_suite(sr, join_suite());
  srunner_add_suite(sr, sets_suite());
  srunner_add_suite(sr, lifecycle_suite());
  srunner_add_suite(sr, coord_timeline_suite());
  srunner_run_all(sr, CK_ENV);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
