/* etcd's JSON gateway encodings (etcd_wire.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_wire.h"

static const char BASE64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

hvd_status rdzv_etcd_base64_append(struct hvd_buf *out, const void *data, size_t len) {
  const unsigned char *p = data;
  size_t need = (len + 2) / 3 * 4;
  hvd_status st = hvd_buf_reserve(out, need + 1);

  if (st != HVD_OK)
    return st;
  char *o = out->data + out->len;
  for (size_t i = 0; i < len; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16;
    if (i + 1 < len)
      v |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < len)
      v |= p[i + 2];
    *o++ = BASE64[v >> 18 & 63];
    *o++ = BASE64[v >> 12 & 63];
    *o++ = i + 1 < len ? BASE64[v >> 6 & 63] : '=';
    *o++ = i + 2 < len ? BASE64[v & 63] : '=';
  }
  out->len += need;
  out->data[out->len] = '\0';
  return HVD_OK;
}

static int base64_value(char ch) {
  const char *at = ch != '\0' ? strchr(BASE64, ch) : NULL;
  return at != NULL ? (int)(at - BASE64) : -1;
}

bool rdzv_etcd_base64_decode(const char *text, struct hvd_buf *out) {
  size_t len = strlen(text);

  hvd_buf_reset(out);
  if (len % 4 != 0 || hvd_buf_reserve(out, len / 4 * 3 + 1) != HVD_OK)
    return false;
  for (size_t i = 0; i < len; i += 4) {
    int v[4];
    size_t pad = 0;
    for (size_t k = 0; k < 4; k++) {
      char ch = text[i + k];
      bool last = i + 4 == len;
      if (ch == '=' && last && k >= 2 && (k == 3 || text[i + 3] == '=')) {
        v[k] = 0;
        pad++;
      } else if ((v[k] = base64_value(ch)) < 0) {
        return false;
      }
    }
    uint32_t bits =
        (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
    unsigned char bytes[3] = {(unsigned char)(bits >> 16), (unsigned char)(bits >> 8),
                              (unsigned char)bits};
    memcpy(out->data + out->len, bytes, 3 - pad);
    out->len += 3 - pad;
  }
  out->data[out->len] = '\0';
  return true;
}

bool rdzv_etcd_json_int64(const cJSON *object, const char *name, int64_t *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, name);

  if (item == NULL) {
    *out = 0;
    return true;
  }
  if (cJSON_IsString(item))
    return hvd_parse_int64(item->valuestring, strlen(item->valuestring), out);
  if (cJSON_IsNumber(item) && item->valuedouble == (double)(int64_t)item->valuedouble) {
    *out = (int64_t)item->valuedouble;
    return true;
  }
  return false;
}

hvd_status rdzv_etcd_json_add_bytes(cJSON *object, const char *name, const void *data, size_t len) {
  struct hvd_buf text;
  hvd_status st;

  hvd_buf_init(&text, 0);
  st = rdzv_etcd_base64_append(&text, data, len);
  if (st == HVD_OK && cJSON_AddStringToObject(object, name, text.data ? text.data : "") == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd request");
  hvd_buf_fini(&text);
  return st;
}

hvd_status rdzv_etcd_key(struct hvd_buf *out, const char *prefix, const char *scope,
                         const char *key) {
  hvd_buf_reset(out);
  return hvd_buf_printf(out, "%s/%s/%s", prefix, scope, key != NULL ? key : "");
}

void rdzv_etcd_range_end(const char *start, size_t len, char *end) {
  memcpy(end, start, len);
  end[len - 1] = (char)(start[len - 1] + 1);
}

bool rdzv_etcd_event_is_put(const cJSON *event) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(event, "type");
  return type == NULL || (cJSON_IsString(type) && strcmp(type->valuestring, "PUT") == 0);
}

const cJSON *rdzv_etcd_first_kv(const cJSON *range_answer) {
  return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(range_answer, "kvs"), 0);
}

cJSON *rdzv_etcd_range_body(const struct hvd_buf *key, const struct hvd_buf *end) {
  cJSON *body = cJSON_CreateObject();
  if (body != NULL && (rdzv_etcd_json_add_bytes(body, "key", key->data, key->len) != HVD_OK ||
                       (end != NULL && rdzv_etcd_json_add_bytes(body, "range_end", end->data,
                                                                end->len) != HVD_OK))) {
    cJSON_Delete(body);
    return NULL;
  }
  return body;
}

cJSON *rdzv_etcd_txn_body(const struct hvd_buf *key, const char *target, int64_t revision,
                          const void *value, size_t len, int64_t lease) {
  cJSON *body = cJSON_CreateObject();
  cJSON *cmp = cJSON_CreateObject(), *yes = cJSON_CreateObject(), *no = cJSON_CreateObject();
  cJSON *put = cJSON_AddObjectToObject(yes, "request_put");
  cJSON *get = cJSON_AddObjectToObject(no, "request_range");
  char rev[24], id[24];
  bool ok = body != NULL && cmp != NULL && yes != NULL && no != NULL && put != NULL && get != NULL;

  snprintf(rev, sizeof(rev), "%" PRId64, revision);
  snprintf(id, sizeof(id), "%" PRId64, lease);
  ok = ok && rdzv_etcd_json_add_bytes(cmp, "key", key->data, key->len) == HVD_OK &&
       cJSON_AddStringToObject(cmp, "target", target) != NULL &&
       cJSON_AddStringToObject(cmp, "result", "EQUAL") != NULL &&
       cJSON_AddStringToObject(
           cmp, strcmp(target, "CREATE") == 0 ? "create_revision" : "mod_revision", rev) != NULL &&
       rdzv_etcd_json_add_bytes(put, "key", key->data, key->len) == HVD_OK &&
       rdzv_etcd_json_add_bytes(put, "value", value, len) == HVD_OK &&
       (lease == 0 || cJSON_AddStringToObject(put, "lease", id) != NULL) &&
       rdzv_etcd_json_add_bytes(get, "key", key->data, key->len) == HVD_OK;
  if (ok) {
    cJSON *compare = cJSON_AddArrayToObject(body, "compare");
    cJSON *success = cJSON_AddArrayToObject(body, "success");
    cJSON *failure = cJSON_AddArrayToObject(body, "failure");
    ok = compare != NULL && success != NULL && failure != NULL &&
         cJSON_AddItemToArray(compare, cmp) && cJSON_AddItemToArray(success, yes) &&
         cJSON_AddItemToArray(failure, no);
    if (ok)
      return body;
  }
  cJSON_Delete(body);
  cJSON_Delete(cmp);
  cJSON_Delete(yes);
  cJSON_Delete(no);
  return NULL;
}

const cJSON *rdzv_etcd_txn_current(const cJSON *answer) {
  const cJSON *resp = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(answer, "responses"), 0);
  return rdzv_etcd_first_kv(cJSON_GetObjectItemCaseSensitive(resp, "response_range"));
}

bool rdzv_etcd_kv_value(struct hvd_buf *out, const cJSON *kv) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
  if (kv == NULL)
    return false;
  if (v == NULL) { /* etcd leaves an empty value out */
    hvd_buf_reset(out);
    if (hvd_buf_reserve(out, 0) != HVD_OK)
      return false;
    out->data[0] = '\0';
    return true;
  }
  return cJSON_IsString(v) && rdzv_etcd_base64_decode(v->valuestring, out);
}
