/*
 * A pods' driver taking over in etcd (elastic_driver.h) from one that
 * died or lost its leadership: everything it needs is in the store.
 *
 * DESIGN. The latest round is elastic/latest, its plan the non-negative
 * assignments under rank_and_size.<latest>, the updates announced the
 * elastic/update.<k> keys. The pods come from elastic_pods as they would
 * for any driver; a pod whose incarnation the previous driver admitted
 * (elastic_admitted) keeps its admission and, if the latest round gives
 * its slot a place, that place: the next round then keeps the workers
 * that hold the state, and a takeover alone announces nothing, so the
 * workers go on training. What the previous driver kept only in memory
 * is lost: its reset count, and how long the current wait has lasted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "elastic_driver.h"

struct found {
  int64_t latest; /* -1: none */
  uint64_t updates;
  struct hvdrun_slot *slots; /* by rank */
  struct hvdrun_host *hosts;
  size_t nhosts;
  int size;
  bool bad; /* an assignment that does not fit */
};

static void on_elastic(struct found *f, const char *key, const char *value, size_t len) {
  int64_t n;
  if (strcmp(key, "latest") == 0 && hvd_parse_int64(value, len, &n) && n >= 0)
    f->latest = n;
  else if (strncmp(key, "update.", 7) == 0 && hvd_parse_int64(key + 7, strlen(key + 7), &n) &&
           n > 0 && (uint64_t)n > f->updates)
    f->updates = (uint64_t)n;
}

/* rank_and_size.<latest>/<host>:<lr> = "rank,size,local_rank,local_size,cross_rank,cross_size" */
static void on_assignment(struct found *f, const char *key, const char *value, size_t len) {
  const char *colon = strrchr(key, ':');
  int v[6];
  size_t h = 0, host_len = colon != NULL ? (size_t)(colon - key) : 0;
  char text[96];

  if (len >= sizeof(text) || host_len == 0 || host_len > HVDRUN_HOST_MAX)
    return;
  memcpy(text, value, len);
  text[len] = '\0';
  if (sscanf(text, "%d,%d,%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6 ||
      v[0] < 0)
    return; /* a worker without a place */
  if (v[1] < 1 || v[1] > HVDRUN_MAX_RANKS || v[0] >= v[1] || (f->size != 0 && v[1] != f->size)) {
    f->bad = true;
    return;
  }
  if (f->slots == NULL) {
    f->size = v[1];
    f->slots = calloc((size_t)v[1], sizeof(*f->slots));
    f->hosts = calloc((size_t)v[1], sizeof(*f->hosts));
    if (f->slots == NULL || f->hosts == NULL) {
      f->bad = true;
      return;
    }
    for (int r = 0; r < f->size; r++)
      f->slots[r].host = -1;
  }
  while (h < f->nhosts &&
         !(strlen(f->hosts[h].name) == host_len && memcmp(f->hosts[h].name, key, host_len) == 0))
    h++;
  if (h == f->nhosts) {
    memcpy(f->hosts[h].name, key, host_len);
    f->nhosts++;
  }
  f->hosts[h].slots++;
  f->slots[v[0]] = (struct hvdrun_slot){(int)h, v[0], v[1], v[2], v[3], v[4], v[5]};
}

/* Hands each entry of a scope to fn; false if it cannot be read. */
static bool each(struct driver *d, const char *scope, struct found *f,
                 void (*fn)(struct found *, const char *, const char *, size_t)) {
  struct rdzv_scope_view view;

  if (rdzv_client_get_scope(d->client, scope, 0, -1, &view) != HVD_OK) {
    driver_say(d, "taking over: reading %s: %s", scope, hvd_last_error_message());
    return false;
  }
  for (size_t i = 0; i < view.count; i++)
    fn(f, view.entries[i].key, (const char *)view.entries[i].value, view.entries[i].value_len);
  rdzv_scope_view_fini(&view);
  return true;
}

void driver_resume(struct driver *d) {
  struct found f = {.latest = -1};
  char scope[48];

  f.bad = !each(d, "elastic", &f, on_elastic);
  if (f.latest >= 0) {
    snprintf(scope, sizeof(scope), "rank_and_size.%lld", (long long)f.latest);
    f.bad = !each(d, scope, &f, on_assignment) || f.bad;
  }
  for (int r = 0; r < f.size && !f.bad; r++)
    f.bad = f.slots[r].host < 0; /* a rank nobody had */
  d->updates = f.updates;
  if (f.latest >= 0 && !f.bad && f.size > 0) {
    d->published = true;
    d->round = (uint64_t)f.latest;
    d->plan = f.slots;
    d->plan_hosts = f.hosts;
    d->plan_size = f.size;
  } else {
    free(f.slots);
    free(f.hosts);
    if (f.latest >= 0) { /* a round with nobody in it: the next one starts afresh */
      d->published = true;
      d->round = (uint64_t)f.latest;
      d->afresh = true;
    }
  }
  if (rdzv_client_get_scope(d->client, "elastic_admitted", 0, -1, &d->admitted) != HVD_OK)
    driver_say(d, "reading the admissions: %s", hvd_last_error_message());
  driver_say(d, "leading the elastic driver%s%s", f.latest >= 0 ? " from round " : "",
             f.latest >= 0 ? (snprintf(scope, sizeof(scope), "%lld", (long long)f.latest), scope)
                           : "");
}

bool driver_resumed_admission(const struct driver *d, const char *incarnation, const char *host,
                              int local_rank, bool *assigned) {
  const struct rdzv_entry *e = d->admitted.count > 0 ? rdzv_scope_find(&d->admitted, incarnation)
                                                     : NULL;
  int64_t first;

  *assigned = false;
  if (e == NULL)
    return false;
  if (!d->published || !hvd_parse_int64((const char *)e->value, e->value_len, &first) ||
      (uint64_t)first > d->round)
    return true; /* admitted; no place yet */
  for (int r = 0; r < d->plan_size; r++) {
    const struct hvdrun_slot *s = &d->plan[r];
    if (s->local_rank == local_rank && strcmp(d->plan_hosts[s->host].name, host) == 0)
      *assigned = true;
  }
  return true;
}
