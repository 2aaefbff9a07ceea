/*
 * Peer records (src/rendezvous/record.c): JSON from another rank, maybe of
 * another version. A record that decodes must be in range, encode, and
 * decode again to the same record.
 */
#include <string.h>

#include "fuzz.h"
#include "rendezvous/rendezvous.h"

static bool same_record(const struct rdzv_record *a, const struct rdzv_record *b) {
  if (a->rank != b->rank || a->global_rank != b->global_rank || a->local_rank != b->local_rank ||
      a->pid != b->pid || a->generation != b->generation || a->port != b->port ||
      a->naddrs != b->naddrs || a->shm != b->shm || strcmp(a->host, b->host) != 0)
    return false;
  for (size_t i = 0; i < a->naddrs; i++) {
    if (strcmp(a->addrs[i], b->addrs[i]) != 0)
      return false;
  }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct rdzv_record first, second;
  struct hvd_buf text;

  if (rdzv_record_decode(data, size, &first) != HVD_OK)
    return 0;
  FUZZ_CHECK(first.rank >= 0 && first.global_rank >= 0 && first.local_rank >= -1 &&
                 first.pid >= 0 && first.port >= 1 && first.port <= 65535 &&
                 first.naddrs >= 1 && first.naddrs <= RDZV_RECORD_MAX_ADDRS &&
                 first.host[0] != '\0' && first.shm >= -1 && first.shm <= 1,
             "a decoded record is out of range");
  hvd_buf_init(&text, 0);
  FUZZ_CHECK(rdzv_record_encode(&first, &text) == HVD_OK, "%s", hvd_last_error_message());
  FUZZ_CHECK(rdzv_record_decode(text.data, text.len, &second) == HVD_OK, "%s: %s",
             hvd_last_error_message(), text.data);
  FUZZ_CHECK(same_record(&first, &second), "a record changed in a round trip: %s", text.data);
  hvd_buf_fini(&text);
  return 0;
}
