/*
 * Real etcd clusters for the tests (see etcd_cluster.h).
 *
 * DESIGN. A member is two processes: a keeper, forked from the test
 * process, and etcd, forked from the keeper and exec'd. The keeper exists
 * for the lifetime cap (etcd is a Go program: it ignores SIGALRM, so
 * alarm() before exec cannot bound it): it waits for etcd with
 * sigtimedwait and SIGKILLs it at the deadline, then exits with etcd's
 * code (128 + signal where etcd was killed). Both set PR_SET_PDEATHSIG, so
 * the death of the test process takes the keeper, and the keeper's takes
 * etcd. The test process reaps keepers only; it signals etcd's pid, which
 * the keeper sends back through a pipe.
 *
 * Ports are chosen at random below the kernel's ephemeral range (so no
 * outgoing connection's local port, and no other test's port-0 listener,
 * takes them between our choice and etcd's bind), after a bind probe. Two
 * clusters started at once may still choose the same free port: one of
 * the members then fails to bind, its keeper exits, and start retries the
 * whole cluster with new ports and fresh data directories. Each cluster has
 * its own --initial-cluster-token, so members of different clusters never
 * join each other.
 *
 * Health comes from the JSON gateway's /v3/maintenance/status (it needs
 * no token, even with auth on, in 3.4): each member's header.member_id and
 * the leader it follows, both uint64 written as decimal strings. A member
 * binds its client port long before it serves it (it serves once it has
 * joined the cluster); requests sent meanwhile wait, so the status timeout
 * is long (5 s). With a short one (0.2 to 1 s), abandoned requests went
 * with members that answered only after about 2 s instead of 0.2 s.
 */
#include "etcd_cluster.h"

#include <arpa/inet.h>
#include <check.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
  START_ATTEMPTS = 5,
  POLL_MS = 50,
  STATUS_TIMEOUT_MS = 5000,
  REQUEST_TIMEOUT_MS = 10000,
  REPLY_CAP = 16 << 20, /* bytes of one gateway reply */
  LOG_TAIL = 4096,      /* bytes of each member's log shown on failure */
};

static const char *etcd_binary(void) {
  const char *path = getenv("HVD_TEST_ETCD");
  return path != NULL && path[0] != '\0' ? path : "/usr/bin/etcd";
}

/* ==== time ====================================================================== */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ==== availability =============================================================== */

const char *etcd_cluster_missing(void) {
  static char why[512];
  const char *bin = etcd_binary();
  char out[256] = "";
  size_t got = 0;
  int pfd[2], status, major = 0, minor = 0;
  const char *v;
  pid_t pid;
  ssize_t n;

  if (access(bin, X_OK) != 0) {
    snprintf(why, sizeof(why),
             "no etcd at %s (%s): install Debian's etcd-server (scripts/setup.sh) or set "
             "HVD_TEST_ETCD to an etcd binary",
             bin, strerror(errno));
    return why;
  }
  if (pipe2(pfd, O_CLOEXEC) != 0) {
    snprintf(why, sizeof(why), "pipe2: %s", strerror(errno));
    return why;
  }
  pid = fork();
  if (pid == 0) {
    dup2(pfd[1], STDOUT_FILENO);
    execl(bin, bin, "--version", (char *)NULL);
    _exit(127);
  }
  close(pfd[1]);
  while (pid > 0 && got + 1 < sizeof(out)) {
    n = read(pfd[0], out + got, sizeof(out) - 1 - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  out[got] = '\0';
  close(pfd[0]);
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    snprintf(why, sizeof(why), "%s --version failed: is it an etcd binary?", bin);
    return why;
  }
  v = strstr(out, "etcd Version: ");
  if (v == NULL || sscanf(v, "etcd Version: %d.%d", &major, &minor) != 2) {
    snprintf(why, sizeof(why), "%s --version printed no version", bin);
    return why;
  }
  if (major != 3 || minor < 4) {
    snprintf(why, sizeof(why), "%s is etcd %d.%d; the tests need 3.4 or later (v3 API)", bin,
             major, minor);
    return why;
  }
  return NULL;
}

/* ==== files ====================================================================== */

static int remove_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

static void remove_tree(const char *path) { nftw(path, remove_cb, 16, FTW_DEPTH | FTW_PHYS); }

__attribute__((format(printf, 3, 4))) static void log_line(const struct etcd_cluster *c, int i,
                                                          const char *fmt, ...) {
  char path[300];
  FILE *f;
  va_list ap;
  snprintf(path, sizeof(path), "%s/m%d.log", c->dir, i);
  f = fopen(path, "a");
  if (f == NULL)
    return;
  fputs("==== etcd_cluster: ", f);
  va_start(ap, fmt);
  vfprintf(f, fmt, ap);
  va_end(ap);
  fputc('\n', f);
  fclose(f);
}

/* The end of member i's log, or "" (static buffer). */
static const char *log_tail(const struct etcd_cluster *c, int i) {
  static char buf[LOG_TAIL + 1];
  char path[300];
  size_t n = 0;
  long size;
  FILE *f;
  snprintf(path, sizeof(path), "%s/m%d.log", c->dir, i);
  buf[0] = '\0';
  f = fopen(path, "r");
  if (f == NULL)
    return buf;
  if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > LOG_TAIL)
    fseek(f, size - LOG_TAIL, SEEK_SET);
  else
    fseek(f, 0, SEEK_SET);
  n = fread(buf, 1, LOG_TAIL, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static void dump_logs(const struct etcd_cluster *c) {
  for (int i = 0; i < c->size; i++)
    fprintf(stderr, "---- etcd member %d (%s/m%d.log), last %d bytes:\n%s\n", i, c->dir, i,
            LOG_TAIL, log_tail(c, i));
}

/* ck_abort_msg with the members' logs on stderr first. */
#define CLUSTER_ASSERT(c, cond, ...)                                                               \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      dump_logs(c);                                                                                \
      ck_abort_msg(__VA_ARGS__);                                                                   \
    }                                                                                              \
  } while (0)

