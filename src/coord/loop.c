/*
 * The loop: the only code that talks to other ranks.
 *
 * DESIGN. The loop is driven by events, not by a clock. Its driver sleeps
 * in poll() on the control communicator and an eventfd until a user thread
 * queues something, a control message arrives, or a timer is due (the
 * coordinator's batching deadline, the stall inspector, a shutdown's
 * deadline). Before it sleeps it spins for HVD_SPIN_US, so a step's next
 * operation is picked up without a wake-up. A worker sends its new
 * requests to rank 0 as soon as it has them (cache bits in place of
 * requests the cache knows) and runs each response list rank 0 sends, in
 * order. Any rank first offers each new operation to its lanes (a small
 * cached allreduce agreed in shared memory, lane_ops.c), which it looks at
 * every turn. Rank 0 feeds its own requests and the workers' to the controller
 * and, whenever a list is due, sends it to every worker before running it
 * itself. Control messages are framed as an 8-byte length and the payload;
 * a receive of up to 4 KiB is always posted per peer, and a longer message
 * sends its remainder as a second message of known length.
 * Who drives: the holder of `drive`. A user thread waiting for its handle
 * takes it and turns until the handle is done, while the background thread
 * parks; otherwise the background thread drives. One thread per rank spins
 * and a blocking call completes on the thread that waits for it, with no
 * hand-off (see docs/architecture.md, "Who drives").
 * Failures: a peer whose control connection breaks, or a collective that
 * fails, stops the job on this rank (every pending handle fails with the
 * reason); rank 0 passes the reason on to every worker in an abort list, a
 * worker to rank 0.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "coord.h"

enum { CHUNK = 4096, FRAME = 8 };

struct coord_loop {
  struct coord_state *s;
  struct net_comm *ctl;
  bool coordinator;
  int nrecv; /* posted receives: rank 0 one per worker (worker r at r - 1), a worker one */
  struct net_req *recvs;
  struct net_req **recv_ptrs;
  unsigned char *bufs; /* nrecv x CHUNK */
  struct net_req *sends; /* 2 per worker */
  struct net_req **send_ptrs;
  struct hvd_buf msg;   /* encoding */
  /* A message longer than its first chunk: the rest is received into
   * rest_bufs[i] as soon as the chunk arrives, even while this rank is
   * blocked sending (two long lists crossing must not wait on each other). */
  struct net_req *rests;
  struct hvd_buf *rest_bufs;
  bool *examined; /* receive i's first chunk was looked at (rest posted if any) */
  struct net_req **wait_ptrs;
  bool stop_sent;
  int64_t stop_deadline;
  bool slept;
  /* Liveness: a peer silent for timeout_ns while this loop could listen
   * (time spent running collectives does not count) has failed, even if
   * its connection never closes (a frozen process, a vanished host). Each
   * side sends at least every timeout/3 (a heartbeat when idle). */
  int64_t *heard; /* per receive slot: when it last sent something */
  int64_t sent;   /* when this rank last sent to its peers */
  int64_t beat_ns;
  /* A worker's list to rank 0 goes out without blocking the loop (rank 0
   * may be in a collective that needs this rank; it reads the list after):
   * send slots 0 .. sending-1 are in flight, with hdr their frame. */
  int sending;
  unsigned char hdr[FRAME];
  /* Buffers a turn fills, kept across turns (grown, never shrunk): the
   * worker's request list, whose requests borrow the queued entries' (they
   * live until their responses come back, long after the list is encoded),
   * and the arrays of a cached response rebuilt (names borrowed from the
   * cache, which nothing changes while the response runs). */
  struct coord_request_list requests;
  size_t reqs_cap, inline_cap, hits_cap;
  /* A worker's last list from rank 0, run but not yet freed, and whether
   * its receive is still to be posted again: both wait until this rank has
   * sent its next requests, so that a thread whose operation the list
   * finished returns to its caller first (see tidy_received). */
  struct coord_response_list received;
  bool holding; /* received holds a list (every turn looks: most find none) */
  bool repost;
  /* What a list of cached responses from rank 0 is decoded into (the
   * received list borrows it until tidy_received); on rank 0, what each
   * worker's request list is (the controller takes it at once). */
  struct coord_response_space space;
  struct coord_request_space request_space;
  char **cached_names;
  int32_t *cached_bits;
  int64_t *cached_counts;
  size_t cached_names_cap, cached_bits_cap, cached_counts_cap;
  /* Who drives (see DESIGN): the holder of `drive` runs turns. */
  pthread_mutex_t drive;
  atomic_int drivers;       /* user threads driving or asking to */
  atomic_bool contended;    /* a user thread gave up asking: wake the background thread */
  atomic_bool finished;     /* the loop has ended: the job stopped */
  atomic_bool parked;       /* the background thread is (about to be) parked */
  _Atomic int64_t left_ns;  /* when a user thread last stopped driving */
  pthread_mutex_t park_mu;
  pthread_cond_t park_cv;
  bool unpark; /* under park_mu */
};

/* A parked background thread looks again this often: a user thread that
 * stopped driving without waking it (it expects to be back within
 * LEAVE_WINDOW_NS, as in a loop of blocking calls) and did not come back. */
enum { PARK_NS = 1000000, LEAVE_WINDOW_NS = 50000 };

/* Whether this thread is running the loop (completion callbacks run here). */
static _Thread_local bool t_driving;

/* What a driver waits for besides its peers: its handle (a user thread) or
 * a user thread asking to drive (the background thread). */
struct driver {
  struct coord_loop *l;
  struct hvd_handle_s *h;
  bool sending; /* queued work waits for this worker's send: the queue does not count */
};

/* Wakes whoever drives from poll(). */
static void kick(struct coord_state *s) {
  if (atomic_load(&s->sleeping)) {
    uint64_t one = 1;
    ssize_t n = write(s->wake_fd, &one, sizeof(one));
    (void)n; /* a full eventfd already wakes the thread */
  }
}

