/*
 * Unit tests for the autotuner: the Cholesky factorisation and the Gaussian
 * process of src/common/bayes.c, the Bayesian optimiser on synthetic
 * throughput curves, the tuner's state machine (src/coord/tuner.c) driven
 * by a simulated job whose throughput depends on the setting, its CSV log,
 * and the environment variables. Time is simulated: nothing here sleeps or
 * depends on the machine's speed. Every suite is its own ctest entry
 * (CK_RUN_SUITE).
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "tune/tune_private.h"

#define MIB (1024.0 * 1024.0)

static bool contains(const char *haystack, const char *needle) {
  return strstr(haystack, needle) != NULL;
}

#define ck_assert_contains(h, n)                                                                   \
  ck_assert_msg(contains((h), (n)), "'%s' does not contain '%s'", (h), (n))

/* An error message is one line. */
static void assert_one_line_error(const char *needle) {
  const char *msg = hvd_last_error_message();
  ck_assert_contains(msg, needle);
  ck_assert_msg(strchr(msg, '\n') == NULL, "'%s' spans lines", msg);
}

/* ==== Cholesky ====================================================================== */

START_TEST(test_cholesky_known) {
  /* A = L Lᵀ with L = [2 0 0; 6 1 0; -8 5 3]; the upper triangle is not ours. */
  double a[3][4] = {{4, 777, 777, 777}, {12, 37, 777, 777}, {-16, -43, 98, 777}};
  const double l[3][3] = {{2, 0, 0}, {6, 1, 0}, {-8, 5, 3}};
  double b[3] = {-20, -43, 192}; /* A (1, 2, 3) */

  ck_assert(tune_bayes_cholesky(&a[0][0], 3, 4));
  for (int i = 0; i < 3; i++) {
    for (int j = 0; j <= i; j++)
      ck_assert_double_eq_tol(a[i][j], l[i][j], 1e-12);
    for (int j = i + 1; j < 4; j++)
      ck_assert_double_eq(a[i][j], 777);
  }
  tune_bayes_cholesky_solve(&a[0][0], 3, 4, b);
  for (int i = 0; i < 3; i++)
    ck_assert_double_eq_tol(b[i], i + 1, 1e-12);
}
END_TEST

START_TEST(test_cholesky_larger) {
  /* A = M Mᵀ + n I for an integer M: positive definite; solve A x = A (1..n). */
  enum { n = 12 };
  double m[n][n], a[n][n], orig[n][n], b[n];

  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++)
      m[i][j] = (double)((i * 7 + j * 3) % 11) - 5;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      double s = i == j ? n : 0;
      for (int k = 0; k < n; k++)
        s += m[i][k] * m[j][k];
      a[i][j] = orig[i][j] = s;
    }
  for (int i = 0; i < n; i++) {
    b[i] = 0;
    for (int j = 0; j < n; j++)
      b[i] += orig[i][j] * (j + 1);
  }
  ck_assert(tune_bayes_cholesky(&a[0][0], n, n));
  for (int i = 0; i < n; i++) /* L Lᵀ gives A back */
    for (int j = 0; j <= i; j++) {
      double s = 0;
      for (int k = 0; k <= j; k++)
        s += a[i][k] * a[j][k];
      ck_assert_double_eq_tol(s, orig[i][j], 1e-9 * fabs(orig[i][i]));
    }
  tune_bayes_cholesky_solve(&a[0][0], n, n, b);
  for (int i = 0; i < n; i++)
    ck_assert_double_eq_tol(b[i], i + 1, 1e-8);
}
END_TEST

START_TEST(test_cholesky_not_positive_definite) {
  double indefinite[2][2] = {{1, 0}, {2, 1}}; /* eigenvalues 3 and -1 */
  double singular[2][2] = {{1, 0}, {1, 1}};
  double zero[1] = {0};
  double one[1] = {4}, b[1] = {8};

  ck_assert(!tune_bayes_cholesky(&indefinite[0][0], 2, 2));
  ck_assert(!tune_bayes_cholesky(&singular[0][0], 2, 2));
  ck_assert(!tune_bayes_cholesky(zero, 1, 1));
  ck_assert(tune_bayes_cholesky(one, 1, 1));
  ck_assert_double_eq(one[0], 2);
  tune_bayes_cholesky_solve(one, 1, 1, b);
  ck_assert_double_eq(b[0], 2);
}
END_TEST

/* ==== the Gaussian process ============================================================ */

static struct tune_bayes *model(int dims, double noise, uint64_t seed) {
  struct tune_bayes_options o;
  struct tune_bayes *b = NULL;

  memset(&o, 0, sizeof(o));
  o.dims = dims;
  for (int i = 0; i < dims; i++) {
    o.dim[i].lo = 0;
    o.dim[i].hi = 1;
  }
  o.noise = noise;
  o.xi = 0.1;
  o.seed = seed;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_OK);
  return b;
}