/* ==== ports ====================================================================== */

static uint64_t rng_state;

static uint32_t rng_next(void) {
  if (rng_state == 0) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    rng_state = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)ts.tv_sec << 20;
    rng_state |= 1;
  }
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

/* Whether 127.0.0.1:port can be bound now (0: bind a port the kernel
 * picks); *bound gets the port. */
static bool probe_port(int port, int *bound) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok;
  if (fd < 0)
    return false;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ok = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
       getsockname(fd, (struct sockaddr *)&a, &len) == 0;
  close(fd);
  if (ok)
    *bound = ntohs(a.sin_port);
  return ok;
}

/* A free port outside the kernel's ephemeral range and not in taken[n]. */
static int pick_port(const int *taken, int n) {
  int lo = 32768, hi = 60999, from = 0, to = 0, port = 0;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f != NULL) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2)
      lo = 32768, hi = 60999;
    fclose(f);
  }
  if (lo - 10000 >= 2000)
    from = 10000, to = lo - 1;
  else if (65535 - hi >= 2000)
    from = hi + 1, to = 65535;
  for (int attempt = 0; attempt < 1000; attempt++) {
    bool dup = false;
    int want = to > from ? from + (int)(rng_next() % (uint32_t)(to - from + 1)) : 0;
    if (!probe_port(want, &port))
      continue;
    for (int k = 0; k < n; k++)
      dup = dup || taken[k] == port;
    if (!dup)
      return port;
  }
  return 0;
}

/* ==== members ==================================================================== */

static bool running(const struct etcd_cluster *c, int i) { return c->members[i].keeper > 0; }

static bool reachable(const struct etcd_cluster *c, int i) {
  return running(c, i) && !c->members[i].paused;
}

/* Reaps member i's keeper if it has exited; returns true then, with its
 * code (etcd's exit code, 128 + the signal that ended etcd, or -1 where
 * someone else reaped it) in *code. */
static bool reap(struct etcd_cluster *c, int i, bool block, int *code) {
  struct etcd_member *m = &c->members[i];
  int status = 0;
  pid_t r;
  if (m->keeper <= 0)
    return false;
  do
    r = waitpid(m->keeper, &status, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == m->keeper)
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  else if (r < 0 && errno == ECHILD) /* a waitpid(-1) of the test took it */
    *code = -1;
  else
    return false;
  m->keeper = 0;
  m->pid = 0;
  m->paused = false;
  return true;
}

