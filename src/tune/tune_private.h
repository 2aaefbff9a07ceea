/*
 * The tune module's insides: the CSV log of the tuner's samples (log.c)
 * and, through bayes.h, the Bayesian optimiser (bayes.c). Only src/tune/
 * and its tests include this.
 */
#ifndef HVD_TUNE_PRIVATE_H
#define HVD_TUNE_PRIVATE_H

#include "bayes.h"
#include "tune.h"

_Static_assert((int)TUNE_MAX_SAMPLES == (int)TUNE_BAYES_MAX_SAMPLES,
               "the tuner's sample ceiling is the optimiser's");

/* ---- the CSV log (log.c) ------------------------------------------------------ */

struct tune_log;

/* Creates (truncates) the file and writes Horovod's header, then hvd's
 * columns: hierarchical_allreduce,hierarchical_allgather,torus_allreduce,
 * cache_enabled,cycle_time_ms,tensor_fusion_threshold,score,
 * allreduce_ring_bytes,ring_segment_bytes. HVD_ERR_IO naming the path. */
/* append: go on after what the file holds (a later elastic round), the
 * header only if it is empty; otherwise the file starts again. */
hvd_status tune_log_open(const char *path, bool append, struct tune_log **out);
/* One row (torus_allreduce always 0, the fusion threshold in bytes, the
 * score in bytes per second), flushed. HVD_ERR_IO naming the path. */
hvd_status tune_log_row(struct tune_log *l, const struct tune_setting *s,
                              double score);
/* NULL is a no-op. */
void tune_log_close(struct tune_log *l);

#endif /* HVD_TUNE_PRIVATE_H */
