/*
 * Elastic hosts: the discovery script, its output, and the job's view of
 * which hosts it may use.
 *
 * DESIGN. The script runs as horovodrun runs it, through /bin/sh -c, in a
 * process group of its own so that a timeout kills whatever it started.
 * hvdrun keeps SIGCHLD blocked for its signalfd and reaps its ranks by pid,
 * so here only our child is waited for, by pid: poll() reads its pipes in
 * ticks of TICK_MS, and between ticks waitid(WNOWAIT) looks whether it
 * has exited without reaping it. Once it has, what is in the pipes is
 * drained and anything it left in its group (still holding a pipe, say) is
 * killed while the unreaped child keeps the group's id from being reused;
 * then it is reaped. Stdout is capped at STDOUT_MAX, and the
 * last TAIL_MAX bytes of stderr go into the error message.
 *
 * The output is Horovod's format, "host" or "host:slots" per line, read
 * strictly: a line hvdrun cannot use is an error naming it.
 *
 * The view follows Horovod's HostManager: each discovery is compared with
 * the last one and reported as hosts removed, added or both; blacklisted
 * hosts are left out, for good or, with a cooldown range, for a randomised
 * cooldown that doubles with each blacklisting. Hosts are ordered by when
 * they last became usable, so that the hosts that have run longest get the
 * lowest ranks and rank 0 stays where the training state is; the array is
 * kept in that order. Hosts absent and never blacklisted are forgotten.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc.h"

enum { STDOUT_MAX = 1 << 20, TAIL_MAX = 512, TICK_MS = 100 };

/* ==== the script's output =================================================== */

static bool space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static hvd_status add_line(struct hvdrun_host **hosts, size_t *n, size_t *cap, const char *line,
                           size_t len, int default_slots, int lineno) {
  const char *colon = memchr(line, ':', len);
  size_t name_len = colon != NULL ? (size_t)(colon - line) : len;
  int slots = default_slots;
  struct hvdrun_host *h;

  if (colon != NULL) {
    size_t digits = len - name_len - 1;
    long v = 0;
    for (size_t i = 0; i < digits && v <= HVDRUN_MAX_RANKS; i++) {
      if (colon[1 + i] < '0' || colon[1 + i] > '9') {
        v = -1;
        break;
      }
      v = v * 10 + (colon[1 + i] - '0');
    }
    if (digits == 0 || v < 1 || v > HVDRUN_MAX_RANKS)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "host discovery line %d: '%.*s': the slots after ':' must be a number "
                       "from 1 to %d",
                       lineno, (int)(len > 300 ? 300 : len), line, HVDRUN_MAX_RANKS);
    slots = (int)v;
  }
  if (name_len == 0 || name_len > HVDRUN_HOST_MAX)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "host discovery line %d: the host name has %zu bytes (1 to %d)", lineno,
                     name_len, HVDRUN_HOST_MAX);
  for (size_t i = 0; i < name_len; i++) {
    unsigned char c = (unsigned char)line[i];
    if (c <= ' ' || c == 0x7f)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "host discovery line %d: '%.*s' is not a host name (a space or control "
                       "character in it)",
                       lineno, (int)name_len, line);
  }
  if (line[0] == '-')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "host discovery line %d: host name '%.*s' starts with '-' (it would read "
                     "as an option)",
                     lineno, (int)name_len, line);
  for (size_t i = 0; i < *n; i++) {
    if (strlen((*hosts)[i].name) != name_len || memcmp((*hosts)[i].name, line, name_len) != 0)
      continue;
    if ((*hosts)[i].slots != slots)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "host discovery line %d: host '%s' is listed with %d slots and with %d",
                       lineno, (*hosts)[i].name, (*hosts)[i].slots, slots);
    return HVD_OK; /* the same line again */
  }
  if (hvd_array_reserve(hosts, cap, *n + 1, sizeof(**hosts), 8) != HVD_OK)
    return hvd_error_prefix("host discovery: %zu hosts", *n + 1);
  h = &(*hosts)[(*n)++];
  memcpy(h->name, line, name_len);
  h->name[name_len] = '\0';
  h->slots = slots;
  return HVD_OK;
}

