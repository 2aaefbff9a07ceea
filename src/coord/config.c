/*
 * The coordinator's tunables, read once by hvd_init. Horovod's variables
 * keep Horovod's names and defaults; hvd's own start with HVD_.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

/* HOROVOD_THREAD_AFFINITY: one core id per local rank, comma-separated. */
static hvd_status parse_affinity(const char *text, int local_rank, int local_size, int *core) {
  const char *p = text;
  int i = 0;

  *core = -1;
  if (text == NULL)
    return HVD_OK;
  while (*p != '\0') {
    const char *comma = strchr(p, ',');
    size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
    int64_t v;
    if (!hvd_parse_int64(p, len, &v) || v < 0 || v > 65535)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "HOROVOD_THREAD_AFFINITY='%s': '%.*s' is not a core number (expected "
                       "%d comma-separated core ids, one per local rank)",
                       text, (int)len, p, local_size);
    if (i == local_rank)
      *core = (int)v;
    i++;
    p += len;
    if (*p == ',')
      p++;
  }
  if (i != local_size)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_THREAD_AFFINITY='%s' has %d entries; this host runs %d ranks, "
                     "one core id each",
                     text, i, local_size);
  return HVD_OK;
}

hvd_status coord_config_from_env(int local_rank, int local_size, struct coord_config *out) {
  struct coord_config c;
  int64_t fusion, inplace, cache, inline_bytes, spin_us, timeout_s;
  double cycle_ms, warn_s, shutdown_s;
  bool disable = false;
  hvd_status st;

  memset(&c, 0, sizeof(c));
  st = hvd_env_int("HOROVOD_FUSION_THRESHOLD", 128 << 20, 0, (int64_t)1 << 40, &fusion);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_FUSION_INPLACE_BYTES", 1 << 20, 0, (int64_t)1 << 40, &inplace);
  if (st == HVD_OK)
    st = hvd_env_double("HOROVOD_CYCLE_TIME", 1.0, 0.0, 60000.0, &cycle_ms);
  if (st == HVD_OK)
    st = hvd_env_int("HOROVOD_CACHE_CAPACITY", 1024, 0, 1 << 20, &cache);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_INLINE_BYTES", COORD_INLINE_MAX, 0, COORD_INLINE_MAX, &inline_bytes);
  if (st == HVD_OK)
    st = hvd_env_bool("HOROVOD_STALL_CHECK_DISABLE", false, &disable);
  if (st == HVD_OK)
    st = hvd_env_double("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0, 0.001, 1e7, &warn_s);
  if (st == HVD_OK)
    st = hvd_env_double("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0.0, 0.0, 1e7, &shutdown_s);
  if (st == HVD_OK)
    st = hvd_env_bool("HOROVOD_HIERARCHICAL_ALLREDUCE", false, &c.hierarchical_allreduce);
  if (st == HVD_OK)
    st = hvd_env_bool("HOROVOD_HIERARCHICAL_ALLGATHER", false, &c.hierarchical_allgather);
  if (st == HVD_OK)
    st = coord_gpu_mode_from_env(&c.gpu_host_staged);
  if (st == HVD_OK)
    st = hvd_env_bool("HOROVOD_TIMELINE_MARK_CYCLES", false, &c.timeline_mark_cycles);
  if (st == HVD_OK)
    st = hvd_env_int("HVD_SPIN_US", 50, 0, 1000000, &spin_us);
  if (st == HVD_OK)
    st = hvd_env_bool("HVD_SHM_LANES", true, &c.lanes);
  if (st == HVD_OK)
    st = hvd_env_int("HOROVOD_GLOO_TIMEOUT_SECONDS", 30, 1, 7 * 24 * 3600, &timeout_s);
  if (st == HVD_OK)
    st = parse_affinity(hvd_env_str("HOROVOD_THREAD_AFFINITY"), local_rank, local_size,
                        &c.affinity_core);
  if (st != HVD_OK)
    return st;
  c.fusion_threshold = (size_t)fusion;
  c.fusion_inplace_bytes = (size_t)inplace;
  c.cycle_ns = (int64_t)(cycle_ms * 1e6);
  c.cache_capacity = (size_t)cache;
  c.inline_bytes = (size_t)inline_bytes;
  c.stall_check = !disable;
  c.stall_warn_ns = (int64_t)(warn_s * 1e9);
  c.stall_shutdown_ns = (int64_t)(shutdown_s * 1e9);
  if (c.stall_shutdown_ns > 0 && c.stall_shutdown_ns < c.stall_warn_ns) {
    HVD_LOG_WARN("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (%g) is below "
                 "HOROVOD_STALL_CHECK_TIME_SECONDS (%g): stalls will not shut the job down",
                 shutdown_s, warn_s);
    c.stall_shutdown_ns = 0;
  }
  if (hvd_env_str("HOROVOD_TIMELINE") != NULL) {
    if (strlen(hvd_env_str("HOROVOD_TIMELINE")) >= sizeof(c.timeline))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "HOROVOD_TIMELINE is longer than %zu bytes",
                       sizeof(c.timeline) - 1);
    snprintf(c.timeline, sizeof(c.timeline), "%s", hvd_env_str("HOROVOD_TIMELINE"));
  }
  c.spin_ns = spin_us * 1000;
  c.timeout_ns = timeout_s * 1000000000LL;
  *out = c;
  return HVD_OK;
}
