/*
 * Running a response on this rank: the collective on the process set's
 * communicator, then the handles.
 *
 * DESIGN. A fused allreduce copies its small tensors into the fusion
 * buffer and reduces them as one, which saves a round of latency per
 * tensor; tensors of HVD_FUSION_INPLACE_BYTES or more are reduced where
 * they are, one collective each, because copying them in and out costs
 * more memory traffic than their own round of latency (on loopback the
 * copies would add half again to a large step). A rank that has joined
 * has no tensors: it contributes the reduction's identity. Allgather
 * fuses by packing each rank's tensors into one block per rank.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

void coord_execute_phase(struct coord_state *s, const struct coord_response *r,
                         const char *phase) {
  if (!coord_timeline_active(s->timeline))
    return;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    coord_timeline_end(s->timeline, r->names[i]);
    if (phase != NULL)
      coord_timeline_begin(s->timeline, r->names[i], phase);
  }
}

static void *grow(void **buf, size_t *cap, size_t bytes) {
  if (bytes > *cap) {
    void *p = NULL;
    size_t want = bytes < 4096 ? 4096 : bytes;
    if (posix_memalign(&p, 64, want) != 0) {
      hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate %zu bytes for a fused operation", want);
      return NULL;
    }
    free(*buf);
    *buf = p;
    *cap = want;
  }
  return *buf;
}

/* A rank in hvd_join runs the others' operations without entries of its
 * own; their generated names still count as its calls (see names.c). */
static void count_joined_calls(struct coord_state *s, const struct coord_response *r,
                               struct coord_entry *const *entries) {
  bool joined = false, checked = false;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    if (entries[i] != NULL)
      continue;
    if (!checked) {
      joined = coord_find_entry(s, HVD_PROCESS_SET_GLOBAL, COORD_JOIN_NAME) != NULL;
      checked = true;
    }
    if (!joined)
      return;
    coord_names_seen(s, r->set, r->names[i]);
  }
}

/* Completes every entry the response took (they are out of the in-flight map). */
static void finish_all(const struct coord_response *r, struct coord_entry **entries,
                       hvd_status st, const char *message) {
  for (uint32_t i = 0; i < r->ntensors; i++) {
    if (entries[i] != NULL)
      coord_complete_entry(entries[i], st, message);
  }
}

/* ==== allreduce ======================================================================= */

/* joined: this rank contributes the identity, which prescaling would
 * change (a product's 1, a minimum's +inf); prescaling is local, so the
 * other ranks still scale theirs. tensor_counts: the n tensors' counts
 * (they add up to count), for Adasum, which combines each tensor with its
 * own dot products; the element-wise ops ignore them. */
static hvd_status reduce(struct coord_state *s, const struct coord_set *set,
                         const struct coord_response *r, const void *in, void *out, size_t count,
                         const size_t *tensor_counts, size_t n, bool joined) {
  double prescale = joined ? 1.0 : r->prescale;
  bool hier = set->id == HVD_PROCESS_SET_GLOBAL && s->cfg.hierarchical_allreduce &&
              s->world->local_size < s->size;
  struct ops_layout l = {s->world->global, s->world->local, s->world->cross};

  if (r->op == HVD_ADASUM && hier)
    return ops_adasum_hierarchical(s->ops, &l, in, out, count, r->dtype, tensor_counts, n,
                                   prescale, r->postscale);
  if (r->op == HVD_ADASUM)
    return ops_adasum(s->ops, set->comm, in, out, count, r->dtype, tensor_counts, n, prescale,
                      r->postscale);
  if (hier)
    return ops_allreduce_hierarchical(s->ops, &l, in, out, count, r->dtype, r->op, prescale,
                                      r->postscale);
  return ops_allreduce(s->ops, set->comm, in, out, count, r->dtype, r->op, prescale,
                       r->postscale);
}

/* A joined rank's input: the identity, count elements. */
static void *identity(struct coord_state *s, const struct coord_response *r, size_t count) {
  size_t esize = hvd_dtype_size(r->dtype);
  void *buf = grow(&s->identity, &s->identity_cap, count * esize);
  if (buf != NULL)
    ops_fill_identity(buf, count, r->dtype, r->op);
  return buf;
}

