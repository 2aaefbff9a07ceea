/*
 * The timeline: a Chrome trace (the JSON array form of the Trace Event
 * Format, which Perfetto and chrome://tracing read) of what rank 0 sees.
 *
 * DESIGN. The file is valid at every moment: "[", then one event per line,
 * every line after the first starting with ","; it never ends inside an
 * event, so a reader closes it by appending "]" (the format lets the bracket
 * be missing, and the viewers read such a file as it is). Threads that
 * record format whole events into `pending` under the lock and never wait on
 * the disk. A writer thread takes what gathered within FLUSH_NS of the first
 * event (Horovod's cycle time, 1 ms) and writes it, blanks filling the rest
 * of a 4 KiB page of the file that the next event would cross, so that
 * every page boundary falls between two events. Linux copies a write into
 * the file page by page, stops one for SIGKILL only between pages, and
 * shows a reader only pages already copied: neither a kill -9 nor a reader
 * ever meets half an event. A failed write is cut back to the last whole
 * event.
 *
 * Rows. pid 0, "hvd ranks", has a thread per rank (tid r + 1, "rank r"),
 * where an instant event named by the tensor marks the moment that rank's
 * submission reached rank 0, and thread 0 ("cycles") for cycle marks. Each
 * tensor is a process of its own (pid 1, 2, ... in order of first sight)
 * named after it, whose thread 0 ("rank 0") has one phase open at a time.
 *
 * Size. Once a file holds max_bytes (at least half of them events), the
 * writer starts <path> again, in one rename(2) that keeps a file at <path>
 * for readers: the header with every rank row seen so far, then the open
 * phases begun anew. The full file, closed with "]", becomes <path>.1 (the
 * one before goes).
 *
 * Locks: ctl (start and stop, one at a time), then lock; both are leaves
 * for the rest of coord.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "coord.h"

enum {
  PAGE = 4096,                    /* no event crosses a page boundary of the file */
  IOV_BATCH = 512,                /* pieces of one writev(2); below IOV_MAX */
  NAME_SHOWN = 480,               /* bytes of a tensor name shown; more: cut, with "..." */
  NAME_JSON = 2 * NAME_SHOWN + 8, /* the shown name escaped, at most */
  PHASE_MAX = 48,                 /* a phase's name: ours, NEGOTIATE_ALLREDUCE ... */
  EVENT_MAX = 2048,               /* one event's text with its separator; below PAGE */
  EARLY_BYTES = 1 << 20,          /* this much pending wakes the writer before FLUSH_NS */
  PENDING_MAX = 64 << 20,         /* beyond this, events are dropped and counted */
};
#define FLUSH_NS INT64_C(1000000)

struct tensor_track {
  int pid;
  bool open;               /* a phase is open: phase */
  bool announced;          /* named in the current file */
  char phase[PHASE_MAX];
  char shown[];            /* the name as the body of a JSON string */
};

struct coord_timeline {
  pthread_mutex_t ctl;     /* start and stop; has_writer, writer, the names */
  pthread_mutex_t lock;    /* the fields from here to `path` */
  pthread_cond_t wake;     /* the writer waits on it */
  atomic_bool active;      /* events are taken (also read without the lock) */
  bool closing;            /* stop: the writer writes what is left, closes, ends */
  bool writer_idle;        /* the writer waits for a first event */
  struct hvd_buf pending;  /* whole events (each ",\n{...}") not yet taken */
  unsigned long long dropped; /* events refused while pending was full */
  bool mark_cycles;
  int64_t start_ns;        /* ts 0 */
  long long start_wall_us;
  int64_t max_bytes;       /* HVD_TIMELINE_MAX_BYTES; 0: no limit */
  struct hvd_map tensors;  /* name -> tensor_track */
  int next_pid;
  unsigned char *ranks_named; /* rank rows named in this file (from the first part on) */
  size_t ranks_bytes;
  char error[512];         /* the writer's failure, reported by stop; "" */
  /* The file: the writer's while it runs, ctl's before and after. */
  char *path, *previous, *next; /* <path>, <path>.1, <path>.next */
  int fd;
  uint64_t size;           /* bytes in the file */
  uint64_t head_size;      /* the header's share of them */
  struct hvd_buf batch;    /* taken from pending, being written */
  struct hvd_buf head;     /* the next file's header */
  char blanks[PAGE];
  bool has_writer;
  pthread_t writer;
};

