/*
 * train_elastic: the MLP of train_mlp (mlp.h), trained by an elastic job
 * that survives failed workers and hosts that come and go.
 *
 *   hvdrun --min-np 2 --max-np 4 --host-discovery-script ./hosts.sh \
 *       train_elastic --steps 600 --commit-every 10
 *
 * DESIGN. The state that must survive a reset is the model and the step
 * counter, registered with hvd_elastic_state_add; hvd_elastic_run does the
 * rest (see hvd.h). The training function runs steps from the state's
 * step on: the gradient of this rank's mini-batch, averaged over ranks
 * (one async allreduce per tensor), SGD, and every --commit-every steps
 * hvd_elastic_commit. Any failing hvd call ends the function with its
 * status, which tells hvd_elastic_run what to do. A reset callback
 * regenerates this rank's data shard, as the rank may have changed.
 * After the last step every rank checks that its parameters are bitwise
 * rank 0's.
 *
 * Rank 0 prints "start: N workers, from step S (after R resets)" when
 * training starts and after every reset, and "reset R: first step S done
 * at T" after the first step that follows a reset (T: CLOCK_REALTIME seconds, so that a test can
 * measure how long a reset took), plus the loss every --print-every
 * steps. A worker the driver removes prints so and exits 0.
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

enum { EXIT_FAIL = 1, EXIT_USAGE = 2, SHARD = 4096 };

struct options {
  int steps, batch, commit_every, print_every, step_ms;
  double lr;
};

struct training {
  struct options o;
  struct teacher teacher;
  struct mlp model; /* registered */
  int64_t step;     /* registered: steps done */
  struct mlp grad;
  float *x, *y; /* this rank's shard */
  int shard_rank;
  bool new_round; /* print the first step of the round */
};

static const char usage_text[] =
    "usage: train_elastic [options]\n"
    "\n"
    "Trains train_mlp's model in an elastic hvd job (hvdrun --min-np ... or\n"
    "--host-discovery-script ...): workers may fail or be added, and the job\n"
    "goes on from the last commit.\n"
    "\n"
    "  --steps N          steps in all (default 600)\n"
    "  --batch N          samples per rank per step (default 32)\n"
    "  --lr X             learning rate (default 0.5)\n"
    "  --commit-every N   commit the state every N steps (default 10)\n"
    "  --print-every N    rank 0 prints the loss every N steps (default 100)\n"
    "  --step-ms N        sleep N ms per step, to stretch the run (default 0)\n"
    "  -h, --help         this text\n";

