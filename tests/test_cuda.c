/*
 * The CUDA backend on a real GPU. Every collective runs twice on the same
 * data, once on CPU tensors and once on GPU tensors, and the results must
 * be the same bytes (the CPU path is checked against references in
 * test_coord); scaling, fusion and the ready event are checked against
 * references computed here. Inputs are small integers, so every reduction
 * order gives the same bits in every dtype. Suites, one job layout each:
 *   nccl          a job of one rank through NCCL (hvd's default)
 *   host          2 and 3 ranks sharing GPU 0 with HVD_GPU_COLLECTIVES=host
 *                 (NCCL refuses ranks that share a GPU)
 *   nccl_pair     2 ranks on GPUs 0 and 1 through NCCL (needs two GPUs)
 *   hierarchical  HOROVOD_HIERARCHICAL_ALLREDUCE over two fake hosts: one
 *                 rank per host on GPU 0 (and 2 per host on GPUs 0 and 1
 *                 when there are two); allreduces only
 * main exits 77 (ctest's skip) before Check forks when the build has no
 * CUDA or no GPU is usable. This process never initialises CUDA itself (a
 * CUDA context does not survive fork): the probe runs in a child, and so
 * does every CUDA call of the ranks. A rank that fails returns at once;
 * its process exits, so those paths free nothing.
 */
#include <stdio.h>
#include <stdlib.h>

#ifndef HVD_TEST_CUDA

int main(void) {
  printf("SKIPPED: built without CUDA (configure with -DHVD_WITH_CUDA=ON, with the CUDA "
         "toolkit and NCCL installed, to build the GPU tests)\n");
  return 77;
}

#else /* HVD_TEST_CUDA */

#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>

#include "coord_harness.h"

enum { EXIT_SKIP = 77, SHARED_REFUSED = 20, SHARED_WORKED = 21 };

/* The layout of a suite's jobs, set by its fixture (in Check's child). */
struct layout {
  int sizes[2]; /* the job sizes of the loop's two iterations (0: none) */
  int gpus;     /* a rank uses GPU local_rank % gpus */
  bool host;    /* HVD_GPU_COLLECTIVES=host */
  bool hier;    /* two fake hosts, hierarchical allreduce */
};

static struct layout layout;
static int gpus_seen; /* the probe's count, set in main before Check forks */

/* ==== values ======================================================================== */

/* Rank r's element i: |v| <= 7 (products: 1 or 2), so that sums over 4
 * ranks, products and the scale factors below stay exact even in bfloat16
 * (8 significant bits). */
static double value(hvd_reduce_op op, int r, size_t i) {
  int v;
  if (op == HVD_PRODUCT)
    return (double)(1 + ((size_t)r + i) % 2);
  v = 1 + (int)((3 * (size_t)r + i) % 7);
  return i % 4 == 3 ? -v : v;
}

/* A host buffer of n elements of rank r's values (one spare byte: never
 * NULL for n 0). */
static void *fill(hvd_dtype t, hvd_reduce_op op, int r, size_t n) {
  unsigned char *buf = malloc(n * hvd_dtype_size(t) + 1);
  for (size_t i = 0; buf != NULL && i < n; i++)
    element_put(t, buf, i, value(op, r, i));
  return buf;
}

static double combine(hvd_reduce_op op, double a, double b) {
  switch (op) {
  case HVD_SUM:
  case HVD_AVERAGE: return a + b;
  case HVD_MIN: return b < a ? b : a;
  case HVD_MAX: return b > a ? b : a;
  case HVD_PRODUCT: return a * b;
  case HVD_ADASUM: break; /* not element-wise */
  }
  return NAN;
}

/* Element i of an allreduce over size ranks as documented: each input
 * times prescale, reduced, times postscale (over size for AVERAGE), the
 * factor applied as ops_scale does (float32: a float multiply; integers:
 * a double multiply truncated toward zero). float32 and integers only. */
static double reference(hvd_dtype t, hvd_reduce_op op, double pre, double post, int size,
                        size_t i) {
  double acc = 0, f = op == HVD_AVERAGE ? post / size : post;
  for (int r = 0; r < size; r++) {
    double v = value(op, r, i);
    v = t == HVD_FLOAT32 ? (double)((float)v * (float)pre) : trunc(v * pre);
    acc = r == 0 ? v : combine(op, acc, v);
  }
  return t == HVD_FLOAT32 ? (double)((float)acc * (float)f) : trunc(acc * f);
}

/* ==== device memory ===================================================================== */

#define CUDA_CALL(expr)                                                                            \
  do {                                                                                             \
    cudaError_t err_ = (expr);                                                                     \
    if (err_ != cudaSuccess)                                                                       \
      return report(EXIT_FAILED, "%s:%d: %s: %s (%s)", __FILE__, __LINE__, #expr,                  \
                    cudaGetErrorString(err_), cudaGetErrorName(err_));                             \
  } while (0)

/* An hvd call that must succeed; what names the case. */
#define HVD_CALL(what, expr)                                                                       \
  do {                                                                                             \
    hvd_status st_ = (expr);                                                                       \
    if (st_ != HVD_OK)                                                                             \
      return report(EXIT_FAILED, "%s: %s: %s: %s", what, #expr, hvd_strerror(st_),                 \
                    hvd_last_error_message());                                                     \
  } while (0)

/* This rank's GPU, made current for the test's own CUDA calls. */
static int use_gpu(int *dev) {
  *dev = hvd_local_rank() % layout.gpus;
  CUDA_CALL(cudaSetDevice(*dev));
  return 0;
}

/* Device memory holding bytes of host (a byte at least, so empty tensors
 * have a pointer too). hvd's stream does not wait for the legacy default
 * stream, and a copy from pageable memory may return before its DMA is
 * done: the device is synchronized, so the input is ready now. */
static int upload(const void *host, size_t bytes, void **dev) {
  CUDA_CALL(cudaMalloc(dev, bytes + 1));
  if (bytes > 0)
    CUDA_CALL(cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice));
  CUDA_CALL(cudaDeviceSynchronize());
  return 0;
}

