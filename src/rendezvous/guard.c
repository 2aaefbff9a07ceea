/*
 * Deadlines for the rendezvous server's connections.
 *
 * DESIGN. libmicrohttpd's connection timeout is an idle timeout: a client
 * that sends one byte a second is never idle, so it could hold one of the
 * server's connection slots for ever without sending a whole request, and
 * a few hundred such clients lock every rank out of the store. The guard
 * gives each connection an absolute deadline for what it is doing: its
 * request's headers within header_ms, a body or an answer at a minimum
 * rate (BASE_MS plus a second per MIN_RATE bytes), none while a long-poll
 * waits in the store (the store's own deadline ends it). A keep-alive
 * connection idle between requests is closed after header_ms too, quietly
 * (clients do not reuse connections idle that long). A thread looks
 * every TICK_MS and shuts down the socket of a connection past its
 * deadline; libmicrohttpd then sees it fail and closes it as usual.
 * libmicrohttpd says a connection closed before it closes the socket, and
 * that happens under the guard's lock, so the thread never touches a
 * descriptor that was closed and reused.
 *
 * libmicrohttpd does not watch a suspended connection, so a long-poll whose
 * client went away would keep its waiter, slot and descriptor until the
 * wait's deadline (up to an hour). On each tick the thread also polls the
 * parked connections for end-of-file or an error and hands those to the
 * gone callback, which drops the waiter. A client that half-closes its side
 * and still reads is taken for gone too; no hvd client does that.
 *
 * The guard also enforces the connection limits, in place of libmicrohttpd's
 * per-address limit, which refuses a newcomer once its address holds its
 * quota whatever those connections are: the ranks of a one-host job all come
 * from 127.0.0.1, so a local user who kept that quota full of silent
 * connections (reopening each one a deadline closes) locked them out without
 * the token. Here a connection trusted (it sent a request with the token, or
 * was admitted) is never displaced; a newcomer past its address's quota, or
 * past the total, takes the place of the oldest untrusted connection of its
 * address, or of any. A stranger then displaces only strangers, its own
 * connections first, and a rank's new connection, trusted by its first
 * request a moment after it opens, would have to be outlived by a quota's
 * worth of newer ones. Only when every connection in the way is trusted is
 * the newcomer refused, as before. The alternatives were worse: counting
 * only trusted connections leaves untrusted ones unbounded per address, and
 * a separate path for local ranks (a Unix socket) would change every client
 * and launcher and still leave remote ranks exposed. A connection closed
 * to make room first gets a 503 with Retry-After saying that its request
 * was not run, which holds even for one being read at that moment (trust
 * fails once a connection is shut), so a client may repeat any request: a
 * rank whose first bytes came late (a quota's worth of newer connections
 * late) then retries instead of losing an add. Then it is shut down like
 * one past its deadline; libmicrohttpd's own limit is set a little above
 * ours (server.c) so that it accepts newcomers while those are closed.
 * Addresses are kept in a tree (tsearch), each with its untrusted
 * connections oldest first, so a newcomer costs O(log addresses).
 */
#include <errno.h>
#include <poll.h>
#include <netinet/in.h>
#include <pthread.h>
#include <search.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "guard.h"

/* The 503's text (docs/rendezvous-protocol.md). */
#define TURNED_AWAY                                                                                \
  "the rendezvous server is at its connection limit and closed this connection, which had not "    \
  "shown the job token, to make room; its request was not run: retry\n"

enum {
  BASE_MS = 10000,
  MIN_RATE = 1 << 20, /* bytes per second */
  TICK_MS = 250,
  LOG_INTERVAL_MS = 10000,
};

/* A circular doubly linked list; a node not in a list points to itself. */
struct ring {
  struct ring *prev, *next;
};

/* One client address. */
struct peer {
  unsigned char key[17]; /* the family (4 or 6, 0: other), then the address */
  unsigned live;         /* its connections counted against the limits */
  struct ring untrusted; /* those of them not trusted yet, oldest first */
};

struct tracked {
  struct tracked *prev, *next;
  struct rdzv_guard *guard;
  int fd;
  int64_t deadline_ns;
  enum rdzv_guard_phase phase;
  bool served; /* a request has completed here: in HEADERS, it is only idle */
  bool shut;
  void *parked; /* RDZV_GUARD_PARKED: the gone callback's argument */
  bool gone;    /* parked and its client left: the callback took it */
  bool trusted; /* sent a request with the token, or was admitted */
  struct peer *peer;      /* counted against its address's quota; NULL once shut */
  struct ring by_peer;    /* in peer->untrusted while counted and not trusted */
  struct ring by_age;     /* in the guard's untrusted list, likewise */
};

