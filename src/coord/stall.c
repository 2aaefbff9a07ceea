/*
 * The stall inspector: on the coordinator, operations that some ranks
 * submitted long ago and others never did. After
 * HOROVOD_STALL_CHECK_TIME_SECONDS it warns, naming the operations and the
 * ranks they wait for (the usual cause: ranks that took different code
 * paths, or one that died without closing its sockets); after
 * HOROVOD_STALL_SHUTDOWN_TIME_SECONDS (if set) it stops the job.
 */
#include <stdio.h>
#include <string.h>

#include "controller_private.h"

enum { SHOWN_TENSORS = 8, SHOWN_RANKS = 16 };

static void missing_ranks(const struct coord_controller *c, const struct pending *p, char *out,
                          size_t size) {
  const struct ctl_set *set = &c->sets[p->first.set];
  size_t len = 0;
  int shown = 0, missing = 0;

  out[0] = '\0';
  for (int i = 0; i < set->size; i++) {
    if ((p->submitted[i / 8] & (1u << (i % 8))) || c->joined[set->ranks[i]])
      continue;
    if (shown < SHOWN_RANKS && len < size) {
      len += (size_t)snprintf(out + len, size - len, "%s%d", shown ? ", " : "", set->ranks[i]);
      shown++;
    }
    missing++;
  }
  if (missing > shown && len < size)
    snprintf(out + len, size - len, " and %d more", missing - shown);
}

hvd_status coord_controller_check_stalls(struct coord_controller *c, int64_t now) {
  const struct coord_config *cfg = &c->s->cfg;
  char ranks[256];
  int stalled = 0;
  const struct pending *worst = NULL;

  if (!cfg->stall_check || now < c->next_stall_check)
    return HVD_OK;
  c->next_stall_check = now + cfg->stall_warn_ns;
  for (const struct pending *p = c->head; p != NULL; p = p->next) {
    if (now - p->first_ns < cfg->stall_warn_ns)
      continue;
    if (stalled == 0)
      HVD_LOG_WARN("operations submitted by some ranks have waited more than %.0f s for the "
                   "others (ranks that run different code, or a rank that hangs?):",
                   (double)cfg->stall_warn_ns / 1e9);
    if (stalled < SHOWN_TENSORS) {
      missing_ranks(c, p, ranks, sizeof(ranks));
      HVD_LOG_WARN("  %s '%s' (process set %d), for %.0f s: missing rank(s) %s",
                   coord_type_name(p->first.type), p->first.name, p->first.set,
                   (double)(now - p->first_ns) / 1e9, ranks);
    }
    stalled++;
    if (worst == NULL || p->first_ns < worst->first_ns)
      worst = p;
  }
  if (stalled > SHOWN_TENSORS)
    HVD_LOG_WARN("  ... and %d more", stalled - SHOWN_TENSORS);
  if (stalled > 0)
    coord_metrics_stalls(stalled);
  if (worst != NULL && cfg->stall_shutdown_ns > 0 &&
      now - worst->first_ns >= cfg->stall_shutdown_ns) {
    missing_ranks(c, worst, ranks, sizeof(ranks));
    return hvd_error(HVD_ERR_TIMEOUT,
                     "%s '%s' waited %.0f s for rank(s) %s, longer than "
                     "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: stopping the job",
                     coord_type_name(worst->first.type), worst->first.name,
                     (double)(now - worst->first_ns) / 1e9, ranks);
  }
  return HVD_OK;
}

/* When the loop should next call the inspector (HVD_NO_DEADLINE: nothing
 * is pending). */
int64_t coord_controller_next_check(const struct coord_controller *c) {
  if (!c->s->cfg.stall_check || c->head == NULL)
    return HVD_NO_DEADLINE;
  return c->next_stall_check > c->head->first_ns + c->s->cfg.stall_warn_ns
             ? c->next_stall_check
             : c->head->first_ns + c->s->cfg.stall_warn_ns;
}