hvd_status coord_timeline_create(struct coord_timeline **out, int64_t max_bytes) {
  struct coord_timeline *t = calloc(1, sizeof(*t));
  if (t == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the timeline");
  if (pthread_mutex_init(&t->ctl, NULL) != 0) {
    free(t);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the timeline");
  }
  if (pthread_mutex_init(&t->lock, NULL) != 0) {
    pthread_mutex_destroy(&t->ctl);
    free(t);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the timeline");
  }
  if (hvd_cond_init(&t->wake) != 0) {
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->ctl);
    free(t);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the timeline");
  }
  atomic_init(&t->active, false);
  hvd_map_init(&t->tensors);
  t->max_bytes = max_bytes;
  t->fd = -1;
  memset(t->blanks, ' ', sizeof(t->blanks));
  *out = t;
  return HVD_OK;
}

static void forget_tensors(struct coord_timeline *t) {
  struct hvd_map_iter it = {0};
  const char *key;
  size_t len;
  void *value;
  while (hvd_map_iter_next(&t->tensors, &it, &key, &len, &value)) {
    free(value);
    hvd_map_iter_remove(&t->tensors, &it);
  }
}

static void free_names(struct coord_timeline *t) {
  free(t->path);
  free(t->previous);
  free(t->next);
  t->path = t->previous = t->next = NULL;
}

void coord_timeline_destroy(struct coord_timeline *t) {
  if (t == NULL)
    return;
  coord_timeline_stop(t);
  forget_tensors(t);
  hvd_map_fini(&t->tensors);
  hvd_buf_fini(&t->pending);
  hvd_buf_fini(&t->batch);
  hvd_buf_fini(&t->head);
  free(t->ranks_named);
  free_names(t);
  pthread_cond_destroy(&t->wake);
  pthread_mutex_destroy(&t->lock);
  pthread_mutex_destroy(&t->ctl);
  free(t);
}

bool coord_timeline_active(const struct coord_timeline *t) {
  return t != NULL && atomic_load_explicit(&t->active, memory_order_relaxed);
}

/* ==== events ============================================================================== */

/* Appends sep and one event to b; false (b unchanged) when it cannot. */
static bool vput(struct hvd_buf *b, const char *sep, const char *fmt, va_list ap)
    HVD_PRINTF(3, 0);
static bool vput(struct hvd_buf *b, const char *sep, const char *fmt, va_list ap) {
  size_t seplen = strlen(sep);
  int n;

  if (hvd_buf_reserve(b, EVENT_MAX) != HVD_OK)
    return false;
  memcpy(b->data + b->len, sep, seplen);
  n = vsnprintf(b->data + b->len + seplen, EVENT_MAX - seplen, fmt, ap);
  if (n < 0 || (size_t)n >= EVENT_MAX - seplen) {
    b->data[b->len] = '\0';
    return false;
  }
  b->len += seplen + (size_t)n;
  return true;
}

static bool put(struct hvd_buf *b, const char *fmt, ...) HVD_PRINTF(2, 3);
static bool put(struct hvd_buf *b, const char *fmt, ...) {
  va_list ap;
  bool ok;
  va_start(ap, fmt);
  ok = vput(b, ",\n", fmt, ap);
  va_end(ap);
  return ok;
}

/* A file's first event, after the bracket. */
static bool put_first(struct hvd_buf *b, const char *fmt, ...) HVD_PRINTF(2, 3);
static bool put_first(struct hvd_buf *b, const char *fmt, ...) {
  va_list ap;
  bool ok;
  va_start(ap, fmt);
  ok = vput(b, "[\n", fmt, ap);
  va_end(ap);
  return ok;
}