START_TEST(test_gp_prior) {
  struct tune_bayes *b = model(2, 0.8, 1);
  double x[2] = {0.3, 0.7}, mean, var, ei;

  ck_assert_int_eq(tune_bayes_count(b), 0);
  ck_assert_int_eq(tune_bayes_predict(b, x, &mean, &var), HVD_OK);
  ck_assert_double_eq(mean, 0);
  ck_assert_double_eq(var, 1);
  ck_assert_int_eq(tune_bayes_expected_improvement(b, x, &ei), HVD_OK);
  ck_assert_double_eq(ei, 0);
  ck_assert_int_eq(tune_bayes_best(b, x, &mean), HVD_ERR_PRECONDITION);
  ck_assert_int_eq(tune_bayes_propose(b, x), HVD_OK); /* the centre */
  ck_assert_double_eq(x[0], 0.5);
  ck_assert_double_eq(x[1], 0.5);
  tune_bayes_destroy(b);
}
END_TEST

START_TEST(test_gp_interpolates) {
  /* Without noise the mean goes through every sample and the variance
   * vanishes there, and only there. */
  struct tune_bayes *b = model(1, 0, 1);
  double xs[6] = {0, 0.2, 0.4, 0.6, 0.8, 1.0}, mean, var, mid_var;

  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(tune_bayes_add(b, &xs[i], 100 + 50 * sin(6 * xs[i])), HVD_OK);
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(tune_bayes_predict(b, &xs[i], &mean, &var), HVD_OK);
    ck_assert_double_eq_tol(mean, 100 + 50 * sin(6 * xs[i]), 1e-3);
    ck_assert_double_le(var, 1e-4);
  }
  xs[0] = 0.5;
  ck_assert_int_eq(tune_bayes_predict(b, &xs[0], &mean, &var), HVD_OK);
  ck_assert_double_gt(var, 1e-3);
  ck_assert_double_eq_tol(mean, 100 + 50 * sin(3), 10); /* between its neighbours */
  tune_bayes_destroy(b);

  /* With noise too, the variance is smaller where samples were taken than
   * away from them. */
  b = model(2, 0.8, 1);
  {
    double pts[3][2] = {{0.8, 0.2}, {0.5, 0.5}, {0.25, 0.75}}, far[2] = {1, 1};
    double far_var;
    for (int i = 0; i < 3; i++)
      ck_assert_int_eq(tune_bayes_add(b, pts[i], i + 1), HVD_OK);
    ck_assert_int_eq(tune_bayes_predict(b, far, &mean, &far_var), HVD_OK);
    for (int i = 0; i < 3; i++) {
      ck_assert_int_eq(tune_bayes_predict(b, pts[i], &mean, &mid_var), HVD_OK);
      ck_assert_double_lt(mid_var, far_var);
    }
  }
  tune_bayes_destroy(b);
}
END_TEST

START_TEST(test_gp_repeated_points) {
  /* The same point twice without noise is a singular kernel: jitter copes. */
  struct tune_bayes *b = model(1, 0, 1);
  double x = 0.5, mean, var;

  ck_assert_int_eq(tune_bayes_add(b, &x, 10), HVD_OK);
  ck_assert_int_eq(tune_bayes_add(b, &x, 12), HVD_OK);
  ck_assert_int_eq(tune_bayes_predict(b, &x, &mean, &var), HVD_OK);
  ck_assert_double_eq_tol(mean, 11, 1e-3);
  ck_assert_int_eq(tune_bayes_propose(b, &x), HVD_OK);
  ck_assert(x >= 0 && x <= 1);
  tune_bayes_destroy(b);
}
END_TEST

START_TEST(test_ei_prefers_unexplored_and_high) {
  struct tune_bayes *b = model(1, 0.01, 1);
  double xs[4] = {0.1, 0.2, 0.3, 0.4}, ys[4] = {1, 2, 3, 4};
  double low, uphill, far, at_sample;

  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(tune_bayes_add(b, &xs[i], ys[i]), HVD_OK);
  ck_assert_int_eq(tune_bayes_expected_improvement(b, (double[]){0.0}, &low), HVD_OK);
  ck_assert_int_eq(tune_bayes_expected_improvement(b, (double[]){0.5}, &uphill), HVD_OK);
  ck_assert_int_eq(tune_bayes_expected_improvement(b, (double[]){0.95}, &far), HVD_OK);
  ck_assert_int_eq(tune_bayes_expected_improvement(b, &xs[3], &at_sample), HVD_OK);
  ck_assert_double_ge(low, 0);
  ck_assert_double_gt(uphill, low);  /* where the trend points beats the known low end */
  ck_assert_double_gt(far, low);     /* so does the unexplored */
  ck_assert_double_eq(at_sample, 0); /* nothing to learn where a sample was taken */
  tune_bayes_destroy(b);
}
END_TEST

/* ==== the optimiser ===================================================================== */

/* One peak, at 32 of [0, 64], 120 high over a floor of 20. */
static double curve_1d(const double *x) {
  return 100.0 / (1 + (x[0] - 32) * (x[0] - 32) / 64.0) + 20;
}

