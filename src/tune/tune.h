/*
 * The tune module: the autotuner (HOROVOD_AUTOTUNE) and its optimiser. On
 * the coordinator, it measures the job's throughput under one setting of
 * the tunables after another and settles on the best. The coordinator's
 * loop owns it (coord/autotune.c): it reports each cycle's work with
 * tune_tuner_record and ships every new setting to the ranks
 * (tune_setting_encode), which apply the highest-numbered one they have
 * seen. It needs no networking and no other module but common; this
 * header is all that other modules see (the optimiser and the log are
 * tune_private.h's).
 *
 * Not thread-safe: one thread (rank 0's background loop, or the user
 * thread driving it) owns a tuner.
 */
#ifndef HVD_TUNE_H
#define HVD_TUNE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* The knobs. A tuner tunes those whose bit is in its `tunable` mask and
 * leaves the others at their initial values, untouched. */
enum tune_knob {
  TUNE_FUSION = 0,     /* HOROVOD_FUSION_THRESHOLD */
  TUNE_CYCLE,          /* HOROVOD_CYCLE_TIME */
  TUNE_CACHE,          /* response cache on/off (HOROVOD_CACHE_CAPACITY 0 or not) */
  TUNE_HIER_ALLREDUCE, /* HOROVOD_HIERARCHICAL_ALLREDUCE */
  TUNE_HIER_ALLGATHER, /* HOROVOD_HIERARCHICAL_ALLGATHER */
  TUNE_RING_BYTES,     /* HVD_ALLREDUCE_RING_BYTES */
  TUNE_SEGMENT_BYTES,  /* HVD_RING_SEGMENT_BYTES */
  TUNE_KNOBS
};
#define TUNE_BIT(knob) (1u << (knob))
#define TUNE_ALL ((1u << TUNE_KNOBS) - 1)

/* The box a tuned knob stays in (pinned knobs may hold anything). Fusion is
 * searched on a linear scale in MiB, as Horovod does; the others on a log
 * scale, since their effect is relative. */
#define TUNE_FUSION_MAX (UINT64_C(64) << 20)
#define TUNE_CYCLE_MIN_NS INT64_C(100000)    /* 0.1 ms */
#define TUNE_CYCLE_MAX_NS INT64_C(100000000) /* 100 ms */
#define TUNE_RING_MIN (UINT64_C(64) << 10)
#define TUNE_RING_MAX (UINT64_C(256) << 20)
#define TUNE_SEGMENT_MIN (UINT64_C(16) << 10)
#define TUNE_SEGMENT_MAX (UINT64_C(8) << 20)

/* A setting: plain values, as the ranks apply them. */
struct tune_setting {
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
enum { TUNE_SETTING_BYTES = 41 };
void tune_setting_encode(const struct tune_setting *s,
                               unsigned char out[TUNE_SETTING_BYTES]);
/* HVD_ERR_PROTOCOL for a wrong length, unknown flag bits or a negative
 * cycle; *out is written only on success. */
hvd_status tune_setting_decode(const void *data, size_t len, struct tune_setting *out);

/* ---- configuration ------------------------------------------------------------- */

enum {
  TUNE_PATH_MAX = 1024,
  TUNE_MAX_SAMPLES = 64, /* HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES' ceiling (the optimiser's) */
};

struct tune_config {
  bool enabled;             /* HOROVOD_AUTOTUNE (0) */
  int64_t warmup_samples;   /* HOROVOD_AUTOTUNE_WARMUP_SAMPLES (3): discarded first samples */
  int64_t steps_per_sample; /* HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE (10), >= 1 */
  int64_t max_samples;      /* HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (20), at most
                               TUNE_MAX_SAMPLES; 0: keep the initial setting */
  double gp_noise;          /* HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (0.8), 0 to 1 */
  char log_path[TUNE_PATH_MAX]; /* HOROVOD_AUTOTUNE_LOG; "": no log */
  bool log_append; /* a later round (an elastic reset, hvd_init again): the log goes on */
  uint64_t seed;                      /* proposals are a function of the seed and the scores */
};

/* Reads the variables above (the seed is a constant). A malformed or
 * out-of-range value is HVD_ERR_INVALID_ARGUMENT with a one-line message
 * naming it; *out is written only on success. */
hvd_status tune_config_from_env(struct tune_config *out);

/* ---- the tuner ------------------------------------------------------------------ */

struct tune_tuner;

/*
 * Makes a tuner that starts from `initial` (its number is ignored) and
 * tunes the knobs in `tunable` (TUNE_BIT()s; pin a knob the user set
 * or that cannot matter, such as hierarchical ones on one host). *first
 * gets setting 1: `initial` with each tuned knob moved into its box; ship
 * it. With nothing to tune, or max_samples 0, setting 1 is already final
 * (and no log is written); otherwise cfg->log_path, if set, is created or
 * truncated and gets the CSV header. cfg->enabled is the caller's to check.
 * HVD_ERR_INVALID_ARGUMENT for a bad config or mask, HVD_ERR_IO naming the
 * log file, HVD_ERR_NO_MEMORY; *out and *first are written only on success.
 */
hvd_status tune_tuner_create(const struct tune_config *cfg,
                              const struct tune_setting *initial, unsigned tunable,
                              struct tune_tuner **out, struct tune_setting *first);
/* Closes the log. NULL is a no-op. */
void tune_tuner_destroy(struct tune_tuner *t);

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
bool tune_tuner_record(struct tune_tuner *t, uint64_t bytes, int64_t now_ns,
                        struct tune_setting *out);
/* The setting in force (the last one returned). */
void tune_tuner_current(const struct tune_tuner *t, struct tune_setting *out);
bool tune_tuner_done(const struct tune_tuner *t);

#endif /* HVD_TUNE_H */