static void unpark(struct coord_loop *l) {
  pthread_mutex_lock(&l->park_mu);
  l->unpark = true;
  pthread_cond_signal(&l->park_cv);
  pthread_mutex_unlock(&l->park_mu);
}

void coord_wake(struct coord_state *s) {
  struct coord_loop *l = s->loop;

  atomic_store(&s->queued, true);
  kick(s);
  /* Nobody drives and nobody has for a while: the background thread takes
   * over now rather than at its next look. */
  if (l != NULL && atomic_load(&l->parked) && atomic_load(&l->drivers) == 0 &&
      hvd_now_ns() - atomic_load(&l->left_ns) > LEAVE_WINDOW_NS)
    unpark(l);
}

void coord_loop_unpark(struct coord_state *s) {
  if (s->loop != NULL)
    unpark(s->loop);
}

static bool driver_check(void *arg) {
  const struct driver *d = arg;
  struct coord_state *s = d->l->s;

  if (!d->sending && atomic_load_explicit(&s->queued, memory_order_relaxed))
    return true;
  if (s->lane_waits.n > 0 && coord_lanes_ready(s))
    return true;
  if (d->h == NULL)
    return atomic_load_explicit(&d->l->drivers, memory_order_relaxed) > 0;
  return atomic_load_explicit(&d->h->done, memory_order_relaxed) ||
         atomic_load_explicit(&s->closing, memory_order_relaxed);
}

static bool driver_sleep(void *arg) {
  const struct driver *d = arg;
  /* Lanes ring no doorbell: spin while a submission waits in one (until
   * it gives up, next_deadline), yielding, so that the ranks it waits for
   * run where they share this core. */
  if (d->l->s->lane_waits.n > 0) {
    sched_yield();
    return true;
  }
  atomic_store(&d->l->s->sleeping, true);
  return driver_check(arg);
}


/* ==== framing ============================================================================ */

static int peer_of(const struct coord_loop *l, int i) { return l->coordinator ? i + 1 : 0; }

static hvd_status post_recv(struct coord_loop *l, int i) {
  l->examined[i] = false;
  return net_irecv_max(l->ctl, peer_of(l, i), l->bufs + (size_t)i * CHUNK, CHUNK, &l->recvs[i]);
}

/* Posts one message to peer in the next one or two send slots (*n counts
 * the slots in use); the caller waits for send_ptrs[0 .. *n). */
static hvd_status post_send(struct coord_loop *l, int peer, const unsigned char *hdr,
                            const void *data, size_t len, int *n) {
  size_t first = len < CHUNK - FRAME ? len : CHUNK - FRAME;
  struct iovec iov[2] = {{(void *)hdr, FRAME}, {(void *)data, first}};
  hvd_status st;

  st = net_isendv(l->ctl, peer, iov, 2, &l->sends[*n]);
  if (st != HVD_OK && !l->sends[*n].done)
    return st;
  l->send_ptrs[*n] = &l->sends[*n];
  (*n)++;
  if (len > first) {
    st = net_isend(l->ctl, peer, (const char *)data + first, len - first, &l->sends[*n]);
    if (st != HVD_OK && !l->sends[*n].done)
      return st;
    l->send_ptrs[*n] = &l->sends[*n];
    (*n)++;
  }
  return HVD_OK;
}

/* The announced length of completed receive i's message. */
static hvd_status message_total(struct coord_loop *l, int i, uint64_t *total) {
  size_t got = net_req_length(&l->recvs[i]);
  if (got < FRAME)
    return hvd_error(HVD_ERR_PROTOCOL, "rank %d sent a control message of %zu bytes",
                     peer_of(l, i), got);
  *total = hvd_get_le64(l->bufs + (size_t)i * CHUNK);
  if (*total > COORD_MAX_MESSAGE || *total < got - FRAME)
    return hvd_error(HVD_ERR_PROTOCOL, "rank %d announced a control message of %llu bytes",
                     peer_of(l, i), (unsigned long long)*total);
  return HVD_OK;
}

/* Looks at receive i's first chunk once: posts the receive of the rest. */
static hvd_status examine(struct coord_loop *l, int i) {
  size_t got = net_req_length(&l->recvs[i]) ;
  struct hvd_buf *b = &l->rest_bufs[i];
  uint64_t total;
  hvd_status st;

  if (l->examined[i])
    return HVD_OK;
  l->examined[i] = true;
  if ((st = message_total(l, i, &total)) != HVD_OK)
    return st;
  if (total == got - FRAME)
    return HVD_OK;
  hvd_buf_reset(b);
  if ((st = hvd_buf_reserve(b, (size_t)total)) != HVD_OK)
    return st;
  memcpy(b->data, l->bufs + (size_t)i * CHUNK + FRAME, got - FRAME);
  b->len = (size_t)total;
  return net_irecv(l->ctl, peer_of(l, i), b->data + got - FRAME, (size_t)total - (got - FRAME),
                   &l->rests[i]);
}

/* The payload of completed receive i: in its buffer, or (longer) once the
 * rest has arrived, in rest_bufs[i]. */
static hvd_status take_message(struct coord_loop *l, int i, const void **data, size_t *len) {
  struct net_req *rest = &l->rests[i];
  size_t got = net_req_length(&l->recvs[i]);
  uint64_t total;
  hvd_status st;

  if ((st = examine(l, i)) != HVD_OK || (st = message_total(l, i, &total)) != HVD_OK)
    return st;
  if (total == got - FRAME) {
    *data = l->bufs + (size_t)i * CHUNK + FRAME;
    *len = (size_t)total;
    return HVD_OK;
  }
  if ((st = net_wait(l->ctl, &rest, 1)) != HVD_OK)
    return st;
  *data = l->rest_bufs[i].data;
  *len = (size_t)total;
  return HVD_OK;
}

