/*
 * The ops context: tunables read once from the environment, and scratch
 * buffers and request slots that grow on demand and are then reused, so a
 * training loop's collectives allocate nothing in steady state.
 */
#include <stdlib.h>
#include <string.h>

#include "ops_private.h"

/* Defaults chosen by measurement on loopback (docs/PERFORMANCE.md). */
enum {
  DEFAULT_SEGMENT_BYTES = 512 * 1024,
  DEFAULT_WINDOW = 4,
  DEFAULT_ALLREDUCE_SMALL_BYTES = 32 * 1024,
  DEFAULT_ALLREDUCE_RING_BYTES = 16 * 1024 * 1024,
  DEFAULT_BROADCAST_SMALL_BYTES = 64 * 1024,
  DEFAULT_SHM_BUFFER_BYTES = 1024 * 1024,
  DEFAULT_SHM_SINGLE_COPY_BYTES = 16 * 1024,
};

hvd_status ops_ctx_create(struct ops_ctx **out) {
  struct ops_ctx *o = calloc(1, sizeof(*o));
  int64_t seg, window, small, ring, bsmall, shm_buffer, single_copy;
  const char *algo = hvd_env_str("HVD_ALLREDUCE_ALGORITHM");
  const char *single = hvd_env_str("HVD_SHM_SINGLE_COPY");
  hvd_status st;

  if (o == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the ops context");
  st = hvd_env_int("HVD_RING_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES, 4096, 1 << 30, &seg);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_RING_WINDOW", DEFAULT_WINDOW, 1, 64, &window);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_ALLREDUCE_SMALL_BYTES", DEFAULT_ALLREDUCE_SMALL_BYTES, 0, INT64_C(1) << 40,
                     &small);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_ALLREDUCE_RING_BYTES", DEFAULT_ALLREDUCE_RING_BYTES, 0,
                     INT64_C(1) << 40, &ring);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_BROADCAST_SMALL_BYTES", DEFAULT_BROADCAST_SMALL_BYTES, 0,
                     INT64_C(1) << 40, &bsmall);
  if (st == HVD_OK)
    st = hvd_env_bool("HVD_SHM", true, &o->t.shm);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_SHM_BUFFER_BYTES", DEFAULT_SHM_BUFFER_BYTES, 64 * 1024, 1 << 30,
                     &shm_buffer);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_SHM_SINGLE_COPY_BYTES", DEFAULT_SHM_SINGLE_COPY_BYTES, 1,
                     INT64_C(1) << 40, &single_copy);
  if (st == HVD_OK && single != NULL) {
    if (strcmp(single, "auto") == 0)
      o->t.shm_single_copy = OPS_SINGLE_COPY_AUTO;
    else if (strcmp(single, "always") == 0)
      o->t.shm_single_copy = OPS_SINGLE_COPY_ALWAYS;
    else if (strcmp(single, "never") == 0)
      o->t.shm_single_copy = OPS_SINGLE_COPY_NEVER;
    else
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HVD_SHM_SINGLE_COPY='%.40s' is not one of auto, always, never", single);
  }
  if (st == HVD_OK && algo != NULL) {
    if (strcmp(algo, "auto") == 0)
      o->t.allreduce_algorithm = OPS_ALGO_AUTO;
    else if (strcmp(algo, "ring") == 0)
      o->t.allreduce_algorithm = OPS_ALGO_RING;
    else if (strcmp(algo, "recursive_doubling") == 0 || strcmp(algo, "rd") == 0)
      o->t.allreduce_algorithm = OPS_ALGO_RECURSIVE_DOUBLING;
    else if (strcmp(algo, "halving_doubling") == 0 || strcmp(algo, "hd") == 0)
      o->t.allreduce_algorithm = OPS_ALGO_HALVING_DOUBLING;
    else
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HVD_ALLREDUCE_ALGORITHM='%.40s' is not one of auto, ring, "
                     "recursive_doubling, halving_doubling",
                     algo);
  }
  if (st != HVD_OK) {
    free(o);
    return st;
  }
  o->t.segment_bytes = (size_t)seg;
  o->t.window = (unsigned)window;
  o->t.allreduce_small_bytes = (size_t)small;
  o->t.allreduce_ring_bytes = (size_t)ring;
  o->t.broadcast_small_bytes = (size_t)bsmall;
  o->t.shm_buffer_bytes = (size_t)shm_buffer;
  o->t.shm_single_copy_bytes = (size_t)single_copy;
  *out = o;
  return HVD_OK;
}