/* The keeper of member i: forks etcd, tells the test process its pid,
 * waits for it until the lifetime's end. Where the test process dies
 * first (a failed ck_assert exits without teardown), it also removes the
 * member's files, and the directory once empty (HVD_TEST_ETCD_KEEP=1: not).
 * Never returns. */
static void keeper_main(const struct etcd_cluster *c, int i, pid_t parent, char *const argv[],
                        int report_fd) {
  int64_t deadline = now_ms() + (int64_t)ETCD_CLUSTER_LIFETIME_S * 1000;
  const char *keep = getenv("HVD_TEST_ETCD_KEEP");
  char data[300], log_path[300];
  sigset_t wanted, blocked, old;
  pid_t self = getpid(), etcd;
  int status, sig = -1;

  snprintf(data, sizeof(data), "%s/m%d", c->dir, i);
  snprintf(log_path, sizeof(log_path), "%s/m%d.log", c->dir, i);
  sigemptyset(&wanted);
  sigaddset(&wanted, SIGCHLD);
  sigaddset(&wanted, SIGUSR1);
  blocked = wanted;
  sigaddset(&blocked, SIGHUP);
  sigprocmask(SIG_BLOCK, &blocked, &old);
  prctl(PR_SET_PDEATHSIG, SIGUSR1);
  if (getppid() != parent)
    _exit(126);
  /* Out of the test's process group: Check SIGKILLs that group when a test
   * fails, and the keeper still has the files to remove. That group is
   * orphaned when the test process dies, and the kernel then sends it
   * SIGHUP (and SIGCONT) if etcd is paused: blocked, it stays pending. */
  setpgid(0, 0);
  /* Nothing of the test's (a listener, a pipe's write end) may live on in
   * the keeper or in etcd: only the pipe to the test process, as fd 3. */
  if (report_fd != 3 && (dup2(report_fd, 3) != 3 || close(report_fd) != 0))
    _exit(125);
  report_fd = 3;
  close_range(4, ~0U, 0);
  etcd = fork();
  if (etcd == 0) {
    int log, null;
    close(report_fd);
    log = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    sigprocmask(SIG_SETMASK, &old, NULL);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != self || log < 0 || null < 0)
      _exit(126);
    dup2(null, STDIN_FILENO);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    execv(argv[0], argv);
    dprintf(log, "==== etcd_cluster: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  if (etcd < 0 || write(report_fd, &etcd, sizeof(etcd)) != (ssize_t)sizeof(etcd))
    _exit(125);
  close(report_fd);
  for (;;) {
    int64_t left = deadline - now_ms();
    struct timespec ts = {left / 1000, (long)(left % 1000) * 1000000};
    if (waitpid(etcd, &status, WNOHANG) == etcd)
      _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    sig = left > 0 ? sigtimedwait(&wanted, NULL, &ts) : -1;
    if (left <= 0 || sig == SIGUSR1)
      break;
  }
  kill(etcd, SIGKILL);
  waitpid(etcd, &status, 0);
  if (sig == SIGUSR1 && !(keep != NULL && strcmp(keep, "1") == 0)) {
    remove_tree(data);
    remove(log_path);
    rmdir(c->dir);
  }
  _exit(124);
}

/* Starts member i on its ports; false (with why) where no process came up. */
static bool spawn(struct etcd_cluster *c, int i, bool existing, char *why, size_t why_len) {
  struct etcd_member *m = &c->members[i];
  char name[16], data[300], client[96], peer[64], cluster[ETCD_CLUSTER_MAX * 48];
  const char *token = strrchr(c->dir, '/') + 1;
  bool tls = c->tls.cert[0] != '\0';
  size_t off = 0;
  int pfd[2];
  pid_t parent = getpid(), etcd = 0;
  ssize_t n;

  snprintf(name, sizeof(name), "m%d", i);
  snprintf(data, sizeof(data), "%s/m%d", c->dir, i);
  /* With TLS, a second client URL: HTTPS for the tests, HTTP for us. */
  off = (size_t)snprintf(client, sizeof(client), "http://127.0.0.1:%d", m->client_port);
  if (tls)
    snprintf(client + off, sizeof(client) - off, ",https://127.0.0.1:%d", m->tls_port);
  off = 0;
  snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", m->peer_port);
  for (int k = 0; k < c->size; k++)
    off += (size_t)snprintf(cluster + off, sizeof(cluster) - off, "%sm%d=http://127.0.0.1:%d",
                            k > 0 ? "," : "", k, c->members[k].peer_port);
  char *const argv[] = {(char *)etcd_binary(),
                        "--name", name,
                        "--data-dir", data,
                        "--listen-client-urls", client,
                        "--advertise-client-urls", client,
                        "--listen-peer-urls", peer,
                        "--initial-advertise-peer-urls", peer,
                        "--initial-cluster", cluster,
                        "--initial-cluster-state", existing ? "existing" : "new",
                        "--initial-cluster-token", (char *)token,
                        "--heartbeat-interval", "50",
                        "--election-timeout", "500",
                        "--logger", "zap",
                        "--log-level", "info",
                        /* without TLS, the list ends here */
                        tls ? "--cert-file" : NULL, c->tls.cert,
                        "--key-file", c->tls.key,
                        "--trusted-ca-file", c->tls.ca,
                        "--client-cert-auth",
                        NULL};

  log_line(c, i, "%s member %d: client port %d, peer port %d, TLS port %d",
           existing ? "restart" : "start", i, m->client_port, m->peer_port, m->tls_port);
  if (pipe2(pfd, O_CLOEXEC) != 0) {
    snprintf(why, why_len, "pipe2: %s", strerror(errno));
    return false;
  }
  m->keeper = fork();
  if (m->keeper == 0) {
    close(pfd[0]);
    keeper_main(c, i, parent, argv, pfd[1]);
  }
  close(pfd[1]);
  if (m->keeper < 0) {
    snprintf(why, why_len, "fork: %s", strerror(errno));
    m->keeper = 0;
    close(pfd[0]);
    return false;
  }
  do
    n = read(pfd[0], &etcd, sizeof(etcd));
  while (n < 0 && errno == EINTR);
  close(pfd[0]);
  if (n != (ssize_t)sizeof(etcd)) {
    int code = 0;
    kill(m->keeper, SIGKILL);
    reap(c, i, true, &code);
    snprintf(why, why_len, "member %d's keeper exited (%d) before starting etcd", i, code);
    return false;
  }
  m->pid = etcd;
  m->paused = false;
  return true;
}

static void kill_member(struct etcd_cluster *c, int i) {
  int code;
  if (!running(c, i))
    return;
  kill(c->members[i].pid, SIGKILL);
  reap(c, i, true, &code);
}

/* ==== HTTP ======================================================================= */

struct reply_buf {
  char *data;
  size_t len;
  bool over;
};

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *userdata) {
  struct reply_buf *r = userdata;
  size_t n = size * nmemb;
  char *grown;
  if (r->len + n + 1 > REPLY_CAP) {
    r->over = true;
    return 0;
  }
  grown = realloc(r->data, r->len + n + 1);
  if (grown == NULL)
    return 0;
  r->data = grown;
  memcpy(r->data + r->len, ptr, n);
  r->len += n;
  r->data[r->len] = '\0';
  return n;
}

