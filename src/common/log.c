/*
 * Logging. Settings are atomics so any thread may log at any time; a line is
 * formatted on the stack and written with one write(2), which keeps lines of
 * concurrent threads (and of ranks sharing a pipe) whole.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

enum { LOG_LINE_MAX = 4096, LOG_NAME_MAX = 64 };

static atomic_int log_level = HVD_LOG_WARNING;
static atomic_bool log_hide_time = false;
static atomic_int log_rank = -1;
static char log_name[LOG_NAME_MAX] = "hvd";

static const char level_letters[] = "TDIWEF";

hvd_status hvd_log_configure_from_env(void) {
  int level = HVD_LOG_WARNING; /* the table's words are the levels, in order */
  bool hide = false;
  hvd_status st = hvd_setting_word(HVD_SET_LOG_LEVEL, &level);

  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_LOG_HIDE_TIME, &hide);
  if (st != HVD_OK)
    return st;
  hvd_log_set_level((enum hvd_log_level)level);
  hvd_log_set_hide_time(hide);
  return HVD_OK;
}

void hvd_log_set_level(enum hvd_log_level level) { atomic_store(&log_level, (int)level); }
enum hvd_log_level hvd_log_get_level(void) { return (enum hvd_log_level)atomic_load(&log_level); }
void hvd_log_set_hide_time(bool hide) { atomic_store(&log_hide_time, hide); }
void hvd_log_set_rank(int rank) { atomic_store(&log_rank, rank); }

void hvd_log_set_name(const char *program) {
  /* Set once at start-up, before other threads log. */
  snprintf(log_name, sizeof(log_name), "%s", program);
}

bool hvd_log_enabled(enum hvd_log_level level) { return (int)level >= atomic_load(&log_level); }

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash != NULL ? slash + 1 : path;
}

static void write_all(int fd, const char *data, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, data, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return; /* nowhere left to report a logging failure */
    data += n;
    len -= (size_t)n;
  }
}

void hvd_log_write(enum hvd_log_level level, const char *file, int line, const char *fmt, ...) {
  char out[LOG_LINE_MAX];
  size_t len = 0;
  int rank = atomic_load(&log_rank);
  char who[LOG_NAME_MAX + 16];
  va_list ap;
  int n;

  if ((unsigned)level >= sizeof(level_letters) - 1)
    level = HVD_LOG_FATAL;
  if (rank >= 0)
    snprintf(who, sizeof(who), "rank %d", rank);
  else
    snprintf(who, sizeof(who), "%s", log_name);

  out[0] = '[';
  len = 1;
  if (!atomic_load(&log_hide_time)) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    len += strftime(out + len, sizeof(out) - len, "%Y-%m-%d %H:%M:%S", &tm);
    len += (size_t)snprintf(out + len, sizeof(out) - len, ".%06ld: ", ts.tv_nsec / 1000);
  }
  n = snprintf(out + len, sizeof(out) - len, "%c %s %s:%d] ", level_letters[level], who,
               base_name(file), line);
  if (n > 0)
    len += (size_t)n;
  if (len < sizeof(out)) {
    va_start(ap, fmt);
    n = vsnprintf(out + len, sizeof(out) - len, fmt, ap);
    va_end(ap);
    if (n > 0)
      len += (size_t)n;
  }
  if (len > sizeof(out) - 2)
    len = sizeof(out) - 2; /* truncated: keep room for the newline */
  out[len++] = '\n';
  write_all(STDERR_FILENO, out, len);
}
