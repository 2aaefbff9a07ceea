/*
 * The autotuner (HOROVOD_AUTOTUNE): on the coordinator, it measures the
 * job's throughput under one setting of the tunables after another and
 * settles on the best. The coordinator's loop owns it: it reports each
 * cycle's work with coord_tuner_record and ships every new setting to the
 * ranks (coord_tune_setting_encode), which apply the highest-numbered one
 * they have seen. Needs no networking and no other module but common.
 *
 * Not thread-safe: one thread (rank 0's background loop) owns a tuner.
 */
#ifndef HVD_COORD_TUNER_H
#define HVD_COORD_TUNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/bayes.h"
#include "common/common.h"

/* The knobs. A tuner tunes those whose bit is in its `tunable` mask and
 * leaves the others at their initial values, untouched. */
enum coord_tune_knob {
  COORD_TUNE_FUSION = 0,     /* HOROVOD_FUSION_THRESHOLD */
  COORD_TUNE_CYCLE,          /* HOROVOD_CYCLE_TIME */
  COORD_TUNE_CACHE,          /* response cache on/off (HOROVOD_CACHE_CAPACITY 0 or not) */
  COORD_TUNE_HIER_ALLREDUCE, /* HOROVOD_HIERARCHICAL_ALLREDUCE */
  COORD_TUNE_HIER_ALLGATHER, /* HOROVOD_HIERARCHICAL_ALLGATHER */
  COORD_TUNE_RING_BYTES,     /* HVD_ALLREDUCE_RING_BYTES */
  COORD_TUNE_SEGMENT_BYTES,  /* HVD_RING_SEGMENT_BYTES */
  COORD_TUNE_KNOBS
};
#define COORD_TUNE_BIT(knob) (1u << (knob))
#define COORD_TUNE_ALL ((1u << COORD_TUNE_KNOBS) - 1)

/* The box a tuned knob stays in (pinned knobs may hold anything). Fusion is
 * searched on a linear scale in MiB, as Horovod does; the others on a log
 * scale, since their effect is relative. */
#define COORD_TUNE_FUSION_MAX (UINT64_C(64) << 20)
#define COORD_TUNE_CYCLE_MIN_NS INT64_C(100000)    /* 0.1 ms */
#define COORD_TUNE_CYCLE_MAX_NS INT64_C(100000000) /* 100 ms */
#define COORD_TUNE_RING_MIN (UINT64_C(64) << 10)
#define COORD_TUNE_RING_MAX (UINT64_C(256) << 20)
#define COORD_TUNE_SEGMENT_MIN (UINT64_C(16) << 10)
#define COORD_TUNE_SEGMENT_MAX (UINT64_C(8) << 20)

/* A setting: plain values, as the ranks apply them. */
struct coord_tune_setting {
  uint64_t number;               /* 1 for the first; each new setting's is larger */
  uint64_t fusion_threshold;     /* bytes; a tuned value is a whole KiB */
  int64_t cycle_ns;              /* a tuned value is a whole microsecond */
  uint64_t allreduce_ring_bytes; /* a tuned value is a multiple of 4 KiB */
  uint64_t segment_bytes;        /* a tuned value is a multiple of 4 KiB */
  bool cache_enabled;
  bool hierarchical_allreduce;
  bool hierarchical_allgather;
  bool final; /* tuning is over: this setting stays */
};

/* Fixed-size little-endian wire form: number, fusion, cycle, ring, segment
 * (8 bytes each), then a flags byte. */
enum { COORD_TUNE_SETTING_BYTES = 41 };
void coord_tune_setting_encode(const struct coord_tune_setting *s,
                               unsigned char out[COORD_TUNE_SETTING_BYTES]);
/* HVD_ERR_PROTOCOL for a wrong length, unknown flag bits or a negative
 * cycle; *out is written only on success. */
hvd_status coord_tune_setting_decode(const void *data, size_t len, struct coord_tune_setting *out);

/* ---- configuration ------------------------------------------------------------- */

enum { COORD_TUNE_PATH_MAX = 1024 };

