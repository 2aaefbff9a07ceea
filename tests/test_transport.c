/*
 * Tests of the transport: wire formats, and forked ranks on loopback that
 * meet through an in-process rendezvous store (rings, layouts, exchanges,
 * lazy links, failures, stray connections, strangers at the shared
 * segment's set-up). Children never call ck_assert:
 * they report through their exit code and stderr; the parent asserts.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "transport/transport_private.h"
#include "store_process.h"
#include "stranger.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
/* Ranks leave through _exit, which skips LeakSanitizer: check by hand, so
 * that every path, failures included, is shown to release what it took. */
static bool leaked(void) { return __lsan_do_recoverable_leak_check() != 0; }
#else
static bool leaked(void) { return false; }
#endif

Suite *iface_suite(void);

/* ==== wire formats ============================================================ */

START_TEST(hello_roundtrip) {
  struct net_hello h = {.version = NET_PROTOCOL_VERSION, .token_len = 5, .comm_id = 7,
                        .from = 3, .to = 9, .from_global = 11, .generation = 0x0102030405060708ull};
  struct net_hello back;
  unsigned char buf[NET_HELLO_MAX];

  memcpy(h.token, "abcde", 5);
  ck_assert_uint_eq(net_hello_encode(&h, buf), NET_HELLO_FIXED + 5);
  ck_assert_uint_eq(buf[0], 'H'); /* little-endian magic reads "HVDT" */
  ck_assert_uint_eq(buf[3], 'T');
  ck_assert_int_eq(net_hello_decode_fixed(buf, &back), HVD_OK);
  ck_assert_uint_eq(back.version, NET_PROTOCOL_VERSION);
  ck_assert_uint_eq(back.token_len, 5);
  ck_assert_uint_eq(back.comm_id, 7);
  ck_assert_uint_eq(back.from, 3);
  ck_assert_uint_eq(back.to, 9);
  ck_assert_uint_eq(back.from_global, 11);
  ck_assert(back.generation == 0x0102030405060708ull);
  ck_assert_mem_eq(buf + NET_HELLO_FIXED, "abcde", 5);

  buf[0] = 'G';
  ck_assert_int_eq(net_hello_decode_fixed(buf, &back), HVD_ERR_PROTOCOL);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "not an hvd peer"));
  buf[0] = 'H';
  hvd_put_le16(buf + 6, NET_TOKEN_MAX + 1);
  ck_assert_int_eq(net_hello_decode_fixed(buf, &back), HVD_ERR_PROTOCOL);
}
END_TEST

START_TEST(ack_roundtrip) {
  unsigned char buf[NET_ACK_BYTES];
  uint16_t version, status;

  net_ack_encode(NET_ACK_BAD_TOKEN, buf);
  ck_assert_int_eq(net_ack_decode(buf, &version, &status), HVD_OK);
  ck_assert_uint_eq(version, NET_PROTOCOL_VERSION);
  ck_assert_uint_eq(status, NET_ACK_BAD_TOKEN);
  ck_assert_str_eq(net_ack_status_text(status), "wrong job token");
  buf[1] ^= 0xff;
  ck_assert_int_eq(net_ack_decode(buf, &version, &status), HVD_ERR_PROTOCOL);
}
END_TEST

/* ==== forked ranks ============================================================== */

enum {
  EXIT_SETUP = 10,    /* could not build the communicators */
  EXIT_WRONG = 11,    /* data or layout not as expected */
  EXIT_FAILED = 12,   /* an operation failed (where success was expected) */
  EXIT_TIMEOUT = 13,  /* an operation failed with HVD_ERR_TIMEOUT */
  EXIT_NETWORK = 14,  /* an operation failed with HVD_ERR_NETWORK */
  EXIT_PROTOCOL = 15, /* an operation failed with HVD_ERR_PROTOCOL */
  EXIT_LEAK = 16,     /* memory was not released (sanitizer builds) */
};

struct job {
  struct store_process store; /* the process serving the store */
  int port;
  const char *token;
  int64_t timeout_ms;
  const char *hosts[16];  /* fake hostname per rank, NULL: "localhost" */
  const char *tokens[16]; /* per-rank transport token, NULL: the job's */
  bool give_layout;      /* pass local/cross ranks instead of deriving them */
};

typedef int (*rank_fn)(struct net_world *w, struct rdzv_client *store, void *arg);

static int status_exit(hvd_status st) {
  fprintf(stderr, "rank failed: %s: %s\n", hvd_strerror(st), hvd_last_error_message());
  switch (st) {
  case HVD_ERR_TIMEOUT: return EXIT_TIMEOUT;
  case HVD_ERR_NETWORK: return EXIT_NETWORK;
  case HVD_ERR_PROTOCOL: return EXIT_PROTOCOL;
  default: return EXIT_FAILED;
  }
}

/* Layout of hvdrun: hosts in order, ranks consecutive per host. */
static void layout(const struct job *job, int rank, int size, struct net_world_config *cfg) {
  int local = 0, lsize = 0, cross = 0, csize = 0;
  const char *mine = job->hosts[rank] ? job->hosts[rank] : "localhost";
  int locals[16];

  for (int r = 0; r < size; r++) {
    const char *h = job->hosts[r] ? job->hosts[r] : "localhost";
    locals[r] = 0;
    for (int q = 0; q < r; q++)
      if (strcmp(job->hosts[q] ? job->hosts[q] : "localhost", h) == 0)
        locals[r]++;
    if (strcmp(h, mine) == 0)
      lsize++;
  }
  local = locals[rank];
  for (int r = 0; r < size; r++) {
    if (locals[r] == local) {
      if (r < rank)
        cross++;
      csize++;
    }
  }
  cfg->local_rank = local;
  cfg->local_size = lsize;
  cfg->cross_rank = cross;
  cfg->cross_size = csize;
}

static int child_main(const struct job *job, int rank, int size, rank_fn fn, void *arg) {
  struct net_world_config cfg;
  struct rdzv_client *store = NULL;
  struct net_world *w = NULL;
  hvd_status st;
  int code;

  hvd_log_set_rank(rank);
  memset(&cfg, 0, sizeof(cfg));
  st = rdzv_client_create("127.0.0.1", job->port, job->token, 20000, &store);
  if (st != HVD_OK)
    return status_exit(st);
  cfg.ctx.rank = rank;
  cfg.ctx.hostname = job->hosts[rank] ? job->hosts[rank] : "localhost";
  cfg.ctx.token = job->tokens[rank] ? job->tokens[rank] : job->token;
  cfg.ctx.timeout_ms = job->timeout_ms ? job->timeout_ms : 20000;
  cfg.ctx.store = store;
  cfg.ctx.store_host = "127.0.0.1";
  cfg.ctx.store_port = job->port;
  cfg.size = size;
  cfg.local_rank = cfg.local_size = cfg.cross_rank = cfg.cross_size = -1;
  if (job->give_layout)
    layout(job, rank, size, &cfg);
  st = net_world_create(&cfg, &w);
  if (st != HVD_OK) {
    fprintf(stderr, "rank %d: setup: %s\n", rank, hvd_last_error_message());
    rdzv_client_destroy(store);
    return EXIT_SETUP;
  }
  code = fn(w, store, arg);
  net_world_destroy(w);
  rdzv_client_destroy(store);
  return code;
}

/*
 * Runs `size` forked ranks; each runs fn after building its world. Fills
 * codes[] with exit codes (-SIG for a signal, -1000 for killed at the
 * deadline). Returns the seconds it took.
 */
