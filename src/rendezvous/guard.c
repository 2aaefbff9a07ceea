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
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "guard.h"

enum {
  BASE_MS = 10000,
  MIN_RATE = 1 << 20, /* bytes per second */
  TICK_MS = 250,
  LOG_INTERVAL_MS = 10000,
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
};

struct rdzv_guard {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  pthread_t thread;
  bool stop;
  int64_t header_ns;
  struct tracked *head;
  rdzv_guard_gone_cb gone;
  void *gone_arg;
  struct pollfd *polls; /* scratch for the parked connections */
  struct tracked **polled;
  size_t polls_cap, polled_cap;
  uint64_t closed;       /* connections shut for a missed deadline */
  uint64_t closed_logged;
  int64_t next_log_ns;
};

static void link_tracked(struct rdzv_guard *g, struct tracked *t) {
  t->prev = NULL;
  t->next = g->head;
  if (g->head != NULL)
    g->head->prev = t;
  g->head = t;
}

static void unlink_tracked(struct rdzv_guard *g, struct tracked *t) {
  if (t->prev != NULL)
    t->prev->next = t->next;
  else
    g->head = t->next;
  if (t->next != NULL)
    t->next->prev = t->prev;
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
        shutdown(t->fd, SHUT_RDWR);
        t->shut = true;
        /* A keep-alive connection that waits for its next request is not
         * slow, and closing it costs its client one reconnection. */
        if (!(t->phase == RDZV_GUARD_HEADERS && t->served))
          g->closed++;
      }
    }
    if (g->closed > g->closed_logged && now >= g->next_log_ns) {
      HVD_LOG_WARN("rendezvous server: closed %llu connection(s) too slow to send a request or "
                   "take an answer (%llu so far)",
                   (unsigned long long)(g->closed - g->closed_logged),
                   (unsigned long long)g->closed);
      g->closed_logged = g->closed;
      g->next_log_ns = now + (int64_t)LOG_INTERVAL_MS * 1000000;
    }
    hvd_cond_wait_until(&g->cond, &g->mu, hvd_deadline_after_ms(TICK_MS));
  }
  pthread_mutex_unlock(&g->mu);
  return NULL;
}

hvd_status rdzv_guard_start(int64_t header_ms, rdzv_guard_gone_cb gone, void *gone_arg,
                            struct rdzv_guard **out) {
  struct rdzv_guard *g = calloc(1, sizeof(*g));
  int err;

  if (g == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the connection guard");
  pthread_mutex_init(&g->mu, NULL);
  hvd_cond_init(&g->cond);
  g->header_ns = header_ms * 1000000;
  g->gone = gone;
  g->gone_arg = gone_arg;
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
    if (info == NULL || (t = calloc(1, sizeof(*t))) == NULL)
      return; /* untracked: only the idle timeout applies */
    t->guard = g;
    t->fd = info->connect_fd;
    pthread_mutex_lock(&g->mu);
    t->deadline_ns = hvd_now_ns() + g->header_ns;
    link_tracked(g, t);
    pthread_mutex_unlock(&g->mu);
    *socket_context = t;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && t != NULL) {
    pthread_mutex_lock(&g->mu);
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

uint64_t rdzv_guard_closed(struct rdzv_guard *g) {
  uint64_t n;
  pthread_mutex_lock(&g->mu);
  n = g->closed;
  pthread_mutex_unlock(&g->mu);
  return n;
}

