/*
 * The plan of an allgather of a response's tensors, shared by the CPU path
 * (execute.c) and the GPU backend, in elements. Fused, rank i's block holds
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
