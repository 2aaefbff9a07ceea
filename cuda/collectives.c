/*
 * GPU collectives with NCCL on hvd's stream: one response at a time, the
 * outputs complete when it returns.
 *
 * DESIGN. A fused allreduce packs its tensors into the device fusion
 * buffer with one batched-copy launch, scales and reduces the buffer as
 * one, and unpacks it with another launch; prescale, postscale and
 * average are kernels on the buffer (average folded into postscale, as
 * on the CPU, so integer results match). Data movement without
 * arithmetic (allgather, broadcast, alltoall) goes as bytes, so every
 * dtype works; reductions need NCCL's type, and what NCCL lacks (int16,
 * uint16) is returned as HVD_ERR_UNSUPPORTED for coord to stage through
 * host memory. Uneven allgathers are grouped broadcasts and uneven
 * reduce-scatters grouped reduces, one per rank, as NCCL's own
 * collectives need equal counts.
 */
#include <stdlib.h>
#include <string.h>

#include "gpu.h"

bool cuda_nccl_type(hvd_dtype dtype, ncclDataType_t *out) {
  switch (dtype) {
  case HVD_UINT8:
  case HVD_BOOL: *out = ncclUint8; return true;
  case HVD_INT8: *out = ncclInt8; return true;
  case HVD_INT32: *out = ncclInt32; return true;
  case HVD_INT64: *out = ncclInt64; return true;
  case HVD_FLOAT16: *out = ncclFloat16; return true;
  case HVD_BFLOAT16: *out = ncclBfloat16; return true;
  case HVD_FLOAT32: *out = ncclFloat32; return true;
  case HVD_FLOAT64: *out = ncclFloat64; return true;
  default: return false;
  }
}

bool cuda_nccl_op(hvd_dtype dtype, hvd_reduce_op op, ncclRedOp_t *out) {
  if (dtype == HVD_BOOL) { /* or and and on bytes that are 0 or 1 */
    *out = op == HVD_SUM || op == HVD_MAX ? ncclMax : ncclMin;
    return op != HVD_AVERAGE;
  }
  switch (op) {
  case HVD_SUM:
  case HVD_AVERAGE: *out = ncclSum; return true;
  case HVD_MIN: *out = ncclMin; return true;
  case HVD_MAX: *out = ncclMax; return true;
  case HVD_PRODUCT: *out = ncclProd; return true;
  default: return false;
  }
}

static size_t elements(const struct coord_entry *e) {
  int ndims;
  const int64_t *shape = coord_entry_shape(e, &ndims);
  int64_t n = 0;
  hvd_shape_elements(shape, ndims, &n);
  return (size_t)n;
}

static hvd_status scale(struct coord_gpu *g, void *buf, size_t count, hvd_dtype dtype,
                        double factor) {
  if (factor == 1.0 || count == 0)
    return HVD_OK;
  return cuda_scale(buf, count, dtype, factor, g->stream);
}

static hvd_status group_end(struct coord_gpu *g) {
  return cuda_nccl_check(g, ncclGroupEnd(), "ncclGroupEnd");
}

/* A joined rank's contribution: count identities of the op, in buf. */
static hvd_status fill_identity(struct coord_gpu *g, void *buf, size_t count, hvd_dtype dtype,
                                hvd_reduce_op op) {
  size_t bytes = count * hvd_dtype_size(dtype);
  void *host;
  hvd_status st = cuda_host_buffer(g, bytes, &host);
  if (st != HVD_OK)
    return st;
  ops_fill_identity(host, count, dtype, op);
  if ((st = cuda_copy_async(g, buf, host, bytes, cudaMemcpyHostToDevice)) != HVD_OK)
    return st;
  return cuda_wait(g, NULL, "filling a joined rank's identity");
}

/* ==== allreduce ========================================================================== */

/* NCCL's type and op for the response's; HVD_ERR_UNSUPPORTED where NCCL
 * has none (the response then goes through host staging). */
static hvd_status nccl_types(const struct coord_response *r, ncclDataType_t *type,
                             ncclRedOp_t *op) {
  hvd_dtype dtype = coord_response_dtype(r);
  hvd_reduce_op rop = coord_response_op(r);
  if (!cuda_nccl_type(dtype, type) || !cuda_nccl_op(dtype, rop, op))
    return hvd_error(HVD_ERR_UNSUPPORTED, "NCCL cannot %s %s", hvd_reduce_op_name(rop),
                     hvd_dtype_name(dtype));
  return HVD_OK;
}

