/*
 * hvdrun's command line, with horovodrun's names where it has them.
 *
 * DESIGN. A table of spellings, matched exactly (no abbreviations: "-np"
 * is not "-n" "-p", and "-p" is not a prefix of a long option). A value
 * follows as the next argument or after '='; --blacklist-cooldown-range
 * takes the next two. The command starts at the first argument that is not
 * an option, or after "--". Every mistake is one line naming the argument;
 * main exits 2 on it. Elastic mode, as horovodrun decides it: on with
 * --min-np or --host-discovery-script; its other flags are errors without
 * it rather than silently ignored. Of horovodrun's controller flags,
 * --gloo names what hvd always does and --mpi what it cannot.
 *
 * A switch has an "on" and an "off" spelling (--autotune, --no-autotune);
 * each passes its value, "1" or "0", as an option with a value would.
 * --config-file's settings (config.c) arrive the same way, as the flag
 * with the same effect and its value, after the whole command line: a
 * setting the command line gave, under any spelling and wherever
 * --config-file stands, is left as it is (horovodrun's rule in its code;
 * its --help says otherwise). The file's values go through the same
 * checks, and their messages name the file, line and key instead of the
 * flag.
 */
#include <stdlib.h>
#include <string.h>

#include "tune/tune.h"
#include "hvdrun.h"

enum opt {
  O_NP, O_HOSTS, O_HOSTFILE, O_SSH_PORT, O_SSH_IDENTITY, O_SSH_COMMAND, O_IFACE, O_START_TIMEOUT,
  O_RDZV_PORT, O_OUTPUT, O_TIMESTAMP, O_NO_PREFIX, O_VERBOSE, O_LOG_LEVEL, O_TIMELINE, O_FUSION,
  O_CYCLE, O_CACHE, O_HIER_ALLREDUCE, O_HIER_ALLGATHER, O_GLOO_TIMEOUT, O_EXPORT, O_MIN_NP,
  O_MAX_NP, O_DISCOVERY, O_SLOTS, O_ELASTIC_TIMEOUT, O_RESET_LIMIT, O_COOLDOWN, O_HOROVOD_COMPAT,
  O_GLOO, O_MPI, O_MARK_CYCLES, O_LOG_HIDE_TIME, O_STALL_CHECK, O_STALL_WARN, O_STALL_SHUTDOWN,
  O_AUTOTUNE, O_AUTOTUNE_LOG, O_AUTOTUNE_WARMUP, O_AUTOTUNE_STEPS, O_AUTOTUNE_MAX_SAMPLES,
  O_AUTOTUNE_NOISE, O_DISABLE_CACHE, O_CONFIG, O_CHECK_BUILD, O_VERSION, O_JSRUN, O_HELP
};
enum { OPT_COUNT = O_HELP + 1 };