/* Uninitialised device memory of bytes (and a spare byte). */
static int dev_alloc(size_t bytes, void **dev) {
  CUDA_CALL(cudaMalloc(dev, bytes + 1));
  return 0;
}

/* A host copy of bytes of device memory (never NULL on success). */
static int download(const void *dev, size_t bytes, void **host) {
  *host = malloc(bytes + 1);
  EXPECT(*host != NULL, "cannot allocate %zu bytes", bytes);
  if (bytes > 0)
    CUDA_CALL(cudaMemcpy(*host, dev, bytes, cudaMemcpyDeviceToHost));
  return 0;
}

/* The GPU's n elements against the CPU's, byte for byte. */
static int compare(const char *what, hvd_dtype t, const void *cpu, const void *gpu, size_t n) {
  size_t es = hvd_dtype_size(t);
  for (size_t i = 0; i < n; i++) {
    if (memcmp((const char *)cpu + i * es, (const char *)gpu + i * es, es) != 0)
      return report(EXIT_WRONG, "%s: element %zu of %zu is %g on the GPU, %g on the CPU", what, i,
                    n, element_get(t, gpu, i), element_get(t, cpu, i));
  }
  return 0;
}

/* The GPU's n elements against reference(). */
static int compare_reference(const char *what, hvd_dtype t, hvd_reduce_op op, double pre,
                             double post, int size, const void *gpu, size_t n) {
  for (size_t i = 0; i < n; i++) {
    double want = reference(t, op, pre, post, size, i), got = element_get(t, gpu, i);
    if (got != want)
      return report(EXIT_WRONG, "%s: element %zu of %zu is %g, expected %g", what, i, n, got,
                    want);
  }
  return 0;
}

static hvd_options options(hvd_reduce_op op, double pre, double post) {
  hvd_options o = HVD_OPTIONS_INIT;
  o.op = op;
  o.prescale = pre;
  o.postscale = post;
  return o;
}

/* ==== allreduce ========================================================================= */

static const hvd_dtype reduce_dtypes[] = {HVD_FLOAT32, HVD_FLOAT16, HVD_BFLOAT16,
                                          HVD_INT32,   HVD_INT64,   HVD_INT16};
static const hvd_reduce_op reduce_ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX, HVD_PRODUCT};
static const struct {
  double pre, post;
} scales[] = {{1.0, 1.0}, {2.0, 0.5}, {0.5, 3.0}};
static const int64_t reduce_counts[] = {1, 7, 1027};

struct reduce_case {
  hvd_dtype dtype;
  hvd_reduce_op op;
  double pre, post;
  int64_t count;
  bool in_place;
};

static int allreduce_case(int rank, int dev, const struct reduce_case *c) {
  size_t n = (size_t)c->count, bytes = n * hvd_dtype_size(c->dtype);
  int64_t shape[1] = {c->count};
  void *in = fill(c->dtype, c->op, rank, n), *cpu = malloc(bytes + 1), *gpu, *din, *dout;
  hvd_options o = options(c->op, c->pre, c->post);
  hvd_tensor t = {NULL, c->dtype, 1, shape, in, cpu};
  char what[160];
  int code;

  snprintf(what, sizeof(what), "allreduce %s %s prescale %g postscale %g count %zu%s",
           hvd_dtype_name(c->dtype), hvd_reduce_op_name(c->op), c->pre, c->post, n,
           c->in_place ? " in place" : "");
  EXPECT(in != NULL && cpu != NULL, "%s: out of memory", what);
  HVD_CALL(what, hvd_allreduce(&t, &o));
  if ((code = upload(in, bytes, &din)) != 0)
    return code;
  dout = din;
  if (!c->in_place && (code = dev_alloc(bytes, &dout)) != 0)
    return code;
  t.input = din;
  t.output = dout;
  o.device = dev;
  HVD_CALL(what, hvd_allreduce(&t, &o));
  if ((code = download(dout, bytes, &gpu)) != 0)
    return code;
  code = compare(what, c->dtype, cpu, gpu, n);
  cudaFree(din);
  if (dout != din)
    cudaFree(dout);
  free(in);
  free(cpu);
  free(gpu);
  return code;
}

/* Every dtype, op and scaling, then in place, empty and a large tensor. */
static int allreduce_rank(int rank, int size, void *arg) {
  static const struct reduce_case extra[] = {
      {HVD_FLOAT32, HVD_SUM, 1.0, 1.0, 1027, true},
      {HVD_INT16, HVD_AVERAGE, 2.0, 0.5, 1027, true},
      {HVD_FLOAT32, HVD_SUM, 1.0, 1.0, 0, false},
      {HVD_INT16, HVD_SUM, 1.0, 1.0, 0, false},
      {HVD_FLOAT32, HVD_AVERAGE, 2.0, 0.5, (1 << 20) + 3, false},
      {HVD_BFLOAT16, HVD_MAX, 1.0, 1.0, (1 << 20) + 3, true},
  };
  int dev, code;
  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (size_t d = 0; d < HVD_ARRAY_SIZE(reduce_dtypes); d++) {
    for (size_t p = 0; p < HVD_ARRAY_SIZE(reduce_ops); p++) {
      for (size_t s = 0; s < HVD_ARRAY_SIZE(scales); s++) {
        for (size_t k = 0; k < HVD_ARRAY_SIZE(reduce_counts); k++) {
          struct reduce_case c = {reduce_dtypes[d], reduce_ops[p], scales[s].pre,
                                  scales[s].post,   reduce_counts[k], false};
          if ((code = allreduce_case(rank, dev, &c)) != 0)
            return code;
        }
      }
    }
  }
  for (size_t k = 0; k < HVD_ARRAY_SIZE(extra); k++) {
    if ((code = allreduce_case(rank, dev, &extra[k])) != 0)
      return code;
  }
  return 0;
}