static hvd_status run_allreduce(struct coord_state *s, const struct coord_set *set,
                                const struct coord_response *r, struct coord_entry **entries) {
  size_t esize = hvd_dtype_size(r->dtype), packed = 0, total = 0;
  size_t inplace = s->cfg.fusion_inplace_bytes;
  char *fb = NULL;
  hvd_status st = HVD_OK;

  if (r->data_len > 0) { /* reduced by rank 0 during negotiation */
    if (r->ntensors != 1 || r->ncounts != 1 || r->data_len != (uint64_t)r->counts[0] * esize)
      return hvd_error(HVD_ERR_PROTOCOL,
                       "rank 0 sent an inline result of %u bytes for allreduce '%s'",
                       r->data_len, r->ntensors > 0 ? r->names[0] : "");
    coord_execute_phase(s, r, "INLINE_ALLREDUCE");
    if (entries[0] != NULL)
      memcpy(entries[0]->output, r->data, r->data_len);
    return HVD_OK;
  }
  if (r->ntensors == 1) {
    struct coord_entry *e = entries[0];
    size_t count = (size_t)r->counts[0];
    void *buf = e != NULL ? e->output : identity(s, r, count);
    if (buf == NULL)
      return hvd_error_status();
    coord_execute_phase(s, r, "ALLREDUCE");
    return reduce(s, set, r, e != NULL ? e->input : buf, buf, count, &count, 1, e == NULL);
  }
  /* The small tensors go through the fusion buffer, in order. */
  for (uint32_t i = 0; i < r->ntensors; i++) {
    size_t bytes = (size_t)r->counts[i] * esize;
    total += bytes;
    if (bytes < inplace || inplace == 0)
      packed += bytes;
  }
  if (packed > 0) {
    size_t off = 0, npacked = 0;
    size_t *counts = grow(&s->fused_counts, &s->fused_counts_cap, r->ntensors * sizeof(size_t));
    if (counts == NULL || (fb = grow(&s->fusion, &s->fusion_cap, packed)) == NULL)
      return hvd_error_status();
    coord_execute_phase(s, r, "MEMCPY_IN_FUSION_BUFFER");
    for (uint32_t i = 0; i < r->ntensors; i++) {
      size_t count = (size_t)r->counts[i], bytes = count * esize;
      if (bytes >= inplace && inplace != 0)
        continue;
      if (entries[i] != NULL)
        memcpy(fb + off, entries[i]->input, bytes);
      else
        ops_fill_identity(fb + off, count, r->dtype, r->op);
      off += bytes;
      counts[npacked++] = count;
    }
    coord_execute_phase(s, r, "ALLREDUCE");
    st = reduce(s, set, r, fb, fb, packed / esize, counts, npacked, entries[0] == NULL);
    if (st != HVD_OK)
      return st;
    coord_execute_phase(s, r, "MEMCPY_OUT_FUSION_BUFFER");
    off = 0;
    for (uint32_t i = 0; i < r->ntensors; i++) {
      size_t bytes = (size_t)r->counts[i] * esize;
      if (bytes >= inplace && inplace != 0)
        continue;
      if (entries[i] != NULL)
        memcpy(entries[i]->output, fb + off, bytes);
      off += bytes;
    }
  }
  if (packed < total)
    coord_execute_phase(s, r, "ALLREDUCE"); /* the tensors reduced in place */
  for (uint32_t i = 0; i < r->ntensors && st == HVD_OK; i++) {
    size_t count = (size_t)r->counts[i];
    struct coord_entry *e = entries[i];
    void *buf;
    if (count * esize < inplace || inplace == 0)
      continue;
    if ((buf = e != NULL ? e->output : identity(s, r, count)) == NULL)
      return hvd_error_status();
    st = reduce(s, set, r, e != NULL ? e->input : buf, buf, count, &count, 1, e == NULL);
  }
  return st;
}

/* ==== allgather ======================================================================== */

