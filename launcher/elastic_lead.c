/*
 * hvd-rendezvous --rendezvous etcd://... --min-np N: a candidate for the
 * elastic driver of pods whose rendezvous is in etcd (proc.h).
 *
 * DESIGN. Run one in every pod (or a few anywhere): each waits to hold
 * elastic_driver/leader, a key under a lease of its own of LEAD_TTL_S
 * seconds (rdzv_client_lead). The holder drives the job as the driver of
 * hvd's own store would, having first read the state the last leader left
 * (driver_resume.c), and renews its lease every turn; when it dies, the
 * lease expires, the key goes, and a waiting candidate leads within
 * LEAD_TTL_S plus a round trip. A leader that cannot renew (cut off from
 * the cluster's majority) stops driving at once and waits again, so that
 * two never drive together for longer than the lease's rest. SIGINT or
 * SIGTERM ends a candidate, resigning first so that the next leads at
 * once.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "elastic_driver.h"

enum {
  LEAD_TTL_S = 2,        /* the leadership's lease */
  CAMPAIGN_MS = 3600000, /* one wait to lead, begun again when it ends */
  RETRY_MS = 1000,       /* after a failure to reach the cluster */
};

static void say(const char *what, const char *detail) {
  fprintf(stderr, "hvd-rendezvous: %s%s\n", what, detail);
}

int hvdrun_lead_elastic_pods(const struct hvdrun_options *o, const char *url, int pod_timeout_s) {
  struct rdzv_client *c = NULL;
  char me[300], host[256] = "";
  sigset_t signals;
  int stop = -1, code = 0;
  bool lost = true;
  hvd_status st;

  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGHUP);
  /* A signal while waiting ends the wait: the supervisor reads the same
   * signals (blocked by the caller) while this one drives. */
  if ((stop = signalfd(-1, &signals, SFD_CLOEXEC)) < 0) {
    say("signalfd: ", strerror(errno));
    return 1;
  }
  gethostname(host, sizeof(host) - 1);
  snprintf(me, sizeof(me), "%s:%d", host, (int)getpid());
  if ((st = rdzv_client_create_url(url, -1, &c)) != HVD_OK) {
    say("", hvd_last_error_message());
    close(stop);
    return 1;
  }
  while (lost) {
    rdzv_client_set_cancel_fd(c, stop);
    if (o->verbose)
      say("waiting to lead the elastic driver of ", url);
    st = rdzv_client_lead(c, "elastic_driver", "leader", me, LEAD_TTL_S, CAMPAIGN_MS);
    if (st == HVD_ERR_ABORTED)
      break; /* a signal */
    if (st != HVD_OK) {
      struct pollfd p = {.fd = stop, .events = POLLIN};
      if (st != HVD_ERR_TIMEOUT)
        say("", hvd_last_error_message());
      if (poll(&p, 1, RETRY_MS) != 0)
        break;
      continue;
    }
    rdzv_client_set_cancel_fd(c, -1);
    code = driver_run_pods(o, NULL, c, url, pod_timeout_s, &lost);
  }
  rdzv_client_destroy(c); /* resigns: the next candidate leads at once */
  close(stop);
  return code;
}