/* A peak at 32 MiB and 2 ms, the second coordinate being log2(ms): 1200 high. */
static double curve_2d(const double *x) {
  double a = (x[0] - 32) / 16, c = (x[1] - 1) / 2;
  return 1000 * exp(-0.5 * (a * a + c * c)) + 200;
}

/* Optimises f from x0 for `samples` samples; the best score seen. */
static double optimise(struct tune_bayes *b, const struct tune_bayes_options *o, double *x,
                       double (*f)(const double *), int samples) {
  double best = -INFINITY;
  for (int i = 0; i < samples; i++) {
    double y = f(x);
    if (y > best)
      best = y;
    ck_assert_int_eq(tune_bayes_add(b, x, y), HVD_OK);
    ck_assert_int_eq(tune_bayes_propose(b, x), HVD_OK);
    for (int d = 0; d < o->dims; d++)
      ck_assert(x[d] >= o->dim[d].lo && x[d] <= o->dim[d].hi);
  }
  return best;
}

START_TEST(test_bo_1d) {
  struct tune_bayes_options o = {.dims = 1, .dim = {{0, 64, 0}}, .noise = 0.8, .xi = 0.1};
  for (uint64_t seed = 1; seed <= 3; seed++) {
    struct tune_bayes *b;
    double x = 8, bx, mean;
    o.seed = seed;
    ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_OK);
    ck_assert_double_ge(optimise(b, &o, &x, curve_1d, 20), 0.97 * 120);
    ck_assert_int_eq(tune_bayes_best(b, &bx, &mean), HVD_OK);
    ck_assert_double_ge(curve_1d(&bx), 0.9 * 120);
    tune_bayes_destroy(b);
  }
}
END_TEST

START_TEST(test_bo_2d) {
  struct tune_bayes_options o = {
      .dims = 2, .dim = {{0, 64, 0}, {log2(0.1), log2(100), 0}}, .noise = 0.8, .xi = 0.1};
  for (uint64_t seed = 1; seed <= 3; seed++) {
    struct tune_bayes *b;
    double x[2] = {8, 5};
    o.seed = seed;
    ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_OK);
    ck_assert_double_ge(optimise(b, &o, x, curve_2d, 20), 0.97 * 1200);
    tune_bayes_destroy(b);
  }
}
END_TEST

/* Continuous peak at 0.7 of [0, 1]; the switch (levels 2) is worth 30%. */
static double curve_switch(const double *x) {
  return (1 + 0.3 * x[1]) * (1 - (x[0] - 0.7) * (x[0] - 0.7));
}

START_TEST(test_bo_discrete) {
  struct tune_bayes_options o = {
      .dims = 2, .dim = {{0, 1, 0}, {0, 1, 2}}, .noise = 0.8, .xi = 0.1, .seed = 7};
  struct tune_bayes *b;
  double x[2] = {0.1, 0}, best = -1, at[2] = {0, 0};

  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_OK);
  for (int i = 0; i < 20; i++) {
    double y = curve_switch(x);
    if (y > best) {
      best = y;
      at[0] = x[0];
      at[1] = x[1];
    }
    ck_assert_int_eq(tune_bayes_add(b, x, y), HVD_OK);
    ck_assert_int_eq(tune_bayes_propose(b, x), HVD_OK);
    ck_assert(x[1] == 0 || x[1] == 1); /* exactly a level */
  }
  ck_assert_double_eq(at[1], 1);
  ck_assert_double_ge(best, 0.97 * 1.3);
  tune_bayes_destroy(b);
}
END_TEST

START_TEST(test_bo_deterministic) {
  struct tune_bayes_options o = {.dims = 2,
                                .dim = {{0, 64, 0}, {log2(0.1), log2(100), 0}},
                                .noise = 0.8,
                                .xi = 0.1,
                                .seed = 42};
  struct tune_bayes *a, *b;
  double xa[2] = {8, 5}, xb[2] = {8, 5};

  ck_assert_int_eq(tune_bayes_create(&o, &a), HVD_OK);
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_OK);
  for (int i = 0; i < 10; i++) {
    ck_assert_int_eq(tune_bayes_add(a, xa, curve_2d(xa)), HVD_OK);
    ck_assert_int_eq(tune_bayes_add(b, xb, curve_2d(xb)), HVD_OK);
    ck_assert_int_eq(tune_bayes_propose(a, xa), HVD_OK);
    ck_assert_int_eq(tune_bayes_propose(b, xb), HVD_OK);
    ck_assert(memcmp(xa, xb, sizeof(xa)) == 0);
  }
  tune_bayes_destroy(a);
  tune_bayes_destroy(b);
}
END_TEST