hvd_status hvdrun_parse_discovery(const char *text, size_t len, int default_slots,
                                  struct hvdrun_host **out, size_t *n) {
  struct hvdrun_host *hosts = NULL;
  size_t count = 0, cap = 0, pos = 0;
  int lineno = 0;
  hvd_status st = HVD_OK;

  if (default_slots < 1 || default_slots > HVDRUN_MAX_RANKS)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "host discovery: default slots %d (1 to %d)",
                     default_slots, HVDRUN_MAX_RANKS);
  while (st == HVD_OK && pos < len) {
    const char *line = text + pos, *nl = memchr(line, '\n', len - pos);
    size_t llen = nl != NULL ? (size_t)(nl - line) : len - pos;
    pos += llen + 1;
    lineno++;
    while (llen > 0 && space(line[0]))
      line++, llen--;
    while (llen > 0 && space(line[llen - 1]))
      llen--;
    if (llen > 0)
      st = add_line(&hosts, &count, &cap, line, llen, default_slots, lineno);
  }
  if (st != HVD_OK) {
    free(hosts);
    return st;
  }
  *out = hosts;
  *n = count;
  return HVD_OK;
}

/* ==== running the script ==================================================== */

struct capture {
  char *out;
  size_t len, cap;
  char tail[TAIL_MAX]; /* the end of stderr */
  size_t tail_len;
  bool too_large;
};

/* Reads what fd has now. Returns 1 at end of file, 0 when it would block,
 * -1 on an error (errno set). */
static int drain(int fd, bool is_stderr, struct capture *c) {
  char buf[4096];
  for (;;) {
    ssize_t got = read(fd, buf, sizeof(buf));
    if (got == 0)
      return 1;
    if (got < 0 && errno == EINTR)
      continue;
    if (got < 0)
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    if (is_stderr) {
      size_t n = (size_t)got, keep = n >= TAIL_MAX ? 0 : TAIL_MAX - n;
      if (keep > c->tail_len)
        keep = c->tail_len;
      memmove(c->tail, c->tail + c->tail_len - keep, keep);
      if (n > TAIL_MAX)
        n = TAIL_MAX;
      memcpy(c->tail + keep, buf + got - (ssize_t)n, n);
      c->tail_len = keep + n;
      continue;
    }
    if (c->len + (size_t)got > STDOUT_MAX) {
      c->too_large = true;
      return -1;
    }
    if (hvd_array_reserve(&c->out, &c->cap, c->len + (size_t)got + 1, 1, 8192) != HVD_OK) {
      errno = ENOMEM;
      return -1;
    }
    memcpy(c->out + c->len, buf, (size_t)got);
    c->len += (size_t)got;
  }
}

/* The stderr tail as one line: control characters become spaces, runs of
 * spaces one, and the ends are trimmed. */
static const char *one_line(struct capture *c) {
  size_t w = 0;
  for (size_t r = 0; r < c->tail_len; r++) {
    char ch = (unsigned char)c->tail[r] < ' ' || c->tail[r] == 0x7f ? ' ' : c->tail[r];
    if (ch == ' ' && (w == 0 || c->tail[w - 1] == ' '))
      continue;
    c->tail[w++] = ch;
  }
  while (w > 0 && c->tail[w - 1] == ' ')
    w--;
  c->tail_len = w < TAIL_MAX ? w : TAIL_MAX - 1;
  c->tail[c->tail_len] = '\0';
  return c->tail;
}

/* Whether the child has exited, without reaping it. */
static bool exited(pid_t pid) {
  siginfo_t si;
  memset(&si, 0, sizeof(si));
  if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
    return errno != EINTR; /* ECHILD: reaped elsewhere; nothing to wait for */
  return si.si_pid == pid;
}

