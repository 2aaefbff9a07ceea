/*
 * Lanes (src/coord/lanes.c): the shared-memory protocol, with two or three
 * ranks' views of one piece of memory in this process, stepped by hand
 * through the orders in which real ranks may interleave.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "coord/coord.h"

TCase *coord_lanes_tcase(void);

enum { RANKS = 3, BIT = 7 };

struct bed {
  unsigned char *slots[RANKS];
  void *words;
  struct coord_lanes *view[RANKS];
};

static void *zeroed(size_t bytes) {
  void *p = NULL;
  ck_assert_int_eq(posix_memalign(&p, 64, bytes), 0);
  memset(p, 0, bytes);
  return p;
}

/* n ranks' views; each opens lane BIT in epoch (0: not yet). */
static void bed_open(struct bed *b, int n, uint64_t epoch) {
  memset(b, 0, sizeof(*b));
  for (int r = 0; r < n; r++)
    b->slots[r] = zeroed(coord_lanes_bytes());
  b->words = zeroed((size_t)COORD_LANES * 64);
  for (int r = 0; r < n; r++) {
    ck_assert_int_eq(coord_lanes_create_at(b->slots, b->words, r, n, &b->view[r]), HVD_OK);
    if (epoch != 0)
      coord_lane_open(b->view[r], BIT, epoch);
  }
}

static void bed_close(struct bed *b) {
  for (int r = 0; r < RANKS; r++) {
    coord_lanes_destroy(b->view[r]);
    free(b->slots[r]);
  }
  free(b->words);
}

static float post(struct bed *b, int r, float v, struct coord_lane_ticket *t) {
  ck_assert_msg(coord_lane_post(b->view[r], BIT, &v, sizeof(v), t), "rank %d cannot post", r);
  return v;
}

static enum coord_lane_state poll_one(struct bed *b, int r, const struct coord_lane_ticket *t,
                                      bool give_up) {
  return coord_lane_poll(b->view[r], t, give_up);
}

/* Every rank posts: each sees the submission complete, with the inputs in
 * rank order; the next one completes the same way. */
START_TEST(lanes_complete_when_everyone_posted) {
  struct bed b;
  struct coord_lane_ticket t[RANKS];

  bed_open(&b, RANKS, 5);
  for (int step = 1; step <= 3; step++) {
    for (int r = 0; r < RANKS; r++) {
      post(&b, r, (float)(10 * step + r), &t[r]);
      ck_assert_uint_eq(t[r].number, (unsigned)step);
      if (r < RANKS - 1)
        ck_assert_int_eq(poll_one(&b, r, &t[r], false), COORD_LANE_WAITING);
    }
    for (int r = RANKS - 1; r >= 0; r--)
      ck_assert_int_eq(poll_one(&b, r, &t[r], false), COORD_LANE_DONE);
    for (int r = 0; r < RANKS; r++) {
      float v;
      memcpy(&v, coord_lane_value(b.view[1], &t[1], r), sizeof(v));
      ck_assert(v == (float)(10 * step + r));
    }
  }
  bed_close(&b);
}
END_TEST

/* A rank that gives up closes the submission for everybody, whoever
 * posted it already or posts it later; the lane stays closed. */
START_TEST(lanes_give_up_closes_for_everyone) {
  struct bed b;
  struct coord_lane_ticket t[RANKS];

  bed_open(&b, RANKS, 5);
  post(&b, 0, 1, &t[0]);
  post(&b, 1, 2, &t[1]);
  ck_assert_int_eq(poll_one(&b, 0, &t[0], true), COORD_LANE_CLOSED);
  ck_assert_int_eq(poll_one(&b, 1, &t[1], false), COORD_LANE_CLOSED);
  post(&b, 2, 3, &t[2]); /* too late: everybody has it negotiated */
  ck_assert_int_eq(poll_one(&b, 2, &t[2], false), COORD_LANE_CLOSED);
  for (int r = 0; r < RANKS; r++) {
    struct coord_lane_ticket again;
    float v = 0;
    ck_assert(!coord_lane(b.view[r], BIT)->open);
    ck_assert(!coord_lane_post(b.view[r], BIT, &v, sizeof(v), &again));
  }
  bed_close(&b);
}
END_TEST

