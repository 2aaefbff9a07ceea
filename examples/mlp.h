/*
 * The model the examples train: a 16-32-1 MLP (tanh, then a sigmoid logit
 * with binary cross-entropy) on a synthetic task. A fixed "teacher"
 * network labels points drawn uniformly from [-1, 1]^16; every rank draws
 * its own shard from a seed that depends on its rank. Within a rank every
 * sum runs in a fixed order, so a run is reproducible for a given number
 * of ranks.
 */
#ifndef HVD_EXAMPLES_MLP_H
#define HVD_EXAMPLES_MLP_H

#include <stddef.h>
#include <stdint.h>

enum { INPUTS = 16, HIDDEN = 32, TEACHER_HIDDEN = 4, NPARAM = 4 };

#define TEACHER_SEED 0x7eac4e55eedull
#define DATA_SEED 0xda7a5eedull
#define INIT_SEED 0x1417ull

struct mlp {
  float w1[HIDDEN * INPUTS]; /* row j: the weights into hidden unit j */
  float b1[HIDDEN];
  float w2[HIDDEN];
  float b2[1];
};

/* One parameter tensor of a struct mlp, for the collectives. */
struct tensor_ref {
  const char *name; /* "W1": the collectives use "grad.W1", "param.W1", ... */
  float *data;
  size_t count;
  int ndims;
  int64_t shape[2];
};

/* The teacher: label = [sum_k v_k tanh(u_k . x) > 0]. Odd in x, so the
 * classes are balanced; a mix of a few tanh units, so not linear. */
struct teacher {
  float u[TEACHER_HIDDEN][INPUTS];
  float v[TEACHER_HIDDEN];
};

void teacher_init(struct teacher *t);
float teacher_label(const struct teacher *t, const float *x);
/* This rank's shard: n points (x: n * INPUTS) and their labels. */
void make_shard(const struct teacher *t, int rank, int n, float *x, float *y);

void mlp_tensors(struct mlp *m, struct tensor_ref out[NPARAM]);
/* Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) from a rank-dependent seed. */
void mlp_init(struct mlp *m, int rank);
/* The gradient of the mean loss over samples first, first + 1, ... (modulo
 * n) into g; returns the mean loss. */
double mlp_gradient(const struct mlp *m, const float *x, const float *y, int n, size_t first,
                    int batch, struct mlp *g);
double mlp_loss(const struct mlp *m, const float *x, const float *y, int n);
void mlp_sgd(struct mlp *m, struct mlp *g, float lr);

#endif
