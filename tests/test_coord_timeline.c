/*
 * The timeline (src/coord/timeline.c) through coord's own interface: a
 * file that parses as a trace at every moment, read while a thread records
 * and after the recording process is killed with SIGKILL; every event
 * inside one 4 KiB page of the file; events on disk within a cycle without
 * a stop; parts of a size limit, with open phases begun again; names that
 * a strict reader takes; start and stop. A reader closes an open file as a
 * viewer does: blanks and a trailing comma off, "]" added.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coord/coord.h"

Suite *coord_timeline_suite(void);

enum { PAGE = 4096 };

static void make_path(char *path, size_t size) {
  static int n;
  snprintf(path, size, "/tmp/hvd-timeline-%d-%d.json", (int)getpid(), n++);
}

static void remove_all(const char *path) {
  char other[512];
  unlink(path);
  snprintf(other, sizeof(other), "%s.1", path);
  unlink(other);
  snprintf(other, sizeof(other), "%s.next", path);
  unlink(other);
}

/* The file's bytes, NUL-terminated; NULL if it cannot be read. */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  char *text = NULL;
  size_t cap = 0, n = 0, got;
  if (f == NULL)
    return NULL;
  do {
    if (cap - n < 65536) {
      cap = cap * 2 + 65536;
      text = realloc(text, cap + 1);
      ck_assert_ptr_nonnull(text);
    }
    got = fread(text + n, 1, cap - n, f);
    n += got;
  } while (got > 0);
  fclose(f);
  text[n] = '\0';
  *len = n;
  return text;
}

/* Whether the bytes are UTF-8 throughout (what a strict reader demands). */
static bool is_utf8(const unsigned char *s, size_t len) {
  for (size_t i = 0; i < len;) {
    size_t n = s[i] < 0x80 ? 1 : s[i] >= 0xc2 && s[i] <= 0xdf ? 2 : s[i] >= 0xe0 && s[i] <= 0xef ? 3
                                                               : s[i] >= 0xf0 && s[i] <= 0xf4 ? 4
                                                                                              : 0;
    if (n == 0 || i + n > len)
      return false;
    for (size_t k = 1; k < n; k++) {
      if ((s[i + k] & 0xc0) != 0x80)
        return false;
    }
    i += n;
  }
  return true;
}

/* Every event ('{' to its '}' on one line) lies inside one page. */
static bool events_in_pages(const char *text, size_t len, char *why, size_t why_size) {
  size_t start = 0;
  while (start < len) {
    const char *nl = memchr(text + start, '\n', len - start);
    size_t end = nl != NULL ? (size_t)(nl - text) : len;
    const char *open = memchr(text + start, '{', end - start);
    if (open != NULL) {
      size_t first = (size_t)(open - text), last = end;
      while (last > first && text[last - 1] != '}')
        last--;
      if (last == first || first / PAGE != (last - 1) / PAGE) {
        snprintf(why, why_size, "the event at byte %zu (to %zu) %s", first, last,
                 last == first ? "is cut" : "crosses a page boundary");
        return false;
      }
    }
    start = end + 1;
  }
  return true;
}

/* The trace in text, closed as a viewer closes an open one; every element
 * an event with the fields the format asks for. NULL, with why, if not. */
static cJSON *parse_trace(char *text, size_t len, char *why, size_t why_size) {
  size_t n = len;
  char *closed;
  cJSON *doc, *e;

  while (n > 0 && strchr(" \t\r\n", text[n - 1]) != NULL)
    n--;
  if (n > 0 && text[n - 1] == ',')
    n--;
  if ((closed = malloc(n + 2)) == NULL)
    return NULL;
  memcpy(closed, text, n);
  closed[n] = '\0';
  if (n == 0 || closed[n - 1] != ']')
    strcat(closed, "]");
  doc = cJSON_Parse(closed);
  free(closed);
  if (!cJSON_IsArray(doc)) {
    snprintf(why, why_size, "not a JSON array (%zu bytes, ending %.80s)", len,
             len > 80 ? text + len - 80 : text);
    cJSON_Delete(doc);
    return NULL;
  }
  cJSON_ArrayForEach(e, doc) {
    cJSON *ph = cJSON_GetObjectItem(e, "ph");
    bool meta = cJSON_IsString(ph) && strcmp(ph->valuestring, "M") == 0;
    if (!cJSON_IsObject(e) || !cJSON_IsString(ph) ||
        !cJSON_IsString(cJSON_GetObjectItem(e, "name")) ||
        !cJSON_IsNumber(cJSON_GetObjectItem(e, "pid")) ||
        !cJSON_IsNumber(cJSON_GetObjectItem(e, "tid")) ||
        (!meta && !cJSON_IsNumber(cJSON_GetObjectItem(e, "ts")))) {
      char *shown = cJSON_PrintUnformatted(e);
      snprintf(why, why_size, "an event lacks a field: %.200s", shown != NULL ? shown : "?");
      free(shown);
      cJSON_Delete(doc);
      return NULL;
    }
  }
  return doc;
}

