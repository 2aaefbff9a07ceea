/*
 * The coordinator's wire messages (src/coord/message.c): every input goes
 * to both decoders. A list that decodes is encoded again, and that encoding
 * must decode to the same list and re-encode to the same bytes, with the
 * input's length: the decoder accepts nothing the encoder cannot say, and
 * the encoder says everything the decoder read.
 */
#include <string.h>

#include "common/common.h"
#include "coord/coord.h"
#include "fuzz.h"

static bool same_bytes(const void *a, const void *b, size_t n) {
  return n == 0 || memcmp(a, b, n) == 0;
}

/* Doubles by their bits: NaN payloads travel too. */
static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof(a)) == 0; }

static bool same_str(const char *a, const char *b) {
  if (a == NULL || b == NULL)
    return a == b;
  return strcmp(a, b) == 0;
}

static bool same_request(const struct coord_request *a, const struct coord_request *b) {
  return a->type == b->type && a->dtype == b->dtype && a->op == b->op && a->set == b->set &&
         a->root == b->root && a->device == b->device && a->group_size == b->group_size &&
         same_double(a->prescale, b->prescale) && same_double(a->postscale, b->postscale) &&
         a->ndims == b->ndims && same_bytes(a->shape, b->shape, (size_t)a->ndims * 8) &&
         a->nranks == b->nranks && same_bytes(a->ranks, b->ranks, a->nranks * 4u) &&
         a->name_len == b->name_len && same_bytes(a->name, b->name, a->name_len) &&
         a->group_len == b->group_len && same_str(a->group, b->group) &&
         a->inline_len == b->inline_len && same_bytes(a->inline_data, b->inline_data, a->inline_len);
}

static bool same_requests(const struct coord_request_list *a, const struct coord_request_list *b) {
  if (a->ack != b->ack || a->flags != b->flags || a->abort_status != b->abort_status ||
      !same_str(a->abort_message, b->abort_message) || a->hits_bytes != b->hits_bytes ||
      !same_bytes(a->hits, b->hits, a->hits_bytes) || a->n != b->n ||
      a->ninline_hits != b->ninline_hits)
    return false;
  for (uint32_t i = 0; i < a->n; i++) {
    if (!same_request(&a->reqs[i], &b->reqs[i]))
      return false;
  }
  for (uint32_t i = 0; i < a->ninline_hits; i++) {
    const struct coord_inline_hit *x = &a->inline_hits[i], *y = &b->inline_hits[i];
    if (x->bit != y->bit || x->len != y->len || !same_bytes(x->data, y->data, x->len))
      return false;
  }
  return true;
}

static bool same_response(const struct coord_response *a, const struct coord_response *b) {
  if (a->cached != b->cached || a->ntensors != b->ntensors || a->data_len != b->data_len ||
      !same_bytes(a->bits, b->bits, a->ntensors * 4u) || !same_bytes(a->data, b->data, a->data_len))
    return false;
  if (a->cached)
    return true; /* the rest of a cached response comes from the cache, not the wire */
  if (a->type != b->type || a->dtype != b->dtype || a->op != b->op || a->status != b->status ||
      a->set != b->set || a->root != b->root || a->device != b->device ||
      a->last_joined != b->last_joined || a->new_set != b->new_set ||
      !same_double(a->prescale, b->prescale) || !same_double(a->postscale, b->postscale) ||
      a->ncounts != b->ncounts || !same_bytes(a->counts, b->counts, a->ncounts * 8u) ||
      a->nranks != b->nranks || !same_bytes(a->ranks, b->ranks, a->nranks * 4u) ||
      !same_str(a->error, b->error))
    return false;
  for (uint32_t i = 0; i < a->ntensors; i++) {
    if (!same_str(a->names[i], b->names[i]))
      return false;
  }
  return true;
}

static bool same_responses(const struct coord_response_list *a,
                           const struct coord_response_list *b) {
  if (a->seq != b->seq || a->flags != b->flags || a->abort_status != b->abort_status ||
      !same_str(a->abort_message, b->abort_message) || a->nretired != b->nretired ||
      !same_bytes(a->retired, b->retired, a->nretired * 4u) || a->n != b->n)
    return false;
  for (uint32_t i = 0; i < a->n; i++) {
    if (!same_response(&a->resps[i], &b->resps[i]))
      return false;
  }
  return true;
}

static void requests(const uint8_t *data, size_t size) {
  struct coord_request_list first, second;
  struct hvd_buf once, twice;

  if (coord_decode_requests(data, size, &first) != HVD_OK)
    return;
  hvd_buf_init(&once, COORD_MAX_MESSAGE);
  hvd_buf_init(&twice, COORD_MAX_MESSAGE);
  FUZZ_CHECK(coord_encode_requests(&first, &once) == HVD_OK, "%s", hvd_last_error_message());
  FUZZ_CHECK(once.len == size, "re-encoded %zu bytes from %zu", once.len, size);
  FUZZ_CHECK(coord_decode_requests(once.data, once.len, &second) == HVD_OK, "%s",
             hvd_last_error_message());
  FUZZ_CHECK(same_requests(&first, &second), "a request list changed in a round trip");
  FUZZ_CHECK(coord_encode_requests(&second, &twice) == HVD_OK, "%s", hvd_last_error_message());
  FUZZ_CHECK(twice.len == once.len && memcmp(twice.data, once.data, once.len) == 0,
             "a request list encodes two ways");
  coord_request_list_fini(&second);
  coord_request_list_fini(&first);
  hvd_buf_fini(&twice);
  hvd_buf_fini(&once);
}

static void responses(const uint8_t *data, size_t size) {
  struct coord_response_list first, second;
  struct hvd_buf once, twice;

  if (coord_decode_responses(data, size, &first) != HVD_OK)
    return;
  hvd_buf_init(&once, COORD_MAX_MESSAGE);
  hvd_buf_init(&twice, COORD_MAX_MESSAGE);
  FUZZ_CHECK(coord_encode_responses(&first, &once) == HVD_OK, "%s", hvd_last_error_message());
  FUZZ_CHECK(once.len == size, "re-encoded %zu bytes from %zu", once.len, size);
  FUZZ_CHECK(coord_decode_responses(once.data, once.len, &second) == HVD_OK, "%s",
             hvd_last_error_message());
  FUZZ_CHECK(same_responses(&first, &second), "a response list changed in a round trip");
  FUZZ_CHECK(coord_encode_responses(&second, &twice) == HVD_OK, "%s", hvd_last_error_message());
  FUZZ_CHECK(twice.len == once.len && memcmp(twice.data, once.data, once.len) == 0,
             "a response list encodes two ways");
  coord_response_list_fini(&second);
  coord_response_list_fini(&first);
  hvd_buf_fini(&twice);
  hvd_buf_fini(&once);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  requests(data, size);
  responses(data, size);
  return 0;
}
