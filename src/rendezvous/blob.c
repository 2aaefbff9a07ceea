/* Immutable reference-counted values, shared between the store and responses. */
#include <stdlib.h>
#include <string.h>

#include "rendezvous.h"

struct rdzv_blob *rdzv_blob_create(const void *data, size_t len, uint64_t version) {
  struct rdzv_blob *b;

  if (len > SIZE_MAX - sizeof(*b) - 1)
    return NULL;
  b = malloc(sizeof(*b) + len + 1);
  if (b == NULL)
    return NULL;
  atomic_init(&b->refs, 1);
  b->version = version;
  b->len = len;
  if (len > 0 && data != NULL)
    memcpy(b->data, data, len);
  b->data[len] = '\0';
  return b;
}

struct rdzv_blob *rdzv_blob_ref(struct rdzv_blob *b) {
  if (b != NULL)
    atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  return b;
}

void rdzv_blob_unref(struct rdzv_blob *b) {
  if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
    free(b);
}
