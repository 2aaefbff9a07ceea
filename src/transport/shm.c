/*
 * Setting up a communicator's shared segment.
 *
 * DESIGN. Member 0 creates the segment with memfd_create (no name, no
 * /dev/shm quota: a default Kubernetes pod has 64 MiB there) and a Unix
 * socket in the abstract namespace under a random name, and sends both
 * names with a random secret to every member over the communicator's TCP
 * links, which the job token authenticated. Each member connects and sends
 * its rank and the secret. Any local user can find the socket and connect
 * too, so member 0 first checks the connection's kernel credentials
 * (SO_PEERCRED: this user, a process a member published) and closes any
 * other unread, then checks the rank and secret and passes the memfd
 * (SCM_RIGHTS). It serves the socket while it waits for the answers, and
 * connections wait side by side: no connection holds up another. Four
 * fixed messages over TCP keep everybody in step, and the last one carries
 * member 0's verdict, so that all members take the same path:
 *   0 -> all: offer (names, secret, sizes) or why there is none
 *   all -> 0: connected, or why not
 *   (member 0 accepts, checks and passes the descriptor, from the offer on)
 *   all -> 0: mapped, or why not
 *   0 -> all: verdict
 * A host that refuses any step (no memfd, seccomp, ranks in different
 * network or process namespaces that claim one host name) gives TCP, with
 * the reason logged. The descriptors are closed once mapped and the socket
 * once set up: when the last member's process ends, the kernel frees the
 * memory, so nothing is left behind, however the job ends.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport_private.h"

enum { NAME_MAX_BYTES = 48, SECRET_BYTES = 16, WHY_BYTES = 200 };
/* Connections member 0 takes from the socket's queue between looks at TCP. */
enum { ACCEPTS_PER_PASS = 64 };

/* Member 0's offer. All members run on one host (they published its
 * name) and so share the byte order; fields are checked all the same. */
struct offer {
  uint32_t ok;
  uint32_t size;
  uint64_t buffer_bytes;
  uint64_t ring_bytes;
  uint64_t segment_bytes;
  char name[NAME_MAX_BYTES];
  unsigned char secret[SECRET_BYTES];
  char why[WHY_BYTES];
};

struct answer {
  uint32_t ok;
  char why[WHY_BYTES];
};

/* A member's first message on the socket (with its doorbell, for links). */
struct hello {
  uint32_t rank;
  unsigned char secret[SECRET_BYTES];
};

size_t net_shm_layout(int n, size_t buffer_bytes, size_t ring_bytes, size_t *data_offset,
                      size_t *rings_offset) {
  size_t head = sizeof(struct net_shm_header) + (size_t)n * sizeof(struct net_shm_line);
  size_t page = 4096;

  *data_offset = (head + page - 1) / page * page;
  *rings_offset = *data_offset + (size_t)n * 2 * buffer_bytes;
  if (ring_bytes == 0)
    return *rings_offset;
  return *rings_offset + 2 * (size_t)(n - 1) * (sizeof(struct net_shm_ring) + ring_bytes);
}

static size_t segment_bytes(int n, size_t buffer_bytes, size_t ring_bytes) {
  size_t data, rings;
  return net_shm_layout(n, buffer_bytes, ring_bytes, &data, &rings);
}

static bool one_host(const struct net_comm *comm) {
  for (int r = 1; r < comm->size; r++) {
    if (strcmp(comm->records[r].host, comm->records[0].host) != 0)
      return false;
  }
  return true;
}

/* why = prefix and this thread's message, cut to fit. */
static void set_why(char *why, const char *prefix) {
  snprintf(why, WHY_BYTES, "%s%.180s", prefix, hvd_last_error_message());
}

static hvd_status wait_fd(int fd, short events, int64_t deadline_ns) {
  for (;;) {
    int64_t left = deadline_ns - hvd_now_ns();
    struct pollfd p = {.fd = fd, .events = events};
    int rc;

    if (left <= 0)
      return hvd_error(HVD_ERR_TIMEOUT, "no answer in time");
    rc = poll(&p, 1, (int)(left / 1000000 + 1));
    if (rc > 0)
      return HVD_OK;
    if (rc < 0 && errno != EINTR)
      return hvd_error(HVD_ERR_IO, "poll: %s", strerror(errno));
  }
}

/* Sends one message (a SOCK_SEQPACKET socket keeps it whole) with nfds
 * descriptors. */
