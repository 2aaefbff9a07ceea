/*
 * hvd-bench-grads: end-to-end gradient synchronisation through the public
 * API (include/hvd/hvd.h), the way a training framework drives hvd.
 *
 *   hvd-bench-grads steps --np 2 --fusion on --cache on -n 20 -w 3
 *   hvd-bench-grads latency --np 2 -n 5000 -w 500
 *
 * DESIGN. `steps`: each step, one user thread submits ResNet-50's 161
 * gradient tensors (bench/resnet50_params.h, 25,557,032 float32 values) as
 * sum allreduces named "grad.<index>", in an order that is a permutation
 * seeded by rank and step (so every rank submits in a different order, and
 * every step differs), then waits for and releases every handle. Right
 * after it, in the same step, the same bytes go through one plain
 * hvd_allreduce_async of a single 25,557,032-float tensor ("plain"), timed
 * the same way, so drift of the machine hits both alike. Every timed
 * section starts after an untimed hvd_barrier and ends when this rank's
 * last handle has completed. Each rank keeps its own section times; after
 * the timed loop one float64 max-allreduce makes them the slowest rank's
 * time per step, and rank 0 prints median, p10 and p90 over steps.
 * `latency`: a single small float32 allreduce (4 bytes unless --bytes;
 * "latency.0", the same name each time, as a training loop would), submitted and waited for on every
 * rank back to back, each op timed on its own; the slowest rank per op the
 * same way.
 *
 * The collectives use only the public API. In local mode (--np N) the
 * benchmark serves a rendezvous store in a child process (the library's
 * internal server, as bench/hvd_bench.c does) and forks N ranks, each given
 * the HOROVOD_* environment hvdrun would set; under hvdrun (HOROVOD_RANK
 * set, no --np) it reads the job's environment. --fusion and --cache set
 * HOROVOD_FUSION_THRESHOLD and HOROVOD_CACHE_CAPACITY before hvd_init in
 * every rank; other knobs (HOROVOD_CYCLE_TIME, HVD_FUSION_INPLACE_BYTES,
 * HVD_SPIN_US, ...) pass through the environment and are printed.
 *
 * With -c 1 every rank fills element j of tensor i with a small integer
 * depending on rank, i and j, so every summation order gives the same bits,
 * and checks the outputs of the first warmup step and of one extra untimed
 * step after the timed loop (outputs zeroed before each) against the exact
 * sum; latency checks every op. Wrong elements are counted over ranks and
 * make the exit code 1.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "hvd/hvd.h"
#include "rendezvous/rendezvous.h" /* local mode only: the store the ranks meet in */
#include "resnet50_params.h"

enum { EXIT_FAIL = 1, EXIT_USAGE = 2, MAX_LOCAL_RANKS = 64, MAX_ITERS = 1000000 };

#define FUSION_ON_BYTES 134217728 /* Horovod's default HOROVOD_FUSION_THRESHOLD, 128 MiB */
#define CACHE_ON_CAPACITY 1024    /* Horovod's default HOROVOD_CACHE_CAPACITY */

enum mode { MODE_STEPS, MODE_LATENCY };
enum order { ORDER_SHUFFLE, ORDER_FIXED, ORDER_REVERSE };

static const char *const order_names[] = {"shuffle", "fixed", "reverse"};

struct options {
  enum mode mode;
  int iters, warmup;
  bool check;
  bool plain; /* steps: also time the single-tensor allreduce */
  bool samples;
  long long fusion; /* HOROVOD_FUSION_THRESHOLD */
  long long cache;  /* HOROVOD_CACHE_CAPACITY */
  enum order order;
  unsigned long long seed;
  int np;           /* local mode: ranks to fork (0: from the environment) */
  int timeout_s;    /* local mode: HOROVOD_GLOO_TIMEOUT_SECONDS */
  int deadline_s;   /* local mode: kill every rank after this long */
  int latency_bytes; /* latency: the tensor's bytes (float32 values x 4) */
};