/* Waits for the first n send slots, receiving meanwhile whatever the
 * peers send (see rests). */
static hvd_status wait_sends(struct coord_loop *l, int n) {
  for (;;) {
    size_t k = 0;
    hvd_status st;
    for (int i = 0; i < n; i++) {
      if (!l->sends[i].done)
        l->wait_ptrs[k++] = &l->sends[i];
    }
    if (k == 0)
      break;
    for (int i = 0; i < l->nrecv; i++) {
      if (!l->recvs[i].done)
        l->wait_ptrs[k++] = &l->recvs[i];
    }
    /* A failed receive is the turn's business (after an orderly shutdown,
     * peers close while the last list goes out); a failed send is ours. */
    st = net_wait_any(l->ctl, l->wait_ptrs, k);
    for (int i = 0; i < n && st != HVD_OK; i++) {
      if (l->sends[i].done && l->sends[i].status != HVD_OK)
        return net_req_result(l->ctl, &l->sends[i]);
    }
    for (int i = 0; i < l->nrecv; i++) {
      if (l->recvs[i].done && l->recvs[i].status == HVD_OK && (st = examine(l, i)) != HVD_OK)
        return st;
    }
  }
  for (int i = 0; i < n; i++) {
    if (l->sends[i].status != HVD_OK)
      return net_req_result(l->ctl, &l->sends[i]);
  }
  return HVD_OK;
}

/* ==== the job's end ===================================================================== */

/* A look at every turn, several times: no lock (phase is atomic). */
static bool stopped(struct coord_state *s) {
  return atomic_load_explicit(&s->phase, memory_order_acquire) != COORD_RUNNING;
}

/* This rank failed (st, with this thread's message): stop, and tell the
 * others what happened, as far as they can still be reached. */
static void fail_job(struct coord_loop *l, hvd_status st) {
  struct coord_state *s = l->s;
  char msg[HVD_ERROR_MESSAGE_MAX];

  snprintf(msg, sizeof(msg), "%s", hvd_last_error_message());
  HVD_LOG_ERROR("stopping: %s", msg);
  coord_metrics_job_error();
  coord_stop(s, st, msg);
  hvd_buf_reset(&l->msg);
  if (l->coordinator) {
    struct coord_response_list out;
    unsigned char hdr[FRAME];
    int n = 0;
    memset(&out, 0, sizeof(out));
    out.flags = COORD_FLAG_ABORT;
    out.abort_status = (uint8_t)st;
    out.abort_message = msg;
    if (coord_encode_responses(&out, &l->msg) != HVD_OK)
      return;
    hvd_put_le64(hdr, l->msg.len);
    for (int w = 1; w < s->size; w++) {
      if (!net_comm_peer_failed(l->ctl, w) &&
          post_send(l, w, hdr, l->msg.data, l->msg.len, &n) != HVD_OK)
        break;
    }
    (void)net_wait(l->ctl, l->send_ptrs, (size_t)n);
  } else if (!net_comm_peer_failed(l->ctl, 0)) {
    /* After the list in flight, if any (its buffer is still in use). */
    struct coord_request_list out;
    struct hvd_buf abort_msg;
    unsigned char hdr[FRAME];
    int n = l->sending;
    memset(&out, 0, sizeof(out));
    out.ack = s->applied_seq;
    out.flags = COORD_FLAG_ABORT;
    out.abort_status = (uint8_t)st;
    out.abort_message = msg;
    hvd_buf_init(&abort_msg, COORD_MAX_MESSAGE);
    if (coord_encode_requests(&out, &abort_msg) == HVD_OK) {
      hvd_put_le64(hdr, abort_msg.len);
      if (post_send(l, 0, hdr, abort_msg.data, abort_msg.len, &n) == HVD_OK)
        (void)wait_sends(l, n);
    }
    hvd_buf_fini(&abort_msg);
  }
}

/* ==== applying a response list (every rank) ============================================ */

/* One tensor of a fused response, for the cache. */
static hvd_status split(const struct coord_response *r, uint32_t i, struct coord_response *out) {
  uint32_t per = r->type == COORD_ALLGATHER && r->ntensors > 0 ? r->ncounts / r->ntensors : 1;
  struct coord_response view = *r;

  view.ntensors = 1;
  view.names = &r->names[i];
  view.bits = &r->bits[i];
  view.ncounts = r->ncounts > 0 ? per : 0;
  view.counts = r->ncounts > 0 ? r->counts + (size_t)i * per : NULL;
  view.cached = false;
  return coord_response_copy(out, &view);
}

/* A response sent as cache bits, rebuilt from the cache into *out, a view
 * of the loop's kept arrays, the cache's names and r's inline result. */
