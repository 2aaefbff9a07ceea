/*
 * Tests of the collectives: forked ranks on loopback run every collective
 * against a serial reference computed from every rank's (deterministic)
 * input. Inputs are small integers, so every order of reduction gives the
 * same bits and results must match exactly; a separate test checks that
 * random floats give bitwise-identical results on every rank.
 * Children never call ck_assert: the first mismatch goes to stderr and the
 * exit code; the parent asserts on exit codes.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/ops.h"
#include "transport/transport_private.h" /* shm_state */
#include "store_process.h"

Suite *kernels_suite(void);

enum { EXIT_SETUP = 10, EXIT_WRONG = 11, EXIT_FAILED = 12 };

/* ==== ranks ======================================================================= */

struct job {
  struct store_process store;
  int port;
  const char *hosts[8]; /* fake hostname per rank */
  int64_t timeout_ms;   /* the ranks' progress timeout (0: 30 s) */
};

static struct job job;

static void job_setup(void) {
  memset(&job, 0, sizeof(job));
  store_process_start(&job.store);
  job.port = job.store.port;
}

static void job_teardown(void) { store_process_stop(&job.store); }

struct rank_env {
  struct net_world *w;
  struct rdzv_client *store;
  struct ops_ctx *ops;      /* default tunables */
  struct ops_ctx *ring;     /* HVD_ALLREDUCE_ALGORITHM=ring, small segments */
  struct ops_ctx *rd;       /* recursive doubling */
  struct ops_ctx *hd;       /* halving-doubling */
  struct ops_ctx *halving;  /* HVD_ALLREDUCE_SMALL_BYTES=0: Adasum halves even small buffers */
  char failure[512];
};

typedef int (*rank_fn)(struct rank_env *e);

static int child(int rank, int size, rank_fn fn) {
  struct net_world_config cfg;
  struct rank_env e;
  int code = EXIT_SETUP;

  memset(&e, 0, sizeof(e));
  memset(&cfg, 0, sizeof(cfg));
  hvd_log_set_rank(rank);
  if (rdzv_client_create("127.0.0.1", job.port, NULL, 30000, &e.store) != HVD_OK)
    goto out;
  cfg.ctx.rank = rank;
  cfg.ctx.hostname = job.hosts[rank] ? job.hosts[rank] : "localhost";
  cfg.ctx.store = e.store;
  cfg.ctx.store_host = "127.0.0.1";
  cfg.ctx.store_port = job.port;
  cfg.size = size;
  cfg.local_rank = cfg.local_size = cfg.cross_rank = cfg.cross_size = -1;
  cfg.ctx.timeout_ms = job.timeout_ms > 0 ? job.timeout_ms : 30000;
  /* The child is single-threaded: changing its environment is safe.
   * The default context meets in shared memory, in small buffers so that
   * modest sizes take several rounds; the others run the TCP algorithms. */
  setenv("HVD_SHM_BUFFER_BYTES", "65536", 1);
  if (net_world_create(&cfg, &e.w) != HVD_OK || ops_ctx_create(&e.ops) != HVD_OK)
    goto out;
  setenv("HVD_SHM", "0", 1);
  setenv("HVD_ALLREDUCE_ALGORITHM", "ring", 1);
  setenv("HVD_RING_SEGMENT_BYTES", "4096", 1); /* many segments even for small tests */
  setenv("HVD_BROADCAST_SMALL_BYTES", "0", 1);
  if (ops_ctx_create(&e.ring) != HVD_OK)
    goto out;
  setenv("HVD_ALLREDUCE_ALGORITHM", "recursive_doubling", 1);
  setenv("HVD_BROADCAST_SMALL_BYTES", "1000000000", 1);
  if (ops_ctx_create(&e.rd) != HVD_OK)
    goto out;
  setenv("HVD_ALLREDUCE_ALGORITHM", "halving_doubling", 1);
  if (ops_ctx_create(&e.hd) != HVD_OK)
    goto out;
  unsetenv("HVD_ALLREDUCE_ALGORITHM");
  setenv("HVD_ALLREDUCE_SMALL_BYTES", "0", 1);
  if (ops_ctx_create(&e.halving) != HVD_OK)
    goto out;
  code = fn(&e);
  if (code != 0)
    fprintf(stderr, "rank %d: %s\n", rank, e.failure);
out:
  if (code == EXIT_SETUP)
    fprintf(stderr, "rank %d: setup: %s\n", rank, hvd_last_error_message());
  ops_ctx_destroy(e.halving);
  ops_ctx_destroy(e.hd);
  ops_ctx_destroy(e.rd);
  ops_ctx_destroy(e.ring);
  ops_ctx_destroy(e.ops);
  net_world_destroy(e.w);
  rdzv_client_destroy(e.store);
  return code;
}

/* Runs `size` ranks; every one must exit 0. */
static void run(int size, rank_fn fn) {
  pid_t pids[8];
  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      alarm(240);
      _exit(child(r, size, fn));
    }
  }
  for (int r = 0; r < size; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "size %d: rank %d ended with status 0x%x", size, r, status);
  }
}

/* ==== inputs and references ======================================================== */

/* Rank r's element i: a small integer valid in every dtype, so that every
 * reduction order is exact. `kind` picks the range per op. */
static double value(int rank, size_t i, hvd_reduce_op op, int salt) {
  int v = (int)((rank * 7 + (int)i * 3 + salt) % 5);
  if (op == HVD_PRODUCT)
    return (double)(1 + v % 2); /* 1 or 2: at most 2^5 */
  return (double)(v + 1);       /* 1..5: sums of 5 ranks stay <= 25 */
}

static void set_element(void *buf, size_t i, hvd_dtype dt, double v) {
  switch (dt) {
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
  case HVD_BOOL: ((uint8_t *)buf)[i] = (uint8_t)((int)v % 2); break;
  }
}

static void fill(void *buf, size_t count, hvd_dtype dt, int rank, hvd_reduce_op op, int salt) {
  for (size_t i = 0; i < count; i++)
    set_element(buf, i, dt, value(rank, i, op, salt));
}

/* The reduction of every rank's input, scaled as the collective does. */
static void reference(void *out, size_t count, hvd_dtype dt, hvd_reduce_op op, int size,
                      int salt, double pre, double post, void *tmp) {
  if (op == HVD_AVERAGE)
    post /= size;
  fill(out, count, dt, 0, op, salt);
  if (pre != 1.0)
    ops_scale(out, out, count, dt, pre);
  for (int r = 1; r < size; r++) {
    fill(tmp, count, dt, r, op, salt);
    if (pre != 1.0)
      ops_scale(tmp, tmp, count, dt, pre);
    ops_reduce(out, out, tmp, count, dt, op);
  }
  if (post != 1.0)
    ops_scale(out, out, count, dt, post);
}

