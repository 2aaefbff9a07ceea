/*
 * Bayesian optimisation (bayes.h).
 *
 * DESIGN. Points live in the unit cube and scores are standardised (mean 0,
 * standard deviation 1), so one prior fits any units. The Gaussian process
 * has a Matern 5/2 kernel of unit variance with one length scale for every
 * dimension, chosen at each refit from a fixed log-spaced grid by the
 * marginal likelihood: a dozen factorisations of at most 64 x 64 cost
 * little and, unlike a gradient search, cannot wander off. (Per-dimension
 * length scales and a fitted variance were tried: with 20 samples they
 * overfit and made the search worse.) The noise alpha is added to the
 * diagonal; if the matrix is still not positive definite (a repeated point
 * without noise), jitter grows until it is.
 *
 * Expected improvement is measured against the best predicted mean at a
 * sample, not the best raw score, so that a lucky measurement does not set
 * the bar, and is 0 within MIN_SPACING of a sample: on a gentle slope it
 * would otherwise creep uphill in ever smaller steps, since standardising
 * makes any difference between close samples look large. Its maximiser is
 * sought among uniform random candidates, then by a compass search with
 * halving steps from the best few of them and from the best sample. A
 * discrete dimension only ever takes its levels; the local search moves it
 * one level at a time.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bayes.h"
#include "common/common.h"

enum {
  N = TUNE_BAYES_MAX_SAMPLES,
  D = TUNE_BAYES_MAX_DIMS,
  STARTS = 4,          /* candidates a local search starts from (plus the best sample) */
  SEARCH_ROUNDS = 100, /* sweeps of one local search at most */
  MAX_LEVELS = 1 << 20,
  MAX_CANDIDATES = 1 << 20,
};

static const double JITTERS[] = {1e-10, 1e-8, 1e-6, 1e-4, 1e-2, 1e-1};
static const double FIRST_LENGTH = 0.04, LENGTH_FACTOR = 1.5;
enum { LENGTHS = 12 }; /* 0.04 .. 3.5: from a tenth of a dimension to flat */
/* No proposal comes closer than this to a sample (unit cube): expected
 * improvement alone creeps along a slope in ever smaller steps. */
static const double MIN_SPACING = 0.05;
static const double FIRST_STEP = 0.125, LAST_STEP = 1e-4;

struct tune_bayes {
  struct tune_bayes_options o;
  int n;
  double u[N][D]; /* the samples' points, in the unit cube */
  double y[N];    /* their scores, as given */
  uint64_t rng;   /* splitmix64 state */

  /* The fit, valid while `fitted` (an add clears it). */
  bool fitted;
  double y_mean, y_sd;
  double length;
  double chol[N * N]; /* L of K + (alpha + jitter) I, lda N */
  double work[N * N];
  double weights[N]; /* (K + alpha I)^-1 ys */
  double best_mean;  /* highest standardised predicted mean at a sample */
  int best;          /* that sample */
};

/* ---- Cholesky ------------------------------------------------------------------ */

bool tune_bayes_cholesky(double *a, int n, int lda) {
  for (int j = 0; j < n; j++) {
    double *rj = a + (size_t)j * lda;
    double s = rj[j];
    for (int k = 0; k < j; k++)
      s -= rj[k] * rj[k];
    if (!(s > 0) || !isfinite(s))
      return false;
    rj[j] = sqrt(s);
    for (int i = j + 1; i < n; i++) {
      double *ri = a + (size_t)i * lda;
      double t = ri[j];
      for (int k = 0; k < j; k++)
        t -= ri[k] * rj[k];
      ri[j] = t / rj[j];
    }
  }
  return true;
}

/* L z = b, in place. */
static void forward(const double *l, int n, int lda, double *b) {
  for (int i = 0; i < n; i++) {
    const double *ri = l + (size_t)i * lda;
    double s = b[i];
    for (int k = 0; k < i; k++)
      s -= ri[k] * b[k];
    b[i] = s / ri[i];
  }
}

void tune_bayes_cholesky_solve(const double *l, int n, int lda, double *b) {
  forward(l, n, lda, b);
  for (int i = n - 1; i >= 0; i--) { /* Lᵀ x = z */
    double s = b[i];
    for (int k = i + 1; k < n; k++)
      s -= l[(size_t)k * lda + i] * b[k];
    b[i] = s / l[(size_t)i * lda + i];
  }
}

