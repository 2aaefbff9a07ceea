/*
 * The autotuner's place in the loop (HOROVOD_AUTOTUNE). Rank 0 owns the
 * tuner (tuner.c): it counts the bytes of every response list it runs and
 * ships each new setting inside the next response list, which every rank
 * applies before that list's responses run. So all ranks switch between
 * the same two operations, whatever their timing, and collectives that
 * depend on a knob (hierarchical or flat, ring or halving-doubling, the
 * ring's segments) always match.
 *
 * Knobs the user set explicitly stay as set (Horovod's rule), and so do
 * those that cannot matter: hierarchical collectives on one host, on one
 * rank per host or on hosts of unequal rank counts; the cache when it is
 * off. The fusion threshold and the cycle time act on rank 0 (which fuses
 * and batches); the rest on every rank. The response cache is paused on
 * rank 0 by retiring every entry, as eviction does, so workers stop
 * sending its bits through the usual acknowledgements.
 */
#include <string.h>

#include "coord.h"

static bool set_by_user(enum hvd_setting id) { return hvd_setting_given(id) != NULL; }

static unsigned tunable_knobs(const struct coord_state *s) {
  unsigned m = 0;
  bool hosts = s->homogeneous && s->world->local_size > 1 && s->world->local_size < s->size;
  if (!set_by_user(HVD_SET_FUSION_THRESHOLD))
    m |= TUNE_BIT(TUNE_FUSION);
  if (!set_by_user(HVD_SET_CYCLE_TIME))
    m |= TUNE_BIT(TUNE_CYCLE);
  if (s->cfg.cache_capacity > 0 && !set_by_user(HVD_SET_CACHE_CAPACITY))
    m |= TUNE_BIT(TUNE_CACHE);
  if (hosts && !set_by_user(HVD_SET_HIERARCHICAL_ALLREDUCE))
    m |= TUNE_BIT(TUNE_HIER_ALLREDUCE);
  if (hosts && !set_by_user(HVD_SET_HIERARCHICAL_ALLGATHER))
    m |= TUNE_BIT(TUNE_HIER_ALLGATHER);
  if (!set_by_user(HVD_SET_ALLREDUCE_RING_BYTES) && !set_by_user(HVD_SET_ALLREDUCE_ALGORITHM))
    m |= TUNE_BIT(TUNE_RING_BYTES);
  if (!set_by_user(HVD_SET_RING_SEGMENT_BYTES))
    m |= TUNE_BIT(TUNE_SEGMENT_BYTES);
  return m;
}

hvd_status coord_autotune_init(struct coord_state *s) {
  struct tune_config cfg;
  struct tune_setting initial, first;
  const struct ops_tunables *t = ops_ctx_tunables(s->ops);
  hvd_status st = tune_config_from_env(&cfg);

  if (st != HVD_OK || !cfg.enabled || s->rank != 0)
    return st;
  /* A later round (an elastic reset, hvd_init again) tunes again: its
   * ranks may have changed. Its log goes on, whichever process is rank 0
   * now, instead of starting over. */
  cfg.log_append = s->round.round > 0;
  memset(&initial, 0, sizeof(initial));
  initial.fusion_threshold = s->cfg.fusion_threshold;
  initial.cycle_ns = s->cfg.cycle_ns;
  initial.cache_enabled = s->cfg.cache_capacity > 0;
  initial.hierarchical_allreduce = s->cfg.hierarchical_allreduce;
  initial.hierarchical_allgather = s->cfg.hierarchical_allgather;
  initial.allreduce_ring_bytes = t->allreduce_ring_bytes;
  initial.segment_bytes = t->segment_bytes;
  if ((st = tune_tuner_create(&cfg, &initial, tunable_knobs(s), &s->tuner, &first)) != HVD_OK)
    return st; /* its message names the variable or the log file */
  s->tune_next = first;
  s->tune_due = true;
  HVD_LOG_INFO("autotune: tuning%s%s", cfg.log_path[0] != '\0' ? "; log in " : "", cfg.log_path);
  return HVD_OK;
}

void coord_autotune_fini(struct coord_state *s) {
  tune_tuner_destroy(s->tuner);
  s->tuner = NULL;
}

void coord_autotune_attach(struct coord_state *s, struct coord_response_list *list) {
  if (!s->tune_due)
    return;
  tune_setting_encode(&s->tune_next, list->tune);
  list->flags |= COORD_FLAG_TUNE;
  s->tune_due = false;
}

hvd_status coord_autotune_apply(struct coord_state *s, const struct coord_response_list *list) {
  struct tune_setting t;
  hvd_status st;

  if (!(list->flags & COORD_FLAG_TUNE))
    return HVD_OK;
  if ((st = tune_setting_decode(list->tune, sizeof(list->tune), &t)) != HVD_OK)
    return st;
  if (t.number <= s->tune_applied)
    return hvd_error(HVD_ERR_PROTOCOL, "rank 0 sent tuning setting %llu after %llu",
                     (unsigned long long)t.number, (unsigned long long)s->tune_applied);
  s->tune_applied = t.number;
  s->cfg.fusion_threshold = (size_t)t.fusion_threshold;
  s->cfg.cycle_ns = t.cycle_ns;
  s->cfg.hierarchical_allreduce = t.hierarchical_allreduce;
  s->cfg.hierarchical_allgather = t.hierarchical_allgather;
  ops_ctx_retune(s->ops, (size_t)t.allreduce_ring_bytes, (size_t)t.segment_bytes);
  if (s->controller != NULL)
    coord_ctl_pause_cache(s->controller, !t.cache_enabled);
  if (t.final)
    HVD_LOG_INFO("autotune: done; fusion threshold %llu bytes, cycle %.3f ms, cache %s, "
                 "hierarchical allreduce %d, allgather %d, ring from %llu bytes, segments of "
                 "%llu bytes",
                 (unsigned long long)t.fusion_threshold, (double)t.cycle_ns / 1e6,
                 t.cache_enabled ? "on" : "off", t.hierarchical_allreduce,
                 t.hierarchical_allgather, (unsigned long long)t.allreduce_ring_bytes,
                 (unsigned long long)t.segment_bytes);
  return HVD_OK;
}

/* Bytes a response moved: its tensors' elements (every rank's, for an
 * allgather) times the element size. */
static uint64_t response_bytes(const struct coord_response *r) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < r->ncounts; i++)
    n += r->counts[i] > 0 ? (uint64_t)r->counts[i] : 0;
  return n * hvd_dtype_size(r->dtype);
}

void coord_autotune_record(struct coord_state *s, const struct coord_response_list *list) {
  uint64_t bytes = 0;
  if (s->tuner == NULL || list->n == 0)
    return;
  for (uint32_t i = 0; i < list->n; i++)
    bytes += response_bytes(&list->resps[i]);
  if (tune_tuner_record(s->tuner, bytes, hvd_now_ns(), &s->tune_next))
    s->tune_due = true;
}