static const struct spelling {
  const char *name;
  enum opt id;
  int values;      /* how many arguments follow */
  const char *set; /* a switch's value: "1" or "0" */
} SPELLINGS[] = {
    {"-np", O_NP, 1, NULL},
    {"--num-proc", O_NP, 1, NULL},
    {"-H", O_HOSTS, 1, NULL},
    {"--hosts", O_HOSTS, 1, NULL},
    {"--hostfile", O_HOSTFILE, 1, NULL},
    {"-hostfile", O_HOSTFILE, 1, NULL},
    {"-p", O_SSH_PORT, 1, NULL},
    {"--ssh-port", O_SSH_PORT, 1, NULL},
    {"-i", O_SSH_IDENTITY, 1, NULL},
    {"--ssh-identity-file", O_SSH_IDENTITY, 1, NULL},
    {"--ssh-command", O_SSH_COMMAND, 1, NULL},
    {"--network-interface", O_IFACE, 1, NULL},
    {"--start-timeout", O_START_TIMEOUT, 1, NULL},
    {"--rendezvous-port", O_RDZV_PORT, 1, NULL},
    {"--output-filename", O_OUTPUT, 1, NULL},
    {"--prefix-output-with-timestamp", O_TIMESTAMP, 0, NULL},
    {"-prefix-timestamp", O_TIMESTAMP, 0, NULL},
    {"--disable-output-prefix", O_NO_PREFIX, 0, NULL},
    {"--verbose", O_VERBOSE, 0, NULL},
    {"--log-level", O_LOG_LEVEL, 1, NULL},
    {"--timeline-filename", O_TIMELINE, 1, NULL},
    {"--fusion-threshold-mb", O_FUSION, 1, NULL},
    {"--cycle-time-ms", O_CYCLE, 1, NULL},
    {"--cache-capacity", O_CACHE, 1, NULL},
    {"--hierarchical-allreduce", O_HIER_ALLREDUCE, 0, "1"},
    {"--no-hierarchical-allreduce", O_HIER_ALLREDUCE, 0, "0"},
    {"--hierarchical-allgather", O_HIER_ALLGATHER, 0, "1"},
    {"--no-hierarchical-allgather", O_HIER_ALLGATHER, 0, "0"},
    {"--timeline-mark-cycles", O_MARK_CYCLES, 0, "1"},
    {"--no-timeline-mark-cycles", O_MARK_CYCLES, 0, "0"},
    {"--log-without-timestamp", O_LOG_HIDE_TIME, 0, "1"},
    {"--log-hide-timestamp", O_LOG_HIDE_TIME, 0, "1"},
    {"--log-with-timestamp", O_LOG_HIDE_TIME, 0, "0"},
    {"--stall-check", O_STALL_CHECK, 0, "1"},
    {"--no-stall-check", O_STALL_CHECK, 0, "0"},
    {"--stall-check-warning-time-seconds", O_STALL_WARN, 1, NULL},
    {"--stall-check-shutdown-time-seconds", O_STALL_SHUTDOWN, 1, NULL},
    {"--autotune", O_AUTOTUNE, 0, "1"},
    {"--no-autotune", O_AUTOTUNE, 0, "0"},
    {"--autotune-log-file", O_AUTOTUNE_LOG, 1, NULL},
    {"--autotune-warmup-samples", O_AUTOTUNE_WARMUP, 1, NULL},
    {"--autotune-steps-per-sample", O_AUTOTUNE_STEPS, 1, NULL},
    {"--autotune-bayes-opt-max-samples", O_AUTOTUNE_MAX_SAMPLES, 1, NULL},
    {"--autotune-gaussian-process-noise", O_AUTOTUNE_NOISE, 1, NULL},
    {"--disable-cache", O_DISABLE_CACHE, 0, NULL},
    {"--config-file", O_CONFIG, 1, NULL},
    {"-cb", O_CHECK_BUILD, 0, NULL},
    {"--check-build", O_CHECK_BUILD, 0, NULL},
    {"--gloo-timeout-seconds", O_GLOO_TIMEOUT, 1, NULL},
    {"-x", O_EXPORT, 1, NULL},
    {"--min-np", O_MIN_NP, 1, NULL},
    {"--min-num-proc", O_MIN_NP, 1, NULL},
    {"--max-np", O_MAX_NP, 1, NULL},
    {"--max-num-proc", O_MAX_NP, 1, NULL},
    {"--host-discovery-script", O_DISCOVERY, 1, NULL},
    {"--slots-per-host", O_SLOTS, 1, NULL},
    {"--slots", O_SLOTS, 1, NULL},
    {"--elastic-timeout", O_ELASTIC_TIMEOUT, 1, NULL},
    {"--reset-limit", O_RESET_LIMIT, 1, NULL},
    {"--blacklist-cooldown-range", O_COOLDOWN, 2, NULL},
    {"--horovod-compat", O_HOROVOD_COMPAT, 0, NULL},
    {"--gloo", O_GLOO, 0, NULL},
    {"--mpi", O_MPI, 0, NULL},
    {"--jsrun", O_JSRUN, 0, NULL},
    {"-v", O_VERSION, 0, NULL},
    {"--version", O_VERSION, 0, NULL},
    {"-h", O_HELP, 0, NULL},
    {"--help", O_HELP, 0, NULL},
};