/* The file at path read and parsed, asserting all of the above. */
static cJSON *read_trace(const char *path, char **text_out) {
  char why[512] = "";
  size_t len = 0;
  char *text = slurp(path, &len);
  cJSON *doc;

  ck_assert_msg(text != NULL, "cannot read %s", path);
  ck_assert_msg(is_utf8((const unsigned char *)text, len), "%s is not UTF-8", path);
  ck_assert_msg(events_in_pages(text, len, why, sizeof(why)), "%s: %s", path, why);
  doc = parse_trace(text, len, why, sizeof(why));
  ck_assert_msg(doc != NULL, "%s: %s", path, why);
  if (text_out != NULL)
    *text_out = text;
  else
    free(text);
  return doc;
}

static int count_named(cJSON *doc, const char *name, const char *ph) {
  cJSON *e;
  int n = 0;
  cJSON_ArrayForEach(e, doc) {
    cJSON *nm = cJSON_GetObjectItem(e, "name"), *p = cJSON_GetObjectItem(e, "ph");
    n += strcmp(nm->valuestring, name) == 0 && (ph == NULL || strcmp(p->valuestring, ph) == 0);
  }
  return n;
}

/* A metadata event's args.name, for pid (and tid, when tid >= 0). */
static bool has_meta(cJSON *doc, const char *what, int pid, int tid, const char *value) {
  cJSON *e;
  cJSON_ArrayForEach(e, doc) {
    cJSON *args = cJSON_GetObjectItem(e, "args");
    cJSON *v = args != NULL ? cJSON_GetObjectItem(args, "name") : NULL;
    if (strcmp(cJSON_GetObjectItem(e, "name")->valuestring, what) == 0 &&
        cJSON_GetObjectItem(e, "pid")->valueint == pid &&
        (tid < 0 || cJSON_GetObjectItem(e, "tid")->valueint == tid) && cJSON_IsString(v) &&
        strcmp(v->valuestring, value) == 0)
      return true;
  }
  return false;
}

/* One operation's events, as rank 0 records them for a job of 4. */
static void record_op(struct coord_timeline *t, const char *name) {
  coord_timeline_begin(t, name, "NEGOTIATE_ALLREDUCE");
  for (int r = 0; r < 4; r++)
    coord_timeline_arrival(t, name, r);
  coord_timeline_begin(t, name, "QUEUE");
  coord_timeline_cycle(t);
  coord_timeline_begin(t, name, "MEMCPY_IN_FUSION_BUFFER");
  coord_timeline_begin(t, name, "ALLREDUCE");
  coord_timeline_end(t, name);
}

/* ==== read while written ==================================================================== */

struct recorder {
  struct coord_timeline *t;
  int ops;
  atomic_bool done;
};

static void *recorder_main(void *arg) {
  struct recorder *r = arg;
  char name[64];
  for (int i = 0; i < r->ops; i++) {
    snprintf(name, sizeof(name), "grad.%d", i % 37);
    record_op(r->t, name);
    if (i % 64 == 0)
      usleep(200);
  }
  atomic_store(&r->done, true);
  return NULL;
}

