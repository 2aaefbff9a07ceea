/*
 * The rendezvous store every hvdrun job serves in-process: its token, the
 * address ranks reach it at, and the server's configuration.
 *
 * DESIGN. The token is random (getrandom), so that only the job's ranks
 * can use the store. The address comes from the first remote host: the
 * interface that routes there (or --network-interface's), since that is
 * the side of this machine the ranks see. The server listens on 127.0.0.1
 * alone when that is the ranks' address and no host can join later, and
 * on every interface otherwise. One event loop is plenty: hvdrun's ranks
 * are its only clients. With an etcd cluster, hvdrun serves nothing: the
 * job's keys live under a prefix of its own there.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"
#include "transport/transport.h"

/* Where ranks reach the store: 127.0.0.1 when no host is remote, else the
 * interface --network-interface names or the route to the first remote
 * host (for a name only the remote shell knows, this host's first IPv4
 * address that is not loopback). */
static hvd_status store_address(const struct hvdrun_options *o, const char *const *remote_hosts,
                                size_t nremote, char *out, size_t size) {
  const char *remote = nremote > 0 ? remote_hosts[0] : NULL;
  struct net_addr addrs[NET_MAX_ADDRS];
  size_t n = 0;
  hvd_status st;

  if (remote == NULL) {
    snprintf(out, size, "127.0.0.1");
    return HVD_OK;
  }
  st = net_select_addresses(o->iface, remote, o->ssh_port > 0 ? o->ssh_port : 22, addrs,
                            NET_MAX_ADDRS, &n);
  if (st != HVD_OK && o->iface == NULL) {
    /* A host name only the remote shell knows (a pod behind kubectl exec):
     * this host's first address that is not loopback. */
    struct net_iface ifs[NET_MAX_IFACES];
    size_t nifs = 0;
    char why[HVD_ERROR_MESSAGE_MAX];
    snprintf(why, sizeof(why), "%s", hvd_last_error_message());
    if (net_iface_list(ifs, NET_MAX_IFACES, &nifs) == HVD_OK) {
      for (size_t i = 0; i < nifs && n == 0; i++) {
        if (!ifs[i].loopback && ifs[i].addr.ss.ss_family == AF_INET)
          addrs[n++] = ifs[i].addr;
      }
    }
    if (n == 0)
      return hvd_error(HVD_ERR_NOT_FOUND,
                       "choosing the address remote ranks reach the store at: %s, and this host "
                       "has no other IPv4 address (use --network-interface)",
                       why);
    st = HVD_OK;
  }
  if (st != HVD_OK)
    return hvd_error_prefix("choosing the address remote ranks reach the store at");
  if (n == 0)
    return hvd_error(HVD_ERR_NOT_FOUND, "no address of this host reaches %s", remote);
  net_addr_format(&addrs[0], out, size);
  return HVD_OK;
}

/* The etcd cluster HVD_RENDEZVOUS (or --rendezvous) names, or NULL. */
static const char *etcd_url(const struct hvdrun_options *o) {
  const char *url = o->settings[HVD_SET_RENDEZVOUS];
  return url != NULL ? url : hvd_setting_real(HVD_SET_RENDEZVOUS);
}

/* The job's prefix: the one given plus "/job-<random>". */
static hvd_status etcd_job(const char *given, struct hvdrun_store *s) {
  char id[HVD_TOKEN_HEX_DIGITS + 1];
  const char *hosts = strstr(given, "://");
  const char *slash = hosts != NULL ? strchr(hosts + 3, '/') : NULL;
  size_t len = strlen(given);
  hvd_status st = hvd_random_token(id);

  if (st != HVD_OK)
    return st;
  id[16] = '\0';
  while (len > 0 && given[len - 1] == '/')
    len--;
  if ((s->url = malloc(len + 64)) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory");
  snprintf(s->url, len + 64, "%.*s%s/job-%s", (int)len, given,
           slash == NULL ? "/hvd/default" : "", id);
  if ((st = rdzv_client_create_url(s->url, -1, &s->client)) != HVD_OK)
    return hvd_error_prefix("--rendezvous");
  return HVD_OK;
}

hvd_status hvdrun_store_start(const struct hvdrun_options *o, const struct hvdrun_store_config *cfg,
                              struct hvdrun_store *out) {
  struct rdzv_server_config sc;
  struct hvdrun_store s;
  const char *url = etcd_url(o);
  hvd_status st;

  memset(&s, 0, sizeof(s));
  st = hvd_random_token(s.token);
  if (st == HVD_OK && url != NULL) {
    if ((st = etcd_job(url, &s)) == HVD_OK) {
      *out = s;
      return HVD_OK;
    }
    hvdrun_store_stop(&s);
    return st;
  }
  if (st == HVD_OK)
    st = store_address(o, cfg->remote, cfg->nremote, s.addr, sizeof(s.addr));
  if (st != HVD_OK)
    return st;
  s.loopback = !cfg->hosts_may_join && strcmp(s.addr, "127.0.0.1") == 0;
  rdzv_server_config_default(&sc);
  sc.bind_address = s.loopback ? "127.0.0.1" : NULL;
  sc.port = o->rendezvous_port;
  sc.token = s.token;
  sc.threads = 1;
  sc.blocking_scope = cfg->blocking_scope;
  if (rdzv_server_start(&sc, &s.server) != HVD_OK)
    return hvd_error_prefix("starting the rendezvous store");
  s.port = rdzv_server_port(s.server);
  *out = s;
  return HVD_OK;
}

void hvdrun_store_stop(struct hvdrun_store *s) {
  rdzv_server_stop(s->server);
  s->server = NULL;
  rdzv_client_destroy(s->client);
  s->client = NULL;
  free(s->url);
  s->url = NULL;
}