void hvdrun_usage(FILE *out) {
  fputs(
      "usage: hvdrun [options] [--] COMMAND [ARGS...]\n"
      "\n"
      "Starts the ranks of an hvd job on this host and others (over ssh), serves\n"
      "their rendezvous store, prefixes their output and stops the whole job when\n"
      "a rank fails.\n"
      "\n"
      "Ranks and hosts:\n"
      "  -np, --num-proc N           ranks to start (default: every slot; at most the slots)\n"
      "  -H, --hosts H:N,H:N         hosts and their slots (default localhost:<np>)\n"
      "  --hostfile FILE             lines 'host slots=N'; '#' starts a comment\n"
      "  -p, --ssh-port PORT         ssh port of the remote hosts\n"
      "  -i, --ssh-identity-file F   ssh private key\n"
      "  --ssh-command CMD           remote shell instead of ssh, run as CMD HOST COMMAND\n"
      "                              (e.g. a wrapper around 'kubectl exec')\n"
      "  --network-interface SPEC    interfaces the ranks use (HOROVOD_GLOO_IFACE:\n"
      "                              names, prefixes, '^' to exclude; comma list)\n"
      "  --start-timeout S           seconds for every rank to reach the store\n"
      "                              (HOROVOD_START_TIMEOUT, default 30)\n"
      "  --rendezvous-port PORT      the store's port (default: any free port)\n"
      "\n"
      "Output:\n"
      "  --output-filename DIR       also write DIR/rank.N/stdout and stderr\n"
      "  --prefix-output-with-timestamp\n"
      "                              put the time before each line's prefix\n"
      "  --disable-output-prefix     pass lines through without '[rank]<stdout>:'\n"
      "  --verbose                   say what hvdrun does (commands, store, exits)\n"
      "  --log-level LEVEL           the ranks' HOROVOD_LOG_LEVEL\n"
      "                              (trace debug info warning error fatal)\n"
      "  --log-without-timestamp     HOROVOD_LOG_HIDE_TIME=1: no time in the ranks' log\n"
      "                              lines (also --log-hide-timestamp;\n"
      "                              --log-with-timestamp: 0)\n"
      "\n"
      "Tuning (handed to the ranks as HOROVOD_* variables):\n"
      "  --timeline-filename FILE    HOROVOD_TIMELINE: rank 0 writes a Chrome trace\n"
      "  --timeline-mark-cycles      HOROVOD_TIMELINE_MARK_CYCLES=1 (needs a timeline;\n"
      "                              --no-timeline-mark-cycles: off)\n"
      "  --fusion-threshold-mb MB    HOROVOD_FUSION_THRESHOLD (default 128; 0: off)\n"
      "  --cycle-time-ms MS          HOROVOD_CYCLE_TIME (default 1)\n"
      "  --cache-capacity N          HOROVOD_CACHE_CAPACITY (default 1024; 0: off)\n"
      "  --hierarchical-allreduce    HOROVOD_HIERARCHICAL_ALLREDUCE=1\n"
      "  --hierarchical-allgather    HOROVOD_HIERARCHICAL_ALLGATHER=1\n"
      "  --no-hierarchical-allreduce, --no-hierarchical-allgather\n"
      "                              off, whatever the config file says\n"
      "  --gloo-timeout-seconds S    HOROVOD_GLOO_TIMEOUT_SECONDS (default 30)\n"
      "  --no-stall-check            HOROVOD_STALL_CHECK_DISABLE=1: no stall warnings\n"
      "                              (--stall-check: 0)\n"
      "  --stall-check-warning-time-seconds S\n"
      "                              HOROVOD_STALL_CHECK_TIME_SECONDS: warn when ranks\n"
      "                              have waited S for the others (default 60)\n"
      "  --stall-check-shutdown-time-seconds S\n"
      "                              HOROVOD_STALL_SHUTDOWN_TIME_SECONDS: stop the job\n"
      "                              after S (default 0: never; must exceed the warning\n"
      "                              time)\n"
      "  --autotune                  HOROVOD_AUTOTUNE=1: tune fusion and cycle time as\n"
      "                              the job runs (--no-autotune: off); the flags\n"
      "                              below reach the ranks only with it\n"
      "  --autotune-log-file FILE    HOROVOD_AUTOTUNE_LOG: rank 0's CSV of the samples\n"
      "  --autotune-warmup-samples N HOROVOD_AUTOTUNE_WARMUP_SAMPLES (default 3)\n"
      "  --autotune-steps-per-sample N\n"
      "                              HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE (default 10)\n"
      "  --autotune-bayes-opt-max-samples N\n"
      "                              HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES (default 20)\n"
      "  --autotune-gaussian-process-noise X\n"
      "                              HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE, 0 to 1\n"
      "                              (default 0.8)\n"
      "  --config-file FILE          horovodrun's YAML config file (params, autotune,\n"
      "                              timeline, stall_check, library_options, logging);\n"
      "                              the command line's flags win over it\n"
      "  -x VAR[=VALUE]              export VAR (hvdrun's value, or VALUE) to every rank;\n"
      "                              repeatable\n"
      "\n"
      "Elastic (ranks may come and go; the job goes on while enough remain):\n"
      "  --min-np, --min-num-proc N  fewest ranks to run with (default: -np);\n"
      "                              turns elastic mode on\n"
      "  --max-np, --max-num-proc N  most ranks to grow to (default: no limit)\n"
      "  --host-discovery-script CMD\n"
      "                              prints the usable hosts, a 'host' or 'host:slots'\n"
      "                              per line; run through /bin/sh, again and again;\n"
      "                              turns elastic mode on (not with -H or --hostfile)\n"
      "  --slots-per-host, --slots N slots of a 'host' line without ':slots' (default 1)\n"
      "  --elastic-timeout S         seconds to wait for --min-np slots to be there\n"
      "                              (HOROVOD_ELASTIC_TIMEOUT, default 600)\n"
      "  --reset-limit N             allow at most N resets, then stop the job\n"
      "                              (default: no limit)\n"
      "  --blacklist-cooldown-range MIN MAX\n"
      "                              let a failed host back after MIN to MAX seconds,\n"
      "                              longer each time it fails (1 to 3600; default:\n"
      "                              never)\n"
      "\n"
      "Python (hvd's own package goes first on the ranks' PYTHONPATH):\n"
      "  --horovod-compat            put hvd's 'horovod' compatibility tree before it,\n"
      "                              so that 'import horovod.torch' gets hvd\n"
      "                              (and set HVD_HOROVOD_COMPAT=1)\n"
      "  --gloo                      accepted and ignored: hvd is always horovodrun's\n"
      "                              Gloo path\n"
      "  --mpi                       refused: hvd has no MPI\n"
      "  --jsrun                     refused: hvdrun starts the ranks itself (no jsrun)\n"
      "\n"
      "This build:\n"
      "  -cb, --check-build          print what this build has (frameworks, controllers,\n"
      "                              tensor operations), as horovodrun does, and exit\n"
      "  --disable-cache             accepted and ignored: hvdrun keeps no cache of host\n"
      "                              checks between runs (horovodrun's ~/.horovod)\n"
      "\n"
      "  -v, --version               print hvd's version and exit\n"
      "  -h, --help                  this text\n"
      "\n"
      "Exit code: 0 when every rank exits 0; the failing rank's code (128+signal\n"
      "when killed) when one fails; 2 for a bad command line; 1 otherwise.\n",
      out);
}