struct coord_tune_config {
  bool enabled;             /* HOROVOD_AUTOTUNE (0) */
  int64_t warmup_samples;   /* HOROVOD_AUTOTUNE_WARMUP_SAMPLES (3): discarded first samples */
  int64_t steps_per_sample; /* HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE (10), >= 1 */
  int64_t max_samples;      /* HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (20), at most
                               HVD_BAYES_MAX_SAMPLES; 0: keep the initial setting */
  double gp_noise;          /* HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (0.8), 0 to 1 */
  char log_path[COORD_TUNE_PATH_MAX]; /* HOROVOD_AUTOTUNE_LOG; "": no log */
  uint64_t seed;                      /* proposals are a function of the seed and the scores */
};

/* Reads the variables above (the seed is a constant). A malformed or
 * out-of-range value is HVD_ERR_INVALID_ARGUMENT with a one-line message
 * naming it; *out is written only on success. */
hvd_status coord_tune_config_from_env(struct coord_tune_config *out);

/* ---- the tuner ------------------------------------------------------------------ */

struct coord_tuner;

/*
 * Makes a tuner that starts from `initial` (its number is ignored) and
 * tunes the knobs in `tunable` (COORD_TUNE_BIT()s; pin a knob the user set
 * or that cannot matter, such as hierarchical ones on one host). *first
 * gets setting 1: `initial` with each tuned knob moved into its box; ship
 * it. With nothing to tune, or max_samples 0, setting 1 is already final
 * (and no log is written); otherwise cfg->log_path, if set, is created or
 * truncated and gets the CSV header. cfg->enabled is the caller's to check.
 * HVD_ERR_INVALID_ARGUMENT for a bad config or mask, HVD_ERR_IO naming the
 * log file, HVD_ERR_NO_MEMORY; *out and *first are written only on success.
 */
hvd_status coord_tuner_create(const struct coord_tune_config *cfg,
                              const struct coord_tune_setting *initial, unsigned tunable,
                              struct coord_tuner **out, struct coord_tune_setting *first);
/* Closes the log. NULL is a no-op. */
void coord_tuner_destroy(struct coord_tuner *t);

/*
 * Reports one step: a coordinator cycle that completed work, `bytes` the
 * bytes it reduced, at `now_ns` (CLOCK_MONOTONIC) when it ended. The first
 * call only starts the clock. Every steps_per_sample steps close a sample,
 * scored as its bytes over the time since the step before its first; the
 * first warmup_samples samples are discarded. Then come max_samples scored
 * samples: setting 1, the optimiser's proposals, and last (when
 * max_samples leaves room) one per tuned boolean, flipped from the best
 * setting so far. The best few (up to 3) are then measured once more and
 * the one with the best mean of its two scores is final. Each scored
 * sample is a CSV row. Returns true, with *out the new setting, when the
 * setting changed (a new proposal, or the final one); false, leaving *out
 * alone, otherwise and once tuning is over. Never fails: a model that
 * cannot be fitted falls back to a random proposal, a failed log write to
 * no log (both with a warning).
 */
bool coord_tuner_record(struct coord_tuner *t, uint64_t bytes, int64_t now_ns,
                        struct coord_tune_setting *out);
/* The setting in force (the last one returned). */
void coord_tuner_current(const struct coord_tuner *t, struct coord_tune_setting *out);
bool coord_tuner_done(const struct coord_tuner *t);

/* ---- the CSV log (tune_log.c) ------------------------------------------------------ */

struct coord_tune_log;

/* Creates (truncates) the file and writes Horovod's header, then hvd's
 * columns: hierarchical_allreduce,hierarchical_allgather,torus_allreduce,
 * cache_enabled,cycle_time_ms,tensor_fusion_threshold,score,
 * allreduce_ring_bytes,ring_segment_bytes. HVD_ERR_IO naming the path. */
hvd_status coord_tune_log_open(const char *path, struct coord_tune_log **out);
/* One row (torus_allreduce always 0, the fusion threshold in bytes, the
 * score in bytes per second), flushed. HVD_ERR_IO naming the path. */
hvd_status coord_tune_log_row(struct coord_tune_log *l, const struct coord_tune_setting *s,
                              double score);
/* NULL is a no-op. */
void coord_tune_log_close(struct coord_tune_log *l);

#endif /* HVD_COORD_TUNER_H */
