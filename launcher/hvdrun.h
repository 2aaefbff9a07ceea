/* hvdrun's pieces: options, hosts and slots, rank environments, spawning,
 * output forwarding and supervision. Only hvdrun and its tests use them. */
#ifndef HVD_LAUNCHER_HVDRUN_H
#define HVD_LAUNCHER_HVDRUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "common/common.h"

enum { HVDRUN_EXIT_USAGE = 2, HVDRUN_HOST_MAX = 255, HVDRUN_MAX_RANKS = 4096 };

/* ==== options (options.c) ================================================== */

struct hvdrun_options {
  int np;                  /* -np; -1: every slot */
  const char *hosts;       /* -H */
  const char *hostfile;    /* --hostfile */
  int ssh_port;            /* -p; 0: ssh's default */
  const char *ssh_identity;
  const char *ssh_command; /* --ssh-command; default "ssh" */
  bool srun;               /* remote ranks start through srun (hosts of an allocation) */
  const char *iface;       /* --network-interface(s): settings[HVD_SET_IFACE] */
  int start_timeout_s;     /* --start-timeout (HOROVOD_START_TIMEOUT, 30) */
  int rendezvous_port;     /* --rendezvous-port; 0: ephemeral */
  const char *output_dir;  /* --output-filename */
  bool timestamp;          /* --prefix-output-with-timestamp */
  bool prefix;             /* false with --disable-output-prefix */
  bool verbose;
  /* The settings' flags (settings.def) as the ranks' variables' values,
   * checked ("1"/"0" for a switch, whole bytes for --fusion-threshold-mb;
   * the interfaces of every --network-interface(s) in one list); NULL: not
   * given. Handed to the ranks except hvdrun's own, and a setting that
   * needs another only with that one on. hvdrun_python_setup adds
   * HVD_HVDRUN with --horovod-compat. */
  char *settings[HVD_SETTING_COUNT];
  const char *config_file; /* --config-file: horovodrun's YAML; the command line wins */
  bool check_build;        /* --check-build: print what this build has and exit */
  bool version;            /* -v, --version: print hvd's version and exit */
  char **owned;            /* strings read from the config file, and exports made here */
  size_t nowned, owned_cap;
  const char **exports; /* -x VAR or VAR=value; --tcp's, --horovod-compat's PATH */
  size_t nexports, exports_cap;
  bool horovod_compat;  /* --horovod-compat: horovod's imports get hvd's tree */
  char *pythonpath;     /* the ranks' PYTHONPATH (hvdrun_python_setup); NULL: as is */
  char **command;       /* after the options (or --) */
  int ncommand;
  /* Elastic mode: on with --min-np or --host-discovery-script (--max-np
   * alone does not turn it on, as in horovodrun). Once on, min_np and np
   * are both set (each defaults to the other) and min_np <= np <= max_np. */
  bool elastic;
  int min_np;                   /* --min-np; -1 when not elastic */
  int max_np;                   /* --max-np; -1: no limit */
  const char *discovery_script; /* --host-discovery-script; NULL: -H/--hostfile/local */
  int slots_per_host;           /* --slots-per-host: slots of a bare "host" line (1) */
  int elastic_timeout_s;        /* --elastic-timeout (HOROVOD_ELASTIC_TIMEOUT, 600) */
  int reset_limit;              /* --reset-limit; -1: unlimited; 0: no reset at all */
  double cooldown_min_s, cooldown_max_s; /* --blacklist-cooldown-range; 0, 0: permanent */
};

/* Parses argv, then --config-file's settings that the command line does
 * not give (wherever on it --config-file is); warnings about the file, and
 * about --num-nccl-streams other than 1, go to stderr. HVD_OK, or
 * HVD_ERR_INVALID_ARGUMENT with a one-line message (HVD_ERR_NO_MEMORY);
 * *help set when --help was asked (nothing else is checked then). With
 * --check-build, no command is needed and the hosts are not checked.
 * hvdrun_options_fini is safe after a failure. */