/* A whole decimal integer in [lo, hi]. */
static bool int_in(const char *text, long lo, long hi, int *out) {
  char *end;
  long v;
  if (text == NULL || *text == '\0')
    return false;
  v = strtol(text, &end, 10);
  if (*end != '\0' || v < lo || v > hi)
    return false;
  *out = (int)v;
  return true;
}

/* A decimal number >= 0 (the knobs' values go to the ranks as text). */
static bool number_ok(const char *text) {
  char *end;
  double v;
  if (text == NULL || *text == '\0')
    return false;
  v = strtod(text, &end);
  return *end == '\0' && v >= 0 && v < 1e15;
}

/* A decimal number in [lo, hi]. */
static bool number_in(const char *text, double lo, double hi) {
  char *end;
  double v;
  if (text == NULL || *text == '\0')
    return false;
  v = strtod(text, &end);
  return *end == '\0' && v >= lo && v <= hi;
}

/* Seconds for the cooldown range: a plain decimal ("30", "1.5"), 1 to 3600. */
static bool seconds_ok(const char *text, double *out) {
  size_t whole = strspn(text, "0123456789"), frac = 0;
  if (text[whole] == '.')
    frac = strspn(text + whole + 1, "0123456789");
  if (whole + frac == 0 || text[whole + (text[whole] == '.' ? 1 + frac : 0)] != '\0')
    return false;
  double v = strtod(text, NULL);
  if (v < 1 || v > 3600)
    return false;
  *out = v;
  return true;
}

