/* What every hvdrun job does with its ranks, static or elastic: the store
 * (store.c); the variables every rank gets, starting a rank on its host,
 * forwarding its output, and naming how it ended (proc.c). */
#ifndef HVD_LAUNCHER_PROC_H
#define HVD_LAUNCHER_PROC_H

#include "hvdrun.h"

/* ==== the store (store.c) ================================================== */

struct rdzv_server;

struct rdzv_client;

/* The store a job serves in-process, and what its ranks need to reach it;
 * or, with --rendezvous (HVD_RENDEZVOUS) naming an etcd cluster, the
 * job's own prefix in that cluster. */
struct hvdrun_store {
  struct rdzv_server *server; /* NULL with etcd */
  char token[HVD_TOKEN_HEX_DIGITS + 1]; /* random */
  char addr[128]; /* where ranks reach it */
  int port;
  bool loopback; /* listening on 127.0.0.1 alone (else on every interface) */
  char *url; /* etcd: HVD_RENDEZVOUS with the job's prefix; else NULL */
  struct rdzv_client *client; /* etcd: hvdrun's client */
};

/* What differs between the static job and the elastic driver. */
struct hvdrun_store_config {
  /* The remote hosts ranks start on: the first one chooses the address
   * (none: 127.0.0.1). */
  const char *const *remote;
  size_t nremote;
  /* Hosts may be found later (a discovery script): listen on every
   * interface even when the first ranks use 127.0.0.1. */
  bool hosts_may_join;
  const char *blocking_scope; /* as rdzv_server_config's; NULL: none */
};

/* Makes a random token, chooses the ranks' address (--network-interface's,
 * else the route to the first remote host; for a name only the remote
 * shell knows, this host's first IPv4 address that is not loopback) and
 * starts the server (--rendezvous-port, one event loop). With an etcd
 * cluster instead, gives the job a prefix of its own under the one named
 * (<prefix>/job-<random>: runs never meet each other's keys) and connects
 * to it. *out is written only on success. Errors name what failed
 * ("starting the rendezvous store: ..."). */
hvd_status hvdrun_store_start(const struct hvdrun_options *o, const struct hvdrun_store_config *cfg,
                              struct hvdrun_store *out);
/* Stops the server (waiting clients get 503). Safe on a zeroed struct. */
void hvdrun_store_stop(struct hvdrun_store *s);

/* ==== ranks (proc.c) ======================================================= */

/* The variables every rank of the job gets: the store (port 0: addr is
 * the HVD_RENDEZVOUS URL of an etcd cluster), the token, the knobs given
 * as options, the -x exports and the Python path (o->pythonpath,
 * HVD_HOROVOD_COMPAT). */
hvd_status hvdrun_job_vars(const struct hvdrun_options *o, const char *addr, int port,
                           const char *token, struct hvdrun_env *e);
/* hvdrun_job_vars for the job's store s: its address, or its etcd URL. */
hvd_status hvdrun_store_vars(const struct hvdrun_options *o, const struct hvdrun_store *s,
                             struct hvdrun_env *e);

/* A slot's HOROVOD_HOSTNAME and HOROVOD_RANK/SIZE, LOCAL_RANK/SIZE and
 * CROSS_RANK/SIZE. */
hvd_status hvdrun_slot_vars(const char *host, const struct hvdrun_slot *s, struct hvdrun_env *e);

/* In a child between fork and exec (async-signal-safe calls only): no
 * blocked signals, a process group of its own, death with hvdrun (exits
 * at once if hvdrun is already gone), stdin from in (-1: /dev/null),
 * stdout and stderr to out and err. */
void hvdrun_child_setup(pid_t parent, int in, int out, int err);

/* One started rank (or elastic worker). */
struct hvdrun_proc {
  pid_t pid;    /* its process group too; 0 before the start */
  bool running; /* not reaped yet */
  int fds[2];   /* stdout, stderr pipes; -1 at EOF */
  struct hvdrun_stream streams[2];
  FILE *files[2]; /* --output-filename copies */
};

/* Sets up the output side: label is the number the lines are prefixed
 * with (and the rank.<label> directory of --output-filename, its digits
 * wide). */
hvd_status hvdrun_proc_init(struct hvdrun_proc *p, const struct hvdrun_options *o, int label,
                            int digits);
/* Starts the command on host (through the remote shell when remote) with
 * hvdrun's environment (a remote one: only HOROVOD_, HVD_ and NCCL_
 * variables) plus vars, in a process group of its own. */
hvd_status hvdrun_proc_start(struct hvdrun_proc *p, const struct hvdrun_options *o,
                             const char *host, bool remote, const struct hvdrun_env *vars,
                             int label);
/* Reads what is waiting on pipe k (0 stdout, 1 stderr) and forwards it;
 * closes the pipe at its end. */
void hvdrun_proc_forward(struct hvdrun_proc *p, int k);
/* Flushes partial lines, closes pipes and files. */
void hvdrun_proc_fini(struct hvdrun_proc *p);

/* "exited with code 3" / "was killed by signal 9 (Killed)", and the exit
 * code hvdrun reports for it (128 + signal for a signal). */
void hvdrun_describe_end(int status, char *out, size_t size, int *code);

/* ==== the elastic job (elastic.c) ========================================= */

/* Runs an elastic job: hosts are -H's or --hostfile's, or NULL with
 * --host-discovery-script. Returns hvdrun's exit code. */
int hvdrun_run_elastic(const struct hvdrun_options *o, const struct hvdrun_host *hosts,
                       size_t nhosts);

/* Runs the elastic driver for pods that register themselves in server's
 * store (hvd-rendezvous --min-np): o gives np, min_np, max_np,
 * elastic_timeout_s and verbose. Serves until SIGINT, SIGTERM or SIGHUP;
 * returns the exit code (0 after a signal). */
int hvdrun_run_elastic_pods(const struct hvdrun_options *o, struct rdzv_server *server,
                            int pod_timeout_s);

/* The same driver in an etcd cluster (hvd-rendezvous --rendezvous
 * etcd://... --min-np): any number of these processes stand by, one
 * leads (elastic_lead.c), and a new leader takes the job over from what
 * the last one wrote there. Until SIGINT, SIGTERM or SIGHUP; the exit
 * code. */
int hvdrun_lead_elastic_pods(const struct hvdrun_options *o, const char *url, int pod_timeout_s);

#endif