START_TEST(test_bo_bad_arguments) {
  struct tune_bayes_options o = {.dims = 1, .dim = {{0, 1, 0}}, .noise = 0.8, .xi = 0.1};
  struct tune_bayes *b = NULL;
  double x;

  o.dims = 0;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_ERR_INVALID_ARGUMENT);
  o.dims = TUNE_BAYES_MAX_DIMS + 1;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_ERR_INVALID_ARGUMENT);
  assert_one_line_error("dimensions");
  o.dims = 1;
  o.dim[0].hi = 0;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_ERR_INVALID_ARGUMENT);
  o.dim[0].hi = 1;
  o.dim[0].levels = 1;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_ERR_INVALID_ARGUMENT);
  o.dim[0].levels = 0;
  o.noise = -1;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_ERR_INVALID_ARGUMENT);
  o.noise = NAN;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(b);
  o.noise = 0.8;
  ck_assert_int_eq(tune_bayes_create(&o, &b), HVD_OK);

  x = 1.5;
  ck_assert_int_eq(tune_bayes_add(b, &x, 1), HVD_ERR_INVALID_ARGUMENT);
  assert_one_line_error("outside the box");
  x = NAN;
  ck_assert_int_eq(tune_bayes_add(b, &x, 1), HVD_ERR_INVALID_ARGUMENT);
  x = 0.5;
  ck_assert_int_eq(tune_bayes_add(b, &x, INFINITY), HVD_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < TUNE_BAYES_MAX_SAMPLES; i++) {
    x = (double)i / TUNE_BAYES_MAX_SAMPLES;
    ck_assert_int_eq(tune_bayes_add(b, &x, i % 5), HVD_OK);
  }
  ck_assert_int_eq(tune_bayes_add(b, &x, 1), HVD_ERR_TOO_LARGE);
  ck_assert_int_eq(tune_bayes_count(b), TUNE_BAYES_MAX_SAMPLES);
  ck_assert_int_eq(tune_bayes_propose(b, &x), HVD_OK); /* a full model still works */
  tune_bayes_destroy(b);
  tune_bayes_destroy(NULL);
}
END_TEST

/* ==== the tuner ============================================================================ */

/* The simulated job: throughput 1 GB/s at fusion 32 MiB, cycle 2 ms, cache
 * on and hierarchical allreduce off, falling off smoothly around them. */
static double job_throughput(const struct tune_setting *s) {
  double f = (double)s->fusion_threshold / MIB, c = (double)s->cycle_ns / 1e6;
  double a = (f - 32) / 32, b = log2(c / 2) / 3;
  return 1e9 / (1 + a * a + b * b) * (s->cache_enabled ? 1.0 : 0.9) *
         (s->hierarchical_allreduce ? 0.85 : 1.0);
}

static struct tune_config test_config(void) {
  struct tune_config c;
  memset(&c, 0, sizeof(c));
  c.enabled = true;
  c.warmup_samples = 3;
  c.steps_per_sample = 10;
  c.max_samples = 20;
  c.gp_noise = 0.8;
  c.seed = 1;
  return c;
}

static struct tune_setting test_initial(void) {
  struct tune_setting s;
  memset(&s, 0, sizeof(s));
  s.fusion_threshold = 128u << 20; /* Horovod's default: above the box */
  s.cycle_ns = 1000000;
  s.allreduce_ring_bytes = 16u << 20;
  s.segment_bytes = 512u << 10;
  s.cache_enabled = true;
  return s;
}

enum { MAX_SETTINGS = 128, STEP_BYTES = 64 << 20 };

struct trace {
  struct tune_setting first, last;
  struct tune_setting settings[MAX_SETTINGS]; /* as returned, after first */
  int n;
  int64_t steps;             /* record calls after the first */
  int64_t first_change_step; /* the step that returned the first change; 0: none */
};

/* Runs the job under the tuner until tuning ends: every step reduces
 * STEP_BYTES at the current setting's throughput. */
static void drive(struct tune_tuner *t, const struct tune_setting *first,
                  double (*throughput)(const struct tune_setting *), struct trace *tr) {
  struct tune_setting cur = *first, next;
  int64_t now = INT64_C(1000000000);

  memset(tr, 0, sizeof(*tr));
  tr->first = *first;
  ck_assert(!tune_tuner_record(t, 12345, now, &next)); /* starts the clock */
  while (!tune_tuner_done(t)) {
    ck_assert_int_lt(tr->steps, 100000);
    now += llround(STEP_BYTES / throughput(&cur) * 1e9);
    tr->steps++;
    if (!tune_tuner_record(t, STEP_BYTES, now, &next))
      continue;
    ck_assert_uint_eq(next.number, cur.number + 1);
    ck_assert(!cur.final);
    ck_assert_int_lt(tr->n, MAX_SETTINGS);
    if (tr->first_change_step == 0)
      tr->first_change_step = tr->steps;
    tr->settings[tr->n++] = next;
    cur = next;
  }
  ck_assert(cur.final);
  tune_tuner_current(t, &tr->last);
  ck_assert(memcmp(&tr->last, &cur, sizeof(cur)) == 0);
  ck_assert(!tune_tuner_record(t, STEP_BYTES, now + 1000000, &next));
}

