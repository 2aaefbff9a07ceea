/*
 * hvd-rendezvous: the rendezvous store as a standalone server, for jobs whose
 * ranks start on their own (e.g. Kubernetes pods behind a Service).
 * Prints "listening on ADDR:PORT" as its first line on stdout, serves until
 * SIGINT or SIGTERM, then shuts down cleanly and exits 0. With --min-np it
 * is also the elastic driver of pods that register in it (elastic.c in pod
 * mode): their rounds are its work until the signal.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"
#include "rendezvous/rendezvous.h"

enum {
  EXIT_USAGE = 2,
  TOKEN_MAX = 4096,
  TOKEN_USABLE_MAX = 256, /* HVD_TOKEN's limit on the ranks */
  PLANS_MAX = 256,
  POD_TIMEOUT_DEFAULT_S = 10,
};

struct plan {
  const char *scope;
  size_t scope_len;
  size_t size;
};

struct options {
  struct rdzv_server_config server;
  const char *token_file;
  struct plan plans[PLANS_MAX];
  size_t nplans;
  /* the elastic driver: on with --min-np */
  struct hvdrun_options driver;
  int pod_timeout_s;
  const char *only_elastic; /* the first driver flag given, for the message without --min-np */
  const char *etcd;         /* --rendezvous (or HVD_RENDEZVOUS): drive pods there */
  const char *only_store;   /* the first flag of the HTTP store, for the message with etcd */
};

static const char usage_text[] =
    "usage: hvd-rendezvous [options]\n"
    "\n"
    "Serves the hvd rendezvous store over HTTP (see docs/rendezvous-protocol.md).\n"
    "Prints 'listening on ADDR:PORT' first; stops cleanly on SIGINT or SIGTERM.\n"
    "\n"
    "options:\n"
    "  --bind ADDR            address to listen on (default: every interface, IPv6 and IPv4)\n"
    "  --port N               port to listen on (default 0: any free port)\n"
    "  --token-file FILE      require the job token in FILE from every client\n"
    "                         (default: the token in $HVD_TOKEN, if set; otherwise none)\n"
    "  --plan SCOPE=SIZE      SCOPE has SIZE ranks: clear it once each deleted its rank key\n"
    "                         (repeatable)\n"
    "  --threads N            event loops (default: one per CPU, at most 4)\n"
    "  --max-connections N    concurrent connections (default: as the open-file limit allows)\n"
    "  --max-connections-per-address N\n"
    "                         concurrent connections from one address (default: a quarter\n"
    "                         of --max-connections, at least 1024)\n"
    "  --max-value-bytes N    largest value (default 4194304)\n"
    "  --max-store-bytes N    all keys and values together (default 268435456)\n"
    "  --max-name-bytes N     longest scope name or key (default 512)\n"
    "  --idle-timeout S       close connections idle for S seconds (default 60)\n"
    "  --log-level LEVEL      trace, debug, info, warning, error or fatal\n"
    "                         (default: $HOROVOD_LOG_LEVEL, else warning)\n"
    "\n"
    "elastic pod jobs (docs/elastic.md, \"Pods\"): the store is also their driver\n"
    "  --min-np N             fewest ranks a round may have; turns the driver on\n"
    "  --np N                 pods needed before the first round (default: --min-np)\n"
    "  --max-np N             most ranks a round may have (default: no limit)\n"
    "  --elastic-timeout S    how long a round may wait for pods to leave the last one\n"
    "                         (default: $HOROVOD_ELASTIC_TIMEOUT, else 600)\n"
    "  --pod-timeout S        a pod without a heartbeat for S seconds is gone (default 10)\n"
    "  --rendezvous URL       the pods' rendezvous is in etcd (etcd://HOST:PORT,...[/PREFIX],\n"
    "                         default: $HVD_RENDEZVOUS): serve nothing, and stand by to lead\n"
    "                         their driver (run one in each pod; docs/etcd.md)\n"
    "  --verbose              say when pods register, and who has no place in a round\n"
    "  --version              print the version and exit\n"
    "  -h, --help             print this help and exit\n";

/* Prints one line (in one write) and returns the usage exit code. */
static int HVD_PRINTF(1, 2) usage_error(const char *fmt, ...) {
  char reason[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof(reason), fmt, ap);
  va_end(ap);
  fprintf(stderr, "hvd-rendezvous: %s (see hvd-rendezvous --help)\n", reason);
  return EXIT_USAGE;
}

static bool parse_number(const char *text, int64_t min, int64_t max, int64_t *out) {
  return hvd_parse_int64(text, strlen(text), out) && *out >= min && *out <= max;
}

