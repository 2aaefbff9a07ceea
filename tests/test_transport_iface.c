/*
 * Unit tests for address selection and the listening socket of the
 * transport module (src/transport/iface.c, listener.c). test_transport.c
 * runs this suite; the file has no main of its own.
 *
 * Interface specs are matched against fake interface lists, so those tests
 * do not depend on this host. The rest use the host's real interfaces and
 * assert only what holds on any host with loopback (IPv6 checks skip when
 * IPv6 is unavailable).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/transport.h"

Suite *iface_suite(void);

/* ---- helpers ------------------------------------------------------------ */

static bool contains(const char *haystack, const char *needle) {
  return strstr(haystack, needle) != NULL;
}

#define ck_assert_contains(h, n) \
  ck_assert_msg(contains((h), (n)), "'%s' does not contain '%s'", (h), (n))

static struct net_addr addr_of(const char *text) {
  struct net_addr a;
  ck_assert_msg(net_addr_parse(text, &a) == HVD_OK, "%s: %s", text, hvd_last_error_message());
  return a;
}

static const char *fmt(const struct net_addr *a) {
  static char text[128];
  net_addr_format(a, text, sizeof(text));
  return text;
}

/* Addresses as getifaddrs lists them: every IPv4 address, then every IPv6. */
static const struct {
  const char *name;
  const char *addr;
} fake_host[] = {
    {"lo", "127.0.0.1"},      {"eth0", "10.0.0.5"},      {"eth1", "10.0.1.5"},
    {"eth0.100", "10.100.0.5"}, {"docker0", "172.17.0.1"}, {"ib0", "192.168.0.5"},
    {"lo", "::1"},            {"eth0", "2001:db8::5"},   {"ib0", "fd00::5"},
};
enum { FAKE_N = sizeof(fake_host) / sizeof(fake_host[0]) };

static void make_fake(struct net_iface *ifs) {
  for (size_t i = 0; i < FAKE_N; i++) {
    memset(&ifs[i], 0, sizeof(ifs[i]));
    snprintf(ifs[i].name, sizeof(ifs[i].name), "%s", fake_host[i].name);
    ifs[i].addr = addr_of(fake_host[i].addr);
    ifs[i].loopback = strcmp(fake_host[i].name, "lo") == 0;
  }
}

/* The distinct names the spec selects from the fake host, "eth0,eth1", or
 * "!<status>" on failure. */
static const char *match(const char *spec) {
  static char out[256];
  struct net_iface ifs[FAKE_N];
  bool selected[FAKE_N];
  size_t pos = 0;
  hvd_status st;

  make_fake(ifs);
  memset(selected, 0, sizeof(selected));
  st = net_iface_match(spec, ifs, FAKE_N, selected);
  if (st != HVD_OK) {
    snprintf(out, sizeof(out), "!%d", (int)st);
    return out;
  }
  out[0] = '\0';
  for (size_t i = 0; i < FAKE_N; i++) {
    bool seen = false;
    for (size_t j = 0; j < i; j++)
      seen |= selected[j] && strcmp(ifs[j].name, ifs[i].name) == 0;
    if (selected[i] && !seen)
      pos += (size_t)snprintf(out + pos, sizeof(out) - pos, "%s%s", pos ? "," : "", ifs[i].name);
  }
  return out;
}

static char not_found[8];
static char invalid[8];

static void init_codes(void) {
  snprintf(not_found, sizeof(not_found), "!%d", (int)HVD_ERR_NOT_FOUND);
  snprintf(invalid, sizeof(invalid), "!%d", (int)HVD_ERR_INVALID_ARGUMENT);
}

/* The host's first non-loopback address of `family` (AF_UNSPEC: any). */
static bool host_address(int family, struct net_addr *out) {
  struct net_iface ifs[NET_MAX_IFACES];
  size_t n = 0;

  ck_assert_int_eq(net_iface_list(ifs, NET_MAX_IFACES, &n), HVD_OK);
  for (size_t i = 0; i < n; i++) {
    if (!ifs[i].loopback && (family == AF_UNSPEC || ifs[i].addr.ss.ss_family == family)) {
      *out = ifs[i].addr;
      return true;
    }
  }
  return false;
}