hvd_status hvdrun_parse(int argc, char **argv, struct hvdrun_options *o, bool *help);
void hvdrun_options_fini(struct hvdrun_options *o);
/* Whether a setting was given and is on (a switch's "1"; any other value). */
bool hvdrun_setting_on(const struct hvdrun_options *o, enum hvd_setting id);
void hvdrun_usage(FILE *out);

/* ==== the config file (config.c) =========================================== */

/* Called for each setting of a config file, in the file's order: flag is
 * the command-line flag with the same effect (its positive spelling for a
 * switch), value its value ("1" or "0" for a switch; NULL for --gloo and
 * --mpi) and where names the setting for messages ("FILE:LINE: section.key").
 * A status other than HVD_OK stops the reading and is returned. */
typedef hvd_status (*hvdrun_config_cb)(void *arg, const char *flag, const char *value,
                                       const char *where);

/* Reads horovodrun's config file (YAML: controller, and the sections params,
 * autotune, timeline, stall_check, library_options and logging; a null
 * value sets nothing) and hands every setting to cb. Keys that horovodrun
 * ignores, or that mean nothing to hvd, get one warning line each on warn
 * (which may be NULL). Errors, one line each, HVD_ERR_INVALID_ARGUMENT: a
 * file that cannot be read; invalid YAML (with libyaml's line and column);
 * an unknown section or key (naming it and what is known); a value of the
 * wrong type (naming the key, the expected type and the value). Values are
 * checked by cb, not here: only their YAML type is. */
hvd_status hvdrun_config_read(const char *path, FILE *warn, hvdrun_config_cb cb, void *arg);

/* ==== --check-build (check_build.c) ========================================= */

/* Prints what this build has, in horovodrun --check-build's layout:
 * PyTorch when python_dir (hvd's Python package directory, or NULL) holds
 * hvd/torch; NCCL when nccl_version is not 0; hvd's own controller and
 * TCP collectives as Gloo's; never MPI, DDL or CCL. */
void hvdrun_check_build(FILE *out, const char *python_dir, int nccl_version);

/* ==== the ranks' Python path (python.c) ===================================== */

enum { HVDRUN_PYTHON_CANDIDATES = 2 };

/* Where hvdrun looks for hvd's Python packages, given the absolute path of
 * its executable without symlinks (exe) and the install's library directory
 * (libdir, CMAKE_INSTALL_LIBDIR), prefix being the directory above exe's:
 * <prefix>/lib/hvd/python (the build tree), then <prefix>/<libdir>/hvd/python
 * (<libdir>/hvd/python for an absolute libdir) unless it is the first. On
 * success out[0 .. *n) are malloc'ed (free() them). HVD_ERR_INVALID_ARGUMENT
 * for a relative exe; HVD_ERR_NO_MEMORY. */
hvd_status hvdrun_python_candidates(const char *exe, const char *libdir,
                                    char *out[HVDRUN_PYTHON_CANDIDATES], size_t *n);
/* The ranks' PYTHONPATH. The first candidate holding the hvd package
 * (hvd/__init__.py; where no candidate has it, a directory hvd) comes first,
 * with its compat directory before it when compat; then current, the user's
 * PYTHONPATH (NULL or "": nothing, and no ':'). On success *dir is that
 * candidate and *value is malloc'ed (free() it); both are NULL when no
 * candidate holds the package (not an error without compat). With compat,
 * a missing package or compat directory is HVD_ERR_NOT_FOUND in one line
 * naming the paths tried. HVD_ERR_NO_MEMORY. */
hvd_status hvdrun_python_path(const char *const *candidates, size_t n, bool compat,
                              const char *current, const char **dir, char **value);
