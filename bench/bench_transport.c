/*
 * hvd-bench-transport: the transport between two ranks against a plain TCP
 * socket pair, in the same run.
 *
 * DESIGN. The parent starts a rendezvous store in-process and a listening
 * socket on 127.0.0.1, then forks two ranks. Each rank builds a 2-rank
 * net_world through the store (the "hvd" side: net_send, net_recv and
 * net_sendrecv on the global communicator) and also opens one TCP
 * connection to the other rank through that listener (the "raw" side: a
 * blocking socket with TCP_NODELAY, send(MSG_NOSIGNAL)/recv loops and the
 * kernel's default buffers, the code anyone would write). Three tests:
 *
 *   latency  rank 0 sends S bytes, rank 1 receives and sends them back;
 *            time per round trip.
 *   uni      rank 0 sends S bytes `n` times, rank 1 receives them and
 *            answers with a 1-byte ack; time per transfer, until the ack.
 *   bi       both ranks send S bytes to each other at once, `n` times (hvd:
 *            net_sendrecv; raw: a persistent sender thread per process, or
 *            poll() with --raw-bidi poll), then a 1-byte ack; time per
 *            exchange.
 *
 * Every sample starts with a control message over the transport under test
 * (rank 0 tells rank 1 the test, size and count; rank 1 answers with the
 * verdict of its data checks so far), which also lines the ranks up. Bulk
 * samples then do one untimed transfer and a 1-byte barrier before the
 * clock starts; latency samples do 100 untimed round trips. Rank 0 keeps
 * the clock. Within a repetition, each size runs on both transports back
 * to back (hvd first on odd repetitions, raw first on even ones), so that
 * noise on a shared machine hits both alike; tables give medians over the
 * repetitions.
 *
 * Data checks: every message carries a per-message stamp in its first and
 * last 8 bytes (compared as it arrives: two loads), and a rank-specific
 * byte pattern (period 251) in between, checked in full after each sample,
 * outside the timed region. The receive buffer is zeroed before each sample,
 * so stale data cannot pass. Any failed check fails the run (exit 1) and
 * suppresses the tables.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rendezvous/rendezvous.h"
#include "transport/transport_private.h" /* only to read the hvd socket's buffer sizes */

enum {
  EXIT_FAILED = 1,
  EXIT_USAGE = 2,
  /* rank exit codes, reported by the parent */
  EXIT_SETUP = 10,
  EXIT_WRONG = 11,
  EXIT_OP = 12,

  MAX_SIZES = 32,
  MAX_REPEAT = 1000,
  OP_TIMEOUT_MS = 60 * 1000,   /* no progress for this long fails an operation */
  CONTROL_BYTES = 24,          /* test u64 | size u64 | count u64 */
  LAT_WARMUP = 100,            /* untimed round trips per latency sample */
  LAT_CALIBRATE = 200,         /* raw round trips that size the latency samples */
  LAT_MIN_ROUND_TRIPS = 1000,
  LAT_MAX_ROUND_TRIPS = 2000000,
  BW_MIN_TRANSFERS = 2,
  BW_MAX_TRANSFERS = 20000,    /* tiny --sizes would otherwise run for hours */
  PATTERN_PERIOD = 251,        /* prime, so an offset error shows */
  REF_CHUNK = 64 * 1024,
};

#define KIB ((size_t)1024)
#define MIB (KIB * 1024)
#define GIB (MIB * 1024)
#define MAX_SIZE GIB
#define LAT_SAMPLE_NS 300000000.0   /* a latency sample lasts about 0.3 s */
#define BW_SAMPLE_BYTES (512 * MIB) /* a bandwidth sample moves this much per direction */

enum test { TEST_LATENCY = 0, TEST_UNI = 1, TEST_BI = 2, TEST_COUNT = 3 };
enum { XP_HVD = 0, XP_RAW = 1, XP_COUNT = 2 };
enum raw_bidi { RAW_BIDI_THREAD, RAW_BIDI_POLL };

static const char *const test_names[TEST_COUNT] = {"latency", "uni", "bi"};

static const char usage_text[] =
    "usage: hvd-bench-transport [options]\n"
    "\n"
    "Measures the hvd transport between two forked ranks on loopback against a plain\n"
    "TCP socket pair (blocking, TCP_NODELAY) in the same run: ping-pong latency,\n"
    "unidirectional and bidirectional bandwidth. Reads HVD_SPIN_US and\n"
    "HVD_SOCKET_BUFFER_BYTES as the transport does.\n"
    "\n"
    "options:\n"
    "  --test T            latency, uni, bi or all (default all)\n"
    "  --repeat K          repetitions of every size (default 5)\n"
    "  --sizes S,S,...     message sizes for the chosen tests, bytes with an optional\n"
    "                      K, M or G suffix (KiB, MiB, GiB); default 8,64,512,4K for\n"
    "                      latency and 1M,4M,16M,64M,256M for uni and bi\n"
    "  --raw-bidi MODE     how the raw pair sends and receives at once: thread (one\n"
    "                      sender thread per process, default) or poll\n"
    "  --timeout S         kill the ranks after S seconds (default 1800)\n"
    "  -v, --verbose       print every sample\n"
    "  -h, --help          print this help and exit\n"
    "\n"
    "Exits 0 when every sample verified, 1 on a failure, 2 on bad flags.\n";

struct options {
  bool tests[TEST_COUNT];
  size_t sizes[MAX_SIZES]; /* --sizes, for every chosen test */
  size_t nsizes;           /* 0: the defaults */
  unsigned repeat;
  enum raw_bidi raw_bidi;
  int timeout_s;
  bool verbose;
};

static const size_t default_lat_sizes[] = {8, 64, 512, 4 * KIB};
static const size_t default_bw_sizes[] = {1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB};

/* ---- arguments ---------------------------------------------------------------- */

static int HVD_PRINTF(1, 2) usage_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "hvd-bench-transport: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see hvd-bench-transport --help)\n");
  return EXIT_USAGE;
}

static bool parse_number(const char *text, size_t len, int64_t min, int64_t max, int64_t *out) {
  return hvd_parse_int64(text, len, out) && *out >= min && *out <= max;
}