static hvd_status send_with_fds(int sock, const void *buf, size_t len, const int *fds, int nfds) {
  struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(2 * sizeof(int))];
  } u;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

  memset(u.buf, 0, sizeof(u.buf));
  if (nfds > 0) {
    struct cmsghdr *c;
    msg.msg_control = u.buf;
    msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, (size_t)nfds * sizeof(int));
  }
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) != (ssize_t)len)
    return hvd_error(HVD_ERR_NETWORK, "sending on the segment's socket: %s", strerror(errno));
  return HVD_OK;
}

/* Takes one message of exactly len bytes with exactly nfds descriptors if
 * one has come (*there says whether); the end of the connection is a
 * refusal. */
static hvd_status take_with_fds(int sock, void *buf, size_t len, int *fds, int nfds,
                                bool *there) {
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(2 * sizeof(int))];
  } u;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof(u.buf)};
  ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  struct cmsghdr *c;
  int got = 0;

  *there = false;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
    return HVD_OK;
  *there = true;
  if (n < 0)
    return hvd_error(HVD_ERR_NETWORK, "receiving on the segment's socket: %s", strerror(errno));
  c = CMSG_FIRSTHDR(&msg);
  if (c != NULL && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
    got = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    int *in = (int *)(void *)CMSG_DATA(c);
    for (int i = 0; i < got; i++) {
      if (i < nfds && got == nfds)
        fds[i] = in[i];
      else
        close(in[i]);
    }
  }
  if (n != (ssize_t)len || got != nfds || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    for (int i = 0; i < nfds && got == nfds; i++) {
      close(fds[i]);
      fds[i] = -1;
    }
    return hvd_error(HVD_ERR_NETWORK, n == 0 ? "the connection ended" : "a malformed message");
  }
  return HVD_OK;
}

/* The same, waiting for the message until the deadline. */
static hvd_status recv_with_fds(int sock, void *buf, size_t len, int *fds, int nfds,
                                int64_t deadline_ns) {
  for (;;) {
    bool there;
    hvd_status st = wait_fd(sock, POLLIN, deadline_ns);
    if (st == HVD_OK)
      st = take_with_fds(sock, buf, len, fds, nfds, &there);
    if (st != HVD_OK || there)
      return st;
  }
}

/* ---- the state, and the mapping ----------------------------------------------------- */

static struct net_shm *shm_new(struct net_comm *comm) {
  struct net_shm *s = calloc(1, sizeof(*s));

  if (s == NULL)
    return NULL;
  s->comm = comm;
  s->rank = comm->rank;
  s->size = comm->size;
  s->pidfds = malloc((size_t)comm->size * sizeof(int));
  s->bells = malloc((size_t)comm->size * sizeof(int));
  if (s->pidfds == NULL || s->bells == NULL) {
    free(s->pidfds);
    free(s->bells);
    free(s);
    return NULL;
  }
  for (int r = 0; r < comm->size; r++)
    s->pidfds[r] = s->bells[r] = -1;
  return s;
}

static hvd_status map_segment(struct net_shm *s, int fd, size_t bytes, size_t buffer_bytes,
                              size_t ring_bytes) {
  size_t data_offset, rings_offset;
  /* MAP_POPULATE: the pages are faulted in now, not in the first operations. */
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);

  if (p == MAP_FAILED)
    return hvd_error(HVD_ERR_NO_MEMORY, "mapping %zu bytes: %s", bytes, strerror(errno));
  s->base = p;
  s->len = bytes;
  s->hdr = p;
  s->lines = (struct net_shm_line *)(s->base + sizeof(struct net_shm_header));
  (void)net_shm_layout(s->size, buffer_bytes, ring_bytes, &data_offset, &rings_offset);
  s->data = s->base + data_offset;
  s->rings = s->base + rings_offset;
  s->buffer_bytes = buffer_bytes;
  s->ring_bytes = ring_bytes;
  return HVD_OK;
}

static hvd_status make_bell(struct net_shm *s) {
  s->bells[s->rank] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->bells[s->rank] < 0)
    return hvd_error(HVD_ERR_IO, "eventfd: %s", strerror(errno));
  return HVD_OK;
}

/* ---- member 0 -------------------------------------------------------------------- */

