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
 * horovodrun's library flags: --tcp is HVD_SHM=0 (and NCCL kept off
 * InfiniBand, as horovodrun does); --num-nccl-streams is accepted, with a
 * warning unless it is 1, since hvd has one NCCL stream per GPU and the
 * flag never changes results; --network-interface, repeated, and
 * --network-interfaces add up to one list, as horovodrun keeps them all.
 *
 * The flags of settings come from the settings table
 * (src/common/settings.def): each is checked by the parser the ranks use,
 * in the same range, and kept as the variable's value in o->settings,
 * which proc.c hands to the ranks. A switch has an "on" and an "off"
 * spelling (--autotune, --no-autotune); each passes its value, "1" or "0",
 * as an option with a value would.
 * --config-file's settings (config.c) arrive the same way, as the flag
 * with the same effect and its value, after the whole command line: a
 * setting the command line gave, under any spelling and wherever
 * --config-file stands, is left as it is (horovodrun's rule in its code;
 * its --help says otherwise). The file's values go through the same
 * checks, and their messages name the file, line and key instead of the
 * flag.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "hvdrun.h"
#include "rendezvous/rendezvous.h"

enum opt {
  O_SETTING, /* a flag of the settings table (src/common/settings.def) */
  O_NP, O_HOSTS, O_HOSTFILE, O_SSH_PORT, O_SSH_IDENTITY, O_SSH_COMMAND, O_RDZV_PORT, O_OUTPUT,
  O_TIMESTAMP, O_NO_PREFIX, O_VERBOSE, O_EXPORT, O_MIN_NP, O_MAX_NP, O_DISCOVERY, O_SLOTS,
  O_RESET_LIMIT, O_COOLDOWN, O_HOROVOD_COMPAT, O_GLOO, O_MPI, O_DISABLE_CACHE, O_CONFIG,
  O_CHECK_BUILD, O_VERSION, O_JSRUN, O_TCP, O_NCCL_STREAMS, O_HELP
};
enum { OPT_COUNT = O_HELP + 1 };

struct spelling {
  const char *name;
  enum opt id;
  int values;              /* how many arguments follow */
  const char *set;         /* a switch's value: "1" or "0" */
  enum hvd_setting setting; /* O_SETTING, O_TCP: which */
};

/* hvdrun's own options, and settings' spellings the table has no field
 * for; the settings' flags come from the table. */