/* One request to 127.0.0.1:port (see etcd_cluster_post). */
static int request(int port, const char *path, const char *body, const char *token,
                   int timeout_ms, char **reply) {
  static bool curl_ready;
  struct reply_buf r = {0};
  struct curl_slist *headers = NULL;
  char url[256], auth[512];
  long http = 0;
  CURLcode rc;
  CURL *h;

  *reply = NULL;
  if (!curl_ready && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    *reply = strdup("curl_global_init failed");
    return -1;
  }
  curl_ready = true;
  h = curl_easy_init();
  if (h == NULL) {
    *reply = strdup("curl_easy_init failed");
    return -1;
  }
  snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
  headers = curl_slist_append(headers, "Content-Type: application/json");
  if (token != NULL) {
    snprintf(auth, sizeof(auth), "Authorization: %s", token);
    headers = curl_slist_append(headers, auth);
  }
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
  if (body != NULL)
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  rc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &http);
  curl_easy_cleanup(h);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s %s: %s%s", body != NULL ? "POST" : "GET", url,
             curl_easy_strerror(rc), r.over ? " (reply over the cap)" : "");
    free(r.data);
    *reply = strdup(msg);
    return -1;
  }
  *reply = r.data != NULL ? r.data : strdup("");
  return (int)http;
}

