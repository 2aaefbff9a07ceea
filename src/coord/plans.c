/*
 * What the CPU path (execute.c) and the GPU backend share about running a
 * response: the plan of an allgather, and an alltoall's splits exchange.
 *
 * The allgather plan is in elements. Fused, rank i's block holds
 * its part of every tensor one after the other, the blocks lie in rank
 * order, and every part is copied once out to where it belongs in its
 * tensor's output: the parts of one tensor follow each other in rank
 * order, so each tensor keeps a running offset and the plan is linear in
 * ranks times tensors.
 */
#include <stdlib.h>

#include "coord.h"

void coord_gather_plan_free(struct coord_gather_plan *p) {
  free(p->block_counts);
  free(p->copies);
  free(p->sums);
  *p = (struct coord_gather_plan){0};
}

hvd_status coord_gather_plan_make(const struct coord_response *r, int n,
                                  struct coord_gather_plan *p) {
  size_t tensors = r->ntensors, k = 0, total = 0;

  *p = (struct coord_gather_plan){0};
  p->n = n;
  p->tensors = tensors;
  p->block_counts = calloc(2 * (size_t)n, sizeof(*p->block_counts));
  p->copies = calloc((size_t)n * tensors, sizeof(*p->copies));
  p->sums = calloc(tensors, sizeof(*p->sums));
  if (p->block_counts == NULL || p->copies == NULL || p->sums == NULL) {
    coord_gather_plan_free(p);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot plan an allgather of %zu tensors over %d ranks",
                     tensors, n);
  }
  p->block_offsets = p->block_counts + n;
  /* sums[t] runs ahead as the next part's place in tensor t's output. */
  for (int i = 0; i < n; i++) {
    p->block_offsets[i] = total;
    for (size_t t = 0; t < tensors; t++) {
      size_t count = (size_t)r->counts[t * (size_t)n + (size_t)i];
      p->copies[k++] = (struct coord_gather_copy){.tensor = (uint32_t)t,
                                                  .src = total,
                                                  .dst = (size_t)p->sums[t],
                                                  .count = count};
      p->block_counts[i] += count;
      p->sums[t] += (int64_t)count;
      total += count;
    }
  }
  p->total = total;
  return HVD_OK;
}

/* ==== alltoall: the splits exchange ============================================ */

void coord_alltoall_plan_free(struct coord_alltoall_plan *p) {
  free(p->recv_splits);
  p->recv_splits = NULL;
}

hvd_status coord_alltoall_exchange(struct coord_state *s, const struct coord_set *set,
                                   const struct coord_response *r, const struct coord_entry *e,
                                   struct coord_alltoall_plan *out) {
  int n = set->size;
  size_t *ones = calloc((size_t)n, sizeof(*ones));
  hvd_status st = HVD_OK;

  *out = (struct coord_alltoall_plan){.row = 1};
  out->recv_splits = calloc((size_t)n, sizeof(*out->recv_splits));
  if (ones == NULL || out->recv_splits == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate alltoall splits");
    goto out;
  }
  for (int i = 0; i < n; i++)
    ones[i] = 1;
  /* The splits are host data: they go over the set's TCP communicator,
   * for GPU tensors too. */
  st = ops_alltoallv(s->ops, set->comm, e->splits, ones, out->recv_splits, ones, HVD_INT32);
  hvd_shape_elements(e->req.shape + 1, e->req.ndims - 1, &out->row);
  for (int i = 0; i < n && st == HVD_OK; i++) {
    if (out->recv_splits[i] < 0)
      st = hvd_error(HVD_ERR_PROTOCOL, "alltoall '%s': set rank %d sends %d rows", r->names[0], i,
                     out->recv_splits[i]);
    else
      out->rows += out->recv_splits[i];
  }
out:
  free(ones);
  if (st != HVD_OK)
    coord_alltoall_plan_free(out);
  return st;
}

void coord_alltoall_done(struct coord_alltoall_plan *p, struct coord_entry *e, int n) {
  e->handle->recv_splits = p->recv_splits;
  e->handle->nsplits = (size_t)n;
  p->recv_splits = NULL;
}