static double run_job(struct job *job, int size, rank_fn fn, void *arg, int *codes,
                      int deadline_s) {
  pid_t pids[16];
  int64_t start = hvd_now_ns();
  int64_t deadline = hvd_deadline_after_ms(deadline_s * 1000LL);
  int left = size;

  for (int r = 0; r < size; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      int code;
      alarm((unsigned)deadline_s + 5); /* never outlive the test */
      code = child_main(job, r, size, fn, arg);
      _exit(leaked() ? EXIT_LEAK : code);
    }
    codes[r] = -2000;
  }
  while (left > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < size; r++) {
        if (pids[r] == pid) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
          left--;
        }
      }
      continue;
    }
    if (hvd_now_ns() > deadline) {
      for (int r = 0; r < size; r++) {
        if (codes[r] == -2000) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], NULL, 0);
          codes[r] = -1000;
        }
      }
      break;
    }
    hvd_sleep_ns(2 * 1000000LL);
  }
  return (double)(hvd_now_ns() - start) / 1e9;
}

static struct job job;

static void job_setup(void) {
  memset(&job, 0, sizeof(job));
  store_process_start(&job.store);
  job.port = job.store.port;
}

static void job_teardown(void) { store_process_stop(&job.store); }

static void expect_all(const int *codes, int size, int code) {
  for (int r = 0; r < size; r++)
    ck_assert_msg(codes[r] == code, "rank %d exited with %d, expected %d", r, codes[r], code);
}

/* ---- rings ----------------------------------------------------------------------- */

/* Each rank tells its right neighbour who it is and checks its left one. */
static int ring_check(struct net_comm *c) {
  int size = net_comm_size(c), rank = net_comm_rank(c);
  int32_t mine[2] = {rank, 1000 + rank}, got[2] = {-1, -1};
  hvd_status st;

  if (size == 1)
    return 0;
  st = net_sendrecv(c, (rank + 1) % size, mine, sizeof(mine), (rank + size - 1) % size, got,
                    sizeof(got));
  if (st != HVD_OK)
    return status_exit(st);
  if (got[0] != (rank + size - 1) % size || got[1] != 1000 + got[0]) {
    fprintf(stderr, "rank %d got %d from its left\n", rank, got[0]);
    return EXIT_WRONG;
  }
  return 0;
}

static int rings_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  int code;
  (void)store;
  (void)arg;
  if ((code = ring_check(w->global)) != 0 || (code = ring_check(w->local)) != 0 ||
      (code = ring_check(w->cross)) != 0)
    return code;
  /* One host: every rank is local, each cross ring has one member. */
  if (w->local_rank != w->rank || w->local_size != w->size || w->cross_size != 1 ||
      w->cross_rank != 0)
    return EXIT_WRONG;
  return 0;
}

START_TEST(rings_of_1_to_8) {
  for (int size = 1; size <= 8; size++) {
    int codes[16];
    run_job(&job, size, rings_fn, NULL, codes, 60);
    for (int r = 0; r < size; r++)
      ck_assert_msg(codes[r] == 0, "size %d: rank %d exited with %d", size, r, codes[r]);
  }
}
END_TEST

/* 2 hosts x 3 slots: local rings of 3, cross rings of 2. */
static int layout_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  int code;
  (void)store;
  (void)arg;
  if (w->local_size != 3 || w->local_rank != w->rank % 3 || w->cross_size != 2 ||
      w->cross_rank != w->rank / 3) {
    fprintf(stderr, "rank %d: local %d/%d cross %d/%d\n", w->rank, w->local_rank, w->local_size,
            w->cross_rank, w->cross_size);
    return EXIT_WRONG;
  }
  if (strcmp(net_comm_hostname(w->local, (w->local_rank + 1) % 3),
             net_comm_hostname(w->global, w->rank)) != 0)
    return EXIT_WRONG;
  if ((code = ring_check(w->global)) != 0 || (code = ring_check(w->local)) != 0 ||
      (code = ring_check(w->cross)) != 0)
    return code;
  /* The cross peer is the same slot on the other host: global rank +-3. */
  int32_t mine = w->rank, theirs = -1;
  hvd_status st = net_sendrecv(w->cross, 1 - w->cross_rank, &mine, 4, 1 - w->cross_rank, &theirs, 4);
  if (st != HVD_OK)
    return status_exit(st);
  return theirs == (w->rank + 3) % 6 ? 0 : EXIT_WRONG;
}

START_TEST(two_hosts_three_slots_derived) {
  int codes[6];
  const char *hosts[] = {"hostA", "hostA", "hostA", "hostB", "hostB", "hostB"};
  memcpy(job.hosts, hosts, sizeof(hosts));
  run_job(&job, 6, layout_fn, NULL, codes, 60);
  expect_all(codes, 6, 0);
}
END_TEST

START_TEST(two_hosts_three_slots_given) {
  int codes[6];
  const char *hosts[] = {"hostA", "hostA", "hostA", "hostB", "hostB", "hostB"};
  memcpy(job.hosts, hosts, sizeof(hosts));
  job.give_layout = true;
  run_job(&job, 6, layout_fn, NULL, codes, 60);
  expect_all(codes, 6, 0);
}
END_TEST

/* ---- exchanges ------------------------------------------------------------------- */

static unsigned char pattern(int rank, size_t i) { return (unsigned char)(rank * 31 + i * 7 + (i >> 13)); }

/* Two ranks send each other the same sizes at the same time. */
static int exchange_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  static const size_t sizes[] = {0, 1, 3, 4096, 65537, 64u << 20};
  int peer = 1 - w->rank;
  (void)store;
  (void)arg;
  for (size_t k = 0; k < HVD_ARRAY_SIZE(sizes); k++) {
    size_t n = sizes[k];
    unsigned char *out = malloc(n + 1), *in = malloc(n + 1);
    hvd_status st;
    if (out == NULL || in == NULL)
      return EXIT_FAILED;
    for (size_t i = 0; i < n; i++)
      out[i] = pattern(w->rank, i);
    memset(in, 0xee, n + 1);
    st = net_sendrecv(w->global, peer, out, n, peer, in, n);
    if (st != HVD_OK)
      return status_exit(st);
    for (size_t i = 0; i < n; i++) {
      if (in[i] != pattern(peer, i)) {
        fprintf(stderr, "size %zu: byte %zu differs\n", n, i);
        return EXIT_WRONG;
      }
    }
    if (in[n] != 0xee)
      return EXIT_WRONG; /* wrote past the end */
    free(out);
    free(in);
  }
  /* Both sides send first, then receive: the engine must not deadlock. */
  size_t n = 8u << 20;
  unsigned char *out = calloc(1, n), *in = calloc(1, n);
  struct net_req s, r;
  struct net_req *reqs[] = {&s, &r};
  if (net_isend(w->global, peer, out, n, &s) != HVD_OK ||
      net_irecv(w->global, peer, in, n, &r) != HVD_OK)
    return EXIT_FAILED;
  hvd_status st = net_wait(w->global, reqs, 2);
  free(out);
  free(in);
  return st == HVD_OK ? 0 : status_exit(st);
}

START_TEST(sendrecv_sizes_both_directions) {
  int codes[2];
  run_job(&job, 2, exchange_fn, NULL, codes, 120);
  expect_all(codes, 2, 0);
}
END_TEST