/* prescale, postscale and average against reference(). */
static int scaling_rank(int rank, int size, void *arg) {
  static const hvd_dtype dtypes[] = {HVD_FLOAT32, HVD_INT32, HVD_INT64, HVD_INT16};
  static const struct {
    double pre, post;
  } factors[] = {{1.0, 1.0}, {2.0, 0.5}, {1.0, 0.25}, {3.0, 1.0}, {0.5, 3.0}};
  const size_t n = 1027;
  int64_t shape[1] = {(int64_t)n};
  int dev, code;

  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (size_t d = 0; d < HVD_ARRAY_SIZE(dtypes); d++) {
    for (size_t p = 0; p < HVD_ARRAY_SIZE(reduce_ops); p++) {
      for (size_t f = 0; f < HVD_ARRAY_SIZE(factors); f++) {
        hvd_dtype t = dtypes[d];
        hvd_reduce_op op = reduce_ops[p];
        size_t bytes = n * hvd_dtype_size(t);
        void *in = fill(t, op, rank, n), *din, *dout, *gpu;
        hvd_options o = options(op, factors[f].pre, factors[f].post);
        hvd_tensor tensor = {NULL, t, 1, shape, NULL, NULL};
        char what[160];
        snprintf(what, sizeof(what), "allreduce %s %s prescale %g postscale %g over %d ranks",
                 hvd_dtype_name(t), hvd_reduce_op_name(op), o.prescale, o.postscale, size);
        EXPECT(in != NULL, "%s: out of memory", what);
        if ((code = upload(in, bytes, &din)) != 0 || (code = dev_alloc(bytes, &dout)) != 0)
          return code;
        tensor.input = din;
        tensor.output = dout;
        o.device = dev;
        HVD_CALL(what, hvd_allreduce(&tensor, &o));
        if ((code = download(dout, bytes, &gpu)) != 0 ||
            (code = compare_reference(what, t, op, o.prescale, o.postscale, size, gpu, n)) != 0)
          return code;
        cudaFree(din);
        cudaFree(dout);
        free(in);
        free(gpu);
      }
    }
  }
  return 0;
}

/* ==== grouped allreduce and fusion ========================================================= */

static const int64_t group_counts[] = {1, 7, 0, 1027, 3};

static int grouped_rank(int rank, int size, void *arg) {
  static const struct {
    hvd_dtype dtype;
    hvd_reduce_op op;
    double pre, post;
  } cases[] = {{HVD_FLOAT32, HVD_SUM, 2.0, 0.5},      {HVD_INT32, HVD_AVERAGE, 1.0, 1.0},
               {HVD_BFLOAT16, HVD_MAX, 1.0, 1.0},     {HVD_FLOAT16, HVD_PRODUCT, 2.0, 1.0},
               {HVD_INT64, HVD_MIN, 1.0, 3.0},        {HVD_INT16, HVD_SUM, 2.0, 0.5}};
  enum { N = HVD_ARRAY_SIZE(group_counts) };
  int dev, code;

  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (size_t c = 0; c < HVD_ARRAY_SIZE(cases); c++) {
    hvd_dtype t = cases[c].dtype;
    hvd_options o = options(cases[c].op, cases[c].pre, cases[c].post);
    hvd_tensor cpu[N], gpu[N];
    void *in[N], *dev_in[N];
    char what[160];
    snprintf(what, sizeof(what), "grouped allreduce of %d %s %s prescale %g postscale %g", N,
             hvd_dtype_name(t), hvd_reduce_op_name(o.op), o.prescale, o.postscale);
    for (int k = 0; k < N; k++) {
      size_t bytes = (size_t)group_counts[k] * hvd_dtype_size(t);
      in[k] = fill(t, o.op, rank, (size_t)group_counts[k]);
      cpu[k] = (hvd_tensor){NULL, t, 1, &group_counts[k], in[k], malloc(bytes + 1)};
      EXPECT(in[k] != NULL && cpu[k].output != NULL, "%s: out of memory", what);
      gpu[k] = cpu[k];
      if ((code = upload(in[k], bytes, &dev_in[k])) != 0 ||
          (code = dev_alloc(bytes, &gpu[k].output)) != 0)
        return code;
      gpu[k].input = dev_in[k];
    }
    HVD_CALL(what, hvd_grouped_allreduce(cpu, N, &o));
    o.device = dev;
    HVD_CALL(what, hvd_grouped_allreduce(gpu, N, &o));
    for (int k = 0; k < N; k++) {
      size_t count = (size_t)group_counts[k];
      void *got;
      if ((code = download(gpu[k].output, count * hvd_dtype_size(t), &got)) != 0 ||
          (code = compare(what, t, cpu[k].output, got, count)) != 0)
        return code;
      free(got);
      free(in[k]);
      free(cpu[k].output);
      cudaFree(dev_in[k]);
      cudaFree(gpu[k].output);
    }
  }
  return 0;
}

enum { FUSED = 64 };

/* FUSED small allreduces of different lengths (so the fusion buffer's
 * offsets are odd), submitted together, then as one group. */
static int fusion_rank(int rank, int size, void *arg) {
  const hvd_reduce_op op = HVD_SUM;
  const double pre = 2.0, post = 0.5;
  int64_t shapes[FUSED];
  void *in[FUSED], *out[FUSED];
  hvd_handle h[FUSED];
  hvd_tensor group[FUSED];
  hvd_options o = options(op, pre, post);
  int dev, code;

  if ((code = use_gpu(&dev)) != 0)
    return code;
  o.device = dev;
  for (int k = 0; k < FUSED; k++) {
    size_t bytes = (size_t)(k + 1) * sizeof(float);
    void *host = fill(HVD_FLOAT32, op, rank, (size_t)k + 1);
    EXPECT(host != NULL, "out of memory");
    shapes[k] = k + 1;
    if ((code = upload(host, bytes, &in[k])) != 0 || (code = dev_alloc(bytes, &out[k])) != 0)
      return code;
    free(host);
    group[k] = (hvd_tensor){NULL, HVD_FLOAT32, 1, &shapes[k], in[k], out[k]};
  }
  for (int round = 0; round < 2; round++) {
    const char *what = round == 0 ? "64 allreduces submitted together" : "a group of 64";
    for (int k = 0; k < FUSED; k++)
      CUDA_CALL(cudaMemset(out[k], 0xff, (size_t)shapes[k] * sizeof(float)));
    CUDA_CALL(cudaDeviceSynchronize()); /* see upload */
    if (round == 0) {
      for (int k = 0; k < FUSED; k++)
        HVD_CALL(what, hvd_allreduce_async(&group[k], &o, &h[k]));
      for (int k = 0; k < FUSED; k++) {
        HVD_CALL(what, hvd_handle_wait(h[k]));
        hvd_handle_release(h[k]);
      }
    } else {
      HVD_CALL(what, hvd_grouped_allreduce(group, FUSED, &o));
    }
    for (int k = 0; k < FUSED; k++) {
      void *got;
      if ((code = download(out[k], (size_t)shapes[k] * sizeof(float), &got)) != 0 ||
          (code = compare_reference(what, HVD_FLOAT32, op, pre, post, size, got,
                                    (size_t)shapes[k])) != 0)
        return code;
      free(got);
    }
  }
  for (int k = 0; k < FUSED; k++) {
    cudaFree(in[k]);
    cudaFree(out[k]);
  }
  return 0;
}