/* Every field is protected by mu. */
struct rdzv_guard {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  pthread_t thread;
  bool stop;
  int64_t header_ns;
  struct tracked *head;
  unsigned tracked;       /* connections in the head list */
  rdzv_guard_gone_cb gone;
  void *gone_arg;
  struct pollfd *polls; /* scratch for the parked connections */
  struct tracked **polled;
  size_t polls_cap, polled_cap;
  uint64_t closed;       /* connections shut for a missed deadline */
  uint64_t closed_logged;
  uint64_t evicted;      /* untrusted connections shut to make room */
  uint64_t evicted_logged;
  int64_t next_log_ns;
  unsigned max_live, per_address; /* the limits */
  unsigned live;          /* connections counted against max_live */
  void *peers;            /* tsearch tree of struct peer */
  struct ring untrusted;  /* counted, untrusted connections, oldest first */
  char turned_away[512];  /* the answer of a connection closed to make room */
  size_t turned_away_len;
};

static void link_tracked(struct rdzv_guard *g, struct tracked *t) {
  t->prev = NULL;
  t->next = g->head;
  if (g->head != NULL)
    g->head->prev = t;
  g->head = t;
  g->tracked++;
}

static void unlink_tracked(struct rdzv_guard *g, struct tracked *t) {
  if (t->prev != NULL)
    t->prev->next = t->next;
  else
    g->head = t->next;
  if (t->next != NULL)
    t->next->prev = t->prev;
  g->tracked--;
}

static void ring_init(struct ring *r) { r->prev = r->next = r; }

static void ring_push(struct ring *list, struct ring *r) {
  r->prev = list->prev;
  r->next = list;
  list->prev->next = r;
  list->prev = r;
}

static void ring_unlink(struct ring *r) {
  r->prev->next = r->next;
  r->next->prev = r->prev;
  ring_init(r);
}

#define TRACKED_OF(node, field)                                                                    \
  ((struct tracked *)((char *)(node) - offsetof(struct tracked, field)))

static int peer_cmp(const void *a, const void *b) {
  return memcmp(((const struct peer *)a)->key, ((const struct peer *)b)->key,
                sizeof(((const struct peer *)a)->key));
}

/* An IPv4 client of a dual-stack socket counts as its IPv4 address. */
static void peer_key(const struct sockaddr *sa, unsigned char key[17]) {
  memset(key, 0, 17);
  if (sa == NULL)
    return;
  if (sa->sa_family == AF_INET) {
    key[0] = 4;
    memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) {
      key[0] = 4;
      memcpy(key + 1, a->s6_addr + 12, 4);
    } else {
      key[0] = 6;
      memcpy(key + 1, a->s6_addr, 16);
    }
  }
}

/* Counts t against its address and the total; false if out of memory. */
static bool count(struct rdzv_guard *g, struct tracked *t, const struct sockaddr *sa) {
  struct peer probe, *p, **slot;

  peer_key(sa, probe.key);
  slot = tfind(&probe, &g->peers, peer_cmp);
  if (slot != NULL) {
    p = *slot;
  } else {
    if ((p = calloc(1, sizeof(*p))) == NULL)
      return false;
    memcpy(p->key, probe.key, sizeof(p->key));
    ring_init(&p->untrusted);
    if (tsearch(p, &g->peers, peer_cmp) == NULL) {
      free(p);
      return false;
    }
  }
  p->live++;
  g->live++;
  t->peer = p;
  ring_push(&p->untrusted, &t->by_peer);
  ring_push(&g->untrusted, &t->by_age);
  return true;
}

static void uncount(struct rdzv_guard *g, struct tracked *t) {
  struct peer *p = t->peer;

  if (p == NULL)
    return;
  ring_unlink(&t->by_peer);
  ring_unlink(&t->by_age);
  g->live--;
  if (--p->live == 0) {
    tdelete(p, &g->peers, peer_cmp);
    free(p);
  }
  t->peer = NULL;
}

/* libmicrohttpd then sees the socket fail and closes the connection; it
 * says so (under mu) before it closes the descriptor, so fd is still ours. */
static void shut(struct rdzv_guard *g, struct tracked *t) {
  shutdown(t->fd, SHUT_RDWR);
  t->shut = true;
  uncount(g, t);
}

/* Closes an untrusted connection to make room. Unless an answer of ours is
 * on its way (RDZV_GUARD_REPLY; queue() enters it, under mu, before it hands
 * the answer to libmicrohttpd), it first gets a whole 503 with Retry-After:
 * the request its client may have sent was not run (rdzv_guard_trust fails
 * from now on), so the client may repeat any request, an add too. */
static void turn_away(struct rdzv_guard *g, struct tracked *t) {
  if (t->phase != RDZV_GUARD_REPLY)
    (void)send(t->fd, g->turned_away, g->turned_away_len, MSG_DONTWAIT | MSG_NOSIGNAL);
  shut(g, t);
}