/* Scatter-gather sends and many queued messages per peer. */
static int iov_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  int peer = 1 - w->rank;
  char a[] = "hello ", b[] = "scatter ", c[] = "gather";
  struct iovec iov[] = {{a, 6}, {b, 0}, {b, 8}, {c, 6}};
  char got[21] = {0};
  struct net_req reqs[64];
  struct net_req *ptrs[64];
  int32_t vals[32], back[32];
  (void)store;
  (void)arg;

  if (net_isendv(w->global, peer, iov, 4, &reqs[0]) != HVD_OK ||
      net_irecv(w->global, peer, got, 20, &reqs[1]) != HVD_OK)
    return EXIT_FAILED;
  ptrs[0] = &reqs[0];
  ptrs[1] = &reqs[1];
  if (net_wait(w->global, ptrs, 2) != HVD_OK || strcmp(got, "hello scatter gather") != 0)
    return EXIT_WRONG;
  for (int i = 0; i < 32; i++) {
    vals[i] = w->rank * 100 + i;
    net_isend(w->global, peer, &vals[i], 4, &reqs[i]);
    net_irecv(w->global, peer, &back[i], 4, &reqs[32 + i]);
  }
  for (int i = 0; i < 64; i++)
    ptrs[i] = &reqs[i];
  if (net_wait(w->global, ptrs, 64) != HVD_OK)
    return EXIT_FAILED;
  for (int i = 0; i < 32; i++)
    if (back[i] != peer * 100 + i)
      return EXIT_WRONG;
  return 0;
}

START_TEST(scatter_gather_and_ordering) {
  int codes[2];
  run_job(&job, 2, iov_fn, NULL, codes, 60);
  expect_all(codes, 2, 0);
}
END_TEST

/* Every pair exchanges, most of them over lazily made links. */
static int mesh_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  int size = w->size;
  (void)store;
  (void)arg;
  for (int step = 1; step < size; step++) {
    int to = (w->rank + step) % size, from = (w->rank + size - step) % size;
    int32_t out = w->rank * 1000 + to, in = -1;
    hvd_status st = net_sendrecv(w->global, to, &out, 4, from, &in, 4);
    if (st != HVD_OK)
      return status_exit(st);
    if (in != from * 1000 + w->rank)
      return EXIT_WRONG;
  }
  return 0;
}

START_TEST(lazy_links_full_mesh) {
  int codes[6];
  run_job(&job, 6, mesh_fn, NULL, codes, 60);
  expect_all(codes, 6, 0);
}
END_TEST

/* A receive posted with the wrong length is caught, not silently misread. */
static int mismatch_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  char buf[20] = {0};
  hvd_status st;
  (void)store;
  (void)arg;
  if (w->rank == 0)
    return net_send(w->global, 1, buf, 10) == HVD_OK ? 0 : EXIT_FAILED;
  st = net_recv(w->global, 0, buf, 20);
  if (st != HVD_ERR_PROTOCOL)
    return EXIT_WRONG;
  /* Poisoned: later operations fail at once with the same error. */
  if (net_send(w->global, 0, buf, 1) != HVD_ERR_PROTOCOL ||
      strstr(hvd_last_error_message(), "expected 20") == NULL)
    return EXIT_WRONG;
  return EXIT_PROTOCOL;
}

START_TEST(length_mismatch_is_an_error) {
  int codes[2];
  run_job(&job, 2, mismatch_fn, NULL, codes, 60);
  ck_assert_int_eq(codes[0], 0);
  ck_assert_int_eq(codes[1], EXIT_PROTOCOL);
}
END_TEST

/* Receives of unknown length, back to back, and one too long for its cap. */
static int upto_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  static const size_t lens[] = {0, 1, 17, 5000, 70000};
  char *buf = malloc(70000);
  (void)store;
  (void)arg;
  if (buf == NULL)
    return EXIT_FAILED;
  if (w->rank == 0) {
    int code = 0;
    for (size_t k = 0; k < HVD_ARRAY_SIZE(lens) && code == 0; k++) {
      memset(buf, (int)('a' + k), lens[k]);
      if (net_send(w->global, 1, buf, lens[k]) != HVD_OK)
        code = EXIT_FAILED;
    }
    if (code == 0 && net_send(w->global, 1, buf, 100) != HVD_OK)
      code = EXIT_FAILED;
    free(buf);
    return code;
  }
  /* Post them all before any arrives: each must stop at its own message. */
  struct net_req reqs[HVD_ARRAY_SIZE(lens)];
  struct net_req *ptrs[HVD_ARRAY_SIZE(lens)];
  char *bufs[HVD_ARRAY_SIZE(lens)];
  for (size_t k = 0; k < HVD_ARRAY_SIZE(lens); k++) {
    bufs[k] = calloc(1, 70001);
    ptrs[k] = &reqs[k];
    if (bufs[k] == NULL || net_irecv_max(w->global, 0, bufs[k], 70000, &reqs[k]) != HVD_OK)
      return EXIT_FAILED;
  }
  if (net_wait(w->global, ptrs, HVD_ARRAY_SIZE(lens)) != HVD_OK)
    return EXIT_FAILED;
  for (size_t k = 0; k < HVD_ARRAY_SIZE(lens); k++) {
    if (net_req_length(&reqs[k]) != lens[k])
      return EXIT_WRONG;
    for (size_t i = 0; i < lens[k]; i++)
      if (bufs[k][i] != (char)('a' + k))
        return EXIT_WRONG;
    if (bufs[k][lens[k]] != 0)
      return EXIT_WRONG;
    free(bufs[k]);
  }
  hvd_status st = net_irecv_max(w->global, 0, buf, 99, &reqs[0]);
  if (st == HVD_OK)
    st = net_wait(w->global, ptrs, 1);
  free(buf);
  if (st != HVD_ERR_PROTOCOL || strstr(hvd_last_error_message(), "more than the 99") == NULL)
    return EXIT_WRONG;
  return EXIT_PROTOCOL;
}

START_TEST(receives_of_unknown_length) {
  int codes[2];
  run_job(&job, 2, upto_fn, NULL, codes, 60);
  ck_assert_int_eq(codes[0], 0);
  ck_assert_int_eq(codes[1], EXIT_PROTOCOL);
}
END_TEST

static bool flag_set(void *arg) { return *(volatile int *)arg != 0; }

/* net_wait_event ends on a request, on its fd, on check() and at its
 * deadline, and waiting idle past the progress timeout is no error. Rank 0
 * sends only once rank 1 is done with the rest (it says so in the store). */
static int event_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  int pipefd[2], flag = 0;
  char byte = 0, got = 0;
  struct net_req r;
  struct net_req *ptrs[] = {&r};
  struct net_wake wake = {.fd = -1, .check = flag_set, .arg = &flag};
  struct hvd_buf v;
  int64_t t0;
  (void)arg;
  if (w->rank == 0) {
    hvd_status st;
    hvd_buf_init(&v, 0);
    st = rdzv_client_wait(store, "test", "event.send", -1, &v);
    hvd_buf_fini(&v);
    if (st == HVD_OK)
      st = net_send(w->global, 1, &byte, 1);
    return st == HVD_OK ? 0 : EXIT_FAILED;
  }
  if (pipe(pipefd) != 0 || net_irecv(w->global, 0, &got, 1, &r) != HVD_OK)
    return EXIT_FAILED;
  /* The deadline, past the 1 s progress timeout. */
  t0 = hvd_now_ns();
  if (net_wait_event(w->global, ptrs, 1, &wake, t0 + 1500 * 1000000LL) != HVD_OK || r.done ||
      hvd_now_ns() - t0 < 1500 * 1000000LL)
    return EXIT_WRONG;
  /* check(). */
  flag = 1;
  if (net_wait_event(w->global, ptrs, 1, &wake, HVD_NO_DEADLINE) != HVD_OK || r.done)
    return EXIT_WRONG;
  flag = 0;
  /* The fd. */
  wake.fd = pipefd[0];
  if (write(pipefd[1], &byte, 1) != 1 ||
      net_wait_event(w->global, ptrs, 1, &wake, HVD_NO_DEADLINE) != HVD_OK || r.done)
    return EXIT_WRONG;
  if (read(pipefd[0], &byte, 1) != 1 ||
      rdzv_client_set(store, "test", "event.send", "1", 1) != HVD_OK)
    return EXIT_FAILED;
  /* The request. */
  if (net_wait_event(w->global, ptrs, 1, &wake, HVD_NO_DEADLINE) != HVD_OK || !r.done)
    return EXIT_WRONG;
  close(pipefd[0]);
  close(pipefd[1]);
  return 0;
}

