/*
 * The whole-scope body (src/rendezvous/scope_codec.c), as a client decodes
 * what the server sent. A body that decodes must list its keys in strictly
 * increasing order (the order rdzv_scope_find bisects in), every key must
 * be found again, and encoding the entries again must give a body that
 * decodes to the same entries.
 */
#include <string.h>

#include "fuzz.h"
#include "rendezvous/rendezvous.h"

static char *copy(const void *data, size_t size) {
  char *c = malloc(size > 0 ? size : 1);
  if (c != NULL && size > 0)
    memcpy(c, data, size);
  return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct rdzv_scope_view view, again;
  struct hvd_buf body;
  char *input = copy(data, size);

  FUZZ_CHECK(input != NULL, "out of memory");
  /* The decoder takes the body whatever happens (it writes NULs into it). */
  if (rdzv_scope_decode(input, size, &view) != HVD_OK)
    return 0;
  hvd_buf_init(&body, 0);
  for (size_t i = 0; i < view.count; i++) {
    const struct rdzv_entry *e = &view.entries[i];
    FUZZ_CHECK(e->key[e->key_len] == '\0' && e->value[e->value_len] == '\0',
               "entry %zu is not NUL-terminated", i);
    if (i > 0) {
      const struct rdzv_entry *p = &view.entries[i - 1];
      FUZZ_CHECK(rdzv_key_compare(p->key, p->key_len, e->key, e->key_len) < 0 &&
                     rdzv_key_compare(e->key, e->key_len, p->key, p->key_len) > 0,
                 "keys %zu and %zu are out of order or compare inconsistently", i - 1, i);
    }
    FUZZ_CHECK(rdzv_key_compare(e->key, e->key_len, e->key, e->key_len) == 0,
               "key %zu differs from itself", i);
    /* rdzv_scope_find takes a C string: keys with a NUL cannot be asked for. */
    if (memchr(e->key, '\0', e->key_len) == NULL)
      FUZZ_CHECK(rdzv_scope_find(&view, e->key) == e, "key %zu is not found", i);
    FUZZ_CHECK(rdzv_scope_encode_entry(&body, e->key, e->key_len, e->value, e->value_len) ==
                   HVD_OK,
               "%s", hvd_last_error_message());
  }
  {
    size_t len = body.len;
    char *detached = hvd_buf_detach(&body, &len);
    FUZZ_CHECK(rdzv_scope_decode(detached, len, &again) == HVD_OK, "%s",
               hvd_last_error_message());
  }
  FUZZ_CHECK(again.count == view.count, "%zu entries became %zu", view.count, again.count);
  for (size_t i = 0; i < view.count; i++) {
    const struct rdzv_entry *a = &view.entries[i], *b = &again.entries[i];
    FUZZ_CHECK(a->key_len == b->key_len && memcmp(a->key, b->key, a->key_len) == 0 &&
                   a->value_len == b->value_len && memcmp(a->value, b->value, a->value_len) == 0,
               "entry %zu changed in a round trip", i);
  }
  rdzv_scope_view_fini(&again);
  rdzv_scope_view_fini(&view);
  hvd_buf_fini(&body);
  return 0;
}
