#include "coord_harness.h"

static int basic(int rank, int size, void *arg) {
  (void)arg;
  float in[5], out[5];
  int64_t shape[1] = {5};
  for (int i = 0; i < 5; i++) in[i] = (float)(rank + i);
  hvd_tensor t = {"x", HVD_FLOAT32, 1, shape, in, out};
  for (int k = 0; k < 3; k++) {
    CALL(hvd_allreduce(&t, NULL));
    for (int i = 0; i < 5; i++) {
      float want = 0; for (int r = 0; r < size; r++) want += (float)(r + i);
      EXPECT(out[i] == want, "k %d i %d: %g != %g", k, i, out[i], want);
    }
  }
  EXPECT(hvd_rank() == rank && hvd_size() == size, "rank/size");
  return 0;
}

START_TEST(smoke) { run_ok(_i, basic, NULL); }
END_TEST

int main(void) {
  Suite *s = suite_create("smoke");
  TCase *tc = tcase_create("smoke");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, smoke, 1, 5);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_ENV);
  int f = srunner_ntests_failed(sr);
  srunner_free(sr);
  return f ? 1 : 0;
}