/* Sets o->pythonpath from hvdrun's own executable (/proc/self/exe), the
 * user's PYTHONPATH (the last -x PYTHONPATH=VALUE, else hvdrun's) and
 * --horovod-compat; with --horovod-compat, also the ranks' PATH (an export:
 * the compat tree's bin directory, with its horovodrun, before the user's
 * PATH, found as PYTHONPATH is) and HVD_HVDRUN (this executable); a tree
 * without an executable horovodrun gets a warning on stderr and neither.
 * With --verbose, says what it added. Without --horovod-compat, finding
 * nothing is not an error. Errors as hvdrun_python_path's. */
hvd_status hvdrun_python_setup(struct hvdrun_options *o);
/* The candidate directory holding hvd's package, as hvdrun_python_setup
 * finds it: *dir malloc'ed (free() it), or NULL when there is none.
 * HVD_ERR_IO or HVD_ERR_TOO_LARGE when hvdrun's own executable cannot be
 * found; HVD_ERR_NO_MEMORY. */
hvd_status hvdrun_python_find(char **dir);

/* ==== hosts and slots (hosts.c) ============================================= */

struct hvdrun_host {
  char name[HVDRUN_HOST_MAX + 1];
  int slots;
};

/* One rank's place, as Horovod assigns it: host by host, slots in order;
 * cross rank = the host's position among hosts that have this local rank. */
struct hvdrun_slot {
  int host; /* index into the host list */
  int rank, size, local_rank, local_size, cross_rank, cross_size;
};

/* "h1:2,h2:4" (a host without ":N" has 1 slot). Messages name the entry. */
hvd_status hvdrun_parse_hosts(const char *text, struct hvdrun_host **out, size_t *n);
/* Lines "host slots=N" (or "host"); blank lines and '#' comments skipped. */
hvd_status hvdrun_read_hostfile(const char *path, struct hvdrun_host **out, size_t *n);
/* Assigns np ranks (-1: every slot) over the hosts. More ranks than slots
 * is HVD_ERR_INVALID_ARGUMENT. *out has *nslots entries, by rank. */
hvd_status hvdrun_assign(const struct hvdrun_host *hosts, size_t nhosts, int np,
                         struct hvdrun_slot **out, int *nslots);
/* The transport scopes the ranks of an assignment meet in, as the ranks
 * name them in a generation: "<prefix>global", "<prefix>local_<host>" and
 * "<prefix>cross_<local rank>" (prefix "g<N>." for N > 0), each with its
 * number of ranks, through fn. */
void hvdrun_each_scope(const struct hvdrun_host *hosts, const struct hvdrun_slot *slots, int size,
                       uint64_t generation,
                       void (*fn)(void *arg, const char *scope, size_t ranks), void *arg);
/* Whether the name is this machine (localhost, a local address, our hostname). */
bool hvdrun_host_is_local(const char *name);

/* ==== a Slurm allocation (allocation.c) ======================================= */

/* Whether hvdrun runs inside a Slurm allocation (salloc, sbatch). */
bool hvdrun_in_allocation(void);
/* The allocation's hosts, in Slurm's order, each with its tasks (or CPUs
 * when no tasks were asked for) as slots. Errors name the variable. */
hvd_status hvdrun_allocation_hosts(struct hvdrun_host **out, size_t *n);
struct hvdrun_argv;
/* srun's command line for one remote rank: one task on host running the
 * shell command text. */
hvd_status hvdrun_srun_argv(const char *host, const char *text, struct hvdrun_argv *argv);

/* ==== elastic hosts (discovery.c) =========================================== */

/* Parses a discovery script's output: one "host" or "host:slots" per line.
 * Whitespace around a line is trimmed and blank lines are skipped. A host
 * listed twice with the same slots counts once; with different slots it is
 * an error naming the host. Slots are 1..HVDRUN_MAX_RANKS (default_slots for
 * a bare "host"); a name is 1..HVDRUN_HOST_MAX bytes without whitespace or
 * control characters, and does not start with '-'. Hosts keep the order of
 * their first line. On success *out is malloc'ed (free() it) with *n entries;
 * no hosts at all is not an error here. HVD_ERR_INVALID_ARGUMENT names the
 * line; HVD_ERR_NO_MEMORY. */