/* "4096", "4K", "64M", "1G". */
static bool parse_size(const char *text, size_t len, size_t *out) {
  size_t unit = 1;
  int64_t n;

  if (len > 0) {
    switch (text[len - 1]) {
    case 'K': case 'k': unit = KIB; break;
    case 'M': case 'm': unit = MIB; break;
    case 'G': case 'g': unit = GIB; break;
    default: break;
    }
  }
  if (unit != 1)
    len--;
  if (!parse_number(text, len, 1, (int64_t)(MAX_SIZE / unit), &n))
    return false;
  *out = (size_t)n * unit;
  return true;
}

static int parse_sizes(struct options *o, const char *arg) {
  const char *p = arg;

  o->nsizes = 0;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);

    if (o->nsizes == MAX_SIZES)
      return usage_error("--sizes '%s': at most %d sizes", arg, MAX_SIZES);
    if (!parse_size(p, len, &o->sizes[o->nsizes]))
      return usage_error("--sizes '%s' must be a comma list of sizes in 1..1G (suffix K, M or G)",
                         arg);
    o->nsizes++;
    if (comma == NULL)
      return 0;
    p = comma + 1;
  }
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, struct options *o) {
  enum { OPT_TEST = 256, OPT_REPEAT, OPT_SIZES, OPT_RAW_BIDI, OPT_TIMEOUT };
  static const struct option longopts[] = {
      {"test", required_argument, NULL, OPT_TEST},
      {"repeat", required_argument, NULL, OPT_REPEAT},
      {"sizes", required_argument, NULL, OPT_SIZES},
      {"raw-bidi", required_argument, NULL, OPT_RAW_BIDI},
      {"timeout", required_argument, NULL, OPT_TIMEOUT},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int opt;
  int64_t n;

  opterr = 0;
  while ((opt = getopt_long(argc, argv, ":hv", longopts, NULL)) != -1) {
    switch (opt) {
    case OPT_TEST:
      memset(o->tests, 0, sizeof(o->tests));
      if (strcmp(optarg, "all") == 0) {
        for (int t = 0; t < TEST_COUNT; t++)
          o->tests[t] = true;
        break;
      }
      for (int t = 0; t < TEST_COUNT; t++)
        o->tests[t] = strcmp(optarg, test_names[t]) == 0;
      if (!o->tests[TEST_LATENCY] && !o->tests[TEST_UNI] && !o->tests[TEST_BI])
        return usage_error("--test '%s' must be latency, uni, bi or all", optarg);
      break;
    case OPT_REPEAT:
      if (!parse_number(optarg, strlen(optarg), 1, MAX_REPEAT, &n))
        return usage_error("--repeat '%s' must be 1-%d", optarg, MAX_REPEAT);
      o->repeat = (unsigned)n;
      break;
    case OPT_SIZES:
      if (parse_sizes(o, optarg) != 0)
        return EXIT_USAGE;
      break;
    case OPT_RAW_BIDI:
      if (strcmp(optarg, "thread") == 0)
        o->raw_bidi = RAW_BIDI_THREAD;
      else if (strcmp(optarg, "poll") == 0)
        o->raw_bidi = RAW_BIDI_POLL;
      else
        return usage_error("--raw-bidi '%s' must be thread or poll", optarg);
      break;
    case OPT_TIMEOUT:
      if (!parse_number(optarg, strlen(optarg), 1, 86400, &n))
        return usage_error("--timeout '%s' must be 1-86400 seconds", optarg);
      o->timeout_s = (int)n;
      break;
    case 'v':
      o->verbose = true;
      break;
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    case ':':
      return usage_error("option %s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  return -1;
}

/* The sizes a test runs. */
static const size_t *test_sizes(const struct options *o, enum test t, size_t *n) {
  if (o->nsizes > 0) {
    *n = o->nsizes;
    return o->sizes;
  }
  if (t == TEST_LATENCY) {
    *n = sizeof(default_lat_sizes) / sizeof(default_lat_sizes[0]);
    return default_lat_sizes;
  }
  *n = sizeof(default_bw_sizes) / sizeof(default_bw_sizes[0]);
  return default_bw_sizes;
}

static void format_size(size_t size, char *out, size_t out_size) {
  if (size >= GIB && size % GIB == 0)
    snprintf(out, out_size, "%zu GiB", size / GIB);
  else if (size >= MIB && size % MIB == 0)
    snprintf(out, out_size, "%zu MiB", size / MIB);
  else if (size >= KIB && size % KIB == 0)
    snprintf(out, out_size, "%zu KiB", size / KIB);
  else
    snprintf(out, out_size, "%zu B", size);
}

/* ---- the raw socket pair --------------------------------------------------------- */

static hvd_status raw_send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;

  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return hvd_error(HVD_ERR_NETWORK, "raw socket: send: %s", strerror(errno));
    }
    p += n;
    len -= (size_t)n;
  }
  return HVD_OK;
}

static hvd_status raw_recv_all(int fd, void *buf, size_t len) {
  char *p = buf;

  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n == 0)
      return hvd_error(HVD_ERR_NETWORK, "raw socket: the other rank closed the connection");
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return hvd_error(HVD_ERR_TIMEOUT, "raw socket: nothing arrived for %d s",
                         OP_TIMEOUT_MS / 1000);
      return hvd_error(HVD_ERR_NETWORK, "raw socket: recv: %s", strerror(errno));
    }
    p += n;
    len -= (size_t)n;
  }
  return HVD_OK;
}

