/*
 * The public collectives and handles: argument checks, entries, the queue.
 * Everything a single rank can tell is wrong is rejected here, at once,
 * with HVD_ERR_INVALID_ARGUMENT; what needs every rank's view is the
 * coordinator's job.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

static const hvd_options default_options = HVD_OPTIONS_INIT;

/* ==== names ================================================================================ */

/* The entry's name: in its own buffer when it fits (coord_entry_destroy
 * knows), else a copy. */
static hvd_status set_name(struct coord_entry *e, const char *name) {
  struct coord_request *req = &e->req;
  size_t len = strlen(name);

  if (len == 0 || len > COORD_NAME_MAX)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "tensor names must have 1 to %d bytes (got %zu)",
                     COORD_NAME_MAX, len);
  if (len < sizeof(e->name_buf))
    req->name = memcpy(e->name_buf, name, len + 1);
  else if ((req->name = hvd_strndup(name, len)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot copy a tensor name");
  req->name_len = (uint32_t)len;
  return HVD_OK;
}

/* ==== checks ================================================================================ */

struct target {
  int set, set_size, set_rank;
};

/* A rank's GPU tensors are all on one device: the first one's. */
static hvd_status check_device(struct coord_state *s, const char *what, const hvd_options *o) {
  int n = 0, current = atomic_load(&s->gpu_device);
  if (o->device == HVD_DEVICE_CPU) {
    if (o->ready_event != NULL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s: a ready event is for GPU tensors, and this one is on the CPU", what);
    return HVD_OK;
  }
  if (o->device < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s: device %d is neither HVD_DEVICE_CPU (-1) nor a GPU ordinal", what,
                     o->device);
  if (s->gpu_backend == NULL)
    return hvd_error(HVD_ERR_UNSUPPORTED,
                     "%s: the tensor is on GPU %d, and this build of hvd has no GPU support "
                     "(configure with -DHVD_WITH_CUDA=ON)",
                     what, o->device);
  if (o->device == current)
    return HVD_OK;
  if (s->gpu_backend->device_count(&n) != HVD_OK)
    return hvd_error_prefix("%s: GPU %d", what, o->device);
  if (o->device >= n)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: GPU %d does not exist (this process sees %d)",
                     what, o->device, n);
  /* Only the first GPU tensor chooses (-1: none yet); current gets the choice that stands. */
  current = -1;
  if (!atomic_compare_exchange_strong(&s->gpu_device, &current, o->device) &&
      current != o->device)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s: the tensor is on GPU %d, but this rank's GPU tensors are on GPU %d "
                     "(hvd uses one GPU per rank)",
                     what, o->device, current);
  return HVD_OK;
}

static hvd_status check_options(struct coord_state *s, const char *what, const hvd_options *o,
                                struct target *t) {
  t->set = o->process_set;
  if (!coord_sets_lookup(&s->sets, o->process_set, &t->set_size, &t->set_rank))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s: process set %d does not exist (or has not been registered yet)", what,
                     o->process_set);
  if (t->set_rank < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: rank %d is not a member of process set %d",
                     what, s->rank, o->process_set);
  if (check_device(s, what, o) != HVD_OK)
    return hvd_error_status();
  if ((int)o->op < HVD_SUM || (int)o->op > HVD_ADASUM)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: %d is not a reduce op", what, (int)o->op);
  if (isnan(o->prescale) || isnan(o->postscale))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: scale factors must not be NaN", what);
  return HVD_OK;
}

