/*
 * Addresses and interfaces: which addresses a rank advertises to its peers.
 *
 * DESIGN. With HOROVOD_GLOO_IFACE the user names the interfaces (NCCL-style
 * spec, see net_iface_match) and we advertise all their addresses. Without
 * it we ask the kernel which local address it would use to reach the
 * rendezvous server: connect() on a UDP socket sends nothing but fixes the
 * route, and getsockname() reports the route's source address. That address
 * reaches the server, so it most likely reaches the other ranks too. When
 * the server is on this host the route is loopback, which peers on other
 * hosts cannot use, so the host's other addresses follow it; peers try the
 * list in order. Loopback is advertised alone only when there is no server
 * (a single-process job).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "transport.h"

/* Room for "ffff:...:255.255.255.255%<ifname>". */
enum { ADDR_TEXT_MAX = INET6_ADDRSTRLEN + IF_NAMESIZE + 1 };

/* ---- addresses ------------------------------------------------------------ */

void net_addr_format(const struct net_addr *a, char *out, size_t size) {
  char host[INET6_ADDRSTRLEN] = "?";

  if (size == 0)
    return;
  if (a->ss.ss_family == AF_INET) {
    const struct sockaddr_in *in4 = (const struct sockaddr_in *)&a->ss;
    inet_ntop(AF_INET, &in4->sin_addr, host, sizeof(host));
    snprintf(out, size, "%s", host);
  } else if (a->ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
    char ifname[IF_NAMESIZE];
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    if (in6->sin6_scope_id == 0)
      snprintf(out, size, "%s", host);
    else if (if_indextoname(in6->sin6_scope_id, ifname) != NULL)
      snprintf(out, size, "%s%%%s", host, ifname);
    else
      snprintf(out, size, "%s%%%u", host, (unsigned)in6->sin6_scope_id);
  } else {
    snprintf(out, size, "(address family %d)", (int)a->ss.ss_family);
  }
}

void net_addr_format_port(const struct net_addr *a, int port, char *out, size_t size) {
  char host[ADDR_TEXT_MAX];

  net_addr_format(a, host, sizeof(host));
  if (a->ss.ss_family == AF_INET6)
    snprintf(out, size, "[%s]:%d", host, port);
  else
    snprintf(out, size, "%s:%d", host, port);
}

/* "%eth0" or "%2" after an IPv6 address. */
static bool parse_scope(const char *scope, uint32_t *index) {
  int64_t v;

  if (scope[0] == '\0')
    return false;
  if (isdigit((unsigned char)scope[0])) {
    if (!hvd_parse_int64(scope, strlen(scope), &v) || v < 1 || v > UINT32_MAX)
      return false;
    *index = (uint32_t)v;
    return true;
  }
  *index = if_nametoindex(scope);
  return *index != 0;
}

hvd_status net_addr_parse(const char *text, struct net_addr *out) {
  struct net_addr a;
  char host[INET6_ADDRSTRLEN];
  const char *percent;
  size_t host_len;

  memset(&a, 0, sizeof(a));
  if (text == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "no address given");
  if (strchr(text, ':') == NULL) {
    struct sockaddr_in *in4 = (struct sockaddr_in *)&a.ss;
    /* inet_pton, unlike inet_aton, takes only the dotted quad. */
    if (inet_pton(AF_INET, text, &in4->sin_addr) != 1)
      goto bad;
    in4->sin_family = AF_INET;
    a.len = sizeof(*in4);
  } else {
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&a.ss;
    percent = strchr(text, '%');
    host_len = percent != NULL ? (size_t)(percent - text) : strlen(text);
    if (host_len >= sizeof(host))
      goto bad;
    memcpy(host, text, host_len);
    host[host_len] = '\0';
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
      goto bad;
    if (percent != NULL && !parse_scope(percent + 1, &in6->sin6_scope_id))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "address '%s': '%s' is not an interface of this host or a scope index",
                       text, percent + 1);
    in6->sin6_family = AF_INET6;
    a.len = sizeof(*in6);
  }
  *out = a;
  return HVD_OK;
