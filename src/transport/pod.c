/*
 * Pod mode: ranks that start on their own (Kubernetes pods, or any
 * processes started without hvdrun) and learn their rank from the store.
 *
 * DESIGN. With HVD_POD=1 a process needs only the store's address
 * (HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT), the job size (HOROVOD_SIZE) and the
 * token. It registers its name, "<hostname>" or "<hostname>:<local rank>"
 * when HOROVOD_LOCAL_RANK is set (several ranks per pod), under scope
 * "pods" (g<N>.pods in later generations), waits with one long-poll until
 * HOROVOD_SIZE names are there, and takes its place in their order as its
 * rank. The order is stable and follows StatefulSet ordinals: names that
 * differ only in a trailing number compare by that number (train-2 before
 * train-10), others as strings. Local and cross ranks then come from the
 * hostnames every rank publishes, as for any job without them. A pod that
 * restarts registers the same name again, which is harmless.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport_private.h"

/* The length of a name without its trailing digits. */
static size_t stem(const char *s, size_t len) {
  while (len > 0 && s[len - 1] >= '0' && s[len - 1] <= '9')
    len--;
  return len;
}

/* a[0..la) against b[0..lb): by the trailing number where only it
 * differs (leading zeros ignored), else as strings. */
static int compare_name(const char *a, size_t la, const char *b, size_t lb) {
  size_t sa = stem(a, la), sb = stem(b, lb), n;
  int c;
  if (sa == sb && sa < la && sb < lb && memcmp(a, b, sa) == 0) {
    const char *na = a + sa, *nb = b + sb;
    size_t da = la - sa, db = lb - sb;
    while (da > 1 && *na == '0')
      na++, da--;
    while (db > 1 && *nb == '0')
      nb++, db--;
    if (da != db)
      return da < db ? -1 : 1;
    if ((c = memcmp(na, nb, da)) != 0)
      return c;
  }
  n = la < lb ? la : lb;
  if ((c = memcmp(a, b, n)) != 0)
    return c;
  return la == lb ? 0 : (la < lb ? -1 : 1);
}

/* Where a name's ":<local rank>" suffix begins (its length if none). */
static size_t host_part(const char *s, size_t len) {
  const char *colon = memrchr(s, ':', len);
  size_t at = colon != NULL ? (size_t)(colon - s) : len;
  if (at == len || at + 1 == len || stem(s, len) != at + 1)
    return len;
  return at;
}

int net_pod_compare(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), ha = host_part(a, la), hb = host_part(b, lb);
  int c = compare_name(a, ha, b, hb);
  if (c != 0)
    return c;
  /* The same host: by local rank, a name without one first. */
  return compare_name(a + ha, la - ha, b + hb, lb - hb);
}

static int compare_entries(const void *x, const void *y) {
  return net_pod_compare(((const struct rdzv_entry *)x)->key,
                         ((const struct rdzv_entry *)y)->key);
}

hvd_status net_pod_rank(struct rdzv_client *store, uint64_t generation, const char *host,
                        int local_rank, int size, int *rank) {
  struct rdzv_scope_view view;
  char scope[32], prefix[24], name[RDZV_RECORD_HOST_MAX + 16];
  hvd_status st;

  net_generation_prefix(generation, prefix, sizeof(prefix));
  snprintf(scope, sizeof(scope), "%spods", prefix);
  if (local_rank >= 0)
    snprintf(name, sizeof(name), "%s:%d", host, local_rank);
  else
    snprintf(name, sizeof(name), "%s", host);
  if ((st = rdzv_client_set(store, scope, name, name, strlen(name))) != HVD_OK)
    return hvd_error_prefix("pod mode: registering '%s' in scope %s", name, scope);
  memset(&view, 0, sizeof(view));
  if ((st = rdzv_client_get_scope(store, scope, (size_t)size, -1, &view)) != HVD_OK)
    return hvd_error_prefix("pod mode: waiting for HOROVOD_SIZE=%d ranks to register in "
                            "scope %s",
                            size, scope);
  if (view.count != (size_t)size) {
    st = hvd_error(HVD_ERR_CONFLICT,
                   "pod mode: %zu ranks registered in scope %s but HOROVOD_SIZE is %d (two "
                   "jobs share the store, or the job was restarted with another size: "
                   "use a fresh store or HVD_TOKEN)",
                   view.count, scope, size);
    goto out;
  }
  qsort(view.entries, view.count, sizeof(view.entries[0]), compare_entries);
  *rank = -1;
  for (size_t i = 0; i < view.count; i++) {
    if (strcmp(view.entries[i].key, name) == 0)
      *rank = (int)i;
  }
  if (*rank < 0)
    st = hvd_error(HVD_ERR_CONFLICT, "pod mode: '%s' is missing from scope %s after registering",
                   name, scope);
  else
    HVD_LOG_INFO("pod mode: '%s' is rank %d of %d", name, *rank, size);
out:
  rdzv_scope_view_fini(&view);
  return st;
}
