/*
 * Unit tests of the coordinator's pieces that need no peers: the message
 * codec (round trips, and every truncation or corruption rejected), the
 * response cache, fusion, validation and the configuration; the elastic
 * state and run helper in a job of one; and the worker's side of the
 * elastic driver's protocol against an in-process store in which the test
 * writes the driver's keys.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord/coord.h"
#include "elastic/elastic.h"

Suite *coord_units_suite(void);
TCase *coord_lanes_tcase(void);

/* ==== messages ================================================================== */

static void make_request(struct coord_request *q, const char *name, int type) {
  memset(q, 0, sizeof(*q));
  q->type = (uint8_t)type;
  q->dtype = HVD_FLOAT32;
  q->op = HVD_SUM;
  q->set = 0;
  q->root = 0;
  q->device = HVD_DEVICE_CPU;
  q->prescale = 1.0;
  q->postscale = 1.0;
  q->ndims = 2;
  q->shape[0] = 3;
  q->shape[1] = 1000;
  q->name = strdup(name);
  q->name_len = (uint32_t)strlen(name);
}

static void make_request_list(struct coord_request_list *l) {
  memset(l, 0, sizeof(*l));
  l->ack = 77;
  l->flags = COORD_FLAG_SHUTDOWN;
  l->hits_bytes = 3;
  l->hits = calloc(3, 1);
  l->hits[2] = 0x81;
  l->n = 3;
  l->reqs = calloc(3, sizeof(*l->reqs));
  make_request(&l->reqs[0], "layer1.weight", COORD_ALLREDUCE);
  l->reqs[0].prescale = 0.25;
  l->reqs[0].op = HVD_AVERAGE;
  make_request(&l->reqs[1], "grouped.b", COORD_ALLREDUCE);
  l->reqs[1].group = strdup("grouped.a");
  l->reqs[1].group_len = 9;
  l->reqs[1].group_size = 2;
  make_request(&l->reqs[2], "ps", COORD_SET_ADD);
  l->reqs[2].nranks = 2;
  l->reqs[2].ranks = malloc(2 * sizeof(int32_t));
  l->reqs[2].ranks[0] = 1;
  l->reqs[2].ranks[1] = 3;
  l->reqs[2].ndims = 0;
  l->reqs[0].ndims = 1; /* a small allreduce with its input inline */
  l->reqs[0].shape[0] = 2;
  l->reqs[0].inline_len = 8;
  memcpy(l->reqs[0].inline_data, "\x01\x02\x03\x04\x05\x06\x07\x08", 8);
  l->ninline_hits = 1;
  l->inline_hits = calloc(1, sizeof(*l->inline_hits));
  l->inline_hits[0].bit = 12;
  l->inline_hits[0].len = 4;
  memcpy(l->inline_hits[0].data, "\xaa\xbb\xcc\xdd", 4);
}

static void encode_requests(struct hvd_buf *out) {
  struct coord_request_list l;
  make_request_list(&l);
  hvd_buf_init(out, COORD_MAX_MESSAGE);
  ck_assert_int_eq(coord_encode_requests(&l, out), HVD_OK);
  coord_request_list_fini(&l);
}

START_TEST(requests_round_trip) {
  struct hvd_buf buf;
  struct coord_request_list got;
  encode_requests(&buf);
  ck_assert_int_eq(coord_decode_requests(buf.data, buf.len, &got), HVD_OK);
  ck_assert_uint_eq(got.ack, 77);
  ck_assert_uint_eq(got.flags, COORD_FLAG_SHUTDOWN);
  ck_assert_uint_eq(got.hits_bytes, 3);
  ck_assert_uint_eq(got.hits[2], 0x81);
  ck_assert_uint_eq(got.n, 3);
  ck_assert_str_eq(got.reqs[0].name, "layer1.weight");
  ck_assert_uint_eq(got.reqs[0].op, HVD_AVERAGE);
  ck_assert(got.reqs[0].prescale == 0.25 && got.reqs[0].postscale == 1.0);
  ck_assert_int_eq(got.reqs[0].ndims, 1);
  ck_assert_int_eq(got.reqs[0].shape[0], 2);
  ck_assert_uint_eq(got.reqs[0].inline_len, 8);
  ck_assert_int_eq(memcmp(got.reqs[0].inline_data, "\x01\x02\x03\x04\x05\x06\x07\x08", 8), 0);
  ck_assert_uint_eq(got.reqs[1].inline_len, 0);
  ck_assert_uint_eq(got.ninline_hits, 1);
  ck_assert_int_eq(got.inline_hits[0].bit, 12);
  ck_assert_uint_eq(got.inline_hits[0].len, 4);
  ck_assert_int_eq(memcmp(got.inline_hits[0].data, "\xaa\xbb\xcc\xdd", 4), 0);
  ck_assert_int_eq(got.reqs[0].device, HVD_DEVICE_CPU);
  ck_assert_ptr_null(got.reqs[0].group);
  ck_assert_str_eq(got.reqs[1].group, "grouped.a");
  ck_assert_uint_eq(got.reqs[1].group_size, 2);
  ck_assert_uint_eq(got.reqs[2].type, COORD_SET_ADD);
  ck_assert_uint_eq(got.reqs[2].nranks, 2);
  ck_assert_int_eq(got.reqs[2].ranks[1], 3);
  coord_request_list_fini(&got);
  hvd_buf_fini(&buf);
}
END_TEST

START_TEST(requests_truncated_rejected) {
  struct hvd_buf buf;
  struct coord_request_list got;
  encode_requests(&buf);
  for (size_t len = 0; len < buf.len; len++) {
    memset(&got, 0, sizeof(got));
    ck_assert_msg(coord_decode_requests(buf.data, len, &got) == HVD_ERR_PROTOCOL,
                  "%zu of %zu bytes decoded", len, buf.len);
    ck_assert_ptr_null(got.reqs);
    ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "malformed request list"));
  }
  hvd_buf_fini(&buf);
}
END_TEST

/* Flipping any one byte either decodes to something well formed or is
 * rejected; it never crashes or reads past the end (ASan watches). */
START_TEST(requests_corruption_contained) {
  struct hvd_buf buf;
  struct coord_request_list got;
  encode_requests(&buf);
  for (size_t i = 0; i < buf.len; i++) {
    for (int bit = 0; bit < 8; bit++) {
      buf.data[i] ^= (unsigned char)(1u << bit);
      if (coord_decode_requests(buf.data, buf.len, &got) == HVD_OK)
        coord_request_list_fini(&got);
      buf.data[i] ^= (unsigned char)(1u << bit);
    }
  }
  /* A wrong magic, version or kind names the field. */
  buf.data[0] ^= 1;
  ck_assert_int_eq(coord_decode_requests(buf.data, buf.len, &got), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "magic"));
  buf.data[0] ^= 1;
  buf.data[4] ^= 2;
  ck_assert_int_eq(coord_decode_requests(buf.data, buf.len, &got), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "version"));
  buf.data[4] ^= 2;
  /* A response list is not a request list. */
  buf.data[6] = 2;
  ck_assert_int_eq(coord_decode_requests(buf.data, buf.len, &got), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "kind"));
  hvd_buf_fini(&buf);
}
END_TEST

START_TEST(requests_huge_counts_rejected) {
  /* A preamble, then counts that claim far more than the bytes present. */
  unsigned char msg[64] = {0};
  struct coord_request_list got;
  size_t at = 0;
  hvd_put_le32(msg, 0x43445648u);
  hvd_put_le16(msg + 4, 2);
  hvd_put_le16(msg + 6, 1);
  at = 8 + 8 + 1 + 1; /* ack, flags, abort status */
  hvd_put_le32(msg + at, 0); /* abort message */
  at += 4;
  hvd_put_le32(msg + at, 0xffffffffu); /* hits */
  ck_assert_int_eq(coord_decode_requests(msg, at + 4, &got), HVD_ERR_PROTOCOL);
  hvd_put_le32(msg + at, 0);
  hvd_put_le32(msg + at + 4, 0x7fffffffu); /* requests */
  ck_assert_int_eq(coord_decode_requests(msg, at + 8, &got), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "request count"));
  hvd_put_le32(msg + at + 4, 0);
  hvd_put_le32(msg + at + 8, 0x7fffffffu); /* inline hits */
  ck_assert_int_eq(coord_decode_requests(msg, at + 12, &got), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "inline hit count"));
  /* An inline input longer than any inline allreduce. */
  hvd_put_le32(msg + at + 8, 1);
  hvd_put_le32(msg + at + 12, 3);                    /* bit */
  hvd_put_le32(msg + at + 16, COORD_INLINE_MAX + 1); /* length */
  ck_assert_int_eq(coord_decode_requests(msg, at + 20, &got), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "inline hit input"));
  /* An empty list is fine. */
  hvd_put_le32(msg + at + 8, 0);
  ck_assert_int_eq(coord_decode_requests(msg, at + 12, &got), HVD_OK);
  ck_assert_uint_eq(got.n, 0);
  coord_request_list_fini(&got);
}
END_TEST