/* Giving up after everybody posted is too late: the submission completes. */
START_TEST(lanes_give_up_after_everyone_posted_completes) {
  struct bed b;
  struct coord_lane_ticket t[2];

  bed_open(&b, 2, 9);
  post(&b, 0, 1, &t[0]);
  post(&b, 1, 2, &t[1]);
  ck_assert_int_eq(poll_one(&b, 0, &t[0], true), COORD_LANE_DONE);
  ck_assert_int_eq(poll_one(&b, 1, &t[1], true), COORD_LANE_DONE);
  bed_close(&b);
}
END_TEST

/* A rank may complete n, post n + 1 and give up on it before a slower rank
 * looked at n: that rank still finds n completed. */
START_TEST(lanes_later_number_means_completed) {
  struct bed b;
  struct coord_lane_ticket t0, t1, next;

  bed_open(&b, 2, 3);
  post(&b, 0, 1, &t0);
  post(&b, 1, 2, &t1);
  ck_assert_int_eq(poll_one(&b, 1, &t1, false), COORD_LANE_DONE);
  post(&b, 1, 4, &next);
  ck_assert_int_eq(poll_one(&b, 1, &next, true), COORD_LANE_CLOSED);
  ck_assert_int_eq(poll_one(&b, 0, &t0, false), COORD_LANE_DONE);
  /* Rank 0's next one is the closed number. */
  post(&b, 0, 3, &next);
  ck_assert_int_eq(poll_one(&b, 0, &next, false), COORD_LANE_CLOSED);
  bed_close(&b);
}
END_TEST

/* A rank whose submission no longer fits the lane closes it from its next
 * number on; the others' next submission closes there too. */
START_TEST(lanes_close_takes_the_next_number) {
  struct bed b;
  struct coord_lane_ticket t[2];

  bed_open(&b, 2, 4);
  post(&b, 0, 1, &t[0]);
  post(&b, 1, 1, &t[1]);
  ck_assert_int_eq(poll_one(&b, 0, &t[0], false), COORD_LANE_DONE);
  ck_assert_int_eq(poll_one(&b, 1, &t[1], false), COORD_LANE_DONE);
  coord_lane_close(b.view[1], BIT);
  ck_assert_uint_eq(coord_lane_closed_at(b.view[0], BIT, 4), 2);
  post(&b, 0, 1, &t[0]);
  ck_assert_int_eq(poll_one(&b, 0, &t[0], false), COORD_LANE_CLOSED);
  bed_close(&b);
}
END_TEST

/* A new grant moves the lane to its epoch; a rank that applies an older
 * grant late leaves the newer one alone, and its submissions on the old
 * epoch close. Slots of the old epoch never count for the new one. */
START_TEST(lanes_epochs_only_move_forward) {
  struct bed b;
  struct coord_lane_ticket t[2];

  bed_open(&b, 2, 20);
  post(&b, 0, 1, &t[0]);
  post(&b, 1, 1, &t[1]);
  ck_assert_int_eq(poll_one(&b, 0, &t[0], false), COORD_LANE_DONE);
  coord_lane_open(b.view[0], BIT, 30);
  coord_lane_open(b.view[1], BIT, 25); /* late */
  ck_assert_uint_eq(coord_lane_closed_at(b.view[0], BIT, 30), 0);
  ck_assert_uint_eq(coord_lane_closed_at(b.view[0], BIT, 25), 0);
  post(&b, 1, 1, &t[1]);
  ck_assert_int_eq(poll_one(&b, 1, &t[1], false), COORD_LANE_CLOSED);
  post(&b, 0, 1, &t[0]); /* epoch 30, number 1: rank 1's slot says epoch 25 */
  ck_assert_int_eq(poll_one(&b, 0, &t[0], false), COORD_LANE_WAITING);
  coord_lane_open(b.view[1], BIT, 30);
  post(&b, 1, 1, &t[1]);
  ck_assert_int_eq(poll_one(&b, 1, &t[1], false), COORD_LANE_DONE);
  ck_assert_int_eq(poll_one(&b, 0, &t[0], false), COORD_LANE_DONE);
  bed_close(&b);
}
END_TEST