static const hvd_dtype all_dtypes[] = {HVD_UINT8,    HVD_INT8,    HVD_UINT16,  HVD_INT16,
                                       HVD_INT32,    HVD_INT64,   HVD_FLOAT16, HVD_BFLOAT16,
                                       HVD_FLOAT32,  HVD_FLOAT64, HVD_BOOL};
static const hvd_reduce_op all_ops[] = {HVD_SUM, HVD_AVERAGE, HVD_MIN, HVD_MAX, HVD_PRODUCT};

static int mismatch(struct rank_env *e, const char *fmt, ...) HVD_PRINTF(2, 3);
static int mismatch(struct rank_env *e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->failure, sizeof(e->failure), fmt, ap);
  va_end(ap);
  return EXIT_WRONG;
}

static int failed_call(struct rank_env *e, const char *what) {
  snprintf(e->failure, sizeof(e->failure), "%s: %s", what, hvd_last_error_message());
  return EXIT_FAILED;
}

/* Counts worth checking for a communicator of n ranks. */
static size_t counts_for(int n, size_t *out) {
  size_t k = 0;
  out[k++] = 0;
  out[k++] = 1;
  if (n > 2)
    out[k++] = (size_t)n - 1; /* fewer elements than ranks */
  out[k++] = 7;
  out[k++] = 1001; /* not divisible by the rank count */
  return k;
}

/* ==== allreduce ======================================================================= */

static int allreduce_all(struct rank_env *e) {
  struct net_comm *c = e->w->global;
  int n = net_comm_size(c), r = net_comm_rank(c);
  struct ops_ctx *ctxs[] = {e->ops, e->ring, e->rd, e->hd};
  const char *ctx_names[] = {"auto", "ring", "recursive doubling", "halving-doubling"};
  size_t counts[8], nc = counts_for(n, counts);
  size_t max = 300000;
  char *in = malloc(max * 8), *out = malloc(max * 8), *ref = malloc(max * 8),
       *tmp = malloc(max * 8);

  for (size_t x = 0; x < HVD_ARRAY_SIZE(ctxs); x++) {
    for (size_t d = 0; d < HVD_ARRAY_SIZE(all_dtypes); d++) {
      hvd_dtype dt = all_dtypes[d];
      size_t es = hvd_dtype_size(dt);
      for (size_t p = 0; p < HVD_ARRAY_SIZE(all_ops); p++) {
        hvd_reduce_op op = all_ops[p];
        if (dt == HVD_BOOL && op == HVD_AVERAGE)
          continue;
        for (size_t k = 0; k < nc + 1; k++) {
          /* One count past a ring segment, for float32 only. */
          size_t count = k < nc ? counts[k] : (dt == HVD_FLOAT32 ? max : 0);
          for (int inplace = 0; inplace < 2; inplace++) {
            int salt = (int)(d * 31 + p * 7 + k);
            fill(in, count, dt, r, op, salt);
            memset(out, 0xab, count * es + 8);
            void *dst = inplace ? in : out;
            if (ops_allreduce(ctxs[x], c, in, dst, count, dt, op, 1.0, 1.0) != HVD_OK)
              return failed_call(e, "ops_allreduce");
            reference(ref, count, dt, op, n, salt, 1.0, 1.0, tmp);
            if (memcmp(dst, ref, count * es) != 0)
              return mismatch(e, "allreduce %s %s %s count %zu %s differs", ctx_names[x],
                          hvd_dtype_name(dt), hvd_reduce_op_name(op), count,
                          inplace ? "in place" : "out of place");
            if (!inplace && (unsigned char)out[count * es] != 0xab)
              return mismatch(e, "allreduce wrote past the end");
          }
        }
      }
    }
  }
  /* Prescale and postscale. */
  for (size_t d = 0; d < HVD_ARRAY_SIZE(all_dtypes) - 1; d++) {
    hvd_dtype dt = all_dtypes[d];
    for (size_t x = 0; x < HVD_ARRAY_SIZE(ctxs); x++) {
      size_t count = 1001;
      fill(in, count, dt, r, HVD_SUM, 3);
      if (ops_allreduce(ctxs[x], c, in, out, count, dt, HVD_AVERAGE, 2.0, 0.5) != HVD_OK)
        return failed_call(e, "scaled ops_allreduce");
      reference(ref, count, dt, HVD_AVERAGE, n, 3, 2.0, 0.5, tmp);
      if (memcmp(out, ref, count * hvd_dtype_size(dt)) != 0)
        return mismatch(e, "scaled allreduce %s %s differs", ctx_names[x], hvd_dtype_name(dt));
    }
  }
  /* Bad arguments fail on every rank without touching the network. */
  if (ops_allreduce(e->ops, c, in, out, 4, HVD_BOOL, HVD_AVERAGE, 1.0, 1.0) !=
      HVD_ERR_INVALID_ARGUMENT)
    return mismatch(e, "bool average accepted");
  free(in);
  free(out);
  free(ref);
  free(tmp);
  return 0;
}

START_TEST(allreduce_1_to_5_ranks) {
  for (int n = 1; n <= 5; n++)
    run(n, allreduce_all);
}
END_TEST

/* Random floats: whatever the order, every rank must end with the same bits. */
static int identical_fn(struct rank_env *e) {
  struct net_comm *c = e->w->global;
  int n = net_comm_size(c), r = net_comm_rank(c);
  struct ops_ctx *ctxs[] = {e->ops, e->ring, e->rd, e->hd};
  size_t count = 200003;
  float *buf = malloc(count * sizeof(float));
  uint64_t hash[8];

  for (size_t x = 0; x < HVD_ARRAY_SIZE(ctxs); x++) {
    uint64_t h = 1469598103934665603ull;
    unsigned seed = (unsigned)r * 2654435761u + 17;
    for (size_t i = 0; i < count; i++) {
      seed = seed * 1103515245u + 12345u;
      buf[i] = (float)((int)(seed >> 8) % 100000) / 977.0f;
    }
    if (ops_allreduce(ctxs[x], c, buf, buf, count, HVD_FLOAT32, HVD_SUM, 1.0, 1.0) != HVD_OK)
      return failed_call(e, "ops_allreduce");
    for (size_t i = 0; i < count * sizeof(float); i++)
      h = (h ^ ((unsigned char *)buf)[i]) * 1099511628211ull;
    /* Everybody's hash, through the collective under test's sibling. */
    size_t ones[8];
    for (int i = 0; i < n; i++)
      ones[i] = 1;
    if (ops_allgatherv(e->ops, c, &h, hash, ones, HVD_INT64) != HVD_OK)
      return failed_call(e, "ops_allgatherv");
    for (int i = 0; i < n; i++)
      if (hash[i] != h)
        return mismatch(e, "rank %d's result differs from this rank's (algorithm %zu)", i, x);
  }
  free(buf);
  return 0;
}

