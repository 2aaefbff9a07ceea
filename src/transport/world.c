/*
 * The communicators every job has: global, local (the ranks on one host)
 * and cross (the ranks with the same local rank, one per host), in the
 * scopes Horovod's Gloo path uses: "global", "local_<host>",
 * "cross_<local_rank>". When the launcher gave no local and cross ranks
 * (pods that start on their own), they are derived from the hostnames in
 * the global records: a rank's local rank is its position among the ranks
 * of its host in global-rank order, and its cross rank its position among
 * the ranks that share its local rank, which is the assignment hvdrun makes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transport_private.h"

/* settings.def's limit for HVD_TOKEN is the handshake's. */
_Static_assert(NET_TOKEN_MAX == 256, "settings.def: HVD_TOKEN's limit");

static char env_hostname[RDZV_RECORD_HOST_MAX];
static char env_token[NET_TOKEN_MAX + 1];

/* Reads a rank/size pair; both unset leaves -1, one without the other fails. */
static hvd_status env_pair(enum hvd_setting rank_id, enum hvd_setting size_id, int *rank,
                           int *size) {
  const char *rank_name = hvd_setting_name(rank_id), *size_name = hvd_setting_name(size_id);
  int64_t r, s;
  hvd_status st = hvd_setting_int(rank_id, &r);
  if (st == HVD_OK)
    st = hvd_setting_int(size_id, &s);
  if (st != HVD_OK)
    return st;
  if ((r < 0) != (s < 0))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s is set but %s is not: set both or neither",
                     r >= 0 ? rank_name : size_name, r >= 0 ? size_name : rank_name);
  if (r >= s && s > 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s=%lld is not below %s=%lld", rank_name,
                     (long long)r, size_name, (long long)s);
  *rank = (int)r;
  *size = (int)s;
  return HVD_OK;
}

/* Pod mode: the size is given, the rank comes from the store. */
static hvd_status pod_size(int *rank, int *size) {
  int64_t s;
  hvd_status st = hvd_setting_int(HVD_SET_SIZE, &s);
  if (st != HVD_OK)
    return st;
  if (s < 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HVD_POD=1 needs HOROVOD_SIZE, the number of ranks to wait for");
  if (hvd_setting_given(HVD_SET_RANK) != NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HVD_POD=1 takes the rank from the store: unset HOROVOD_RANK");
  *rank = 0;
  *size = (int)s;
  return HVD_OK;
}

hvd_status net_world_config_from_env(struct net_world_config *cfg) {
  const char *host = NULL, *token = NULL;
  int64_t timeout_s;
  int rank, size;
  hvd_status st;

  memset(cfg, 0, sizeof(*cfg));
  st = hvd_setting_bool(HVD_SET_POD, &cfg->rank_from_store);
  if (st == HVD_OK && cfg->rank_from_store) {
    /* An elastic pod gets its ranks from the driver's round instead. */
    bool elastic = false;
    st = hvd_setting_bool(HVD_SET_ELASTIC, &elastic);
    cfg->rank_from_store = !elastic;
  }
  if (st == HVD_OK && cfg->rank_from_store)
    st = pod_size(&rank, &size);
  else if (st == HVD_OK)
    st = env_pair(HVD_SET_RANK, HVD_SET_SIZE, &rank, &size);
  if (st == HVD_OK)
    st = env_pair(HVD_SET_LOCAL_RANK, HVD_SET_LOCAL_SIZE, &cfg->local_rank, &cfg->local_size);
  if (st == HVD_OK)
    st = env_pair(HVD_SET_CROSS_RANK, HVD_SET_CROSS_SIZE, &cfg->cross_rank, &cfg->cross_size);
  if (st == HVD_OK)
    st = hvd_setting_int(HVD_SET_TIMEOUT, &timeout_s);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_TOKEN, &token); /* at most NET_TOKEN_MAX bytes */
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_HOSTNAME, &host);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_IFACE, &cfg->ctx.iface_spec);
  if (st == HVD_OK)
    st = hvd_setting_text(HVD_SET_PORT_RANGE, &cfg->ctx.port_range);
  if (st != HVD_OK)
    return st;
  if (host == NULL) {
    if (gethostname(env_hostname, sizeof(env_hostname) - 1) != 0)
      snprintf(env_hostname, sizeof(env_hostname), "localhost");
  } else {
    snprintf(env_hostname, sizeof(env_hostname), "%s", host);
  }
  snprintf(env_token, sizeof(env_token), "%s", token != NULL ? token : "");
  cfg->ctx.rank = rank < 0 ? 0 : rank;
  cfg->size = size < 0 ? 1 : size;
  cfg->ctx.hostname = env_hostname;
  cfg->ctx.token = token != NULL ? env_token : NULL;
  cfg->ctx.timeout_ms = timeout_s * 1000;
  return HVD_OK;
}

