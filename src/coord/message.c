/*
 * The coordinator's messages on the wire (docs/coordinator-protocol.md).
 *
 * DESIGN. A list is one little-endian byte string: a 12-byte preamble
 * (magic "HVDC", version, kind), the list's fields, then its entries.
 * Integers are fixed width; doubles travel as their IEEE bits; strings and
 * arrays are a u32 count then the items. The decoder checks every count
 * against the bytes that remain before it allocates anything, so a hostile
 * or corrupt message costs at most its own size in memory, and rejects
 * values outside their enums. A failed decode names the field.
 */
#include <stdlib.h>
#include <string.h>

#include "coord.h"

#define COORD_MAGIC 0x43445648u /* "HVDC" */
enum { COORD_VERSION = 2, KIND_REQUESTS = 1, KIND_RESPONSES = 2 };
enum { FORM_FULL = 0, FORM_CACHED = 1 };

const char *coord_type_name(int type) {
  static const char *const names[COORD_TYPE_COUNT] = {
      "allreduce", "allgather", "broadcast", "join", "alltoall",
      "barrier", "reducescatter", "process_set_add", "process_set_remove", "error"};
  return type >= 0 && type < COORD_TYPE_COUNT ? names[type] : "unknown";
}

/* ==== ownership ================================================================== */

void coord_request_fini(struct coord_request *r) {
  free(r->name);
  free(r->ranks);
  free(r->group);
  r->name = NULL;
  r->ranks = NULL;
  r->group = NULL;
  r->name_len = r->nranks = r->group_len = 0;
}

hvd_status coord_request_copy(struct coord_request *dst, const struct coord_request *src) {
  *dst = *src;
  dst->name = NULL;
  dst->ranks = NULL;
  dst->group = NULL;
  if ((src->name != NULL && (dst->name = hvd_strndup(src->name, src->name_len)) == NULL) ||
      (src->group != NULL && (dst->group = hvd_strndup(src->group, src->group_len)) == NULL)) {
    coord_request_fini(dst);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot copy a tensor name");
  }
  if (src->nranks > 0) {
    dst->ranks = malloc(src->nranks * sizeof(*dst->ranks));
    if (dst->ranks == NULL) {
      coord_request_fini(dst);
      return hvd_error(HVD_ERR_NO_MEMORY, "cannot copy a rank list");
    }
    memcpy(dst->ranks, src->ranks, src->nranks * sizeof(*dst->ranks));
  }
  return HVD_OK;
}

void coord_response_fini(struct coord_response *r) {
  if (r->names != NULL) {
    for (uint32_t i = 0; i < r->ntensors; i++)
      free(r->names[i]);
  }
  free(r->names);
  free(r->bits);
  free(r->counts);
  free(r->ranks);
  free(r->error);
  free(r->data);
  memset(r, 0, sizeof(*r));
}

hvd_status coord_response_copy(struct coord_response *dst, const struct coord_response *src) {
  *dst = *src;
  dst->names = NULL;
  dst->bits = NULL;
  dst->counts = NULL;
  dst->ranks = NULL;
  dst->error = NULL;
  dst->data = NULL;
  if (src->data_len > 0) {
    if ((dst->data = malloc(src->data_len)) == NULL)
      goto nomem;
    memcpy(dst->data, src->data, src->data_len);
  }
  if (src->ntensors > 0) {
    dst->names = calloc(src->ntensors, sizeof(*dst->names));
    dst->bits = malloc(src->ntensors * sizeof(*dst->bits));
    if (dst->names == NULL || dst->bits == NULL)
      goto nomem;
    memcpy(dst->bits, src->bits, src->ntensors * sizeof(*dst->bits));
    for (uint32_t i = 0; i < src->ntensors && src->names != NULL; i++) {
      if ((dst->names[i] = hvd_strndup(src->names[i], strlen(src->names[i]))) == NULL)
        goto nomem;
    }
  }
  if (src->ncounts > 0) {
    if ((dst->counts = malloc(src->ncounts * sizeof(*dst->counts))) == NULL)
      goto nomem;
    memcpy(dst->counts, src->counts, src->ncounts * sizeof(*dst->counts));
  }
  if (src->nranks > 0) {
    if ((dst->ranks = malloc(src->nranks * sizeof(*dst->ranks))) == NULL)
      goto nomem;
    memcpy(dst->ranks, src->ranks, src->nranks * sizeof(*dst->ranks));
  }
  if (src->error != NULL && (dst->error = hvd_strndup(src->error, strlen(src->error))) == NULL)
    goto nomem;
  return HVD_OK;
nomem:
  coord_response_fini(dst);
  return hvd_error(HVD_ERR_NO_MEMORY, "cannot copy a response");
}

