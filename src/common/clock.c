/* Monotonic time, deadlines, and condition variables that wait on them. */
#include <errno.h>
#include <time.h>

#include "common.h"

int64_t hvd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t hvd_coarse_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t hvd_deadline_after_ms(int64_t ms) {
  int64_t now = hvd_now_ns();
  if (ms < 0 || ms > (HVD_NO_DEADLINE - now) / 1000000)
    return HVD_NO_DEADLINE;
  return now + ms * 1000000;
}

int64_t hvd_remaining_ms(int64_t deadline_ns) {
  int64_t now = hvd_now_ns();
  if (deadline_ns == HVD_NO_DEADLINE)
    return INT64_MAX / 1000000;
  if (deadline_ns <= now)
    return 0;
  return (deadline_ns - now + 999999) / 1000000;
}

void hvd_sleep_ns(int64_t ns) {
  struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
  while (ns > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int hvd_cond_init(pthread_cond_t *cond) {
  pthread_condattr_t attr;
  int rc = pthread_condattr_init(&attr);
  if (rc != 0)
    return rc;
  rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  if (rc == 0)
    rc = pthread_cond_init(cond, &attr);
  pthread_condattr_destroy(&attr);
  return rc;
}

int hvd_cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *mu, int64_t deadline_ns) {
  struct timespec ts;
  if (deadline_ns == HVD_NO_DEADLINE)
    return pthread_cond_wait(cond, mu);
  ts.tv_sec = deadline_ns / 1000000000;
  ts.tv_nsec = deadline_ns % 1000000000;
  return pthread_cond_timedwait(cond, mu, &ts);
}