static hvd_status expand(struct coord_loop *l, const struct coord_response *r,
                         struct coord_response *out) {
  const struct coord_cache *cache = &l->s->cache;
  const struct coord_cache_entry *first = coord_cache_entry(cache, r->bits[0]);
  uint32_t per;

  if (first == NULL || first->state != COORD_CACHE_ACTIVE)
    return hvd_error(HVD_ERR_PROTOCOL, "rank 0 sent cache bit %d, which this rank does not have",
                     r->bits[0]);
  per = first->resp.ncounts;
  /* The rebuilt response's arrays: kept across turns, grown by doubling. */
  if (hvd_array_reserve(&l->cached_names, &l->cached_names_cap, r->ntensors,
                        sizeof(*l->cached_names), 16) != HVD_OK ||
      hvd_array_reserve(&l->cached_bits, &l->cached_bits_cap, r->ntensors,
                        sizeof(*l->cached_bits), 16) != HVD_OK ||
      hvd_array_reserve(&l->cached_counts, &l->cached_counts_cap, (size_t)per * r->ntensors,
                        sizeof(*l->cached_counts), 16) != HVD_OK)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot expand a cached response");
  *out = first->resp;
  out->ntensors = r->ntensors;
  out->ncounts = per * r->ntensors;
  out->names = l->cached_names;
  out->bits = l->cached_bits;
  out->counts = out->ncounts > 0 ? l->cached_counts : NULL;
  out->ranks = NULL;
  out->error = NULL;
  out->cached = false;
  out->data = r->data_len > 0 ? r->data : NULL;
  out->data_len = r->data_len;
  for (uint32_t i = 0; i < r->ntensors; i++) {
    const struct coord_cache_entry *e = coord_cache_entry(cache, r->bits[i]);
    if (e == NULL || e->state != COORD_CACHE_ACTIVE || e->resp.ncounts != per)
      return hvd_error(HVD_ERR_PROTOCOL,
                       "rank 0 sent cache bit %d, which this rank does not have", r->bits[i]);
    out->names[i] = e->resp.names[0];
    out->bits[i] = r->bits[i];
    if (per > 0)
      memcpy(out->counts + (size_t)i * per, e->resp.counts, per * sizeof(*out->counts));
  }
  return HVD_OK;
}

/* A worker records the bits a full response assigns, with its own requests. */
static hvd_status remember(struct coord_state *s, const struct coord_response *r, uint64_t seq) {
  for (uint32_t i = 0; i < r->ntensors; i++) {
    struct coord_response one;
    struct coord_entry *e;
    hvd_status st;
    if (r->bits == NULL || r->bits[i] < 0)
      continue;
    if ((st = split(r, i, &one)) != HVD_OK)
      return st;
    e = coord_find_entry(s, r->set, r->names[i]);
    st = coord_cache_put(&s->cache, r->bits[i], &one, e != NULL ? &e->req : NULL, seq);
    coord_response_fini(&one);
    if (st != HVD_OK)
      return st;
  }
  return HVD_OK;
}

/* Runs a list; returns a failure of the job. */
static hvd_status apply(struct coord_loop *l, struct coord_response_list *list) {
  struct coord_state *s = l->s;
  hvd_status st = HVD_OK;

  if (list->flags & COORD_FLAG_ABORT) {
    coord_metrics_job_error();
    coord_stop(s, list->abort_status ? (hvd_status)list->abort_status : HVD_ERR_ABORTED,
               list->abort_message != NULL ? list->abort_message : "the job failed");
    return HVD_OK;
  }
  if ((st = coord_autotune_apply(s, list)) != HVD_OK)
    return st;
  for (uint32_t i = 0; i < list->n && st == HVD_OK; i++) {
    struct coord_response *r = &list->resps[i];
    /* Bits only: from rank 0's wire, or rank 0's own list of cached
     * allreduces (dispatch.c's light_list); rank 0's other responses
     * carry every field. */
    bool bits_only = r->cached && r->names == NULL;
    if (l->coordinator && !bits_only) {
      st = coord_execute(s, r);
    } else if (bits_only) {
      struct coord_response full; /* a view: nothing to free */
      st = expand(l, r, &full);
      if (st == HVD_OK) {
        for (uint32_t k = 0; k < full.ntensors; k++)
          coord_cache_touch(&s->cache, full.bits[k]);
        st = coord_execute(s, &full);
      }
    } else {
      st = remember(s, r, list->seq);
      if (st == HVD_OK)
        st = coord_execute(s, r);
    }
  }
  if (st != HVD_OK)
    return st;
  if (!l->coordinator) {
    for (uint32_t i = 0; i < list->nretired; i++)
      coord_cache_drop(&s->cache, list->retired[i]);
  }
  if ((st = coord_lanes_apply(s, list)) != HVD_OK)
    return st;
  s->applied_seq = list->seq;
  if (list->flags & COORD_FLAG_SHUTDOWN) {
    char why[HVD_ERROR_MESSAGE_MAX];
    snprintf(why, sizeof(why),
             "hvd was shut down: %s (its program ended or stopped hvd; operations after that "
             "fail)",
             list->abort_message != NULL ? list->abort_message : "a rank called hvd_shutdown");
    s->clean_stop = true;
    coord_stop(s, HVD_ERR_ABORTED, why);
  }
  return HVD_OK;
}

/* apply, begun at *now (the caller's clock reading), with the time it took
 * credited to every peer's silence: a long collective is not a silent
 * peer. *now becomes the time it ended. (The clock is read as little as
 * this: every small operation passes here.) */
static hvd_status timed_apply(struct coord_loop *l, struct coord_response_list *list,
                              int64_t *now) {
  int64_t start = *now;
  hvd_status st;

  l->s->apply_ns = start;
  st = apply(l, list);
  *now = hvd_now_ns();
  for (int i = 0; i < l->nrecv; i++)
    l->heard[i] += *now - start;
  return st;
}

/* Fails the job if a peer has been silent too long. */
static hvd_status check_silence(struct coord_loop *l, int64_t now) {
  for (int i = 0; i < l->nrecv; i++) {
    if (now - l->heard[i] > l->s->cfg.timeout_ns)
      return hvd_error(HVD_ERR_TIMEOUT,
                       "rank %d has sent nothing for %.0f s (HOROVOD_GLOO_TIMEOUT_SECONDS); its "
                       "process may be frozen or its host unreachable",
                       peer_of(l, i), (double)(now - l->heard[i]) / 1e9);
  }
  return HVD_OK;
}

/* ==== one turn of the loop ================================================================ */

/* Takes what user threads queued; *stop says whether shutdown was asked. */
static struct coord_entry *drain(struct coord_state *s, bool *stop) {
  struct coord_entry *head;

