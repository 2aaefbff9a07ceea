/*
 * The elastic driver's pods: workers that start on their own and register
 * in hvd-rendezvous's store (hvd-rendezvous --min-np; docs/elastic.md,
 * "Pods"). The worker's side is src/elastic/pod.c.
 *
 * DESIGN. A pod writes elastic_pods/<host>:<lr> = "<incarnation> <n>"
 * every second, and "<incarnation> done" or "... exit" when it leaves. The
 * driver reads that scope at every tick: a new incarnation is a new worker,
 * admitted with elastic_admitted/<incarnation> = the first round it may be
 * in; a heartbeat that stops changing for --pod-timeout, "exit", or a new
 * incarnation of the same slot (the pod restarted) ends the worker it
 * belongs to, as a process exiting does for hvdrun. The usable hosts are
 * the pods' host names, each with as many slots as it has live workers
 * with local ranks 0, 1, ... without a gap; they feed the same host view
 * and rounds as a discovery script's hosts.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "elastic_driver.h"

enum {
  /* Pods beat every second: two seconds of silence is a dead one. */
  RESET_SILENCE_S = 2,
};

static int64_t s_ns(int64_t s) { return s * 1000000000; }

static struct worker *by_incarnation(struct driver *d, const char *inc, size_t len) {
  for (size_t i = 0; i < d->nw; i++) {
    if (strlen(d->w[i].incarnation) == len && memcmp(d->w[i].incarnation, inc, len) == 0)
      return &d->w[i];
  }
  return NULL;
}

/* A new registration: key "<host>:<lr>" (host_len bytes of host), value
 * "<incarnation> <n>" (inc_len bytes of incarnation). */
static void admit(struct driver *d, const char *key, size_t host_len, int lr, const char *value,
                  size_t inc_len, size_t len) {
  struct worker *w = driver_add_worker(d);
  char first[32];

  if (w == NULL) {
    driver_say(d, "out of memory: pod %s cannot be admitted", key);
    return;
  }
  memcpy(w->host, key, host_len);
  w->local_rank = lr;
  memcpy(w->incarnation, value, inc_len);
  memcpy(w->beat, value, len);
  w->heard_at = hvd_now_ns();
  w->running = !d->finishing;
  if (driver_resumed_admission(d, w->incarnation, w->host, lr, &w->assigned)) {
    /* Without a place in the latest round it may be a pod the previous
     * driver counted as gone (its last beat stays in the store): it is
     * placed only once it beats under this driver, not waited for. */
    w->unproven = !w->assigned;
    if (d->o->verbose)
      driver_say(d, "pod %s is worker %d (admitted by the previous driver%s)", key, w->label,
                 w->assigned ? "; in the latest round" : "");
    return;
  }
  if (d->finishing)
    snprintf(first, sizeof(first), "finished");
  else
    snprintf(first, sizeof(first), "%llu",
             (unsigned long long)(d->published ? d->round + 1 : 0));
  driver_put(d, "elastic_admitted", w->incarnation, first);
  if (d->o->verbose || d->finishing)
    driver_say(d, "pod %s registered as worker %d%s", key, w->label,
               d->finishing ? "; the job has finished, so it has no place" : "");
}

