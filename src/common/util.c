/* Small helpers: strings, secrets, the open-file limit. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>

#include "common.h"

char *hvd_strndup(const char *s, size_t len) {
  char *copy = malloc(len + 1);
  if (copy == NULL)
    return NULL;
  memcpy(copy, s, len);
  copy[len] = '\0';
  return copy;
}

void hvd_printable(const char *text, char *out, size_t size) {
  size_t n = 0;
  if (size == 0)
    return;
  for (; text[n] != '\0' && n + 1 < size; n++) {
    unsigned char c = (unsigned char)text[n];
    out[n] = c < 0x20 || c == 0x7f ? '?' : (char)c;
  }
  out[n] = '\0';
}

void *hvd_zalloc(size_t n, size_t size) {
  void *p;

  if (size != 0 && n > SIZE_MAX / size)
    return NULL;
  if ((p = malloc(n * size != 0 ? n * size : 1)) != NULL)
    memset(p, 0, n * size);
  return p;
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

uint64_t hvd_raise_fd_limit(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      rl.rlim_cur = old;
  }
  return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}

hvd_status hvd_random_token(char *out) {
  unsigned char raw[HVD_TOKEN_HEX_DIGITS / 2];
  size_t got = 0;
  while (got < sizeof(raw)) {
    ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0 && errno != EINTR)
      return hvd_error(HVD_ERR_IO, "cannot make a job token: getrandom: %s", strerror(errno));
    if (n > 0)
      got += (size_t)n;
  }
  for (size_t i = 0; i < sizeof(raw); i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
  explicit_bzero(raw, sizeof(raw));
  return HVD_OK;
}