static void encode_responses(struct hvd_buf *out) {
  struct coord_response_list l;
  struct coord_response *r;
  memset(&l, 0, sizeof(l));
  l.seq = 9;
  l.nretired = 2;
  l.retired = malloc(2 * sizeof(int32_t));
  l.retired[0] = 4;
  l.retired[1] = 1023;
  l.flags = COORD_FLAG_LANES;
  l.nlanes = 2;
  l.lanes = malloc(2 * sizeof(int32_t));
  l.lanes[0] = 0;
  l.lanes[1] = COORD_LANES - 1;
  l.n = 3;
  l.resps = calloc(3, sizeof(*l.resps));
  r = &l.resps[0];
  r->type = COORD_ALLGATHER;
  r->dtype = HVD_INT64;
  r->set = 2;
  r->device = HVD_DEVICE_CPU;
  r->last_joined = -1;
  r->new_set = -1;
  r->prescale = r->postscale = 1.0;
  r->ntensors = 2;
  r->names = calloc(2, sizeof(char *));
  r->names[0] = strdup("a");
  r->names[1] = strdup("bb");
  r->bits = malloc(2 * sizeof(int32_t));
  r->bits[0] = 5;
  r->bits[1] = -1;
  r->ncounts = 4;
  r->counts = malloc(4 * sizeof(int64_t));
  for (int i = 0; i < 4; i++)
    r->counts[i] = (int64_t)i * 1000000000000LL;
  r = &l.resps[1];
  r->cached = true;
  r->ntensors = 1;
  r->bits = malloc(sizeof(int32_t));
  r->bits[0] = 7;
  r->data_len = 4; /* an inline allreduce's result */
  r->data = malloc(4);
  memcpy(r->data, "\x00\x00\x80\x3f", 4);
  r = &l.resps[2];
  r->type = COORD_ERROR;
  r->status = HVD_ERR_MISMATCH;
  r->last_joined = -1;
  r->new_set = -1;
  r->ntensors = 1;
  r->names = calloc(1, sizeof(char *));
  r->names[0] = strdup("x");
  r->bits = malloc(sizeof(int32_t));
  r->bits[0] = -1;
  r->error = strdup("mismatched shapes: rank 0 sent [1], rank 1 sent [2]");
  hvd_buf_init(out, COORD_MAX_MESSAGE);
  ck_assert_int_eq(coord_encode_responses(&l, out), HVD_OK);
  coord_response_list_fini(&l);
}

START_TEST(responses_round_trip) {
  struct hvd_buf buf;
  struct coord_response_list got;
  encode_responses(&buf);
  ck_assert_int_eq(coord_decode_responses(buf.data, buf.len, &got), HVD_OK);
  ck_assert_uint_eq(got.seq, 9);
  ck_assert_uint_eq(got.nretired, 2);
  ck_assert_int_eq(got.retired[1], 1023);
  ck_assert_uint_eq(got.nlanes, 2);
  ck_assert_int_eq(got.lanes[0], 0);
  ck_assert_int_eq(got.lanes[1], COORD_LANES - 1);
  ck_assert_uint_eq(got.n, 3);
  ck_assert_uint_eq(got.resps[0].type, COORD_ALLGATHER);
  ck_assert_int_eq(got.resps[0].set, 2);
  ck_assert_str_eq(got.resps[0].names[1], "bb");
  ck_assert_int_eq(got.resps[0].bits[0], 5);
  ck_assert_int_eq(got.resps[0].bits[1], -1);
  ck_assert_int_eq(got.resps[0].counts[3], 3000000000000LL);
  ck_assert(got.resps[1].cached);
  ck_assert_uint_eq(got.resps[1].ntensors, 1);
  ck_assert_int_eq(got.resps[1].bits[0], 7);
  ck_assert_uint_eq(got.resps[1].data_len, 4);
  ck_assert_int_eq(memcmp(got.resps[1].data, "\x00\x00\x80\x3f", 4), 0);
  ck_assert_uint_eq(got.resps[0].data_len, 0);
  ck_assert_uint_eq(got.resps[2].status, HVD_ERR_MISMATCH);
  ck_assert_str_eq(got.resps[2].error, "mismatched shapes: rank 0 sent [1], rank 1 sent [2]");
  coord_response_list_fini(&got);
  hvd_buf_fini(&buf);
}
END_TEST

/* A lane beyond the lanes, or a negative one, is a protocol error. */
START_TEST(responses_bad_lane_rejected) {
  const int32_t bad[2] = {COORD_LANES, -1};
  for (int i = 0; i < 2; i++) {
    struct coord_response_list l = {0}, got;
    struct hvd_buf buf;
    int32_t lane = bad[i];
    l.seq = 4;
    l.flags = COORD_FLAG_LANES;
    l.nlanes = 1;
    l.lanes = &lane;
    hvd_buf_init(&buf, COORD_MAX_MESSAGE);
    ck_assert_int_eq(coord_encode_responses(&l, &buf), HVD_OK);
    ck_assert_int_eq(coord_decode_responses(buf.data, buf.len, &got), HVD_ERR_PROTOCOL);
    ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "lanes"));
    hvd_buf_fini(&buf);
  }
}
END_TEST

/* Rank 0 decodes request lists into arrays it keeps (the list borrows
 * them, its requests' names are the list's): the same values, the same
 * arrays the next time; a broken list fails as without them. */
START_TEST(requests_decode_into_space) {
  struct coord_request_space space = {0};
  struct coord_request_list got;
  struct hvd_buf buf;

  encode_requests(&buf);
  for (int round = 0; round < 2; round++) {
    ck_assert_int_eq(coord_decode_requests_in(buf.data, buf.len, &got, &space), HVD_OK);
    ck_assert(got.borrowed);
    ck_assert_ptr_eq(got.reqs, space.reqs);
    ck_assert_ptr_eq(got.hits, space.hits);
    ck_assert_ptr_eq(got.inline_hits, space.inline_hits);
    ck_assert_uint_eq(got.hits[2], 0x81);
    ck_assert_uint_eq(got.n, 3);
    ck_assert_str_eq(got.reqs[0].name, "layer1.weight");
    ck_assert_str_eq(got.reqs[1].group, "grouped.a");
    ck_assert_int_eq(got.reqs[2].ranks[1], 3);
    ck_assert_int_eq(got.inline_hits[0].bit, 12);
    coord_request_list_fini(&got); /* the names, not the arrays (ASan: no double free) */
  }
  ck_assert_int_eq(coord_decode_requests_in(buf.data, buf.len - 1, &got, &space),
                   HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "request list"));
  hvd_buf_fini(&buf);
  coord_request_space_fini(&space);
}
END_TEST

/* A list of cached responses decodes into the worker's kept arrays (the
 * list borrows them); a list with others, or a broken one, decodes as
 * coord_decode_responses does. */
