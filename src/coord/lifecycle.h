/*
 * The lifecycle of hvd's state (lifecycle.c): what the entry points
 * (elastic/init.c: hvd_init, hvd_shutdown) and the elastic worker
 * (elastic/) may do with it, and nothing more. Everything else they use
 * is the public API of hvd.h.
 */
#ifndef HVD_COORD_LIFECYCLE_H
#define HVD_COORD_LIFECYCLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"

/* One worker's place in one of the elastic driver's rounds. */
struct coord_round {
  uint64_t round;   /* the transport generation of the round */
  uint64_t updates; /* host updates the driver had announced when it published it */
  int rank, size, local_rank, local_size, cross_rank, cross_size;
};

/* Which ranks and generation a new state takes. */
struct coord_start {
  /* A round of the elastic driver: its ranks and generation replace the
   * environment's. NULL: the environment's ranks, and the generation below. */
  const struct coord_round *round;
  /* Without round: an elastic worker's first round meets in its driver's
   * generation (and remembers the updates announced before it); otherwise
   * the nth hvd_init of this process meets in generation n. */
  bool elastic;
  uint64_t generation, updates;
};

/* Builds and publishes the state (what hvd_init does once it knows how);
 * HVD_ERR_PRECONDITION when initialized or another thread is starting,
 * HVD_ERR_REMOVED once removed, HVD_ERR_ABORTED when coord_shutdown_state
 * ran meanwhile. No lock is held while the state is built. */
hvd_status coord_init_state(const struct coord_start *how);
/* Stops and frees the state, if any: hvd_shutdown without the pod's
 * membership (a reset keeps it). A start in progress on another thread is
 * told to give up, and waited for. HVD_ERR_PRECONDITION, with nothing
 * done, from a completion callback. */
hvd_status coord_shutdown_state(void);
/* Whether a thread is in coord_init_state (tests). */
bool coord_is_starting(void);
/* The round of the running state: HVD_ERR_PRECONDITION when not initialized. */
hvd_status coord_current_round(struct coord_round *out);
/* From now on hvd_init and every call that needs hvd fail with HVD_ERR_REMOVED. */
void coord_mark_removed(const char *message);
bool coord_is_removed(void);

#endif