/*
 * Member 0's end of the socket. Anyone on the host can read the socket's
 * name in /proc/net/unix and connect, without the token: a connection is
 * judged by its kernel credentials (this user, a member's process) before
 * anything is read from it, and strangers are closed at once. Members'
 * connections wait side by side for their hellos, and the listener is
 * served while member 0 waits for the members' answers over TCP (a
 * member's connect() blocks while the listener's queue is full, and anyone
 * can fill it): nobody who connects holds anybody else.
 */
struct host_side {
  int memfd;
  int listen_fd;
  int epfd;   /* the listener and the waiting connections */
  int *conns; /* per member, -1 until it proved itself */
  /* Per member, a connection from its process whose hello has not come, or -1. */
  int *waiting;
  int admitted;
  int strangers;         /* connections closed unread: another uid, or no member's process */
  struct ucred stranger; /* the last of them */
  hvd_status failed;     /* HVD_OK while the socket is served; then it is closed */
  char failed_why[WHY_BYTES];
};

static hvd_status create_segment(struct host_side *h, size_t bytes) {
  h->memfd = memfd_create("hvd-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (h->memfd < 0)
    return hvd_error(HVD_ERR_UNSUPPORTED, "memfd_create: %s", strerror(errno));
  if (ftruncate(h->memfd, (off_t)bytes) != 0)
    return hvd_error(HVD_ERR_NO_MEMORY, "sizing the segment to %zu bytes: %s", bytes,
                     strerror(errno));
  /* Nobody may shrink it under the others (they would fault). */
  if (fcntl(h->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return hvd_error(HVD_ERR_UNSUPPORTED, "sealing the segment: %s", strerror(errno));
  return HVD_OK;
}

static void abstract_address(const char *name, struct sockaddr_un *sa, socklen_t *len) {
  size_t nlen = strnlen(name, NAME_MAX_BYTES);
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  /* Abstract namespace: sun_path[0] is 0 and the name follows. */
  memcpy(sa->sun_path + 1, name, nlen);
  *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nlen);
}

static hvd_status create_socket(struct host_side *h, struct offer *o) {
  struct epoll_event ev = {.events = EPOLLIN};
  struct sockaddr_un sa;
  unsigned char rnd[16];
  socklen_t len;

  if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd) ||
      getrandom(o->secret, sizeof(o->secret), 0) != (ssize_t)sizeof(o->secret))
    return hvd_error(HVD_ERR_IO, "getrandom: %s", strerror(errno));
  int k = snprintf(o->name, sizeof(o->name), "hvd-shm-");
  for (size_t i = 0; i < sizeof(rnd); i++)
    k += snprintf(o->name + k, sizeof(o->name) - (size_t)k, "%02x", rnd[i]);
  abstract_address(o->name, &sa, &len);
  h->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (h->listen_fd < 0)
    return hvd_error(HVD_ERR_UNSUPPORTED, "a Unix socket: %s", strerror(errno));
  /* A long queue: strangers in it are closed as soon as they are seen. */
  if (bind(h->listen_fd, (struct sockaddr *)&sa, len) != 0 ||
      listen(h->listen_fd, SOMAXCONN) != 0)
    return hvd_error(HVD_ERR_UNSUPPORTED, "binding a Unix socket: %s", strerror(errno));
  h->epfd = epoll_create1(EPOLL_CLOEXEC);
  ev.data.fd = h->listen_fd;
  if (h->epfd < 0 || epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->listen_fd, &ev) != 0)
    return hvd_error(HVD_ERR_IO, "epoll: %s", strerror(errno));
  return HVD_OK;
}

/* Closes the listener and the connections still waiting for their hello:
 * a member still waiting for the descriptor, or in connect(), sees the end. */
static void stop_serving(struct host_side *h, int size) {
  for (int r = 0; r < size; r++) {
    if (h->waiting[r] >= 0)
      close(h->waiting[r]);
    h->waiting[r] = -1;
  }
  if (h->listen_fd >= 0)
    close(h->listen_fd);
  h->listen_fd = -1;
}

/* Serving the socket failed here: member 0's verdict will say why. */
static void serving_failed(struct host_side *h, int size, hvd_status st) {
  h->failed = st;
  set_why(h->failed_why, "rank 0: ");
  stop_serving(h, size);
}

/* The member (not yet admitted, none of whose connections waits) whose
 * process this is, or -1. */
