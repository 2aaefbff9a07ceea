/*
 * The registry of process sets. The background thread adds and removes
 * sets when it applies the coordinator's responses, so every rank sees the
 * same ids in the same order; user threads only look sets up (under the
 * lock) to check an operation before queueing it. A member derives the
 * set's communicator from the global one; its id counts registrations, so
 * a set removed and added again never meets the old set's connections.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

static void set_destroy(struct coord_set *set) {
  if (set == NULL)
    return;
  if (set->owns_comm)
    net_comm_destroy(set->comm);
  free(set->ranks);
  free(set);
}

hvd_status coord_sets_init(struct coord_sets *s, struct net_comm *global, int size) {
  struct coord_set *g;

  memset(s, 0, sizeof(*s));
  if (pthread_mutex_init(&s->lock, NULL) != 0)
    return hvd_error(HVD_ERR_IO, "pthread_mutex_init failed");
  s->cap = 8;
  s->sets = calloc((size_t)s->cap, sizeof(*s->sets));
  g = calloc(1, sizeof(*g));
  if (g != NULL)
    g->ranks = malloc((size_t)size * sizeof(*g->ranks));
  if (s->sets == NULL || g == NULL || g->ranks == NULL) {
    set_destroy(g);
    coord_sets_fini(s);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the process sets");
  }
  for (int r = 0; r < size; r++)
    g->ranks[r] = r;
  g->id = HVD_PROCESS_SET_GLOBAL;
  g->comm_id = NET_COMM_GLOBAL;
  g->size = size;
  g->rank = net_comm_rank(global);
  g->comm = global;
  s->sets[0] = g;
  return HVD_OK;
}

void coord_sets_fini(struct coord_sets *s) {
  if (s->sets != NULL) {
    for (int i = 0; i < s->cap; i++)
      set_destroy(s->sets[i]);
    free(s->sets);
    pthread_mutex_destroy(&s->lock);
  }
  memset(s, 0, sizeof(*s));
}

bool coord_sets_lookup(struct coord_sets *s, int id, int *size, int *rank) {
  bool found = false;

  pthread_mutex_lock(&s->lock);
  if (id >= 0 && id < s->cap && s->sets[id] != NULL) {
    *size = s->sets[id]->size;
    *rank = s->sets[id]->rank;
    found = true;
  }
  pthread_mutex_unlock(&s->lock);
  return found;
}

struct coord_set *coord_sets_get(struct coord_sets *s, int id) {
  return id >= 0 && id < s->cap ? s->sets[id] : NULL;
}

int coord_sets_find(struct coord_sets *s, const int32_t *ranks, uint32_t n) {
  for (int i = 0; i < s->cap; i++) {
    const struct coord_set *set = s->sets[i];
    if (set != NULL && (uint32_t)set->size == n &&
        memcmp(set->ranks, ranks, n * sizeof(*ranks)) == 0)
      return i;
  }
  return -1;
}

int coord_sets_free_id(struct coord_sets *s) {
  for (int i = 1; i < s->cap; i++) {
    if (s->sets[i] == NULL)
      return i;
  }
  return s->cap;
}

hvd_status coord_sets_add(struct coord_sets *s, struct net_comm *global, int id,
                          const int32_t *ranks, uint32_t n) {
  struct coord_set *set = calloc(1, sizeof(*set));
  int *members = malloc(n * sizeof(*members));
  uint32_t comm_id = NET_COMM_PROCESS_SET + s->registrations++;
  hvd_status st = HVD_OK;

  if (set == NULL || members == NULL || (set->ranks = malloc(n * sizeof(*ranks))) == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate process set %d", id);
    goto out;
  }
  memcpy(set->ranks, ranks, n * sizeof(*ranks));
  set->id = id;
  set->comm_id = comm_id;
  set->size = (int)n;
  set->rank = -1;
  for (uint32_t i = 0; i < n; i++) {
    members[i] = ranks[i];
    if (ranks[i] == net_comm_rank(global))
      set->rank = (int)i;
  }
  if (set->rank >= 0) {
    st = net_comm_derive(global, comm_id, members, (int)n, &set->comm);
    if (st != HVD_OK)
      goto out;
    set->owns_comm = true;
  }
  pthread_mutex_lock(&s->lock);
  if (id >= s->cap) {
    size_t cap = (size_t)s->cap;
    if (hvd_array_reserve(&s->sets, &cap, (size_t)id + 1, sizeof(*s->sets), 8) != HVD_OK) {
      pthread_mutex_unlock(&s->lock);
      st = hvd_error_prefix("the process sets, for set %d", id);
      goto out;
    }
    memset(s->sets + s->cap, 0, (cap - (size_t)s->cap) * sizeof(*s->sets)); /* free ids */
    s->cap = (int)cap;
  }
  if (s->sets[id] != NULL) {
    pthread_mutex_unlock(&s->lock);
    st = hvd_error(HVD_ERR_INTERNAL, "process set %d registered twice", id);
    goto out;
  }
  s->sets[id] = set;
  set = NULL;
  pthread_mutex_unlock(&s->lock);
out:
  set_destroy(set);
  free(members);
  return st;
}

hvd_status coord_sets_remove(struct coord_sets *s, int id) {
  struct coord_set *set = NULL;

  pthread_mutex_lock(&s->lock);
  if (id > 0 && id < s->cap) {
    set = s->sets[id];
    s->sets[id] = NULL;
  }
  pthread_mutex_unlock(&s->lock);
  if (set == NULL)
    return hvd_error(HVD_ERR_INTERNAL, "removing process set %d, which does not exist", id);
  set_destroy(set);
  return HVD_OK;
}

hvd_status coord_sets_ranks(struct coord_sets *s, int id, int *out, size_t cap, size_t *n) {
  hvd_status st = HVD_OK;

  pthread_mutex_lock(&s->lock);
  if (id < 0 || id >= s->cap || s->sets[id] == NULL) {
    st = hvd_error(HVD_ERR_NOT_FOUND, "process set %d does not exist", id);
  } else {
    const struct coord_set *set = s->sets[id];
    for (int i = 0; i < set->size && (size_t)i < cap; i++)
      out[i] = set->ranks[i];
    *n = (size_t)set->size;
  }
  pthread_mutex_unlock(&s->lock);
  return st;
}

void coord_sets_ids(struct coord_sets *s, int *out, size_t cap, size_t *n) {
  size_t k = 0;

  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < s->cap; i++) {
    if (s->sets[i] == NULL)
      continue;
    if (k < cap)
      out[k] = i;
    k++;
  }
  pthread_mutex_unlock(&s->lock);
  *n = k;
}