static const struct spelling *lookup(const char *arg, const char **value) {
  const char *eq = strchr(arg, '=');
  size_t len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);

  for (size_t i = 0; i < HVD_ARRAY_SIZE(SPELLINGS); i++) {
    if (strlen(SPELLINGS[i].name) == len && strncmp(SPELLINGS[i].name, arg, len) == 0) {
      *value = eq != NULL ? eq + 1 : NULL;
      return &SPELLINGS[i];
    }
  }
  return NULL;
}

/* v2: the second value, for the one option that takes two. */
static hvd_status apply(struct hvdrun_options *o, const struct spelling *sp, const char *v,
                        const char *v2) {
  switch (sp->id) {
  case O_NP:
    if (!int_in(v, 1, HVDRUN_MAX_RANKS, &o->np))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a number of ranks (1 to %d)",
                       sp->name, v, HVDRUN_MAX_RANKS);
    break;
  case O_HOSTS:
    o->hosts = v;
    break;
  case O_HOSTFILE:
    o->hostfile = v;
    break;
  case O_SSH_PORT:
    if (!int_in(v, 1, 65535, &o->ssh_port))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a port (1 to 65535)", sp->name,
                       v);
    break;
  case O_SSH_IDENTITY:
    o->ssh_identity = v;
    break;
  case O_SSH_COMMAND:
    if (*v == '\0')
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: empty command", sp->name);
    o->ssh_command = v;
    break;
  case O_IFACE:
    if (*v == '\0')
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: empty interface spec", sp->name);
    o->iface = v;
    break;
  case O_START_TIMEOUT:
    if (!int_in(v, 1, 86400, &o->start_timeout_s))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a number of seconds (1 to 86400)",
                       sp->name, v);
    break;
  case O_RDZV_PORT:
    if (!int_in(v, 1, 65535, &o->rendezvous_port))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a port (1 to 65535)", sp->name,
                       v);
    break;
  case O_OUTPUT:
    if (*v == '\0')
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: empty directory name", sp->name);
    o->output_dir = v;
    break;
  case O_TIMESTAMP:
    o->timestamp = true;
    break;
  case O_NO_PREFIX:
    o->prefix = false;
    break;
  case O_VERBOSE:
    o->verbose = true;
    break;
  case O_LOG_LEVEL: {
    enum hvd_log_level level;
    if (hvd_log_parse_level(v, &level) != HVD_OK)
      return hvd_error_prefix("%s", sp->name);
    o->log_level = v;
    break;
  }
  case O_TIMELINE:
    o->timeline = v;
    break;
  case O_CACHE:
  case O_GLOO_TIMEOUT: {
    int n;
    /* The ranks' limits: 2^20 cache entries (HOROVOD_CACHE_CAPACITY), a
     * week (HOROVOD_GLOO_TIMEOUT_SECONDS). */
    if (!int_in(v, sp->id == O_CACHE ? 0 : 1, sp->id == O_CACHE ? 1048576 : 604800, &n))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a whole number%s", sp->name, v,
                       sp->id == O_CACHE ? " from 0 to 1048576" : " from 1 to 604800");
    if (sp->id == O_CACHE)
      o->cache_capacity = v;
    else
      o->gloo_timeout_s = v;
    break;
  }
  case O_FUSION:
  case O_CYCLE:
    if (!number_ok(v))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a number >= 0", sp->name, v);
    if (sp->id == O_CYCLE && !number_in(v, 0, 60000)) /* the ranks' HOROVOD_CYCLE_TIME */
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is more than 60000 ms", sp->name, v);
    if (sp->id == O_FUSION)
      o->fusion_mb = v;
    else
      o->cycle_ms = v;
    break;
  case O_HIER_ALLREDUCE:
    o->hier_allreduce = v[0] == '1';
    break;
  case O_HIER_ALLGATHER:
    o->hier_allgather = v[0] == '1';
    break;
  case O_MARK_CYCLES:
    o->timeline_mark_cycles = v[0] == '1';
    break;
  case O_LOG_HIDE_TIME:
    o->log_hide_time = v[0] == '1';
    break;
  case O_STALL_CHECK:
    o->stall_check = v[0] == '1' ? 1 : -1;
    break;
  case O_STALL_WARN:
    /* The ranks refuse 0 (HOROVOD_STALL_CHECK_TIME_SECONDS): it is no threshold. */
    if (!number_in(v, 0.001, 1e7))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s: '%s' is not a number of seconds from 0.001 to 10000000 (to turn the "
                       "stall check off, use --no-stall-check)",
                       sp->name, v);
    o->stall_warn_s = v;
    break;
  case O_STALL_SHUTDOWN:
    if (!number_in(v, 0, 1e7))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s: '%s' is not a number of seconds from 0 (never) to 10000000", sp->name,
                       v);
    o->stall_shutdown_s = v;
    break;
  case O_AUTOTUNE:
    o->autotune = v[0] == '1';
    break;
  case O_AUTOTUNE_LOG:
    if (*v == '\0')
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: empty file name", sp->name);
    o->autotune_log = v;
    break;
  case O_AUTOTUNE_WARMUP:
  case O_AUTOTUNE_STEPS:
  case O_AUTOTUNE_MAX_SAMPLES: {
    /* The ranks' limits (src/coord/tuner.c), so that a bad value stops here. */
    int n, lo = sp->id == O_AUTOTUNE_STEPS ? 1 : 0;
    int hi = sp->id == O_AUTOTUNE_MAX_SAMPLES ? TUNE_MAX_SAMPLES : 1000000;
    if (!int_in(v, lo, hi, &n))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a whole number from %d to %d",
                       sp->name, v, lo, hi);
    if (sp->id == O_AUTOTUNE_WARMUP)
      o->autotune_warmup = v;
    else if (sp->id == O_AUTOTUNE_STEPS)
      o->autotune_steps = v;
    else
      o->autotune_max_samples = v;
    break;
  }
  case O_AUTOTUNE_NOISE:
    if (!number_in(v, 0, 1))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a number from 0 to 1", sp->name,
                       v);
    o->autotune_noise = v;
    break;
  case O_DISABLE_CACHE: /* horovodrun's cache of host checks (~/.horovod); hvdrun has none */
    break;
  case O_CONFIG:
    if (*v == '\0')
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: empty file name", sp->name);
    o->config_file = v;
    break;
  case O_CHECK_BUILD:
    o->check_build = true;
    break;
  case O_VERSION:
    o->version = true;
    break;
  case O_JSRUN:
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "--jsrun: hvd does not launch through jsrun (IBM Spectrum LSF); hvdrun "
                     "starts the ranks itself, locally or over ssh (-H, --hostfile)");
  case O_EXPORT: {
    size_t name = strcspn(v, "=");
    const char **grown;
    if (name == 0)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "-x: '%s' does not start with a variable name",
                       v);
    for (size_t i = 0; i < name; i++) {
      char c = v[i];
      if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
            (i > 0 && c >= '0' && c <= '9')))
        return hvd_error(HVD_ERR_INVALID_ARGUMENT, "-x: '%.*s' is not a variable name", (int)name,
                         v);
    }
    grown = realloc(o->exports, (o->nexports + 1) * sizeof(*grown));
    if (grown == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "-x: out of memory");
    o->exports = grown;
    o->exports[o->nexports++] = v;
    break;
  }
  case O_MIN_NP:
  case O_MAX_NP: {
    int *field = sp->id == O_MIN_NP ? &o->min_np : &o->max_np;
    if (!int_in(v, 1, HVDRUN_MAX_RANKS, field))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a number of ranks (1 to %d)",
                       sp->name, v, HVDRUN_MAX_RANKS);
    break;
  }
  case O_DISCOVERY:
    if (*v == '\0')
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: empty script name", sp->name);
    o->discovery_script = v;
    break;
  case O_SLOTS:
    if (!int_in(v, 1, HVDRUN_MAX_RANKS, &o->slots_per_host))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a number of slots (1 to %d)",
                       sp->name, v, HVDRUN_MAX_RANKS);
    break;
  case O_ELASTIC_TIMEOUT:
    if (!int_in(v, 1, 86400, &o->elastic_timeout_s))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a number of seconds (1 to 86400)",
                       sp->name, v);
    break;
  case O_RESET_LIMIT:
    if (!int_in(v, 0, 1000000000, &o->reset_limit))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a whole number >= 0", sp->name,
                       v);
    break;
  case O_COOLDOWN:
    if (!seconds_ok(v, &o->cooldown_min_s))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s: MIN '%s' is not a number of seconds from 1 to 3600", sp->name, v);
    if (!seconds_ok(v2, &o->cooldown_max_s))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s: MAX '%s' is not a number of seconds from 1 to 3600", sp->name, v2);
    if (o->cooldown_min_s > o->cooldown_max_s)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: MIN %s is more than MAX %s", sp->name, v,
                       v2);
    break;
  case O_HOROVOD_COMPAT:
    o->horovod_compat = true;
    break;
  case O_GLOO: /* horovodrun's choice of controller; hvd's is always that one */
    break;
  case O_MPI:
    if (sp->name[0] != '-') /* the config file's controller: mpi */
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s is mpi, but hvd has no MPI; write controller: gloo, or leave the "
                       "key out",
                       sp->name);
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "--mpi: hvd has no MPI; drop --mpi (hvd's own controller and TCP "
                     "collectives are horovodrun's --gloo path)");
  case O_HELP:
    break;
  }
  return HVD_OK;
}