/* ---- the Gaussian process ---------------------------------------------------------- */

static double matern52(const double *a, const double *b, int d, double length) {
  double r2 = 0, s;
  for (int i = 0; i < d; i++)
    r2 += (a[i] - b[i]) * (a[i] - b[i]);
  s = sqrt(5.0 * r2) / length;
  return (1.0 + s + s * s / 3.0) * exp(-s);
}

/* Whether u is within MIN_SPACING of a sample. */
static bool too_close(const struct tune_bayes *b, const double *u) {
  for (int i = 0; i < b->n; i++) {
    double r2 = 0;
    for (int j = 0; j < b->o.dims; j++)
      r2 += (u[j] - b->u[i][j]) * (u[j] - b->u[i][j]);
    if (r2 < MIN_SPACING * MIN_SPACING)
      return true;
  }
  return false;
}

/* Factors K + (alpha + jitter) I into b->work for this length scale, with
 * the least jitter that works; its log marginal likelihood (less the
 * constant) goes to *lml. */
static bool factor(struct tune_bayes *b, double length, const double *ys, double *lml) {
  int n = b->n, d = b->o.dims;
  double w[N];

  for (size_t t = 0; t < HVD_ARRAY_SIZE(JITTERS); t++) {
    for (int i = 0; i < n; i++) {
      double *row = b->work + (size_t)i * N;
      for (int j = 0; j < i; j++)
        row[j] = matern52(b->u[i], b->u[j], d, length);
      row[i] = 1.0 + b->o.noise + JITTERS[t];
    }
    if (!tune_bayes_cholesky(b->work, n, N))
      continue;
    memcpy(w, ys, (size_t)n * sizeof(*w));
    tune_bayes_cholesky_solve(b->work, n, N, w);
    *lml = 0;
    for (int i = 0; i < n; i++)
      *lml -= 0.5 * ys[i] * w[i] + log(b->work[(size_t)i * N + i]);
    return true;
  }
  return false;
}

/* Tries a length scale; keeps it (and its factor) if its likelihood beats *best. */
static void consider(struct tune_bayes *b, double length, const double *ys, double *best) {
  double lml;
  if (!factor(b, length, ys, &lml) || !(lml > *best))
    return;
  *best = lml;
  b->length = length;
  memcpy(b->chol, b->work, (size_t)b->n * N * sizeof(*b->chol));
}

static hvd_status fit(struct tune_bayes *b) {
  int n = b->n, d = b->o.dims;
  double ys[N], best = -INFINITY, length = FIRST_LENGTH;
  double sum = 0, sq = 0;

  if (b->fitted || n == 0)
    return HVD_OK;
  for (int i = 0; i < n; i++)
    sum += b->y[i];
  b->y_mean = sum / n;
  for (int i = 0; i < n; i++)
    sq += (b->y[i] - b->y_mean) * (b->y[i] - b->y_mean);
  b->y_sd = sqrt(sq / n);
  if (!(b->y_sd > 0) || !isfinite(b->y_sd))
    b->y_sd = 1; /* one sample, or all equal: nothing to scale */
  for (int i = 0; i < n; i++)
    ys[i] = (b->y[i] - b->y_mean) / b->y_sd;

  b->length = 0;
  for (int k = 0; k < LENGTHS; k++, length *= LENGTH_FACTOR)
    consider(b, length, ys, &best);
  if (b->length == 0)
    return hvd_error(HVD_ERR_INTERNAL,
                     "autotune: the Gaussian process's kernel matrix of %d samples is not "
                     "positive definite even with jitter",
                     n);
  memcpy(b->weights, ys, (size_t)n * sizeof(*ys));
  tune_bayes_cholesky_solve(b->chol, n, N, b->weights);

  b->best = 0;
  b->best_mean = -INFINITY;
  for (int i = 0; i < n; i++) {
    double mu = 0;
    for (int j = 0; j < n; j++)
      mu += matern52(b->u[i], b->u[j], d, b->length) * b->weights[j];
    if (mu > b->best_mean) {
      b->best_mean = mu;
      b->best = i;
    }
  }
  b->fitted = true;
  return HVD_OK;
}

/* Standardised mean and variance at a point of the unit cube (fitted, n > 0). */
static void predict_unit(const struct tune_bayes *b, const double *u, double *mean, double *var) {
  int n = b->n;
  double k[N], mu = 0, v = 1;

  for (int i = 0; i < n; i++) {
    k[i] = matern52(u, b->u[i], b->o.dims, b->length);
    mu += k[i] * b->weights[i];
  }
  forward(b->chol, n, N, k);
  for (int i = 0; i < n; i++)
    v -= k[i] * k[i];
  *mean = mu;
  *var = v > 0 ? v : 0;
}

