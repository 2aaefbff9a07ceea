/*
 * NCCL communicators: made on first use, their unique ids exchanged
 * through the rendezvous store, and waits that cannot hang.
 *
 * DESIGN. Rank 0 of a group makes the unique id and publishes it under
 * key <name> of scope "nccl" (g<round>.nccl in later generations, so an
 * elastic round never reads an old id); the others long-poll for it.
 * Communicators are non-blocking (ncclConfig_t.blocking = 0): init and
 * collectives return at once and cuda_wait polls them together with the
 * stream against the deadline (HOROVOD_GLOO_TIMEOUT_SECONDS without
 * completion). A failure or timeout aborts every communicator with
 * ncclCommAbort, which is what frees a peer stuck in a collective with a
 * rank that died, and the job then stops (or resets, when elastic).
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu.h"

/* How long cuda_wait spins before it sleeps between polls: a collective of
 * small tensors completes within it, so that path has no sleep latency. */
enum { SPIN_NS = 2000000, POLL_SLEEP_NS = 20000 };

static void abort_all(struct coord_gpu *g) {
  for (struct gpu_comm *c = g->comms; c != NULL; c = c->next) {
    if (c->nccl != NULL)
      ncclCommAbort(c->nccl);
    c->nccl = NULL;
  }
  g->failed = true;
}

void cuda_comms_close(struct coord_gpu *g, bool abort) {
  struct gpu_comm *c = g->comms, *next;
  for (; c != NULL; c = next) {
    next = c->next;
    if (c->nccl != NULL) {
      if (abort)
        ncclCommAbort(c->nccl);
      else
        ncclCommDestroy(c->nccl);
    }
    free(c);
  }
  g->comms = NULL;
}

static hvd_status settle(struct coord_gpu *g, struct gpu_comm *c, const char *what,
                         int64_t started, int64_t deadline);

/* A call that returned ncclInProgress is settled before anything else
 * goes on the stream, as NCCL asks of non-blocking communicators. */
hvd_status cuda_nccl_check(struct coord_gpu *g, ncclResult_t r, const char *call) {
  if (r == ncclSuccess)
    return HVD_OK;
  if (r == ncclInProgress) {
    int64_t now = hvd_now_ns();
    for (struct gpu_comm *c = g->comms; c != NULL; c = c->next) {
      hvd_status st = c->nccl != NULL ? settle(g, c, call, now, now + g->timeout_ns) : HVD_OK;
      if (st != HVD_OK)
        return st;
    }
    return HVD_OK;
  }
  cuda_nccl_error(r, call);
  abort_all(g);
  return hvd_error_status();
}

static void pause_poll(int64_t started) {
  if (hvd_now_ns() - started < SPIN_NS) {
    sched_yield();
  } else {
    struct timespec ts = {0, POLL_SLEEP_NS};
    nanosleep(&ts, NULL);
  }
}

/* c's asynchronous state: ncclSuccess, ncclInProgress, or a failure that
 * aborted every communicator (*st says so). */
static ncclResult_t async_state(struct coord_gpu *g, struct gpu_comm *c, const char *what,
                                hvd_status *st) {
  ncclResult_t async = ncclSuccess, r = ncclCommGetAsyncError(c->nccl, &async);
  if (r != ncclSuccess)
    async = r;
  if (async != ncclSuccess && async != ncclInProgress) {
    cuda_nccl_error(async, "NCCL");
    abort_all(g);
    *st = hvd_error_prefix("%s on communicator %s", what, c->name);
  }
  return async;
}

/* The deadline passed: every communicator is aborted. */
static hvd_status timed_out(struct coord_gpu *g, const char *what, const char *where) {
  abort_all(g);
  return hvd_error(HVD_ERR_TIMEOUT,
                   "%s on %s did not complete within %lld s (HOROVOD_GLOO_TIMEOUT_SECONDS); "
                   "a peer may have failed",
                   what, where, (long long)(g->timeout_ns / 1000000000));
}

/* Polls c's asynchronous state until it is no longer in progress. */
static hvd_status settle(struct coord_gpu *g, struct gpu_comm *c, const char *what,
                         int64_t started, int64_t deadline) {
  for (;;) {
    hvd_status st = HVD_OK;
    ncclResult_t async = async_state(g, c, what, &st);
    if (async != ncclInProgress)
      return st;
    if (hvd_now_ns() >= deadline)
      return timed_out(g, what, c->name);
    pause_poll(started);
  }
}