static void child_fail(const char *what) {
  /* write(2) only: this runs between fork and exec. */
  const char *err = strerror(errno);
  (void)!write(2, what, strlen(what));
  (void)!write(2, err, strlen(err));
  (void)!write(2, "\n", 1);
}

hvd_status hvdrun_run_discovery(const char *script, int64_t timeout_ms, char **out, size_t *len) {
  int64_t deadline = hvd_deadline_after_ms(timeout_ms);
  int outp[2] = {-1, -1}, errp[2] = {-1, -1}, status = 0;
  struct capture c;
  bool done = false, timed_out = false;
  pid_t parent = getpid(), pid = -1, got;
  hvd_status st = HVD_OK;

  memset(&c, 0, sizeof(c));
  if (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0) {
    st = hvd_error(HVD_ERR_IO, "host discovery script '%s': pipe: %s", script, strerror(errno));
    goto out;
  }
  if ((pid = fork()) < 0) {
    st = hvd_error(HVD_ERR_IO, "host discovery script '%s': fork: %s", script, strerror(errno));
    goto out;
  }
  if (pid == 0) {
    hvdrun_child_setup(parent, -1, outp[1], errp[1]);
    execl("/bin/sh", "sh", "-c", script, (char *)NULL);
    child_fail("hvdrun: cannot run /bin/sh: ");
    _exit(127);
  }
  setpgid(pid, pid); /* (also in the child: whichever runs first) */
  close(outp[1]);
  close(errp[1]);
  outp[1] = errp[1] = -1;
  fcntl(outp[0], F_SETFL, O_NONBLOCK);
  fcntl(errp[0], F_SETFL, O_NONBLOCK);

  for (;;) {
    struct pollfd pfd[2];
    int *fds[2], nfds = 0, rc;
    int64_t left;
    if (!done)
      done = exited(pid);
    if (outp[0] >= 0) {
      fds[nfds] = &outp[0];
      pfd[nfds++] = (struct pollfd){.fd = outp[0], .events = POLLIN};
    }
    if (errp[0] >= 0) {
      fds[nfds] = &errp[0];
      pfd[nfds++] = (struct pollfd){.fd = errp[0], .events = POLLIN};
    }
    if (done && nfds == 0)
      break;
    if ((left = hvd_remaining_ms(deadline)) == 0) {
      timed_out = true;
      break;
    }
    /* Once it has exited, one last pass reads what is in the pipes. */
    rc = poll(pfd, (nfds_t)nfds, done ? 0 : (int)(left < TICK_MS ? left : TICK_MS));
    if (rc < 0 && errno == EINTR)
      continue;
    if (rc < 0) {
      st = hvd_error(HVD_ERR_IO, "host discovery script '%s': poll: %s", script, strerror(errno));
      break;
    }
    if (rc == 0 && done)
      break; /* the pipes are empty; whoever still holds them is killed below */
    for (int k = 0; k < nfds && st == HVD_OK; k++) {
      int r;
      if (pfd[k].revents == 0)
        continue;
      r = drain(*fds[k], *fds[k] == errp[0], &c);
      if (r < 0 && c.too_large)
        st = hvd_error(HVD_ERR_TOO_LARGE,
                       "host discovery script '%s' printed more than %d bytes (is it the right "
                       "script?)",
                       script, STDOUT_MAX);
      else if (r < 0)
        st = hvd_error(HVD_ERR_IO, "host discovery script '%s': read: %s", script,
                       strerror(errno));
      if (r != 0) {
        close(*fds[k]);
        *fds[k] = -1;
      }
    }
    if (st != HVD_OK || done)
      break;
  }
  /* The script's group, leftovers included; the child is not reaped yet,
   * so its id is still ours. */
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  while ((got = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  if (st != HVD_OK)
    goto out;
  if (timed_out) {
    st = hvd_error(HVD_ERR_TIMEOUT,
                   "host discovery script '%s' did not finish within %lld ms and was killed",
                   script, (long long)timeout_ms);
  } else if (got < 0) {
    st = hvd_error(HVD_ERR_IO, "host discovery script '%s': waitpid: %s", script,
                   strerror(errno));
  } else if (WIFSIGNALED(status) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const char *tail = one_line(&c);
    if (WIFSIGNALED(status))
      st = hvd_error(HVD_ERR_IO, "host discovery script '%s' was killed by signal %d (%s)%s%s",
                     script, WTERMSIG(status), strsignal(WTERMSIG(status)),
                     *tail != '\0' ? ": " : "", tail);
    else
      st = hvd_error(HVD_ERR_IO, "host discovery script '%s' exited with code %d%s%s", script,
                     WEXITSTATUS(status), *tail != '\0' ? ": " : "", tail);
  } else if (c.out == NULL && (c.out = malloc(1)) == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "host discovery script '%s': out of memory", script);
  }
out:
  for (int k = 0; k < 2; k++) {
    if (outp[k] >= 0)
      close(outp[k]);
    if (errp[k] >= 0)
      close(errp[k]);
  }
  if (st != HVD_OK) {
    free(c.out);
    return st;
  }
  c.out[c.len] = '\0';
  *out = c.out;
  *len = c.len;
  return HVD_OK;
}

/* ==== the view ============================================================== */

static struct hvdrun_known_host *find(const struct hvdrun_hosts_view *v, const char *name) {
  for (size_t i = 0; i < v->n; i++) {
    if (strcmp(v->hosts[i].name, name) == 0)
      return &v->hosts[i];
  }
  return NULL;
}

static int slots_in(const struct hvdrun_host *found, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++) {
    if (strcmp(found[i].name, name) == 0)
      return found[i].slots > 0 ? found[i].slots : 0;
  }
  return 0;
}