static hvd_status gather(struct coord_state *s, const struct coord_set *set, const void *in,
                         void *out, const size_t *counts, hvd_dtype dtype) {
  if (set->id == HVD_PROCESS_SET_GLOBAL && s->cfg.hierarchical_allgather &&
      s->world->local_size < s->size) {
    struct ops_layout l = {s->world->global, s->world->local, s->world->cross};
    return ops_allgatherv_hierarchical(s->ops, &l, in, out, counts, dtype);
  }
  return ops_allgatherv(s->ops, set->comm, in, out, counts, dtype);
}

void coord_output_shape(struct coord_entry *e, int64_t total, size_t esize) {
  struct coord_output *o = coord_entry_output(e);
  int64_t row = 1;

  hvd_shape_elements(e->req.shape + 1, e->req.ndims - 1, &row);
  o->bytes = (size_t)total * esize;
  o->ndims = e->req.ndims;
  memcpy(o->shape, e->req.shape, (size_t)e->req.ndims * sizeof(o->shape[0]));
  o->shape[0] = row > 0 ? total / row : 0;
}

/* Host memory for an output of `bytes` (at least one byte, so that an
 * empty output is a pointer too), aligned for every dtype and vector. */
static hvd_status host_output(struct coord_entry *e, const char *what) {
  struct coord_output *o = coord_entry_output(e);
  void *p = NULL;

  if (posix_memalign(&p, 64, o->bytes ? o->bytes : 1) != 0)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate %zu bytes for %s '%s'", o->bytes, what,
                     e->req.name);
  o->data = p;
  return HVD_OK;
}

/* Allocates a tensor's gathered output in its handle. */
static hvd_status gathered_output(struct coord_entry *e, int64_t total, size_t esize) {
  coord_output_shape(e, total, esize);
  return host_output(e, "allgather");
}

static hvd_status run_allgather(struct coord_state *s, const struct coord_set *set,
                                const struct coord_response *r, struct coord_entry **entries) {
  size_t esize = hvd_dtype_size(r->dtype);
  const struct coord_gather_copy *mine;
  struct coord_gather_plan p;
  char *fb;
  hvd_status st = coord_gather_plan_make(r, set->size, &p);

  for (uint32_t t = 0; t < r->ntensors && st == HVD_OK; t++) {
    if (entries[t] == NULL)
      st = hvd_error(HVD_ERR_PROTOCOL, "allgather '%s' reached a rank that did not submit it",
                     r->names[t]);
    else
      st = gathered_output(entries[t], p.sums[t], esize);
  }
  if (st != HVD_OK)
    goto out;
  if (r->ntensors == 1) {
    coord_execute_phase(s, r, "ALLGATHER");
    st = gather(s, set, entries[0]->input, coord_entry_output(entries[0])->data, p.block_counts,
                r->dtype);
    goto out;
  }
  if ((fb = grow(&s->fusion, &s->fusion_cap, p.total * esize)) == NULL) {
    st = hvd_error_status();
    goto out;
  }
  /* This rank's block: its tensors, one after the other. */
  coord_execute_phase(s, r, "MEMCPY_IN_FUSION_BUFFER");
  mine = &p.copies[(size_t)set->rank * p.tensors];
  for (size_t t = 0; t < p.tensors; t++)
    memcpy(fb + mine[t].src * esize, entries[t]->input, mine[t].count * esize);
  coord_execute_phase(s, r, "ALLGATHER");
  st = gather(s, set, fb + p.block_offsets[set->rank] * esize, fb, p.block_counts, r->dtype);
  if (st != HVD_OK)
    goto out;
  coord_execute_phase(s, r, "MEMCPY_OUT_FUSION_BUFFER");
  for (size_t k = 0; k < (size_t)p.n * p.tensors; k++) {
    const struct coord_gather_copy *c = &p.copies[k];
    memcpy((char *)coord_entry_output(entries[c->tensor])->data + c->dst * esize,
           fb + c->src * esize, c->count * esize);
  }
out:
  coord_gather_plan_free(&p);
  return st;
}

/* ==== the others ====================================================================== */

