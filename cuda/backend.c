/*
 * The CUDA backend's entry points: devices, the stream, memory, copies.
 */
#include <stdlib.h>

#include "gpu.h"

hvd_status cuda_cuda_error(cudaError_t err, const char *call) {
  cudaGetLastError(); /* clears a sticky-free error so later calls do not repeat it */
  return hvd_error(err == cudaErrorMemoryAllocation ? HVD_ERR_NO_MEMORY : HVD_ERR_IO,
                   "%s failed: %s (%s)", call, cudaGetErrorString(err), cudaGetErrorName(err));
}

hvd_status cuda_nccl_error(ncclResult_t r, const char *call) {
  hvd_status st = HVD_ERR_IO;
  switch (r) {
  case ncclRemoteError:
  case ncclSystemError: st = HVD_ERR_NETWORK; break;
  case ncclInvalidArgument:
  case ncclInvalidUsage: st = HVD_ERR_INVALID_ARGUMENT; break;
  case ncclInternalError: st = HVD_ERR_INTERNAL; break;
  default: break;
  }
  return hvd_error(st, "%s failed: %s (NCCL error %d)%s", call, ncclGetErrorString(r), (int)r,
                   r == ncclInvalidUsage
                       ? "; ranks sharing one GPU need HVD_GPU_COLLECTIVES=host"
                       : "");
}

hvd_status cuda_use_device(struct coord_gpu *g) {
  cudaError_t err = cudaSetDevice(g->device);
  if (err != cudaSuccess)
    return cuda_cuda_error(err, "cudaSetDevice");
  if (g->failed)
    return hvd_error(HVD_ERR_ABORTED,
                     "GPU %d: an NCCL communicator was aborted after a failure; "
                     "GPU operations fail until hvd is initialized again",
                     g->device);
  return HVD_OK;
}

static hvd_status grow(void **buf, size_t *cap, size_t bytes, bool host) {
  cudaError_t err;
  void *p = NULL;
  size_t want;
  if (bytes <= *cap)
    return HVD_OK;
  want = bytes < (1u << 20) ? (1u << 20) : bytes;
  err = host ? cudaMallocHost(&p, want) : cudaMalloc(&p, want);
  if (err != cudaSuccess) {
    cuda_cuda_error(err, host ? "cudaMallocHost" : "cudaMalloc");
    return hvd_error_prefix("a fusion buffer of %zu bytes", want);
  }
  if (*buf != NULL)
    host ? cudaFreeHost(*buf) : cudaFree(*buf);
  *buf = p;
  *cap = want;
  return HVD_OK;
}

hvd_status cuda_fusion_buffer(struct coord_gpu *g, size_t bytes, void **out) {
  hvd_status st = grow(&g->fusion, &g->fusion_cap, bytes, false);
  if (st == HVD_OK)
    *out = g->fusion;
  return st;
}

hvd_status cuda_host_buffer(struct coord_gpu *g, size_t bytes, void **out) {
  hvd_status st = grow(&g->host, &g->host_cap, bytes, true);
  if (st == HVD_OK)
    *out = g->host;
  return st;
}

/* Pinned staging stops here: beyond it, host staging pages in malloc'd
 * memory rather than keep that much host memory locked for the process's
 * life. */
#define CUDA_PINNED_STAGING_MAX ((size_t)1 << 30)

/* The hierarchical allreduce's buffer serves: both run on the loop's
 * thread, and a response is staged only when execute declined it. */
static void staging_buffer(struct coord_gpu *g, size_t bytes, void **out) {
  *out = NULL;
  if (bytes > CUDA_PINNED_STAGING_MAX || cuda_use_device(g) != HVD_OK ||
      cuda_host_buffer(g, bytes, out) != HVD_OK) {
    *out = NULL;
    hvd_error_clear(); /* malloc'd staging still works */
  }
}

/* ==== the backend's functions ========================================================= */

static hvd_status device_count(int *n) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return hvd_error(HVD_ERR_NOT_FOUND, "no usable GPU: cudaGetDeviceCount failed: %s (%s)",
                     cudaGetErrorString(err), cudaGetErrorName(err));
  }
  if (count == 0)
    return hvd_error(HVD_ERR_NOT_FOUND, "no GPU is visible to this process");
  *n = count;
  return HVD_OK;
}

