/*
 * The coordinator's table: which ranks have submitted which operation.
 *
 * DESIGN. Global rank 0 keeps one table for every process set, keyed by
 * set and name, so that one total order covers all sets: every rank runs
 * the responses in the order rank 0 sends them, and ranks in two sets can
 * never wait on each other in opposite orders. A request is checked
 * against the first one submitted under its name as it arrives; the first
 * disagreement is kept and becomes an error response once the operation is
 * ready, so every rank that submitted it fails it, with the same message,
 * and the job goes on. An operation is ready when every member of its set
 * that has not joined has submitted it. Ready operations wait in a FIFO
 * (grouped ones until their whole group is ready) for dispatch.c.
 * An operation whose name has an active cache bit is kept under that bit
 * (by_bit) rather than its name: every submission of it is then found
 * without a key, and a bit that retires hands its operation to the name
 * table first, where later submissions (no longer hits) look. Finished
 * entries are kept for reuse (PENDING_SPARES).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller_private.h"

/* ==== process sets, as the coordinator sees them ==================================== */

static hvd_status set_put(struct coord_controller *c, int id, const int32_t *ranks, int n) {
  int32_t *copy = malloc((size_t)(n ? n : 1) * sizeof(*copy));

  if (copy == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot record process set %d", id);
  if (id >= c->nsets) {
    size_t cap = (size_t)c->nsets;
    if (hvd_array_reserve(&c->sets, &cap, (size_t)id + 1, sizeof(*c->sets), 8) != HVD_OK) {
      free(copy);
      return hvd_error_prefix("cannot record process set %d", id);
    }
    memset(c->sets + c->nsets, 0, (cap - (size_t)c->nsets) * sizeof(*c->sets)); /* unused */
    c->nsets = (int)cap;
  }
  memcpy(copy, ranks, (size_t)n * sizeof(*copy));
  free(c->sets[id].ranks);
  c->sets[id] = (struct ctl_set){.used = true, .ranks = copy, .size = n};
  return HVD_OK;
}

int coord_ctl_set_rank(const struct ctl_set *set, int rank) {
  int lo = 0, hi = set->size - 1;
  while (lo <= hi) {
    int mid = lo + (hi - lo) / 2;
    if (set->ranks[mid] == rank)
      return mid;
    if (set->ranks[mid] < rank)
      lo = mid + 1;
    else
      hi = mid - 1;
  }
  return -1;
}

/* ==== lifetime ========================================================================= */

hvd_status coord_controller_create(struct coord_state *s, struct coord_controller **out) {
  struct coord_controller *c = calloc(1, sizeof(*c));
  int32_t *all = NULL;
  bool grants;
  hvd_status st;

  if (c == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the coordinator");
  c->s = s;
  c->size = s->size;
  c->next_seq = 1;
  c->last_joined = -1;
  hvd_map_init(&c->table);
  hvd_map_init(&c->groups);
  c->joined = calloc((size_t)s->size, sizeof(*c->joined));
  c->acks = calloc((size_t)s->size, sizeof(*c->acks));
  all = malloc((size_t)s->size * sizeof(*all));
  /* Lanes are granted where they exist and waiting ranks spin. */
  grants = s->lanes != NULL && s->cfg.lanes && s->cfg.spin_ns > 0;
  if (grants)
    c->lane_grants = calloc(COORD_LANES, sizeof(*c->lane_grants));
  if (c->joined == NULL || c->acks == NULL || all == NULL || (grants && c->lane_grants == NULL)) {
    free(all);
    coord_controller_destroy(c);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the coordinator for %d ranks", s->size);
  }
  for (int r = 0; r < s->size; r++)
    all[r] = r;
  st = set_put(c, HVD_PROCESS_SET_GLOBAL, all, s->size);
  free(all);
  if (st != HVD_OK) {
    coord_controller_destroy(c);
    return st;
  }
  *out = c;
  return HVD_OK;
}

/* What p holds but its buffers (name_buf, inline_vals). */
static void destroy_contents(struct pending *p) {
  p->first.name = NULL; /* name_buf */
  coord_request_fini(&p->first);
  if (p->submitted != p->submitted_here)
    free(p->submitted);
  free(p->elements);
  free(p->error);
}

void coord_ctl_pending_destroy(struct pending *p) {
  if (p == NULL)
    return;
  destroy_contents(p);
  free(p->inline_vals);
  free(p->name_buf);
  free(p);
}

enum { PENDING_SPARES = 16 };

struct pending *coord_ctl_pending_new(struct coord_controller *c) {
  struct pending *p = c->spares;

  if (p == NULL) {
    if ((p = calloc(1, sizeof(*p))) != NULL)
      p->bit = -1;
    return p;
  }
  c->spares = p->next;
  c->nspares--;
  p->next = NULL;
  return p;
}

void coord_ctl_pending_release(struct coord_controller *c, struct pending *p) {
  unsigned char *vals;
  char *name;
  size_t vals_cap, name_cap;

  if (p == NULL)
    return;
  if (c->nspares >= PENDING_SPARES) {
    coord_ctl_pending_destroy(p);
    return;
  }
  /* Emptied now, so that a spare holds nothing but its buffers, whose
   * bytes are written before they are read. */
  destroy_contents(p);
  vals = p->inline_vals;
  vals_cap = p->inline_cap;
  name = p->name_buf;
  name_cap = p->name_cap;
  memset(p, 0, sizeof(*p));
  p->inline_vals = vals;
  p->inline_cap = vals_cap;
  p->name_buf = name;
  p->name_cap = name_cap;
  p->bit = -1;
  p->next = c->spares;
  c->spares = p;
  c->nspares++;
}

void coord_controller_destroy(struct coord_controller *c) {
  struct hvd_map_iter it = {0};
  const char *key;
  size_t klen;
  void *value;

  if (c == NULL)
    return;
  while (c->head != NULL) {
    struct pending *p = c->head;
    coord_ctl_unlink(c, p);
    coord_ctl_pending_destroy(p);
  }
  while (c->ready_head != NULL) {
    struct pending *p = c->ready_head;
    c->ready_head = p->next_ready;
    coord_ctl_pending_destroy(p);
  }
  while (hvd_map_iter_next(&c->groups, &it, &key, &klen, &value)) {
    struct group_wait *g = value;
    for (int i = 0; i < g->count; i++)
      coord_ctl_pending_destroy(g->members[i]);
    free(g->members);
    free(g);
  }
  hvd_map_fini(&c->groups);
  hvd_map_fini(&c->table);
  for (int i = 0; i < c->nsets; i++)
    free(c->sets[i].ranks);
  free(c->sets);
  free(c->joined);
  free(c->acks);
  free(c->retired);
  free(c->singles);
  free(c->single_bytes);
  free(c->light);
  free(c->light_bits);
  free(c->light_data);
  free(c->light_lanes);
  free(c->lane_grants);
  free(c->by_bit);
  while (c->spares != NULL) {
    struct pending *p = c->spares;
    c->spares = p->next;
    coord_ctl_pending_destroy(p);
  }
  free(c);
}

/* ==== the table ========================================================================== */

static size_t pending_key(const struct pending *p, char *key, size_t size) {
  return coord_key(key, size, p->first.set, p->first.name, p->first.name_len);
}

void coord_ctl_unlink(struct coord_controller *c, struct pending *p) {
  char key[COORD_KEY_MAX];

  if (!p->in_table)
    return;
  if (p->bit >= 0)
    c->by_bit[p->bit] = NULL;
  else
    hvd_map_remove(&c->table, key, pending_key(p, key, sizeof(key)));
  if (p->prev != NULL)
    p->prev->next = p->next;
  else
    c->head = p->next;
  if (p->next != NULL)
    p->next->prev = p->prev;
  else
    c->tail = p->prev;
  p->prev = p->next = NULL;
  p->in_table = false;
  c->npending--;
}

size_t coord_ctl_pending_bytes(const struct pending *p) {
  int64_t n = 0;
  size_t esize = hvd_dtype_size(p->first.dtype);

  if (p->first.type == COORD_ALLGATHER && p->elements != NULL) {
    for (int i = 0; i < p->set_size; i++)
      n += p->elements[i];
  } else if (!hvd_shape_elements(p->first.shape, p->first.ndims, &n)) {
    n = 0;
  }
  return (size_t)n * esize;
}

void coord_ctl_push_ready(struct coord_controller *c, struct pending *p) {
  p->next_ready = NULL;
  if (c->ready_tail != NULL)
    c->ready_tail->next_ready = p;
  else
    c->ready_head = p;
  c->ready_tail = p;
  if (c->nready++ == 0)
    c->oldest_ready_ns = hvd_now_ns();
  c->ready_bytes += coord_ctl_pending_bytes(p);
}

/* A ready operation goes to the FIFO, or waits for the rest of its group. */
static void make_ready(struct coord_controller *c, struct pending *p) {
  char key[COORD_KEY_MAX];
  size_t klen;
  struct group_wait *g;

  coord_ctl_unlink(c, p);
  if (c->s->timeline != NULL) /* negotiated: waits for its turn to run */
    coord_timeline_begin(c->s->timeline, p->first.name, "QUEUE");
  if (p->first.group_size == 0) {
    coord_ctl_push_ready(c, p);
    return;
  }
  klen = coord_key(key, sizeof(key), p->first.set, p->first.group, p->first.group_len);
  g = hvd_map_get(&c->groups, key, klen);
  if (g == NULL) {
    g = calloc(1, sizeof(*g));
    if (g != NULL)
      g->members = calloc(p->first.group_size, sizeof(*g->members));
    if (g == NULL || g->members == NULL || hvd_map_put(&c->groups, key, klen, g, NULL) != HVD_OK) {
      /* Out of memory: run it alone rather than lose it. */
      if (g != NULL)
        free(g->members);
      free(g);
      coord_ctl_push_ready(c, p);
      return;
    }
    g->size = (int)p->first.group_size;
  }
  g->members[g->count++] = p;
  if (g->count < g->size)
    return;
  hvd_map_remove(&c->groups, key, klen);
  for (int i = 0; i < g->count; i++)
    coord_ctl_push_ready(c, g->members[i]);
  free(g->members);
  free(g);
}

bool coord_ctl_is_ready(const struct coord_controller *c, const struct pending *p) {
  const struct ctl_set *set;

  if (c->njoined == 0)
    return p->count >= p->set_size;
  set = &c->sets[p->first.set];
  for (int i = 0; i < set->size; i++) {
    if (!(p->submitted[i / 8] & (1u << (i % 8))) && !c->joined[set->ranks[i]])
      return false;
  }
  return true;
}

/* Makes req p's first submission. Its name is copied into p's buffer, so
 * that a borrowed request (a cache hit's, rank 0's own) is kept without
 * an allocation; what else it holds (a group, a rank list) is taken when
 * owned (req is left empty), else copied. False when out of memory. */
static bool keep_first(struct pending *p, struct coord_request *req, bool owned) {
  struct coord_request rest = *req;
  size_t len = req->name_len;

  if (hvd_array_reserve(&p->name_buf, &p->name_cap, len + 1, 1, 64) != HVD_OK) {
    hvd_error_clear(); /* the caller says what it drops */
    return false;
  }
  rest.name = NULL;
  rest.name_len = 0;
  if (!owned && coord_request_copy(&p->first, &rest) != HVD_OK) {
    hvd_error_clear();
    return false;
  }
  memcpy(p->name_buf, req->name, len);
  p->name_buf[len] = '\0';
  if (owned) {
    p->first = rest;
    free(req->name);
    memset(req, 0, sizeof(*req));
  }
  p->first.name = p->name_buf;
  p->first.name_len = (uint32_t)len;
  return true;
}

/* An operation that fails at once (an unknown set): ready with its error. */
static void fail_now(struct coord_controller *c, struct coord_request *req, uint8_t status,
                     const char *why) {
  struct pending *p = coord_ctl_pending_new(c);
  char msg[HVD_ERROR_MESSAGE_MAX];

  if (p == NULL || !keep_first(p, req, true)) {
    coord_ctl_pending_destroy(p);
    coord_request_fini(req);
    return;
  }
  p->first.group_size = 0; /* it fails alone */
  free(p->first.group);
  p->first.group = NULL;
  p->first.group_len = 0;
  snprintf(msg, sizeof(msg), "%s '%.256s': %s", coord_type_name(p->first.type), p->first.name,
           why);
  p->error = hvd_strndup(msg, strlen(msg));
  p->error_status = status;
  coord_ctl_push_ready(c, p);
}

/* Keeps a submission's inline input, or marks the operation as one that
 * runs its collective (a rank sent none, or a length that does not fit). */
static void keep_inline(struct pending *p, const struct coord_request *req, int srank,
                        int64_t elements) {
  size_t want = (size_t)elements * hvd_dtype_size(req->dtype);

  if (p->inline_broken)
    return;
  if (req->type != COORD_ALLREDUCE || req->inline_len == 0 || req->inline_len != want ||
      (p->inline_len != 0 && req->inline_len != p->inline_len)) {
    p->inline_broken = true;
    return;
  }
  if (p->inline_len == 0) { /* the first input: room for every set rank's */
    size_t need = (size_t)p->set_size * req->inline_len;
    if (hvd_array_reserve(&p->inline_vals, &p->inline_cap, need, 1, need) != HVD_OK) {
      p->inline_broken = true;
      return;
    }
    p->inline_len = req->inline_len;
  }
  memcpy(p->inline_vals + (size_t)srank * p->inline_len, req->inline_data, req->inline_len);
}

/* Whether two submissions describe the same operation (the cache's view:
 * an allgather's first dimension may differ). */
static bool same_params(const struct coord_request *a, const struct coord_request *b) {
  int from = a->type == COORD_ALLGATHER ? 1 : 0;
  if (a->type != b->type || a->dtype != b->dtype || a->op != b->op || a->root != b->root ||
      !coord_same_device_kind(a->device, b->device) || a->ndims != b->ndims ||
      a->group_size != b->group_size ||
      memcmp(&a->prescale, &b->prescale, sizeof(double)) != 0 ||
      memcmp(&a->postscale, &b->postscale, sizeof(double)) != 0)
    return false;
  for (int i = from; i < a->ndims; i++) {
    if (a->shape[i] != b->shape[i])
      return false;
  }
  return true;
}

/* The pending entry kept under a bit that retires moves to the table,
 * where the name's later submissions (no longer cache hits) look. */
static void move_to_table(struct coord_controller *c, int bit) {
  struct pending *p = c->by_bit != NULL ? c->by_bit[bit] : NULL;
  char key[COORD_KEY_MAX];

  if (p == NULL)
    return;
  if (hvd_map_put(&c->table, key, pending_key(p, key, sizeof(key)), p, NULL) != HVD_OK) {
    HVD_LOG_ERROR("out of memory in the coordinator: '%s' may never complete", p->first.name);
    return;
  }
  c->by_bit[bit] = NULL;
  p->bit = -1;
}

void coord_ctl_retire(struct coord_controller *c, int bit) {
  move_to_table(c, bit);
  if (hvd_array_reserve(&c->retired, &c->retired_cap, (size_t)c->nretired + 1,
                        sizeof(*c->retired), 16) != HVD_OK)
    return; /* the bit stays retired on the coordinator only: workers keep a harmless entry */
  coord_cache_retire(&c->s->cache, bit, c->next_seq);
  c->retired[c->nretired++] = bit;
  /* The retirement closes its lane everywhere; the bit's next tensor starts afresh. */
  if (c->lane_grants != NULL && bit < COORD_LANES)
    memset(&c->lane_grants[bit], 0, sizeof(c->lane_grants[bit]));
}

static void submit_join(struct coord_controller *c, struct coord_request *req) {
  int rank = req->rank;

  coord_request_fini(req);
  if (c->joined[rank])
    return;
  c->joined[rank] = true;
  c->njoined++;
  c->last_joined = rank;
  /* Operations that only waited for this rank are ready now. */
  for (struct pending *p = c->head; p != NULL;) {
    struct pending *next = p->next;
    if (coord_ctl_is_ready(c, p))
      make_ready(c, p);
    p = next;
  }
  if (c->njoined == c->size)
    c->join_due = true;
}

/* req's set as the coordinator knows it, and req's rank in it (*srank);
 * NULL when there is no such set or the rank is not in it. */
static const struct ctl_set *find_member(const struct coord_controller *c,
                                         const struct coord_request *req, int *srank) {
  if (req->set < 0 || req->set >= c->nsets || !c->sets[req->set].used)
    return NULL;
  if ((*srank = coord_ctl_set_rank(&c->sets[req->set], req->rank)) < 0)
    return NULL;
  return &c->sets[req->set];
}

/* Fails req at once: its set does not exist, or its rank is not in it. */
static void fail_not_member(struct coord_controller *c, struct coord_request *req) {
  char msg[128];

  if (req->set < 0 || req->set >= c->nsets || !c->sets[req->set].used)
    snprintf(msg, sizeof(msg), "process set %d does not exist", req->set);
  else
    snprintf(msg, sizeof(msg), "rank %d is not in process set %d", req->rank, req->set);
  fail_now(c, req, HVD_ERR_INVALID_ARGUMENT, msg);
}

/* A cached operation submitted with other parameters leaves the cache.
 * Returns the bit of the operation's active cache entry, or -1. */
static int retire_if_changed(struct coord_controller *c, const struct coord_request *req) {
  struct coord_cache *cache = &c->s->cache;
  int bit;
  const struct coord_cache_entry *e;

  if (cache->capacity == 0)
    return -1;
  bit = coord_cache_find(cache, req->set, req->name, req->name_len);
  e = coord_cache_entry(cache, bit);
  if (e == NULL || e->state != COORD_CACHE_ACTIVE || !e->have_req)
    return -1;
  if (same_params(&e->req, req))
    return bit;
  coord_ctl_retire(c, bit);
  return -1;
}

/* The timeline's negotiation phase: NEGOTIATE_ALLREDUCE, ... */
static void begin_negotiation(struct coord_timeline *t, const struct pending *p) {
  char phase[64];

  if (!coord_timeline_active(t)) /* every operation passes here: no formatting for nothing */
    return;
  snprintf(phase, sizeof(phase), "NEGOTIATE_%s", coord_type_name(p->first.type));
  for (char *q = phase; *q; q++)
    *q = (char)(*q >= 'a' && *q <= 'z' ? *q - 32 : *q);
  coord_timeline_begin(t, p->first.name, phase);
}

/* A new table entry for the first submission of an operation, req, which
 * it takes when owned and copies otherwise (keep_first); NULL (the
 * operation dropped) when out of memory. */
static struct pending *open_pending(struct coord_controller *c, struct coord_request *req,
                                    bool owned, const struct ctl_set *set, int hit) {
  struct pending *p = coord_ctl_pending_new(c);
  char key[COORD_KEY_MAX];

  if (p != NULL) /* a set of up to 511 ranks needs no allocation of its own */
    p->submitted = (size_t)set->size / 8 + 1 <= sizeof(p->submitted_here)
                       ? p->submitted_here
                       : calloc((size_t)set->size / 8 + 1, 1);
  if (p == NULL || p->submitted == NULL ||
      (req->type == COORD_ALLGATHER &&
       (p->elements = calloc((size_t)set->size, sizeof(*p->elements))) == NULL) ||
      !keep_first(p, req, owned)) {
    coord_ctl_pending_destroy(p);
    HVD_LOG_ERROR("out of memory in the coordinator: dropping '%s'", req->name);
    return NULL;
  }
  p->set_size = set->size;
  p->first_ns = hvd_coarse_now_ns(); /* for stall warnings, seconds later */
  if (hit >= 0) {
    c->by_bit[hit] = p;
    p->bit = hit;
  } else if (hvd_map_put(&c->table, key, pending_key(p, key, sizeof(key)), p, NULL) != HVD_OK) {
    coord_ctl_pending_destroy(p);
    HVD_LOG_ERROR("out of memory in the coordinator: dropping an operation");
    return NULL;
  }
  p->in_table = true;
  p->prev = c->tail;
  if (c->tail != NULL)
    c->tail->next = p;
  else
    c->head = p;
  c->tail = p;
  c->npending++;
  if (c->s->timeline != NULL)
    begin_negotiation(c->s->timeline, p);
  return p;
}

/* A later submission: the first disagreement with the first one is kept
 * (it fails the operation on every rank once ready). Returns false for a
 * rank's second submission, which is dropped. */
static bool check_again(struct pending *p, const struct coord_request *req, int srank) {
  char msg[HVD_ERROR_MESSAGE_MAX], full[HVD_ERROR_MESSAGE_MAX];

  if (p->error == NULL && !coord_validate(&p->first, req, msg, sizeof(msg))) {
    snprintf(full, sizeof(full), "%s '%.256s': %.700s", coord_type_name(p->first.type),
             p->first.name, msg);
    p->error = hvd_strndup(full, strlen(full));
    p->error_status = HVD_ERR_MISMATCH;
  }
  if (!(p->submitted[srank / 8] & (1u << (srank % 8))))
    return true;
  snprintf(msg, sizeof(msg), "%s '%.256s': rank %d submitted it twice",
           coord_type_name(p->first.type), p->first.name, req->rank);
  HVD_LOG_ERROR("%s", msg);
  if (p->error == NULL) {
    p->error = hvd_strndup(msg, strlen(msg));
    p->error_status = HVD_ERR_PROTOCOL;
  }
  return false;
}

/* Set rank srank has submitted p (sub: its submission). */
static void record(struct coord_controller *c, struct pending *p, const struct coord_request *sub,
                   int srank) {
  int64_t elements;

  if (!hvd_shape_elements(sub->shape, sub->ndims, &elements))
    elements = 0;
  p->submitted[srank / 8] |= (unsigned char)(1u << (srank % 8));
  p->count++;
  keep_inline(p, sub, srank, elements);
  if (p->elements != NULL)
    p->elements[srank] = elements;
  coord_timeline_arrival(c->s->timeline, p->first.name, sub->rank);
}

/* A borrowed request copied into *copy for the table to keep; NULL (the
 * operation dropped, logged) when out of memory. */
static struct coord_request *copy_to_keep(const struct coord_request *req,
                                          struct coord_request *copy) {
  if (coord_request_copy(copy, req) == HVD_OK)
    return copy;
  HVD_LOG_ERROR("out of memory in the coordinator: dropping '%s'", req->name);
  return NULL;
}

/* Submits req. owned: req's allocations are the table's to keep (req is
 * left empty); otherwise they are borrowed: the first submission of an
 * operation keeps a copy of its name in an entry's own buffer, and only a
 * failure copies the request, so a cached operation's submissions
 * allocate nothing. hit: req is the request of active cache entry `hit`
 * (so it cannot retire it), or -1. */
static void submit(struct coord_controller *c, struct coord_request *req, bool owned, int hit) {
  struct coord_request copy;
  char key[COORD_KEY_MAX];
  struct pending *p;
  const struct ctl_set *set = NULL;
  int srank = -1;

  if (req->type == COORD_JOIN || (set = find_member(c, req, &srank)) == NULL) {
    if (!owned && (req = copy_to_keep(req, &copy)) == NULL)
      return;
    if (req->type == COORD_JOIN)
      submit_join(c, req);
    else
      fail_not_member(c, req);
    return;
  }
  if (hit < 0)
    hit = retire_if_changed(c, req);
  if (req->rank == 0 && c->s->cfg.metrics && c->s->cache.capacity > 0)
    coord_metrics_cache(hit >= 0); /* rank 0's own: its workers count theirs */
  if (hit >= 0 && c->by_bit == NULL &&
      (c->by_bit = calloc(c->s->cache.capacity, sizeof(*c->by_bit))) == NULL)
    hit = -1; /* out of memory: the table serves */
  if (hit >= 0)
    p = c->by_bit[hit];
  else
    p = hvd_map_get(&c->table, key,
                    coord_key(key, sizeof(key), req->set, req->name, req->name_len));
  if (p == NULL) {
    if ((p = open_pending(c, req, owned, set, hit)) != NULL)
      record(c, p, &p->first, srank);
  } else if (check_again(p, req, srank)) {
    record(c, p, req, srank);
  } else {
    p = NULL; /* a second submission, dropped */
  }
  if (owned)
    coord_request_fini(req);
  if (p != NULL && coord_ctl_is_ready(c, p))
    make_ready(c, p);
}

void coord_controller_submit(struct coord_controller *c, struct coord_request *req) {
  submit(c, req, true, -1);
}

void coord_controller_submit_borrowed(struct coord_controller *c, const struct coord_request *req) {
  struct coord_request view = *req;
  submit(c, &view, false, -1);
}

/* A worker's cache bit, turned back into its request (with the inline
 * input it carried, if any) and submitted. */
static hvd_status submit_hit(struct coord_controller *c, int rank, uint64_t ack, int bit,
                             const struct coord_inline_hit *in) {
  struct coord_cache *cache = &c->s->cache;
  const struct coord_cache_entry *e = coord_cache_entry(cache, bit);
  struct coord_request req;
  bool valid = e != NULL && e->have_req && e->assigned_seq <= ack &&
               (e->state == COORD_CACHE_ACTIVE ||
                (e->state == COORD_CACHE_RETIRED && ack < e->retired_seq));

  if (!valid)
    return hvd_error(HVD_ERR_PROTOCOL,
                     "rank %d sent cache bit %d, which it cannot know (it acknowledged list %llu)",
                     rank, bit, (unsigned long long)ack);
  if (in != NULL && e->req.type != COORD_ALLREDUCE)
    return hvd_error(HVD_ERR_PROTOCOL, "rank %d sent an inline input with cache bit %d (a %s)",
                     rank, bit, coord_type_name(e->req.type));
  req = e->req; /* borrowed: the entry outlives the submission */
  req.rank = rank;
  if (in != NULL) {
    req.inline_len = in->len;
    memcpy(req.inline_data, in->data, in->len);
  }
  if (req.type == COORD_ALLGATHER) {
    const struct ctl_set *set = &c->sets[req.set];
    int srank = req.set < c->nsets && set->used ? coord_ctl_set_rank(set, rank) : -1;
    int64_t row = 1;
    hvd_shape_elements(req.shape + 1, req.ndims - 1, &row);
    if (srank < 0 || (uint32_t)srank >= e->resp.ncounts || row <= 0)
      return hvd_error(HVD_ERR_PROTOCOL, "rank %d sent cache bit %d of a set it is not in", rank,
                       bit);
    req.shape[0] = e->resp.counts[srank] / row;
  }
  coord_cache_touch(cache, bit);
  submit(c, &req, false, e->state == COORD_CACHE_ACTIVE ? bit : -1);
  return HVD_OK;
}

hvd_status coord_controller_receive(struct coord_controller *c, int rank,
                                    struct coord_request_list *l) {
  if (l->ack < c->acks[rank] || l->ack >= c->next_seq)
    return hvd_error(HVD_ERR_PROTOCOL,
                     "rank %d acknowledged response list %llu, after %llu (%llu sent so far)", rank,
                     (unsigned long long)l->ack, (unsigned long long)c->acks[rank],
                     (unsigned long long)(c->next_seq - 1));
  c->acks[rank] = l->ack;
  if (l->flags & COORD_FLAG_ABORT) {
    if (!c->aborting) {
      c->aborting = true;
      c->abort_status = l->abort_status ? l->abort_status : HVD_ERR_ABORTED;
      snprintf(c->abort_msg, sizeof(c->abort_msg), "rank %d failed: %s", rank,
               l->abort_message != NULL ? l->abort_message : "(no message)");
    }
    return HVD_OK;
  }
  if ((l->flags & COORD_FLAG_SHUTDOWN) && !c->shutdown) {
    c->shutdown = true;
    c->shutdown_rank = rank;
  }
  for (uint32_t byte = 0; byte < l->hits_bytes; byte++) {
    for (int b = 0; b < 8; b++) {
      hvd_status st;
      if ((l->hits[byte] & (1u << b)) &&
          (st = submit_hit(c, rank, l->ack, (int)(byte * 8 + (uint32_t)b), NULL)) != HVD_OK)
        return st;
    }
  }
  for (uint32_t i = 0; i < l->ninline_hits; i++) {
    hvd_status st = submit_hit(c, rank, l->ack, l->inline_hits[i].bit, &l->inline_hits[i]);
    if (st != HVD_OK)
      return st;
  }
  for (uint32_t i = 0; i < l->n; i++) {
    struct coord_request req = l->reqs[i];
    memset(&l->reqs[i], 0, sizeof(l->reqs[i]));
    req.rank = rank;
    coord_controller_submit(c, &req);
  }
  return HVD_OK;
}

/* Takes the pending operations of a set out of the table and the group
 * waits, with an error (the set is being removed). */
void coord_controller_fail_set(struct coord_controller *c, int set, const char *why) {
  struct hvd_map_iter it = {0};
  const char *key;
  size_t klen;
  void *value;

  for (struct pending *p = c->head; p != NULL;) {
    struct pending *next = p->next;
    if (p->first.set == set) {
      char msg[HVD_ERROR_MESSAGE_MAX];
      snprintf(msg, sizeof(msg), "%s '%.256s': %.700s", coord_type_name(p->first.type),
               p->first.name, why);
      if (p->error == NULL) {
        p->error = hvd_strndup(msg, strlen(msg));
        p->error_status = HVD_ERR_ABORTED;
      }
      coord_ctl_unlink(c, p);
      coord_ctl_push_ready(c, p);
    }
    p = next;
  }
  while (hvd_map_iter_next(&c->groups, &it, &key, &klen, &value)) {
    struct group_wait *g = value;
    if (g->count == 0 || g->members[0]->first.set != set)
      continue;
    hvd_map_iter_remove(&c->groups, &it);
    for (int i = 0; i < g->count; i++)
      coord_ctl_push_ready(c, g->members[i]);
    free(g->members);
    free(g);
  }
}

/* Records a set registered or removed by a response being built. */
hvd_status coord_ctl_set_added(struct coord_controller *c, int id, const int32_t *ranks, int n) {
  return set_put(c, id, ranks, n);
}

void coord_ctl_set_removed(struct coord_controller *c, int id) {
  if (id > 0 && id < c->nsets) {
    free(c->sets[id].ranks);
    memset(&c->sets[id], 0, sizeof(c->sets[id]));
  }
}
