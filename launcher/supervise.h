/* hvdrun's one process supervisor (supervise.c): the table of started
 * processes and the loop that waits on their output, on signals and on
 * timers. The static job (job.c) and the elastic driver (elastic.c) are
 * policies over it: hooks tell them what happened, and they decide what it
 * means. Not thread-safe, except hvdrun_sup_wake. */
#ifndef HVD_LAUNCHER_SUPERVISE_H
#define HVD_LAUNCHER_SUPERVISE_H

#include <poll.h>

#include "proc.h"

enum {
  HVDRUN_GRACE_S = 5,     /* a stopped process gets SIGKILL this long after SIGTERM */
  HVDRUN_DRAIN_MS = 1000, /* output still read once every process has ended */
};

/* Called on the loop's thread; a hook may use every function below. */
struct hvdrun_sup_hooks {
  void *arg;
  /* Process i was reaped: why says how it ended ("exited with code 3"),
   * code is what hvdrun reports for it (128 + signal for a signal). */
  void (*ended_cb)(void *arg, size_t i, const char *why, int code);
  /* SIGINT, SIGTERM or SIGHUP reached hvdrun. */
  void (*signal_cb)(void *arg, int signo);
  /* Process i still runs HVDRUN_GRACE_S after its SIGTERM; its group gets
   * SIGKILL when this returns. */
  void (*overdue_cb)(void *arg, size_t i);
  /* The loop cannot wait (hvd_last_error_message says why). */
  void (*failed_cb)(void *arg);
  /* The policy's turn: at once, then after every wake-up, once the events
   * above have been handled. Returns when it wants its next turn
   * (HVD_NO_DEADLINE: at the next event only). */
  int64_t (*tick_cb)(void *arg);
};

/* One process of the table; entries are never removed. */
struct hvdrun_sup_entry {
  struct hvdrun_proc p;
  bool stopped;    /* SIGTERM sent (or the stop asked before it started) */
  bool killed;     /* SIGKILL sent */
  int64_t term_at; /* when it was stopped: SIGKILL follows after the grace */
};

struct hvdrun_sup {
  struct hvdrun_sup_hooks hooks;
  bool ready; /* init ran: sigfd and wakefd are ours (-1: not made) */
  int sigfd;  /* SIGCHLD, SIGINT, SIGTERM, SIGHUP */
  int wakefd; /* eventfd: hvdrun_sup_wake */
  struct hvdrun_sup_entry *procs;
  size_t n, cap;
  struct pollfd *pfds; /* room for the two descriptors and every pipe */
  size_t *who;         /* pfds[k] >= 2: process who[k] / 2, pipe who[k] % 2 */
  size_t pfds_cap, who_cap;
  bool end_when_idle;
  int64_t drain_until; /* 0 until every process has ended */
};

/* Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP (ignoring SIGPIPE) and makes
 * the descriptors the loop waits on. Call it before the store's threads
 * start, so that they inherit the mask. HVD_ERR_IO naming the call, or
 * HVD_ERR_NO_MEMORY; after a failure, only fini may follow. */
hvd_status hvdrun_sup_init(struct hvdrun_sup *s, const struct hvdrun_sup_hooks *hooks);
/* Flushes and closes every process's output, closes the descriptors and
 * frees the table. Safe on a zeroed struct; reaps and signals nothing. */
void hvdrun_sup_fini(struct hvdrun_sup *s);

/* Adds count entries (no process yet: pid 0, pipes closed) at *first,
 * *first + 1, ...; all or none. HVD_ERR_NO_MEMORY. May be called before
 * init. Entries may move: do not keep pointers across a call. */
hvd_status hvdrun_sup_add(struct hvdrun_sup *s, size_t count, size_t *first);
/* Entry i's process, for hvdrun_proc_init and hvdrun_proc_start. */
struct hvdrun_proc *hvdrun_sup_proc(struct hvdrun_sup *s, size_t i);
/* Processes started and not reaped yet. */
size_t hvdrun_sup_running(const struct hvdrun_sup *s);

/* Stops process i: SIGTERM to its group now (even after the process
 * itself has been reaped: what it started may remain), and SIGKILL after
 * HVDRUN_GRACE_S if it still runs. Only the first call counts. */
void hvdrun_sup_stop(struct hvdrun_sup *s, size_t i);
/* SIGKILL to process i's group now. */
void hvdrun_sup_kill(struct hvdrun_sup *s, size_t i);
/* From now on, the loop ends once no process runs: every group gets
 * SIGKILL (nothing they started may outlive them), and output is read for
 * at most HVDRUN_DRAIN_MS more. */
void hvdrun_sup_end_when_idle(struct hvdrun_sup *s);
/* Makes the loop wake up and give the policy its turn. Callable from any
 * thread, and from a signal handler. */
void hvdrun_sup_wake(struct hvdrun_sup *s);

/* The loop: forwards output, reaps, signals, and calls the hooks, until
 * hvdrun_sup_end_when_idle's end. */
void hvdrun_sup_run(struct hvdrun_sup *s);

#endif