static size_t count_host_addresses(bool loopback) {
  struct net_iface ifs[NET_MAX_IFACES];
  size_t n = 0;
  size_t count = 0;

  ck_assert_int_eq(net_iface_list(ifs, NET_MAX_IFACES, &n), HVD_OK);
  for (size_t i = 0; i < n; i++)
    count += ifs[i].loopback == loopback;
  return count;
}

static bool host_has_loopback(int family) {
  struct net_iface ifs[NET_MAX_IFACES];
  size_t n = 0;

  ck_assert_int_eq(net_iface_list(ifs, NET_MAX_IFACES, &n), HVD_OK);
  for (size_t i = 0; i < n; i++) {
    if (ifs[i].loopback && ifs[i].addr.ss.ss_family == family)
      return true;
  }
  return false;
}

static bool ipv6_available(void) {
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0)
    return false;
  close(fd);
  return true;
}

static int port_of(const struct sockaddr_storage *ss) {
  return ntohs(ss->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)ss)->sin6_port
                                         : ((const struct sockaddr_in *)ss)->sin_port);
}

/* Connects (blocking) to host:port and checks that `listener` accepts it. */
static void check_accepts(int listener, const char *host, int port) {
  struct net_addr a = addr_of(host);
  struct pollfd pfd = {.fd = listener, .events = POLLIN};
  int c = socket(a.ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int s;

  ck_assert_int_ge(c, 0);
  net_addr_set_port(&a, port);
  ck_assert_msg(connect(c, (struct sockaddr *)&a.ss, a.len) == 0, "connect %s:%d: %s", host,
                port, strerror(errno));
  ck_assert_int_eq(poll(&pfd, 1, 10000), 1);
  s = accept(listener, NULL, NULL);
  ck_assert_msg(s >= 0, "accept: %s", strerror(errno));
  close(s);
  close(c);
}

/* Holds `port` the way another process's listener would (IPv4 wildcard,
 * listening); returns -1 if the port is taken. */
static int occupy(int port) {
  struct sockaddr_in in4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  ck_assert_int_ge(fd, 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (struct sockaddr *)&in4, sizeof(in4)) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A run of `count` consecutive ports below the kernel's ephemeral range that
 * are all free right now; returns the first. */
static int free_ports(int count) {
  unsigned seed = (unsigned)getpid();

  for (int attempt = 0; attempt < 1000; attempt++) {
    int base = 20000 + (int)(rand_r(&seed) % 10000);
    bool ok = true;
    for (int i = 0; i < count && ok; i++) {
      int fd = occupy(base + i);
      ok = fd >= 0;
      if (ok)
        close(fd);
    }
    if (ok)
      return base;
  }
  ck_abort_msg("no run of %d free ports found", count);
  return -1;
}

/* ---- interface specs on a fake host --------------------------------------- */

START_TEST(test_match_exact_beats_prefix) {
  ck_assert_str_eq(match("eth0"), "eth0");
  ck_assert_str_eq(match("eth0.100"), "eth0.100");
  ck_assert_str_eq(match("ib0"), "ib0");
  ck_assert_str_eq(match("lo"), "lo");
  ck_assert_str_eq(match("=eth0"), "eth0");
}
END_TEST

START_TEST(test_match_prefix) {
  ck_assert_str_eq(match("eth"), "eth0,eth1,eth0.100");
  ck_assert_str_eq(match("e"), "eth0,eth1,eth0.100");
  ck_assert_str_eq(match("doc"), "docker0");
  ck_assert_str_eq(match("eth0."), "eth0.100");
  ck_assert_str_eq(match("i"), "ib0");
}
END_TEST

START_TEST(test_match_exact_only_not_found) {
  struct net_iface ifs[FAKE_N];
  bool selected[FAKE_N];
  const char *msg;

  init_codes();
  make_fake(ifs);
  for (size_t i = 0; i < FAKE_N; i++)
    selected[i] = true;
  ck_assert_int_eq(net_iface_match("=eth", ifs, FAKE_N, selected), HVD_ERR_NOT_FOUND);
  msg = hvd_last_error_message();
  ck_assert_contains(msg, "HOROVOD_GLOO_IFACE==eth selects no interface");
  /* One group per interface, its IPv4 and IPv6 addresses together. */
  ck_assert_contains(msg, "lo (127.0.0.1, ::1), eth0 (10.0.0.5, 2001:db8::5), eth1 (10.0.1.5)");
  ck_assert_contains(msg, "docker0 (172.17.0.1), ib0 (192.168.0.5, fd00::5)");
  for (size_t i = 0; i < FAKE_N; i++)
    ck_assert(selected[i]); /* untouched on failure */

  ck_assert_str_eq(match("eth9"), not_found);
  ck_assert_str_eq(match("=lo0"), not_found);
  ck_assert_str_eq(match("ethernet"), not_found);
  ck_assert_str_eq(match("^lo,eth,docker,ib"), not_found);
  ck_assert_str_eq(match("^e,l,d,i"), not_found);

  ck_assert_int_eq(net_iface_match("eth0", ifs, 0, selected), HVD_ERR_NOT_FOUND);
  ck_assert_contains(hvd_last_error_message(), "HOROVOD_GLOO_IFACE=eth0");
}
END_TEST

START_TEST(test_match_comma_list) {
  ck_assert_str_eq(match("eth1,ib"), "eth1,ib0");
  ck_assert_str_eq(match("ib,eth1"), "eth1,ib0"); /* interface order, not spec order */
  ck_assert_str_eq(match("eth0,=eth1"), "eth0,eth1");
  ck_assert_str_eq(match("eth0,eth0"), "eth0");
  ck_assert_str_eq(match("eth0,nonexistent0"), "eth0");
  ck_assert_str_eq(match("=eth,docker"), "docker0");
  ck_assert_str_eq(match("lo,eth"), "lo,eth0,eth1,eth0.100");
}
END_TEST

START_TEST(test_match_exclude) {
  ck_assert_str_eq(match("^docker,lo"), "eth0,eth1,eth0.100,ib0");
  ck_assert_str_eq(match("^=eth0"), "lo,eth1,eth0.100,docker0,ib0");
  ck_assert_str_eq(match("^eth0"), "lo,eth1,eth0.100,docker0,ib0"); /* exact beats prefix */
  ck_assert_str_eq(match("^eth"), "lo,docker0,ib0");
  ck_assert_str_eq(match("^=eth"), "lo,eth0,eth1,eth0.100,docker0,ib0");
  ck_assert_str_eq(match("^nonexistent0"), "lo,eth0,eth1,eth0.100,docker0,ib0");
  ck_assert_str_eq(match("^lo,=eth0.100,=docker0"), "eth0,eth1,ib0");
}
END_TEST

START_TEST(test_match_malformed) {
  static const char *const bad[] = {
      "",    ",",      "eth0,",     ",eth0", "eth0,,eth1", "^",     "^,",
      "=",   "eth0,=", "eth0,^lo",  "^^lo",  " eth0",      "eth0 ", "eth0, eth1",
      "^=",  "eth\t0", "abcdefghijklmnop",
  };
  struct net_iface ifs[FAKE_N];
  bool selected[FAKE_N];

  init_codes();
  make_fake(ifs);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    for (size_t j = 0; j < FAKE_N; j++)
      selected[j] = true;
    ck_assert_msg(net_iface_match(bad[i], ifs, FAKE_N, selected) == HVD_ERR_INVALID_ARGUMENT,
                  "spec '%s' accepted", bad[i]);
    ck_assert_contains(hvd_last_error_message(), "HOROVOD_GLOO_IFACE");
    ck_assert_contains(hvd_last_error_message(), "malformed");
    for (size_t j = 0; j < FAKE_N; j++)
      ck_assert(selected[j]);
  }
  ck_assert_str_eq(match("eth0,"), invalid);
  ck_assert_int_eq(net_iface_match(NULL, ifs, FAKE_N, selected), HVD_ERR_INVALID_ARGUMENT);
  /* 15 characters is the longest interface name. */
  ck_assert_str_eq(match("abcdefghijklmno"), not_found);
}
END_TEST

/* ---- addresses ------------------------------------------------------------ */

START_TEST(test_addr_round_trip) {
  static const struct {
    const char *text;
    const char *with_port;
    int family;
  } cases[] = {
      {"10.0.0.5", "10.0.0.5:4000", AF_INET},
      {"127.0.0.1", "127.0.0.1:4000", AF_INET},
      {"0.0.0.0", "0.0.0.0:4000", AF_INET},
      {"2001:db8::5", "[2001:db8::5]:4000", AF_INET6},
      {"::1", "[::1]:4000", AF_INET6},
      {"::", "[::]:4000", AF_INET6},
      {"::ffff:10.0.0.1", "[::ffff:10.0.0.1]:4000", AF_INET6},
      {"fe80::1%lo", "[fe80::1%lo]:4000", AF_INET6},
  };
  char text[128];

  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    struct net_addr a = addr_of(cases[i].text);
    ck_assert_int_eq(a.ss.ss_family, cases[i].family);
    ck_assert_uint_eq(a.len, cases[i].family == AF_INET ? sizeof(struct sockaddr_in)
                                                        : sizeof(struct sockaddr_in6));
    net_addr_format(&a, text, sizeof(text));
    ck_assert_str_eq(text, cases[i].text);
    net_addr_format_port(&a, 4000, text, sizeof(text));
    ck_assert_str_eq(text, cases[i].with_port);
  }
}
END_TEST

