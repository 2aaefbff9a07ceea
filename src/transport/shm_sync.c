/*
 * Waiting in a shared segment: the barrier that orders every round of the
 * shared-memory collectives, and failures.
 *
 * DESIGN. Each member owns one cache line with the number of barriers it
 * has entered; entering stores the new number (a release: the data written
 * before it is visible to whoever sees the number), and waiting reads the
 * others' lines until all reach it. A waiter spins for HVD_SPIN_US (on two
 * cores a peer arrives within a microsecond), then sleeps on the segment's
 * futex, announcing itself in `sleepers` first; an arriving member bumps
 * the futex and wakes it only when somebody sleeps, so the common case
 * costs no system call. Both sides use sequentially consistent operations:
 * either the arriver sees the sleeper, or the sleeper, after announcing
 * itself, sees the arrival; and the bumped futex word makes a wake that
 * lands before the sleep harmless.
 * A sleeper wakes every SLICE to look for members whose process ended (a
 * pidfd becomes readable; kill(pid, 0) where pidfds are missing) and for
 * the communicator's timeout. The first member to fail writes why into the
 * header and wakes everybody, so that every member fails with the reason.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "transport_private.h"

#define SLICE_NS INT64_C(20000000) /* how often a sleeper looks for dead members */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static void futex_wake_all(_Atomic uint32_t *word) {
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_sleep(_Atomic uint32_t *word, uint32_t seen, int64_t ns) {
  struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void wake(struct net_shm *s) {
  atomic_fetch_add(&s->hdr->futex, 1);
  futex_wake_all(&s->hdr->futex);
}

/* How many members have entered barrier k. */
static int arrived(const struct net_shm *s, uint64_t k) {
  int n = 0;
  for (int r = 0; r < s->size; r++)
    n += atomic_load_explicit(&s->lines[r].arrived, memory_order_acquire) >= k;
  return n;
}

void net_shm_mark_failed(struct net_shm *s) {
  int32_t expected = 0;

  if (atomic_compare_exchange_strong(&s->hdr->failed, &expected, NET_SHM_FAIL_WRITING)) {
    snprintf(s->hdr->reason, sizeof(s->hdr->reason), "%s", hvd_last_error_message());
    atomic_store(&s->hdr->failed, s->rank + 1);
  }
  wake(s);
}

hvd_status net_shm_fail(struct net_shm *s, hvd_status st) {
  net_shm_mark_failed(s);
  return net_comm_poison(s->comm, st);
}

/* The group's failure as this thread's error (the first member's reason). */
static hvd_status failed(struct net_shm *s, int32_t who) {
  char reason[NET_SHM_REASON_MAX];
  int64_t until = hvd_now_ns() + 1000000;

  /* The failing member writes its reason in a few hundred nanoseconds;
   * if it died meanwhile, say so without one. */
  while (who == NET_SHM_FAIL_WRITING && hvd_now_ns() < until)
    who = atomic_load(&s->hdr->failed);
  if (who == NET_SHM_FAIL_WRITING)
    snprintf(reason, sizeof(reason), "a member failed");
  else
    snprintf(reason, sizeof(reason), "%s", s->hdr->reason);
  hvd_error(HVD_ERR_ABORTED, "%s", reason);
  return net_comm_poison(s->comm, HVD_ERR_ABORTED);
}

/* A member whose process has ended, or -1. */
static int dead_member(const struct net_shm *s, uint64_t k) {
  for (int r = 0; r < s->size; r++) {
    if (r == s->rank || atomic_load(&s->lines[r].arrived) >= k)
      continue;
    if (s->pidfds[r] >= 0) {
      struct pollfd p = {.fd = s->pidfds[r], .events = POLLIN};
      if (poll(&p, 1, 0) == 1)
        return r;
    } else if (kill((pid_t)s->comm->records[r].pid, 0) != 0 && errno == ESRCH) {
      return r;
    }
  }
  return -1;
}

static hvd_status fail_dead(struct net_shm *s, int r) {
  char who[NET_WHO_MAX];
  net_comm_describe_peer(s->comm, r, who, sizeof(who));
  hvd_error(HVD_ERR_NETWORK,
            "%s, process %d, ended while rank %d waited for it in shared memory", who,
            s->comm->records[r].pid, s->rank);
  return net_shm_fail(s, HVD_ERR_NETWORK);
}

/* Names the members that have not arrived as the TCP path does ("rank 2
 * (global rank 2 on h3)"): hvdrun reads them from the message to say who
 * stopped. */
static hvd_status fail_timeout(struct net_shm *s, uint64_t k) {
  char missing[3 * NET_WHO_MAX + 16] = "";
  size_t used = 0;
  int shown = 0;

  for (int r = 0; r < s->size && shown < 3; r++) {
    char who[NET_WHO_MAX];
    if (atomic_load(&s->lines[r].arrived) >= k)
      continue;
    net_comm_describe_peer(s->comm, r, who, sizeof(who));
    used += (size_t)snprintf(missing + used, sizeof(missing) - used, "%s%s", shown ? ", " : "", who);
    shown++;
  }
  hvd_error(HVD_ERR_TIMEOUT,
            "no progress for %.1f s: waiting in shared memory for %s (a peer may have hung; "
            "raise HOROVOD_GLOO_TIMEOUT_SECONDS if it is only slow)",
            (double)s->comm->ctx->timeout_ms / 1000.0, missing);
  return net_shm_fail(s, HVD_ERR_TIMEOUT);
}

static hvd_status sleep_until_arrived(struct net_shm *s, uint64_t k) {
  struct net_shm_header *h = s->hdr;
  int64_t timeout_ns = s->comm->ctx->timeout_ms * 1000000;
  int64_t progress_ns = hvd_now_ns();
  int seen = arrived(s, k);

  for (;;) {
    uint32_t word = atomic_load(&h->futex);
    int32_t who;
    int now_in;

    atomic_fetch_add(&h->sleepers, 1);
    if (arrived(s, k) == s->size) {
      atomic_fetch_sub(&h->sleepers, 1);
      return HVD_OK;
    }
    if ((who = atomic_load(&h->failed)) == 0)
      futex_sleep(&h->futex, word, SLICE_NS);
    atomic_fetch_sub(&h->sleepers, 1);
    if ((now_in = arrived(s, k)) == s->size)
      return HVD_OK;
    if ((who = atomic_load(&h->failed)) != 0)
      return failed(s, who);
    int64_t now = hvd_now_ns();
    if (now_in != seen) {
      seen = now_in;
      progress_ns = now;
    }
    int dead = dead_member(s, k);
    if (dead >= 0)
      return fail_dead(s, dead);
    if (now - progress_ns >= timeout_ns)
      return fail_timeout(s, k);
  }
}

static hvd_status wait_barrier(struct net_shm *s, uint64_t k) {
  struct net_ctx *ctx = s->comm->ctx;
  int32_t who;

  if (s->comm->poison != HVD_OK)
    return hvd_error(s->comm->poison, "%s", s->comm->poison_msg);
  /* A member that gave up (a timeout) may have entered this barrier
   * before it did: arriving late must fail, not complete the barrier. */
  if ((who = atomic_load(&s->hdr->failed)) != 0)
    return failed(s, who);
  if (s->rank == 0) /* published by the release below */
    s->lines[0].hint[k & 1] = s->hint_next;
  atomic_store(&s->lines[s->rank].arrived, k);
  if (atomic_load(&s->hdr->sleepers) > 0)
    wake(s);
  int64_t start = hvd_now_ns(), last = start;
  if (start >= ctx->spin_resume_ns) {
    while (last - start < ctx->spin_ns) {
      if (arrived(s, k) == s->size)
        return HVD_OK;
      if ((who = atomic_load_explicit(&s->hdr->failed, memory_order_relaxed)) != 0)
        return failed(s, who);
      for (int i = 0; i < 16; i++)
        cpu_relax();
      if (ctx->spin_yield && s->size > ctx->cpus) /* ranks share cores */
        sched_yield();
      int64_t now = hvd_now_ns();
      /* Another process took the core: sleeping wakes sooner than spinning. */
      if (now - last > HVD_SPIN_LOST_CORE_NS) {
        ctx->spin_resume_ns = now + 100 * INT64_C(1000000);
        break;
      }
      last = now;
    }
  }
  return sleep_until_arrived(s, k);
}

hvd_status net_shm_barrier(struct net_shm *s) {
  uint64_t k = ++s->barriers;
  hvd_status st = wait_barrier(s, k);

  /* Member 0 writes this slot again only at barrier k + 2, which nobody
   * enters before everybody has left barrier k. */
  if (st == HVD_OK)
    s->hint_seen = s->lines[0].hint[k & 1];
  return st;
}

void net_shm_hint(struct net_shm *s, uint64_t v) { s->hint_next = v; }

uint64_t net_shm_hint_seen(const struct net_shm *s) { return s->hint_seen; }

void net_shm_report(struct net_shm *s, uint64_t v) {
  atomic_store_explicit(&s->lines[s->rank].report, v, memory_order_relaxed);
}

uint64_t net_shm_report_of(const struct net_shm *s, int r) {
  return atomic_load_explicit(&s->lines[r].report, memory_order_relaxed);
}