/* Makes room for the newcomer t, counted already: over a limit, the oldest
 * untrusted connection in the way goes, which is t itself (refused) when
 * every other one there is trusted. */
static void make_room(struct rdzv_guard *g, struct tracked *t) {
  while (t->peer != NULL && t->peer->live > g->per_address) {
    struct tracked *oldest = TRACKED_OF(t->peer->untrusted.next, by_peer);
    turn_away(g, oldest);
    g->evicted += oldest != t;
  }
  while (t->peer != NULL && g->live > g->max_live) {
    struct tracked *oldest = TRACKED_OF(g->untrusted.next, by_age);
    turn_away(g, oldest);
    g->evicted += oldest != t;
  }
  if (t->shut)
    HVD_LOG_DEBUG("rendezvous server: a new connection refused: every connection of its "
                  "address, or of all, has shown the token");
}

/* Grows the poll scratch arrays to hold n entries; false if out of memory. */
static bool reserve_polls(struct rdzv_guard *g, size_t n) {
  return hvd_array_reserve(&g->polls, &g->polls_cap, n, sizeof(*g->polls), 64) == HVD_OK &&
         hvd_array_reserve(&g->polled, &g->polled_cap, n, sizeof(*g->polled), 64) == HVD_OK;
}

/* Hands parked connections whose client has left to the gone callback. */
static void check_parked(struct rdzv_guard *g) {
  size_t n = 0;

  for (struct tracked *t = g->head; t != NULL; t = t->next) {
    if (t->phase != RDZV_GUARD_PARKED || t->parked == NULL || t->gone || t->shut)
      continue;
    if (!reserve_polls(g, n + 1))
      break; /* the rest wait for their deadline */
    g->polls[n] = (struct pollfd){.fd = t->fd, .events = POLLIN | POLLRDHUP};
    g->polled[n++] = t;
  }
  if (n == 0 || poll(g->polls, n, 0) <= 0)
    return;
  for (size_t i = 0; i < n; i++) {
    short ev = g->polls[i].revents;
    char byte;
    if (ev == 0)
      continue;
    /* Readable without hang-up: the client sent more (a pipelined request);
     * only end-of-file or an error says it left. */
    if (!(ev & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) &&
        recv(g->polls[i].fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != 0)
      continue;
    if (g->gone(g->gone_arg, g->polled[i]->parked))
      g->polled[i]->gone = true;
  }
}

static void *guard_main(void *arg) {
  struct rdzv_guard *g = arg;

  pthread_mutex_lock(&g->mu);
  while (!g->stop) {
    int64_t now = hvd_now_ns();
    check_parked(g);
    for (struct tracked *t = g->head; t != NULL; t = t->next) {
      if (!t->shut && t->deadline_ns <= now) {
        shut(g, t);
        /* A keep-alive connection that waits for its next request is not
         * slow, and closing it costs its client one reconnection. */
        if (!(t->phase == RDZV_GUARD_HEADERS && t->served))
          g->closed++;
      }
    }
    if ((g->closed > g->closed_logged || g->evicted > g->evicted_logged) &&
        now >= g->next_log_ns) {
      if (g->closed > g->closed_logged)
        HVD_LOG_WARN("rendezvous server: closed %llu connection(s) too slow to send a request or "
                     "take an answer (%llu so far)",
                     (unsigned long long)(g->closed - g->closed_logged),
                     (unsigned long long)g->closed);
      if (g->evicted > g->evicted_logged)
        HVD_LOG_WARN("rendezvous server: closed %llu connection(s) without the token to make "
                     "room for new ones, over the per-address or total connection limit (%llu "
                     "so far)",
                     (unsigned long long)(g->evicted - g->evicted_logged),
                     (unsigned long long)g->evicted);
      g->closed_logged = g->closed;
      g->evicted_logged = g->evicted;
      g->next_log_ns = now + (int64_t)LOG_INTERVAL_MS * 1000000;
    }
    hvd_cond_wait_until(&g->cond, &g->mu, hvd_deadline_after_ms(TICK_MS));
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

hvd_status rdzv_guard_start(int64_t header_ms, unsigned max_connections, unsigned per_address,
                            rdzv_guard_gone_cb gone, void *gone_arg, struct rdzv_guard **out) {
  struct rdzv_guard *g = calloc(1, sizeof(*g));
  int err;

  if (g == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the connection guard");
  pthread_mutex_init(&g->mu, NULL);
  hvd_cond_init(&g->cond);
  g->header_ns = header_ms * 1000000;
  g->gone = gone;
  g->gone_arg = gone_arg;
  g->max_live = max_connections > 0 ? max_connections : 1;
  g->per_address = per_address > 0 ? per_address : 1;
  ring_init(&g->untrusted);
  g->turned_away_len = (size_t)snprintf(
      g->turned_away, sizeof(g->turned_away),
      "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
      "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n\r\n%s",
      strlen(TURNED_AWAY), TURNED_AWAY);
  if ((err = pthread_create(&g->thread, NULL, guard_main, g)) != 0) {
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mu);
    free(g);
    return hvd_error(HVD_ERR_IO, "cannot start the connection guard: %s", strerror(err));
  }
  *out = g;
  return HVD_OK;
}

/* After libmicrohttpd has stopped: every connection is closed by then. */
void rdzv_guard_stop(struct rdzv_guard *g) {
  if (g == NULL)
    return;
  pthread_mutex_lock(&g->mu);
  g->stop = true;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->mu);
  pthread_join(g->thread, NULL);
  while (g->head != NULL) {
    struct tracked *t = g->head;
    uncount(g, t);
    unlink_tracked(g, t);
    free(t);
  }
  free(g->polls);
  free(g->polled);
  pthread_cond_destroy(&g->cond);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

void rdzv_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                       enum MHD_ConnectionNotificationCode code) {
  struct rdzv_guard *g = cls;
  struct tracked *t = *socket_context;

  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *addr =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL)
      return; /* untracked (libmicrohttpd always knows the descriptor) */
    if ((t = calloc(1, sizeof(*t))) == NULL) {
      shutdown(info->connect_fd, SHUT_RDWR); /* refused: it would escape the limits */
      return;
    }
    t->guard = g;
    t->fd = info->connect_fd;
    ring_init(&t->by_peer);
    ring_init(&t->by_age);
    pthread_mutex_lock(&g->mu);
    t->deadline_ns = hvd_now_ns() + g->header_ns;
    link_tracked(g, t);
    if (count(g, t, addr != NULL ? addr->client_addr : NULL))
      make_room(g, t);
    else
      shut(g, t); /* out of memory: refused */
    pthread_mutex_unlock(&g->mu);
    *socket_context = t;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && t != NULL) {
    pthread_mutex_lock(&g->mu);
    uncount(g, t);
    unlink_tracked(g, t);
    pthread_mutex_unlock(&g->mu);
    free(t);
    *socket_context = NULL;
  }
}

