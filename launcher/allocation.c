/*
 * hvdrun inside a Slurm allocation (salloc, sbatch) without -H or
 * --hostfile: the hosts and their slots are the allocation's, and remote
 * ranks start through srun instead of ssh, so that they run inside the
 * job's cgroups and accounting and the nodes need no ssh at all.
 *
 * DESIGN. The hosts are SLURM_JOB_NODELIST in Slurm's order; a host's
 * slots are its tasks (SLURM_TASKS_PER_NODE) when the allocation asked for
 * tasks, else its CPUs (SLURM_JOB_CPUS_PER_NODE). Each remote rank is one
 * job step of one task on its host (`srun --overlap`: steps share the
 * allocation's CPUs with each other and with the batch step), started
 * exactly as ssh would start it: the rank's command line through /bin/sh,
 * the job token on its standard input, which srun hands to the task. Ranks
 * on hvdrun's own host start directly, as always.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/launch.h"
#include "proc.h"

bool hvdrun_in_allocation(void) {
  return getenv("SLURM_JOB_ID") != NULL && getenv("SLURM_JOB_NODELIST") != NULL;
}

hvd_status hvdrun_allocation_hosts(struct hvdrun_host **out, size_t *n) {
  const char *slots_var = getenv("SLURM_NTASKS") != NULL && getenv("SLURM_TASKS_PER_NODE") != NULL
                              ? "SLURM_TASKS_PER_NODE"
                              : "SLURM_JOB_CPUS_PER_NODE";
  struct launch_hostlist list = {0};
  struct hvdrun_host *hosts = NULL;
  int *counts = NULL;
  hvd_status st;

  st = launch_slurm_nodes("SLURM_JOB_NODELIST", slots_var, HVDRUN_MAX_RANKS, &list, &counts);
  if (st != HVD_OK)
    return hvd_error_prefix("inside a Slurm allocation");
  if ((hosts = calloc(list.count, sizeof(*hosts))) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot list the allocation's %zu hosts", list.count);
  for (size_t i = 0; st == HVD_OK && i < list.count; i++) {
    const char *name = launch_hostlist_get(&list, i);
    if (strlen(name) > HVDRUN_HOST_MAX) {
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "host '%s' is longer than %d bytes", name,
                     HVDRUN_HOST_MAX);
      break;
    }
    snprintf(hosts[i].name, sizeof(hosts[i].name), "%s", name);
    hosts[i].slots = counts[i] < HVDRUN_MAX_RANKS ? counts[i] : HVDRUN_MAX_RANKS;
  }
  free(counts);
  if (st == HVD_OK) {
    *out = hosts;
    *n = list.count;
  } else {
    free(hosts);
  }
  launch_hostlist_fini(&list);
  return st;
}

hvd_status hvdrun_srun_argv(const char *host, const char *text, struct hvdrun_argv *argv) {
  char nodelist[HVDRUN_HOST_MAX + 16];
  const char *fixed[] = {"srun", "--overlap", "--nodes=1", "--ntasks=1", "--quiet",
                         "--kill-on-bad-exit=1", nodelist, "/bin/sh", "-c"};
  hvd_status st = HVD_OK;

  snprintf(nodelist, sizeof(nodelist), "--nodelist=%s", host);
  for (size_t i = 0; i < HVD_ARRAY_SIZE(fixed) && st == HVD_OK; i++)
    st = hvdrun_argv_add(argv, fixed[i]);
  return st == HVD_OK ? hvdrun_argv_add(argv, text) : st;
}
