/*
 * Peer records: the JSON a rank publishes so its peers can connect to it.
 * The decoder trusts nothing: a record comes from another process, maybe of
 * another version, so every field is checked for type and range.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "rendezvous.h"

enum { RECORD_VERSION = 1 };

hvd_status rdzv_record_encode(const struct rdzv_record *r, struct hvd_buf *out) {
  cJSON *doc = cJSON_CreateObject();
  cJSON *addrs = cJSON_CreateArray();
  hvd_status st = HVD_OK;
  char *text = NULL;

  if (doc == NULL || addrs == NULL)
    goto oom;
  cJSON_AddNumberToObject(doc, "v", RECORD_VERSION);
  cJSON_AddNumberToObject(doc, "rank", r->rank);
  cJSON_AddNumberToObject(doc, "global_rank", r->global_rank);
  cJSON_AddStringToObject(doc, "host", r->host);
  cJSON_AddNumberToObject(doc, "local_rank", r->local_rank);
  cJSON_AddNumberToObject(doc, "pid", r->pid);
  /* A string: cJSON's numbers are doubles, which lose 64-bit integers. */
  char gen[24];
  snprintf(gen, sizeof(gen), "%llu", (unsigned long long)r->generation);
  cJSON_AddStringToObject(doc, "gen", gen);
  cJSON_AddNumberToObject(doc, "port", r->port);
  if (r->shm >= 0)
    cJSON_AddNumberToObject(doc, "shm", r->shm);
  for (size_t i = 0; i < r->naddrs; i++) {
    cJSON *a = cJSON_CreateString(r->addrs[i]);
    if (a == NULL)
      goto oom;
    cJSON_AddItemToArray(addrs, a);
  }
  cJSON_AddItemToObject(doc, "addrs", addrs);
  addrs = NULL;
  text = cJSON_PrintUnformatted(doc);
  if (text == NULL)
    goto oom;
  hvd_buf_reset(out);
  st = hvd_buf_append(out, text, strlen(text));
  cJSON_free(text);
  cJSON_Delete(doc);
  return st;
oom:
  cJSON_Delete(addrs);
  cJSON_Delete(doc);
  return hvd_error(HVD_ERR_NO_MEMORY, "cannot encode a peer record");
}

/* An integer field within [min, max]; false (with a message) otherwise. */
static bool get_int(const cJSON *doc, const char *name, double min, double max, double *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(doc, name);
  /* The range first: converting a double outside int64_t's is undefined. */
  if (!cJSON_IsNumber(item) || !(item->valuedouble >= min && item->valuedouble <= max) ||
      item->valuedouble != (double)(int64_t)item->valuedouble) {
    hvd_error(HVD_ERR_PROTOCOL, "peer record: field '%s' is missing or not an integer in [%.0f, %.0f]",
              name, min, max);
    return false;
  }
  *out = item->valuedouble;
  return true;
}

static bool get_string(const cJSON *item, const char *name, char *out, size_t size) {
  if (!cJSON_IsString(item) || item->valuestring[0] == '\0' || strlen(item->valuestring) >= size) {
    hvd_error(HVD_ERR_PROTOCOL, "peer record: field '%s' is missing, empty or longer than %zu bytes",
              name, size - 1);
    return false;
  }
  memcpy(out, item->valuestring, strlen(item->valuestring) + 1);
  return true;
}

hvd_status rdzv_record_decode(const void *text, size_t len, struct rdzv_record *out) {
  cJSON *doc = cJSON_ParseWithLength(text, len);
  const cJSON *addrs;
  struct rdzv_record r;
  double v, rank, global_rank, local_rank, pid, port, shm = -1;
  char gen_text[24];
  int64_t gen;
  hvd_status st = HVD_ERR_PROTOCOL;

  memset(&r, 0, sizeof(r));
  if (!cJSON_IsObject(doc)) {
    hvd_error(HVD_ERR_PROTOCOL, "peer record: not a JSON object (%zu bytes)", len);
    goto out;
  }
  if (!get_int(doc, "v", 0, 1e9, &v))
    goto out;
  if (v != RECORD_VERSION) {
    hvd_error(HVD_ERR_PROTOCOL,
              "peer record: version %.0f, this build reads version %d (mixed hvd versions?)", v,
              RECORD_VERSION);
    goto out;
  }
  if (!get_int(doc, "rank", 0, 1 << 24, &rank) ||
      !get_int(doc, "global_rank", 0, 1 << 24, &global_rank) ||
      !get_int(doc, "local_rank", -1, 1 << 24, &local_rank) ||
      !get_int(doc, "pid", 0, 1 << 30, &pid) || !get_int(doc, "port", 1, 65535, &port) ||
      !get_string(cJSON_GetObjectItemCaseSensitive(doc, "gen"), "gen", gen_text,
                  sizeof(gen_text)) ||
      !get_string(cJSON_GetObjectItemCaseSensitive(doc, "host"), "host", r.host, sizeof(r.host)))
    goto out;
  /* Optional: what each rank's HVD_SHM is, so that ranks that differ say
   * so before any of them waits for a shared-memory set-up. */
  if (cJSON_GetObjectItemCaseSensitive(doc, "shm") != NULL && !get_int(doc, "shm", 0, 1, &shm))
    goto out;
  if (!hvd_parse_int64(gen_text, strlen(gen_text), &gen) || gen < 0) {
    hvd_error(HVD_ERR_PROTOCOL, "peer record: 'gen' is not a non-negative decimal integer");
    goto out;
  }
  addrs = cJSON_GetObjectItemCaseSensitive(doc, "addrs");
  if (!cJSON_IsArray(addrs) || cJSON_GetArraySize(addrs) < 1 ||
      cJSON_GetArraySize(addrs) > RDZV_RECORD_MAX_ADDRS) {
    hvd_error(HVD_ERR_PROTOCOL, "peer record: 'addrs' must list 1 to %d addresses",
              RDZV_RECORD_MAX_ADDRS);
    goto out;
  }
  for (const cJSON *a = addrs->child; a != NULL; a = a->next) {
    if (!get_string(a, "addrs", r.addrs[r.naddrs], sizeof(r.addrs[0])))
      goto out;
    r.naddrs++;
  }
  r.rank = (int)rank;
  r.global_rank = (int)global_rank;
  r.local_rank = (int)local_rank;
  r.pid = (int)pid;
  r.generation = (uint64_t)gen;
  r.port = (int)port;
  r.shm = (int)shm;
  *out = r;
  st = HVD_OK;
out:
  cJSON_Delete(doc);
  return st;
}