START_TEST(responses_decode_into_space) {
  struct coord_response_space space = {0};
  struct coord_response_list l = {0}, got;
  struct hvd_buf buf;
  const int32_t bits[3] = {4, 9, 2};

  l.seq = 3;
  l.n = 2;
  l.resps = calloc(2, sizeof(*l.resps));
  for (uint32_t i = 0; i < l.n; i++) {
    l.resps[i].cached = true;
    l.resps[i].ntensors = i == 0 ? 1 : 2;
    l.resps[i].bits = malloc(2 * sizeof(int32_t));
    memcpy(l.resps[i].bits, bits + i, l.resps[i].ntensors * sizeof(int32_t));
  }
  l.resps[0].data_len = 4;
  l.resps[0].data = malloc(4);
  memcpy(l.resps[0].data, "\x01\x02\x03\x04", 4);
  hvd_buf_init(&buf, COORD_MAX_MESSAGE);
  ck_assert_int_eq(coord_encode_responses(&l, &buf), HVD_OK);
  coord_response_list_fini(&l);
  for (int round = 0; round < 2; round++) { /* the second reuses the arrays */
    ck_assert_int_eq(coord_decode_responses_in(buf.data, buf.len, &got, &space), HVD_OK);
    ck_assert(got.borrowed);
    ck_assert_ptr_eq(got.resps, space.resps);
    ck_assert_uint_eq(got.seq, 3);
    ck_assert_uint_eq(got.n, 2);
    ck_assert_int_eq(got.resps[0].bits[0], 4);
    ck_assert_int_eq(memcmp(got.resps[0].data, "\x01\x02\x03\x04", 4), 0);
    ck_assert_uint_eq(got.resps[1].ntensors, 2);
    ck_assert_int_eq(got.resps[1].bits[0], 9);
    ck_assert_int_eq(got.resps[1].bits[1], 2);
    ck_assert_uint_eq(got.resps[1].data_len, 0);
    coord_response_list_fini(&got); /* leaves the arrays (ASan: no double free) */
  }
  /* Truncated: the same error as without the space. */
  ck_assert_int_eq(coord_decode_responses_in(buf.data, buf.len - 1, &got, &space),
                   HVD_ERR_PROTOCOL);
  hvd_buf_fini(&buf);
  /* A list with full responses: allocated, not borrowed. */
  encode_responses(&buf);
  ck_assert_int_eq(coord_decode_responses_in(buf.data, buf.len, &got, &space), HVD_OK);
  ck_assert(!got.borrowed);
  ck_assert_uint_eq(got.n, 3);
  ck_assert_str_eq(got.resps[0].names[1], "bb");
  ck_assert_int_eq(got.resps[1].bits[0], 7);
  coord_response_list_fini(&got);
  hvd_buf_fini(&buf);
  coord_response_space_fini(&space);
}
END_TEST

START_TEST(responses_truncated_rejected) {
  struct hvd_buf buf;
  struct coord_response_list got;
  encode_responses(&buf);
  for (size_t len = 0; len < buf.len; len++) {
    memset(&got, 0, sizeof(got));
    ck_assert_msg(coord_decode_responses(buf.data, len, &got) == HVD_ERR_PROTOCOL,
                  "%zu of %zu bytes decoded", len, buf.len);
    ck_assert_ptr_null(got.resps);
  }
  /* One byte too many. */
  ck_assert_int_eq(hvd_buf_append(&buf, "", 1), HVD_OK);
  ck_assert_int_eq(coord_decode_responses(buf.data, buf.len, &got), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "trailing"));
  for (size_t i = 0; i + 1 < buf.len; i++) {
    for (int bit = 0; bit < 8; bit++) {
      buf.data[i] ^= (unsigned char)(1u << bit);
      if (coord_decode_responses(buf.data, buf.len - 1, &got) == HVD_OK)
        coord_response_list_fini(&got);
      buf.data[i] ^= (unsigned char)(1u << bit);
    }
  }
  hvd_buf_fini(&buf);
}
END_TEST

/* ==== cache ======================================================================== */

static void single_response(struct coord_response *r, const char *name) {
  memset(r, 0, sizeof(*r));
  r->type = COORD_ALLREDUCE;
  r->dtype = HVD_FLOAT32;
  r->device = HVD_DEVICE_CPU;
  r->prescale = r->postscale = 1.0;
  r->last_joined = r->new_set = -1;
  r->ntensors = 1;
  r->names = calloc(1, sizeof(char *));
  r->names[0] = strdup(name);
  r->bits = malloc(sizeof(int32_t));
  r->bits[0] = -1;
  r->ncounts = 1;
  r->counts = malloc(sizeof(int64_t));
  r->counts[0] = 3000;
}

START_TEST(cache_hits_and_invalidation) {
  struct coord_cache c;
  struct coord_request q, other;
  struct coord_response r;
  int evicted;

  coord_cache_init(&c, 2);
  make_request(&q, "w", COORD_ALLREDUCE);
  single_response(&r, "w");
  ck_assert(coord_cache_eligible(&q));
  ck_assert_int_eq(coord_cache_hit(&c, &q), -1);
  ck_assert_int_eq(coord_cache_take_bit(&c, 0, 1, &evicted), 0);
  ck_assert_int_eq(coord_cache_put(&c, 0, &r, &q, 1), HVD_OK);
  ck_assert_int_eq(coord_cache_find(&c, 0, "w", 1), 0);
  ck_assert_int_eq(coord_cache_find(&c, 1, "w", 1), -1); /* another process set */
  ck_assert_int_eq(coord_cache_hit(&c, &q), 0);
  /* A different shape or dtype under the same name is a miss. */
  make_request(&other, "w", COORD_ALLREDUCE);
  other.shape[1] = 999;
  ck_assert_int_eq(coord_cache_hit(&c, &other), -1);
  other.shape[1] = 1000;
  other.dtype = HVD_FLOAT64;
  ck_assert_int_eq(coord_cache_hit(&c, &other), -1);
  coord_request_fini(&other);
  /* Bits out of range are refused. */
  ck_assert_int_eq(coord_cache_put(&c, 2, &r, &q, 1), HVD_ERR_PROTOCOL);
  ck_assert_int_eq(coord_cache_put(&c, -1, &r, &q, 1), HVD_ERR_PROTOCOL);
  /* Fill the second bit, then a third tensor evicts the least recently used. */
  ck_assert_int_eq(coord_cache_take_bit(&c, 0, 2, &evicted), 1);
  ck_assert_int_eq(coord_cache_put(&c, 1, &r, &q, 2), HVD_OK); /* "w" moves to bit 1 */
  ck_assert_int_eq(coord_cache_find(&c, 0, "w", 1), 1);
  coord_cache_touch(&c, 1);
  ck_assert_int_eq(coord_cache_take_bit(&c, 0, 3, &evicted), -1);
  ck_assert_int_eq(evicted, 0); /* bit 0 was used least recently */
  ck_assert_int_eq(coord_cache_entry(&c, 0)->state, COORD_CACHE_RETIRED);
  /* Retired at list 3: not reused before every rank acknowledged list 3. */
  ck_assert_int_eq(coord_cache_take_bit(&c, 2, 4, &evicted), -1);
  ck_assert_int_eq(coord_cache_take_bit(&c, 3, 4, &evicted), 0);
  coord_cache_retire(&c, 1, 5);
  ck_assert_int_eq(coord_cache_find(&c, 0, "w", 1), -1);
  ck_assert_int_eq(coord_cache_hit(&c, &q), -1);
  coord_cache_drop(&c, 1);
  ck_assert_int_eq(coord_cache_entry(&c, 1)->state, COORD_CACHE_FREE);
  coord_response_fini(&r);
  coord_request_fini(&q);
  coord_cache_fini(&c);
}
END_TEST

/* Keys of the in-flight map and the cache: "<set>:<name>", cut to fit. */
START_TEST(keys_name_set_and_tensor) {
  char key[16];
  ck_assert_uint_eq(coord_key(key, sizeof(key), 0, "grad", 4), 6);
  ck_assert_str_eq(key, "0:grad");
  ck_assert_uint_eq(coord_key(key, sizeof(key), 1234, "w", 1), 6);
  ck_assert_str_eq(key, "1234:w");
  ck_assert_uint_eq(coord_key(key, sizeof(key), -7, "ab", 1), 4); /* only len bytes of the name */
  ck_assert_str_eq(key, "-7:a");
  ck_assert_uint_eq(coord_key(key, sizeof(key), 5, "a-rather-long-name", 18), 15);
  ck_assert_str_eq(key, "5:a-rather-long");
  ck_assert_uint_eq(coord_key(key, 3, 42, "x", 1), 2);
  ck_assert_str_eq(key, "42");
}
END_TEST

START_TEST(cache_eligibility) {
  struct coord_request q;
  make_request(&q, "g", COORD_ALLREDUCE);
  q.group_size = 2; /* groups are negotiated whole, never from the cache */
  ck_assert(!coord_cache_eligible(&q));
  q.group_size = 0;
  q.type = COORD_ALLTOALL;
  ck_assert(!coord_cache_eligible(&q));
  q.type = COORD_ALLGATHER;
  ck_assert(coord_cache_eligible(&q));
  q.shape[1] = 0; /* empty rows: the first dimension cannot be recovered */
  ck_assert(!coord_cache_eligible(&q));
  q.type = COORD_BARRIER;
  ck_assert(!coord_cache_eligible(&q));
  coord_request_fini(&q);
  struct coord_cache off;
  coord_cache_init(&off, 0);
  int evicted;
  ck_assert_int_eq(coord_cache_take_bit(&off, 0, 1, &evicted), -1);
  ck_assert_int_eq(evicted, -1);
  coord_cache_fini(&off);
}
END_TEST