static int member_of(const struct net_comm *comm, const struct host_side *h, pid_t pid) {
  for (int r = 1; r < comm->size; r++) {
    if (comm->records[r].pid == pid && h->conns[r] < 0 && h->waiting[r] < 0)
      return r;
  }
  return -1;
}

/* Closes a connection from someone who is not a member, unread. */
static void refuse(struct host_side *h, int fd, const struct ucred *cred) {
  h->strangers++;
  h->stranger = *cred;
  close(fd);
}

/* Reads the hello of member r's waiting connection if it has come, and
 * admits the member it proves, passing the segment (and member 0's
 * doorbell) in exchange for the member's. */
static void hear(struct net_shm *s, struct host_side *h, const struct offer *o, int r) {
  struct net_comm *comm = s->comm;
  int nbell = o->ring_bytes > 0 ? 1 : 0;
  int fd = h->waiting[r], bell = -1;
  struct hello hi;
  bool there = false;
  hvd_status st = take_with_fds(fd, &hi, sizeof(hi), &bell, nbell, &there);

  if (st == HVD_OK && !there)
    return;
  h->waiting[r] = -1; /* closing it takes it out of the epoll set */
  /* A member's process that does not prove it is a member is dropped and
   * the wait goes on. */
  if (st != HVD_OK || memcmp(hi.secret, o->secret, SECRET_BYTES) != 0 || hi.rank == 0 ||
      hi.rank >= (uint32_t)comm->size || h->conns[hi.rank] >= 0 ||
      comm->records[hi.rank].pid != comm->records[r].pid) {
    HVD_LOG_WARN("communicator %s: dropped a connection to the shared segment's socket from "
                 "rank %d's process (pid %d) that did not prove it is a member",
                 comm->scope, r, comm->records[r].pid);
    if (bell >= 0)
      close(bell);
    close(fd);
    return;
  }
  h->conns[hi.rank] = fd;
  s->bells[hi.rank] = bell;
  int fds[2] = {h->memfd, s->bells[0]};
  if ((st = send_with_fds(fd, "S", 1, fds, 1 + nbell)) != HVD_OK) {
    serving_failed(h, comm->size, st);
    return;
  }
  h->admitted++;
}

/* Takes what waits on the listener (at most max connections, and none
 * after the deadline), closing strangers unread, then reads the hellos
 * that have come. */
static void serve(struct net_shm *s, struct host_side *h, const struct offer *o, int max,
                  int64_t deadline_ns) {
  struct net_comm *comm = s->comm;

  for (int i = 0; i < max && h->failed == HVD_OK && h->admitted < comm->size - 1; i++) {
    struct epoll_event ev = {.events = EPOLLIN};
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    int fd, r;

    if (hvd_now_ns() >= deadline_ns)
      break;
    fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED)
        continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        serving_failed(h, comm->size,
                       hvd_error(HVD_ERR_IO, "accept on the segment's socket: %s",
                                 strerror(errno)));
      break;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
      close(fd);
      continue;
    }
    if (cred.uid != getuid() || (r = member_of(comm, h, cred.pid)) < 0) {
      refuse(h, fd, &cred);
      continue;
    }
    ev.data.fd = fd;
    if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      serving_failed(h, comm->size, hvd_error(HVD_ERR_IO, "epoll_ctl: %s", strerror(errno)));
      break;
    }
    h->waiting[r] = fd;
    hear(s, h, o, r); /* a member sends its hello right after connecting */
  }
  for (int r = 1; r < comm->size && h->failed == HVD_OK; r++) {
    if (h->waiting[r] >= 0)
      hear(s, h, o, r);
  }
}

/* Receives every member's answer to the offer (connected, or why not)
 * while serving the socket. */