START_TEST(allreduce_bitwise_identical) {
  for (int n = 2; n <= 5; n++)
    run(n, identical_fn);
}
END_TEST

/* ==== the other collectives ============================================================== */

static int others_fn(struct rank_env *e) {
  struct net_comm *c = e->w->global;
  int n = net_comm_size(c), r = net_comm_rank(c);
  static const hvd_dtype dts[] = {HVD_UINT8, HVD_INT32, HVD_FLOAT16, HVD_FLOAT64, HVD_BOOL};
  size_t counts[8], sizes[8], recv[8], nc = counts_for(n, counts);
  char *in = malloc(1 << 22), *out = malloc(1 << 22), *ref = malloc(1 << 22),
       *tmp = malloc(1 << 22);
  struct ops_ctx *ctxs[] = {e->ops, e->ring, e->rd};

  for (size_t d = 0; d < HVD_ARRAY_SIZE(dts); d++) {
    hvd_dtype dt = dts[d];
    size_t es = hvd_dtype_size(dt);

    /* allgatherv: rank i gives (i * 3 + k) % 5 elements, zeros included. */
    for (size_t k = 0; k < 4; k++) {
      size_t total = 0;
      for (int i = 0; i < n; i++) {
        sizes[i] = (size_t)(i * 3 + (int)k) % 5 * (k == 3 ? 20000 : 1);
        total += sizes[i];
      }
      fill(in, sizes[r], dt, r, HVD_SUM, (int)k);
      memset(out, 0xcd, total * es + 8);
      if (ops_allgatherv(ctxs[k % 3], c, in, out, sizes, dt) != HVD_OK)
        return failed_call(e, "ops_allgatherv");
      size_t off = 0;
      for (int i = 0; i < n; i++) {
        fill(ref, sizes[i], dt, i, HVD_SUM, (int)k);
        if (memcmp(out + off * es, ref, sizes[i] * es) != 0)
          return mismatch(e, "allgatherv %s case %zu: block of rank %d differs", hvd_dtype_name(dt),
                      k, i);
        off += sizes[i];
      }
      if ((unsigned char)out[total * es] != 0xcd)
        return mismatch(e, "allgatherv wrote past the end");
    }

    /* broadcast from every root, tree and chain, small and segmented. */
    for (int root = 0; root < n; root++) {
      for (size_t k = 0; k < nc + 1; k++) {
        size_t count = k < nc ? counts[k] : 150000 / es;
        struct ops_ctx *o = ctxs[(k + (size_t)root) % 3];
        fill(in, count, dt, r == root ? 100 : r, HVD_SUM, root);
        if (ops_broadcast(o, c, in, count, dt, root) != HVD_OK)
          return failed_call(e, "ops_broadcast");
        fill(ref, count, dt, 100, HVD_SUM, root);
        if (memcmp(in, ref, count * es) != 0)
          return mismatch(e, "broadcast %s from %d count %zu differs", hvd_dtype_name(dt), root,
                      count);
      }
    }

    /* alltoallv: rank i sends (i + j) % 3 elements to rank j (zeros too),
     * Horovod's test shape (rank+1 elements to everyone), and 20000 times
     * the first (several rounds of the shared buffers); shapes 0-2 in shared
     * memory, 3-5 over TCP. */
    for (int shape = 0; shape < 6; shape++) {
      size_t sent = 0, got = 0, send_counts[8];
      size_t scale = shape % 3 == 2 ? 20000 : 1;
      for (int j = 0; j < n; j++) {
        send_counts[j] = shape % 3 != 1 ? (size_t)(r + j) % 3 * scale : (size_t)r + 1;
        recv[j] = shape % 3 != 1 ? (size_t)(j + r) % 3 * scale : (size_t)j + 1;
        sent += send_counts[j];
      }
      /* Element value encodes sender and destination. */
      size_t pos = 0;
      for (int j = 0; j < n; j++)
        for (size_t i = 0; i < send_counts[j]; i++)
          set_element(in, pos++, dt, (double)((r * 5 + j + (int)i) % (dt == HVD_BOOL ? 2 : 50)));
      if (ops_alltoallv(shape < 3 ? e->ops : e->ring, c, in, send_counts, out, recv, dt) !=
          HVD_OK)
        return failed_call(e, "ops_alltoallv");
      pos = 0;
      for (int j = 0; j < n; j++) {
        for (size_t i = 0; i < recv[j]; i++) {
          set_element(ref, 0, dt, (double)((j * 5 + r + (int)i) % (dt == HVD_BOOL ? 2 : 50)));
          if (memcmp(out + pos * es, ref, es) != 0)
            return mismatch(e, "alltoallv %s shape %d: element %zu from rank %d differs",
                        hvd_dtype_name(dt), shape, i, j);
          pos++;
        }
        got += recv[j];
      }
      (void)sent;
      (void)got;
    }

    /* reducescatter: uneven shares, every op. */
    for (size_t p = 0; p < HVD_ARRAY_SIZE(all_ops); p++) {
      hvd_reduce_op op = all_ops[p];
      if (dt == HVD_BOOL && op == HVD_AVERAGE)
        continue;
      for (size_t k = 0; k < nc + 1; k++) {
        size_t count = k < nc ? counts[k] : 100003;
        size_t share = ops_share_count(count, n, r), off = ops_share_offset(count, n, r);
        fill(in, count, dt, r, op, (int)(p + k));
        memset(out, 0xee, share * es + 8);
        if (ops_reducescatter(ctxs[k % 3], c, in, out, count, dt, op, 1.0, 1.0) != HVD_OK)
          return failed_call(e, "ops_reducescatter");
        reference(ref, count, dt, op, n, (int)(p + k), 1.0, 1.0, tmp);
        if (memcmp(out, ref + off * es, share * es) != 0)
          return mismatch(e, "reducescatter %s %s count %zu differs", hvd_dtype_name(dt),
                      hvd_reduce_op_name(op), count);
        if ((unsigned char)out[share * es] != 0xee)
          return mismatch(e, "reducescatter wrote past its share");
        /* The input is left as it was. */
        fill(ref, count, dt, r, op, (int)(p + k));
        if (memcmp(in, ref, count * es) != 0)
          return mismatch(e, "reducescatter changed its input");
      }
    }
  }
  /* Barrier (shared memory, then TCP): nobody leaves before everybody arrived. */
  for (int x = 0; x < 2; x++) {
    char key[32];
    snprintf(key, sizeof(key), "arrived%d.%d", r, x);
    if (rdzv_client_set(e->store, "barrier_test", key, "1", 1) != HVD_OK ||
        ops_barrier(x == 0 ? e->ops : e->ring, c) != HVD_OK)
      return failed_call(e, "barrier");
    for (int i = 0; i < n; i++) {
      struct hvd_buf v;
      hvd_buf_init(&v, 0);
      snprintf(key, sizeof(key), "arrived%d.%d", i, x);
      hvd_status st = rdzv_client_get(e->store, "barrier_test", key, &v, NULL);
      hvd_buf_fini(&v);
      if (st != HVD_OK)
        return mismatch(e, "left barrier %d before rank %d arrived", x, i);
    }
  }
  if (ops_broadcast(e->ops, c, in, 1, HVD_INT32, n) != HVD_ERR_INVALID_ARGUMENT)
    return mismatch(e, "broadcast from a rank that does not exist was accepted");
  free(in);
  free(out);
  free(ref);
  free(tmp);
  return 0;
}

