/*
 * The driver shared by the pipelined algorithms (ring, chain broadcast).
 *
 * DESIGN. An algorithm describes its units: receive unit u, send unit u, and
 * how many sends may go once k receives are done. The driver keeps up to
 * `window` receives and 2*window sends posted, and waits for whichever of
 * the oldest receive and the oldest send finishes first. It never blocks on
 * a send while a receive could be consumed (or the other way round): with
 * both neighbours sending at once and socket buffers full, that is the
 * difference between a pipeline and a deadlock.
 */
#include "ops_private.h"

hvd_status ops_pipeline_run(struct ops_ctx *o, struct net_comm *c, const struct pipeline *p,
                            void *arg) {
  size_t window = o->t.window, send_window = 2 * (size_t)o->t.window;
  size_t next_recv = 0, done_recv = 0, next_send = 0, done_send = 0;
  struct net_req *reqs = ops_requests(o, window + send_window);
  struct net_req *rr, *sr;
  hvd_status st = HVD_OK;

  if (reqs == NULL)
    return hvd_error_status();
  rr = reqs;
  sr = reqs + window;
  while (st == HVD_OK && (done_recv < p->recv_units || done_send < p->send_units)) {
    struct net_req *oldest[2];
    size_t n = 0, ready = p->send_ready(arg, done_recv);

    if (ready > p->send_units)
      ready = p->send_units;
    while (st == HVD_OK && next_recv < p->recv_units && next_recv - done_recv < window) {
      st = p->post_recv(arg, next_recv, &rr[next_recv % window]);
      next_recv++;
    }
    while (st == HVD_OK && next_send < ready && next_send - done_send < send_window) {
      st = p->post_send(arg, next_send, &sr[next_send % send_window]);
      next_send++;
    }
    if (st != HVD_OK)
      break;
    if (done_recv < next_recv)
      oldest[n++] = &rr[done_recv % window];
    if (done_send < next_send)
      oldest[n++] = &sr[done_send % send_window];
    if (n == 0)
      return hvd_error(HVD_ERR_INTERNAL, "pipeline stalled with nothing in flight");
    st = net_wait_any(c, oldest, n);
    if (st != HVD_OK)
      break;
    while (done_recv < next_recv && rr[done_recv % window].done) {
      if (p->recv_done != NULL)
        p->recv_done(arg, done_recv);
      done_recv++;
    }
    while (done_send < next_send && sr[done_send % send_window].done)
      done_send++;
  }
  return st;
}
