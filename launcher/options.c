/*
 * hvdrun's command line, with horovodrun's names where it has them.
 *
 * DESIGN. A table of spellings, matched exactly (no abbreviations: "-np"
 * is not "-n" "-p", and "-p" is not a prefix of a long option). A value
 * follows as the next argument or after '='. The command starts at the
 * first argument that is not an option, or after "--". Every mistake is
 * one line naming the argument; main exits 2 on it.
 */
#include <stdlib.h>
#include <string.h>

#include "hvdrun.h"

enum opt {
  O_NP, O_HOSTS, O_HOSTFILE, O_SSH_PORT, O_SSH_IDENTITY, O_SSH_COMMAND, O_IFACE, O_START_TIMEOUT,
  O_RDZV_PORT, O_OUTPUT, O_TIMESTAMP, O_NO_PREFIX, O_VERBOSE, O_LOG_LEVEL, O_TIMELINE, O_FUSION,
  O_CYCLE, O_CACHE, O_HIER_ALLREDUCE, O_HIER_ALLGATHER, O_GLOO_TIMEOUT, O_EXPORT, O_HELP
};

static const struct spelling {
  const char *name;
  enum opt id;
  bool value;
} SPELLINGS[] = {
    {"-np", O_NP, true},
    {"--num-proc", O_NP, true},
    {"-H", O_HOSTS, true},
    {"--hosts", O_HOSTS, true},
    {"--hostfile", O_HOSTFILE, true},
    {"-hostfile", O_HOSTFILE, true},
    {"-p", O_SSH_PORT, true},
    {"--ssh-port", O_SSH_PORT, true},
    {"-i", O_SSH_IDENTITY, true},
    {"--ssh-identity-file", O_SSH_IDENTITY, true},
    {"--ssh-command", O_SSH_COMMAND, true},
    {"--network-interface", O_IFACE, true},
    {"--start-timeout", O_START_TIMEOUT, true},
    {"--rendezvous-port", O_RDZV_PORT, true},
    {"--output-filename", O_OUTPUT, true},
    {"--prefix-output-with-timestamp", O_TIMESTAMP, false},
    {"-prefix-timestamp", O_TIMESTAMP, false},
    {"--disable-output-prefix", O_NO_PREFIX, false},
    {"--verbose", O_VERBOSE, false},
    {"--log-level", O_LOG_LEVEL, true},
    {"--timeline-filename", O_TIMELINE, true},
    {"--fusion-threshold-mb", O_FUSION, true},
    {"--cycle-time-ms", O_CYCLE, true},
    {"--cache-capacity", O_CACHE, true},
    {"--hierarchical-allreduce", O_HIER_ALLREDUCE, false},
    {"--hierarchical-allgather", O_HIER_ALLGATHER, false},
    {"--gloo-timeout-seconds", O_GLOO_TIMEOUT, true},
    {"-x", O_EXPORT, true},
    {"-h", O_HELP, false},
    {"--help", O_HELP, false},
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
      "\n"
      "Tuning (handed to the ranks as HOROVOD_* variables):\n"
      "  --timeline-filename FILE    HOROVOD_TIMELINE: rank 0 writes a Chrome trace\n"
      "  --fusion-threshold-mb MB    HOROVOD_FUSION_THRESHOLD (default 128; 0: off)\n"
      "  --cycle-time-ms MS          HOROVOD_CYCLE_TIME (default 1)\n"
      "  --cache-capacity N          HOROVOD_CACHE_CAPACITY (default 1024; 0: off)\n"
      "  --hierarchical-allreduce    HOROVOD_HIERARCHICAL_ALLREDUCE=1\n"
      "  --hierarchical-allgather    HOROVOD_HIERARCHICAL_ALLGATHER=1\n"
      "  --gloo-timeout-seconds S    HOROVOD_GLOO_TIMEOUT_SECONDS (default 30)\n"
      "  -x VAR[=VALUE]              export VAR (hvdrun's value, or VALUE) to every rank;\n"
      "                              repeatable\n"
      "\n"
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

static hvd_status apply(struct hvdrun_options *o, const struct spelling *sp, const char *v) {
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
    if (!int_in(v, sp->id == O_CACHE ? 0 : 1, 1000000000, &n))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a whole number%s", sp->name, v,
                       sp->id == O_CACHE ? " >= 0" : " >= 1");
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
    if (sp->id == O_FUSION)
      o->fusion_mb = v;
    else
      o->cycle_ms = v;
    break;
  case O_HIER_ALLREDUCE:
    o->hier_allreduce = true;
    break;
  case O_HIER_ALLGATHER:
    o->hier_allgather = true;
    break;
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
  case O_HELP:
    break;
  }
  return HVD_OK;
}

hvd_status hvdrun_parse(int argc, char **argv, struct hvdrun_options *o, bool *help) {
  int i = 1;

  memset(o, 0, sizeof(*o));
  o->np = -1;
  o->prefix = true;
  o->start_timeout_s = 30;
  o->ssh_command = "ssh";
  *help = false;
  if (getenv("HOROVOD_START_TIMEOUT") != NULL &&
      !int_in(getenv("HOROVOD_START_TIMEOUT"), 1, 86400, &o->start_timeout_s))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_START_TIMEOUT='%s' is not a number of seconds (1 to 86400)",
                     getenv("HOROVOD_START_TIMEOUT"));
  while (i < argc) {
    const char *arg = argv[i], *value;
    const struct spelling *sp;
    hvd_status st;
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
    if (!sp->value && value != NULL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s takes no value", sp->name);
    if (sp->value && value == NULL) {
      if (i + 1 >= argc)
        return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s needs a value", sp->name);
      value = argv[++i];
    }
    if ((st = apply(o, sp, value)) != HVD_OK)
      return st;
    i++;
  }
  if (i >= argc)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "no command to run (hvdrun [options] [--] COMMAND [ARGS...])");
  if (o->hosts != NULL && o->hostfile != NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "-H and --hostfile exclude each other");
  o->command = argv + i;
  o->ncommand = argc - i;
  return HVD_OK;
}

void hvdrun_options_fini(struct hvdrun_options *o) {
  free(o->exports);
  o->exports = NULL;
  o->nexports = 0;
}