  /* Nothing queued (queued is set after every enqueue and stop request,
   * and the caller acts on a stop the first time it is told). */
  if (!atomic_load(&s->queued)) {
    *stop = false;
    return NULL;
  }
  pthread_mutex_lock(&s->lock);
  head = s->queue_head;
  s->queue_head = s->queue_tail = NULL;
  *stop = s->stop_requested;
  atomic_store(&s->queued, false);
  pthread_mutex_unlock(&s->lock);
  return head;
}

/* Sends the list encoded in l->msg to every worker; returns once it has gone out. */
static hvd_status send_to_workers(struct coord_loop *l, int64_t now) {
  unsigned char hdr[FRAME];
  int n = 0;
  hvd_status st = HVD_OK;

  hvd_put_le64(hdr, l->msg.len);
  for (int w = 1; w < l->s->size && st == HVD_OK; w++)
    st = post_send(l, w, hdr, l->msg.data, l->msg.len, &n);
  if (st == HVD_OK)
    st = wait_sends(l, n);
  l->sent = now;
  return st;
}

/* An empty list that only says rank 0 is alive. */
static hvd_status coordinator_heartbeat(struct coord_loop *l) {
  struct coord_response_list hb;
  hvd_status st;

  memset(&hb, 0, sizeof(hb));
  hb.flags = COORD_FLAG_HEARTBEAT;
  hvd_buf_reset(&l->msg);
  st = coord_encode_responses(&hb, &l->msg);
  return st == HVD_OK ? send_to_workers(l, hvd_now_ns()) : st;
}

/* Rank 0's own queued requests go straight to the controller, which takes
 * copies (its table outlives the entries' turn). */
static hvd_status submit_own(struct coord_loop *l, bool *worked, int64_t now) {
  struct coord_controller *c = l->s->controller;
  bool stop;

  for (struct coord_entry *e = drain(l->s, &stop); e != NULL; e = e->next) {
    struct coord_request req = e->req;
    *worked = true;
    e->taken_ns = now;
    if (coord_lanes_submit(l->s, e, COORD_LANE_FIND, now)) {
      if (l->s->cfg.metrics)
        coord_metrics_cache(true); /* a lane is a cached operation's */
      continue;
    }
    req.rank = 0;
    coord_controller_submit_borrowed(c, &req);
  }
  if (stop)
    coord_controller_request_shutdown(c);
  return HVD_OK;
}

/* Worker i + 1's request list, arrived in receive i, into the controller. */
static hvd_status take_requests(struct coord_loop *l, int i, int64_t now) {
  struct coord_request_list in;
  const void *data;
  size_t len;
  hvd_status st;

  l->heard[i] = now;
  if (l->recvs[i].status != HVD_OK) /* the worker is gone (the message names it) */
    return net_req_result(l->ctl, &l->recvs[i]);
  st = take_message(l, i, &data, &len);
  if (st == HVD_OK)
    st = coord_decode_requests_in(data, len, &in, &l->request_space);
  if (st != HVD_OK)
    return hvd_error_prefix("from rank %d", i + 1);
  st = coord_controller_receive(l->s->controller, i + 1, &in);
  coord_request_list_fini(&in);
  return st == HVD_OK ? post_recv(l, i) : st;
}

/* Sends every response list that is due to the workers, then runs it here. */
static hvd_status send_responses(struct coord_loop *l, bool *worked, int64_t now) {
  struct coord_state *s = l->s;
  struct coord_response_list list;
  int64_t due;

  while (!stopped(s) && coord_controller_next(s->controller, now, &list, &due)) {
    hvd_status st;
    *worked = true;
    coord_timeline_cycle(s->timeline);
    coord_autotune_attach(s, &list);
    st = HVD_OK;
    if (s->size > 1) { /* alone, nobody reads the list */
      hvd_buf_reset(&l->msg);
      st = coord_encode_responses(&list, &l->msg);
      if (st == HVD_OK)
        st = send_to_workers(l, now);
    }
    if (st == HVD_OK)
      st = timed_apply(l, &list, &now);
    if (st == HVD_OK)
      coord_autotune_record(s, &list);
    coord_response_list_fini(&list);
    if (st != HVD_OK)
      return st;
  }
  return HVD_OK;
}

static hvd_status coordinator_turn(struct coord_loop *l, bool *worked, int64_t now) {
  struct coord_state *s = l->s;
  hvd_status st;

  if (s->lane_waits.n > 0)
    coord_lanes_progress(s, now, worked);
  st = submit_own(l, worked, now);

  for (int i = 0; i < l->nrecv && st == HVD_OK; i++) {
    if (l->recvs[i].done) {
      *worked = true;
      st = take_requests(l, i, now);
    }
  }
  if (st == HVD_OK)
    st = coord_controller_check_stalls(s->controller, now);
  /* A list sent from here on moves l->sent past now: no heartbeat then. */
  if (st == HVD_OK)
    st = send_responses(l, worked, now);
  if (st == HVD_OK && !stopped(s) && now - l->sent >= l->beat_ns)
    st = coordinator_heartbeat(l);
  return st;
}

/* Whether the worker's list in flight to rank 0 is still going out (the
 * next one waits for it); a failed send fails the turn. */
static hvd_status settle_send(struct coord_loop *l, bool *worked, bool *in_flight) {
  *in_flight = false;
  if (l->sending == 0)
    return HVD_OK;
  for (int i = 0; i < l->sending; i++) {
    if (!l->sends[i].done) {
      *in_flight = true;
      return HVD_OK;
    }
  }
  for (int i = 0; i < l->sending; i++) {
    if (l->sends[i].status != HVD_OK)
      return net_req_result(l->ctl, &l->sends[i]);
  }
  l->sending = 0;
  *worked = true;
  return HVD_OK;
}

/* A queued entry into its lane, or into the worker's list (*added): its
 * cache bit (with this step's inline input, if any), or its request,
 * borrowed. */