/* Bidirectional with poll(): one thread, MSG_DONTWAIT on the blocking socket. */
static hvd_status raw_exchange_poll(int fd, const void *sbuf, void *rbuf, size_t len) {
  const char *s = sbuf;
  char *r = rbuf;
  size_t sent = 0, got = 0;

  while (sent < len || got < len) {
    struct pollfd p = {.fd = fd,
                       .events = (short)((sent < len ? POLLOUT : 0) | (got < len ? POLLIN : 0))};
    int rc = poll(&p, 1, OP_TIMEOUT_MS);
    ssize_t n;

    if (rc < 0 && errno == EINTR)
      continue;
    if (rc < 0)
      return hvd_error(HVD_ERR_IO, "raw socket: poll: %s", strerror(errno));
    if (rc == 0)
      return hvd_error(HVD_ERR_TIMEOUT, "raw socket: no progress for %d s", OP_TIMEOUT_MS / 1000);
    if (got < len && (p.revents & (POLLIN | POLLERR | POLLHUP))) {
      n = recv(fd, r + got, len - got, MSG_DONTWAIT);
      if (n == 0)
        return hvd_error(HVD_ERR_NETWORK, "raw socket: the other rank closed the connection");
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return hvd_error(HVD_ERR_NETWORK, "raw socket: recv: %s", strerror(errno));
      if (n > 0)
        got += (size_t)n;
    }
    if (sent < len && (p.revents & (POLLOUT | POLLERR))) {
      n = send(fd, s + sent, len - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return hvd_error(HVD_ERR_NETWORK, "raw socket: send: %s", strerror(errno));
      if (n > 0)
        sent += (size_t)n;
    }
  }
  return HVD_OK;
}

/* Bidirectional with threads: a persistent thread sends what it is handed
 * while the caller receives. */
struct sender {
  int fd;
  pthread_t thread;
  bool started;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  /* protected by mu */
  const void *buf;
  size_t len;
  bool pending; /* handed over, not sent yet */
  bool quit;
  hvd_status status;
  char error[HVD_ERROR_MESSAGE_MAX];
};

static void *sender_main(void *arg) {
  struct sender *s = arg;

  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->pending && !s->quit)
      pthread_cond_wait(&s->cond, &s->mu);
    if (!s->pending)
      break;
    const void *buf = s->buf;
    size_t len = s->len;
    pthread_mutex_unlock(&s->mu);
    hvd_status st = raw_send_all(s->fd, buf, len);
    pthread_mutex_lock(&s->mu);
    s->status = st;
    if (st != HVD_OK)
      snprintf(s->error, sizeof(s->error), "%s", hvd_last_error_message());
    s->pending = false;
    pthread_cond_broadcast(&s->cond);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static hvd_status sender_start(struct sender *s, int fd) {
  int rc;

  memset(s, 0, sizeof(*s));
  s->fd = fd;
  if (pthread_mutex_init(&s->mu, NULL) != 0 || hvd_cond_init(&s->cond) != 0)
    return hvd_error(HVD_ERR_IO, "cannot create the sender thread's lock");
  rc = pthread_create(&s->thread, NULL, sender_main, s);
  if (rc != 0)
    return hvd_error(HVD_ERR_IO, "pthread_create: %s", strerror(rc));
  s->started = true;
  return HVD_OK;
}

static void sender_stop(struct sender *s) {
  if (!s->started)
    return;
  pthread_mutex_lock(&s->mu);
  s->quit = true;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->cond);
  pthread_mutex_destroy(&s->mu);
  s->started = false;
}

static hvd_status raw_exchange_thread(struct sender *s, const void *sbuf, void *rbuf, size_t len) {
  int64_t deadline;
  hvd_status st, sst;

  pthread_mutex_lock(&s->mu);
  s->buf = sbuf;
  s->len = len;
  s->pending = true;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->mu);

  st = raw_recv_all(s->fd, rbuf, len);
  if (st != HVD_OK)
    shutdown(s->fd, SHUT_RDWR); /* so that a blocked send returns */
  /* The sender borrows sbuf: wait for it whatever happened. */
  deadline = hvd_deadline_after_ms(2 * OP_TIMEOUT_MS);
  pthread_mutex_lock(&s->mu);
  while (s->pending && hvd_cond_wait_until(&s->cond, &s->mu, deadline) != ETIMEDOUT) {
  }
  if (s->pending) {
    pthread_mutex_unlock(&s->mu);
    fprintf(stderr, "hvd-bench-transport: the raw sender thread is stuck; giving up\n");
    _exit(EXIT_OP);
  }
  sst = s->status;
  if (st == HVD_OK && sst != HVD_OK)
    st = hvd_error(sst, "%s", s->error);
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* ---- both transports behind one interface ------------------------------------------ */

struct xport {
  const char *name;
  struct net_comm *comm; /* hvd */
  int peer;
  int fd;                /* raw */
  enum raw_bidi raw_bidi;
  struct sender *sender; /* raw, RAW_BIDI_THREAD */
  hvd_status (*send)(struct xport *x, const void *buf, size_t len);
  hvd_status (*recv)(struct xport *x, void *buf, size_t len);
  hvd_status (*exchange)(struct xport *x, const void *sbuf, void *rbuf, size_t len);
};

static hvd_status hvd_send_cb(struct xport *x, const void *buf, size_t len) {
  return net_send(x->comm, x->peer, buf, len);
}

static hvd_status hvd_recv_cb(struct xport *x, void *buf, size_t len) {
  return net_recv(x->comm, x->peer, buf, len);
}

static hvd_status hvd_exchange_cb(struct xport *x, const void *sbuf, void *rbuf, size_t len) {
  return net_sendrecv(x->comm, x->peer, sbuf, len, x->peer, rbuf, len);
}

static hvd_status raw_send_cb(struct xport *x, const void *buf, size_t len) {
  return raw_send_all(x->fd, buf, len);
}

static hvd_status raw_recv_cb(struct xport *x, void *buf, size_t len) {
  return raw_recv_all(x->fd, buf, len);
}

static hvd_status raw_exchange_cb(struct xport *x, const void *sbuf, void *rbuf, size_t len) {
  if (x->raw_bidi == RAW_BIDI_POLL)
    return raw_exchange_poll(x->fd, sbuf, rbuf, len);
  return raw_exchange_thread(x->sender, sbuf, rbuf, len);
}

/* ---- data checks --------------------------------------------------------------------- */

/* Byte i of a rank's messages (outside the stamps) is (i % 251) ^ key. */
static unsigned char rank_key(int rank) { return rank == 0 ? 0x5a : 0xa5; }

/* ref[j] = (j % 251) ^ key for j < PATTERN_PERIOD + REF_CHUNK: the pattern
 * at offset i, for up to REF_CHUNK bytes, starts at ref + i % 251. */
