/*
 * Setting up a communicator's shared segment.
 *
 * DESIGN. Member 0 creates the segment with memfd_create (no name, no
 * /dev/shm quota: a default Kubernetes pod has 64 MiB there) and a Unix
 * socket in the abstract namespace under a random name, and sends both
 * names with a random secret to every member over the communicator's TCP
 * links, which the job token authenticated. Each member connects and sends
 * its rank and the secret; member 0 checks the secret and that the kernel's
 * credentials of the connection (SO_PEERCRED) are this user and the process
 * the member published, then passes the memfd (SCM_RIGHTS). Four fixed
 * messages over TCP keep everybody in step, and the last one carries member
 * 0's verdict, so that all members take the same path:
 *   0 -> all: offer (names, secret, sizes) or why there is none
 *   all -> 0: connected, or why not
 *   (member 0 accepts, checks and passes the descriptor)
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
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "transport_private.h"

enum { NAME_MAX_BYTES = 48, SECRET_BYTES = 16, WHY_BYTES = 200 };

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

/* Receives one message of exactly len bytes with exactly nfds descriptors
 * before the deadline; the end of the connection is a refusal. */
static hvd_status recv_with_fds(int sock, void *buf, size_t len, int *fds, int nfds,
                                int64_t deadline_ns) {
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(2 * sizeof(int))];
  } u;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof(u.buf)};
  hvd_status st = wait_fd(sock, POLLIN, deadline_ns);
  ssize_t n;
  struct cmsghdr *c;
  int got = 0;

  if (st != HVD_OK)
    return st;
  n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
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