/* ==== fusion ======================================================================= */

START_TEST(fusion_groups_compatible_tensors) {
  struct coord_response in[5], *out = NULL;
  size_t bytes[5] = {400, 400, 400, 400, 900}, nout = 0;
  const char *names[5] = {"a", "b", "c", "d", "e"};
  for (int i = 0; i < 5; i++)
    single_response(&in[i], names[i]);
  in[1].dtype = HVD_FLOAT64; /* skipped over, not a barrier */
  in[3].op = HVD_MAX;
  ck_assert_int_eq(coord_fuse(in, bytes, 5, 1000, &out, &nout), HVD_OK);
  /* a+c fuse (800 <= 1000; e would pass the threshold); b, d, e alone. */
  ck_assert_uint_eq(nout, 4);
  ck_assert_uint_eq(out[0].ntensors, 2);
  ck_assert_str_eq(out[0].names[0], "a");
  ck_assert_str_eq(out[0].names[1], "c");
  ck_assert_uint_eq(out[0].ncounts, 2);
  ck_assert_str_eq(out[1].names[0], "b");
  ck_assert_str_eq(out[2].names[0], "d");
  ck_assert_str_eq(out[3].names[0], "e");
  for (size_t i = 0; i < nout; i++)
    coord_response_fini(&out[i]);
  free(out);
  /* A threshold of 0 disables fusion. */
  for (int i = 0; i < 5; i++)
    single_response(&in[i], names[i]);
  ck_assert_int_eq(coord_fuse(in, bytes, 5, 0, &out, &nout), HVD_OK);
  ck_assert_uint_eq(nout, 5);
  for (size_t i = 0; i < nout; i++) {
    ck_assert_uint_eq(out[i].ntensors, 1);
    coord_response_fini(&out[i]);
  }
  free(out);
}
END_TEST

/* ==== validation ===================================================================== */

START_TEST(validation_names_both_ranks) {
  struct coord_request a, b;
  char msg[512];
  make_request(&a, "t", COORD_ALLREDUCE);
  make_request(&b, "t", COORD_ALLREDUCE);
  a.rank = 0;
  b.rank = 3;
  ck_assert(coord_validate(&a, &b, msg, sizeof(msg)));
  b.shape[0] = 4;
  ck_assert(!coord_validate(&a, &b, msg, sizeof(msg)));
  ck_assert_ptr_nonnull(strstr(msg, "mismatched shapes: rank 0 sent [3, 1000], rank 3 sent [4, 1000]"));
  b.type = COORD_ALLGATHER;
  a.type = COORD_ALLGATHER;
  ck_assert(coord_validate(&a, &b, msg, sizeof(msg))); /* the first dimension may differ */
  b.shape[1] = 7;
  ck_assert(!coord_validate(&a, &b, msg, sizeof(msg)));
  coord_request_fini(&b);
  b = a; /* shares a's name */
  b.rank = 3;
  b.device = 0;
  ck_assert(!coord_validate(&a, &b, msg, sizeof(msg)));
  ck_assert_ptr_nonnull(strstr(msg, "GPU 0"));
  b = a;
  b.rank = 2;
  b.type = COORD_BROADCAST;
  ck_assert(!coord_validate(&a, &b, msg, sizeof(msg)));
  ck_assert_ptr_nonnull(strstr(msg, "mismatched operations"));
  coord_request_fini(&a);
}
END_TEST

/* ==== configuration ===================================================================== */

START_TEST(config_defaults_and_overrides) {
  struct coord_config cfg;
  unsetenv("HOROVOD_FUSION_THRESHOLD");
  unsetenv("HOROVOD_CACHE_CAPACITY");
  unsetenv("HOROVOD_CYCLE_TIME");
  unsetenv("HOROVOD_STALL_CHECK_DISABLE");
  ck_assert_int_eq(coord_config_from_env(0, 1, &cfg), HVD_OK);
  ck_assert_uint_eq(cfg.fusion_threshold, 128u << 20);
  ck_assert_uint_eq(cfg.cache_capacity, 1024);
  ck_assert_int_eq(cfg.cycle_ns, 1000000);
  ck_assert(cfg.stall_check);
  ck_assert_int_eq(cfg.stall_warn_ns, 60 * 1000000000LL);
  setenv("HOROVOD_FUSION_THRESHOLD", "0", 1);
  setenv("HOROVOD_CACHE_CAPACITY", "0", 1);
  setenv("HOROVOD_CYCLE_TIME", "0.5", 1);
  setenv("HOROVOD_STALL_CHECK_DISABLE", "1", 1);
  ck_assert_int_eq(coord_config_from_env(0, 1, &cfg), HVD_OK);
  ck_assert_uint_eq(cfg.fusion_threshold, 0);
  ck_assert_uint_eq(cfg.cache_capacity, 0);
  ck_assert_int_eq(cfg.cycle_ns, 500000);
  ck_assert(!cfg.stall_check);
  setenv("HOROVOD_THREAD_AFFINITY", "3,5", 1);
  ck_assert_int_eq(coord_config_from_env(1, 2, &cfg), HVD_OK);
  ck_assert_int_eq(cfg.affinity_core, 5);
  ck_assert_int_eq(coord_config_from_env(0, 3, &cfg), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HOROVOD_THREAD_AFFINITY"));
  unsetenv("HOROVOD_THREAD_AFFINITY");
}
END_TEST

/* ==== elastic: the state ========================================================= */

/* Every variable hvd_init or the elastic code reads: tests start from a
 * process that is not part of any job, and leave none behind. */
static const char *const job_env[] = {
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_ELASTIC",
    "HOROVOD_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_RESET_LIMIT", "HVD_ELASTIC_ROUND",
    "HVD_ELASTIC_UPDATES", "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT",
    "HVD_TOKEN", "HOROVOD_GLOO_TIMEOUT_SECONDS", "HOROVOD_TIMELINE"};

static void clear_job_env(void) {
  for (size_t i = 0; i < HVD_ARRAY_SIZE(job_env); i++)
    unsetenv(job_env[i]);
}

struct hook_log {
  int commits, restores, syncs;
  void *commit_user, *restore_user, *sync_user;
  hvd_status fail_with; /* what the hooks return */
  int32_t seen_at_sync; /* values[0] when the sync hook ran */
  int32_t *values;
};

static hvd_status commit_cb(void *user) {
  struct hook_log *l = user;
  l->commits++;
  l->commit_user = user;
  return l->fail_with;
}

static hvd_status restore_cb(void *user) {
  struct hook_log *l = user;
  l->restores++;
  l->restore_user = user;
  return l->fail_with;
}

static hvd_status sync_cb(void *user) {
  struct hook_log *l = user;
  l->syncs++;
  l->sync_user = user;
  if (l->values != NULL)
    l->seen_at_sync = l->values[0];
  return l->fail_with;
}

static const hvd_elastic_hooks all_hooks = {commit_cb, restore_cb, sync_cb};

static void nop_cb(void *arg) { (void)arg; }

START_TEST(elastic_state_bad_arguments) {
  hvd_elastic_state *s = NULL;
  char name[256];
  int32_t v = 1;

  ck_assert_int_eq(hvd_elastic_state_create(NULL), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_ptr_nonnull(s);
  ck_assert_int_eq(hvd_elastic_state_add(NULL, "v", &v, sizeof(v)), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_state_add(s, NULL, &v, sizeof(v)), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_state_add(s, "", &v, sizeof(v)), HVD_ERR_INVALID_ARGUMENT);
  memset(name, 'n', sizeof(name));
  name[201] = '\0';
  ck_assert_int_eq(hvd_elastic_state_add(s, name, &v, sizeof(v)), HVD_ERR_INVALID_ARGUMENT);
  name[200] = '\0'; /* the longest name allowed */
  ck_assert_msg(hvd_elastic_state_add(s, name, &v, sizeof(v)) == HVD_OK, "%s",
                hvd_last_error_message());
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", NULL, 4), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "'v'"));
  ck_assert_int_eq(hvd_elastic_state_set_hooks(NULL, &all_hooks, NULL), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_state_on_reset(NULL, nop_cb, NULL),
                   HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_state_on_reset(s, NULL, NULL), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_commit(NULL), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_restore(NULL), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_sync(NULL), HVD_ERR_INVALID_ARGUMENT);
  hvd_elastic_state_destroy(s);
  hvd_elastic_state_destroy(NULL);
}
END_TEST

/* Restore goes back to the last commit; before any, to the values the
 * buffers had when they were registered. */
START_TEST(elastic_commit_and_restore) {
  hvd_elastic_state *s = NULL;
  int32_t a[4] = {1, 2, 3, 4};
  double d = 2.5;
  unsigned char empty[1];

  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "a", a, sizeof(a)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "d", &d, sizeof(d)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "empty", empty, 0), HVD_OK);
  a[0] = 100;
  a[3] = -7;
  d = 9.0;
  ck_assert_int_eq(hvd_elastic_restore(s), HVD_OK);
  ck_assert_int_eq(a[0], 1);
  ck_assert_int_eq(a[3], 4);
  ck_assert(d == 2.5);

  for (int i = 0; i < 4; i++)
    a[i] = 10 * (i + 1);
  d = -1.0;
  ck_assert_int_eq(hvd_elastic_commit(s), HVD_OK); /* no hvd_init: nothing to check */
  memset(a, 0, sizeof(a));
  d = 0.0;
  ck_assert_int_eq(hvd_elastic_restore(s), HVD_OK);
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(a[i], 10 * (i + 1));
  ck_assert(d == -1.0);
  /* Restoring twice gives the same values: the snapshot is not consumed. */
  a[1] = 5;
  ck_assert_int_eq(hvd_elastic_restore(s), HVD_OK);
  ck_assert_int_eq(a[1], 20);
  hvd_elastic_state_destroy(s);
}
END_TEST