static unsigned char *ref_create(unsigned char key) {
  unsigned char *ref = malloc(PATTERN_PERIOD + REF_CHUNK);
  if (ref != NULL) {
    for (size_t j = 0; j < PATTERN_PERIOD + REF_CHUNK; j++)
      ref[j] = (unsigned char)((j % PATTERN_PERIOD) ^ key);
  }
  return ref;
}

static void pattern_fill(unsigned char *buf, size_t from, size_t to, const unsigned char *ref) {
  for (size_t i = from; i < to;) {
    size_t n = to - i < REF_CHUNK ? to - i : REF_CHUNK;
    memcpy(buf + i, ref + i % PATTERN_PERIOD, n);
    i += n;
  }
}

/* The first offset in [from, to) that differs from the pattern, or `to`. */
static size_t pattern_check(const unsigned char *buf, size_t from, size_t to,
                            const unsigned char *ref) {
  for (size_t i = from; i < to;) {
    size_t n = to - i < REF_CHUNK ? to - i : REF_CHUNK;
    if (memcmp(buf + i, ref + i % PATTERN_PERIOD, n) != 0) {
      for (size_t k = i; k < i + n; k++) {
        if (buf[k] != ref[k % PATTERN_PERIOD])
          return k;
      }
    }
    i += n;
  }
  return to;
}

/* A message of len bytes: a stamp in [0, 8) and, from 16 bytes on, in
 * [len-8, len); the pattern in between. Shorter messages carry only the
 * stamp's first len bytes. */
static size_t stamp_head(size_t len) { return len < 8 ? len : 8; }
static size_t stamp_tail(size_t len) { return len >= 16 ? len - 8 : len; }

static void stamp_put(unsigned char *buf, size_t len, uint64_t v) {
  unsigned char s[8];
  hvd_put_le64(s, v);
  memcpy(buf, s, stamp_head(len));
  if (len >= 16)
    memcpy(buf + len - 8, s, 8);
}

static bool stamp_ok(const unsigned char *buf, size_t len, uint64_t v) {
  unsigned char s[8];
  hvd_put_le64(s, v);
  return memcmp(buf, s, stamp_head(len)) == 0 && (len < 16 || memcmp(buf + len - 8, s, 8) == 0);
}

/* ---- one rank ------------------------------------------------------------------------- */

struct bench {
  const struct options *o;
  int rank;
  struct xport xp[XP_COUNT];
  unsigned char *sbuf, *rbuf; /* cap bytes each */
  size_t cap;
  unsigned char *ref_own, *ref_peer;
  unsigned char small[CONTROL_BYTES];
  uint64_t sample_no;  /* the same sequence on both ranks */
  unsigned bad;        /* failed data checks since the last verdict */
  char bad_what[256];  /* the first of them */
  bool failed;         /* rank 0: a data check failed on some rank */
};

static void HVD_PRINTF(2, 3) data_bad(struct bench *b, const char *fmt, ...) {
  va_list ap;
  if (b->bad++ > 0)
    return;
  va_start(ap, fmt);
  vsnprintf(b->bad_what, sizeof(b->bad_what), fmt, ap);
  va_end(ap);
  fprintf(stderr, "hvd-bench-transport: rank %d: data check failed: %s\n", b->rank, b->bad_what);
}

/*
 * Starts a sample: rank 0 sends (test, size, count) and rank 1 answers with
 * the verdict of its checks since the last answer. Rank 1 learns the count
 * here. Rank 0 records a bad verdict in b->failed.
 */
static hvd_status control(struct bench *b, struct xport *x, enum test t, size_t size,
                          uint64_t *count) {
  unsigned char *m = b->small;
  unsigned char verdict = 0;
  hvd_status st;

  if (b->rank == 0) {
    hvd_put_le64(m, (uint64_t)t);
    hvd_put_le64(m + 8, size);
    hvd_put_le64(m + 16, *count);
    st = x->send(x, m, CONTROL_BYTES);
    if (st == HVD_OK)
      st = x->recv(x, &verdict, 1);
    if (st == HVD_OK && verdict != 0) {
      fprintf(stderr, "hvd-bench-transport: rank 1 reported failed data checks (see above)\n");
      b->failed = true;
    }
    if (b->bad > 0)
      b->failed = true;
    b->bad = 0;
    return st;
  }
  st = x->recv(x, m, CONTROL_BYTES);
  if (st != HVD_OK)
    return st;
  if (hvd_get_le64(m) != (uint64_t)t || hvd_get_le64(m + 8) != size)
    return hvd_error(HVD_ERR_PROTOCOL,
                     "the ranks disagree: rank 0 runs test %" PRIu64 " size %" PRIu64
                     ", rank 1 test %d size %zu",
                     hvd_get_le64(m), hvd_get_le64(m + 8), (int)t, size);
  *count = hvd_get_le64(m + 16);
  verdict = b->bad > 0;
  b->bad = 0;
  return x->send(x, &verdict, 1);
}

/* Rank 0 sends one byte, rank 1 answers with one. */
static hvd_status barrier(struct bench *b, struct xport *x) {
  unsigned char c = 1;
  hvd_status st;

  if (b->rank == 0) {
    st = x->send(x, &c, 1);
    return st == HVD_OK ? x->recv(x, &c, 1) : st;
  }
  st = x->recv(x, &c, 1);
  return st == HVD_OK ? x->send(x, &c, 1) : st;
}

/* Rank 1 tells rank 0 that everything arrived. */
static hvd_status ack(struct bench *b, struct xport *x) {
  unsigned char c = 1;
  return b->rank == 0 ? x->recv(x, &c, 1) : x->send(x, &c, 1);
}

/* Puts the pattern back where stamps went into the send buffer, so that
 * a later, longer message carries the pattern there. */
static void unstamp(struct bench *b, size_t size) {
  pattern_fill(b->sbuf, 0, stamp_head(size), b->ref_own);
  pattern_fill(b->sbuf, stamp_tail(size), size, b->ref_own);
}