/* An allreduce response, read once. */
struct reduction {
  const struct coord_response *r;
  struct gpu_comm *comm; /* NULL: hierarchical */
  hvd_dtype dtype;
  hvd_reduce_op rop;
  double prescale, postscale; /* postscale with the average's division */
  ncclDataType_t type;
  ncclRedOp_t op;
};

static hvd_status reduce(struct coord_gpu *g, const struct reduction *x, const void *in,
                         void *out, size_t count) {
  hvd_status st;
  if (x->comm != NULL)
    return cuda_nccl_check(g,
                           ncclAllReduce(in, out, count, x->type, x->op, x->comm->nccl, g->stream),
                           "ncclAllReduce");
  if (in != out && (st = cuda_copy_async(g, out, in, count * hvd_dtype_size(x->dtype),
                                         cudaMemcpyDeviceToDevice)) != HVD_OK)
    return st;
  return cuda_allreduce_hierarchical(g, out, count, x->dtype, x->rop);
}

static hvd_status allreduce_one(struct coord_gpu *g, const struct reduction *x,
                                struct coord_entry *e) {
  size_t count = (size_t)coord_response_counts(x->r)[0];
  size_t bytes = count * hvd_dtype_size(x->dtype);
  const void *in;
  void *out;
  hvd_status st;

  if (e == NULL) { /* joined */
    if ((st = cuda_fusion_buffer(g, bytes, &out)) != HVD_OK ||
        (st = fill_identity(g, out, count, x->dtype, x->rop)) != HVD_OK)
      return st;
    in = out;
  } else {
    in = coord_entry_input(e);
    out = coord_entry_output_buffer(e);
    if (x->prescale != 1.0) {
      if (in != out &&
          (st = cuda_copy_async(g, out, in, bytes, cudaMemcpyDeviceToDevice)) != HVD_OK)
        return st;
      if ((st = scale(g, out, count, x->dtype, x->prescale)) != HVD_OK)
        return st;
      in = out;
    }
  }
  if ((st = reduce(g, x, in, out, count)) != HVD_OK)
    return st;
  return scale(g, out, count, x->dtype, x->postscale);
}

