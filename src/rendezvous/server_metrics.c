/*
 * GET /metrics: the job's metrics in the Prometheus text exposition format,
 * merged from the snapshots its ranks keep in scope hvd_metrics (see
 * docs/observability.md).
 *
 * DESIGN. The server knows no metric by name: a snapshot is exposition
 * text of one rank (HELP and TYPE lines, then that family's samples) after
 * a first line "# hvd-metrics round=<R> host=<H>". Families are merged by
 * name, in the order they first appear, and every sample gets the labels
 * rank (the snapshot's key) and host put first. The text comes from ranks
 * that hold the job's token, but it is checked all the same: a line that
 * is not a plain sample of the current family (a name, labels whose values
 * hold no quote, backslash or newline, a number) is dropped, so what is
 * served is always valid exposition. In an elastic job, only the snapshots
 * of the latest round are served: the keys of ranks that left stay behind.
 * The work is done per scrape (one every few seconds), not per push.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "rendezvous.h"

enum {
  FAMILIES_MAX = 128,
  NAME_MAX_BYTES = 128,
  HELP_MAX_BYTES = 512,
  OUTPUT_MAX = 64 << 20,
};

struct family {
  char name[NAME_MAX_BYTES];
  char type[16];
  char help[HELP_MAX_BYTES];
  struct hvd_buf samples;
};

struct merge {
  struct family *fams; /* FAMILIES_MAX */
  size_t n;
};

static bool name_char(char c, bool first) {
  return isalpha((unsigned char)c) || c == '_' || c == ':' || (!first && isdigit((unsigned char)c));
}

/* Length of the metric or label name at p (0: none). */
static size_t name_len(const char *p, const char *end) {
  size_t n = 0;
  while (p + n < end && name_char(p[n], n == 0))
    n++;
  return n;
}

/* The labels "{...}" at p, as name="value" pairs; their end, or NULL. */
static const char *labels_end(const char *p, const char *end) {
  if (p >= end || *p != '{')
    return p;
  p++;
  while (p < end && *p != '}') {
    size_t n = name_len(p, end);
    if (n == 0 || p + n + 1 >= end || p[n] != '=' || p[n + 1] != '"')
      return NULL;
    if ((n == 4 && memcmp(p, "rank", 4) == 0) || (n == 4 && memcmp(p, "host", 4) == 0))
      return NULL; /* ours */
    p += n + 2;
    while (p < end && *p != '"' && *p != '\\')
      p++;
    if (p >= end || *p != '"')
      return NULL;
    p++;
    if (p < end && *p == ',')
      p++;
  }
  return p < end ? p + 1 : NULL;
}

static bool number(const char *p, const char *end) {
  char text[40], *stop;
  size_t n = (size_t)(end - p);
  if (n == 0 || n >= sizeof(text))
    return false;
  memcpy(text, p, n);
  text[n] = '\0';
  if (strcmp(text, "+Inf") == 0 || strcmp(text, "-Inf") == 0 || strcmp(text, "NaN") == 0)
    return true;
  (void)strtod(text, &stop);
  return *stop == '\0' && strchr(text, 'n') == NULL && strchr(text, 'N') == NULL &&
         strchr(text, 'i') == NULL && strchr(text, 'I') == NULL;
}

/* Whether a sample name belongs to family f (a histogram's _bucket, ...). */
static bool belongs(const struct family *f, const char *p, size_t n) {
  size_t fl = strlen(f->name);
  if (n < fl || memcmp(p, f->name, fl) != 0)
    return false;
  if (n == fl)
    return true;
  if (strcmp(f->type, "histogram") != 0 && strcmp(f->type, "summary") != 0)
    return false;
  p += fl;
  n -= fl;
  return (n == 7 && memcmp(p, "_bucket", 7) == 0) || (n == 4 && memcmp(p, "_sum", 4) == 0) ||
         (n == 6 && memcmp(p, "_count", 6) == 0);
}

