/*
 * Tensor fusion on the coordinator: ready single-tensor responses become
 * fewer, larger ones.
 *
 * DESIGN. Walking the ready responses in order, each one not yet taken
 * starts a group and pulls in every later one it is compatible with (same
 * type, process set, dtype and device; for allreduce also the same reduce
 * op and scale factors) while the group's bytes stay within the fusion
 * threshold. Incompatible responses are skipped over, not a barrier, so one
 * odd tensor does not split a step's gradients; they start groups of their
 * own later. Only allreduce and allgather fuse.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

/* An inline allreduce carries its result already: nothing to fuse. */
static bool fusable(const struct coord_response *r) {
  return (r->type == COORD_ALLREDUCE && r->data_len == 0) || r->type == COORD_ALLGATHER;
}

static bool compatible(const struct coord_response *a, const struct coord_response *b) {
  if (a->type != b->type || a->set != b->set || a->dtype != b->dtype || a->device != b->device)
    return false;
  if (a->type == COORD_ALLGATHER)
    return true;
  return a->op == b->op && memcmp(&a->prescale, &b->prescale, sizeof(double)) == 0 &&
         memcmp(&a->postscale, &b->postscale, sizeof(double)) == 0;
}

/* Moves the members of one group (indices idx[0..m-1] of in) into out. */
static hvd_status build(struct coord_response *in, const size_t *idx, size_t m,
                        struct coord_response *out) {
  uint32_t ntensors = 0, ncounts = 0;

  for (size_t k = 0; k < m; k++) {
    ntensors += in[idx[k]].ntensors;
    ncounts += in[idx[k]].ncounts;
  }
  *out = in[idx[0]];
  if (m == 1) {
    memset(&in[idx[0]], 0, sizeof(in[idx[0]]));
    return HVD_OK;
  }
  out->ntensors = ntensors;
  out->ncounts = ncounts;
  out->names = malloc(ntensors * sizeof(*out->names));
  out->bits = malloc(ntensors * sizeof(*out->bits));
  out->counts = ncounts > 0 ? malloc(ncounts * sizeof(*out->counts)) : NULL;
  if (out->names == NULL || out->bits == NULL || (ncounts > 0 && out->counts == NULL)) {
    free(out->names);
    free(out->bits);
    free(out->counts);
    memset(out, 0, sizeof(*out));
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot fuse %u tensors", ntensors);
  }
  ntensors = ncounts = 0;
  for (size_t k = 0; k < m; k++) {
    struct coord_response *r = &in[idx[k]];
    memcpy(out->names + ntensors, r->names, r->ntensors * sizeof(*r->names));
    memcpy(out->bits + ntensors, r->bits, r->ntensors * sizeof(*r->bits));
    if (r->ncounts > 0)
      memcpy(out->counts + ncounts, r->counts, r->ncounts * sizeof(*r->counts));
    ntensors += r->ntensors;
    ncounts += r->ncounts;
    free(r->names);
    free(r->bits);
    free(r->counts);
    r->names = NULL;
    r->bits = NULL;
    r->counts = NULL;
    r->ntensors = r->ncounts = 0;
    if (k == 0) { /* out took over its other allocations */
      r->error = NULL;
      r->ranks = NULL;
    }
    coord_response_fini(r);
  }
  return HVD_OK;
}

/* Lists up to this long keep their scratch on the stack (a list a step is
 * the common case, and every small operation passes here). */
enum { SMALL_LIST = 32 };

static hvd_status fuse_many(struct coord_response *in, const size_t *bytes, size_t n,
                            size_t threshold, struct coord_response **out, size_t *nout) {
  bool small = n <= SMALL_LIST, taken_here[SMALL_LIST] = {false};
  size_t idx_here[SMALL_LIST];
  bool *taken = small ? taken_here : calloc(n, sizeof(*taken));
  size_t *idx = small ? idx_here : malloc(n * sizeof(*idx));
  struct coord_response *res = hvd_zalloc(n ? n : 1, sizeof(*res));
  size_t count = 0;
  hvd_status st = HVD_OK;

  if (taken == NULL || idx == NULL || res == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot fuse %zu responses", n);
    goto out;
  }
  for (size_t i = 0; i < n && st == HVD_OK; i++) {
    size_t m = 0, total = bytes[i];
    if (taken[i])
      continue;
    taken[i] = true;
    idx[m++] = i;
    if (fusable(&in[i]) && threshold > 0) {
      for (size_t j = i + 1; j < n; j++) {
        if (!taken[j] && compatible(&in[i], &in[j]) && bytes[j] <= threshold - total &&
            total <= threshold) {
          taken[j] = true;
          idx[m++] = j;
          total += bytes[j];
        }
      }
    }
    st = build(in, idx, m, &res[count]);
    if (st == HVD_OK)
      count++;
  }
out:
  for (size_t i = 0; i < n; i++)
    coord_response_fini(&in[i]);
  if (!small) {
    free(taken);
    free(idx);
  }
  if (st != HVD_OK) {
    for (size_t i = 0; i < count; i++)
      coord_response_fini(&res[i]);
    free(res);
    return st;
  }
  *out = res;
  *nout = count;
  return HVD_OK;
}

hvd_status coord_fuse(struct coord_response *in, const size_t *bytes, size_t n, size_t threshold,
                      struct coord_response **out, size_t *nout) {
  if (n != 1)
    return fuse_many(in, bytes, n, threshold, out, nout);
  /* A lone operation (a small one is sent the moment it is ready): as it is. */
  if ((*out = malloc(sizeof(**out))) == NULL) {
    coord_response_fini(&in[0]);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot fuse 1 response");
  }
  **out = in[0];
  memset(&in[0], 0, sizeof(in[0]));
  *nout = 1;
  return HVD_OK;
}