static bool reserve(struct hvdrun_hosts_view *v, size_t want) {
  return hvd_array_reserve(&v->hosts, &v->cap, want, sizeof(*v->hosts), 16) == HVD_OK;
}

/* Appends a host (capacity reserved) as the newest. */
static struct hvdrun_known_host *append(struct hvdrun_hosts_view *v, const char *name) {
  struct hvdrun_known_host *h = &v->hosts[v->n++];
  memset(h, 0, sizeof(*h));
  snprintf(h->name, sizeof(h->name), "%s", name);
  h->seen = v->next_seen++;
  return h;
}

/* splitmix64 */
static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void hvdrun_hosts_view_init(struct hvdrun_hosts_view *v, double cooldown_min_s,
                            double cooldown_max_s) {
  memset(v, 0, sizeof(*v));
  v->cooldown_min_s = cooldown_min_s;
  v->cooldown_max_s = cooldown_max_s;
  v->rng = (uint64_t)hvd_now_ns() ^ ((uint64_t)getpid() << 32);
}

void hvdrun_hosts_view_fini(struct hvdrun_hosts_view *v) {
  free(v->hosts);
  memset(v, 0, sizeof(*v));
}

static bool usable(const struct hvdrun_known_host *h) {
  return h->slots > 0 && !h->blacklisted;
}