static const struct spelling SPELLINGS[] = {
    {"-np", O_NP, 1, NULL, HVD_SET_NONE},
    {"--num-proc", O_NP, 1, NULL, HVD_SET_NONE},
    {"-H", O_HOSTS, 1, NULL, HVD_SET_NONE},
    {"--hosts", O_HOSTS, 1, NULL, HVD_SET_NONE},
    {"--hostfile", O_HOSTFILE, 1, NULL, HVD_SET_NONE},
    {"-hostfile", O_HOSTFILE, 1, NULL, HVD_SET_NONE},
    {"-p", O_SSH_PORT, 1, NULL, HVD_SET_NONE},
    {"--ssh-port", O_SSH_PORT, 1, NULL, HVD_SET_NONE},
    {"-i", O_SSH_IDENTITY, 1, NULL, HVD_SET_NONE},
    {"--ssh-identity-file", O_SSH_IDENTITY, 1, NULL, HVD_SET_NONE},
    {"--ssh-command", O_SSH_COMMAND, 1, NULL, HVD_SET_NONE},
    {"--rendezvous-port", O_RDZV_PORT, 1, NULL, HVD_SET_NONE},
    {"--output-filename", O_OUTPUT, 1, NULL, HVD_SET_NONE},
    {"--prefix-output-with-timestamp", O_TIMESTAMP, 0, NULL, HVD_SET_NONE},
    {"-prefix-timestamp", O_TIMESTAMP, 0, NULL, HVD_SET_NONE},
    {"--disable-output-prefix", O_NO_PREFIX, 0, NULL, HVD_SET_NONE},
    {"--verbose", O_VERBOSE, 0, NULL, HVD_SET_NONE},
    {"--disable-cache", O_DISABLE_CACHE, 0, NULL, HVD_SET_NONE},
    {"--config-file", O_CONFIG, 1, NULL, HVD_SET_NONE},
    {"-cb", O_CHECK_BUILD, 0, NULL, HVD_SET_NONE},
    {"--check-build", O_CHECK_BUILD, 0, NULL, HVD_SET_NONE},
    {"-x", O_EXPORT, 1, NULL, HVD_SET_NONE},
    {"--min-np", O_MIN_NP, 1, NULL, HVD_SET_NONE},
    {"--min-num-proc", O_MIN_NP, 1, NULL, HVD_SET_NONE},
    {"--max-np", O_MAX_NP, 1, NULL, HVD_SET_NONE},
    {"--max-num-proc", O_MAX_NP, 1, NULL, HVD_SET_NONE},
    {"--host-discovery-script", O_DISCOVERY, 1, NULL, HVD_SET_NONE},
    {"--slots-per-host", O_SLOTS, 1, NULL, HVD_SET_NONE},
    {"--slots", O_SLOTS, 1, NULL, HVD_SET_NONE},
    {"--reset-limit", O_RESET_LIMIT, 1, NULL, HVD_SET_NONE},
    {"--blacklist-cooldown-range", O_COOLDOWN, 2, NULL, HVD_SET_NONE},
    {"--horovod-compat", O_HOROVOD_COMPAT, 0, NULL, HVD_SET_NONE},
    {"--gloo", O_GLOO, 0, NULL, HVD_SET_NONE},
    {"--mpi", O_MPI, 0, NULL, HVD_SET_NONE},
    {"--jsrun", O_JSRUN, 0, NULL, HVD_SET_NONE},
    {"--tcp", O_TCP, 0, "0", HVD_SET_SHM},
    {"--num-nccl-streams", O_NCCL_STREAMS, 1, NULL, HVD_SET_NONE},
    {"--no-log-hide-timestamp", O_SETTING, 0, "0", HVD_SET_LOG_HIDE_TIME},
    {"-v", O_VERSION, 0, NULL, HVD_SET_NONE},
    {"--version", O_VERSION, 0, NULL, HVD_SET_NONE},
    {"-h", O_HELP, 0, NULL, HVD_SET_NONE},
    {"--help", O_HELP, 0, NULL, HVD_SET_NONE},
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
      "  --rendezvous-port PORT      the store's port (default: any free port)\n"
      "\n"
      "Output:\n"
      "  --output-filename DIR       also write DIR/rank.N/stdout and stderr\n"
      "  --prefix-output-with-timestamp\n"
      "                              put the time before each line's prefix\n"
      "  --disable-output-prefix     pass lines through without '[rank]<stdout>:'\n"
      "  --verbose                   say what hvdrun does (commands, store, exits)\n"
      "\n"
      "Settings (each flag sets the variable it names, for every rank; all of them\n"
      "are in docs/environment.md):\n",
      out);
  hvd_setting_flag_help(out);
  fputs(
      "  --tcp                       HVD_SHM=0 and NCCL_IB_DISABLE=1: the ranks talk\n"
      "                              over TCP only (horovodrun's --tcp)\n"
      "  --num-nccl-streams N        accepted; hvd has one NCCL stream per GPU (any\n"
      "                              value but 1 gets a warning)\n"
      "  --no-log-hide-timestamp     --log-with-timestamp's older spelling\n"
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
      "  --reset-limit N             allow at most N resets, then stop the job\n"
      "                              (default: no limit)\n"
      "  --blacklist-cooldown-range MIN MAX\n"
      "                              let a failed host back after MIN to MAX seconds,\n"
      "                              longer each time it fails (1 to 3600; default:\n"
      "                              never)\n"
      "  (and --elastic-timeout above)\n"
      "\n"
      "Python (hvd's own package goes first on the ranks' PYTHONPATH):\n"
      "  --horovod-compat            put hvd's 'horovod' compatibility tree before it,\n"
      "                              so that 'import horovod.torch' gets hvd\n"
      "                              (and set HVD_HOROVOD_COMPAT=1), and a\n"
      "                              'horovodrun' command first on their PATH that\n"
      "                              runs this hvdrun\n"
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

static bool named(const char *name, const char *arg, size_t len) {
  return name != NULL && strlen(name) == len && strncmp(name, arg, len) == 0;
}

/* The option arg spells (hvdrun's own, or a setting's flag); false if none. */
static bool lookup(const char *arg, const char **value, struct spelling *out) {
  const char *eq = strchr(arg, '=');
  size_t len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);

  *value = eq != NULL ? eq + 1 : NULL;
  for (size_t i = 0; i < HVD_ARRAY_SIZE(SPELLINGS); i++) {
    if (named(SPELLINGS[i].name, arg, len)) {
      *out = SPELLINGS[i];
      return true;
    }
  }
  for (int id = 1; id < HVD_SETTING_COUNT; id++) {
    const struct hvd_setting_info *s = hvd_setting_info((enum hvd_setting)id);
    const char *name = named(s->flag, arg, len)       ? s->flag
                       : named(s->flag_alt, arg, len) ? s->flag_alt
                       : named(s->flag_off, arg, len) ? s->flag_off
                                                      : NULL;
    bool sw = s->type == HVD_SETTING_BOOL;
    if (name != NULL) {
      *out = (struct spelling){name, O_SETTING, sw ? 0 : 1,
                               sw ? (name == s->flag_off ? "0" : "1") : NULL,
                               (enum hvd_setting)id};
      return true;
    }
  }
  return false;
}