static void close_gpu(struct coord_gpu *g, bool abort) {
  int previous = -1;
  if (g == NULL)
    return;
  /* The caller's thread (hvd_shutdown's) keeps its own current device. */
  if (cudaGetDevice(&previous) != cudaSuccess)
    previous = -1;
  cudaSetDevice(g->device);
  cuda_comms_close(g, abort || g->failed);
  if (g->stream != NULL) {
    if (!abort && !g->failed)
      cudaStreamSynchronize(g->stream);
    cudaStreamDestroy(g->stream);
  }
  cudaFree(g->fusion);
  cudaFreeHost(g->host);
  free(g);
  if (previous >= 0)
    cudaSetDevice(previous);
}

static hvd_status open_gpu(struct coord_state *s, int device, struct coord_gpu **out) {
  struct coord_gpu *g = calloc(1, sizeof(*g));
  cudaError_t err;
  if (g == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the GPU state");
  g->s = s;
  g->device = device;
  g->timeout_ns = coord_gpu_timeout_ns(s);
  if ((err = cudaSetDevice(device)) != cudaSuccess)
    cuda_cuda_error(err, "cudaSetDevice");
  else if ((err = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess)
    cuda_cuda_error(err, "cudaStreamCreateWithFlags");
  if (err != cudaSuccess) {
    close_gpu(g, true);
    return hvd_error_prefix("GPU %d", device);
  }
  *out = g;
  return HVD_OK;
}

static hvd_status wait_event(struct coord_gpu *g, void *event) {
  hvd_status st = cuda_use_device(g);
  cudaError_t err;
  if (st != HVD_OK)
    return st;
  err = cudaStreamWaitEvent(g->stream, (cudaEvent_t)event, 0);
  return err == cudaSuccess ? HVD_OK : cuda_cuda_error(err, "cudaStreamWaitEvent (ready event)");
}

hvd_status cuda_copy_async(struct coord_gpu *g, void *dst, const void *src, size_t bytes,
                          enum cudaMemcpyKind kind) {
  cudaError_t err;
  if (bytes == 0)
    return HVD_OK;
  err = cudaMemcpyAsync(dst, src, bytes, kind, g->stream);
  return err == cudaSuccess ? HVD_OK : cuda_cuda_error(err, "cudaMemcpyAsync");
}

static hvd_status copy(struct coord_gpu *g, void *dst, const void *src, size_t bytes,
                       enum cudaMemcpyKind kind) {
  hvd_status st = cuda_use_device(g);
  if (st == HVD_OK)
    st = cuda_copy_async(g, dst, src, bytes, kind);
  if (st != HVD_OK)
    return st;
  return cuda_wait(g, NULL, kind == cudaMemcpyDeviceToHost ? "a copy to the host"
                                                          : "a copy to the GPU");
}

static hvd_status to_host(struct coord_gpu *g, void *dst, const void *src, size_t bytes) {
  return copy(g, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static hvd_status to_device(struct coord_gpu *g, void *dst, const void *src, size_t bytes) {
  return copy(g, dst, src, bytes, cudaMemcpyHostToDevice);
}

static hvd_status alloc(struct coord_gpu *g, size_t bytes, void **out) {
  hvd_status st = cuda_use_device(g);
  cudaError_t err;
  if (st != HVD_OK)
    return st;
  err = cudaMalloc(out, bytes > 0 ? bytes : 1);
  if (err != cudaSuccess) {
    *out = NULL;
    cuda_cuda_error(err, "cudaMalloc");
    return hvd_error_prefix("an output of %zu bytes on GPU %d", bytes, g->device);
  }
  return HVD_OK;
}

/* Any thread (hvd_handle_release): the pointer's own device is made
 * current for the free, then the thread's own is restored. */
static void release(void *p) {
  struct cudaPointerAttributes attr;
  int previous = -1;
  if (p == NULL)
    return;
  if (cudaGetDevice(&previous) != cudaSuccess)
    previous = -1;
  if (cudaPointerGetAttributes(&attr, p) == cudaSuccess && attr.device >= 0)
    cudaSetDevice(attr.device);
  cudaFree(p);
  if (previous >= 0)
    cudaSetDevice(previous);
}

static const struct coord_gpu_backend cuda_backend = {
    .name = "cuda",
    .nccl_version = NCCL_VERSION_CODE,
    .device_count = device_count,
    .open = open_gpu,
    .close = close_gpu,
    .execute = cuda_execute,
    .wait_event = wait_event,
    .to_host = to_host,
    .to_device = to_device,
    .staging_buffer = staging_buffer,
    .alloc = alloc,
    .free = release,
};

const struct coord_gpu_backend *coord_gpu_builtin(void) { return &cuda_backend; }