START_TEST(valid_while_written) {
  char path[256], *text;
  struct recorder r = {.ops = 5000};
  pthread_t th;
  cJSON *doc;
  int reads = 0;
  bool seen = false;

  make_path(path, sizeof(path));
  ck_assert_int_eq(coord_timeline_create(&r.t, 0), HVD_OK);
  ck_assert_int_eq(coord_timeline_start(r.t, path, true), HVD_OK);
  /* The header is on disk when start returns. */
  doc = read_trace(path, NULL);
  ck_assert(has_meta(doc, "process_name", 0, 0, "hvd ranks"));
  ck_assert_int_eq(count_named(doc, "start_time_since_epoch_in_micros", "M"), 1);
  cJSON_Delete(doc);

  atomic_init(&r.done, false);
  ck_assert_int_eq(pthread_create(&th, NULL, recorder_main, &r), 0);
  while (!atomic_load(&r.done) || reads < 20) {
    cJSON_Delete(read_trace(path, NULL));
    reads++;
  }
  pthread_join(th, NULL);
  coord_timeline_arrival(r.t, "the.last.one", 2);
  /* On disk within a cycle, with no stop: a job killed now keeps it. */
  for (int i = 0; i < 400 && !seen; i++) {
    doc = read_trace(path, NULL);
    seen = count_named(doc, "the.last.one", "i") == 1;
    cJSON_Delete(doc);
    if (!seen)
      usleep(5000);
  }
  ck_assert_msg(seen, "an event recorded 2 s ago is not in the file");
  doc = read_trace(path, NULL);
  ck_assert_int_eq(count_named(doc, "NEGOTIATE_ALLREDUCE", "B"), r.ops);
  ck_assert_int_eq(count_named(doc, "ALLREDUCE", "E"), r.ops);
  ck_assert_int_eq(count_named(doc, "CYCLE_START", "i"), r.ops);
  ck_assert_int_eq(count_named(doc, "grad.5", "i"), 4 * ((r.ops - 5 + 36) / 37));
  /* Ranks as rows: pid 0's thread r + 1 is "rank r"; tensors name theirs. */
  for (int k = 0; k < 4; k++) {
    char rank[16];
    snprintf(rank, sizeof(rank), "rank %d", k);
    ck_assert(has_meta(doc, "thread_name", 0, k + 1, rank));
  }
  ck_assert(has_meta(doc, "process_name", 1, 0, "grad.0"));
  ck_assert(has_meta(doc, "thread_name", 1, 0, "rank 0"));
  cJSON_Delete(doc);

  ck_assert_int_eq(coord_timeline_stop(r.t), HVD_OK);
  doc = read_trace(path, &text);
  ck_assert_msg(strlen(text) >= 3 && strcmp(text + strlen(text) - 3, "\n]\n") == 0,
                "a stopped timeline ends with its bracket: ...%s", text + strlen(text) - 20);
  cJSON_Delete(doc);
  doc = cJSON_Parse(text); /* as it is, with no closing */
  ck_assert_ptr_nonnull(doc);
  cJSON_Delete(doc);
  free(text);
  coord_timeline_destroy(r.t);
  remove_all(path);
  ck_assert_msg(reads >= 20, "%d reads", reads);
}
END_TEST

/* ==== kill -9 ================================================================================ */

/* A process that records as fast as it can until it is killed. */
static void record_until_killed(const char *path, int ready_fd) {
  struct coord_timeline *t;
  char name[64], long_name[1500];
  memset(long_name, 'x', sizeof(long_name) - 1);
  long_name[sizeof(long_name) - 1] = '\0';
  if (coord_timeline_create(&t, 0) != HVD_OK || coord_timeline_start(t, path, true) != HVD_OK)
    _exit(3);
  if (write(ready_fd, "r", 1) != 1)
    _exit(4);
  for (long i = 0;; i++) {
    snprintf(name, sizeof(name), "grad.%ld", i % 101);
    record_op(t, i % 13 == 0 ? long_name : name);
    if (i % 16 == 0)
      usleep(50);
  }
}

