/* Strict number and boolean parsing shared by env, flags and wire formats. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

bool hvd_parse_int64(const char *text, size_t len, int64_t *out) {
  size_t i = 0;
  bool negative = false;
  uint64_t magnitude = 0;
  uint64_t limit;

  if (len > 0 && (text[0] == '-' || text[0] == '+')) {
    negative = text[0] == '-';
    i = 1;
  }
  if (i == len)
    return false;
  limit = negative ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
  for (; i < len; i++) {
    unsigned digit = (unsigned char)text[i] - '0';
    if (digit > 9)
      return false;
    if (magnitude > (limit - digit) / 10)
      return false;
    magnitude = magnitude * 10 + digit;
  }
  if (negative)
    *out = magnitude == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)magnitude;
  else
    *out = (int64_t)magnitude;
  return true;
}

bool hvd_parse_double(const char *text, double *out) {
  char *end = NULL;
  double v;

  if (*text == '\0' || isspace((unsigned char)*text)) /* strtod would skip blanks */
    return false;
  errno = 0;
  v = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !isfinite(v))
    return false;
  *out = v;
  return true;
}

bool hvd_parse_bool(const char *text, bool *out) {
  static const char *const yes[] = {"1", "true", "yes", "on", "y"};
  static const char *const no[] = {"0", "false", "no", "off", "n"};

  for (size_t i = 0; i < HVD_ARRAY_SIZE(yes); i++) {
    if (strcasecmp(text, yes[i]) == 0) {
      *out = true;
      return true;
    }
    if (strcasecmp(text, no[i]) == 0) {
      *out = false;
      return true;
    }
  }
  return false;
}

/* A port "1".."65535": digits only, no sign, no blanks. */
static bool parse_port(const char *text, size_t len, int *out) {
  int64_t v;

  if (len == 0 || !isdigit((unsigned char)text[0]))
    return false;
  if (!hvd_parse_int64(text, len, &v) || v < 1 || v > 65535)
    return false;
  *out = (int)v;
  return true;
}

hvd_status hvd_parse_port_range(const char *text, int *lo, int *hi) {
  const char *dash = strchr(text, '-');
  size_t first_len = dash != NULL ? (size_t)(dash - text) : strlen(text);
  int a = 0;
  int b = 0;

  if (!parse_port(text, first_len, &a))
    goto bad;
  b = a;
  if (dash != NULL && !parse_port(dash + 1, strlen(dash + 1), &b))
    goto bad;
  if (a > b)
    goto bad;
  *lo = a;
  *hi = b;
  return HVD_OK;
bad:
  return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "HVD_PORT_RANGE='%s' is malformed: expected a port 'A' or a range 'A-B' with "
                   "1 <= A <= B <= 65535 (e.g. 40000-40100), or unset for any free port",
                   text);
}