static void assert_in_box(const struct tune_setting *s) {
  ck_assert_uint_le(s->fusion_threshold, TUNE_FUSION_MAX);
  ck_assert_uint_eq(s->fusion_threshold % 1024, 0);
  ck_assert_int_ge(s->cycle_ns, TUNE_CYCLE_MIN_NS);
  ck_assert_int_le(s->cycle_ns, TUNE_CYCLE_MAX_NS);
  ck_assert_int_eq(s->cycle_ns % 1000, 0);
  ck_assert_uint_ge(s->allreduce_ring_bytes, TUNE_RING_MIN);
  ck_assert_uint_le(s->allreduce_ring_bytes, TUNE_RING_MAX);
  ck_assert_uint_eq(s->allreduce_ring_bytes % 4096, 0);
  ck_assert_uint_ge(s->segment_bytes, TUNE_SEGMENT_MIN);
  ck_assert_uint_le(s->segment_bytes, TUNE_SEGMENT_MAX);
  ck_assert_uint_eq(s->segment_bytes % 4096, 0);
}

START_TEST(test_tuner_finds_optimum) {
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *t;
  struct trace tr;
  unsigned mask = TUNE_BIT(TUNE_FUSION) | TUNE_BIT(TUNE_CYCLE);

  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, mask, &t, &first), HVD_OK);
  ck_assert_uint_eq(first.number, 1);
  ck_assert(!first.final);
  ck_assert_uint_eq(first.fusion_threshold, TUNE_FUSION_MAX); /* moved into the box */
  ck_assert_int_eq(first.cycle_ns, 1000000);
  drive(t, &first, job_throughput, &tr);
  for (int i = 0; i < tr.n; i++)
    assert_in_box(&tr.settings[i]);
  ck_assert_double_ge(job_throughput(&tr.last), 0.97e9);
  ck_assert_double_ge((double)tr.last.fusion_threshold / MIB, 24);
  ck_assert_double_le((double)tr.last.fusion_threshold / MIB, 40);
  ck_assert_int_ge(tr.last.cycle_ns, 1400000);
  ck_assert_int_le(tr.last.cycle_ns, 2800000);
  /* 20 samples and up to 3 re-measured, all after 3 discarded. */
  ck_assert_int_ge(tr.steps, (3 + 20 + 2) * 10);
  ck_assert_int_le(tr.steps, (3 + 20 + 3) * 10);
  tune_tuner_destroy(t);
}
END_TEST

START_TEST(test_tuner_all_knobs) {
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *t;
  struct trace tr;

  cfg.max_samples = 40;
  initial.hierarchical_allreduce = true;
  initial.cache_enabled = false;
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &t, &first), HVD_OK);
  assert_in_box(&first);
  drive(t, &first, job_throughput, &tr);
  for (int i = 0; i < tr.n; i++)
    assert_in_box(&tr.settings[i]);
  ck_assert(tr.last.cache_enabled);
  ck_assert(!tr.last.hierarchical_allreduce);
  ck_assert_double_ge(job_throughput(&tr.last), 0.9e9);
  tune_tuner_destroy(t);
}
END_TEST

/* Warm-up samples are dropped: the first proposal comes after them and one
 * scored sample, however fast the warm-up ran. */
static int64_t clock_calls;
static double fast_warmup(const struct tune_setting *s) {
  return ++clock_calls <= 30 ? 1e15 : job_throughput(s);
}

START_TEST(test_tuner_discards_warmup) {
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *t;
  struct trace tr;
  char path[] = "/tmp/hvd_tune_warmupXXXXXX";
  int fd = mkstemp(path);
  char line[256];
  FILE *f;
  int rows = 0;

  ck_assert_int_ge(fd, 0);
  close(fd);
  snprintf(cfg.log_path, sizeof(cfg.log_path), "%s", path);
  clock_calls = 0;
  ck_assert_int_eq(
      tune_tuner_create(&cfg, &initial, TUNE_BIT(TUNE_FUSION), &t, &first), HVD_OK);
  drive(t, &first, fast_warmup, &tr);
  ck_assert_int_eq(tr.first_change_step, (3 + 1) * 10);
  ck_assert_uint_ne(tr.last.fusion_threshold, first.fusion_threshold);
  /* No row has the warm-up's absurd score, and there is one per scored sample. */
  f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof(line), f) != NULL) {
    rows++;
    ck_assert(!contains(line, "e+15"));
  }
  fclose(f);
  ck_assert_int_eq(rows - 1, tr.steps / 10 - 3);
  unlink(path);
  tune_tuner_destroy(t);
}
END_TEST