/* root's token, or NULL where auth is off or login failed (then *why). */
static char *login(const struct etcd_cluster *c, int port, int timeout_ms, char **why) {
  cJSON *req = cJSON_CreateObject(), *rep;
  char *body, *reply = NULL, *token = NULL;
  const cJSON *t;
  int http;
  cJSON_AddStringToObject(req, "name", "root");
  cJSON_AddStringToObject(req, "password", c->password);
  body = cJSON_PrintUnformatted(req);
  cJSON_Delete(req);
  http = request(port, "/v3/auth/authenticate", body, NULL, timeout_ms, &reply);
  free(body);
  rep = http == 200 ? cJSON_Parse(reply) : NULL;
  t = cJSON_GetObjectItemCaseSensitive(rep, "token");
  if (cJSON_IsString(t))
    token = strdup(t->valuestring);
  cJSON_Delete(rep);
  if (token == NULL) {
    *why = reply;
    return NULL;
  }
  free(reply);
  return token;
}

static int first_reachable(const struct etcd_cluster *c) {
  for (int i = 0; i < c->size; i++)
    if (reachable(c, i))
      return i;
  return -1;
}

int etcd_cluster_post(struct etcd_cluster *c, int member, const char *path, const char *body,
                      int timeout_ms, char **reply) {
  char *token = NULL;
  int port, http;
  if (member < 0)
    member = first_reachable(c);
  if (member < 0 || member >= c->size) {
    *reply = strdup("no such member, or none running");
    return -1;
  }
  port = c->members[member].client_port;
  if (c->password[0] != '\0' && (token = login(c, port, timeout_ms, reply)) == NULL)
    return -1;
  http = request(port, path, body, token, timeout_ms, reply);
  free(token);
  return http;
}

/* ==== base64 ===================================================================== */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const char *text) {
  size_t n = strlen(text), o = 0;
  const unsigned char *s = (const unsigned char *)text;
  char *out = malloc(4 * ((n + 2) / 3) + 1);
  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                 (i + 2 < n ? s[i + 2] : 0);
    out[o++] = b64[v >> 18 & 63];
    out[o++] = b64[v >> 12 & 63];
    out[o++] = i + 1 < n ? b64[v >> 6 & 63] : '=';
    out[o++] = i + 2 < n ? b64[v & 63] : '=';
  }
  out[o] = '\0';
  return out;
}

/* NULL where text is not base64. */
static char *b64_decode(const char *text) {
  size_t n = strlen(text), o = 0;
  uint32_t acc = 0;
  int bits = 0;
  char *out = malloc(n / 4 * 3 + 3);
  if (out == NULL)
    return NULL;
  for (size_t i = 0; i < n && text[i] != '='; i++) {
    const char *p = strchr(b64, text[i]);
    if (p == NULL) {
      free(out);
      return NULL;
    }
    acc = acc << 6 | (uint32_t)(p - b64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[o++] = (char)(acc >> bits & 0xff);
    }
  }
  out[o] = '\0';
  return out;
}

/* ==== status and leader ========================================================== */

static uint64_t json_u64(const cJSON *obj, const char *name) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  if (cJSON_IsString(v))
    return strtoull(v->valuestring, NULL, 10);
  return cJSON_IsNumber(v) ? (uint64_t)v->valuedouble : 0;
}

/* Member i's own id and the leader it follows (0: none); false where it
 * did not answer. */
static bool status(struct etcd_cluster *c, int i, uint64_t *leader) {
  char *reply = NULL;
  int http = request(c->members[i].client_port, "/v3/maintenance/status", "{}", NULL,
                     STATUS_TIMEOUT_MS, &reply);
  cJSON *rep = http == 200 ? cJSON_Parse(reply) : NULL;
  uint64_t id = json_u64(cJSON_GetObjectItemCaseSensitive(rep, "header"), "member_id");
  bool ok = rep != NULL && id != 0;
  if (ok) {
    c->members[i].id = id;
    *leader = json_u64(rep, "leader");
  }
  cJSON_Delete(rep);
  free(reply);
  return ok;
}