static struct tracked *tracked_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info != NULL ? info->socket_context : NULL;
}

static void enter_locked(struct tracked *t, enum rdzv_guard_phase phase, uint64_t bytes,
                         void *parked) {
  int64_t now = hvd_now_ns();

  if (phase == RDZV_GUARD_HEADERS && t->phase != RDZV_GUARD_HEADERS)
    t->served = true;
  t->phase = phase;
  t->parked = parked;
  t->gone = false;
  switch (phase) {
  case RDZV_GUARD_HEADERS:
    t->deadline_ns = now + t->guard->header_ns;
    break;
  case RDZV_GUARD_PARKED:
    t->deadline_ns = INT64_MAX;
    break;
  case RDZV_GUARD_BODY:
  case RDZV_GUARD_REPLY: {
    uint64_t ms = BASE_MS + bytes / (MIN_RATE / 1000);
    t->deadline_ns = ms > INT64_MAX / 2000000 ? INT64_MAX : now + (int64_t)ms * 1000000;
    break;
  }
  }
}

void rdzv_guard_enter(struct MHD_Connection *conn, enum rdzv_guard_phase phase, uint64_t bytes) {
  struct tracked *t = tracked_of(conn);

  if (t == NULL)
    return;
  pthread_mutex_lock(&t->guard->mu);
  enter_locked(t, phase, bytes, NULL);
  pthread_mutex_unlock(&t->guard->mu);
}

void rdzv_guard_park(struct MHD_Connection *conn, void *parked) {
  struct tracked *t = tracked_of(conn);

  if (t == NULL)
    return;
  pthread_mutex_lock(&t->guard->mu);
  enter_locked(t, RDZV_GUARD_PARKED, 0, parked);
  pthread_mutex_unlock(&t->guard->mu);
}

bool rdzv_guard_trust(struct MHD_Connection *conn) {
  struct tracked *t = tracked_of(conn);
  bool ok;

  if (t == NULL)
    return true;
  pthread_mutex_lock(&t->guard->mu);
  ok = !t->shut;
  t->trusted = true;
  ring_unlink(&t->by_peer);
  ring_unlink(&t->by_age);
  pthread_mutex_unlock(&t->guard->mu);
  return ok;
}

void rdzv_guard_get_counts(struct rdzv_guard *g, struct rdzv_guard_counts *out) {
  pthread_mutex_lock(&g->mu);
  out->connections = g->tracked;
  out->closed = g->closed;
  out->evicted = g->evicted;
  pthread_mutex_unlock(&g->mu);
}