void coord_request_list_fini(struct coord_request_list *l) {
  for (uint32_t i = 0; i < l->n; i++)
    coord_request_fini(&l->reqs[i]);
  if (!l->borrowed) {
    free(l->reqs);
    free(l->hits);
    free(l->inline_hits);
  }
  free(l->abort_message);
  memset(l, 0, sizeof(*l));
}

void coord_response_list_fini(struct coord_response_list *l) {
  for (uint32_t i = 0; i < l->n && !l->borrowed; i++)
    coord_response_fini(&l->resps[i]);
  if (!l->borrowed)
    free(l->resps);
  free(l->retired);
  if (!l->borrowed)
    free(l->lanes);
  free(l->abort_message);
  memset(l, 0, sizeof(*l));
}

/* ==== writing ====================================================================== */

struct writer {
  struct hvd_buf *b;
  char *at;    /* where the next field goes: b->data + bytes written */
  size_t room; /* bytes that fit from at on without growing (hvd_buf_room) */
  hvd_status st;
};

/* The cursor at the buffer's end, and the room past it. */
static void writer_sync(struct writer *w) {
  w->at = w->b->data != NULL ? w->b->data + w->b->len : NULL;
  w->room = hvd_buf_room(w->b);
}

static void writer_start(struct writer *w, struct hvd_buf *b) {
  w->b = b;
  w->st = HVD_OK;
  writer_sync(w);
}

/* A field that does not fit: the buffer grows (or the message fails). */
static void put_slow(struct writer *w, const void *p, size_t n) {
  if (w->st != HVD_OK)
    return;
  if (w->at != NULL)
    w->b->len = (size_t)(w->at - w->b->data);
  w->st = hvd_buf_append(w->b, p, n);
  if (w->st == HVD_OK)
    writer_sync(w);
  else
    w->room = 0;
}

/* Fields are copied at the cursor while they fit: a message is a dozen or
 * more of them, each a few bytes, and a check of the buffer per field
 * would cost more than the copy. */
static inline void put(struct writer *w, const void *p, size_t n) {
  if (n == 0) /* an empty array may have no address */
    return;
  if (n <= w->room) {
    memcpy(w->at, p, n);
    w->at += n;
    w->room -= n;
  } else {
    put_slow(w, p, n);
  }
}

/* The message's status; the buffer's length and NUL set. */
static hvd_status writer_end(struct writer *w) {
  if (w->st == HVD_OK && w->at != NULL) {
    w->b->len = (size_t)(w->at - w->b->data);
    w->b->data[w->b->len] = '\0';
  }
  return w->st;
}

static void put_u8(struct writer *w, uint8_t v) { put(w, &v, 1); }

static void put_u16(struct writer *w, uint16_t v) {
  unsigned char b[2];
  hvd_put_le16(b, v);
  put(w, b, 2);
}

static void put_u32(struct writer *w, uint32_t v) {
  unsigned char b[4];
  hvd_put_le32(b, v);
  put(w, b, 4);
}

static void put_u64(struct writer *w, uint64_t v) {
  unsigned char b[8];
  hvd_put_le64(b, v);
  put(w, b, 8);
}

/* A list of cache bits: a count, then each as an i32. */
static void put_bits(struct writer *w, const int32_t *bits, uint32_t n) {
  put_u32(w, n);
  for (uint32_t i = 0; i < n; i++)
    put_u32(w, (uint32_t)bits[i]);
}

static void put_f64(struct writer *w, double v) {
  uint64_t bits;
  memcpy(&bits, &v, 8);
  put_u64(w, bits);
}

static void put_str(struct writer *w, const char *s, size_t len) {
  put_u32(w, (uint32_t)len);
  put(w, s, len);
}

static void put_preamble(struct writer *w, uint16_t kind) {
  put_u32(w, COORD_MAGIC);
  put_u16(w, COORD_VERSION);
  put_u16(w, kind);
}

