/* Small string helpers. */
#include <stdlib.h>
#include <string.h>

#include "common.h"

char *hvd_strndup(const char *s, size_t len) {
  char *copy = malloc(len + 1);
  if (copy == NULL)
    return NULL;
  memcpy(copy, s, len);
  copy[len] = '\0';
  return copy;
}

bool hvd_secure_equal(const void *a, size_t a_len, const void *b, size_t b_len) {
  const unsigned char *x = a;
  const unsigned char *y = b;
  unsigned char diff = (unsigned char)(a_len != b_len);
  size_t n = a_len < b_len ? a_len : b_len;

  for (size_t i = 0; i < n; i++)
    diff |= x[i] ^ y[i];
  return diff == 0;
}
