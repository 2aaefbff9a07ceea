/*
 * Environments and shell quoting for the commands hvdrun starts.
 */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "hvdrun.h"

static size_t name_len(const char *kv) { return strcspn(kv, "="); }

hvd_status hvdrun_env_put(struct hvdrun_env *e, const char *kv) {
  size_t nl = name_len(kv);
  char *copy = hvd_strndup(kv, strlen(kv));

  if (copy == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a rank's environment");
  for (size_t i = 0; i < e->n; i++) {
    if (name_len(e->vars[i]) == nl && strncmp(e->vars[i], kv, nl) == 0) {
      free(e->vars[i]);
      e->vars[i] = copy;
      return HVD_OK;
    }
  }
  if (hvd_array_reserve(&e->vars, &e->cap, e->n + 1, sizeof(*e->vars), 64) != HVD_OK) {
    free(copy);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a rank's environment");
  }
  e->vars[e->n++] = copy;
  return HVD_OK;
}

hvd_status hvdrun_env_set(struct hvdrun_env *e, const char *name, const char *fmt, ...) {
  /* Sized to the value: a PYTHONPATH or an exported variable may be long. */
  size_t nl = strlen(name);
  char *kv = NULL;
  hvd_status st;
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || (kv = malloc(nl + (size_t)n + 2)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a rank's environment");
  memcpy(kv, name, nl);
  kv[nl] = '=';
  va_start(ap, fmt);
  vsnprintf(kv + nl + 1, (size_t)n + 1, fmt, ap);
  va_end(ap);
  st = hvdrun_env_put(e, kv);
  free(kv);
  return st;
}

char **hvdrun_env_array(const struct hvdrun_env *e) {
  char **a = malloc((e->n + 1) * sizeof(*a));
  if (a == NULL)
    return NULL;
  memcpy(a, e->vars, e->n * sizeof(*a));
  a[e->n] = NULL;
  return a;
}

void hvdrun_env_fini(struct hvdrun_env *e) {
  for (size_t i = 0; i < e->n; i++)
    free(e->vars[i]);
  free(e->vars);
  memset(e, 0, sizeof(*e));
}

static hvd_status append(char **out, size_t *len, size_t *cap, const char *s, size_t n);

hvd_status hvdrun_append(char **out, size_t *len, size_t *cap, const char *text) {
  return append(out, len, cap, text, strlen(text));
}

hvd_status hvdrun_argv_add(struct hvdrun_argv *a, const char *arg) {
  char *copy = hvd_strndup(arg, strlen(arg));
  if (copy == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a command line");
  /* Room for the new argument and the NULL after it. */
  if (hvd_array_reserve(&a->v, &a->cap, a->n + 2, sizeof(*a->v), 16) != HVD_OK) {
    free(copy);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a command line");
  }
  a->v[a->n++] = copy;
  a->v[a->n] = NULL;
  return HVD_OK;
}

void hvdrun_argv_fini(struct hvdrun_argv *a) {
  for (size_t i = 0; i < a->n; i++)
    free(a->v[i]);
  free(a->v);
  memset(a, 0, sizeof(*a));
}

static hvd_status append(char **out, size_t *len, size_t *cap, const char *s, size_t n) {
  if (hvd_array_reserve(out, cap, *len + n + 1, 1, 256) != HVD_OK)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a remote command");
  memcpy(*out + *len, s, n);
  *len += n;
  (*out)[*len] = '\0';
  return HVD_OK;
}

hvd_status hvdrun_shell_quote(const char *text, char **out, size_t *len, size_t *cap) {
  hvd_status st = append(out, len, cap, "'", 1);
  for (const char *p = text; st == HVD_OK && *p != '\0'; p++) {
    if (*p == '\'')
      st = append(out, len, cap, "'\\''", 4);
    else
      st = append(out, len, cap, p, 1);
  }
  if (st == HVD_OK)
    st = append(out, len, cap, "'", 1);
  return st;
}