/* Whether the comma list has the entry of len bytes at name. */
static bool list_has(const char *list, const char *name, size_t len) {
  for (const char *p = list; *p != '\0';) {
    size_t n = strcspn(p, ",");
    if (n == len && strncmp(p, name, len) == 0)
      return true;
    p += n + (p[n] == ',');
  }
  return false;
}

/* Interfaces given again: the list so far (had) and the new entries it
 * lacks, in *value, which is replaced. horovodrun keeps a set of them; an
 * exclusion ('^', the whole spec's) cannot join it. */
static hvd_status add_interfaces(const char *label, const char *had, char **value) {
  struct hvd_buf all = {0};
  const char *p = *value;
  hvd_status st;

  if (had[0] == '^' || p[0] == '^')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s '%s': an exclusion ('^') cannot be added to other interfaces ('%s'); "
                     "give one list, '^a,b' or names only",
                     label, *value, had);
  st = hvd_buf_printf(&all, "%s", had);
  while (st == HVD_OK && *p != '\0') {
    size_t n = strcspn(p, ",");
    if (n == 0 || !list_has(all.data, p, n))
      st = hvd_buf_printf(&all, ",%.*s", (int)n, p);
    p += n + (p[n] == ',');
  }
  if (st != HVD_OK) {
    hvd_buf_fini(&all);
    return hvd_error_prefix("%s", label);
  }
  free(*value);
  *value = hvd_buf_detach(&all, NULL);
  return HVD_OK;
}

/* A setting's value: checked as the ranks will read it, kept as the
 * variable's value (the interfaces' added to those given before). */
static hvd_status set_setting(struct hvdrun_options *o, const struct spelling *sp, const char *v) {
  char *value;
  hvd_status st = hvd_setting_check(sp->setting, v, sp->name, true, &value);
  const char *had = o->settings[sp->setting];

  if (st == HVD_OK && sp->setting == HVD_SET_IFACE && had != NULL)
    st = add_interfaces(sp->name, had, &value);
  if (st != HVD_OK) {
    free(value);
    return st;
  }
  free(o->settings[sp->setting]);
  o->settings[sp->setting] = value;
  return HVD_OK;
}

/* -x's VAR or VAR=value (kept as given: o does not own it). */
static hvd_status add_export(struct hvdrun_options *o, const char *label, const char *v) {
  size_t name = strcspn(v, "=");
  if (name == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' does not start with a variable name",
                     label, v);
  for (size_t i = 0; i < name; i++) {
    char c = v[i];
    if (!(c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
          (i > 0 && c >= '0' && c <= '9')))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%.*s' is not a variable name", label,
                       (int)name, v);
  }
  if (hvd_array_reserve(&o->exports, &o->exports_cap, o->nexports + 1, sizeof(*o->exports), 8) !=
      HVD_OK)
    return hvd_error_prefix("%s", label);
  o->exports[o->nexports++] = v;
  return HVD_OK;
}

