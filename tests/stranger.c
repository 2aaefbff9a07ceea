/* A stranger at a rank's transport listener (see stranger.h). */
#include "stranger.h"

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

int stranger_dial(int port) {
  struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int err;

  if (fd < 0 || connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0)
    return fd;
  err = errno;
  close(fd);
  errno = err;
  return -1;
}

bool stranger_closed_within(int fd, int ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char c;
  if (poll(&p, 1, ms) <= 0)
    return false;
  return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

int stranger_hello(int port, const struct net_hello *h, const void *raw, size_t raw_len, int ms) {
  unsigned char buf[NET_HELLO_MAX], ack[NET_ACK_BYTES];
  size_t len = raw != NULL ? raw_len : net_hello_encode(h, buf);
  int64_t deadline = hvd_deadline_after_ms(ms);
  size_t have = 0;
  uint16_t version, status;
  int fd = stranger_dial(port), result = STRANGER_CLOSED;

  if (fd < 0)
    return STRANGER_FAILED;
  if (send(fd, raw != NULL ? raw : buf, len, MSG_NOSIGNAL) != (ssize_t)len) {
    close(fd);
    return STRANGER_FAILED;
  }
  while (have < NET_ACK_BYTES) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    ssize_t n;
    if (poll(&p, 1, (int)hvd_remaining_ms(deadline)) <= 0) {
      result = STRANGER_SILENT;
      break;
    }
    if ((n = recv(fd, ack + have, NET_ACK_BYTES - have, 0)) <= 0)
      break;
    have += (size_t)n;
  }
  close(fd);
  if (have < NET_ACK_BYTES || net_ack_decode(ack, &version, &status) != HVD_OK)
    return result;
  return status;
}