/* ==== allgather =========================================================================== */

enum rows_kind { ROWS_EVEN, ROWS_RAMP, ROWS_HOLE };

static int64_t rows_of(enum rows_kind k, int rank) {
  switch (k) {
  case ROWS_EVEN: return 3;
  case ROWS_RAMP: return rank + 1;
  case ROWS_HOLE: return rank == 1 ? 0 : rank + 2; /* rank 1 sends nothing */
  }
  return 0;
}

struct gather_case {
  hvd_dtype dtype;
  int64_t width; /* elements per row */
  enum rows_kind rows;
};

/* n allgathers submitted together (fused when they share a dtype), on the
 * CPU and then on the GPU; outputs and shapes must agree. */
static int gather_batch(int rank, int dev, const struct gather_case *cases, size_t n) {
  int64_t shapes[8][2];
  void *in[8], *dev_in[8];
  hvd_handle cpu[8], gpu[8];
  hvd_options o = HVD_OPTIONS_INIT;
  int code;

  EXPECT(n <= 8, "at most 8 allgathers at once");
  for (size_t k = 0; k < n; k++) {
    size_t count;
    shapes[k][0] = rows_of(cases[k].rows, rank);
    shapes[k][1] = cases[k].width;
    count = (size_t)(shapes[k][0] * shapes[k][1]);
    in[k] = fill(cases[k].dtype, HVD_SUM, rank, count);
    EXPECT(in[k] != NULL, "out of memory");
    if ((code = upload(in[k], count * hvd_dtype_size(cases[k].dtype), &dev_in[k])) != 0)
      return code;
  }
  for (int on_gpu = 0; on_gpu < 2; on_gpu++) {
    o.device = on_gpu ? dev : HVD_DEVICE_CPU;
    for (size_t k = 0; k < n; k++) {
      hvd_tensor t = {NULL, cases[k].dtype, 2, shapes[k], on_gpu ? dev_in[k] : in[k], NULL};
      HVD_CALL("allgather", hvd_allgather_async(&t, &o, on_gpu ? &gpu[k] : &cpu[k]));
    }
  }
  for (size_t k = 0; k < n; k++) {
    void *want, *got_dev, *got;
    size_t want_bytes, got_bytes;
    int64_t want_shape[2], got_shape[2];
    char what[160];
    static const char *const rows_text[] = {"even", "uneven", "with an empty rank"};
    snprintf(what, sizeof(what), "allgather %zu of %zu: %s, %lld columns, rows %s", k + 1, n,
             hvd_dtype_name(cases[k].dtype), (long long)cases[k].width,
             rows_text[cases[k].rows]);
    HVD_CALL(what, hvd_handle_wait(cpu[k]));
    HVD_CALL(what, hvd_handle_wait(gpu[k]));
    HVD_CALL(what, hvd_handle_output(cpu[k], &want, &want_bytes, want_shape));
    HVD_CALL(what, hvd_handle_output(gpu[k], &got_dev, &got_bytes, got_shape));
    EXPECT(got_bytes == want_bytes && got_shape[0] == want_shape[0] &&
               got_shape[1] == want_shape[1],
           "%s: the GPU's output has %zu bytes, shape [%lld, %lld]; the CPU's %zu, [%lld, %lld]",
           what, got_bytes, (long long)got_shape[0], (long long)got_shape[1], want_bytes,
           (long long)want_shape[0], (long long)want_shape[1]);
    if ((code = download(got_dev, got_bytes, &got)) != 0 ||
        (code = compare(what, cases[k].dtype, want, got,
                        got_bytes / hvd_dtype_size(cases[k].dtype))) != 0)
      return code;
    free(got);
    hvd_handle_release(cpu[k]);
    hvd_handle_release(gpu[k]);
    free(in[k]);
    cudaFree(dev_in[k]);
  }
  return 0;
}

static int allgather_rank(int rank, int size, void *arg) {
  static const struct gather_case singles[] = {
      {HVD_FLOAT32, 3, ROWS_EVEN}, {HVD_FLOAT32, 3, ROWS_RAMP},    {HVD_FLOAT16, 5, ROWS_RAMP},
      {HVD_INT64, 1, ROWS_HOLE},   {HVD_INT16, 2, ROWS_HOLE},      {HVD_BFLOAT16, 1027, ROWS_RAMP},
  };
  static const struct gather_case fused[] = {
      {HVD_FLOAT16, 5, ROWS_RAMP}, {HVD_FLOAT16, 1, ROWS_HOLE}, {HVD_FLOAT16, 3, ROWS_EVEN}};
  int dev, code;
  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (size_t k = 0; k < HVD_ARRAY_SIZE(singles); k++) {
    if ((code = gather_batch(rank, dev, &singles[k], 1)) != 0)
      return code;
  }
  return gather_batch(rank, dev, fused, HVD_ARRAY_SIZE(fused));
}

/* ==== broadcast =========================================================================== */