static double ei_unit(const struct tune_bayes *b, const double *u) {
  double mu, var, sigma, gain, z;

  if (too_close(b, u))
    return 0;

  predict_unit(b, u, &mu, &var);
  sigma = sqrt(var);
  gain = mu - b->best_mean - b->o.xi;
  if (sigma < 1e-12)
    return gain > 0 ? gain : 0;
  z = gain / sigma;
  return gain * 0.5 * erfc(-z / M_SQRT2) + sigma * exp(-0.5 * z * z) / sqrt(2 * M_PI);
}

/* ---- points ------------------------------------------------------------------------- */

static uint64_t next_random(struct tune_bayes *b) {
  uint64_t z = (b->rng += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static double uniform(struct tune_bayes *b) { return (double)(next_random(b) >> 11) * 0x1p-53; }

static double snap(double u, int levels) {
  double steps = levels - 1;
  return levels == 0 ? u : round(u * steps) / steps;
}

static void to_unit(const struct tune_bayes *b, const double *x, double *u) {
  for (int i = 0; i < b->o.dims; i++) {
    const struct tune_bayes_dim *dm = &b->o.dim[i];
    double v = (x[i] - dm->lo) / (dm->hi - dm->lo);
    u[i] = snap(v < 0 ? 0 : v > 1 ? 1 : v, dm->levels);
  }
}

static void from_unit(const struct tune_bayes *b, const double *u, double *x) {
  for (int i = 0; i < b->o.dims; i++) {
    const struct tune_bayes_dim *dm = &b->o.dim[i];
    x[i] = u[i] >= 1 ? dm->hi : dm->lo + u[i] * (dm->hi - dm->lo);
  }
}

/* Compass search for a higher expected improvement from u (whose value is
 * ei); returns the value reached, u moved there. */
static double refine(struct tune_bayes *b, double *u, double ei) {
  double step = FIRST_STEP;

  for (int round = 0; round < SEARCH_ROUNDS && step >= LAST_STEP; round++) {
    bool moved = false;
    for (int i = 0; i < b->o.dims; i++) {
      int levels = b->o.dim[i].levels;
      double delta = levels != 0 ? 1.0 / (levels - 1) : step;
      for (int sign = -1; sign <= 1; sign += 2) {
        double old = u[i], v = old + sign * delta, e;
        if (v < 0 || v > 1) {
          if (levels != 0 || old == (v < 0 ? 0 : 1))
            continue;
          v = v < 0 ? 0 : 1;
        }
        u[i] = snap(v, levels);
        e = ei_unit(b, u);
        if (e > ei) {
          ei = e;
          moved = true;
        } else {
          u[i] = old;
        }
      }
    }
    if (!moved)
      step /= 2;
  }
  return ei;
}

/* ---- the interface ------------------------------------------------------------------- */

hvd_status tune_bayes_create(const struct tune_bayes_options *o, struct tune_bayes **out) {
  struct tune_bayes *b;

  if (o->dims < 1 || o->dims > D)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "bayes: %d dimensions (allowed: 1 to %d)", o->dims,
                     D);
  for (int i = 0; i < o->dims; i++) {
    const struct tune_bayes_dim *dm = &o->dim[i];
    if (!isfinite(dm->lo) || !isfinite(dm->hi) || !(dm->lo < dm->hi))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "bayes: dimension %d's box [%g, %g] is empty or not finite", i, dm->lo,
                       dm->hi);
    if (dm->levels < 0 || dm->levels == 1 || dm->levels > MAX_LEVELS)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "bayes: dimension %d has %d levels (allowed: 0 for continuous, or 2 "
                       "to %d)",
                       i, dm->levels, MAX_LEVELS);
  }
  if (!(o->noise >= 0) || !isfinite(o->noise) || !(o->xi >= 0) || !isfinite(o->xi))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "bayes: noise %g and xi %g must be finite and not negative", o->noise, o->xi);
  if (o->candidates < 0 || o->candidates > MAX_CANDIDATES)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "bayes: %d candidates (allowed: 0 to %d)",
                     o->candidates, MAX_CANDIDATES);
  b = calloc(1, sizeof(*b));
  if (b == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "bayes: cannot allocate a model");
  b->o = *o;
  if (b->o.candidates == 0)
    b->o.candidates = TUNE_BAYES_DEFAULT_CANDIDATES;
  b->rng = o->seed;
  *out = b;
  return HVD_OK;
}