/* n round trips: rank 0 sends, rank 1 sends back what it got. */
static hvd_status pingpong(struct bench *b, struct xport *x, size_t size, uint64_t n,
                           uint64_t *stamp) {
  hvd_status st = HVD_OK;

  for (uint64_t i = 0; i < n && st == HVD_OK; i++, (*stamp)++) {
    if (b->rank == 0) {
      stamp_put(b->sbuf, size, *stamp);
      st = x->send(x, b->sbuf, size);
      if (st == HVD_OK)
        st = x->recv(x, b->rbuf, size);
    } else {
      st = x->recv(x, b->rbuf, size);
      if (st == HVD_OK)
        st = x->send(x, b->rbuf, size);
    }
    if (st == HVD_OK && !stamp_ok(b->rbuf, size, *stamp))
      data_bad(b, "%s latency %zu B: round trip %" PRIu64 " carries the wrong stamp", x->name,
               size, i);
  }
  return st;
}

/* n transfers from rank 0 to rank 1 (uni) or both ways at once (bi). */
static hvd_status transfers(struct bench *b, struct xport *x, enum test t, size_t size,
                            uint64_t n, uint64_t *stamp) {
  hvd_status st = HVD_OK;

  for (uint64_t i = 0; i < n && st == HVD_OK; i++, (*stamp)++) {
    if (t == TEST_BI || b->rank == 0)
      stamp_put(b->sbuf, size, *stamp);
    if (t == TEST_BI)
      st = x->exchange(x, b->sbuf, b->rbuf, size);
    else if (b->rank == 0)
      st = x->send(x, b->sbuf, size);
    else
      st = x->recv(x, b->rbuf, size);
    if (st == HVD_OK && (t == TEST_BI || b->rank == 1) && !stamp_ok(b->rbuf, size, *stamp))
      data_bad(b, "%s %s %zu B: transfer %" PRIu64 " carries the wrong stamp", x->name,
               test_names[t], size, i);
  }
  return st;
}

/*
 * One sample of test t at one size on one transport. *count: rank 0 passes
 * the number of timed operations, rank 1 learns it. Rank 0 gets the seconds
 * per operation in *seconds.
 */
static hvd_status sample(struct bench *b, struct xport *x, enum test t, size_t size,
                         uint64_t *count, double *seconds) {
  uint64_t stamp = ++b->sample_no << 32;
  bool receives = t != TEST_UNI || b->rank == 1;
  int64_t start = 0, end;
  hvd_status st;

  if (receives)
    memset(b->rbuf, 0, size);
  st = control(b, x, t, size, count);
  if (st != HVD_OK)
    return st;
  if (t == TEST_LATENCY) {
    st = pingpong(b, x, size, LAT_WARMUP, &stamp);
    start = hvd_now_ns();
    if (st == HVD_OK)
      st = pingpong(b, x, size, *count, &stamp);
  } else {
    st = transfers(b, x, t, size, 1, &stamp);
    if (st == HVD_OK)
      st = barrier(b, x);
    start = hvd_now_ns();
    if (st == HVD_OK)
      st = transfers(b, x, t, size, *count, &stamp);
    if (st == HVD_OK)
      st = ack(b, x);
  }
  end = hvd_now_ns();
  if (st != HVD_OK)
    return st;
  *seconds = (double)(end - start) / 1e9 / (double)*count;

  /* Outside the clock: the whole pattern of the last message, and the
   * stamps put back into the send buffer's pattern. */
  if (receives) {
    /* A latency round trip brings back rank 0's own bytes. */
    const unsigned char *ref = t == TEST_LATENCY && b->rank == 0 ? b->ref_own : b->ref_peer;
    size_t from = stamp_head(size), to = stamp_tail(size);
    size_t at = pattern_check(b->rbuf, from, to, ref);
    if (at != to)
      data_bad(b, "%s %s %zu B: byte %zu is 0x%02x, expected 0x%02x", x->name, test_names[t],
               size, at, b->rbuf[at], ref[at % PATTERN_PERIOD]);
  }
  unstamp(b, size);
  return HVD_OK;
}

/* Collects rank 1's last verdict at the end of a test. */
static hvd_status test_done(struct bench *b, enum test t) {
  uint64_t zero = 0;
  return control(b, &b->xp[XP_RAW], t, 0, &zero);
}

/* Round trips per latency sample, from raw round trips (rank 0 decides). */
static hvd_status calibrate(struct bench *b, size_t size, uint64_t *count) {
  struct xport *x = &b->xp[XP_RAW];
  uint64_t stamp = ++b->sample_no << 32;
  hvd_status st = pingpong(b, x, size, LAT_WARMUP, &stamp);
  int64_t start = hvd_now_ns();
  double rtt_ns, n;

  if (st == HVD_OK)
    st = pingpong(b, x, size, LAT_CALIBRATE, &stamp);
  unstamp(b, size);
  if (st != HVD_OK)
    return st;
  rtt_ns = (double)(hvd_now_ns() - start) / LAT_CALIBRATE;
  n = LAT_SAMPLE_NS / (rtt_ns > 1 ? rtt_ns : 1);
  *count = n < LAT_MIN_ROUND_TRIPS   ? LAT_MIN_ROUND_TRIPS
           : n > LAT_MAX_ROUND_TRIPS ? LAT_MAX_ROUND_TRIPS
                                     : (uint64_t)n;
  return HVD_OK;
}

/* ---- results (rank 0) -------------------------------------------------------------------- */

static int compare_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof(*v), compare_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Seconds per operation, [size][xport][rep]. */
static double *cell(double *samples, const struct options *o, size_t s, int xp) {
  return samples + (s * XP_COUNT + (size_t)xp) * o->repeat;
}

