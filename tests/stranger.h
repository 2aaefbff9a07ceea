/*
 * A stranger at a rank's transport listener on 127.0.0.1, for the tests
 * that check what the listener does with connections it did not expect.
 * Nothing here asserts, so forked ranks may use it as well as the parent.
 */
#ifndef HVD_TEST_STRANGER_H
#define HVD_TEST_STRANGER_H

#include <stdbool.h>
#include <stddef.h>

#include "transport/transport_private.h"

enum {
  STRANGER_CLOSED = -1,  /* the rank closed the connection without an ACK */
  STRANGER_SILENT = -2,  /* neither an ACK nor a close within the time given */
  STRANGER_FAILED = -3,  /* connect or send failed (errno says why) */
};

/* A connected socket, or -1 with errno (ECONNREFUSED: nobody listens). */
int stranger_dial(int port);
/* Whether the rank closes fd (EOF or a reset) within ms. */
bool stranger_closed_within(int fd, int ms);
/* Dials, sends the encoded HELLO h (or raw_len bytes of raw when raw is
 * not NULL), and waits up to ms for the ACK: its status, or one of the
 * STRANGER_* codes. */
int stranger_hello(int port, const struct net_hello *h, const void *raw, size_t raw_len, int ms);

#endif