static int broadcast_rank(int rank, int size, void *arg) {
  static const struct {
    hvd_dtype dtype;
    int64_t count;
    bool in_place;
  } cases[] = {{HVD_FLOAT32, 1027, false}, {HVD_FLOAT32, 1027, true}, {HVD_FLOAT16, 7, false},
               {HVD_INT64, 1, true},       {HVD_INT16, 5, false},     {HVD_FLOAT32, 0, false}};
  int dev, code;
  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (int root = 0; root < size; root++) {
    for (size_t c = 0; c < HVD_ARRAY_SIZE(cases); c++) {
      hvd_dtype t = cases[c].dtype;
      size_t n = (size_t)cases[c].count, bytes = n * hvd_dtype_size(t);
      void *in = fill(t, HVD_SUM, rank, n), *cpu = malloc(bytes + 1), *din, *dout, *got;
      hvd_options o = HVD_OPTIONS_INIT;
      hvd_tensor tensor = {NULL, t, 1, &cases[c].count, in, cpu};
      char what[160];
      snprintf(what, sizeof(what), "broadcast from rank %d of %zu %s%s", root, n,
               hvd_dtype_name(t), cases[c].in_place ? " in place" : "");
      EXPECT(in != NULL && cpu != NULL, "%s: out of memory", what);
      o.root = root;
      HVD_CALL(what, hvd_broadcast(&tensor, &o));
      if ((code = upload(in, bytes, &din)) != 0)
        return code;
      dout = din;
      if (!cases[c].in_place && (code = dev_alloc(bytes, &dout)) != 0)
        return code;
      tensor.input = din;
      tensor.output = dout;
      o.device = dev;
      HVD_CALL(what, hvd_broadcast(&tensor, &o));
      if ((code = download(dout, bytes, &got)) != 0 || (code = compare(what, t, cpu, got, n)) != 0)
        return code;
      cudaFree(din);
      if (dout != din)
        cudaFree(dout);
      free(in);
      free(cpu);
      free(got);
    }
  }
  return 0;
}

/* ==== alltoall ============================================================================= */

enum split_kind { SPLIT_EVEN /* NULL splits */, SPLIT_UNEVEN, SPLIT_NONE_TO_SELF };

static int64_t splits_of(enum split_kind k, int rank, int size, int32_t *splits) {
  int64_t rows = 0;
  for (int p = 0; p < size; p++) {
    splits[p] = k == SPLIT_EVEN ? 2 : k == SPLIT_UNEVEN ? (rank + 2 * p) % 3 : p == rank ? 0 : 2;
    rows += splits[p];
  }
  return k == SPLIT_UNEVEN ? rows + 1 : rows; /* uneven: one row nobody receives */
}

static int alltoall_rank(int rank, int size, void *arg) {
  static const struct {
    hvd_dtype dtype;
    int64_t width;
    enum split_kind splits;
  } cases[] = {{HVD_FLOAT32, 3, SPLIT_EVEN},    {HVD_FLOAT32, 3, SPLIT_UNEVEN},
               {HVD_FLOAT16, 5, SPLIT_UNEVEN},  {HVD_INT16, 1, SPLIT_UNEVEN},
               {HVD_INT64, 2, SPLIT_NONE_TO_SELF}};
  int32_t splits[16];
  int dev, code;
  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (size_t c = 0; c < HVD_ARRAY_SIZE(cases); c++) {
    hvd_dtype t = cases[c].dtype;
    int64_t shape[2] = {splits_of(cases[c].splits, rank, size, splits), cases[c].width};
    const int32_t *sp = cases[c].splits == SPLIT_EVEN ? NULL : splits;
    size_t n = (size_t)(shape[0] * shape[1]);
    void *in = fill(t, HVD_SUM, rank, n), *din, *want, *got_dev, *got;
    const int32_t *want_splits, *got_splits;
    size_t want_bytes, got_bytes, want_n, got_n;
    int64_t want_shape[2], got_shape[2];
    hvd_options o = HVD_OPTIONS_INIT;
    hvd_tensor tensor = {NULL, t, 2, shape, in, NULL};
    hvd_handle cpu, gpu;
    char what[160];
    snprintf(what, sizeof(what), "alltoall of %s, %lld columns, %s splits", hvd_dtype_name(t),
             (long long)shape[1], sp == NULL ? "even (NULL)" : "uneven");
    EXPECT(in != NULL, "%s: out of memory", what);
    if ((code = upload(in, n * hvd_dtype_size(t), &din)) != 0)
      return code;
    HVD_CALL(what, hvd_alltoall_async(&tensor, sp, &o, &cpu));
    HVD_CALL(what, hvd_handle_wait(cpu));
    tensor.input = din;
    o.device = dev;
    HVD_CALL(what, hvd_alltoall_async(&tensor, sp, &o, &gpu));
    HVD_CALL(what, hvd_handle_wait(gpu));
    HVD_CALL(what, hvd_handle_output(cpu, &want, &want_bytes, want_shape));
    HVD_CALL(what, hvd_handle_output(gpu, &got_dev, &got_bytes, got_shape));
    HVD_CALL(what, hvd_handle_received_splits(cpu, &want_splits, &want_n));
    HVD_CALL(what, hvd_handle_received_splits(gpu, &got_splits, &got_n));
    EXPECT(got_bytes == want_bytes && got_shape[0] == want_shape[0] && got_n == want_n &&
               memcmp(got_splits, want_splits, got_n * sizeof(*got_splits)) == 0,
           "%s: the GPU's output has %zu bytes, %lld rows; the CPU's %zu, %lld rows (or the "
           "received splits differ)",
           what, got_bytes, (long long)got_shape[0], want_bytes, (long long)want_shape[0]);
    if ((code = download(got_dev, got_bytes, &got)) != 0 ||
        (code = compare(what, t, want, got, got_bytes / hvd_dtype_size(t))) != 0)
      return code;
    hvd_handle_release(cpu);
    hvd_handle_release(gpu);
    cudaFree(din);
    free(in);
    free(got);
  }
  return 0;
}

/* ==== reducescatter ======================================================================== */

