/*
 * Admission: how a rank without the job token gets it from the store that
 * rank 0 hosts, and how that store decides.
 *
 * DESIGN. A rank asks (POST /_admit) with a MUNGE credential whose payload
 * names the job, when MUNGE works here; the store admits a credential of
 * its own uid for its own job (munged refuses a replayed or expired one).
 * Without a credential the store admits a connection from its own host
 * whose socket belongs to its uid (peer.c): a one-host job needs no MUNGE.
 * Anything else is refused with the reason, which the rank reports. The
 * answer names the job as well as the token, so a rank that reached
 * another job's store (two jobs of one user that derived the same port)
 * says so instead of joining it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

#define CREDENTIAL_KIND "munge:"
#define PAYLOAD_PREFIX "hvd-admit "

static bool by_credential(const char *credential, const char *job, char *why, size_t size) {
  uid_t uid;
  char *payload = NULL;
  bool ok = false;

  if (strncmp(credential, CREDENTIAL_KIND, strlen(CREDENTIAL_KIND)) != 0) {
    snprintf(why, size, "an unknown kind of credential");
    return false;
  }
  if (launch_munge_decode(credential + strlen(CREDENTIAL_KIND), &uid, &payload) != HVD_OK)
    snprintf(why, size, "%s", hvd_last_error_message());
  else if (uid != geteuid())
    snprintf(why, size, "a MUNGE credential of uid %u, but the job runs as uid %u",
             (unsigned)uid, (unsigned)geteuid());
  else if (strncmp(payload, PAYLOAD_PREFIX, strlen(PAYLOAD_PREFIX)) != 0 ||
           strcmp(payload + strlen(PAYLOAD_PREFIX), job) != 0)
    snprintf(why, size, "a MUNGE credential for another job ('%.100s', not '%.100s')", payload,
             job);
  else
    ok = true;
  free(payload);
  return ok;
}

bool launch_admit_cb(const struct rdzv_admit_request *req, void *arg, char *why, size_t size) {
  uid_t uid;

  if (req->credential != NULL)
    return by_credential(req->credential, arg, why, size);
  if (launch_peer_uid(req->peer, req->local, &uid) != HVD_OK) {
    snprintf(why, size,
             "no credential, and the connection does not come from this host (%s): ranks on "
             "other hosts need MUNGE, or the job an HVD_TOKEN every rank has",
             hvd_last_error_message());
    return false;
  }
  if (uid != geteuid()) {
    snprintf(why, size, "the connection comes from a process of uid %u, but the job runs as uid %u",
             (unsigned)uid, (unsigned)geteuid());
    return false;
  }
  return true;
}

hvd_status launch_admission(const char *host, int port, const char *job, int64_t timeout_ms,
                            char *token, size_t token_size) {
  struct rdzv_client *c = NULL;
  struct hvd_buf payload, credential, their_job, their_token;
  char *cred = NULL, no_munge[HVD_ERROR_MESSAGE_MAX] = "";
  hvd_status st;

  hvd_buf_init(&payload, 0);
  hvd_buf_init(&credential, 0);
  hvd_buf_init(&their_job, 0);
  hvd_buf_init(&their_token, 0);
  st = hvd_buf_printf(&payload, PAYLOAD_PREFIX "%s", job);
  if (st == HVD_OK) {
    st = launch_munge_encode(payload.data, &cred);
    if (st == HVD_ERR_UNSUPPORTED) { /* a local connection may do */
      snprintf(no_munge, sizeof(no_munge), "%s", hvd_last_error_message());
      st = HVD_OK;
    } else if (st == HVD_OK) {
      st = hvd_buf_printf(&credential, CREDENTIAL_KIND "%s", cred);
    }
  }
  if (st == HVD_OK)
    st = rdzv_client_create(host, port, NULL, timeout_ms, &c);
  if (st == HVD_OK) {
    st = rdzv_client_admit(c, cred != NULL ? credential.data : NULL, &their_job, &their_token);
    if (st == HVD_ERR_UNAUTHORIZED && no_munge[0] != '\0')
      hvd_error_prefix("without a credential (%s)", no_munge);
  }
  if (st == HVD_OK && strcmp(their_job.data, job) != 0)
    st = hvd_error(HVD_ERR_CONFLICT,
                   "the store at %s:%d belongs to job '%.100s', not to this one ('%.100s'): two "
                   "jobs chose the same port; set HOROVOD_GLOO_RENDEZVOUS_PORT",
                   host, port, their_job.data, job);
  if (st == HVD_OK && their_token.len >= token_size)
    st = hvd_error(HVD_ERR_PROTOCOL, "the store at %s:%d sent a token of %zu bytes", host, port,
                   their_token.len);
  if (st == HVD_OK)
    memcpy(token, their_token.data, their_token.len + 1);
  if (their_token.data != NULL)
    explicit_bzero(their_token.data, their_token.len);
  rdzv_client_destroy(c);
  free(cred);
  hvd_buf_fini(&their_token);
  hvd_buf_fini(&their_job);
  hvd_buf_fini(&credential);
  hvd_buf_fini(&payload);
  return st == HVD_OK ? st : hvd_error_prefix("admission to the store at %s:%d", host, port);
}
