/* The multi-process harness of the coordinator tests (see coord_harness.h). */
#include "coord_harness.h"

#include <errno.h>
#include <time.h>

struct job job;

void job_setup(void) {
  memset(&job, 0, sizeof(job));
  store_process_start(&job.store);
  job.port = job.store.port;
}

void job_teardown(void) { store_process_stop(&job.store); }

int report(int code, const char *fmt, ...) {
  va_list ap;
  char msg[2048];
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  fprintf(stderr, "rank %d: %s\n", hvd_rank(), msg);
  return code;
}

static void set_int(const char *name, int v) {
  char text[32];
  snprintf(text, sizeof(text), "%d", v);
  setenv(name, text, 1);
}

static void put_env(const char *setting) {
  char name[128];
  const char *eq = strchr(setting, '=');
  if (eq == NULL || (size_t)(eq - setting) >= sizeof(name))
    return;
  memcpy(name, setting, (size_t)(eq - setting));
  name[eq - setting] = '\0';
  setenv(name, eq + 1, 1);
}

static int child(int rank, int size, rank_fn fn, void *arg) {
  int code;

  set_int("HOROVOD_RANK", rank);
  set_int("HOROVOD_SIZE", size);
  setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1", 1);
  set_int("HOROVOD_GLOO_RENDEZVOUS_PORT", job.port);
  set_int("HOROVOD_GLOO_TIMEOUT_SECONDS", job.timeout_s > 0 ? job.timeout_s : 20);
  setenv("HOROVOD_HOSTNAME", job.hosts[rank] != NULL ? job.hosts[rank] : "localhost", 1);
  for (int i = 0; i < 16 && job.env[i] != NULL; i++)
    put_env(job.env[i]);
  for (int i = 0; i < 4 && job.rank_env[rank][i] != NULL; i++)
    put_env(job.rank_env[rank][i]);
  if (hvd_init() != HVD_OK) {
    fprintf(stderr, "rank %d: hvd_init: %s\n", rank, hvd_last_error_message());
    return EXIT_SETUP;
  }
  code = fn(rank, size, arg);
  hvd_shutdown();
  return code;
}

void run_ranks(int size, rank_fn fn, void *arg, int *codes, int deadline_s) {
  pid_t pids[16];
  struct timespec start;

  ck_assert_int_le(size, 16);
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      alarm((unsigned)deadline_s + 30);
      fflush(stderr);
      _exit(child(r, size, fn, arg));
    }
  }
  /* Reap every rank; a rank that stopped itself (SIGSTOP: a frozen
   * process) is killed once all the others have exited. */
  bool exited[16] = {false}, stopped[16] = {false};
  int left = size;
  while (left > 0) {
    struct timespec now;
    int running = 0;
    for (int r = 0; r < size; r++) {
      int status = 0;
      pid_t got;
      if (exited[r])
        continue;
      got = waitpid(pids[r], &status, WNOHANG | WUNTRACED);
      if (got == 0) {
        running += !stopped[r];
        continue;
      }
      if (got > 0 && WIFSTOPPED(status)) {
        stopped[r] = true;
        continue;
      }
      exited[r] = true;
      left--;
      if (got < 0)
        codes[r] = -1000;
      else if (WIFEXITED(status))
        codes[r] = WEXITSTATUS(status);
      else
        codes[r] = -WTERMSIG(status);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    for (int r = 0; r < size; r++) {
      if (!exited[r] && (running == 0 || now.tv_sec - start.tv_sec > deadline_s))
        kill(pids[r], SIGKILL);
    }
    usleep(2000);
  }
}

uint64_t lane_completions(void) {
  struct coord_state *s = coord_acquire_quiet();
  uint64_t n = s != NULL ? atomic_load(&s->lane_waits.completed) : 0;
  if (s != NULL)
    coord_release();
  return n;
}

void run_ok(int size, rank_fn fn, void *arg) {
  int codes[16];
  run_ranks(size, fn, arg, codes, 120);
  for (int r = 0; r < size; r++)
    ck_assert_msg(codes[r] == 0, "size %d: rank %d exited with %d", size, r, codes[r]);
}

/* ==== tensor elements ===================================================================== */

double element_get(hvd_dtype t, const void *buf, size_t i) {
  switch (t) {
  case HVD_UINT8: return ((const uint8_t *)buf)[i];
  case HVD_INT8: return ((const int8_t *)buf)[i];
  case HVD_UINT16: return ((const uint16_t *)buf)[i];
  case HVD_INT16: return ((const int16_t *)buf)[i];
  case HVD_INT32: return ((const int32_t *)buf)[i];
  case HVD_INT64: return (double)((const int64_t *)buf)[i];
  case HVD_FLOAT16: return ops_half_to_float(((const uint16_t *)buf)[i]);
  case HVD_BFLOAT16: return ops_bf16_to_float(((const uint16_t *)buf)[i]);
  case HVD_FLOAT32: return ((const float *)buf)[i];
  case HVD_FLOAT64: return ((const double *)buf)[i];
  case HVD_BOOL: return ((const uint8_t *)buf)[i];
  }
  return -1;
}

void element_put(hvd_dtype t, void *buf, size_t i, double v) {
  switch (t) {
  case HVD_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case HVD_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case HVD_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
  case HVD_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
  case HVD_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case HVD_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case HVD_FLOAT16: ((uint16_t *)buf)[i] = ops_float_to_half((float)v); break;
  case HVD_BFLOAT16: ((uint16_t *)buf)[i] = ops_float_to_bf16((float)v); break;
  case HVD_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case HVD_FLOAT64: ((double *)buf)[i] = v; break;
  case HVD_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
  }
}
