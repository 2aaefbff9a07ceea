/*
 * The launch step of hvd_init: the job as the launcher described it, put
 * in the words the rest of hvd reads.
 *
 * DESIGN. Under Slurm, torchrun or a Kubernetes Indexed Job, the ranks,
 * the store's address and the token are provided (hvd_setting_provide) as
 * HOROVOD_RANK ... HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT and HVD_TOKEN; a
 * variable the user set wins over the derived value (ADDR says where rank
 * 0 is reachable, PORT where it listens). Rank 0 hosts the store, in this
 * process, for the rest of its life: its token is HVD_TOKEN where every
 * rank has one (an sbatch script or a manifest exported it), else a random
 * one that the other ranks get through admission (admit.c). hvdrun's
 * ranks and a process on its own need nothing here. The step runs once
 * per process; a failed one runs again at the next hvd_init.
 */
#include <stdio.h>
#include <string.h>

#include "launch.h"

static pthread_mutex_t prepare_mu = PTHREAD_MUTEX_INITIALIZER;
static bool prepared;                /* under prepare_mu */
static struct rdzv_server *g_hosted; /* the store rank 0 hosts: the process's */
static char g_job[LAUNCH_NAME_MAX];  /* its job's name (the admission callback's) */

static hvd_status provide_int(enum hvd_setting id, int value) {
  char text[16];
  if (value < 0)
    return HVD_OK;
  snprintf(text, sizeof(text), "%d", value);
  return hvd_setting_provide(id, text);
}

static hvd_status provide_ranks(const struct launch_job *job) {
  hvd_status st = provide_int(HVD_SET_RANK, job->rank);
  if (st == HVD_OK)
    st = provide_int(HVD_SET_SIZE, job->size);
  if (st == HVD_OK && job->local_rank >= 0 && job->cross_rank >= 0) {
    st = provide_int(HVD_SET_LOCAL_RANK, job->local_rank);
    if (st == HVD_OK)
      st = provide_int(HVD_SET_LOCAL_SIZE, job->local_size);
    if (st == HVD_OK)
      st = provide_int(HVD_SET_CROSS_RANK, job->cross_rank);
    if (st == HVD_OK)
      st = provide_int(HVD_SET_CROSS_SIZE, job->cross_size);
  }
  if (st == HVD_OK && job->host[0] != '\0')
    st = hvd_setting_provide(HVD_SET_HOSTNAME, job->host);
  return st;
}

/* The store, in this process: on every interface, at the job's port. */
static hvd_status host_store(const struct launch_job *job, int port, const char *token) {
  struct rdzv_server_config cfg;
  hvd_status st;

  snprintf(g_job, sizeof(g_job), "%s", job->job);
  rdzv_server_config_default(&cfg);
  cfg.port = port;
  cfg.token = token;
  cfg.threads = job->size > 256 ? 0 : 1;
  cfg.admit = launch_admit_cb;
  cfg.admit_arg = g_job;
  cfg.job = g_job;
  st = rdzv_server_start(&cfg, &g_hosted);
  if (st == HVD_ERR_CONFLICT) /* the port is taken */
    return hvd_error_prefix("hosting the job's store on port %d (%s), which another process "
                            "holds: set HOROVOD_GLOO_RENDEZVOUS_PORT to a free port, the same "
                            "for every rank",
                            port, job->store_port_why);
  return st == HVD_OK ? st : hvd_error_prefix("hosting the job's store on port %d", port);
}

static hvd_status prepare(void) {
  struct launch_job job;
  const char *addr = hvd_setting_real(HVD_SET_RENDEZVOUS_ADDR);
  const char *given_token = hvd_setting_real(HVD_SET_TOKEN);
  char token[HVD_TOKEN_HEX_DIGITS + 1] = "", port_text[8];
  int64_t timeout_s, port;
  hvd_status st;

  if ((st = launch_detect(&job)) != HVD_OK)
    return st;
  if (job.kind == LAUNCH_NONE || job.kind == LAUNCH_HVDRUN) {
    HVD_LOG_DEBUG("launcher: %s (%s)", launch_kind_name(job.kind), job.why);
    return HVD_OK;
  }
  /* Nothing is provided yet: these are the user's. */
  if ((st = hvd_setting_int(HVD_SET_RENDEZVOUS_PORT, &port)) != HVD_OK ||
      (st = hvd_setting_int(HVD_SET_TIMEOUT, &timeout_s)) != HVD_OK)
    return st;
  if (port < 0)
    port = job.store_port;
  else
    snprintf(job.store_port_why, sizeof(job.store_port_why), "HOROVOD_GLOO_RENDEZVOUS_PORT");
  if (addr != NULL)
    snprintf(job.store_host, sizeof(job.store_host), "%s", addr);
  hvd_log_set_rank(job.rank);
  if (job.rank == 0 && job.size > 1 && hvd_setting_real(HVD_SET_RENDEZVOUS) != NULL)
    hvd_log_write(HVD_LOG_INFO, __FILE__, __LINE__, "launcher: %s (%s): %d ranks; they meet in %s",
                  launch_kind_name(job.kind), job.why, job.size,
                  hvd_setting_real(HVD_SET_RENDEZVOUS));
  else if (job.rank == 0 && job.size > 1) /* shown whatever the log level: the job's first words */
    hvd_log_write(HVD_LOG_INFO, __FILE__, __LINE__,
                  "launcher: %s (%s): %d ranks; this rank hosts the store at %s:%d (port: %s)",
                  launch_kind_name(job.kind), job.why, job.size, job.store_host, (int)port,
                  job.store_port_why);
  if ((st = provide_ranks(&job)) != HVD_OK || job.size == 1)
    return st;
  if (hvd_setting_real(HVD_SET_RENDEZVOUS) != NULL) {
    /* The job meets in etcd: nothing to host, and no admission (the
     * token, if any, is every rank's own). */
    if (job.rank == 0 && given_token == NULL)
      HVD_LOG_WARN("launcher: HVD_RENDEZVOUS without HVD_TOKEN: the ranks' connections are "
                   "not authenticated; set the same HVD_TOKEN in every rank");
    return HVD_OK;
  }
  snprintf(port_text, sizeof(port_text), "%d", (int)port);
  if ((st = hvd_setting_provide(HVD_SET_RENDEZVOUS_ADDR, job.store_host)) != HVD_OK ||
      (st = hvd_setting_provide(HVD_SET_RENDEZVOUS_PORT, port_text)) != HVD_OK)
    return st;
  if (given_token != NULL) /* every rank has it: rank 0 hosts with it */
    return job.rank == 0 ? host_store(&job, (int)port, given_token) : HVD_OK;
  if (job.rank == 0) {
    st = hvd_random_token(token);
    if (st == HVD_OK)
      st = host_store(&job, (int)port, token);
  } else {
    st = launch_admission(job.store_host, (int)port, job.job, timeout_s * 1000, token,
                          sizeof(token));
  }
  if (st == HVD_OK)
    st = hvd_setting_provide(HVD_SET_TOKEN, token);
  explicit_bzero(token, sizeof(token));
  return st;
}

hvd_status launch_prepare(void) {
  hvd_status st = HVD_OK;
  pthread_mutex_lock(&prepare_mu);
  if (!prepared && (st = prepare()) == HVD_OK)
    prepared = true;
  pthread_mutex_unlock(&prepare_mu);
  return st;
}