START_TEST(test_addr_scope_and_port) {
  struct net_addr a = addr_of("fe80::1%1");
  char ifname[IF_NAMESIZE];
  char expect[64];
  char text[64];

  ck_assert_uint_eq(((struct sockaddr_in6 *)&a.ss)->sin6_scope_id, 1);
  ck_assert_ptr_nonnull(if_indextoname(1, ifname));
  snprintf(expect, sizeof(expect), "fe80::1%%%s", ifname);
  net_addr_format(&a, text, sizeof(text));
  ck_assert_str_eq(text, expect);

  a = addr_of("fe80::1%4000000000"); /* no such interface: the index is kept */
  net_addr_format(&a, text, sizeof(text));
  ck_assert_str_eq(text, "fe80::1%4000000000");

  a = addr_of("10.0.0.5");
  ck_assert_uint_eq(((struct sockaddr_in *)&a.ss)->sin_port, 0);
  net_addr_set_port(&a, 65535);
  ck_assert_uint_eq(ntohs(((struct sockaddr_in *)&a.ss)->sin_port), 65535);
  a = addr_of("::1");
  net_addr_set_port(&a, 4000);
  ck_assert_uint_eq(ntohs(((struct sockaddr_in6 *)&a.ss)->sin6_port), 4000);
  net_addr_format(&a, text, sizeof(text)); /* the port is not part of the address text */
  ck_assert_str_eq(text, "::1");

  net_addr_format_port(&a, 4000, text, 6); /* truncated, still terminated */
  ck_assert_str_eq(text, "[::1]");
}
END_TEST