static hvd_status check_tensor(const char *what, const hvd_tensor *t, bool output,
                               int64_t *elements) {
  if (t == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: no tensor", what);
  if (hvd_dtype_size(t->dtype) == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: %d is not a dtype", what, (int)t->dtype);
  if (t->ndims < 0 || t->ndims > HVD_MAX_DIMS)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: %d dimensions; 0 to %d are allowed", what,
                     t->ndims, HVD_MAX_DIMS);
  if (t->ndims > 0 && t->shape == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: %d dimensions but no shape", what, t->ndims);
  for (int i = 0; i < t->ndims; i++) {
    if (t->shape[i] < 0)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: dimension %d is %" PRId64, what, i,
                       t->shape[i]);
  }
  if (!hvd_shape_elements(t->shape, t->ndims, elements) ||
      (uint64_t)*elements > SIZE_MAX / 8 / hvd_dtype_size(t->dtype))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: the shape's size overflows", what);
  if (*elements > 0 && t->input == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: no input buffer", what);
  if (output && *elements > 0 && t->output == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: no output buffer", what);
  return HVD_OK;
}

/* ==== entries =============================================================================== */

/* An empty tensor may come without buffers (hvd.h allows NULL then): its
 * entry points here instead, so that every copy of its 0 bytes has an
 * address (memcpy from or to NULL is undefined, even for 0 bytes). */
static unsigned char no_bytes[1];

static struct coord_entry *entry_new(int type, const hvd_tensor *t, const hvd_options *o,
                                     struct hvd_handle_s *h) {
  struct coord_entry *e = coord_entry_alloc();
  if (e == NULL)
    return NULL;
  e->req.type = (uint8_t)type;
  e->req.set = o->process_set;
  e->req.root = o->root;
  e->req.device = o->device;
  e->ready_event = o->ready_event;
  e->req.op = (uint8_t)o->op;
  e->req.prescale = o->prescale;
  e->req.postscale = o->postscale;
  if (t != NULL) {
    e->req.dtype = (uint8_t)t->dtype;
    e->req.ndims = t->ndims;
    if (t->ndims > 0)
      memcpy(e->req.shape, t->shape, (size_t)t->ndims * sizeof(e->req.shape[0]));
    e->input = t->input;
    e->output = t->output;
    if (o->device == HVD_DEVICE_CPU) {
      if (e->input == NULL)
        e->input = no_bytes;
      if (e->output == NULL)
        e->output = no_bytes;
    }
  }
  e->handle = h;
  return e;
}

/* entries may be NULL, and hold NULLs (entries never built). */
static void destroy_entries(struct coord_entry **entries, size_t n) {
  for (size_t i = 0; entries != NULL && i < n; i++)
    coord_entry_destroy(entries[i]);
}

/* Queues n entries under one new handle; *out gets the handle. */
static hvd_status submit(struct coord_state *s, struct coord_entry **entries, size_t n,
                         struct hvd_handle_s *h, hvd_handle *out) {
  hvd_status st = coord_enqueue(s, entries, n);
  if (st != HVD_OK) {
    destroy_entries(entries, n);
    coord_handle_destroy(h);
    return st;
  }
  *out = h;
  return HVD_OK;
}

/* Collectives that n tensors may share as one group. */
static bool groupable(int type) {
  return type == COORD_ALLREDUCE || type == COORD_ALLGATHER || type == COORD_REDUCESCATTER;
}

/* One call of a tensor collective, as enqueue's steps share it. */
struct call {
  int type;
  const char *what; /* the collective's name, for messages */
  const hvd_options *o;
  size_t n;           /* tensors */
  struct target tg;   /* filled in by check_target */
  char group[96]; /* an unnamed group's generated prefix: grouped_<what>.noname.<n> */
};

/* What needs no state: the handle pointer, the count, the array. */
static hvd_status check_call(const struct call *c, const hvd_tensor *tensors,
                             const hvd_handle *out) {
  if (out == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: no handle pointer", c->what);
  if (c->n == 0 || c->n > INT32_MAX || (c->n > 1 && !groupable(c->type)))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: %zu tensors", c->what, c->n);
  if (tensors == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: no tensor", c->what);
  return HVD_OK;
}

/* The options against this rank's state, and a broadcast's root against the set. */
static hvd_status check_target(struct coord_state *s, struct call *c) {
  const hvd_options *o = c->o;
  hvd_status st = check_options(s, c->what, o, &c->tg);

  if (st == HVD_OK && c->type == COORD_BROADCAST && (o->root < 0 || o->root >= c->tg.set_size))
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "broadcast: root %d is not a rank of process set %d (size %d)", o->root,
                   o->process_set, c->tg.set_size);
  return st;
}

/* What one tensor of the call must satisfy on this rank alone. */
static hvd_status check_call_tensor(const struct call *c, const hvd_tensor *t,
                                    int64_t *elements) {
  const hvd_options *o = c->o;
  int type = c->type;
  bool output = type == COORD_ALLREDUCE || type == COORD_BROADCAST;
  hvd_status st = check_tensor(c->what, t, output, elements);

  if (st == HVD_OK && (type == COORD_ALLREDUCE || type == COORD_REDUCESCATTER))
    st = ops_check_reduce(t->dtype, o->op, o->prescale, o->postscale);
  if (st == HVD_OK && type == COORD_REDUCESCATTER && o->op == HVD_ADASUM)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "reducescatter: adasum is an allreduce only (use sum, average, min, max or "
                   "product)");
  if (st == HVD_OK && t->ndims == 0 &&
      (type == COORD_ALLGATHER || type == COORD_ALLTOALL || type == COORD_REDUCESCATTER))
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "%s needs a tensor of at least one dimension, not a scalar", c->what);
  /* A rank that receives no rows may pass no output buffer. */
  if (st == HVD_OK && type == COORD_REDUCESCATTER && t->output == NULL &&
      ops_share_count((size_t)t->shape[0], c->tg.set_size, c->tg.set_rank) > 0 && *elements > 0)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "reducescatter: no output buffer");
  return st;
}

/* A group's tensors are all named or all unnamed; an unnamed group takes a
 * generated prefix (its tensors are <prefix>.<i>). */
static hvd_status name_group(struct coord_state *s, struct call *c, const hvd_tensor *tensors) {
  char kind[32];

  c->group[0] = '\0';
  for (size_t i = 1; i < c->n; i++) {
    if ((tensors[i].name == NULL) != (tensors[0].name == NULL))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s: tensor %zu %s a name and tensor 0 %s (name all of a group's tensors "
                       "or none)",
                       c->what, i, tensors[i].name == NULL ? "has no" : "has",
                       tensors[0].name == NULL ? "has none" : "has one");
  }
  if (c->n == 1 || tensors[0].name != NULL)
    return HVD_OK;
  snprintf(kind, sizeof(kind), "grouped_%s", c->what);
  snprintf(c->group, sizeof(c->group), "%s.noname.%" PRIu64, kind,
           coord_name_number(s, c->tg.set, kind));
  return HVD_OK;
}

/* Entry i's name: its tensor's, or a generated one. A group's entries also
 * carry the group's name, which is its first entry's. */
static hvd_status name_entry(struct coord_state *s, const struct call *c, const hvd_tensor *t,
                             size_t i, struct coord_entry **entries) {
  struct coord_request *req = &entries[i]->req;
  char name[COORD_NAME_MAX + 64];
  const char *g;
  hvd_status st;

  if (t->name != NULL && strlen(t->name) > COORD_NAME_MAX)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: tensor names must have at most %d bytes",
                     c->what, COORD_NAME_MAX);
  if (t->name != NULL) {
    st = set_name(entries[i], t->name);
  } else {
    if (c->n > 1)
      snprintf(name, sizeof(name), "%s.%zu", c->group, i);
    else
      snprintf(name, sizeof(name), "%s.noname.%" PRIu64, c->what,
               coord_name_number(s, c->tg.set, c->what));
    st = set_name(entries[i], name);
  }
  if (st != HVD_OK || c->n == 1)
    return st;
  g = entries[0]->req.name;
  if ((req->group = hvd_strndup(g, strlen(g))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "%s: cannot copy a group name", c->what);
  req->group_len = (uint32_t)strlen(g);
  req->group_size = (uint32_t)c->n;
  return HVD_OK;
}

/* A small CPU allreduce travels with its request (see coord_request). */
static void attach_inline(const struct coord_state *s, const struct call *c, const hvd_tensor *t,
                          int64_t elements, struct coord_entry *e) {
  size_t bytes = (size_t)elements * hvd_dtype_size(t->dtype);

  /* Rank 0 reduces inline inputs element-wise; Adasum is not element-wise. */
  if (c->type == COORD_ALLREDUCE && c->n == 1 && c->o->device == HVD_DEVICE_CPU && bytes > 0 &&
      bytes <= s->cfg.inline_bytes && c->o->op != HVD_ADASUM) {
    e->req.inline_len = (uint32_t)bytes;
    memcpy(e->req.inline_data, t->input, bytes);
  }
}

/* An alltoall's rows to each set rank: the caller's splits, or equal shares. */
static hvd_status copy_splits(const struct call *c, const hvd_tensor *t, const int32_t *splits,
                              struct coord_entry *e) {
  int size = c->tg.set_size;
  int64_t sum = 0;

  if ((e->splits = malloc((size_t)size * sizeof(*e->splits))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "alltoall: cannot copy the splits");
  for (int p = 0; p < size; p++) {
    e->splits[p] = splits != NULL ? splits[p] : (int32_t)(t->shape[0] / size);
    if (e->splits[p] < 0)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "alltoall: splits[%d] is %d", p, e->splits[p]);
    sum += e->splits[p];
  }
  if (splits == NULL && t->shape[0] % size != 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "alltoall: no splits given, and the first dimension (%" PRId64
                     ") is not a multiple of the process set's size (%d)",
                     t->shape[0], size);
  if (sum > t->shape[0])
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "alltoall: the splits sum to %" PRId64
                     " rows, more than the first dimension (%" PRId64 ")",
                     sum, t->shape[0]);
  return HVD_OK;
}