START_TEST(test_tuner_respects_pinned) {
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *t;
  struct trace tr;
  bool fusion_moved = false;

  /* Pinned values outside the box stay as they are. */
  initial.cycle_ns = 5;
  initial.allreduce_ring_bytes = 12345;
  initial.segment_bytes = 777;
  initial.hierarchical_allreduce = true;
  initial.hierarchical_allgather = true;
  initial.cache_enabled = false;
  ck_assert_int_eq(
      tune_tuner_create(&cfg, &initial, TUNE_BIT(TUNE_FUSION), &t, &first), HVD_OK);
  drive(t, &first, job_throughput, &tr);
  for (int i = 0; i < tr.n; i++) {
    const struct tune_setting *s = &tr.settings[i];
    ck_assert_int_eq(s->cycle_ns, 5);
    ck_assert_uint_eq(s->allreduce_ring_bytes, 12345);
    ck_assert_uint_eq(s->segment_bytes, 777);
    ck_assert(s->hierarchical_allreduce && s->hierarchical_allgather && !s->cache_enabled);
    ck_assert_uint_le(s->fusion_threshold, TUNE_FUSION_MAX);
    fusion_moved |= s->fusion_threshold != first.fusion_threshold;
  }
  ck_assert(fusion_moved);
  tune_tuner_destroy(t);
}
END_TEST

START_TEST(test_tuner_nothing_to_tune) {
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first, next;
  struct tune_tuner *t;

  /* No knob: setting 1 is the initial one, final. */
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, 0, &t, &first), HVD_OK);
  ck_assert(first.final);
  ck_assert_uint_eq(first.number, 1);
  ck_assert_uint_eq(first.fusion_threshold, initial.fusion_threshold);
  ck_assert(tune_tuner_done(t));
  for (int i = 0; i < 100; i++)
    ck_assert(!tune_tuner_record(t, STEP_BYTES, 1000000 * (i + 1), &next));
  tune_tuner_destroy(t);

  /* No samples: the same, with the knobs only moved into their box. */
  cfg.max_samples = 0;
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &t, &first), HVD_OK);
  ck_assert(first.final);
  ck_assert(tune_tuner_done(t));
  ck_assert_uint_eq(first.fusion_threshold, TUNE_FUSION_MAX);
  tune_tuner_destroy(t);
  tune_tuner_destroy(NULL);
}
END_TEST

START_TEST(test_tuner_deterministic) {
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *a, *b;
  static struct trace ta, tb;

  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &a, &first), HVD_OK);
  drive(a, &first, job_throughput, &ta);
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &b, &first), HVD_OK);
  drive(b, &first, job_throughput, &tb);
  ck_assert_int_eq(ta.n, tb.n);
  ck_assert(memcmp(ta.settings, tb.settings, sizeof(ta.settings[0]) * (size_t)ta.n) == 0);
  tune_tuner_destroy(a);
  tune_tuner_destroy(b);
}
END_TEST

START_TEST(test_tuner_bad_config) {
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *t = NULL;

  cfg.steps_per_sample = 0;
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &t, &first),
                   HVD_ERR_INVALID_ARGUMENT);
  cfg = test_config();
  cfg.max_samples = TUNE_BAYES_MAX_SAMPLES + 1;
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &t, &first),
                   HVD_ERR_INVALID_ARGUMENT);
  cfg = test_config();
  cfg.gp_noise = 2;
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &t, &first),
                   HVD_ERR_INVALID_ARGUMENT);
  cfg = test_config();
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, 1u << TUNE_KNOBS, &t, &first),
                   HVD_ERR_INVALID_ARGUMENT);
  assert_one_line_error("unknown knobs");
  ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_setting_wire) {
  struct tune_setting s = test_initial(), back;
  unsigned char wire[TUNE_SETTING_BYTES];

  s.number = 0x0102030405060708u;
  s.hierarchical_allgather = true;
  s.final = true;
  tune_setting_encode(&s, wire);
  ck_assert_uint_eq(wire[0], 0x08); /* little-endian */
  ck_assert_int_eq(tune_setting_decode(wire, sizeof(wire), &back), HVD_OK);
  ck_assert_uint_eq(back.number, s.number);
  ck_assert_uint_eq(back.fusion_threshold, s.fusion_threshold);
  ck_assert_int_eq(back.cycle_ns, s.cycle_ns);
  ck_assert_uint_eq(back.allreduce_ring_bytes, s.allreduce_ring_bytes);
  ck_assert_uint_eq(back.segment_bytes, s.segment_bytes);
  ck_assert(back.final && back.hierarchical_allgather && back.cache_enabled &&
            !back.hierarchical_allreduce);

  back.number = 99;
  ck_assert_int_eq(tune_setting_decode(wire, sizeof(wire) - 1, &back), HVD_ERR_PROTOCOL);
  wire[40] |= 0x80;
  ck_assert_int_eq(tune_setting_decode(wire, sizeof(wire), &back), HVD_ERR_PROTOCOL);
  assert_one_line_error("flags");
  wire[40] &= 0x7f;
  wire[23] = 0x80; /* cycle's top byte: negative */
  ck_assert_int_eq(tune_setting_decode(wire, sizeof(wire), &back), HVD_ERR_PROTOCOL);
  ck_assert_uint_eq(back.number, 99); /* untouched on failure */
}
END_TEST