static struct family *find(struct merge *m, const char *name, size_t n) {
  for (size_t i = 0; i < m->n; i++)
    if (strlen(m->fams[i].name) == n && memcmp(m->fams[i].name, name, n) == 0)
      return &m->fams[i];
  return NULL;
}

/* "# TYPE name type" or "# HELP name text": the family it names (made if
 * new and there is room), NULL if the line is malformed or disagrees. */
static struct family *comment(struct merge *m, const char *p, const char *end, bool *is_type) {
  bool type = end - p > 7 && memcmp(p, "# TYPE ", 7) == 0;
  bool help = end - p > 7 && memcmp(p, "# HELP ", 7) == 0;
  struct family *f;
  size_t n;

  *is_type = type;
  if (!type && !help)
    return NULL;
  p += 7;
  n = name_len(p, end);
  if (n == 0 || n >= NAME_MAX_BYTES || p + n >= end || p[n] != ' ')
    return NULL;
  f = find(m, p, n);
  if (f == NULL) {
    if (m->n == FAMILIES_MAX)
      return NULL;
    f = &m->fams[m->n++];
    memcpy(f->name, p, n);
    f->name[n] = '\0';
    hvd_buf_init(&f->samples, OUTPUT_MAX);
  }
  p += n + 1;
  n = (size_t)(end - p);
  if (type) {
    static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    bool known = false;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
      known = known || (strlen(types[i]) == n && memcmp(types[i], p, n) == 0);
    if (!known)
      return NULL;
    if (f->type[0] == '\0')
      snprintf(f->type, sizeof(f->type), "%.*s", (int)n, p);
    else if (strlen(f->type) != n || memcmp(f->type, p, n) != 0)
      return NULL; /* ranks disagree: the first one's stands */
  } else if (f->help[0] == '\0' && n < HELP_MAX_BYTES && memchr(p, '\\', n) == NULL) {
    memcpy(f->help, p, n);
    f->help[n] = '\0';
  }
  return f;
}

/* One sample line of family f from rank, labelled (rank first, then host). */
static void sample(struct family *f, const char *p, const char *end, const char *labels) {
  size_t n = name_len(p, end);
  const char *after, *value;

  if (f == NULL || n == 0 || !belongs(f, p, n))
    return;
  after = labels_end(p + n, end);
  if (after == NULL || after >= end || *after != ' ')
    return;
  value = after + 1;
  if (!number(value, end))
    return;
  hvd_buf_append(&f->samples, p, n);
  hvd_buf_printf(&f->samples, "{%s", labels);
  if (p[n] == '{' && after - (p + n) > 2) { /* the rank's own labels, without the braces */
    hvd_buf_append(&f->samples, ",", 1);
    hvd_buf_append(&f->samples, p + n + 1, (size_t)(after - (p + n) - 2));
  }
  hvd_buf_append(&f->samples, "} ", 2);
  hvd_buf_append(&f->samples, value, (size_t)(end - value));
  hvd_buf_append(&f->samples, "\n", 1);
}

/* The snapshot's round and host from its first line (0 and "" without one). */
static void header(const char *text, size_t len, uint64_t *round, const char **host,
                   size_t *host_len) {
  static const char tag[] = "# hvd-metrics round=";
  const char *nl = memchr(text, '\n', len), *h;
  *round = 0;
  *host = "";
  *host_len = 0;
  if (nl == NULL || len < sizeof(tag) - 1 || memcmp(text, tag, sizeof(tag) - 1) != 0)
    return;
  *round = strtoull(text + sizeof(tag) - 1, NULL, 10);
  h = strstr(text, " host=");
  if (h != NULL && h < nl) {
    *host = h + 6;
    *host_len = (size_t)(nl - *host);
  }
}