/* Inputs a lane cannot carry, and bits beyond the lanes. */
START_TEST(lanes_refuse_what_they_cannot_carry) {
  struct bed b;
  struct coord_lane_ticket t;
  unsigned char big[COORD_LANE_VALUE_MAX + 1] = {0};

  bed_open(&b, 2, 0);
  ck_assert(!coord_lane_post(b.view[0], BIT, big, 4, &t)); /* not open */
  coord_lane_open(b.view[0], BIT, 2);
  ck_assert(!coord_lane_post(b.view[0], BIT, big, sizeof(big), &t));
  ck_assert(coord_lane_post(b.view[0], BIT, big, COORD_LANE_VALUE_MAX, &t));
  ck_assert_ptr_null(coord_lane(b.view[0], COORD_LANES));
  ck_assert_ptr_null(coord_lane(b.view[0], -1));
  ck_assert_uint_eq(coord_lane_epoch(UINT64_C(1) << 40), 0);
  bed_close(&b);
}
END_TEST

/* The word holds 23 bits of number: the last one closes the lane on
 * every rank, without touching the epoch. (The state is set by hand: the
 * word's layout is the protocol's, docs/coordinator-protocol.md.) */
START_TEST(lanes_close_when_numbers_run_out) {
  const uint32_t last = (UINT32_C(1) << 23) - 1;
  struct bed b;
  struct coord_lane_ticket t[2];

  bed_open(&b, 2, 6);
  for (int r = 0; r < 2; r++)
    ((struct coord_lane *)coord_lane(b.view[r], BIT))->number = last - 2;
  *(_Atomic uint64_t *)((unsigned char *)b.words + BIT * 64) =
      UINT64_C(6) << 24 | (uint64_t)(last - 2) << 1;
  post(&b, 0, 1, &t[0]);
  post(&b, 1, 2, &t[1]);
  ck_assert_uint_eq(t[0].number, last - 1);
  ck_assert_int_eq(poll_one(&b, 0, &t[0], false), COORD_LANE_DONE);
  ck_assert_int_eq(poll_one(&b, 1, &t[1], false), COORD_LANE_DONE);
  for (int r = 0; r < 2; r++) {
    float v = 0;
    ck_assert(!coord_lane_post(b.view[r], BIT, &v, sizeof(v), &t[r]));
    ck_assert(!coord_lane(b.view[r], BIT)->open);
  }
  ck_assert_uint_eq(coord_lane_closed_at(b.view[0], BIT, 6), last);
  bed_close(&b);
}
END_TEST

TCase *coord_lanes_tcase(void) {
  TCase *tc = tcase_create("lanes");
  tcase_add_test(tc, lanes_complete_when_everyone_posted);
  tcase_add_test(tc, lanes_give_up_closes_for_everyone);
  tcase_add_test(tc, lanes_give_up_after_everyone_posted_completes);
  tcase_add_test(tc, lanes_later_number_means_completed);
  tcase_add_test(tc, lanes_close_takes_the_next_number);
  tcase_add_test(tc, lanes_epochs_only_move_forward);
  tcase_add_test(tc, lanes_refuse_what_they_cannot_carry);
  tcase_add_test(tc, lanes_close_when_numbers_run_out);
  return tc;
}
