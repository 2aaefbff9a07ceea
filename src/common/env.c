/*
 * The environment, as the settings table reads it (settings.c parses and
 * checks the values): a variable's text, or the value the launch module
 * provided for it where the environment has none.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { PROVIDED_MAX = 32 };

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