static int reducescatter_rank(int rank, int size, void *arg) {
  static const hvd_dtype dtypes[] = {HVD_FLOAT32, HVD_FLOAT16, HVD_BFLOAT16, HVD_INT32,
                                     HVD_INT16};
  static const hvd_reduce_op ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MAX};
  const int64_t width = 5;
  int dev, code;
  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (int uneven = 0; uneven < 2; uneven++) {
    for (size_t d = 0; d < HVD_ARRAY_SIZE(dtypes); d++) {
      for (size_t p = 0; p < HVD_ARRAY_SIZE(ops); p++) {
        for (size_t s = 0; s < 2; s++) {
          hvd_dtype t = dtypes[d];
          int64_t shape[2] = {2 * size + uneven, width};
          size_t n = (size_t)(shape[0] * width), es = hvd_dtype_size(t);
          size_t mine = (size_t)(hvd_reducescatter_rows(shape[0], HVD_PROCESS_SET_GLOBAL) * width);
          void *in = fill(t, ops[p], rank, n), *cpu = malloc(mine * es + 1), *din, *dout, *got;
          hvd_options o = options(ops[p], scales[s].pre, scales[s].post);
          hvd_tensor tensor = {NULL, t, 2, shape, in, cpu};
          char what[160];
          snprintf(what, sizeof(what), "reducescatter %s %s prescale %g postscale %g, %lld rows",
                   hvd_dtype_name(t), hvd_reduce_op_name(o.op), o.prescale, o.postscale,
                   (long long)shape[0]);
          EXPECT(in != NULL && cpu != NULL, "%s: out of memory", what);
          HVD_CALL(what, hvd_reducescatter(&tensor, &o));
          if ((code = upload(in, n * es, &din)) != 0 || (code = dev_alloc(mine * es, &dout)) != 0)
            return code;
          tensor.input = din;
          tensor.output = dout;
          o.device = dev;
          HVD_CALL(what, hvd_reducescatter(&tensor, &o));
          if ((code = download(dout, mine * es, &got)) != 0 ||
              (code = compare(what, t, cpu, got, mine)) != 0)
            return code;
          cudaFree(din);
          cudaFree(dout);
          free(in);
          free(cpu);
          free(got);
        }
      }
    }
  }
  return 0;
}

/* ==== the ready event and hvd's outputs ===================================================== */

/* Holds the user's stream for a while, so that work hvd queued without
 * waiting for the ready event would read the input before it is filled. */
static void CUDART_CB hold_stream_cb(void *arg) {
  (void)arg;
  usleep(200 * 1000);
}

