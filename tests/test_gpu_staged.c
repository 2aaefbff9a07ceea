/*
 * GPU tensors in the coordinator, on a machine without a GPU: every rank
 * installs a fake backend (coord_gpu_override) whose "device memory" is
 * host memory it keeps a registry of, stored XOR-ed with a key. hvd can
 * only get the right values by going through the backend's to_host and
 * to_device; an output hvd allocated must be fake device memory and must
 * go back through the backend's free. Each collective runs once on GPU
 * tensors and once on CPU tensors, and the results must be the same bytes.
 * Suites: units (no job, or a job of one), staged (the collectives under
 * each variant of the backend), errors (device checks, mismatches, joined
 * and failed ranks).
 */
#include <pthread.h>

#include "coord_harness.h"

/* ==== the fake backend ============================================================= */

enum { KEY = 0xA5, MAX_BLOCKS = 256, MAX_EVENTS = 64 };

struct coord_gpu {
  int device;
};

struct block {
  unsigned char *base;
  size_t bytes;
  bool by_hvd; /* from the backend's alloc (else the test's own tensors) */
};

/* One per rank process; mu protects everything (free runs on user threads). */
static struct {
  pthread_mutex_t mu;
  struct block blocks[MAX_BLOCKS];
  int nblocks;
  struct coord_gpu *gpu; /* the open state */
  int opens, open_device, closes;
  bool close_abort;
  int executes;
  uint32_t last_ntensors; /* of the last response execute saw */
  int hvd_allocs, hvd_frees;
  void *last_freed;
  unsigned char *staging; /* the declining backend's staging buffer (plain host memory) */
  size_t staging_cap;
  int staging_calls;
  const void *events[MAX_EVENTS];
  int nevents;
  int bad; /* misuses seen; bad_msg says what the first was */
  char bad_msg[256];
} fake = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* fake.mu held. */
static void misuse(const char *fmt, ...) HVD_PRINTF(1, 2);
static void misuse(const char *fmt, ...) {
  va_list ap;
  if (fake.bad++ > 0)
    return;
  va_start(ap, fmt);
  vsnprintf(fake.bad_msg, sizeof(fake.bad_msg), fmt, ap);
  va_end(ap);
}

/* The block that holds [p, p + bytes), or NULL; fake.mu held. */
static struct block *find_block(const void *p, size_t bytes) {
  const unsigned char *c = p;
  for (int i = 0; i < fake.nblocks; i++) {
    struct block *b = &fake.blocks[i];
    if (c >= b->base && (size_t)(c - b->base) <= b->bytes &&
        bytes <= b->bytes - (size_t)(c - b->base))
      return b;
  }
  return NULL;
}

static void *block_new(size_t bytes, bool by_hvd) {
  unsigned char *p = malloc(bytes > 0 ? bytes : 1);
  pthread_mutex_lock(&fake.mu);
  if (p != NULL && fake.nblocks == MAX_BLOCKS) {
    misuse("more than %d live device blocks", MAX_BLOCKS);
    free(p);
    p = NULL;
  }
  if (p != NULL)
    fake.blocks[fake.nblocks++] = (struct block){p, bytes, by_hvd};
  pthread_mutex_unlock(&fake.mu);
  return p;
}

/* Removes p's block; false if p is not the start of a block of that kind. */
static bool block_free(void *p, bool by_hvd) {
  bool found = false;
  pthread_mutex_lock(&fake.mu);
  for (int i = 0; i < fake.nblocks && !found; i++) {
    if (fake.blocks[i].base == p && fake.blocks[i].by_hvd == by_hvd) {
      fake.blocks[i] = fake.blocks[--fake.nblocks];
      found = true;
    }
  }
  pthread_mutex_unlock(&fake.mu);
  if (found)
    free(p);
  return found;
}

static int live_blocks(bool by_hvd) {
  int n = 0;
  pthread_mutex_lock(&fake.mu);
  for (int i = 0; i < fake.nblocks; i++)
    n += fake.blocks[i].by_hvd == by_hvd;
  pthread_mutex_unlock(&fake.mu);
  return n;
}

/* Whether p starts a block hvd allocated through the backend, of >= bytes. */
static bool hvd_block(const void *p, size_t bytes) {
  bool ok = false;
  pthread_mutex_lock(&fake.mu);
  for (int i = 0; i < fake.nblocks; i++)
    ok |= fake.blocks[i].base == p && fake.blocks[i].by_hvd && fake.blocks[i].bytes >= bytes;
  pthread_mutex_unlock(&fake.mu);
  return ok;
}

static bool saw_event(const void *event) {
  bool seen = false;
  pthread_mutex_lock(&fake.mu);
  for (int i = 0; i < fake.nevents; i++)
    seen |= fake.events[i] == event;
  pthread_mutex_unlock(&fake.mu);
  return seen;
}

static void xor_copy(void *dst, const void *src, size_t bytes) {
  for (size_t i = 0; i < bytes; i++)
    ((unsigned char *)dst)[i] = ((const unsigned char *)src)[i] ^ KEY;
}

static hvd_status fake_device_count(int *n) {
  *n = 2;
  return HVD_OK;
}

static hvd_status fake_open(struct coord_state *s, int device, struct coord_gpu **out) {
  struct coord_gpu *g = calloc(1, sizeof(*g));
  (void)s;
  if (g == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "fake backend: open");
  g->device = device;
  pthread_mutex_lock(&fake.mu);
  if (fake.gpu != NULL)
    misuse("open while GPU %d is open", fake.gpu->device);
  fake.opens++;
  fake.open_device = device;
  fake.gpu = g;
  pthread_mutex_unlock(&fake.mu);
  *out = g;
  return HVD_OK;
}

