/*
 * Multi-process harness of the coordinator tests: a rendezvous store in a
 * process of its own, ranks forked from the (thread-free) test process,
 * each with the environment hvdrun would give it. Children never call
 * ck_assert: they report through their exit code and stderr.
 */
#ifndef HVD_TEST_COORD_HARNESS_H
#define HVD_TEST_COORD_HARNESS_H

#include <check.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coord/coord.h"
#include "store_process.h"

enum {
  EXIT_SETUP = 10,  /* hvd_init failed */
  EXIT_WRONG = 11,  /* a value or status was not as expected */
  EXIT_FAILED = 12, /* a call failed where it should not have */
};

struct job {
  struct store_process store;
  int port;
  const char *hosts[16]; /* HOROVOD_HOSTNAME per rank, NULL: "localhost" */
  const char *env[16];   /* extra NAME=VALUE settings for every rank */
  const char *rank_env[16][4]; /* and for one rank */
  int timeout_s;         /* HOROVOD_GLOO_TIMEOUT_SECONDS (default 20) */
};

extern struct job job;

typedef int (*rank_fn)(int rank, int size, void *arg);

void job_setup(void);
void job_teardown(void);
/* Runs size ranks of fn (after hvd_init; hvd_shutdown after); codes[r]
 * gets each exit code (-signal if killed). deadline_s bounds the run. */
void run_ranks(int size, rank_fn fn, void *arg, int *codes, int deadline_s);
/* The same, and every rank must exit 0. */
void run_ok(int size, rank_fn fn, void *arg);

/* Element i of a tensor of dtype t as a double, and back (float16 and
 * bfloat16 through float, bool as 0 or 1). */
double element_get(hvd_dtype t, const void *buf, size_t i);
void element_put(hvd_dtype t, void *buf, size_t i, double v);

/* Submissions finished through lanes on this rank so far (0 before
 * hvd_init). */
uint64_t lane_completions(void);

/* A child reports why it fails; returns code. */
int report(int code, const char *fmt, ...) HVD_PRINTF(2, 3);
#define EXPECT(cond, ...)                                                                          \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      return report(EXIT_WRONG, __VA_ARGS__);                                                        \
  } while (0)
#define CALL(expr)                                                                                 \
  do {                                                                                             \
    hvd_status st_ = (expr);                                                                       \
    if (st_ != HVD_OK)                                                                             \
      return report(EXIT_FAILED, "%s:%d: %s: %s: %s", __FILE__, __LINE__, #expr,                    \
                  hvd_strerror(st_), hvd_last_error_message());                                    \
  } while (0)

#endif