START_TEST(other_collectives_1_to_5_ranks) {
  for (int n = 1; n <= 5; n++)
    run(n, others_fn);
}
END_TEST

/* ==== hierarchical =========================================================================== */

static int hierarchical_fn(struct rank_env *e) {
  struct ops_layout l = {e->w->global, e->w->local, e->w->cross};
  int n = e->w->size, r = e->w->rank;
  size_t counts[8], nc = counts_for(n, counts), sizes[8];
  char *in = malloc(1 << 22), *out = malloc(1 << 22), *ref = malloc(1 << 22),
       *tmp = malloc(1 << 22);
  static const hvd_dtype dts[] = {HVD_INT32, HVD_FLOAT32, HVD_BFLOAT16};

  for (size_t d = 0; d < HVD_ARRAY_SIZE(dts); d++) {
    hvd_dtype dt = dts[d];
    size_t es = hvd_dtype_size(dt);
    for (size_t p = 0; p < HVD_ARRAY_SIZE(all_ops); p++) {
      hvd_reduce_op op = all_ops[p];
      for (size_t k = 0; k < nc + 1; k++) {
        size_t count = k < nc ? counts[k] : 250001;
        fill(in, count, dt, r, op, (int)k);
        if (ops_allreduce_hierarchical(e->ring, &l, in, out, count, dt, op, 1.0, 1.0) != HVD_OK)
          return failed_call(e, "ops_allreduce_hierarchical");
        reference(ref, count, dt, op, n, (int)k, 1.0, 1.0, tmp);
        if (memcmp(out, ref, count * es) != 0)
          return mismatch(e, "hierarchical allreduce %s %s count %zu differs", hvd_dtype_name(dt),
                      hvd_reduce_op_name(op), count);
      }
    }
    for (size_t k = 0; k < 3; k++) {
      size_t total = 0;
      for (int i = 0; i < n; i++) {
        sizes[i] = (size_t)(i * 2 + (int)k) % 4 * (k == 2 ? 10000 : 1);
        total += sizes[i];
      }
      fill(in, sizes[r], dt, r, HVD_SUM, (int)k);
      if (ops_allgatherv_hierarchical(e->ops, &l, in, out, sizes, dt) != HVD_OK)
        return failed_call(e, "ops_allgatherv_hierarchical");
      size_t off = 0;
      for (int i = 0; i < n; i++) {
        fill(ref, sizes[i], dt, i, HVD_SUM, (int)k);
        if (memcmp(out + off * es, ref, sizes[i] * es) != 0)
          return mismatch(e, "hierarchical allgather %s case %zu: block %d differs",
                      hvd_dtype_name(dt), k, i);
        off += sizes[i];
      }
      (void)total;
    }
  }
  free(in);
  free(out);
  free(ref);
  free(tmp);
  return 0;
}

START_TEST(hierarchical_two_hosts) {
  static const char *layouts[][6] = {
      {"hostA", "hostA", "hostB", "hostB"},
      {"hostA", "hostA", "hostA", "hostB", "hostB", "hostB"},
      {"hostA", "hostA", "hostA", "hostB"}, /* uneven: must fall back to flat */
      {"hostA", "hostB"},                   /* one rank per host: local rings of one */
  };
  static const int sizes[] = {4, 6, 4, 2};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(sizes); i++) {
    memcpy(job.hosts, layouts[i], sizeof(layouts[i]));
    run(sizes[i], hierarchical_fn);
  }
}
END_TEST

/* ==== shared memory ================================================================ */

/* Whether communicator c meets in shared memory (a collective on first use). */
static bool shares_memory(struct net_comm *c) {
  struct net_shm *s = NULL;
  return net_shm_get(c, 65536, 0, &s) == HVD_OK && s != NULL;
}

/* Two fake hosts: local phases in shared memory, the cross phase over TCP. */
static int mixed_hosts_fn(struct rank_env *e) {
  struct ops_layout l = {e->w->global, e->w->local, e->w->cross};
  int n = e->w->size, r = e->w->rank;
  size_t count = 100003, es = sizeof(float);
  char *in = malloc(count * es), *out = malloc(count * es), *ref = malloc(count * es),
       *tmp = malloc(count * es);

  for (size_t p = 0; p < HVD_ARRAY_SIZE(all_ops); p++) {
    fill(in, count, HVD_FLOAT32, r, all_ops[p], (int)p);
    if (ops_allreduce_hierarchical(e->ops, &l, in, out, count, HVD_FLOAT32, all_ops[p], 1.0,
                                   1.0) != HVD_OK)
      return failed_call(e, "ops_allreduce_hierarchical");
    reference(ref, count, HVD_FLOAT32, all_ops[p], n, (int)p, 1.0, 1.0, tmp);
    if (memcmp(out, ref, count * es) != 0)
      return mismatch(e, "hierarchical allreduce %s differs", hvd_reduce_op_name(all_ops[p]));
  }
  if (!shares_memory(e->w->local))
    return mismatch(e, "the ranks of one host do not share memory");
  if (shares_memory(e->w->global) || shares_memory(e->w->cross))
    return mismatch(e, "a communicator across hosts claims shared memory");
  free(in);
  free(out);
  free(ref);
  free(tmp);
  return 0;
}

START_TEST(mixed_hosts_use_shm_locally) {
  static const char *hosts[] = {"hostA", "hostA", "hostB", "hostB"};
  memcpy(job.hosts, hosts, sizeof(hosts));
  run(4, mixed_hosts_fn);
}
END_TEST

static int one_host_fn(struct rank_env *e) {
  int r = e->w->rank;
  float x = (float)r, y = 0;

  if (ops_allreduce(e->ring, e->w->global, &x, &y, 1, HVD_FLOAT32, HVD_SUM, 1.0, 1.0) != HVD_OK)
    return failed_call(e, "ops_allreduce");
  /* HVD_SHM=0 (the ring context) runs over TCP and sets nothing up. */
  if (e->w->global->shm_state != SHM_UNDECIDED)
    return mismatch(e, "HVD_SHM=0 still looked at shared memory");
  if (ops_allreduce(e->ops, e->w->global, &x, &y, 1, HVD_FLOAT32, HVD_SUM, 1.0, 1.0) != HVD_OK)
    return failed_call(e, "ops_allreduce");
  if (!shares_memory(e->w->global) || !shares_memory(e->w->local))
    return mismatch(e, "ranks on one host do not share memory");
  return 0;
}