/* Local and cross ranks from the hostnames of the global communicator. */
static hvd_status derive(struct net_world *w) {
  int *local = calloc((size_t)w->size, sizeof(*local));
  struct net_comm *g = w->global;

  if (local == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot derive local ranks of %d ranks", w->size);
  for (int r = 0; r < w->size; r++) {
    for (int q = 0; q < r; q++) {
      if (strcmp(g->records[q].host, g->records[r].host) == 0)
        local[r]++;
    }
  }
  w->local_rank = local[w->rank];
  w->local_size = 0;
  w->cross_rank = 0;
  w->cross_size = 0;
  for (int r = 0; r < w->size; r++) {
    if (strcmp(g->records[r].host, g->records[w->rank].host) == 0)
      w->local_size++;
    if (local[r] == w->local_rank) {
      if (r < w->rank)
        w->cross_rank++;
      w->cross_size++;
    }
  }
  free(local);
  return HVD_OK;
}

void net_generation_prefix(uint64_t generation, char *out, size_t size) {
  if (generation > 0)
    snprintf(out, size, "g%llu.", (unsigned long long)generation);
  else if (size > 0)
    out[0] = '\0';
}

hvd_status net_world_create(const struct net_world_config *cfg, struct net_world **out) {
  struct net_world *w = calloc(1, sizeof(*w));
  char scope[RDZV_RECORD_HOST_MAX + 64], prefix[24];
  struct net_ctx_config ctx;
  hvd_status st;

  if (w == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the communicators");
  w->rank = cfg->ctx.rank;
  w->size = cfg->size;
  net_generation_prefix(cfg->ctx.generation, prefix, sizeof(prefix));
  ctx = cfg->ctx;
  if (cfg->rank_from_store && cfg->size > 1) {
    if (ctx.store == NULL)
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HVD_POD=1 needs the store (HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT)");
    else
      st = net_pod_rank(ctx.store, ctx.generation, ctx.hostname, cfg->local_rank, cfg->size,
                        &w->rank);
    if (st != HVD_OK) {
      free(w);
      return st;
    }
    ctx.rank = w->rank;
  }
  st = net_ctx_create(&ctx, &w->ctx);
  snprintf(scope, sizeof(scope), "%sglobal", prefix);
  if (st == HVD_OK)
    st = net_comm_create(w->ctx, scope, NET_COMM_GLOBAL, w->rank, w->size, &w->global);
  if (st != HVD_OK)
    goto fail;
  if (cfg->local_rank >= 0 && cfg->cross_rank >= 0) {
    w->local_rank = cfg->local_rank;
    w->local_size = cfg->local_size;
    w->cross_rank = cfg->cross_rank;
    w->cross_size = cfg->cross_size;
  } else if ((st = derive(w)) != HVD_OK) {
    goto fail;
  }
  snprintf(scope, sizeof(scope), "%slocal_%s", prefix, w->ctx->hostname);
  st = net_comm_create(w->ctx, scope, NET_COMM_LOCAL, w->local_rank, w->local_size, &w->local);
  if (st != HVD_OK)
    goto fail;
  snprintf(scope, sizeof(scope), "%scross_%d", prefix, w->local_rank);
  st = net_comm_create(w->ctx, scope, NET_COMM_CROSS, w->cross_rank, w->cross_size, &w->cross);
  if (st != HVD_OK)
    goto fail;
  *out = w;
  return HVD_OK;
fail:
  net_world_destroy(w);
  return st;
}

void net_world_destroy(struct net_world *w) {
  if (w == NULL)
    return;
  net_comm_destroy(w->cross);
  net_comm_destroy(w->local);
  net_comm_destroy(w->global);
  net_ctx_destroy(w->ctx);
  free(w);
}