/* An empty buffer may have no address (add refuses NULL only with bytes):
 * registering, committing, restoring and syncing it do nothing to it. */
START_TEST(elastic_empty_buffer_without_address) {
  hvd_elastic_state *s = NULL;
  int32_t v = 4;

  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "none", NULL, 0), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  v = 5;
  ck_assert_int_eq(hvd_elastic_commit(s), HVD_OK);
  v = 6;
  ck_assert_int_eq(hvd_elastic_restore(s), HVD_OK);
  ck_assert_int_eq(v, 5);
  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_msg(hvd_elastic_sync(s) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(v, 5);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
  hvd_elastic_state_destroy(s);
}
END_TEST

/* Every hook gets the user pointer, once per call. */
START_TEST(elastic_hooks_get_the_user_pointer) {
  hvd_elastic_state *s = NULL;
  struct hook_log log = {.fail_with = HVD_OK};
  int32_t v = 3;

  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_set_hooks(s, &all_hooks, &log), HVD_OK);
  ck_assert_int_eq(hvd_elastic_commit(s), HVD_OK);
  ck_assert_int_eq(log.commits, 1);
  ck_assert_ptr_eq(log.commit_user, &log);
  ck_assert_int_eq(log.restores, 0);
  ck_assert_int_eq(hvd_elastic_restore(s), HVD_OK);
  ck_assert_int_eq(log.restores, 1);
  ck_assert_ptr_eq(log.restore_user, &log);
  ck_assert_int_eq(log.commits, 1);
  /* NULL hooks: none is called any more. */
  ck_assert_int_eq(hvd_elastic_state_set_hooks(s, NULL, NULL), HVD_OK);
  ck_assert_int_eq(hvd_elastic_commit(s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_restore(s), HVD_OK);
  ck_assert_int_eq(log.commits, 1);
  ck_assert_int_eq(log.restores, 1);
  hvd_elastic_state_destroy(s);
}
END_TEST

/* A hook that fails fails the call with the hook's status. A hook is user
 * code: it cannot set hvd's error message, so the status it returns is
 * all there is to go on. */
START_TEST(elastic_failing_hook_fails_the_call) {
  hvd_elastic_state *s = NULL;
  struct hook_log log = {.fail_with = HVD_ERR_IO};
  hvd_status commit, restore;
  int32_t v = 3;

  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_set_hooks(s, &all_hooks, &log), HVD_OK);
  hvd_error_clear(); /* as in a thread that has not failed before */
  commit = hvd_elastic_commit(s);
  hvd_error_clear();
  restore = hvd_elastic_restore(s);
  ck_assert_int_eq(log.commits, 1);
  ck_assert_int_eq(log.restores, 1);
  ck_assert_msg(commit == HVD_ERR_IO && restore == HVD_ERR_IO,
                "with hooks that return HVD_ERR_IO: commit returned %s, restore %s",
                hvd_strerror(commit), hvd_strerror(restore));
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "hook"));
  hvd_elastic_state_destroy(s);
}
END_TEST

/* ==== elastic: a job of one, not elastic ============================================ */

struct train_log {
  int calls;
  hvd_status result;  /* what train returns */
  int syncs_at_first; /* the sync hook's count when train first ran */
  struct hook_log *hooks;
};

static hvd_status train_cb(hvd_elastic_state *state, void *arg) {
  struct train_log *t = arg;
  (void)state;
  if (t->calls++ == 0 && t->hooks != NULL)
    t->syncs_at_first = t->hooks->syncs;
  return t->result;
}

/* Before hvd_init: reset and run need it, commit and restore do not. */
START_TEST(elastic_before_init) {
  hvd_elastic_state *s = NULL;
  struct train_log t = {.result = HVD_OK};
  int32_t v = 3;

  ck_assert_int_eq(hvd_is_initialized(), 0);
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_run(s, train_cb, &t), HVD_ERR_PRECONDITION);
  ck_assert_int_eq(t.calls, 0);
  ck_assert_int_eq(hvd_elastic_reset(), HVD_ERR_PRECONDITION);
  ck_assert_int_eq(hvd_elastic_resets(), 0);
  ck_assert_int_eq(hvd_elastic_commit(s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_hosts_updated(), -1);
  ck_assert_int_eq(hvd_elastic_done(), HVD_OK);
  hvd_elastic_state_destroy(s);
}
END_TEST

START_TEST(elastic_single_rank_sync_keeps_values) {
  hvd_elastic_state *s = NULL;
  struct hook_log log = {.fail_with = HVD_OK};
  int32_t a[3] = {7, 8, 9};
  double d = 0.25;
  unsigned char empty[1];

  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(hvd_size(), 1);
  log.values = a;
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "a", a, sizeof(a)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "d", &d, sizeof(d)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "empty", empty, 0), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_set_hooks(s, &all_hooks, &log), HVD_OK);
  a[1] = 80; /* uncommitted: sync broadcasts the buffers, not the snapshot */
  ck_assert_msg(hvd_elastic_sync(s) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(a[0], 7);
  ck_assert_int_eq(a[1], 80);
  ck_assert_int_eq(a[2], 9);
  ck_assert(d == 0.25);
  ck_assert_int_eq(log.syncs, 1);
  ck_assert_ptr_eq(log.sync_user, &log);
  ck_assert_int_eq(log.seen_at_sync, 7); /* after the buffers were broadcast */
  /* Twice in a row (the broadcast names are used again). */
  ck_assert_msg(hvd_elastic_sync(s) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(log.syncs, 2);
  /* Not elastic: commit only snapshots, and no host ever changes. */
  ck_assert_int_eq(hvd_elastic_commit(s), HVD_OK);
  ck_assert_int_eq(log.commits, 1);
  ck_assert_int_eq(hvd_elastic_hosts_updated(), 0);
  ck_assert_int_eq(hvd_is_homogeneous(), 1);
  hvd_elastic_state_destroy(s);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
}
END_TEST

START_TEST(elastic_failing_sync_hook_fails_sync) {
  hvd_elastic_state *s = NULL;
  struct hook_log log = {.fail_with = HVD_ERR_CONFLICT};
  int32_t v = 3;

  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_set_hooks(s, &all_hooks, &log), HVD_OK);
  hvd_error_clear();
  ck_assert_int_eq(hvd_elastic_sync(s), HVD_ERR_CONFLICT);
  ck_assert_int_eq(log.syncs, 1);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "hook"));
  hvd_elastic_state_destroy(s);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
}
END_TEST