/* One registration: elastic_pods/<host>:<lr> = "<incarnation> <n|done|exit>". */
static void on_pod(struct driver *d, const char *key, const char *value, size_t len) {
  const char *colon = strrchr(key, ':'), *space = memchr(value, ' ', len);
  const char *state = space != NULL ? space + 1 : NULL;
  size_t host_len = colon != NULL ? (size_t)(colon - key) : 0;
  size_t inc_len = space != NULL ? (size_t)(space - value) : 0;
  size_t state_len = state != NULL ? len - (size_t)(state - value) : 0;
  bool done = state_len == 4 && memcmp(state, "done", 4) == 0;
  bool left = done || (state_len == 4 && memcmp(state, "exit", 4) == 0);
  struct worker *w, *old;
  int64_t lr;

  if (host_len == 0 || host_len > HVDRUN_HOST_MAX ||
      !hvd_parse_int64(colon + 1, strlen(colon + 1), &lr) || lr < 0 || lr >= HVDRUN_MAX_RANKS ||
      inc_len == 0 || inc_len > POD_INCARNATION_MAX || state_len == 0 ||
      len >= sizeof(w->beat))
    return; /* not a pod's registration: nothing hvd writes */
  if ((w = by_incarnation(d, value, inc_len)) != NULL) {
    bool changed = strlen(w->beat) != len || memcmp(w->beat, value, len) != 0;
    if (!changed)
      return;
    memcpy(w->beat, value, len);
    w->beat[len] = '\0';
    w->heard_at = hvd_now_ns();
    w->unproven = false;
    if (!worker_live(w)) {
      /* It beats on after its end: another process took its slot, or it
       * was counted as gone and came back; either way it has no place. */
      if (!left && !w->twin_said && driver_live_worker(d, key, host_len, (int)lr) != NULL)
        driver_say(d, "two processes register as pod %s (the same host name and local rank): "
                      "give each its own HOROVOD_HOSTNAME or HOROVOD_LOCAL_RANK",
                   key);
      else if (!left && !w->twin_said)
        driver_say(d, "pod %s (worker %d) beats again after it was counted as gone; it gets "
                      "no place until it restarts",
                   key, w->label);
      w->twin_said = w->twin_said || !left;
      return;
    }
    if (left)
      driver_worker_ended(d, w, done ? "finished" : "left the job", done ? 0 : 1);
    return;
  }
  if (left)
    return; /* a registration that ended before the driver saw it */
  if ((old = driver_live_worker(d, key, host_len, (int)lr)) != NULL)
    driver_worker_ended(d, old, "was replaced by a new process with its host name (the pod "
                                "restarted)",
                        1);
  admit(d, key, host_len, (int)lr, value, inc_len, len);
}

/* A slot whose live worker may have a place in a round. */
static bool placeable(struct driver *d, const char *host, int local_rank) {
  const struct worker *w = driver_live_worker(d, host, strlen(host), local_rank);
  return w != NULL && !w->unproven;
}

/* Appends host name with its placeable slots, unless listed or without any. */
static void list_host(struct driver *d, struct hvdrun_host *hosts, size_t *count,
                      const char *name) {
  struct hvdrun_host *h = &hosts[*count];

  for (size_t i = 0; i < *count; i++) {
    if (strcmp(hosts[i].name, name) == 0)
      return;
  }
  snprintf(h->name, sizeof(h->name), "%s", name);
  h->slots = 0;
  while (placeable(d, name, h->slots))
    h->slots++;
  if (h->slots > 0)
    (*count)++;
}

hvd_status pods_discover(struct driver *d, struct hvdrun_host **found, size_t *n) {
  int64_t now = hvd_now_ns();
  struct hvdrun_host *hosts;
  size_t count = 0;
  int64_t newest = 0; /* the latest heartbeat heard from any live pod */

  driver_scope_each(d, "elastic_pods", on_pod, d);
  for (size_t i = 0; i < d->nw; i++) {
    if (worker_live(&d->w[i]) && d->w[i].heard_at > newest)
      newest = d->w[i].heard_at;
  }
  for (size_t i = 0; i < d->nw; i++) {
    struct worker *w = &d->w[i];
    char why[128];
    /* While the others reset, a worker of the round that has not left it
     * and beats no more is gone: it cannot hold them up --pod-timeout.
     * Silent while others beat, that is: a store that stalls (an etcd
     * election) silences every pod alike. */
    bool holding_up = d->pending && d->published && w->assigned && w->left < (int64_t)d->round &&
                      now - w->heard_at > s_ns(RESET_SILENCE_S) &&
                      newest - w->heard_at > s_ns(RESET_SILENCE_S);
    if (!worker_live(w))
      continue;
    if (now - w->heard_at > s_ns(d->pod_timeout_s))
      snprintf(why, sizeof(why), "sent no heartbeat for %d s (--pod-timeout)", d->pod_timeout_s);
    else if (holding_up)
      snprintf(why, sizeof(why), "sent no heartbeat for %d s while the others reset",
               RESET_SILENCE_S);
    else
      continue;
    driver_worker_ended(d, w, why, 1);
  }
  if ((hosts = calloc(d->nw + 1, sizeof(*hosts))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  /* Hosts in the latest round's rank order, then the others in the order
   * their pods first registered; slots 0, 1, ... A driver that took over
   * read its pods in the store's key order: listing the round's hosts
   * first gives it the last driver's plan, not a new one (a reset). */
  for (int r = 0; r < d->plan_size; r++)
    list_host(d, hosts, &count, d->plan_hosts[d->plan[r].host].name);
  for (size_t i = 0; i < d->nw; i++) {
    if (worker_live(&d->w[i]) && !d->w[i].unproven)
      list_host(d, hosts, &count, d->w[i].host);
  }
  *found = hosts;
  *n = count;
  return HVD_OK;
}