static const char usage_text[] =
    "usage: hvd-bench-grads MODE [options]\n"
    "\n"
    "MODE is\n"
    "  steps     ResNet-50 gradient steps: 161 float32 sum allreduces (25,557,032 values)\n"
    "            submitted by one thread in a per-rank, per-step order, then waited for;\n"
    "            each step also times one plain allreduce of the same bytes as one tensor\n"
    "  latency   one small float32 sum allreduce submitted and waited for on every rank,\n"
    "            back to back; per-op end-to-end latency in microseconds\n"
    "\n"
    "  -n, --iters N        timed steps (default 20) or ops (latency, default 5000)\n"
    "  -w, --warmup N       untimed steps (default 3) or ops (latency, default 500) first\n"
    "  -c, --check 0|1      check every rank's results (default 1)\n"
    "      --fusion on|off|BYTES  HOROVOD_FUSION_THRESHOLD: on = 134217728 (default),\n"
    "                       off = 0; K, M, G suffixes\n"
    "      --cache on|off|N HOROVOD_CACHE_CAPACITY: on = 1024 (default), off = 0\n"
    "      --order O        steps: shuffle (default: a permutation seeded by rank and step),\n"
    "                       fixed (table order on every rank) or reverse (backprop order)\n"
    "      --seed S         seed of the shuffle (default 1)\n"
    "      --plain 0|1      steps: also time the single-tensor allreduce (default 1)\n"
    "      --samples 0|1    also print every timed sample (default 1 for steps, 0 for latency)\n"
    "      --bytes B        latency: the tensor's size, a multiple of 4 in 4-4096 (default 4)\n"
    "      --np N           fork N local ranks and serve their store (default: from hvdrun's\n"
    "                       environment, or 1)\n"
    "      --timeout S      local mode: HOROVOD_GLOO_TIMEOUT_SECONDS for the ranks (default 60)\n"
    "      --deadline S     local mode: kill the ranks after S seconds (default 1800)\n"
    "  -h, --help           this text\n"
    "\n"
    "The flags override HOROVOD_FUSION_THRESHOLD and HOROVOD_CACHE_CAPACITY in the\n"
    "environment; HOROVOD_CYCLE_TIME, HVD_FUSION_INPLACE_BYTES, HVD_SPIN_US and the\n"
    "other knobs pass through to every rank and are printed in the header.\n"
    "Data lines (rank 0): case, samples, mean, median, p10, p90, min, max, unit, #wrong;\n"
    "time per step (or op) on the slowest rank.\n";

static int __attribute__((format(printf, 1, 2))) usage_error(const char *fmt, ...) {
  char reason[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof(reason), fmt, ap);
  va_end(ap);
  fprintf(stderr, "hvd-bench-grads: %s (see hvd-bench-grads --help)\n", reason);
  return EXIT_USAGE;
}

static bool parse_ll(const char *text, long long min, long long max, long long *out) {
  char *end;
  long long v;
  errno = 0;
  v = strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < min || v > max)
    return false;
  *out = v;
  return true;
}

static bool parse_int(const char *text, int min, int max, int *out) {
  long long v;
  if (!parse_ll(text, min, max, &v))
    return false;
  *out = (int)v;
  return true;
}

/* "on", "off" or a byte count with an optional K/M/G suffix (1024-based). */
static bool parse_fusion(const char *text, long long *out) {
  char *end;
  unsigned long long v, mult = 1;
  if (strcasecmp(text, "on") == 0) {
    *out = FUSION_ON_BYTES;
    return true;
  }
  if (strcasecmp(text, "off") == 0) {
    *out = 0;
    return true;
  }
  errno = 0;
  v = strtoull(text, &end, 10);
  if (end == text || errno != 0 || text[0] == '-')
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
  *out = (long long)(v * mult);
  return true;
}

