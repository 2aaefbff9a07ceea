/*
 * Writes the generated seeds of the fuzz corpora: valid inputs made with
 * hvd's own encoders (the coordinator's lists, scope bodies, peer records,
 * HELLOs and ACKs), requests and texts like those the tests send, and edge
 * cases next to them. Run it from the source tree after a change of a wire
 * format:  build/bin/fuzz_make_seeds tests/fuzz/corpus
 * Seeds it does not make (crash-* regressions, found-* inputs the fuzzers
 * found) are left alone. Files are named <corpus>/seed-<what>.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coord/coord.h"
#include "rendezvous/rendezvous.h"
#include "transport/transport_private.h"

static const char *root;

static void put(const char *corpus, const char *what, const void *data, size_t len) {
  char path[512];
  FILE *f;
  snprintf(path, sizeof(path), "%s/%s", root, corpus);
  if (mkdir(path, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "make_seeds: mkdir %s: %s\n", path, strerror(errno));
    exit(1);
  }
  snprintf(path, sizeof(path), "%s/%s/seed-%s", root, corpus, what);
  f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
    fprintf(stderr, "make_seeds: %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

static void put_text(const char *corpus, const char *what, const char *text) {
  put(corpus, what, text, strlen(text));
}

static void must(hvd_status st) {
  if (st != HVD_OK) {
    fprintf(stderr, "make_seeds: %s\n", hvd_last_error_message());
    exit(1);
  }
}

/* ---- coord -------------------------------------------------------------- */

static void request(struct coord_request *r, const char *name, int type) {
  memset(r, 0, sizeof(*r));
  r->type = (uint8_t)type;
  r->dtype = HVD_FLOAT32;
  r->op = HVD_SUM;
  r->root = 0;
  r->rank = 0;
  r->device = HVD_DEVICE_CPU;
  r->prescale = 1.0;
  r->postscale = 1.0;
  r->name = strdup(name);
  r->name_len = (uint32_t)strlen(name);
  r->ndims = 2;
  r->shape[0] = 3;
  r->shape[1] = 5;
}