/* ==== the CSV log ============================================================================ */

static char *read_file(const char *path) {
  FILE *f = fopen(path, "r");
  char *text;
  long size;

  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
  size = ftell(f);
  rewind(f);
  text = calloc(1, (size_t)size + 1);
  ck_assert_ptr_nonnull(text);
  ck_assert_uint_eq(fread(text, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  return text;
}

static const char HEADER[] = "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,"
                             "cache_enabled,cycle_time_ms,tensor_fusion_threshold,score,"
                             "allreduce_ring_bytes,ring_segment_bytes\n";

START_TEST(test_log_rows) {
  char path[] = "/tmp/hvd_tune_logXXXXXX";
  int fd = mkstemp(path);
  struct tune_log *l;
  struct tune_setting s = test_initial();
  char *text;

  ck_assert_int_ge(fd, 0);
  close(fd);
  ck_assert_int_eq(tune_log_open(path, false, &l), HVD_OK);
  text = read_file(path); /* the header is there before any row */
  ck_assert_str_eq(text, HEADER);
  free(text);
  s.fusion_threshold = 32u << 20;
  s.cycle_ns = 2500000;
  s.hierarchical_allreduce = true;
  ck_assert_int_eq(tune_log_row(l, &s, 1e9), HVD_OK);
  text = read_file(path); /* flushed per row */
  ck_assert_str_eq(text + strlen(HEADER), "1,0,0,1,2.500,33554432,1000000000.0,16777216,524288\n");
  free(text);
  s.cache_enabled = false;
  s.hierarchical_allgather = true;
  ck_assert_int_eq(tune_log_row(l, &s, 1234.5), HVD_OK);
  tune_log_close(l);
  tune_log_close(NULL);
  text = read_file(path);
  ck_assert_contains(text, "\n1,1,0,0,2.500,33554432,1234.5,16777216,524288\n");
  free(text);
  /* A later round goes on after the rows, without a second header. */
  ck_assert_int_eq(tune_log_open(path, true, &l), HVD_OK);
  ck_assert_int_eq(tune_log_row(l, &s, 99.0), HVD_OK);
  tune_log_close(l);
  text = read_file(path);
  ck_assert_contains(text, "\n1,1,0,0,2.500,33554432,1234.5,16777216,524288\n"
                           "1,1,0,0,2.500,33554432,99.0,16777216,524288\n");
  ck_assert_ptr_eq(strstr(text + 1, HEADER), NULL);
  free(text);
  /* A new job starts the file again. */
  ck_assert_int_eq(tune_log_open(path, false, &l), HVD_OK);
  tune_log_close(l);
  text = read_file(path);
  ck_assert_str_eq(text, HEADER);
  free(text);
  unlink(path);
}
END_TEST

START_TEST(test_log_tuner_rows) {
  char path[] = "/tmp/hvd_tune_rowsXXXXXX";
  int fd = mkstemp(path);
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *t;
  struct trace tr;
  char *text, *line;
  int rows = 0;

  ck_assert_int_ge(fd, 0);
  close(fd);
  cfg.max_samples = 6;
  cfg.warmup_samples = 2;
  snprintf(cfg.log_path, sizeof(cfg.log_path), "%s", path);
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &t, &first), HVD_OK);
  drive(t, &first, job_throughput, &tr);
  tune_tuner_destroy(t);
  text = read_file(path);
  ck_assert(strncmp(text, HEADER, strlen(HEADER)) == 0);
  for (line = text + strlen(HEADER); *line != '\0'; line = strchr(line, '\n') + 1) {
    int commas = 0;
    for (const char *c = line; *c != '\n'; c++)
      commas += *c == ',';
    ck_assert_int_eq(commas, 8);
    ck_assert(strncmp(line + 4, "0,", 2) == 0); /* torus */
    rows++;
  }
  ck_assert_int_eq(rows, tr.steps / 10 - 2); /* every scored sample */
  ck_assert_int_ge(rows, 6 + 2);
  free(text);
  unlink(path);
}
END_TEST

START_TEST(test_log_open_error) {
  struct tune_log *l = NULL;
  struct tune_config cfg = test_config();
  struct tune_setting initial = test_initial(), first;
  struct tune_tuner *t = NULL;

  ck_assert_int_eq(tune_log_open("/nonexistent-hvd-dir/tune.csv", false, &l), HVD_ERR_IO);
  assert_one_line_error("/nonexistent-hvd-dir/tune.csv");
  ck_assert_ptr_null(l);
  snprintf(cfg.log_path, sizeof(cfg.log_path), "/nonexistent-hvd-dir/tune.csv");
  ck_assert_int_eq(tune_tuner_create(&cfg, &initial, TUNE_ALL, &t, &first), HVD_ERR_IO);
  assert_one_line_error("HOROVOD_AUTOTUNE_LOG");
  ck_assert_ptr_null(t);
}
END_TEST

/* ==== the environment ============================================================================
 */