START_TEST(test_addr_parse_rejects) {
  static const char *const bad[] = {
      "",          "1.2.3",       "1.2.3.4:80",    "[::1]",       "::1%",  "fe80::1%nosuchif0",
      "localhost", "1.2.3.256",   " 1.2.3.4",      "1.2.3.4 ",    "0x7f.0.0.1", ":::1",
      "::1%0",     "2001:db8::g", "fe80::1%-1",
  };
  struct net_addr a;
  struct net_addr sentinel;

  memset(&sentinel, 0x5a, sizeof(sentinel));
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    a = sentinel;
    ck_assert_msg(net_addr_parse(bad[i], &a) == HVD_ERR_INVALID_ARGUMENT, "'%s' accepted",
                  bad[i]);
    ck_assert_msg(memcmp(&a, &sentinel, sizeof(a)) == 0, "'%s' wrote the output", bad[i]);
    ck_assert_contains(hvd_last_error_message(), bad[i]);
  }
  ck_assert_int_eq(net_addr_parse(NULL, &a), HVD_ERR_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_addr_loopback) {
  static const char *const yes[] = {"127.0.0.1", "127.1.2.3", "127.255.255.255", "::1",
                                    "::ffff:127.0.0.1", "::ffff:127.9.8.7"};
  static const char *const no[] = {"10.0.0.5", "128.0.0.1", "126.255.255.255", "0.0.0.0",
                                   "::", "::2", "::ffff:10.0.0.1", "fd00::1", "fe80::1%1",
                                   "::127.0.0.1"};

  for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
    struct net_addr a = addr_of(yes[i]);
    ck_assert_msg(net_addr_is_loopback(&a), "%s is loopback", yes[i]);
  }
  for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
    struct net_addr a = addr_of(no[i]);
    ck_assert_msg(!net_addr_is_loopback(&a), "%s is not loopback", no[i]);
  }
}
END_TEST