static void print_table(const struct options *o, enum test t, const size_t *sizes, size_t nsizes,
                        double *samples, const uint64_t *counts) {
  char label[32];

  if (t == TEST_LATENCY) {
    printf("\n# latency: ping-pong round trip, microseconds (lower is better); ratio = hvd/raw\n");
    printf("#%9s %11s %11s %7s %9s %9s %12s\n", "size", "hvd_median", "raw_median", "ratio",
           "hvd_min", "raw_min", "round_trips");
  } else {
    printf("\n# %s: %s bandwidth, GB/s = 1e9 bytes/s%s (higher is better); ratio = hvd/raw; "
           "best = fastest repetition\n",
           test_names[t], t == TEST_UNI ? "unidirectional" : "bidirectional",
           t == TEST_BI ? " per direction, aggr = both directions" : "");
    printf("#%9s %11s %11s %7s %9s %9s", "size", "hvd_median", "raw_median", "ratio", "hvd_best",
           "raw_best");
    if (t == TEST_BI)
      printf(" %9s %9s", "hvd_aggr", "raw_aggr");
    printf(" %12s\n", t == TEST_UNI ? "transfers" : "exchanges");
  }
  for (size_t s = 0; s < nsizes; s++) {
    double med[XP_COUNT], best[XP_COUNT];
    for (int xp = 0; xp < XP_COUNT; xp++) {
      double *v = cell(samples, o, s, xp);
      for (unsigned k = 0; k < o->repeat; k++)
        v[k] = t == TEST_LATENCY ? v[k] * 1e6 : (double)sizes[s] / v[k] / 1e9;
      med[xp] = median(v, o->repeat); /* sorts v ascending */
      best[xp] = t == TEST_LATENCY ? v[0] : v[o->repeat - 1];
    }
    format_size(sizes[s], label, sizeof(label));
    printf("%10s %11.2f %11.2f %7.3f %9.2f %9.2f", label, med[XP_HVD], med[XP_RAW],
           med[XP_HVD] / med[XP_RAW], best[XP_HVD], best[XP_RAW]);
    if (t == TEST_BI)
      printf(" %9.2f %9.2f", 2 * med[XP_HVD], 2 * med[XP_RAW]);
    printf(" %12" PRIu64 "\n", counts[s]);
  }
  fflush(stdout);
}

/* ---- the tests ---------------------------------------------------------------------------- */