static const char *const VARS[] = {
    "HOROVOD_AUTOTUNE",
    "HOROVOD_AUTOTUNE_LOG",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
};

static void env_clear(void) {
  for (size_t i = 0; i < HVD_ARRAY_SIZE(VARS); i++)
    unsetenv(VARS[i]);
}

START_TEST(test_env_defaults) {
  struct tune_config c;

  ck_assert_int_eq(tune_config_from_env(&c), HVD_OK);
  ck_assert(!c.enabled);
  ck_assert_int_eq(c.warmup_samples, 3);
  ck_assert_int_eq(c.steps_per_sample, 10);
  ck_assert_int_eq(c.max_samples, 20);
  ck_assert_double_eq(c.gp_noise, 0.8);
  ck_assert_str_eq(c.log_path, "");
}
END_TEST

START_TEST(test_env_values) {
  struct tune_config c;

  setenv("HOROVOD_AUTOTUNE", "1", 1);
  setenv("HOROVOD_AUTOTUNE_LOG", "/tmp/tune.csv", 1);
  setenv("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "0", 1);
  setenv("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "1", 1);
  setenv("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "0", 1);
  setenv("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0", 1);
  ck_assert_int_eq(tune_config_from_env(&c), HVD_OK);
  ck_assert(c.enabled);
  ck_assert_str_eq(c.log_path, "/tmp/tune.csv");
  ck_assert_int_eq(c.warmup_samples, 0);
  ck_assert_int_eq(c.steps_per_sample, 1);
  ck_assert_int_eq(c.max_samples, 0);
  ck_assert_double_eq(c.gp_noise, 0);
  setenv("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "1", 1);
  setenv("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "64", 1);
  ck_assert_int_eq(tune_config_from_env(&c), HVD_OK);
  ck_assert_double_eq(c.gp_noise, 1);
  ck_assert_int_eq(c.max_samples, 64);
}
END_TEST

START_TEST(test_env_bad_values) {
  static const struct {
    const char *name, *value;
  } bad[] = {
      {"HOROVOD_AUTOTUNE", "maybe"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "-1"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "2.5"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "0"},
      {"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "ten"},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "-3"},
      {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "65"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "1.5"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "-0.1"},
      {"HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "abc"},
  };
  struct tune_config c;

  for (size_t i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    c.max_samples = 777;
    setenv(bad[i].name, bad[i].value, 1);
    ck_assert_int_eq(tune_config_from_env(&c), HVD_ERR_INVALID_ARGUMENT);
    assert_one_line_error(bad[i].name);
    ck_assert_int_eq(c.max_samples, 777); /* untouched */
    unsetenv(bad[i].name);
  }
}
END_TEST

/* ==== suites ================================================================================== */

static Suite *bayes_suite(void) {
  Suite *s = suite_create("bayes");
  TCase *tc = tcase_create("bayes");
  tcase_add_test(tc, test_cholesky_known);
  tcase_add_test(tc, test_cholesky_larger);
  tcase_add_test(tc, test_cholesky_not_positive_definite);
  tcase_add_test(tc, test_gp_prior);
  tcase_add_test(tc, test_gp_interpolates);
  tcase_add_test(tc, test_gp_repeated_points);
  tcase_add_test(tc, test_ei_prefers_unexplored_and_high);
  tcase_add_test(tc, test_bo_1d);
  tcase_add_test(tc, test_bo_2d);
  tcase_add_test(tc, test_bo_discrete);
  tcase_add_test(tc, test_bo_deterministic);
  tcase_add_test(tc, test_bo_bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *tuner_suite(void) {
  Suite *s = suite_create("tuner");
  TCase *tc = tcase_create("tuner");
  tcase_add_test(tc, test_tuner_finds_optimum);
  tcase_add_test(tc, test_tuner_all_knobs);
  tcase_add_test(tc, test_tuner_discards_warmup);
  tcase_add_test(tc, test_tuner_respects_pinned);
  tcase_add_test(tc, test_tuner_nothing_to_tune);
  tcase_add_test(tc, test_tuner_deterministic);
  tcase_add_test(tc, test_tuner_bad_config);
  tcase_add_test(tc, test_setting_wire);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *log_suite(void) {
  Suite *s = suite_create("log");
  TCase *tc = tcase_create("log");
  tcase_add_test(tc, test_log_rows);
  tcase_add_test(tc, test_log_tuner_rows);
  tcase_add_test(tc, test_log_open_error);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *env_suite(void) {
  Suite *s = suite_create("env");
  TCase *tc = tcase_create("env");
  tcase_add_checked_fixture(tc, env_clear, env_clear);
  tcase_add_test(tc, test_env_defaults);
  tcase_add_test(tc, test_env_values);
  tcase_add_test(tc, test_env_bad_values);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(bayes_suite());
  int failed;

  srunner_add_suite(sr, tuner_suite());
  srunner_add_suite(sr, log_suite());
  srunner_add_suite(sr, env_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