bad:
  return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "'%s' is not a numeric IPv4 or IPv6 address (expected e.g. 10.0.0.5 or "
                   "fe80::1%%eth0, without port or brackets)",
                   text);
}

bool net_addr_is_loopback(const struct net_addr *a) {
  if (a->ss.ss_family == AF_INET) {
    const struct sockaddr_in *in4 = (const struct sockaddr_in *)&a->ss;
    return (ntohl(in4->sin_addr.s_addr) >> 24) == 127;
  }
  if (a->ss.ss_family == AF_INET6) {
    const struct in6_addr *in6 = &((const struct sockaddr_in6 *)&a->ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(in6) || (IN6_IS_ADDR_V4MAPPED(in6) && in6->s6_addr[12] == 127);
  }
  return false;
}

void net_addr_set_port(struct net_addr *a, int port) {
  if (a->ss.ss_family == AF_INET)
    ((struct sockaddr_in *)&a->ss)->sin_port = htons((uint16_t)port);
  else if (a->ss.ss_family == AF_INET6)
    ((struct sockaddr_in6 *)&a->ss)->sin6_port = htons((uint16_t)port);
}

bool net_addr_equal(const struct net_addr *a, const struct net_addr *b) {
  if (a->ss.ss_family != b->ss.ss_family)
    return false;
  if (a->ss.ss_family == AF_INET)
    return ((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr ==
           ((const struct sockaddr_in *)&b->ss)->sin_addr.s_addr;
  if (a->ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *x = (const struct sockaddr_in6 *)&a->ss;
    const struct sockaddr_in6 *y = (const struct sockaddr_in6 *)&b->ss;
    return memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) == 0 &&
           x->sin6_scope_id == y->sin6_scope_id;
  }
  return false;
}

/* ---- interfaces ----------------------------------------------------------- */

hvd_status net_iface_list(struct net_iface *out, size_t max, size_t *n) {
  struct ifaddrs *list = NULL;
  size_t count = 0;
  size_t dropped = 0;

  if (getifaddrs(&list) != 0)
    return hvd_error(HVD_ERR_IO, "getifaddrs: %s (cannot list this host's network interfaces)",
                     strerror(errno));
  for (const struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
    struct net_iface *f;
    int family;

    if (ifa->ifa_addr == NULL || (ifa->ifa_flags & IFF_UP) == 0)
      continue;
    family = ifa->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6)
      continue;
    if (family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr))
      continue;
    if (count == max) {
      dropped++;
      continue;
    }
    f = &out[count++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", ifa->ifa_name);
    f->addr.len = family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    memcpy(&f->addr.ss, ifa->ifa_addr, f->addr.len);
    net_addr_set_port(&f->addr, 0);
    f->loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
  }
  freeifaddrs(list);
  if (dropped > 0)
    HVD_LOG_DEBUG("net_iface_list: %zu interface addresses beyond the first %zu ignored", dropped,
                  max);
  *n = count;
  return HVD_OK;
}

/* Appends to a fixed buffer; text that does not fit is cut and marked. */
static void append(char *buf, size_t size, size_t *pos, const char *fmt, ...) HVD_PRINTF(4, 5);
static void append(char *buf, size_t size, size_t *pos, const char *fmt, ...) {
  va_list ap;
  int w;

  if (*pos + 1 >= size)
    return;
  va_start(ap, fmt);
  w = vsnprintf(buf + *pos, size - *pos, fmt, ap);
  va_end(ap);
  if (w < 0)
    return;
  if ((size_t)w >= size - *pos) {
    *pos = size - 1;
    if (size >= 4)
      memcpy(buf + size - 4, "...", 4);
    return;
  }
  *pos += (size_t)w;
}

/* "lo (127.0.0.1, ::1), eth0 (10.0.0.5)": one group per name, first-seen order. */
static void describe_ifaces(const struct net_iface *ifs, size_t n, char *buf, size_t size) {
  size_t pos = 0;

  buf[0] = '\0';
  if (n == 0) {
    append(buf, size, &pos, "no interface that is up and has an address");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    const char *sep = "";

    for (size_t j = 0; j < i && !seen; j++)
      seen = strcmp(ifs[j].name, ifs[i].name) == 0;
    if (seen)
      continue;
    append(buf, size, &pos, "%s%s (", i > 0 ? ", " : "", ifs[i].name);
    for (size_t j = i; j < n; j++) {
      char text[ADDR_TEXT_MAX];
      if (strcmp(ifs[j].name, ifs[i].name) != 0)
        continue;
      net_addr_format(&ifs[j].addr, text, sizeof(text));
      append(buf, size, &pos, "%s%s", sep, text);
      sep = ", ";
    }
    append(buf, size, &pos, ")");
  }
}

/* One entry of a spec: a name or prefix, `len` bytes at `name`. */
struct entry {
  const char *name;
  size_t len;
  bool exact;
};

/* Splits the entry at *p off the comma list and advances *p past it. */
static void next_entry(const char **p, struct entry *e) {
  const char *end = strchr(*p, ',');
  size_t len = end != NULL ? (size_t)(end - *p) : strlen(*p);

  e->exact = len > 0 && (*p)[0] == '=';
  e->name = *p + e->exact;
  e->len = len - e->exact;
  *p = end != NULL ? end + 1 : *p + len;
}

static hvd_status check_spec(const char *spec) {
  const char *p = spec + (spec[0] == '^');
  const char *why = NULL;
  struct entry e;

  if (*p == '\0')
    why = spec[0] == '^' ? "nothing after '^'" : "empty";
  while (why == NULL) {
    bool last;

    next_entry(&p, &e);
    last = e.name + e.len == p; /* no comma followed */
    if (e.len == 0)
      why = "blank entry";
    else if (e.len >= IF_NAMESIZE)
      why = "an interface name has at most 15 characters";
    for (size_t i = 0; i < e.len && why == NULL; i++) {
      if (isspace((unsigned char)e.name[i]))
        why = "whitespace in an entry";
      else if (e.name[i] == '^')
        why = "'^' is allowed only at the start of the whole spec";
    }
    if (last)
      break;
  }
  if (why != NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "HOROVOD_GLOO_IFACE='%s' is malformed: %s (expected a comma list of "
                     "interface names or prefixes, '=name' for an exact name, and an optional "
                     "leading '^' to exclude instead, e.g. 'eth0,ib' or '^docker,lo')",
                     spec, why);
  return HVD_OK;
}

static bool name_is(const char *name, const struct entry *e) {
  return strlen(name) == e->len && memcmp(name, e->name, e->len) == 0;
}

/* Whether the entry picks ifs[i]: its exact name, else (unless "=") a prefix of it. */
static bool entry_matches(const struct entry *e, const struct net_iface *ifs, size_t n,
                          size_t i) {
  if (name_is(ifs[i].name, e))
    return true;
  if (e->exact || strncmp(ifs[i].name, e->name, e->len) != 0)
    return false;
  for (size_t j = 0; j < n; j++) {
    if (name_is(ifs[j].name, e))
      return false; /* an interface has exactly this name, so it is not a prefix */
  }
  return true;
}

static bool spec_selects(const char *spec, const struct net_iface *ifs, size_t n, size_t i) {
  bool exclude = spec[0] == '^';
  const char *p = spec + exclude;
  struct entry e;

  while (*p != '\0') {
    next_entry(&p, &e);
    if (entry_matches(&e, ifs, n, i))
      return !exclude;
  }
  return exclude;
}

hvd_status net_iface_match(const char *spec, const struct net_iface *ifs, size_t n,
                           bool *selected) {
  char have[HVD_ERROR_MESSAGE_MAX / 2];
  size_t count = 0;
  hvd_status st;

  if (spec == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "no HOROVOD_GLOO_IFACE spec given");
  st = check_spec(spec);
  if (st != HVD_OK)
    return st;
  for (size_t i = 0; i < n; i++)
    count += spec_selects(spec, ifs, n, i);
  if (count == 0) {
    describe_ifaces(ifs, n, have, sizeof(have));
    return hvd_error(HVD_ERR_NOT_FOUND,
                     "HOROVOD_GLOO_IFACE=%s selects no interface; this host has: %s", spec, have);
  }
  for (size_t i = 0; i < n; i++)
    selected[i] = spec_selects(spec, ifs, n, i);
  return HVD_OK;
}

/* ---- address selection ---------------------------------------------------- */

/* A candidate list; ADDRS_MAX bounds what any of the choices below can add. */
enum { ADDRS_MAX = NET_MAX_IFACES + 1 };

struct addr_list {
  struct net_addr addr[ADDRS_MAX];
  size_t n;
};

static void add_unique(struct addr_list *l, const struct net_addr *a) {
  for (size_t i = 0; i < l->n; i++) {
    if (net_addr_equal(&l->addr[i], a))
      return;
  }
  if (l->n < ADDRS_MAX) {
    l->addr[l->n] = *a;
    net_addr_set_port(&l->addr[l->n], 0);
    l->n++;
  }
}

/* Accepts "[::1]" as well as "::1". */
static hvd_status strip_brackets(const char *host, char *out, size_t size) {
  size_t len = strlen(host);

  if (len >= 2 && host[0] == '[' && host[len - 1] == ']') {
    host++;
    len -= 2;
  }
  if (len == 0)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "the rendezvous host name is empty");
  if (len >= size)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous host name of %zu bytes is too long",
                     len);
  memcpy(out, host, len);
  out[len] = '\0';
  return HVD_OK;
}