static hvd_status add_request(struct coord_loop *l, struct coord_entry *e, int64_t now,
                              bool *added) {
  struct coord_cache *cache = &l->s->cache;
  struct coord_request_list *out = &l->requests;
  int bit = cache->capacity > 0 ? coord_cache_hit(cache, &e->req) : -1;

  e->taken_ns = now;
  if (l->s->cfg.metrics && cache->capacity > 0)
    coord_metrics_cache(bit >= 0);
  if (coord_lanes_submit(l->s, e, bit, now))
    return HVD_OK;
  *added = true;
  if (bit < 0) {
    if (hvd_array_reserve(&out->reqs, &l->reqs_cap, (size_t)out->n + 1, sizeof(*out->reqs), 16) !=
        HVD_OK)
      return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a request list");
    out->reqs[out->n++] = e->req;
    return HVD_OK;
  }
  if (e->req.inline_len > 0) {
    struct coord_inline_hit *h;
    if (hvd_array_reserve(&out->inline_hits, &l->inline_cap, (size_t)out->ninline_hits + 1,
                          sizeof(*out->inline_hits), 16) != HVD_OK)
      return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a request list");
    h = &out->inline_hits[out->ninline_hits++];
    h->bit = bit;
    h->len = e->req.inline_len;
    memcpy(h->data, e->req.inline_data, h->len);
  } else {
    uint32_t need = (uint32_t)bit / 8 + 1;
    if (need > out->hits_bytes) {
      if (hvd_array_reserve(&out->hits, &l->hits_cap, need, sizeof(*out->hits), 16) != HVD_OK)
        return hvd_error(HVD_ERR_NO_MEMORY, "cannot build a request list");
      memset(out->hits + out->hits_bytes, 0, need - out->hits_bytes);
      out->hits_bytes = need;
    }
    out->hits[bit / 8] |= (unsigned char)(1u << (bit % 8));
  }
  coord_cache_touch(cache, bit);
  return HVD_OK;
}

/* Sends rank 0 what user threads queued and a shutdown asked for; an empty
 * list when this rank has been quiet is the heartbeat (and carries the ack). */
static hvd_status send_requests(struct coord_loop *l, bool *worked, int64_t now) {
  struct coord_state *s = l->s;
  struct coord_request_list *out = &l->requests;
  bool stop, any = false;
  hvd_status st = HVD_OK;

  out->n = out->ninline_hits = out->hits_bytes = 0;
  out->flags = 0;
  for (struct coord_entry *e = drain(s, &stop); e != NULL && st == HVD_OK; e = e->next) {
    *worked = true;
    st = add_request(l, e, now, &any);
  }
  if (stop && !l->stop_sent) {
    out->flags |= COORD_FLAG_SHUTDOWN;
    l->stop_sent = true;
    l->stop_deadline = now + s->cfg.timeout_ns;
  }
  if (st != HVD_OK || !(any || out->flags != 0 || now - l->sent >= l->beat_ns))
    return st;
  *worked = true;
  l->sent = now;
  out->ack = s->applied_seq;
  hvd_buf_reset(&l->msg);
  st = coord_encode_requests(out, &l->msg);
  hvd_put_le64(l->hdr, l->msg.len);
  if (st == HVD_OK)
    st = post_send(l, 0, l->hdr, l->msg.data, l->msg.len, &l->sending);
  return st;
}

/* Runs the response list rank 0 sent, if one has arrived; *now moves to
 * the end of what it ran. */
static hvd_status receive_responses(struct coord_loop *l, bool *worked, int64_t *now) {
  struct coord_response_list list;
  const void *data;
  size_t len;
  hvd_status st;

  if (l->nrecv == 0 || !l->recvs[0].done)
    return HVD_OK;
  *worked = true;
  l->heard[0] = *now;
  if (l->recvs[0].status != HVD_OK)
    return net_req_result(l->ctl, &l->recvs[0]);
  st = take_message(l, 0, &data, &len);
  if (st == HVD_OK)
    st = coord_decode_responses_in(data, len, &list, &l->space);
  if (st != HVD_OK)
    return hvd_error_prefix("from rank 0");
  if (!(list.flags & COORD_FLAG_HEARTBEAT))
    st = timed_apply(l, &list, now);
  l->received = list;
  l->holding = true;
  l->repost = st == HVD_OK && !stopped(l->s);
  return st;
}

/* Frees the last list from rank 0 and posts its receive again. Deferred
 * from receive_responses to the next turn, after that turn's requests went
 * out: a blocking call returns as soon as the list finished its operation,
 * and the next one's request leaves without this work before it (rank 0's
 * answer takes longer than it). */
static hvd_status tidy_received(struct coord_loop *l) {
  bool repost = l->repost;

  if (!l->holding)
    return HVD_OK;
  coord_response_list_fini(&l->received);
  l->holding = false;
  l->repost = false;
  return repost && !stopped(l->s) ? post_recv(l, 0) : HVD_OK;
}

static hvd_status worker_turn(struct coord_loop *l, bool *worked, int64_t *now) {
  bool in_flight;
  hvd_status st;

  if (l->s->lane_waits.n > 0)
    coord_lanes_progress(l->s, *now, worked);
  st = settle_send(l, worked, &in_flight);

  if (st == HVD_OK && !in_flight)
    st = send_requests(l, worked, *now);
  if (st == HVD_OK)
    st = tidy_received(l);
  return st == HVD_OK ? receive_responses(l, worked, now) : st;
}