static void put_abort(struct writer *w, uint8_t flags, uint8_t status, const char *msg) {
  put_u8(w, flags);
  put_u8(w, status);
  put_str(w, msg != NULL ? msg : "", msg != NULL ? strlen(msg) : 0);
}

static void put_request(struct writer *w, const struct coord_request *r) {
  put_u8(w, r->type);
  put_u8(w, r->dtype);
  put_u8(w, r->op);
  put_u8(w, 0);
  put_u32(w, (uint32_t)r->set);
  put_u32(w, (uint32_t)r->root);
  put_u32(w, (uint32_t)r->device);
  put_u32(w, r->group_size);
  put_f64(w, r->prescale);
  put_f64(w, r->postscale);
  put_u32(w, (uint32_t)r->ndims);
  for (int i = 0; i < r->ndims; i++)
    put_u64(w, (uint64_t)r->shape[i]);
  put_u32(w, r->nranks);
  for (uint32_t i = 0; i < r->nranks; i++)
    put_u32(w, (uint32_t)r->ranks[i]);
  put_str(w, r->name, r->name_len);
  put_str(w, r->group != NULL ? r->group : "", r->group_len);
  put_u32(w, r->inline_len);
  put(w, r->inline_data, r->inline_len);
}

hvd_status coord_encode_requests(const struct coord_request_list *l, struct hvd_buf *out) {
  struct writer w;

  writer_start(&w, out);
  put_preamble(&w, KIND_REQUESTS);
  put_u64(&w, l->ack);
  put_abort(&w, l->flags, l->abort_status, l->abort_message);
  put_u32(&w, l->hits_bytes);
  put(&w, l->hits, l->hits_bytes);
  put_u32(&w, l->n);
  for (uint32_t i = 0; i < l->n; i++)
    put_request(&w, &l->reqs[i]);
  put_u32(&w, l->ninline_hits);
  for (uint32_t i = 0; i < l->ninline_hits; i++) {
    put_u32(&w, (uint32_t)l->inline_hits[i].bit);
    put_u32(&w, l->inline_hits[i].len);
    put(&w, l->inline_hits[i].data, l->inline_hits[i].len);
  }
  return writer_end(&w);
}

static void put_response(struct writer *w, const struct coord_response *r) {
  if (r->cached) {
    put_u8(w, FORM_CACHED);
    put_u32(w, r->ntensors);
    for (uint32_t i = 0; i < r->ntensors; i++)
      put_u32(w, (uint32_t)r->bits[i]);
    put_u32(w, r->data_len);
    put(w, r->data, r->data_len);
    return;
  }
  put_u8(w, FORM_FULL);
  put_u8(w, r->type);
  put_u8(w, r->dtype);
  put_u8(w, r->op);
  put_u8(w, r->status);
  put_u32(w, (uint32_t)r->set);
  put_u32(w, (uint32_t)r->root);
  put_u32(w, (uint32_t)r->device);
  put_u32(w, (uint32_t)r->last_joined);
  put_u32(w, (uint32_t)r->new_set);
  put_f64(w, r->prescale);
  put_f64(w, r->postscale);
  put_u32(w, r->ntensors);
  for (uint32_t i = 0; i < r->ntensors; i++) {
    put_str(w, r->names[i], strlen(r->names[i]));
    put_u32(w, (uint32_t)(r->bits != NULL ? r->bits[i] : -1));
  }
  put_u32(w, r->ncounts);
  for (uint32_t i = 0; i < r->ncounts; i++)
    put_u64(w, (uint64_t)r->counts[i]);
  put_u32(w, r->nranks);
  for (uint32_t i = 0; i < r->nranks; i++)
    put_u32(w, (uint32_t)r->ranks[i]);
  put_str(w, r->error != NULL ? r->error : "", r->error != NULL ? strlen(r->error) : 0);
  put_u32(w, r->data_len);
  put(w, r->data, r->data_len);
}

