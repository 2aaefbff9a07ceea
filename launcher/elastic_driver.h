/* The elastic driver's state, shared by its rounds (elastic.c) and its
 * pod membership (elastic_pods.c). Only the driver uses it. */
#ifndef HVD_LAUNCHER_ELASTIC_DRIVER_H
#define HVD_LAUNCHER_ELASTIC_DRIVER_H

#include <pthread.h>

#include "rendezvous/rendezvous.h"
#include "supervise.h"

enum { POD_INCARNATION_MAX = 64 };

struct worker {
  char host[HVDRUN_HOST_MAX + 1];
  int local_rank; /* with host: the slot, the worker's name in every round */
  int label;      /* output prefix: workers are numbered in the order they start */
  long proc;      /* its process in the supervisor's table; -1: none (a pod) */
  bool running;   /* started and not ended (a pod: registered and not gone) */
  bool assigned;  /* has a rank in the latest round */
  bool stopped;   /* the driver stopped it: its end is not a failure */
  int64_t left;   /* the last round it said it left; -1: none */
  int64_t removed_at; /* lost its place at this time (0: it has one) */
  /* pods */
  char incarnation[POD_INCARNATION_MAX + 1]; /* the registration this worker is */
  char beat[POD_INCARNATION_MAX + 32];       /* its latest heartbeat */
  int64_t heard_at;                          /* when the heartbeat last changed */
  bool twin_said;                            /* a second process with its slot was reported */
  bool unproven; /* taken over without a place: gets one once its heartbeat changes */
};

/* Running and not being stopped by the driver. */
static inline bool worker_live(const struct worker *w) { return w->running && !w->stopped; }

/* A store scope the driver reads at every turn, watched so that what a
 * worker writes there wakes the driver at once (driver_store.c): a waiter
 * of hvdrun's own store, or in etcd a thread of its own that watches. */
struct scope_watch {
  const char *scope;
  struct rdzv_waiter w;
  bool armed;            /* w is registered with the store, or was */
  bool parked;           /* the store registered w (else it finished at once) */
  atomic_bool fired;     /* the store handed w back: it may be armed again */
  uint64_t seen;         /* the scope's version at the last wake-up */
  _Atomic(struct hvdrun_sup *) sup; /* whom the callback wakes */
  /* etcd */
  pthread_t thread;
  bool started;
  int stop[2]; /* closing stop[1] ends the thread's watch */
  const char *url;
};

struct driver {
  const struct hvdrun_options *o;
  const char *name; /* the messages' prefix: "hvdrun", "hvd-rendezvous" */
  struct hvdrun_hosts_view view;
  const struct hvdrun_host *fixed; /* -H / --hostfile hosts, or NULL: the script */
  size_t nfixed;
  struct hvdrun_store rdzv; /* hvdrun's own store (pods: the caller's, not here) */
  struct rdzv_store *store; /* the store the driver reads and writes */
  struct rdzv_client *client; /* or, in etcd, its client there (store NULL) */
  struct hvdrun_sup sup;    /* the workers' processes (pods: none) */
  int digits;
  struct worker *w;
  size_t nw, capw;
  /* rounds */
  bool published;
  uint64_t round;
  struct hvdrun_host *plan_hosts; /* the latest round's hosts and slots */
  struct hvdrun_slot *plan;
  int plan_size;
  bool pending; /* a new round is needed */
  int64_t pending_since;
  int resets;
  uint64_t updates;
  int64_t next_discovery;
  bool discovered_once;
  /* elastic_ready; elastic_pods (pods only). On the heap: should the store
   * keep one past the driver's end, it is left allocated, not freed. */
  struct scope_watch *watches;
  size_t nwatches;
  /* pods (hvd-rendezvous --min-np): workers are pods that register */
  bool pods;
  int pod_timeout_s;
  bool afresh;   /* every worker is gone: the next round starts the job again */
  bool finished; /* a worker succeeded and every worker has ended */
  /* leading in etcd (elastic_lead.c): the leadership is renewed each turn */
  bool leading;
  bool lost_lead; /* it lapsed: the driver stopped, another leads */
  int64_t renew_at;
  struct rdzv_scope_view admitted; /* taking over: elastic_admitted as found */
  /* the end */
  bool finishing; /* a worker succeeded */
  bool stopping;
  int exit_code;
  int last_failure; /* exit code of the latest failed worker */
  int finish_code;  /* after the first success: 0, or a later failure's code */
};

