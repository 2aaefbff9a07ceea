/* etcd's JSON gateway encodings (etcd_wire.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd_wire.h"

static const char BASE64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

hvd_status etcd_base64_append(struct hvd_buf *out, const void *data, size_t len) {
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

bool etcd_base64_decode(const char *text, struct hvd_buf *out) {
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
    uint32_t bits = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                    (uint32_t)v[3];
    unsigned char bytes[3] = {(unsigned char)(bits >> 16), (unsigned char)(bits >> 8),
                              (unsigned char)bits};
    memcpy(out->data + out->len, bytes, 3 - pad);
    out->len += 3 - pad;
  }
  out->data[out->len] = '\0';
  return true;
}

bool etcd_json_int64(const cJSON *object, const char *name, int64_t *out) {
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

hvd_status etcd_json_add_bytes(cJSON *object, const char *name, const void *data, size_t len) {
  struct hvd_buf text;
  hvd_status st;

  hvd_buf_init(&text, 0);
  st = etcd_base64_append(&text, data, len);
  if (st == HVD_OK && cJSON_AddStringToObject(object, name, text.data ? text.data : "") == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "out of memory building an etcd request");
  hvd_buf_fini(&text);
  return st;
}

hvd_status etcd_key(struct hvd_buf *out, const char *prefix, const char *scope,
                    const char *key) {
  hvd_buf_reset(out);
  return hvd_buf_printf(out, "%s/%s/%s", prefix, scope, key != NULL ? key : "");
}

void etcd_range_end(const char *start, size_t len, char *end) {
  memcpy(end, start, len);
  end[len - 1] = (char)(start[len - 1] + 1);
}