START_TEST(waiting_for_events) {
  int codes[2];
  struct job j = job;
  j.timeout_ms = 1000;
  run_job(&j, 2, event_fn, NULL, codes, 60);
  expect_all(codes, 2, 0);
}
END_TEST

/* Communicators derived from global (even ranks, and a reversed list)
 * exchange over their own connections; a member's death is seen by a
 * wait for events. */
static int derive_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  int evens[3] = {0, 2, 4}, reversed[5] = {4, 3, 2, 1, 0};
  struct net_comm *even = NULL, *rev = NULL;
  int rr;
  (void)store;
  (void)arg;
  if (net_comm_derive(w->global, NET_COMM_PROCESS_SET + 1, reversed, 5, &rev) != HVD_OK)
    return EXIT_FAILED;
  rr = net_comm_rank(rev);
  if (rr != 4 - w->rank || net_comm_size(rev) != 5 ||
      strcmp(net_comm_hostname(rev, 0), net_comm_hostname(w->global, 4)) != 0)
    return EXIT_WRONG;
  if (ring_check(rev) != 0)
    return EXIT_WRONG;
  if (w->rank % 2 == 0) {
    if (net_comm_derive(w->global, NET_COMM_PROCESS_SET + 2, evens, 3, &even) != HVD_OK ||
        net_comm_rank(even) != w->rank / 2 || ring_check(even) != 0)
      return EXIT_WRONG;
  } else if (net_comm_derive(w->global, NET_COMM_PROCESS_SET + 2, evens, 3, &even) !=
             HVD_ERR_INVALID_ARGUMENT) {
    return EXIT_WRONG;
  }
  /* Global rank 1 dies; global rank 0, which it sent to in ring_check (so
   * the connection exists), waits for a message from it that never comes. */
  if (w->rank == 1)
    _exit(0);
  if (w->rank == 0) {
    char c;
    struct net_req r;
    struct net_req *ptrs[] = {&r};
    hvd_status st = net_irecv(rev, 3, &c, 1, &r); /* rank 3 of rev is global rank 1 */
    if (st == HVD_OK)
      st = net_wait_event(rev, ptrs, 1, NULL, HVD_NO_DEADLINE);
    if (st != HVD_ERR_NETWORK)
      return EXIT_WRONG;
  }
  net_comm_destroy(even);
  net_comm_destroy(rev);
  return 0;
}

START_TEST(derived_communicators) {
  int codes[5];
  run_job(&job, 5, derive_fn, NULL, codes, 60);
  expect_all(codes, 5, 0);
}
END_TEST

/* ==== failures ====================================================================== */

/* Ranks pass messages around the ring until told to stop or failure. */
static int ring_loop(struct net_comm *c, int rounds) {
  int size = net_comm_size(c), rank = net_comm_rank(c);
  char out[4096], in[4096];
  for (int i = 0; i < rounds; i++) {
    hvd_status st = net_sendrecv(c, (rank + 1) % size, out, sizeof(out), (rank + size - 1) % size,
                                 in, sizeof(in));
    if (st != HVD_OK)
      return status_exit(st);
  }
  return 0;
}

static int killed_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  (void)store;
  (void)arg;
  if (ring_loop(w->global, 100) != 0)
    return EXIT_FAILED;
  if (w->rank == 2)
    raise(SIGKILL);
  return ring_loop(w->global, 1000000);
}

START_TEST(killed_peer_fails_others_fast) {
  int codes[4];
  /* EOF, not the timeout, must stop the survivors: with a 60 s timeout and a
   * 40 s deadline, waiting for the timeout would get them killed. */
  job.timeout_ms = 60000;
  run_job(&job, 4, killed_fn, NULL, codes, 40);
  ck_assert_int_eq(codes[2], -SIGKILL);
  for (int r = 0; r < 4; r++) {
    if (r == 2)
      continue;
    ck_assert_msg(codes[r] == EXIT_NETWORK, "rank %d exited with %d", r, codes[r]);
  }
}
END_TEST

/* Rank 1 stays alive but silent (waiting in the store) until rank 0 has
 * timed out twice, as rank 0 says in the store. */
static int silent_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  char byte;
  hvd_status st;
  int code;
  (void)arg;
  if (w->rank == 1) {
    struct hvd_buf v;
    hvd_buf_init(&v, 0);
    st = rdzv_client_wait(store, "test", "silent.timed_out", -1, &v);
    hvd_buf_fini(&v);
    return st == HVD_OK ? 0 : EXIT_FAILED;
  }
  st = net_recv(w->global, 1, &byte, 1);
  if (st != HVD_ERR_TIMEOUT || strstr(hvd_last_error_message(), "HOROVOD_GLOO_TIMEOUT_SECONDS") ==
                                   NULL)
    code = EXIT_WRONG;
  else
    code = net_recv(w->global, 1, &byte, 1) == HVD_ERR_TIMEOUT ? EXIT_TIMEOUT : EXIT_WRONG;
  st = rdzv_client_set(store, "test", "silent.timed_out", "1", 1);
  return st == HVD_OK ? code : EXIT_FAILED;
}

START_TEST(silent_peer_times_out) {
  int codes[2];
  job.timeout_ms = 1000;
  run_job(&job, 2, silent_fn, NULL, codes, 60);
  ck_assert_int_eq(codes[0], EXIT_TIMEOUT);
  ck_assert_int_eq(codes[1], 0);
}
END_TEST

/* ---- stray connections ------------------------------------------------------------- */

/* Publishes its port, then keeps the ring busy until the parent says stop. */
static int busy_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  char key[16], port[16];
  struct hvd_buf v;
  (void)arg;
  snprintf(key, sizeof(key), "port%d", w->rank);
  snprintf(port, sizeof(port), "%d", net_ctx_port(w->ctx));
  if (rdzv_client_set(store, "test", key, port, strlen(port)) != HVD_OK)
    return EXIT_FAILED;
  hvd_buf_init(&v, 0);
  for (int i = 0; i < 100000; i++) {
    int code = ring_loop(w->global, 20);
    char stop = 0;
    if (code != 0)
      return code;
    /* Rank 0 decides and passes the decision around, so all stop together. */
    int left = (w->rank + w->size - 1) % w->size, right = (w->rank + 1) % w->size;
    hvd_status st;
    if (w->rank == 0) {
      stop = rdzv_client_get(store, "test", "stop", &v, NULL) == HVD_OK;
      st = net_send(w->global, right, &stop, 1);
      if (st == HVD_OK)
        st = net_recv(w->global, left, &stop, 1);
    } else {
      st = net_recv(w->global, left, &stop, 1);
      if (st == HVD_OK)
        st = net_send(w->global, right, &stop, 1);
    }
    if (st != HVD_OK)
      return status_exit(st);
    if (stop)
      break;
  }
  hvd_buf_fini(&v);
  return mesh_fn(w, store, arg);
}

struct stray_result {
  int ack_status; /* -1: closed without an ACK */
};

/* A 3-rank job running fn (busy_fn or a variant) in a child process, while
 * this process plays the stranger against rank 0's listener. */