/* Checks tensor i and builds its entry into entries[i] (where the caller
 * destroys it if this or a later step fails). */
static hvd_status build_entry(struct coord_state *s, const struct call *c, const hvd_tensor *t,
                              size_t i, const int32_t *splits, struct hvd_handle_s *h,
                              struct coord_entry **entries) {
  int64_t elements = 0;
  struct coord_entry *e;
  hvd_status st = check_call_tensor(c, t, &elements);

  if (st != HVD_OK)
    return st;
  if ((e = entry_new(c->type, t, c->o, h)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "%s: cannot allocate an entry", c->what);
  entries[i] = e;
  e->part = (int)i;
  if ((st = name_entry(s, c, t, i, entries)) != HVD_OK)
    return st;
  attach_inline(s, c, t, elements, e);
  return c->type == COORD_ALLTOALL ? copy_splits(c, t, splits, e) : HVD_OK;
}

static struct hvd_handle_s *handle_new(const struct coord_state *s, int parts, bool outputs,
                                       hvd_callback cb, void *arg) {
  struct hvd_handle_s *h = coord_handle_create(parts, outputs, cb, arg);
  if (h != NULL)
    h->spin_ns = s->cfg.spin_ns;
  return h;
}

/* The common path of the tensor collectives: checks, a handle, an entry per
 * tensor, the queue. */
static hvd_status enqueue(int type, const hvd_tensor *tensors, size_t n, const int32_t *splits,
                          const hvd_options *options, hvd_handle *out) {
  struct call c = {.type = type, .what = coord_type_name(type), .n = n,
                   .o = options != NULL ? options : &default_options};
  struct coord_entry *one[1] = {NULL}, **entries = one;
  struct hvd_handle_s *h = NULL;
  struct coord_state *s;
  hvd_status st = check_call(&c, tensors, out);

  if (st != HVD_OK)
    return st;
  if ((s = coord_acquire()) == NULL)
    return hvd_error_status();
  st = check_target(s, &c);
  if (st == HVD_OK && n > 1 && (entries = calloc(n, sizeof(*entries))) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "%s: cannot allocate %zu entries", c.what, n);
  if (st == HVD_OK &&
      (h = handle_new(s, (int)n, type == COORD_ALLGATHER || type == COORD_ALLTOALL,
                      c.o->callback, c.o->callback_arg)) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "%s: cannot allocate a handle", c.what);
  if (st == HVD_OK)
    st = name_group(s, &c, tensors);
  for (size_t i = 0; st == HVD_OK && i < n; i++)
    st = build_entry(s, &c, &tensors[i], i, splits, h, entries);
  if (st == HVD_OK) {
    st = submit(s, entries, n, h, out); /* takes the entries and h, even when it fails */
  } else {
    destroy_entries(entries, n);
    coord_handle_destroy(h);
  }
  if (entries != one)
    free(entries);
  coord_release();
  return st;
}

HVD_API hvd_status hvd_allreduce_async(const hvd_tensor *tensor, const hvd_options *options,
                                       hvd_handle *handle) {
  return enqueue(COORD_ALLREDUCE, tensor, 1, NULL, options, handle);
}

HVD_API hvd_status hvd_grouped_allreduce_async(const hvd_tensor *tensors, size_t n,
                                               const hvd_options *options, hvd_handle *handle) {
  if (tensors == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "grouped allreduce: no tensors");
  return enqueue(COORD_ALLREDUCE, tensors, n, NULL, options, handle);
}

HVD_API hvd_status hvd_allgather_async(const hvd_tensor *tensor, const hvd_options *options,
                                       hvd_handle *handle) {
  return enqueue(COORD_ALLGATHER, tensor, 1, NULL, options, handle);
}

HVD_API hvd_status hvd_grouped_allgather_async(const hvd_tensor *tensors, size_t n,
                                               const hvd_options *options, hvd_handle *handle) {
  if (tensors == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "grouped allgather: no tensors");
  return enqueue(COORD_ALLGATHER, tensors, n, NULL, options, handle);
}

HVD_API hvd_status hvd_broadcast_async(const hvd_tensor *tensor, const hvd_options *options,
                                       hvd_handle *handle) {
  return enqueue(COORD_BROADCAST, tensor, 1, NULL, options, handle);
}

HVD_API hvd_status hvd_alltoall_async(const hvd_tensor *tensor, const int32_t *splits,
                                      const hvd_options *options, hvd_handle *handle) {
  return enqueue(COORD_ALLTOALL, tensor, 1, splits, options, handle);
}

HVD_API hvd_status hvd_reducescatter_async(const hvd_tensor *tensor, const hvd_options *options,
                                           hvd_handle *handle) {
  return enqueue(COORD_REDUCESCATTER, tensor, 1, NULL, options, handle);
}

HVD_API hvd_status hvd_grouped_reducescatter_async(const hvd_tensor *tensors, size_t n,
                                                   const hvd_options *options,
                                                   hvd_handle *handle) {
  if (tensors == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "grouped reducescatter: no tensors");
  return enqueue(COORD_REDUCESCATTER, tensors, n, NULL, options, handle);
}

/* ==== blocking forms ====================================================================== */

static hvd_status wait_handle(hvd_handle h, int64_t deadline_ns, const char *what);

static hvd_status finish(hvd_status st, hvd_handle h) {
  if (st != HVD_OK)
    return st;
  st = hvd_handle_wait(h);
  if (st != HVD_OK) {
    /* Keep the operation's message across the release. */
    char msg[HVD_ERROR_MESSAGE_MAX];
    snprintf(msg, sizeof(msg), "%s", hvd_last_error_message());
    hvd_handle_release(h);
    return hvd_error(st, "%s", msg);
  }
  hvd_handle_release(h);
  return HVD_OK;
}

HVD_API hvd_status hvd_allreduce(const hvd_tensor *tensor, const hvd_options *options) {
  hvd_handle h = NULL;
  hvd_status st = hvd_allreduce_async(tensor, options, &h);
  return finish(st, h);
}

HVD_API hvd_status hvd_grouped_allreduce(const hvd_tensor *tensors, size_t n,
                                         const hvd_options *options) {
  hvd_handle h = NULL;
  hvd_status st = hvd_grouped_allreduce_async(tensors, n, options, &h);
  return finish(st, h);
}

HVD_API hvd_status hvd_broadcast(const hvd_tensor *tensor, const hvd_options *options) {
  hvd_handle h = NULL;
  hvd_status st = hvd_broadcast_async(tensor, options, &h);
  return finish(st, h);
}

HVD_API hvd_status hvd_reducescatter(const hvd_tensor *tensor, const hvd_options *options) {
  hvd_handle h = NULL;
  hvd_status st = hvd_reducescatter_async(tensor, options, &h);
  return finish(st, h);
}

HVD_API hvd_status hvd_grouped_reducescatter(const hvd_tensor *tensors, size_t n,
                                             const hvd_options *options) {
  hvd_handle h = NULL;
  hvd_status st = hvd_grouped_reducescatter_async(tensors, n, options, &h);
  return finish(st, h);
}

HVD_API hvd_status hvd_allreduce_wait_for(const hvd_tensor *tensor, const hvd_options *options,
                                          int64_t timeout_ms, hvd_handle *pending) {
  char msg[HVD_ERROR_MESSAGE_MAX];
  hvd_handle h = NULL;
  hvd_status st;

  if (pending == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_allreduce_wait_for: no pending pointer");
  if ((st = hvd_allreduce_async(tensor, options, &h)) != HVD_OK)
    return st;
  st = wait_handle(h, hvd_deadline_after_ms(timeout_ms < 0 ? 0 : timeout_ms),
                   "hvd_allreduce_wait_for");
  if (!hvd_handle_poll(h)) { /* timed out, or a callback's thread, which cannot wait */
    *pending = h;
    return st;
  }
  *pending = NULL;
  if (st == HVD_OK) {
    hvd_handle_release(h);
    return HVD_OK;
  }
  /* Keep the operation's message across the release. */
  snprintf(msg, sizeof(msg), "%s", hvd_last_error_message());
  hvd_handle_release(h);
  return hvd_error(st, "%s", msg);
}

/* ==== control operations (join, barrier, process sets) ================================== */

/* Queues one control entry on the global set (or `set`) and waits for it;
 * *value receives the handle's value. */
static hvd_status control_op(int type, int set, const char *kind, const char *fixed_name,
                             int32_t root, const int32_t *ranks, uint32_t nranks, int *value) {
  hvd_options o = HVD_OPTIONS_INIT;
  struct coord_state *s;
  struct coord_entry *e;
  struct hvd_handle_s *h;
  struct target tg;
  char name[96];
  hvd_handle out = NULL;
  hvd_status st;

  if ((s = coord_acquire()) == NULL)
    return hvd_error_status();
  o.process_set = set;
  st = check_options(s, coord_type_name(type), &o, &tg);
  if (st != HVD_OK) {
    coord_release();
    return st;
  }
  h = handle_new(s, 1, false, NULL, NULL);
  e = h != NULL ? entry_new(type, NULL, &o, h) : NULL;
  if (e == NULL) {
    coord_handle_destroy(h);
    coord_release();
    return hvd_error(HVD_ERR_NO_MEMORY, "%s: cannot allocate an entry", coord_type_name(type));
  }
  e->req.root = root;
  if (fixed_name != NULL)
    snprintf(name, sizeof(name), "%s", fixed_name);
  else
    snprintf(name, sizeof(name), "%s.noname.%" PRIu64, kind, coord_name_number(s, set, kind));
  st = set_name(e, name);
  if (st == HVD_OK && nranks > 0) {
    if ((e->req.ranks = malloc(nranks * sizeof(*ranks))) == NULL)
      st = hvd_error(HVD_ERR_NO_MEMORY, "cannot copy a rank list");
    else
      memcpy(e->req.ranks, ranks, nranks * sizeof(*ranks));
    e->req.nranks = nranks;
  }
  if (st != HVD_OK) {
    coord_entry_destroy(e);
    coord_handle_destroy(h);
    coord_release();
    return st;
  }
  st = submit(s, &e, 1, h, &out);
  coord_release();
  if (st != HVD_OK)
    return st;
  st = hvd_handle_wait(out);
  if (st == HVD_OK && value != NULL)
    *value = out->value;
  if (st != HVD_OK) {
    char msg[HVD_ERROR_MESSAGE_MAX];
    snprintf(msg, sizeof(msg), "%s", hvd_last_error_message());
    hvd_handle_release(out);
    return hvd_error(st, "%s", msg);
  }
  hvd_handle_release(out);
  return HVD_OK;
}

HVD_API hvd_status hvd_join(int *last_joined_rank) {
  int last = -1;
  hvd_status st = control_op(COORD_JOIN, HVD_PROCESS_SET_GLOBAL, "join", COORD_JOIN_NAME, 0, NULL, 0,
                             &last);
  if (st == HVD_OK && last_joined_rank != NULL)
    *last_joined_rank = last;
  return st;
}

HVD_API hvd_status hvd_barrier(int process_set) {
  return control_op(COORD_BARRIER, process_set, "hvd.barrier", NULL, 0, NULL, 0, NULL);
}

static int compare_int32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

HVD_API hvd_status hvd_process_set_add(const int *ranks, size_t n, int *id) {
  int32_t *sorted;
  int size = hvd_size(), value = -1;
  hvd_status st;

  if (size < 0)
    return hvd_error(HVD_ERR_PRECONDITION, "hvd is not initialized (call hvd_init first)");
  if (ranks == NULL || n == 0 || n > (size_t)size)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "hvd_process_set_add: %zu ranks; a set has 1 to %d ranks", n, size);
  if ((sorted = malloc(n * sizeof(*sorted))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "hvd_process_set_add: cannot copy the ranks");
  for (size_t i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= size) {
      free(sorted);
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_process_set_add: rank %d is not in [0, %d)",
                       ranks[i], size);
    }
    sorted[i] = ranks[i];
  }
  qsort(sorted, n, sizeof(*sorted), compare_int32);
  for (size_t i = 1; i < n; i++) {
    if (sorted[i] == sorted[i - 1]) {
      int dup = sorted[i];
      free(sorted);
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_process_set_add: rank %d is listed twice",
                       dup);
    }
  }
  st = control_op(COORD_SET_ADD, HVD_PROCESS_SET_GLOBAL, "hvd.process_set_add", NULL, 0, sorted,
                  (uint32_t)n, &value);
  free(sorted);
  if (st == HVD_OK && id != NULL)
    *id = value;
  return st;
}