void ops_ctx_destroy(struct ops_ctx *o) {
  if (o == NULL)
    return;
  for (int i = 0; i < SCRATCH_COUNT; i++)
    free(o->scratch[i].p);
  for (int i = 0; i < OPS_SHM_FIGURES; i++)
    free(o->figures[i]);
  free(o->reqs);
  free(o->sizes);
  free(o);
}

const struct ops_tunables *ops_ctx_tunables(const struct ops_ctx *o) { return &o->t; }

void ops_ctx_retune(struct ops_ctx *o, size_t allreduce_ring_bytes, size_t segment_bytes) {
  if (allreduce_ring_bytes > 0)
    o->t.allreduce_ring_bytes = allreduce_ring_bytes;
  if (segment_bytes >= 4096)
    o->t.segment_bytes = segment_bytes;
}

void *ops_scratch(struct ops_ctx *o, int which, size_t bytes) {
  if (bytes > o->scratch[which].cap) {
    void *p = NULL;
    size_t cap = bytes < 4096 ? 4096 : bytes;
    if (posix_memalign(&p, 64, cap) != 0) {
      hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate %zu bytes of scratch", cap);
      return NULL;
    }
    free(o->scratch[which].p);
    o->scratch[which].p = p;
    o->scratch[which].cap = cap;
  }
  return o->scratch[which].p;
}

struct net_req *ops_requests(struct ops_ctx *o, size_t n) {
  if (hvd_array_reserve(&o->reqs, &o->nreqs, n, sizeof(*o->reqs), 16) != HVD_OK)
    return NULL;
  return o->reqs;
}

size_t *ops_sizes(struct ops_ctx *o, size_t n) {
  if (hvd_array_reserve(&o->sizes, &o->nsizes, n, sizeof(*o->sizes), 16) != HVD_OK)
    return NULL;
  return o->sizes;
}

hvd_status ops_bytes(size_t count, hvd_dtype dtype, size_t *bytes) {
  size_t esize = hvd_dtype_size(dtype);
  if (esize == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%d is not a dtype", (int)dtype);
  if (count > SIZE_MAX / esize)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%zu elements of %s overflow", count,
                     hvd_dtype_name(dtype));
  *bytes = count * esize;
  return HVD_OK;
}

size_t ops_share_count(size_t count, int n, int r) {
  return count / (size_t)n + ((size_t)r < count % (size_t)n ? 1 : 0);
}

size_t ops_share_offset(size_t count, int n, int r) {
  size_t extra = count % (size_t)n;
  return (size_t)r * (count / (size_t)n) + ((size_t)r < extra ? (size_t)r : extra);
}

size_t *ops_equal_shares(struct ops_ctx *o, size_t count, int n) {
  size_t *sizes = ops_sizes(o, 2 * (size_t)n);
  for (int i = 0; sizes != NULL && i < n; i++) {
    sizes[i] = ops_share_offset(count, n, i);
    sizes[n + i] = ops_share_count(count, n, i);
  }
  return sizes;
}

void ops_copy_scaled(void *dst, const void *src, size_t count, hvd_dtype dtype, double factor) {
  if (count == 0) /* an empty share's buffers may be NULL */
    return;
  if (factor != 1.0)
    ops_scale(dst, src, count, dtype, factor);
  else if (dst != src)
    memcpy(dst, src, count * hvd_dtype_size(dtype));
}