struct busy_job {
  pid_t runner;
  int pipefd[2];
  struct rdzv_client *store;
  int port; /* rank 0's transport port */
};

static void busy_job_start(struct busy_job *b, rank_fn fn) {
  int codes[3];
  struct hvd_buf v;

  job.token = "jobtoken";
  ck_assert_int_eq(pipe(b->pipefd), 0);
  b->runner = fork();
  if (b->runner == 0) {
    close(b->pipefd[0]);
    run_job(&job, 3, fn, NULL, codes, 60);
    ck_assert_int_eq(write(b->pipefd[1], codes, sizeof(codes)), sizeof(codes));
    _exit(0);
  }
  close(b->pipefd[1]);
  hvd_buf_init(&v, 0);
  ck_assert_int_eq(rdzv_client_create("127.0.0.1", job.port, "jobtoken", 30000, &b->store),
                   HVD_OK);
  ck_assert_int_eq(rdzv_client_wait(b->store, "test", "port0", -1, &v), HVD_OK);
  b->port = atoi(v.data);
  hvd_buf_fini(&v);
}

/* Tells the ranks to stop and checks that every one of them succeeded. */
static void busy_job_finish(struct busy_job *b) {
  int codes[3];
  ck_assert_int_eq(rdzv_client_set(b->store, "test", "stop", "1", 1), HVD_OK);
  ck_assert_int_eq(read(b->pipefd[0], codes, sizeof(codes)), sizeof(codes));
  close(b->pipefd[0]);
  waitpid(b->runner, NULL, 0);
  expect_all(codes, 3, 0);
  rdzv_client_destroy(b->store);
}

/* A HELLO from a stranger; 15 s is a bound for a hang, not a wait. */
static int stray_hello(int port, const struct net_hello *h, const void *raw, size_t raw_len) {
  return stranger_hello(port, h, raw, raw_len, 15000);
}

START_TEST(stray_connections_rejected) {
  struct net_hello h = {.version = NET_PROTOCOL_VERSION, .comm_id = NET_COMM_GLOBAL, .from = 1,
                        .to = 0};
  struct busy_job b;
  int port;

  job.timeout_ms = 3000; /* also how long a silent stranger may hold a socket */
  busy_job_start(&b, busy_fn);
  port = b.port;

  memcpy(h.token, "wrongtoken", 10);
  h.token_len = 10;
  ck_assert_int_eq(stray_hello(port, &h, NULL, 0), NET_ACK_BAD_TOKEN);
  memcpy(h.token, "jobtoken", 8);
  h.token_len = 8;
  h.version = NET_PROTOCOL_VERSION + 1;
  ck_assert_int_eq(stray_hello(port, &h, NULL, 0), NET_ACK_BAD_VERSION);
  h.version = NET_PROTOCOL_VERSION;
  h.generation = 99;
  ck_assert_int_eq(stray_hello(port, &h, NULL, 0), NET_ACK_BAD_GENERATION);
  static const char http[] = "GET / HTTP/1.1\r\nHost: somewhere.example\r\n\r\n"; /* > 36 bytes */
  ck_assert_int_eq(stray_hello(port, NULL, http, sizeof(http) - 1), STRANGER_CLOSED);
  /* connects and says nothing... */
  ck_assert_int_eq(stray_hello(port, NULL, "", 0), STRANGER_CLOSED);
  busy_job_finish(&b); /* ...and the job went on */
}
END_TEST

static int dial(int port) {
  int fd = stranger_dial(port);
  ck_assert_msg(fd >= 0, "connect to port %d: %s", port, strerror(errno));
  return fd;
}

enum { FLOOD = 600 };

/* Silent strangers beyond the handshake cap push the oldest out at once
 * (long before any deadline), a valid HELLO still gets through the flood,
 * and a validated socket nobody claims is closed after the job's timeout. */
START_TEST(stray_flood_is_bounded_and_parked_sockets_expire) {
  int flood[FLOOD], parked;
  struct net_hello h = {.version = NET_PROTOCOL_VERSION, .comm_id = 777, .from = 1, .to = 0,
                        .token_len = 8};
  unsigned char buf[NET_HELLO_MAX], ack[NET_ACK_BYTES];
  uint16_t version, status;
  struct busy_job b;
  size_t len;

  job.timeout_ms = 4000;
  memcpy(h.token, "jobtoken", 8);
  busy_job_start(&b, busy_fn);
  for (int i = 0; i < FLOOD; i++)
    flood[i] = dial(b.port);
  /* The handshake deadline is 3 s; the first are gone long before. */
  ck_assert_msg(stranger_closed_within(flood[0], 1500),
                "the oldest stranger was not dropped for newer ones");
  parked = dial(b.port);
  len = net_hello_encode(&h, buf);
  ck_assert_int_eq(send(parked, buf, len, MSG_NOSIGNAL), (ssize_t)len);
  ck_assert_int_eq(recv(parked, ack, sizeof(ack), MSG_WAITALL), (ssize_t)sizeof(ack));
  ck_assert_int_eq(net_ack_decode(ack, &version, &status), HVD_OK);
  ck_assert_int_eq(status, NET_ACK_OK);
  for (int i = 0; i < FLOOD; i++) {
    ck_assert_msg(stranger_closed_within(flood[i], 10000), "stranger %d still connected", i);
    close(flood[i]);
  }
  /* Communicator 777 never exists: the parked socket goes after the timeout. */
  ck_assert_msg(stranger_closed_within(parked, 15000), "an unclaimed socket stayed parked");
  close(parked);
  busy_job_finish(&b);
}
END_TEST

/* Rank 0 runs out of descriptors: few above what it holds once its world
 * is up. */
static int busy_low_fd_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  if (w->rank == 0) {
    struct rlimit rl;
    int open_now = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
      return EXIT_FAILED;
    while (readdir(d) != NULL)
      open_now++;
    closedir(d);
    rl.rlim_cur = rl.rlim_max = (rlim_t)open_now + 8;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
      return EXIT_FAILED;
  }
  return busy_fn(w, store, arg);
}

/* How many of fds[0..n) their peer has closed, waiting (all of them at
 * once) until `want` are or ms have passed: a bound for hangs, so a slow
 * machine only waits longer. */
static int count_closed(const int *fds, int n, int want, int ms) {
  struct pollfd p[64];
  bool closed[64] = {false};
  int64_t deadline = hvd_deadline_after_ms(ms);
  int count = 0;

  ck_assert_int_le(n, 64);
  while (count < want && hvd_now_ns() < deadline) {
    int k = 0;
    for (int i = 0; i < n; i++) {
      if (!closed[i])
        p[k++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    }
    if (poll(p, (nfds_t)k, (int)hvd_remaining_ms(deadline)) <= 0)
      break;
    for (int j = 0; j < k; j++) {
      char c;
      if (p[j].revents == 0 || recv(p[j].fd, &c, 1, MSG_DONTWAIT) > 0)
        continue;
      for (int i = 0; i < n; i++) {
        if (fds[i] == p[j].fd && !closed[i]) {
          closed[i] = true;
          count++;
        }
      }
    }
  }
  return count;
}

/* At EMFILE the rank accepts and closes what waits (a reserve descriptor)
 * instead of leaving it in the backlog, and its ring goes on. */
START_TEST(listener_at_emfile_sheds_connections) {
  enum { STRANGERS = 40 };
  int fds[STRANGERS], closed;
  struct busy_job b;

  job.timeout_ms = 30000; /* no deadline closes them during the test */
  /* Returns once rank 0 published its port, after lowering its limit. */
  busy_job_start(&b, busy_low_fd_fn);
  for (int i = 0; i < STRANGERS; i++)
    fds[i] = dial(b.port);
  /* Beyond the few that fit, each is accepted and closed at once. */
  closed = count_closed(fds, STRANGERS, STRANGERS - 12, 20000);
  for (int i = 0; i < STRANGERS; i++)
    close(fds[i]);
  ck_assert_msg(closed >= STRANGERS - 12, "only %d of %d strangers were shed", closed, STRANGERS);
  busy_job_finish(&b);
}
END_TEST

/* A rank with another token cannot join: its peer refuses it. */
static int lone_token_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  (void)store;
  (void)arg;
  return ring_check(w->global);
}

