/*
 * The response cache (see coord.h for the protocol). Every rank keeps the
 * same table, bit -> single-tensor response, changed only in response-list
 * order. On the coordinator an entry also keeps the tensor's request, so a
 * worker's cache bit can be turned back into it, and a retired entry keeps
 * its contents until every rank has acknowledged the retirement.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

/* "<set>:<name>", truncated to size - 1 bytes. Built by hand: it runs for
 * every operation on every rank, several times, and snprintf costs more
 * than the rest of a map lookup. */
size_t coord_key(char *out, size_t size, int set, const char *name, size_t len) {
  char digits[12];
  unsigned v = set < 0 ? 0u - (unsigned)set : (unsigned)set;
  size_t nd = 0, n = 0;

  if (size == 0)
    return 0;
  do {
    digits[nd++] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  if (set < 0 && n + 1 < size)
    out[n++] = '-';
  while (nd > 0 && n + 1 < size)
    out[n++] = digits[--nd];
  if (n + 1 < size)
    out[n++] = ':';
  len = strnlen(name, len);
  if (len > size - 1 - n)
    len = size - 1 - n;
  memcpy(out + n, name, len);
  n += len;
  out[n] = '\0';
  return n;
}

void coord_cache_init(struct coord_cache *c, size_t capacity) {
  memset(c, 0, sizeof(*c));
  c->capacity = capacity;
  hvd_map_init(&c->by_name);
}

static void clear_entry(struct coord_cache_entry *e) {
  coord_response_fini(&e->resp);
  if (e->have_req)
    coord_request_fini(&e->req);
  memset(e, 0, sizeof(*e));
}

void coord_cache_fini(struct coord_cache *c) {
  for (size_t i = 0; i < c->nentries; i++)
    clear_entry(&c->entries[i]);
  free(c->entries);
  hvd_map_fini(&c->by_name);
  memset(c, 0, sizeof(*c));
}

bool coord_cache_eligible(const struct coord_request *req) {
  int64_t row = 1;

  if (req->group_size != 0)
    return false;
  switch (req->type) {
  case COORD_ALLREDUCE:
  case COORD_BROADCAST:
  case COORD_REDUCESCATTER:
    return true;
  case COORD_ALLGATHER:
    /* The coordinator recovers a rank's first dimension from its element
     * count, which needs rows of at least one element. */
    return req->ndims >= 1 && hvd_shape_elements(req->shape + 1, req->ndims - 1, &row) &&
           row > 0;
  default:
    return false;
  }
}

static void unmap(struct coord_cache *c, struct coord_cache_entry *e) {
  char key[COORD_KEY_MAX];
  size_t len;
  if (e->resp.names == NULL)
    return;
  len = coord_key(key, sizeof(key), e->resp.set, e->resp.names[0], strlen(e->resp.names[0]));
  if ((intptr_t)hvd_map_get(&c->by_name, key, len) == e - c->entries + 1)
    hvd_map_remove(&c->by_name, key, len);
}

int coord_cache_find(const struct coord_cache *c, int set, const char *name, size_t len) {
  char key[COORD_KEY_MAX];
  size_t klen = coord_key(key, sizeof(key), set, name, len);
  intptr_t v = (intptr_t)hvd_map_get(&c->by_name, key, klen);
  return v > 0 ? (int)(v - 1) : -1;
}

static bool same_request(const struct coord_request *a, const struct coord_request *b) {
  return a->type == b->type && a->dtype == b->dtype && a->op == b->op && a->set == b->set &&
         a->root == b->root && a->device == b->device && a->group_size == b->group_size &&
         memcmp(&a->prescale, &b->prescale, sizeof(double)) == 0 &&
         memcmp(&a->postscale, &b->postscale, sizeof(double)) == 0 && a->ndims == b->ndims &&
         memcmp(a->shape, b->shape, (size_t)a->ndims * sizeof(a->shape[0])) == 0 &&
         a->name_len == b->name_len && memcmp(a->name, b->name, a->name_len) == 0;
}

int coord_cache_hit(struct coord_cache *c, const struct coord_request *req) {
  int bit = coord_cache_find(c, req->set, req->name, req->name_len);
  const struct coord_cache_entry *e;

  if (bit < 0)
    return -1;
  e = &c->entries[bit];
  return e->state == COORD_CACHE_ACTIVE && e->have_req && same_request(&e->req, req) ? bit : -1;
}

hvd_status coord_cache_put(struct coord_cache *c, int bit, const struct coord_response *resp,
                           const struct coord_request *req, uint64_t seq) {
  struct coord_cache_entry *e;
  char key[COORD_KEY_MAX];
  size_t len;
  hvd_status st;

  if (bit < 0 || (size_t)bit >= c->capacity || resp->ntensors != 1)
    return hvd_error(HVD_ERR_PROTOCOL, "cache bit %d is outside the cache's %zu entries", bit,
                     c->capacity);
  if (c->entries == NULL && (c->entries = calloc(c->capacity, sizeof(*c->entries))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate a cache of %zu entries", c->capacity);
  e = &c->entries[bit];
  unmap(c, e);
  clear_entry(e);
  st = coord_response_copy(&e->resp, resp);
  if (st == HVD_OK && req != NULL) {
    st = coord_request_copy(&e->req, req);
    e->have_req = st == HVD_OK;
  }
  /* An inline allreduce's values belong to one step, not to the entry. */
  free(e->resp.data);
  e->resp.data = NULL;
  e->resp.data_len = 0;
  e->req.inline_len = 0;
  if (st != HVD_OK) {
    clear_entry(e);
    return st;
  }
  e->resp.cached = false;
  e->resp.bits[0] = bit;
  e->state = COORD_CACHE_ACTIVE;
  e->assigned_seq = seq;
  e->used = ++c->clock;
  len = coord_key(key, sizeof(key), resp->set, resp->names[0], strlen(resp->names[0]));
  /* A stale mapping of this name (to another bit) is replaced. */
  st = hvd_map_put(&c->by_name, key, len, (void *)(intptr_t)(bit + 1), NULL);
  if (st != HVD_OK) {
    clear_entry(e);
    return st;
  }
  if ((size_t)bit >= c->nentries)
    c->nentries = (size_t)bit + 1;
  return HVD_OK;
}

void coord_cache_drop(struct coord_cache *c, int bit) {
  if (bit < 0 || (size_t)bit >= c->nentries)
    return;
  unmap(c, &c->entries[bit]);
  clear_entry(&c->entries[bit]);
}

void coord_cache_retire(struct coord_cache *c, int bit, uint64_t seq) {
  struct coord_cache_entry *e;
  if (bit < 0 || (size_t)bit >= c->nentries)
    return;
  e = &c->entries[bit];
  if (e->state != COORD_CACHE_ACTIVE)
    return;
  unmap(c, e);
  e->state = COORD_CACHE_RETIRED;
  e->retired_seq = seq;
}

int coord_cache_take_bit(struct coord_cache *c, uint64_t min_ack, uint64_t seq, int *evicted) {
  size_t lru = SIZE_MAX;

  *evicted = -1;
  if (c->capacity == 0)
    return -1;
  for (size_t i = 0; i < c->capacity; i++) {
    struct coord_cache_entry *e = i < c->nentries ? &c->entries[i] : NULL;
    if (e == NULL || e->state == COORD_CACHE_FREE)
      return (int)i;
    if (e->state == COORD_CACHE_RETIRED && e->retired_seq <= min_ack) {
      clear_entry(e);
      return (int)i;
    }
    if (e->state == COORD_CACHE_ACTIVE && (lru == SIZE_MAX || e->used < c->entries[lru].used))
      lru = i;
  }
  /* Full: retire the least recently used; its bit is free once acknowledged. */
  if (lru != SIZE_MAX) {
    coord_cache_retire(c, (int)lru, seq);
    *evicted = (int)lru;
  }
  return -1;
}

const struct coord_cache_entry *coord_cache_entry(const struct coord_cache *c, int bit) {
  return bit >= 0 && (size_t)bit < c->nentries ? &c->entries[bit] : NULL;
}

void coord_cache_touch(struct coord_cache *c, int bit) {
  if (bit >= 0 && (size_t)bit < c->nentries)
    c->entries[bit].used = ++c->clock;
}