static int index_of(const struct etcd_cluster *c, uint64_t id) {
  for (int i = 0; i < c->size; i++)
    if (id != 0 && c->members[i].id == id)
      return i;
  return -1;
}

/* One look: the index of the leader every reachable member follows, where
 * it is reachable too; else -1. */
static int agreed_leader(struct etcd_cluster *c) {
  uint64_t common = 0;
  int who;
  for (int i = 0; i < c->size; i++) {
    uint64_t leader = 0;
    if (!reachable(c, i))
      continue;
    if (!status(c, i, &leader) || leader == 0 || (common != 0 && leader != common))
      return -1;
    common = leader;
  }
  who = index_of(c, common);
  return who >= 0 && reachable(c, who) ? who : -1;
}

/* A running member whose keeper has exited is reaped; returns its index. */
static int reap_dead(struct etcd_cluster *c, int *code) {
  for (int i = 0; i < c->size; i++)
    if (reap(c, i, false, code))
      return i;
  return -1;
}

int etcd_cluster_wait_leader(struct etcd_cluster *c, int timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  int code;
  for (;;) {
    int who;
    while (reap_dead(c, &code) >= 0) { /* exited on its own: down */
    }
    who = agreed_leader(c);
    if (who >= 0 || now_ms() >= deadline)
      return who;
    sleep_ms(POLL_MS);
  }
}

int etcd_cluster_leader(struct etcd_cluster *c) {
  int who = etcd_cluster_wait_leader(c, ETCD_CLUSTER_WAIT_MS);
  CLUSTER_ASSERT(c, who >= 0, "etcd cluster %s: the running members agree on no leader after %d ms",
                 c->dir, ETCD_CLUSTER_WAIT_MS);
  return who;
}

/* ==== the cluster ================================================================ */

/* One try at starting every member on fresh ports; false with why (and
 * *retry where a member lost its port to someone else). */
static bool start_once(struct etcd_cluster *c, bool *retry, char *why, size_t why_len) {
  int taken[3 * ETCD_CLUSTER_MAX], ntaken = 0, code = 0, dead;
  int64_t deadline;
  char *p = c->endpoints, *t = c->tls_endpoints;
  bool tls = c->tls.cert[0] != '\0';

  *retry = false;
  for (int i = 0; i < c->size; i++) {
    struct etcd_member *m = &c->members[i];
    memset(m, 0, sizeof(*m));
    m->client_port = pick_port(taken, ntaken);
    taken[ntaken++] = m->client_port;
    m->peer_port = pick_port(taken, ntaken);
    taken[ntaken++] = m->peer_port;
    if (tls) {
      m->tls_port = pick_port(taken, ntaken);
      taken[ntaken++] = m->tls_port;
    }
    if (m->client_port == 0 || m->peer_port == 0 || (tls && m->tls_port == 0)) {
      snprintf(why, why_len, "no free port on 127.0.0.1");
      return false;
    }
    p += sprintf(p, "%s127.0.0.1:%d", i > 0 ? "," : "", m->client_port);
    if (tls)
      t += sprintf(t, "%s127.0.0.1:%d", i > 0 ? "," : "", m->tls_port);
  }
  for (int i = 0; i < c->size; i++)
    if (!spawn(c, i, false, why, why_len))
      return false;
  deadline = now_ms() + ETCD_CLUSTER_WAIT_MS;
  for (;;) {
    if ((dead = reap_dead(c, &code)) >= 0) {
      *retry = strstr(log_tail(c, dead), "address already in use") != NULL;
      snprintf(why, why_len, "member %d exited with code %d while starting%s", dead, code,
               *retry ? " (a port was taken)" : "");
      return false;
    }
    if (agreed_leader(c) >= 0)
      return true;
    if (now_ms() >= deadline) {
      snprintf(why, why_len, "no leader after %d ms", ETCD_CLUSTER_WAIT_MS);
      return false;
    }
    sleep_ms(POLL_MS);
  }
}