struct host_side {
  int memfd;
  int listen_fd;
  int *conns; /* per member, -1 until it proved itself */
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

static hvd_status create_socket(struct host_side *h, struct offer *o, int backlog) {
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
  if (bind(h->listen_fd, (struct sockaddr *)&sa, len) != 0 || listen(h->listen_fd, backlog) != 0)
    return hvd_error(HVD_ERR_UNSUPPORTED, "binding a Unix socket: %s", strerror(errno));
  return HVD_OK;
}

/* Accepts one connection per member, checks who it is, and passes the
 * segment (and member 0's doorbell) in exchange for the member's. */
static hvd_status admit(struct net_shm *s, struct host_side *h, const struct offer *o,
                        int64_t deadline_ns) {
  struct net_comm *comm = s->comm;
  int nbell = o->ring_bytes > 0 ? 1 : 0;
  int admitted = 0;

  while (admitted < comm->size - 1) {
    struct hello hi;
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    int bell = -1;
    int fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    hvd_status st;

    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
        return hvd_error(HVD_ERR_IO, "accept: %s", strerror(errno));
      if ((st = wait_fd(h->listen_fd, POLLIN, deadline_ns)) != HVD_OK)
        return hvd_error(st, "%d of %d members connected to the segment's socket in time",
                         admitted, comm->size - 1);
      continue;
    }
    st = recv_with_fds(fd, &hi, sizeof(hi), &bell, nbell, deadline_ns);
    if (st == HVD_OK && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0)
      st = hvd_error(HVD_ERR_IO, "SO_PEERCRED: %s", strerror(errno));
    /* A stranger (wrong secret) is dropped and the wait goes on; a member
     * that is not the process it published means namespaces differ. */
    if (st != HVD_OK || memcmp(hi.secret, o->secret, SECRET_BYTES) != 0 || hi.rank == 0 ||
        hi.rank >= (uint32_t)comm->size || h->conns[hi.rank] >= 0 || cred.uid != getuid()) {
      HVD_LOG_WARN("communicator %s: dropped a connection to the shared segment's socket that "
                   "did not prove it is a member (pid %d)",
                   comm->scope, st == HVD_OK ? (int)cred.pid : -1);
      if (bell >= 0)
        close(bell);
      close(fd);
      continue;
    }
    h->conns[hi.rank] = fd;
    s->bells[hi.rank] = bell;
    if (cred.pid != comm->records[hi.rank].pid)
      return hvd_error(HVD_ERR_UNSUPPORTED,
                       "rank %u published pid %d but connected as pid %d (the ranks are in "
                       "different process namespaces)",
                       hi.rank, comm->records[hi.rank].pid, (int)cred.pid);
    int fds[2] = {h->memfd, s->bells[0]};
    if ((st = send_with_fds(fd, "S", 1, fds, 1 + nbell)) != HVD_OK)
      return st;
    admitted++;
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

static hvd_status host(struct net_shm *s, size_t buffer_bytes, size_t ring_bytes, char *why) {
  struct net_comm *comm = s->comm;
  struct host_side h = {.memfd = -1, .listen_fd = -1};
  struct offer o;
  struct answer *answers = calloc((size_t)comm->size, sizeof(*answers));
  struct answer verdict = {.ok = 1};
  int64_t deadline = hvd_now_ns() + comm->ctx->timeout_ms * 1000000;
  hvd_status st, local = HVD_OK;

  h.conns = malloc((size_t)comm->size * sizeof(int));
  if (answers == NULL || h.conns == NULL) {
    free(answers);
    free(h.conns);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the segment's setup");
  }
  for (int r = 0; r < comm->size; r++)
    h.conns[r] = -1;
  memset(&o, 0, sizeof(o));
  o.size = (uint32_t)comm->size;
  o.buffer_bytes = buffer_bytes;
  o.ring_bytes = ring_bytes;
  o.segment_bytes = segment_bytes(comm->size, buffer_bytes, ring_bytes);
  local = create_segment(&h, o.segment_bytes);
  if (local == HVD_OK)
    local = create_socket(&h, &o, comm->size);
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
    st = exchange_all(comm, NULL, answers, sizeof(*answers));
    if (st == HVD_OK && !first_refusal(answers, comm->size, verdict.why) &&
        (local = admit(s, &h, &o, deadline)) != HVD_OK)
      set_why(verdict.why, "rank 0: ");
    /* Refused or not, every connection closes now, and the listener
     * with the connections still queued on it: a member still waiting
     * for the descriptor sees the end. */
    for (int r = 0; r < comm->size; r++) {
      if (h.conns[r] >= 0)
        close(h.conns[r]);
    }
    close(h.listen_fd);
    h.listen_fd = -1;
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
  if (h.memfd >= 0)
    close(h.memfd);
  free(h.conns);
  free(answers);
  if (st == HVD_OK && !verdict.ok)
    memcpy(why, verdict.why, WHY_BYTES);
  return st;
}

/* ---- the other members ------------------------------------------------------------- */

static hvd_status connect_to(const struct offer *o, int *out) {
  struct sockaddr_un sa;
  socklen_t len;
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

  if (fd < 0)
    return hvd_error(HVD_ERR_UNSUPPORTED, "a Unix socket: %s", strerror(errno));
  abstract_address(o->name, &sa, &len);
  if (connect(fd, (struct sockaddr *)&sa, len) != 0) {
    int e = errno;
    close(fd);
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
static hvd_status introduce(struct net_shm *s, const struct offer *o, int *sock) {
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
  if ((st = connect_to(o, sock)) != HVD_OK)
    return st;
  if ((st = send_with_fds(*sock, &hi, sizeof(hi), &s->bells[s->rank], o->ring_bytes > 0)) !=
      HVD_OK)
    return st;
  if (getsockopt(*sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 ||
      cred.pid != comm->records[0].pid || cred.uid != getuid())
    return hvd_error(HVD_ERR_UNSUPPORTED,
                     "the segment's socket does not belong to rank 0's process (pid %d)",
                     comm->records[0].pid);
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

  if (st != HVD_OK)
    return st;
  if (!o.ok) {
    snprintf(why, WHY_BYTES, "%.*s", WHY_BYTES - 1, o.why);
    return HVD_OK;
  }
  a.ok = introduce(s, &o, &sock) == HVD_OK;
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