static void fake_close(struct coord_gpu *g, bool abort) {
  pthread_mutex_lock(&fake.mu);
  if (g != fake.gpu)
    misuse("close of a state that is not open");
  fake.closes++;
  fake.close_abort = abort;
  fake.gpu = NULL;
  pthread_mutex_unlock(&fake.mu);
  free(g);
}

/* fake.mu held. */
static void check_state(struct coord_gpu *g, const char *what) {
  if (g == NULL || g != fake.gpu)
    misuse("%s with a state that is not the open one", what);
}

/* A backend without device collectives for some responses. */
static hvd_status fake_execute(struct coord_gpu *g, const struct coord_set *set,
                               const struct coord_response *r, struct coord_entry **entries) {
  (void)set;
  (void)entries;
  pthread_mutex_lock(&fake.mu);
  check_state(g, "execute");
  fake.executes++;
  fake.last_ntensors = r->ntensors;
  pthread_mutex_unlock(&fake.mu);
  return hvd_error(HVD_ERR_UNSUPPORTED, "fake backend: no device collectives");
}

static hvd_status fake_wait_event(struct coord_gpu *g, void *event) {
  pthread_mutex_lock(&fake.mu);
  check_state(g, "wait_event");
  if (fake.nevents < MAX_EVENTS)
    fake.events[fake.nevents++] = event;
  pthread_mutex_unlock(&fake.mu);
  return HVD_OK;
}

static hvd_status copy(struct coord_gpu *g, void *dst, const void *src, size_t bytes,
                       bool to_device) {
  const void *dev = to_device ? dst : src, *host = to_device ? src : dst;
  bool ok;
  pthread_mutex_lock(&fake.mu);
  check_state(g, to_device ? "to_device" : "to_host");
  ok = find_block(dev, bytes) != NULL && find_block(host, 1) == NULL;
  if (!ok)
    misuse("%s of %zu bytes: %p is not device memory or %p is", to_device ? "to_device" : "to_host",
           bytes, dev, host);
  pthread_mutex_unlock(&fake.mu);
  if (!ok)
    return hvd_error(HVD_ERR_INTERNAL, "fake backend: a copy with a wrong pointer");
  xor_copy(dst, src, bytes);
  return HVD_OK;
}

static hvd_status fake_to_host(struct coord_gpu *g, void *dst, const void *src, size_t bytes) {
  return copy(g, dst, src, bytes, false);
}

static hvd_status fake_to_device(struct coord_gpu *g, void *dst, const void *src, size_t bytes) {
  return copy(g, dst, src, bytes, true);
}