START_TEST(valid_after_kill_9) {
  /* Kills at several moments: some meet a write in progress. */
  for (int round = 0; round < 6; round++) {
    char path[256], c;
    int fds[2], status;
    pid_t pid;
    cJSON *doc;

    make_path(path, sizeof(path));
    ck_assert_int_eq(pipe(fds), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      alarm(30); /* a child the test lost does not outlive it */
      record_until_killed(path, fds[1]);
    }
    close(fds[1]);
    ck_assert_int_eq(read(fds[0], &c, 1), 1);
    close(fds[0]);
    usleep(20000 + 37000 * round);
    ck_assert_int_eq(kill(pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    doc = read_trace(path, NULL);
    ck_assert_msg(count_named(doc, "ALLREDUCE", "E") > 10, "round %d: %d operations", round,
                  count_named(doc, "ALLREDUCE", "E"));
    cJSON_Delete(doc);
    remove_all(path);
  }
}
END_TEST

/* ==== size limit ============================================================================= */

START_TEST(parts_of_the_limit) {
  enum { LIMIT = 65536 };
  char path[256], previous[300], next[300];
  struct coord_timeline *t;
  struct stat sb;
  cJSON *doc;
  char *text;

  make_path(path, sizeof(path));
  snprintf(previous, sizeof(previous), "%s.1", path);
  snprintf(next, sizeof(next), "%s.next", path);
  /* A part of an earlier timeline at this path goes at the start. */
  ck_assert_int_eq(close(open(previous, O_WRONLY | O_CREAT | O_TRUNC, 0644)), 0);
  ck_assert_int_eq(coord_timeline_create(&t, LIMIT), HVD_OK);
  ck_assert_int_eq(coord_timeline_start(t, path, false), HVD_OK);
  ck_assert_int_ne(access(previous, F_OK), 0);
  coord_timeline_begin(t, "held \"open\"", "NEGOTIATE_BROADCAST");
  /* About 6 parts' worth, in batches the writer takes one by one. */
  for (int i = 0; i < 60; i++) {
    for (int k = 0; k < 8; k++) {
      char name[32];
      snprintf(name, sizeof(name), "grad.%d", (i * 8 + k) % 50);
      record_op(t, name);
    }
    usleep(3000);
  }
  usleep(20000);
  ck_assert_int_eq(stat(previous, &sb), 0);
  ck_assert_msg(sb.st_size >= LIMIT / 2 && sb.st_size < 4 * LIMIT, "%s: %lld bytes", previous,
                (long long)sb.st_size);
  ck_assert_int_ne(access(next, F_OK), 0);
  /* The part before is closed: it parses as it is. */
  text = slurp(previous, &(size_t){0});
  doc = cJSON_Parse(text);
  ck_assert_msg(cJSON_IsArray(doc), "%s does not parse as it is", previous);
  cJSON_Delete(doc);
  free(text);
  cJSON_Delete(read_trace(previous, NULL));
  /* The current part names what it shows and begins the open phase again. */
  ck_assert_int_eq(stat(path, &sb), 0);
  ck_assert_int_lt(sb.st_size, 4 * LIMIT);
  doc = read_trace(path, NULL);
  ck_assert(has_meta(doc, "process_name", 0, 0, "hvd ranks"));
  ck_assert_int_eq(count_named(doc, "start_time_since_epoch_in_micros", "M"), 1);
  ck_assert(has_meta(doc, "process_name", 1, 0, "held \"open\""));
  ck_assert_int_eq(count_named(doc, "NEGOTIATE_BROADCAST", "B"), 1);
  cJSON_Delete(doc);
  /* A part names the rank rows seen before it in its header, before the
   * open phase begun again. */
  text = slurp(path, &(size_t){0});
  for (int r = 0; r < 4; r++) {
    char row[64];
    snprintf(row, sizeof(row), "\"tid\":%d,\"args\":{\"name\":\"rank %d\"}}", r + 1, r);
    ck_assert_msg(strstr(text, row) != NULL && strstr(text, row) < strstr(text, "\"B\""),
                  "the part does not name rank %d's row in its header", r);
  }
  free(text);
  coord_timeline_end(t, "held \"open\"");
  ck_assert_int_eq(coord_timeline_stop(t), HVD_OK);
  doc = read_trace(path, NULL);
  ck_assert_int_eq(count_named(doc, "NEGOTIATE_BROADCAST", "E"), 1);
  cJSON_Delete(doc);
  coord_timeline_destroy(t);
  remove_all(path);
}
END_TEST

/* ==== names and switches ===================================================================== */

START_TEST(names_a_strict_reader_takes) {
  static const char *names[] = {
      "quote\" backslash\\ slash/", "line\nfeed\ttab\rret\bback\fform", "ctl\x01\x1f del\x7f",
      "bad \xff \xc3 \xed\xa0\x80 \xf4\x90\x80\x80 end",
      "utf-8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
  };
  static const char *shown[] = {
      "quote\" backslash\\ slash/", "line\nfeed\ttab\rret\bback\fform", "ctl?? del?",
      "bad ? ? ??? ???? end", "utf-8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
  };
  char path[256], *longest = malloc(4097);
  struct coord_timeline *t;
  cJSON *doc, *e;
  bool cut = false;

  memset(longest, 'n', 4096);
  longest[4096] = '\0';
  make_path(path, sizeof(path));
  ck_assert_int_eq(coord_timeline_create(&t, 0), HVD_OK);
  ck_assert_int_eq(coord_timeline_start(t, path, false), HVD_OK);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    record_op(t, names[i]);
  record_op(t, longest);
  ck_assert_int_eq(coord_timeline_stop(t), HVD_OK);
  doc = read_trace(path, NULL);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    ck_assert_msg(has_meta(doc, "process_name", (int)i + 1, 0, shown[i]), "name %zu", i);
  cJSON_ArrayForEach(e, doc) {
    cJSON *args = cJSON_GetObjectItem(e, "args");
    cJSON *v = args != NULL ? cJSON_GetObjectItem(args, "name") : NULL;
    if (cJSON_IsString(v) && v->valuestring[0] == 'n') {
      size_t n = strlen(v->valuestring);
      cut = n < 600 && strcmp(v->valuestring + n - 3, "...") == 0;
    }
  }
  ck_assert_msg(cut, "a 4096-byte name is not shown cut");
  cJSON_Delete(doc);
  coord_timeline_destroy(t);
  remove_all(path);
  free(longest);
}
END_TEST

START_TEST(start_and_stop) {
  char path[256], other[256];
  struct coord_timeline *t;
  cJSON *doc;

  make_path(path, sizeof(path));
  make_path(other, sizeof(other));
  ck_assert_int_eq(coord_timeline_create(&t, 0), HVD_OK);
  ck_assert_int_eq(coord_timeline_stop(t), HVD_OK); /* none: nothing to do */
  coord_timeline_begin(t, "unseen", "QUEUE");        /* none: dropped */
  ck_assert(!coord_timeline_active(t));
  ck_assert_int_eq(coord_timeline_start(t, "/nonexistent-hvd-dir/t.json", false), HVD_ERR_IO);
  ck_assert_ptr_nonnull(strstr(hvd_last_error_message(), "/nonexistent-hvd-dir/t.json"));
  ck_assert_int_eq(coord_timeline_start(t, path, false), HVD_OK);
  ck_assert(coord_timeline_active(t));
  ck_assert_int_eq(coord_timeline_start(t, other, false), HVD_ERR_PRECONDITION);
  record_op(t, "first");
  ck_assert_int_eq(coord_timeline_stop(t), HVD_OK);
  ck_assert_int_eq(coord_timeline_stop(t), HVD_OK);
  ck_assert(!coord_timeline_active(t));
  /* Started again: a new file with its own tracks; no cycle marks asked. */
  ck_assert_int_eq(coord_timeline_start(t, other, false), HVD_OK);
  record_op(t, "second");
  coord_timeline_destroy(t); /* stops it */
  doc = read_trace(path, NULL);
  ck_assert(has_meta(doc, "process_name", 1, 0, "first"));
  ck_assert_int_eq(count_named(doc, "unseen", NULL), 0);
  cJSON_Delete(doc);
  doc = read_trace(other, NULL);
  ck_assert(has_meta(doc, "process_name", 1, 0, "second"));
  ck_assert_int_eq(count_named(doc, "first", NULL), 0);
  ck_assert_int_eq(count_named(doc, "CYCLE_START", NULL), 0);
  cJSON_Delete(doc);
  remove_all(path);
  remove_all(other);
}
END_TEST

Suite *coord_timeline_suite(void) {
  Suite *s = suite_create("timeline");
  TCase *tc = tcase_create("file");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, valid_while_written);
  tcase_add_test(tc, valid_after_kill_9);
  tcase_add_test(tc, parts_of_the_limit);
  tcase_add_test(tc, names_a_strict_reader_takes);
  tcase_add_test(tc, start_and_stop);
  suite_add_tcase(s, tc);
  return s;
}