/* The local address of the route to host:port (a UDP connect sends nothing). */
static hvd_status route_source(const char *route_host, int route_port, struct net_addr *local) {
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM,
                           .ai_flags = AI_NUMERICSERV};
  struct addrinfo *list = NULL;
  char host[NI_MAXHOST];
  char service[16];
  char where[ADDR_TEXT_MAX + 8] = "";
  const char *call = "connect";
  int err = 0;
  int rc;
  hvd_status st;

  st = strip_brackets(route_host, host, sizeof(host));
  if (st != HVD_OK)
    return st;
  if (route_port < 0 || route_port > 65535)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "rendezvous port %d is not in 0-65535",
                     route_port);
  /* Port 0 is not routable as a destination; routing ignores ports anyway. */
  snprintf(service, sizeof(service), "%d", route_port > 0 ? route_port : 9);
  rc = getaddrinfo(host, service, &hints, &list);
  if (rc != 0)
    return hvd_error(HVD_ERR_NETWORK,
                     "cannot resolve rendezvous host '%s': %s (check the host name and DNS, or "
                     "set HOROVOD_GLOO_IFACE)",
                     host, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
  st = HVD_ERR_NETWORK;
  for (const struct addrinfo *ai = list; ai != NULL; ai = ai->ai_next) {
    struct net_addr peer = {.len = ai->ai_addrlen};
    socklen_t len = sizeof(local->ss);
    int fd;

    memcpy(&peer.ss, ai->ai_addr, ai->ai_addrlen);
    net_addr_format_port(&peer, route_port, where, sizeof(where));
    fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      call = "socket";
      continue;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      call = "connect";
    } else if (getsockname(fd, (struct sockaddr *)&local->ss, &len) != 0) {
      err = errno;
      call = "getsockname";
    } else {
      local->len = len;
      net_addr_set_port(local, 0);
      st = HVD_OK;
    }
    close(fd);
    if (st == HVD_OK)
      goto out;
  }
  hvd_error(HVD_ERR_NETWORK,
            "no route to rendezvous host '%s' (%s): %s: %s (check the address and this host's "
            "network configuration, or set HOROVOD_GLOO_IFACE)",
            host, where, call, strerror(err));
