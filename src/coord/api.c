/*
 * The public queries (rank, size, process sets) and the timeline's switch:
 * each reads the published state under coord_acquire.
 */
#include <stddef.h>

#include "coord.h"

/* ==== queries ============================================================================ */

static int world_field(size_t offset) {
  struct coord_state *s = coord_acquire_quiet();
  int v = -1;
  if (s != NULL) {
    v = *(const int *)((const char *)s->world + offset);
    coord_release();
  }
  return v;
}

HVD_API int hvd_rank(void) { return world_field(offsetof(struct net_world, rank)); }
HVD_API int hvd_size(void) { return world_field(offsetof(struct net_world, size)); }
HVD_API int hvd_local_rank(void) { return world_field(offsetof(struct net_world, local_rank)); }
HVD_API int hvd_local_size(void) { return world_field(offsetof(struct net_world, local_size)); }
HVD_API int hvd_cross_rank(void) { return world_field(offsetof(struct net_world, cross_rank)); }
HVD_API int hvd_cross_size(void) { return world_field(offsetof(struct net_world, cross_size)); }

HVD_API int hvd_is_homogeneous(void) {
  struct coord_state *s = coord_acquire_quiet();
  int v = -1;
  if (s != NULL) {
    v = s->homogeneous ? 1 : 0;
    coord_release();
  }
  return v;
}

HVD_API int hvd_process_set_rank(int id) {
  struct coord_state *s = coord_acquire();
  int size = -1, rank = -1;
  if (s == NULL)
    return -1;
  if (!coord_sets_lookup(&s->sets, id, &size, &rank))
    rank = -1;
  coord_release();
  return rank;
}

HVD_API int hvd_process_set_size(int id) {
  struct coord_state *s = coord_acquire();
  int size = -1, rank = -1;
  if (s == NULL)
    return -1;
  if (!coord_sets_lookup(&s->sets, id, &size, &rank))
    size = -1;
  coord_release();
  return size;
}

HVD_API hvd_status hvd_process_set_ranks(int id, int *ranks, size_t cap, size_t *n) {
  struct coord_state *s;
  hvd_status st;
  if (n == NULL || (ranks == NULL && cap > 0))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "hvd_process_set_ranks: needs n, and ranks for cap > 0");
  if ((s = coord_acquire()) == NULL)
    return hvd_error_status();
  st = coord_sets_ranks(&s->sets, id, ranks, cap, n);
  coord_release();
  return st;
}

HVD_API hvd_status hvd_process_set_ids(int *ids, size_t cap, size_t *n) {
  struct coord_state *s;
  if (n == NULL || (ids == NULL && cap > 0))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_process_set_ids: needs n, and ids for cap > 0");
  if ((s = coord_acquire()) == NULL)
    return hvd_error_status();
  coord_sets_ids(&s->sets, ids, cap, n);
  coord_release();
  return HVD_OK;
}

HVD_API int64_t hvd_reducescatter_rows(int64_t dim0, int process_set) {
  struct coord_state *s = coord_acquire();
  int size = -1, rank = -1;
  int64_t rows = -1;
  if (s == NULL)
    return -1;
  if (dim0 >= 0 && coord_sets_lookup(&s->sets, process_set, &size, &rank) && rank >= 0)
    rows = (int64_t)ops_share_count((size_t)dim0, size, rank);
  coord_release();
  return rows;
}

/* ==== timeline ============================================================================ */

HVD_API hvd_status hvd_timeline_start(const char *path, int mark_cycles) {
  struct coord_state *s;
  hvd_status st = HVD_OK;

  if (path == NULL || path[0] == '\0')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "hvd_timeline_start: no path");
  if ((s = coord_acquire()) == NULL)
    return hvd_error_status();
  if (s->rank == 0)
    st = coord_timeline_start(s->timeline, path, mark_cycles != 0);
  coord_release();
  return st;
}

HVD_API hvd_status hvd_timeline_stop(void) {
  struct coord_state *s;
  hvd_status st = HVD_OK;

  if ((s = coord_acquire()) == NULL)
    return hvd_error_status();
  if (s->rank == 0)
    st = coord_timeline_stop(s->timeline);
  coord_release();
  return st;
}