static void coord_seeds(void) {
  struct coord_request_list rl;
  struct coord_response_list pl;
  struct coord_response *p;
  struct hvd_buf b;

  /* Requests: an inline allreduce, a grouped one, a process set, a cache hit. */
  memset(&rl, 0, sizeof(rl));
  rl.ack = 41;
  rl.n = 4;
  rl.reqs = calloc(rl.n, sizeof(*rl.reqs));
  request(&rl.reqs[0], "layer1.weight", COORD_ALLREDUCE);
  rl.reqs[0].op = HVD_AVERAGE;
  rl.reqs[0].prescale = 0.25;
  rl.reqs[0].ndims = 1;
  rl.reqs[0].shape[0] = 2;
  rl.reqs[0].inline_len = 8;
  memcpy(rl.reqs[0].inline_data, "\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  request(&rl.reqs[1], "grouped.b", COORD_ALLREDUCE);
  rl.reqs[1].group = strdup("grouped.a");
  rl.reqs[1].group_len = 9;
  rl.reqs[1].group_size = 2;
  request(&rl.reqs[2], "ps", COORD_SET_ADD);
  rl.reqs[2].ndims = 0;
  rl.reqs[2].nranks = 2;
  rl.reqs[2].ranks = malloc(2 * sizeof(int32_t));
  rl.reqs[2].ranks[0] = 1;
  rl.reqs[2].ranks[1] = 3;
  request(&rl.reqs[3], "bcast", COORD_BROADCAST);
  rl.reqs[3].root = 1;
  rl.reqs[3].dtype = HVD_INT64;
  rl.hits_bytes = 2;
  rl.hits = malloc(2);
  memcpy(rl.hits, "\x05\x80", 2);
  rl.ninline_hits = 1;
  rl.inline_hits = calloc(1, sizeof(*rl.inline_hits));
  rl.inline_hits[0].bit = 12;
  rl.inline_hits[0].len = 4;
  memcpy(rl.inline_hits[0].data, "\xaa\xbb\xcc\xdd", 4);
  hvd_buf_init(&b, COORD_MAX_MESSAGE);
  must(coord_encode_requests(&rl, &b));
  put("coord", "requests", b.data, b.len);
  hvd_buf_reset(&b);
  /* The shutdown a worker sends, with an abort message. */
  coord_request_list_fini(&rl);
  rl.flags = COORD_FLAG_SHUTDOWN | COORD_FLAG_ABORT;
  rl.abort_status = HVD_ERR_IO;
  rl.abort_message = strdup("rank 2: connection reset");
  must(coord_encode_requests(&rl, &b));
  put("coord", "requests-abort", b.data, b.len);
  hvd_buf_reset(&b);
  coord_request_list_fini(&rl);
  must(coord_encode_requests(&rl, &b));
  put("coord", "requests-empty", b.data, b.len);
  hvd_buf_reset(&b);

  /* Responses: a fused allreduce, a cached one with its inline result, an
   * error, an allgather's counts, a join. */
  memset(&pl, 0, sizeof(pl));
  pl.seq = 7;
  pl.n = 5;
  pl.resps = calloc(pl.n, sizeof(*pl.resps));
  p = &pl.resps[0];
  p->type = COORD_ALLREDUCE;
  p->dtype = HVD_FLOAT32;
  p->op = HVD_SUM;
  p->last_joined = -1;
  p->new_set = -1;
  p->prescale = p->postscale = 1.0;
  p->ntensors = 2;
  p->names = calloc(2, sizeof(char *));
  p->names[0] = strdup("a");
  p->names[1] = strdup("bb");
  p->bits = malloc(2 * sizeof(int32_t));
  p->bits[0] = 5;
  p->bits[1] = -1;
  p->ncounts = 2;
  p->counts = malloc(2 * sizeof(int64_t));
  p->counts[0] = 15;
  p->counts[1] = 1000000000000LL;
  p = &pl.resps[1];
  p->cached = true;
  p->ntensors = 1;
  p->bits = malloc(sizeof(int32_t));
  p->bits[0] = 7;
  p->data_len = 4;
  p->data = malloc(4);
  memcpy(p->data, "\x00\x00\x80\x3f", 4);
  p = &pl.resps[2];
  p->type = COORD_ERROR;
  p->status = HVD_ERR_MISMATCH;
  p->last_joined = -1;
  p->new_set = -1;
  p->ntensors = 1;
  p->names = calloc(1, sizeof(char *));
  p->names[0] = strdup("x");
  p->bits = malloc(sizeof(int32_t));
  p->bits[0] = -1;
  p->error = strdup("mismatched shapes: rank 0 sent [1], rank 1 sent [2]");
  p = &pl.resps[3];
  p->type = COORD_ALLGATHER;
  p->dtype = HVD_UINT8;
  p->last_joined = -1;
  p->new_set = -1;
  p->ntensors = 1;
  p->names = calloc(1, sizeof(char *));
  p->names[0] = strdup("gathered");
  p->bits = malloc(sizeof(int32_t));
  p->bits[0] = 0;
  p->ncounts = 3;
  p->counts = calloc(3, sizeof(int64_t));
  p->counts[1] = 4;
  p->counts[2] = 9;
  p = &pl.resps[4];
  p->type = COORD_SET_ADD;
  p->last_joined = 2;
  p->new_set = 3;
  p->ntensors = 1;
  p->names = calloc(1, sizeof(char *));
  p->names[0] = strdup("process_set.3");
  p->bits = malloc(sizeof(int32_t));
  p->bits[0] = -1;
  p->nranks = 2;
  p->ranks = malloc(2 * sizeof(int32_t));
  p->ranks[0] = 0;
  p->ranks[1] = 2;
  pl.nretired = 2;
  pl.retired = malloc(2 * sizeof(int32_t));
  pl.retired[0] = 1;
  pl.retired[1] = 4;
  must(coord_encode_responses(&pl, &b));
  put("coord", "responses", b.data, b.len);
  hvd_buf_reset(&b);
  coord_response_list_fini(&pl);
  {
    /* Lanes granted to two cache bits. */
    int32_t lanes[2] = {3, 17};
    pl.seq = 12;
    pl.flags = COORD_FLAG_LANES;
    pl.nlanes = 2;
    pl.lanes = lanes;
    must(coord_encode_responses(&pl, &b));
    put("coord", "responses-lanes", b.data, b.len);
    hvd_buf_reset(&b);
    pl.lanes = NULL;
    pl.nlanes = 0;
  }
  pl.seq = 0;
  pl.flags = COORD_FLAG_HEARTBEAT;
  must(coord_encode_responses(&pl, &b));
  put("coord", "responses-heartbeat", b.data, b.len);
  hvd_buf_reset(&b);
  {
    /* An autotuner setting riding on an empty list. */
    struct tune_setting t = {.number = 3, .fusion_threshold = 1 << 20, .cycle_ns = 2000000,
                                   .allreduce_ring_bytes = 1 << 24, .segment_bytes = 1 << 19,
                                   .cache_enabled = true, .final = true};
    pl.seq = 7;
    pl.flags = COORD_FLAG_TUNE;
    tune_setting_encode(&t, pl.tune);
    must(coord_encode_responses(&pl, &b));
    put("coord", "responses-tune", b.data, b.len);
    hvd_buf_reset(&b);
  }
  /* Edge cases: the preamble alone, a wrong version. */
  put("coord", "preamble", "HVDC\x02\x00\x01\x00", 8);
  put("coord", "version-1", "HVDC\x01\x00\x02\x00\x07\x00\x00\x00\x00\x00\x00\x00", 16);
  hvd_buf_fini(&b);
}

/* ---- scope bodies and peer records ----------------------------------------- */

static void scope_seeds(void) {
  struct hvd_buf b;
  hvd_buf_init(&b, 0);
  must(rdzv_scope_encode_entry(&b, "0", 1, "{\"rank\":0}", 10));
  must(rdzv_scope_encode_entry(&b, "1", 1, "{\"rank\":1}", 10));
  must(rdzv_scope_encode_entry(&b, "10", 2, "x", 1));
  must(rdzv_scope_encode_entry(&b, "a", 1, "", 0));
  must(rdzv_scope_encode_entry(&b, "b\nc", 3, "\x00\x01\xff", 3));
  put("scope", "mixed", b.data, b.len);
  hvd_buf_reset(&b);
  must(rdzv_scope_encode_entry(&b, "007", 3, "leading zeros", 13));
  must(rdzv_scope_encode_entry(&b, "8", 1, "v", 1));
  put("scope", "zeros", b.data, b.len);
  put("scope", "empty", "", 0);
  put_text("scope", "out-of-order", "1 1\nb\nx\n1 1\na\ny\n");
  put_text("scope", "huge-length", "1 99999999999999999999\nk\nv\n");
  hvd_buf_fini(&b);
}

static void record_seeds(void) {
  struct rdzv_record r;
  struct hvd_buf b;
  memset(&r, 0, sizeof(r));
  r.rank = 3;
  r.global_rank = 7;
  snprintf(r.host, sizeof(r.host), "node1");
  r.local_rank = 1;
  r.pid = 4242;
  r.generation = 12;
  r.port = 40123;
  snprintf(r.addrs[0], sizeof(r.addrs[0]), "10.0.0.5");
  snprintf(r.addrs[1], sizeof(r.addrs[1]), "fe80::1%%eth0");
  r.naddrs = 2;
  r.shm = 1;
  hvd_buf_init(&b, 0);
  must(rdzv_record_encode(&r, &b));
  put("record", "two-addrs", b.data, b.len);
  put_text("record", "hand",
           "{\"v\":1,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":-1,\"pid\":1,"
           "\"gen\":\"18446744073709551615\",\"port\":65535,\"addrs\":[\"127.0.0.1\"]}");
  put_text("record", "version-2", "{\"v\":2}");
  put_text("record", "shm-2",
           "{\"v\":1,\"rank\":0,\"global_rank\":0,\"host\":\"h\",\"local_rank\":-1,\"pid\":1,"
           "\"gen\":\"1\",\"port\":1,\"shm\":2,\"addrs\":[\"127.0.0.1\"]}");
  put_text("record", "abandoned", RDZV_RECORD_ABANDONED);
  hvd_buf_fini(&b);
}

/* ---- handshake ------------------------------------------------------------- */

static void hello_seed(const char *what, uint16_t version, const char *token, uint64_t gen) {
  struct net_hello h;
  unsigned char out[NET_HELLO_MAX];
  memset(&h, 0, sizeof(h));
  h.version = version;
  h.token_len = (uint16_t)strlen(token);
  memcpy(h.token, token, h.token_len);
  h.comm_id = NET_COMM_GLOBAL;
  h.from = 1;
  h.to = 2;
  h.from_global = 1;
  h.generation = gen;
  put("handshake", what, out, net_hello_encode(&h, out));
}

static void handshake_seeds(void) {
  unsigned char ack[NET_ACK_BYTES];
  /* The harness's listener expects the token "fuzz-token", generation 7. */
  hello_seed("hello-good", NET_PROTOCOL_VERSION, "fuzz-token", 7);
  hello_seed("hello-no-token", NET_PROTOCOL_VERSION, "", 7);
  hello_seed("hello-bad-token", NET_PROTOCOL_VERSION, "fuzz-tokem", 7);
  hello_seed("hello-bad-version", 2, "fuzz-token", 7);
  hello_seed("hello-bad-generation", NET_PROTOCOL_VERSION, "fuzz-token", 8);
  net_ack_encode(NET_ACK_OK, ack);
  put("handshake", "ack-ok", ack, sizeof(ack));
  net_ack_encode(NET_ACK_BAD_TOKEN, ack);
  put("handshake", "ack-bad-token", ack, sizeof(ack));
  put_text("handshake", "http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
}

/* ---- HTTP ---------------------------------------------------------------------- */

static void http_seeds(void) {
  static const struct {
    const char *what, *text;
  } seeds[] = {
      {"put-get", "PUT /s/k HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                  "GET /s/k HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"get-scope", "PUT /s/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na"
                    "PUT /s/1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nb"
                    "GET /s?count=2&wait=10 HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"wait-timeout", "GET /s/k?wait=5 HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"add", "POST /s/n?add=-3 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
              "POST /s/n?add=9223372036854775807 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"},
      {"cas", "PUT /s/k HTTP/1.1\r\nHost: x\r\nIf-None-Match: *\r\nContent-Length: 1\r\n\r\nx"
              "PUT /s/k HTTP/1.1\r\nHost: x\r\nIf-Match: \"1\"\r\nContent-Length: 1\r\n\r\ny"},
      {"delete", "PUT /s/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx"
                 "DELETE /s/k HTTP/1.1\r\nHost: x\r\n\r\nDELETE /s HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"head", "HEAD /s/k HTTP/1.1\r\nHost: x\r\n\r\nHEAD /_health HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"health", "GET /_health HTTP/1.0\r\n\r\n"},
      {"chunked", "PUT /t/k3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nGET /t/k3 HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"http10", "PUT /s/k2 HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc"},
      {"escapes", "GET /a%2fb/c%00d?wait=1%30 HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"smuggle", "PUT /c/k HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 44\r\n\r\n"
                  "PUT /c/evil HTTP/1.1\r\nContent-Length: 0\r\n\r\n"},
      {"te-and-length", "PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"},
      {"too-large", "PUT /s/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"},
      {"long-name", "GET /s/12345678901234567890123456789012345678901234567890123456789012345 "
                    "HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"blocking", "PUT /blocking/0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n3"
                   "GET /blocking/0 HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"methods", "BREW /a/b HTTP/1.1\r\nHost: x\r\n\r\nOPTIONS /a/b HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"bad-params", "GET /a/b?bogus=1&wait=-1 HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"reserved", "GET /_secret/b HTTP/1.1\r\nHost: x\r\n\r\n"},
      {"garbage", "\x01\x02garbage\xff\xfe\r\n\r\n"},
      {"full-store", NULL}, /* made below: five 1000-byte values, past the 4096-byte store */
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(seeds); i++) {
    if (seeds[i].text == NULL) {
      struct hvd_buf b;
      hvd_buf_init(&b, 0);
      for (int k = 0; k < 5; k++) {
        char head[128];
        int n = snprintf(head, sizeof(head),
                         "PUT /s/%c HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", 'a' + k);
        must(hvd_buf_append(&b, head, (size_t)n));
        for (int j = 0; j < 1000; j++)
          must(hvd_buf_append(&b, "v", 1));
      }
      put("http", seeds[i].what, b.data, b.len);
      hvd_buf_fini(&b);
      continue;
    }
    put_text("http", seeds[i].what, seeds[i].text);
  }
}

/* ---- text and launcher ------------------------------------------------------- */

static void text_seeds(void) {
  static const char *const seeds[] = {
      "42", "-9223372036854775808", "9223372036854775808", "+007", " 1e3 ", "0x10", "1.5e-300",
      "inf", "nan", "TRUE", "off", "Warn", " debug\n", "10.0.0.5", "::1", "fe80::1%lo",
      "fe80::1%4294967295", "::ffff:1.2.3.4", "eth", "^docker,lo", "=ib,eth0", "ib,", "",
      "gpu[01-04,07],cpu-a[1-2]", "rack[1-2]-n[08-11]", "n[2-1]", "n[1-2", "2(x3),1", "1(x0)",
  };
  for (size_t i = 0; i < HVD_ARRAY_SIZE(seeds); i++) {
    char what[32];
    snprintf(what, sizeof(what), "%02zu", i);
    put_text("text", what, seeds[i]);
  }
}

static void launcher_seeds(void) {
  put_text("launcher", "dash-h", "h1:2,h2:4,localhost");
  put_text("launcher", "hostfile", "# hosts\nnode1 slots=4\n\n  node2\tslots=2  # two\nnode3\n");
  put_text("launcher", "discovery", "node1:4\n  node2  \n\nnode1:4\r\nnode3:4096\n");
  put_text("launcher", "bad-slots", "h1:0,h2:4097,h3:");
  put_text("launcher", "twice", "a:1\na:2\n");
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  coord_seeds();
  scope_seeds();
  record_seeds();
  handshake_seeds();
  http_seeds();
  text_seeds();
  launcher_seeds();
  return 0;
}
