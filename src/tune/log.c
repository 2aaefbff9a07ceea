/*
 * The autotuner's CSV log (HOROVOD_AUTOTUNE_LOG): Horovod's columns, in
 * Horovod's order, so that its readers keep working, then hvd's own knobs.
 * Each row is flushed: the file is read while the job runs, or after it
 * was killed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tune_private.h"

static const char HEADER[] = "hierarchical_allreduce,hierarchical_allgather,torus_allreduce,"
                             "cache_enabled,cycle_time_ms,tensor_fusion_threshold,score,"
                             "allreduce_ring_bytes,ring_segment_bytes\n";

struct tune_log {
  FILE *f;
  char *path;
};

static hvd_status write_error(const struct tune_log *l, const char *call, int err) {
  return hvd_error(HVD_ERR_IO, "HOROVOD_AUTOTUNE_LOG %s: %s: %s (check the disk and its space)",
                   l->path, call, strerror(err));
}

hvd_status tune_log_open(const char *path, bool append, struct tune_log **out) {
  struct tune_log *l = calloc(1, sizeof(*l));
  hvd_status st = HVD_OK;

  if (l == NULL || (l->path = hvd_strndup(path, strlen(path))) == NULL) {
    free(l);
    return hvd_error(HVD_ERR_NO_MEMORY, "HOROVOD_AUTOTUNE_LOG: cannot allocate the log");
  }
  l->f = fopen(path, append ? "a" : "w");
  if (l->f == NULL)
    st = hvd_error(HVD_ERR_IO,
                   "HOROVOD_AUTOTUNE_LOG %s: fopen: %s (check that the directory exists and "
                   "is writable)",
                   path, strerror(errno));
  else if (ftell(l->f) == 0 && (fputs(HEADER, l->f) == EOF || fflush(l->f) != 0))
    st = write_error(l, "write", errno);
  if (st != HVD_OK) {
    tune_log_close(l);
    return st;
  }
  *out = l;
  return HVD_OK;
}

hvd_status tune_log_row(struct tune_log *l, const struct tune_setting *s,
                              double score) {
  if (fprintf(l->f, "%d,%d,0,%d,%.3f,%" PRIu64 ",%.1f,%" PRIu64 ",%" PRIu64 "\n",
              s->hierarchical_allreduce, s->hierarchical_allgather, s->cache_enabled,
              (double)s->cycle_ns / 1e6, s->fusion_threshold, score, s->allreduce_ring_bytes,
              s->segment_bytes) < 0 ||
      fflush(l->f) != 0)
    return write_error(l, "write", errno);
  return HVD_OK;
}

void tune_log_close(struct tune_log *l) {
  if (l == NULL)
    return;
  if (l->f != NULL)
    fclose(l->f);
  free(l->path);
  free(l);
}