static hvd_status gather(struct net_shm *s, struct host_side *h, const struct offer *o,
                         struct answer *answers, int64_t deadline_ns) {
  struct net_comm *comm = s->comm;
  int n = comm->size - 1, posted = 0;
  struct net_req *reqs = calloc((size_t)n, sizeof(*reqs));
  struct net_req **left = calloc((size_t)n, sizeof(*left));
  hvd_status st = HVD_OK;

  if (reqs == NULL || left == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the segment's setup");
    goto out;
  }
  while (posted < n && st == HVD_OK) {
    st = net_irecv(comm, posted + 1, &answers[posted], sizeof(*answers), &reqs[posted]);
    if (st == HVD_OK)
      posted++;
  }
  while (st == HVD_OK) {
    struct net_wake wake = {.fd = -1};
    size_t k = 0;

    if (h->listen_fd >= 0) {
      serve(s, h, o, ACCEPTS_PER_PASS, deadline_ns);
      if (h->admitted == n)
        stop_serving(h, comm->size);
    }
    for (int i = 0; i < n; i++) {
      if (!reqs[i].done)
        left[k++] = &reqs[i];
    }
    if (k == 0)
      break;
    if (hvd_now_ns() >= deadline_ns) {
      /* The engine's own timeout, and its message naming who is waited for. */
      st = net_wait(comm, left, k);
      break;
    }
    wake.fd = h->listen_fd >= 0 ? h->epfd : -1;
    st = net_wait_event(comm, left, k, &wake, deadline_ns);
  }
  if (st != HVD_OK) {
    /* The engine's message names the rank; a rank with HVD_SHM=0 sends
     * something else, or nothing, in place of its answer. */
    hvd_error_prefix("waiting for the answers to rank 0's shared-memory offer%s",
                     st == HVD_ERR_PROTOCOL || st == HVD_ERR_TIMEOUT
                         ? " (HVD_SHM must be the same on every rank)"
                         : "");
    /* Requests still posted point into memory freed below. */
    for (int i = 0; i < posted; i++) {
      if (!reqs[i].done) {
        net_comm_poison(comm, st);
        break;
      }
    }
  }
out:
  free(left);
  free(reqs);
  return st;
}

/* Admits the members not admitted yet once all answered. Each member
 * connected and sent its hello before answering (member()), so by now
 * every member's connection is queued with its hello: a member still
 * missing after the queue is taken came from a process it did not
 * publish. */
static hvd_status admit_rest(struct net_shm *s, struct host_side *h, const struct offer *o,
                             int64_t deadline_ns) {
  struct net_comm *comm = s->comm;

  if (h->listen_fd >= 0)
    serve(s, h, o, INT_MAX, deadline_ns);
  if (h->failed != HVD_OK)
    return h->failed;
  for (int r = 1; r < comm->size; r++) {
    if (h->conns[r] >= 0)
      continue;
    if (h->strangers > 0)
      return hvd_error(HVD_ERR_UNSUPPORTED,
                       "rank %d (pid %d) did not reach the segment's socket as that process; the "
                       "last connection refused came from pid %d of uid %u (the ranks are in "
                       "different process or user namespaces)",
                       r, comm->records[r].pid, (int)h->stranger.pid, (unsigned)h->stranger.uid);
    return hvd_error(HVD_ERR_UNSUPPORTED,
                     "rank %d (pid %d) did not prove it is a member on the segment's socket", r,
                     comm->records[r].pid);
  }
  return HVD_OK;
}

static hvd_status exchange_all(struct net_comm *comm, const void *out, void *in, size_t len) {
  hvd_status st = HVD_OK;
  for (int r = 1; r < comm->size && st == HVD_OK; r++) {
    if (out != NULL)
      st = net_send(comm, r, out, len);
    else
      st = net_recv(comm, r, (char *)in + (size_t)(r - 1) * len, len);
  }
  return st;
}

/* The first failure among the members' answers, into why; false if none. */
static bool first_refusal(const struct answer *a, int n, char *why) {
  for (int r = 1; r < n; r++) {
    if (!a[r - 1].ok) {
      char detail[WHY_BYTES];
      snprintf(detail, sizeof(detail), "%.*s", WHY_BYTES - 1, a[r - 1].why);
      snprintf(why, WHY_BYTES, "rank %d: %.150s", r, detail);
      return true;
    }
  }
  return false;
}

/* Logs, once per set-up, the connections closed unread. */
static void log_strangers(const struct net_comm *comm, const struct host_side *h) {
  if (h->strangers > 0)
    HVD_LOG_WARN("communicator %s: closed %d connection%s to the shared segment's socket from "
                 "processes that are not its members (the last: pid %d of uid %u)",
                 comm->scope, h->strangers, h->strangers == 1 ? "" : "s", (int)h->stranger.pid,
                 (unsigned)h->stranger.uid);
}

