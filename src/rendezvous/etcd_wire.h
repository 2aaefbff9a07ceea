/*
 * etcd's v3 JSON gateway, the pieces of its wire form the client needs:
 * keys and values travel base64-encoded, 64-bit numbers as decimal
 * strings, and a scope is the range of keys "<prefix>/<scope>/".
 */
#ifndef HVD_RENDEZVOUS_ETCD_WIRE_H
#define HVD_RENDEZVOUS_ETCD_WIRE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* Appends the base64 (RFC 4648, padded) of data to out. */
hvd_status rdzv_etcd_base64_append(struct hvd_buf *out, const void *data, size_t len);
/* Decodes text into out (reset first; NUL-terminated after len bytes).
 * false for text that is not padded base64. */
bool rdzv_etcd_base64_decode(const char *text, struct hvd_buf *out);

/* A field of a JSON answer holding a 64-bit number, as etcd writes them
 * (a decimal string; absent means 0). false for anything else. */
bool rdzv_etcd_json_int64(const cJSON *object, const char *name, int64_t *out);

/* Adds "name": base64(data) to object. */
hvd_status rdzv_etcd_json_add_bytes(cJSON *object, const char *name, const void *data, size_t len);

/* Whether a watch event is a put (etcd leaves a put's type out; a
 * deletion says "DELETE"). */
bool rdzv_etcd_event_is_put(const cJSON *event);
/* The first kv of a range answer, or NULL. */
const cJSON *rdzv_etcd_first_kv(const cJSON *range_answer);
/* A kv's value, decoded into out; false when there is none. */
bool rdzv_etcd_kv_value(struct hvd_buf *out, const cJSON *kv);
/* A range request of one key, or of [key, end). NULL when out of memory. */
cJSON *rdzv_etcd_range_body(const struct hvd_buf *key, const struct hvd_buf *end);
/* A transaction on one key: if its `target` revision ("CREATE" or "MOD")
 * equals `revision`, put value (under the lease, if not 0); else read the
 * key. NULL when out of memory. */
cJSON *rdzv_etcd_txn_body(const struct hvd_buf *key, const char *target, int64_t revision,
                          const void *value, size_t len, int64_t lease);
/* The kv a failed etcd_txn_body read, or NULL when the key was absent. */
const cJSON *rdzv_etcd_txn_current(const cJSON *answer);

/* "<prefix>/<scope>/<key>" into out (reset first); key NULL: the scope's
 * range start "<prefix>/<scope>/". */
hvd_status rdzv_etcd_key(struct hvd_buf *out, const char *prefix, const char *scope,
                         const char *key);
/* The end of the range of keys that start with `start`: its last byte
 * plus one (start never ends in 0xff here: it ends in '/'). */
void rdzv_etcd_range_end(const char *start, size_t len, char *end);

#endif
