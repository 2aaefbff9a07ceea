/*
 * The ops context: tunables read once from the environment, and scratch
 * buffers and request slots that grow on demand and are then reused, so a
 * training loop's collectives allocate nothing in steady state.
 */
#include <stdlib.h>
#include <string.h>

#include "ops_private.h"

/* The table's word orders are the enums' (defaults, chosen by measurement
 * on loopback, are in settings.def; docs/PERFORMANCE.md has the runs). */
_Static_assert(OPS_ALGO_AUTO == 0 && OPS_ALGO_RING == 1 && OPS_ALGO_RECURSIVE_DOUBLING == 2 &&
                   OPS_ALGO_HALVING_DOUBLING == 3,
               "settings.def: HVD_ALLREDUCE_ALGORITHM's words");
_Static_assert(OPS_SINGLE_COPY_AUTO == 0 && OPS_SINGLE_COPY_ALWAYS == 1 &&
                   OPS_SINGLE_COPY_NEVER == 2,
               "settings.def: HVD_SHM_SINGLE_COPY's words");

hvd_status ops_ctx_create(struct ops_ctx **out) {
  struct ops_ctx *o = calloc(1, sizeof(*o));
  int64_t seg, window, small, ring, bsmall, shm_buffer, single_copy;
  int algo, single;
  hvd_status st;

  if (o == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the ops context");
  st = hvd_setting_int(HVD_SET_RING_SEGMENT_BYTES, &seg);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_RING_WINDOW, &window);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_ALLREDUCE_SMALL_BYTES, &small);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_ALLREDUCE_RING_BYTES, &ring);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_BROADCAST_SMALL_BYTES, &bsmall);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_SHM, &o->t.shm);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_SHM_BUFFER_BYTES, &shm_buffer);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_SHM_SINGLE_COPY_BYTES, &single_copy);
  if (st == HVD_OK)
    st = hvd_setting_word(HVD_SET_SHM_SINGLE_COPY, &single);
  if (st == HVD_OK)
    st = hvd_setting_word(HVD_SET_ALLREDUCE_ALGORITHM, &algo);
  if (st != HVD_OK) {
    free(o);
    return st;
  }
  o->t.shm_single_copy = single;
  o->t.allreduce_algorithm = algo;
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
