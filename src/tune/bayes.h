/*
 * Bayesian optimisation over a box of at most TUNE_BAYES_MAX_DIMS dimensions,
 * for the autotuner (tuner.c): a Gaussian-process model of a
 * noisy score, and the next point to try, chosen by expected improvement.
 * It maximises. Everything is deterministic for a given seed, and a model
 * allocates only when it is created.
 *
 * Not thread-safe: one thread owns a model.
 */
#ifndef HVD_TUNE_BAYES_H
#define HVD_TUNE_BAYES_H

#include <stdbool.h>
#include <stdint.h>

#include "hvd/hvd.h"

enum {
  TUNE_BAYES_MAX_DIMS = 8,
  TUNE_BAYES_MAX_SAMPLES = 64,
  TUNE_BAYES_DEFAULT_CANDIDATES = 1024,
};

/* ---- dense Cholesky ---------------------------------------------------------
 * Row-major n x n matrices with leading dimension lda (>= n).
 */

/* Factors the symmetric matrix a into L Lᵀ in place: L goes to the lower
 * triangle (the upper one is neither read nor written). Returns false when a
 * is not (numerically) positive definite; a is then partly overwritten. */
bool tune_bayes_cholesky(double *a, int n, int lda);
/* Solves L Lᵀ x = b for x, in place in b, with L from tune_bayes_cholesky. */
void tune_bayes_cholesky_solve(const double *l, int n, int lda, double *b);

/* ---- the optimiser ------------------------------------------------------------ */

struct tune_bayes_dim {
  double lo, hi; /* the box: lo < hi, both finite */
  int levels;    /* 0: continuous; k >= 2: only the k evenly spaced values lo, ..., hi
                    (a boolean is lo 0, hi 1, levels 2) */
};

struct tune_bayes_options {
  int dims; /* 1 .. TUNE_BAYES_MAX_DIMS */
  struct tune_bayes_dim dim[TUNE_BAYES_MAX_DIMS];
  double noise;   /* alpha, added to the kernel's diagonal, in units of the
                     standardised scores' variance: >= 0 (Horovod: 0.8) */
  double xi;      /* expected improvement's exploration margin, in standard
                     deviations of the scores: >= 0 (Horovod: 0.1) */
  int candidates; /* random candidates per proposal; 0: TUNE_BAYES_DEFAULT_CANDIDATES */
  uint64_t seed;  /* the same seed and samples give the same proposals */
};

struct tune_bayes;

/* Validates the options (HVD_ERR_INVALID_ARGUMENT naming the bad field) and
 * makes an empty model; HVD_ERR_NO_MEMORY. */
hvd_status tune_bayes_create(const struct tune_bayes_options *o, struct tune_bayes **out);
/* NULL is a no-op. */
void tune_bayes_destroy(struct tune_bayes *b);

/* Adds the observation y at x (dims values inside the box). HVD_ERR_TOO_LARGE
 * once TUNE_BAYES_MAX_SAMPLES are held; HVD_ERR_INVALID_ARGUMENT for a point
 * outside the box or a value that is not finite. */
hvd_status tune_bayes_add(struct tune_bayes *b, const double *x, double y);
int tune_bayes_count(const struct tune_bayes *b);

/* The model's mean and variance of the noise-free score at x (in the
 * scores' units; the prior, mean 0 and variance 1, before any sample).
 * The first call after an add refits the model. HVD_ERR_INTERNAL if the
 * kernel matrix cannot be factored even with jitter. */
hvd_status tune_bayes_predict(struct tune_bayes *b, const double *x, double *mean, double *var);
/* Expected improvement at x over the best predicted mean at a sample (plus
 * xi); 0 before any sample and within 0.05 of a sample (in the box scaled
 * to the unit cube), where nothing new would be learnt. HVD_ERR_INTERNAL as
 * tune_bayes_predict. */
hvd_status tune_bayes_expected_improvement(struct tune_bayes *b, const double *x, double *ei);
/* The point to observe next: the maximiser of expected improvement found by
 * the random candidates and local searches from the best few; a discrete
 * dimension's value is one of its levels exactly. The box's centre before
 * any sample. HVD_ERR_INTERNAL as tune_bayes_predict. */
hvd_status tune_bayes_propose(struct tune_bayes *b, double *x);
/* Of the samples, the one whose predicted mean is highest (with noise, a
 * lucky measurement does not win on its own): its point and that mean.
 * HVD_ERR_PRECONDITION before any sample; HVD_ERR_INTERNAL as above. */
hvd_status tune_bayes_best(struct tune_bayes *b, double *x, double *mean);

#endif /* HVD_TUNE_BAYES_H */