static hvd_status fake_alloc(struct coord_gpu *g, size_t bytes, void **out) {
  void *p;
  pthread_mutex_lock(&fake.mu);
  check_state(g, "alloc");
  pthread_mutex_unlock(&fake.mu);
  if ((p = block_new(bytes, true)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "fake backend: alloc of %zu bytes", bytes);
  pthread_mutex_lock(&fake.mu);
  fake.hvd_allocs++;
  pthread_mutex_unlock(&fake.mu);
  *out = p;
  return HVD_OK;
}

static void fake_free(void *p) {
  bool ok = block_free(p, true);
  pthread_mutex_lock(&fake.mu);
  if (!ok)
    misuse("free(%p), which the backend did not allocate", p);
  fake.hvd_frees += ok;
  fake.last_freed = p;
  pthread_mutex_unlock(&fake.mu);
}

/* Grows one buffer, as a backend's page-locked one: its bytes are
 * scribbled over on every call, so nothing may rely on them surviving. */
static void fake_staging_buffer(struct coord_gpu *g, size_t bytes, void **out) {
  pthread_mutex_lock(&fake.mu);
  check_state(g, "staging_buffer");
  fake.staging_calls++;
  if (bytes > fake.staging_cap) {
    free(fake.staging);
    fake.staging = malloc(bytes);
    fake.staging_cap = fake.staging != NULL ? bytes : 0;
  }
  if (fake.staging != NULL)
    memset(fake.staging, 0x5C, fake.staging_cap);
  *out = fake.staging;
  pthread_mutex_unlock(&fake.mu);
}

/* execute NULL: everything is staged. */
static const struct coord_gpu_backend staged_backend = {
    .name = "fake-staged",
    .device_count = fake_device_count,
    .open = fake_open,
    .close = fake_close,
    .wait_event = fake_wait_event,
    .to_host = fake_to_host,
    .to_device = fake_to_device,
    .alloc = fake_alloc,
    .free = fake_free,
};
/* execute declines (HVD_ERR_UNSUPPORTED): staging is the fallback, in the
 * backend's staging buffer. */
static const struct coord_gpu_backend declining_backend = {
    .name = "fake-declining",
    .device_count = fake_device_count,
    .open = fake_open,
    .close = fake_close,
    .execute = fake_execute,
    .wait_event = fake_wait_event,
    .to_host = fake_to_host,
    .to_device = fake_to_device,
    .staging_buffer = fake_staging_buffer,
    .alloc = fake_alloc,
    .free = fake_free,
};

/* ==== tensors on either side ======================================================== */

static void *buf_new(int device, size_t bytes) {
  return device == HVD_DEVICE_CPU ? malloc(bytes > 0 ? bytes : 1) : block_new(bytes, false);
}

static void buf_free(int device, void *p) {
  if (device == HVD_DEVICE_CPU)
    free(p);
  else if (p != NULL && !block_free(p, false)) {
    pthread_mutex_lock(&fake.mu);
    misuse("the test's own block %p went missing", p);
    pthread_mutex_unlock(&fake.mu);
  }
}

static void buf_put(int device, void *dst, const void *src, size_t bytes) {
  if (device == HVD_DEVICE_CPU)
    memcpy(dst, src, bytes);
  else
    xor_copy(dst, src, bytes);
}

/* A result as bytes in host memory: outputs, shapes, splits, one after the other. */
struct result {
  unsigned char *data;
  size_t len;
};

/* Appends bytes (8-aligned, so the caller may read them as doubles) and
 * returns where they went, valid until the next res_add. */
static void *res_add(struct result *r, int device, const void *src, size_t bytes) {
  size_t at = (r->len + 7) & ~(size_t)7;
  unsigned char *p = realloc(r->data, at + bytes + 1);
  if (p == NULL)
    abort(); /* a test out of memory */
  memset(p + r->len, 0, at - r->len);
  r->data = p;
  p += at;
  r->len = at + bytes;
  if (device == HVD_DEVICE_CPU)
    memcpy(p, src, bytes);
  else
    xor_copy(p, src, bytes);
  return p;
}

static const char *name_of(char *buf, size_t size, const char *base, int k, int device) {
  snprintf(buf, size, "%s.%d.%s", base, k, device == HVD_DEVICE_CPU ? "cpu" : "gpu");
  return buf;
}

/* Rank r's element i: small integers, so every reduction order agrees. */
static double val(int rank, int i) { return (double)((rank + 1) * (i % 7 + 1) % 23); }

static double sum_of(int size, int i, int skip) {
  double s = 0;
  for (int r = 0; r < size; r++)
    s += r == skip ? 0 : val(r, i);
  return s;
}

static double elem(hvd_dtype t, const void *p, size_t i) {
  return t == HVD_FLOAT64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static void set_elem(hvd_dtype t, void *p, size_t i, double v) {
  if (t == HVD_FLOAT64)
    ((double *)p)[i] = v;
  else
    ((float *)p)[i] = (float)v;
}

/* ==== the collectives, run on device `device` (or the CPU) ========================== */

typedef int (*case_fn)(int rank, int size, int device, struct result *res);

/* Several tensors at once (fused where they can be), sum, average and
 * scaled; one in place; on the GPU each with a ready event. */
static int case_allreduce(int rank, int size, int device, struct result *res) {
  enum { N = 4 };
  static const int64_t counts[N] = {1, 100, 3000, 33};
  static const hvd_dtype types[N] = {HVD_FLOAT32, HVD_FLOAT32, HVD_FLOAT32, HVD_FLOAT64};
  static const struct {
    hvd_reduce_op op;
    double pre, post;
  } how[] = {{HVD_SUM, 1, 1}, {HVD_AVERAGE, 1, 1}, {HVD_SUM, 0.5, 4}};
  static char events[3][N];

  for (int h = 0; h < 3; h++) {
    void *in[N], *out[N];
    hvd_handle hd[N];
    char name[64];
    for (int k = 0; k < N; k++) {
      size_t bytes = (size_t)counts[k] * hvd_dtype_size(types[k]);
      void *host = malloc(bytes);
      hvd_options o = HVD_OPTIONS_INIT;
      for (int i = 0; i < counts[k]; i++)
        set_elem(types[k], host, (size_t)i, val(rank, i + k));
      in[k] = buf_new(device, bytes);
      buf_put(device, in[k], host, bytes);
      free(host);
      out[k] = k == 1 ? in[k] : buf_new(device, bytes);
      o.op = how[h].op;
      o.prescale = how[h].pre;
      o.postscale = how[h].post;
      o.device = device;
      o.ready_event = device != HVD_DEVICE_CPU ? &events[h][k] : NULL;
      hvd_tensor t = {name_of(name, sizeof(name), "allreduce", h * N + k, device), types[k], 1,
                      &counts[k], in[k], out[k]};
      CALL(hvd_allreduce_async(&t, &o, &hd[k]));
    }
    for (int k = 0; k < N; k++) {
      size_t bytes = (size_t)counts[k] * hvd_dtype_size(types[k]);
      const void *got;
      CALL(hvd_handle_wait(hd[k]));
      hvd_handle_release(hd[k]);
      got = res_add(res, device, out[k], bytes);
      for (int i = 0; i < counts[k] && how[h].op == HVD_SUM; i++) {
        double want = sum_of(size, i + k, -1) * how[h].pre * how[h].post;
        EXPECT(elem(types[k], got, (size_t)i) == want,
               "allreduce %d of tensor %d on device %d: element %d is %g, want %g", h, k, device,
               i, elem(types[k], got, (size_t)i), want);
      }
      EXPECT(device == HVD_DEVICE_CPU || saw_event(&events[h][k]),
             "the ready event of allreduce %d tensor %d never reached wait_event", h, k);
      if (out[k] != in[k])
        buf_free(device, out[k]);
      buf_free(device, in[k]);
    }
  }
  return 0;
}

/* The same names step after step: from the second on they travel as cache bits. */
static int case_steps(int rank, int size, int device, struct result *res) {
  int64_t shape[1] = {5};
  char name[64];
  for (int step = 0; step < 4; step++) {
    for (int k = 0; k < 2; k++) {
      float host[5], *buf = buf_new(device, sizeof(host));
      hvd_options o = HVD_OPTIONS_INIT;
      hvd_tensor t = {name_of(name, sizeof(name), "step", k, device), HVD_FLOAT32, 1, shape, buf,
                      buf};
      for (int i = 0; i < 5; i++)
        host[i] = (float)(val(rank, i + k) + step);
      buf_put(device, buf, host, sizeof(host));
      o.device = device;
      CALL(hvd_allreduce(&t, &o));
      const float *got = res_add(res, device, buf, sizeof(host));
      for (int i = 0; i < 5; i++)
        EXPECT(got[i] == (float)(sum_of(size, i + k, -1) + step * size),
               "step %d tensor %d element %d on device %d: %g", step, k, i, device, got[i]);
      buf_free(device, buf);
    }
  }
  return 0;
}

/* Checks an output hvd allocated: device memory through the backend on the GPU. */
static int take_output(hvd_handle h, int device, struct result *res, const void **got,
                       size_t *bytes, int64_t *shape) {
  void *data = NULL;
  CALL(hvd_handle_output(h, &data, bytes, shape));
  EXPECT(device == HVD_DEVICE_CPU || hvd_block(data, *bytes),
         "output %p (%zu bytes) is not device memory the backend allocated", data, *bytes);
  res_add(res, HVD_DEVICE_CPU, shape, 2 * sizeof(*shape));
  *got = res_add(res, device, data, *bytes);
  return 0;
}

/* Releases h: on the GPU its output goes back through the backend's free.
 * hvd's thread may allocate and free staging blocks meanwhile for the
 * operations still in flight, so the check is on this block, not on counts:
 * it is gone (or its address was handed out again at once, in which case
 * it was the last block freed before that). */
static int release_output(hvd_handle h, int device) {
  void *data = NULL;
  size_t bytes;
  int frees;
  CALL(hvd_handle_output(h, &data, &bytes, NULL));
  pthread_mutex_lock(&fake.mu);
  frees = fake.hvd_frees;
  pthread_mutex_unlock(&fake.mu);
  hvd_handle_release(h);
  if (device != HVD_DEVICE_CPU) {
    pthread_mutex_lock(&fake.mu);
    bool freed = fake.hvd_frees > frees;
    void *last = fake.last_freed;
    pthread_mutex_unlock(&fake.mu);
    EXPECT(freed && (!hvd_block(data, bytes) || last == data),
           "hvd_handle_release left the output %p in device memory", data);
  }
  return 0;
}

/* Takes h's output over and releases h: the output outlives the handle
 * until hvd_output_free_gpu gives it back through the backend's free
 * (hvd_output_free for host memory). */
static int free_taken_output(hvd_handle h, int device) {
  void *data = NULL;
  size_t bytes = 0;
  int frees;
  bool freed;
  CALL(hvd_handle_take_output(h, 0, &data, &bytes, NULL));
  hvd_handle_release(h);
  if (device == HVD_DEVICE_CPU) {
    hvd_output_free(data);
    return 0;
  }
  EXPECT(hvd_block(data, bytes), "the taken output %p did not outlive its handle", data);
  pthread_mutex_lock(&fake.mu);
  frees = fake.hvd_frees;
  pthread_mutex_unlock(&fake.mu);
  hvd_output_free_gpu(data);
  pthread_mutex_lock(&fake.mu);
  freed = fake.hvd_frees > frees && fake.last_freed == data;
  pthread_mutex_unlock(&fake.mu);
  EXPECT(freed, "hvd_output_free_gpu(%p) did not go through the backend's free", data);
  return 0;
}

/* Two at once (fused where they can be): rank r gives r + 1 rows of 3
 * floats, and r rows of 2 ints (rank 0 none). */
static int case_allgather(int rank, int size, int device, struct result *res) {
  int64_t shapes[2][2] = {{rank + 1, 3}, {rank, 2}};
  hvd_dtype types[2] = {HVD_FLOAT32, HVD_INT32};
  void *in[2];
  hvd_handle h[2];
  char name[64];
  int code;

  for (int k = 0; k < 2; k++) {
    size_t n = (size_t)(shapes[k][0] * shapes[k][1]);
    int32_t host[64];
    float fhost[64];
    hvd_options o = HVD_OPTIONS_INIT;
    for (size_t i = 0; i < n; i++) {
      fhost[i] = (float)(rank * 100 + (int)i);
      host[i] = -(rank * 100 + (int)i);
    }
    in[k] = buf_new(device, n * 4);
    buf_put(device, in[k], k == 0 ? (void *)fhost : (void *)host, n * 4);
    o.device = device;
    hvd_tensor t = {name_of(name, sizeof(name), "allgather", k, device), types[k], 2, shapes[k],
                    in[k], NULL};
    CALL(hvd_allgather_async(&t, &o, &h[k]));
  }
  for (int k = 0; k < 2; k++) {
    int64_t shape[HVD_MAX_DIMS] = {0};
    int64_t rows = 0, at = 0;
    size_t bytes;
    const void *got;
    CALL(hvd_handle_wait(h[k]));
    if ((code = take_output(h[k], device, res, &got, &bytes, shape)) != 0)
      return code;
    for (int r = 0; r < size; r++)
      rows += k == 0 ? r + 1 : r;
    EXPECT(shape[0] == rows && shape[1] == shapes[k][1] && bytes == (size_t)(rows * shape[1]) * 4,
           "allgather %d on device %d: shape [%lld, %lld], %zu bytes", k, device,
           (long long)shape[0], (long long)shape[1], bytes);
    for (int r = 0; r < size; r++) {
      int64_t n = (k == 0 ? r + 1 : r) * shapes[k][1];
      for (int i = 0; i < n; i++, at++) {
        double v = k == 0 ? ((const float *)got)[at] : ((const int32_t *)got)[at];
        EXPECT(v == (k == 0 ? 1 : -1) * (r * 100 + i),
               "allgather %d on device %d: element %d of rank %d is %g", k, device, i, r, v);
      }
    }
    code = k == 0 ? release_output(h[k], device) : free_taken_output(h[k], device);
    if (code != 0)
      return code;
    buf_free(device, in[k]);
  }
  return 0;
}

static int case_broadcast(int rank, int size, int device, struct result *res) {
  int64_t shape[2] = {5, 7};
  char name[64];
  for (int root = 0; root < size; root++) {
    for (int in_place = 0; in_place < 2; in_place++) {
      double host[35];
      void *in = buf_new(device, sizeof(host));
      void *out = in_place ? in : buf_new(device, sizeof(host));
      hvd_options o = HVD_OPTIONS_INIT;
      hvd_tensor t = {name_of(name, sizeof(name), "broadcast", root * 2 + in_place, device),
                      HVD_FLOAT64, 2, shape, in, out};
      for (int i = 0; i < 35; i++)
        host[i] = rank * 1000 + i;
      buf_put(device, in, host, sizeof(host));
      o.root = root;
      o.device = device;
      CALL(hvd_broadcast(&t, &o));
      const double *got = res_add(res, device, out, sizeof(host));
      for (int i = 0; i < 35; i++)
        EXPECT(got[i] == root * 1000 + i, "broadcast from %d on device %d: element %d is %g",
               root, device, i, got[i]);
      if (out != in)
        buf_free(device, out);
      buf_free(device, in);
    }
  }
  return 0;
}

/* Rank r sends (r + p) % 3 rows of 2 ints to rank p, and keeps one row back. */
static int case_alltoall(int rank, int size, int device, struct result *res) {
  int32_t splits[16], host[2 * 64];
  int64_t rows = 1, at = 0, shape[2];
  char name[64];
  int code;

  for (int p = 0; p < size; p++)
    rows += splits[p] = (rank + p) % 3;
  shape[0] = rows;
  shape[1] = 2;
  for (int p = 0; p < size; p++) {
    for (int k = 0; k < splits[p]; k++, at++) {
      host[at * 2] = rank * 1000 + p * 100 + k;
      host[at * 2 + 1] = -host[at * 2];
    }
  }
  host[at * 2] = host[at * 2 + 1] = 99999; /* the row nobody gets */
  void *in = buf_new(device, (size_t)rows * 2 * 4);
  buf_put(device, in, host, (size_t)rows * 2 * 4);
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_tensor t = {name_of(name, sizeof(name), "alltoall", 0, device), HVD_INT32, 2, shape, in,
                  NULL};
  hvd_handle h;
  const int32_t *recv, *got;
  size_t nrecv, bytes;
  int64_t got_shape[HVD_MAX_DIMS] = {0};
  o.device = device;
  CALL(hvd_alltoall_async(&t, splits, &o, &h));
  CALL(hvd_handle_wait(h));
  CALL(hvd_handle_received_splits(h, &recv, &nrecv));
  EXPECT(nrecv == (size_t)size, "%zu received splits", nrecv);
  res_add(res, HVD_DEVICE_CPU, recv, nrecv * sizeof(*recv));
  if ((code = take_output(h, device, res, (const void **)&got, &bytes, got_shape)) != 0)
    return code;
  at = 0;
  for (int r = 0; r < size; r++) {
    int want = (r + rank) % 3;
    EXPECT(recv[r] == want, "device %d: %d rows from rank %d, want %d", device, recv[r], r, want);
    for (int k = 0; k < want; k++, at++)
      EXPECT(got[at * 2] == r * 1000 + rank * 100 + k && got[at * 2 + 1] == -got[at * 2],
             "alltoall on device %d: row %lld is %d %d", device, (long long)at, got[at * 2],
             got[at * 2 + 1]);
  }
  EXPECT(got_shape[0] == at && bytes == (size_t)at * 2 * 4, "alltoall: %lld rows, %zu bytes",
         (long long)got_shape[0], bytes);
  if ((code = release_output(h, device)) != 0)
    return code;
  buf_free(device, in);
  return 0;
}

static int case_reducescatter(int rank, int size, int device, struct result *res) {
  char name[64];
  for (int dim0 = 1; dim0 <= 2 * size + 1; dim0 += size) {
    for (int avg = 0; avg < 2; avg++) {
      int64_t shape[2] = {dim0, 3}, mine = hvd_reducescatter_rows(dim0, HVD_PROCESS_SET_GLOBAL);
      int64_t first = 0;
      float host[3 * 16];
      size_t out_bytes = (size_t)mine * 3 * sizeof(float);
      void *in = buf_new(device, (size_t)dim0 * 3 * sizeof(float));
      void *out = buf_new(device, out_bytes);
      hvd_options o = HVD_OPTIONS_INIT;
      hvd_tensor t = {name_of(name, sizeof(name), "reducescatter", dim0 * 2 + avg, device),
                      HVD_FLOAT32, 2, shape, in, out};
      for (int r = 0; r < rank; r++)
        first += dim0 / size + (r < dim0 % size);
      for (int i = 0; i < dim0 * 3; i++)
        host[i] = (float)val(rank, i);
      buf_put(device, in, host, (size_t)dim0 * 3 * sizeof(float));
      o.op = avg ? HVD_AVERAGE : HVD_SUM;
      o.device = device;
      CALL(hvd_reducescatter(&t, &o));
      const float *got = res_add(res, device, out, out_bytes);
      for (int64_t i = 0; i < mine * 3 && !avg; i++)
        EXPECT(got[i] == (float)sum_of(size, (int)(first * 3 + i), -1),
               "reducescatter of %d rows on device %d: element %lld is %g", dim0, device,
               (long long)i, got[i]);
      buf_free(device, out);
      buf_free(device, in);
    }
  }
  return 0;
}

/* A group is negotiated as one and fused into one response. */
static int case_grouped(int rank, int size, int device, struct result *res) {
  enum { N = 5 };
  hvd_tensor ts[N];
  int64_t shapes[N];
  void *bufs[N];
  char names[N][64];
  hvd_options o = HVD_OPTIONS_INIT;
  uint32_t ntensors;
  int executes;

  for (int k = 0; k < N; k++) {
    float *host;
    shapes[k] = k * 100 + 1;
    host = malloc((size_t)shapes[k] * sizeof(float));
    for (int i = 0; i < shapes[k]; i++)
      host[i] = (float)val(rank, i + k);
    bufs[k] = buf_new(device, (size_t)shapes[k] * sizeof(float));
    buf_put(device, bufs[k], host, (size_t)shapes[k] * sizeof(float));
    free(host);
    ts[k] = (hvd_tensor){name_of(names[k], sizeof(names[k]), "group", k, device), HVD_FLOAT32, 1,
                         &shapes[k], bufs[k], bufs[k]};
  }
  pthread_mutex_lock(&fake.mu);
  executes = fake.executes;
  pthread_mutex_unlock(&fake.mu);
  o.device = device;
  CALL(hvd_grouped_allreduce(ts, N, &o));
  pthread_mutex_lock(&fake.mu);
  executes = fake.executes - executes;
  ntensors = fake.last_ntensors;
  pthread_mutex_unlock(&fake.mu);
  /* (with execute NULL or HVD_GPU_COLLECTIVES=host nothing reaches it) */
  EXPECT(executes == 0 || (executes == 1 && ntensors == N),
         "the group reached execute as %d responses, the last of %u tensors; want one of %d",
         executes, ntensors, N);
  for (int k = 0; k < N; k++) {
    const float *got = res_add(res, device, bufs[k], (size_t)shapes[k] * sizeof(float));
    for (int i = 0; i < shapes[k]; i++)
      EXPECT(got[i] == (float)sum_of(size, i + k, -1),
             "group tensor %d on device %d: element %d is %g", k, device, i, got[i]);
    buf_free(device, bufs[k]);
  }
  return 0;
}

static const struct {
  const char *name;
  case_fn fn;
} cases[] = {
    {"allreduce", case_allreduce}, {"steps", case_steps},
    {"allgather", case_allgather}, {"broadcast", case_broadcast},
    {"alltoall", case_alltoall},   {"reducescatter", case_reducescatter},
    {"grouped", case_grouped},
};

/* ==== the staged suite ================================================================== */

struct variant {
  const char *name;
  const struct coord_gpu_backend *backend;
  const char *env; /* for every rank, or NULL */
  bool mixed;      /* rank r uses GPU r % 2 (else all GPU 0) */
  bool executes;   /* the backend's execute must have run (else never) */
};

static const struct variant variants[] = {
    {"staged", &staged_backend, NULL, false, false},
    {"declined", &declining_backend, NULL, false, true},
    {"declined, ordinals differ", &declining_backend, NULL, true, true},
    {"HVD_GPU_COLLECTIVES=host", &declining_backend, "HVD_GPU_COLLECTIVES=host", true, false},
};

/* Shuts hvd down and checks how the backend was used: one open of the
 * rank's device, a clean close, every allocation freed, no misuse. */
static int finish(int rank, int device, int executes /* 1, 0, or -1: either */) {
  CALL(hvd_shutdown());
  /* hvd's threads are gone: fake is this thread's alone now. */
  EXPECT(fake.bad == 0, "rank %d: the backend was misused %d times; first: %s", rank, fake.bad,
         fake.bad_msg);
  EXPECT(fake.opens == 1 && fake.open_device == device,
         "rank %d: %d opens, the last of GPU %d; want one of GPU %d", rank, fake.opens,
         fake.open_device, device);
  EXPECT(fake.closes == 1 && !fake.close_abort,
         "rank %d: %d closes, abort %d after a clean shutdown", rank, fake.closes,
         fake.close_abort);
  EXPECT(fake.hvd_allocs == fake.hvd_frees && live_blocks(true) == 0,
         "rank %d: %d device allocations, %d frees", rank, fake.hvd_allocs, fake.hvd_frees);
  EXPECT(live_blocks(false) == 0, "rank %d: the test leaked device blocks", rank);
  EXPECT(executes < 0 || (fake.executes > 0) == (executes > 0),
         "rank %d: execute ran %d times, want %s", rank, fake.executes,
         executes > 0 ? "some" : "none");
  return 0;
}

static int gpu_matches_cpu(int rank, int size, void *arg) {
  const struct variant *v = arg;
  int device = v->mixed ? rank % 2 : 0, count = 0;

  CALL(hvd_cuda_device_count(&count));
  EXPECT(count == 2, "hvd_cuda_device_count: %d, the fake has 2", count);
  for (size_t c = 0; c < HVD_ARRAY_SIZE(cases); c++) {
    struct result gpu = {0}, cpu = {0};
    int code = cases[c].fn(rank, size, device, &gpu);
    if (code == 0)
      code = cases[c].fn(rank, size, HVD_DEVICE_CPU, &cpu);
    if (code != 0)
      return report(code, "%s: case %s failed", v->name, cases[c].name);
    EXPECT(gpu.len == cpu.len && memcmp(gpu.data, cpu.data, gpu.len) == 0,
           "%s: %s on GPU %d gives other bytes than on the CPU (%zu and %zu bytes)", v->name,
           cases[c].name, device, gpu.len, cpu.len);
    free(gpu.data);
    free(cpu.data);
  }
  if ((count = finish(rank, device, v->executes)) != 0)
    return count;
  EXPECT((fake.staging_calls > 0) == (v->backend->staging_buffer != NULL),
         "%s: the staging buffer was asked for %d times", v->name, fake.staging_calls);
  free(fake.staging);
  return 0;
}

/* _i: variant * 2 + (size - 2). */
START_TEST(collectives_match_cpu) {
  const struct variant *v = &variants[_i / 2];
  job.env[0] = v->env;
  coord_gpu_override(v->backend);
  run_ok(2 + _i % 2, gpu_matches_cpu, (void *)v);
  coord_gpu_override(NULL);
}
END_TEST

/* ==== the errors suite ================================================================== */

#define EXPECT_STATUS(expr, want, words)                                                          \
  do {                                                                                             \
    hvd_status s_ = (expr);                                                                        \
    EXPECT(s_ == (want) && strstr(hvd_last_error_message(), (words)) != NULL,                      \
           "%s gave %s (%s), want %s naming '%s'", #expr, hvd_strerror(s_),                        \
           hvd_last_error_message(), hvd_strerror(want), (words));                                 \
  } while (0)

/* An allreduce of 4 floats on device (or the CPU) that must give the sum. */
static int allreduce4(int rank, int size, const char *name, int device) {
  int64_t shape[1] = {4};
  float host[4], got[4];
  void *buf = buf_new(device, sizeof(host));
  hvd_tensor t = {name, HVD_FLOAT32, 1, shape, buf, buf};
  hvd_options o = HVD_OPTIONS_INIT;
  for (int i = 0; i < 4; i++)
    host[i] = (float)val(rank, i);
  buf_put(device, buf, host, sizeof(host));
  o.device = device;
  CALL(hvd_allreduce(&t, &o));
  if (device == HVD_DEVICE_CPU)
    memcpy(got, buf, sizeof(got));
  else
    xor_copy(got, buf, sizeof(got));
  buf_free(device, buf);
  for (int i = 0; i < 4; i++)
    EXPECT(got[i] == (float)sum_of(size, i, -1), "%s on device %d: element %d is %g", name,
           device, i, got[i]);
  return 0;
}

static int device_errors(int rank, int size, void *arg) {
  int64_t shape[1] = {4};
  float cpu[4] = {1, 2, 3, 4};
  void *dev = buf_new(0, sizeof(cpu));
  hvd_tensor t = {"bad", HVD_FLOAT32, 1, shape, dev, dev};
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_handle h = NULL;
  char event;
  int code;
  (void)arg;

  buf_put(0, dev, cpu, sizeof(cpu));
  o.device = -2;
  EXPECT_STATUS(hvd_allreduce_async(&t, &o, &h), HVD_ERR_INVALID_ARGUMENT, "device -2");
  o.device = 5;
  EXPECT_STATUS(hvd_allreduce_async(&t, &o, &h), HVD_ERR_INVALID_ARGUMENT, "GPU 5");
  o.device = HVD_DEVICE_CPU;
  o.ready_event = &event;
  t.input = t.output = cpu;
  EXPECT_STATUS(hvd_allreduce_async(&t, &o, &h), HVD_ERR_INVALID_ARGUMENT, "ready event");
  EXPECT(h == NULL, "a refused call returned a handle");

  /* Rank 0 on the CPU, the others on a GPU: a mismatch everywhere. */
  o = (hvd_options)HVD_OPTIONS_INIT;
  o.device = rank == 0 ? HVD_DEVICE_CPU : 0;
  t.name = "disputed";
  t.input = t.output = rank == 0 ? (void *)cpu : dev;
  CALL(hvd_allreduce_async(&t, &o, &h));
  hvd_status st = hvd_handle_wait(h);
  const char *msg = hvd_last_error_message();
  EXPECT(st == HVD_ERR_MISMATCH && strstr(msg, "mismatched devices") != NULL &&
             strstr(msg, "CPU") != NULL && strstr(msg, "GPU 0") != NULL,
         "CPU against GPU gave %s: %s", hvd_strerror(st), msg);
  hvd_handle_release(h);

  /* The job goes on; then this rank's GPU is GPU 0, and GPU 1 is refused. */
  if ((code = allreduce4(rank, size, "after", 0)) != 0)
    return code;
  o.device = 1;
  t.name = "elsewhere";
  t.input = t.output = dev;
  EXPECT_STATUS(hvd_allreduce_async(&t, &o, &h), HVD_ERR_INVALID_ARGUMENT, "on GPU 0");
  if ((code = allreduce4(rank, size, "still", 0)) != 0)
    return code;
  buf_free(0, dev);
  return finish(rank, 0, 0);
}

START_TEST(device_checks) {
  coord_gpu_override(&staged_backend);
  run_ok(_i, device_errors, NULL);
  coord_gpu_override(NULL);
}
END_TEST

/* The last rank joins at once, never having had a GPU tensor: it meets
 * the others' GPU allreduces, opens GPU 0 and contributes zeros. */
static int joined_rank(int rank, int size, void *arg) {
  int code;
  (void)arg;
  for (int step = 0; step < 3 && rank != size - 1; step++) {
    int64_t shape[1] = {10};
    float host[10], got[10];
    void *buf = buf_new(0, sizeof(host));
    hvd_tensor t = {"joined", HVD_FLOAT32, 1, shape, buf, buf};
    hvd_options o = HVD_OPTIONS_INIT;
    for (int i = 0; i < 10; i++)
      host[i] = (float)val(rank, i);
    buf_put(0, buf, host, sizeof(host));
    o.device = 0;
    CALL(hvd_allreduce(&t, &o));
    xor_copy(got, buf, sizeof(got));
    buf_free(0, buf);
    for (int i = 0; i < 10; i++)
      EXPECT(got[i] == (float)sum_of(size, i, size - 1), "step %d element %d: %g without rank %d",
             step, i, got[i], size - 1);
  }
  CALL(hvd_join(NULL));
  if ((code = allreduce4(rank, size, "after.join", HVD_DEVICE_CPU)) != 0)
    return code;
  return finish(rank, 0, -1);
}

START_TEST(joined_rank_contributes) {
  coord_gpu_override(&staged_backend);
  run_ok(_i, joined_rank, NULL);
  coord_gpu_override(NULL);
}
END_TEST

/* Rank 1 vanishes after a GPU allreduce: rank 0's next one fails, and its
 * backend is closed with abort set. */
static int lost_rank(int rank, int size, void *arg) {
  int code;
  (void)arg;
  if ((code = allreduce4(rank, size, "before", 0)) != 0)
    return code;
  if (rank == 1)
    _exit(0);
  EXPECT(allreduce4(rank, size, "after", 0) == EXIT_FAILED, "an allreduce without rank 1 passed");
  hvd_shutdown();
  EXPECT(fake.opens == 1 && fake.closes == 1 && fake.close_abort,
         "after a failure: %d opens, %d closes, abort %d", fake.opens, fake.closes,
         fake.close_abort);
  EXPECT(fake.bad == 0, "the backend was misused: %s", fake.bad_msg);
  return 0;
}

START_TEST(failed_job_aborts_backend) {
  int codes[2];
  job.timeout_s = 5;
  coord_gpu_override(&staged_backend);
  run_ranks(2, lost_rank, NULL, codes, 60);
  coord_gpu_override(NULL);
  ck_assert_msg(codes[0] == 0 && codes[1] == 0, "exit codes %d, %d", codes[0], codes[1]);
}
END_TEST

/* ==== units: no job, or a job of one ======================================================= */

START_TEST(without_a_backend) {
  const struct coord_gpu_backend *builtin = coord_gpu_builtin();
  int64_t shape[1] = {2};
  float v[2] = {1, 2};
  hvd_tensor t = {"t", HVD_FLOAT32, 1, shape, v, v};
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_handle h = NULL;
  int n = -1;

  ck_assert_int_eq(hvd_cuda_built(), builtin != NULL);
  ck_assert_int_eq(hvd_nccl_built(), builtin != NULL ? builtin->nccl_version : 0);
  ck_assert_int_eq(hvd_cuda_device_count(NULL), HVD_ERR_INVALID_ARGUMENT);
  if (builtin != NULL)
    return; /* a CUDA build: cuda/'s own tests cover the rest */
  ck_assert_int_eq(hvd_cuda_device_count(&n), HVD_ERR_UNSUPPORTED);
  ck_assert_int_eq(n, 0);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "GPU"));
  ck_assert_int_eq(hvd_init(), HVD_OK); /* a job of one */
  o.device = 0;
  ck_assert_int_eq(hvd_allreduce_async(&t, &o, &h), HVD_ERR_UNSUPPORTED);
  ck_assert_ptr_null(h);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "GPU 0"));
  o.device = HVD_DEVICE_CPU;
  ck_assert_int_eq(hvd_allreduce(&t, &o), HVD_OK);
  ck_assert(v[0] == 1 && v[1] == 2);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
}
END_TEST