hvd_status hvdrun_elastic_timeout_from_env(int *seconds) {
  int64_t timeout;
  hvd_status st = hvd_env_int("HOROVOD_ELASTIC_TIMEOUT", 600, 1, 86400, &timeout);
  if (st == HVD_OK)
    *seconds = (int)timeout;
  return st;
}

/* The elastic flags, once parsing is done. only_elastic: the first flag
 * given that means something in elastic mode only (NULL: none). */
static hvd_status check_elastic(struct hvdrun_options *o, const char *only_elastic,
                                const char *slots_flag, bool timeout_given) {
  if (o->discovery_script != NULL && (o->hosts != NULL || o->hostfile != NULL))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "--host-discovery-script and %s exclude each other (one source of hosts)",
                     o->hosts != NULL ? "-H" : "--hostfile");
  o->elastic = o->min_np > 0 || o->discovery_script != NULL;
  if (!o->elastic) {
    if (only_elastic != NULL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s is for elastic mode: add --min-np or --host-discovery-script",
                       only_elastic);
    return HVD_OK;
  }
  if (slots_flag != NULL && o->discovery_script == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s applies to --host-discovery-script's output; with -H or --hostfile give "
                     "the slots there",
                     slots_flag);
  if (o->np < 0 && o->min_np < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "elastic mode needs -np or --min-np");
  if (o->min_np < 0)
    o->min_np = o->np;
  if (o->np < 0)
    o->np = o->min_np;
  if (o->min_np > o->np)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "--min-np %d is more than -np %d", o->min_np,
                     o->np);
  if (o->max_np > 0 && o->max_np < o->np)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "--max-np %d is less than -np %d", o->max_np,
                     o->np);
  if (!timeout_given)
    return hvdrun_elastic_timeout_from_env(&o->elastic_timeout_s);
  return HVD_OK;
}

