/*
 * Handles: how a user thread learns that its operation finished.
 *
 * DESIGN. The background thread finishes a handle's parts (a grouped
 * allreduce has one per tensor). The last part runs the callback, then
 * publishes `done` and wakes waiters, so a callback always runs before any
 * waiter returns and nobody can release the handle under it. Waiters spin
 * for a short while first (HVD_SPIN_US, yielding the core): a small
 * operation finishes in a few microseconds, and a futex wake-up costs more
 * than that on a loaded machine.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

/* Released handles and entries are kept for the next operations (up to
 * SPARES of each): a new handle costs an allocation and a mutex and
 * condition variable set up and torn down, an entry a zeroed allocation,
 * together more than all the rest of enqueueing a small operation. */
enum { SPARES = 16 };
struct spares {
  pthread_mutex_t mu;
  void *items[SPARES];
  int n;
};
static struct spares handle_spares = {.mu = PTHREAD_MUTEX_INITIALIZER};
static struct spares entry_spares = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *take_spare(struct spares *sp) {
  void *item = NULL;

  pthread_mutex_lock(&sp->mu);
  if (sp->n > 0)
    item = sp->items[--sp->n];
  pthread_mutex_unlock(&sp->mu);
  return item;
}

/* Whether the pool kept item (else it is the caller's to free). */
static bool keep_spare(struct spares *sp, void *item) {
  bool kept = false;

  pthread_mutex_lock(&sp->mu);
  if (sp->n < SPARES) {
    sp->items[sp->n++] = item;
    kept = true;
  }
  pthread_mutex_unlock(&sp->mu);
  return kept;
}

/* Keeps h (its mutex and condition variable ready) or frees it. */
static void give_back(struct hvd_handle_s *h) {
  if (!keep_spare(&handle_spares, h)) {
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
  }
}

static struct hvd_handle_s *new_handle(void) {
  struct hvd_handle_s *h = malloc(sizeof(*h));

  if (h == NULL)
    return NULL;
  if (pthread_mutex_init(&h->mu, NULL) != 0) {
    free(h);
    return NULL;
  }
  if (hvd_cond_init(&h->cv) != 0) {
    pthread_mutex_destroy(&h->mu);
    free(h);
    return NULL;
  }
  atomic_init(&h->done, false);
  return h;
}

struct hvd_handle_s *coord_handle_create(int parts, bool outputs, hvd_callback cb, void *arg) {
  struct hvd_handle_s *h = take_spare(&handle_spares);

  if (h == NULL && (h = new_handle()) == NULL)
    return NULL;
  h->outputs = NULL;
  if (outputs && (h->outputs = calloc((size_t)parts, sizeof(*h->outputs))) == NULL) {
    give_back(h);
    return NULL;
  }
  atomic_store_explicit(&h->done, false, memory_order_relaxed);
  h->noutputs = outputs ? parts : 0;
  h->parts = parts;
  h->waiters = 0;
  h->status = HVD_OK;
  h->message = NULL;
  h->callback = cb;
  h->callback_arg = arg;
  h->recv_splits = NULL;
  h->nsplits = 0;
  h->value = -1;
  h->spin_ns = 0;
  return h;
}

void coord_handle_finish(struct hvd_handle_s *h, hvd_status st, const char *message) {
  bool last;

  pthread_mutex_lock(&h->mu);
  if (st != HVD_OK && h->status == HVD_OK) {
    const char *m = message != NULL ? message : hvd_last_error_message();
    h->status = st;
    h->message = hvd_strndup(m, strlen(m));
  }
  last = --h->parts == 0;
  if (last && h->callback == NULL) { /* the common case: done under the same hold */
    atomic_store_explicit(&h->done, true, memory_order_release);
    if (h->waiters > 0)
      pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return;
  }
  pthread_mutex_unlock(&h->mu);
  if (!last)
    return;
  if (h->callback != NULL)
    h->callback(h, h->status, h->callback_arg);
  pthread_mutex_lock(&h->mu);
  atomic_store_explicit(&h->done, true, memory_order_release);
  if (h->waiters > 0)
    pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
}

static hvd_status result(struct hvd_handle_s *h) {
  if (h->status == HVD_OK)
    return HVD_OK;
  return hvd_error(h->status, "%s", h->message != NULL ? h->message : hvd_strerror(h->status));
}

hvd_status coord_handle_wait(struct hvd_handle_s *h, int64_t deadline_ns, int64_t spin_ns) {
  int64_t spin_until;

  if (atomic_load_explicit(&h->done, memory_order_acquire))
    return result(h);
  spin_until = hvd_now_ns() + spin_ns;
  while (!atomic_load_explicit(&h->done, memory_order_acquire)) {
    int64_t now = hvd_now_ns();
    if (now >= spin_until)
      break;
    sched_yield();
    /* The core is contended: a sleeping waiter is woken sooner than a
     * yielding one gets the core back. */
    if (hvd_now_ns() - now > HVD_SPIN_LOST_CORE_NS)
      break;
  }
  if (atomic_load_explicit(&h->done, memory_order_acquire))
    return result(h);
  pthread_mutex_lock(&h->mu);
  h->waiters++;
  while (!atomic_load_explicit(&h->done, memory_order_acquire)) {
    if (hvd_cond_wait_until(&h->cv, &h->mu, deadline_ns) == ETIMEDOUT &&
        !atomic_load_explicit(&h->done, memory_order_acquire)) {
      h->waiters--;
      pthread_mutex_unlock(&h->mu);
      return hvd_error(HVD_ERR_TIMEOUT, "the operation has not completed yet");
    }
  }
  h->waiters--;
  pthread_mutex_unlock(&h->mu);
  return result(h);
}

void coord_handle_destroy(struct hvd_handle_s *h) {
  if (h == NULL)
    return;
  /* A waiter that spun may see `done` while the finishing thread still
   * holds mu: taking it once waits until that thread has let go. */
  pthread_mutex_lock(&h->mu);
  pthread_mutex_unlock(&h->mu);
  for (int i = 0; i < h->noutputs; i++) {
    struct coord_output *o = &h->outputs[i];
    if (o->free != NULL && o->data != NULL) /* NULL: taken (hvd_handle_take_output) */
      o->free(o->data);
    else
      free(o->data);
  }
  free(h->outputs);
  free(h->recv_splits);
  free(h->message);
  give_back(h);
}

struct coord_entry *coord_entry_alloc(void) {
  struct coord_entry *e = take_spare(&entry_spares);

  if (e == NULL)
    return calloc(1, sizeof(*e));
  memset(e, 0, sizeof(*e));
  return e;
}

void coord_entry_destroy(struct coord_entry *e) {
  if (e == NULL)
    return;
  if (e->req.name == e->name_buf) /* not an allocation (set_name) */
    e->req.name = NULL;
  coord_request_fini(&e->req);
  free(e->splits);
  if (!keep_spare(&entry_spares, e))
    free(e);
}
