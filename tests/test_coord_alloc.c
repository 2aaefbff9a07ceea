/*
 * A training loop's steady state allocates nothing: ranks repeat one
 * cached small allreduce (a 4-byte metric under the same name), and after
 * a warm-up the heap allocations of the whole process (the user thread,
 * hvd's background thread, any other) are counted over many more
 * (alloc_count.h). Every rank must count zero, on each path such an
 * operation takes: lanes (one host), rank 0's negotiation with the result
 * reduced inline, the same with a collective run for it, and a job over
 * TCP on two hosts. Metrics are counted, not sent. Suite: steady.
 */
#include "alloc_count.h"
#include "coord_harness.h"

enum { WARMUP = 100, COUNTED = 200 };

struct path {
  const char *name;
  int size;
  const char *env[4];
  const char *hosts[4]; /* HOROVOD_HOSTNAME per rank; NULL: one host */
  bool lanes;           /* completes through lanes (where ranks have a core each) */
};

static const struct path paths[] = {
    /* A lane waits HVD_SPIN_US for the others: more than the default, for
     * a loaded machine. */
    {"lanes", 2, {"HVD_SPIN_US=2000"}, {NULL}, true},
    {"lanes", 3, {"HVD_SPIN_US=2000"}, {NULL}, true},
    {"rank 0, inline", 2, {"HVD_SHM_LANES=0"}, {NULL}, false},
    {"rank 0, inline", 3, {"HVD_SHM_LANES=0"}, {NULL}, false},
    {"rank 0, collective", 3, {"HVD_SHM_LANES=0", "HVD_INLINE_BYTES=0"}, {NULL}, false},
    {"two hosts, TCP", 3, {"HVD_SHM=0"}, {"a", "a", "b"}, false},
};

/* One allreduce of a float, the same name every time (so a cached one);
 * rank r gives r + step % 8. */
static int metric(int rank, int size, int step) {
  int64_t shape[1] = {1};
  float in = (float)(rank + step % 8), out = -1;
  float want = (float)(size * (step % 8) + size * (size - 1) / 2);
  hvd_tensor t = {"alloc.metric", HVD_FLOAT32, 1, shape, &in, &out};

  CALL(hvd_allreduce(&t, NULL));
  EXPECT(out == want, "step %d: %g, want %g", step, (double)out, (double)want);
  return 0;
}

static int steady_state(int rank, int size, void *arg) {
  const struct path *p = arg;
  uint64_t allocs, lanes_before, lanes;
  int code;

  alloc_count_init();
  for (int step = 0; step < WARMUP; step++) {
    /* With lanes, now and then a rank falls behind by longer than a lane
     * waits: that step goes through rank 0 on every rank and the lane is
     * granted again, as may happen in the window on a loaded machine. The
     * buffers of that way grow here, the first time, not there. */
    if (p->lanes && step % 20 == 10 && rank == (step / 20) % size)
      usleep(5000);
    if ((code = metric(rank, size, step)) != 0)
      return code;
  }
  lanes_before = lane_completions();
  alloc_count_start();
  for (int step = WARMUP; step < WARMUP + COUNTED; step++) {
    if ((code = metric(rank, size, step)) != 0) {
      alloc_count_stop();
      return code;
    }
  }
  allocs = alloc_count_stop();
  lanes = lane_completions() - lanes_before;
  /* Once any rank has finished this one, every rank has stopped counting:
   * one that shuts down first cannot be counted on another. */
  if ((code = metric(rank, size, WARMUP + COUNTED)) != 0)
    return code;
  if (allocs != 0) {
    report(EXIT_WRONG, "%s, %d ranks: %llu allocations in %d cached allreduces", p->name, size,
           (unsigned long long)allocs, COUNTED);
    alloc_count_report(stderr);
    return EXIT_WRONG;
  }
  if (p->lanes && size <= sysconf(_SC_NPROCESSORS_ONLN))
    EXPECT(lanes > 0, "%s, %d ranks: none of %d allreduces went through lanes", p->name, size,
           COUNTED);
  if (!p->lanes)
    EXPECT(lanes == 0, "%s, %d ranks: %llu allreduces went through lanes", p->name, size,
           (unsigned long long)lanes);
  return 0;
}

START_TEST(cached_allreduce_allocates_nothing) {
  const struct path *p = &paths[_i];
  for (int i = 0; i < 4; i++) {
    job.env[i] = p->env[i];
    job.hosts[i] = p->hosts[i];
  }
  /* The counters are kept (their updates are on the path counted); the
   * thread that sends them once a second allocates in libcurl, not per
   * operation, and would land in the window only now and then. */
  setenv("HVD_METRICS", "1", 1);
  setenv("HVD_METRICS_PUSH_MS", "0", 1);
  run_ok(p->size, steady_state, (void *)p);
  unsetenv("HVD_METRICS_PUSH_MS");
}
END_TEST

static Suite *steady_suite(void) {
  Suite *s = suite_create("steady");
  TCase *tc = tcase_create("steady");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, cached_allreduce_allocates_nothing, 0, (int)HVD_ARRAY_SIZE(paths));
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr;
  int failed;

  if (!ALLOC_COUNT_AVAILABLE) {
    fprintf(stderr, "skipped: allocations cannot be counted under this sanitizer\n");
    return 77;
  }
  sr = srunner_create(steady_suite());
  srunner_run_all(sr, CK_ENV);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
