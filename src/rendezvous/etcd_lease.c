/*
 * The job's lease (etcd_private.h). Every key of the job is written under
 * it, so that a dead job's keys expire by themselves. The first process
 * to need it grants one and publishes its id at <prefix>/_lease, a key
 * attached to that lease (it goes when the lease does) and created only
 * if absent, so all processes of the job agree on one; each renews it
 * when a third of its time has passed while it uses the store.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_private.h"

/* A lease call: body {"<field>": "<value>"} to lease/<path>. */
static hvd_status lease_call(struct rdzv_client *c, const char *path, const char *what,
                             const char *field, int64_t value, bool idempotent,
                             int64_t deadline_ns) {
  cJSON *body = cJSON_CreateObject();
  char text[24];
  hvd_status st;

  snprintf(text, sizeof(text), "%" PRId64, value);
  if (body == NULL || cJSON_AddStringToObject(body, field, text) == NULL) {
    cJSON_Delete(body);
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  }
  st = rdzv_etcd_call(c, path, what, body, deadline_ns, idempotent);
  cJSON_Delete(body);
  return st;
}

hvd_status rdzv_etcd_lease_grant(struct rdzv_client *c, const char *what, int64_t ttl_s,
                                 int64_t deadline_ns, int64_t *id) {
  hvd_status st = lease_call(c, "lease/grant", what, "TTL", ttl_s, false, deadline_ns);
  if (st == HVD_OK && (!rdzv_etcd_json_int64(etcd_of(c)->answer, "ID", id) || *id == 0))
    st =
        hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s: no lease id in the answer", c->where, what);
  return st;
}

hvd_status rdzv_etcd_lease_renew(struct rdzv_client *c, const char *what, int64_t id,
                                 int64_t deadline_ns, bool *alive) {
  int64_t ttl = 0;
  hvd_status st = lease_call(c, "lease/keepalive", what, "ID", id, true, deadline_ns);
  /* an expired lease's answer has no TTL */
  *alive = st == HVD_OK &&
           rdzv_etcd_json_int64(cJSON_GetObjectItemCaseSensitive(etcd_of(c)->answer, "result"),
                                "TTL", &ttl) &&
           ttl > 0;
  return st;
}

/* The lease id a "<prefix>/_lease" kv holds, or 0. */
static int64_t lease_of(struct etcd *e, const cJSON *kv) {
  int64_t id = 0;
  if (!rdzv_etcd_kv_value(&e->value, kv) || !hvd_parse_int64(e->value.data, e->value.len, &id))
    return 0;
  return id;
}

/* Grants a lease and makes it the job's unless another process was first. */
static hvd_status establish_lease(struct rdzv_client *c, const char *what,
                                  const struct hvd_buf *key, int64_t deadline_ns) {
  struct etcd *e = etcd_of(c);
  cJSON *body;
  char id[24];
  int64_t granted = 0;
  hvd_status st = rdzv_etcd_lease_grant(c, what, e->lease_ttl_s, deadline_ns, &granted);

  if (st != HVD_OK)
    return st;
  snprintf(id, sizeof(id), "%" PRId64, granted);
  if ((body = rdzv_etcd_txn_body(key, "CREATE", 0, id, strlen(id), granted)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  st = rdzv_etcd_call(c, "kv/txn", what, body, deadline_ns, true);
  cJSON_Delete(body);
  if (st != HVD_OK)
    return st;
  /* Another process was first: its lease is the job's (ours, unused,
   * expires by itself). */
  if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e->answer, "succeeded")) &&
      (granted = lease_of(e, rdzv_etcd_txn_current(e->answer))) == 0)
    return hvd_error(HVD_ERR_PROTOCOL, "rendezvous %s: %s does not hold a lease id", c->where,
                     key->data);
  e->lease = granted;
  e->lease_renewed_ns = hvd_now_ns();
  return HVD_OK;
}

hvd_status rdzv_etcd_keep_lease(struct rdzv_client *c, const char *what, bool write,
                                int64_t deadline_ns) {
  struct etcd *e = etcd_of(c);
  struct hvd_buf key;
  cJSON *body;
  hvd_status st;

  /* Known and renewed lately, or looked for lately by a reader. */
  if ((e->lease != 0 || !write) &&
      hvd_now_ns() - e->lease_renewed_ns < e->lease_ttl_s * 1000000000 / 3)
    return HVD_OK;
  if (e->lease != 0) {
    bool alive;
    if ((st = rdzv_etcd_lease_renew(c, what, e->lease, deadline_ns, &alive)) != HVD_OK)
      return st;
    if (alive) {
      e->lease_renewed_ns = hvd_now_ns();
      return HVD_OK;
    }
    e->lease = 0; /* it expired, and the job's keys with it: a new one */
  }
  hvd_buf_init(&key, 0);
  st = hvd_buf_printf(&key, "%s/_lease", e->prefix);
  body = st == HVD_OK ? rdzv_etcd_range_body(&key, NULL) : NULL;
  if (st == HVD_OK && body == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  if (st == HVD_OK)
    st = rdzv_etcd_call(c, "kv/range", what, body, deadline_ns, true);
  cJSON_Delete(body);
  if (st == HVD_OK && (e->lease = lease_of(e, rdzv_etcd_first_kv(e->answer))) != 0) {
    /* Renewed within a third of its time; should it expire sooner, a put
     * under it fails, and the put finds or makes the next one. */
    e->lease_renewed_ns = hvd_now_ns();
  } else if (st == HVD_OK && write) {
    st = establish_lease(c, what, &key, deadline_ns);
  } else if (st == HVD_OK) {
    e->lease_renewed_ns = hvd_now_ns(); /* none yet: a reader makes none */
  }
  hvd_buf_fini(&key);
  return st;
}
