/*
 * The timeline: a Chrome trace (the JSON array format that Perfetto and
 * chrome://tracing read) of what the coordinator sees per tensor. Each
 * tensor is a "process" (pid) named after it, with one phase open at a
 * time: NEGOTIATE_<OP> from its first submission until every rank has
 * submitted (instant marks name the ranks as they arrive), then the
 * phases of its execution. Writes go through stdio's buffer under a lock;
 * only the background thread writes events, user threads start and stop.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord.h"

struct tensor_track {
  int pid;
  bool open;
};

struct coord_timeline {
  pthread_mutex_t lock;
  atomic_bool active;
  FILE *f;
  bool mark_cycles;
  int64_t start_ns;
  struct hvd_map tensors; /* name -> tensor_track */
  int next_pid;
  bool first;
};

hvd_status coord_timeline_create(struct coord_timeline **out) {
  struct coord_timeline *t = calloc(1, sizeof(*t));
  if (t == NULL || pthread_mutex_init(&t->lock, NULL) != 0) {
    free(t);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot allocate the timeline");
  }
  atomic_init(&t->active, false);
  hvd_map_init(&t->tensors);
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

void coord_timeline_destroy(struct coord_timeline *t) {
  if (t == NULL)
    return;
  coord_timeline_stop(t);
  forget_tensors(t);
  hvd_map_fini(&t->tensors);
  pthread_mutex_destroy(&t->lock);
  free(t);
}

bool coord_timeline_active(const struct coord_timeline *t) {
  return t != NULL && atomic_load_explicit(&t->active, memory_order_relaxed);
}

/* A JSON string body: quotes, backslashes and control characters escaped. */
static void put_escaped(FILE *f, const char *s) {
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
}

static void separator(struct coord_timeline *t) {
  if (!t->first)
    fputs(",\n", t->f);
  t->first = false;
}

static int64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double now_us(const struct coord_timeline *t) {
  return (double)(hvd_now_ns() - t->start_ns) / 1000.0;
}

hvd_status coord_timeline_start(struct coord_timeline *t, const char *path, bool mark_cycles) {
  FILE *f;

  pthread_mutex_lock(&t->lock);
  if (t->f != NULL) {
    pthread_mutex_unlock(&t->lock);
    return hvd_error(HVD_ERR_PRECONDITION, "a timeline is already being written");
  }
  f = fopen(path, "w");
  if (f == NULL) {
    int err = errno;
    pthread_mutex_unlock(&t->lock);
    return hvd_error(HVD_ERR_IO, "timeline %s: %s", path, strerror(err));
  }
  setvbuf(f, NULL, _IOFBF, 1 << 16);
  t->f = f;
  t->mark_cycles = mark_cycles;
  t->start_ns = hvd_now_ns();
  t->next_pid = 1;
  t->first = true;
  fputs("[\n", f);
  separator(t);
  fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"hvd cycles\"}}", f);
  /* Event times are relative to the start; this puts them on the wall clock. */
  separator(t);
  fprintf(f,
          "{\"name\":\"start_time_since_epoch_in_micros\",\"ph\":\"M\",\"pid\":0,"
          "\"args\":{\"start_time_since_epoch_in_micros\":%lld}}",
          (long long)(wall_ns() / 1000));
  atomic_store(&t->active, true);
  pthread_mutex_unlock(&t->lock);
  return HVD_OK;
}

hvd_status coord_timeline_stop(struct coord_timeline *t) {
  hvd_status st = HVD_OK;

  pthread_mutex_lock(&t->lock);
  atomic_store(&t->active, false);
  if (t->f != NULL) {
    fputs("\n]\n", t->f);
    if (fclose(t->f) != 0)
      st = hvd_error(HVD_ERR_IO, "closing the timeline: %s", strerror(errno));
    t->f = NULL;
  }
  forget_tensors(t);
  pthread_mutex_unlock(&t->lock);
  return st;
}

/* The tensor's track, announced with its name the first time. Under lock. */
static struct tensor_track *track(struct coord_timeline *t, const char *tensor) {
  size_t len = strlen(tensor);
  struct tensor_track *k = hvd_map_get(&t->tensors, tensor, len);
  if (k != NULL)
    return k;
  if ((k = calloc(1, sizeof(*k))) == NULL)
    return NULL;
  if (hvd_map_put(&t->tensors, tensor, len, k, NULL) != HVD_OK) {
    free(k);
    return NULL;
  }
  k->pid = t->next_pid++;
  separator(t);
  fprintf(t->f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"", k->pid);
  put_escaped(t->f, tensor);
  fputs("\"}}", t->f);
  separator(t);
  fprintf(t->f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}}",
          k->pid, k->pid);
  return k;
}

static void close_phase(struct coord_timeline *t, struct tensor_track *k) {
  if (!k->open)
    return;
  separator(t);
  fprintf(t->f, "{\"ph\":\"E\",\"ts\":%.3f,\"pid\":%d,\"tid\":0}", now_us(t), k->pid);
  k->open = false;
}

void coord_timeline_begin(struct coord_timeline *t, const char *tensor, const char *phase) {
  struct tensor_track *k;
  if (!coord_timeline_active(t))
    return;
  pthread_mutex_lock(&t->lock);
  if (t->f != NULL && (k = track(t, tensor)) != NULL) {
    close_phase(t, k);
    separator(t);
    fprintf(t->f, "{\"name\":\"%s\",\"ph\":\"B\",\"ts\":%.3f,\"pid\":%d,\"tid\":0}", phase,
            now_us(t), k->pid);
    k->open = true;
  }
  pthread_mutex_unlock(&t->lock);
}

void coord_timeline_end(struct coord_timeline *t, const char *tensor) {
  struct tensor_track *k;
  if (!coord_timeline_active(t))
    return;
  pthread_mutex_lock(&t->lock);
  if (t->f != NULL && (k = hvd_map_get(&t->tensors, tensor, strlen(tensor))) != NULL)
    close_phase(t, k);
  pthread_mutex_unlock(&t->lock);
}

void coord_timeline_mark(struct coord_timeline *t, const char *tensor, const char *what) {
  struct tensor_track *k;
  if (!coord_timeline_active(t))
    return;
  pthread_mutex_lock(&t->lock);
  if (t->f != NULL && (k = track(t, tensor)) != NULL) {
    separator(t);
    fprintf(t->f, "{\"name\":\"");
    put_escaped(t->f, what);
    fprintf(t->f, "\",\"ph\":\"i\",\"s\":\"p\",\"ts\":%.3f,\"pid\":%d,\"tid\":0}", now_us(t),
            k->pid);
  }
  pthread_mutex_unlock(&t->lock);
}

void coord_timeline_cycle(struct coord_timeline *t) {
  if (!coord_timeline_active(t))
    return;
  pthread_mutex_lock(&t->lock);
  if (t->f != NULL && t->mark_cycles) {
    separator(t);
    fprintf(t->f, "{\"name\":\"CYCLE_START\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":0,\"tid\":0}",
            now_us(t));
  }
  pthread_mutex_unlock(&t->lock);
}
