/*
 * Lanes: cached inline allreduces agreed through shared memory, without
 * rank 0's round trip, in a job whose ranks all share one host.
 *
 * DESIGN. Rank 0 grants a lane to a cache bit in a response list (the
 * lanes field, see docs/coordinator-protocol.md); every rank opens it when
 * it applies that list, under an epoch (the list's sequence number). From
 * then on each rank's submissions of that tensor are numbered 1, 2, ...:
 * the nth goes into the rank's slot (value, then a tag of epoch and n),
 * and once every rank's slot carries the tag, each rank reduces the values
 * itself, in rank order (the same bits everywhere). One shared word per
 * lane decides each number: it moves from (epoch, n - 1) to (epoch, n) when
 * the nth completes, or to (epoch, n, closed) when a rank gives up on it:
 * waited longer than its spin time, or submits the tensor in a way the lane
 * cannot carry. Whoever changes the word first decides, by compare and
 * swap, so every rank sees the same outcome; a closed number, and every
 * one after it, goes to rank 0 as a request like any other (its cache bit,
 * its input). Rank 0 learns that a lane closed from a completion it
 * negotiates itself, and grants the bit again later (lanes_grant in
 * dispatch.c backs off).
 *
 * Why this is safe: a submission is numbered after the previous one of the
 * same name completed (names are unique in flight), and a lane opens in the
 * list that completes one, so the nth on every rank is the same step. Slots
 * alternate by number: the nth's slot is written again at n + 2, after
 * every rank has posted n + 1, that is after every rank has read n.
 *
 * Memory: the control communicator's segment, whose data buffers no
 * collective uses: each rank's slots in its buffer 0, the words in rank 0's
 * buffer 1.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

enum { LINE = 64, EPOCH_BITS = 40, COUNT_BITS = 23 };

#define EPOCH_MASK ((UINT64_C(1) << EPOCH_BITS) - 1)
#define COUNT_MAX ((UINT32_C(1) << COUNT_BITS) - 1)

struct lane_slot {
  _Alignas(LINE) _Atomic uint64_t tag; /* epoch << 24 | number */
  unsigned char value[COORD_LANE_VALUE_MAX];
};

struct lane_word {
  _Alignas(LINE) _Atomic uint64_t word; /* epoch << 24 | number << 1 | closed */
};

_Static_assert(sizeof(struct lane_slot) == LINE, "a slot is one cache line");

struct coord_lanes {
  unsigned char **bases; /* per rank: its slots */
  struct lane_word *words;
  int rank, size;
  struct coord_lane lane[COORD_LANES];
};

static uint64_t pack(uint64_t epoch, uint32_t n, bool closed) {
  return epoch << 24 | (uint64_t)n << 1 | (closed ? 1u : 0u);
}
static uint64_t tag_of(uint64_t epoch, uint32_t n) { return epoch << 24 | n; }
static uint64_t word_epoch(uint64_t w) { return w >> 24; }
static uint32_t word_number(uint64_t w) { return (uint32_t)(w >> 1) & COUNT_MAX; }
static bool word_closed(uint64_t w) { return (w & 1u) != 0; }

static struct lane_slot *slot(const struct coord_lanes *l, int rank, int bit, uint32_t n) {
  return (struct lane_slot *)l->bases[rank] + (size_t)bit * 2 + (n & 1u);
}

size_t coord_lanes_bytes(void) {
  return (size_t)COORD_LANES * 2 * sizeof(struct lane_slot);
}

hvd_status coord_lanes_create_at(unsigned char *const *slots, void *words, int rank, int size,
                                 struct coord_lanes **out) {
  struct coord_lanes *l = calloc(1, sizeof(*l));

  *out = NULL;
  if (l == NULL || (l->bases = calloc((size_t)size, sizeof(*l->bases))) == NULL) {
    free(l);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the lanes' state");
  }
  memcpy(l->bases, slots, (size_t)size * sizeof(*l->bases));
  l->words = words;
  l->rank = rank;
  l->size = size;
  *out = l;
  return HVD_OK;
}

