/* The examples' model: see mlp.h. */
#include <math.h>
#include <string.h>

#include "mlp.h"

/* ==== random numbers and data ============================================= */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Uniform in [-1, 1), from 24 random bits (exact in a float). */
static float uniform(uint64_t *state) {
  return (float)(splitmix64(state) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

/* A stream seed for (base, index): well mixed, so streams do not overlap
 * in practice. */
static uint64_t stream_seed(uint64_t base, uint64_t index) {
  uint64_t s = base ^ (index * 0xd1342543de82ef95ull);
  return splitmix64(&s);
}

void teacher_init(struct teacher *t) {
  uint64_t s = stream_seed(TEACHER_SEED, 0);
  for (int k = 0; k < TEACHER_HIDDEN; k++) {
    for (int i = 0; i < INPUTS; i++)
      t->u[k][i] = 2.0f * uniform(&s); /* steep enough to bend the boundary */
    t->v[k] = uniform(&s);
  }
}

float teacher_label(const struct teacher *t, const float *x) {
  float f = 0.0f;
  for (int k = 0; k < TEACHER_HIDDEN; k++) {
    float a = 0.0f;
    for (int i = 0; i < INPUTS; i++)
      a += t->u[k][i] * x[i];
    f += t->v[k] * tanhf(a);
  }
  return f > 0.0f ? 1.0f : 0.0f;
}

/* This rank's shard: n points (x: n * INPUTS) and their labels. */
void make_shard(const struct teacher *t, int rank, int n, float *x, float *y) {
  uint64_t s = stream_seed(DATA_SEED, (uint64_t)rank + 1);
  for (int j = 0; j < n; j++) {
    for (int i = 0; i < INPUTS; i++)
      x[(size_t)j * INPUTS + i] = uniform(&s);
    y[j] = teacher_label(t, x + (size_t)j * INPUTS);
  }
}

/* ==== the model ============================================================= */

void mlp_tensors(struct mlp *m, struct tensor_ref out[NPARAM]) {
  out[0] = (struct tensor_ref){"W1", m->w1, HIDDEN * INPUTS, 2, {HIDDEN, INPUTS}};
  out[1] = (struct tensor_ref){"b1", m->b1, HIDDEN, 1, {HIDDEN, 0}};
  out[2] = (struct tensor_ref){"W2", m->w2, HIDDEN, 2, {1, HIDDEN}};
  out[3] = (struct tensor_ref){"b2", m->b2, 1, 1, {1, 0}};
}

/* Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) from a rank-dependent seed. */
void mlp_init(struct mlp *m, int rank) {
  uint64_t s = stream_seed(INIT_SEED, (uint64_t)rank + 1);
  const float a1 = 1.0f / sqrtf((float)INPUTS), a2 = 1.0f / sqrtf((float)HIDDEN);
  for (int i = 0; i < HIDDEN * INPUTS; i++)
    m->w1[i] = a1 * uniform(&s);
  for (int j = 0; j < HIDDEN; j++)
    m->b1[j] = a1 * uniform(&s);
  for (int j = 0; j < HIDDEN; j++)
    m->w2[j] = a2 * uniform(&s);
  m->b2[0] = a2 * uniform(&s);
}

/* Binary cross-entropy of logit z against label y, computed stably. */
static double bce(float z, float y) {
  double zd = z;
  return fmax(zd, 0.0) - zd * y + log1p(exp(-fabs(zd)));
}

/* Forward pass of one sample: fills h and returns the logit. */
static float forward(const struct mlp *m, const float *x, float h[HIDDEN]) {
  float z = m->b2[0];
  for (int j = 0; j < HIDDEN; j++) {
    float a = m->b1[j];
    const float *w = m->w1 + (size_t)j * INPUTS;
    for (int i = 0; i < INPUTS; i++)
      a += w[i] * x[i];
    h[j] = tanhf(a);
    z += m->w2[j] * h[j];
  }
  return z;
}

/* The gradient of the mean loss over samples first, first + 1, ... (modulo
 * n) into g; returns the mean loss. */
double mlp_gradient(const struct mlp *m, const float *x, const float *y, int n,
                           size_t first, int batch, struct mlp *g) {
  double loss = 0.0;
  const float inv = 1.0f / (float)batch;

  memset(g, 0, sizeof(*g));
  for (int b = 0; b < batch; b++) {
    size_t j = (first + (size_t)b) % (size_t)n;
    const float *xj = x + j * INPUTS;
    float h[HIDDEN];
    float z = forward(m, xj, h);
    float dz = (1.0f / (1.0f + expf(-z)) - y[j]) * inv; /* d mean loss / dz */

    loss += bce(z, y[j]);
    g->b2[0] += dz;
    for (int k = 0; k < HIDDEN; k++) {
      float da = dz * m->w2[k] * (1.0f - h[k] * h[k]);
      float *gw = g->w1 + (size_t)k * INPUTS;
      g->w2[k] += dz * h[k];
      g->b1[k] += da;
      for (int i = 0; i < INPUTS; i++)
        gw[i] += da * xj[i];
    }
  }
  return loss / batch;
}

double mlp_loss(const struct mlp *m, const float *x, const float *y, int n) {
  double loss = 0.0;
  for (int j = 0; j < n; j++) {
    float h[HIDDEN];
    loss += bce(forward(m, x + (size_t)j * INPUTS, h), y[j]);
  }
  return loss / n;
}

void mlp_sgd(struct mlp *m, struct mlp *g, float lr) {
  struct tensor_ref p[NPARAM], d[NPARAM];
  mlp_tensors(m, p);
  mlp_tensors(g, d);
  for (int t = 0; t < NPARAM; t++)
    for (size_t i = 0; i < p[t].count; i++)
      p[t].data[i] -= lr * d[t].data[i];
}