START_TEST(elastic_run_outside_an_elastic_job) {
  hvd_elastic_state *s = NULL;
  struct hook_log log = {.fail_with = HVD_OK};
  struct train_log t = {.result = HVD_OK, .hooks = &log};
  int32_t v[2] = {5, 6};

  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_set_hooks(s, &all_hooks, &log), HVD_OK);
  ck_assert_msg(hvd_elastic_run(s, train_cb, &t) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(t.calls, 1);
  ck_assert_int_eq(t.syncs_at_first, 1); /* synced before training */

  /* A failure that would reset an elastic job is returned as is. */
  t = (struct train_log){.result = HVD_ERR_NETWORK};
  ck_assert_int_eq(hvd_elastic_run(s, train_cb, &t), HVD_ERR_NETWORK);
  ck_assert_int_eq(t.calls, 1);
  ck_assert_int_eq(hvd_elastic_resets(), 0);
  t = (struct train_log){.result = HVD_ERR_HOSTS_UPDATED};
  ck_assert_int_eq(hvd_elastic_run(s, train_cb, &t), HVD_ERR_HOSTS_UPDATED);
  ck_assert_int_eq(t.calls, 1);
  t = (struct train_log){.result = HVD_ERR_MISMATCH};
  ck_assert_int_eq(hvd_elastic_run(s, train_cb, &t), HVD_ERR_MISMATCH);
  ck_assert_int_eq(t.calls, 1);
  ck_assert_int_eq(hvd_elastic_resets(), 0);
  ck_assert_int_eq(hvd_elastic_run(NULL, train_cb, &t), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(hvd_elastic_run(s, NULL, &t), HVD_ERR_INVALID_ARGUMENT);

  ck_assert_int_eq(hvd_elastic_reset(), HVD_ERR_PRECONDITION);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "not an elastic job"));
  ck_assert_int_eq(hvd_elastic_resets(), 0);
  ck_assert_int_eq(hvd_is_initialized(), 1); /* the refused reset left hvd alone */
  hvd_elastic_state_destroy(s);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
  /* And after shutdown, run needs hvd again. */
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  t = (struct train_log){.result = HVD_OK};
  ck_assert_int_eq(hvd_elastic_run(s, train_cb, &t), HVD_ERR_PRECONDITION);
  ck_assert_int_eq(t.calls, 0);
  hvd_elastic_state_destroy(s);
}
END_TEST

/* ==== elastic: the driver's protocol, the driver played by the test =================== */

static struct rdzv_server *esrv;
static struct rdzv_client *ecli;

static void elastic_store_setup(void) {
  struct rdzv_server_config cfg;
  char port[16];

  clear_job_env();
  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  ck_assert_msg(rdzv_server_start(&cfg, &esrv) == HVD_OK, "%s", hvd_last_error_message());
  snprintf(port, sizeof(port), "%d", rdzv_server_port(esrv));
  setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1", 1);
  setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", port, 1);
  ck_assert_int_eq(rdzv_client_create("127.0.0.1", rdzv_server_port(esrv), NULL, 20000, &ecli),
                   HVD_OK);
}

static void elastic_store_teardown(void) {
  rdzv_client_destroy(ecli);
  ecli = NULL;
  rdzv_server_stop(esrv);
  esrv = NULL;
  clear_job_env();
}

static void put(const char *scope, const char *key, const char *value) {
  ck_assert_int_eq(rdzv_client_set(ecli, scope, key, value, strlen(value)), HVD_OK);
}

/* Round n as the driver publishes it: the assignment, latest, round.<n>. */
static void publish_round(unsigned n, unsigned updates, const char *slot, const char *assignment) {
  char scope[48], value[24];
  snprintf(scope, sizeof(scope), "rank_and_size.%u", n);
  if (assignment != NULL)
    put(scope, slot, assignment);
  snprintf(value, sizeof(value), "%u", n);
  put("elastic", "latest", value);
  snprintf(scope, sizeof(scope), "round.%u", n);
  snprintf(value, sizeof(value), "%u", updates);
  put("elastic", scope, value);
}

static void expect_value(const char *scope, const char *key, const char *want) {
  struct hvd_buf v;
  hvd_buf_init(&v, 0);
  ck_assert_msg(rdzv_client_get(ecli, scope, key, &v, NULL) == HVD_OK, "%s/%s: %s", scope, key,
                hvd_last_error_message());
  ck_assert_str_eq(v.data, want);
  hvd_buf_fini(&v);
}

static void slot_env(struct elastic_env *env) {
  memset(env, 0, sizeof(*env));
  env->elastic = true;
  env->timeout_ms = 5000;
  env->reset_limit = -1;
  snprintf(env->host, sizeof(env->host), "nodeA");
  env->local_rank = 1;
}

START_TEST(next_round_takes_the_assignment) {
  struct elastic_env env;
  struct coord_round r;

  slot_env(&env);
  publish_round(3, 2, "nodeA:1", "2,4,1,2,1,2");
  memset(&r, 0, sizeof(r));
  ck_assert_msg(elastic_next_round(&env, 2, &r) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_uint_eq(r.round, 3);
  ck_assert_uint_eq(r.updates, 2);
  ck_assert_int_eq(r.rank, 2);
  ck_assert_int_eq(r.size, 4);
  ck_assert_int_eq(r.local_rank, 1);
  ck_assert_int_eq(r.local_size, 2);
  ck_assert_int_eq(r.cross_rank, 1);
  ck_assert_int_eq(r.cross_size, 2);
  /* It told the driver which round it left. */
  expect_value("elastic_ready", "nodeA:1", "2");
}
END_TEST

/* Leaving round 0 when rounds 1 to 3 are out: round 3 it is, with round
 * 3's update count (the older ones are abandoned already). */
START_TEST(next_round_jumps_to_the_latest) {
  struct elastic_env env;
  struct coord_round r;

  slot_env(&env);
  publish_round(1, 0, "nodeA:1", "-1,-1,-1,-1,-1,-1");
  publish_round(2, 0, "nodeA:1", "1,2,1,2,0,1");
  publish_round(3, 1, "nodeA:1", "0,1,0,1,0,1");
  ck_assert_msg(elastic_next_round(&env, 0, &r) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_uint_eq(r.round, 3);
  ck_assert_uint_eq(r.updates, 1);
  ck_assert_int_eq(r.rank, 0);
  ck_assert_int_eq(r.size, 1);
  expect_value("elastic_ready", "nodeA:1", "0");
}
END_TEST

struct next_round_thread {
  pthread_t thread;
  struct elastic_env env;
  uint64_t leaving;
  struct coord_round round;
  hvd_status status;
  char message[HVD_ERROR_MESSAGE_MAX];
};

static void *next_round_main(void *arg) {
  struct next_round_thread *t = arg;
  t->status = elastic_next_round(&t->env, t->leaving, &t->round);
  snprintf(t->message, sizeof(t->message), "%s", hvd_last_error_message());
  return NULL;
}

/* The worker says it left, then waits for the driver, which publishes
 * the round only after that. */
START_TEST(next_round_waits_for_the_driver) {
  struct next_round_thread t = {.leaving = 4};
  struct hvd_buf v;

  hvd_buf_init(&v, 0);
  slot_env(&t.env);
  pthread_create(&t.thread, NULL, next_round_main, &t);
  ck_assert_int_eq(rdzv_client_wait(ecli, "elastic_ready", "nodeA:1", 20000, &v), HVD_OK);
  ck_assert_str_eq(v.data, "4");
  publish_round(5, 3, "nodeA:1", "1,3,1,3,0,1");
  pthread_join(t.thread, NULL);
  ck_assert_msg(t.status == HVD_OK, "%s", t.message);
  ck_assert_uint_eq(t.round.round, 5);
  ck_assert_uint_eq(t.round.updates, 3);
  ck_assert_int_eq(t.round.rank, 1);
  ck_assert_int_eq(t.round.size, 3);
  ck_assert_int_eq(t.round.local_size, 3);
  hvd_buf_fini(&v);
}
END_TEST

START_TEST(next_round_removed) {
  struct elastic_env env;
  struct coord_round r;

  slot_env(&env);
  publish_round(1, 0, "nodeA:1", "-1,-1,-1,-1,-1,-1");
  ck_assert_int_eq(elastic_next_round(&env, 0, &r), HVD_ERR_REMOVED);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "nodeA:1"));
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "removed"));
  /* No assignment at all for this slot is the same. */
  publish_round(2, 0, "nodeB:0", "0,1,0,1,0,1");
  ck_assert_int_eq(elastic_next_round(&env, 1, &r), HVD_ERR_REMOVED);
  expect_value("elastic_ready", "nodeA:1", "1");
}
END_TEST