HVD_API hvd_status hvd_process_set_remove(int id) {
  if (id == HVD_PROCESS_SET_GLOBAL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "hvd_process_set_remove: the global process set cannot be removed");
  if (id < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_process_set_remove: %d is not a set id", id);
  return control_op(COORD_SET_REMOVE, HVD_PROCESS_SET_GLOBAL, "hvd.process_set_remove", NULL, id,
                    NULL, 0, NULL);
}

/* ==== handles ============================================================================== */

HVD_API int hvd_handle_poll(hvd_handle h) {
  return h != NULL && atomic_load_explicit(&h->done, memory_order_acquire);
}

/* Waits for h, running hvd's loop meanwhile when no other thread does. */
static hvd_status wait_handle(hvd_handle h, int64_t deadline_ns, const char *what) {
  if (!atomic_load_explicit(&h->done, memory_order_acquire)) {
    struct coord_state *s;
    if (coord_loop_driving())
      return hvd_error(HVD_ERR_PRECONDITION,
                       "%s: called from a completion callback for an operation that has not "
                       "completed (the callback runs the loop that would complete it)",
                       what);
    if ((s = coord_try_acquire()) != NULL) {
      coord_loop_drive(s, h, deadline_ns);
      coord_release();
    }
  }
  return coord_handle_wait(h, deadline_ns, h->spin_ns);
}

HVD_API hvd_status hvd_handle_wait(hvd_handle h) {
  if (h == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_handle_wait: no handle");
  return wait_handle(h, HVD_NO_DEADLINE, "hvd_handle_wait");
}

HVD_API hvd_status hvd_handle_wait_for(hvd_handle h, int64_t timeout_ms) {
  if (h == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_handle_wait_for: no handle");
  return wait_handle(h, hvd_deadline_after_ms(timeout_ms < 0 ? 0 : timeout_ms),
                     "hvd_handle_wait_for");
}

static hvd_status completed_ok(hvd_handle h, const char *what) {
  if (h == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: no handle", what);
  if (!atomic_load_explicit(&h->done, memory_order_acquire))
    return hvd_error(HVD_ERR_PRECONDITION, "%s: the operation has not completed", what);
  if (h->status != HVD_OK)
    return hvd_error(HVD_ERR_PRECONDITION, "%s: the operation failed: %s", what,
                     h->message != NULL ? h->message : hvd_strerror(h->status));
  return HVD_OK;
}

/* The index-th output of a completed, successful operation. */
static hvd_status output_at(hvd_handle h, size_t index, const char *what,
                            struct coord_output **out) {
  hvd_status st = completed_ok(h, what);
  if (st != HVD_OK)
    return st;
  if (h->noutputs == 0)
    return hvd_error(HVD_ERR_PRECONDITION,
                     "%s: only allgather and alltoall have outputs in the handle", what);
  if (index >= (size_t)h->noutputs)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: index %zu, but the handle has %d outputs",
                     what, index, h->noutputs);
  if (h->outputs[index].data == NULL)
    return hvd_error(HVD_ERR_PRECONDITION, "%s: output %zu was taken (hvd_handle_take_output)",
                     what, index);
  *out = &h->outputs[index];
  return HVD_OK;
}

static void describe_output(const struct coord_output *o, void **data, size_t *bytes,
                            int64_t *shape) {
  if (data != NULL)
    *data = o->data;
  if (bytes != NULL)
    *bytes = o->bytes;
  if (shape != NULL)
    memcpy(shape, o->shape, (size_t)o->ndims * sizeof(*shape));
}

HVD_API hvd_status hvd_handle_output_at(hvd_handle h, size_t index, void **data, size_t *bytes,
                                        int64_t *shape) {
  struct coord_output *o;
  hvd_status st = output_at(h, index, "hvd_handle_output", &o);
  if (st == HVD_OK)
    describe_output(o, data, bytes, shape);
  return st;
}

HVD_API hvd_status hvd_handle_output(hvd_handle h, void **data, size_t *bytes, int64_t *shape) {
  return hvd_handle_output_at(h, 0, data, bytes, shape);
}

HVD_API hvd_status hvd_handle_take_output(hvd_handle h, size_t index, void **data,
                                          size_t *bytes, int64_t *shape) {
  struct coord_output *o;
  hvd_status st = output_at(h, index, "hvd_handle_take_output", &o);
  if (st != HVD_OK)
    return st;
  describe_output(o, data, bytes, shape);
  o->data = NULL;
  return HVD_OK;
}

/* Outputs are host_output's posix_memalign (execute.c). */
HVD_API void hvd_output_free(void *data) { free(data); }

/* A GPU output came from the backend's alloc (gpu.c's move_output, or the
 * backend's own collectives), whose free may run on any thread. */
HVD_API void hvd_output_free_gpu(void *data) {
  const struct coord_gpu_backend *b = coord_gpu_backend();
  if (data != NULL && b != NULL)
    b->free(data);
}

HVD_API hvd_status hvd_handle_received_splits(hvd_handle h, const int32_t **splits, size_t *n) {
  hvd_status st = completed_ok(h, "hvd_handle_received_splits");
  if (st != HVD_OK)
    return st;
  if (h->recv_splits == NULL)
    return hvd_error(HVD_ERR_PRECONDITION,
                     "hvd_handle_received_splits: only alltoall has received splits");
  if (splits != NULL)
    *splits = h->recv_splits;
  if (n != NULL)
    *n = h->nsplits;
  return HVD_OK;
}

HVD_API void hvd_handle_release(hvd_handle h) {
  if (h == NULL)
    return;
  if (wait_handle(h, HVD_NO_DEADLINE, "hvd_handle_release") == HVD_ERR_PRECONDITION &&
      !atomic_load_explicit(&h->done, memory_order_acquire)) {
    /* From a callback: the loop still finishes h later, so it must live. */
    HVD_LOG_ERROR("%s; the handle is leaked", hvd_last_error_message());
    return;
  }
  coord_handle_destroy(h);
}