static hvd_status run_test(struct bench *b, enum test t) {
  const struct options *o = b->o;
  size_t nsizes;
  const size_t *sizes = test_sizes(o, t, &nsizes);
  double *samples = NULL;
  uint64_t counts[MAX_SIZES];
  hvd_status st = HVD_OK;

  if (b->rank == 0) {
    samples = calloc(nsizes * XP_COUNT * o->repeat, sizeof(*samples));
    if (samples == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the samples");
  }
  for (size_t s = 0; s < nsizes && st == HVD_OK; s++) {
    counts[s] = BW_SAMPLE_BYTES / sizes[s];
    if (t == TEST_LATENCY)
      st = calibrate(b, sizes[s], &counts[s]);
    else if (counts[s] < BW_MIN_TRANSFERS)
      counts[s] = BW_MIN_TRANSFERS;
    else if (counts[s] > BW_MAX_TRANSFERS)
      counts[s] = BW_MAX_TRANSFERS;
  }
  for (unsigned k = 0; k < o->repeat && st == HVD_OK; k++) {
    for (size_t s = 0; s < nsizes && st == HVD_OK; s++) {
      for (int i = 0; i < XP_COUNT && st == HVD_OK; i++) {
        int xp = k % 2 == 0 ? i : XP_COUNT - 1 - i; /* hvd first on odd repetitions */
        double sec = 0;
        st = sample(b, &b->xp[xp], t, sizes[s], &counts[s], &sec);
        if (st != HVD_OK)
          hvd_error_prefix("%s %s %zu B", b->xp[xp].name, test_names[t], sizes[s]);
        else if (b->rank == 0)
          cell(samples, o, s, xp)[k] = sec;
        if (st == HVD_OK && b->rank == 0 && o->verbose) {
          char label[32];
          format_size(sizes[s], label, sizeof(label));
          if (t == TEST_LATENCY)
            printf("# sample: %s rep %u %s %s: %.2f us\n", test_names[t], k + 1, label,
                   b->xp[xp].name, sec * 1e6);
          else
            printf("# sample: %s rep %u %s %s: %.3f GB/s\n", test_names[t], k + 1, label,
                   b->xp[xp].name, (double)sizes[s] / sec / 1e9);
          fflush(stdout);
        }
      }
    }
  }
  if (st == HVD_OK)
    st = test_done(b, t);
  if (st == HVD_OK && b->rank == 0) {
    if (b->failed)
      printf("\n# %s: FAILED: data checks failed; no numbers\n", test_names[t]);
    else
      print_table(o, t, sizes, nsizes, samples, counts);
  }
  free(samples);
  return st;
}

static void print_buffers(struct bench *b) {
  int fds[XP_COUNT] = {b->xp[XP_HVD].comm->conns[b->xp[XP_HVD].peer].tx_fd, b->xp[XP_RAW].fd};

  printf("\n# socket buffers at the end (rank 0, getsockopt, kernel-doubled values):");
  for (int xp = 0; xp < XP_COUNT; xp++) {
    int snd = -1, rcv = -1;
    socklen_t len = sizeof(int);
    if (fds[xp] >= 0) {
      getsockopt(fds[xp], SOL_SOCKET, SO_SNDBUF, &snd, &len);
      len = sizeof(int);
      getsockopt(fds[xp], SOL_SOCKET, SO_RCVBUF, &rcv, &len);
    }
    printf(" %s SO_SNDBUF %d SO_RCVBUF %d%s", b->xp[xp].name, snd, rcv, xp == 0 ? ";" : "\n");
  }
}

/* ---- ranks and the parent --------------------------------------------------------------- */

struct job {
  const struct options *o;
  int store_port;
  int listen_fd; /* the raw pair's listener on 127.0.0.1 */
  int raw_port;
};

/* Rank 0 accepts, rank 1 connects; both leave with a tuned blocking socket. */
static hvd_status raw_connect(const struct job *job, int rank, int *out) {
  struct timeval tv = {.tv_sec = OP_TIMEOUT_MS / 1000};
  int one = 1;
  int fd;

  if (rank == 0) {
    struct pollfd p = {.fd = job->listen_fd, .events = POLLIN};
    int rc;
    while ((rc = poll(&p, 1, OP_TIMEOUT_MS)) < 0 && errno == EINTR) {
    }
    if (rc <= 0)
      return hvd_error(HVD_ERR_TIMEOUT, "raw socket: rank 1 did not connect within %d s",
                       OP_TIMEOUT_MS / 1000);
    fd = accept4(job->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
      return hvd_error(HVD_ERR_NETWORK, "raw socket: accept: %s", strerror(errno));
  } else {
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)job->raw_port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
      return hvd_error(HVD_ERR_IO, "raw socket: socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
      hvd_status st = hvd_error(HVD_ERR_NETWORK, "raw socket: connect 127.0.0.1:%d: %s",
                                job->raw_port, strerror(errno));
      close(fd);
      return st;
    }
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  *out = fd;
  return HVD_OK;
}

static hvd_status world_create(const struct job *job, int rank, struct rdzv_client **store,
                               struct net_world **w) {
  struct net_world_config cfg;
  hvd_status st;

  memset(&cfg, 0, sizeof(cfg));
  st = rdzv_client_create("127.0.0.1", job->store_port, NULL, OP_TIMEOUT_MS, store);
  if (st != HVD_OK)
    return st;
  cfg.ctx.rank = rank;
  cfg.ctx.hostname = "localhost";
  cfg.ctx.timeout_ms = OP_TIMEOUT_MS;
  cfg.ctx.store = *store;
  cfg.ctx.store_host = "127.0.0.1";
  cfg.ctx.store_port = job->store_port;
  cfg.size = 2;
  cfg.local_rank = cfg.local_size = cfg.cross_rank = cfg.cross_size = -1;
  return net_world_create(&cfg, w);
}

static int rank_main(const struct job *job, int rank) {
  const struct options *o = job->o;
  struct bench b;
  struct sender sender;
  struct rdzv_client *store = NULL;
  struct net_world *w = NULL;
  int raw_fd = -1;
  int code = EXIT_SETUP;
  hvd_status st;

  hvd_log_set_rank(rank);
  memset(&b, 0, sizeof(b));
  memset(&sender, 0, sizeof(sender));
  b.o = o;
  b.rank = rank;

  st = raw_connect(job, rank, &raw_fd);
  close(job->listen_fd);
  if (st == HVD_OK)
    st = world_create(job, rank, &store, &w);
  if (st != HVD_OK)
    goto out;

  for (int t = 0; t < TEST_COUNT; t++) {
    size_t n;
    const size_t *sizes = test_sizes(o, (enum test)t, &n);
    for (size_t i = 0; o->tests[t] && i < n; i++)
      b.cap = sizes[i] > b.cap ? sizes[i] : b.cap;
  }
  b.sbuf = malloc(b.cap);
  b.rbuf = malloc(b.cap);
  b.ref_own = ref_create(rank_key(rank));
  b.ref_peer = ref_create(rank_key(1 - rank));
  if (b.sbuf == NULL || b.rbuf == NULL || b.ref_own == NULL || b.ref_peer == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate 2 buffers of %zu bytes", b.cap);
    goto out;
  }
  pattern_fill(b.sbuf, 0, b.cap, b.ref_own); /* also faults the pages in */
  memset(b.rbuf, 0, b.cap);
  if (o->tests[TEST_BI] && o->raw_bidi == RAW_BIDI_THREAD) {
    st = sender_start(&sender, raw_fd);
    if (st != HVD_OK)
      goto out;
  }
  b.xp[XP_HVD] = (struct xport){.name = "hvd", .comm = w->global, .peer = 1 - rank, .fd = -1,
                                .send = hvd_send_cb, .recv = hvd_recv_cb,
                                .exchange = hvd_exchange_cb};
  b.xp[XP_RAW] = (struct xport){.name = "raw", .peer = 1 - rank, .fd = raw_fd,
                                .raw_bidi = o->raw_bidi, .sender = &sender,
                                .send = raw_send_cb, .recv = raw_recv_cb,
                                .exchange = raw_exchange_cb};

  code = 0;
  for (int t = 0; t < TEST_COUNT && st == HVD_OK; t++) {
    if (o->tests[t])
      st = run_test(&b, (enum test)t);
  }
  if (st == HVD_OK && rank == 0)
    print_buffers(&b);
  if (st != HVD_OK)
    code = EXIT_OP;
  else if (b.failed)
    code = EXIT_WRONG;

out:
  if (st != HVD_OK)
    fprintf(stderr, "hvd-bench-transport: rank %d: %s\n", rank, hvd_last_error_message());
  if (raw_fd >= 0 && st != HVD_OK)
    shutdown(raw_fd, SHUT_RDWR); /* wakes a sender thread blocked in send */
  sender_stop(&sender);
  free(b.ref_peer);
  free(b.ref_own);
  free(b.rbuf);
  free(b.sbuf);
  net_world_destroy(w);
  rdzv_client_destroy(store);
  if (raw_fd >= 0)
    close(raw_fd);
  fflush(stdout);
  return code;
}

static hvd_status raw_listen(int *fd_out, int *port_out) {
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof(sin);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  if (fd < 0)
    return hvd_error(HVD_ERR_IO, "socket: %s", strerror(errno));
  if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, (struct sockaddr *)&sin, &len) != 0) {
    hvd_status st = hvd_error(HVD_ERR_IO, "raw listener on 127.0.0.1: %s", strerror(errno));
    close(fd);
    return st;
  }
  *fd_out = fd;
  *port_out = ntohs(sin.sin_port);
  return HVD_OK;
}

/* The first line of a /proc file, newline dropped; "?" if unreadable. */
static void read_line(const char *path, char *out, size_t size) {
  FILE *f = fopen(path, "r");
  snprintf(out, size, "?");
  if (f != NULL) {
    if (fgets(out, (int)size, f) != NULL)
      out[strcspn(out, "\n")] = '\0';
    fclose(f);
  }
  for (char *p = out; *p; p++) {
    if (*p == '\t')
      *p = ' ';
  }
}

static void cpu_model(char *out, size_t size) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256];

  snprintf(out, size, "?");
  if (f == NULL)
    return;
  while (fgets(line, sizeof(line), f) != NULL) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
      colon += colon[1] == ' ' ? 2 : 1;
      colon[strcspn(colon, "\n")] = '\0';
      snprintf(out, size, "%s", colon);
      break;
    }
  }
  fclose(f);
}

