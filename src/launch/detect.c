/*
 * Which launcher started this process, and the job it describes.
 *
 * DESIGN. HVD_LAUNCHER forces one; otherwise the first whose variables
 * are there wins, in this order: hvd's own (HOROVOD_RANK, HVD_POD or
 * HOROVOD_ELASTIC: hvdrun, hvd-rendezvous's pods, or a user who set them),
 * a worker of torchrun itself (its variables with TORCHELASTIC_RUN_ID), a
 * Slurm job step (SLURM_STEP_ID with SLURM_PROCID: a task of srun, not the
 * batch script or an salloc shell), torchrun's variables without torchrun
 * (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which PyTorchJob and
 * similar operators set), a Kubernetes Indexed Job (JOB_COMPLETION_INDEX),
 * else a process on its own. The order settles the mixes that happen:
 * hvdrun's ranks started through srun carry Slurm's variables too, and so
 * do the workers of `srun torchrun ...` (one torchrun per node), whose
 * ranks are torchrun's; a script under srun that sets RANK and WORLD_SIZE
 * for torch itself keeps Slurm's (the same values). Each launcher's own file reads
 * its variables; what they cannot say stays -1 and is derived later from
 * the host names every rank publishes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "launch.h"

static const char *const kind_names[] = {
    [LAUNCH_NONE] = "none",         [LAUNCH_HVDRUN] = "hvdrun", [LAUNCH_SLURM] = "slurm",
    [LAUNCH_TORCHRUN] = "torchrun", [LAUNCH_K8S] = "k8s",
};

const char *launch_kind_name(enum launch_kind kind) {
  return (unsigned)kind < HVD_ARRAY_SIZE(kind_names) ? kind_names[kind] : "?";
}

hvd_status launch_env_int(const char *name, int min, int max, int *out) {
  const char *v = hvd_env_real(name);
  int64_t x;
  if (v == NULL)
    return HVD_ERR_NOT_FOUND;
  if (!hvd_parse_int64(v, strlen(v), &x) || x < min || x > max)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s='%.64s' is not an integer in %d to %d", name,
                     v, min, max);
  *out = (int)x;
  return HVD_OK;
}

/* FNV-1a: the same port on every rank, spread over the range. */
int launch_port_for(const char *job, int lo, int hi) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const unsigned char *p = (const unsigned char *)job; *p != '\0'; p++) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  return lo + (int)(h % (uint64_t)(hi - lo + 1));
}

hvd_status launch_store_range(int *lo, int *hi) {
  const char *range = hvd_setting_real(HVD_SET_PORT_RANGE);
  if (range != NULL)
    return hvd_parse_port_range(range, lo, hi);
  *lo = 20000;
  *hi = 29999;
  return HVD_OK;
}

static bool set(const char *name) { return hvd_env_real(name) != NULL; }

/* hvd's own variables, as the user set them (nothing is provided yet). */
static bool is_true(enum hvd_setting id) {
  bool b = false;
  return hvd_setting_real(id) != NULL && hvd_setting_bool(id, &b) == HVD_OK && b;
}

/* The launcher whose variables are there, and which ones. */
static enum launch_kind sniff(char *why, size_t size) {
  const enum hvd_setting own[] = {HVD_SET_RANK, HVD_SET_POD, HVD_SET_ELASTIC};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(own); i++) {
    if (i == 0 ? hvd_setting_real(own[i]) != NULL : is_true(own[i])) {
      snprintf(why, size, "%s is set", hvd_setting_name(own[i]));
      return LAUNCH_HVDRUN;
    }
  }
  bool torch_vars = set("RANK") && set("WORLD_SIZE") && set("MASTER_ADDR") && set("MASTER_PORT");
  if (torch_vars && set("TORCHELASTIC_RUN_ID")) {
    snprintf(why, size, "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID are "
                        "set (a worker of torchrun)");
    return LAUNCH_TORCHRUN;
  }
  if (set("SLURM_STEP_ID") && set("SLURM_PROCID")) {
    snprintf(why, size, "SLURM_STEP_ID=%.32s and SLURM_PROCID=%.32s are set (a task of srun)",
             hvd_env_real("SLURM_STEP_ID"), hvd_env_real("SLURM_PROCID"));
    return LAUNCH_SLURM;
  }
  if (torch_vars) {
    snprintf(why, size, "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set");
    return LAUNCH_TORCHRUN;
  }
  if (set("JOB_COMPLETION_INDEX")) {
    snprintf(why, size, "JOB_COMPLETION_INDEX=%.32s is set (an Indexed Job)",
             hvd_env_real("JOB_COMPLETION_INDEX"));
    return LAUNCH_K8S;
  }
  snprintf(why, size, "no launcher's variables are set");
  return LAUNCH_NONE;
}

/* HVD_LAUNCHER's words, in settings.def's order. */
static const enum launch_kind by_word[] = {LAUNCH_SLURM, LAUNCH_TORCHRUN, LAUNCH_K8S,
                                           LAUNCH_HVDRUN, LAUNCH_NONE};

hvd_status launch_detect(struct launch_job *out) {
  struct launch_job job;
  int word = -1;
  hvd_status st = hvd_setting_word(HVD_SET_LAUNCHER, &word);

  if (st != HVD_OK)
    return st;
  memset(&job, 0, sizeof(job));
  job.rank = job.size = -1;
  job.local_rank = job.local_size = job.cross_rank = job.cross_size = -1;
  if (word >= 0 && (size_t)word < HVD_ARRAY_SIZE(by_word)) {
    job.kind = by_word[word];
    snprintf(job.why, sizeof(job.why), "HVD_LAUNCHER=%s", launch_kind_name(job.kind));
  } else {
    job.kind = sniff(job.why, sizeof(job.why));
  }
  switch (job.kind) {
  case LAUNCH_SLURM: st = launch_slurm_read(&job); break;
  case LAUNCH_TORCHRUN: st = launch_torchrun_read(&job); break;
  case LAUNCH_K8S: st = launch_k8s_read(&job); break;
  default: break;
  }
  if (st != HVD_OK)
    return hvd_error_prefix("%s launcher (%s)", launch_kind_name(job.kind), job.why);
  *out = job;
  return HVD_OK;
}