START_TEST(wrong_token_rank_is_refused) {
  int codes[2];
  job.timeout_ms = 3000;
  job.tokens[1] = "another job's token";
  run_job(&job, 2, lone_token_fn, NULL, codes, 30);
  /* Rank 0 dials and is refused; rank 1 waits in vain and times out. */
  ck_assert_int_eq(codes[0], EXIT_SETUP);
  ck_assert_int_eq(codes[1], EXIT_SETUP);
}
END_TEST

/* ---- rounds the elastic driver abandoned ---------------------------------------- */

static hvd_status ctx_for(int rank, struct rdzv_client *store, struct net_ctx **ctx) {
  struct net_ctx_config cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.rank = rank;
  cfg.hostname = "localhost";
  cfg.timeout_ms = 30000;
  cfg.store = store;
  cfg.store_host = "127.0.0.1";
  cfg.store_port = job.port;
  return net_ctx_create(&cfg, ctx);
}

static void put_abandoned(struct rdzv_client *c, const char *scope, const char *key) {
  ck_assert_int_eq(rdzv_client_set(c, scope, key, RDZV_RECORD_ABANDONED,
                                   strlen(RDZV_RECORD_ABANDONED)),
                   HVD_OK);
}

/* The marker is already there: the communicator fails at once, naming
 * its scope, instead of waiting for a record that will never come. */
START_TEST(abandoned_round_fails_the_communicator) {
  struct rdzv_client *store = NULL;
  struct net_ctx *ctx = NULL;
  struct net_comm *comm = NULL;
  struct rdzv_record rec;
  struct hvd_buf text;

  ck_assert_int_eq(rdzv_client_create("127.0.0.1", job.port, NULL, 30000, &store), HVD_OK);
  ck_assert_msg(ctx_for(0, store, &ctx) == HVD_OK, "%s", hvd_last_error_message());
  put_abandoned(store, "round.7.global", "1");
  ck_assert_int_eq(net_comm_create(ctx, "round.7.global", NET_COMM_GLOBAL, 0, 2, &comm),
                   HVD_ERR_ABORTED);
  ck_assert_ptr_null(comm);
  ck_assert_msg(strstr(hvd_last_error_message(), "'round.7.global'") != NULL, "%s",
                hvd_last_error_message());
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "abandoned"));
  /* A marker between two real records counts as well. */
  memset(&rec, 0, sizeof(rec));
  rec.rank = rec.global_rank = 2;
  snprintf(rec.host, sizeof(rec.host), "localhost");
  rec.local_rank = -1;
  rec.pid = 1;
  rec.port = 1;
  snprintf(rec.addrs[0], sizeof(rec.addrs[0]), "127.0.0.1");
  rec.naddrs = 1;
  hvd_buf_init(&text, 0);
  ck_assert_int_eq(rdzv_record_encode(&rec, &text), HVD_OK);
  ck_assert_int_eq(rdzv_client_set(store, "round.8.global", "2", text.data, text.len), HVD_OK);
  put_abandoned(store, "round.8.global", "1");
  ck_assert_int_eq(net_comm_create(ctx, "round.8.global", NET_COMM_GLOBAL, 0, 3, &comm),
                   HVD_ERR_ABORTED);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "'round.8.global'"));
  ck_assert_ptr_null(comm);
  hvd_buf_fini(&text);
  net_ctx_destroy(ctx);
  rdzv_client_destroy(store);
}
END_TEST

/* Two ranks of three came and wait for the third; the driver gives up on
 * it: both fail with HVD_ERR_ABORTED rather than at their 30 s timeout. */
static int abandoned_rank_main(int rank) {
  struct rdzv_client *store = NULL;
  struct net_ctx *ctx = NULL;
  struct net_comm *comm = NULL;
  hvd_status st;
  int code = 0;

  st = rdzv_client_create("127.0.0.1", job.port, NULL, 30000, &store);
  if (st == HVD_OK)
    st = ctx_for(rank, store, &ctx);
  if (st != HVD_OK)
    return EXIT_SETUP;
  st = net_comm_create(ctx, "round.3.global", NET_COMM_GLOBAL, rank, 3, &comm);
  if (st != HVD_ERR_ABORTED) {
    code = st == HVD_OK ? EXIT_WRONG : status_exit(st);
  } else if (strstr(hvd_last_error_message(), "'round.3.global'") == NULL) {
    fprintf(stderr, "rank %d: %s\n", rank, hvd_last_error_message());
    code = EXIT_WRONG;
  }
  net_comm_destroy(comm);
  net_ctx_destroy(ctx);
  rdzv_client_destroy(store);
  return leaked() ? EXIT_LEAK : code;
}

START_TEST(abandoned_round_ends_waiting_ranks) {
  static const char *const came[] = {"0", "1"};
  struct rdzv_client *c = NULL;
  pid_t pids[2];
  int codes[2];

  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    ck_assert_int_ge(pids[r], 0);
    if (pids[r] == 0) {
      alarm(90); /* never outlive the test */
      _exit(abandoned_rank_main(r));
    }
  }
  /* The driver's view: ranks 0 and 1 published, rank 2 never will. */
  ck_assert_int_eq(rdzv_client_create("127.0.0.1", job.port, NULL, 30000, &c), HVD_OK);
  ck_assert_int_eq(rdzv_client_wait_keys(c, "round.3.global", came, 2, 30000), HVD_OK);
  put_abandoned(c, "round.3.global", "2");
  for (int r = 0; r < 2; r++) {
    int status;
    ck_assert_int_eq(waitpid(pids[r], &status, 0), pids[r]);
    codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  expect_all(codes, 2, 0);
  rdzv_client_destroy(c);
}
END_TEST

/* Pod mode orders names as StatefulSet ordinals: by a trailing number
 * where only it differs, else as strings. */
START_TEST(pod_order) {
  static const char *sorted[] = {"a",       "b-1",     "train-0", "train-1", "train-2",
                                 "train-10", "train-10:0", "train-10:1", "train-x", "worker"};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(sorted); i++) {
    ck_assert_int_eq(net_pod_compare(sorted[i], sorted[i]), 0);
    for (size_t j = i + 1; j < HVD_ARRAY_SIZE(sorted); j++) {
      ck_assert_msg(net_pod_compare(sorted[i], sorted[j]) < 0, "%s < %s", sorted[i], sorted[j]);
      ck_assert_msg(net_pod_compare(sorted[j], sorted[i]) > 0, "%s > %s", sorted[j], sorted[i]);
    }
  }
  ck_assert_int_lt(net_pod_compare("node9", "node10"), 0);
  ck_assert_int_lt(net_pod_compare("node007", "node10"), 0);
  ck_assert_int_ne(net_pod_compare("node07", "node7"), 0); /* distinct names stay distinct */
}
END_TEST

/* ==== suites ======================================================================= */

static Suite *wire_suite(void) {
  Suite *s = suite_create("wire");
  TCase *tc = tcase_create("wire");
  tcase_add_test(tc, hello_roundtrip);
  tcase_add_test(tc, ack_roundtrip);
  tcase_add_test(tc, pod_order);
  suite_add_tcase(s, tc);
  return s;
}


