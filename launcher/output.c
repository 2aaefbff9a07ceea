/*
 * A rank's output, line by line: "[3]<stdout>:text".
 *
 * DESIGN. Bytes arrive in arbitrary chunks (a pipe read may end inside a
 * line, or inside a UTF-8 character); a line is written only once it is
 * complete, with its prefix, in one fwrite, so lines of different ranks
 * never interleave within a line. "\r" ends a line as "\n" does (progress
 * bars that redraw one line become one line per update, as horovodrun
 * shows them). A line longer than LINE_MAX is written in pieces, each with
 * the prefix. The --output-filename copy gets the bytes as the rank wrote
 * them, unprefixed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvdrun.h"

enum { LINE_MAX_BYTES = 64 * 1024 };

void hvdrun_stream_init(struct hvdrun_stream *s, int rank, bool is_stderr, FILE *out, FILE *file,
                        bool prefix, bool timestamp) {
  memset(s, 0, sizeof(*s));
  s->rank = rank;
  s->is_stderr = is_stderr;
  s->out = out;
  s->file = file;
  s->prefix = prefix;
  s->timestamp = timestamp;
}

/* The N of "rank N" right before text + at; -1 when it is not there. */
static int rank_before(const char *text, size_t at) {
  size_t digits = at;
  long n;
  while (digits > 0 && text[digits - 1] >= '0' && text[digits - 1] <= '9')
    digits--;
  if (digits == at || digits < 5 || strncmp(text + digits - 5, "rank ", 5) != 0 ||
      at - digits > 9)
    return -1;
  n = strtol(text + digits, NULL, 10);
  return (int)n;
}

/* What a rank's failure message says of other ranks, so that hvdrun's
 * last lines can name the rank at fault, not the first one that gave up:
 * a transport timeout names the peers it waited for ("no progress for
 * 30.0 s: receiving 4 bytes from rank 2 (global rank 2 on h3); ..."), the
 * coordinator a silent one ("rank 2 has sent nothing for 30 s"), a stop
 * the rank that shut the job down ("rank 1 called hvd_shutdown") or that
 * failed ("rank 1 failed: ..."). The first of these a line holds wins:
 * "rank 0 failed: rank 2 has sent nothing" points at rank 2. */
static void note_waits(struct hvdrun_stream *s, const char *line, size_t len) {
  static const char timeout[] = "no progress for ", who[] = "(global rank ";
  static const struct {
    const char *after; /* follows "rank N" */
    enum hvdrun_wait_kind kind;
  } about[] = {{" has sent nothing for ", HVDRUN_WAIT_TIMEOUT},
               {" called hvd_shutdown", HVDRUN_WAIT_SHUTDOWN},
               {" failed: ", HVDRUN_WAIT_FAILED}};
  char text[1024];
  const char *p;

  /* Every line of stderr passes here: look before copying. */
  if (!s->is_stderr || memmem(line, len, "rank ", 5) == NULL)
    return;
  len = len < sizeof(text) - 1 ? len : sizeof(text) - 1;
  memcpy(text, line, len);
  text[len] = '\0';
  if ((p = strstr(text, timeout)) != NULL) {
    s->nwaited = 0;
    s->wait_kind = HVDRUN_WAIT_TIMEOUT;
    while ((p = strstr(p, who)) != NULL && s->nwaited < HVDRUN_WAITED_MAX) {
      const char *digits = p + sizeof(who) - 1;
      char *end;
      long g = strtol(digits, &end, 10);
      p = end;
      if (end != digits && g >= 0 && g <= INT32_MAX)
        s->waited_on[s->nwaited++] = (int)g;
    }
    return;
  }
  for (size_t i = 0; i < HVD_ARRAY_SIZE(about); i++) {
    int r;
    if ((p = strstr(text, about[i].after)) != NULL &&
        (r = rank_before(text, (size_t)(p - text))) >= 0) {
      s->waited_on[0] = r;
      s->nwaited = 1;
      s->wait_kind = about[i].kind;
      return;
    }
  }
}

/* Writes line[0 .. len) (without its end) with the prefix and a newline. */
static void emit(struct hvdrun_stream *s, const char *line, size_t len) {
  char head[96];
  size_t hlen = 0;

  note_waits(s, line, len);
  if (s->timestamp) {
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    hlen += strftime(head, sizeof(head), "%a %b %e %H:%M:%S %Y", &tm);
  }
  if (s->prefix)
    hlen += (size_t)snprintf(head + hlen, sizeof(head) - hlen, "[%d]<%s>:", s->rank,
                             s->is_stderr ? "stderr" : "stdout");
  else if (s->timestamp && hlen < sizeof(head) - 1)
    head[hlen++] = ' ';
  /* One buffer so that the line goes out in one write. */
  char *buf = malloc(hlen + len + 1);
  if (buf == NULL) {
    fwrite(head, 1, hlen, s->out);
    fwrite(line, 1, len, s->out);
    fputc('\n', s->out);
  } else {
    memcpy(buf, head, hlen);
    memcpy(buf + hlen, line, len);
    buf[hlen + len] = '\n';
    fwrite(buf, 1, hlen + len + 1, s->out);
    free(buf);
  }
  fflush(s->out);
}

static bool keep(struct hvdrun_stream *s, const char *data, size_t n) {
  if (hvd_array_reserve(&s->line, &s->cap, s->len + n, 1, 256) != HVD_OK)
    return false;
  memcpy(s->line + s->len, data, n);
  s->len += n;
  return true;
}

void hvdrun_stream_feed(struct hvdrun_stream *s, const char *data, size_t n) {
  if (s->file != NULL) {
    fwrite(data, 1, n, s->file);
    fflush(s->file);
  }
  if (s->after_cr && n > 0 && data[0] == '\n') {
    data++;
    n--;
  }
  s->after_cr = false;
  while (n > 0) {
    size_t k = 0;
    while (k < n && data[k] != '\n' && data[k] != '\r')
      k++;
    if (k == n) { /* no line end: keep the rest for later */
      if (s->len + n > LINE_MAX_BYTES) {
        size_t room = LINE_MAX_BYTES - s->len;
        if (keep(s, data, room))
          emit(s, s->line, s->len);
        s->len = 0;
        data += room;
        n -= room;
        continue;
      }
      if (!keep(s, data, n)) { /* out of memory: pass what we have through */
        emit(s, s->line, s->len);
        emit(s, data, n);
        s->len = 0;
      }
      return;
    }
    if (s->len > 0) {
      if (keep(s, data, k))
        emit(s, s->line, s->len);
      else {
        emit(s, s->line, s->len);
        emit(s, data, k);
      }
      s->len = 0;
    } else {
      emit(s, data, k);
    }
    /* "\r\n" is one line end, even split between two reads. */
    if (data[k] == '\r' && k + 1 < n && data[k + 1] == '\n')
      k++;
    else if (data[k] == '\r' && k + 1 == n)
      s->after_cr = true;
    data += k + 1;
    n -= k + 1;
  }
}

void hvdrun_stream_finish(struct hvdrun_stream *s) {
  if (s->len > 0)
    emit(s, s->line, s->len);
  s->len = 0;
}

void hvdrun_stream_fini(struct hvdrun_stream *s) {
  free(s->line);
  s->line = NULL;
  s->len = s->cap = 0;
}
