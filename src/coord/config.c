/*
 * The coordinator's tunables, read once by hvd_init from the settings
 * table (src/common/settings.def: names, ranges, defaults), and the
 * settings every rank takes from rank 0 in the start-up handshake.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

/* settings.def's limits for these are the coordinator's own. */
_Static_assert(COORD_INLINE_MAX == 64, "settings.def: HVD_INLINE_BYTES's limit");
_Static_assert(sizeof(((struct coord_config *)0)->timeline) == 1024,
               "settings.def: HOROVOD_TIMELINE's limit");

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
  const char *timeline = NULL, *affinity = NULL;
  bool disable = false;
  hvd_status st;

  memset(&c, 0, sizeof(c));
  st = hvd_setting_int(HVD_SET_FUSION_THRESHOLD, &fusion);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_FUSION_INPLACE_BYTES, &inplace);
  if (st == HVD_OK)
    st = hvd_setting_number(HVD_SET_CYCLE_TIME, &cycle_ms);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_CACHE_CAPACITY, &cache);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_INLINE_BYTES, &inline_bytes);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_STALL_CHECK_DISABLE, &disable);
  if (st == HVD_OK)
    st = hvd_setting_number(HVD_SET_STALL_CHECK_TIME, &warn_s);
  if (st == HVD_OK)
    st = hvd_setting_number(HVD_SET_STALL_SHUTDOWN_TIME, &shutdown_s);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_HIERARCHICAL_ALLREDUCE, &c.hierarchical_allreduce);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_HIERARCHICAL_ALLGATHER, &c.hierarchical_allgather);
  if (st == HVD_OK)
    st = coord_gpu_mode_from_env(&c.gpu_host_staged);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_TIMELINE_MARK_CYCLES, &c.timeline_mark_cycles);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_TIMELINE_MAX_BYTES, &c.timeline_max_bytes);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_SPIN_US, &spin_us);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_SHM_LANES, &c.lanes);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_TIMEOUT, &timeout_s);
  if (st == HVD_OK)
    st = hvd_setting_bool(HVD_SET_METRICS, &c.metrics);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_METRICS_PUSH_MS, &c.metrics_push_ms);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_TIMELINE, &timeline);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_THREAD_AFFINITY, &affinity);
  if (st == HVD_OK)
    st = parse_affinity(affinity, local_rank, local_size, &c.affinity_core);
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
  if (timeline != NULL) /* the table's limit: it fits */
    snprintf(c.timeline, sizeof(c.timeline), "%s", timeline);
  c.spin_ns = spin_us * 1000;
  c.timeout_ns = timeout_s * 1000000000LL;
  *out = c;
  return HVD_OK;
}

size_t coord_handshake_settings(enum hvd_setting *ids, size_t max) {
  size_t n = 0;
  for (int id = 1; id < HVD_SETTING_COUNT && n < max; id++) {
    enum hvd_setting_scope scope = hvd_setting_info((enum hvd_setting)id)->scope;
    if (scope == HVD_SCOPE_AGREE || scope == HVD_SCOPE_SAME)
      ids[n++] = (enum hvd_setting)id;
  }
  return n;
}

void coord_config_adopt(struct coord_config *c, enum hvd_setting id, uint64_t v) {
  switch (id) {
  case HVD_SET_CACHE_CAPACITY:
    c->cache_capacity = (size_t)v;
    break;
  case HVD_SET_FUSION_INPLACE_BYTES:
    c->fusion_inplace_bytes = (size_t)v;
    break;
  case HVD_SET_INLINE_BYTES:
    c->inline_bytes = v <= COORD_INLINE_MAX ? (size_t)v : 0;
    break;
  case HVD_SET_HIERARCHICAL_ALLREDUCE:
    c->hierarchical_allreduce = v != 0;
    break;
  case HVD_SET_HIERARCHICAL_ALLGATHER:
    c->hierarchical_allgather = v != 0;
    break;
  case HVD_SET_GPU_COLLECTIVES:
    c->gpu_host_staged = v == COORD_GPU_HOST;
    break;
  default: /* a SAME setting: never adopted, a difference fails the handshake */
    break;
  }
}
