/*
 * The whole-scope body: entries of
 *   "<key bytes> <value bytes>\n" <key> "\n" <value> "\n"
 * Lengths come first so values may hold any bytes; the separators let the
 * decoder NUL-terminate keys and values in place, and keep the body readable
 * with curl when values are text. The decoder trusts nothing: every length is
 * checked against what is left before it is used, and keys must arrive in
 * strictly increasing order.
 */
#include <stdlib.h>
#include <string.h>

#include "rendezvous.h"

static bool all_digits(const char *s, size_t len) {
  if (len == 0)
    return false;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return false;
  }
  return true;
}

int rdzv_key_compare(const char *a, size_t a_len, const char *b, size_t b_len) {
  bool a_num = all_digits(a, a_len);
  bool b_num = all_digits(b, b_len);
  size_t n = a_len < b_len ? a_len : b_len;
  int c;

  if (a_num != b_num)
    return a_num ? -1 : 1;
  if (a_num) {
    /* Compare decimal numbers of any length: skip leading zeros, then the
     * longer number is larger, then digits decide. */
    size_t za = 0, zb = 0;
    while (za + 1 < a_len && a[za] == '0')
      za++;
    while (zb + 1 < b_len && b[zb] == '0')
      zb++;
    if (a_len - za != b_len - zb)
      return a_len - za < b_len - zb ? -1 : 1;
    c = memcmp(a + za, b + zb, a_len - za);
    if (c != 0)
      return c;
  }
  c = memcmp(a, b, n);
  if (c != 0)
    return c;
  return a_len < b_len ? -1 : (a_len > b_len ? 1 : 0);
}

hvd_status rdzv_scope_encode_entry(struct hvd_buf *out, const char *key, size_t key_len,
                                   const void *value, size_t value_len) {
  hvd_status st = hvd_buf_printf(out, "%zu %zu\n", key_len, value_len);
  if (st == HVD_OK)
    st = hvd_buf_append(out, key, key_len);
  if (st == HVD_OK)
    st = hvd_buf_append(out, "\n", 1);
  if (st == HVD_OK)
    st = hvd_buf_append(out, value, value_len);
  if (st == HVD_OK)
    st = hvd_buf_append(out, "\n", 1);
  return st;
}

/* Parses "<digits> <digits>\n" at *pos; false on anything else. */
static bool parse_header(const char *body, size_t len, size_t *pos, size_t *key_len,
                         size_t *value_len) {
  int64_t numbers[2];
  for (int i = 0; i < 2; i++) {
    size_t start = *pos;
    char sep = i == 0 ? ' ' : '\n';
    while (*pos < len && body[*pos] >= '0' && body[*pos] <= '9' && *pos - start < 19)
      (*pos)++;
    if (*pos == start || *pos >= len || body[*pos] != sep ||
        !hvd_parse_int64(body + start, *pos - start, &numbers[i]))
      return false;
    (*pos)++;
  }
  *key_len = (size_t)numbers[0];
  *value_len = (size_t)numbers[1];
  return true;
}

/* Walks the body; fills entries when it is not NULL. Returns the count or -1. */
static long walk(char *body, size_t len, struct rdzv_entry *entries) {
  size_t pos = 0;
  long count = 0;
  const char *prev_key = NULL;
  size_t prev_len = 0;

  while (pos < len) {
    size_t key_len, value_len;
    if (!parse_header(body, len, &pos, &key_len, &value_len))
      return -1;
    if (key_len > len - pos || len - pos - key_len < 1 || body[pos + key_len] != '\n')
      return -1;
    /* Strictly increasing keys: no duplicates, and lookups can bisect. */
    if (prev_key != NULL && rdzv_key_compare(prev_key, prev_len, body + pos, key_len) >= 0)
      return -1;
    prev_key = body + pos;
    prev_len = key_len;
    if (entries != NULL) {
      entries[count].key = body + pos;
      entries[count].key_len = key_len;
      body[pos + key_len] = '\0';
    }
    pos += key_len + 1;
    if (value_len > len - pos || len - pos - value_len < 1 || body[pos + value_len] != '\n')
      return -1;
    if (entries != NULL) {
      entries[count].value = (const unsigned char *)body + pos;
      entries[count].value_len = value_len;
      body[pos + value_len] = '\0';
    }
    pos += value_len + 1;
    count++;
  }
  return count;
}

hvd_status rdzv_scope_decode(char *body, size_t len, struct rdzv_scope_view *out) {
  long count = body != NULL ? walk(body, len, NULL) : 0;
  struct rdzv_entry *entries = NULL;

  if (count < 0) {
    free(body);
    return hvd_error(HVD_ERR_PROTOCOL, "malformed scope body (%zu bytes)", len);
  }
  if (count > 0) {
    entries = calloc((size_t)count, sizeof(*entries));
    if (entries == NULL) {
      free(body);
      return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate %ld scope entries", count);
    }
    walk(body, len, entries);
  }
  out->entries = entries;
  out->count = (size_t)count;
  out->body = body;
  return HVD_OK;
}

const struct rdzv_entry *rdzv_scope_find(const struct rdzv_scope_view *v, const char *key) {
  size_t key_len = strlen(key);
  size_t lo = 0, hi = v->count;

  /* Entries arrive in key order: binary search. */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = rdzv_key_compare(v->entries[mid].key, v->entries[mid].key_len, key, key_len);
    if (c == 0)
      return &v->entries[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

void rdzv_scope_view_fini(struct rdzv_scope_view *v) {
  free(v->entries);
  free(v->body);
  memset(v, 0, sizeof(*v));
}
