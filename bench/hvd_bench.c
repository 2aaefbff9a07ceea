/*
 * hvd-bench: collective benchmarks with nccl-tests conventions.
 *
 *   hvd-bench allreduce --np 4 -b 8 -e 64M -f 2 -n 20 -w 5 -c 1 -d float32 -o sum
 *
 * Columns: size count type redop root time algbw busbw #wrong, with GB =
 * 1e9 and nccl-tests' bus-bandwidth factors (allreduce 2(n-1)/n; allgather,
 * reducescatter and alltoall (n-1)/n; broadcast 1). `time` is the mean time
 * of one operation on the slowest rank (the peers' benchmarks in
 * bench/peers report the same). With --np N the benchmark forks N
 * local ranks that meet through a store it serves itself; under hvdrun
 * (HOROVOD_RANK set), or as a pod (HVD_POD=1, see docs/running.md), it reads
 * the job's environment instead.
 * With -c 1 every rank checks its result after the timed loop against a
 * serial reference built from every rank's input (small integers, so every
 * reduction order gives the same bits); wrong elements are counted.
 * With -g 1 (a build with CUDA) the buffers are device memory, rank r on
 * GPU local_rank % GPUs, and each operation goes through hvd's public API
 * (hvd_init, negotiation, then NCCL, or host staging under
 * HVD_GPU_COLLECTIVES=host) with a fixed name per size, so the response
 * cache hits as in training; an operation's time ends when its handle
 * completes, which is when its outputs are complete on the device. An
 * allgather's or alltoall's output is hvd's (device memory it allocates):
 * each timed operation also releases the previous one's.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"

#ifdef HVD_BENCH_CUDA
#include <cuda_runtime.h>
#endif

enum { EXIT_FAIL = 1, EXIT_USAGE = 2, MAX_LOCAL_RANKS = 64, MAX_ITERS = 10000000 };

enum coll { ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER };

static const char *const coll_names[] = {"allreduce", "allgather", "broadcast", "alltoall",
                                         "reducescatter"};

struct options {
  enum coll coll;
  size_t min_bytes, max_bytes, step_bytes;
  double factor;
  int iters, warmup;
  bool check;
  hvd_dtype dtype;
  hvd_reduce_op op;
  int root;
  int np;    /* local mode: ranks to fork */
  int hosts; /* local mode: fake hosts to spread them over */
  bool hierarchical;
  bool gpu;    /* -g: device buffers through hvd's API */
  bool per_op; /* -I: per-operation time percentiles */
  double target_s; /* -T: time each size this long instead of -n iterations */
  size_t sizes[32]; /* --sizes: explicit list instead of -b/-e/-f */
  int flood;        /* --flood: silent connections to rank 0 (local mode) */
  int store_flood;  /* --store-flood: trickling connections to the store (local mode) */
  size_t nsizes;
};

static const char usage_text[] =
    "usage: hvd-bench [COLLECTIVE] [options]\n"
    "\n"
    "COLLECTIVE is allreduce (the default), allgather, broadcast, alltoall or\n"
    "reducescatter.\n"
    "\n"
    "  -b, --minbytes N    smallest size (default 32M; K, M, G suffixes)\n"
    "  -e, --maxbytes N    largest size (default 32M)\n"
    "  -f, --stepfactor F  multiply the size by F each step (default 2)\n"
    "  -i, --stepbytes N   add N bytes each step instead\n"
    "  -n, --iters N       timed iterations per size (default 20)\n"
    "  -w, --warmup N      untimed iterations per size (default 5)\n"
    "  -c, --check 0|1     check results (default 1)\n"
    "  -d, --datatype T    uint8 int8 uint16 int16 int32 int64 float16 bfloat16 float32\n"
    "                      float64 bool (nccl names float, half, double, int also work)\n"
    "  -o, --op OP         sum avg min max prod adasum (default sum)\n"
    "  -r, --root R        broadcast root (default 0)\n"
    "  -I, --per-op 0|1    also print rank 0's per-operation min/median/p99/max\n"
    "  -g, --gpu 0|1       1: buffers in GPU memory (rank r on GPU local_rank % GPUs),\n"
    "                      each operation through hvd's API: NCCL, or host staging with\n"
    "                      HVD_GPU_COLLECTIVES=host (needs a build with CUDA)\n"
    "  -T, --time S        time each size for about S seconds (iterations calibrated\n"
    "                      by doubling a batch, as bench/peers does) instead of -n\n"
    "      --sizes LIST    comma list of sizes instead of -b/-e/-f (e.g. 8,4K,1M,64M)\n"
    "      --np N          fork N local ranks and serve their store (default: from hvdrun's\n"
    "                      environment, or 1)\n"
    "      --hosts H       local mode: spread the ranks over H fake hosts (default 1)\n"
    "      --hierarchical  hierarchical allreduce/allgather over the hosts\n"
    "      --flood N       with --np: a stranger opens N connections to rank 0's\n"
    "                      transport port and holds them, silent, while it runs\n"
    "      --store-flood N with --np: a stranger keeps N connections to the store, each\n"
    "                      sending a request's headers a byte a second, and the store\n"
    "                      gets N - N/6 connection slots, so they alone would fill it\n"
    "  -h, --help          this text\n";

static int HVD_PRINTF(1, 2) usage_error(const char *fmt, ...) {
  char reason[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof(reason), fmt, ap);
  va_end(ap);
  fprintf(stderr, "hvd-bench: %s (see hvd-bench --help)\n", reason);
  return EXIT_USAGE;
}

