/* A growable byte buffer with a hard cap, for data whose size a peer decides. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

void hvd_buf_init(struct hvd_buf *b, size_t max) {
  memset(b, 0, sizeof(*b));
  b->max = max;
}

void hvd_buf_fini(struct hvd_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

void hvd_buf_reset(struct hvd_buf *b) {
  b->len = 0;
  if (b->data != NULL)
    b->data[0] = '\0';
}

hvd_status hvd_buf_reserve(struct hvd_buf *b, size_t extra) {
  size_t need, cap;
  char *p;

  if (extra > SIZE_MAX - b->len - 1)
    return hvd_error(HVD_ERR_TOO_LARGE, "buffer size overflow");
  need = b->len + extra;
  if (b->max != 0 && need > b->max)
    return hvd_error(HVD_ERR_TOO_LARGE, "%zu bytes exceed the limit of %zu bytes", need, b->max);
  if (need + 1 <= b->cap)
    return HVD_OK;
  cap = b->cap < 64 ? 64 : b->cap;
  while (cap < need + 1)
    cap = cap > SIZE_MAX / 2 ? need + 1 : cap * 2;
  p = realloc(b->data, cap);
  if (p == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate %zu bytes", cap);
  b->data = p;
  b->cap = cap;
  return HVD_OK;
}

size_t hvd_buf_room(const struct hvd_buf *b) {
  size_t room = b->data != NULL && b->cap > b->len ? b->cap - b->len - 1 : 0; /* one for the NUL */

  if (b->max != 0 && b->max - b->len < room)
    room = b->max - b->len;
  return room;
}

hvd_status hvd_buf_append(struct hvd_buf *b, const void *data, size_t len) {
  hvd_status st = hvd_buf_reserve(b, len);
  if (st != HVD_OK)
    return st;
  if (len > 0)
    memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
  return HVD_OK;
}

hvd_status hvd_buf_printf(struct hvd_buf *b, const char *fmt, ...) {
  va_list ap;
  int n;
  hvd_status st;

  va_start(ap, fmt);
  n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "bad format '%s'", fmt);
  st = hvd_buf_reserve(b, (size_t)n);
  if (st != HVD_OK)
    return st;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return HVD_OK;
}

char *hvd_buf_detach(struct hvd_buf *b, size_t *len) {
  char *data = b->data;
  if (len != NULL)
    *len = b->len;
  b->data = NULL;
  b->len = b->cap = 0;
  return data;
}

hvd_status hvd_array_reserve(void *array, size_t *cap, size_t need, size_t size, size_t first) {
  void *items, *grown;
  size_t ncap = *cap > first ? *cap : first;

  memcpy(&items, array, sizeof(items));
  if (need <= *cap && items != NULL)
    return HVD_OK;
  while (ncap < need)
    ncap = ncap > SIZE_MAX / 2 ? need : 2 * ncap;
  if (size != 0 && ncap > SIZE_MAX / size)
    return hvd_error(HVD_ERR_TOO_LARGE, "an array of %zu elements of %zu bytes", ncap, size);
  if ((grown = realloc(items, ncap * size)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot grow an array to %zu elements", ncap);
  memcpy(array, &grown, sizeof(grown));
  *cap = ncap;
  return HVD_OK;
}
