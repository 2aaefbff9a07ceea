#include <stdio.h>
#include <hvd/hvd.h>

int main(void) {
  float grad[1000] = {0};
  int64_t shape[1] = {1000};
  hvd_tensor t = {"layer1.weight", HVD_FLOAT32, 1, shape, grad, grad};
  hvd_options o = HVD_OPTIONS_INIT;
  hvd_handle h;
  hvd_status st;

  if (hvd_init() != HVD_OK) /* reads the HOROVOD_* environment; alone: size 1 */
    return 1;
  o.op = HVD_AVERAGE;
  st = hvd_allreduce_async(&t, &o, &h); /* or hvd_allreduce(&t, &o): blocking */
  if (st == HVD_OK) {
    st = hvd_handle_wait(h); /* grad now holds the average over every rank */
    hvd_handle_release(h);
  }
  if (st != HVD_OK)
    fprintf(stderr, "allreduce: %s\n", hvd_last_error_message());
  hvd_shutdown();
  return st == HVD_OK ? 0 : 1;
}