static hvd_status run_broadcast(struct coord_state *s, const struct coord_set *set,
                                const struct coord_response *r, struct coord_entry *e) {
  size_t count = (size_t)r->counts[0];
  if (e == NULL)
    return hvd_error(HVD_ERR_PROTOCOL, "broadcast '%s' reached a rank that did not submit it",
                     r->names[0]);
  if (set->rank == r->root && e->output != e->input)
    memcpy(e->output, e->input, count * hvd_dtype_size(r->dtype));
  coord_execute_phase(s, r, "BROADCAST");
  return ops_broadcast(s->ops, set->comm, e->output, count, r->dtype, r->root);
}

static hvd_status run_alltoall(struct coord_state *s, const struct coord_set *set,
                               const struct coord_response *r, struct coord_entry *e) {
  int n = set->size;
  size_t esize = hvd_dtype_size(r->dtype);
  struct coord_alltoall_plan p = {0};
  struct coord_output *o;
  size_t *send = NULL, *recv = NULL;
  hvd_status st;

  if (e == NULL)
    return hvd_error(HVD_ERR_PROTOCOL, "alltoall '%s' reached a rank that did not submit it",
                     r->names[0]);
  coord_execute_phase(s, r, "ALLTOALL");
  if ((st = coord_alltoall_exchange(s, set, r, e, &p)) != HVD_OK)
    return st;
  send = calloc((size_t)n, sizeof(*send));
  recv = calloc((size_t)n, sizeof(*recv));
  if (send == NULL || recv == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate alltoall counts");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    send[i] = (size_t)e->splits[i] * (size_t)p.row;
    recv[i] = (size_t)p.recv_splits[i] * (size_t)p.row;
  }
  o = coord_entry_output(e);
  o->bytes = (size_t)p.rows * (size_t)p.row * esize;
  if ((st = host_output(e, "alltoall")) != HVD_OK)
    goto out;
  o->ndims = e->req.ndims;
  memcpy(o->shape, e->req.shape, (size_t)e->req.ndims * sizeof(o->shape[0]));
  o->shape[0] = p.rows;
  st = ops_alltoallv(s->ops, set->comm, e->input, send, o->data, recv, r->dtype);
  if (st == HVD_OK)
    coord_alltoall_done(&p, e, n);
out:
  coord_alltoall_plan_free(&p);
  free(send);
  free(recv);
  return st;
}