/* Reads the token: one line, surrounding blanks dropped, printable ASCII only. */
static hvd_status read_token_file(const char *path, char *token, size_t size) {
  FILE *f = fopen(path, "r");
  size_t len;

  if (f == NULL)
    return hvd_error(HVD_ERR_IO, "cannot read token file %s: %s", path, strerror(errno));
  len = fread(token, 1, size - 1, f);
  if (!feof(f) && len == size - 1) {
    fclose(f);
    return hvd_error(HVD_ERR_TOO_LARGE, "token file %s is larger than %zu bytes", path, size - 1);
  }
  fclose(f);
  token[len] = '\0';
  size_t lead = strspn(token, " \t\r\n");
  memmove(token, token + lead, len - lead + 1);
  len -= lead;
  while (len > 0 && (token[len - 1] == '\n' || token[len - 1] == '\r' || token[len - 1] == ' ' ||
                     token[len - 1] == '\t'))
    token[--len] = '\0';
  if (len == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "token file %s is empty", path);
  if (len > TOKEN_USABLE_MAX) /* ranks refuse a longer HVD_TOKEN */
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "token file %s: the token is longer than %d bytes",
                     path, TOKEN_USABLE_MAX);
  for (size_t i = 0; i < len; i++) {
    if (token[i] < 0x21 || token[i] > 0x7e)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "token file %s: the token must be printable ASCII without blanks", path);
  }
  return HVD_OK;
}

static int parse_plan(struct options *o, const char *arg) {
  const char *eq = strrchr(arg, '=');
  int64_t size;

  if (o->nplans == PLANS_MAX)
    return usage_error("too many --plan options (at most %d)", PLANS_MAX);
  if (eq == NULL || eq == arg || !parse_number(eq + 1, 1, 1 << 24, &size))
    return usage_error("--plan '%s' must be SCOPE=SIZE with SIZE in 1..16777216", arg);
  o->plans[o->nplans++] = (struct plan){arg, (size_t)(eq - arg), (size_t)size};
  return 0;
}

/* The driver's flags once parsed: -1 to go on, or the usage exit code. */
static int check_driver(struct options *o) {
  struct hvdrun_options *d = &o->driver;

  if (o->etcd == NULL)
    o->etcd = hvd_setting_real(HVD_SET_RENDEZVOUS);
  if (d->min_np < 0) {
    if (o->etcd != NULL)
      return usage_error("with --rendezvous (or HVD_RENDEZVOUS) hvd-rendezvous only leads an "
                         "elastic driver: add --min-np");
    if (o->only_elastic != NULL)
      return usage_error("%s is for the elastic driver: add --min-np", o->only_elastic);
    return -1;
  }
  d->elastic = true;
  if (o->etcd != NULL && o->only_store != NULL)
    return usage_error("--%s is for hvd's own store: with --rendezvous nothing is served",
                       o->only_store);
  if (o->etcd != NULL) { /* the URL and the etcd settings, read without a request */
    struct rdzv_client *c = NULL;
    if (rdzv_client_create_url(o->etcd, -1, &c) != HVD_OK)
      return usage_error("%s", hvd_last_error_message());
    rdzv_client_destroy(c);
  }
  if (d->np < 0)
    d->np = d->min_np;
  if (d->np < d->min_np)
    return usage_error("--np %d is below --min-np %d", d->np, d->min_np);
  if (d->max_np >= 0 && d->max_np < d->np)
    return usage_error("--max-np %d is below --np %d", d->max_np, d->np);
  if (d->elastic_timeout_s == 0) {
    int64_t timeout;
    if (hvd_setting_int(HVD_SET_ELASTIC_TIMEOUT, &timeout) != HVD_OK)
      return usage_error("%s", hvd_last_error_message());
    d->elastic_timeout_s = (int)timeout;
  }
  return -1;
}

