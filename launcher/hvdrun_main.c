/*
 * hvdrun: starts an hvd job. See hvdrun --help and docs/running.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"

int main(int argc, char **argv) {
  struct hvdrun_options o;
  struct hvdrun_host *hosts = NULL;
  struct hvdrun_slot *slots = NULL;
  size_t nhosts = 0;
  int size = 0, code;
  bool help;
  hvd_status st;

  hvd_log_configure_from_env();
  st = hvdrun_parse(argc, argv, &o, &help);
  if (st == HVD_OK && help) {
    hvdrun_usage(stdout);
    return 0;
  }
  if (st == HVD_OK && o.version) {
    printf("%s\n", hvd_version());
    hvdrun_options_fini(&o);
    return 0;
  }
  if (st == HVD_OK && o.check_build && o.hosts != NULL) {
    /* It runs nothing, but a malformed -H is still the command line's
     * mistake, said before anything is printed. */
    st = hvdrun_parse_hosts(o.hosts, &hosts, &nhosts);
    free(hosts);
    hosts = NULL;
    if (st != HVD_OK) {
      fprintf(stderr, "hvdrun: %s\n", hvd_last_error_message());
      hvdrun_options_fini(&o);
      return HVDRUN_EXIT_USAGE;
    }
  }
  if (st == HVD_OK && o.check_build) {
    char *python_dir = NULL;
    if (hvdrun_python_find(&python_dir) != HVD_OK && o.verbose)
      fprintf(stderr, "hvdrun: %s\n", hvd_last_error_message());
    hvdrun_check_build(stdout, python_dir, hvd_nccl_built());
    free(python_dir);
    hvdrun_options_fini(&o);
    return 0;
  }
  if (st == HVD_OK)
    st = hvdrun_python_setup(&o);
  if (st == HVD_OK && o.elastic && o.discovery_script != NULL) {
    code = hvdrun_run_elastic(&o, NULL, 0);
    hvdrun_options_fini(&o);
    return code;
  }
  if (st == HVD_OK) {
    if (o.hosts != NULL) {
      st = hvdrun_parse_hosts(o.hosts, &hosts, &nhosts);
    } else if (o.hostfile != NULL) {
      st = hvdrun_read_hostfile(o.hostfile, &hosts, &nhosts);
    } else if (hvdrun_in_allocation()) {
      /* Slurm's hosts; their ranks start through srun unless a remote
       * shell was named. */
      st = hvdrun_allocation_hosts(&hosts, &nhosts);
      o.srun = strcmp(o.ssh_command, "ssh") == 0;
      if (st == HVD_OK && o.verbose)
        fprintf(stderr, "hvdrun: inside Slurm job %s: hosts %s, remote ranks through %s\n",
                getenv("SLURM_JOB_ID"), getenv("SLURM_JOB_NODELIST"),
                o.srun ? "srun" : o.ssh_command);
    } else if (o.np < 0) {
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "give -np N (or hosts with -H or --hostfile)");
    } else {
      char local[32];
      snprintf(local, sizeof(local), "localhost:%d", o.np);
      st = hvdrun_parse_hosts(local, &hosts, &nhosts);
    }
  }
  if (st == HVD_OK && !o.elastic)
    st = hvdrun_assign(hosts, nhosts, o.np, &slots, &size);
  if (st != HVD_OK) {
    fprintf(stderr, "hvdrun: %s\n", hvd_last_error_message());
    free(hosts);
    hvdrun_options_fini(&o);
    return HVDRUN_EXIT_USAGE;
  }
  code = o.elastic ? hvdrun_run_elastic(&o, hosts, nhosts)
                   : hvdrun_run(&o, hosts, nhosts, slots, size);
  free(slots);
  free(hosts);
  hvdrun_options_fini(&o);
  return code;
}