/* The tensors in the fusion buffer: in (pack) or out (unpack). */
static hvd_status batch(struct coord_gpu *g, const struct coord_response *r,
                        struct coord_entry **entries, char *fb, bool pack) {
  size_t esize = hvd_dtype_size(coord_response_dtype(r)), off = 0, n = 0;
  uint32_t tensors = coord_response_ntensors(r);
  const int64_t *counts = coord_response_counts(r);
  struct gpu_copy *copies = calloc(tensors, sizeof(*copies));
  hvd_status st;
  if (copies == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot plan a fusion buffer copy");
  for (uint32_t i = 0; i < tensors; i++) {
    size_t bytes = (size_t)counts[i] * esize;
    if (entries[i] != NULL && bytes > 0) {
      copies[n].src = pack ? coord_entry_input(entries[i]) : fb + off;
      copies[n].dst = pack ? (void *)(fb + off) : coord_entry_output_buffer(entries[i]);
      copies[n].bytes = bytes;
      n++;
    }
    off += bytes;
  }
  st = cuda_batched_copy(copies, n, g->stream);
  free(copies);
  return st;
}

static hvd_status run_allreduce(struct coord_gpu *g, const struct coord_set *set,
                                const struct coord_response *r, struct coord_entry **entries) {
  struct coord_state *s = g->s;
  struct reduction x = {.r = r,
                        .dtype = coord_response_dtype(r),
                        .rop = coord_response_op(r),
                        .prescale = coord_response_prescale(r),
                        .postscale = coord_response_postscale(r)};
  uint32_t tensors = coord_response_ntensors(r);
  size_t total = 0;
  void *fb;
  bool joined = true;
  hvd_status st;

  if ((st = nccl_types(r, &x.type, &x.op)) != HVD_OK)
    return st;
  if (!cuda_hierarchical_applies(g, set) && (st = cuda_comm_for_set(g, set, &x.comm)) != HVD_OK)
    return st;
  if (x.rop == HVD_AVERAGE)
    x.postscale /= coord_set_size(set);
  coord_execute_phase(s, r, x.comm != NULL ? "NCCL_ALLREDUCE" : "NCCL_HIERARCHICAL_ALLREDUCE");
  if (tensors == 1) {
    st = allreduce_one(g, &x, entries[0]);
    return st == HVD_OK ? cuda_wait(g, x.comm, "allreduce") : st;
  }
  for (uint32_t i = 0; i < tensors; i++) {
    total += (size_t)coord_response_counts(r)[i];
    joined = joined && entries[i] == NULL;
  }
  if ((st = cuda_fusion_buffer(g, total * hvd_dtype_size(x.dtype), &fb)) != HVD_OK)
    return st;
  coord_execute_phase(s, r, "MEMCPY_IN_FUSION_BUFFER");
  st = joined ? fill_identity(g, fb, total, x.dtype, x.rop) : batch(g, r, entries, fb, true);
  if (st == HVD_OK && !joined)
    st = scale(g, fb, total, x.dtype, x.prescale);
  coord_execute_phase(s, r, x.comm != NULL ? "NCCL_ALLREDUCE" : "NCCL_HIERARCHICAL_ALLREDUCE");
  if (st == HVD_OK)
    st = reduce(g, &x, fb, fb, total);
  if (st == HVD_OK)
    st = scale(g, fb, total, x.dtype, x.postscale);
  coord_execute_phase(s, r, "MEMCPY_OUT_FUSION_BUFFER");
  if (st == HVD_OK && !joined)
    st = batch(g, r, entries, fb, false);
  return st == HVD_OK ? cuda_wait(g, x.comm, "allreduce") : st;
}

/* ==== allgather ============================================================================ */

/* Every rank's block of counts[i] elements at offsets[i] of buf (this
 * rank's is in place, or at `mine` if not NULL). */
static hvd_status gather_blocks(struct coord_gpu *g, struct gpu_comm *c, const void *mine,
                                char *buf, const size_t *counts, const size_t *offsets,
                                size_t esize) {
  bool even = true;
  hvd_status st = HVD_OK;
  for (int i = 1; i < c->size; i++)
    even = even && counts[i] == counts[0];
  if (mine == NULL)
    mine = buf + offsets[c->rank] * esize;
  if (even)
    return cuda_nccl_check(
        g, ncclAllGather(mine, buf, counts[0] * esize, ncclChar, c->nccl, g->stream),
        "ncclAllGather");
  if ((st = cuda_nccl_check(g, ncclGroupStart(), "ncclGroupStart")) != HVD_OK)
    return st;
  for (int i = 0; i < c->size && st == HVD_OK; i++) {
    char *block = buf + offsets[i] * esize;
    const void *send = i == c->rank ? mine : block;
    st = cuda_nccl_check(
        g, ncclBroadcast(send, block, counts[i] * esize, ncclChar, i, c->nccl, g->stream),
        "ncclBroadcast");
  }
  return st == HVD_OK ? group_end(g) : st;
}

/* Allocates a device output of every tensor, sized by the plan. */
static hvd_status gathered_outputs(struct coord_gpu *g, const struct coord_response *r,
                                   struct coord_entry **entries,
                                   const struct coord_gather_plan *p) {
  const struct coord_gpu_backend *b = coord_gpu_builtin();
  size_t esize = hvd_dtype_size(coord_response_dtype(r));
  hvd_status st = HVD_OK;

  for (uint32_t t = 0; t < coord_response_ntensors(r) && st == HVD_OK; t++) {
    struct coord_output *o;
    if (entries[t] == NULL)
      return hvd_error(HVD_ERR_PROTOCOL, "allgather '%s' reached a rank that did not submit it",
                       coord_response_name(r, t));
    coord_output_shape(entries[t], p->sums[t], esize);
    o = coord_gpu_output(entries[t]);
    if ((st = b->alloc(g, o->bytes, &o->data)) == HVD_OK)
      o->free = b->free;
  }
  return st;
}

/* Fused: this rank's tensors one after the other in its block, the blocks
 * gathered in place, then every part copied once to its tensor's output
 * (the plan's copies, one batch each way). */
static hvd_status gather_fused(struct coord_gpu *g, struct gpu_comm *c, int rank,
                               const struct coord_response *r, struct coord_entry **entries,
                               const struct coord_gather_plan *p) {
  size_t esize = hvd_dtype_size(coord_response_dtype(r)), parts = (size_t)p->n * p->tensors;
  const struct coord_gather_copy *mine = &p->copies[(size_t)rank * p->tensors];
  struct gpu_copy *copies = calloc(parts, sizeof(*copies));
  char *fb = NULL;
  hvd_status st = HVD_OK;

  if (copies == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot plan a fused allgather");
  if ((st = cuda_fusion_buffer(g, p->total * esize, (void **)&fb)) != HVD_OK)
    goto out;
  for (size_t t = 0; t < p->tensors; t++)
    copies[t] = (struct gpu_copy){coord_entry_input(entries[t]), fb + mine[t].src * esize,
                                  mine[t].count * esize};
  if ((st = cuda_batched_copy(copies, p->tensors, g->stream)) != HVD_OK)
    goto out;
  if ((st = gather_blocks(g, c, NULL, fb, p->block_counts, p->block_offsets, esize)) != HVD_OK)
    goto out;
  for (size_t k = 0; k < parts; k++) {
    const struct coord_gather_copy *part = &p->copies[k];
    copies[k] = (struct gpu_copy){
        fb + part->src * esize,
        (char *)coord_gpu_output(entries[part->tensor])->data + part->dst * esize,
        part->count * esize};
  }
  st = cuda_batched_copy(copies, parts, g->stream);
out:
  free(copies);
  return st;
}

static hvd_status run_allgather(struct coord_gpu *g, const struct coord_set *set,
                                const struct coord_response *r, struct coord_entry **entries) {
  struct coord_gather_plan p;
  struct gpu_comm *c = NULL;
  hvd_status st = coord_gather_plan_make(r, coord_set_size(set), &p);

  if (st == HVD_OK)
    st = cuda_comm_for_set(g, set, &c);
  if (st == HVD_OK)
    st = gathered_outputs(g, r, entries, &p);
  if (st == HVD_OK) {
    coord_execute_phase(g->s, r, "NCCL_ALLGATHER");
    if (coord_response_ntensors(r) == 1)
      st = gather_blocks(g, c, coord_entry_input(entries[0]), coord_gpu_output(entries[0])->data,
                         p.block_counts, p.block_offsets, hvd_dtype_size(coord_response_dtype(r)));
    else
      st = gather_fused(g, c, coord_set_rank(set), r, entries, &p);
  }
  if (st == HVD_OK)
    st = cuda_wait(g, c, "allgather");
  coord_gather_plan_free(&p);
  return st;
}

/* ==== broadcast, alltoall, reducescatter ===================================================== */

static hvd_status run_broadcast(struct coord_gpu *g, const struct coord_set *set,
                                const struct coord_response *r, struct coord_entry *e) {
  size_t bytes = (size_t)coord_response_counts(r)[0] * hvd_dtype_size(coord_response_dtype(r));
  struct gpu_comm *c;
  hvd_status st;
  if (e == NULL)
    return hvd_error(HVD_ERR_PROTOCOL, "broadcast '%s' reached a rank that did not submit it",
                     coord_response_name(r, 0));
  if ((st = cuda_comm_for_set(g, set, &c)) != HVD_OK)
    return st;
  coord_execute_phase(g->s, r, "NCCL_BROADCAST");
  st = cuda_nccl_check(g,
                       ncclBroadcast(coord_entry_input(e), coord_entry_output_buffer(e), bytes,
                                     ncclChar, coord_response_root(r), c->nccl, g->stream),
                       "ncclBroadcast");
  return st == HVD_OK ? cuda_wait(g, c, "broadcast") : st;
}

/* Every rank's rows to every rank, straight into the output. */
static hvd_status exchange_rows(struct coord_gpu *g, struct gpu_comm *c,
                                const struct coord_entry *e, const struct coord_alltoall_plan *p,
                                size_t row_bytes, char *out) {
  const char *in = coord_entry_input(e);
  const int32_t *splits = coord_entry_splits(e);
  size_t send_off = 0, recv_off = 0;
  hvd_status st = cuda_nccl_check(g, ncclGroupStart(), "ncclGroupStart");

  for (int i = 0; i < c->size && st == HVD_OK; i++) {
    size_t out_len = (size_t)splits[i] * row_bytes, in_len = (size_t)p->recv_splits[i] * row_bytes;
    st = cuda_nccl_check(g, ncclSend(in + send_off, out_len, ncclChar, i, c->nccl, g->stream),
                         "ncclSend");
    if (st == HVD_OK)
      st = cuda_nccl_check(g, ncclRecv(out + recv_off, in_len, ncclChar, i, c->nccl, g->stream),
                           "ncclRecv");
    send_off += out_len;
    recv_off += in_len;
  }
  return st == HVD_OK ? group_end(g) : st;
}

static hvd_status run_alltoall(struct coord_gpu *g, const struct coord_set *set,
                               const struct coord_response *r, struct coord_entry *e) {
  const struct coord_gpu_backend *b = coord_gpu_builtin();
  size_t esize = hvd_dtype_size(coord_response_dtype(r));
  struct coord_alltoall_plan p = {0};
  struct coord_output *o;
  struct gpu_comm *c;
  hvd_status st;

  if (e == NULL)
    return hvd_error(HVD_ERR_PROTOCOL, "alltoall '%s' reached a rank that did not submit it",
                     coord_response_name(r, 0));
  if ((st = cuda_comm_for_set(g, set, &c)) != HVD_OK)
    return st;
  coord_execute_phase(g->s, r, "NCCL_ALLTOALL");
  if ((st = coord_alltoall_exchange(g->s, set, r, e, &p)) != HVD_OK)
    return st;
  coord_output_shape(e, p.rows * p.row, esize);
  o = coord_gpu_output(e);
  o->shape[0] = p.rows;
  if ((st = b->alloc(g, o->bytes, &o->data)) == HVD_OK) {
    o->free = b->free;
    st = exchange_rows(g, c, e, &p, (size_t)p.row * esize, o->data);
  }
  if (st == HVD_OK)
    st = cuda_wait(g, c, "alltoall");
  if (st == HVD_OK)
    coord_alltoall_done(&p, e, coord_set_size(set));
  coord_alltoall_plan_free(&p);
  return st;
}

static hvd_status run_reducescatter(struct coord_gpu *g, const struct coord_set *set,
                                    const struct coord_response *r, struct coord_entry *e) {
  int n = coord_set_size(set), ndims;
  hvd_dtype dtype = coord_response_dtype(r);
  size_t esize = hvd_dtype_size(dtype), total, off = 0, rows;
  int64_t row;
  double prescale = coord_response_prescale(r), postscale = coord_response_postscale(r);
  void *out;
  ncclDataType_t type;
  ncclRedOp_t op;
  struct gpu_comm *c;
  const void *in;
  bool even = true;
  hvd_status st;

  if (e == NULL)
    return hvd_error(HVD_ERR_PROTOCOL, "reducescatter '%s' reached a rank that did not submit it",
                     coord_response_name(r, 0));
  if ((st = nccl_types(r, &type, &op)) != HVD_OK || (st = cuda_comm_for_set(g, set, &c)) != HVD_OK)
    return st;
  total = elements(e);
  rows = (size_t)coord_entry_shape(e, &ndims)[0];
  row = rows > 0 ? (int64_t)(total / rows) : 0;
  in = coord_entry_input(e);
  out = coord_entry_output_buffer(e);
  coord_execute_phase(g->s, r, "NCCL_REDUCESCATTER");
  if (prescale != 1.0) { /* the input is the caller's: scale a copy */
    void *fb;
    if ((st = cuda_fusion_buffer(g, total * esize, &fb)) != HVD_OK ||
        (st = cuda_copy_async(g, fb, in, total * esize, cudaMemcpyDeviceToDevice)) != HVD_OK ||
        (st = scale(g, fb, total, dtype, prescale)) != HVD_OK)
      return st;
    in = fb;
  }
  for (int i = 1; i < n; i++)
    even = even && ops_share_count(rows, n, i) == ops_share_count(rows, n, 0);
  if (even) {
    st = cuda_nccl_check(g,
                         ncclReduceScatter(in, out, ops_share_count(rows, n, 0) * (size_t)row,
                                           type, op, c->nccl, g->stream),
                         "ncclReduceScatter");
  } else if ((st = cuda_nccl_check(g, ncclGroupStart(), "ncclGroupStart")) == HVD_OK) {
    for (int i = 0; i < n && st == HVD_OK; i++) {
      size_t count = ops_share_count(rows, n, i) * (size_t)row;
      st = cuda_nccl_check(g,
                           ncclReduce((const char *)in + off * esize, out, count, type, op, i,
                                      c->nccl, g->stream),
                           "ncclReduce");
      off += count;
    }
    if (st == HVD_OK)
      st = group_end(g);
  }
  if (coord_response_op(r) == HVD_AVERAGE)
    postscale /= n;
  if (st == HVD_OK)
    st = scale(g, out, ops_share_count(rows, n, coord_set_rank(set)) * (size_t)row, dtype,
               postscale);
  return st == HVD_OK ? cuda_wait(g, c, "reducescatter") : st;
}

/* ==== dispatch ================================================================================ */

hvd_status cuda_execute(struct coord_gpu *g, const struct coord_set *set,
                       const struct coord_response *r, struct coord_entry **entries) {
  hvd_status st = cuda_use_device(g);
  if (st != HVD_OK)
    return st;
  switch (coord_response_type(r)) {
  case COORD_ALLREDUCE: return run_allreduce(g, set, r, entries);
  case COORD_ALLGATHER: return run_allgather(g, set, r, entries);
  case COORD_BROADCAST: return run_broadcast(g, set, r, entries[0]);
  case COORD_ALLTOALL: return run_alltoall(g, set, r, entries[0]);
  case COORD_REDUCESCATTER: return run_reducescatter(g, set, r, entries[0]);
  default:
    return hvd_error(HVD_ERR_UNSUPPORTED, "%s has no GPU implementation",
                     coord_type_name(coord_response_type(r)));
  }
}