hvd_status coord_encode_responses(const struct coord_response_list *l, struct hvd_buf *out) {
  struct writer w;

  writer_start(&w, out);
  put_preamble(&w, KIND_RESPONSES);
  put_u64(&w, l->seq);
  put_abort(&w, l->flags, l->abort_status, l->abort_message);
  if (l->flags & COORD_FLAG_TUNE)
    put(&w, l->tune, sizeof(l->tune));
  put_bits(&w, l->retired, l->nretired);
  if (l->flags & COORD_FLAG_LANES)
    put_bits(&w, l->lanes, l->nlanes);
  put_u32(&w, l->n);
  for (uint32_t i = 0; i < l->n; i++)
    put_response(&w, &l->resps[i]);
  return writer_end(&w);
}

/* ==== reading ========================================================================= */

struct reader {
  const unsigned char *p;
  size_t left;
  const char *bad; /* the first field that did not fit or was out of range */
};

static bool need(struct reader *r, size_t n, const char *field) {
  if (r->bad != NULL)
    return false;
  if (r->left < n) {
    r->bad = field;
    return false;
  }
  return true;
}

static uint8_t get_u8(struct reader *r, const char *field) {
  if (!need(r, 1, field))
    return 0;
  r->left--;
  return *r->p++;
}

static uint16_t get_u16(struct reader *r, const char *field) {
  uint16_t v;
  if (!need(r, 2, field))
    return 0;
  v = hvd_get_le16(r->p);
  r->p += 2;
  r->left -= 2;
  return v;
}

static uint32_t get_u32(struct reader *r, const char *field) {
  uint32_t v;
  if (!need(r, 4, field))
    return 0;
  v = hvd_get_le32(r->p);
  r->p += 4;
  r->left -= 4;
  return v;
}

static uint64_t get_u64(struct reader *r, const char *field) {
  uint64_t v;
  if (!need(r, 8, field))
    return 0;
  v = hvd_get_le64(r->p);
  r->p += 8;
  r->left -= 8;
  return v;
}

static double get_f64(struct reader *r, const char *field) {
  uint64_t bits = get_u64(r, field);
  double v;
  memcpy(&v, &bits, 8);
  return v;
}

/* A count of items of `size` bytes each that must still fit in the message
 * (a product, not a division: a division takes tens of cycles, and every
 * list has a few counts). */
static uint32_t get_count(struct reader *r, size_t size, uint32_t max, const char *field) {
  uint32_t n = get_u32(r, field);
  if (r->bad == NULL && (n > max || (uint64_t)n * size > r->left))
    r->bad = field;
  return r->bad == NULL ? n : 0;
}

/* A string, copied and NUL-terminated; *len its length. */
static char *get_str(struct reader *r, uint32_t max, uint32_t *len, const char *field) {
  uint32_t n = get_count(r, 1, max, field);
  char *s;
  if (r->bad != NULL)
    return NULL;
  if ((s = hvd_strndup((const char *)r->p, n)) == NULL) {
    r->bad = "memory";
    return NULL;
  }
  if (memchr(s, '\0', n) != NULL) { /* names and messages are text */
    free(s);
    r->bad = field;
    return NULL;
  }
  r->p += n;
  r->left -= n;
  if (len != NULL)
    *len = n;
  return s;
}

/* An optional string (a group, an abort message, an error): NULL when
 * empty, so that the common case allocates nothing. */
static char *get_opt_str(struct reader *r, uint32_t max, uint32_t *len, const char *field) {
  if (r->bad == NULL && r->left >= 4 && hvd_get_le32(r->p) == 0) {
    r->p += 4;
    r->left -= 4;
    if (len != NULL)
      *len = 0;
    return NULL;
  }
  return get_str(r, max, len, field);
}

static void *get_array(struct reader *r, uint32_t n, size_t size, const char *field) {
  void *a;
  if (r->bad != NULL || n == 0)
    return NULL;
  if ((a = hvd_zalloc(n, size)) == NULL)
    r->bad = "memory";
  (void)field;
  return a;
}

/* get_array into an array the caller keeps (*kept, *cap items), grown
 * as needed: the same zeroed items without an allocation once it is large
 * enough. */
static void *get_array_in(struct reader *r, void *kept, size_t *cap, uint32_t n, size_t size,
                          const char *field) {
  void *a;
  if (r->bad != NULL || n == 0)
    return NULL;
  if (hvd_array_reserve(kept, cap, n, size, 1) != HVD_OK) {
    hvd_error_clear(); /* decode_failed says what failed */
    r->bad = "memory";
    return NULL;
  }
  (void)field;
  memcpy(&a, kept, sizeof(a));
  memset(a, 0, (size_t)n * size);
  return a;
}

