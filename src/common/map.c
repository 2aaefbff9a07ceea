/*
 * String-keyed hash map: open addressing, linear probing, word-wise hashes.
 * Removal leaves a tombstone; tombstones are dropped when the table is
 * rebuilt, which happens once live entries plus tombstones pass 3/4 of it.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"

struct hvd_map_slot {
  char *key; /* NULL: empty; TOMBSTONE: removed */
  size_t key_len;
  uint64_t hash;
  void *value;
};

static char tombstone_marker;
#define TOMBSTONE (&tombstone_marker)

/* Eight bytes a step, each folded in with a multiply, then a final mix
 * so that the low bits (the slot) depend on every byte. Keys are tensor
 * names, often 30-100 bytes, hashed several times per operation: a byte
 * a step cost more than the rest of a look-up. */
static uint64_t hash_bytes(const char *key, size_t len) {
  const uint64_t m = 0xff51afd7ed558ccdull;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ len, w;
  size_t i = 0;

  for (; i + 8 <= len; i += 8) {
    memcpy(&w, key + i, 8);
    h = (h ^ w) * m;
    h ^= h >> 32;
  }
  if (i < len) { /* the last 1-7 bytes, without a variable-length memcpy call */
    w = 0;
    for (unsigned shift = 0; i < len; i++, shift += 8)
      w |= (uint64_t)(unsigned char)key[i] << shift;
    h = (h ^ w) * m;
  }
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

/* Keys shorter than KEY_BLOCK bytes live in blocks of that size, which
 * removed keys leave for new ones; longer keys get their own allocation. */
enum { KEY_BLOCK = 64 };

static char *copy_key(struct hvd_map *m, const char *key, size_t len) {
  char *copy;

  if (len < KEY_BLOCK)
    copy = m->nspare_keys > 0 ? m->spare_keys[--m->nspare_keys] : malloc(KEY_BLOCK);
  else
    copy = malloc(len + 1);
  if (copy != NULL) {
    memcpy(copy, key, len);
    copy[len] = '\0';
  }
  return copy;
}

static void free_key(struct hvd_map *m, char *key, size_t len) {
  if (len < KEY_BLOCK && m->nspare_keys < HVD_MAP_SPARE_KEYS)
    m->spare_keys[m->nspare_keys++] = key;
  else
    free(key);
}

static bool slot_live(const struct hvd_map_slot *s) { return s->key != NULL && s->key != TOMBSTONE; }

void hvd_map_init(struct hvd_map *m) { memset(m, 0, sizeof(*m)); }

void hvd_map_fini(struct hvd_map *m) {
  for (size_t i = 0; i < m->cap; i++) {
    if (slot_live(&m->slots[i]))
      free(m->slots[i].key);
  }
  for (int i = 0; i < m->nspare_keys; i++)
    free(m->spare_keys[i]);
  free(m->slots);
  memset(m, 0, sizeof(*m));
}

/* The slot holding the key, or NULL. */
static struct hvd_map_slot *find(const struct hvd_map *m, const char *key, size_t len,
                                 uint64_t hash) {
  if (m->cap == 0)
    return NULL;
  for (size_t i = hash & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    struct hvd_map_slot *s = &m->slots[i];
    if (s->key == NULL)
      return NULL;
    if (s->key != TOMBSTONE && s->hash == hash && s->key_len == len &&
        memcmp(s->key, key, len) == 0)
      return s;
  }
}

static hvd_status rebuild(struct hvd_map *m, size_t cap) {
  struct hvd_map_slot *slots = calloc(cap, sizeof(*slots));
  if (slots == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate a map of %zu slots", cap);
  for (size_t i = 0; i < m->cap; i++) {
    struct hvd_map_slot *s = &m->slots[i];
    size_t j;
    if (!slot_live(s))
      continue;
    for (j = s->hash & (cap - 1); slots[j].key != NULL; j = (j + 1) & (cap - 1)) {
    }
    slots[j] = *s;
  }
  free(m->slots);
  m->slots = slots;
  m->cap = cap;
  m->tombstones = 0;
  return HVD_OK;
}

void *hvd_map_get(const struct hvd_map *m, const char *key, size_t key_len) {
  struct hvd_map_slot *s = find(m, key, key_len, hash_bytes(key, key_len));
  return s != NULL ? s->value : NULL;
}

hvd_status hvd_map_put(struct hvd_map *m, const char *key, size_t key_len, void *value,
                       void **old) {
  uint64_t hash = hash_bytes(key, key_len);
  struct hvd_map_slot *s = find(m, key, key_len, hash);
  char *copy;
  size_t i;

  if (s != NULL) {
    if (old != NULL)
      *old = s->value;
    s->value = value;
    return HVD_OK;
  }
  if ((m->count + m->tombstones + 1) * 4 > m->cap * 3) {
    size_t cap = m->cap == 0 ? 16 : m->cap;
    while ((m->count + 1) * 2 > cap)
      cap *= 2;
    if (rebuild(m, cap) != HVD_OK)
      return HVD_ERR_NO_MEMORY;
  }
  copy = copy_key(m, key, key_len);
  if (copy == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot copy a map key of %zu bytes", key_len);
  for (i = hash & (m->cap - 1); slot_live(&m->slots[i]); i = (i + 1) & (m->cap - 1)) {
  }
  s = &m->slots[i];
  if (s->key == TOMBSTONE)
    m->tombstones--;
  s->key = copy;
  s->key_len = key_len;
  s->hash = hash;
  s->value = value;
  m->count++;
  if (old != NULL)
    *old = NULL;
  return HVD_OK;
}

static void *remove_slot(struct hvd_map *m, struct hvd_map_slot *s) {
  void *value = s->value;
  free_key(m, s->key, s->key_len);
  s->key = TOMBSTONE;
  s->value = NULL;
  m->count--;
  m->tombstones++;
  return value;
}

void *hvd_map_remove(struct hvd_map *m, const char *key, size_t key_len) {
  struct hvd_map_slot *s = find(m, key, key_len, hash_bytes(key, key_len));
  return s != NULL ? remove_slot(m, s) : NULL;
}

bool hvd_map_iter_next(const struct hvd_map *m, struct hvd_map_iter *it, const char **key,
                       size_t *key_len, void **value) {
  while (it->next < m->cap) {
    const struct hvd_map_slot *s = &m->slots[it->next++];
    if (!slot_live(s))
      continue;
    if (key != NULL)
      *key = s->key;
    if (key_len != NULL)
      *key_len = s->key_len;
    if (value != NULL)
      *value = s->value;
    return true;
  }
  return false;
}

void hvd_map_iter_remove(struct hvd_map *m, struct hvd_map_iter *it) {
  if (it->next == 0)
    return; /* nothing returned yet */
  struct hvd_map_slot *s = &m->slots[it->next - 1];
  if (slot_live(s))
    remove_slot(m, s);
}