/* ---- links through shared memory ----------------------------------------------- */

/* Sets up rings of 4 KiB (messages much longer than a ring wrap around and
 * wait for room) on the global communicator, checks that rank 0's
 * connections and the others' to rank 0 use them, then runs fn (arg). */
static int linked_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  rank_fn fn = *(const rank_fn *)arg;
  struct net_shm *s = NULL;
  hvd_status st = net_shm_get(w->global, 65536, 4096, &s);

  if (st != HVD_OK)
    return status_exit(st);
  if (s == NULL)
    return EXIT_WRONG;
  for (int p = 0; p < w->size; p++) {
    bool want = p != w->rank && (p == 0 || w->rank == 0);
    if ((w->global->conns[p].ring_rx != NULL) != want) {
      fprintf(stderr, "rank %d: link to %d is %s\n", w->rank, p, want ? "missing" : "there");
      return EXIT_WRONG;
    }
  }
  return fn(w, store, NULL);
}

START_TEST(links_carry_messages_both_ways) {
  int codes[2];
  static const rank_fn fn = exchange_fn;
  run_job(&job, 2, linked_fn, (void *)&fn, codes, 120);
  expect_all(codes, 2, 0);
}
END_TEST

START_TEST(links_receive_unknown_lengths) {
  int codes[2];
  static const rank_fn fn = upto_fn;
  run_job(&job, 2, linked_fn, (void *)&fn, codes, 60);
  ck_assert_int_eq(codes[0], 0);
  ck_assert_int_eq(codes[1], EXIT_PROTOCOL);
}
END_TEST

/* Rank 0 exchanges with every other rank over links; rank 2 is killed. */
static int star_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  char out[512] = {0}, in[512];
  (void)store;
  (void)arg;
  for (int i = 0; i < 1000000; i++) {
    hvd_status st = HVD_OK;
    if (i == 100 && w->rank == 2)
      raise(SIGKILL);
    for (int p = 1; p < w->size && st == HVD_OK; p++) {
      if (w->rank == 0)
        st = net_sendrecv(w->global, p, out, sizeof(out), p, in, sizeof(in));
      else if (w->rank == p)
        st = net_sendrecv(w->global, 0, out, sizeof(out), 0, in, sizeof(in));
    }
    if (st != HVD_OK)
      return status_exit(st);
  }
  return 0;
}

START_TEST(killed_peer_fails_links_fast) {
  int codes[3];
  job.timeout_ms = 60000; /* the pidfd, not the timeout, must end it */
  static const rank_fn fn = star_fn;
  run_job(&job, 3, linked_fn, (void *)&fn, codes, 40);
  ck_assert_int_eq(codes[2], -SIGKILL);
  ck_assert_msg(codes[0] == EXIT_NETWORK, "rank 0 exited with %d", codes[0]);
  ck_assert_msg(codes[1] == EXIT_NETWORK, "rank 1 exited with %d", codes[1]);
}
END_TEST

/* ---- the shared segment's set-up, and who may delay it ------------------------------ */

/* Pipes made before the ranks and the stranger fork. */
struct setup_pipes {
  int pid[2];    /* rank 0 -> stranger: rank 0's pid */
  int go[2];     /* stranger -> rank 1: set up now */
  int result[2]; /* stranger -> test: what it saw */
  int done[2];   /* test -> stranger: the job is over (closed) */
};

struct stranger_result {
  int connected; /* silent connections it made before rank 1 connected */
  int closed;    /* of the first batch, those rank 0 closed */
};

enum { SILENT = 8 };

static bool read_within(int fd, void *buf, size_t len, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, ms) == 1 && read(fd, buf, len) == (ssize_t)len;
}

/* The name of the segment's socket that process pid listens on (without
 * the '@' of the abstract namespace), as a local user finds it in
 * /proc/net/unix; the inode tells which of the host's it is. */
static bool setup_socket_of(pid_t pid, char *name, size_t cap) {
  char path[64], link[64], line[512];
  unsigned long inodes[64];
  int n = 0;
  bool found = false;
  struct dirent *e;
  DIR *d;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  if ((d = opendir(path)) == NULL)
    return false;
  while ((e = readdir(d)) != NULL && n < 64) {
    char fd_path[320];
    ssize_t k;
    snprintf(fd_path, sizeof(fd_path), "%s/%s", path, e->d_name);
    k = readlink(fd_path, link, sizeof(link) - 1);
    if (k > 0) {
      link[k] = 0;
      if (sscanf(link, "socket:[%lu]", &inodes[n]) == 1)
        n++;
    }
  }
  closedir(d);
  if ((f = fopen("/proc/net/unix", "r")) == NULL)
    return false;
  while (!found && fgets(line, sizeof(line), f) != NULL) {
    unsigned long inode;
    char sock_path[128];
    if (sscanf(line, "%*s %*s %*s %*s %*s %*s %lu %127s", &inode, sock_path) != 2 ||
        strncmp(sock_path, "@hvd-shm-", 9) != 0)
      continue;
    for (int i = 0; i < n && !found; i++) {
      if (inodes[i] == inode) {
        snprintf(name, cap, "%.100s", sock_path + 1);
        found = true;
      }
    }
  }
  fclose(f);
  return found;
}

/* Up to n silent connections to the abstract socket name (a full queue
 * refuses the rest); returns how many, their descriptors in fds. */
static int connect_silently(const char *name, int n, int *fds) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
  int k = 0;

  memcpy(sa.sun_path + 1, name, strlen(name));
  for (int i = 0; i < n; i++) {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, len) == 0)
      fds[k++] = fd;
    else if (fd >= 0)
      close(fd);
  }
  return k;
}

/* A process that is not a member (of uid 65534 when other_uid, else of
 * ours) finds rank 0's set-up socket and connects silently, twice: the
 * first connections must be closed (10 s is a bound for a hang, not a
 * wait); the second ones are still there when rank 1 connects, and held
 * until the job is over. */
static int stranger_main(struct setup_pipes *p, bool other_uid) {
  struct stranger_result res = {0, 0};
  int first[SILENT], second[SILENT];
  int64_t until = hvd_deadline_after_ms(30000);
  char name[108] = "", byte = 1;
  pid_t pid0;

  close(p->done[1]);
  if (!read_within(p->pid[0], &pid0, sizeof(pid0), 30000))
    return 10;
  while (!setup_socket_of(pid0, name, sizeof(name)) && hvd_now_ns() < until)
    hvd_sleep_ns(1000000);
  if (name[0] == 0)
    return 11;
  if (other_uid && (setgid(65534) != 0 || setuid(65534) != 0))
    return 12;
  res.connected = connect_silently(name, SILENT, first);
  res.closed = count_closed(first, res.connected, res.connected, 10000);
  (void)connect_silently(name, SILENT, second);
  if (write(p->go[1], &byte, 1) != 1 || write(p->result[1], &res, sizeof(res)) != sizeof(res))
    return 13;
  while (read(p->done[0], &byte, 1) > 0) {
  }
  return 0;
}

/* Rank 0 tells the stranger its pid and sets up; rank 1 waits until the
 * stranger has connected. Both must get the segment and use it: a
 * barrier, and each rank's number read by the other. */
