/*
 * A task of a Slurm job step (srun, also inside sbatch or salloc).
 *
 * DESIGN. Slurm gives every task its rank (SLURM_PROCID), the step's size
 * (SLURM_STEP_NUM_TASKS), its node's index in the step (SLURM_NODEID) and
 * its rank on that node (SLURM_LOCALID), the step's nodes
 * (SLURM_STEP_NODELIST, a compressed host list) and the tasks on each
 * (SLURM_STEP_TASKS_PER_NODE, "2(x3),1"). Local ranks are Slurm's; a
 * task's cross rank is the number of nodes before its own that run a task
 * of its local rank, as hvdrun assigns them. Task 0 runs on the step's
 * first node under block and cyclic distributions alike: it hosts the
 * store there, on a port every task derives from the job and step ids
 * (inside HVD_PORT_RANGE, else 20000-29999), unless
 * HOROVOD_GLOO_RENDEZVOUS_PORT names one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

/* The name, or its older spelling where only that one is set. */
static const char *either(const char *name, const char *old) {
  return hvd_env_real(name) == NULL && hvd_env_real(old) != NULL ? old : name;
}

static hvd_status need_int(const char *name, int min, int max, int *out) {
  hvd_status st = launch_env_int(name, min, max, out);
  if (st == HVD_ERR_NOT_FOUND)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s is not set", name);
  return st;
}

/* Local size, cross rank and size from the tasks on each node. */
static hvd_status place(struct launch_job *job, int node, const char *tasks, const int *counts,
                        size_t nnodes) {
  int64_t total = 0;
  for (size_t i = 0; i < nnodes; i++)
    total += counts[i];
  if (total != job->size)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "SLURM_STEP_TASKS_PER_NODE='%.64s' adds up to %lld tasks, not %d", tasks,
                     (long long)total, job->size);
  if ((size_t)node >= nnodes)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "SLURM_NODEID=%d but the step has %zu nodes", node,
                     nnodes);
  job->local_size = counts[node];
  if (job->local_rank >= job->local_size)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "SLURM_LOCALID=%d but node %d runs %d tasks",
                     job->local_rank, node, job->local_size);
  job->cross_rank = job->cross_size = 0;
  for (size_t i = 0; i < nnodes; i++) {
    if (counts[i] > job->local_rank) {
      if ((int)i < node)
        job->cross_rank++;
      job->cross_size++;
    }
  }
  job->same_host = nnodes == 1;
  return HVD_OK;
}

hvd_status launch_slurm_nodes(const char *nodes_var, const char *counts_var, size_t max_hosts,
                              struct launch_hostlist *hosts, int **counts) {
  const char *nodes = hvd_env_real(nodes_var), *text = hvd_env_real(counts_var);
  struct launch_hostlist l = {0};
  int *c = NULL;
  size_t n = 0;
  hvd_status st = HVD_OK;

  if (nodes == NULL || text == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s is not set",
                     nodes == NULL ? nodes_var : counts_var);
  if ((st = launch_hostlist_parse(nodes, max_hosts, &l)) != HVD_OK)
    return hvd_error_prefix("%s", nodes_var);
  if ((c = malloc(l.count * sizeof(*c))) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot read the counts of %zu nodes", l.count);
  if (st == HVD_OK && (st = launch_tasks_per_node_parse(text, c, l.count, &n)) != HVD_OK)
    hvd_error_prefix("%s", counts_var);
  if (st == HVD_OK && n != l.count)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s='%.64s' counts %zu nodes but %s names %zu",
                   counts_var, text, n, nodes_var, l.count);
  if (st != HVD_OK) {
    free(c);
    launch_hostlist_fini(&l);
    return st;
  }
  *hosts = l;
  *counts = c;
  return HVD_OK;
}

hvd_status launch_slurm_read(struct launch_job *job) {
  const char *nodes_var = either("SLURM_STEP_NODELIST", "SLURM_NODELIST");
  const char *tasks_var = either("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
  const char *node_name = hvd_env_real("SLURMD_NODENAME");
  struct launch_hostlist hosts = {0};
  int *counts = NULL, node = 0, job_id = 0, step_id = 0, lo, hi;
  hvd_status st;

  st = need_int(either("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 1, 1 << 24, &job->size);
  if (st == HVD_OK)
    st = need_int("SLURM_PROCID", 0, job->size - 1, &job->rank);
  if (st == HVD_OK)
    st = need_int("SLURM_LOCALID", 0, 1 << 24, &job->local_rank);
  if (st == HVD_OK)
    st = need_int("SLURM_NODEID", 0, LAUNCH_MAX_HOSTS - 1, &node);
  if (st == HVD_OK)
    st = need_int(either("SLURM_JOB_ID", "SLURM_JOBID"), 0, 0x7fffffff, &job_id);
  if (st == HVD_OK)
    st = need_int("SLURM_STEP_ID", 0, 0x7fffffff, &step_id);
  if (st == HVD_OK)
    st = launch_slurm_nodes(nodes_var, tasks_var, LAUNCH_MAX_HOSTS, &hosts, &counts);
  if (st == HVD_OK)
    st = place(job, node, hvd_env_real(tasks_var), counts, hosts.count);
  if (st == HVD_OK) {
    snprintf(job->store_host, sizeof(job->store_host), "%s", launch_hostlist_get(&hosts, 0));
    snprintf(job->host, sizeof(job->host), "%s",
             node_name != NULL ? node_name : launch_hostlist_get(&hosts, (size_t)node));
    snprintf(job->job, sizeof(job->job), "slurm:%d.%d", job_id, step_id);
    if (job->rank == 0 && strcmp(job->host, job->store_host) != 0 &&
        hvd_setting_real(HVD_SET_RENDEZVOUS_ADDR) == NULL)
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "task 0 runs on %s, not on the step's first node %s, where the other tasks "
                     "look for the store it hosts (use --distribution=block or cyclic)",
                     job->host, job->store_host);
  }
  if (st == HVD_OK && (st = launch_store_range(&lo, &hi)) == HVD_OK) {
    job->store_port = launch_port_for(job->job, lo, hi);
    snprintf(job->store_port_why, sizeof(job->store_port_why),
             "derived from job %d step %d in %d-%d%s", job_id, step_id, lo, hi,
             hvd_setting_real(HVD_SET_PORT_RANGE) != NULL ? " (HVD_PORT_RANGE)"
                                                    : ", HVD_PORT_RANGE's default");
  }
  free(counts);
  launch_hostlist_fini(&hosts);
  return st;
}