/* A list of cache bits (put_bits), at most max of them, each in 0 .. limit - 1,
 * into *bits (*n their count): allocated, or in the caller's array *kept
 * (*kept_cap of them) when kept is not NULL. */
static void get_bits(struct reader *r, uint32_t max, int64_t limit, int32_t **bits, uint32_t *n,
                     int32_t **kept, size_t *kept_cap, const char *count_field,
                     const char *field) {
  *n = get_count(r, 4, max, count_field);
  *bits = kept != NULL ? get_array_in(r, kept, kept_cap, *n, sizeof(**bits), field)
                       : get_array(r, *n, sizeof(**bits), field);
  for (uint32_t i = 0; i < *n && r->bad == NULL; i++) {
    (*bits)[i] = (int32_t)get_u32(r, field);
    if ((*bits)[i] < 0 || (*bits)[i] >= limit)
      r->bad = field;
  }
}

/* Inline bytes: a count of at most COORD_INLINE_MAX, then the bytes into out. */
static uint32_t get_inline(struct reader *r, unsigned char *out, const char *field) {
  uint32_t n = get_count(r, 1, COORD_INLINE_MAX, field);
  if (r->bad != NULL)
    return 0;
  memcpy(out, r->p, n);
  r->p += n;
  r->left -= n;
  return n;
}

/* Where a list of cached responses puts its arrays instead of allocating
 * them: each a bump of a cursor through room reserved for the whole
 * message (NULL: allocate). */
struct space_cursor {
  struct coord_response_space *space;
  size_t bits, data; /* used so far */
};

/* A response's inline result: a count, then the bytes (allocated, or from
 * the cursor's space). */
static void get_data(struct reader *r, struct coord_response *p, struct space_cursor *cur) {
  uint32_t n = get_count(r, 1, COORD_INLINE_MAX, "inline result");
  if (r->bad != NULL || n == 0)
    return;
  if (cur != NULL) {
    p->data = cur->space->data + cur->data;
    cur->data += n;
  } else if ((p->data = malloc(n)) == NULL) {
    r->bad = "memory";
    return;
  }
  memcpy(p->data, r->p, n);
  p->data_len = n;
  r->p += n;
  r->left -= n;
}

static hvd_status decode_failed(struct reader *r, const char *what) {
  if (strcmp(r->bad, "memory") == 0)
    return hvd_error(HVD_ERR_NO_MEMORY, "out of memory decoding a %s", what);
  return hvd_error(HVD_ERR_PROTOCOL, "malformed %s: bad or truncated field '%s'", what, r->bad);
}

static void get_preamble(struct reader *r, uint16_t kind) {
  uint32_t magic = get_u32(r, "magic");
  uint16_t version = get_u16(r, "version");
  uint16_t k = get_u16(r, "kind");
  if (r->bad == NULL && magic != COORD_MAGIC)
    r->bad = "magic";
  else if (r->bad == NULL && version != COORD_VERSION)
    r->bad = "version";
  else if (r->bad == NULL && k != kind)
    r->bad = "kind";
}