/* ---- this host's interfaces ----------------------------------------------- */

START_TEST(test_iface_list_host) {
  struct net_iface ifs[NET_MAX_IFACES];
  size_t n = 0;
  bool loopback = false;

  ck_assert_int_eq(net_iface_list(ifs, NET_MAX_IFACES, &n), HVD_OK);
  ck_assert_uint_ge(n, 1);
  for (size_t i = 0; i < n; i++) {
    const struct net_addr *a = &ifs[i].addr;
    ck_assert_uint_gt(strlen(ifs[i].name), 0);
    ck_assert(a->ss.ss_family == AF_INET || a->ss.ss_family == AF_INET6);
    ck_assert_uint_eq(a->len, a->ss.ss_family == AF_INET ? sizeof(struct sockaddr_in)
                                                         : sizeof(struct sockaddr_in6));
    if (a->ss.ss_family == AF_INET6) {
      const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&a->ss;
      ck_assert_msg(!IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr), "%s %s is link-local",
                    ifs[i].name, fmt(a));
      ck_assert_uint_eq(in6->sin6_port, 0);
    } else {
      ck_assert_uint_eq(((const struct sockaddr_in *)&a->ss)->sin_port, 0);
    }
    if (ifs[i].loopback) {
      loopback = true;
      ck_assert_msg(net_addr_is_loopback(a), "%s %s", ifs[i].name, fmt(a));
    }
  }
  ck_assert_msg(loopback, "no loopback interface found");

  /* max bounds what is written */
  memset(ifs, 0, sizeof(ifs));
  ck_assert_int_eq(net_iface_list(ifs, 1, &n), HVD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(ifs[1].addr.ss.ss_family, 0);
  ck_assert_int_eq(net_iface_list(ifs, 0, &n), HVD_OK);
  ck_assert_uint_eq(n, 0);
}
END_TEST

/* ---- address selection on this host ----------------------------------------- */

