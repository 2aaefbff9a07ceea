/*
 * The coordinator's output: response lists.
 *
 * DESIGN. Ready operations are sent as soon as nothing else is pending:
 * a lone small tensor goes out the moment its last rank submits it. While
 * other operations are still partly submitted, ready ones wait for them,
 * at most HOROVOD_CYCLE_TIME after the oldest became ready and only until
 * the fusion threshold is reached, so that a step's gradients, submitted
 * in different orders by different ranks, leave as a few fused responses.
 * Each response is first built for one tensor (an error for a mismatch or
 * an operation join does not allow), given a cache bit, then fused
 * (fusion.c). A response whose tensors all have bits the workers already
 * know travels as those bits only. A small allreduce whose every input
 * came with its request is reduced here, and its result travels in the
 * response: the ranks copy it out instead of running a collective, which
 * takes a network round off the latency of a step's scalars.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller_private.h"

static hvd_status error_response(struct coord_response *r, uint8_t status, const char *msg) {
  r->type = COORD_ERROR;
  r->status = status;
  free(r->counts);
  r->counts = NULL;
  r->ncounts = 0;
  r->error = hvd_strndup(msg, strlen(msg));
  return r->error != NULL ? HVD_OK : hvd_error(HVD_ERR_NO_MEMORY, "cannot build a response");
}

static bool anyone_joined(const struct coord_controller *c, int set_id, char *list, size_t size) {
  const struct ctl_set *set = &c->sets[set_id];
  size_t len = 0;
  bool any = false;

  list[0] = '\0';
  for (int i = 0; i < set->size; i++) {
    if (!c->joined[set->ranks[i]])
      continue;
    if (len < size)
      len += (size_t)snprintf(list + len, size - len, "%s%d", any ? ", " : "", set->ranks[i]);
    any = true;
  }
  return any;
}

void coord_inline_fold(unsigned char *acc, const unsigned char *in, bool first, size_t count,
                       int dtype, int op, double prescale) {
  unsigned char scaled[COORD_INLINE_MAX];

  if (prescale != 1.0) {
    ops_scale(scaled, in, count, dtype, prescale);
    in = scaled;
  }
  if (first)
    memcpy(acc, in, count * hvd_dtype_size(dtype));
  else
    ops_reduce(acc, acc, in, count, dtype, op);
}

void coord_inline_finish(unsigned char *acc, bool any, size_t count, int dtype, int op,
                         double postscale, int set_size) {
  if (!any)
    ops_fill_identity(acc, count, dtype, op);
  if (op == HVD_AVERAGE)
    postscale /= set_size;
  if (postscale != 1.0)
    ops_scale(acc, acc, count, dtype, postscale);
}

/* An inline allreduce's result into acc (p->inline_len bytes): the inputs
 * reduced in set-rank order (one order, so every rank gets the same bits),
 * scaled as ops_allreduce scales. A rank that joined contributes the
 * identity, which changes nothing. */
static void inline_result(const struct pending *p, unsigned char *acc) {
  const struct coord_request *q = &p->first;
  size_t count = p->inline_len / hvd_dtype_size(q->dtype);
  bool any = false;

  for (int i = 0; i < p->set_size; i++) {
    if (!(p->submitted[i / 8] & (1u << (i % 8))))
      continue;
    coord_inline_fold(acc, p->inline_vals + (size_t)i * p->inline_len, !any, count, q->dtype,
                      q->op, q->prescale);
    any = true;
  }
  coord_inline_finish(acc, any, count, q->dtype, q->op, q->postscale, p->set_size);
}

