/* The store's internals, shared by store.c (data) and store_wait.c (waiters). */
#ifndef HVD_RENDEZVOUS_STORE_PRIVATE_H
#define HVD_RENDEZVOUS_STORE_PRIVATE_H

#include <pthread.h>

#include "rendezvous.h"

struct rdzv_scope {
  char *name;
  size_t name_len;
  struct hvd_map items;    /* key -> struct rdzv_blob * */
  struct hvd_map finished; /* planned scopes: rank keys deleted so far (value unused) */
  size_t bytes;            /* accounted bytes of the items */
  struct rdzv_blob *snapshot; /* serialized items, NULL when stale */
  size_t snapshot_count;
  /* Pending waiters, doubly linked through prev/next: those for one key,
   * and those for a number of keys. min_count_bound is at most the smallest
   * min_count among the latter, so writes below it skip the scan. */
  struct rdzv_waiter *key_waiters;
  struct rdzv_waiter *count_waiters;
  size_t min_count_bound;
  struct rdzv_waiter *change_waiters; /* the scope's next change */
  uint64_t changed;                   /* the store version of its last change */
};

/* Lock order: mu is a leaf (the connection guard takes it under its own
 * lock); no callback is ever made while holding it except the park
 * callback, which must not call back into the store or the guard. */
struct rdzv_store {
  pthread_mutex_t mu;
  pthread_cond_t deadline_cond; /* wakes the deadline thread */
  pthread_cond_t idle_cond;     /* signalled when delivering drops to 0 */
  pthread_t deadline_thread;
  bool deadline_thread_started;

  /* Everything below is protected by mu. */
  struct rdzv_store_limits limits;
  struct hvd_map scopes; /* name -> struct rdzv_scope * */
  struct hvd_map plans;  /* name -> planned size, stored as a pointer-sized integer */
  struct hvd_map rounds; /* planned name -> times all its ranks finished (pointer-sized) */
  size_t bytes; /* keys, values, current scope bodies, overheads */
  /* What readers and uploads hold beyond bytes (blob.c); charged to the
   * limit as well. Charged only under mu, discharged from any thread. */
  struct rdzv_ledger *held;
  size_t keys;
  uint64_t version; /* last version handed out */
  struct rdzv_waiter **heap; /* min-heap of pending waiters by deadline */
  size_t heap_len, heap_cap;
  bool closing;
  bool stop_thread;
  unsigned delivering; /* threads handing fired waiters to the callback */

  rdzv_fire_cb fire;
  void *fire_arg;
};

/* store.c */
/* Whether adding bytes (after freeing freed) stays within the limit. */
bool rdzv_store_fits(struct rdzv_store *s, size_t bytes, size_t freed);
struct rdzv_scope *rdzv_store_find_scope(struct rdzv_store *s, const char *name, size_t len);
struct rdzv_scope *rdzv_store_get_scope(struct rdzv_store *s, const char *name, size_t len);
void rdzv_store_maybe_drop_scope(struct rdzv_store *s, struct rdzv_scope *scope);
hvd_status rdzv_store_scope_snapshot(struct rdzv_store *s, struct rdzv_scope *scope,
                                     struct rdzv_blob **out);

/* store_wait.c */
hvd_status rdzv_store_wait_start(struct rdzv_store *s);
void rdzv_store_wait_stop(struct rdzv_store *s);
/* Detaches the waiters that a write of key made ready onto *fired. */
void rdzv_store_wait_check(struct rdzv_store *s, struct rdzv_scope *scope, const char *key,
                           size_t key_len, struct rdzv_waiter **fired);
/* The scope changed (at version s->version): detaches its change waiters. */
void rdzv_store_wait_changed(struct rdzv_store *s, struct rdzv_scope *scope,
                             struct rdzv_waiter **fired);
/* Releases the lock, then hands fired waiters to their fire callback. Closing
 * waits for every such delivery, so none can outlive rdzv_store_close. */
void rdzv_store_unlock_deliver(struct rdzv_store *s, struct rdzv_waiter *fired);
/* Detaches every pending waiter as cancelled onto *fired. */
void rdzv_store_wait_cancel_all(struct rdzv_store *s, struct rdzv_waiter **fired);

#endif