START_TEST(one_host_uses_shm_unless_disabled) { run(3, one_host_fn); }
END_TEST

/* Rank 1 moves to a network namespace of its own before the first
 * collective: it cannot reach rank 0's socket, so everyone falls back to
 * TCP, and the results are still right. */
static int netns_fn(struct rank_env *e) {
  int n = e->w->size, r = e->w->rank;
  size_t count = 50001, es = sizeof(int32_t);
  char *in = malloc(count * es), *out = malloc(count * es), *ref = malloc(count * es),
       *tmp = malloc(count * es);

  if (r == 1 && unshare(CLONE_NEWNET) != 0) {
    fprintf(stderr, "rank 1: unshare(CLONE_NEWNET): %s; cannot test the fallback\n",
            strerror(errno));
    _exit(77);
  }
  fill(in, count, HVD_INT32, r, HVD_SUM, 1);
  if (ops_allreduce(e->ops, e->w->global, in, out, count, HVD_INT32, HVD_SUM, 1.0, 1.0) != HVD_OK)
    return failed_call(e, "ops_allreduce");
  reference(ref, count, HVD_INT32, HVD_SUM, n, 1, 1.0, 1.0, tmp);
  if (memcmp(out, ref, count * es) != 0)
    return mismatch(e, "allreduce after the fallback differs");
  if (shares_memory(e->w->global))
    return mismatch(e, "rank 1 is in another network namespace, yet memory is shared");
  free(in);
  free(out);
  free(ref);
  free(tmp);
  return 0;
}

START_TEST(refused_host_falls_back_to_tcp) {
  pid_t pids[3];
  int codes[3];
  if (geteuid() != 0)
    return; /* needs CAP_SYS_ADMIN for a network namespace */
  for (int r = 0; r < 3; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      alarm(120);
      _exit(child(r, 3, netns_fn));
    }
  }
  for (int r = 0; r < 3; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  if (codes[1] == 77)
    return; /* the host allows no namespaces here */
  for (int r = 0; r < 3; r++)
    ck_assert_msg(codes[r] == 0, "rank %d ended with %d", r, codes[r]);
}
END_TEST

static int dev_shm_entries(void) {
  DIR *d = opendir("/dev/shm");
  int n = 0;
  if (d == NULL)
    return 0;
  while (readdir(d) != NULL)
    n++;
  closedir(d);
  return n;
}

static int ready_pipe[2];

/* Every rank loops on large allreduces until one fails; rank 1 says when
 * it is in the loop, and the parent kills it. */
static int killed_fn(struct rank_env *e) {
  size_t count = 1 << 20;
  float *buf = calloc(count, sizeof(float));
  hvd_status st = HVD_OK;

  for (int i = 0; i < 100000 && st == HVD_OK; i++) {
    if (i == 3 && e->w->rank == 1 && write(ready_pipe[1], "x", 1) != 1)
      return failed_call(e, "write");
    st = ops_allreduce(e->ops, e->w->global, buf, buf, count, HVD_FLOAT32, HVD_SUM, 1.0, 1.0);
  }
  if (st == HVD_OK)
    return mismatch(e, "100000 allreduces went through although rank 1 was killed");
  if (strstr(hvd_last_error_message(), "rank 1") == NULL ||
      strstr(hvd_last_error_message(), "ended") == NULL)
    return mismatch(e, "the error does not say that rank 1 ended: %s", hvd_last_error_message());
  /* The communicator stays failed. */
  if (ops_allreduce(e->ops, e->w->global, buf, buf, 8, HVD_FLOAT32, HVD_SUM, 1.0, 1.0) == HVD_OK)
    return mismatch(e, "an allreduce after the failure succeeded");
  free(buf);
  return 0;
}

START_TEST(killed_rank_fails_the_others) {
  int before = dev_shm_entries();
  pid_t pids[3];
  char byte;

  ck_assert_int_eq(pipe(ready_pipe), 0);
  for (int r = 0; r < 3; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      close(ready_pipe[0]);
      alarm(120);
      _exit(child(r, 3, killed_fn));
    }
  }
  close(ready_pipe[1]);
  ck_assert_int_eq(read(ready_pipe[0], &byte, 1), 1);
  usleep(20000);
  kill(pids[1], SIGKILL);
  close(ready_pipe[0]);
  for (int r = 0; r < 3; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (r == 1)
      ck_assert_msg(WIFSIGNALED(status), "rank 1 was not killed (status 0x%x)", status);
    else
      ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                    "rank %d ended with status 0x%x", r, status);
  }
  ck_assert_int_eq(dev_shm_entries(), before);
}
END_TEST

/* A rank that stays away: the others time out with a message naming it,
 * and the late one, which comes once rank 0 says (through ready_pipe) that
 * it gave up, learns why. */
static int late_fn(struct rank_env *e) {
  struct pollfd p = {.fd = ready_pipe[0], .events = POLLIN};
  float x = 1;
  char byte;
  hvd_status st;

  if (ops_barrier(e->ops, e->w->global) != HVD_OK) /* sets the segment up */
    return failed_call(e, "ops_barrier");
  if (e->w->rank == 1 && (poll(&p, 1, 30000) != 1 || read(ready_pipe[0], &byte, 1) != 1))
    return failed_call(e, "waiting for rank 0 to give up");
  st = ops_allreduce(e->ops, e->w->global, &x, &x, 1, HVD_FLOAT32, HVD_SUM, 1.0, 1.0);
  if (e->w->rank == 0) {
    int code = 0;
    if (st != HVD_ERR_TIMEOUT || strstr(hvd_last_error_message(), "1") == NULL)
      code = mismatch(e, "rank 0 got %d (%s), not a timeout naming rank 1", (int)st,
                      hvd_last_error_message());
    if (write(ready_pipe[1], "x", 1) != 1 && code == 0)
      code = failed_call(e, "write");
    return code;
  }
  if (st == HVD_OK)
    return mismatch(e, "the late rank's allreduce succeeded after the others gave up");
  return 0;
}

START_TEST(absent_rank_times_out) {
  job.timeout_ms = 1000;
  ck_assert_int_eq(pipe(ready_pipe), 0);
  run(2, late_fn);
  close(ready_pipe[0]);
  close(ready_pipe[1]);
}
END_TEST

/* An ops context whose shared-memory allgathers, broadcasts and allreduces
 * (above 8 KiB) read the others' memory directly, where the host allows. */