/* The labels every sample of a rank gets: rank="R",host="H" (escaped). */
static void rank_labels(char *out, size_t size, const char *rank, size_t rank_len,
                        const char *host, size_t host_len) {
  size_t at = (size_t)snprintf(out, size, "rank=\"%.*s\",host=\"", (int)rank_len, rank);
  for (size_t i = 0; i < host_len && at + 3 < size; i++) {
    char c = host[i];
    if (c == '\\' || c == '"' || c == '\n') {
      out[at++] = '\\';
      c = c == '\n' ? 'n' : c;
    }
    out[at++] = c;
  }
  snprintf(out + at, size - at, "\"");
}

static bool decimal(const char *p, size_t n) {
  if (n == 0 || n > 9)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!isdigit((unsigned char)p[i]))
      return false;
  return true;
}

static void merge_rank(struct merge *m, const struct rdzv_entry *e) {
  const char *text = (const char *)e->value, *end = text + e->value_len, *host;
  struct family *cur = NULL;
  char labels[600];
  size_t host_len;
  uint64_t round;

  header(text, e->value_len, &round, &host, &host_len);
  rank_labels(labels, sizeof(labels), e->key, e->key_len, host, host_len);
  while (text < end) {
    const char *nl = memchr(text, '\n', (size_t)(end - text));
    const char *line_end = nl != NULL ? nl : end;
    if (text < line_end && text[0] == '#') {
      bool is_type;
      struct family *f = comment(m, text, line_end, &is_type);
      if (is_type)
        cur = f; /* a bad TYPE line: its samples go too */
    } else if (text < line_end) {
      sample(cur, text, line_end, labels);
    }
    text = nl != NULL ? nl + 1 : end;
  }
}

hvd_status rdzv_metrics_render(struct rdzv_store *store, struct hvd_buf *out) {
  struct rdzv_scope_view view = {0};
  struct rdzv_blob *blob = NULL;
  struct merge m = {0};
  uint64_t latest = 0;
  size_t count = 0;
  char *body;
  hvd_status st;

  st = rdzv_store_snapshot(store, RDZV_METRICS_SCOPE, strlen(RDZV_METRICS_SCOPE), &blob, &count);
  if (st != HVD_OK)
    return st;
  body = malloc(blob->len + 1);
  if (body == NULL) {
    rdzv_blob_unref(blob);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot copy the metrics' snapshots");
  }
  memcpy(body, blob->data, blob->len);
  body[blob->len] = '\0';
  st = rdzv_scope_decode(body, blob->len, &view);
  rdzv_blob_unref(blob);
  if (st != HVD_OK)
    return st;
  if ((m.fams = calloc(FAMILIES_MAX, sizeof(*m.fams))) == NULL) {
    rdzv_scope_view_fini(&view);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot merge the metrics' snapshots");
  }
  for (size_t i = 0; i < view.count; i++) {
    const char *host;
    size_t host_len;
    uint64_t round;
    header((const char *)view.entries[i].value, view.entries[i].value_len, &round, &host,
           &host_len);
    latest = round > latest ? round : latest;
  }
  for (size_t i = 0; i < view.count; i++) { /* in rank order: the keys sort numerically */
    const struct rdzv_entry *e = &view.entries[i];
    const char *host;
    size_t host_len;
    uint64_t round;
    header((const char *)e->value, e->value_len, &round, &host, &host_len);
    if (round == latest && decimal(e->key, e->key_len))
      merge_rank(&m, e);
  }
  hvd_buf_reset(out);
  for (size_t i = 0; i < m.n && st == HVD_OK; i++) {
    struct family *f = &m.fams[i];
    if (f->type[0] == '\0')
      continue; /* HELP without TYPE: no samples were taken */
    if (f->help[0] != '\0')
      st = hvd_buf_printf(out, "# HELP %s %s\n", f->name, f->help);
    if (st == HVD_OK)
      st = hvd_buf_printf(out, "# TYPE %s %s\n", f->name, f->type);
    if (st == HVD_OK && f->samples.len > 0)
      st = hvd_buf_append(out, f->samples.data, f->samples.len);
  }
  for (size_t i = 0; i < m.n; i++)
    hvd_buf_fini(&m.fams[i].samples);
  free(m.fams);
  rdzv_scope_view_fini(&view);
  return st;
}
