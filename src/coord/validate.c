/*
 * What ranks must agree on for one operation (the coordinator checks each
 * request against the first one submitted under the name). The message
 * names both ranks and both values; the coordinator prefixes the
 * operation and the tensor.
 */
#include <stdio.h>
#include <string.h>

#include "coord.h"

static void format_shape(const struct coord_request *r, char *out, size_t size) {
  size_t len = 0;
  out[0] = '\0';
  len += (size_t)snprintf(out, size, "[");
  for (int i = 0; i < r->ndims && len < size; i++)
    len += (size_t)snprintf(out + len, size - len, "%s%lld", i ? ", " : "", (long long)r->shape[i]);
  if (len < size)
    snprintf(out + len, size - len, "]");
}

static void format_device(int device, char *out, size_t size) {
  if (device == HVD_DEVICE_CPU)
    snprintf(out, size, "CPU");
  else
    snprintf(out, size, "GPU %d", device);
}

static bool same_dims(const struct coord_request *a, const struct coord_request *b, int from) {
  if (a->ndims != b->ndims)
    return false;
  for (int i = from; i < a->ndims; i++) {
    if (a->shape[i] != b->shape[i])
      return false;
  }
  return true;
}

static bool same_shape(const struct coord_request *first, const struct coord_request *req,
                       char *msg, size_t size) {
  char x[256], y[256];
  if (same_dims(first, req, 0))
    return true;
  format_shape(first, x, sizeof(x));
  format_shape(req, y, sizeof(y));
  snprintf(msg, size, "mismatched shapes: rank %d sent %s, rank %d sent %s", first->rank, x,
           req->rank, y);
  return false;
}

/* SET_ADD: the same ranks; SET_REMOVE: the same set. */
static bool same_set_change(const struct coord_request *first, const struct coord_request *req,
                            char *msg, size_t size) {
  int a = first->rank, b = req->rank;

  if (first->type == COORD_SET_ADD &&
      (first->nranks != req->nranks ||
       memcmp(first->ranks, req->ranks, first->nranks * sizeof(*first->ranks)) != 0)) {
    snprintf(msg, size, "mismatched process sets: rank %d registers %u ranks, rank %d %u ranks%s",
             a, first->nranks, b, req->nranks,
             first->nranks == req->nranks ? " (different ones)" : "");
    return false;
  }
  if (first->type == COORD_SET_REMOVE && first->root != req->root) {
    snprintf(msg, size, "mismatched process sets: rank %d removes set %d, rank %d set %d", a,
             first->root, b, req->root);
    return false;
  }
  return true;
}

/* What every tensor collective agrees on: dtype, kind of device, group. */
static bool same_tensor_kind(const struct coord_request *first, const struct coord_request *req,
                             char *msg, size_t size) {
  int a = first->rank, b = req->rank;
  char x[256], y[256];

  if (first->dtype != req->dtype) {
    snprintf(msg, size, "mismatched data types: rank %d sent %s, rank %d sent %s", a,
             hvd_dtype_name(first->dtype), b, hvd_dtype_name(req->dtype));
    return false;
  }
  if (!coord_same_device_kind(first->device, req->device)) {
    format_device(first->device, x, sizeof(x));
    format_device(req->device, y, sizeof(y));
    snprintf(msg, size, "mismatched devices: rank %d's tensor is on %s, rank %d's on %s", a, x, b,
             y);
    return false;
  }
  if (first->group_size != req->group_size || first->group_len != req->group_len ||
      (first->group_len > 0 && memcmp(first->group, req->group, first->group_len) != 0)) {
    snprintf(msg, size,
             "mismatched groups: rank %d submitted it in group '%s' of %u tensors, rank %d in "
             "group '%s' of %u",
             a, first->group ? first->group : "(none)", first->group_size, b,
             req->group ? req->group : "(none)", req->group_size);
    return false;
  }
  return true;
}

/* What each collective adds: the reduction and scale factors, the root,
 * the shape (all of it, or all but the first dimension). */
static bool same_type_params(const struct coord_request *first, const struct coord_request *req,
                             char *msg, size_t size) {
  int a = first->rank, b = req->rank;
  char x[256], y[256];

  switch (first->type) {
  case COORD_ALLREDUCE:
  case COORD_REDUCESCATTER:
    if (first->op != req->op) {
      snprintf(msg, size, "mismatched reduction operations: rank %d asked for %s, rank %d for %s",
               a, hvd_reduce_op_name(first->op), b, hvd_reduce_op_name(req->op));
      return false;
    }
    if (memcmp(&first->prescale, &req->prescale, sizeof(double)) != 0 ||
        memcmp(&first->postscale, &req->postscale, sizeof(double)) != 0) {
      snprintf(msg, size,
               "mismatched scale factors: rank %d has prescale %g and postscale %g, rank %d "
               "prescale %g and postscale %g",
               a, first->prescale, first->postscale, b, req->prescale, req->postscale);
      return false;
    }
    return same_shape(first, req, msg, size);
  case COORD_BROADCAST:
    if (first->root != req->root) {
      snprintf(msg, size, "mismatched broadcast roots: rank %d named root %d, rank %d root %d", a,
               first->root, b, req->root);
      return false;
    }
    return same_shape(first, req, msg, size);
  case COORD_ALLGATHER:
  case COORD_ALLTOALL:
    if (!same_dims(first, req, 1)) {
      format_shape(first, x, sizeof(x));
      format_shape(req, y, sizeof(y));
      snprintf(msg, size,
               "mismatched shapes: rank %d sent %s, rank %d sent %s (only the first dimension "
               "may differ)",
               a, x, b, y);
      return false;
    }
    return true;
  default:
    return true;
  }
}

bool coord_validate(const struct coord_request *first, const struct coord_request *req,
                    char *msg, size_t size) {
  if (first->type != req->type) {
    snprintf(msg, size, "mismatched operations: rank %d submitted %s, rank %d %s", first->rank,
             coord_type_name(first->type), req->rank, coord_type_name(req->type));
    return false;
  }
  switch (first->type) {
  case COORD_JOIN:
  case COORD_BARRIER:
    return true;
  case COORD_SET_ADD:
  case COORD_SET_REMOVE:
    return same_set_change(first, req, msg, size);
  default:
    return same_tensor_kind(first, req, msg, size) && same_type_params(first, req, msg, size);
  }
}