static bool parse_size(const char *text, size_t *out) {
  char *end;
  unsigned long long v = strtoull(text, &end, 10);
  unsigned long long mult = 1;
  if (end == text)
    return false;
  if (*end == 'K' || *end == 'k')
    mult = 1ull << 10;
  else if (*end == 'M' || *end == 'm')
    mult = 1ull << 20;
  else if (*end == 'G' || *end == 'g')
    mult = 1ull << 30;
  if (mult != 1)
    end++;
  if (*end != '\0' || v > (1ull << 40) / mult)
    return false;
  *out = (size_t)(v * mult);
  return true;
}

static bool parse_dtype(const char *t, hvd_dtype *out) {
  static const struct {
    const char *name;
    hvd_dtype dt;
  } aliases[] = {{"float", HVD_FLOAT32}, {"half", HVD_FLOAT16}, {"double", HVD_FLOAT64},
                 {"int", HVD_INT32},     {"bf16", HVD_BFLOAT16}, {"char", HVD_INT8}};
  for (int d = 0; d < HVD_DTYPE_COUNT; d++) {
    if (strcasecmp(t, hvd_dtype_name((hvd_dtype)d)) == 0) {
      *out = (hvd_dtype)d;
      return true;
    }
  }
  for (size_t i = 0; i < HVD_ARRAY_SIZE(aliases); i++) {
    if (strcasecmp(t, aliases[i].name) == 0) {
      *out = aliases[i].dt;
      return true;
    }
  }
  return false;
}

static bool parse_op(const char *t, hvd_reduce_op *out) {
  static const struct {
    const char *name;
    hvd_reduce_op op;
  } ops[] = {{"sum", HVD_SUM},     {"avg", HVD_AVERAGE}, {"average", HVD_AVERAGE},
             {"min", HVD_MIN},     {"max", HVD_MAX},     {"prod", HVD_PRODUCT},
             {"product", HVD_PRODUCT}, {"adasum", HVD_ADASUM}};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(ops); i++) {
    if (strcasecmp(t, ops[i].name) == 0) {
      *out = ops[i].op;
      return true;
    }
  }
  return false;
}