hvd_status hvdrun_hosts_view_update(struct hvdrun_hosts_view *v, const struct hvdrun_host *found,
                                    size_t n, int64_t now_ns, int *change) {
  const uint64_t fresh = UINT64_MAX; /* becomes usable now: ordered below */
  int result = HVDRUN_HOSTS_SAME;
  size_t kept = 0;

  if (!reserve(v, v->n + n))
    return hvd_error(HVD_ERR_NO_MEMORY, "host discovery: out of memory for %zu hosts", v->n + n);
  for (size_t i = 0; i < v->n; i++) {
    struct hvdrun_known_host *h = &v->hosts[i];
    int slots = slots_in(found, n, h->name);
    bool was = usable(h);
    if (h->blacklisted && h->cooldown_until_ns != HVD_NO_DEADLINE &&
        now_ns >= h->cooldown_until_ns) {
      h->blacklisted = false;
      h->cooldown_until_ns = 0;
    }
    if (was && slots < h->slots)
      result |= HVDRUN_HOSTS_REMOVED;
    if (slots > 0 && !h->blacklisted && (!was || slots > h->slots))
      result |= HVDRUN_HOSTS_ADDED;
    if (slots > 0 && !h->blacklisted && !was)
      h->seen = fresh;
    h->slots = slots;
  }
  for (size_t i = 0; i < n; i++) {
    if (found[i].slots > 0 && find(v, found[i].name) == NULL) {
      struct hvdrun_known_host *h = append(v, found[i].name);
      h->slots = found[i].slots;
      h->seen = fresh;
      result |= HVDRUN_HOSTS_ADDED;
    }
  }
  /* Forget hosts that carry nothing: absent, never blacklisted. */
  for (size_t i = 0; i < v->n; i++) {
    const struct hvdrun_known_host *h = &v->hosts[i];
    if (h->slots > 0 || h->blacklisted || h->blacklist_count > 0)
      v->hosts[kept++] = *h;
  }
  v->n = kept;
  /* The fresh ones go last, in the discovery's order. */
  for (size_t i = 0; i < n; i++) {
    struct hvdrun_known_host *h = find(v, found[i].name), moved;
    if (h == NULL || h->seen != fresh)
      continue;
    moved = *h;
    moved.seen = v->next_seen++;
    memmove(h, h + 1, (size_t)(&v->hosts[v->n] - (h + 1)) * sizeof(*h));
    v->hosts[v->n - 1] = moved;
  }
  *change = result;
  return HVD_OK;
}

void hvdrun_hosts_view_blacklist(struct hvdrun_hosts_view *v, const char *name, int64_t now_ns) {
  struct hvdrun_known_host *h = find(v, name);
  double cooldown, random01;

  if (h == NULL) {
    if (strlen(name) > HVDRUN_HOST_MAX)
      return; /* cannot be in a discovery either */
    if (!reserve(v, v->n + 1)) {
      HVD_LOG_WARN("host discovery: out of memory; host %s is not blacklisted", name);
      return;
    }
    h = append(v, name);
  }
  if (h->blacklisted && now_ns < h->cooldown_until_ns)
    return; /* still in effect (or for good) */
  h->blacklisted = true;
  if (v->cooldown_min_s <= 0 || v->cooldown_max_s <= 0) {
    h->cooldown_until_ns = HVD_NO_DEADLINE;
    h->blacklist_count++;
    return;
  }
  cooldown = v->cooldown_min_s;
  for (int k = 0; k < h->blacklist_count && cooldown < v->cooldown_max_s; k++)
    cooldown *= 2;
  random01 = (double)(next_random(&v->rng) >> 11) / (double)(1ULL << 53);
  cooldown += random01 * v->cooldown_min_s;
  if (cooldown > v->cooldown_max_s)
    cooldown = v->cooldown_max_s;
  if (cooldown < v->cooldown_min_s)
    cooldown = v->cooldown_min_s;
  h->cooldown_until_ns = now_ns + (int64_t)(cooldown * 1e9);
  h->blacklist_count++;
}

size_t hvdrun_hosts_view_usable(const struct hvdrun_hosts_view *v, struct hvdrun_host *out,
                                size_t cap) {
  size_t count = 0;
  for (size_t i = 0; i < v->n && count < cap; i++) {
    if (!usable(&v->hosts[i]))
      continue;
    memcpy(out[count].name, v->hosts[i].name, sizeof(out[count].name));
    out[count++].slots = v->hosts[i].slots;
  }
  return count;
}

int hvdrun_hosts_view_slots(const struct hvdrun_hosts_view *v) {
  long total = 0;
  for (size_t i = 0; i < v->n; i++) {
    if (usable(&v->hosts[i]))
      total += v->hosts[i].slots;
  }
  return total > INT_MAX ? INT_MAX : (int)total;
}
