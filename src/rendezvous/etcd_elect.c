/*
 * Leadership in etcd (rdzv_client_lead): one key, created only where
 * absent under a short lease of the candidate's own. The holder renews
 * the lease; when it dies, the lease expires and the key with it, and the
 * candidates, each watching the key for its deletion, try again: the
 * first creation wins.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_private.h"

/* The leader's key went (its lease expired, or it resigned). */
static bool key_deleted(const cJSON *event, int64_t revision, void *arg) {
  (void)revision;
  (void)arg;
  return !rdzv_etcd_event_is_put(event);
}

hvd_status rdzv_etcd_lead(struct rdzv_client *c, const char *scope, const char *key,
                          const char *value, int ttl_s, int64_t deadline_ns) {
  struct etcd *e = etcd_of(c);
  char what[256];
  hvd_status st;

  snprintf(what, sizeof(what), "LEAD /%s/%s", scope, key);
  e->lead_ttl_s = ttl_s;
  /* a name etcd refuses, before a lease is granted for it */
  if ((st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK ||
      (st = rdzv_etcd_ready(c, deadline_ns)) != HVD_OK)
    return st;
  for (;;) {
    const cJSON *kv;
    cJSON *body;
    int64_t mod = 0;
    bool resync;

    if (e->lead_lease == 0 &&
        (st = rdzv_etcd_lease_grant(c, what, e->lead_ttl_s, deadline_ns, &e->lead_lease)) != HVD_OK)
      return st;
    if ((st = rdzv_etcd_name_key(c, scope, key)) != HVD_OK)
      return st;
    body = rdzv_etcd_txn_body(&e->keybuf, "CREATE", 0, value, strlen(value), e->lead_lease);
    if (body == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
    /* Repeated: a creation that was applied fails its compare the second
     * time, and shows our own value. */
    st = rdzv_etcd_call(c, "kv/txn", what, body, deadline_ns, true);
    cJSON_Delete(body);
    if (st == HVD_ERR_NOT_FOUND) { /* our lease expired while we waited */
      e->lead_lease = 0;
      continue;
    }
    if (st != HVD_OK)
      return st;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e->answer, "succeeded")))
      break;
    kv = rdzv_etcd_txn_current(e->answer);
    if (kv != NULL && rdzv_etcd_kv_value(&e->value, kv) && strcmp(e->value.data, value) == 0) {
      /* ours already: an earlier attempt was applied; is it our lease's? */
      int64_t lease = 0;
      if (rdzv_etcd_json_int64(kv, "lease", &lease) && lease == e->lead_lease)
        break;
    }
    if (kv != NULL && !rdzv_etcd_json_int64(kv, "mod_revision", &mod))
      return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: a malformed key in the answer",
                       c->where, what);
    if (kv == NULL)
      continue; /* gone meanwhile: try again */
    st = rdzv_etcd_watch(c, what, e->keybuf.data, e->keybuf.len, NULL, 0, mod + 1, deadline_ns,
                         key_deleted, NULL, &resync);
    if (st == HVD_ERR_TIMEOUT)
      return hvd_error(HVD_ERR_TIMEOUT, "rendezvous %s: %s: another holds it", c->where, what);
    if (st != HVD_OK)
      return st;
  }
  return rdzv_etcd_lead_renew(c);
}

hvd_status rdzv_etcd_lead_renew(struct rdzv_client *c) {
  struct etcd *e = etcd_of(c);
  bool alive;
  hvd_status st;

  if (e->lead_lease == 0)
    return hvd_error(HVD_ERR_NOT_FOUND, "rendezvous %s: this process does not lead", c->where);
  st = rdzv_etcd_lease_renew(c, "renew the leadership", e->lead_lease,
                             hvd_deadline_after_ms(e->lead_ttl_s * 1000), &alive);
  if (st != HVD_OK || alive)
    return st;
  e->lead_lease = 0;
  return hvd_error(HVD_ERR_NOT_FOUND,
                   "rendezvous %s: the leadership's lease expired (not renewed within %" PRId64
                   " s): another may lead now",
                   c->where, e->lead_ttl_s);
}

void rdzv_etcd_lead_resign(struct rdzv_client *c) {
  struct etcd *e = etcd_of(c);
  cJSON *body;
  char id[24];

  if (e->lead_lease == 0)
    return;
  snprintf(id, sizeof(id), "%" PRId64, e->lead_lease);
  e->lead_lease = 0;
  body = cJSON_CreateObject();
  if (body != NULL && cJSON_AddStringToObject(body, "ID", id) != NULL &&
      rdzv_etcd_call(c, "lease/revoke", "resign the leadership", body, hvd_deadline_after_ms(2000),
                     true) != HVD_OK)
    HVD_LOG_DEBUG("%s", hvd_last_error_message()); /* it expires by itself */
  cJSON_Delete(body);
}