/* The length of the well-formed UTF-8 sequence at p; 0 if there is none. */
static size_t utf8_length(const unsigned char *p) {
  unsigned char lo = 0x80, hi = 0xbf;
  size_t n;

  if (p[0] >= 0xc2 && p[0] <= 0xdf) {
    n = 2;
  } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
    n = 3;
    lo = p[0] == 0xe0 ? 0xa0 : lo; /* not overlong */
    hi = p[0] == 0xed ? 0x9f : hi; /* not a surrogate */
  } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
    n = 4;
    lo = p[0] == 0xf0 ? 0x90 : lo;
    hi = p[0] == 0xf4 ? 0x8f : hi; /* not past U+10FFFF */
  } else {
    return 0;
  }
  if (p[1] < lo || p[1] > hi)
    return 0;
  for (size_t i = 2; i < n; i++) {
    if (p[i] < 0x80 || p[i] > 0xbf)
      return 0;
  }
  return n;
}

/* s as the body of a JSON string, into out (NAME_JSON bytes): quotes and
 * backslashes escaped, control characters as their short escapes, others
 * and bytes that are not UTF-8 as '?' (strict readers refuse raw ones, and
 * Perfetto reads no \u escapes), cut after NAME_SHOWN bytes with "...". */
static size_t json_text(char *out, const char *s) {
  static const char shorts[] = "\bb\ff\nn\rr\tt";
  const unsigned char *p = (const unsigned char *)s;
  size_t o = 0, i = 0;

  while (p[i] != '\0') {
    size_t n = p[i] >= 0x80 ? utf8_length(p + i) : 1;
    const char *e;
    if (i + (n > 0 ? n : 1) > NAME_SHOWN) {
      memcpy(out + o, "...", 3);
      o += 3;
      break;
    }
    if (p[i] == '"' || p[i] == '\\') {
      out[o++] = '\\';
      out[o++] = (char)p[i];
    } else if (p[i] < 0x20 && (e = memchr(shorts, p[i], sizeof(shorts) - 1)) != NULL &&
               (e - shorts) % 2 == 0) {
      out[o++] = '\\';
      out[o++] = e[1];
    } else if (p[i] < 0x20 || p[i] == 0x7f || n == 0) {
      out[o++] = '?';
    } else {
      memcpy(out + o, p + i, n);
      o += n;
      i += n;
      continue;
    }
    i++;
  }
  out[o] = '\0';
  return o;
}

/* A time since the start in microseconds, as "%lld.%03d" prints it (a
 * double's %f costs several times more, on every event). */
struct stamp {
  long long us;
  int ns;
};
#define TS "%lld.%03d"

static struct stamp now_stamp(const struct coord_timeline *t) {
  int64_t ns = hvd_now_ns() - t->start_ns;
  return (struct stamp){.us = ns / 1000, .ns = (int)(ns % 1000)};
}

/* Whether pending takes another event; a refused one is counted. Under lock. */
static bool room(struct coord_timeline *t) {
  if (!atomic_load_explicit(&t->active, memory_order_relaxed))
    return false;
  if (t->pending.len <= PENDING_MAX)
    return true;
  t->dropped++;
  return false;
}

/* After an event: the writer wakes for a first one, or for a full batch. Under lock. */
static void wake(struct coord_timeline *t) {
  if (t->writer_idle || t->pending.len >= EARLY_BYTES) {
    t->writer_idle = false;
    pthread_cond_signal(&t->wake);
  }
}

/* The metadata that names a tensor's process and its row. Under lock. */
static void announce(struct hvd_buf *b, struct tensor_track *k) {
  put(b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"%s\"}}",
      k->pid, k->shown);
  put(b,
      "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
      "\"args\":{\"sort_index\":%d}}",
      k->pid, k->pid);
  put(b,
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
      "\"args\":{\"name\":\"rank 0\"}}",
      k->pid);
  k->announced = true;
}

/* The tensor's track, named in the current file. Under lock. */
static struct tensor_track *track(struct coord_timeline *t, const char *tensor) {
  size_t len = strlen(tensor);
  struct tensor_track *k = hvd_map_get(&t->tensors, tensor, len);

