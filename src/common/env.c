/*
 * Environment parsing. A malformed value is an error that names the variable
 * and the value: a typo in HOROVOD_GLOO_TIMEOUT_SECONDS must never turn into
 * a silent 0. Surrounding blanks are tolerated, anything else is not.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { ENV_VALUE_MAX = 256, PROVIDED_MAX = 32 };

/* Values the launch module derived from a launcher's own variables. A
 * value, once handed out, stays valid for the life of the process: a
 * replaced one moves to `retired` instead of being freed (a value changes
 * only where a later hvd_init derives another). */
struct provided {
  char *name, *value;
};
static pthread_mutex_t provided_mu = PTHREAD_MUTEX_INITIALIZER;
static struct provided provided[PROVIDED_MAX]; /* under provided_mu */
static size_t nprovided;
static struct retired {
  struct retired *next;
  char *value;
} *retired;

static const char *find_provided(const char *name) {
  const char *v = NULL;
  pthread_mutex_lock(&provided_mu);
  for (size_t i = 0; i < nprovided && v == NULL; i++) {
    if (strcmp(provided[i].name, name) == 0)
      v = provided[i].value;
  }
  pthread_mutex_unlock(&provided_mu);
  return v;
}

static void retire(char *value) {
  struct retired *r = malloc(sizeof(*r));
  if (r == NULL)
    return; /* a string lost, not a value wrong */
  r->value = value;
  r->next = retired;
  retired = r;
}

hvd_status hvd_env_provide(const char *name, const char *value) {
  hvd_status st = HVD_OK;
  char *copy = strdup(value);
  size_t i;

  if (copy == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot provide %s", name);
  pthread_mutex_lock(&provided_mu);
  for (i = 0; i < nprovided && strcmp(provided[i].name, name) != 0; i++) {
  }
  if (i < nprovided) {
    if (strcmp(provided[i].value, value) == 0) {
      free(copy);
    } else {
      retire(provided[i].value);
      provided[i].value = copy;
    }
  } else if (nprovided == PROVIDED_MAX) {
    free(copy);
    st = hvd_error(HVD_ERR_INTERNAL, "more than %d provided variables (%s)", PROVIDED_MAX, name);
  } else if ((provided[i].name = strdup(name)) == NULL) {
    free(copy);
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot provide %s", name);
  } else {
    provided[i].value = copy;
    nprovided++;
  }
  pthread_mutex_unlock(&provided_mu);
  return st;
}

const char *hvd_env_real(const char *name) {
  const char *v = getenv(name);
  return (v != NULL && v[0] != '\0') ? v : NULL;
}

const char *hvd_env_str(const char *name) {
  const char *v = hvd_env_real(name);
  return v != NULL ? v : find_provided(name);
}

/* Copies the value without surrounding blanks; false if it does not fit. */
static bool trimmed(const char *v, char *buf, size_t size) {
  size_t len;
  while (isspace((unsigned char)*v))
    v++;
  len = strlen(v);
  while (len > 0 && isspace((unsigned char)v[len - 1]))
    len--;
  if (len >= size)
    return false;
  memcpy(buf, v, len);
  buf[len] = '\0';
  return true;
}

hvd_status hvd_env_int(const char *name, int64_t def, int64_t min, int64_t max, int64_t *out) {
  const char *v = hvd_env_str(name);
  char buf[ENV_VALUE_MAX];
  int64_t x;

  if (v == NULL) {
    *out = def;
    return HVD_OK;
  }
  if (!trimmed(v, buf, sizeof(buf)) || !hvd_parse_int64(buf, strlen(buf), &x))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s='%.64s' is not an integer", name, v);
  if (x < min || x > max)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s=%" PRId64 " is out of range (allowed: %" PRId64 " to %" PRId64 ")",
                     name, x, min, max);
  *out = x;
  return HVD_OK;
}

hvd_status hvd_env_double(const char *name, double def, double min, double max, double *out) {
  const char *v = hvd_env_str(name);
  char buf[ENV_VALUE_MAX];
  double x;

  if (v == NULL) {
    *out = def;
    return HVD_OK;
  }
  if (!trimmed(v, buf, sizeof(buf)) || !hvd_parse_double(buf, &x))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s='%.64s' is not a number", name, v);
  if (x < min || x > max)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s=%g is out of range (allowed: %g to %g)", name,
                     x, min, max);
  *out = x;
  return HVD_OK;
}

hvd_status hvd_env_bool(const char *name, bool def, bool *out) {
  const char *v = hvd_env_str(name);
  char buf[ENV_VALUE_MAX];
  bool x;

  if (v == NULL) {
    *out = def;
    return HVD_OK;
  }
  if (!trimmed(v, buf, sizeof(buf)) || !hvd_parse_bool(buf, &x))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s='%.64s' is not a boolean (use 1/0, true/false, yes/no or on/off)", name,
                     v);
  *out = x;
  return HVD_OK;
}