static hvd_status host(struct net_shm *s, size_t buffer_bytes, size_t ring_bytes, char *why) {
  struct net_comm *comm = s->comm;
  struct host_side h = {.memfd = -1, .listen_fd = -1, .epfd = -1};
  struct offer o;
  struct answer *answers = calloc((size_t)comm->size, sizeof(*answers));
  struct answer verdict = {.ok = 1};
  int64_t deadline = hvd_now_ns() + comm->ctx->timeout_ms * 1000000;
  hvd_status st, local = HVD_OK;

  h.conns = malloc((size_t)comm->size * sizeof(int));
  h.waiting = malloc((size_t)comm->size * sizeof(int));
  if (answers == NULL || h.conns == NULL || h.waiting == NULL) {
    free(answers);
    free(h.conns);
    free(h.waiting);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the segment's setup");
  }
  for (int r = 0; r < comm->size; r++)
    h.conns[r] = h.waiting[r] = -1;
  memset(&o, 0, sizeof(o));
  o.size = (uint32_t)comm->size;
  o.buffer_bytes = buffer_bytes;
  o.ring_bytes = ring_bytes;
  o.segment_bytes = segment_bytes(comm->size, buffer_bytes, ring_bytes);
  local = create_segment(&h, o.segment_bytes);
  if (local == HVD_OK)
    local = create_socket(&h, &o);
  if (local == HVD_OK && ring_bytes > 0)
    local = make_bell(s);
  if (local == HVD_OK)
    local = map_segment(s, h.memfd, o.segment_bytes, buffer_bytes, ring_bytes);
  o.ok = local == HVD_OK;
  if (!o.ok) {
    set_why(o.why, "rank 0: ");
  } else {
    s->hdr->magic = NET_SHM_MAGIC;
    s->hdr->size = (uint32_t)comm->size;
    s->hdr->buffer_bytes = buffer_bytes;
  }
  st = exchange_all(comm, &o, NULL, sizeof(o));
  if (st == HVD_OK && o.ok) {
    st = gather(s, &h, &o, answers, deadline);
    if (st == HVD_OK && !first_refusal(answers, comm->size, verdict.why)) {
      if (h.failed != HVD_OK)
        memcpy(verdict.why, h.failed_why, sizeof(verdict.why));
      else if (admit_rest(s, &h, &o, deadline) != HVD_OK)
        set_why(verdict.why, "rank 0: ");
    }
    /* Refused or not, every connection closes now, and the listener
     * with the connections still queued on it: a member still waiting
     * for the descriptor sees the end. */
    for (int r = 0; r < comm->size; r++) {
      if (h.conns[r] >= 0)
        close(h.conns[r]);
    }
    stop_serving(&h, comm->size);
    log_strangers(comm, &h);
    if (st == HVD_OK)
      st = exchange_all(comm, NULL, answers, sizeof(*answers));
    if (st == HVD_OK && verdict.why[0] == 0)
      (void)first_refusal(answers, comm->size, verdict.why);
    verdict.ok = verdict.why[0] == 0;
    if (st == HVD_OK)
      st = exchange_all(comm, &verdict, NULL, sizeof(verdict));
  } else if (!o.ok) {
    memcpy(verdict.why, o.why, sizeof(verdict.why));
    verdict.ok = 0;
  }
  if (h.listen_fd >= 0)
    close(h.listen_fd);
  if (h.epfd >= 0)
    close(h.epfd);
  if (h.memfd >= 0)
    close(h.memfd);
  free(h.waiting);
  free(h.conns);
  free(answers);
  if (st == HVD_OK && !verdict.ok)
    memcpy(why, verdict.why, WHY_BYTES);
  return st;
}

/* ---- the other members ------------------------------------------------------------- */

/* Connects before the deadline: connect() waits while rank 0's queue is
 * full. */
static hvd_status connect_to(const struct offer *o, int64_t deadline_ns, int *out) {
  int64_t left_us = (deadline_ns - hvd_now_ns()) / 1000;
  struct timeval tv = {.tv_sec = left_us > 0 ? left_us / 1000000 : 0,
                       .tv_usec = left_us > 0 ? left_us % 1000000 : 1};
  struct sockaddr_un sa;
  socklen_t len;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  if (fd < 0)
    return hvd_error(HVD_ERR_UNSUPPORTED, "a Unix socket: %s", strerror(errno));
  abstract_address(o->name, &sa, &len);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
      connect(fd, (struct sockaddr *)&sa, len) != 0) {
    int e = errno;
    close(fd);
    if (e == EAGAIN || e == EINPROGRESS)
      return hvd_error(HVD_ERR_TIMEOUT, "rank 0's socket took no connection in time");
    return hvd_error(HVD_ERR_UNSUPPORTED,
                     "cannot reach rank 0's socket: %s (the ranks are in different network "
                     "namespaces)",
                     strerror(e));
  }
  *out = fd;
  return HVD_OK;
}

