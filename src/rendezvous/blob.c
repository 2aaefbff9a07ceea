/*
 * Immutable reference-counted values, shared between the store and responses.
 *
 * A store charges the values it holds to its byte limit. When it lets go of
 * one that a reader still holds (a slow client's answer, an overwritten
 * value, a stale scope body), the memory stays in use until that reader
 * lets go too, so the store hands it to its ledger: the ledger counts it
 * until the last reference goes. The ledger is reference-counted as well,
 * because a reader may outlive the store.
 */
#include <stdlib.h>
#include <string.h>

#include "rendezvous.h"

struct rdzv_ledger {
  atomic_size_t refs;
  atomic_size_t bytes;
};

struct rdzv_ledger *rdzv_ledger_create(void) {
  struct rdzv_ledger *l = malloc(sizeof(*l));
  if (l != NULL) {
    atomic_init(&l->refs, 1);
    atomic_init(&l->bytes, 0);
  }
  return l;
}

void rdzv_ledger_unref(struct rdzv_ledger *l) {
  if (l != NULL && atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) == 1)
    free(l);
}

size_t rdzv_ledger_bytes(struct rdzv_ledger *l) {
  return atomic_load_explicit(&l->bytes, memory_order_relaxed);
}

void rdzv_ledger_charge(struct rdzv_ledger *l, size_t bytes) {
  atomic_fetch_add_explicit(&l->bytes, bytes, memory_order_relaxed);
}

void rdzv_ledger_discharge(struct rdzv_ledger *l, size_t bytes) {
  atomic_fetch_sub_explicit(&l->bytes, bytes, memory_order_relaxed);
}

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
  b->ledger = NULL;
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
  if (b == NULL || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
    return;
  if (b->ledger != NULL) {
    rdzv_ledger_discharge(b->ledger, b->len);
    rdzv_ledger_unref(b->ledger);
  }
  free(b);
}

void rdzv_blob_release_to(struct rdzv_blob *b, struct rdzv_ledger *l) {
  if (b == NULL)
    return;
  /* Only the owner can make new references (under its lock), so a count of
   * one cannot grow behind our back: nobody else holds the value. */
  if (l != NULL && b->ledger == NULL &&
      atomic_load_explicit(&b->refs, memory_order_acquire) > 1) {
    atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
    rdzv_ledger_charge(l, b->len);
    b->ledger = l; /* read only by the last unref, which our unref below precedes */
  }
  rdzv_blob_unref(b);
}