out:
  freeaddrinfo(list);
  return st;
}

static hvd_status select_by_spec(const char *spec, const char *route_host, int route_port,
                                 struct addr_list *l) {
  struct net_iface ifs[NET_MAX_IFACES];
  bool selected[NET_MAX_IFACES];
  char have[HVD_ERROR_MESSAGE_MAX / 2];
  struct net_addr server_side;
  int first = AF_INET;
  size_t n;
  hvd_status st;

  st = net_iface_list(ifs, NET_MAX_IFACES, &n);
  if (st != HVD_OK)
    return st;
  st = net_iface_match(spec, ifs, n, selected);
  if (st != HVD_OK)
    return st;
  /* Loopback is only for a spec that names it; "^docker" means the real NICs. */
  if (spec[0] == '^') {
    for (size_t i = 0; i < n; i++)
      selected[i] = selected[i] && !ifs[i].loopback;
  }
  if (route_host != NULL) {
    /* The rendezvous client reports an unreachable server better than we can. */
    if (route_source(route_host, route_port, &server_side) == HVD_OK) {
      first = server_side.ss.ss_family;
    } else {
      HVD_LOG_DEBUG("HOROVOD_GLOO_IFACE=%s: no route to %s, listing IPv4 first", spec,
                    route_host);
      hvd_error_clear();
    }
  }
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      bool want = (ifs[i].addr.ss.ss_family == first) == (pass == 0);
      if (selected[i] && want)
        add_unique(l, &ifs[i].addr);
    }
  }
  if (l->n == 0) {
    describe_ifaces(ifs, n, have, sizeof(have));
    return hvd_error(HVD_ERR_NOT_FOUND,
                     "HOROVOD_GLOO_IFACE=%s selects only loopback interfaces, which are used only "
                     "when named (e.g. HOROVOD_GLOO_IFACE=lo); this host has: %s",
                     spec, have);
  }
  return HVD_OK;
}