static int ready_event_rank(int rank, int size, void *arg) {
  static const hvd_dtype dtypes[] = {HVD_FLOAT32, HVD_INT16}; /* int16: host staging */
  const size_t n = 4099;
  int64_t shape[1] = {(int64_t)n};
  int dev, code;
  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (size_t d = 0; d < HVD_ARRAY_SIZE(dtypes); d++) {
    hvd_dtype t = dtypes[d];
    size_t bytes = n * hvd_dtype_size(t);
    void *values = fill(t, HVD_SUM, rank, n), *pinned, *din, *dout, *got;
    cudaStream_t stream;
    cudaEvent_t ready;
    hvd_options o = HVD_OPTIONS_INIT;
    hvd_tensor tensor = {NULL, t, 1, shape, NULL, NULL};
    char what[160];
    snprintf(what, sizeof(what), "allreduce of %zu %s after a ready event", n, hvd_dtype_name(t));
    EXPECT(values != NULL, "%s: out of memory", what);
    CUDA_CALL(cudaMallocHost(&pinned, bytes));
    memcpy(pinned, values, bytes);
    if ((code = dev_alloc(bytes, &din)) != 0 || (code = dev_alloc(bytes, &dout)) != 0)
      return code;
    CUDA_CALL(cudaMemset(din, 0xff, bytes)); /* NaN or -1 until filled */
    CUDA_CALL(cudaDeviceSynchronize());
    CUDA_CALL(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CALL(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    CUDA_CALL(cudaLaunchHostFunc(stream, hold_stream_cb, NULL));
    CUDA_CALL(cudaMemcpyAsync(din, pinned, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CALL(cudaEventRecord(ready, stream));
    tensor.input = din;
    tensor.output = dout;
    o.device = dev;
    o.ready_event = ready;
    HVD_CALL(what, hvd_allreduce(&tensor, &o));
    if ((code = download(dout, bytes, &got)) != 0 ||
        (code = compare_reference(what, t, HVD_SUM, 1.0, 1.0, size, got, n)) != 0)
      return code;
    CUDA_CALL(cudaStreamSynchronize(stream));
    cudaEventDestroy(ready);
    cudaStreamDestroy(stream);
    cudaFreeHost(pinned);
    cudaFree(din);
    cudaFree(dout);
    free(values);
    free(got);
  }
  return 0;
}

/* The outputs hvd allocates for GPU tensors are device memory on the
 * tensor's GPU (int16 allgathers too, which host staging moves). */
static int outputs_on_device_rank(int rank, int size, void *arg) {
  static const hvd_dtype dtypes[] = {HVD_FLOAT32, HVD_INT16};
  int dev, code;
  if ((code = use_gpu(&dev)) != 0)
    return code;
  for (size_t d = 0; d < HVD_ARRAY_SIZE(dtypes); d++) {
    for (int alltoall = 0; alltoall < 2; alltoall++) {
      hvd_dtype t = dtypes[d];
      int64_t shape[2] = {alltoall ? 2 * size : rank + 1, 3};
      size_t n = (size_t)(shape[0] * shape[1]);
      void *in = fill(t, HVD_SUM, rank, n), *din, *out;
      size_t bytes, want = (size_t)(alltoall ? 2 * size : size * (size + 1) / 2) * 3 *
                           hvd_dtype_size(t);
      struct cudaPointerAttributes attr;
      hvd_options o = HVD_OPTIONS_INIT;
      hvd_tensor tensor = {NULL, t, 2, shape, NULL, NULL};
      hvd_handle h;
      char what[160];
      snprintf(what, sizeof(what), "the output of a GPU %s of %s",
               alltoall ? "alltoall" : "allgather", hvd_dtype_name(t));
      EXPECT(in != NULL, "%s: out of memory", what);
      if ((code = upload(in, n * hvd_dtype_size(t), &din)) != 0)
        return code;
      tensor.input = din;
      o.device = dev;
      if (alltoall)
        HVD_CALL(what, hvd_alltoall_async(&tensor, NULL, &o, &h));
      else
        HVD_CALL(what, hvd_allgather_async(&tensor, &o, &h));
      HVD_CALL(what, hvd_handle_wait(h));
      HVD_CALL(what, hvd_handle_output(h, &out, &bytes, NULL));
      EXPECT(bytes == want, "%s has %zu bytes, not %zu", what, bytes, want);
      CUDA_CALL(cudaPointerGetAttributes(&attr, out));
      EXPECT(attr.type == cudaMemoryTypeDevice && attr.device == dev,
             "%s is memory of type %d on device %d, not device memory (type %d) on GPU %d", what,
             (int)attr.type, attr.device, (int)cudaMemoryTypeDevice, dev);
      hvd_handle_release(h);
      cudaFree(din);
      free(in);
    }
  }
  return 0;
}

/* NCCL with two ranks on one GPU: either it works (values right) or every
 * rank fails, and some rank's message names HVD_GPU_COLLECTIVES=host. */
static int shared_gpu_rank(int rank, int size, void *arg) {
  const size_t n = 7;
  int64_t shape[1] = {(int64_t)n};
  void *in = fill(HVD_FLOAT32, HVD_SUM, rank, n), *din, *dout, *got;
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_tensor tensor = {NULL, HVD_FLOAT32, 1, shape, NULL, NULL};
  hvd_status st;
  int dev, code;

  EXPECT(in != NULL, "out of memory");
  if ((code = use_gpu(&dev)) != 0 || (code = upload(in, n * sizeof(float), &din)) != 0 ||
      (code = dev_alloc(n * sizeof(float), &dout)) != 0)
    return code;
  tensor.input = din;
  tensor.output = dout;
  o.device = dev;
  st = hvd_allreduce(&tensor, &o);
  if (st == HVD_OK) {
    if ((code = download(dout, n * sizeof(float), &got)) != 0 ||
        (code = compare_reference("allreduce, NCCL on a shared GPU", HVD_FLOAT32, HVD_SUM, 1.0,
                                  1.0, size, got, n)) != 0)
      return code;
    return SHARED_WORKED;
  }
  if (strstr(hvd_last_error_message(), "HVD_GPU_COLLECTIVES=host") != NULL)
    return 0;
  return report(SHARED_REFUSED, "NCCL on a shared GPU failed (%s) without naming the fix: %s",
                hvd_strerror(st), hvd_last_error_message());
}

/* ==== tests ================================================================================= */

static void add_env(const char *setting) {
  for (size_t i = 0; i < HVD_ARRAY_SIZE(job.env); i++) {
    if (job.env[i] == NULL) {
      job.env[i] = setting;
      return;
    }
  }
  ck_abort_msg("too many settings for the job");
}

/* Runs a job of the layout; the hierarchical layout puts the first half
 * of the ranks on one fake host, the rest on another. */
static void run_layout(int size, rank_fn fn) {
  for (int r = 0; layout.hier && r < size; r++)
    job.hosts[r] = r < size / 2 ? "gpu-host-a" : "gpu-host-b";
  run_ok(size, fn, NULL);
}

/* _i picks the job size from the layout; a size of 0 is a layout without
 * that iteration (two GPUs are missing). */
#define LAYOUT_TEST(test, fn)                                                                      \
  START_TEST(test) {                                                                               \
    if (layout.sizes[_i] > 0)                                                                      \
      run_layout(layout.sizes[_i], fn);                                                            \
  }                                                                                                \
  END_TEST

LAYOUT_TEST(allreduce_matches_cpu, allreduce_rank)
LAYOUT_TEST(scaling_matches_reference, scaling_rank)
LAYOUT_TEST(grouped_allreduce_matches_cpu, grouped_rank)
LAYOUT_TEST(allgather_matches_cpu, allgather_rank)
LAYOUT_TEST(broadcast_matches_cpu, broadcast_rank)
LAYOUT_TEST(alltoall_matches_cpu, alltoall_rank)
LAYOUT_TEST(reducescatter_matches_cpu, reducescatter_rank)
LAYOUT_TEST(ready_event_is_waited_for, ready_event_rank)
LAYOUT_TEST(outputs_are_device_memory, outputs_on_device_rank)

/* The fused tensors' values, and rank 0's timeline: the fusion buffer was
 * used, by NCCL unless the job stages through the host. */
START_TEST(many_small_tensors_fuse) {
  char path[] = "/tmp/hvd-cuda-timeline-XXXXXX", env[64];
  int fd = mkstemp(path);
  struct stat sb;
  char *text;
  bool nccl;

  if (layout.sizes[_i] == 0)
    return;
  ck_assert_int_ge(fd, 0);
  close(fd);
  snprintf(env, sizeof(env), "HOROVOD_TIMELINE=%s", path);
  add_env(env);
  run_layout(layout.sizes[_i], fusion_rank);
  ck_assert_int_eq(stat(path, &sb), 0);
  text = calloc(1, (size_t)sb.st_size + 1);
  ck_assert_ptr_nonnull(text);
  fd = open(path, O_RDONLY);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(read(fd, text, (size_t)sb.st_size), sb.st_size);
  close(fd);
  unlink(path);
  nccl = strstr(text, "\"name\":\"NCCL_") != NULL;
  ck_assert_msg(strstr(text, "\"name\":\"MEMCPY_IN_FUSION_BUFFER\"") != NULL,
                "the timeline shows no fused allreduce: %.500s", text);
  ck_assert_msg(nccl == !layout.host, "the timeline %s NCCL phases, with HVD_GPU_COLLECTIVES=%s",
                nccl ? "has" : "lacks", layout.host ? "host" : "nccl");
  free(text);
}
END_TEST

START_TEST(nccl_on_a_shared_gpu_names_the_fix) {
  int codes[16], refused = 0, named = 0, worked = 0;
  job.env[0] = "HVD_GPU_COLLECTIVES=nccl"; /* the layout's host staging, overridden */
  run_ranks(2, shared_gpu_rank, NULL, codes, 120);
  for (int r = 0; r < 2; r++) {
    named += codes[r] == 0;
    refused += codes[r] == SHARED_REFUSED;
    worked += codes[r] == SHARED_WORKED;
  }
  ck_assert_msg(worked == 2 || (worked == 0 && named + refused == 2 && named > 0),
                "rank exit codes %d and %d: expected both %d (NCCL accepted a shared GPU), or "
                "failures with at least one naming HVD_GPU_COLLECTIVES=host (0)",
                codes[0], codes[1], SHARED_WORKED);
}
END_TEST

/* ==== suites ================================================================================= */

static void nccl_setup(void) {
  job_setup();
  layout = (struct layout){{1, 0}, 1, false, false};
}

static void host_setup(void) {
  job_setup();
  layout = (struct layout){{2, 3}, 1, true, false};
  add_env("HVD_GPU_COLLECTIVES=host");
}

static void nccl_pair_setup(void) {
  job_setup();
  layout = (struct layout){{2, 0}, 2, false, false};
}

/* One rank per fake host on GPU 0; with two GPUs also two per host. */
static void hierarchical_setup(void) {
  job_setup();
  layout = (struct layout){{2, gpus_seen >= 2 ? 4 : 0}, gpus_seen >= 2 ? 2 : 1, false, true};
  add_env("HOROVOD_HIERARCHICAL_ALLREDUCE=1");
}

static Suite *layout_suite(const char *name, void (*setup)(void)) {
  Suite *s = suite_create(name);
  TCase *tc = tcase_create(name);
  bool hier = setup == hierarchical_setup; /* a global NCCL communicator would share GPUs */
  tcase_add_checked_fixture(tc, setup, job_teardown);
  tcase_set_timeout(tc, 240);
  tcase_add_loop_test(tc, allreduce_matches_cpu, 0, 2);
  tcase_add_loop_test(tc, scaling_matches_reference, 0, 2);
  tcase_add_loop_test(tc, grouped_allreduce_matches_cpu, 0, 2);
  tcase_add_loop_test(tc, many_small_tensors_fuse, 0, 2);
  tcase_add_loop_test(tc, ready_event_is_waited_for, 0, 2);
  if (!hier) {
    tcase_add_loop_test(tc, allgather_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, broadcast_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, alltoall_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, reducescatter_matches_cpu, 0, 2);
    tcase_add_loop_test(tc, outputs_are_device_memory, 0, 2);
  }
  if (setup == host_setup)
    tcase_add_test(tc, nccl_on_a_shared_gpu_names_the_fix);
  suite_add_tcase(s, tc);
  return s;
}

/* ==== main: skip without a GPU ================================================================ */

/* The number of GPUs, and whether processes may share GPU 0, from a child
 * (this process must not initialise CUDA before Check forks); why says
 * what is missing when the count is 0. */
static int probe_gpus(bool *shared, char *why, size_t size) {
  char buf[1024] = "";
  int fds[2], status = 0, count = 0, mode = 0, used = 0;
  ssize_t got;
  size_t len = 0;
  pid_t pid;

  if (pipe(fds) != 0) {
    snprintf(why, size, "pipe failed: %s", strerror(errno));
    return 0;
  }
  if ((pid = fork()) == 0) {
    hvd_status st = hvd_cuda_device_count(&count);
    close(fds[0]);
    if (st == HVD_OK &&
        cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0) != cudaSuccess)
      mode = cudaComputeModeDefault;
    len = (size_t)snprintf(buf, sizeof(buf), "%d %d %s", st == HVD_OK ? count : 0, mode,
                           st == HVD_OK ? "" : hvd_last_error_message());
    if (write(fds[1], buf, len < sizeof(buf) ? len : sizeof(buf) - 1) < 0)
      _exit(1);
    _exit(0);
  }
  close(fds[1]);
  while (pid > 0 && len < sizeof(buf) - 1 &&
         (got = read(fds[0], buf + len, sizeof(buf) - 1 - len)) > 0)
    len += (size_t)got;
  buf[len] = '\0';
  close(fds[0]);
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0 || sscanf(buf, "%d %d %n", &count, &mode, &used) < 2) {
    snprintf(why, size, "the GPU probe process failed (status 0x%x): %.800s", status, buf);
    return 0;
  }
  snprintf(why, size, "%s", buf + used);
  *shared = mode == cudaComputeModeDefault;
  return count;
}

int main(void) {
  const char *only = getenv("CK_RUN_SUITE");
  char why[1024];
  bool shared = false;
  SRunner *sr;
  int failed;

  if (!hvd_cuda_built()) {
    printf("SKIPPED: this build of hvd has no CUDA backend\n");
    return EXIT_SKIP;
  }
  gpus_seen = probe_gpus(&shared, why, sizeof(why));
  if (gpus_seen <= 0) {
    printf("SKIPPED: no GPU: %s\n", why[0] != '\0' ? why : "hvd_cuda_device_count found none");
    return EXIT_SKIP;
  }
  printf("%d GPU(s), NCCL %d\n", gpus_seen, hvd_nccl_built());
  if (only != NULL && strcmp(only, "nccl_pair") == 0 && gpus_seen < 2) {
    printf("SKIPPED: nccl_pair needs two GPUs; this machine has %d\n", gpus_seen);
    return EXIT_SKIP;
  }
  if (only != NULL && (strcmp(only, "host") == 0 || strcmp(only, "hierarchical") == 0) &&
      !shared) {
    printf("SKIPPED: %s runs several processes on GPU 0, whose compute mode is exclusive\n",
           only);
    return EXIT_SKIP;
  }
  sr = srunner_create(layout_suite("nccl", nccl_setup));
  if (shared) {
    srunner_add_suite(sr, layout_suite("host", host_setup));
    srunner_add_suite(sr, layout_suite("hierarchical", hierarchical_setup));
  }
  if (gpus_seen >= 2)
    srunner_add_suite(sr, layout_suite("nccl_pair", nccl_pair_setup));
  srunner_run_all(sr, CK_ENV);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}

#endif /* HVD_TEST_CUDA */
