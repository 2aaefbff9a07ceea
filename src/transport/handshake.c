/*
 * The fixed wire formats of a connection: HELLO, ACK and the per-message
 * header (layouts in transport_private.h). Pure encoding and decoding; the
 * state machines that use them are in ctx.c (accepting) and conn.c (dialling).
 */
#include <string.h>

#include "transport_private.h"

size_t net_hello_encode(const struct net_hello *h, unsigned char *out) {
  hvd_put_le32(out, NET_HELLO_MAGIC);
  hvd_put_le16(out + 4, h->version);
  hvd_put_le16(out + 6, h->token_len);
  hvd_put_le32(out + 8, h->comm_id);
  hvd_put_le32(out + 12, h->from);
  hvd_put_le32(out + 16, h->to);
  hvd_put_le32(out + 20, h->from_global);
  hvd_put_le64(out + 24, h->generation);
  hvd_put_le32(out + 32, 0);
  memcpy(out + NET_HELLO_FIXED, h->token, h->token_len);
  return NET_HELLO_FIXED + h->token_len;
}

hvd_status net_hello_decode_fixed(const unsigned char *in, struct net_hello *out) {
  uint32_t magic = hvd_get_le32(in);
  uint16_t token_len = hvd_get_le16(in + 6);

  if (magic != NET_HELLO_MAGIC)
    return hvd_error(HVD_ERR_PROTOCOL, "not an hvd peer (first bytes 0x%08x, expected 0x%08x)",
                     magic, NET_HELLO_MAGIC);
  if (token_len > NET_TOKEN_MAX)
    return hvd_error(HVD_ERR_PROTOCOL, "token of %u bytes exceeds the limit of %d", token_len,
                     NET_TOKEN_MAX);
  out->version = hvd_get_le16(in + 4);
  out->token_len = token_len;
  out->comm_id = hvd_get_le32(in + 8);
  out->from = hvd_get_le32(in + 12);
  out->to = hvd_get_le32(in + 16);
  out->from_global = hvd_get_le32(in + 20);
  out->generation = hvd_get_le64(in + 24);
  return HVD_OK;
}

void net_ack_encode(enum net_ack_status status, unsigned char *out) {
  hvd_put_le32(out, NET_ACK_MAGIC);
  hvd_put_le16(out + 4, NET_PROTOCOL_VERSION);
  hvd_put_le16(out + 6, (uint16_t)status);
}

hvd_status net_ack_decode(const unsigned char *in, uint16_t *version, uint16_t *status) {
  uint32_t magic = hvd_get_le32(in);
  if (magic != NET_ACK_MAGIC)
    return hvd_error(HVD_ERR_PROTOCOL, "the peer answered the handshake with 0x%08x, not an hvd ACK",
                     magic);
  *version = hvd_get_le16(in + 4);
  *status = hvd_get_le16(in + 6);
  return HVD_OK;
}

const char *net_ack_status_text(uint16_t status) {
  switch (status) {
  case NET_ACK_OK: return "accepted";
  case NET_ACK_BAD_VERSION: return "protocol version mismatch";
  case NET_ACK_BAD_TOKEN: return "wrong job token";
  case NET_ACK_BAD_GENERATION: return "different elastic generation";
  }
  return "unknown refusal";
}

void net_header_encode(uint32_t seq, uint64_t len, unsigned char *out) {
  hvd_put_le32(out, seq);
  hvd_put_le32(out + 4, NET_MSG_MAGIC);
  hvd_put_le64(out + 8, len);
}