static hvd_status select_by_route(const char *route_host, int route_port, struct addr_list *l) {
  struct net_iface ifs[NET_MAX_IFACES];
  struct net_addr local;
  size_t n;
  hvd_status st;

  st = route_source(route_host, route_port, &local);
  if (st != HVD_OK)
    return st;
  add_unique(l, &local);
  if (!net_addr_is_loopback(&local))
    return HVD_OK;
  /* The server is on this host; peers elsewhere need a real address. */
  st = net_iface_list(ifs, NET_MAX_IFACES, &n);
  if (st != HVD_OK)
    return st;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < n; i++) {
      bool same = ifs[i].addr.ss.ss_family == local.ss.ss_family;
      if (!ifs[i].loopback && !net_addr_is_loopback(&ifs[i].addr) && same == (pass == 0))
        add_unique(l, &ifs[i].addr);
    }
  }
  return HVD_OK;
}

static hvd_status select_loopback(struct addr_list *l) {
  struct net_iface ifs[NET_MAX_IFACES];
  struct net_addr a;
  bool have_v4 = false;
  bool have_v6 = false;
  size_t n;
  hvd_status st;

  st = net_iface_list(ifs, NET_MAX_IFACES, &n);
  if (st != HVD_OK)
    return st;
  for (size_t i = 0; i < n; i++) {
    if (net_addr_is_loopback(&ifs[i].addr)) {
      have_v4 |= ifs[i].addr.ss.ss_family == AF_INET;
      have_v6 |= ifs[i].addr.ss.ss_family == AF_INET6;
    }
  }
  st = net_addr_parse(have_v6 && !have_v4 ? "::1" : "127.0.0.1", &a);
  if (st != HVD_OK)
    return st;
  add_unique(l, &a);
  return HVD_OK;
}

hvd_status net_select_addresses(const char *spec, const char *route_host, int route_port,
                                struct net_addr *out, size_t max, size_t *n) {
  struct addr_list l;
  hvd_status st;

  l.n = 0;
  if (spec != NULL)
    st = select_by_spec(spec, route_host, route_port, &l);
  else if (route_host != NULL)
    st = select_by_route(route_host, route_port, &l);
  else
    st = select_loopback(&l);
  if (st != HVD_OK)
    return st;
  if (l.n > max)
    l.n = max;
  memcpy(out, l.addr, l.n * sizeof(l.addr[0]));
  *n = l.n;
  return HVD_OK;
}
