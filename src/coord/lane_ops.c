/*
 * Operations through lanes (lanes.c has the shared-memory protocol): which
 * submissions take one, waiting for the other ranks, and what becomes of
 * a submission whose lane closed.
 *
 * DESIGN. The loop's driver offers every queued entry to its lanes first
 * (coord_lanes_submit): a cached inline allreduce of the global set whose
 * bit has an open lane is posted there and waits in this rank's list of
 * lane waits instead of going to rank 0. A submission that no longer
 * matches its cache bit closes the bit's lane before it goes to rank 0, so
 * that the other ranks' same submission follows it there. Each turn looks
 * at the waits (coord_lanes_progress): a completed one is reduced here and
 * finished, one whose lane closed, or that waited HVD_SPIN_US (at least
 * MIN_WAIT_NS), goes back to the front of the queue, where the driver
 * finds it again and sends it to rank 0 as usual. The loop spins while
 * waits are pending: a lane rings no doorbell.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

enum { MIN_WAIT_NS = 10000 };

void coord_lanes_init(struct coord_state *s) {
  memset(&s->lane_waits, 0, sizeof(s->lane_waits));
  s->lane_waits.wait_ns = s->cfg.spin_ns > MIN_WAIT_NS ? s->cfg.spin_ns : MIN_WAIT_NS;
}

void coord_lanes_fini(struct coord_state *s) {
  free(s->lane_waits.w);
  memset(&s->lane_waits, 0, sizeof(s->lane_waits));
}

/* Whether a lane may carry requests like q (cheap fields first). */
static bool lane_kind(const struct coord_request *q) {
  return q->type == COORD_ALLREDUCE && q->set == HVD_PROCESS_SET_GLOBAL &&
         q->device == HVD_DEVICE_CPU;
}

bool coord_lanes_submit(struct coord_state *s, struct coord_entry *e, int bit, int64_t now) {
  struct coord_lane_waits *ws = &s->lane_waits;
  const struct coord_request *q = &e->req;
  const struct coord_lane *lane;
  struct coord_lane_ticket t;

  if (s->lanes == NULL || !lane_kind(q))
    return false;
  if (bit == COORD_LANE_FIND)
    bit = coord_cache_hit(&s->cache, q);
  if (bit < 0) { /* not its cached request any more: the others follow it to rank 0 */
    coord_lane_close(s->lanes, coord_cache_find(&s->cache, q->set, q->name, q->name_len));
    return false;
  }
  lane = coord_lane(s->lanes, bit);
  if (lane == NULL || !lane->open)
    return false;
  if (q->inline_len > 0 &&
      hvd_array_reserve(&ws->w, &ws->cap, ws->n + 1, sizeof(*ws->w), 16) == HVD_OK &&
      coord_lane_post(s->lanes, bit, q->inline_data, q->inline_len, &t)) {
    ws->w[ws->n++] = (struct coord_lane_wait){e, t, now + ws->wait_ns};
    coord_cache_touch(&s->cache, bit);
    return true;
  }
  hvd_error_clear(); /* out of memory: rank 0 negotiates it, and the others follow */
  coord_lane_close(s->lanes, bit);
  return false;
}

/* Every rank posted w's input: the result, reduced in rank order as rank 0
 * reduces inline inputs, into the entry's output. */
static void finish(struct coord_state *s, const struct coord_lane_wait *w, int64_t now) {
  const struct coord_request *q = &w->e->req;
  size_t count = w->t.len / hvd_dtype_size(q->dtype);
  unsigned char acc[COORD_LANE_VALUE_MAX];
  char *name = q->name;
  const struct coord_response phase = {.ntensors = 1, .names = &name};

  for (int r = 0; r < s->size; r++)
    coord_inline_fold(acc, coord_lane_value(s->lanes, &w->t, r), r == 0, count, q->dtype, q->op,
                      q->prescale);
  coord_inline_finish(acc, true, count, q->dtype, q->op, q->postscale, s->size);
  memcpy(w->e->output, acc, w->t.len);
  coord_execute_phase(s, &phase, "LANE_ALLREDUCE");
  atomic_fetch_add_explicit(&s->lane_waits.completed, 1, memory_order_relaxed);
  if (s->cfg.metrics)
    coord_metrics_lane(w->e, now);
  coord_finish_entry(s, w->e, HVD_OK, NULL);
}

/* Finishes or requeues the waits with an outcome, all of them or those of
 * one cache bit (bit >= 0), forcing one (give_up) where asked. */
static void settle(struct coord_state *s, int64_t now, int bit, bool force, bool *worked) {
  struct coord_lane_waits *ws = &s->lane_waits;
  size_t kept = 0;

  for (size_t i = 0; i < ws->n; i++) {
    struct coord_lane_wait w = ws->w[i];
    enum coord_lane_state state = COORD_LANE_WAITING;

    if (bit < 0 || w.t.bit == bit)
      state = coord_lane_poll(s->lanes, &w.t, force || now >= w.give_up);
    if (state == COORD_LANE_WAITING) {
      ws->w[kept++] = w;
      continue;
    }
    *worked = true;
    if (state == COORD_LANE_DONE)
      finish(s, &w, now);
    else
      coord_requeue(s, w.e);
  }
  ws->n = kept;
}

void coord_lanes_progress(struct coord_state *s, int64_t now, bool *worked) {
  settle(s, now, -1, false, worked);
}

bool coord_lanes_ready(struct coord_state *s) {
  struct coord_lane_waits *ws = &s->lane_waits;

  for (size_t i = 0; i < ws->n; i++) {
    if (coord_lane_poll(s->lanes, &ws->w[i].t, false) != COORD_LANE_WAITING)
      return true;
  }
  return false;
}

int64_t coord_lanes_deadline(const struct coord_state *s) {
  const struct coord_lane_waits *ws = &s->lane_waits;
  int64_t d = HVD_NO_DEADLINE;

  for (size_t i = 0; i < ws->n; i++) {
    if (ws->w[i].give_up < d)
      d = ws->w[i].give_up;
  }
  return d;
}

hvd_status coord_lanes_apply(struct coord_state *s, const struct coord_response_list *list) {
  uint64_t epoch = coord_lane_epoch(list->seq);

  /* A retired bit may be reused for another tensor, whose lane would
   * reuse the bit's shared word: a submission waiting in the old lane
   * learns its outcome now, before this rank acknowledges the list (the
   * bit is reused only after every rank has). */
  for (uint32_t i = 0; i < list->nretired && s->lanes != NULL; i++) {
    bool worked = false;
    if (s->lane_waits.n > 0)
      settle(s, 0, list->retired[i], true, &worked);
    coord_lane_close(s->lanes, list->retired[i]);
  }
  if (list->nlanes == 0)
    return HVD_OK;
  if (s->lanes == NULL || epoch == 0)
    return hvd_error(HVD_ERR_PROTOCOL,
                     "rank 0 granted lanes in list %llu, which this rank cannot open (%s)",
                     (unsigned long long)list->seq,
                     s->lanes == NULL ? "no shared segment for control" : "epoch 0");
  for (uint32_t i = 0; i < list->nlanes; i++)
    coord_lane_open(s->lanes, list->lanes[i], epoch);
  return HVD_OK;
}