hvd_status hvdrun_parse_discovery(const char *text, size_t len, int default_slots,
                                  struct hvdrun_host **out, size_t *n);

/* Runs the discovery script as horovodrun does, through the shell
 * (/bin/sh -c SCRIPT, so it may carry arguments), in a process group of its
 * own, with stdin /dev/null and every signal unblocked. Blocks until it
 * exits, or until timeout_ms (< 0: no limit) passes: then its group gets
 * SIGKILL and the status is HVD_ERR_TIMEOUT. Whatever the script leaves
 * running in its group when it exits is killed too. Reaps only its own child
 * (waitpid on its pid; never -1), on every path; SIGCHLD may stay blocked.
 * On success *out (malloc'ed, NUL-terminated; free() it) holds the stdout,
 * *len bytes. Non-zero exit or a signal is HVD_ERR_IO with the code and the
 * end of its stderr; more than 1 MiB of stdout is HVD_ERR_TOO_LARGE. */
hvd_status hvdrun_run_discovery(const char *script, int64_t timeout_ms, char **out, size_t *len);

/* The elastic job's view of the hosts, as Horovod's HostManager keeps it.
 * Not thread-safe: one thread owns a view. */
enum hvdrun_hosts_change {
  HVDRUN_HOSTS_SAME = 0,
  HVDRUN_HOSTS_REMOVED = 1,
  HVDRUN_HOSTS_ADDED = 2,
  HVDRUN_HOSTS_MIXED = 3
};

struct hvdrun_known_host {
  char name[HVDRUN_HOST_MAX + 1];
  int slots;     /* from the latest discovery; 0 while absent from it */
  uint64_t seen; /* when it last became usable: older hosts get lower ranks */
  bool blacklisted;
  int blacklist_count;       /* times blacklisted so far (the cooldown grows with it) */
  int64_t cooldown_until_ns; /* while blacklisted: when it ends; HVD_NO_DEADLINE: never */
};

struct hvdrun_hosts_view {
  struct hvdrun_known_host *hosts; /* sorted by seen */
  size_t n, cap;
  uint64_t next_seen;
  double cooldown_min_s, cooldown_max_s; /* 0, 0: a blacklisted host stays so */
  uint64_t rng;                          /* the cooldown's random part; seeded by init */
};

void hvdrun_hosts_view_init(struct hvdrun_hosts_view *v, double cooldown_min_s,
                            double cooldown_max_s);
/* Safe on a zeroed view. */
void hvdrun_hosts_view_fini(struct hvdrun_hosts_view *v);
/* Applies a fresh discovery at now_ns (CLOCK_MONOTONIC). First, blacklisted
 * hosts whose cooldown has ended are whitelisted. *change gets
 * HVDRUN_HOSTS_REMOVED when a usable host vanished or has fewer slots, and
 * HVDRUN_HOSTS_ADDED when a host became usable (new, back after vanishing,
 * or whitelisted and in this discovery) or a usable host has more slots.
 * A host that becomes usable again is ordered after those that stayed, as
 * Horovod does: its ranks start afresh, and rank 0 must stay on a host that
 * holds the training state. Among hosts that become usable together, the
 * discovery's order counts. HVD_OK, or HVD_ERR_NO_MEMORY with v unchanged. */
hvd_status hvdrun_hosts_view_update(struct hvdrun_hosts_view *v, const struct hvdrun_host *found,
                                    size_t n, int64_t now_ns, int *change);
/* Blacklists a host at now_ns (an unknown name is kept as absent and
 * blacklisted). With a cooldown range, the host comes back after
 * clamp(min * 2^count + U(0,1) * min, min, max) seconds, count being how many
 * times it was blacklisted before; without one, never. Blacklisting a host
 * whose blacklist is still in effect changes nothing. */
