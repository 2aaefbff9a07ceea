/*
 * The transport's handshake (src/transport/handshake.c, ctx.c): the input is
 * what a stranger sends to a rank's listener. It is checked twice:
 * - the pure decoders: net_hello_decode_fixed accepts exactly the HVDT magic
 *   with a token of at most NET_TOKEN_MAX bytes and reads back what
 *   net_hello_encode writes; net_ack_decode likewise for the ACK;
 * - the accepting side for real: the bytes go over loopback to a context's
 *   listener, whose state machine (net_ctx_progress_incoming) reads the fixed
 *   part, then the token (the HELLO's variable part), and answers. Its
 *   answer must be the one the HELLO deserves (no answer for a short or
 *   foreign HELLO; an ACK naming the version, token or generation problem;
 *   acceptance and a parked socket for a good one), and it must settle
 *   (drop or park) every connection.
 * Only the HELLO's bytes are sent: the listener never reads past them, and
 * unread bytes would turn its close into a reset that can eat the ACK.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "transport/transport_private.h"

#define TOKEN "fuzz-token"
enum { GENERATION = 7, SETTLE_MS = 2000 };

static struct net_ctx *ctx;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  struct net_ctx_config cfg = {.hostname = "fuzz", .token = TOKEN, .generation = GENERATION,
                               .timeout_ms = 1000};
  (void)argc;
  (void)argv;
  hvd_log_set_level(HVD_LOG_FATAL); /* every refusal logs a warning */
  if (net_ctx_create(&cfg, &ctx) != HVD_OK) {
    fprintf(stderr, "fuzz_handshake: %s\n", hvd_last_error_message());
    exit(1);
  }
  return 0;
}

static void check_decoders(const uint8_t *data, size_t size) {
  struct net_hello h;
  unsigned char again[NET_HELLO_MAX];
  uint16_t version, status;

  if (size >= NET_HELLO_FIXED) {
    bool ok = hvd_get_le32(data) == NET_HELLO_MAGIC && hvd_get_le16(data + 6) <= NET_TOKEN_MAX;
    memset(&h, 0, sizeof(h));
    FUZZ_CHECK((net_hello_decode_fixed(data, &h) == HVD_OK) == ok, "HELLO accepted wrongly");
    if (ok && size >= NET_HELLO_FIXED + (size_t)h.token_len) {
      memcpy(h.token, data + NET_HELLO_FIXED, h.token_len);
      FUZZ_CHECK(net_hello_encode(&h, again) == NET_HELLO_FIXED + (size_t)h.token_len,
                 "HELLO length");
      /* Bytes 32..35 are reserved: written as 0, never read. */
      FUZZ_CHECK(memcmp(again, data, 32) == 0 &&
                     memcmp(again + NET_HELLO_FIXED, data + NET_HELLO_FIXED, h.token_len) == 0,
                 "a HELLO changed in a round trip");
    }
  }
  if (size >= NET_ACK_BYTES) {
    bool ok = hvd_get_le32(data) == NET_ACK_MAGIC;
    FUZZ_CHECK((net_ack_decode(data, &version, &status) == HVD_OK) == ok, "ACK accepted wrongly");
    if (ok) {
      FUZZ_CHECK(version == hvd_get_le16(data + 4) && status == hvd_get_le16(data + 6),
                 "ACK fields");
      FUZZ_CHECK(net_ack_status_text(status) != NULL, "no text for ACK status %u", status);
      net_ack_encode((enum net_ack_status)status, again);
      FUZZ_CHECK(memcmp(again, data, 4) == 0 && memcmp(again + 6, data + 6, 2) == 0 &&
                     hvd_get_le16(again + 4) == NET_PROTOCOL_VERSION,
                 "an ACK changed in a round trip");
    }
  }
}

/* What the listener must answer: -1 nothing (it closes), else an ACK status. */
static int expected_answer(const uint8_t *data, size_t size, size_t *send_len) {
  uint16_t token_len;
  *send_len = size;
  if (size < NET_HELLO_FIXED)
    return -1;
  token_len = hvd_get_le16(data + 6);
  if (hvd_get_le32(data) != NET_HELLO_MAGIC || token_len > NET_TOKEN_MAX) {
    *send_len = NET_HELLO_FIXED;
    return -1;
  }
  if (size < NET_HELLO_FIXED + (size_t)token_len)
    return -1;
  *send_len = NET_HELLO_FIXED + token_len;
  if (hvd_get_le16(data + 4) != NET_PROTOCOL_VERSION)
    return NET_ACK_BAD_VERSION;
  if (token_len != strlen(TOKEN) || memcmp(data + NET_HELLO_FIXED, TOKEN, token_len) != 0)
    return NET_ACK_BAD_TOKEN;
  if (hvd_get_le64(data + 24) != GENERATION)
    return NET_ACK_BAD_GENERATION;
  return NET_ACK_OK;
}

static void check_listener(const uint8_t *data, size_t size) {
  size_t send_len, got = 0, sent = 0;
  int want = expected_answer(data, size, &send_len);
  int fd = fuzz_dial(net_ctx_port(ctx));
  int64_t deadline = hvd_deadline_after_ms(SETTLE_MS);
  unsigned char answer[64];
  bool eof = false;

  while (sent < send_len) {
    ssize_t n = send(fd, data + sent, send_len - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    FUZZ_CHECK(n > 0, "send: %s", strerror(errno));
    sent += (size_t)n;
  }
  shutdown(fd, SHUT_WR);
  for (;;) {
    bool progressed = false;
    ssize_t n;
    net_ctx_progress_incoming(ctx, &progressed);
    n = recv(fd, answer + got, sizeof(answer) - got, MSG_DONTWAIT);
    if (n > 0) {
      got += (size_t)n;
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      eof = true;
      break;
    }
    if (got >= NET_ACK_BYTES && ctx->handshaking.n == 0)
      break; /* accepted and parked: the listener keeps the socket */
    FUZZ_CHECK(hvd_now_ns() < deadline, "the handshake did not settle within %d ms",
               SETTLE_MS);
    if (!progressed)
      poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 1);
  }
  if (want < 0) {
    FUZZ_CHECK(eof && got == 0, "a short or foreign HELLO got %zu bytes back", got);
  } else {
    uint16_t version, status;
    FUZZ_CHECK(got == NET_ACK_BYTES, "an ACK of %zu bytes", got);
    FUZZ_CHECK(net_ack_decode(answer, &version, &status) == HVD_OK, "%s",
               hvd_last_error_message());
    FUZZ_CHECK(version == NET_PROTOCOL_VERSION && status == want, "ACK %u for a HELLO worth %d",
               status, want);
    FUZZ_CHECK(eof == (want != NET_ACK_OK), "a %s connection was %s",
               want == NET_ACK_OK ? "accepted" : "refused", eof ? "closed" : "kept");
  }
  if (want == NET_ACK_OK) {
    /* Our half-close makes the claim drop the socket instead of handing it over. */
    int claimed = net_ctx_claim(ctx, hvd_get_le32(data + 8), hvd_get_le32(data + 12),
                            hvd_get_le32(data + 16));
    if (claimed >= 0)
      close(claimed);
  }
  FUZZ_CHECK(ctx->handshaking.n == 0 && ctx->parked.n == 0,
             "%zu handshakes and %zu parked sockets left", ctx->handshaking.n, ctx->parked.n);
  close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  check_decoders(data, size);
  check_listener(data, size);
  return 0;
}