static void get_request(struct reader *r, struct coord_request *q) {
  q->type = get_u8(r, "request type");
  q->dtype = get_u8(r, "dtype");
  q->op = get_u8(r, "reduce op");
  (void)get_u8(r, "reserved");
  q->set = (int32_t)get_u32(r, "process set");
  q->root = (int32_t)get_u32(r, "root");
  q->device = (int32_t)get_u32(r, "device");
  q->group_size = get_u32(r, "group size");
  q->prescale = get_f64(r, "prescale");
  q->postscale = get_f64(r, "postscale");
  q->ndims = (int32_t)get_count(r, 8, HVD_MAX_DIMS, "ndims");
  for (int i = 0; i < q->ndims && r->bad == NULL; i++) {
    q->shape[i] = (int64_t)get_u64(r, "shape");
    if (q->shape[i] < 0)
      r->bad = "shape";
  }
  q->nranks = get_count(r, 4, COORD_MAX_SET_RANKS, "rank count");
  q->ranks = get_array(r, q->nranks, sizeof(*q->ranks), "ranks");
  for (uint32_t i = 0; i < q->nranks && r->bad == NULL; i++)
    q->ranks[i] = (int32_t)get_u32(r, "ranks");
  q->name = get_str(r, COORD_NAME_MAX, &q->name_len, "name");
  q->group = get_opt_str(r, COORD_NAME_MAX, &q->group_len, "group");
  q->inline_len = get_inline(r, q->inline_data, "inline input");
  if (r->bad == NULL && (q->group == NULL) != (q->group_size == 0))
    r->bad = "group";
  if (r->bad == NULL && (q->type >= COORD_ERROR))
    r->bad = "request type";
  if (r->bad == NULL && (q->dtype >= HVD_DTYPE_COUNT))
    r->bad = "dtype";
  if (r->bad == NULL && q->op > HVD_ADASUM)
    r->bad = "reduce op";
  if (r->bad == NULL && q->name_len == 0)
    r->bad = "name";
  if (r->bad == NULL && q->inline_len > 0 && (q->type != COORD_ALLREDUCE || q->op == HVD_ADASUM))
    r->bad = "inline input";
}

/* A request list whose arrays go into space's (the list borrows them). */
static hvd_status decode_requests(const void *data, size_t len, struct coord_request_list *out,
                                  struct coord_request_space *space) {
  struct reader r = {data, len, NULL};
  struct coord_request_list l;

  memset(&l, 0, sizeof(l));
  l.borrowed = true;
  get_preamble(&r, KIND_REQUESTS);
  l.ack = get_u64(&r, "ack");
  l.flags = get_u8(&r, "flags");
  l.abort_status = get_u8(&r, "abort status");
  l.abort_message = get_opt_str(&r, HVD_ERROR_MESSAGE_MAX, NULL, "abort message");
  l.hits_bytes = get_count(&r, 1, UINT32_MAX, "hits");
  l.hits = get_array_in(&r, &space->hits, &space->hits_cap, l.hits_bytes, 1, "hits");
  if (l.hits != NULL) {
    memcpy(l.hits, r.p, l.hits_bytes);
    r.p += l.hits_bytes;
    r.left -= l.hits_bytes;
  }
  /* A request is at least 56 bytes: that bounds the count. */
  l.n = get_count(&r, 56, UINT32_MAX, "request count");
  l.reqs = get_array_in(&r, &space->reqs, &space->reqs_cap, l.n, sizeof(*l.reqs), "requests");
  if (l.reqs == NULL)
    l.n = 0; /* a failed allocation (r.bad says so): fini must not walk a NULL array */
  for (uint32_t i = 0; i < l.n && r.bad == NULL; i++)
    get_request(&r, &l.reqs[i]);
  /* An inline hit is at least 8 bytes. */
  l.ninline_hits = get_count(&r, 8, UINT32_MAX, "inline hit count");
  l.inline_hits = get_array_in(&r, &space->inline_hits, &space->inline_hits_cap, l.ninline_hits,
                               sizeof(*l.inline_hits), "inline hits");
  for (uint32_t i = 0; i < l.ninline_hits && r.bad == NULL; i++) {
    l.inline_hits[i].bit = (int32_t)get_u32(&r, "inline hit bit");
    l.inline_hits[i].len = get_inline(&r, l.inline_hits[i].data, "inline hit input");
    if (r.bad == NULL && (l.inline_hits[i].bit < 0 || l.inline_hits[i].len == 0))
      r.bad = "inline hit";
  }
  if (r.bad == NULL && r.left != 0)
    r.bad = "trailing bytes";
  if (r.bad != NULL) {
    coord_request_list_fini(&l);
    return decode_failed(&r, "request list");
  }
  *out = l;
  return HVD_OK;
}

hvd_status coord_decode_requests(const void *data, size_t len, struct coord_request_list *out) {
  struct coord_request_space space = {0};
  hvd_status st = decode_requests(data, len, out, &space);

  if (st != HVD_OK) {
    coord_request_space_fini(&space);
    return st;
  }
  out->borrowed = false; /* its arrays are the fresh space's: the list owns them */
  return HVD_OK;
}

hvd_status coord_decode_requests_in(const void *data, size_t len, struct coord_request_list *out,
                                    struct coord_request_space *space) {
  return decode_requests(data, len, out, space);
}

