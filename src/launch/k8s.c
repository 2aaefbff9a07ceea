/*
 * A pod of a Kubernetes Indexed Job (or a JobSet's): no hvd-rendezvous
 * Deployment, no hvdrun.
 *
 * DESIGN. The rank is JOB_COMPLETION_INDEX and the size HOROVOD_SIZE, which
 * the manifest sets to the Job's completions (Kubernetes does not tell a
 * pod). Index 0 hosts the store on port 29400 (HOROVOD_GLOO_RENDEZVOUS_PORT
 * to change it). A pod of an Indexed Job whose spec.subdomain names a
 * headless Service is "<job>-<index>.<subdomain>.<namespace>.svc...": the
 * others find index 0 at the same name with index 0, unless
 * HOROVOD_GLOO_RENDEZVOUS_ADDR names it. Local and cross ranks come from
 * the host names (one pod per host, or several).
 */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "launch.h"

enum { K8S_STORE_PORT = 29400 };

/* Index 0's DNS name from this pod's: "<stem>-<index>.<domain>" becomes
 * "<stem>-0.<domain>". */
static hvd_status index0_name(int index, char *out, size_t size) {
  struct addrinfo hints = {.ai_flags = AI_CANONNAME}, *res = NULL;
  char host[LAUNCH_NAME_MAX], suffix[24];
  const char *fqdn, *dot;
  size_t label, slen;
  int rc;

  if (gethostname(host, sizeof(host)) != 0)
    return hvd_error(HVD_ERR_IO, "gethostname failed");
  host[sizeof(host) - 1] = '\0';
  rc = getaddrinfo(host, NULL, &hints, &res);
  fqdn = rc == 0 && res->ai_canonname != NULL ? res->ai_canonname : host;
  dot = strchr(fqdn, '.');
  label = dot != NULL ? (size_t)(dot - fqdn) : strlen(fqdn);
  slen = (size_t)snprintf(suffix, sizeof(suffix), "-%d", index);
  if (dot == NULL || label <= slen || memcmp(fqdn + label - slen, suffix, slen) != 0) {
    hvd_status st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                              "cannot tell index 0's address from this pod's name '%.100s': "
                              "give the Job's pod template a subdomain (a headless Service), or "
                              "set HOROVOD_GLOO_RENDEZVOUS_ADDR",
                              fqdn);
    if (res != NULL)
      freeaddrinfo(res);
    return st;
  }
  snprintf(out, size, "%.*s-0%s", (int)(label - slen), fqdn, dot);
  freeaddrinfo(res);
  return HVD_OK;
}

hvd_status launch_k8s_read(struct launch_job *job) {
  const char *addr = hvd_setting_real(HVD_SET_RENDEZVOUS_ADDR);
  int64_t size;
  hvd_status st = hvd_setting_int(HVD_SET_SIZE, &size);

  if (st != HVD_OK)
    return st;
  if (size < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_SIZE is not set: the manifest sets it to the Job's completions");
  job->size = (int)size;
  if (st == HVD_OK && (st = launch_env_int("JOB_COMPLETION_INDEX", 0, job->size - 1,
                                           &job->rank)) == HVD_ERR_NOT_FOUND)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "JOB_COMPLETION_INDEX is not set");
  if (st != HVD_OK)
    return st;
  if (addr != NULL)
    snprintf(job->store_host, sizeof(job->store_host), "%s", addr);
  else if ((st = index0_name(job->rank, job->store_host, sizeof(job->store_host))) != HVD_OK)
    return st;
  job->store_port = K8S_STORE_PORT;
  snprintf(job->store_port_why, sizeof(job->store_port_why), "the Indexed Job's default");
  snprintf(job->job, sizeof(job->job), "k8s:%.200s", job->store_host);
  return HVD_OK;
}