START_TEST(test_select_route_loopback) {
  struct net_addr out[NET_MAX_IFACES + 1];
  size_t others = count_host_addresses(false);
  size_t n = 0;

  ck_assert_int_eq(net_select_addresses(NULL, "127.0.0.1", 29500, out, NET_MAX_IFACES + 1, &n),
                   HVD_OK);
  ck_assert_uint_ge(n, 1);
  ck_assert_str_eq(fmt(&out[0]), "127.0.0.1");
  /* Then every non-loopback address of this host, IPv4 (the route's family) first. */
  ck_assert_uint_eq(n, 1 + others);
  for (size_t i = 1; i < n; i++) {
    ck_assert_msg(!net_addr_is_loopback(&out[i]), "%s", fmt(&out[i]));
    if (i > 1 && out[i].ss.ss_family == AF_INET)
      ck_assert_int_eq(out[i - 1].ss.ss_family, AF_INET);
  }
  for (size_t i = 0; i < n; i++)
    ck_assert_uint_eq(((struct sockaddr_in *)&out[i].ss)->sin_port, 0);

  /* max caps the list */
  ck_assert_int_eq(net_select_addresses(NULL, "127.0.0.1", 29500, out, 1, &n), HVD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert_str_eq(fmt(&out[0]), "127.0.0.1");
}
END_TEST

START_TEST(test_select_route_ipv6_loopback) {
  struct net_addr out[NET_MAX_IFACES + 1];
  size_t n = 0;

  if (!ipv6_available() || !host_has_loopback(AF_INET6))
    return; /* no ::1 here */
  ck_assert_int_eq(net_select_addresses(NULL, "[::1]", 29500, out, NET_MAX_IFACES + 1, &n),
                   HVD_OK);
  ck_assert_uint_eq(n, 1 + count_host_addresses(false));
  ck_assert_str_eq(fmt(&out[0]), "::1");
  for (size_t i = 1; i < n; i++) {
    ck_assert(!net_addr_is_loopback(&out[i]));
    if (i > 1 && out[i].ss.ss_family == AF_INET6)
      ck_assert_int_eq(out[i - 1].ss.ss_family, AF_INET6);
  }
  ck_assert_int_eq(net_select_addresses(NULL, "::1", 29500, out, 1, &n), HVD_OK);
  ck_assert_str_eq(fmt(&out[0]), "::1");
}
END_TEST

START_TEST(test_select_route_own_address) {
  struct net_addr own;
  struct net_addr out[NET_MAX_ADDRS];
  char host[128];
  size_t n = 0;

  if (!host_address(AF_UNSPEC, &own))
    return; /* loopback-only host */
  net_addr_format(&own, host, sizeof(host));
  ck_assert_int_eq(net_select_addresses(NULL, host, 29500, out, NET_MAX_ADDRS, &n), HVD_OK);
  ck_assert_uint_ge(n, 1);
  ck_assert_str_eq(fmt(&out[0]), host);
  ck_assert_uint_eq(n, 1); /* a non-loopback route needs nothing after it */
}
END_TEST

START_TEST(test_select_spec_lo) {
  struct net_addr out[NET_MAX_ADDRS];
  size_t n = 0;

  ck_assert_int_eq(net_select_addresses("lo", NULL, 0, out, NET_MAX_ADDRS, &n), HVD_OK);
  ck_assert_uint_ge(n, 1);
  ck_assert_uint_eq(n, count_host_addresses(true));
  for (size_t i = 0; i < n; i++)
    ck_assert_msg(net_addr_is_loopback(&out[i]), "%s", fmt(&out[i]));
  if (host_has_loopback(AF_INET))
    ck_assert_str_eq(fmt(&out[0]), "127.0.0.1");

  /* A server reached over IPv6 puts IPv6 first. */
  if (ipv6_available() && host_has_loopback(AF_INET6)) {
    ck_assert_int_eq(net_select_addresses("lo", "::1", 29500, out, NET_MAX_ADDRS, &n), HVD_OK);
    ck_assert_str_eq(fmt(&out[0]), "::1");
    ck_assert_int_eq(net_select_addresses("=lo", "127.0.0.1", 29500, out, NET_MAX_ADDRS, &n),
                     HVD_OK);
    ck_assert_str_eq(fmt(&out[0]), "127.0.0.1");
  }
}
END_TEST

START_TEST(test_select_spec_exclusion_skips_loopback) {
  struct net_addr out[NET_MAX_IFACES];
  size_t others = count_host_addresses(false);
  size_t n = 0;
  hvd_status st = net_select_addresses("^nonexistent0", NULL, 0, out, NET_MAX_IFACES, &n);

  if (others == 0) {
    ck_assert_int_eq(st, HVD_ERR_NOT_FOUND);
    ck_assert_contains(hvd_last_error_message(), "loopback");
    return;
  }
  ck_assert_int_eq(st, HVD_OK);
  ck_assert_uint_eq(n, others);
  for (size_t i = 0; i < n; i++) {
    ck_assert_msg(!net_addr_is_loopback(&out[i]), "%s", fmt(&out[i]));
    if (i > 0 && out[i].ss.ss_family == AF_INET)
      ck_assert_int_eq(out[i - 1].ss.ss_family, AF_INET);
  }
}
END_TEST

START_TEST(test_select_spec_not_found) {
  struct net_addr out[NET_MAX_ADDRS];
  size_t n = 777;

  ck_assert_int_eq(net_select_addresses("nonexistent0", "127.0.0.1", 29500, out, NET_MAX_ADDRS,
                                        &n),
                   HVD_ERR_NOT_FOUND);
  ck_assert_uint_eq(n, 777);
  ck_assert_contains(hvd_last_error_message(), "nonexistent0");
  ck_assert_contains(hvd_last_error_message(), "lo (");
  ck_assert_contains(hvd_last_error_message(), "127.0.0.1");

  ck_assert_int_eq(net_select_addresses("eth0,,lo", NULL, 0, out, NET_MAX_ADDRS, &n),
                   HVD_ERR_INVALID_ARGUMENT);
  ck_assert_uint_eq(n, 777);
}
END_TEST

START_TEST(test_select_no_server) {
  struct net_addr out[NET_MAX_ADDRS];
  size_t n = 0;

  ck_assert_int_eq(net_select_addresses(NULL, NULL, 0, out, NET_MAX_ADDRS, &n), HVD_OK);
  ck_assert_uint_eq(n, 1);
  ck_assert(net_addr_is_loopback(&out[0]));
  if (host_has_loopback(AF_INET))
    ck_assert_str_eq(fmt(&out[0]), "127.0.0.1");
}
END_TEST

START_TEST(test_select_unresolvable) {
  struct net_addr out[NET_MAX_ADDRS];
  size_t n = 777;

  ck_assert_int_ne(net_select_addresses(NULL, "no-such-host.invalid", 29500, out, NET_MAX_ADDRS,
                                        &n),
                   HVD_OK);
  ck_assert_uint_eq(n, 777);
  ck_assert_contains(hvd_last_error_message(), "cannot resolve rendezvous host");
  ck_assert_contains(hvd_last_error_message(), "'no-such-host.invalid'");

  ck_assert_int_eq(net_select_addresses(NULL, "", 29500, out, NET_MAX_ADDRS, &n),
                   HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(net_select_addresses(NULL, "127.0.0.1", 70000, out, NET_MAX_ADDRS, &n),
                   HVD_ERR_INVALID_ARGUMENT);
  ck_assert_uint_eq(n, 777);
}
END_TEST

/* ---- listening socket ------------------------------------------------------ */

START_TEST(test_listen_ephemeral) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  int fd = -1;
  int port = 0;
  int type = 0;
  socklen_t type_len = sizeof(type);

  ck_assert_int_eq(net_listen(AF_INET, NULL, &fd, &port), HVD_OK);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_gt(port, 0);
  ck_assert_int_le(port, 65535);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
  ck_assert_int_eq(port_of(&ss), port);
  ck_assert(fcntl(fd, F_GETFL) & O_NONBLOCK);
  ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  ck_assert_int_eq(getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &type, &type_len), 0);
  ck_assert_int_eq(type, 1);
  check_accepts(fd, "127.0.0.1", port);
  close(fd);

  ck_assert_int_eq(net_listen(AF_INET, "", &fd, &port), HVD_OK); /* "" is unset */
  ck_assert_int_gt(port, 0);
  check_accepts(fd, "127.0.0.1", port);
  close(fd);
}
END_TEST