void coord_request_space_fini(struct coord_request_space *space) {
  free(space->reqs);
  free(space->hits);
  free(space->inline_hits);
  memset(space, 0, sizeof(*space));
}

/* One response; with a cursor, only a cached one (another stops the
 * decode: the caller decodes the list again, allocating). */
static void get_response(struct reader *r, struct coord_response *p, struct space_cursor *cur) {
  uint8_t form = get_u8(r, "response form");

  p->last_joined = -1;
  p->new_set = -1;
  if (form == FORM_CACHED) {
    p->cached = true;
    p->ntensors = get_count(r, 4, UINT32_MAX, "cached count");
    if (cur != NULL && r->bad == NULL) {
      p->bits = cur->space->bits + cur->bits; /* get_count bounded it by the message */
      cur->bits += p->ntensors;
    } else {
      p->bits = get_array(r, p->ntensors, sizeof(*p->bits), "bits");
    }
    for (uint32_t i = 0; i < p->ntensors && r->bad == NULL; i++) {
      p->bits[i] = (int32_t)get_u32(r, "bits");
      if (p->bits[i] < 0)
        r->bad = "bits";
    }
    if (r->bad == NULL && p->ntensors == 0)
      r->bad = "cached count";
    get_data(r, p, cur);
    if (r->bad == NULL && p->data_len > 0 && p->ntensors != 1)
      r->bad = "inline result";
    return;
  }
  if (r->bad == NULL && form != FORM_FULL) {
    r->bad = "response form";
    return;
  }
  if (cur != NULL) {
    r->bad = "not cached";
    return;
  }
  p->type = get_u8(r, "response type");
  p->dtype = get_u8(r, "dtype");
  p->op = get_u8(r, "reduce op");
  p->status = get_u8(r, "status");
  p->set = (int32_t)get_u32(r, "process set");
  p->root = (int32_t)get_u32(r, "root");
  p->device = (int32_t)get_u32(r, "device");
  p->last_joined = (int32_t)get_u32(r, "last joined");
  p->new_set = (int32_t)get_u32(r, "new set");
  p->prescale = get_f64(r, "prescale");
  p->postscale = get_f64(r, "postscale");
  p->ntensors = get_count(r, 8, UINT32_MAX, "tensor count");
  p->names = get_array(r, p->ntensors, sizeof(*p->names), "names");
  p->bits = get_array(r, p->ntensors, sizeof(*p->bits), "bits");
  for (uint32_t i = 0; i < p->ntensors && r->bad == NULL; i++) {
    uint32_t len = 0;
    p->names[i] = get_str(r, COORD_NAME_MAX, &len, "name");
    p->bits[i] = (int32_t)get_u32(r, "bits");
    if (r->bad == NULL && (len == 0 || p->bits[i] < -1))
      r->bad = len == 0 ? "name" : "bits";
  }
  p->ncounts = get_count(r, 8, UINT32_MAX, "count count");
  p->counts = get_array(r, p->ncounts, sizeof(*p->counts), "counts");
  for (uint32_t i = 0; i < p->ncounts && r->bad == NULL; i++) {
    p->counts[i] = (int64_t)get_u64(r, "counts");
    if (p->counts[i] < 0)
      r->bad = "counts";
  }
  p->nranks = get_count(r, 4, COORD_MAX_SET_RANKS, "rank count");
  p->ranks = get_array(r, p->nranks, sizeof(*p->ranks), "ranks");
  for (uint32_t i = 0; i < p->nranks && r->bad == NULL; i++)
    p->ranks[i] = (int32_t)get_u32(r, "ranks");
  p->error = get_opt_str(r, HVD_ERROR_MESSAGE_MAX * 4, NULL, "error");
  get_data(r, p, NULL);
  if (r->bad == NULL && p->data_len > 0 && (p->type != COORD_ALLREDUCE || p->ntensors != 1))
    r->bad = "inline result";
  if (r->bad == NULL && p->type >= COORD_TYPE_COUNT)
    r->bad = "response type";
  if (r->bad == NULL && p->dtype >= HVD_DTYPE_COUNT)
    r->bad = "dtype";
  if (r->bad == NULL && p->op > HVD_ADASUM)
    r->bad = "reduce op";
}

