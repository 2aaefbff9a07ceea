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
 * (from its start, or the end of its previous request). max_connections and
 * per_address: the connections allowed in all and from one address; a new
 * connection past either takes the place of the oldest one in its way that
 * is not trusted (rdzv_guard_trust), or is refused if all are. */
hvd_status rdzv_guard_start(int64_t header_ms, unsigned max_connections, unsigned per_address,
                            rdzv_guard_gone_cb gone, void *gone_arg, struct rdzv_guard **out);
void rdzv_guard_stop(struct rdzv_guard *g);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback; cls is the guard. */
void rdzv_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
/* The connection enters a phase; bytes: the body's or the answer's length. */
void rdzv_guard_enter(struct MHD_Connection *conn, enum rdzv_guard_phase phase, uint64_t bytes);
/* The connection's request is about to wait in the store (RDZV_GUARD_PARKED);
 * parked is handed to the gone callback if its client leaves meanwhile. */
void rdzv_guard_park(struct MHD_Connection *conn, void *parked);
/* The connection sent a request with the job's token (or was admitted): it
 * is never closed to make room for others. False if the guard has closed it
 * already (to make room, telling its client the request was not run, or
 * past a deadline): do not run the request. */
bool rdzv_guard_trust(struct MHD_Connection *conn);

/* For /_health. */
struct rdzv_guard_counts {
  unsigned connections; /* open now, on every event loop */
  uint64_t closed;      /* closed so far for missing a deadline (keep-alive ones
                         * closed while idle between requests are not counted) */
  uint64_t evicted;     /* untrusted ones closed so far to make room */
};
void rdzv_guard_get_counts(struct rdzv_guard *g, struct rdzv_guard_counts *out);

#endif