hvd_status cuda_wait(struct coord_gpu *g, struct gpu_comm *c, const char *what) {
  int64_t started = hvd_now_ns(), deadline = started + g->timeout_ns;
  bool nccl = c != NULL && c->nccl != NULL;
  hvd_status st = HVD_OK;

  if (nccl && (st = settle(g, c, what, started, deadline)) != HVD_OK)
    return st;
  for (;;) {
    cudaError_t err = cudaStreamQuery(g->stream);
    if (err == cudaSuccess)
      return HVD_OK;
    if (err != cudaErrorNotReady) {
      cuda_cuda_error(err, "cudaStreamQuery");
      abort_all(g);
      return hvd_error_prefix("%s on GPU %d", what, g->device);
    }
    if (nccl && (async_state(g, c, what, &st), st != HVD_OK))
      return st;
    if (hvd_now_ns() >= deadline)
      return timed_out(g, what, nccl ? c->name : "the GPU");
    pause_poll(started);
  }
}

/* The group's unique id: made by its rank 0, read from the store by the others. */
static hvd_status exchange_id(struct coord_gpu *g, const char *name, int rank, int size,
                              ncclUniqueId *id) {
  struct coord_state *s = g->s;
  char scope[64];
  struct hvd_buf value;
  hvd_status st;

  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess)
      return cuda_nccl_error(r, "ncclGetUniqueId");
  }
  if (size == 1)
    return HVD_OK;
  if (coord_gpu_store(s) == NULL)
    return hvd_error(HVD_ERR_INTERNAL, "NCCL communicator %s has %d ranks but no store", name,
                     size);
  coord_gpu_id_scope(s, scope, sizeof(scope));
  if (rank == 0) {
    st = rdzv_client_set(coord_gpu_store(s), scope, name, id, sizeof(*id));
    return st == HVD_OK ? HVD_OK : hvd_error_prefix("publishing NCCL id %s/%s", scope, name);
  }
  hvd_buf_init(&value, 4096);
  st = rdzv_client_wait(coord_gpu_store(s), scope, name, -1, &value);
  if (st == HVD_OK && value.len != sizeof(*id))
    st = hvd_error(HVD_ERR_PROTOCOL, "NCCL id %s/%s has %zu bytes, not %zu", scope, name,
                   value.len, sizeof(*id));
  if (st == HVD_OK)
    memcpy(id, value.data, sizeof(*id));
  else
    hvd_error_prefix("waiting for NCCL id %s/%s from the group's rank 0", scope, name);
  hvd_buf_fini(&value);
  return st;
}

hvd_status cuda_comm_get(struct coord_gpu *g, const char *name, int rank, int size,
                        struct gpu_comm **out) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclUniqueId id;
  struct gpu_comm *c;
  ncclResult_t r;
  hvd_status st;

  for (c = g->comms; c != NULL; c = c->next) {
    if (strcmp(c->name, name) == 0) {
      *out = c;
      return HVD_OK;
    }
  }
  if ((st = cuda_use_device(g)) != HVD_OK)
    return st;
  if ((c = calloc(1, sizeof(*c))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate an NCCL communicator");
  snprintf(c->name, sizeof(c->name), "%s", name);
  c->rank = rank;
  c->size = size;
  memset(&id, 0, sizeof(id));
  if ((st = exchange_id(g, name, rank, size, &id)) != HVD_OK) {
    free(c);
    return st;
  }
  config.blocking = 0;
  r = ncclCommInitRankConfig(&c->nccl, size, id, rank, &config);
  c->next = g->comms; /* listed first, so that a failure aborts it too */
  g->comms = c;
  if ((st = cuda_nccl_check(g, r, "ncclCommInitRankConfig")) != HVD_OK)
    return hvd_error_prefix("NCCL communicator %s (rank %d of %d) on GPU %d", name, rank, size,
                            g->device);
  HVD_LOG_DEBUG("NCCL communicator %s: rank %d of %d on GPU %d", name, rank, size, g->device);
  *out = c;
  return HVD_OK;
}

hvd_status cuda_comm_for_set(struct coord_gpu *g, const struct coord_set *set,
                            struct gpu_comm **out) {
  char name[32];
  if (coord_set_id(set) == HVD_PROCESS_SET_GLOBAL)
    return cuda_comm_get(g, "global", coord_set_rank(set), coord_set_size(set), out);
  snprintf(name, sizeof(name), "set%u", (unsigned)coord_set_comm_id(set));
  return cuda_comm_get(g, name, coord_set_rank(set), coord_set_size(set), out);
}