static void start(struct etcd_cluster *c, int size, const struct etcd_cluster_tls *tls) {
  const char *tmp = getenv("TMPDIR");
  char why[512] = "";
  bool retry = true;

  ck_assert_msg(size >= 1 && size <= ETCD_CLUSTER_MAX, "etcd cluster of %d members", size);
  memset(c, 0, sizeof(*c));
  if (tls != NULL)
    c->tls = *tls;
  snprintf(c->dir, sizeof(c->dir), "%s/hvd-etcd-XXXXXX", tmp != NULL && tmp[0] ? tmp : "/tmp");
  ck_assert_msg(mkdtemp(c->dir) != NULL, "mkdtemp %s: %s", c->dir, strerror(errno));
  c->size = size;
  for (int attempt = 0; attempt < START_ATTEMPTS && retry; attempt++) {
    if (start_once(c, &retry, why, sizeof(why)))
      return;
    for (int i = 0; i < size; i++) {
      char data[300];
      kill_member(c, i);
      snprintf(data, sizeof(data), "%s/m%d", c->dir, i);
      remove_tree(data);
      log_line(c, i, "start failed: %s", why);
    }
  }
  dump_logs(c);
  etcd_cluster_stop(c);
  ck_abort_msg("etcd cluster of %d: %s (the logs above)", size, why);
}

void etcd_cluster_start(struct etcd_cluster *c, int size) { start(c, size, NULL); }

void etcd_cluster_start_tls(struct etcd_cluster *c, int size, const struct etcd_cluster_tls *tls) {
  ck_assert_msg(tls->cert[0] != '\0' && tls->key[0] != '\0' && tls->ca[0] != '\0',
                "etcd_cluster_start_tls: a certificate, its key and a CA");
  start(c, size, tls);
}

void etcd_cluster_stop(struct etcd_cluster *c) {
  const char *keep = getenv("HVD_TEST_ETCD_KEEP");
  if (c->size == 0)
    return;
  for (int i = 0; i < c->size; i++)
    kill_member(c, i);
  if (keep != NULL && strcmp(keep, "1") == 0)
    fprintf(stderr, "etcd cluster kept in %s\n", c->dir);
  else
    remove_tree(c->dir);
  c->size = 0;
}

const char *etcd_cluster_endpoints(const struct etcd_cluster *c) { return c->endpoints; }

static void check_member(const struct etcd_cluster *c, int i, bool want_running) {
  ck_assert_msg(i >= 0 && i < c->size, "etcd member %d of %d", i, c->size);
  ck_assert_msg(running(c, i) == want_running, "etcd member %d is %s", i,
                want_running ? "down" : "running");
}

void etcd_cluster_kill(struct etcd_cluster *c, int member) {
  check_member(c, member, true);
  log_line(c, member, "kill -9 member %d", member);
  kill_member(c, member);
}

void etcd_cluster_restart(struct etcd_cluster *c, int member) {
  int64_t deadline = now_ms() + ETCD_CLUSTER_WAIT_MS;
  char why[512] = "", *reply = NULL;
  int code = 0;
  check_member(c, member, false);
  CLUSTER_ASSERT(c, spawn(c, member, true, why, sizeof(why)), "restart of etcd member %d: %s",
                 member, why);
  for (;;) {
    uint64_t leader = 0;
    int who;
    CLUSTER_ASSERT(c, !reap(c, member, false, &code), "restarted etcd member %d exited (%d)",
                   member, code);
    if (status(c, member, &leader) && (who = index_of(c, leader)) >= 0 && reachable(c, who)) {
      int http = request(c->members[member].client_port, "/health", NULL, NULL,
                         STATUS_TIMEOUT_MS, &reply);
      bool healthy = http == 200 && reply != NULL && strstr(reply, "\"true\"") != NULL;
      free(reply);
      if (healthy || c->password[0] != '\0')
        return;
    }
    CLUSTER_ASSERT(c, now_ms() < deadline,
                   "restarted etcd member %d: not healthy after %d ms", member,
                   ETCD_CLUSTER_WAIT_MS);
    sleep_ms(POLL_MS);
  }
}

void etcd_cluster_pause(struct etcd_cluster *c, int member) {
  check_member(c, member, true);
  ck_assert_msg(kill(c->members[member].pid, SIGSTOP) == 0, "SIGSTOP etcd: %s", strerror(errno));
  c->members[member].paused = true;
}

