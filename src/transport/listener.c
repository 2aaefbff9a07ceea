/*
 * The process's listening socket.
 *
 * DESIGN. One socket on the wildcard address (dual-stack for AF_INET6)
 * accepts every peer. Without HVD_PORT_RANGE the kernel picks a free port.
 * With a range (firewalled clusters), each process starts at a random port
 * of the range and walks it with wrap-around, so that ranks starting together
 * on one host do not all collide on the first port. A port counts as taken
 * when bind() or listen() says EADDRINUSE: with SO_REUSEADDR, Linux lets two
 * sockets bind one port as long as neither listens, so the loser finds out
 * only at listen(). Each attempt uses a fresh socket.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport.h"

enum { LISTEN_BACKLOG = 4096 };

/* Different in every process and call, so that concurrent ranks spread out. */
static uint64_t random_start(void) {
  static _Atomic uint64_t counter;
  uint64_t x = (uint64_t)hvd_now_ns() ^ ((uint64_t)getpid() << 32) ^ counter++;

  /* splitmix64 finalizer */
  x += 0x9e3779b97f4a7c15u;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
  return x ^ (x >> 31);
}

/*
 * One attempt on one port. Returns 0 and the socket, or the errno of the
 * call that failed, named in *call.
 */
static int try_listen(int family, int port, int *fd_out, const char **call) {
  struct sockaddr_storage ss;
  socklen_t len;
  int one = 1;
  int zero = 0;
  int err = 0;
  int fd;

  memset(&ss, 0, sizeof(ss));
  if (family == AF_INET6) {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    in6->sin6_port = htons((uint16_t)port);
    len = sizeof(*in6);
  } else {
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    in4->sin_family = AF_INET;
    in4->sin_addr.s_addr = htonl(INADDR_ANY);
    in4->sin_port = htons((uint16_t)port);
    len = sizeof(*in4);
  }
  fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *call = "socket";
    return errno;
  }
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    err = errno;
    *call = "setsockopt(SO_REUSEADDR)";
  } else if (family == AF_INET6 &&
             setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) != 0) {
    err = errno;
    *call = "setsockopt(IPV6_V6ONLY=0)";
  } else if (bind(fd, (struct sockaddr *)&ss, len) != 0) {
    err = errno;
    *call = "bind";
  } else if (listen(fd, LISTEN_BACKLOG) != 0) {
    err = errno;
    *call = "listen";
  }
  if (err != 0) {
    close(fd);
    return err;
  }
  *fd_out = fd;
  return 0;
}

static hvd_status listen_error(int family, int port, const char *call, int err) {
  const char *fam = family == AF_INET6 ? "IPv6" : "IPv4";

  if (err == EAFNOSUPPORT)
    return hvd_error(HVD_ERR_UNSUPPORTED, "%s listener: %s: %s (is %s enabled on this host?)", fam,
                     call, strerror(err), fam);
  return hvd_error(HVD_ERR_IO, "%s listener on port %d: %s: %s%s", fam, port, call,
                   strerror(err),
                   err == EACCES && port > 0 && port < 1024
                       ? " (ports below 1024 need privileges; choose another HVD_PORT_RANGE)"
                       : "");
}

hvd_status net_listen(int family, const char *port_range, int *fd, int *port) {
  return net_listen_avoiding(family, port_range, 0, fd, port);
}

hvd_status net_listen_avoiding(int family, const char *port_range, int avoid, int *fd,
                               int *port) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  const char *call = "";
  int lo = 0;
  int hi = 0;
  int s = -1;
  int err;
  hvd_status st;

  if (family != AF_INET && family != AF_INET6)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "listener address family %d is neither AF_INET nor AF_INET6", family);
  if (port_range != NULL && port_range[0] != '\0') {
    st = hvd_parse_port_range(port_range, &lo, &hi);
    if (st != HVD_OK)
      return st;
  }
  if (lo == 0) {
    err = try_listen(family, 0, &s, &call);
    if (err != 0)
      return listen_error(family, 0, call, err);
  } else {
    uint32_t count = (uint32_t)(hi - lo) + 1;
    uint32_t start = (uint32_t)(random_start() % count);

    for (uint32_t i = 0; i < count && s < 0; i++) {
      int p = lo + (int)((start + i) % count);
      if (p == avoid)
        continue;
      err = try_listen(family, p, &s, &call);
      if (err != 0 && err != EADDRINUSE)
        return listen_error(family, p, call, err);
    }
    if (s < 0)
      return hvd_error(HVD_ERR_NETWORK,
                       "no free port in HVD_PORT_RANGE=%s (all %u in use; widen the range, or "
                       "unset it for any free port)",
                       port_range, (unsigned)count);
  }
  if (getsockname(s, (struct sockaddr *)&ss, &len) != 0) {
    err = errno;
    close(s);
    return hvd_error(HVD_ERR_IO, "listener: getsockname: %s", strerror(err));
  }
  *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                         : ((struct sockaddr_in *)&ss)->sin_port);
  *fd = s;
  return HVD_OK;
}