static struct ops_ctx *always_reads(void) {
  struct ops_ctx *o = NULL;
  setenv("HVD_SHM", "1", 1);
  setenv("HVD_SHM_SINGLE_COPY", "always", 1);
  setenv("HVD_SHM_SINGLE_COPY_BYTES", "1", 1);
  if (ops_ctx_create(&o) != HVD_OK)
    o = NULL;
  unsetenv("HVD_SHM_SINGLE_COPY");
  unsetenv("HVD_SHM_SINGLE_COPY_BYTES");
  return o;
}

/* Allgathers (uneven, empty blocks, in place), allreduces and broadcasts
 * from every root, every dtype's size, checked against the reference. */
static int gather_and_broadcast(struct rank_env *e, struct ops_ctx *o) {
  struct net_comm *c = e->w->global;
  int n = net_comm_size(c), r = net_comm_rank(c);
  static const hvd_dtype dts[] = {HVD_UINT8, HVD_FLOAT16, HVD_INT32, HVD_FLOAT64};
  size_t sizes[8], bytes = 1 << 23;
  char *in = malloc(bytes), *out = malloc(bytes), *ref = malloc(bytes);
  int code = 0;

  for (size_t d = 0; d < HVD_ARRAY_SIZE(dts) && code == 0; d++) {
    hvd_dtype dt = dts[d];
    size_t es = hvd_dtype_size(dt);
    for (size_t k = 0; k < 4 && code == 0; k++) {
      size_t total = 0, off = 0, own = 0;
      for (int i = 0; i < n; i++) {
        sizes[i] = (size_t)(i * 3 + (int)k) % 5 * (k >= 2 ? 30011 : 7);
        own = i < r ? own + sizes[i] : own;
        total += sizes[i];
      }
      memset(out, 0xcd, total * es + 8);
      /* k == 3: in place, the block already where it goes. */
      char *src = k == 3 ? out + own * es : in;
      fill(src, sizes[r], dt, r, HVD_SUM, (int)k);
      if (ops_allgatherv(o, c, src, out, sizes, dt) != HVD_OK) {
        code = failed_call(e, "ops_allgatherv");
        break;
      }
      for (int i = 0; i < n && code == 0; i++) {
        fill(ref, sizes[i], dt, i, HVD_SUM, (int)k);
        if (memcmp(out + off * es, ref, sizes[i] * es) != 0)
          code = mismatch(e, "allgatherv %s case %zu: rank %d's block differs",
                          hvd_dtype_name(dt), k, i);
        off += sizes[i];
      }
      if (code == 0 && (unsigned char)out[total * es] != 0xcd)
        code = mismatch(e, "allgatherv wrote past the end");
    }
    /* Allreduces read the others' inputs too; even ranks reduce in place
     * and odd ranks out of place, in the same operations. */
    for (size_t count = 3001; count < 400000 && code == 0; count *= 11) {
      char *dst = r % 2 == 0 ? in : out;
      fill(in, count, dt, r, HVD_SUM, 5);
      if (ops_allreduce(o, c, in, dst, count, dt, HVD_SUM, 1.0, 1.0) != HVD_OK) {
        code = failed_call(e, "ops_allreduce");
        break;
      }
      reference(ref, count, dt, HVD_SUM, n, 5, 1.0, 1.0, ref + count * es);
      if (memcmp(dst, ref, count * es) != 0)
        code = mismatch(e, "allreduce %s count %zu differs", hvd_dtype_name(dt), count);
    }
    /* The root writes a share into the others' buffers as they read the
     * rest: shares of many lines, of a part of one, and none. */
    for (int k = 0; k < 3 * n && code == 0; k++) {
      int root = k % n;
      size_t count = k < n ? (size_t)(root + 1) * 70001 / es : k < 2 * n ? 77 : 3;
      fill(in, count, dt, r == root ? 100 : r, HVD_SUM, root);
      if (ops_broadcast(o, c, in, count, dt, root) != HVD_OK) {
        code = failed_call(e, "ops_broadcast");
        break;
      }
      fill(ref, count, dt, 100, HVD_SUM, root);
      if (memcmp(in, ref, count * es) != 0)
        code = mismatch(e, "broadcast %s from %d differs", hvd_dtype_name(dt), root);
    }
  }
  free(in);
  free(out);
  free(ref);
  return code;
}

/* Whether this host lets a rank read and write another's memory: forked
 * from one test process, the ranks have this variable at the same address
 * (written back with the value it holds). */
static int reachable_word = 42;

static bool host_allows_reads(struct rank_env *e) {
  pid_t peer = e->w->global->records[(e->w->rank + 1) % e->w->size].pid;
  int word = 0;
  struct iovec here = {&word, sizeof word}, there = {&reachable_word, sizeof word};
  return process_vm_readv(peer, &here, 1, &there, 1, 0) == (ssize_t)sizeof word &&
         word == 42 && process_vm_writev(peer, &here, 1, &there, 1, 0) == (ssize_t)sizeof word;
}

static int single_copy_fn(struct rank_env *e) {
  struct ops_ctx *o = always_reads();
  bool allowed = host_allows_reads(e); /* before the peers may end */
  int code;

  if (o == NULL)
    return failed_call(e, "ops_ctx_create");
  code = gather_and_broadcast(e, o);
  ops_ctx_destroy(o);
  if (code == 0 && e->w->global->shm == NULL)
    return mismatch(e, "the ranks do not share memory");
  /* Where the host forbids the reads (Yama, seccomp), the fallback ran. */
  if (code == 0 && e->w->global->shm->read_from != (allowed ? 1u : 0u))
    return mismatch(e, "the ranks agreed on single-copy reads from %zu bytes",
                    e->w->global->shm->read_from);
  return code;
}

START_TEST(single_copy_reads_gather_and_broadcast) { run(3, single_copy_fn); }
END_TEST

/* Rank 1's process_vm_readv (or, in the second run, process_vm_writev)
 * fails as a container's seccomp profile makes it fail: every rank copies
 * through the segment instead, with the same results. */
static int refused_call;

static int refuse_single_copy(void) {
  struct sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)refused_call, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = (unsigned short)HVD_ARRAY_SIZE(code), .filter = code};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
    return -1;
  return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

static int refused_reads_fn(struct rank_env *e) {
  struct ops_ctx *o;
  int code;

  if (e->w->rank == 1 && refuse_single_copy() != 0)
    return mismatch(e, "seccomp: %s", strerror(errno));
  if ((o = always_reads()) == NULL)
    return failed_call(e, "ops_ctx_create");
  code = gather_and_broadcast(e, o);
  ops_ctx_destroy(o);
  if (code == 0 && (e->w->global->shm == NULL || e->w->global->shm->read_from != 0))
    return mismatch(e, "single-copy transfers are on although rank 1 cannot make them");
  return code;
}

START_TEST(refused_single_copy_copies_through_the_segment) {
  refused_call = _i == 0 ? SYS_process_vm_readv : SYS_process_vm_writev;
  run(3, refused_reads_fn);
}
END_TEST