/* One line on stderr, "<name>: <message>". */
void driver_say(const struct driver *d, const char *fmt, ...) HVD_PRINTF(2, 3);

/* ---- the store (driver_store.c): hvdrun's own, or etcd's through a client.
 * A failure is said, and the driver goes on: its next turn reads again. */
void driver_put(const struct driver *d, const char *scope, const char *key, const char *value);
/* driver_put only where the key is absent. */
void driver_put_new(const struct driver *d, const char *scope, const char *key,
                    const char *value);
void driver_delete_scope(const struct driver *d, const char *scope);
/* Calls fn for each key of a store scope (a snapshot). */
void driver_scope_each(const struct driver *d, const char *scope,
                       void (*fn)(struct driver *, const char *key, const char *value,
                                  size_t value_len),
                       struct driver *arg);
/* A scope now holds its `size` keys: its waiters wake (in etcd they
 * watch a marker that a read puts; hvd's store wakes them itself). */
void driver_scope_filled(const struct driver *d, const char *scope, size_t size);
/* hvd's store: the scope clears itself once its `size` ranks finished. */
void driver_plan_scope(const struct driver *d, const char *scope, size_t size);
/* Whether every rank of a planned scope finished there (hvd's store; in
 * etcd, whose records stay, false: writes where absent find them). */
bool driver_scope_met(const struct driver *d, const char *scope);
/* The scopes the driver watches; false if out of memory. */
bool driver_watches_init(struct driver *d, const char *const *scopes, size_t n);
/* Arms the watch again once it fired; false when the scope changed and
 * the driver should take another turn at once. */
bool driver_watch_arm(struct driver *d, struct scope_watch *sw);
/* The end: takes every watch back. */
void driver_watches_retire(struct driver *d);
/* The live worker (running, not stopped) of a slot, the host given by
 * its first host_len bytes; NULL if none. */
struct worker *driver_live_worker(struct driver *d, const char *host, size_t host_len,
                                  int local_rank);
/* A new worker slot (zeroed but for its number and pipes); NULL when out of memory. */
struct worker *driver_add_worker(struct driver *d);
/* A worker ended: code 0 is a success; why says how ("exited with code 1"). */
void driver_worker_ended(struct driver *d, struct worker *w, const char *why, int code);

/* Pods: reads their registrations and heartbeats, admits new ones, ends
 * the ones that stopped, and lists the usable hosts (*found, malloc'ed). */
hvd_status pods_discover(struct driver *d, struct hvdrun_host **found, size_t *n);

/* Runs the pods' driver over hvd's store (server) or etcd (client and url;
 * *lost_lead tells whether it ended because the leadership lapsed). */
int driver_run_pods(const struct hvdrun_options *o, struct rdzv_server *server,
                    struct rdzv_client *client, const char *url, int pod_timeout_s,
                    bool *lost_lead);
/* Taking over in etcd (driver_resume.c): the latest round, its plan and
 * the updates announced, from what the previous driver wrote. */
void driver_resume(struct driver *d);
/* Whether the previous driver admitted this incarnation (so its
 * admission stands), and then whether it has a place in the latest round
 * (*assigned). Only while taking over; false otherwise. */
bool driver_resumed_admission(const struct driver *d, const char *incarnation, const char *host,
                              int local_rank, bool *assigned);

#endif
