/*
 * torchrun's workers, and whatever else sets its variables (Kubeflow's
 * PyTorchJob, other operators, a user's script).
 *
 * DESIGN. RANK and WORLD_SIZE are the rank and size; LOCAL_RANK and
 * LOCAL_WORLD_SIZE, when there, the local ones; GROUP_RANK and
 * GROUP_WORLD_SIZE (torchrun's node index and count) the cross ones when
 * every node runs LOCAL_WORLD_SIZE workers, as torchrun's do. Rank 0 runs
 * on MASTER_ADDR's host and hosts hvd's store next to torch's, on
 * MASTER_PORT + 1 unless HOROVOD_GLOO_RENDEZVOUS_PORT names one: torch's
 * store keeps MASTER_PORT, so both can run in one script. The job's name
 * includes torchrun's run id and restart count, so that a restarted
 * group's ranks never take an earlier group's store for theirs.
 */
#include <stdio.h>
#include <string.h>

#include "launch.h"

/* Both of a pair, or neither (-1). */
static hvd_status pair(const char *rank_name, const char *size_name, int *rank, int *size) {
  hvd_status a = launch_env_int(size_name, 1, 1 << 24, size);
  hvd_status b = a == HVD_OK ? launch_env_int(rank_name, 0, *size - 1, rank) : a;
  if (a == HVD_ERR_NOT_FOUND && launch_env_int(rank_name, 0, 1 << 24, rank) != HVD_ERR_NOT_FOUND)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s is set but %s is not", rank_name, size_name);
  if (b == HVD_ERR_NOT_FOUND && a == HVD_OK)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s is set but %s is not", size_name, rank_name);
  if (a == HVD_ERR_NOT_FOUND) {
    *rank = *size = -1;
    return HVD_OK;
  }
  return b;
}

hvd_status launch_torchrun_read(struct launch_job *job) {
  const char *addr = hvd_env_real("MASTER_ADDR"), *run_id = hvd_env_real("TORCHELASTIC_RUN_ID");
  int port = 0, restarts = 0, group = -1, groups = -1;
  hvd_status st;

  if (addr == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "MASTER_ADDR is not set");
  if (strlen(addr) >= sizeof(job->store_host))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "MASTER_ADDR is longer than %zu bytes",
                     sizeof(job->store_host) - 1);
  st = pair("RANK", "WORLD_SIZE", &job->rank, &job->size);
  if (st == HVD_OK && job->size < 0)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "RANK and WORLD_SIZE are not set");
  if (st == HVD_OK)
    st = pair("LOCAL_RANK", "LOCAL_WORLD_SIZE", &job->local_rank, &job->local_size);
  if (st == HVD_OK)
    st = pair("GROUP_RANK", "GROUP_WORLD_SIZE", &group, &groups);
  if (st == HVD_OK && (st = launch_env_int("MASTER_PORT", 1, 65534, &port)) == HVD_ERR_NOT_FOUND)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "MASTER_PORT is not set");
  if (st == HVD_OK && launch_env_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, &restarts) ==
                          HVD_ERR_INVALID_ARGUMENT)
    st = hvd_error_status();
  if (st != HVD_OK)
    return st;
  if (job->local_size > 0 && groups > 0 && (int64_t)job->local_size * groups == job->size) {
    job->cross_rank = group;
    job->cross_size = groups;
  } else {
    job->local_rank = job->local_size = -1; /* both from the host names */
  }
  job->same_host = job->local_size == job->size;
  snprintf(job->store_host, sizeof(job->store_host), "%s", addr);
  job->store_port = port + 1;
  snprintf(job->store_port_why, sizeof(job->store_port_why), "MASTER_PORT + 1");
  if (run_id != NULL)
    snprintf(job->job, sizeof(job->job), "torchrun:%.100s:%d/%.100s.%d", addr, port, run_id,
             restarts);
  else
    snprintf(job->job, sizeof(job->job), "torchrun:%.200s:%d", addr, port);
  return HVD_OK;
}