/* Connects, proves the secret (sending the doorbell for links) and checks
 * that the socket is rank 0's process. */
static hvd_status introduce(struct net_shm *s, const struct offer *o, int64_t deadline_ns,
                            int *sock) {
  struct net_comm *comm = s->comm;
  struct hello hi = {.rank = (uint32_t)comm->rank};
  struct ucred cred;
  socklen_t clen = sizeof(cred);
  hvd_status st;

  memcpy(hi.secret, o->secret, SECRET_BYTES);
  if (o->size != (uint32_t)comm->size || o->buffer_bytes == 0 || o->buffer_bytes % 4096 != 0 ||
      (o->ring_bytes & (o->ring_bytes - 1)) != 0 ||
      o->segment_bytes != segment_bytes(comm->size, o->buffer_bytes, o->ring_bytes))
    return hvd_error(HVD_ERR_PROTOCOL, "rank 0 offered a segment of %llu bytes for %u members",
                     (unsigned long long)o->segment_bytes, o->size);
  if (o->ring_bytes > 0 && (st = make_bell(s)) != HVD_OK)
    return st;
  if ((st = connect_to(o, deadline_ns, sock)) != HVD_OK)
    return st;
  if ((st = send_with_fds(*sock, &hi, sizeof(hi), &s->bells[s->rank], o->ring_bytes > 0)) !=
      HVD_OK)
    return st;
  if (getsockopt(*sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0)
    return hvd_error(HVD_ERR_IO, "SO_PEERCRED: %s", strerror(errno));
  /* Only rank 0 knew the name before it bound it: another process or user
   * there means the ranks see each other through different namespaces. */
  if (cred.pid != comm->records[0].pid || cred.uid != getuid())
    return hvd_error(HVD_ERR_UNSUPPORTED,
                     "the segment's socket does not belong to rank 0's process (pid %d): it is "
                     "pid %d of uid %u here (the ranks are in different process or user "
                     "namespaces)",
                     comm->records[0].pid, (int)cred.pid, (unsigned)cred.uid);
  return HVD_OK;
}

static hvd_status member(struct net_shm *s, char *why) {
  struct net_comm *comm = s->comm;
  struct offer o;
  struct answer a = {.ok = 1};
  struct answer verdict;
  int64_t deadline = hvd_now_ns() + comm->ctx->timeout_ms * 1000000;
  int sock = -1;
  hvd_status st = net_recv(comm, 0, &o, sizeof(o));

  /* Rank 0 with HVD_SHM=0 sends something else, or nothing, instead. */
  if (st != HVD_OK)
    return hvd_error_prefix("waiting for rank 0's shared-memory offer%s",
                            st == HVD_ERR_PROTOCOL || st == HVD_ERR_TIMEOUT
                                ? " (HVD_SHM must be the same on every rank)"
                                : "");
  if (!o.ok) {
    snprintf(why, WHY_BYTES, "%.*s", WHY_BYTES - 1, o.why);
    return HVD_OK;
  }
  a.ok = introduce(s, &o, deadline, &sock) == HVD_OK;
  if (!a.ok)
    set_why(a.why, "");
  st = net_send(comm, 0, &a, sizeof(a));
  if (st == HVD_OK && a.ok) {
    char byte;
    int fds[2] = {-1, -1};
    int nfds = o.ring_bytes > 0 ? 2 : 1;
    hvd_status got = recv_with_fds(sock, &byte, 1, fds, nfds, deadline);
    if (got == HVD_OK) {
      s->bells[0] = fds[1];
      got = map_segment(s, fds[0], o.segment_bytes, o.buffer_bytes, o.ring_bytes);
      close(fds[0]);
    } else {
      hvd_error_prefix("rank 0 did not pass the segment");
    }
    if (got == HVD_OK &&
        (s->hdr->magic != NET_SHM_MAGIC || s->hdr->size != (uint32_t)comm->size))
      got = hvd_error(HVD_ERR_PROTOCOL, "the segment rank 0 passed is not one it made");
    a.ok = got == HVD_OK;
    if (!a.ok)
      set_why(a.why, "");
  }
  if (sock >= 0)
    close(sock);
  if (st == HVD_OK)
    st = net_send(comm, 0, &a, sizeof(a));
  if (st == HVD_OK)
    st = net_recv(comm, 0, &verdict, sizeof(verdict));
  if (st == HVD_OK && !verdict.ok)
    snprintf(why, WHY_BYTES, "%.*s", WHY_BYTES - 1, verdict.why);
  return st;
}

/* Descriptors that become readable when a member's process ends. */
static void watch_members(struct net_shm *s) {
  for (int r = 0; r < s->size; r++) {
    if (r != s->rank)
      s->pidfds[r] = (int)syscall(SYS_pidfd_open, (pid_t)s->comm->records[r].pid, 0);
  }
}

hvd_status net_shm_get(struct net_comm *comm, size_t buffer_bytes, size_t ring_bytes,
                       struct net_shm **out) {
  char why[WHY_BYTES] = "";
  struct net_shm *s = NULL;
  hvd_status st;

  if (comm->shm_state == SHM_UNDECIDED) {
    if (comm->size < 2 || !one_host(comm)) {
      comm->shm_state = SHM_OFF;
      if (comm->size > 1)
        HVD_LOG_INFO("communicator %s: %d ranks on several hosts: TCP", comm->scope, comm->size);
    } else {
      if ((s = shm_new(comm)) == NULL)
        return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the segment's state");
      buffer_bytes = (buffer_bytes + 4095) / 4096 * 4096;
      st = comm->rank == 0 ? host(s, buffer_bytes, ring_bytes, why) : member(s, why);
      if (st != HVD_OK) {
        /* Recorded as the segment's failure, this thread's message (the
         * peer and why) survives the destroy. */
        if (s->hdr != NULL)
          net_shm_mark_failed(s);
        net_shm_destroy(s);
        return hvd_error_prefix("communicator %s: setting up shared memory", comm->scope);
      }
      if (why[0] != 0 || s->base == NULL) {
        net_shm_destroy(s);
        comm->shm_state = SHM_OFF;
        HVD_LOG_WARN("communicator %s: %d ranks on host %s cannot share memory (%s): TCP",
                     comm->scope, comm->size, comm->records[0].host,
                     why[0] ? why : "no segment");
      } else {
        watch_members(s);
        comm->shm = s;
        comm->shm_state = SHM_ON;
        if (ring_bytes > 0)
          net_shm_attach_links(s);
        HVD_LOG_INFO("communicator %s: %d ranks on host %s: shared memory (2 x %zu KiB per "
                     "rank%s)",
                     comm->scope, comm->size, comm->records[0].host, s->buffer_bytes / 1024,
                     ring_bytes > 0 ? ", messages through rings" : "");
      }
    }
  }
  *out = comm->shm_state == SHM_ON ? comm->shm : NULL;
  return HVD_OK;
}

void *net_shm_buffer(const struct net_shm *s, int r, unsigned b) {
  return s->data + ((size_t)r * 2 + (b & 1u)) * s->buffer_bytes;
}

size_t net_shm_buffer_bytes(const struct net_shm *s) { return s->buffer_bytes; }

struct net_comm *net_shm_comm(const struct net_shm *s) { return s->comm; }

unsigned net_shm_next_round(struct net_shm *s) { return s->rounds++ & 1u; }

void net_shm_post(struct net_shm *s, unsigned b, uint64_t v) { s->lines[s->rank].value[b & 1u] = v; }

uint64_t net_shm_value(const struct net_shm *s, int r, unsigned b) {
  return s->lines[r].value[b & 1u];
}

void net_shm_destroy(struct net_shm *s) {
  if (s == NULL)
    return;
  if (s->hdr != NULL && atomic_load(&s->hdr->failed) == 0) {
    hvd_error(HVD_ERR_ABORTED, "rank %d left communicator %s", s->rank, s->comm->scope);
    net_shm_mark_failed(s);
  }
  for (int r = 0; r < s->size; r++) {
    if (s->pidfds[r] >= 0)
      close(s->pidfds[r]);
    if (s->bells[r] >= 0)
      close(s->bells[r]);
  }
  if (s->base != NULL)
    munmap(s->base, s->len);
  free(s->pidfds);
  free(s->bells);
  free(s);
}