hvd_status coord_lanes_create(struct net_shm *shm, int rank, int size, struct coord_lanes **out) {
  unsigned char **slots;
  hvd_status st;

  *out = NULL;
  if (net_shm_buffer_bytes(shm) < coord_lanes_bytes())
    return HVD_OK; /* a segment too small: no lanes, negotiation as before */
  if ((slots = calloc((size_t)size, sizeof(*slots))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the lanes' state");
  for (int r = 0; r < size; r++)
    slots[r] = net_shm_buffer(shm, r, 0);
  st = coord_lanes_create_at(slots, net_shm_buffer(shm, 0, 1), rank, size, out);
  free(slots);
  return st;
}

void coord_lanes_destroy(struct coord_lanes *l) {
  if (l == NULL)
    return;
  free(l->bases);
  free(l);
}

const struct coord_lane *coord_lane(const struct coord_lanes *l, int bit) {
  return l != NULL && bit >= 0 && bit < COORD_LANES ? &l->lane[bit] : NULL;
}

uint64_t coord_lane_epoch(uint64_t seq) { return seq & EPOCH_MASK; }

/* Whether epoch a is later than b (epochs wrap after 2^40 lists). */
static bool later(uint64_t a, uint64_t b) {
  return ((a - b) & EPOCH_MASK) != 0 && ((a - b) & EPOCH_MASK) < (UINT64_C(1) << (EPOCH_BITS - 1));
}

void coord_lane_open(struct coord_lanes *l, int bit, uint64_t epoch) {
  struct lane_word *w = &l->words[bit];
  uint64_t cur = atomic_load(&w->word);

  l->lane[bit] = (struct coord_lane){.epoch = epoch, .number = 0, .open = true};
  /* Every rank opens it; the first moves the word to the new epoch, and a
   * rank that applies an older grant late leaves a newer one alone. */
  while (cur == 0 || later(epoch, word_epoch(cur))) {
    if (atomic_compare_exchange_weak(&w->word, &cur, pack(epoch, 0, false)))
      break;
  }
}

/* Moves the word from (epoch, n - 1) to (epoch, n[, closed]); false if it
 * holds anything else (*seen: what). */
static bool decide(struct lane_word *w, uint64_t epoch, uint32_t n, bool closed, uint64_t *seen) {
  uint64_t expect = pack(epoch, n - 1, false);
  if (atomic_compare_exchange_strong(&w->word, &expect, pack(epoch, n, closed)))
    return true;
  *seen = expect;
  return false;
}

void coord_lane_close(struct coord_lanes *l, int bit) {
  struct coord_lane *lane;
  uint64_t seen;

  if (l == NULL || bit < 0 || bit >= COORD_LANES || !l->lane[bit].open)
    return;
  lane = &l->lane[bit];
  lane->open = false;
  (void)decide(&l->words[bit], lane->epoch, lane->number + 1, true, &seen);
}

bool coord_lane_post(struct coord_lanes *l, int bit, const void *value, size_t len,
                     struct coord_lane_ticket *t) {
  struct coord_lane *lane = &l->lane[bit];
  struct lane_slot *mine;

  if (!lane->open || len > COORD_LANE_VALUE_MAX)
    return false;
  /* Numbers run out (the word holds 23 bits): the last one closes the lane,
   * and rank 0 grants it anew. */
  if (lane->number + 1 >= COUNT_MAX) {
    coord_lane_close(l, bit);
    return false;
  }
  lane->number++;
  mine = slot(l, l->rank, bit, lane->number);
  memcpy(mine->value, value, len);
  atomic_store_explicit(&mine->tag, tag_of(lane->epoch, lane->number),
                        memory_order_release);
  *t = (struct coord_lane_ticket){.bit = bit, .epoch = lane->epoch, .number = lane->number,
                                  .len = len};
  return true;
}

/* Whether every rank's slot for the ticket's number carries its tag. */
static bool all_posted(const struct coord_lanes *l, const struct coord_lane_ticket *t) {
  uint64_t tag = tag_of(t->epoch, t->number);
  for (int r = 0; r < l->size; r++) {
    if (atomic_load_explicit(&slot(l, r, t->bit, t->number)->tag, memory_order_acquire) != tag)
      return false;
  }
  return true;
}

enum coord_lane_state coord_lane_poll(struct coord_lanes *l, const struct coord_lane_ticket *t,
                                      bool give_up) {
  struct lane_word *w = &l->words[t->bit];
  uint64_t cur = atomic_load_explicit(&w->word, memory_order_acquire);

  for (;;) {
    uint32_t n = word_number(cur);
    /* Decided: completed (a later number exists only once this one
     * completed, even one closed by a rank that gave up on it), or closed,
     * or the lane moved on to another epoch (see coord_lanes_apply). */
    if (word_epoch(cur) == t->epoch && (n > t->number || (n == t->number && !word_closed(cur))))
      return COORD_LANE_DONE;
    if (word_epoch(cur) != t->epoch || word_closed(cur) || n != t->number - 1) {
      if (l->lane[t->bit].epoch == t->epoch)
        l->lane[t->bit].open = false;
      return COORD_LANE_CLOSED;
    }
    if (all_posted(l, t)) {
      if (decide(w, t->epoch, t->number, false, &cur))
        return COORD_LANE_DONE;
      continue;
    }
    if (!give_up)
      return COORD_LANE_WAITING;
    if (decide(w, t->epoch, t->number, true, &cur))
      cur = pack(t->epoch, t->number, true);
  }
}

const unsigned char *coord_lane_value(const struct coord_lanes *l,
                                      const struct coord_lane_ticket *t, int rank) {
  return slot(l, rank, t->bit, t->number)->value;
}

uint32_t coord_lane_closed_at(const struct coord_lanes *l, int bit, uint64_t epoch) {
  uint64_t cur = atomic_load(&l->words[bit].word);
  return word_epoch(cur) == epoch ? word_number(cur) : 0;
}
