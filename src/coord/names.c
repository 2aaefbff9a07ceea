/*
 * Generated operation names. An operation submitted without a name is
 * named after the calls of its kind this rank has made in its set:
 * `<kind>.noname.<n>` (a group's tensors add `.<i>`; join, barrier and the
 * process-set operations use the kinds `hvd.barrier`, ...), so ranks that
 * call in the same order agree on every name.
 *
 * A rank in hvd_join makes no calls, yet the others' allreduces, barriers
 * and process-set changes run on it, and each of them advanced the others'
 * counters. When such a response runs on a joined rank, coord_names_seen
 * advances this rank's counter past the number it carries, so once the
 * join round ends every rank's next generated name is the same again.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

static size_t counter_key(char *out, size_t size, int set, const char *kind, size_t kind_len) {
  int n = snprintf(out, size, "%d:%.*s", set, (int)kind_len, kind);
  return n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
}

uint64_t coord_name_number(struct coord_state *s, int set, const char *kind) {
  char key[64];
  size_t len = counter_key(key, sizeof(key), set, kind, strlen(kind));
  uintptr_t n;

  pthread_mutex_lock(&s->lock);
  n = (uintptr_t)hvd_map_get(&s->noname, key, len);
  if (hvd_map_put(&s->noname, key, len, (void *)(n + 1), NULL) != HVD_OK)
    n = UINTPTR_MAX; /* out of memory: the name will not match; the coordinator says so */
  pthread_mutex_unlock(&s->lock);
  return n;
}

/* Splits a generated name into its kind and number; false for any other. */
static bool parse_generated(const char *name, size_t *kind_len, uint64_t *number) {
  static const char marker[] = ".noname.";
  const char *at = NULL, *p = name, *digits;
  char *end;

  while ((p = strstr(p, marker)) != NULL)
    at = p++;
  if (at == NULL || at == name)
    return false;
  digits = at + sizeof(marker) - 1;
  if (*digits < '0' || *digits > '9')
    return false;
  *number = strtoull(digits, &end, 10);
  if (*end == '.') { /* a group member's index */
    const char *index = end + 1;
    if (*index < '0' || *index > '9')
      return false;
    (void)strtoull(index, &end, 10);
  }
  if (*end != '\0')
    return false;
  *kind_len = (size_t)(at - name);
  return true;
}

void coord_names_seen(struct coord_state *s, int set, const char *name) {
  char key[64];
  size_t kind_len, len;
  uint64_t number;

  if (!parse_generated(name, &kind_len, &number) || number >= UINTPTR_MAX - 1 ||
      kind_len + 16 > sizeof(key))
    return;
  len = counter_key(key, sizeof(key), set, name, kind_len);
  pthread_mutex_lock(&s->lock);
  if ((uintptr_t)hvd_map_get(&s->noname, key, len) <= number)
    (void)hvd_map_put(&s->noname, key, len, (void *)(uintptr_t)(number + 1), NULL);
  pthread_mutex_unlock(&s->lock);
}
