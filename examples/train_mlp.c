/*
 * train_mlp: data-parallel training of a small MLP through hvd's public API,
 * the way a training framework drives hvd.
 *
 *   hvdrun -np 4 train_mlp --steps 300 --expect-loss-below 0.3
 *
 * DESIGN. The model is 16 inputs -> 32 tanh units -> 1 logit, trained with
 * sigmoid and binary cross-entropy by plain SGD. The task is synthetic but
 * learnable: a fixed "teacher" network (its own seed, the same on every
 * rank) labels points drawn uniformly from [-1, 1]^16. Each rank draws its
 * own shard of points from a seed that depends on its rank and walks
 * through it in mini-batches. Parameters are initialised from a
 * rank-dependent seed on purpose, then broadcast from rank 0: without that
 * broadcast the ranks would train different models, and the final check
 * would say so (--no-broadcast shows it).
 *
 * Each step every rank computes the gradient of its own mini-batch, submits
 * one asynchronous HVD_AVERAGE allreduce per parameter tensor ("grad.W1",
 * "grad.b1", "grad.W2", "grad.b2": stable names, so the coordinator's
 * response cache and tensor fusion get used), waits for and releases every
 * handle, then applies the averaged gradient. As every rank applies the
 * same bits to the same bits, the parameters stay bitwise identical; at the
 * end each rank compares its parameters with rank 0's (broadcast into a
 * scratch copy) and a sum allreduce counts the ranks that differ.
 *
 * Rank 0 prints the loss averaged over ranks: at step 1, every
 * --print-every steps and at the last step, the mean loss of the
 * mini-batches since the previous line (each before its update), and over
 * every rank's whole shard before and after training ("initial loss",
 * "final loss"; --expect-loss-below checks the latter, which is not at the
 * mercy of one noisy mini-batch).
 *
 * Within a rank every sum runs in a fixed order, so a run is reproducible
 * for a given number of ranks.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hvd/hvd.h>

#include "mlp.h"

enum { EXIT_FAIL = 1, EXIT_USAGE = 2 };

struct options {
  int steps;
  int batch;      /* samples per rank per step */
  int shard;      /* samples per rank */
  int print_every;
  double lr;
  double expect_below; /* < 0: no check */
  bool broadcast;
};

static int g_rank = -1; /* this rank, for messages; -1 before hvd_init */

static const char usage_text[] =
    "usage: train_mlp [options]\n"
    "\n"
    "Trains a 16-32-1 MLP (tanh, sigmoid + binary cross-entropy) by SGD on a\n"
    "synthetic classification task, data-parallel over the job's ranks: gradients\n"
    "are averaged with one hvd allreduce per parameter tensor. Run it under hvdrun,\n"
    "or alone as a job of one rank.\n"
    "\n"
    "  --steps N              training steps (default 300)\n"
    "  --batch N              samples per rank per step (default 32)\n"
    "  --shard N              training samples per rank (default 4096)\n"
    "  --lr X                 learning rate (default 0.5)\n"
    "  --print-every N        rank 0 prints the loss every N steps (default 50):\n"
    "                         the mean over ranks and over the steps since the last\n"
    "                         line\n"
    "  --expect-loss-below X  exit 1 unless the final loss (over every rank's whole\n"
    "                         shard) is below X\n"
    "  --no-broadcast         skip the initial broadcast of rank 0's parameters\n"
    "                         (a demonstration: the ranks then diverge and the\n"
    "                         final check fails)\n"
    "  -h, --help             this text\n"
    "\n"
    "Exit status: 0 on success, 1 when hvd fails, the ranks' parameters differ or\n"
    "the loss is not below --expect-loss-below, 2 for a bad option.\n";

static int __attribute__((format(printf, 1, 2))) usage_error(const char *fmt, ...) {
  char reason[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof(reason), fmt, ap);
  va_end(ap);
  fprintf(stderr, "train_mlp: %s (see train_mlp --help)\n", reason);
  return EXIT_USAGE;
}

static bool parse_int(const char *text, int min, int max, int *out) {
  char *end;
  long v;
  errno = 0;
  v = strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < min || v > max)
    return false;
  *out = (int)v;
  return true;
}

