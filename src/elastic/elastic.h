/*
 * The worker's side of elastic jobs: the environment hvdrun's elastic
 * driver (or hvd-rendezvous's, for pods) gives a worker, the rounds it
 * joins through the store, rank 0's watch for host updates, a pod's
 * membership, and hvd_init/hvd_shutdown, which choose between a plain
 * start, a pod's and an elastic worker's (init.c). Built on the public API
 * and coord's lifecycle (coord/lifecycle.h); the protocol is in
 * docs/elastic.md.
 */
#ifndef HVD_ELASTIC_H
#define HVD_ELASTIC_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "coord/lifecycle.h"
#include "rendezvous/rendezvous.h"

/* ==== the environment and the driver's rounds (link.c) ======================== */

struct elastic_env {
  bool elastic;        /* HOROVOD_ELASTIC: started by hvdrun's elastic driver */
  bool pod;            /* with HVD_POD: a pod that joins hvd-rendezvous's driver by itself */
  int64_t timeout_ms;  /* HOROVOD_ELASTIC_TIMEOUT */
  int64_t reset_limit; /* HOROVOD_ELASTIC_RESET_LIMIT; -1: none */
  uint64_t round;      /* HVD_ELASTIC_ROUND: the round this process started in */
  uint64_t updates;    /* HVD_ELASTIC_UPDATES: that round's update count */
  char host[RDZV_RECORD_HOST_MAX]; /* HOROVOD_HOSTNAME (a pod's: its host name) and */
  int local_rank;                  /* HOROVOD_LOCAL_RANK: the driver's name for this worker */
};

hvd_status elastic_read_env(struct elastic_env *out);
/* Tells the driver this worker left round `leaving` and waits for the
 * next round's assignment; HVD_ERR_REMOVED when it gives this worker none. */
hvd_status elastic_next_round(const struct elastic_env *env, uint64_t leaving,
                              struct coord_round *out);
/* A pod's first round: waits for round `first` (or a later one) and reads
 * this worker's place in the latest; HVD_ERR_REMOVED without one. */
hvd_status elastic_first_round(const struct elastic_env *env, uint64_t first,
                               struct coord_round *out);

/* ==== joining rounds (state.c) ================================================= */

/* Failures an elastic reset can cure: a peer that failed or went silent,
 * or a round that ended under this worker. */
bool elastic_recoverable(hvd_status st);
/* Joins the round after `leaving` (and the next ones, while they fail to
 * start): hvd is initialized with its ranks on success. */
hvd_status elastic_rejoin(const struct elastic_env *env, uint64_t leaving);
/* The same for a pod's first round, `first` (the round it was admitted to). */
hvd_status elastic_join_first(const struct elastic_env *env, uint64_t first);
/* After a state of an elastic job started: rank 0 watches for host updates. */
hvd_status elastic_started(void);
/* Before the state stops: the watch, if any, ends. */
void elastic_stopping(void);

/* ==== a pod's membership (pod.c) ================================================
 * The pod registers as <host>:<local_rank> with a fresh incarnation and a
 * heartbeat thread, waits to be admitted, and joins its first round with
 * hvd initialized in it. The membership outlives resets; hvd_shutdown ends
 * it, saying "done" when hvd_elastic_run succeeded. */
hvd_status elastic_pod_join(const struct elastic_env *env);
/* hvd_elastic_run finished: the driver is told "done" when the pod leaves. */
void elastic_pod_mark_done(void);
/* Stops the heartbeat and tells the driver the pod left (done or exit). */
void elastic_pod_leave(void);

/* ==== threads that talk to the store (link.c) ================================== */

/* Rank 0's watch and a pod's heartbeat. stop_fd is an eventfd that is the
 * client's cancel fd too, so stopping also ends a request in flight. */
struct elastic_store_thread {
  pthread_t thread;
  bool started;
  int stop_fd;
  struct rdzv_client *client;
};
/* The stop eventfd and a client from the environment (closed again on failure). */
hvd_status elastic_store_thread_open(struct elastic_store_thread *t);
hvd_status elastic_store_thread_start(struct elastic_store_thread *t, void *(*fn)(void *),
                                      void *arg);
/* Stops and joins the thread if it started; frees the client and the fd. */
void elastic_store_thread_close(struct elastic_store_thread *t);

/* Rank 0's watch for the driver's host updates (a thread with one long-poll). */
struct elastic_watch;
hvd_status elastic_watch_start(uint64_t after, struct elastic_watch **out);
/* The number of the latest update seen. */
uint64_t elastic_watch_updates(struct elastic_watch *w);
/* HVD_HOSTS_ADDED | HVD_HOSTS_REMOVED of the updates seen so far. */
int elastic_watch_kinds(struct elastic_watch *w);
void elastic_watch_stop(struct elastic_watch *w);

#endif