/* How long the loop may sleep. */
static int64_t next_deadline(const struct coord_loop *l) {
  int64_t d = HVD_NO_DEADLINE;
  if (l->coordinator) {
    d = coord_controller_due(l->s->controller);
    int64_t stall = coord_controller_next_check(l->s->controller);
    if (stall < d)
      d = stall;
  }
  if (l->stop_sent && l->stop_deadline < d)
    d = l->stop_deadline;
  if (l->s->lane_waits.n > 0 && coord_lanes_deadline(l->s) < d)
    d = coord_lanes_deadline(l->s);
  if (l->nrecv > 0 && l->sent + l->beat_ns < d)
    d = l->sent + l->beat_ns;
  for (int i = 0; i < l->nrecv; i++) {
    if (l->heard[i] + l->s->cfg.timeout_ns + 1 < d)
      d = l->heard[i] + l->s->cfg.timeout_ns + 1;
  }
  return d;
}

/* Waits for a peer's message, a finished send, what the driver waits for
 * besides (see driver_check) or a timer, at most until `until`. */
static hvd_status idle_wait(struct coord_loop *l, struct hvd_handle_s *h, int64_t until) {
  struct coord_state *s = l->s;
  struct driver d = {l, h, l->sending > 0};
  struct net_wake w = {.fd = s->wake_fd, .check = driver_check, .sleep = driver_sleep, .arg = &d};
  int64_t due = next_deadline(l);
  size_t k = 0;
  hvd_status st;

  for (int i = 0; i < l->nrecv; i++)
    l->wait_ptrs[k++] = &l->recvs[i];
  for (int i = 0; i < l->sending; i++) {
    if (!l->sends[i].done)
      l->wait_ptrs[k++] = &l->sends[i];
  }
  st = net_wait_event(l->ctl, l->wait_ptrs, k, &w, due < until ? due : until);
  if (atomic_exchange(&s->sleeping, false)) {
    uint64_t v;
    ssize_t n = read(s->wake_fd, &v, sizeof(v)); /* non-blocking: empty is fine */
    (void)n;
  }
  /* With isolation, only a worker's receive can fail: the turn reports it. */
  return l->coordinator ? HVD_OK : st;
}

/* One turn, then, if it found nothing to do, the wait for the next event.
 * The caller holds drive. Returns false once the loop has ended (the job
 * stopped; a failure was passed on to the peers by this thread, which
 * holds its message). */
static bool step(struct coord_loop *l, struct hvd_handle_s *h, int64_t until) {
  struct coord_state *s = l->s;
  bool worked = false;
  int64_t now;
  hvd_status st;

  if (atomic_load(&l->finished))
    return false;
  /* One clock reading for the turn (tens of ns in a virtual machine, and
   * every small operation takes a few turns): what the turn does with it
   * is timers of milliseconds and more; running a list moves it on. */
  now = hvd_now_ns();
  st = l->coordinator ? coordinator_turn(l, &worked, now) : worker_turn(l, &worked, &now);
  if (st == HVD_OK)
    st = check_silence(l, now);
  if (st == HVD_OK && !stopped(s) && l->stop_sent && now >= l->stop_deadline)
    st = hvd_error(HVD_ERR_TIMEOUT,
                   "shutting down: rank 0 did not answer within HOROVOD_GLOO_TIMEOUT_SECONDS");
  if (st == HVD_OK && !stopped(s) && !worked)
    st = idle_wait(l, h, until);
  if (st != HVD_OK)
    fail_job(l, st);
  if (st != HVD_OK || stopped(s)) {
    s->lane_waits.n = 0; /* their entries were failed with the job */
    /* This state talks to nobody again and nothing would service the
     * listener until hvd_shutdown: dials are refused from now on. */
    net_ctx_stop_listening(s->world->ctx);
    atomic_store(&l->finished, true);
    return false;
  }
  return true;
}

/* The background thread parks while user threads drive, looking again
 * every PARK_NS. */
static void park(struct coord_loop *l) {
  pthread_mutex_lock(&l->park_mu);
  atomic_store(&l->parked, true);
  if (!l->unpark && atomic_load(&l->drivers) > 0 && !atomic_load(&l->finished))
    (void)hvd_cond_wait_until(&l->park_cv, &l->park_mu, hvd_now_ns() + PARK_NS);
  l->unpark = false;
  atomic_store(&l->parked, false);
  pthread_mutex_unlock(&l->park_mu);
}

static void *loop_main(void *arg) {
  struct coord_loop *l = arg;
  struct coord_state *s = l->s;

  if (s->cfg.affinity_core >= 0) {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(s->cfg.affinity_core, &cpus);
    if (pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus) != 0)
      HVD_LOG_WARN("HOROVOD_THREAD_AFFINITY: cannot pin the background thread to core %d",
                   s->cfg.affinity_core);
  }
  while (!atomic_load(&l->finished)) {
    if (atomic_load(&l->drivers) > 0) {
      park(l);
      continue;
    }
    pthread_mutex_lock(&l->drive);
    t_driving = true;
    while (atomic_load(&l->drivers) == 0 && step(l, NULL, HVD_NO_DEADLINE))
      ;
    t_driving = false;
    pthread_mutex_unlock(&l->drive);
  }
  return NULL;
}

bool coord_loop_driving(void) { return t_driving; }

int coord_loop_drivers(const struct coord_state *s) {
  return s->loop != NULL ? atomic_load(&s->loop->drivers) : 0;
}

