/* hvdrun's pieces: options, hosts and slots, rank environments, spawning,
 * output forwarding and supervision. Only hvdrun and its tests use them. */
#ifndef HVD_LAUNCHER_HVDRUN_H
#define HVD_LAUNCHER_HVDRUN_H

#include <stdbool.h>
#include <stddef.h>
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
  const char *iface;       /* --network-interface */
  int start_timeout_s;     /* --start-timeout (HOROVOD_START_TIMEOUT, 30) */
  int rendezvous_port;     /* --rendezvous-port; 0: ephemeral */
  const char *output_dir;  /* --output-filename */
  bool timestamp;          /* --prefix-output-with-timestamp */
  bool prefix;             /* false with --disable-output-prefix */
  bool verbose;
  /* Knobs handed to the ranks as HOROVOD_* variables; NULL: not given. */
  const char *log_level, *timeline, *fusion_mb, *cycle_ms, *cache_capacity, *gloo_timeout_s;
  bool hier_allreduce, hier_allgather;
  const char **exports; /* -x VAR or VAR=value */
  size_t nexports;
  char **command;       /* after the options (or --) */
  int ncommand;
};

/* Parses argv. HVD_OK, or HVD_ERR_INVALID_ARGUMENT with a one-line message;
 * *help set when --help was asked (nothing else is checked then). */
hvd_status hvdrun_parse(int argc, char **argv, struct hvdrun_options *o, bool *help);
void hvdrun_options_fini(struct hvdrun_options *o);
void hvdrun_usage(FILE *out);

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
/* Whether the name is this machine (localhost, a local address, our hostname). */
bool hvdrun_host_is_local(const char *name);

/* ==== output (output.c) ===================================================== */

/* Prefixes and forwards one stream of one rank, line by line; "\r" ends a
 * line too (progress bars). A partial line waits for the rest, and is
 * flushed at the end with a newline added. */
struct hvdrun_stream {
  int rank;
  bool is_stderr;
  bool prefix, timestamp;
  FILE *out;  /* the terminal side: hvdrun's stdout or stderr */
  FILE *file; /* --output-filename's copy, or NULL (unprefixed) */
  char *line;
  size_t len, cap;
  bool after_cr; /* the last chunk ended in "\r": a "\n" next belongs to it */
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