/* What hvdrun_parse keeps while it reads the command line and the config file. */
struct parse_state {
  struct hvdrun_options *o;
  const char *given[OPT_COUNT]; /* the spelling the command line used; NULL: none */
};

/* A config file's setting, unless the command line gave one. */
static hvd_status from_file_cb(void *arg, const char *flag, const char *value,
                               const char *where) {
  struct parse_state *ps = arg;
  struct hvdrun_options *o = ps->o;
  const char *ignored;
  const struct spelling *sp = lookup(flag, &ignored);
  struct spelling labelled;
  char *copy = NULL, **grown;

  if (sp == NULL)
    return hvd_error(HVD_ERR_INTERNAL, "%s: hvdrun has no flag %s for it", where, flag);
  if (ps->given[sp->id] != NULL)
    return HVD_OK;
  /* --gloo and --mpi both answer the file's controller (as in horovodrun). */
  if ((sp->id == O_GLOO || sp->id == O_MPI) && (ps->given[O_GLOO] || ps->given[O_MPI]))
    return HVD_OK;
  if (value != NULL) {
    grown = realloc(o->owned, (o->nowned + 1) * sizeof(*grown));
    if (grown == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory", where);
    o->owned = grown;
    if ((copy = hvd_strndup(value, strlen(value))) == NULL)
      return hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory", where);
    o->owned[o->nowned++] = copy;
  }
  labelled = *sp;
  labelled.name = where;
  return apply(o, &labelled, copy, NULL);
}

/* Flags of the command line that mean nothing without another setting
 * (which may come from the config file): errors, not silently dropped. */
static hvd_status check_needs(const struct hvdrun_options *o, const struct parse_state *ps) {
  static const enum opt autotune_parts[] = {O_AUTOTUNE_LOG, O_AUTOTUNE_WARMUP, O_AUTOTUNE_STEPS,
                                            O_AUTOTUNE_MAX_SAMPLES, O_AUTOTUNE_NOISE};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(autotune_parts) && !o->autotune; i++) {
    if (ps->given[autotune_parts[i]] != NULL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s applies to autotuning: add --autotune (or autotune: enabled: true in "
                       "the config file)",
                       ps->given[autotune_parts[i]]);
  }
  if (o->timeline_mark_cycles && o->timeline == NULL && ps->given[O_MARK_CYCLES] != NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "--timeline-mark-cycles marks the timeline: add --timeline-filename FILE");
  return HVD_OK;
}

hvd_status hvdrun_parse(int argc, char **argv, struct hvdrun_options *o, bool *help) {
  struct parse_state ps = {o, {NULL}};
  const char *only_elastic = NULL, *slots_flag = NULL;
  bool timeout_given = false;
  hvd_status st;
  int i = 1;

  memset(o, 0, sizeof(*o));
  o->np = -1;
  o->prefix = true;
  o->start_timeout_s = 30;
  o->ssh_command = "ssh";
  o->min_np = -1;
  o->max_np = -1;
  o->slots_per_host = 1;
  o->elastic_timeout_s = 600;
  o->reset_limit = -1;
  *help = false;
  if (getenv("HOROVOD_START_TIMEOUT") != NULL &&
      !int_in(getenv("HOROVOD_START_TIMEOUT"), 1, 86400, &o->start_timeout_s))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_START_TIMEOUT='%s' is not a number of seconds (1 to 86400)",
                     getenv("HOROVOD_START_TIMEOUT"));
  while (i < argc) {
    const char *arg = argv[i], *value, *value2 = NULL;
    const struct spelling *sp;
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (arg[0] != '-' || arg[1] == '\0')
      break; /* the command */
    if ((sp = lookup(arg, &value)) == NULL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "unknown option '%s' (see hvdrun --help)", arg);
    if (sp->id == O_HELP) {
      *help = true;
      return HVD_OK;
    }
    if (sp->values == 0 && value != NULL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s takes no value", sp->name);
    if (sp->values == 2) {
      if (value != NULL)
        return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                         "%s takes two separate values, without '=': %s MIN MAX", sp->name,
                         sp->name);
      if (i + 2 >= argc)
        return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s needs two values: %s MIN MAX", sp->name,
                         sp->name);
      value = argv[++i];
      value2 = argv[++i];
    } else if (sp->values == 1 && value == NULL) {
      if (i + 1 >= argc)
        return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s needs a value", sp->name);
      value = argv[++i];
    } else if (sp->values == 0) {
      value = sp->set;
    }
    if ((st = apply(o, sp, value, value2)) != HVD_OK)
      return st;
    ps.given[sp->id] = sp->name;
    if (only_elastic == NULL && (sp->id == O_MAX_NP || sp->id == O_SLOTS ||
                                 sp->id == O_ELASTIC_TIMEOUT || sp->id == O_RESET_LIMIT ||
                                 sp->id == O_COOLDOWN))
      only_elastic = sp->name;
    if (sp->id == O_SLOTS)
      slots_flag = sp->name;
    if (sp->id == O_ELASTIC_TIMEOUT)
      timeout_given = true;
    i++;
  }
  if (o->config_file != NULL &&
      (st = hvdrun_config_read(o->config_file, stderr, from_file_cb, &ps)) != HVD_OK)
    return st;
  if ((st = check_needs(o, &ps)) != HVD_OK)
    return st;
  o->command = argv + i;
  o->ncommand = argc - i;
  if (o->check_build || o->version)
    return HVD_OK; /* it runs nothing: no command or hosts to check */
  if (i >= argc)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "no command to run (hvdrun [options] [--] COMMAND [ARGS...])");
  if (o->hosts != NULL && o->hostfile != NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "-H and --hostfile exclude each other");
  return check_elastic(o, only_elastic, slots_flag, timeout_given);
}

void hvdrun_options_fini(struct hvdrun_options *o) {
  for (size_t i = 0; i < o->nowned; i++)
    free(o->owned[i]);
  free(o->owned);
  free(o->exports);
  free(o->pythonpath);
  o->owned = NULL;
  o->nowned = 0;
  o->exports = NULL;
  o->nexports = 0;
  o->pythonpath = NULL;
}