void coord_loop_drive(struct coord_state *s, struct hvd_handle_s *h, int64_t deadline_ns) {
  struct coord_loop *l = s->loop;
  int64_t give_up = 0, now; /* give_up: set when another thread is first found driving */
  bool wake_bg = false;

  /* A pinned background thread (HOROVOD_THREAD_AFFINITY) keeps all work. */
  if (l == NULL || s->cfg.affinity_core >= 0 || t_driving)
    return;
  atomic_fetch_add(&l->drivers, 1);
  kick(s); /* a background thread asleep in poll() lets go of drive */
  while (!atomic_load(&h->done) && !atomic_load(&l->finished) && !atomic_load(&s->closing)) {
    if (pthread_mutex_trylock(&l->drive) == 0) {
      t_driving = true;
      while (!atomic_load(&h->done) && !atomic_load(&s->closing) &&
             (deadline_ns == HVD_NO_DEADLINE || hvd_now_ns() < deadline_ns) &&
             step(l, h, deadline_ns))
        ;
      t_driving = false;
      wake_bg = atomic_exchange(&l->contended, false) || atomic_load(&l->finished) ||
                atomic_load(&s->closing);
      pthread_mutex_unlock(&l->drive);
      break;
    }
    /* Another user thread drives (and may drive for long, waiting on an
     * operation of its own): wait on the handle instead, and have the
     * background thread take over when that thread stops. */
    now = hvd_now_ns();
    if (give_up == 0)
      give_up = now + s->cfg.spin_ns;
    if (now >= give_up || now >= deadline_ns) {
      atomic_store(&l->contended, true);
      break;
    }
    sched_yield();
  }
  atomic_store(&l->left_ns, hvd_now_ns());
  atomic_fetch_sub(&l->drivers, 1);
  if (wake_bg)
    unpark(l);
}

/* ==== start and stop ======================================================================= */

static void loop_destroy(struct coord_loop *l) {
  if (l == NULL)
    return;
  free(l->recvs);
  free(l->recv_ptrs);
  free(l->bufs);
  free(l->sends);
  free(l->send_ptrs);
  free(l->heard);
  /* Only the arrays: the requests and names in them are borrowed. */
  coord_response_list_fini(&l->received);
  coord_response_space_fini(&l->space);
  coord_request_space_fini(&l->request_space);
  free(l->requests.reqs);
  free(l->requests.inline_hits);
  free(l->requests.hits);
  free(l->cached_names);
  free(l->cached_bits);
  free(l->cached_counts);
  hvd_buf_fini(&l->msg);
  for (int i = 0; l->rest_bufs != NULL && i <= l->nrecv; i++)
    hvd_buf_fini(&l->rest_bufs[i]);
  free(l->rest_bufs);
  free(l->rests);
  free(l->examined);
  free(l->wait_ptrs);
  pthread_mutex_destroy(&l->drive);
  pthread_mutex_destroy(&l->park_mu);
  pthread_cond_destroy(&l->park_cv);
  free(l);
}

hvd_status coord_loop_start(struct coord_state *s) {
  struct coord_loop *l = calloc(1, sizeof(*l));
  int workers = s->size - 1;
  hvd_status st;

  if (l == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the background loop");
  l->s = s;
  l->ctl = s->control;
  l->coordinator = s->rank == 0;
  if (pthread_mutex_init(&l->drive, NULL) != 0 || pthread_mutex_init(&l->park_mu, NULL) != 0 ||
      hvd_cond_init(&l->park_cv) != 0) {
    free(l); /* (a failed init leaks nothing worth undoing on Linux) */
    return hvd_error(HVD_ERR_IO, "cannot create the background loop's locks");
  }
  atomic_init(&l->drivers, 0);
  atomic_init(&l->contended, false);
  atomic_init(&l->finished, false);
  atomic_init(&l->parked, false);
  atomic_init(&l->left_ns, 0);
  l->nrecv = l->coordinator ? workers : (s->size > 1 ? 1 : 0);
  hvd_buf_init(&l->msg, COORD_MAX_MESSAGE);
  l->rests = calloc((size_t)l->nrecv + 1, sizeof(*l->rests));
  l->rest_bufs = calloc((size_t)l->nrecv + 1, sizeof(*l->rest_bufs));
  l->examined = calloc((size_t)l->nrecv + 1, sizeof(*l->examined));
  l->wait_ptrs = calloc(2 * (size_t)workers + 3 + (size_t)l->nrecv, sizeof(*l->wait_ptrs));
  for (int i = 0; l->rest_bufs != NULL && i <= l->nrecv; i++)
    hvd_buf_init(&l->rest_bufs[i], COORD_MAX_MESSAGE);
  l->recvs = calloc((size_t)l->nrecv + 1, sizeof(*l->recvs));
  l->recv_ptrs = calloc((size_t)l->nrecv + 1, sizeof(*l->recv_ptrs));
  l->bufs = malloc(((size_t)l->nrecv + 1) * CHUNK);
  l->sends = calloc(2 * (size_t)workers + 2, sizeof(*l->sends));
  l->send_ptrs = calloc(2 * (size_t)workers + 2, sizeof(*l->send_ptrs));
  l->heard = calloc((size_t)l->nrecv + 1, sizeof(*l->heard));
  l->beat_ns = s->cfg.timeout_ns / 3 > 0 ? s->cfg.timeout_ns / 3 : 1;
  if (l->rests == NULL || l->rest_bufs == NULL || l->examined == NULL || l->wait_ptrs == NULL ||
      l->heard == NULL || l->recvs == NULL || l->recv_ptrs == NULL || l->bufs == NULL || l->sends == NULL ||
      l->send_ptrs == NULL) {
    loop_destroy(l);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the background loop");
  }
  for (int i = 0; i < l->nrecv; i++)
    l->recv_ptrs[i] = &l->recvs[i];
  l->sent = hvd_now_ns();
  for (int i = 0; i < l->nrecv; i++) {
    l->heard[i] = l->sent;
    if ((st = post_recv(l, i)) != HVD_OK) {
      loop_destroy(l);
      return st;
    }
  }
  s->loop = l;
  if (pthread_create(&s->thread, NULL, loop_main, l) != 0) {
    s->loop = NULL;
    loop_destroy(l);
    return hvd_error(HVD_ERR_IO, "cannot start the background thread");
  }
  return HVD_OK;
}

void coord_loop_join(struct coord_state *s) {
  if (s->loop == NULL)
    return;
  pthread_join(s->thread, NULL);
  loop_destroy(s->loop);
  s->loop = NULL;
}