START_TEST(test_listen_range_skips_taken_ports) {
  int base = free_ports(3);
  char range[32];
  int held[2];

  snprintf(range, sizeof(range), "%d-%d", base, base + 2);
  /* Listening holders, at every position of the free port. */
  for (int free_at = 0; free_at < 3; free_at++) {
    int k = 0;
    for (int i = 0; i < 3; i++) {
      if (i != free_at) {
        held[k] = occupy(base + i);
        ck_assert_int_ge(held[k], 0);
        k++;
      }
    }
    for (int round = 0; round < 8; round++) { /* random starts */
      int fd = -1;
      int port = 0;
      ck_assert_msg(net_listen(AF_INET, range, &fd, &port) == HVD_OK, "%s",
                    hvd_last_error_message());
      ck_assert_int_eq(port, base + free_at);
      check_accepts(fd, "127.0.0.1", port);
      close(fd);
    }
    close(held[0]);
    close(held[1]);
  }

  /* A single port. */
  snprintf(range, sizeof(range), "%d", base + 1);
  {
    int fd = -1;
    int port = 0;
    ck_assert_int_eq(net_listen(AF_INET, range, &fd, &port), HVD_OK);
    ck_assert_int_eq(port, base + 1);
    close(fd);
  }
}
END_TEST

START_TEST(test_listen_range_exhausted) {
  int base = free_ports(2);
  char range[32];
  int held[2];
  int fd = 777;
  int port = 777;

  held[0] = occupy(base);
  held[1] = occupy(base + 1);
  ck_assert_int_ge(held[0], 0);
  ck_assert_int_ge(held[1], 0);
  snprintf(range, sizeof(range), "%d-%d", base, base + 1);
  ck_assert_int_eq(net_listen(AF_INET, range, &fd, &port), HVD_ERR_NETWORK);
  ck_assert_contains(hvd_last_error_message(), "HVD_PORT_RANGE=");
  ck_assert_contains(hvd_last_error_message(), range);
  ck_assert_contains(hvd_last_error_message(), "all 2 in use");
  ck_assert_int_eq(fd, 777);
  ck_assert_int_eq(port, 777);

  snprintf(range, sizeof(range), "%d", base);
  ck_assert_int_eq(net_listen(AF_INET, range, &fd, &port), HVD_ERR_NETWORK);
  ck_assert_contains(hvd_last_error_message(), "all 1 in use");

  /* A dual-stack IPv6 listener collides with IPv4 holders too. */
  if (ipv6_available()) {
    snprintf(range, sizeof(range), "%d-%d", base, base + 1);
    ck_assert_int_eq(net_listen(AF_INET6, range, &fd, &port), HVD_ERR_NETWORK);
  }
  close(held[0]);
  close(held[1]);
}
END_TEST

