/*
 * Who is at the other end of a TCP connection from this host: the kernel's
 * socket table says which uid owns the client's socket (sock_diag, the
 * table `ss -e` reads), so a local rank needs no credential at all.
 *
 * DESIGN. One exact lookup of the client's socket by its four-tuple, seen
 * from its side (its address and port are the source, ours the
 * destination), in this process's network namespace: a connection from
 * another host, or from another namespace, is not found, and the caller
 * then needs other proof. IPv4 clients of a dual-stack listener arrive as
 * IPv4-mapped IPv6 addresses and are looked up as IPv4.
 */
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "launch.h"

/* The family, address (network order, 16 bytes at most) and port of sa,
 * IPv4-mapped addresses as IPv4. */
static bool endpoint(const struct sockaddr *sa, int *family, uint32_t addr[4], uint16_t *port) {
  memset(addr, 0, 16);
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    *family = AF_INET;
    memcpy(addr, &in->sin_addr, 4);
    *port = in->sin_port;
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      *family = AF_INET;
      memcpy(addr, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      *family = AF_INET6;
      memcpy(addr, &in6->sin6_addr, 16);
    }
    *port = in6->sin6_port;
    return true;
  }
  return false;
}

hvd_status launch_peer_uid(const struct sockaddr *peer, const struct sockaddr *local, uid_t *uid) {
  struct {
    struct nlmsghdr nlh;
    struct inet_diag_req_v2 req;
  } msg;
  union {
    struct nlmsghdr nlh;
    char bytes[8192];
  } answer;
  struct timeval tv = {.tv_sec = 1};
  int pfamily, lfamily, fd;
  uint16_t pport, lport;
  ssize_t n;

  memset(&msg, 0, sizeof(msg));
  if (!endpoint(peer, &pfamily, msg.req.id.idiag_src, &pport) ||
      !endpoint(local, &lfamily, msg.req.id.idiag_dst, &lport) || pfamily != lfamily)
    return hvd_error(HVD_ERR_NOT_FOUND, "not a TCP connection of this host");
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.req.sdiag_family = (uint8_t)pfamily;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = pport;
  msg.req.id.idiag_dport = lport;
  msg.req.id.idiag_cookie[0] = msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

  fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0)
    return hvd_error(HVD_ERR_IO, "socket(NETLINK_SOCK_DIAG): %s", strerror(errno));
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (send(fd, &msg, sizeof(msg), 0) != (ssize_t)sizeof(msg)) {
    int err = errno;
    close(fd);
    return hvd_error(HVD_ERR_IO, "sock_diag: send: %s", strerror(err));
  }
  n = recv(fd, &answer, sizeof(answer), 0);
  close(fd);
  if (n < 0)
    return hvd_error(HVD_ERR_IO, "sock_diag: recv: %s", strerror(errno));
  if (!NLMSG_OK(&answer.nlh, (size_t)n))
    return hvd_error(HVD_ERR_PROTOCOL, "sock_diag: a truncated answer");
  if (answer.nlh.nlmsg_type == NLMSG_ERROR) {
    const struct nlmsgerr *e = NLMSG_DATA(&answer.nlh);
    return hvd_error(HVD_ERR_NOT_FOUND, "the client's socket is not on this host (%s)",
                     strerror(-e->error));
  }
  if (answer.nlh.nlmsg_type != SOCK_DIAG_BY_FAMILY ||
      answer.nlh.nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
    return hvd_error(HVD_ERR_PROTOCOL, "sock_diag: an answer of type %u",
                     (unsigned)answer.nlh.nlmsg_type);
  *uid = ((const struct inet_diag_msg *)NLMSG_DATA(&answer.nlh))->idiag_uid;
  return HVD_OK;
}