/* v2: the second value, for the one option that takes two. */
static hvd_status apply(struct hvdrun_options *o, const struct spelling *sp, const char *v,
                        const char *v2) {
  switch (sp->id) {
  case O_TCP: {
    /* horovodrun's "TCP only": NCCL_IB_DISABLE=1 as horovodrun sets it
     * (a later -x NCCL_IB_DISABLE=... wins), and no shared memory. */
    hvd_status st = add_export(o, sp->name, "NCCL_IB_DISABLE=1");
    if (st != HVD_OK)
      return st;
    return set_setting(o, sp, v);
  }
  case O_SETTING:
    return set_setting(o, sp, v);
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
  case O_EXPORT:
    return add_export(o, sp->name, v);
  case O_NCCL_STREAMS: {
    int n;
    if (!int_in(v, 0, INT_MAX, &n))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '%s' is not a whole number >= 0", sp->name,
                       v);
    if (n != 1)
      fprintf(stderr,
              "hvdrun: warning: %s %d changes nothing: hvd runs NCCL on one stream per GPU\n",
              sp->name, n);
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

/* A setting hvdrun uses itself: the flag's value, else the environment's
 * (or the default). */
static hvd_status own_setting(const struct hvdrun_options *o, enum hvd_setting id, int *out) {
  int64_t v;
  hvd_status st = HVD_OK;
  if (o->settings[id] == NULL)
    st = hvd_setting_int(id, &v);
  else if (!hvd_parse_int64(o->settings[id], strlen(o->settings[id]), &v))
    st = hvd_error(HVD_ERR_INTERNAL, "%s: '%s' was checked", hvd_setting_name(id),
                   o->settings[id]);
  if (st == HVD_OK)
    *out = (int)v;
  return st;
}

/* The elastic flags, once parsing is done. only_elastic: the first flag
 * given that means something in elastic mode only (NULL: none). */
static hvd_status check_elastic(struct hvdrun_options *o, const char *only_elastic,
                                const char *slots_flag) {
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
  return HVD_OK;
}

/* What hvdrun_parse keeps while it reads the command line and the config file. */
struct parse_state {
  struct hvdrun_options *o;
  const char *given[OPT_COUNT]; /* the spelling the command line used; NULL: none */
  const char *given_setting[HVD_SETTING_COUNT]; /* the same for settings */
  const char *file_setting[HVD_SETTING_COUNT];  /* "FILE:LINE: key" of the file's */
};

static const char **given_slot(struct parse_state *ps, const struct spelling *sp) {
  return sp->id == O_SETTING ? &ps->given_setting[sp->setting] : &ps->given[sp->id];
}

/* A copy of text that lives as long as the options (the config file's
 * values and where they stand). */
static hvd_status keep(struct hvdrun_options *o, const char *text, char **out) {
  if (hvd_array_reserve(&o->owned, &o->owned_cap, o->nowned + 1, sizeof(*o->owned), 16) !=
      HVD_OK)
    return hvd_error_prefix("%.200s", text);
  if ((*out = hvd_strndup(text, strlen(text))) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "%.200s: out of memory", text);
  o->owned[o->nowned++] = *out;
  return HVD_OK;
}

/* A config file's setting, unless the command line gave one. */
static hvd_status from_file_cb(void *arg, const char *flag, const char *value,
                               const char *where) {
  struct parse_state *ps = arg;
  struct hvdrun_options *o = ps->o;
  const char *ignored;
  struct spelling labelled;
  char *copy = NULL;
  hvd_status st;

  if (!lookup(flag, &ignored, &labelled))
    return hvd_error(HVD_ERR_INTERNAL, "%s: hvdrun has no flag %s for it", where, flag);
  if (*given_slot(ps, &labelled) != NULL)
    return HVD_OK;
  /* --gloo and --mpi both answer the file's controller (as in horovodrun). */
  if ((labelled.id == O_GLOO || labelled.id == O_MPI) && (ps->given[O_GLOO] || ps->given[O_MPI]))
    return HVD_OK;
  if (value != NULL && (st = keep(o, value, &copy)) != HVD_OK)
    return hvd_error_prefix("%s", where);
  labelled.name = where;
  if ((st = apply(o, &labelled, copy, NULL)) != HVD_OK || labelled.id != O_SETTING)
    return st;
  /* Kept for check_needs, which names the file's line. */
  if ((st = keep(o, where, &copy)) == HVD_OK)
    ps->file_setting[labelled.setting] = copy;
  return st;
}

/* Flags of the command line that mean nothing without another setting
 * (which may come from the config file): errors, not silently dropped. A
 * switch turned off needs nothing. */
static hvd_status check_needs(const struct hvdrun_options *o, const struct parse_state *ps) {
  for (int id = 1; id < HVD_SETTING_COUNT; id++) {
    const struct hvd_setting_info *s = hvd_setting_info((enum hvd_setting)id);
    const struct hvd_setting_info *need = hvd_setting_info(s->needs);
    /* The command line's, or a switch the file turned on (horovodrun's
     * sample files carry the autotuner's values with it off). */
    const char *by = ps->given_setting[id] != NULL        ? ps->given_setting[id]
                     : s->type == HVD_SETTING_BOOL ? ps->file_setting[id]
                                                   : NULL;
    if (s->needs == HVD_SET_NONE || by == NULL || !hvdrun_setting_on(o, (enum hvd_setting)id) ||
        hvdrun_setting_on(o, s->needs))
      continue;
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s has no effect without %s: add %s%s%s (or %s%s in the config file)",
                     by, need->env, need->flag,
                     need->flag_arg != NULL ? " " : "", need->flag_arg != NULL ? need->flag_arg : "",
                     need->key, need->type == HVD_SETTING_BOOL ? ": true" : "");
  }
  return HVD_OK;
}

/* --rendezvous: a URL and etcd settings a client accepts (a usage error
 * now, rather than the job's failure later). */
static hvd_status check_rendezvous(const struct hvdrun_options *o) {
  struct rdzv_client *c = NULL;
  hvd_status st = rdzv_client_create_url(o->settings[HVD_SET_RENDEZVOUS], -1, &c);
  rdzv_client_destroy(c);
  return st != HVD_OK ? hvd_error_prefix("--rendezvous") : HVD_OK;
}

bool hvdrun_setting_on(const struct hvdrun_options *o, enum hvd_setting id) {
  const char *v = o->settings[id];
  return v != NULL && (hvd_setting_info(id)->type != HVD_SETTING_BOOL || strcmp(v, "1") == 0);
}

hvd_status hvdrun_parse(int argc, char **argv, struct hvdrun_options *o, bool *help) {
  struct parse_state ps = {o, {NULL}, {NULL}, {NULL}};
  const char *only_elastic = NULL, *slots_flag = NULL;
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
  o->reset_limit = -1;
  *help = false;
  while (i < argc) {
    const char *arg = argv[i], *value, *value2 = NULL;
    struct spelling spelt, *sp = &spelt;
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (arg[0] != '-' || arg[1] == '\0')
      break; /* the command */
    if (!lookup(arg, &value, sp))
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
    *given_slot(&ps, sp) = sp->name;
    if (only_elastic == NULL &&
        (sp->id == O_MAX_NP || sp->id == O_SLOTS || sp->id == O_RESET_LIMIT ||
         sp->id == O_COOLDOWN || (sp->id == O_SETTING && sp->setting == HVD_SET_ELASTIC_TIMEOUT)))
      only_elastic = sp->name;
    if (sp->id == O_SLOTS)
      slots_flag = sp->name;
    i++;
  }
  if (o->config_file != NULL &&
      (st = hvdrun_config_read(o->config_file, stderr, from_file_cb, &ps)) != HVD_OK)
    return st;
  if ((st = check_needs(o, &ps)) != HVD_OK ||
      (st = own_setting(o, HVD_SET_START_TIMEOUT, &o->start_timeout_s)) != HVD_OK ||
      (st = own_setting(o, HVD_SET_ELASTIC_TIMEOUT, &o->elastic_timeout_s)) != HVD_OK)
    return st;
  o->iface = o->settings[HVD_SET_IFACE];
  if (o->settings[HVD_SET_RENDEZVOUS] != NULL && (st = check_rendezvous(o)) != HVD_OK)
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
  return check_elastic(o, only_elastic, slots_flag);
}

void hvdrun_options_fini(struct hvdrun_options *o) {
  for (size_t i = 0; i < o->nowned; i++)
    free(o->owned[i]);
  for (int id = 0; id < HVD_SETTING_COUNT; id++) {
    free(o->settings[id]);
    o->settings[id] = NULL;
  }
  free(o->owned);
  free(o->exports);
  free(o->pythonpath);
  o->owned = NULL;
  o->nowned = o->owned_cap = 0;
  o->exports = NULL;
  o->nexports = o->exports_cap = 0;
  o->pythonpath = NULL;
}
