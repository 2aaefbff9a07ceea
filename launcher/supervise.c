/*
 * hvdrun's process supervisor: one table of started processes and one
 * loop, shared by the static job and the elastic driver.
 *
 * DESIGN. One thread polls a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP,
 * blocked before the store's threads start so that they inherit the
 * mask), an eventfd that other threads may write to wake it, and every
 * process's stdout and stderr pipe. Each wake-up handles, in this order,
 * signals (a SIGCHLD reaps every process that ended, by pid, so that a
 * child the caller waits for itself, the discovery script, is left to it),
 * output, and stopped processes past their grace; then the policy has its
 * turn and says when it wants the next. Every process leads its own
 * process group, so stopping it (SIGTERM, SIGKILL after HVDRUN_GRACE_S)
 * stops what it started. Once the policy has said the job ends and no
 * process runs, every group gets SIGKILL and the pipes are read until they
 * close, for HVDRUN_DRAIN_MS at most: a grandchild that kept one open
 * cannot hold hvdrun.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervise.h"

enum { FIXED_FDS = 2 }; /* pfds[0]: the signalfd, pfds[1]: the eventfd */

static int64_t ms_ns(int64_t ms) { return ms * 1000000; }

/* ==== set-up ================================================================ */

static hvd_status grow(struct hvdrun_sup *s, size_t need) {
  size_t fds = FIXED_FDS + 2 * need, first_fds = FIXED_FDS + 2 * 16;

  /* Each array keeps its contents when another cannot grow: a failure
   * leaves the table as it was (with room to spare in some). */
  if (hvd_array_reserve(&s->procs, &s->cap, need, sizeof(*s->procs), 16) != HVD_OK ||
      hvd_array_reserve(&s->pfds, &s->pfds_cap, fds, sizeof(*s->pfds), first_fds) != HVD_OK ||
      hvd_array_reserve(&s->who, &s->who_cap, fds, sizeof(*s->who), first_fds) != HVD_OK)
    return hvd_error_prefix("the table of %zu processes", need);
  return HVD_OK;
}