void hvdrun_hosts_view_blacklist(struct hvdrun_hosts_view *v, const char *name, int64_t now_ns);
/* Writes the usable hosts (in the latest discovery and not blacklisted),
 * oldest first, to out (at most cap; v->n always suffices); returns how many
 * it wrote. */
size_t hvdrun_hosts_view_usable(const struct hvdrun_hosts_view *v, struct hvdrun_host *out,
                                size_t cap);
/* The usable hosts' slots, summed. */
int hvdrun_hosts_view_slots(const struct hvdrun_hosts_view *v);

/* ==== output (output.c) ===================================================== */

/* Prefixes and forwards one stream of one rank, line by line; "\r" ends a
 * line too (progress bars). A partial line waits for the rest, and is
 * flushed at the end with a newline added. */
enum { HVDRUN_WAITED_MAX = 4 };

/* Why a rank's failure points at others (output.c reads it from its
 * messages; job.c names the rank at fault last). */
enum hvdrun_wait_kind {
  HVDRUN_WAIT_TIMEOUT,  /* it timed out waiting for them */
  HVDRUN_WAIT_SHUTDOWN, /* one of them ended the job with hvd_shutdown */
  HVDRUN_WAIT_FAILED,   /* one of them failed first */
};

struct hvdrun_stream {
  int rank;
  bool is_stderr;
  bool prefix, timestamp;
  FILE *out;  /* the terminal side: hvdrun's stdout or stderr */
  FILE *file; /* --output-filename's copy, or NULL (unprefixed) */
  char *line;
  size_t len, cap;
  bool after_cr; /* the last chunk ended in "\r": a "\n" next belongs to it */
  /* Global ranks this rank's failure points at, as its last message of
   * that kind names them, and why (stderr only; see output.c). */
  int waited_on[HVDRUN_WAITED_MAX];
  int nwaited;
  enum hvdrun_wait_kind wait_kind;
};

void hvdrun_stream_init(struct hvdrun_stream *s, int rank, bool is_stderr, FILE *out, FILE *file,
                        bool prefix, bool timestamp);
/* Consumes n bytes of the rank's output. */
void hvdrun_stream_feed(struct hvdrun_stream *s, const char *data, size_t n);
/* End of the stream: the partial line, if any. */
void hvdrun_stream_finish(struct hvdrun_stream *s);
void hvdrun_stream_fini(struct hvdrun_stream *s);

/* ==== the job (job.c) ======================================================= */

/* Runs the whole job over the assigned slots: store, ranks, output,
 * supervision. Returns the exit code hvdrun should exit with. */
int hvdrun_run(const struct hvdrun_options *o, const struct hvdrun_host *hosts, size_t nhosts,
               const struct hvdrun_slot *slots, int size);

/* ==== commands (command.c) ================================================== */

/* "K=V" strings, grown as needed; set() replaces an earlier K. */
struct hvdrun_env {
  char **vars;
  size_t n, cap;
};

hvd_status hvdrun_env_set(struct hvdrun_env *e, const char *name, const char *fmt, ...)
    HVD_PRINTF(3, 4);
/* Adds "K=V" (replacing an earlier K). */
hvd_status hvdrun_env_put(struct hvdrun_env *e, const char *kv);
/* A NULL-terminated copy of the pointers, for execve (the strings stay e's). */
char **hvdrun_env_array(const struct hvdrun_env *e);
void hvdrun_env_fini(struct hvdrun_env *e);

/* An argument vector, always NULL-terminated (v is NULL while empty). */
struct hvdrun_argv {
  char **v;
  size_t n, cap;
};
hvd_status hvdrun_argv_add(struct hvdrun_argv *a, const char *arg);
void hvdrun_argv_fini(struct hvdrun_argv *a);

/* Appends text to the growing string *out (*len bytes of *cap), as is or
 * quoted for a POSIX shell ('...', with '\'' for a quote inside). */
hvd_status hvdrun_append(char **out, size_t *len, size_t *cap, const char *text);
hvd_status hvdrun_shell_quote(const char *text, char **out, size_t *len, size_t *cap);

#endif