static void expect_env_error(const char *name, const char *value) {
  struct ops_ctx *o = NULL;
  setenv(name, value, 1);
  ck_assert_int_eq(ops_ctx_create(&o), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), name));
  unsetenv(name);
}

START_TEST(bad_shm_variables) {
  expect_env_error("HVD_SHM", "maybe");
  expect_env_error("HVD_SHM_BUFFER_BYTES", "1000");
  expect_env_error("HVD_SHM_BUFFER_BYTES", "2G");
  expect_env_error("HVD_SHM_SINGLE_COPY", "sometimes");
  expect_env_error("HVD_SHM_SINGLE_COPY_BYTES", "0");
  expect_env_error("HVD_SHM_SINGLE_COPY_BYTES", "-5");
}
END_TEST

static Suite *shm_suite(void) {
  Suite *s = suite_create("shm");
  TCase *tc = tcase_create("shm");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_add_test(tc, one_host_uses_shm_unless_disabled);
  tcase_add_test(tc, mixed_hosts_use_shm_locally);
  tcase_add_test(tc, refused_host_falls_back_to_tcp);
  tcase_add_test(tc, killed_rank_fails_the_others);
  tcase_add_test(tc, single_copy_reads_gather_and_broadcast);
  tcase_add_loop_test(tc, refused_single_copy_copies_through_the_segment, 0, 2);
  tcase_add_test(tc, absent_rank_times_out);
  tcase_add_test(tc, bad_shm_variables);
  suite_add_tcase(s, tc);
  return s;
}

/* ==== Adasum ======================================================================= */

enum { ADASUM_MAX_COUNT = 4096, ADASUM_MAX_TENSORS = 4 };

/* The cases: tensor counts of one buffer (one tensor: unfused). */
static const size_t adasum_cases[][ADASUM_MAX_TENSORS + 1] = {
    {1, 1000}, {1, 1}, {1, 3}, {3, 5, 1000, 37}, {4, 1, 0, 700, 2}, {2, 4096 - 9, 9},
};
static const hvd_dtype adasum_dtypes[] = {HVD_FLOAT16, HVD_BFLOAT16, HVD_FLOAT32, HVD_FLOAT64};

static double get_element(const void *buf, size_t i, hvd_dtype dt) {
  switch (dt) {
  case HVD_FLOAT16: return ops_half_to_float(((const uint16_t *)buf)[i]);
  case HVD_BFLOAT16: return ops_bf16_to_float(((const uint16_t *)buf)[i]);
  case HVD_FLOAT32: return ((const float *)buf)[i];
  default: return ((const double *)buf)[i];
  }
}

/* Rank r's input: pseudo-random values in [-2, 2), rounded to dt; kind 1
 * makes every rank's vector the same, kind 2 the ranks' vectors orthogonal
 * (rank r holds r + 1 at the elements i with i % size == r, else 0). */
static void adasum_input(void *buf, size_t count, hvd_dtype dt, int r, int size, int kind,
                         int salt) {
  unsigned seed = (kind == 1 ? 0u : (unsigned)r) * 2654435761u + (unsigned)salt * 40503u + 7u;
  for (size_t i = 0; i < count; i++) {
    double v;
    seed = seed * 1103515245u + 12345u;
    v = (double)((seed >> 8) % 4096) / 1024.0 - 2.0;
    if (kind == 2)
      v = (int)(i % (size_t)size) == r ? r + 1 : 0;
    set_element(buf, i, dt, v);
  }
}

/* a = adasum(a, b) per tensor, in double: the definition, serially. */
static void adasum_pair(double *a, const double *b, const size_t *counts, size_t n) {
  size_t off = 0;
  for (size_t t = 0; t < n; t++) {
    double dot = 0, aa = 0, bb = 0, ca, cb;
    for (size_t i = off; i < off + counts[t]; i++) {
      dot += a[i] * b[i];
      aa += a[i] * a[i];
      bb += b[i] * b[i];
    }
    ca = aa >= 1e-8 ? 1 - dot / (2 * aa) : 1;
    cb = bb >= 1e-8 ? 1 - dot / (2 * bb) : 1;
    for (size_t i = off; i < off + counts[t]; i++)
      a[i] = ca * a[i] + cb * b[i];
    off += counts[t];
  }
}

/* The reference: the leaves' vectors (leaves of them, count each) combined
 * pairwise up the tree hvd documents (fold the first 2 * rem in pairs, then
 * distance 1, 2, 4, ...); the result is left in v[0]. */
static void adasum_tree(double **v, int leaves, size_t count, const size_t *counts, size_t n) {
  int p = 1, rem;
  (void)count;
  while (p * 2 <= leaves)
    p *= 2;
  rem = leaves - p;
  for (int i = 0; i < rem; i++)
    adasum_pair(v[2 * i], v[2 * i + 1], counts, n);
  for (int i = 0; i < p; i++) /* virtual rank i */
    v[i] = v[i < rem ? 2 * i : i + rem];
  for (int d = 1; d < p; d *= 2)
    for (int i = 0; i < p; i += 2 * d)
      adasum_pair(v[i], v[i + d], counts, n);
}

static double adasum_tolerance(hvd_dtype dt) {
  switch (dt) {
  case HVD_FLOAT16: return 2e-2;
  case HVD_BFLOAT16: return 8e-2;
  case HVD_FLOAT32: return 1e-5;
  default: return 1e-11;
  }
}

/* Every rank's hash of buf, compared: the same bits everywhere. */
static int same_everywhere(struct rank_env *e, struct net_comm *c, const void *buf, size_t bytes,
                           const char *what) {
  uint64_t h = 1469598103934665603ull, hash[8];
  size_t ones[8];
  int n = net_comm_size(c);
  for (size_t i = 0; i < bytes; i++)
    h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ull;
  for (int i = 0; i < n; i++)
    ones[i] = 1;
  if (ops_allgatherv(e->ops, c, &h, hash, ones, HVD_INT64) != HVD_OK)
    return failed_call(e, "ops_allgatherv");
  for (int i = 0; i < n; i++)
    if (hash[i] != h)
      return mismatch(e, "%s: rank %d's result differs from this rank's", what, i);
  return 0;
}

/* One case on every rank: Adasum (hierarchical when l is given), checked
 * against the reference and across ranks. hosts: ranks per host of the
 * hierarchical reference (0: flat). */