static int usage_error(const char *what, const char *value) {
  fprintf(stderr, "train_elastic: %s '%s' (see train_elastic --help)\n", what, value);
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

static int parse_args(int argc, char **argv, struct options *o) {
  static const struct option longopts[] = {
      {"steps", required_argument, NULL, 's'},        {"batch", required_argument, NULL, 'b'},
      {"lr", required_argument, NULL, 'l'},           {"commit-every", required_argument, NULL, 'c'},
      {"print-every", required_argument, NULL, 'p'},  {"step-ms", required_argument, NULL, 'm'},
      {"help", no_argument, NULL, 'h'},               {NULL, 0, NULL, 0},
  };
  int c;
  char *end;

  *o = (struct options){600, 32, 10, 100, 0, 0.5};
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 's':
      if (!parse_int(optarg, 1, 10000000, &o->steps))
        return usage_error("--steps must be an integer in 1-10000000, not", optarg);
      break;
    case 'b':
      if (!parse_int(optarg, 1, SHARD, &o->batch))
        return usage_error("--batch must be an integer in 1-4096, not", optarg);
      break;
    case 'c':
      if (!parse_int(optarg, 1, 10000000, &o->commit_every))
        return usage_error("--commit-every must be a positive integer, not", optarg);
      break;
    case 'p':
      if (!parse_int(optarg, 1, 10000000, &o->print_every))
        return usage_error("--print-every must be a positive integer, not", optarg);
      break;
    case 'm':
      if (!parse_int(optarg, 0, 60000, &o->step_ms))
        return usage_error("--step-ms must be an integer in 0-60000, not", optarg);
      break;
    case 'l':
      errno = 0;
      o->lr = strtod(optarg, &end);
      if (end == optarg || *end != '\0' || errno != 0 || !(o->lr > 0.0 && o->lr <= 100.0))
        return usage_error("--lr must be a number above 0 and at most 100, not", optarg);
      break;
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    case ':':
      return usage_error("this option needs a value:", argv[optind - 1]);
    default:
      return usage_error("unknown option", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument", argv[optind]);
  return -1;
}

static double realtime_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Returns st after printing what failed, unless it is an elastic event that
 * hvd_elastic_run handles quietly. */
static hvd_status failed(const char *what, hvd_status st) {
  if (st != HVD_ERR_HOSTS_UPDATED)
    fprintf(stderr, "train_elastic: rank %d: %s: %s: %s\n", hvd_rank(), what, hvd_strerror(st),
            hvd_last_error_message());
  return st;
}

/* This rank's shard, for the rank it has now. */
static void on_reset(void *arg) {
  struct training *t = arg;
  t->shard_rank = hvd_rank();
  make_shard(&t->teacher, t->shard_rank, SHARD, t->x, t->y);
  t->new_round = true;
}

static hvd_status average(struct mlp *g) {
  struct tensor_ref refs[NPARAM];
  hvd_handle h[NPARAM] = {NULL};
  hvd_options o = HVD_OPTIONS_INIT;
  char names[NPARAM][16];
  hvd_status st = HVD_OK, first = HVD_OK;

  o.op = HVD_AVERAGE;
  mlp_tensors(g, refs);
  for (int i = 0; i < NPARAM && st == HVD_OK; i++) {
    hvd_tensor ht = {names[i], HVD_FLOAT32, refs[i].ndims, refs[i].shape, refs[i].data,
                     refs[i].data};
    snprintf(names[i], sizeof(names[i]), "grad.%s", refs[i].name);
    st = hvd_allreduce_async(&ht, &o, &h[i]);
    if (st != HVD_OK)
      first = failed("hvd_allreduce_async", st);
  }
  for (int i = 0; i < NPARAM; i++) {
    if (h[i] == NULL)
      continue;
    st = hvd_handle_wait(h[i]);
    if (st != HVD_OK && first == HVD_OK)
      first = failed("allreduce of the gradients", st);
    hvd_handle_release(h[i]);
  }
  return first;
}

static hvd_status train(hvd_elastic_state *state, void *arg) {
  struct training *t = arg;
  hvd_status st;

  if (hvd_rank() != t->shard_rank)
    on_reset(t);
  if (hvd_rank() == 0)
    printf("start: %d workers, from step %lld (after %d resets)\n", hvd_size(),
           (long long)t->step, hvd_elastic_resets());
  while (t->step < t->o.steps) {
    size_t first = (size_t)t->step * (size_t)t->o.batch % SHARD;
    double loss = mlp_gradient(&t->model, t->x, t->y, SHARD, first, t->o.batch, &t->grad);
    if ((st = average(&t->grad)) != HVD_OK)
      return st;
    mlp_sgd(&t->model, &t->grad, (float)t->o.lr);
    t->step++;
    if (t->new_round && hvd_rank() == 0)
      printf("reset %d: first step %lld done at %.3f\n", hvd_elastic_resets(),
             (long long)t->step, realtime_now());
    t->new_round = false;
    if (hvd_rank() == 0 && t->step % t->o.print_every == 0)
      printf("step %lld: %d workers, loss %.4f\n", (long long)t->step, hvd_size(), loss);
    if (t->o.step_ms > 0) {
      struct timespec ts = {t->o.step_ms / 1000, (long)(t->o.step_ms % 1000) * 1000000};
      nanosleep(&ts, NULL);
    }
    if (t->step % t->o.commit_every == 0 && (st = hvd_elastic_commit(state)) != HVD_OK)
      return failed("hvd_elastic_commit", st);
  }
  return HVD_OK;
}

/* Whether every rank's parameters are bitwise rank 0's (collective). */
static hvd_status check_identical(struct training *t, bool *identical) {
  struct mlp ref = t->model;
  int64_t shape[1] = {(int64_t)sizeof(ref)}, one[1] = {1};
  int32_t differ;
  hvd_tensor b = {"check.model", HVD_UINT8, 1, shape, &ref, &ref};
  hvd_tensor s = {"check.differ", HVD_INT32, 1, one, &differ, &differ};
  hvd_status st = hvd_broadcast(&b, NULL);

  differ = memcmp(&ref, &t->model, sizeof(ref)) != 0;
  if (st == HVD_OK)
    st = hvd_allreduce(&s, NULL);
  *identical = differ == 0;
  return st;
}

/* Trains through hvd_elastic_run and checks the result: the exit code. */
static int run(struct training *t) {
  hvd_elastic_state *state = NULL;
  bool identical = false;
  hvd_status st;
  int rc;

  teacher_init(&t->teacher);
  mlp_init(&t->model, 0); /* the same start everywhere; sync makes sure */
  on_reset(t);
  t->new_round = false;
  st = hvd_elastic_state_create(&state);
  if (st == HVD_OK)
    st = hvd_elastic_state_add(state, "model", &t->model, sizeof(t->model));
  if (st == HVD_OK)
    st = hvd_elastic_state_add(state, "step", &t->step, sizeof(t->step));
  if (st == HVD_OK)
    st = hvd_elastic_state_on_reset(state, on_reset, t);
  if (st == HVD_OK)
    st = hvd_elastic_run(state, train, t);
  if (st == HVD_ERR_REMOVED) {
    printf("train_elastic: this worker was removed from the job; exiting\n");
    rc = 0;
  } else if (st != HVD_OK) {
    rc = (failed("hvd_elastic_run", st), EXIT_FAIL);
  } else if ((st = check_identical(t, &identical)) != HVD_OK) {
    rc = (failed("checking the parameters", st), EXIT_FAIL);
  } else {
    double loss = mlp_loss(&t->model, t->x, t->y, SHARD);
    if (hvd_rank() == 0)
      printf("done: %lld steps, %d workers, %d resets, loss %.4f, parameters %s\n",
             (long long)t->step, hvd_size(), hvd_elastic_resets(), loss,
             identical ? "identical on every rank" : "DIFFER between ranks");
    rc = identical ? 0 : EXIT_FAIL;
  }
  hvd_elastic_state_destroy(state);
  return rc;
}

int main(int argc, char **argv) {
  struct training *t = calloc(1, sizeof(*t));
  hvd_status st;
  int rc = t == NULL ? EXIT_FAIL : parse_args(argc, argv, &t->o);

  if (rc >= 0) {
    free(t);
    return rc;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  t->x = malloc((size_t)SHARD * INPUTS * sizeof(*t->x));
  t->y = malloc((size_t)SHARD * sizeof(*t->y));
  if (t->x == NULL || t->y == NULL) {
    rc = EXIT_FAIL;
  } else if ((st = hvd_init()) == HVD_ERR_REMOVED) { /* a pod that came after the job ended */
    printf("train_elastic: this worker has no place in the job (%s); exiting\n",
           hvd_last_error_message());
    rc = 0;
  } else if (st != HVD_OK) {
    rc = (failed("hvd_init", st), EXIT_FAIL);
  } else {
    rc = run(t);
  }
  hvd_shutdown();
  free(t->x);
  free(t->y);
  free(t);
  return rc;
}