static void print_header(const struct options *o) {
  struct utsname u;
  char cpu[128], rmem[64], wmem[64], rmax[32], wmax[32], when[32];
  const char *spin = hvd_setting_given(HVD_SET_SPIN_US);
  const char *sockbuf = hvd_setting_given(HVD_SET_SOCKET_BUFFER_BYTES);
  time_t now = time(NULL);
  struct tm tm;
  bool first = true;

  if (uname(&u) != 0)
    memset(&u, 0, sizeof(u));
  cpu_model(cpu, sizeof(cpu));
  read_line("/proc/sys/net/ipv4/tcp_rmem", rmem, sizeof(rmem));
  read_line("/proc/sys/net/ipv4/tcp_wmem", wmem, sizeof(wmem));
  read_line("/proc/sys/net/core/rmem_max", rmax, sizeof(rmax));
  read_line("/proc/sys/net/core/wmem_max", wmax, sizeof(wmax));
  gmtime_r(&now, &tm);
  strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", &tm);

  printf("# hvd-bench-transport: 2 forked ranks on 127.0.0.1, %s\n", when);
  printf("# machine: nproc %ld, Linux %s %s, cpu \"%s\"\n", sysconf(_SC_NPROCESSORS_ONLN),
         u.release, u.machine, cpu);
  printf("# tcp: tcp_rmem %s, tcp_wmem %s, rmem_max %s, wmem_max %s\n", rmem, wmem, rmax, wmax);
  printf("# knobs: HVD_SPIN_US=%s, HVD_SOCKET_BUFFER_BYTES=%s\n",
         spin && *spin ? spin : "(unset: 50 us)",
         sockbuf && *sockbuf ? sockbuf : "(unset: 0, kernel autotuning)");
  printf("# hvd: net_send/net_recv/net_sendrecv on the global communicator of a 2-rank net_world\n");
  printf("# raw: one TCP socket, TCP_NODELAY, blocking send(MSG_NOSIGNAL)/recv loops, default "
         "buffers; bidirectional: %s\n",
         o->raw_bidi == RAW_BIDI_THREAD
             ? "one persistent sender thread per process, the caller receives"
             : "one thread per process, poll() and MSG_DONTWAIT");
  printf("# tests:");
  for (int t = 0; t < TEST_COUNT; t++) {
    if (o->tests[t]) {
      printf("%s%s", first ? " " : ", ", test_names[t]);
      first = false;
    }
  }
  printf("; %u repetition%s; in each, every size runs hvd then raw (raw first on even "
         "repetitions); medians over repetitions\n",
         o->repeat, o->repeat == 1 ? "" : "s");
  fflush(stdout);
}

static void describe_exit(int code, char *out, size_t size) {
  switch (code) {
  case 0: snprintf(out, size, "ok"); break;
  case EXIT_SETUP: snprintf(out, size, "could not set up"); break;
  case EXIT_WRONG: snprintf(out, size, "data checks failed"); break;
  case EXIT_OP: snprintf(out, size, "an operation failed"); break;
  case -1000: snprintf(out, size, "killed by the parent (--timeout, or the other rank could not start)"); break;
  default:
    if (code < 0)
      snprintf(out, size, "signal %d (%s)", -code, strsignal(-code));
    else
      snprintf(out, size, "exit code %d", code);
  }
}

int main(int argc, char **argv) {
  struct options o = {.tests = {true, true, true}, .repeat = 5, .raw_bidi = RAW_BIDI_THREAD,
                      .timeout_s = 1800};
  struct rdzv_server_config cfg;
  struct rdzv_server *srv = NULL;
  struct job job = {.o = &o, .listen_fd = -1};
  pid_t pids[2] = {0, 0};
  int codes[2] = {-2000, -2000};
  int64_t deadline;
  int left = 0;
  bool ok = true;
  int rc;

  hvd_log_set_name("hvd-bench-transport");
  if (hvd_log_configure_from_env() != HVD_OK) {
    fprintf(stderr, "hvd-bench-transport: %s\n", hvd_last_error_message());
    return EXIT_USAGE;
  }
  rc = parse_args(argc, argv, &o);
  if (rc >= 0)
    return rc;
  signal(SIGPIPE, SIG_IGN);

  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  cfg.port = 0;
  if (rdzv_server_start(&cfg, &srv) != HVD_OK || raw_listen(&job.listen_fd, &job.raw_port) != HVD_OK) {
    fprintf(stderr, "hvd-bench-transport: %s\n", hvd_last_error_message());
    rdzv_server_stop(srv);
    return EXIT_FAILED;
  }
  job.store_port = rdzv_server_port(srv);
  print_header(&o);

  deadline = hvd_deadline_after_ms((int64_t)o.timeout_s * 1000);
  for (int r = 0; r < 2; r++) {
    fflush(stdout);
    fflush(stderr);
    pids[r] = fork();
    if (pids[r] < 0) {
      fprintf(stderr, "hvd-bench-transport: fork: %s\n", strerror(errno));
      pids[r] = 0;
      ok = false;
      deadline = 0; /* the rank already started waits for its peer: stop it now */
      break;
    }
    if (pids[r] == 0) {
      alarm((unsigned)o.timeout_s + 10); /* never outlive the parent's deadline */
      _exit(rank_main(&job, r));
    }
    left++;
  }
  close(job.listen_fd);

  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < 2; r++) {
        if (pids[r] == pid) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
          left--;
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR)
      break;
    if (hvd_now_ns() > deadline) {
      for (int r = 0; r < 2; r++) {
        if (pids[r] > 0 && codes[r] == -2000) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          codes[r] = -1000;
        }
      }
      break;
    }
    hvd_sleep_ns(20 * 1000000LL);
  }
  rdzv_server_stop(srv);

  for (int r = 0; r < 2; r++) {
    char how[96];
    if (codes[r] == 0)
      continue;
    ok = false;
    describe_exit(codes[r], how, sizeof(how));
    fprintf(stderr, "hvd-bench-transport: rank %d: %s\n", r, how);
  }
  printf("# %s\n", ok ? "every sample verified" : "FAILED: see the errors above");
  return ok ? 0 : EXIT_FAILED;
}
