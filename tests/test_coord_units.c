/*
 * Unit tests of the coordinator's pieces that need no peers: the message
 * codec (round trips, and every truncation or corruption rejected), the
 * response cache, fusion, validation and the configuration.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "coord/coord.h"

Suite *coord_units_suite(void);

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

Suite *coord_units_suite(void) {
  Suite *s = suite_create("units");
  TCase *tc = tcase_create("units");
  tcase_add_test(tc, requests_round_trip);
  tcase_add_test(tc, requests_truncated_rejected);
  tcase_add_test(tc, requests_corruption_contained);
  tcase_add_test(tc, requests_huge_counts_rejected);
  tcase_add_test(tc, responses_round_trip);
  tcase_add_test(tc, responses_truncated_rejected);
  tcase_add_test(tc, cache_hits_and_invalidation);
  tcase_add_test(tc, keys_name_set_and_tensor);
  tcase_add_test(tc, cache_eligibility);
  tcase_add_test(tc, fusion_groups_compatible_tensors);
  tcase_add_test(tc, validation_names_both_ranks);
  tcase_add_test(tc, config_defaults_and_overrides);
  suite_add_tcase(s, tc);
  return s;
}