/* A finite number in (min, max]. */
static bool parse_double(const char *text, double min, double max, double *out) {
  char *end;
  double v;
  errno = 0;
  v = strtod(text, &end);
  if (end == text || *end != '\0' || errno != 0 || !isfinite(v) || v <= min || v > max)
    return false;
  *out = v;
  return true;
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, struct options *o) {
  enum { OPT_STEPS = 256, OPT_BATCH, OPT_SHARD, OPT_LR, OPT_PRINT, OPT_EXPECT, OPT_NO_BCAST };
  static const struct option longopts[] = {
      {"steps", required_argument, NULL, OPT_STEPS},
      {"batch", required_argument, NULL, OPT_BATCH},
      {"shard", required_argument, NULL, OPT_SHARD},
      {"lr", required_argument, NULL, OPT_LR},
      {"print-every", required_argument, NULL, OPT_PRINT},
      {"expect-loss-below", required_argument, NULL, OPT_EXPECT},
      {"no-broadcast", no_argument, NULL, OPT_NO_BCAST},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int c;

  *o = (struct options){300, 32, 4096, 50, 0.5, -1.0, true};
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case OPT_STEPS:
      if (!parse_int(optarg, 1, 10000000, &o->steps))
        return usage_error("--steps '%s' must be an integer in 1-10000000", optarg);
      break;
    case OPT_BATCH:
      if (!parse_int(optarg, 1, 1 << 16, &o->batch))
        return usage_error("--batch '%s' must be an integer in 1-%d", optarg, 1 << 16);
      break;
    case OPT_SHARD:
      if (!parse_int(optarg, 1, 1 << 22, &o->shard))
        return usage_error("--shard '%s' must be an integer in 1-%d", optarg, 1 << 22);
      break;
    case OPT_LR:
      if (!parse_double(optarg, 0.0, 100.0, &o->lr))
        return usage_error("--lr '%s' must be a number above 0 and at most 100", optarg);
      break;
    case OPT_PRINT:
      if (!parse_int(optarg, 1, 10000000, &o->print_every))
        return usage_error("--print-every '%s' must be an integer in 1-10000000", optarg);
      break;
    case OPT_EXPECT:
      if (!parse_double(optarg, 0.0, 1e9, &o->expect_below))
        return usage_error("--expect-loss-below '%s' must be a positive number", optarg);
      break;
    case OPT_NO_BCAST:
      o->broadcast = false;
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
  return -1;
}

/* ==== reporting hvd failures ============================================== */

/* Prints what failed with hvd's message; returns EXIT_FAIL. */
static int hvd_failed(const char *what, hvd_status st) {
  char msg[1024];
  /* The message is only valid until the next hvd call: copy it first. */
  snprintf(msg, sizeof(msg), "%s", hvd_last_error_message());
  if (g_rank >= 0)
    fprintf(stderr, "train_mlp: rank %d: ", g_rank);
  else
    fprintf(stderr, "train_mlp: ");
  fprintf(stderr, "%s failed: %s: %s\n", what, hvd_strerror(st),
          msg[0] != '\0' ? msg : "(no detail)");
  return EXIT_FAIL;
}

/* ==== collectives ============================================================ */

static hvd_tensor as_hvd(const struct tensor_ref *r, const char *name, const void *input,
                         void *output) {
  return (hvd_tensor){name, HVD_FLOAT32, r->ndims, r->shape, input, output};
}

/* Averages g over the ranks in place: one async allreduce per tensor, then
 * every handle waited for and released. */
static int average_gradients(struct mlp *g) {
  struct tensor_ref t[NPARAM];
  hvd_handle h[NPARAM] = {NULL};
  hvd_options o = HVD_OPTIONS_INIT;
  char names[NPARAM][16], what[128];
  int submitted = 0, rc = 0;
  hvd_status st;

  o.op = HVD_AVERAGE;
  mlp_tensors(g, t);
  for (; submitted < NPARAM; submitted++) {
    int i = submitted;
    hvd_tensor ht;
    snprintf(names[i], sizeof(names[i]), "grad.%s", t[i].name);
    ht = as_hvd(&t[i], names[i], t[i].data, t[i].data);
    if ((st = hvd_allreduce_async(&ht, &o, &h[i])) != HVD_OK) {
      snprintf(what, sizeof(what), "hvd_allreduce_async of %s", names[i]);
      rc = hvd_failed(what, st);
      /* The other ranks will wait for this tensor forever: leave the job,
       * which completes the handles already submitted (aborted). */
      (void)hvd_shutdown(); /* already failing: its status adds nothing */
      break;
    }
  }
  for (int i = 0; i < submitted; i++) {
    if ((st = hvd_handle_wait(h[i])) != HVD_OK && rc == 0) {
      snprintf(what, sizeof(what), "allreduce of %s", names[i]);
      rc = hvd_failed(what, st);
    }
    hvd_handle_release(h[i]);
  }
  return rc;
}

/* *out = the average over ranks of v (float64). */
static int mean_over_ranks(double v, const char *name, double *out) {
  int64_t shape[1] = {1};
  hvd_tensor t = {name, HVD_FLOAT64, 1, shape, &v, &v};
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_status st;
  o.op = HVD_AVERAGE;
  if ((st = hvd_allreduce(&t, &o)) != HVD_OK) {
    char what[64];
    snprintf(what, sizeof(what), "allreduce of %s", name);
    return hvd_failed(what, st);
  }
  *out = v;
  return 0;
}

/* Copies rank 0's parameters m into out on every rank (out may be m); the
 * tensors are named "<prefix>.W1", ... */
static int broadcast_params(struct mlp *m, struct mlp *out, const char *prefix) {
  struct tensor_ref in[NPARAM], to[NPARAM];
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_status st;

  o.root = 0;
  mlp_tensors(m, in);
  mlp_tensors(out, to);
  for (int i = 0; i < NPARAM; i++) {
    char name[32];
    hvd_tensor t;
    snprintf(name, sizeof(name), "%s.%s", prefix, in[i].name);
    t = as_hvd(&in[i], name, in[i].data, to[i].data);
    if ((st = hvd_broadcast(&t, &o)) != HVD_OK) {
      char what[64];
      snprintf(what, sizeof(what), "broadcast of %s", name);
      return hvd_failed(what, st);
    }
  }
  return 0;
}

/* Compares m bitwise with rank 0's; *identical (written on success) says
 * whether every rank's parameters equal rank 0's. */
static int check_identical(struct mlp *m, int size, bool *identical) {
  struct mlp ref;
  struct tensor_ref mine[NPARAM], theirs[NPARAM];
  int32_t *differ = calloc((size_t)size, sizeof(*differ));
  int64_t shape[1] = {size};
  hvd_tensor t = {"check.differ", HVD_INT32, 1, shape, differ, differ};
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_status st;
  int rc;

  if (differ == NULL) {
    fprintf(stderr, "train_mlp: rank %d: cannot allocate %d flags\n", g_rank, size);
    return EXIT_FAIL;
  }
  if ((rc = broadcast_params(m, &ref, "check")) != 0)
    goto out;
  mlp_tensors(m, mine);
  mlp_tensors(&ref, theirs);
  for (int k = 0; k < NPARAM && differ[g_rank] == 0; k++) {
    for (size_t i = 0; i < mine[k].count; i++) {
      if (memcmp(&mine[k].data[i], &theirs[k].data[i], sizeof(float)) != 0) {
        fprintf(stderr, "train_mlp: rank %d: %s[%zu] is %.9g here but %.9g on rank 0\n", g_rank,
                mine[k].name, i, mine[k].data[i], theirs[k].data[i]);
        differ[g_rank] = 1;
        break;
      }
    }
  }
  if ((st = hvd_allreduce(&t, &o)) != HVD_OK) {
    rc = hvd_failed("allreduce of check.differ", st);
    goto out;
  }
  if (g_rank == 0) {
    int n = 0;
    for (int r = 0; r < size; r++)
      n += differ[r] != 0;
    if (n == 0) {
      printf("parameters identical on all %d ranks\n", size);
    } else {
      fprintf(stderr, "train_mlp: parameters differ from rank 0's on %d of %d ranks:", n, size);
      for (int r = 0; r < size; r++)
        if (differ[r] != 0)
          fprintf(stderr, " %d", r);
      fprintf(stderr, "\n");
    }
  }
  *identical = true;
  for (int r = 0; r < size; r++)
    if (differ[r] != 0)
      *identical = false;
out:
  free(differ);
  return rc;
}

/* ==== training =============================================================== */

static double seconds_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int train(const struct options *o, int size) {
  struct teacher teach;
  struct mlp m, g;
  float *x = malloc((size_t)o->shard * INPUTS * sizeof(*x));
  float *y = malloc((size_t)o->shard * sizeof(*y));
  double loss, window = 0.0, t0;
  int window_steps = 0;
  bool identical = false;
  int rc = 0;

  if (x == NULL || y == NULL) {
    fprintf(stderr, "train_mlp: rank %d: cannot allocate a shard of %d samples\n", g_rank,
            o->shard);
    rc = EXIT_FAIL;
    goto out;
  }
  teacher_init(&teach);
  make_shard(&teach, g_rank, o->shard, x, y);
  mlp_init(&m, g_rank);
  if (o->broadcast && (rc = broadcast_params(&m, &m, "param")) != 0)
    goto out;

  if (g_rank == 0)
    printf("train_mlp: %d rank%s, MLP %d-%d-1, %d steps, batch %d per rank, shard %d per "
           "rank, lr %g%s\n",
           size, size == 1 ? "" : "s", INPUTS, HIDDEN, o->steps, o->batch, o->shard, o->lr,
           o->broadcast ? "" : ", no initial broadcast");
  if ((rc = mean_over_ranks(mlp_loss(&m, x, y, o->shard), "loss.initial", &loss)) != 0)
    goto out;
  if (g_rank == 0)
    printf("initial loss %.4f\n", loss);

  t0 = seconds_now();
  for (int step = 1; step <= o->steps; step++) {
    size_t first = (size_t)(step - 1) * (size_t)o->batch % (size_t)o->shard;
    window += mlp_gradient(&m, x, y, o->shard, first, o->batch, &g);
    window_steps++;
    if ((rc = average_gradients(&g)) != 0)
      goto out;
    /* Every rank takes the same decision here: the loss allreduce matches. */
    if (step == 1 || step % o->print_every == 0 || step == o->steps) {
      if ((rc = mean_over_ranks(window / window_steps, "loss.window", &loss)) != 0)
        goto out;
      if (g_rank == 0)
        printf("step %d loss %.4f\n", step, loss);
      window = 0.0;
      window_steps = 0;
    }
    mlp_sgd(&m, &g, (float)o->lr);
  }

  if ((rc = mean_over_ranks(mlp_loss(&m, x, y, o->shard), "loss.final", &loss)) != 0)
    goto out;
  if (g_rank == 0)
    printf("final loss %.4f (%d steps in %.2f s)\n", loss, o->steps, seconds_now() - t0);
  if ((rc = check_identical(&m, size, &identical)) != 0)
    goto out;
  if (!identical) {
    rc = EXIT_FAIL;
    goto out;
  }
  if (o->expect_below > 0.0 && !(loss < o->expect_below)) {
    if (g_rank == 0)
      fprintf(stderr, "train_mlp: final loss %.4f is not below %g (--expect-loss-below)\n",
              loss, o->expect_below);
    rc = EXIT_FAIL;
  }
out:
  free(y);
  free(x);
  return rc;
}

int main(int argc, char **argv) {
  struct options o;
  hvd_status st;
  int rc = parse_args(argc, argv, &o);

  if (rc >= 0)
    return rc;
  setvbuf(stdout, NULL, _IOLBF, 0); /* ranks share a terminal or a pipe */
  if ((st = hvd_init()) != HVD_OK)
    return hvd_failed("hvd_init", st);
  g_rank = hvd_rank();
  rc = train(&o, hvd_size());
  if ((st = hvd_shutdown()) != HVD_OK && rc == 0)
    rc = hvd_failed("hvd_shutdown", st);
  return rc;
}
