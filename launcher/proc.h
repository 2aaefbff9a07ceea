/* What every hvdrun job does with its ranks, static or elastic (proc.c):
 * the store's token and address, the variables every rank gets, starting
 * a rank on its host, forwarding its output, and naming how it ended. */
#ifndef HVD_LAUNCHER_PROC_H
#define HVD_LAUNCHER_PROC_H

#include "hvdrun.h"

/* A random job token: 48 hex digits (out has room for 49 bytes). */
hvd_status hvdrun_make_token(char *out, size_t size);

/* Where ranks reach the store: 127.0.0.1 when no host is remote, else the
 * interface --network-interface names or the route to the first remote
 * host (for a name only the remote shell knows, this host's first IPv4
 * address that is not loopback). */
hvd_status hvdrun_store_address(const struct hvdrun_options *o, const char *const *remote_hosts,
                                size_t nremote, char *out, size_t size);

/* The variables every rank of the job gets: the store, the token, the
 * knobs given as options, the -x exports and the Python path
 * (o->pythonpath, HVD_HOROVOD_COMPAT). */
hvd_status hvdrun_job_vars(const struct hvdrun_options *o, const char *addr, int port,
                           const char *token, struct hvdrun_env *e);

/* A slot's HOROVOD_HOSTNAME and HOROVOD_RANK/SIZE, LOCAL_RANK/SIZE and
 * CROSS_RANK/SIZE. */
hvd_status hvdrun_slot_vars(const char *host, const struct hvdrun_slot *s, struct hvdrun_env *e);

/* Blocks SIGCHLD, SIGINT, SIGTERM and SIGHUP (ignoring SIGPIPE) and
 * returns a signalfd that reads them: the loop's view of signals. */
hvd_status hvdrun_signal_fd(int *fd);
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
struct rdzv_server;
int hvdrun_run_elastic_pods(const struct hvdrun_options *o, struct rdzv_server *server,
                            int pod_timeout_s);

#endif