START_TEST(test_listen_malformed_range) {
  static const char *const bad[] = {
      "40000-", "abc",    "5-1",    "0-10",   " 4-5",  "4-5 ",  "-5",     "+5-6", "1-65536",
      "65536",  "4--5",   "4-5-6",  "0",      "-",     "4-+5",  "40000-40100x", "4 -5",
      "99999999999999999999",
  };
  int fd = 777;
  int port = 777;

  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    ck_assert_msg(net_listen(AF_INET, bad[i], &fd, &port) == HVD_ERR_INVALID_ARGUMENT,
                  "'%s' accepted", bad[i]);
    ck_assert_contains(hvd_last_error_message(), "HVD_PORT_RANGE");
    ck_assert_contains(hvd_last_error_message(), bad[i]);
    ck_assert_int_eq(fd, 777);
    ck_assert_int_eq(port, 777);
  }
  ck_assert_int_eq(net_listen(AF_UNIX, NULL, &fd, &port), HVD_ERR_INVALID_ARGUMENT);
  ck_assert_int_eq(fd, 777);
}
END_TEST

START_TEST(test_listen_dual_stack) {
  int fd = -1;
  int port = 0;

  if (!ipv6_available())
    return;
  ck_assert_msg(net_listen(AF_INET6, NULL, &fd, &port) == HVD_OK, "%s",
                hvd_last_error_message());
  ck_assert_int_gt(port, 0);
  check_accepts(fd, "127.0.0.1", port); /* IPv4 reaches the IPv6 socket */
  if (host_has_loopback(AF_INET6))
    check_accepts(fd, "::1", port);
  close(fd);
}
END_TEST

Suite *iface_suite(void) {
  Suite *s = suite_create("iface");
  TCase *match_case = tcase_create("match");
  TCase *addr_case = tcase_create("addr");
  TCase *select_case = tcase_create("select");
  TCase *resolve_case = tcase_create("resolve");
  TCase *listen_case = tcase_create("listen");

  tcase_add_test(match_case, test_match_exact_beats_prefix);
  tcase_add_test(match_case, test_match_prefix);
  tcase_add_test(match_case, test_match_exact_only_not_found);
  tcase_add_test(match_case, test_match_comma_list);
  tcase_add_test(match_case, test_match_exclude);
  tcase_add_test(match_case, test_match_malformed);
  suite_add_tcase(s, match_case);

  tcase_add_test(addr_case, test_addr_round_trip);
  tcase_add_test(addr_case, test_addr_scope_and_port);
  tcase_add_test(addr_case, test_addr_parse_rejects);
  tcase_add_test(addr_case, test_addr_loopback);
  suite_add_tcase(s, addr_case);

  tcase_add_test(select_case, test_iface_list_host);
  tcase_add_test(select_case, test_select_route_loopback);
  tcase_add_test(select_case, test_select_route_ipv6_loopback);
  tcase_add_test(select_case, test_select_route_own_address);
  tcase_add_test(select_case, test_select_spec_lo);
  tcase_add_test(select_case, test_select_spec_exclusion_skips_loopback);
  tcase_add_test(select_case, test_select_spec_not_found);
  tcase_add_test(select_case, test_select_no_server);
  suite_add_tcase(s, select_case);

  /* A lost DNS packet costs the resolver's 5 s retry, more than once under load. */
  tcase_set_timeout(resolve_case, 60);
  tcase_add_test(resolve_case, test_select_unresolvable);
  suite_add_tcase(s, resolve_case);

  tcase_add_test(listen_case, test_listen_ephemeral);
  tcase_add_test(listen_case, test_listen_range_skips_taken_ports);
  tcase_add_test(listen_case, test_listen_range_exhausted);
  tcase_add_test(listen_case, test_listen_malformed_range);
  tcase_add_test(listen_case, test_listen_dual_stack);
  suite_add_tcase(s, listen_case);
  return s;
}