  if (k == NULL) {
    char shown[NAME_JSON];
    size_t n = json_text(shown, tensor);
    if ((k = calloc(1, sizeof(*k) + n + 1)) == NULL)
      return NULL;
    memcpy(k->shown, shown, n + 1);
    if (hvd_map_put(&t->tensors, tensor, len, k, NULL) != HVD_OK) {
      free(k);
      return NULL;
    }
    k->pid = t->next_pid++;
  }
  if (!k->announced)
    announce(&t->pending, k);
  return k;
}

static void name_rank_row(struct hvd_buf *b, int r) {
  put(b,
      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
      "\"args\":{\"name\":\"rank %d\"}}",
      r + 1, r);
  put(b,
      "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
      "\"args\":{\"sort_index\":%d}}",
      r + 1, r + 1);
}

/* Rank r's row on pid 0, named in the current file. Under lock. */
static bool rank_row(struct coord_timeline *t, int r) {
  size_t byte = (size_t)r / 8;
  unsigned char bit = (unsigned char)(1u << (r % 8));

  if (byte >= t->ranks_bytes) {
    size_t n = t->ranks_bytes * 2 > byte + 1 ? t->ranks_bytes * 2 : byte + 16;
    unsigned char *p = realloc(t->ranks_named, n);
    if (p == NULL)
      return false;
    memset(p + t->ranks_bytes, 0, n - t->ranks_bytes);
    t->ranks_named = p;
    t->ranks_bytes = n;
  }
  if (!(t->ranks_named[byte] & bit)) {
    name_rank_row(&t->pending, r);
    t->ranks_named[byte] |= bit;
  }
  return true;
}

static void put_end(struct hvd_buf *b, const struct tensor_track *k, struct stamp ts) {
  put(b, "{\"name\":\"%s\",\"ph\":\"E\",\"ts\":" TS ",\"pid\":%d,\"tid\":0}", k->phase, ts.us,
      ts.ns, k->pid);
}

void coord_timeline_begin(struct coord_timeline *t, const char *tensor, const char *phase) {
  struct tensor_track *k;
  if (!coord_timeline_active(t))
    return;
  pthread_mutex_lock(&t->lock);
  if (room(t) && (k = track(t, tensor)) != NULL) {
    struct stamp ts = now_stamp(t);
    size_t n = strnlen(phase, sizeof(k->phase) - 1);
    if (k->open)
      put_end(&t->pending, k, ts);
    memcpy(k->phase, phase, n);
    k->phase[n] = '\0';
    put(&t->pending, "{\"name\":\"%s\",\"ph\":\"B\",\"ts\":" TS ",\"pid\":%d,\"tid\":0}",
        k->phase, ts.us, ts.ns, k->pid);
    k->open = true;
    wake(t);
  }
  pthread_mutex_unlock(&t->lock);
}

void coord_timeline_end(struct coord_timeline *t, const char *tensor) {
  struct tensor_track *k;
  if (!coord_timeline_active(t))
    return;
  pthread_mutex_lock(&t->lock);
  if (room(t) && (k = hvd_map_get(&t->tensors, tensor, strlen(tensor))) != NULL && k->open) {
    put_end(&t->pending, k, now_stamp(t));
    k->open = false;
    wake(t);
  }
  pthread_mutex_unlock(&t->lock);
}

void coord_timeline_arrival(struct coord_timeline *t, const char *tensor, int rank) {
  struct tensor_track *k;
  if (!coord_timeline_active(t) || rank < 0)
    return;
  pthread_mutex_lock(&t->lock);
  if (room(t) && (k = track(t, tensor)) != NULL && rank_row(t, rank)) {
    struct stamp ts = now_stamp(t);
    put(&t->pending,
        "{\"name\":\"%s\",\"ph\":\"i\",\"s\":\"t\",\"ts\":" TS ",\"pid\":0,\"tid\":%d}",
        k->shown, ts.us, ts.ns, rank + 1);
    wake(t);
  }
  pthread_mutex_unlock(&t->lock);
}

void coord_timeline_cycle(struct coord_timeline *t) {
  if (!coord_timeline_active(t))
    return;
  pthread_mutex_lock(&t->lock);
  if (t->mark_cycles && room(t)) {
    struct stamp ts = now_stamp(t);
    put(&t->pending,
        "{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"g\",\"ts\":" TS ",\"pid\":0,\"tid\":0}",
        ts.us, ts.ns);
    wake(t);
  }
  pthread_mutex_unlock(&t->lock);
}