static bool parse_int(const char *t, int64_t min, int64_t max, int *out) {
  int64_t v;
  if (!hvd_parse_int64(t, strlen(t), &v) || v < min || v > max)
    return false;
  *out = (int)v;
  return true;
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, struct options *o) {
  enum { OPT_NP = 256, OPT_HOSTS, OPT_HIER, OPT_SIZES, OPT_FLOOD, OPT_STORE_FLOOD };
  static const struct option longopts[] = {
      {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
      {"stepfactor", required_argument, NULL, 'f'}, {"stepbytes", required_argument, NULL, 'i'},
      {"iters", required_argument, NULL, 'n'},    {"warmup", required_argument, NULL, 'w'},
      {"check", required_argument, NULL, 'c'},    {"datatype", required_argument, NULL, 'd'},
      {"op", required_argument, NULL, 'o'},       {"root", required_argument, NULL, 'r'},
      {"per-op", required_argument, NULL, 'I'},   {"gpu", required_argument, NULL, 'g'},
      {"time", required_argument, NULL, 'T'},
      {"sizes", required_argument, NULL, OPT_SIZES},
      {"np", required_argument, NULL, OPT_NP},    {"hosts", required_argument, NULL, OPT_HOSTS},
      {"hierarchical", no_argument, NULL, OPT_HIER}, {"help", no_argument, NULL, 'h'},
      {"flood", required_argument, NULL, OPT_FLOOD},
      {"store-flood", required_argument, NULL, OPT_STORE_FLOOD},
      {NULL, 0, NULL, 0}};
  int opt, flag, first;

  *o = (struct options){.coll = ALLREDUCE, .min_bytes = 32u << 20, .max_bytes = 32u << 20,
                        .factor = 2.0, .iters = 20, .warmup = 5, .check = true,
                        .dtype = HVD_FLOAT32, .op = HVD_SUM, .np = 0, .hosts = 1};
  if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
    fputs(usage_text, stdout);
    return 0;
  }
  /* Without a collective (options first, as all_reduce_perf takes them):
   * allreduce. */
  if (argc >= 2 && argv[1][0] != '-') {
    for (o->coll = ALLREDUCE; o->coll <= REDUCESCATTER; o->coll++) {
      if (strcmp(argv[1], coll_names[o->coll]) == 0)
        break;
    }
    if (o->coll > REDUCESCATTER)
      return usage_error("unknown collective '%s'", argv[1]);
    first = 2;
  } else {
    o->coll = ALLREDUCE;
    first = 1;
  }
  opterr = 0;
  optind = first;
  while ((opt = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:r:I:g:T:h", longopts, NULL)) != -1) {
    switch (opt) {
    case 'b':
      if (!parse_size(optarg, &o->min_bytes))
        return usage_error("-b '%s' is not a size", optarg);
      break;
    case 'e':
      if (!parse_size(optarg, &o->max_bytes))
        return usage_error("-e '%s' is not a size", optarg);
      break;
    case 'f':
      if (!hvd_parse_double(optarg, &o->factor) || o->factor <= 1.0)
        return usage_error("-f '%s' must be a number above 1", optarg);
      o->step_bytes = 0;
      break;
    case 'i':
      if (!parse_size(optarg, &o->step_bytes) || o->step_bytes == 0)
        return usage_error("-i '%s' must be a positive size", optarg);
      break;
    case 'n':
      if (!parse_int(optarg, 1, 1000000000, &o->iters))
        return usage_error("-n '%s' must be a positive integer", optarg);
      break;
    case 'w':
      if (!parse_int(optarg, 0, 1000000000, &o->warmup))
        return usage_error("-w '%s' must be a non-negative integer", optarg);
      break;
    case 'c':
      if (!parse_int(optarg, 0, 1, &flag))
        return usage_error("-c '%s' must be 0 or 1", optarg);
      o->check = flag == 1;
      break;
    case 'd':
      if (!parse_dtype(optarg, &o->dtype))
        return usage_error("-d '%s' is not a datatype", optarg);
      break;
    case 'o':
      if (!parse_op(optarg, &o->op))
        return usage_error("-o '%s' is not sum, avg, min, max or prod", optarg);
      break;
    case 'r':
      if (!parse_int(optarg, 0, 1 << 24, &o->root))
        return usage_error("-r '%s' is not a rank", optarg);
      break;
    case 'I':
      if (!parse_int(optarg, 0, 1, &flag))
        return usage_error("-I '%s' must be 0 or 1", optarg);
      o->per_op = flag == 1;
      break;
    case 'g':
      if (!parse_int(optarg, 0, 1, &flag))
        return usage_error("-g '%s' must be 0 or 1", optarg);
      o->gpu = flag == 1;
      break;
    case 'T':
      if (!hvd_parse_double(optarg, &o->target_s) || o->target_s <= 0 || o->target_s > 3600)
        return usage_error("-T '%s' must be a number of seconds in (0, 3600]", optarg);
      break;
    case OPT_SIZES: {
      char list[512];
      snprintf(list, sizeof(list), "%s", optarg);
      o->nsizes = 0;
      for (char *save = NULL, *t = strtok_r(list, ",", &save); t != NULL;
           t = strtok_r(NULL, ",", &save)) {
        if (o->nsizes == HVD_ARRAY_SIZE(o->sizes) || !parse_size(t, &o->sizes[o->nsizes]))
          return usage_error("--sizes '%s' must list at most 32 sizes", optarg);
        o->nsizes++;
      }
      if (o->nsizes == 0)
        return usage_error("--sizes '%s' lists no size", optarg);
      break;
    }
    case OPT_NP:
      if (!parse_int(optarg, 1, MAX_LOCAL_RANKS, &o->np))
        return usage_error("--np '%s' must be 1-%d", optarg, MAX_LOCAL_RANKS);
      break;
    case OPT_HOSTS:
      if (!parse_int(optarg, 1, MAX_LOCAL_RANKS, &o->hosts))
        return usage_error("--hosts '%s' must be 1-%d", optarg, MAX_LOCAL_RANKS);
      break;
    case OPT_HIER:
      o->hierarchical = true;
      break;
    case OPT_FLOOD:
      if (!parse_int(optarg, 0, 100000, &o->flood))
        return usage_error("--flood '%s' must be 0-100000", optarg);
      break;
    case OPT_STORE_FLOOD:
      if (!parse_int(optarg, 0, 100000, &o->store_flood))
        return usage_error("--store-flood '%s' must be 0-100000", optarg);
      break;
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    case ':':
      return usage_error("option %s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if (o->min_bytes > o->max_bytes)
    return usage_error("-b is larger than -e");
  if (o->nsizes == 0) {
    /* The -b/-e/-f (or -i) sweep, as a list. */
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes && o->nsizes < HVD_ARRAY_SIZE(o->sizes);) {
      o->sizes[o->nsizes++] = bytes;
      if (o->step_bytes > 0)
        bytes += o->step_bytes;
      else if ((size_t)((double)bytes * o->factor) == bytes)
        bytes++;
      else
        bytes = (size_t)((double)bytes * o->factor);
    }
  }
  if (o->np > 0 && o->np % o->hosts != 0)
    return usage_error("--np %d does not spread evenly over --hosts %d", o->np, o->hosts);
#ifndef HVD_BENCH_CUDA
  if (o->gpu) {
    fprintf(stderr, "hvd-bench: -g 1 needs a build with CUDA, and this one has none "
                    "(configure with -DHVD_WITH_CUDA=ON, with the CUDA toolkit and NCCL "
                    "installed)\n");
    return EXIT_USAGE;
  }
#endif
  return -1;
}

/* ==== one rank ======================================================================== */

struct bench {
  const struct options *o;
  int64_t *samples; /* -I: per-operation end times, then durations */
  struct net_world *w; /* NULL with -g 1 */
  struct ops_ctx *ops;
  int n, rank;
  char *in, *out, *ref, *tmp; /* -g 1: in and out are device memory */
  size_t *counts, *splits;
  /* -g 1 */
  int device;
  char *host_out;  /* the result, copied back for the check */
  hvd_handle last; /* the last allgather or alltoall: hvd owns its output */
  char name[64];   /* the operation's name: one per size */
};

/* ==== device memory (-g 1) ============================================================ */

#ifdef HVD_BENCH_CUDA
static int cuda_failed(cudaError_t err, const char *call) {
  fprintf(stderr, "hvd-bench: %s failed: %s (%s)\n", call, cudaGetErrorString(err),
          cudaGetErrorName(err));
  return EXIT_FAIL;
}

/* This rank's GPU and its two device buffers of cap bytes. */
static int gpu_setup(struct bench *b, size_t cap) {
  int count = 0;
  cudaError_t err;
  if (hvd_cuda_device_count(&count) != HVD_OK) {
    fprintf(stderr, "hvd-bench: rank %d: %s\n", b->rank, hvd_last_error_message());
    return EXIT_FAIL;
  }
  b->device = hvd_local_rank() % count;
  if ((err = cudaSetDevice(b->device)) != cudaSuccess)
    return cuda_failed(err, "cudaSetDevice");
  if ((err = cudaMalloc((void **)&b->in, cap)) != cudaSuccess ||
      (err = cudaMalloc((void **)&b->out, cap)) != cudaSuccess)
    return cuda_failed(err, "cudaMalloc");
  return 0;
}

/* Synchronous: a copy from pageable memory may return before its DMA is
 * done, and hvd's stream does not wait for the default stream. */
static int gpu_copy(void *dst, const void *src, size_t bytes, bool to_device) {
  cudaError_t err = cudaMemcpy(dst, src, bytes,
                               to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
  if (err != cudaSuccess)
    return cuda_failed(err, "cudaMemcpy");
  if (to_device && (err = cudaDeviceSynchronize()) != cudaSuccess)
    return cuda_failed(err, "cudaDeviceSynchronize");
  return 0;
}

static void gpu_free(struct bench *b) {
  cudaFree(b->in);
  cudaFree(b->out);
}
#else /* parse_args refuses -g 1 in a build without CUDA */
static int gpu_setup(struct bench *b, size_t cap) { return EXIT_USAGE; }
static int gpu_copy(void *dst, const void *src, size_t bytes, bool to_device) {
  return EXIT_FAIL;
}
static void gpu_free(struct bench *b) {}
#endif

static int compare_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static double value(int rank, size_t i, hvd_reduce_op op) {
  int v = (int)((rank * 7 + (int)(i % 1000003) * 3) % 5);
  return op == HVD_PRODUCT ? (double)(1 + v % 2) : (double)(v + 1);
}

/* Small integers, valid in every dtype. With adasum every rank gives the
 * same vector, whose Adasum is that vector: the work is the same as for
 * any input, and the result checks exactly. */
static void fill(const struct bench *b, void *buf, size_t count, int rank) {
  hvd_dtype dt = b->o->dtype;
  if (b->o->op == HVD_ADASUM)
    rank = 0;
  for (size_t i = 0; i < count; i++) {
    double v = value(rank, i, b->o->op);
    switch (dt) {
    case HVD_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case HVD_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case HVD_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case HVD_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case HVD_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case HVD_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case HVD_FLOAT16: ((uint16_t *)buf)[i] = ops_float_to_half((float)v); break;
    case HVD_BFLOAT16: ((uint16_t *)buf)[i] = ops_float_to_bf16((float)v); break;
    case HVD_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case HVD_FLOAT64: ((double *)buf)[i] = v; break;
    case HVD_BOOL: ((uint8_t *)buf)[i] = (uint8_t)((int)v % 2); break;
    }
  }
}

/* Elements per rank for a size: nccl-tests' convention per collective. */
static size_t count_for(const struct bench *b, size_t bytes) {
  size_t es = hvd_dtype_size(b->o->dtype);
  size_t count = bytes / es;
  if (b->o->coll == ALLGATHER || b->o->coll == ALLTOALL || b->o->coll == REDUCESCATTER)
    count = count / (size_t)b->n; /* size is the whole array */
  return count;
}

/* -g 1: one operation through hvd's API on the device buffers. */
static hvd_status run_once_api(struct bench *b, size_t count) {
  const struct options *o = b->o;
  int64_t shape[1] = {(int64_t)count};
  hvd_tensor t = {b->name, o->dtype, 1, shape, b->in, b->out};
  hvd_options opt = HVD_OPTIONS_INIT;
  hvd_handle h = NULL;
  hvd_status st = HVD_ERR_INTERNAL;

  opt.device = b->device;
  switch (o->coll) {
  case ALLREDUCE:
    opt.op = o->op;
    return hvd_allreduce(&t, &opt);
  case BROADCAST: /* in place, in the buffer check() reads */
    opt.root = o->root;
    t.input = t.output = b->rank == o->root ? b->in : b->out;
    return hvd_broadcast(&t, &opt);
  case REDUCESCATTER:
    opt.op = o->op;
    shape[0] = (int64_t)(count * (size_t)b->n);
    return hvd_reducescatter(&t, &opt);
  case ALLGATHER:
    st = hvd_allgather_async(&t, &opt, &h);
    break;
  case ALLTOALL:
    shape[0] = (int64_t)(count * (size_t)b->n);
    st = hvd_alltoall_async(&t, NULL, &opt, &h);
    break;
  }
  if (st == HVD_OK)
    st = hvd_handle_wait(h);
  hvd_handle_release(b->last);
  b->last = h;
  return st;
}

static hvd_status run_once(struct bench *b, size_t count) {
  const struct options *o = b->o;
  struct ops_layout l;
  struct net_comm *c;
  hvd_dtype dt = o->dtype;

  if (o->gpu)
    return run_once_api(b, count);
  l = (struct ops_layout){b->w->global, b->w->local, b->w->cross};
  c = b->w->global;
  switch (o->coll) {
  case ALLREDUCE:
    if (o->hierarchical)
      return ops_allreduce_hierarchical(b->ops, &l, b->in, b->out, count, dt, o->op, 1.0, 1.0);
    return ops_allreduce(b->ops, c, b->in, b->out, count, dt, o->op, 1.0, 1.0);
  case ALLGATHER:
    for (int i = 0; i < b->n; i++)
      b->counts[i] = count;
    if (o->hierarchical)
      return ops_allgatherv_hierarchical(b->ops, &l, b->in, b->out, b->counts, dt);
    return ops_allgatherv(b->ops, c, b->in, b->out, b->counts, dt);
  case BROADCAST:
    return ops_broadcast(b->ops, c, b->rank == o->root ? b->in : b->out, count, dt, o->root);
  case ALLTOALL:
    for (int i = 0; i < b->n; i++)
      b->counts[i] = count;
    return ops_alltoallv(b->ops, c, b->in, b->counts, b->out, b->counts, dt);
  case REDUCESCATTER:
    return ops_reducescatter(b->ops, c, b->in, b->out, count * (size_t)b->n, dt, o->op, 1.0, 1.0);
  }
  return HVD_ERR_INTERNAL;
}

/* This rank's len elements of result in host memory (-g 1: copied from
 * the device); NULL if that failed. */
static const char *result(struct bench *b, size_t len) {
  const struct options *o = b->o;
  size_t bytes = len * hvd_dtype_size(o->dtype);
  const char *got = o->coll == BROADCAST && b->rank == o->root ? b->in : b->out;
  void *dev = (void *)got;
  size_t have = bytes;

  if (!o->gpu)
    return got;
  if ((o->coll == ALLGATHER || o->coll == ALLTOALL) &&
      (b->last == NULL || hvd_handle_output(b->last, &dev, &have, NULL) != HVD_OK))
    return NULL;
  if (have != bytes || (bytes > 0 && gpu_copy(b->host_out, dev, bytes, false) != 0))
    return NULL;
  return b->host_out;
}

/* Elements of this rank's result that differ from the reference. */
static size_t check(struct bench *b, size_t count) {
  const struct options *o = b->o;
  size_t es = hvd_dtype_size(o->dtype), wrong = 0, n = (size_t)b->n;
  const char *got;
  size_t len = count;
  double post = o->op == HVD_AVERAGE ? 1.0 / b->n : 1.0;

  switch (o->coll) {
  case ALLREDUCE:
  case REDUCESCATTER: {
    size_t total = o->coll == ALLREDUCE ? count : count * n;
    fill(b, b->ref, total, 0);
    for (int r = 1; r < b->n && o->op != HVD_ADASUM; r++) {
      fill(b, b->tmp, total, r);
      ops_reduce(b->ref, b->ref, b->tmp, total, o->dtype, o->op);
    }
    if (post != 1.0)
      ops_scale(b->ref, b->ref, total, o->dtype, post);
    if (o->coll == REDUCESCATTER)
      memmove(b->ref, b->ref + ops_share_offset(total, b->n, b->rank) * es, count * es);
    break;
  }
  case ALLGATHER:
    for (int r = 0; r < b->n; r++)
      fill(b, b->ref + (size_t)r * count * es, count, r);
    len = count * n;
    break;
  case BROADCAST:
    fill(b, b->ref, count, o->root);
    break;
  case ALLTOALL:
    /* Block p of rank r's input is what rank p receives from r. */
    for (int r = 0; r < b->n; r++) {
      fill(b, b->tmp, count * n, r);
      memcpy(b->ref + (size_t)r * count * es, b->tmp + (size_t)b->rank * count * es, count * es);
    }
    len = count * n;
    break;
  }
  if ((got = result(b, len)) == NULL) {
    fprintf(stderr, "hvd-bench: rank %d: cannot read the result back; counting it all wrong\n",
            b->rank);
    return len;
  }
  for (size_t i = 0; i < len; i++)
    wrong += memcmp(got + i * es, b->ref + i * es, es) != 0;
  return wrong;
}


/* A float64 reduced over every rank, on the CPU (-g 1: through hvd's API). */
static hvd_status reduce_double(struct bench *b, double v, hvd_reduce_op op, double *out) {
  if (b->o->gpu) {
    int64_t one = 1;
    hvd_tensor t = {op == HVD_MAX ? "hvd-bench.max" : "hvd-bench.sum", HVD_FLOAT64, 1, &one,
                    &v, out};
    hvd_options opt = HVD_OPTIONS_INIT;
    opt.op = op;
    return hvd_allreduce(&t, &opt);
  }
  return ops_allreduce(b->ops, b->w->global, &v, out, 1, HVD_FLOAT64, op, 1.0, 1.0);
}

/* The slowest rank's time, as the peers' benchmarks report it. */
static double max_over_ranks(struct bench *b, double v) {
  double max = v;
  if (reduce_double(b, v, HVD_MAX, &max) != HVD_OK)
    return v;
  return max;
}

/*
 * -T: doubles a batch until it takes an eighth of the target, then sizes
 * the timed run to the target (at least 3 operations). Every rank uses the
 * slowest rank's times, so all reach the same count.
 */
static hvd_status calibrate(struct bench *b, size_t count, int *iters) {
  double per_op = 0;
  hvd_status st = HVD_OK;

  for (int batch = 1; st == HVD_OK; batch *= 2) {
    int64_t t0 = hvd_now_ns();
    for (int i = 0; i < batch && st == HVD_OK; i++)
      st = run_once(b, count);
    double t = max_over_ranks(b, (double)(hvd_now_ns() - t0) / 1e9);
    per_op = t / batch;
    if (t >= b->o->target_s / 8 || batch >= MAX_ITERS / 4)
      break;
  }
  if (st == HVD_OK) {
    double n = per_op > 0 ? b->o->target_s / per_op : MAX_ITERS;
    *iters = n < 3 ? 3 : n > MAX_ITERS ? MAX_ITERS : (int)n;
  }
  return st;
}

/* Runs the sizes on this rank: over w's communicators, or (w NULL, -g 1)
 * through hvd's API, which hvd_init has set up. */
static int bench_rank(const struct options *o, struct net_world *w) {
  struct bench b = {.o = o, .w = w, .n = w != NULL ? w->size : hvd_size(),
                    .rank = w != NULL ? w->rank : hvd_rank()};
  size_t es = hvd_dtype_size(o->dtype);
  size_t largest = 0;
  for (size_t k = 0; k < o->nsizes; k++)
    largest = o->sizes[k] > largest ? o->sizes[k] : largest;
  size_t cap = largest + (size_t)b.n * es + 64;
  size_t total_wrong = 0;
  double bus_sum = 0;
  int rows = 0;
  int code = 0;

  if (o->coll == BROADCAST && o->root >= b.n) {
    fprintf(stderr, "hvd-bench: root %d is not a rank of %d\n", o->root, b.n);
    return EXIT_USAGE;
  }
  if (!o->gpu && ops_ctx_create(&b.ops) != HVD_OK) {
    fprintf(stderr, "hvd-bench: %s\n", hvd_last_error_message());
    return EXIT_FAIL;
  }
  if (o->gpu) {
    if ((code = gpu_setup(&b, cap)) != 0)
      return code;
    b.host_out = malloc(cap);
  } else {
    b.in = malloc(cap);
    b.out = malloc(cap);
  }
  b.ref = malloc(cap);
  b.tmp = malloc(cap);
  b.counts = calloc((size_t)b.n, sizeof(size_t));
  if (o->per_op)
    b.samples = calloc(MAX_ITERS, sizeof(int64_t));
  if (!b.in || !b.out || !b.ref || !b.tmp || !b.counts || (o->gpu && !b.host_out)) {
    fprintf(stderr, "hvd-bench: cannot allocate 4 x %zu bytes\n", cap);
    return EXIT_FAIL;
  }
  if (b.rank == 0) {
    char iter_text[64];
    if (o->target_s > 0)
      snprintf(iter_text, sizeof(iter_text), "iterations for %.2f s per size", o->target_s);
    else
      snprintf(iter_text, sizeof(iter_text), "%d iterations", o->iters);
    printf("# hvd-bench %s: %d ranks, %s, op %s, %s, %d warmup, check %d%s\n",
           coll_names[o->coll], b.n, hvd_dtype_name(o->dtype), hvd_reduce_op_name(o->op),
           iter_text, o->warmup, o->check, o->hierarchical ? ", hierarchical" : "");
    if (o->gpu) {
      const char *mode = hvd_setting_given(HVD_SET_GPU_COLLECTIVES);
      int gpus = 0;
      hvd_cuda_device_count(&gpus);
      printf("# gpu: device memory, rank 0 on GPU %d of %d; hvd's API (negotiation included), "
             "%s\n",
             b.device, gpus,
             mode != NULL && strcmp(mode, "host") == 0 ? "staged through host memory and TCP"
                                                        : "NCCL");
    }
    printf("# time: mean per operation on the slowest rank; GB = 1e9 bytes\n#\n");
    printf("# %10s %12s %8s %6s %6s %10s %8s %8s %6s\n", "size", "count", "type", "redop", "root",
           "time", "algbw", "busbw", "#wrong");
    printf("# %10s %12s %8s %6s %6s %10s %8s %8s %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "");
  }
  for (size_t k = 0; k < o->nsizes; k++) {
    size_t bytes = o->sizes[k];
    size_t count = count_for(&b, bytes);
    int iters = o->iters;
    size_t shown = o->coll == ALLREDUCE || o->coll == BROADCAST ? count * es
                                                                 : count * (size_t)b.n * es;
    double factor = 1.0, secs, t_us, algbw, busbw;
    size_t wrong = 0;
    int64_t t0;
    hvd_status st = HVD_OK;

    size_t in_count =
        o->coll == ALLTOALL || o->coll == REDUCESCATTER ? count * (size_t)b.n : count;
    snprintf(b.name, sizeof(b.name), "hvd-bench.%s.%zu", coll_names[o->coll], bytes);
    if (o->gpu) {
      fill(&b, b.tmp, in_count, b.rank);
      if ((code = gpu_copy(b.in, b.tmp, in_count * es, true)) != 0)
        break;
    } else {
      fill(&b, b.in, in_count, b.rank);
    }
    for (int i = 0; i < o->warmup && st == HVD_OK; i++)
      st = run_once(&b, count);
    if (st == HVD_OK && o->target_s > 0)
      st = calibrate(&b, count, &iters);
    if (st == HVD_OK)
      st = o->gpu ? hvd_barrier(HVD_PROCESS_SET_GLOBAL) : ops_barrier(b.ops, w->global);
    t0 = hvd_now_ns();
    for (int i = 0; i < iters && st == HVD_OK; i++) {
      st = run_once(&b, count);
      if (b.samples != NULL)
        b.samples[i] = hvd_now_ns();
    }
    secs = (double)(hvd_now_ns() - t0) / 1e9 / iters;
    if (st != HVD_OK) {
      fprintf(stderr, "hvd-bench: rank %d: %s\n", b.rank, hvd_last_error_message());
      code = EXIT_FAIL;
      break;
    }
    secs = max_over_ranks(&b, secs);
    if (o->check)
      wrong = check(&b, count);
    if (o->check) {
      /* Everybody's wrong count, so rank 0 prints the job's. */
      double w_all = (double)wrong;
      reduce_double(&b, (double)wrong, HVD_SUM, &w_all);
      wrong = (size_t)w_all;
    }
    switch (o->coll) {
    case ALLREDUCE: factor = 2.0 * (b.n - 1) / b.n; break;
    case BROADCAST: factor = 1.0; break;
    default: factor = (double)(b.n - 1) / b.n; break;
    }
    t_us = secs * 1e6;
    algbw = secs > 0 ? (double)shown / secs / 1e9 : 0;
    busbw = algbw * factor;
    bus_sum += busbw;
    rows++;
    total_wrong += wrong;
    if (b.rank == 0 && b.samples != NULL) {
      /* This rank's per-operation times: min, median, p99, max. */
      for (int i = iters - 1; i > 0; i--)
        b.samples[i] -= b.samples[i - 1];
      b.samples[0] -= t0;
      qsort(b.samples, (size_t)iters, sizeof(int64_t), compare_i64);
      printf("# per-op us on rank 0: min %.2f median %.2f p99 %.2f max %.2f\n",
             b.samples[0] / 1e3, b.samples[iters / 2] / 1e3, b.samples[(iters * 99) / 100] / 1e3,
             b.samples[iters - 1] / 1e3);
    }
    if (b.rank == 0) {
      printf("  %10zu %12zu %8s %6s %6d %10.2f %8.3f %8.3f %6zu\n", shown,
             o->coll == ALLREDUCE || o->coll == BROADCAST ? count : count * (size_t)b.n,
             o->dtype == HVD_FLOAT32 ? "float" : hvd_dtype_name(o->dtype),
             o->coll == ALLREDUCE || o->coll == REDUCESCATTER ? hvd_reduce_op_name(o->op) : "none",
             o->coll == BROADCAST ? o->root : -1, t_us, algbw, busbw, wrong);
      fflush(stdout);
    }
  }
  if (b.rank == 0 && code == 0) {
    printf("# Out of bounds values : %zu %s\n", total_wrong, total_wrong ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %.4f\n#\n", rows ? bus_sum / rows : 0.0);
  }
  if (total_wrong > 0)
    code = EXIT_FAIL;
  ops_ctx_destroy(b.ops);
  if (o->gpu) {
    hvd_handle_release(b.last);
    gpu_free(&b);
    free(b.host_out);
  } else {
    free(b.in);
    free(b.out);
  }
  free(b.ref);
  free(b.tmp);
  free(b.counts);
  free(b.samples);
  return code;
}

/* ==== launching ============================================================================ */

/* -g 1: hvd_init reads the rank's environment (hvdrun's, or run_local's). */
static int run_api(const struct options *o) {
  int rc;
  if (o->hierarchical) {
    setenv("HOROVOD_HIERARCHICAL_ALLREDUCE", "1", 1);
    setenv("HOROVOD_HIERARCHICAL_ALLGATHER", "1", 1);
  }
  if (hvd_init() != HVD_OK) {
    fprintf(stderr, "hvd-bench: hvd_init: %s\n", hvd_last_error_message());
    return EXIT_FAIL;
  }
  rc = bench_rank(o, NULL);
  fflush(stdout);
  hvd_shutdown();
  return rc;
}

static void set_int_env(const char *name, int v) {
  char text[16];
  snprintf(text, sizeof(text), "%d", v);
  setenv(name, text, 1);
}

/* --flood: a stranger that opens n connections to port and holds them,
 * silent, until it is killed. */
static void flood_main(int port, int n) {
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  /* Nothing of the rank's: a stranger shares none of its sockets. */
  for (int fd = 3; fd < 1024; fd++)
    close(fd);
  (void)hvd_raise_fd_limit();
  for (int i = 0; i < n; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
      break;
    (void)connect(fd, (struct sockaddr *)&sin, sizeof(sin));
  }
  for (;;)
    pause();
}

/* --store-flood: a stranger that keeps n connections to the store, each
 * sending a request line and then one header byte a second, never finishing;
 * a connection the store closes is opened again. */
static void store_flood_main(int port, int n) {
  static const char start[] = "GET /global/0 HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int *fds = malloc((size_t)n * sizeof(*fds));
  size_t *sent = calloc((size_t)n, sizeof(*sent));

  for (int fd = 3; fd < 1024; fd++)
    close(fd);
  (void)hvd_raise_fd_limit();
  if (fds == NULL || sent == NULL)
    _exit(EXIT_FAIL);
  for (int i = 0; i < n; i++)
    fds[i] = -1;
  for (;;) {
    for (int i = 0; i < n; i++) {
      if (fds[i] < 0) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fds[i] >= 0)
          (void)connect(fds[i], (struct sockaddr *)&sin, sizeof(sin));
        sent[i] = 0;
        continue;
      }
      char c = sent[i] < sizeof(start) - 1 ? start[sent[i]] : 'a';
      if (send(fds[i], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) {
        sent[i]++;
      } else if (errno != EAGAIN && errno != ENOTCONN) {
        close(fds[i]); /* the store closed it: come back */
        fds[i] = -1;
      }
    }
    hvd_sleep_ns(1000000000LL);
  }
}

static int run_local(const struct options *o) {
  struct rdzv_server_config scfg;
  struct rdzv_server_child server;
  pid_t ranks[MAX_LOCAL_RANKS];
  char hosts[MAX_LOCAL_RANKS][32];
  int port, code = 0;

  rdzv_server_config_default(&scfg);
  scfg.bind_address = "127.0.0.1";
  scfg.threads = 1;
  if (o->store_flood > 0) {
    scfg.max_connections = (unsigned)(o->store_flood - o->store_flood / 6);
    scfg.max_connections_per_address = scfg.max_connections; /* all from 127.0.0.1 */
  }
  if (rdzv_server_child_start(&scfg, 0, &server) != HVD_OK) {
    fprintf(stderr, "hvd-bench: the local rendezvous store did not start: %s\n",
            hvd_last_error_message());
    return EXIT_FAIL;
  }
  port = server.port;
  pid_t store_flooder = -1;
  if (o->store_flood > 0 && (store_flooder = fork()) == 0)
    store_flood_main(port, o->store_flood);
  if (store_flooder > 0)
    hvd_sleep_ns(1000 * 1000000LL); /* the slots are taken before the ranks come */
  for (int r = 0; r < o->np; r++) {
    snprintf(hosts[r], sizeof(hosts[r]), "host%d", r / (o->np / o->hosts));
    ranks[r] = fork();
    if (ranks[r] == 0) {
      struct net_world_config cfg;
      struct rdzv_client *store = NULL;
      struct net_world *w = NULL;
      int rc;
      close(server.ctl);
      hvd_log_set_rank(r);
      if (o->gpu) { /* the environment hvdrun would give the rank */
        set_int_env("HOROVOD_RANK", r);
        set_int_env("HOROVOD_SIZE", o->np);
        setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1", 1);
        set_int_env("HOROVOD_GLOO_RENDEZVOUS_PORT", port);
        setenv("HOROVOD_HOSTNAME", o->hosts > 1 ? hosts[r] : "localhost", 1);
        /* Derived from the hostnames, as below; the local store has no token. */
        unsetenv("HOROVOD_LOCAL_RANK");
        unsetenv("HOROVOD_LOCAL_SIZE");
        unsetenv("HOROVOD_CROSS_RANK");
        unsetenv("HOROVOD_CROSS_SIZE");
        unsetenv("HVD_TOKEN");
        _exit(run_api(o));
      }
      if (net_world_config_from_env(&cfg) != HVD_OK ||
          rdzv_client_create("127.0.0.1", port, NULL, 60000, &store) != HVD_OK) {
        fprintf(stderr, "hvd-bench: rank %d: %s\n", r, hvd_last_error_message());
        _exit(EXIT_FAIL);
      }
      cfg.ctx.rank = r;
      cfg.size = o->np;
      cfg.local_rank = cfg.local_size = cfg.cross_rank = cfg.cross_size = -1;
      cfg.ctx.hostname = o->hosts > 1 ? hosts[r] : "localhost";
      cfg.ctx.store = store;
      cfg.ctx.store_host = "127.0.0.1";
      cfg.ctx.store_port = port;
      if (net_world_create(&cfg, &w) != HVD_OK) {
        fprintf(stderr, "hvd-bench: rank %d: %s\n", r, hvd_last_error_message());
        _exit(EXIT_FAIL);
      }
      pid_t flooder = -1;
      if (r == 0 && o->flood > 0 && (flooder = fork()) == 0)
        flood_main(net_ctx_port(w->ctx), o->flood);
      if (flooder > 0)
        hvd_sleep_ns(500 * 1000000LL); /* let the flood arrive first */
      rc = bench_rank(o, w);
      if (flooder > 0) {
        kill(flooder, SIGKILL);
        waitpid(flooder, NULL, 0);
      }
      fflush(stdout);
      net_world_destroy(w);
      rdzv_client_destroy(store);
      _exit(rc);
    }
  }
  for (int r = 0; r < o->np; r++) {
    int status = 0;
    waitpid(ranks[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (code == 0)
        fprintf(stderr, "hvd-bench: rank %d ended with status 0x%x\n", r, status);
      code = EXIT_FAIL;
    }
  }
  if (store_flooder > 0) {
    kill(store_flooder, SIGKILL);
    waitpid(store_flooder, NULL, 0);
  }
  rdzv_server_child_stop(&server);
  return code;
}

/* Under hvdrun: the job's environment says who we are. */
static int run_env(const struct options *o) {
  struct net_world_config cfg;
  struct rdzv_client *store = NULL;
  struct net_world *w = NULL;
  const char *host = hvd_setting_given(HVD_SET_RENDEZVOUS_ADDR);
  int64_t port = 0;
  int rc;

  if (net_world_config_from_env(&cfg) != HVD_OK ||
      (cfg.size > 1 && rdzv_client_create_from_env(&store) != HVD_OK) ||
      hvd_setting_int(HVD_SET_RENDEZVOUS_PORT, &port) != HVD_OK) {
    fprintf(stderr, "hvd-bench: %s\n", hvd_last_error_message());
    return EXIT_FAIL;
  }
  hvd_log_set_rank(cfg.ctx.rank);
  cfg.ctx.store = store;
  cfg.ctx.store_host = host;
  cfg.ctx.store_port = port > 0 ? (int)port : 0; /* -1: unset */
  if (net_world_create(&cfg, &w) != HVD_OK) {
    fprintf(stderr, "hvd-bench: %s\n", hvd_last_error_message());
    rdzv_client_destroy(store);
    return EXIT_FAIL;
  }
  hvd_log_set_rank(w->rank); /* a pod learns it in net_world_create */
  rc = bench_rank(o, w);
  net_world_destroy(w);
  rdzv_client_destroy(store);
  return rc;
}

int main(int argc, char **argv) {
  struct options o;
  int rc = parse_args(argc, argv, &o);

  if (rc >= 0)
    return rc;
  signal(SIGPIPE, SIG_IGN);
  if (hvd_log_configure_from_env() != HVD_OK) {
    fprintf(stderr, "hvd-bench: %s\n", hvd_last_error_message());
    return EXIT_USAGE;
  }
  /* A rank of a job: started by hvdrun (HOROVOD_RANK), or a pod that
   * learns its rank from the store (HVD_POD=1). */
  if (o.np > 0 ||
      (hvd_setting_given(HVD_SET_RANK) == NULL && hvd_setting_given(HVD_SET_POD) == NULL)) {
    if (o.np == 0)
      o.np = 1;
    return run_local(&o);
  }
  return o.gpu ? run_api(&o) : run_env(&o);
}