START_TEST(next_round_rejects_malformed_answers) {
  static const char *const bad[] = {
      "1,2,3",           "1,2,3,4,5,6,7", "a,b,c,d,e,f", "", "1,2,3,4,5,",
      "4,4,0,1,0,1", /* rank not below size */
      "0,1,1,1,0,1", /* local rank not below local size */
      "0,1,0,1,0,0", /* no cross ranks */
  };
  struct elastic_env env;
  struct coord_round r;

  slot_env(&env);
  for (unsigned i = 0; i < HVD_ARRAY_SIZE(bad); i++) {
    publish_round(i + 1, 0, "nodeA:1", bad[i]);
    ck_assert_msg(elastic_next_round(&env, i, &r) == HVD_ERR_PROTOCOL, "'%s': %s", bad[i],
                  hvd_last_error_message());
  }
  /* Round numbers that are not numbers, or a latest that goes backwards. */
  put("elastic", "round.20", "many");
  put("elastic", "latest", "20");
  ck_assert_int_eq(elastic_next_round(&env, 19, &r), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "elastic/round.20"));
  put("elastic", "round.31", "0");
  put("elastic", "latest", "30");
  ck_assert_int_eq(elastic_next_round(&env, 30, &r), HVD_ERR_PROTOCOL);
}
END_TEST

/* ---- the watch ---------------------------------------------------------------- */

/* Until the watch has seen n updates, at most 20 s (a hang guard). */
static uint64_t await_updates(struct elastic_watch *w, uint64_t n) {
  int64_t deadline = hvd_deadline_after_ms(20000);
  while (elastic_watch_updates(w) < n && hvd_now_ns() < deadline)
    hvd_sleep_ns(5 * 1000000LL);
  return elastic_watch_updates(w);
}

static void await_parked(size_t n) {
  struct rdzv_store_stats stats;
  int64_t deadline = hvd_deadline_after_ms(20000);
  do {
    rdzv_store_get_stats(rdzv_server_store(esrv), &stats);
    if (stats.waiters >= n)
      return;
    hvd_sleep_ns(5 * 1000000LL);
  } while (hvd_now_ns() < deadline);
  ck_assert_uint_ge(stats.waiters, n);
}

START_TEST(watch_counts_updates) {
  struct elastic_watch *w = NULL;

  ck_assert_msg(elastic_watch_start(0, &w) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_uint_eq(elastic_watch_updates(w), 0);
  ck_assert_int_eq(elastic_watch_kinds(w), 0);
  put("elastic", "update.1", "removed");
  ck_assert_uint_eq(await_updates(w, 1), 1);
  ck_assert_int_eq(elastic_watch_kinds(w), HVD_HOSTS_REMOVED);
  put("elastic", "update.2", "added");
  ck_assert_uint_eq(await_updates(w, 2), 2);
  ck_assert_int_eq(elastic_watch_kinds(w), HVD_HOSTS_ADDED | HVD_HOSTS_REMOVED);
  put("elastic", "update.3", "mixed");
  ck_assert_uint_eq(await_updates(w, 3), 3);
  elastic_watch_stop(w);
  elastic_watch_stop(NULL);
  /* A value that is neither counts as both: nobody skips a sync on it. */
  ck_assert_int_eq(elastic_watch_start(3, &w), HVD_OK);
  put("elastic", "update.4", "garbled");
  ck_assert_uint_eq(await_updates(w, 4), 4);
  ck_assert_int_eq(elastic_watch_kinds(w), HVD_HOSTS_ADDED | HVD_HOSTS_REMOVED);
  elastic_watch_stop(w);
}
END_TEST

/* A watch that starts after update 4 counts on from there. */
START_TEST(watch_starts_after_a_count) {
  struct elastic_watch *w = NULL;

  ck_assert_msg(elastic_watch_start(4, &w) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_uint_eq(elastic_watch_updates(w), 4);
  put("elastic", "update.5", "added");
  ck_assert_uint_eq(await_updates(w, 5), 5);
  elastic_watch_stop(w);
}
END_TEST

/* Stopping ends the open long-poll (up to an hour) at once; the tcase's
 * timeout, shorter than one 30 s long-poll chunk, is the guard. */
START_TEST(watch_stop_ends_the_long_poll) {
  struct elastic_watch *w = NULL;

  ck_assert_msg(elastic_watch_start(0, &w) == HVD_OK, "%s", hvd_last_error_message());
  await_parked(1);
  elastic_watch_stop(w);
  /* And a watch that saw updates stops the same way. */
  ck_assert_int_eq(elastic_watch_start(0, &w), HVD_OK);
  put("elastic", "update.1", "added");
  ck_assert_uint_eq(await_updates(w, 1), 1);
  await_parked(1);
  elastic_watch_stop(w);
}
END_TEST

START_TEST(watch_needs_the_store_address) {
  struct elastic_watch *w = NULL;
  unsetenv("HOROVOD_GLOO_RENDEZVOUS_ADDR");
  ck_assert_int_eq(elastic_watch_start(0, &w), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_null(w);
}
END_TEST

/* ==== elastic: a worker of one, reset by the test's driver =============================== */

/* HOROVOD_ELASTIC=1 in slot nodeA:0, round 0; the store already set up. */
static void elastic_worker_env(void) {
  setenv("HOROVOD_ELASTIC", "1", 1);
  setenv("HOROVOD_HOSTNAME", "nodeA", 1);
  setenv("HOROVOD_ELASTIC_TIMEOUT", "20", 1);
}

START_TEST(elastic_commit_sees_host_updates) {
  hvd_elastic_state *s = NULL;
  int32_t v = 1;
  hvd_status st = HVD_OK;
  int64_t deadline;

  elastic_worker_env();
  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_msg(hvd_elastic_commit(s) == HVD_OK, "%s", hvd_last_error_message());
  ck_assert_int_eq(hvd_elastic_hosts_updated(), 0);
  put("elastic", "update.1", "removed");
  deadline = hvd_deadline_after_ms(20000);
  for (v = 2; hvd_now_ns() < deadline; v++) {
    if ((st = hvd_elastic_commit(s)) != HVD_OK)
      break;
    hvd_sleep_ns(5 * 1000000LL);
  }
  ck_assert_msg(st == HVD_ERR_HOSTS_UPDATED, "%s: %s", hvd_strerror(st), hvd_last_error_message());
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "update 1"));
  ck_assert_int_eq(hvd_elastic_hosts_updated(), HVD_HOSTS_REMOVED); /* local, rank 0's */
  /* The interrupted commit still took its snapshot. */
  int32_t committed = v;
  v = 0;
  ck_assert_int_eq(hvd_elastic_restore(s), HVD_OK);
  ck_assert_int_eq(v, committed);
  hvd_elastic_state_destroy(s);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
}
END_TEST

struct elastic_train {
  int calls;
  hvd_status fail_with; /* the first call's result */
  int32_t *value;
  int32_t seen[2]; /* *value when each call began */
  int rank[2], size[2];
  int resets_seen; /* reset callbacks so far, at the second call */
  int callbacks;
  int initialized_in_callback;
};

static void on_reset_cb(void *arg) {
  struct elastic_train *t = arg;
  t->callbacks++;
  t->initialized_in_callback = hvd_is_initialized();
}

static hvd_status elastic_train_cb(hvd_elastic_state *state, void *arg) {
  struct elastic_train *t = arg;
  int call = t->calls++;
  (void)state;
  if (call >= 2)
    return HVD_ERR_INTERNAL; /* a third call: the test fails below */
  t->seen[call] = *t->value;
  t->rank[call] = hvd_rank();
  t->size[call] = hvd_size();
  if (call == 1) {
    t->resets_seen = t->callbacks;
    return HVD_OK;
  }
  *t->value = 42; /* progress after the last commit */
  return t->fail_with;
}

/* One reset after the given failure; returns the train log. */
static void run_with_one_reset(hvd_status failure, struct elastic_train *t) {
  hvd_elastic_state *s = NULL;
  struct coord_round round;
  int32_t v = 7;

  elastic_worker_env();
  publish_round(1, 0, "nodeA:0", "0,1,0,1,0,1");
  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  memset(t, 0, sizeof(*t));
  t->fail_with = failure;
  t->value = &v;
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_on_reset(s, on_reset_cb, t), HVD_OK);
  ck_assert_msg(hvd_elastic_run(s, elastic_train_cb, t) == HVD_OK, "%s",
                hvd_last_error_message());
  ck_assert_int_eq(t->calls, 2);
  ck_assert_int_eq(hvd_elastic_resets(), 1);
  ck_assert_int_eq(t->callbacks, 1);
  ck_assert_int_eq(t->resets_seen, 1);
  ck_assert_int_eq(t->initialized_in_callback, 1);
  ck_assert_int_eq(t->seen[0], 7);
  ck_assert_int_eq(t->rank[1], 0);
  ck_assert_int_eq(t->size[1], 1);
  /* It left round 0 and is in round 1 now. */
  expect_value("elastic_ready", "nodeA:0", "0");
  ck_assert_int_eq(coord_current_round(&round), HVD_OK);
  ck_assert_uint_eq(round.round, 1);
  hvd_elastic_state_destroy(s);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
}

