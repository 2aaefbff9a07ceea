/*
 * Slurm's compressed lists: host lists such as "gpu[01-04,07],cpu-a[1-2]"
 * (SLURM_STEP_NODELIST, SLURM_JOB_NODELIST) and task counts such as
 * "2(x3),1" (SLURM_STEP_TASKS_PER_NODE).
 *
 * DESIGN. A host list is items separated by commas outside brackets; an
 * item is literal text and bracket groups, each group numbers and ranges
 * separated by commas ("01-04" keeps the low bound's width: 01 02 03 04).
 * Several groups in one item expand as their product, the leftmost
 * slowest, which is Slurm's order for "rack[1-2]-n[1-2]". Names keep the
 * list's order (Slurm hands lists out sorted already). The parser is
 * strict: an empty item or range, a reversed range, a stray bracket or a
 * name over 255 bytes is an error naming the place, and the expansion is
 * bounded by the caller's maximum before anything is allocated for it.
 * tests/fuzz runs it on arbitrary bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

enum { NAME_MAX_BYTES = 255, NUMBER_DIGITS_MAX = 9, GROUPS_MAX = 8 };

struct range {
  unsigned long lo, hi;
  int width;
};

/* One bracket group of an item: its ranges (pointers into the parse's own
 * array) and how many names it stands for. */
struct group {
  size_t first, nranges, size;
  size_t prefix_at, prefix_len; /* the literal text before it */
};

struct item {
  struct group groups[GROUPS_MAX];
  size_t ngroups;
  size_t tail_at, tail_len; /* the literal text after the last group */
  size_t count;
};

static hvd_status bad(const char *text, size_t at, const char *what) {
  return hvd_error(HVD_ERR_INVALID_ARGUMENT, "host list '%.200s': %s at offset %zu", text, what,
                   at);
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A number of at most NUMBER_DIGITS_MAX digits at text[*at]. */
static bool number(const char *text, size_t *at, unsigned long *value, int *width) {
  size_t start = *at;
  unsigned long v = 0;
  while (is_digit(text[*at]) && *at - start < NUMBER_DIGITS_MAX)
    v = v * 10 + (unsigned long)(text[(*at)++] - '0');
  if (*at == start || is_digit(text[*at]))
    return false;
  *value = v;
  *width = (int)(*at - start);
  return true;
}

/* Ranges of a group, from text[*at] (just past '[') to its ']'. */
static hvd_status parse_group(const char *text, size_t *at, struct range **ranges, size_t *nranges,
                              size_t *cap, size_t max_hosts, struct group *g) {
  g->first = *nranges;
  g->size = 0;
  for (;;) {
    struct range r;
    if (!number(text, at, &r.lo, &r.width))
      return bad(text, *at, "expected a number of at most 9 digits");
    r.hi = r.lo;
    if (text[*at] == '-') {
      int w;
      (*at)++;
      if (!number(text, at, &r.hi, &w))
        return bad(text, *at, "expected the range's upper bound");
      if (r.hi < r.lo)
        return bad(text, *at, "a range runs backwards");
    }
    if (r.hi - r.lo + 1 > max_hosts - g->size)
      return hvd_error(HVD_ERR_TOO_LARGE, "host list '%.200s' names more than %zu hosts", text,
                       max_hosts);
    g->size += r.hi - r.lo + 1;
    if (hvd_array_reserve(ranges, cap, *nranges + 1, sizeof(**ranges), 8) != HVD_OK)
      return hvd_error_prefix("host list '%.200s'", text);
    (*ranges)[(*nranges)++] = r;
    if (text[*at] == ']') {
      (*at)++;
      g->nranges = *nranges - g->first;
      return HVD_OK;
    }
    if (text[*at] != ',')
      return bad(text, *at, "expected ',' or ']'");
    (*at)++;
  }
}

/* Printable ASCII but the list's own punctuation. */
static bool literal_char(char c) {
  unsigned char u = (unsigned char)c;
  return u > ' ' && u < 0x7f && c != ',' && c != '[' && c != ']';
}

/* One item from text[*at] to the next top-level comma or the end. */
static hvd_status parse_item(const char *text, size_t *at, struct range **ranges, size_t *nranges,
                             size_t *cap, size_t max_hosts, struct item *it) {
  size_t lit = *at;
  hvd_status st;

  memset(it, 0, sizeof(*it));
  it->count = 1;
  for (;;) {
    while (literal_char(text[*at]))
      (*at)++;
    if (text[*at] != '[')
      break;
    if (it->ngroups == GROUPS_MAX)
      return bad(text, *at, "more than 8 bracket groups in one name");
    struct group *g = &it->groups[it->ngroups++];
    g->prefix_at = lit;
    g->prefix_len = *at - lit;
    (*at)++;
    if ((st = parse_group(text, at, ranges, nranges, cap, max_hosts, g)) != HVD_OK)
      return st;
    if (g->size > max_hosts / it->count)
      return hvd_error(HVD_ERR_TOO_LARGE, "host list '%.200s' names more than %zu hosts", text,
                       max_hosts);
    it->count *= g->size;
    lit = *at;
  }
  it->tail_at = lit;
  it->tail_len = *at - lit;
  if (text[*at] != '\0' && text[*at] != ',')
    return bad(text, *at, text[*at] == ']' ? "']' without '['" : "a character hosts cannot hold");
  if (it->ngroups == 0 && it->tail_len == 0)
    return bad(text, *at, "an empty name");
  return HVD_OK;
}

/* The length of an item's longest name, a bound checked before writing. */
static size_t longest(const struct item *it, const struct range *ranges) {
  size_t len = it->tail_len;
  for (size_t g = 0; g < it->ngroups; g++) {
    size_t digits = 0;
    for (size_t r = 0; r < it->groups[g].nranges; r++) {
      const struct range *x = &ranges[it->groups[g].first + r];
      char buf[16];
      int n = snprintf(buf, sizeof(buf), "%0*lu", x->width, x->hi);
      if ((size_t)n > digits)
        digits = (size_t)n;
    }
    len += it->groups[g].prefix_len + digits;
  }
  return len;
}

/* The value of group g's pos-th name. */
static void group_value(const struct group *g, const struct range *ranges, size_t pos,
                        unsigned long *value, int *width) {
  for (size_t r = 0; r < g->nranges; r++) {
    const struct range *x = &ranges[g->first + r];
    size_t n = x->hi - x->lo + 1;
    if (pos < n) {
      *value = x->lo + pos;
      *width = x->width;
      return;
    }
    pos -= n;
  }
}

/* Writes the item's names, NUL-terminated, at out->names + *used. */
static void expand(const char *text, const struct item *it, const struct range *ranges,
                   struct launch_hostlist *out, size_t *used) {
  for (size_t k = 0; k < it->count; k++) {
    char *name = out->names + *used;
    size_t len = 0, rest = k, div = it->count;
    for (size_t g = 0; g < it->ngroups; g++) {
      const struct group *grp = &it->groups[g];
      unsigned long v = 0;
      int w = 0;
      div /= grp->size;
      group_value(grp, ranges, rest / div, &v, &w);
      rest %= div;
      memcpy(name + len, text + grp->prefix_at, grp->prefix_len);
      len += grp->prefix_len;
      len += (size_t)sprintf(name + len, "%0*lu", w, v);
    }
    memcpy(name + len, text + it->tail_at, it->tail_len);
    len += it->tail_len;
    name[len] = '\0';
    out->offsets[out->count++] = *used;
    *used += len + 1;
  }
}

hvd_status launch_hostlist_parse(const char *text, size_t max_hosts, struct launch_hostlist *out) {
  struct launch_hostlist l = {0};
  struct range *ranges = NULL;
  struct item *items = NULL;
  size_t nranges = 0, cap = 0, nitems = 0, items_cap = 0, total = 0, bytes = 0, at = 0, used = 0;
  hvd_status st = HVD_OK;

  if (text == NULL || text[0] == '\0')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "an empty host list");
  while (st == HVD_OK) {
    if ((st = hvd_array_reserve(&items, &items_cap, nitems + 1, sizeof(*items), 4)) != HVD_OK) {
      hvd_error_prefix("host list '%.200s'", text);
      break;
    }
    st = parse_item(text, &at, &ranges, &nranges, &cap, max_hosts, &items[nitems]);
    if (st != HVD_OK)
      break;
    if (items[nitems].count > max_hosts - total) {
      st = hvd_error(HVD_ERR_TOO_LARGE, "host list '%.200s' names more than %zu hosts", text,
                     max_hosts);
      break;
    }
    size_t len = longest(&items[nitems], ranges);
    if (len > NAME_MAX_BYTES) {
      st = bad(text, at, "a host name longer than 255 bytes");
      break;
    }
    total += items[nitems].count;
    bytes += items[nitems].count * (len + 1);
    nitems++;
    if (text[at] == '\0')
      break;
    at++; /* the comma */
  }
  if (st == HVD_OK) {
    l.names = malloc(bytes);
    l.offsets = malloc(total * sizeof(*l.offsets));
    if (l.names == NULL || l.offsets == NULL)
      st = hvd_error(HVD_ERR_NO_MEMORY, "cannot expand host list '%.200s' (%zu hosts)", text,
                     total);
  }
  for (size_t i = 0; st == HVD_OK && i < nitems; i++)
    expand(text, &items[i], ranges, &l, &used);
  free(items);
  free(ranges);
  if (st != HVD_OK) {
    launch_hostlist_fini(&l);
    return st;
  }
  *out = l;
  return HVD_OK;
}

