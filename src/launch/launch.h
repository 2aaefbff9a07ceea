/*
 * The launch module: finding the job from whoever started this process
 * (hvdrun, Slurm, torchrun and the operators that set its variables, a
 * Kubernetes Indexed Job), hosting the store on rank 0 when nobody else
 * does, and proving to it that a rank belongs to the job (docs/running.md,
 * "Launchers").
 *
 * It uses common and the rendezvous module; coord never calls it: hvd_init
 * (elastic/init.c) prepares the launch, which hands hvd's own variables
 * (HOROVOD_RANK, HOROVOD_GLOO_RENDEZVOUS_ADDR, HVD_TOKEN, ...) to the rest
 * of the library through hvd_setting_provide, where the environment does not
 * set them itself.
 */
#ifndef HVD_LAUNCH_H
#define HVD_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/common.h"
#include "rendezvous/rendezvous.h"

/* ==== compressed lists (hostlist.c) ======================================= */
struct launch_hostlist {
  char *names;     /* every name, NUL-terminated, one after the other */
  size_t *offsets; /* where each begins */
  size_t count;
};

/* Expands a Slurm host list ("gpu[01-04,07],cpu-a[1-2]"), at most
 * max_hosts names. */
hvd_status launch_hostlist_parse(const char *text, size_t max_hosts, struct launch_hostlist *out);
/* The ith name, or NULL past the end. */
const char *launch_hostlist_get(const struct launch_hostlist *l, size_t i);
void launch_hostlist_fini(struct launch_hostlist *l);
/* Expands Slurm's task counts per node ("2(x3),1": 2 2 2 1) into counts,
 * at most max_nodes of them. */
hvd_status launch_tasks_per_node_parse(const char *text, int *counts, size_t max_nodes,
                                       size_t *nnodes);

/* ==== the job, as the launcher describes it (detect.c and one file per
 * launcher) ================================================================ */
enum launch_kind {
  LAUNCH_NONE,     /* one process on its own */
  LAUNCH_HVDRUN,   /* hvdrun, hvd-rendezvous's pods, or hvd's variables set by hand */
  LAUNCH_SLURM,    /* a task of a Slurm job step (srun) */
  LAUNCH_TORCHRUN, /* torchrun, or anything that sets its variables (PyTorchJob) */
  LAUNCH_K8S,      /* a pod of a Kubernetes Indexed Job */
};

enum { LAUNCH_NAME_MAX = 256, LAUNCH_WHY_MAX = 256, LAUNCH_MAX_HOSTS = 1 << 20 };

struct launch_job {
  enum launch_kind kind;
  char why[LAUNCH_WHY_MAX]; /* the variables that gave it away */
  /* Filled for Slurm, torchrun and Kubernetes; -1 where the launcher does
   * not say (local and cross ranks then come from the host names). */
  int rank, size;
  int local_rank, local_size, cross_rank, cross_size;
  char host[LAUNCH_NAME_MAX];       /* this rank's host as the launcher names it, or "" */
  char store_host[LAUNCH_NAME_MAX]; /* where rank 0 hosts the store */
  int store_port;
  char store_port_why[LAUNCH_WHY_MAX]; /* how the port was chosen, for messages */
  char job[LAUNCH_NAME_MAX];           /* the job's name, e.g. "slurm:1234.0" */
  bool same_host;                      /* every rank runs on one host */
};

const char *launch_kind_name(enum launch_kind kind);
/* Reads the environment: HVD_LAUNCHER if set (slurm, torchrun, k8s, none,
 * or hvdrun: hvd's own variables), else the first launcher whose variables
 * are there. A launcher's variables that are missing or malformed are an
 * error naming them. */
hvd_status launch_detect(struct launch_job *out);
/* The per-launcher halves of launch_detect: fill everything after kind
 * and why. */
hvd_status launch_slurm_read(struct launch_job *job);
/* A Slurm node list and its per-node counts ("2(x3),1"), from the two
 * variables named: at most max_hosts hosts, and one count each in *counts
 * (malloc'ed). Errors name the variables (unset, malformed, or counting
 * another number of nodes). */
hvd_status launch_slurm_nodes(const char *nodes_var, const char *counts_var, size_t max_hosts,
                              struct launch_hostlist *hosts, int **counts);
hvd_status launch_torchrun_read(struct launch_job *job);
hvd_status launch_k8s_read(struct launch_job *job);
/* An integer variable in [min, max]; HVD_ERR_NOT_FOUND when unset (no
 * message), HVD_ERR_INVALID_ARGUMENT naming it when malformed. */
hvd_status launch_env_int(const char *name, int min, int max, int *out);
/* The store's port in [lo, hi] for a job's name: the same on every rank. */
int launch_port_for(const char *job, int lo, int hi);
/* HVD_PORT_RANGE as the store's range, else [20000, 29999]. */
hvd_status launch_store_range(int *lo, int *hi);

/* ==== proofs of belonging (admit.c, munge.c, peer.c) =====================
 * A rank without the token asks the store for it (POST /_admit) with a
 * MUNGE credential when MUNGE is there; the store admits a credential of
 * its own uid bound to its job, or, without one, a connection from this
 * host whose socket the kernel says belongs to its uid.
 */
/* A MUNGE credential of this process's uid carrying payload, for
 * HVD_MUNGE_SOCKET's munged (libmunge's default socket if unset). *out
 * is malloc'ed. HVD_ERR_UNSUPPORTED without libmunge or munged. */
hvd_status launch_munge_encode(const char *payload, char **out);
/* Decodes a credential: its uid and payload (malloc'ed, NUL-terminated). */
hvd_status launch_munge_decode(const char *cred, uid_t *uid, char **payload);
/* The uid owning the other end of a TCP connection from this host (the
 * kernel's socket table); HVD_ERR_NOT_FOUND when that end is elsewhere. */
hvd_status launch_peer_uid(const struct sockaddr *peer, const struct sockaddr *local, uid_t *uid);
/* The admission callback of a store that rank 0 hosts (arg: the job's name). */
bool launch_admit_cb(const struct rdzv_admit_request *req, void *arg, char *why, size_t why_size);
/* A rank's side: the token of `job` from the store at host:port. */
hvd_status launch_admission(const char *host, int port, const char *job, int64_t timeout_ms,
                            char *token, size_t token_size);

/* ==== the whole step (prepare.c) ========================================== */
/* Once per process, before the state is built: detects the launcher, logs
 * it (rank 0), hosts the store when this rank should, gets the token, and
 * provides hvd's variables. Later calls return the first one's result
 * unless it failed. */
hvd_status launch_prepare(void);

#endif /* HVD_LAUNCH_H */