static hvd_status run_reducescatter(struct coord_state *s, const struct coord_set *set,
                                    const struct coord_response *r, struct coord_entry *e) {
  int n = set->size;
  size_t *counts;
  int64_t rows, row;
  hvd_status st;

  if (e == NULL)
    return hvd_error(HVD_ERR_PROTOCOL,
                     "reducescatter '%s' reached a rank that did not submit it", r->names[0]);
  rows = e->req.shape[0];
  row = rows > 0 ? r->counts[0] / rows : 0;
  if ((counts = calloc((size_t)n, sizeof(*counts))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate reducescatter counts");
  for (int i = 0; i < n; i++)
    counts[i] = ops_share_count((size_t)rows, n, i) * (size_t)row;
  coord_execute_phase(s, r, "REDUCESCATTER");
  st = ops_reducescatterv(s->ops, set->comm, e->input, e->output, counts, r->dtype, r->op,
                          r->prescale, r->postscale);
  free(counts);
  return st;
}

/* ==== dispatch ========================================================================== */

static hvd_status execute_cpu(struct coord_state *s, const struct coord_set *set,
                              const struct coord_response *r, struct coord_entry **entries) {
  switch (r->type) {
  case COORD_ALLREDUCE: return run_allreduce(s, set, r, entries);
  case COORD_ALLGATHER: return run_allgather(s, set, r, entries);
  case COORD_BROADCAST: return run_broadcast(s, set, r, entries[0]);
  case COORD_ALLTOALL: return run_alltoall(s, set, r, entries[0]);
  case COORD_REDUCESCATTER: return run_reducescatter(s, set, r, entries[0]);
  case COORD_BARRIER:
    coord_execute_phase(s, r, "BARRIER");
    return ops_barrier(s->ops, set->comm);
  default:
    return hvd_error(HVD_ERR_PROTOCOL, "unexpected response type %d", r->type);
  }
}

/* A GPU response: the backend's own collectives, else staged through host
 * memory and the CPU collectives above. */
static hvd_status execute_gpu(struct coord_state *s, const struct coord_set *set,
                              const struct coord_response *r, struct coord_entry **entries) {
  struct coord_gpu_staging staging;
  bool ran;
  hvd_status st = coord_gpu_run(s, set, r, entries, &ran);

  if (ran)
    return st;
  if ((st = coord_gpu_stage_in(s, set, r, entries, &staging)) != HVD_OK)
    return st;
  st = execute_cpu(s, set, r, staging.entries);
  if (st == HVD_OK)
    st = coord_gpu_stage_out(s, r, entries, &staging);
  coord_gpu_staging_free(&staging);
  return st;
}

hvd_status coord_execute(struct coord_state *s, const struct coord_response *r) {
  struct coord_entry *one[1], **entries = r->ntensors <= 1 ? one : NULL;
  struct coord_set *set = coord_sets_get(&s->sets, r->set);
  hvd_status st = HVD_OK, failure = HVD_OK;
  int64_t start;
  bool timed;

  if (r->type == COORD_JOIN) {
    struct coord_entry *e = coord_find_entry(s, HVD_PROCESS_SET_GLOBAL, COORD_JOIN_NAME);
    if (e != NULL) {
      e->handle->value = r->last_joined;
      coord_finish_entry(s, e, HVD_OK, NULL);
    }
    return HVD_OK;
  }
  if (entries == NULL && (entries = calloc(r->ntensors, sizeof(*entries))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot run a response of %u tensors", r->ntensors);
  one[0] = NULL;
  /* Taken out of the in-flight map now: each is completed below, on every
   * path, and the same name may be submitted again from here on. */
  coord_take_entries(s, r->set, r->names, r->ntensors, entries);
  count_joined_calls(s, r, entries);
  switch (r->type) {
  case COORD_ERROR:
    if (s->cfg.metrics)
      coord_metrics_op(s, set, r, entries, 0, 0, false);
    finish_all(r, entries, (hvd_status)r->status,
               r->error != NULL ? r->error : "rank 0 failed the operation (no message)");
    goto out;
  case COORD_SET_ADD:
    st = coord_sets_add(&s->sets, s->world->global, r->new_set, r->ranks, r->nranks);
    if (st != HVD_OK) {
      failure = st;
      break;
    }
    if (entries[0] != NULL)
      entries[0]->handle->value = r->new_set;
    break;
  case COORD_SET_REMOVE:
    st = coord_sets_remove(&s->sets, r->new_set);
    if (st != HVD_OK)
      failure = st;
    break;
  default:
    if (set == NULL) {
      failure = st = hvd_error(HVD_ERR_PROTOCOL, "%s '%s' names process set %d, which is unknown",
                               coord_type_name(r->type), r->names[0], r->set);
      break;
    }
    if (set->rank < 0) { /* not a member (it cannot have submitted one) */
      finish_all(r, entries, HVD_ERR_INTERNAL, "this rank is not in the operation's process set");
      goto out;
    }
    /* A collective reads the clock for its metrics; a result reduced
     * inline (no collective, the small-op path) takes the list's time. */
    timed = s->cfg.metrics && r->data_len == 0;
    start = timed ? hvd_now_ns() : s->apply_ns;
    if (r->device != HVD_DEVICE_CPU)
      st = execute_gpu(s, set, r, entries);
    else
      st = execute_cpu(s, set, r, entries);
    if (s->cfg.metrics)
      coord_metrics_op(s, set, r, entries, start, timed ? hvd_now_ns() : -1, st == HVD_OK);
    /* A failed collective means a failed communicator: the job stops. */
    if (st != HVD_OK)
      failure = st;
    break;
  }
  finish_all(r, entries, st, NULL);
out:
  coord_execute_phase(s, r, NULL);
  if (entries != one)
    free(entries);
  return failure;
}