const char *launch_hostlist_get(const struct launch_hostlist *l, size_t i) {
  return i < l->count ? l->names + l->offsets[i] : NULL;
}

void launch_hostlist_fini(struct launch_hostlist *l) {
  free(l->names);
  free(l->offsets);
  memset(l, 0, sizeof(*l));
}

hvd_status launch_tasks_per_node_parse(const char *text, int *counts, size_t max_nodes,
                                       size_t *nnodes) {
  size_t at = 0, n = 0;

  if (text == NULL || text[0] == '\0')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "an empty task count list");
  for (;;) {
    unsigned long tasks, repeat = 1;
    int w;
    if (!number(text, &at, &tasks, &w) || tasks == 0 || tasks > (1u << 24))
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "task counts '%.200s': expected a count of 1 to 16777216 at offset %zu",
                       text, at);
    if (strncmp(text + at, "(x", 2) == 0) {
      at += 2;
      if (!number(text, &at, &repeat, &w) || repeat == 0 || text[at] != ')')
        return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                         "task counts '%.200s': expected '(x<repeat>)' at offset %zu", text, at);
      at++;
    }
    if (repeat > max_nodes - n)
      return hvd_error(HVD_ERR_TOO_LARGE, "task counts '%.200s' name more than %zu nodes", text,
                       max_nodes);
    for (unsigned long i = 0; i < repeat; i++)
      counts[n++] = (int)tasks;
    if (text[at] == '\0')
      break;
    if (text[at] != ',')
      return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "task counts '%.200s': expected ',' at offset %zu", text, at);
    at++;
  }
  *nnodes = n;
  return HVD_OK;
}