/* A failed peer: the state goes back to the last commit. */
START_TEST(elastic_run_restores_after_a_failure) {
  struct elastic_train t;
  run_with_one_reset(HVD_ERR_NETWORK, &t);
  ck_assert_int_eq(t.seen[1], 7);
}
END_TEST

/* Hosts changed at a commit: nothing is lost, nothing restored. */
START_TEST(elastic_run_keeps_values_after_a_host_update) {
  struct elastic_train t;
  run_with_one_reset(HVD_ERR_HOSTS_UPDATED, &t);
  ck_assert_int_eq(t.seen[1], 42);
}
END_TEST

START_TEST(elastic_run_removed_worker) {
  hvd_elastic_state *s = NULL;
  struct elastic_train t = {.fail_with = HVD_ERR_ABORTED};
  int32_t v = 7;
  int64_t shape[1] = {1};
  float f = 1;
  hvd_tensor tensor = {"t", HVD_FLOAT32, 1, shape, &f, &f};

  elastic_worker_env();
  publish_round(1, 0, "nodeA:0", "-1,-1,-1,-1,-1,-1");
  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  t.value = &v;
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_run(s, elastic_train_cb, &t), HVD_ERR_REMOVED);
  ck_assert_int_eq(t.calls, 1);
  ck_assert_int_eq(hvd_is_initialized(), 0);
  /* From now on hvd says so to every call that needs it. */
  ck_assert_int_eq(hvd_allreduce(&tensor, NULL), HVD_ERR_REMOVED);
  ck_assert_int_eq(hvd_init(), HVD_ERR_REMOVED);
  ck_assert_int_eq(hvd_elastic_run(s, elastic_train_cb, &t), HVD_ERR_REMOVED);
  ck_assert_int_eq(t.calls, 1);
  hvd_elastic_state_destroy(s);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
}
END_TEST

START_TEST(elastic_run_reset_limit) {
  hvd_elastic_state *s = NULL;
  struct elastic_train t = {.fail_with = HVD_ERR_TIMEOUT};
  int32_t v = 7;

  elastic_worker_env();
  setenv("HOROVOD_ELASTIC_RESET_LIMIT", "0", 1);
  ck_assert_msg(hvd_init() == HVD_OK, "%s", hvd_last_error_message());
  t.value = &v;
  ck_assert_int_eq(hvd_elastic_state_create(&s), HVD_OK);
  ck_assert_int_eq(hvd_elastic_state_add(s, "v", &v, sizeof(v)), HVD_OK);
  ck_assert_int_eq(hvd_elastic_run(s, elastic_train_cb, &t), HVD_ERR_TIMEOUT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "HOROVOD_ELASTIC_RESET_LIMIT"));
  ck_assert_int_eq(t.calls, 1);
  ck_assert_int_eq(hvd_elastic_resets(), 0);
  ck_assert_int_eq(hvd_is_initialized(), 1);
  hvd_elastic_state_destroy(s);
  ck_assert_int_eq(hvd_shutdown(), HVD_OK);
}
END_TEST

/* The ABI query a ctypes binding checks against its own declarations. */
START_TEST(abi_describes_the_header) {
  ck_assert_int_eq(hvd_abi_version(), HVD_ABI_VERSION);
  ck_assert_uint_eq(hvd_abi_sizeof("hvd_tensor"), sizeof(hvd_tensor));
  ck_assert_uint_eq(hvd_abi_sizeof("hvd_options"), sizeof(hvd_options));
  ck_assert_uint_eq(hvd_abi_sizeof("hvd_elastic_hooks"), sizeof(hvd_elastic_hooks));
  ck_assert_uint_eq(hvd_abi_sizeof("hvd_handle"), 0);
  ck_assert_uint_eq(hvd_abi_sizeof(""), 0);
  ck_assert_uint_eq(hvd_abi_sizeof(NULL), 0);
  ck_assert_str_eq(hvd_strerror(HVD_ERR_EXISTS), "exists already");
}
END_TEST

Suite *coord_units_suite(void) {
  Suite *s = suite_create("units");
  TCase *tc = tcase_create("units");
  tcase_add_test(tc, requests_round_trip);
  tcase_add_test(tc, requests_truncated_rejected);
  tcase_add_test(tc, requests_corruption_contained);
  tcase_add_test(tc, requests_huge_counts_rejected);
  tcase_add_test(tc, requests_decode_into_space);
  tcase_add_test(tc, responses_round_trip);
  tcase_add_test(tc, responses_bad_lane_rejected);
  tcase_add_test(tc, responses_truncated_rejected);
  tcase_add_test(tc, responses_decode_into_space);
  tcase_add_test(tc, cache_hits_and_invalidation);
  tcase_add_test(tc, keys_name_set_and_tensor);
  tcase_add_test(tc, cache_eligibility);
  tcase_add_test(tc, fusion_groups_compatible_tensors);
  tcase_add_test(tc, validation_names_both_ranks);
  tcase_add_test(tc, config_defaults_and_overrides);
  tcase_add_test(tc, abi_describes_the_header);
  suite_add_tcase(s, tc);
  suite_add_tcase(s, coord_lanes_tcase());

  tc = tcase_create("elastic_state");
  tcase_add_checked_fixture(tc, clear_job_env, clear_job_env);
  tcase_add_test(tc, elastic_state_bad_arguments);
  tcase_add_test(tc, elastic_commit_and_restore);
  tcase_add_test(tc, elastic_empty_buffer_without_address);
  tcase_add_test(tc, elastic_hooks_get_the_user_pointer);
  tcase_add_test(tc, elastic_failing_hook_fails_the_call);
  tcase_add_test(tc, elastic_before_init);
  tcase_add_test(tc, elastic_single_rank_sync_keeps_values);
  tcase_add_test(tc, elastic_failing_sync_hook_fails_sync);
  tcase_add_test(tc, elastic_run_outside_an_elastic_job);
  suite_add_tcase(s, tc);

  tc = tcase_create("elastic_link");
  tcase_add_checked_fixture(tc, elastic_store_setup, elastic_store_teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, next_round_takes_the_assignment);
  tcase_add_test(tc, next_round_jumps_to_the_latest);
  tcase_add_test(tc, next_round_waits_for_the_driver);
  tcase_add_test(tc, next_round_removed);
  tcase_add_test(tc, next_round_rejects_malformed_answers);
  suite_add_tcase(s, tc);

  /* Shorter than one 30 s long-poll chunk: a stop that did not end the
   * watch's long-poll at once would run into it. */
  tc = tcase_create("elastic_watch");
  tcase_add_checked_fixture(tc, elastic_store_setup, elastic_store_teardown);
  tcase_set_timeout(tc, 25);
  tcase_add_test(tc, watch_counts_updates);
  tcase_add_test(tc, watch_starts_after_a_count);
  tcase_add_test(tc, watch_stop_ends_the_long_poll);
  tcase_add_test(tc, watch_needs_the_store_address);
  suite_add_tcase(s, tc);

  tc = tcase_create("elastic_worker");
  tcase_add_checked_fixture(tc, elastic_store_setup, elastic_store_teardown);
  tcase_add_test(tc, elastic_commit_sees_host_updates);
  tcase_add_test(tc, elastic_run_restores_after_a_failure);
  tcase_add_test(tc, elastic_run_keeps_values_after_a_host_update);
  tcase_add_test(tc, elastic_run_removed_worker);
  tcase_add_test(tc, elastic_run_reset_limit);
  suite_add_tcase(s, tc);
  return s;
}