/* Room in space for any list of cached responses in len bytes: a response
 * is at least 13 bytes, a bit 4, inline bytes no more than the message. */
static bool reserve_space(struct coord_response_space *s, size_t len) {
  return hvd_array_reserve(&s->resps, &s->resps_cap, len / 13 + 1, sizeof(*s->resps), 16) ==
             HVD_OK &&
         hvd_array_reserve(&s->bits, &s->bits_cap, len / 4 + 1, sizeof(*s->bits), 64) == HVD_OK &&
         hvd_array_reserve(&s->data, &s->data_cap, len + 1, 1, 1024) == HVD_OK;
}

static hvd_status decode_responses(const void *data, size_t len, struct coord_response_list *out,
                                   struct space_cursor *cur) {
  struct reader r = {data, len, NULL};
  struct coord_response_list l;

  memset(&l, 0, sizeof(l));
  get_preamble(&r, KIND_RESPONSES);
  l.seq = get_u64(&r, "sequence");
  l.flags = get_u8(&r, "flags");
  l.abort_status = get_u8(&r, "abort status");
  l.abort_message = get_opt_str(&r, HVD_ERROR_MESSAGE_MAX, NULL, "abort message");
  if ((l.flags & COORD_FLAG_TUNE) && need(&r, sizeof(l.tune), "tuning setting")) {
    struct tune_setting t;
    memcpy(l.tune, r.p, sizeof(l.tune));
    r.p += sizeof(l.tune);
    r.left -= sizeof(l.tune);
    if (tune_setting_decode(l.tune, sizeof(l.tune), &t) != HVD_OK) {
      hvd_error_clear();
      r.bad = "tuning setting";
    }
  }
  /* Retirements are rare: their bits are the list's own even in space. */
  get_bits(&r, UINT32_MAX, (int64_t)INT32_MAX + 1, &l.retired, &l.nretired, NULL, NULL,
           "retired count", "retired");
  /* Grants are not (a lane that closed is granted again). */
  l.borrowed = cur != NULL;
  if (l.flags & COORD_FLAG_LANES)
    get_bits(&r, COORD_LANES, COORD_LANES, &l.lanes, &l.nlanes,
             cur != NULL ? &cur->space->lanes : NULL, cur != NULL ? &cur->space->lanes_cap : NULL,
             "lane count", "lanes");
  /* A response is at least 13 bytes (a cached one with one bit). */
  l.n = get_count(&r, 13, UINT32_MAX, "response count");
  /* Into space, each response is zeroed as it is reached: a list of full
   * responses stops at its first. */
  if (cur != NULL)
    l.resps = r.bad == NULL && l.n > 0 ? cur->space->resps : NULL;
  else
    l.resps = get_array(&r, l.n, sizeof(*l.resps), "responses");
  if (l.resps == NULL)
    l.n = 0; /* as for requests */
  for (uint32_t i = 0; i < l.n && r.bad == NULL; i++) {
    if (l.borrowed)
      memset(&l.resps[i], 0, sizeof(l.resps[i]));
    get_response(&r, &l.resps[i], cur);
  }
  if (r.bad == NULL && r.left != 0)
    r.bad = "trailing bytes";
  if (r.bad != NULL) {
    coord_response_list_fini(&l);
    /* Into space, no message: the caller decodes again, allocating. */
    return cur != NULL ? HVD_ERR_PROTOCOL : decode_failed(&r, "response list");
  }
  *out = l;
  return HVD_OK;
}

hvd_status coord_decode_responses(const void *data, size_t len, struct coord_response_list *out) {
  return decode_responses(data, len, out, NULL);
}

hvd_status coord_decode_responses_in(const void *data, size_t len, struct coord_response_list *out,
                                     struct coord_response_space *space) {
  struct space_cursor cur = {space, 0, 0};

  /* A list with other responses, or a malformed one, is decoded again
   * allocating (which reports what was wrong). */
  if (!reserve_space(space, len))
    hvd_error_clear();
  else if (decode_responses(data, len, out, &cur) == HVD_OK)
    return HVD_OK;
  return decode_responses(data, len, out, NULL);
}

void coord_response_space_fini(struct coord_response_space *space) {
  free(space->resps);
  free(space->bits);
  free(space->data);
  free(space->lanes);
  memset(space, 0, sizeof(*space));
}
