/*
 * What every harness shares: libFuzzer's entry points, declared so that the
 * harnesses build clean under -Wmissing-prototypes with or without
 * libFuzzer (replay_main.c stands in for it in the normal build), and a
 * check that stops the run on a broken property.
 */
#ifndef HVD_FUZZ_H
#define HVD_FUZZ_H

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* A property that must hold for every input. abort() is right here: the
 * fuzzer (or the replay) reports it with the input that broke it. */
#define FUZZ_CHECK(cond, ...)                                                     \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "%s:%d: property '%s' broken: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                               \
      fputc('\n', stderr);                                                        \
      abort();                                                                    \
    }                                                                             \
  } while (0)

/* A blocking TCP connection to 127.0.0.1:port. libFuzzer's timers
 * interrupt system calls: an interrupted connect goes on by itself. */
static inline int fuzz_dial(int port) {
  struct sockaddr_in sin = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), err = 0;
  socklen_t len = sizeof(err);

  FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
  if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    FUZZ_CHECK(errno == EINTR, "connect: %s", strerror(errno));
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    FUZZ_CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0, "connect: %s",
               strerror(err));
  }
  return fd;
}

#endif /* HVD_FUZZ_H */