void tune_bayes_destroy(struct tune_bayes *b) { free(b); }

int tune_bayes_count(const struct tune_bayes *b) { return b->n; }

hvd_status tune_bayes_add(struct tune_bayes *b, const double *x, double y) {
  if (b->n == N)
    return hvd_error(HVD_ERR_TOO_LARGE, "bayes: already %d samples, the most a model holds", N);
  if (!isfinite(y))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "bayes: the score %g is not finite", y);
  for (int i = 0; i < b->o.dims; i++)
    if (!(x[i] >= b->o.dim[i].lo && x[i] <= b->o.dim[i].hi))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "bayes: coordinate %d (%g) is outside the box [%g, %g]", i, x[i],
                       b->o.dim[i].lo, b->o.dim[i].hi);
  to_unit(b, x, b->u[b->n]);
  b->y[b->n++] = y;
  b->fitted = false;
  return HVD_OK;
}

hvd_status tune_bayes_predict(struct tune_bayes *b, const double *x, double *mean, double *var) {
  double u[D], mu, v;
  hvd_status st = fit(b);

  if (st != HVD_OK)
    return st;
  if (b->n == 0) {
    *mean = 0;
    *var = 1;
    return HVD_OK;
  }
  to_unit(b, x, u);
  predict_unit(b, u, &mu, &v);
  *mean = b->y_mean + mu * b->y_sd;
  *var = v * b->y_sd * b->y_sd;
  return HVD_OK;
}

hvd_status tune_bayes_expected_improvement(struct tune_bayes *b, const double *x, double *ei) {
  double u[D];
  hvd_status st = fit(b);

  if (st != HVD_OK)
    return st;
  if (b->n == 0) {
    *ei = 0;
    return HVD_OK;
  }
  to_unit(b, x, u);
  *ei = ei_unit(b, u) * b->y_sd;
  return HVD_OK;
}

hvd_status tune_bayes_propose(struct tune_bayes *b, double *x) {
  double start[STARTS + 1][D], start_ei[STARTS + 1], u[D], best_ei = -1;
  int d = b->o.dims, starts = 0, pick = 0;
  hvd_status st = fit(b);

  if (st != HVD_OK)
    return st;
  if (b->n == 0) {
    for (int i = 0; i < d; i++)
      u[i] = snap(0.5, b->o.dim[i].levels);
    from_unit(b, u, x);
    return HVD_OK;
  }
  /* The best STARTS random candidates, kept sorted by expected improvement. */
  for (int c = 0; c < b->o.candidates; c++) {
    double e;
    int at;
    for (int i = 0; i < d; i++) {
      int levels = b->o.dim[i].levels;
      double r = uniform(b);
      u[i] = levels == 0 ? r : floor(r * levels) / (levels - 1);
    }
    e = ei_unit(b, u);
    if (starts == STARTS && e <= start_ei[STARTS - 1])
      continue;
    at = starts < STARTS ? starts++ : STARTS - 1;
    while (at > 0 && start_ei[at - 1] < e) {
      memcpy(start[at], start[at - 1], sizeof(start[at]));
      start_ei[at] = start_ei[at - 1];
      at--;
    }
    memcpy(start[at], u, sizeof(u));
    start_ei[at] = e;
  }
  memcpy(start[starts], b->u[b->best], sizeof(start[starts]));
  start_ei[starts] = ei_unit(b, start[starts]);
  starts++;

  for (int s = 0; s < starts; s++) {
    double e = refine(b, start[s], start_ei[s]);
    if (e > best_ei) {
      best_ei = e;
      pick = s;
    }
  }
  from_unit(b, start[pick], x);
  return HVD_OK;
}

hvd_status tune_bayes_best(struct tune_bayes *b, double *x, double *mean) {
  hvd_status st;

  if (b->n == 0)
    return hvd_error(HVD_ERR_PRECONDITION, "bayes: no samples yet, so no best one");
  st = fit(b);
  if (st != HVD_OK)
    return st;
  from_unit(b, b->u[b->best], x);
  *mean = b->y_mean + b->best_mean * b->y_sd;
  return HVD_OK;
}
