/*
 * The tensor queue: operations from enqueue to completion. User threads
 * add entries (under coord_state.lock) to the in-flight map, which rejects
 * a name already in flight, and to the queue the background thread
 * drains; the background thread finishes them, or fails all of them when
 * the job stops. Once stopped, enqueue fails at once with the reason.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

static size_t entry_key(const struct coord_entry *e, char *key, size_t size) {
  return coord_key(key, size, e->req.set, e->req.name, e->req.name_len);
}

hvd_status coord_enqueue(struct coord_state *s, struct coord_entry **entries, size_t n) {
  char key[COORD_KEY_MAX];
  hvd_status st = HVD_OK;
  size_t added = 0;

  pthread_mutex_lock(&s->lock);
  if (s->phase != COORD_RUNNING || s->stop_requested) {
    st = s->phase != COORD_RUNNING
             ? hvd_error(s->failure, "%s", s->failure_msg)
             : hvd_error(HVD_ERR_ABORTED, "hvd is shutting down (hvd_shutdown was called)");
    goto out;
  }
  for (; added < n; added++) {
    struct coord_entry *e = entries[added];
    size_t len = entry_key(e, key, sizeof(key));
    void *old = NULL;
    if ((st = hvd_map_put(&s->inflight, key, len, e, &old)) != HVD_OK)
      break;
    if (old != NULL) { /* one look-up for the common case; the rare one puts old back */
      (void)hvd_map_put(&s->inflight, key, len, old, NULL);
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s: a tensor named '%s' is already in flight on this rank (names must be "
                     "unique among the operations in flight)",
                     coord_type_name(e->req.type), e->req.name);
      break;
    }
  }
  if (st != HVD_OK) {
    while (added > 0) {
      struct coord_entry *e = entries[--added];
      hvd_map_remove(&s->inflight, key, entry_key(e, key, sizeof(key)));
    }
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    entries[i]->next = NULL;
    if (s->queue_tail != NULL)
      s->queue_tail->next = entries[i];
    else
      s->queue_head = entries[i];
    s->queue_tail = entries[i];
  }
out:
  pthread_mutex_unlock(&s->lock);
  if (st != HVD_OK)
    return st;
  coord_wake(s);
  return HVD_OK;
}

void coord_requeue(struct coord_state *s, struct coord_entry *e) {
  pthread_mutex_lock(&s->lock);
  e->next = s->queue_head;
  s->queue_head = e;
  if (s->queue_tail == NULL)
    s->queue_tail = e;
  atomic_store(&s->queued, true);
  pthread_mutex_unlock(&s->lock);
}

struct coord_entry *coord_find_entry(struct coord_state *s, int set, const char *name) {
  char key[COORD_KEY_MAX];
  struct coord_entry *e;
  pthread_mutex_lock(&s->lock);
  e = hvd_map_get(&s->inflight, key, coord_key(key, sizeof(key), set, name, strlen(name)));
  pthread_mutex_unlock(&s->lock);
  return e;
}

void coord_take_entries(struct coord_state *s, int set, char *const *names, uint32_t n,
                        struct coord_entry **out) {
  char key[COORD_KEY_MAX];
  pthread_mutex_lock(&s->lock);
  for (uint32_t i = 0; i < n; i++)
    out[i] = hvd_map_remove(&s->inflight, key,
                            coord_key(key, sizeof(key), set, names[i], strlen(names[i])));
  pthread_mutex_unlock(&s->lock);
}

void coord_complete_entry(struct coord_entry *e, hvd_status st, const char *message) {
  coord_handle_finish(e->handle, st, message);
  coord_entry_destroy(e);
}

void coord_finish_entry(struct coord_state *s, struct coord_entry *e, hvd_status st,
                        const char *message) {
  char key[COORD_KEY_MAX];
  pthread_mutex_lock(&s->lock);
  hvd_map_remove(&s->inflight, key, entry_key(e, key, sizeof(key)));
  pthread_mutex_unlock(&s->lock);
  coord_complete_entry(e, st, message);
}

void coord_stop(struct coord_state *s, hvd_status st, const char *message) {
  struct hvd_map_iter it = {0};
  struct coord_entry **all = NULL;
  const char *key;
  size_t klen, n = 0;
  void *value;

  pthread_mutex_lock(&s->lock);
  if (s->phase == COORD_RUNNING) {
    s->phase = COORD_STOPPED;
    s->failure = st;
    snprintf(s->failure_msg, sizeof(s->failure_msg), "%s", message);
  }
  all = malloc((s->inflight.count + 1) * sizeof(*all));
  while (all != NULL && hvd_map_iter_next(&s->inflight, &it, &key, &klen, &value)) {
    all[n++] = value;
    hvd_map_iter_remove(&s->inflight, &it);
  }
  s->queue_head = s->queue_tail = NULL;
  pthread_mutex_unlock(&s->lock);
  for (size_t i = 0; i < n; i++)
    coord_complete_entry(all[i], s->failure, s->failure_msg);
  free(all);
}