/* A file's beginning into b: pid 0's names and the start time; after a
 * rotation, the tensors with an open phase, begun again. Under lock. */
static void header(struct coord_timeline *t, struct hvd_buf *b, bool rotated) {
  struct hvd_map_iter it = {0};
  const char *key;
  size_t len;
  void *value;
  struct stamp ts = now_stamp(t);

  hvd_buf_reset(b);
  put_first(b, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
               "\"args\":{\"name\":\"hvd ranks\"}}");
  put(b, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
         "\"args\":{\"sort_index\":0}}");
  put(b, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
         "\"args\":{\"name\":\"cycles\"}}");
  /* Event times are relative to the start; this puts them on the wall clock. */
  put(b,
      "{\"name\":\"start_time_since_epoch_in_micros\",\"ph\":\"M\",\"pid\":0,\"tid\":0,"
      "\"args\":{\"start_time_since_epoch_in_micros\":%lld}}",
      t->start_wall_us);
  /* A part names every rank row seen so far (a fresh start, none). */
  for (size_t i = 0; rotated && i < t->ranks_bytes * 8; i++) {
    if (t->ranks_named[i / 8] & (1u << (i % 8)))
      name_rank_row(b, (int)i);
  }
  if (!rotated && t->ranks_named != NULL)
    memset(t->ranks_named, 0, t->ranks_bytes);
  while (rotated && hvd_map_iter_next(&t->tensors, &it, &key, &len, &value)) {
    struct tensor_track *k = value;
    k->announced = false;
    if (!k->open)
      continue;
    announce(b, k);
    put(b,
        "{\"name\":\"%s\",\"ph\":\"B\",\"ts\":" TS ",\"pid\":%d,\"tid\":0,"
        "\"args\":{\"continued\":true}}",
        k->phase, ts.us, ts.ns, k->pid);
  }
}

/* ==== the file ============================================================================ */

/* Writes io[0..n) whole, through short writes. */
static bool write_all(int fd, struct iovec *io, int n) {
  while (n > 0) {
    ssize_t w;
    if (io->iov_len == 0) {
      io++;
      n--;
      continue;
    }
    if ((w = writev(fd, io, n)) < 0) {
      if (errno == EINTR)
        continue;
      return false;
    }
    while (w > 0) {
      size_t step = (size_t)w < io->iov_len ? (size_t)w : io->iov_len;
      io->iov_base = (char *)io->iov_base + step;
      io->iov_len -= step;
      w -= (ssize_t)step;
      if (io->iov_len == 0) {
        io++;
        n--;
      }
    }
  }
  return true;
}

/* The length of the longest run of whole events at the start of s (len
 * bytes, more than room) that fits in room bytes: it ends before the ","
 * of a ",\n" that starts the next event. 0 when the first does not fit. */
static size_t fitting(const char *s, size_t len, size_t room) {
  for (size_t k = room + 1 < len ? room + 1 : len - 1; k >= 2; k--) {
    if (s[k] == '\n' && s[k - 1] == ',')
      return k - 1;
  }
  return 0;
}

/* Appends whole events to the file, padded so that every 4 KiB boundary
 * of it falls between two events; one writev(2) takes up to IOV_BATCH
 * pieces. On failure, the file is cut back to its last whole event. */
static bool write_events(struct coord_timeline *t, const char *s, size_t len) {
  struct iovec io[IOV_BATCH];
  uint64_t at = t->size; /* where the pieces so far end */
  int n = 0;

  while (len > 0) {
    size_t room = PAGE - (size_t)(at % PAGE), take = len, pad = 0;
    if (take > room) {
      take = fitting(s, len, room);
      if (take == 0 && room == PAGE)
        take = room; /* an event longer than a page: EVENT_MAX rules it out */
      pad = room - take;
    }
    if (take > 0)
      io[n++] = (struct iovec){.iov_base = (void *)s, .iov_len = take};
    if (pad > 0)
      io[n++] = (struct iovec){.iov_base = t->blanks, .iov_len = pad};
    at += take + pad;
    s += take;
    len -= take;
    if (len > 0 && n < IOV_BATCH - 1)
      continue;
    if (!write_all(t->fd, io, n)) {
      int err = errno;
      (void)ftruncate(t->fd, (off_t)t->size);
      errno = err;
      return false;
    }
    t->size = at;
    n = 0;
  }
  return true;
}