void etcd_cluster_resume(struct etcd_cluster *c, int member) {
  check_member(c, member, true);
  ck_assert_msg(kill(c->members[member].pid, SIGCONT) == 0, "SIGCONT etcd: %s", strerror(errno));
  c->members[member].paused = false;
}

/* A gateway call that must answer 200; returns the reply (caller frees). */
static char *call_ok(struct etcd_cluster *c, int member, const char *path, const char *body) {
  char *reply = NULL;
  int http = etcd_cluster_post(c, member, path, body, REQUEST_TIMEOUT_MS, &reply);
  CLUSTER_ASSERT(c, http == 200, "etcd %s %s: HTTP %d: %s", path, body, http,
                 reply != NULL ? reply : "");
  return reply;
}

void etcd_cluster_enable_auth(struct etcd_cluster *c, const char *password) {
  cJSON *user = cJSON_CreateObject();
  char *body;
  ck_assert_msg(strlen(password) > 0 && strlen(password) < sizeof(c->password),
                "etcd root password of %zu bytes", strlen(password));
  cJSON_AddStringToObject(user, "name", "root");
  cJSON_AddStringToObject(user, "password", password);
  body = cJSON_PrintUnformatted(user);
  cJSON_Delete(user);
  free(call_ok(c, -1, "/v3/auth/role/add", "{\"name\":\"root\"}"));
  free(call_ok(c, -1, "/v3/auth/user/add", body));
  free(call_ok(c, -1, "/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}"));
  free(call_ok(c, -1, "/v3/auth/enable", "{}"));
  free(body);
  snprintf(c->password, sizeof(c->password), "%s", password);
}

void etcd_cluster_put(struct etcd_cluster *c, int member, const char *key, const char *value) {
  char *k = b64_encode(key), *v = b64_encode(value), *body;
  size_t n;
  ck_assert_msg(k != NULL && v != NULL, "out of memory");
  n = strlen(k) + strlen(v) + 32;
  body = malloc(n);
  ck_assert_msg(body != NULL, "out of memory");
  snprintf(body, n, "{\"key\":\"%s\",\"value\":\"%s\"}", k, v);
  free(call_ok(c, member, "/v3/kv/put", body));
  free(body);
  free(v);
  free(k);
}

char *etcd_cluster_get(struct etcd_cluster *c, int member, const char *key) {
  char *k = b64_encode(key), *body, *reply, *value = NULL;
  const cJSON *kvs, *v;
  cJSON *rep;
  size_t n;
  ck_assert_msg(k != NULL, "out of memory");
  n = strlen(k) + 16;
  body = malloc(n);
  ck_assert_msg(body != NULL, "out of memory");
  snprintf(body, n, "{\"key\":\"%s\"}", k);
  reply = call_ok(c, member, "/v3/kv/range", body);
  rep = cJSON_Parse(reply);
  CLUSTER_ASSERT(c, rep != NULL, "etcd /v3/kv/range: not JSON: %s", reply);
  kvs = cJSON_GetObjectItemCaseSensitive(rep, "kvs");
  v = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(kvs, 0), "value");
  if (cJSON_IsString(v))
    value = b64_decode(v->valuestring);
  else if (cJSON_GetArraySize(kvs) > 0)
    value = strdup(""); /* the gateway leaves out empty fields */
  CLUSTER_ASSERT(c, cJSON_GetArraySize(kvs) == 0 || value != NULL,
                 "etcd /v3/kv/range: bad value in %s", reply);
  cJSON_Delete(rep);
  free(reply);
  free(body);
  free(k);
  return value;
}

long etcd_cluster_watchers(struct etcd_cluster *c) {
  static const char metric[] = "\netcd_debugging_mvcc_watcher_total ";
  long sum = 0;
  for (int i = 0; i < c->size; i++) {
    char *reply = NULL, *at;
    long n = -1;
    if (c->members[i].keeper == 0 || c->members[i].paused)
      continue;
    if (etcd_cluster_post(c, i, "/metrics", NULL, 5000, &reply) == 200 &&
        (at = strstr(reply, metric)) != NULL)
      n = strtol(at + strlen(metric), NULL, 10);
    free(reply);
    if (n < 0)
      return -1;
    sum += n;
  }
  return sum;
}