static hvd_status reduce_inline(const struct pending *p, struct coord_response *r) {
  if ((r->data = malloc(p->inline_len)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a response");
  inline_result(p, r->data);
  r->data_len = p->inline_len;
  return HVD_OK;
}

/* A response's scalar fields from its request (no arrays). */
static void response_fields(const struct coord_request *q, struct coord_response *r) {
  memset(r, 0, sizeof(*r));
  r->type = q->type;
  r->dtype = q->dtype;
  r->op = q->op;
  r->set = q->set;
  r->root = q->root;
  /* Any GPU is GPU 0 here: ranks use their own ordinals, and responses
   * fuse and cache alike whichever rank submitted first. */
  r->device = q->device == HVD_DEVICE_CPU ? HVD_DEVICE_CPU : 0;
  r->prescale = q->prescale;
  r->postscale = q->postscale;
  r->last_joined = -1;
  r->new_set = -1;
}

/* A response's fields from its request, for one tensor, with no cache bit.
 * The name is a copy (q's is its table entry's, which is reused). */
static hvd_status start_response(const struct coord_request *q, struct coord_response *r) {
  response_fields(q, r);
  r->ntensors = 1;
  r->names = calloc(1, sizeof(*r->names));
  r->bits = malloc(sizeof(*r->bits));
  if (r->names == NULL || r->bits == NULL ||
      (r->names[0] = hvd_strndup(q->name, q->name_len)) == NULL) {
    coord_response_fini(r);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a response");
  }
  r->bits[0] = -1;
  return HVD_OK;
}

/* Collectives a joined rank cannot take part in (it has no tensor to give). */
static bool needs_every_rank(int type) {
  return type == COORD_ALLGATHER || type == COORD_BROADCAST || type == COORD_ALLTOALL ||
         type == COORD_REDUCESCATTER;
}

/* A small CPU allreduce whose every input came with its request: reduced
 * here, its result sent in the response. */
static bool reduced_here(const struct pending *p) {
  return p->first.type == COORD_ALLREDUCE && p->inline_len != 0 && !p->inline_broken &&
         p->first.device == HVD_DEVICE_CPU;
}

/* ALLREDUCE, BROADCAST, REDUCESCATTER: the tensor's elements; one reduced
 * here (reduced_here) has its result too. */
static hvd_status count_response(const struct pending *p, struct coord_response *r) {
  const struct coord_request *q = &p->first;
  int64_t elements = 0;

  hvd_shape_elements(q->shape, q->ndims, &elements);
  if ((r->counts = malloc(sizeof(*r->counts))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a response");
  r->counts[0] = elements;
  r->ncounts = 1;
  if (reduced_here(p))
    return reduce_inline(p, r);
  return HVD_OK;
}

/* A new process set takes the lowest free id, unless one with these ranks exists. */
static hvd_status set_add_response(struct coord_controller *c, const struct coord_request *q,
                                   struct coord_response *r) {
  char msg[128];
  int existing = -1, id = 1;

  for (int i = 0; i < c->nsets; i++) {
    if (c->sets[i].used && (uint32_t)c->sets[i].size == q->nranks &&
        memcmp(c->sets[i].ranks, q->ranks, q->nranks * sizeof(*q->ranks)) == 0)
      existing = i;
  }
  if (existing >= 0) {
    snprintf(msg, sizeof(msg), "a process set with these %u ranks exists already (id %d)",
             q->nranks, existing);
    return error_response(r, HVD_ERR_EXISTS, msg);
  }
  while (id < c->nsets && c->sets[id].used)
    id++;
  if (coord_ctl_set_added(c, id, q->ranks, (int)q->nranks) != HVD_OK)
    return hvd_error_status();
  r->new_set = id;
  r->ranks = malloc(q->nranks * sizeof(*r->ranks));
  if (r->ranks == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a response");
  memcpy(r->ranks, q->ranks, q->nranks * sizeof(*r->ranks));
  r->nranks = q->nranks;
  return HVD_OK;
}

static hvd_status set_remove_response(struct coord_controller *c, const struct coord_request *q,
                                      struct coord_response *r) {
  char msg[128];

  if (q->root <= 0 || q->root >= c->nsets || !c->sets[q->root].used) {
    snprintf(msg, sizeof(msg), "process set %d %s", q->root,
             q->root == 0 ? "is the global set, which cannot be removed" : "does not exist");
    return error_response(r, HVD_ERR_INVALID_ARGUMENT, msg);
  }
  r->new_set = q->root;
  coord_ctl_set_removed(c, q->root);
  return HVD_OK;
}

/* The response for one ready operation (consumes p's counts): an error for
 * a disagreement or an operation join does not allow, else what runs. */
static hvd_status build_single(struct coord_controller *c, struct pending *p,
                               struct coord_response *r) {
  const struct coord_request *q = &p->first;
  char msg[HVD_ERROR_MESSAGE_MAX], joined[256];
  hvd_status st = start_response(q, r);

  if (st != HVD_OK)
    return st;
  if (p->error != NULL)
    return error_response(r, p->error_status, p->error);
  if (needs_every_rank(q->type) && anyone_joined(c, q->set, joined, sizeof(joined))) {
    snprintf(msg, sizeof(msg), "%s '%s' cannot run while rank(s) %s have joined (hvd_join)",
             coord_type_name(q->type), q->name, joined);
    return error_response(r, HVD_ERR_PRECONDITION, msg);
  }
  switch (q->type) {
  case COORD_ALLREDUCE:
  case COORD_BROADCAST:
  case COORD_REDUCESCATTER:
    return count_response(p, r);
  case COORD_ALLGATHER:
    r->counts = p->elements;
    r->ncounts = (uint32_t)p->set_size;
    p->elements = NULL;
    return HVD_OK;
  case COORD_SET_ADD:
    return set_add_response(c, q, r);
  case COORD_SET_REMOVE:
    return set_remove_response(c, q, r);
  default:
    return HVD_OK;
  }
}

/* The minimum acknowledgement over the workers (rank 0 is always current). */
static uint64_t min_ack(const struct coord_controller *c) {
  uint64_t m = UINT64_MAX;
  for (int r = 1; r < c->size; r++) {
    if (c->acks[r] < m)
      m = c->acks[r];
  }
  return m;
}

static bool same_response(const struct coord_response *a, const struct coord_response *b) {
  return a->type == b->type && a->dtype == b->dtype && a->op == b->op && a->set == b->set &&
         a->root == b->root && a->device == b->device &&
         memcmp(&a->prescale, &b->prescale, sizeof(double)) == 0 &&
         memcmp(&a->postscale, &b->postscale, sizeof(double)) == 0 && a->ncounts == b->ncounts &&
         (a->ncounts == 0 || memcmp(a->counts, b->counts, a->ncounts * sizeof(*a->counts)) == 0);
}

/* Whether the cache may hold this operation's response at all. */
static bool cacheable(const struct coord_controller *c, const struct coord_request *q) {
  return c->s->cache.capacity > 0 && !c->cache_paused && coord_cache_eligible(q);
}

/* The cache entry of the bit p's name had when it opened, if that bit is
 * still the name's (p->bit is a hint): NULL otherwise. */
static const struct coord_cache_entry *hinted_entry(const struct coord_controller *c,
                                                    const struct pending *p) {
  const struct coord_cache_entry *e = coord_cache_entry(&c->s->cache, p->bit);

  if (e == NULL || e->state != COORD_CACHE_ACTIVE || e->resp.set != p->first.set ||
      strcmp(e->resp.names[0], p->first.name) != 0)
    return NULL;
  return e;
}

/* Gives a single response its cache bit: the one it has, or a new one. */
static void assign_bit(struct coord_controller *c, const struct pending *p,
                       struct coord_response *r) {
  struct coord_cache *cache = &c->s->cache;
  int bit, evicted;
  const struct coord_cache_entry *e;

  if (r->type == COORD_ERROR || !cacheable(c, &p->first))
    return;
  /* The bit the operation's name had when it opened, if it still has it:
   * no look-up by name. */
  bit = p->bit;
  if ((e = hinted_entry(c, p)) == NULL) {
    bit = coord_cache_find(cache, r->set, r->names[0], strlen(r->names[0]));
    e = coord_cache_entry(cache, bit);
  }
  if (e != NULL && e->state == COORD_CACHE_ACTIVE) {
    if (same_response(&e->resp, r)) {
      coord_cache_touch(cache, bit);
      r->bits[0] = bit;
      return;
    }
    coord_ctl_retire(c, bit);
  }
  bit = coord_cache_take_bit(cache, min_ack(c), c->next_seq, &evicted);
  if (evicted >= 0)
    coord_ctl_retire(c, evicted);
  if (bit >= 0 && coord_cache_put(cache, bit, r, &p->first, c->next_seq) == HVD_OK)
    r->bits[0] = bit;
}

static bool known_bits(const struct coord_controller *c, const struct coord_response *r) {
  for (uint32_t i = 0; i < r->ntensors; i++) {
    const struct coord_cache_entry *e = coord_cache_entry(&c->s->cache, r->bits[i]);
    if (r->bits[i] < 0 || e == NULL || e->assigned_seq >= c->next_seq)
      return false;
  }
  return r->ntensors > 0;
}

static void retire_set(struct coord_controller *c, int set) {
  struct coord_cache *cache = &c->s->cache;
  for (size_t i = 0; i < cache->nentries; i++) {
    if (cache->entries[i].state == COORD_CACHE_ACTIVE && cache->entries[i].resp.set == set)
      coord_ctl_retire(c, (int)i);
  }
}

void coord_ctl_pause_cache(struct coord_controller *c, bool paused) {
  struct coord_cache *cache = &c->s->cache;
  if (paused && !c->cache_paused) {
    for (size_t i = 0; i < cache->nentries; i++) {
      if (cache->entries[i].state == COORD_CACHE_ACTIVE)
        coord_ctl_retire(c, (int)i);
    }
  }
  c->cache_paused = paused;
}

static bool due_now(const struct coord_controller *c, int64_t now, int64_t *due) {
  const struct coord_config *cfg = &c->s->cfg;
  bool waiting = c->npending > 0 || c->groups.count > 0;

  if (c->shutdown || c->join_due)
    return true;
  if (c->nready == 0)
    return false;
  if (!waiting || cfg->fusion_threshold == 0 || c->ready_bytes >= cfg->fusion_threshold ||
      now >= c->oldest_ready_ns + cfg->cycle_ns)
    return true;
  *due = c->oldest_ready_ns + cfg->cycle_ns;
  return false;
}

/* The list every rank stops on, once a rank failed or the coordinator did. */
static void abort_list(struct coord_controller *c, struct coord_response_list *out) {
  out->seq = c->next_seq++;
  out->flags = COORD_FLAG_ABORT;
  out->abort_status = c->abort_status;
  out->abort_message = hvd_strndup(c->abort_msg, strlen(c->abort_msg));
}

static struct pending *pop_ready(struct coord_controller *c) {
  struct pending *p = c->ready_head;

  c->ready_head = p->next_ready;
  if (c->ready_head == NULL)
    c->ready_tail = NULL;
  c->nready--;
  return p;
}

/* A set's removal fails the set's pending operations first, in the same
 * list: they join the FIFO ahead of it, and it goes back to the end.
 * Returns whether p went back. */
static bool defer_removal(struct coord_controller *c, struct pending *p) {
  int id = p->first.root;
  char why[96];

  if (p->first.type != COORD_SET_REMOVE || p->error != NULL || p->prepared || id <= 0 ||
      id >= c->nsets || !c->sets[id].used)
    return false;
  snprintf(why, sizeof(why), "process set %d was removed", id);
  coord_controller_fail_set(c, id, why);
  retire_set(c, id);
  p->prepared = true;
  coord_ctl_push_ready(c, p);
  return true;
}

/* Room for n single responses: the arrays are kept across lists. */
static hvd_status reserve_singles(struct coord_controller *c, size_t n) {
  if (hvd_array_reserve(&c->singles, &c->singles_cap, n, sizeof(*c->singles), 16) != HVD_OK ||
      hvd_array_reserve(&c->single_bytes, &c->single_bytes_cap, n, sizeof(*c->single_bytes),
                        16) != HVD_OK)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a response list");
  return HVD_OK;
}

/* Turns the ready FIFO into c->singles[0 .. *n): a response each, with its
 * cache bit. On failure none is left. */
static hvd_status take_ready(struct coord_controller *c, size_t *n) {
  hvd_status st = HVD_OK;

  *n = 0;
  while (st == HVD_OK && c->ready_head != NULL) {
    struct pending *p;
    if ((st = reserve_singles(c, *n + 1)) != HVD_OK)
      break;
    p = pop_ready(c);
    if (defer_removal(c, p))
      continue;
    c->single_bytes[*n] = coord_ctl_pending_bytes(p);
    st = build_single(c, p, &c->singles[*n]);
    if (st == HVD_OK)
      assign_bit(c, p, &c->singles[*n]);
    if (st == HVD_OK)
      (*n)++;
    else
      coord_response_fini(&c->singles[*n]);
    coord_ctl_pending_release(c, p);
  }
  if (st != HVD_OK) {
    for (size_t i = 0; i < *n; i++)
      coord_response_fini(&c->singles[i]);
    return st;
  }
  c->ready_bytes = 0;
  return HVD_OK;
}

static void free_responses(struct coord_response *rs, size_t n) {
  for (size_t i = 0; i < n; i++)
    coord_response_fini(&rs[i]);
  free(rs);
}

/* Every rank has joined: the JOIN response ends the list, and joining
 * starts over. */
static hvd_status append_join(struct coord_controller *c, struct coord_response **rs, size_t *n) {
  size_t cap = *n; /* at least what coord_fuse allocated */
  struct coord_response *join;

  if (hvd_array_reserve(rs, &cap, *n + 1, sizeof(**rs), *n + 1) != HVD_OK)
    return hvd_error_prefix("the join response");
  join = &(*rs)[*n];
  memset(join, 0, sizeof(*join));
  join->type = COORD_JOIN;
  join->last_joined = c->last_joined;
  join->new_set = -1;
  (*n)++;
  c->join_due = false;
  c->njoined = 0;
  memset(c->joined, 0, (size_t)c->size * sizeof(*c->joined));
  return HVD_OK;
}

/* Lanes (lanes.c): a cached inline allreduce of the global set whose
 * completion rank 0 negotiated gets its lane (again) in the list that
 * completes it. Negotiated after a grant, it means that the lane closed:
 * a rank fell behind, which costs the others about a negotiation more
 * than without lanes. A lane that closes again and again before it served
 * LANE_LONG submissions (ranks that never keep within HVD_SPIN_US of each
 * other) waits for 1, 3, 7 ... 1023 negotiated completions before its
 * next grant; one that served that many is granted again at once. */
enum { LANE_LONG = 16, LANE_MAX_LEVEL = 10 };

/* Room for a grant per response of out: the controller's for a borrowed
 * list (a lane granted again after it closed, a loaded machine's steady
 * state, allocates nothing), else the list's own. NULL when out of memory. */
static int32_t *grants_array(struct coord_controller *c, const struct coord_response_list *out) {
  if (!out->borrowed)
    return malloc((size_t)out->n * sizeof(*out->lanes));
  if (hvd_array_reserve(&c->light_lanes, &c->light_lanes_cap, out->n, sizeof(*c->light_lanes),
                        16) != HVD_OK) {
    hvd_error_clear();
    return NULL;
  }
  return c->light_lanes;
}

static void grant_lanes(struct coord_controller *c, struct coord_response_list *out) {
  uint64_t epoch = coord_lane_epoch(out->seq);
  int32_t *lanes = NULL;

  if (c->lane_grants == NULL || c->njoined > 0 || c->shutdown || epoch == 0)
    return;
  for (uint32_t i = 0; i < out->n; i++) {
    const struct coord_response *r = &out->resps[i];
    int bit = r->ntensors == 1 && r->bits != NULL ? r->bits[0] : -1;
    const struct coord_cache_entry *e = coord_cache_entry(&c->s->cache, bit);
    struct lane_grant *g;

    if (r->data_len == 0 || r->data_len > COORD_LANE_VALUE_MAX || r->set != 0 || bit < 0 ||
        bit >= COORD_LANES || e == NULL || e->state != COORD_CACHE_ACTIVE)
      continue;
    g = &c->lane_grants[bit];
    if (g->epoch != 0) {
      uint32_t served = coord_lane_closed_at(c->s->lanes, bit, g->epoch);
      if (served >= LANE_LONG)
        g->level = 0;
      else if (g->level < LANE_MAX_LEVEL)
        g->level++;
      g->skip = (1u << g->level) - 1;
      g->epoch = 0;
    }
    if (g->skip > 0) {
      g->skip--;
      continue;
    }
    if (lanes == NULL && (lanes = grants_array(c, out)) == NULL)
      return; /* no grant: negotiation goes on as before */
    lanes[out->nlanes++] = bit;
    g->epoch = epoch;
  }
  if (out->nlanes > 0) {
    out->lanes = lanes;
    out->flags |= COORD_FLAG_LANES;
  }
}

/* The list of the ready operations, fused; takes fused. */
static hvd_status assemble(struct coord_controller *c, struct coord_response *fused,
                           size_t nfused, struct coord_response_list *out) {
  if (c->join_due && append_join(c, &fused, &nfused) != HVD_OK) {
    free_responses(fused, nfused);
    return hvd_error_status();
  }
  for (size_t i = 0; i < nfused; i++)
    fused[i].cached = known_bits(c, &fused[i]);
  out->seq = c->next_seq++;
  out->resps = fused;
  out->n = (uint32_t)nfused;
  /* The list takes the retired bits; the next retirement starts a new array. */
  out->retired = c->retired;
  out->nretired = c->nretired;
  c->retired = NULL;
  c->nretired = c->retired_cap = 0;
  if (c->shutdown) {
    /* The stop's reason travels where an abort's does: who asked. */
    char why[64];
    snprintf(why, sizeof(why), "rank %d called hvd_shutdown", c->shutdown_rank);
    out->flags |= COORD_FLAG_SHUTDOWN;
    out->abort_message = hvd_strndup(why, strlen(why));
  }
  grant_lanes(c, out);
  return HVD_OK;
}

/* Whether p's response is the one its cache bit already stands for: a
 * cached allreduce, the steady state of a training loop's small tensors
 * (what assign_bit and known_bits would find, decided before anything is
 * built). */
static bool cached_allreduce(const struct coord_controller *c, const struct pending *p) {
  const struct coord_request *q = &p->first;
  const struct coord_cache_entry *e;
  struct coord_response r;
  int64_t elements = 0;

  if (p->error != NULL || q->type != COORD_ALLREDUCE || !cacheable(c, q))
    return false;
  if ((e = hinted_entry(c, p)) == NULL || e->assigned_seq >= c->next_seq)
    return false;
  response_fields(q, &r);
  hvd_shape_elements(q->shape, q->ndims, &elements);
  r.ncounts = 1;
  r.counts = &elements;
  return same_response(&e->resp, &r);
}

/* When every ready operation is a cached allreduce, at most one of them
 * run by a collective (two might fuse) and the others reduced here, the
 * list of their bits and results, in arrays the controller keeps
 * (out->borrowed): no allocation, nothing to fuse. False, with nothing
 * taken, when not (or when the arrays cannot grow). */
static bool light_list(struct coord_controller *c, struct coord_response_list *out) {
  size_t n = 0, collectives = 0;

  /* Lists that carry more than responses take the general way. */
  if (c->join_due || c->nretired > 0 || c->shutdown || c->s->tuner != NULL)
    return false;
  for (const struct pending *p = c->ready_head; p != NULL; p = p->next_ready) {
    if (!cached_allreduce(c, p) || (!reduced_here(p) && ++collectives > 1))
      return false;
    n++;
  }
  if (n == 0 ||
      hvd_array_reserve(&c->light, &c->light_cap, n, sizeof(*c->light), 16) != HVD_OK ||
      hvd_array_reserve(&c->light_bits, &c->light_bits_cap, n, sizeof(*c->light_bits), 16) !=
          HVD_OK ||
      hvd_array_reserve(&c->light_data, &c->light_data_cap, n * COORD_INLINE_MAX, 1,
                        16 * COORD_INLINE_MAX) != HVD_OK) {
    hvd_error_clear();
    return false;
  }
  for (size_t i = 0; i < n; i++) {
    struct pending *p = pop_ready(c);
    struct coord_response *r = &c->light[i];

    memset(r, 0, sizeof(*r));
    r->cached = true;
    r->ntensors = 1;
    r->bits = &c->light_bits[i];
    r->bits[0] = p->bit;
    r->last_joined = -1;
    r->new_set = -1;
    r->set = p->first.set; /* not sent: grant_lanes reads it */
    if (reduced_here(p)) {
      r->data = c->light_data + i * COORD_INLINE_MAX;
      r->data_len = p->inline_len;
      inline_result(p, r->data);
    }
    coord_cache_touch(&c->s->cache, p->bit);
    coord_ctl_pending_release(c, p);
  }
  c->ready_bytes = 0;
  out->seq = c->next_seq++;
  out->resps = c->light;
  out->n = (uint32_t)n;
  out->borrowed = true;
  grant_lanes(c, out);
  return true;
}

bool coord_controller_next(struct coord_controller *c, int64_t now, struct coord_response_list *out,
                           int64_t *due) {
  struct coord_response *fused = NULL;
  size_t n = 0, nfused = 0;
  hvd_status st;

  *due = HVD_NO_DEADLINE;
  memset(out, 0, sizeof(*out));
  if (c->aborting) {
    abort_list(c, out);
    return true;
  }
  if (!due_now(c, now, due))
    return false;
  if (light_list(c, out))
    return true;
  st = take_ready(c, &n);
  if (st == HVD_OK) /* consumes the singles, leaving the array */
    st = coord_fuse(c->singles, c->single_bytes, n, c->s->cfg.fusion_threshold, &fused, &nfused);
  if (st == HVD_OK)
    st = assemble(c, fused, nfused, out);
  if (st != HVD_OK) {
    /* Out of memory: the job cannot keep its ranks in step any more. */
    c->aborting = true;
    c->abort_status = st;
    snprintf(c->abort_msg, sizeof(c->abort_msg), "the coordinator failed: %s",
             hvd_last_error_message());
    abort_list(c, out);
  }
  return true;
}

void coord_controller_request_shutdown(struct coord_controller *c) {
  if (!c->shutdown)
    c->shutdown_rank = 0;
  c->shutdown = true;
}

int64_t coord_controller_due(const struct coord_controller *c) {
  if (c->shutdown || c->join_due || c->aborting)
    return 0;
  if (c->nready == 0)
    return HVD_NO_DEADLINE;
  return c->oldest_ready_ns + c->s->cfg.cycle_ns;
}
