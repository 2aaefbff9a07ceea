/* Deadlines for the rendezvous server's connections (guard.c). */
#ifndef HVD_RENDEZVOUS_GUARD_H
#define HVD_RENDEZVOUS_GUARD_H

#include <microhttpd.h>

#include "common/common.h"

/* What a connection is doing, which decides how long it may take. */
enum rdzv_guard_phase {
  RDZV_GUARD_HEADERS, /* until a request's headers are in */
  RDZV_GUARD_BODY,    /* reading a body of the given length */
  RDZV_GUARD_PARKED,  /* a long-poll in the store: its own deadline applies */
  RDZV_GUARD_REPLY,   /* sending an answer of the given length */
};

struct rdzv_guard;

/* Called, under the guard's lock, for a parked connection whose client has
 * gone (closed its side), with the context it was parked with; it must not
 * call into the guard or take a lock held while calling it. Called again on
 * later ticks while the connection stays parked and the call returns false. */
typedef bool (*rdzv_guard_gone_cb)(void *arg, void *parked);

/* header_ms: how long a connection may take to send a request's headers
 * (from its start, or the end of its previous request). */
hvd_status rdzv_guard_start(int64_t header_ms, rdzv_guard_gone_cb gone, void *gone_arg,
                            struct rdzv_guard **out);
void rdzv_guard_stop(struct rdzv_guard *g);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback; cls is the guard. */
void rdzv_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
/* The connection enters a phase; bytes: the body's or the answer's length. */
void rdzv_guard_enter(struct MHD_Connection *conn, enum rdzv_guard_phase phase, uint64_t bytes);
/* The connection's request is about to wait in the store (RDZV_GUARD_PARKED);
 * parked is handed to the gone callback if its client leaves meanwhile. */
void rdzv_guard_park(struct MHD_Connection *conn, void *parked);
/* Connections closed for missing a deadline so far (keep-alive ones closed
 * while idle between requests are not counted). */
uint64_t rdzv_guard_closed(struct rdzv_guard *g);

#endif