static void fail(struct coord_timeline *t, const char *what, int err) {
  snprintf(t->error, sizeof(t->error),
           "timeline %s: %s: %s (it stopped; the file keeps the events written before)", t->path,
           what, strerror(err));
}

/* The full file becomes <path>.1, closed; <path> starts again with head. */
static bool rotate(struct coord_timeline *t) {
  struct iovec end = {.iov_base = "\n]\n", .iov_len = 3};
  int fd;

  (void)write_all(t->fd, &end, 1);
  if (close(t->fd) != 0) {
    t->fd = -1;
    fail(t, "close", errno);
    return false;
  }
  t->fd = -1;
  if ((fd = open(t->next, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    fail(t, "open for the next part", errno);
    return false;
  }
  t->fd = fd;
  t->size = 0;
  if (!write_events(t, t->head.data, t->head.len)) {
    fail(t, "write", errno);
    return false;
  }
  t->head_size = t->size;
  /* The swap leaves a file at <path> at every moment; a file system
   * without it gets two renames. */
  if (renameat2(AT_FDCWD, t->next, AT_FDCWD, t->path, RENAME_EXCHANGE) == 0) {
    if (rename(t->next, t->previous) != 0) {
      fail(t, "rename to .1", errno);
      return false;
    }
  } else if (rename(t->path, t->previous) != 0 || rename(t->next, t->path) != 0) {
    fail(t, "rename", errno);
    return false;
  }
  return true;
}

static void *writer_main(void *arg) {
  struct coord_timeline *t = arg;
  bool last = false;

  (void)pthread_setname_np(pthread_self(), "hvd-timeline");
  pthread_mutex_lock(&t->lock);
  while (!last) {
    bool fresh = false, ok = true;
    int64_t due;
    struct hvd_buf swap;

    while (!t->closing && t->pending.len == 0) {
      t->writer_idle = true;
      pthread_cond_wait(&t->wake, &t->lock);
    }
    t->writer_idle = false;
    /* What gathers within a cycle of the first event goes out together. */
    due = hvd_now_ns() + FLUSH_NS;
    while (!t->closing && t->pending.len < EARLY_BYTES &&
           hvd_cond_wait_until(&t->wake, &t->lock, due) != ETIMEDOUT)
      ;
    last = t->closing;
    swap = t->batch;
    t->batch = t->pending;
    t->pending = swap;
    hvd_buf_reset(&t->pending);
    if (t->dropped > 0) {
      struct stamp ts = now_stamp(t);
      put(&t->batch,
          "{\"name\":\"hvd: %llu events dropped (the disk fell behind)\",\"ph\":\"i\",\"s\":\"g\","
          "\"ts\":" TS ",\"pid\":0,\"tid\":0}",
          t->dropped, ts.us, ts.ns);
      t->dropped = 0;
    }
    if (!last && t->fd >= 0 && t->max_bytes > 0 &&
        t->size + t->batch.len >= (uint64_t)t->max_bytes &&
        t->size - t->head_size + t->batch.len >= (uint64_t)t->max_bytes / 2) {
      header(t, &t->head, true);
      fresh = true;
    }
    pthread_mutex_unlock(&t->lock);

    if (t->fd >= 0) {
      ok = write_events(t, t->batch.data, t->batch.len);
      if (!ok)
        fail(t, "write", errno);
      if (ok && fresh)
        ok = rotate(t);
      if (ok && last) {
        struct iovec end = {.iov_base = "\n]\n", .iov_len = 3};
        ok = write_all(t->fd, &end, 1);
        if (!ok)
          fail(t, "write", errno);
      }
      if (!ok || last) {
        if (close(t->fd) != 0 && ok)
          fail(t, "close", errno);
        t->fd = -1;
      }
    }

    pthread_mutex_lock(&t->lock);
    if (!ok) { /* nothing more is taken; stop reports it */
      atomic_store(&t->active, false);
      hvd_buf_reset(&t->pending);
      HVD_LOG_WARN("%s", t->error);
    }
  }
  pthread_mutex_unlock(&t->lock);
  return NULL;
}

/* ==== start and stop ====================================================================== */

static char *with_suffix(const char *path, const char *suffix) {
  size_t n = strlen(path), m = strlen(suffix);
  char *s = malloc(n + m + 1);
  if (s != NULL) {
    memcpy(s, path, n);
    memcpy(s + n, suffix, m + 1);
  }
  return s;
}

hvd_status coord_timeline_start(struct coord_timeline *t, const char *path, bool mark_cycles) {
  struct timespec wall;
  hvd_status st = HVD_OK;
  int fd = -1, err;

  pthread_mutex_lock(&t->ctl);
  if (t->has_writer) {
    st = hvd_error(HVD_ERR_PRECONDITION, "a timeline is already being written (to %s)", t->path);
    goto out;
  }
  free_names(t);
  t->path = with_suffix(path, "");
  t->previous = with_suffix(path, ".1");
  t->next = with_suffix(path, ".next");
  if (t->path == NULL || t->previous == NULL || t->next == NULL) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the timeline's file names");
    goto out;
  }
  /* Written aside and renamed into place: <path> is never empty or cut. */
  if ((fd = open(t->next, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    st = hvd_error(HVD_ERR_IO, "timeline %s: %s", path, strerror(errno));
    goto out;
  }
  clock_gettime(CLOCK_REALTIME, &wall);
  pthread_mutex_lock(&t->lock);
  t->mark_cycles = mark_cycles;
  t->start_ns = hvd_now_ns();
  t->start_wall_us = (long long)wall.tv_sec * 1000000 + wall.tv_nsec / 1000;
  t->next_pid = 1;
  t->closing = false;
  t->dropped = 0;
  t->error[0] = '\0';
  hvd_buf_reset(&t->pending);
  header(t, &t->head, false);
  pthread_mutex_unlock(&t->lock);
  t->fd = fd;
  t->size = 0;
  if (t->head.len == 0 || !write_events(t, t->head.data, t->head.len)) {
    err = t->head.len == 0 ? ENOMEM : errno;
    st = hvd_error(HVD_ERR_IO, "timeline %s: %s", path, strerror(err));
    goto out;
  }
  t->head_size = t->size;
  if (rename(t->next, t->path) != 0) {
    st = hvd_error(HVD_ERR_IO, "timeline %s: rename from %s: %s", path, t->next, strerror(errno));
    goto out;
  }
  (void)unlink(t->previous); /* an earlier timeline's part, not this one's */
  if ((err = pthread_create(&t->writer, NULL, writer_main, t)) != 0) {
    st = hvd_error(HVD_ERR_NO_MEMORY, "timeline %s: cannot start its writer thread: %s", path,
                   strerror(err));
    goto out;
  }
  t->has_writer = true;
  atomic_store(&t->active, true);
out:
  if (st != HVD_OK && fd >= 0) {
    close(fd);
    (void)unlink(t->next);
    t->fd = -1;
  }
  pthread_mutex_unlock(&t->ctl);
  return st;
}

hvd_status coord_timeline_stop(struct coord_timeline *t) {
  hvd_status st = HVD_OK;

  pthread_mutex_lock(&t->ctl);
  if (!t->has_writer)
    goto out;
  pthread_mutex_lock(&t->lock);
  atomic_store(&t->active, false);
  t->closing = true;
  pthread_cond_signal(&t->wake);
  pthread_mutex_unlock(&t->lock);
  pthread_join(t->writer, NULL);
  t->has_writer = false;
  pthread_mutex_lock(&t->lock);
  if (t->error[0] != '\0')
    st = hvd_error(HVD_ERR_IO, "%s", t->error);
  forget_tensors(t);
  hvd_buf_reset(&t->pending);
  pthread_mutex_unlock(&t->lock);
out:
  pthread_mutex_unlock(&t->ctl);
  return st;
}
