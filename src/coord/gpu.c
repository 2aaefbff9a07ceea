/*
 * GPU tensors on the coordinator's side: which backend runs them, and the
 * host-staged path every backend gets for free.
 *
 * DESIGN. Negotiation, fusion decisions and ordering are the same for GPU
 * tensors as for CPU ones; only running a response differs. The backend
 * (cuda/, NCCL) runs what it can on the device. What it cannot (int16,
 * whose type NCCL lacks) and everything under HVD_GPU_COLLECTIVES=host
 * (ranks sharing one GPU, which NCCL refuses) is staged: inputs are copied
 * to host memory, the CPU collectives of execute.c run over TCP, outputs
 * are copied back. Staging works on copies of the entries, so execute.c's
 * code runs unchanged, and the outputs hvd allocates (allgather, alltoall)
 * move to device memory at the end. execute.c owns the dispatch: it asks
 * for the backend's own run, else stages in, runs its CPU collectives and
 * stages out; nothing here calls back into it.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

static _Atomic(const struct coord_gpu_backend *) g_override;

void coord_gpu_override(const struct coord_gpu_backend *b) { atomic_store(&g_override, b); }

const struct coord_gpu_backend *coord_gpu_backend(void) {
  const struct coord_gpu_backend *b = atomic_load(&g_override);
  return b != NULL ? b : coord_gpu_builtin();
}

hvd_status coord_gpu_mode_from_env(bool *host_staged) {
  int mode;
  hvd_status st = hvd_setting_word(HVD_SET_GPU_COLLECTIVES, &mode);
  if (st == HVD_OK)
    *host_staged = mode == COORD_GPU_HOST;
  return st;
}

void coord_gpu_id_scope(const struct coord_state *s, char *out, size_t size) {
  char prefix[24];
  net_generation_prefix(s->round.round, prefix, sizeof(prefix));
  snprintf(out, size, "%snccl", prefix);
}

/* ==== what a backend may read (gpu_backend.h) ============================================ */

int64_t coord_gpu_timeout_ns(const struct coord_state *s) { return s->cfg.timeout_ns; }
struct rdzv_client *coord_gpu_store(const struct coord_state *s) { return s->store; }
struct ops_ctx *coord_gpu_ops(const struct coord_state *s) { return s->ops; }
const struct net_world *coord_gpu_world(const struct coord_state *s) { return s->world; }
bool coord_gpu_hierarchical(const struct coord_state *s) { return s->cfg.hierarchical_allreduce; }

int coord_set_id(const struct coord_set *set) { return set->id; }
uint32_t coord_set_comm_id(const struct coord_set *set) { return set->comm_id; }
int coord_set_rank(const struct coord_set *set) { return set->rank; }
int coord_set_size(const struct coord_set *set) { return set->size; }
struct net_comm *coord_set_comm(const struct coord_set *set) { return set->comm; }

enum coord_type coord_response_type(const struct coord_response *r) {
  return (enum coord_type)r->type;
}
hvd_dtype coord_response_dtype(const struct coord_response *r) { return (hvd_dtype)r->dtype; }
hvd_reduce_op coord_response_op(const struct coord_response *r) { return (hvd_reduce_op)r->op; }
uint32_t coord_response_ntensors(const struct coord_response *r) { return r->ntensors; }
const char *coord_response_name(const struct coord_response *r, uint32_t t) {
  return r->names[t];
}
const int64_t *coord_response_counts(const struct coord_response *r) { return r->counts; }
double coord_response_prescale(const struct coord_response *r) { return r->prescale; }
double coord_response_postscale(const struct coord_response *r) { return r->postscale; }
int coord_response_root(const struct coord_response *r) { return r->root; }

const void *coord_entry_input(const struct coord_entry *e) { return e->input; }
void *coord_entry_output_buffer(const struct coord_entry *e) { return e->output; }
const int64_t *coord_entry_shape(const struct coord_entry *e, int *ndims) {
  *ndims = e->req.ndims;
  return e->req.shape;
}
const int32_t *coord_entry_splits(const struct coord_entry *e) { return e->splits; }
struct coord_output *coord_gpu_output(const struct coord_entry *e) {
  return coord_entry_output(e);
}

/* ==== the public queries ================================================================ */