static int adasum_case(struct rank_env *e, struct ops_ctx *ctx, const struct ops_layout *l,
                       hvd_dtype dt, const size_t *counts, size_t nt, int kind, int salt,
                       int per_host) {
  struct net_comm *c = e->w->global;
  int n = net_comm_size(c), r = net_comm_rank(c), leaves = per_host > 0 ? n / per_host : n;
  size_t count = 0, es = hvd_dtype_size(dt);
  char in[ADASUM_MAX_COUNT * 8], out[ADASUM_MAX_COUNT * 8], what[160];
  static double ref[8][ADASUM_MAX_COUNT];
  double *v[8], tol = adasum_tolerance(dt), worst = 0, scale = 0;
  hvd_status st;
  int code;

  for (size_t t = 0; t < nt; t++)
    count += counts[t];
  snprintf(what, sizeof(what), "adasum %s, %zu tensors, %zu elements, kind %d%s over %d, %s",
           hvd_dtype_name(dt), nt, count, kind, per_host > 0 ? ", hierarchical" : "", n,
           ctx == e->ops ? "default schedule" : "halving");
  adasum_input(in, count, dt, r, n, kind, salt);
  st = l != NULL ? ops_adasum_hierarchical(ctx, l, in, out, count, dt, counts, nt, 1.0, 1.0)
                 : ops_adasum(ctx, c, in, out, count, dt, counts, nt, 1.0, 1.0);
  if (st != HVD_OK)
    return failed_call(e, what);
  if ((code = same_everywhere(e, c, out, count * es, what)) != 0)
    return code;
  /* The leaves: each rank's input, or each host's average. */
  for (int k = 0; k < leaves; k++) {
    int members = per_host > 0 ? per_host : 1;
    memset(ref[k], 0, count * sizeof(double));
    for (int m = 0; m < members; m++) {
      adasum_input(in, count, dt, k * members + m, n, kind, salt);
      for (size_t i = 0; i < count; i++)
        ref[k][i] += get_element(in, i, dt) / members;
    }
    v[k] = ref[k];
  }
  adasum_tree(v, leaves, count, counts, nt);
  for (size_t i = 0; i < count; i++)
    scale = fabs(v[0][i]) > scale ? fabs(v[0][i]) : scale;
  for (size_t i = 0; i < count; i++) {
    double got = get_element(out, i, dt), diff = fabs(got - v[0][i]);
    worst = diff > worst ? diff : worst;
    if (kind != 0 && dt != HVD_FLOAT16 && dt != HVD_BFLOAT16 && got != v[0][i])
      return mismatch(e, "%s: element %zu is %.17g, exactly %.17g expected", what, i, got,
                      v[0][i]);
  }
  if (worst > tol * (scale + 1e-30))
    return mismatch(e, "%s: off the reference by %g (largest element %g, tolerance %g)", what,
                    worst, scale, tol * scale);
  return 0;
}

/* Every case in both schedules: the default (small buffers swap whole
 * vectors) and halving for every size; kinds 0 to kinds - 1 of input. */
static int adasum_all(struct rank_env *e, const struct ops_layout *l, int per_host, int kinds) {
  struct ops_ctx *ctxs[] = {e->ops, e->halving};
  int code;
  for (size_t x = 0; x < HVD_ARRAY_SIZE(ctxs); x++)
    for (size_t d = 0; d < HVD_ARRAY_SIZE(adasum_dtypes); d++)
      for (size_t k = 0; k < HVD_ARRAY_SIZE(adasum_cases); k++)
        for (int kind = 0; kind < kinds; kind++)
          if ((code = adasum_case(e, ctxs[x], l, adasum_dtypes[d], adasum_cases[k] + 1,
                                  adasum_cases[k][0], kind, (int)k, per_host)) != 0)
            return code;
  return 0;
}

static int adasum_fn(struct rank_env *e) { return adasum_all(e, NULL, 0, 3); }

/* np = 1 to 5 (3 and 5 fold in pairs), every dtype, fused and unfused;
 * identical inputs give the input back and orthogonal ones their sum,
 * exactly (float32, float64). */
START_TEST(adasum_matches_reference) {
  for (int n = 1; n <= 5; n++)
    run(n, adasum_fn);
}
END_TEST

static int adasum_hier_fn(struct rank_env *e) {
  struct ops_layout l = {e->w->global, e->w->local, e->w->cross};
  return adasum_all(e, &l, e->w->local_size, 1);
}

/* Two fake hosts: the hosts' averages combined by Adasum. */
START_TEST(adasum_hierarchical_two_hosts) {
  static const char *layouts[][6] = {
      {"hostA", "hostA", "hostB", "hostB"},
      {"hostA", "hostA", "hostA", "hostB", "hostB", "hostB"},
  };
  static const int sizes[] = {4, 6};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(sizes); i++) {
    memcpy(job.hosts, layouts[i], sizeof(layouts[i]));
    run(sizes[i], adasum_hier_fn);
  }
}
END_TEST

static int adasum_errors_fn(struct rank_env *e) {
  struct net_comm *c = e->w->global;
  float buf[8] = {0};
  int32_t ints[8] = {0};
  size_t two[2] = {3, 4}, eight = 8;
  if (ops_adasum(e->ops, c, ints, ints, 8, HVD_INT32, &eight, 1, 1.0, 1.0) !=
          HVD_ERR_INVALID_ARGUMENT ||
      strstr(hvd_last_error_message(), "int32") == NULL)
    return mismatch(e, "adasum of int32: %s", hvd_last_error_message());
  if (ops_adasum(e->ops, c, buf, buf, 8, HVD_FLOAT32, two, 2, 1.0, 1.0) !=
      HVD_ERR_INVALID_ARGUMENT)
    return mismatch(e, "tensor counts that do not add up were accepted");
  if (ops_allreduce(e->ops, c, ints, ints, 8, HVD_BOOL, HVD_ADASUM, 1.0, 1.0) !=
      HVD_ERR_INVALID_ARGUMENT)
    return mismatch(e, "adasum of bool was accepted");
  return 0;
}

START_TEST(adasum_rejects_bad_input) { run(2, adasum_errors_fn); }
END_TEST

static Suite *adasum_suite(void) {
  Suite *s = suite_create("adasum");
  TCase *tc = tcase_create("adasum");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_add_test(tc, adasum_matches_reference);
  tcase_add_test(tc, adasum_hierarchical_two_hosts);
  tcase_add_test(tc, adasum_rejects_bad_input);
  suite_add_tcase(s, tc);
  return s;
}

/* ==== suites =================================================================================== */

static Suite *collectives_suite(void) {
  Suite *s = suite_create("collectives");
  TCase *tc = tcase_create("collectives");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_add_test(tc, allreduce_1_to_5_ranks);
  tcase_add_test(tc, allreduce_bitwise_identical);
  tcase_add_test(tc, other_collectives_1_to_5_ranks);
  tcase_add_test(tc, hierarchical_two_hosts);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(kernels_suite());
  int failed;

  signal(SIGPIPE, SIG_IGN);
  srunner_add_suite(sr, collectives_suite());
  srunner_add_suite(sr, adasum_suite());
  srunner_add_suite(sr, shm_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
