/*
 * The rendezvous store's HTTP handling (src/rendezvous/server.c on
 * libmicrohttpd): paths, query strings, headers, bodies. One server runs
 * in-process on 127.0.0.1; each input is the byte stream of one fresh TCP
 * connection (so several pipelined requests are fine), half-closed, and
 * whatever comes back is read until the server closes, nothing comes for
 * IDLE_MS, or READ_MS passes. (libmicrohttpd can miss the FIN of a
 * connection that sent everything at once and keep it until its idle
 * deadline.)
 * An answer must start with an HTTP status line and may not be a 500.
 * The store is emptied after each input so that inputs stay independent.
 *
 * Long-polls are the cost to manage: a GET with ?wait (or of the blocking
 * scope) that cannot finish parks in the store, after the client has gone,
 * until its deadline or until the server notices. Parked requests are
 * counted in the store's stats; past MAX_WAITERS the server is restarted,
 * which answers them all. Every HEALTH_EVERY inputs, and after each
 * restart, GET /_health must answer 200.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "rendezvous/rendezvous.h"

enum {
  READ_MS = 300, /* at most, for one input's answers */
  IDLE_MS = 20,  /* answers come back to back: this long without one ends it */
  HEALTH_EVERY = 256,
  MAX_WAITERS = 64,
  ANSWER_MAX = 1 << 16, /* bytes of answer kept for the checks */
};

static struct rdzv_server *srv;
static unsigned long inputs;
static bool verbose;

static void start(void) {
  struct rdzv_server_config cfg;
  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  cfg.threads = 1;            /* the fuzzer has one core */
  cfg.idle_timeout_s = 1;     /* so that no input costs seconds */
  cfg.header_timeout_ms = 300;
  cfg.max_header_bytes = 8192;
  cfg.limits.max_name_bytes = 64;      /* small limits, so inputs reach them */
  cfg.limits.max_value_bytes = 1024;
  cfg.limits.max_total_bytes = 4096;
  cfg.blocking_scope = "blocking";
  if (rdzv_server_start(&cfg, &srv) != HVD_OK) {
    fprintf(stderr, "fuzz_http: %s\n", hvd_last_error_message());
    exit(1);
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  hvd_log_set_level(HVD_LOG_FATAL);
  verbose = getenv("FUZZ_HTTP_VERBOSE") != NULL;
  start();
  return 0;
}

/* Sends what the server takes (it may answer and close before the end),
 * half-closes, reads the answers (see above). Returns the bytes kept. */
static size_t exchange(const uint8_t *data, size_t size, char *answer, size_t cap) {
  int fd = fuzz_dial(rdzv_server_port(srv));
  int64_t deadline = hvd_deadline_after_ms(READ_MS);
  size_t sent = 0, got = 0;

  while (sent < size) {
    ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    sent += (size_t)n;
  }
  shutdown(fd, SHUT_WR);
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char sink[4096];
    int64_t left = hvd_remaining_ms(deadline);
    ssize_t n;
    int ready = poll(&p, 1, (int)(left < IDLE_MS ? left : IDLE_MS));
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready <= 0)
      break;
    n = got < cap ? recv(fd, answer + got, cap - got, 0) : recv(fd, sink, sizeof(sink), 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    if (got < cap)
      got += (size_t)n;
  }
  close(fd);
  return got;
}

/* The first answer starts with a status line and is no 500. (Later
 * answers of pipelined requests are not looked for: a body may echo a
 * stored value that looks like one.) */
static void check_answer(const char *a, size_t len) {
  static const char first[] = "HTTP/1.";
  if (len == 0)
    return; /* closed without an answer: fine for garbage */
  FUZZ_CHECK(len >= 12 && memcmp(a, first, sizeof(first) - 1) == 0,
             "the answer does not start with a status line: '%.*s'", (int)(len < 40 ? len : 40),
             a);
  FUZZ_CHECK(memcmp(a + 8, " 500", 4) != 0, "an internal error: '%.*s'",
             (int)(len < 300 ? len : 300), a);
}

static void check_health(void) {
  static const char req[] = "GET /_health HTTP/1.1\r\nHost: x\r\n\r\n";
  char answer[2048];
  size_t got = exchange((const uint8_t *)req, sizeof(req) - 1, answer, sizeof(answer) - 1);
  answer[got] = '\0';
  FUZZ_CHECK(strncmp(answer, "HTTP/1.1 200", 12) == 0, "the server is unhealthy: '%.100s'",
             answer);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static char answer[ANSWER_MAX];
  struct rdzv_store_stats stats;
  size_t got = exchange(data, size, answer, sizeof(answer));

  if (verbose) /* FUZZ_HTTP_VERBOSE=1: what came back, to check a seed */
    fprintf(stderr, "fuzz_http: %zu bytes back: %.*s\n", got, (int)(got < 2000 ? got : 2000),
            answer);
  check_answer(answer, got);
  rdzv_store_reset(rdzv_server_store(srv));
  rdzv_store_get_stats(rdzv_server_store(srv), &stats);
  if (stats.waiters > MAX_WAITERS) {
    rdzv_server_stop(srv);
    start();
    check_health();
  } else if (++inputs % HEALTH_EVERY == 0) {
    check_health();
  }
  return 0;
}