START_TEST(collectives_setting) {
  static const char *const good[] = {"host", "nccl"};
  setenv("HVD_GPU_COLLECTIVES", "bogus", 1);
  ck_assert_int_eq(hvd_init(), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HVD_GPU_COLLECTIVES"));
  ck_assert_int_eq(hvd_is_initialized(), 0);
  for (size_t i = 0; i < HVD_ARRAY_SIZE(good); i++) {
    setenv("HVD_GPU_COLLECTIVES", good[i], 1);
    ck_assert_msg(hvd_init() == HVD_OK, "%s: %s", good[i], hvd_last_error_message());
    ck_assert_int_eq(hvd_shutdown(), HVD_OK);
  }
  unsetenv("HVD_GPU_COLLECTIVES");
}
END_TEST

/* ==== suites ================================================================================== */

static TCase *mp_case(Suite *s, const char *name, int timeout) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_set_timeout(tc, timeout);
  suite_add_tcase(s, tc);
  return tc;
}

int main(void) {
  Suite *units = suite_create("units"), *staged = suite_create("staged");
  Suite *errors = suite_create("errors");
  TCase *alone = tcase_create("alone");
  TCase *tc;
  SRunner *sr;
  int failed;

  tcase_add_test(alone, without_a_backend);
  tcase_add_test(alone, collectives_setting);
  suite_add_tcase(units, alone);
  tc = mp_case(staged, "variants", 300);
  tcase_add_loop_test(tc, collectives_match_cpu, 0, 2 * (int)HVD_ARRAY_SIZE(variants));
  tc = mp_case(errors, "errors", 120);
  tcase_add_loop_test(tc, device_checks, 2, 4);
  tcase_add_loop_test(tc, joined_rank_contributes, 2, 4);
  tcase_add_test(tc, failed_job_aborts_backend);

  sr = srunner_create(units);
  srunner_add_suite(sr, staged);
  srunner_add_suite(sr, errors);
  srunner_run_all(sr, CK_ENV);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