HVD_API int hvd_cuda_built(void) { return coord_gpu_builtin() != NULL; }

HVD_API int hvd_nccl_built(void) {
  const struct coord_gpu_backend *b = coord_gpu_builtin();
  return b != NULL ? b->nccl_version : 0;
}

HVD_API hvd_status hvd_cuda_device_count(int *count) {
  const struct coord_gpu_backend *b = coord_gpu_backend();
  hvd_error_clear();
  if (count == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_cuda_device_count: count is NULL");
  *count = 0;
  if (b == NULL)
    return hvd_error(HVD_ERR_UNSUPPORTED,
                     "this build of hvd has no GPU support (configure with -DHVD_WITH_CUDA=ON)");
  return b->device_count(count);
}

/* ==== host staging ======================================================================= */

/* Bytes of an entry's output that the caller provided (0: hvd allocates it). */
static size_t given_output_bytes(const struct coord_set *set, const struct coord_response *r,
                                 const struct coord_entry *e, size_t in_bytes) {
  switch (r->type) {
  case COORD_ALLREDUCE:
  case COORD_BROADCAST:
    return in_bytes;
  case COORD_REDUCESCATTER: {
    int64_t rows = e->req.ndims > 0 ? e->req.shape[0] : 0;
    size_t row_bytes = rows > 0 ? in_bytes / (size_t)rows : 0;
    return ops_share_count((size_t)rows, set->size, set->rank) * row_bytes;
  }
  default:
    return 0;
  }
}

/* Moves an output hvd allocated in host memory to device memory. */
static hvd_status move_output(struct coord_state *s, struct coord_output *o) {
  const struct coord_gpu_backend *b = s->gpu_backend;
  void *dev = NULL;
  hvd_status st = b->alloc(s->gpu, o->bytes, &dev);
  if (st == HVD_OK && o->bytes > 0)
    st = b->to_device(s->gpu, dev, o->data, o->bytes);
  if (st != HVD_OK) {
    if (dev != NULL)
      b->free(dev);
    return st;
  }
  free(o->data);
  o->data = dev;
  o->free = b->free;
  return HVD_OK;
}

void coord_gpu_staging_free(struct coord_gpu_staging *g) {
  for (size_t i = 0; g->copies != NULL && !g->pinned && i < g->n; i++) {
    free((void *)g->copies[i].input);
    free(g->copies[i].output);
  }
  free(g->copies);
  free(g->entries);
  free(g->out_bytes);
  memset(g, 0, sizeof(*g));
}

/* Each staged buffer starts on a cache line; never 0 bytes, so that no
 * pointer is NULL even for a reducescatter share of 0 rows (the CPU
 * collectives copy 0 bytes to it, and memcpy to NULL is undefined). */
static size_t staged_size(size_t bytes) { return ((bytes > 0 ? bytes : 1) + 63) & ~(size_t)63; }

/* The entries' host buffers: carved from the backend's page-locked staging
 * buffer when it has one that large (copies run at the bus's speed and
 * nothing is paged in per operation), else malloc'd one by one. */
static hvd_status staging_buffers(struct coord_state *s, const struct coord_response *r,
                                  struct coord_entry **entries, struct coord_gpu_staging *out,
                                  const size_t *in_bytes) {
  const struct coord_gpu_backend *b = s->gpu_backend;
  size_t total = 0, used = 0;
  char *pinned = NULL;

  for (size_t i = 0; i < out->n; i++)
    if (entries[i] != NULL)
      total += staged_size(in_bytes[i]) + staged_size(out->out_bytes[i]);
  if (b->staging_buffer != NULL && total > 0)
    b->staging_buffer(s->gpu, total, (void **)&pinned);
  out->pinned = pinned != NULL;
  for (size_t i = 0; i < out->n; i++) {
    struct coord_entry *c = out->entries[i], *e = entries[i];
    if (e == NULL)
      continue;
    if (pinned != NULL) {
      c->input = pinned + used;
      used += staged_size(in_bytes[i]);
      c->output = pinned + used;
      used += staged_size(out->out_bytes[i]);
      continue;
    }
    c->input = malloc(staged_size(in_bytes[i]));
    c->output = malloc(staged_size(out->out_bytes[i]));
    if (c->input == NULL || c->output == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "cannot stage %s '%s' in host memory (%zu bytes)",
                       coord_type_name(r->type), e->req.name, in_bytes[i] + out->out_bytes[i]);
  }
  return HVD_OK;
}

hvd_status coord_gpu_stage_in(struct coord_state *s, const struct coord_set *set,
                              const struct coord_response *r, struct coord_entry **entries,
                              struct coord_gpu_staging *out) {
  const struct coord_gpu_backend *b = s->gpu_backend;
  size_t esize = hvd_dtype_size(r->dtype), n = r->ntensors, *in_bytes;
  hvd_status st = HVD_OK;

  memset(out, 0, sizeof(*out));
  out->n = n;
  out->copies = calloc(n, sizeof(*out->copies));
  out->entries = calloc(n, sizeof(*out->entries));
  out->out_bytes = calloc(n, sizeof(*out->out_bytes));
  in_bytes = calloc(n, sizeof(*in_bytes));
  if (out->copies == NULL || out->entries == NULL || out->out_bytes == NULL || in_bytes == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot stage %zu GPU tensors", n);
  for (size_t i = 0; i < n && st == HVD_OK; i++) {
    struct coord_entry *e = entries[i], *c = &out->copies[i];
    int64_t elements = 0;
    if (e == NULL)
      continue;
    *c = *e;
    c->input = c->output = NULL;
    out->entries[i] = c;
    hvd_shape_elements(e->req.shape, e->req.ndims, &elements);
    in_bytes[i] = (size_t)elements * esize;
    out->out_bytes[i] = given_output_bytes(set, r, e, in_bytes[i]);
  }
  if (st == HVD_OK)
    st = staging_buffers(s, r, entries, out, in_bytes);
  for (size_t i = 0; i < n && st == HVD_OK; i++)
    if (entries[i] != NULL && in_bytes[i] > 0)
      st = b->to_host(s->gpu, (void *)out->copies[i].input, entries[i]->input, in_bytes[i]);
  free(in_bytes);
  if (st != HVD_OK)
    coord_gpu_staging_free(out);
  return st;
}

hvd_status coord_gpu_stage_out(struct coord_state *s, const struct coord_response *r,
                               struct coord_entry **entries,
                               const struct coord_gpu_staging *staging) {
  hvd_status st = HVD_OK;

  for (size_t i = 0; i < staging->n && st == HVD_OK; i++) {
    struct coord_entry *e = entries[i];
    if (e == NULL)
      continue;
    if (staging->out_bytes[i] > 0)
      st = s->gpu_backend->to_device(s->gpu, e->output, staging->copies[i].output,
                                     staging->out_bytes[i]);
    else if (r->type == COORD_ALLGATHER || r->type == COORD_ALLTOALL)
      st = move_output(s, coord_entry_output(e));
  }
  return st;
}

/* ==== running a GPU response ============================================================== */

hvd_status coord_gpu_run(struct coord_state *s, const struct coord_set *set,
                         const struct coord_response *r, struct coord_entry **entries,
                         bool *ran) {
  const struct coord_gpu_backend *b = s->gpu_backend;
  hvd_status st;

  *ran = true; /* unless the backend leaves it to staging, below */
  if (b == NULL)
    return hvd_error(HVD_ERR_UNSUPPORTED,
                     "%s '%s' is on a GPU, and this build of hvd has no GPU support",
                     coord_type_name(r->type), r->names[0]);
  if (s->gpu == NULL) {
    /* A rank that joined may meet GPU tensors before it ever had one. */
    int device = atomic_load(&s->gpu_device);
    if ((st = b->open(s, device >= 0 ? device : 0, &s->gpu)) != HVD_OK)
      return st;
  }
  for (uint32_t i = 0; i < r->ntensors; i++) {
    if (entries[i] != NULL && entries[i]->ready_event != NULL &&
        (st = b->wait_event(s->gpu, entries[i]->ready_event)) != HVD_OK)
      return st;
  }
  if (!s->cfg.gpu_host_staged && b->execute != NULL) {
    st = b->execute(s->gpu, set, r, entries);
    if (st != HVD_ERR_UNSUPPORTED)
      return st;
    hvd_error_clear();
  }
  *ran = false;
  return HVD_OK;
}
