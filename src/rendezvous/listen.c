/*
 * The server's listening socket. We create it ourselves (rather than let
 * libmicrohttpd) to control the address family, dual-stack IPv6, the backlog,
 * and to report exactly which address and port were bound.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "listen.h"

enum { LISTEN_BACKLOG = 65535 }; /* the kernel caps it at net.core.somaxconn */

void rdzv_format_address(const struct sockaddr *sa, char *out, size_t size) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;

  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    snprintf(out, size, "[%s]:%d", host, port);
    return;
  }
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in4 = (const struct sockaddr_in *)sa;
    inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
    port = ntohs(in4->sin_port);
  }
  snprintf(out, size, "%s:%d", host, port);
}

static hvd_status try_bind(const struct sockaddr *sa, socklen_t sa_len, bool dual_stack,
                           int *fd_out) {
  int one = 1;
  int zero = 0;
  int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  char where[INET6_ADDRSTRLEN + 16];

  rdzv_format_address(sa, where, sizeof(where));
  if (fd < 0)
    return hvd_error(HVD_ERR_IO, "socket for %s: %s", where, strerror(errno));
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (sa->sa_family == AF_INET6)
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dual_stack ? &zero : &one, sizeof(int));
  if (bind(fd, sa, sa_len) != 0) {
    int err = errno;
    close(fd);
    return hvd_error(err == EADDRINUSE ? HVD_ERR_CONFLICT : HVD_ERR_IO, "bind %s: %s%s", where,
                     strerror(err),
                     err == EADDRNOTAVAIL ? " (is it an address of this host?)"
                     : err == EADDRINUSE  ? " (choose another port, or 0 for any free one)"
                     : err == EACCES      ? " (ports below 1024 need privileges)"
                                          : "");
  }
  if (listen(fd, LISTEN_BACKLOG) != 0) {
    int err = errno;
    close(fd);
    return hvd_error(HVD_ERR_IO, "listen on %s: %s", where, strerror(err));
  }
  *fd_out = fd;
  return HVD_OK;
}

/* Every interface: dual-stack IPv6, or IPv4 where IPv6 is unavailable. */
static hvd_status bind_any(int port, int *fd) {
  struct sockaddr_in6 in6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                             .sin6_addr = IN6ADDR_ANY_INIT};
  struct sockaddr_in in4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
  hvd_status st = try_bind((struct sockaddr *)&in6, sizeof(in6), true, fd);

  if (st == HVD_OK || st == HVD_ERR_CONFLICT)
    return st;
  return try_bind((struct sockaddr *)&in4, sizeof(in4), false, fd);
}

static hvd_status bind_named(const char *bind_address, int port, int *fd) {
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
  struct addrinfo *list = NULL;
  char host[256];
  char service[16];
  size_t len = strlen(bind_address);
  hvd_status st = HVD_ERR_NOT_FOUND;
  int rc;

  /* Accept "[::1]" as well as "::1". */
  if (len >= 2 && bind_address[0] == '[' && bind_address[len - 1] == ']') {
    bind_address++;
    len -= 2;
  }
  if (len >= sizeof(host))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "bind address of %zu bytes is too long", len);
  memcpy(host, bind_address, len);
  host[len] = '\0';
  snprintf(service, sizeof(service), "%d", port);
  rc = getaddrinfo(host, service, &hints, &list);
  if (rc != 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "cannot resolve bind address '%s': %s", host,
                     gai_strerror(rc));
  *fd = -1;
  for (const struct addrinfo *ai = list; ai != NULL && *fd < 0; ai = ai->ai_next)
    st = try_bind(ai->ai_addr, ai->ai_addrlen, false, fd);
  freeaddrinfo(list);
  if (*fd < 0 && st == HVD_ERR_NOT_FOUND)
    return hvd_error(HVD_ERR_NOT_FOUND, "no usable address for '%s'", host);
  return *fd < 0 ? st : HVD_OK;
}

hvd_status rdzv_listen(const char *bind_address, int port, int *fd_out, char *address,
                       size_t address_size, int *port_out) {
  struct sockaddr_storage ss;
  socklen_t ss_len = sizeof(ss);
  hvd_status st;
  int fd = -1;

  if (port < 0 || port > 65535)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "port %d is not in 0-65535", port);
  if (bind_address == NULL || bind_address[0] == '\0')
    st = bind_any(port, &fd);
  else
    st = bind_named(bind_address, port, &fd);
  if (st != HVD_OK)
    return st;
  if (getsockname(fd, (struct sockaddr *)&ss, &ss_len) != 0) {
    int err = errno;
    close(fd);
    return hvd_error(HVD_ERR_IO, "getsockname: %s", strerror(err));
  }
  rdzv_format_address((struct sockaddr *)&ss, address, address_size);
  *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  *fd_out = fd;
  return HVD_OK;
}