static bool parse_cache(const char *text, long long *out) {
  if (strcasecmp(text, "on") == 0) {
    *out = CACHE_ON_CAPACITY;
    return true;
  }
  if (strcasecmp(text, "off") == 0) {
    *out = 0;
    return true;
  }
  return parse_ll(text, 0, 1 << 20, out);
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, struct options *o) {
  enum {
    OPT_FUSION = 256,
    OPT_CACHE,
    OPT_ORDER,
    OPT_SEED,
    OPT_PLAIN,
    OPT_SAMPLES,
    OPT_NP,
    OPT_TIMEOUT,
    OPT_DEADLINE,
    OPT_BYTES
  };
  static const struct option longopts[] = {
      {"iters", required_argument, NULL, 'n'},       {"warmup", required_argument, NULL, 'w'},
      {"check", required_argument, NULL, 'c'},       {"fusion", required_argument, NULL, OPT_FUSION},
      {"cache", required_argument, NULL, OPT_CACHE}, {"order", required_argument, NULL, OPT_ORDER},
      {"seed", required_argument, NULL, OPT_SEED},   {"plain", required_argument, NULL, OPT_PLAIN},
      {"samples", required_argument, NULL, OPT_SAMPLES},
      {"np", required_argument, NULL, OPT_NP},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"deadline", required_argument, NULL, OPT_DEADLINE},
      {"bytes", required_argument, NULL, OPT_BYTES},
      {"help", no_argument, NULL, 'h'},              {NULL, 0, NULL, 0}};
  int opt, flag, samples = -1;
  bool have_iters = false, have_warmup = false;
  long long seed;

  *o = (struct options){.mode = MODE_STEPS, .iters = 20, .warmup = 3, .check = true,
                        .plain = true, .fusion = -1, .cache = -1,
                        .order = ORDER_SHUFFLE, .seed = 1, .timeout_s = 60, .deadline_s = 1800,
                        .latency_bytes = 4};
  if (argc < 2 || argv[1][0] == '-') {
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
      fputs(usage_text, stdout);
      return 0;
    }
    return usage_error("name a mode first: steps or latency");
  }
  if (strcmp(argv[1], "steps") == 0)
    o->mode = MODE_STEPS;
  else if (strcmp(argv[1], "latency") == 0)
    o->mode = MODE_LATENCY;
  else
    return usage_error("unknown mode '%s' (expected steps or latency)", argv[1]);
  opterr = 0;
  optind = 2;
  while ((opt = getopt_long(argc, argv, ":n:w:c:h", longopts, NULL)) != -1) {
    switch (opt) {
    case 'n':
      if (!parse_int(optarg, 1, MAX_ITERS, &o->iters))
        return usage_error("-n '%s' must be an integer in 1-%d", optarg, MAX_ITERS);
      have_iters = true;
      break;
    case 'w':
      if (!parse_int(optarg, 0, MAX_ITERS, &o->warmup))
        return usage_error("-w '%s' must be an integer in 0-%d", optarg, MAX_ITERS);
      have_warmup = true;
      break;
    case 'c':
      if (!parse_int(optarg, 0, 1, &flag))
        return usage_error("-c '%s' must be 0 or 1", optarg);
      o->check = flag == 1;
      break;
    case OPT_FUSION:
      if (!parse_fusion(optarg, &o->fusion))
        return usage_error("--fusion '%s' must be on, off or a byte count (e.g. 64M)", optarg);
      break;
    case OPT_CACHE:
      if (!parse_cache(optarg, &o->cache))
        return usage_error("--cache '%s' must be on, off or a capacity in 0-%d", optarg,
                           1 << 20);
      break;
    case OPT_ORDER:
      for (flag = 0; flag < 3 && strcmp(optarg, order_names[flag]) != 0; flag++) {
      }
      if (flag == 3)
        return usage_error("--order '%s' must be shuffle, fixed or reverse", optarg);
      o->order = (enum order)flag;
      break;
    case OPT_SEED:
      if (!parse_ll(optarg, 0, (1ll << 62), &seed))
        return usage_error("--seed '%s' must be a non-negative integer", optarg);
      o->seed = (unsigned long long)seed;
      break;
    case OPT_PLAIN:
      if (!parse_int(optarg, 0, 1, &flag))
        return usage_error("--plain '%s' must be 0 or 1", optarg);
      o->plain = flag == 1;
      break;
    case OPT_SAMPLES:
      if (!parse_int(optarg, 0, 1, &samples))
        return usage_error("--samples '%s' must be 0 or 1", optarg);
      break;
    case OPT_NP:
      if (!parse_int(optarg, 1, MAX_LOCAL_RANKS, &o->np))
        return usage_error("--np '%s' must be 1-%d", optarg, MAX_LOCAL_RANKS);
      break;
    case OPT_TIMEOUT:
      if (!parse_int(optarg, 1, 86400, &o->timeout_s))
        return usage_error("--timeout '%s' must be 1-86400 seconds", optarg);
      break;
    case OPT_DEADLINE:
      if (!parse_int(optarg, 1, 7 * 86400, &o->deadline_s))
        return usage_error("--deadline '%s' must be 1-604800 seconds", optarg);
      break;
    case OPT_BYTES:
      if (!parse_int(optarg, 4, 4096, &o->latency_bytes) || o->latency_bytes % 4 != 0)
        return usage_error("--bytes '%s' must be a multiple of 4 in 4-4096", optarg);
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
  if (o->mode == MODE_LATENCY) {
    if (!have_iters)
      o->iters = 5000;
    if (!have_warmup)
      o->warmup = 500;
  } else if (o->check && o->warmup == 0) {
    return usage_error("-c 1 checks the first warmup step: give -w 1 or more, or -c 0");
  }
  o->samples = samples < 0 ? o->mode == MODE_STEPS : samples == 1;
  return -1;
}

/* ==== one rank ========================================================================= */

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Small integers: every summation order of N ranks gives the same bits. */
static float value(int rank, int tensor, int64_t j) {
  return (float)((rank * 3 + (tensor + 1) * 7 + (int)(j % 8191)) % 5 + 1);
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Submission order of one step on one rank. */
static void make_order(const struct options *o, int rank, int step, int *perm) {
  uint64_t s = o->seed * 0x100000001b3ull + (uint64_t)rank * 1000003u + (uint64_t)step;
  for (int i = 0; i < RESNET50_TENSORS; i++)
    perm[i] = o->order == ORDER_REVERSE ? RESNET50_TENSORS - 1 - i : i;
  if (o->order != ORDER_SHUFFLE)
    return;
  for (int i = RESNET50_TENSORS - 1; i > 0; i--) {
    int k = (int)(splitmix64(&s) % (uint64_t)(i + 1));
    int t = perm[i];
    perm[i] = perm[k];
    perm[k] = t;
  }
}

struct bench {
  const struct options *o;
  int rank, size;
  float *in[RESNET50_TENSORS], *out[RESNET50_TENSORS];
  float *plain_in, *plain_out;
  double *t_grads, *t_plain; /* seconds per timed step (or op), this rank's, then the max */
};

static int __attribute__((format(printf, 2, 3))) fail(const struct bench *b, const char *fmt,
                                                      ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "hvd-bench-grads: rank %d: %s\n", b->rank, msg);
  return EXIT_FAIL;
}

static int fail_status(const struct bench *b, const char *what, hvd_status st) {
  return fail(b, "%s: %s: %s", what, hvd_strerror(st), hvd_last_error_message());
}

/* One timed gradient step: submit all, then wait for and release all. */
static hvd_status grad_step(struct bench *b, int step, int64_t *ns) {
  static const hvd_options opts = HVD_OPTIONS_INIT;
  hvd_handle handles[RESNET50_TENSORS];
  int perm[RESNET50_TENSORS];
  char names[RESNET50_TENSORS][16];
  hvd_status st = HVD_OK, first = HVD_OK;
  int submitted = 0;
  int64_t t0;

  make_order(b->o, b->rank, step, perm);
  for (int i = 0; i < RESNET50_TENSORS; i++)
    snprintf(names[i], sizeof(names[i]), "grad.%d", i);
  st = hvd_barrier(HVD_PROCESS_SET_GLOBAL);
  if (st != HVD_OK)
    return st;
  t0 = now_ns();
  for (; submitted < RESNET50_TENSORS; submitted++) {
    int i = perm[submitted];
    hvd_tensor t = {names[i], HVD_FLOAT32, resnet50_params[i].ndims, resnet50_params[i].shape,
                    b->in[i], b->out[i]};
    st = hvd_allreduce_async(&t, &opts, &handles[submitted]);
    if (st != HVD_OK) {
      first = st;
      fail_status(b, "hvd_allreduce_async", st);
      break;
    }
  }
  for (int k = 0; k < submitted; k++) {
    st = hvd_handle_wait(handles[k]);
    if (st != HVD_OK && first == HVD_OK) {
      first = st;
      fail(b, "grad.%d: hvd_handle_wait: %s: %s", perm[k], hvd_strerror(st),
           hvd_last_error_message());
    }
    hvd_handle_release(handles[k]);
  }
  *ns = now_ns() - t0;
  return first;
}

static hvd_status plain_step(struct bench *b, int64_t *ns) {
  static const hvd_options opts = HVD_OPTIONS_INIT;
  const int64_t shape[1] = {RESNET50_VALUES};
  hvd_tensor t = {"plain", HVD_FLOAT32, 1, shape, b->plain_in, b->plain_out};
  hvd_handle h;
  hvd_status st = hvd_barrier(HVD_PROCESS_SET_GLOBAL);
  int64_t t0;

  if (st != HVD_OK)
    return st;
  t0 = now_ns();
  st = hvd_allreduce_async(&t, &opts, &h);
  if (st == HVD_OK) {
    st = hvd_handle_wait(h);
    hvd_handle_release(h);
  }
  *ns = now_ns() - t0;
  return st;
}

static void zero_outputs(struct bench *b) {
  for (int i = 0; i < RESNET50_TENSORS; i++)
    memset(b->out[i], 0, (size_t)resnet50_count(i) * sizeof(float));
  if (b->plain_out != NULL)
    memset(b->plain_out, 0, (size_t)RESNET50_VALUES * sizeof(float));
}

/* Wrong elements of one output (tensor index `tensor` of the fill pattern);
 * the first one of a check is described on stderr. */
static int64_t count_wrong(const struct bench *b, const float *got, int tensor, int64_t count,
                           int64_t wrong_before) {
  int64_t wrong = 0;
  for (int64_t j = 0; j < count; j++) {
    float want = 0;
    for (int r = 0; r < b->size; r++)
      want += value(r, tensor, j);
    if (got[j] != want) {
      if (wrong_before + wrong == 0)
        fprintf(stderr,
                "hvd-bench-grads: rank %d: %s element %lld is %g, expected %g\n", b->rank,
                tensor < 0 ? "plain" : resnet50_params[tensor].name, (long long)j,
                (double)got[j], (double)want);
      wrong++;
    }
  }
  return wrong;
}

static int64_t check_outputs(const struct bench *b) {
  int64_t wrong = 0;
  for (int i = 0; i < RESNET50_TENSORS; i++)
    wrong += count_wrong(b, b->out[i], i, resnet50_count(i), wrong);
  if (b->plain_out != NULL)
    wrong += count_wrong(b, b->plain_out, -1, RESNET50_VALUES, wrong);
  return wrong;
}

/* In place: every element becomes the max over ranks. */
static hvd_status max_over_ranks(double *v, int n, const char *name) {
  hvd_options opts = HVD_OPTIONS_INIT;
  const int64_t shape[1] = {n};
  hvd_tensor t = {name, HVD_FLOAT64, 1, shape, v, v};
  opts.op = HVD_MAX;
  return hvd_allreduce(&t, &opts);
}

static hvd_status sum_over_ranks(int64_t *v) {
  hvd_options opts = HVD_OPTIONS_INIT;
  const int64_t shape[1] = {1};
  hvd_tensor t = {"bench.wrong", HVD_INT64, 1, shape, v, v};
  return hvd_allreduce(&t, &opts);
}

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Linear interpolation between the closest ranks of sorted v. */
static double quantile(const double *v, int n, double q) {
  double pos = q * (n - 1);
  int lo = (int)floor(pos);
  int hi = lo + 1 < n ? lo + 1 : lo;
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

/* A data line from the max-over-ranks samples (sorted in place). */
static void print_line(const char *name, double *v, int n, double scale, const char *unit,
                       int64_t wrong, bool samples) {
  double sum = 0;
  if (samples) {
    printf("# samples %s (%s, in step order):", name, unit);
    for (int i = 0; i < n; i++)
      printf(" %.4g", v[i] * scale);
    printf("\n");
  }
  for (int i = 0; i < n; i++)
    sum += v[i];
  qsort(v, (size_t)n, sizeof(double), compare_double);
  printf("  %-10s %7d %11.3f %11.3f %11.3f %11.3f %11.3f %11.3f %4s %7lld\n", name, n,
         sum / n * scale, quantile(v, n, 0.5) * scale, quantile(v, n, 0.1) * scale,
         quantile(v, n, 0.9) * scale, v[0] * scale, v[n - 1] * scale, unit, (long long)wrong);
}

static const char *env_or(const char *name, const char *dflt) {
  const char *v = getenv(name);
  return v != NULL ? v : dflt;
}

static void print_header(const struct bench *b) {
  const struct options *o = b->o;
  printf("# hvd-bench-grads %s: %d ranks, hvd %s, %d warmup, %d timed, check %d\n",
         o->mode == MODE_STEPS ? "steps" : "latency", b->size, hvd_version(), o->warmup,
         o->iters, o->check);
  printf("# HOROVOD_FUSION_THRESHOLD=%s HOROVOD_CACHE_CAPACITY=%s HOROVOD_AUTOTUNE=%s\n",
         env_or("HOROVOD_FUSION_THRESHOLD", "(default)"),
         env_or("HOROVOD_CACHE_CAPACITY", "(default)"), env_or("HOROVOD_AUTOTUNE", "(default)"));
  printf("# HOROVOD_CYCLE_TIME=%s HVD_FUSION_INPLACE_BYTES=%s HVD_SPIN_US=%s "
         "HVD_SPIN_YIELD=%s HVD_ALLREDUCE_ALGORITHM=%s\n",
         env_or("HOROVOD_CYCLE_TIME", "(default)"), env_or("HVD_FUSION_INPLACE_BYTES", "(default)"),
         env_or("HVD_SPIN_US", "(default)"), env_or("HVD_SPIN_YIELD", "(default)"),
         env_or("HVD_ALLREDUCE_ALGORITHM", "(default)"));
  if (o->mode == MODE_STEPS) {
    printf("# grads: %d float32 sum allreduces \"grad.<i>\" (ResNet-50, %d values, %lld B), "
           "order %s (seed %llu), submitted by one thread, then waited for\n",
           RESNET50_TENSORS, RESNET50_VALUES, (long long)RESNET50_VALUES * 4,
           order_names[o->order], o->seed);
    if (o->plain)
      printf("# plain: one float32 sum allreduce of %d values, right after each grads step\n",
             RESNET50_VALUES);
    printf("# time: per step, from the first submit (after a barrier) to the last handle "
           "released, max over ranks per step (one float64 max-allreduce after the loop)\n");
  } else {
    printf("# latency: one float32 sum allreduce of %d value%s (%d B) \"latency.0\", submit + "
           "wait + release, back to back; max over ranks per op (one float64 max-allreduce "
           "after the loop)\n",
           o->latency_bytes / 4, o->latency_bytes > 4 ? "s" : "", o->latency_bytes);
  }
  printf("# %-10s %7s %11s %11s %11s %11s %11s %11s %4s %7s\n", "case", "samples", "mean",
         "median", "p10", "p90", "min", "max", "unit", "#wrong");
  fflush(stdout);
}

static int run_steps(struct bench *b) {
  const struct options *o = b->o;
  int64_t wrong = 0, ns;
  hvd_status st;

  for (int i = 0; i < RESNET50_TENSORS; i++) {
    size_t n = (size_t)resnet50_count(i);
    b->in[i] = malloc(n * sizeof(float));
    b->out[i] = malloc(n * sizeof(float));
    if (b->in[i] == NULL || b->out[i] == NULL)
      return fail(b, "cannot allocate 2 x %zu bytes for %s", n * sizeof(float),
                  resnet50_params[i].name);
    for (size_t j = 0; j < n; j++)
      b->in[i][j] = value(b->rank, i, (int64_t)j);
  }
  if (o->plain) {
    b->plain_in = malloc((size_t)RESNET50_VALUES * sizeof(float));
    b->plain_out = malloc((size_t)RESNET50_VALUES * sizeof(float));
    if (b->plain_in == NULL || b->plain_out == NULL)
      return fail(b, "cannot allocate 2 x %zu bytes for the plain tensor",
                  (size_t)RESNET50_VALUES * sizeof(float));
    for (int64_t j = 0; j < RESNET50_VALUES; j++)
      b->plain_in[j] = value(b->rank, -1, j);
  }
  zero_outputs(b);

  for (int s = 0; s < o->warmup + o->iters; s++) {
    int timed = s - o->warmup;
    st = grad_step(b, s, &ns);
    if (st != HVD_OK)
      return fail_status(b, "grads step", st);
    if (timed >= 0)
      b->t_grads[timed] = (double)ns / 1e9;
    if (o->plain) {
      st = plain_step(b, &ns);
      if (st != HVD_OK)
        return fail_status(b, "plain step", st);
      if (timed >= 0)
        b->t_plain[timed] = (double)ns / 1e9;
    }
    if (s == 0 && o->check)
      wrong += check_outputs(b);
  }
  if (o->check) {
    /* One more step, untimed, with zeroed outputs: a step that wrote nothing shows. */
    zero_outputs(b);
    st = grad_step(b, o->warmup + o->iters, &ns);
    if (st == HVD_OK && o->plain)
      st = plain_step(b, &ns);
    if (st != HVD_OK)
      return fail_status(b, "checked step", st);
    wrong += check_outputs(b);
    if ((st = sum_over_ranks(&wrong)) != HVD_OK)
      return fail_status(b, "summing the wrong counts", st);
  }
  if ((st = max_over_ranks(b->t_grads, o->iters, "bench.times.grads")) != HVD_OK ||
      (o->plain && (st = max_over_ranks(b->t_plain, o->iters, "bench.times.plain")) != HVD_OK))
    return fail_status(b, "collecting the step times", st);
  if (b->rank == 0) {
    double med_g, med_p = 0;
    print_line("grads", b->t_grads, o->iters, 1e3, "ms", wrong, o->samples);
    med_g = quantile(b->t_grads, o->iters, 0.5);
    if (o->plain) {
      print_line("plain", b->t_plain, o->iters, 1e3, "ms", wrong, o->samples);
      med_p = quantile(b->t_plain, o->iters, 0.5);
      printf("# ratio grads/plain (medians): %.3f\n", med_g / med_p);
    }
    printf("# %s\n", !o->check ? "results not checked (-c 0)"
                     : wrong == 0 ? "all results verified"
                                  : "FAILED: wrong elements");
    fflush(stdout);
  }
  return wrong == 0 ? 0 : EXIT_FAIL;
}

static int run_latency(struct bench *b) {
  enum { MAX_VALUES = 1024 };
  const struct options *o = b->o;
  static const hvd_options opts = HVD_OPTIONS_INIT;
  const int64_t shape[1] = {o->latency_bytes / 4};
  float in[MAX_VALUES], out[MAX_VALUES], want[MAX_VALUES];
  hvd_tensor t = {"latency.0", HVD_FLOAT32, 1, shape, in, out};
  int64_t wrong = 0;
  hvd_status st;

  for (int64_t j = 0; j < shape[0]; j++) {
    in[j] = value(b->rank, 0, j);
    want[j] = 0;
    for (int r = 0; r < b->size; r++)
      want[j] += value(r, 0, j);
  }
  st = hvd_barrier(HVD_PROCESS_SET_GLOBAL);
  for (int i = 0; i < o->warmup + o->iters && st == HVD_OK; i++) {
    hvd_handle h;
    int64_t t0;
    out[0] = out[shape[0] - 1] = -1;
    t0 = now_ns();
    st = hvd_allreduce_async(&t, &opts, &h);
    if (st == HVD_OK) {
      st = hvd_handle_wait(h);
      hvd_handle_release(h);
    }
    if (i >= o->warmup)
      b->t_grads[i - o->warmup] = (double)(now_ns() - t0) / 1e9;
    for (int64_t j = 0; st == HVD_OK && o->check && j < shape[0]; j++) {
      if (out[j] != want[j]) {
        if (wrong == 0)
          fail(b, "op %d: element %lld is %g, expected %g", i, (long long)j, (double)out[j],
               (double)want[j]);
        wrong++;
      }
    }
  }
  if (st != HVD_OK)
    return fail_status(b, "latency op", st);
  if (o->check && (st = sum_over_ranks(&wrong)) != HVD_OK)
    return fail_status(b, "summing the wrong counts", st);
  if ((st = max_over_ranks(b->t_grads, o->iters, "bench.times.latency")) != HVD_OK)
    return fail_status(b, "collecting the op times", st);
  if (b->rank == 0) {
    print_line("latency", b->t_grads, o->iters, 1e6, "us", wrong, o->samples);
    printf("# %s\n", !o->check ? "results not checked (-c 0)"
                     : wrong == 0 ? "all results verified"
                                  : "FAILED: wrong results");
    fflush(stdout);
  }
  return wrong == 0 ? 0 : EXIT_FAIL;
}

static void set_ll(const char *name, long long v) {
  char text[32];
  snprintf(text, sizeof(text), "%lld", v);
  setenv(name, text, 1);
}

/* hvd_init, the benchmark, hvd_shutdown: one rank's whole life. */
static int bench_rank(const struct options *o) {
  struct bench b = {.o = o};
  hvd_status st;
  int code;

  /* Only what the flags give: a knob the user sets is one the autotuner
   * leaves alone (HOROVOD_AUTOTUNE). */
  if (o->fusion >= 0)
    set_ll("HOROVOD_FUSION_THRESHOLD", o->fusion);
  if (o->cache >= 0)
    set_ll("HOROVOD_CACHE_CAPACITY", o->cache);
  if ((st = hvd_init()) != HVD_OK) {
    fprintf(stderr, "hvd-bench-grads: hvd_init: %s: %s\n", hvd_strerror(st),
            hvd_last_error_message());
    return EXIT_FAIL;
  }
  b.rank = hvd_rank();
  b.size = hvd_size();
  b.t_grads = calloc((size_t)o->iters, sizeof(double));
  b.t_plain = calloc((size_t)o->iters, sizeof(double));
  if (b.t_grads == NULL || b.t_plain == NULL) {
    code = fail(&b, "cannot allocate %d samples", o->iters);
  } else {
    if (b.rank == 0)
      print_header(&b);
    code = o->mode == MODE_STEPS ? run_steps(&b) : run_latency(&b);
  }
  hvd_shutdown();
  for (int i = 0; i < RESNET50_TENSORS; i++) {
    free(b.in[i]);
    free(b.out[i]);
  }
  free(b.plain_in);
  free(b.plain_out);
  free(b.t_grads);
  free(b.t_plain);
  return code;
}

/* ==== launching ============================================================================ */

/* Local mode: N ranks with the environment hvdrun would give them. */
static int run_local(const struct options *o) {
  struct rdzv_server_config cfg;
  struct rdzv_server_child store;
  pid_t ranks[MAX_LOCAL_RANKS];
  int port, code = 0, left = o->np;
  bool done[MAX_LOCAL_RANKS] = {false};
  int64_t start = now_ns(), grace_until = 0;

  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  cfg.threads = 1;
  if (rdzv_server_child_start(&cfg, 0, &store) != HVD_OK) {
    fprintf(stderr, "hvd-bench-grads: local rendezvous store: %s\n", hvd_last_error_message());
    return EXIT_FAIL;
  }
  port = store.port;
  fflush(stdout);
  for (int r = 0; r < o->np; r++) {
    ranks[r] = fork();
    if (ranks[r] < 0) {
      fprintf(stderr, "hvd-bench-grads: fork: %s\n", strerror(errno));
      for (int q = 0; q < r; q++)
        kill(ranks[q], SIGKILL);
      for (int q = 0; q < r; q++)
        waitpid(ranks[q], NULL, 0);
      rdzv_server_child_stop(&store);
      return EXIT_FAIL;
    }
    if (ranks[r] == 0) {
      close(store.ctl);
      set_ll("HOROVOD_RANK", r);
      set_ll("HOROVOD_SIZE", o->np);
      set_ll("HOROVOD_LOCAL_RANK", r);
      set_ll("HOROVOD_LOCAL_SIZE", o->np);
      set_ll("HOROVOD_CROSS_RANK", 0);
      set_ll("HOROVOD_CROSS_SIZE", 1);
      setenv("HOROVOD_HOSTNAME", "localhost", 1);
      setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1", 1);
      set_ll("HOROVOD_GLOO_RENDEZVOUS_PORT", port);
      set_ll("HOROVOD_GLOO_TIMEOUT_SECONDS", o->timeout_s);
      code = bench_rank(o);
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
  }
  /* Reap the ranks. After one fails, the others get the library's timeout
   * (plus a margin) to fail on their own before they are killed; the
   * deadline bounds the whole run. */
  while (left > 0) {
    int64_t now = now_ns();
    bool kill_all = now - start > (int64_t)o->deadline_s * 1000000000 ||
                    (grace_until > 0 && now > grace_until);
    for (int r = 0; r < o->np; r++) {
      int status = 0;
      pid_t got;
      if (done[r])
        continue;
      if (kill_all)
        kill(ranks[r], SIGKILL);
      got = waitpid(ranks[r], &status, kill_all ? 0 : WNOHANG);
      if (got == 0)
        continue;
      done[r] = true;
      left--;
      if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (kill_all)
          fprintf(stderr, "hvd-bench-grads: rank %d killed (%s)\n", r,
                  grace_until > 0 ? "still running after another rank failed"
                                  : "past --deadline");
        else if (WIFSIGNALED(status))
          fprintf(stderr, "hvd-bench-grads: rank %d died of signal %d\n", r, WTERMSIG(status));
        else
          fprintf(stderr, "hvd-bench-grads: rank %d exited with status %d\n", r,
                  WEXITSTATUS(status));
        code = EXIT_FAIL;
        if (grace_until == 0)
          grace_until = now + ((int64_t)o->timeout_s + 10) * 1000000000;
      }
    }
    if (left > 0)
      usleep(10000);
  }
  rdzv_server_child_stop(&store);
  return code;
}

int main(int argc, char **argv) {
  struct options o;
  int rc = parse_args(argc, argv, &o);

  if (rc >= 0)
    return rc;
  signal(SIGPIPE, SIG_IGN);
  {
    /* Sanity of the table: the figure torchvision documents. */
    int64_t total = 0;
    for (int i = 0; i < RESNET50_TENSORS; i++)
      total += resnet50_count(i);
    if (total != RESNET50_VALUES) {
      fprintf(stderr, "hvd-bench-grads: the ResNet-50 table sums to %lld values, not %d\n",
              (long long)total, RESNET50_VALUES);
      return EXIT_FAIL;
    }
  }
  if (o.np > 0 || hvd_setting_given(HVD_SET_RANK) == NULL) {
    if (o.np == 0)
      o.np = 1;
    return run_local(&o);
  }
  return bench_rank(&o);
}