/* Returns -1 to go on, or an exit code. */
static int parse_args(int argc, char **argv, struct options *o) {
  enum {
    OPT_BIND = 256, OPT_PORT, OPT_TOKEN_FILE, OPT_PLAN, OPT_THREADS, OPT_MAX_CONN,
    OPT_MAX_PER_ADDRESS, OPT_MAX_VALUE, OPT_MAX_STORE, OPT_MAX_NAME, OPT_IDLE, OPT_LOG_LEVEL,
    OPT_VERSION, OPT_MIN_NP, OPT_NP, OPT_MAX_NP, OPT_ELASTIC_TIMEOUT, OPT_POD_TIMEOUT, OPT_VERBOSE,
    OPT_RENDEZVOUS,
  };
  static const struct option longopts[] = {
      {"bind", required_argument, NULL, OPT_BIND},
      {"port", required_argument, NULL, OPT_PORT},
      {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
      {"plan", required_argument, NULL, OPT_PLAN},
      {"threads", required_argument, NULL, OPT_THREADS},
      {"max-connections", required_argument, NULL, OPT_MAX_CONN},
      {"max-connections-per-address", required_argument, NULL, OPT_MAX_PER_ADDRESS},
      {"max-value-bytes", required_argument, NULL, OPT_MAX_VALUE},
      {"max-store-bytes", required_argument, NULL, OPT_MAX_STORE},
      {"max-name-bytes", required_argument, NULL, OPT_MAX_NAME},
      {"idle-timeout", required_argument, NULL, OPT_IDLE},
      {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
      {"version", no_argument, NULL, OPT_VERSION},
      {"min-np", required_argument, NULL, OPT_MIN_NP},
      {"np", required_argument, NULL, OPT_NP},
      {"max-np", required_argument, NULL, OPT_MAX_NP},
      {"elastic-timeout", required_argument, NULL, OPT_ELASTIC_TIMEOUT},
      {"pod-timeout", required_argument, NULL, OPT_POD_TIMEOUT},
      {"verbose", no_argument, NULL, OPT_VERBOSE},
      {"rendezvous", required_argument, NULL, OPT_RENDEZVOUS},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int opt;
  int64_t n;

  opterr = 0;
  while ((opt = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    for (size_t i = 0; opt >= OPT_BIND && opt <= OPT_IDLE && o->only_store == NULL; i++) {
      if (longopts[i].val == opt) /* the store's own flags: said with --rendezvous */
        o->only_store = longopts[i].name;
    }
    switch (opt) {
    case OPT_BIND:
      o->server.bind_address = optarg;
      break;
    case OPT_PORT:
      if (!parse_number(optarg, 0, 65535, &n))
        return usage_error("--port '%s' is not a port number (0-65535)", optarg);
      o->server.port = (int)n;
      break;
    case OPT_TOKEN_FILE:
      o->token_file = optarg;
      break;
    case OPT_PLAN:
      if (parse_plan(o, optarg) != 0)
        return EXIT_USAGE;
      break;
    case OPT_THREADS:
      if (!parse_number(optarg, 1, 64, &n))
        return usage_error("--threads '%s' must be 1-64", optarg);
      o->server.threads = (unsigned)n;
      break;
    case OPT_MAX_CONN:
      if (!parse_number(optarg, 1, 1 << 20, &n))
        return usage_error("--max-connections '%s' must be 1-1048576", optarg);
      o->server.max_connections = (unsigned)n;
      break;
    case OPT_MAX_PER_ADDRESS:
      if (!parse_number(optarg, 1, 1 << 20, &n))
        return usage_error("--max-connections-per-address '%s' must be 1-1048576", optarg);
      o->server.max_connections_per_address = (unsigned)n;
      break;
    case OPT_MAX_VALUE:
      if (!parse_number(optarg, 1, INT64_C(1) << 30, &n))
        return usage_error("--max-value-bytes '%s' must be 1-1073741824", optarg);
      o->server.limits.max_value_bytes = (size_t)n;
      break;
    case OPT_MAX_STORE:
      if (!parse_number(optarg, 4096, INT64_C(1) << 40, &n))
        return usage_error("--max-store-bytes '%s' must be 4096-1099511627776", optarg);
      o->server.limits.max_total_bytes = (size_t)n;
      break;
    case OPT_MAX_NAME:
      if (!parse_number(optarg, 1, 65536, &n))
        return usage_error("--max-name-bytes '%s' must be 1-65536", optarg);
      o->server.limits.max_name_bytes = (size_t)n;
      break;
    case OPT_IDLE:
      if (!parse_number(optarg, 1, 86400, &n))
        return usage_error("--idle-timeout '%s' must be 1-86400 seconds", optarg);
      o->server.idle_timeout_s = (unsigned)n;
      break;
    case OPT_LOG_LEVEL: {
      int level; /* HOROVOD_LOG_LEVEL's words are the levels, in order */
      if (hvd_setting_word_of(HVD_SET_LOG_LEVEL, optarg, "--log-level", &level) != HVD_OK)
        return usage_error("%s", hvd_last_error_message());
      hvd_log_set_level((enum hvd_log_level)level);
      break;
    }
    case OPT_VERSION:
      printf("hvd-rendezvous %s\n", hvd_version());
      return 0;
    case OPT_MIN_NP:
    case OPT_NP:
    case OPT_MAX_NP:
      if (!parse_number(optarg, 1, HVDRUN_MAX_RANKS, &n))
        return usage_error("%s '%s' must be 1-%d", argv[optind - 1], optarg, HVDRUN_MAX_RANKS);
      *(opt == OPT_MIN_NP ? &o->driver.min_np
                          : opt == OPT_NP ? &o->driver.np : &o->driver.max_np) = (int)n;
      if (opt != OPT_MIN_NP && o->only_elastic == NULL)
        o->only_elastic = opt == OPT_NP ? "--np" : "--max-np";
      break;
    case OPT_ELASTIC_TIMEOUT: {
      char *seconds; /* HOROVOD_ELASTIC_TIMEOUT's range */
      if (hvd_setting_check(HVD_SET_ELASTIC_TIMEOUT, optarg, "--elastic-timeout", false,
                            &seconds) != HVD_OK)
        return usage_error("%s", hvd_last_error_message());
      o->driver.elastic_timeout_s = atoi(seconds);
      free(seconds);
      if (o->only_elastic == NULL)
        o->only_elastic = "--elastic-timeout";
      break;
    }
    case OPT_POD_TIMEOUT:
      if (!parse_number(optarg, 2, 3600, &n))
        return usage_error("--pod-timeout '%s' must be 2-3600 seconds", optarg);
      o->pod_timeout_s = (int)n;
      if (o->only_elastic == NULL)
        o->only_elastic = "--pod-timeout";
      break;
    case OPT_VERBOSE:
      o->driver.verbose = true;
      break;
    case OPT_RENDEZVOUS:
      if (strncmp(optarg, "etcd://", 7) != 0 && strncmp(optarg, "etcds://", 8) != 0)
        return usage_error("--rendezvous '%s' must be etcd://HOST:PORT[,...][/PREFIX] or "
                           "etcds://...",
                           optarg);
      o->etcd = optarg;
      break;
    case 'h':
      fputs(usage_text, stdout);
      return 0;
    case ':':
      return usage_error("option %s needs a value", argv[optind - 1]);
    default:
      return usage_error("unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  return check_driver(o);
}

int main(int argc, char **argv) {
  static struct options o;
  static char token[TOKEN_MAX];
  struct rdzv_server *srv = NULL;
  sigset_t signals;
  int sig;
  int rc;

  hvd_log_set_name("hvd-rendezvous");
  if (hvd_log_configure_from_env() != HVD_OK) {
    fprintf(stderr, "hvd-rendezvous: %s\n", hvd_last_error_message());
    return EXIT_USAGE;
  }
  rdzv_server_config_default(&o.server);
  o.driver.min_np = o.driver.np = o.driver.max_np = -1;
  o.driver.reset_limit = -1; /* workers limit their own resets (HOROVOD_ELASTIC_RESET_LIMIT) */
  o.pod_timeout_s = POD_TIMEOUT_DEFAULT_S;
  rc = parse_args(argc, argv, &o);
  if (rc >= 0)
    return rc;
  if (o.token_file != NULL) {
    if (read_token_file(o.token_file, token, sizeof(token)) != HVD_OK) {
      fprintf(stderr, "hvd-rendezvous: %s\n", hvd_last_error_message());
      return EXIT_USAGE;
    }
    o.server.token = token;
  } else {
    o.server.token = hvd_setting_given(HVD_SET_TOKEN);
  }

  /* Signals are taken by sigwait below, never by a handler in another thread. */
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  if (o.driver.elastic) { /* the driver's signalfd reads these too: no thread may take them */
    sigaddset(&signals, SIGHUP);
    sigaddset(&signals, SIGCHLD);
    o.server.blocking_scope = "rank_and_size"; /* Horovod's GET waits for the next round */
  }
  pthread_sigmask(SIG_BLOCK, &signals, NULL);
  signal(SIGPIPE, SIG_IGN);

  if (o.etcd != NULL)
    return hvdrun_lead_elastic_pods(&o.driver, o.etcd, o.pod_timeout_s);
  if (rdzv_server_start(&o.server, &srv) != HVD_OK) {
    fprintf(stderr, "hvd-rendezvous: %s\n", hvd_last_error_message());
    return 1;
  }
  for (size_t i = 0; i < o.nplans; i++) {
    if (rdzv_store_plan(rdzv_server_store(srv), o.plans[i].scope, o.plans[i].scope_len,
                        o.plans[i].size) != HVD_OK) {
      fprintf(stderr, "hvd-rendezvous: --plan %.*s: %s\n", (int)o.plans[i].scope_len,
              o.plans[i].scope, hvd_last_error_message());
      rdzv_server_stop(srv);
      return EXIT_USAGE;
    }
  }
  printf("listening on %s\n", rdzv_server_address(srv));
  fflush(stdout);
  if (o.driver.elastic) {
    rc = hvdrun_run_elastic_pods(&o.driver, srv, o.pod_timeout_s);
    rdzv_server_stop(srv);
    return rc;
  }

  siginfo_t info;
  while ((sig = sigwaitinfo(&signals, &info)) < 0) {
  }
  /* Name the sender: an unexpected stop is then easy to trace. */
  HVD_LOG_INFO("received %s from pid %d, shutting down", sig == SIGINT ? "SIGINT" : "SIGTERM",
               (int)info.si_pid);
  rdzv_server_stop(srv);
  return 0;
}