static int guarded_setup_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  struct setup_pipes *p = arg;
  struct net_shm *s = NULL;
  hvd_status st;
  unsigned b;
  char byte;
  (void)store;

  if (w->rank == 0) {
    pid_t pid = getpid();
    if (write(p->pid[1], &pid, sizeof(pid)) != sizeof(pid))
      return EXIT_FAILED;
  } else if (!read_within(p->go[0], &byte, 1, 30000)) {
    fprintf(stderr, "rank 1: the stranger never connected\n");
    return EXIT_FAILED;
  }
  if ((st = net_shm_get(w->global, 65536, 0, &s)) != HVD_OK)
    return status_exit(st);
  if (s == NULL) {
    fprintf(stderr, "rank %d: the job runs on TCP\n", w->rank);
    return EXIT_WRONG;
  }
  b = net_shm_next_round(s);
  net_shm_post(s, b, 100 + (uint64_t)w->rank);
  if ((st = net_shm_barrier(s)) != HVD_OK)
    return status_exit(st);
  return net_shm_value(s, 1 - w->rank, b) == 100 + (uint64_t)(1 - w->rank) ? 0 : EXIT_WRONG;
}

/* A 2-rank job sets up shared memory while a process that is not a member
 * holds silent connections to the set-up socket. The timeout (60 s) is
 * far above the test's deadline (30 s): a job that waited for it is
 * killed, and fails. */
static void setup_beside_stranger(bool other_uid) {
  struct setup_pipes p;
  struct stranger_result res = {-1, -1};
  pid_t stranger;
  int codes[2], status;

  ck_assert_int_eq(pipe2(p.pid, O_CLOEXEC), 0);
  ck_assert_int_eq(pipe2(p.go, O_CLOEXEC), 0);
  ck_assert_int_eq(pipe2(p.result, O_CLOEXEC), 0);
  ck_assert_int_eq(pipe2(p.done, O_CLOEXEC), 0);
  stranger = fork();
  ck_assert_int_ge(stranger, 0);
  if (stranger == 0) {
    alarm(90);
    _exit(stranger_main(&p, other_uid));
  }
  job.timeout_ms = 60000;
  run_job(&job, 2, guarded_setup_fn, &p, codes, 30);
  close(p.done[1]);
  (void)read_within(p.result[0], &res, sizeof(res), 1000);
  ck_assert_int_eq(waitpid(stranger, &status, 0), stranger);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "stranger: status %d", status);
  expect_all(codes, 2, 0);
  ck_assert_msg(res.connected > 0, "the stranger could not connect");
  ck_assert_msg(res.closed == res.connected, "%d of the stranger's %d connections were closed",
                res.closed, res.connected);
  for (int i = 0; i < 2; i++) {
    close(p.pid[i]);
    close(p.go[i]);
    close(p.result[i]);
  }
  close(p.done[0]);
}

START_TEST(shm_setup_ignores_silent_process_of_our_uid) { setup_beside_stranger(false); }
END_TEST

START_TEST(shm_setup_ignores_silent_stranger) { setup_beside_stranger(true); }
END_TEST

/* How a rank's set-up of shared memory fails (arg: the case). */
enum setup_case { PEER_DIES, PEER_WITHOUT_SHM, ROOT_WITHOUT_SHM };

static int failed_setup_fn(struct net_world *w, struct rdzv_client *store, void *arg) {
  enum setup_case c = *(const enum setup_case *)arg;
  bool skips = (c == ROOT_WITHOUT_SHM) == (w->rank == 0);
  const char *msg;
  struct net_shm *s = NULL;
  uint64_t word = 7;
  hvd_status st;
  (void)store;

  if (skips && c == PEER_DIES)
    _exit(0);
  if (skips) { /* HVD_SHM=0 here: a TCP collective goes ahead */
    st = net_send(w->global, 1 - w->rank, &word, sizeof(word));
    if (st == HVD_OK)
      (void)net_recv(w->global, 1 - w->rank, &word, sizeof(word));
    return 0;
  }
  st = net_shm_get(w->global, 65536, 0, &s);
  msg = hvd_last_error_message();
  fprintf(stderr, "rank %d: %s\n", w->rank, msg);
  if (st == HVD_OK || strstr(msg, "left communicator") != NULL)
    return EXIT_WRONG;
  if (c == PEER_DIES)
    return strstr(msg, "rank 1") != NULL ? 0 : EXIT_WRONG;
  return strstr(msg, "HVD_SHM must be the same on every rank") != NULL ? 0 : EXIT_WRONG;
}

/* The message of a failed set-up names the peer and why, not the rank
 * that prints it. */
START_TEST(shm_setup_failure_names_the_cause) {
  static const enum setup_case cases[] = {PEER_DIES, PEER_WITHOUT_SHM, ROOT_WITHOUT_SHM};
  int codes[2];

  job.timeout_ms = 5000;
  for (size_t i = 0; i < HVD_ARRAY_SIZE(cases); i++) {
    int asserted = cases[i] == ROOT_WITHOUT_SHM ? 1 : 0;
    run_job(&job, 2, failed_setup_fn, (void *)&cases[i], codes, 30);
    ck_assert_msg(codes[asserted] == 0, "case %zu: rank %d exited with %d", i, asserted,
                  codes[asserted]);
  }
}
END_TEST

static Suite *comm_suite(void) {
  Suite *s = suite_create("comm");
  TCase *tc = tcase_create("comm");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_add_test(tc, rings_of_1_to_8);
  tcase_add_test(tc, two_hosts_three_slots_derived);
  tcase_add_test(tc, two_hosts_three_slots_given);
  tcase_add_test(tc, sendrecv_sizes_both_directions);
  tcase_add_test(tc, scatter_gather_and_ordering);
  tcase_add_test(tc, lazy_links_full_mesh);
  tcase_add_test(tc, length_mismatch_is_an_error);
  tcase_add_test(tc, receives_of_unknown_length);
  tcase_add_test(tc, waiting_for_events);
  tcase_add_test(tc, derived_communicators);
  tcase_add_test(tc, links_carry_messages_both_ways);
  tcase_add_test(tc, links_receive_unknown_lengths);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *failure_suite(void) {
  Suite *s = suite_create("failure");
  TCase *tc = tcase_create("failure");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_add_test(tc, killed_peer_fails_others_fast);
  tcase_add_test(tc, killed_peer_fails_links_fast);
  tcase_add_test(tc, silent_peer_times_out);
  tcase_add_test(tc, stray_connections_rejected);
  tcase_add_test(tc, stray_flood_is_bounded_and_parked_sockets_expire);
  tcase_add_test(tc, listener_at_emfile_sheds_connections);
  tcase_add_test(tc, wrong_token_rank_is_refused);
  tcase_add_test(tc, abandoned_round_fails_the_communicator);
  tcase_add_test(tc, abandoned_round_ends_waiting_ranks);
  tcase_add_test(tc, shm_setup_ignores_silent_process_of_our_uid);
  tcase_add_test(tc, shm_setup_failure_names_the_cause);
  suite_add_tcase(s, tc);
  return s;
}

/* A suite of its own: it needs root to become another uid, and main
 * reports it skipped (77) elsewhere. */
static Suite *outsider_suite(void) {
  Suite *s = suite_create("outsider");
  TCase *tc = tcase_create("outsider");
  tcase_add_checked_fixture(tc, job_setup, job_teardown);
  tcase_add_test(tc, shm_setup_ignores_silent_stranger);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const char *only = getenv("CK_RUN_SUITE");
  SRunner *sr;
  int failed;

  if (only != NULL && strcmp(only, "outsider") == 0 && geteuid() != 0) {
    printf("skipped: not root, so the test cannot become another uid\n");
    return 77;
  }
  sr = srunner_create(wire_suite());
  signal(SIGPIPE, SIG_IGN);
  srunner_add_suite(sr, iface_suite());
  srunner_add_suite(sr, comm_suite());
  srunner_add_suite(sr, failure_suite());
  if (geteuid() == 0)
    srunner_add_suite(sr, outsider_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