static hvd_status signal_fd(int *fd) {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  signal(SIGPIPE, SIG_IGN);
  if ((*fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0)
    return hvd_error(HVD_ERR_IO, "signalfd: %s", strerror(errno));
  return HVD_OK;
}

hvd_status hvdrun_sup_init(struct hvdrun_sup *s, const struct hvdrun_sup_hooks *hooks) {
  hvd_status st;

  s->hooks = *hooks;
  s->ready = true;
  s->sigfd = s->wakefd = -1;
  if ((st = signal_fd(&s->sigfd)) != HVD_OK)
    return st;
  if ((s->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
    return hvd_error(HVD_ERR_IO, "eventfd: %s", strerror(errno));
  return grow(s, s->n); /* the loop's arrays exist even for an empty table */
}

void hvdrun_sup_fini(struct hvdrun_sup *s) {
  for (size_t i = 0; i < s->n; i++)
    hvdrun_proc_fini(&s->procs[i].p);
  if (s->ready && s->sigfd >= 0)
    close(s->sigfd);
  if (s->ready && s->wakefd >= 0)
    close(s->wakefd);
  free(s->procs);
  free(s->pfds);
  free(s->who);
  memset(s, 0, sizeof(*s));
}

/* ==== the table ============================================================= */

hvd_status hvdrun_sup_add(struct hvdrun_sup *s, size_t count, size_t *first) {
  hvd_status st = grow(s, s->n + count);

  if (st != HVD_OK)
    return st;
  for (size_t i = s->n; i < s->n + count; i++) {
    memset(&s->procs[i], 0, sizeof(s->procs[i]));
    s->procs[i].p.fds[0] = s->procs[i].p.fds[1] = -1;
  }
  *first = s->n;
  s->n += count;
  return HVD_OK;
}

struct hvdrun_proc *hvdrun_sup_proc(struct hvdrun_sup *s, size_t i) { return &s->procs[i].p; }

size_t hvdrun_sup_running(const struct hvdrun_sup *s) {
  size_t n = 0;
  for (size_t i = 0; i < s->n; i++)
    n += s->procs[i].p.running;
  return n;
}

/* ==== stopping ============================================================== */

static void signal_group(const struct hvdrun_sup_entry *e, int sig) {
  if (e->p.pid > 0)
    (void)kill(-e->p.pid, sig);
}

void hvdrun_sup_stop(struct hvdrun_sup *s, size_t i) {
  struct hvdrun_sup_entry *e = &s->procs[i];
  if (e->stopped)
    return;
  e->stopped = true;
  e->term_at = hvd_now_ns();
  signal_group(e, SIGTERM);
}

void hvdrun_sup_kill(struct hvdrun_sup *s, size_t i) {
  struct hvdrun_sup_entry *e = &s->procs[i];
  e->stopped = e->killed = true;
  signal_group(e, SIGKILL);
}

void hvdrun_sup_end_when_idle(struct hvdrun_sup *s) { s->end_when_idle = true; }

void hvdrun_sup_wake(struct hvdrun_sup *s) {
  uint64_t one = 1;
  /* Only write(2): async-signal-safe. A full counter already wakes. */
  (void)!write(s->wakefd, &one, sizeof(one));
}

/* When a stopped process that still runs is due for SIGKILL; HVD_NO_DEADLINE if never. */
static int64_t kill_due(const struct hvdrun_sup_entry *e) {
  if (!e->stopped || e->killed || !e->p.running)
    return HVD_NO_DEADLINE;
  return e->term_at + (int64_t)HVDRUN_GRACE_S * 1000000000;
}

static void kill_overdue(struct hvdrun_sup *s) {
  int64_t now = hvd_now_ns();
  for (size_t i = 0; i < s->n; i++) {
    if (kill_due(&s->procs[i]) > now)
      continue;
    s->hooks.overdue_cb(s->hooks.arg, i);
    hvdrun_sup_kill(s, i);
  }
}

/* ==== events ================================================================ */

static void reap(struct hvdrun_sup *s) {
  for (size_t i = 0; i < s->n; i++) {
    struct hvdrun_proc *p = &s->procs[i].p;
    char why[128];
    int status, code;
    if (!p->running || p->pid <= 0 || waitpid(p->pid, &status, WNOHANG) != p->pid)
      continue;
    p->running = false;
    hvdrun_describe_end(status, why, sizeof(why), &code);
    s->hooks.ended_cb(s->hooks.arg, i, why, code);
  }
}

static void on_signals(struct hvdrun_sup *s) {
  struct signalfd_siginfo si;
  /* The kernel hands pending signals over lowest number first, so a stop
   * request is seen before the exits that came with it. */
  while (read(s->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
    if (si.ssi_signo != SIGCHLD)
      s->hooks.signal_cb(s->hooks.arg, (int)si.ssi_signo);
  }
  reap(s); /* SIGCHLDs merge: look at every process */
}

/* Fills pfds (the two descriptors, then every open pipe); returns how many. */
static nfds_t gather(struct hvdrun_sup *s) {
  nfds_t n = 0;
  s->pfds[n++] = (struct pollfd){.fd = s->sigfd, .events = POLLIN};
  s->pfds[n++] = (struct pollfd){.fd = s->wakefd, .events = POLLIN};
  for (size_t i = 0; i < s->n; i++) {
    for (int k = 0; k < 2; k++) {
      if (s->procs[i].p.fds[k] < 0)
        continue;
      s->who[n] = i * 2 + (size_t)k;
      s->pfds[n++] = (struct pollfd){.fd = s->procs[i].p.fds[k], .events = POLLIN};
    }
  }
  return n;
}

static void forward(struct hvdrun_sup *s, nfds_t n) {
  /* s->pfds, not a copy: a hook may have grown the table (contents kept). */
  for (nfds_t k = FIXED_FDS; k < n; k++) {
    if (s->pfds[k].revents & (POLLIN | POLLHUP | POLLERR))
      hvdrun_proc_forward(&s->procs[s->who[k] / 2].p, (int)(s->who[k] % 2));
  }
}

static void drain_wakes(struct hvdrun_sup *s) {
  uint64_t count;
  (void)!read(s->wakefd, &count, sizeof(count));
}

/* ==== the loop ============================================================== */

static int64_t next_wake(const struct hvdrun_sup *s, int64_t turn_at) {
  int64_t wake = turn_at;
  if (s->drain_until != 0 && s->drain_until < wake)
    wake = s->drain_until;
  for (size_t i = 0; i < s->n; i++) {
    int64_t due = kill_due(&s->procs[i]);
    if (due < wake)
      wake = due;
  }
  return wake;
}

static int poll_timeout(int64_t wake, int64_t now) {
  int64_t ms;
  if (wake == HVD_NO_DEADLINE)
    return -1;
  if (wake <= now)
    return 0;
  ms = (wake - now + ms_ns(1) - 1) / ms_ns(1);
  return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* Once the job ends and nothing runs: SIGKILL to every group, then drain. */
static void maybe_finish(struct hvdrun_sup *s, int64_t now) {
  if (!s->end_when_idle || s->drain_until != 0 || hvdrun_sup_running(s) > 0)
    return;
  for (size_t i = 0; i < s->n; i++)
    signal_group(&s->procs[i], SIGKILL);
  s->drain_until = now + ms_ns(HVDRUN_DRAIN_MS);
}

void hvdrun_sup_run(struct hvdrun_sup *s) {
  int64_t turn_at = hvd_now_ns(); /* the policy's first turn comes at once */

  for (;;) {
    int64_t now = hvd_now_ns();
    nfds_t n;
    int rc;

    maybe_finish(s, now);
    n = gather(s);
    if (s->drain_until != 0 && (n == FIXED_FDS || now >= s->drain_until))
      return;
    rc = poll(s->pfds, n, poll_timeout(next_wake(s, turn_at), now));
    if (rc < 0 && errno != EINTR) {
      hvd_error(HVD_ERR_IO, "poll: %s", strerror(errno));
      s->hooks.failed_cb(s->hooks.arg);
    }
    if (rc > 0 && (s->pfds[0].revents & POLLIN))
      on_signals(s);
    if (rc > 0 && (s->pfds[1].revents & POLLIN))
      drain_wakes(s);
    if (rc > 0)
      forward(s, n);
    kill_overdue(s);
    turn_at = s->hooks.tick_cb(s->hooks.arg);
  }
}
