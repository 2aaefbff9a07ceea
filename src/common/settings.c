/*
 * The settings table (settings.def) and the one parser of its values. The
 * library's reads, hvdrun's checks of its flags and config file, and the
 * docs all go through here, so a value is accepted, refused and described
 * the same way wherever it is given. Messages name where the value came
 * from: VARIABLE='value' for the environment, "LABEL: 'value'" for hvdrun.
 */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

enum { VALUE_MAX = 256 };

static const struct hvd_setting_info TABLE[HVD_SETTING_COUNT] = {
#define HVD_SETTING(id, env_, section_, scope_, ...)                                             \
  [HVD_SET_##id] = {.env = env_, .section = section_, .scope = scope_, __VA_ARGS__},
#include "settings.def"
#undef HVD_SETTING
};

const struct hvd_setting_info *hvd_setting_info(enum hvd_setting id) { return &TABLE[id]; }
const char *hvd_setting_name(enum hvd_setting id) { return TABLE[id].env; }
const char *hvd_setting_given(enum hvd_setting id) { return hvd_env_str(TABLE[id].env); }
const char *hvd_setting_real(enum hvd_setting id) { return hvd_env_real(TABLE[id].env); }

hvd_status hvd_setting_provide(enum hvd_setting id, const char *value) {
  return hvd_env_provide(TABLE[id].env, value);
}

/* ---- parsing ------------------------------------------------------------ */

/* Where a value came from, for messages. */
struct origin {
  const char *label;
  bool flag; /* "LABEL: 'v'" (hvdrun) rather than "VAR='v'" */
};

static hvd_status HVD_PRINTF(3, 4) refuse(struct origin o, const char *value, const char *fmt,
                                          ...) {
  char what[512], shown[65];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  hvd_printable(value, shown, sizeof(shown));
  return hvd_error(HVD_ERR_INVALID_ARGUMENT, o.flag ? "%s: '%s' %s" : "%s='%s' %s", o.label,
                   shown, what);
}

/* A number as people write it: 10000000, not 1e+07; 0.001, not 1e-03. */
static void number_text(double v, char *out, size_t size) {
  if (v == floor(v) && fabs(v) < 1e15)
    snprintf(out, size, "%.0f", v);
  else
    snprintf(out, size, "%g", v);
}

/* Copies the value without surrounding blanks; false if it does not fit. */
static bool trimmed(const char *v, char *buf, size_t size) {
  size_t len;
  while (isspace((unsigned char)*v))
    v++;
  len = strlen(v);
  while (len > 0 && isspace((unsigned char)v[len - 1]))
    len--;
  if (len >= size)
    return false;
  memcpy(buf, v, len);
  buf[len] = '\0';
  return true;
}

/* Which of a WORD setting's words a text is (-1: none); a word's other
 * spellings ("halving_doubling|hd") count as the word. */
static int word_index(const struct hvd_setting_info *s, const char *text) {
  const char *p = s->words;
  int index = 0;
  size_t len = strlen(text);
  while (*p != '\0') {
    size_t n = strcspn(p, ",|");
    if (n == len && (s->any_case ? strncasecmp(p, text, n) : strncmp(p, text, n)) == 0)
      return index;
    p += n;
    if (*p == ',')
      index++;
    if (*p != '\0')
      p++;
  }
  return -1;
}

/* Writes word `index`'s first spelling; false ("?") when there is none. */
static bool word_text(const struct hvd_setting_info *s, int index, char *out, size_t size) {
  const char *p = index >= 0 ? s->words : NULL;
  for (int i = 0; i < index && p != NULL; i++) {
    p = strchr(p, ',');
    if (p != NULL)
      p++;
  }
  if (p == NULL) {
    snprintf(out, size, "?");
    return false;
  }
  snprintf(out, size, "%.*s", (int)strcspn(p, ",|"), p);
  return true;
}

/* "a, b, c": the first spellings, for messages. */
static void word_list(const struct hvd_setting_info *s, char *out, size_t size) {
  size_t used = 0;
  char w[64];
  out[0] = '\0';
  for (int i = 0; used < size && word_text(s, i, w, sizeof(w)); i++)
    used += (size_t)snprintf(out + used, size - used, "%s%s", i > 0 ? ", " : "", w);
}

/* The parsed value of one setting. */
struct value {
  int64_t i;     /* INT, BOOL (0/1), WORD (index) */
  double d;      /* NUMBER */
  const char *t; /* TEXT: as given; NULL when unset */
};

static hvd_status parse(const struct hvd_setting_info *s, const char *text, struct origin o,
                        int64_t scale, struct value *v) {
  char buf[VALUE_MAX], lo[32], hi[32];
  const char *of = s->unit != NULL ? " of " : "", *unit = s->unit != NULL ? s->unit : "";
  bool b;

  if (s->type == HVD_SETTING_TEXT) {
    if (s->hi > 0 && strlen(text) > (size_t)s->hi)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s is longer than %" PRId64 " bytes", o.label,
                       s->hi);
    return HVD_OK;
  }
  if (!trimmed(text, buf, sizeof(buf)))
    buf[0] = '\0'; /* far too long for any of these: refused below */
  switch (s->type) {
  case HVD_SETTING_INT:
    if (scale > 1) { /* a flag in larger units: any number of them, rounded to whole bytes */
      double x;
      number_text((double)s->lo / (double)scale, lo, sizeof(lo));
      number_text((double)s->hi / (double)scale, hi, sizeof(hi));
      if (!hvd_parse_double(buf, &x) || !(x * (double)scale >= (double)s->lo) ||
          !(x * (double)scale <= (double)s->hi))
        return refuse(o, text, "is not a number from %s to %s", lo, hi);
      v->i = (int64_t)llround(x * (double)scale);
      return HVD_OK;
    }
    if (!hvd_parse_int64(buf, strlen(buf), &v->i) || v->i < s->lo || v->i > s->hi)
      return refuse(o, text, "is not a whole number%s%s from %" PRId64 " to %" PRId64, of, unit,
                    s->lo, s->hi);
    return HVD_OK;
  case HVD_SETTING_NUMBER:
    number_text(s->dlo, lo, sizeof(lo));
    number_text(s->dhi, hi, sizeof(hi));
    if (!hvd_parse_double(buf, &v->d) || !(v->d >= s->dlo) || !(v->d <= s->dhi))
      return refuse(o, text, "is not a number%s%s from %s to %s", of, unit, lo, hi);
    return HVD_OK;
  case HVD_SETTING_BOOL:
    if (!hvd_parse_bool(buf, &b))
      return refuse(o, text, "is not a boolean (use 1/0, true/false, yes/no or on/off)");
    v->i = b;
    return HVD_OK;
  case HVD_SETTING_WORD: {
    char list[256];
    if ((v->i = word_index(s, buf)) < 0) {
      word_list(s, list, sizeof(list));
      return refuse(o, text, "is not one of %s", list);
    }
    return HVD_OK;
  }
  case HVD_SETTING_TEXT:
    break;
  }
  return HVD_OK;
}

/* The setting's value from the environment (or provided), else its default. */
static hvd_status read_value(enum hvd_setting id, enum hvd_setting_type type, struct value *v) {
  const struct hvd_setting_info *s = &TABLE[id];
  const char *text = hvd_env_str(s->env);
  struct origin o = {s->env, false};

  if (s->type != type)
    return hvd_error(HVD_ERR_INTERNAL, "%s is not read as its type", s->env);
  v->i = s->def;
  v->d = s->ddef;
  v->t = text;
  return text == NULL ? HVD_OK : parse(s, text, o, 1, v);
}

hvd_status hvd_setting_int(enum hvd_setting id, int64_t *out) {
  struct value v;
  hvd_status st = read_value(id, HVD_SETTING_INT, &v);
  if (st == HVD_OK)
    *out = v.i;
  return st;
}

hvd_status hvd_setting_number(enum hvd_setting id, double *out) {
  struct value v;
  hvd_status st = read_value(id, HVD_SETTING_NUMBER, &v);
  if (st == HVD_OK)
    *out = v.d;
  return st;
}

hvd_status hvd_setting_bool(enum hvd_setting id, bool *out) {
  struct value v;
  hvd_status st = read_value(id, HVD_SETTING_BOOL, &v);
  if (st == HVD_OK)
    *out = v.i != 0;
  return st;
}

hvd_status hvd_setting_word(enum hvd_setting id, int *out) {
  struct value v;
  hvd_status st = read_value(id, HVD_SETTING_WORD, &v);
  if (st == HVD_OK)
    *out = (int)v.i;
  return st;
}

hvd_status hvd_setting_text(enum hvd_setting id, const char **out) {
  struct value v;
  hvd_status st = read_value(id, HVD_SETTING_TEXT, &v);
  if (st == HVD_OK)
    *out = v.t;
  return st;
}

hvd_status hvd_setting_word_of(enum hvd_setting id, const char *text, const char *label,
                               int *out) {
  struct origin o = {label, true};
  struct value v;
  hvd_status st;

  if (TABLE[id].type != HVD_SETTING_WORD)
    return hvd_error(HVD_ERR_INTERNAL, "%s is not a word", TABLE[id].env);
  st = parse(&TABLE[id], text, o, 1, &v);
  if (st == HVD_OK)
    *out = (int)v.i;
  return st;
}

hvd_status hvd_setting_bits(enum hvd_setting id, uint64_t *out) {
  const struct hvd_setting_info *s = &TABLE[id];
  struct value v;
  hvd_status st = read_value(id, s->type, &v);
  if (st != HVD_OK)
    return st;
  if (s->type == HVD_SETTING_NUMBER)
    memcpy(out, &v.d, sizeof(*out));
  else
    *out = (uint64_t)v.i;
  return HVD_OK;
}

void hvd_setting_format_bits(enum hvd_setting id, uint64_t bits, char *out, size_t size) {
  const struct hvd_setting_info *s = &TABLE[id];
  double d;
  switch (s->type) {
  case HVD_SETTING_NUMBER:
    memcpy(&d, &bits, sizeof(d));
    number_text(d, out, size);
    break;
  case HVD_SETTING_WORD:
    word_text(s, (int)(int64_t)bits, out, size);
    break;
  default:
    snprintf(out, size, "%" PRId64, (int64_t)bits);
    break;
  }
}

hvd_status hvd_setting_check(enum hvd_setting id, const char *text, const char *label,
                             bool scaled, char **out) {
  const struct hvd_setting_info *s = &TABLE[id];
  struct origin o = {label, true};
  struct value v = {0, 0, NULL};
  char canonical[32];
  hvd_status st;

  *out = NULL;
  if (text == NULL || text[0] == '\0')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: '' is no value (give one, or leave it out)",
                     label);
  st = parse(s, text, o, scaled && s->flag_scale > 1 ? s->flag_scale : 1, &v);
  if (st != HVD_OK)
    return st;
  if (s->type == HVD_SETTING_BOOL || (s->type == HVD_SETTING_INT && scaled && s->flag_scale > 1))
    snprintf(canonical, sizeof(canonical), "%" PRId64, v.i);
  else
    canonical[0] = '\0';
  *out = strdup(canonical[0] != '\0' ? canonical : text);
  return *out != NULL ? HVD_OK : hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory", label);
}

/* ---- documentation ------------------------------------------------------ */

/* 2^40 rather than 1099511627776 where a limit is a power of two. */
static void limit_text(int64_t v, char *out, size_t size) {
  if (v == INT64_MAX)
    snprintf(out, size, "2^63-1");
  else if (v == INT32_MAX)
    snprintf(out, size, "2^31-1");
  else if (v >= (1 << 24) && (v & (v - 1)) == 0)
    snprintf(out, size, "2^%d", __builtin_ctzll((unsigned long long)v));
  else
    snprintf(out, size, "%" PRId64, v);
}

static void default_text(const struct hvd_setting_info *s, char *out, size_t size) {
  if (s->def_doc != NULL) {
    snprintf(out, size, "%s", s->def_doc);
    return;
  }
  switch (s->type) {
  case HVD_SETTING_INT:
    if (s->def < s->lo || s->def > s->hi)
      snprintf(out, size, "unset");
    else
      snprintf(out, size, "%" PRId64, s->def);
    break;
  case HVD_SETTING_NUMBER:
    number_text(s->ddef, out, size);
    break;
  case HVD_SETTING_BOOL:
    snprintf(out, size, "%d", (int)s->def);
    break;
  case HVD_SETTING_WORD:
    if (s->def < 0) {
      snprintf(out, size, "unset");
    } else {
      char w[64];
      word_text(s, (int)s->def, w, sizeof(w));
      snprintf(out, size, "`%s`", w);
    }
    break;
  case HVD_SETTING_TEXT:
    snprintf(out, size, "unset");
    break;
  }
}

static void valid_text(const struct hvd_setting_info *s, char *out, size_t size) {
  char lo[32], hi[32];
  if (s->valid_doc != NULL) {
    snprintf(out, size, "%s", s->valid_doc);
    return;
  }
  switch (s->type) {
  case HVD_SETTING_INT:
    limit_text(s->lo, lo, sizeof(lo));
    limit_text(s->hi, hi, sizeof(hi));
    snprintf(out, size, "integer %s … %s", lo, hi);
    break;
  case HVD_SETTING_NUMBER:
    number_text(s->dlo, lo, sizeof(lo));
    number_text(s->dhi, hi, sizeof(hi));
    snprintf(out, size, "number %s … %s", lo, hi);
    break;
  case HVD_SETTING_BOOL:
    snprintf(out, size, "boolean");
    break;
  case HVD_SETTING_WORD: {
    /* "`auto`, `halving_doubling` (`hd`)": other spellings in brackets. */
    size_t used = 0;
    for (const char *p = s->words; *p != '\0' && used < size;) {
      size_t n = strcspn(p, ",|");
      const char *before = p == s->words ? "" : p[-1] == '|' ? " (" : ", ";
      used += (size_t)snprintf(out + used, size - used, "%s`%.*s`%s", before, (int)n, p,
                               p != s->words && p[-1] == '|' ? ")" : "");
      p += n;
      if (*p != '\0')
        p++;
    }
    if (s->any_case && used < size)
      snprintf(out + used, size - used, ", any case");
    break;
  }
  case HVD_SETTING_TEXT:
    if (s->hi > 0)
      snprintf(out, size, "text of at most %" PRId64 " bytes", s->hi);
    else
      snprintf(out, size, "text");
    break;
  }
}

static const char *scope_text(enum hvd_setting_scope scope) {
  switch (scope) {
  case HVD_SCOPE_RANK:
    return "each rank";
  case HVD_SCOPE_RANK0:
    return "rank 0";
  case HVD_SCOPE_AGREE:
    return "rank 0's, for all ranks (a worker that differs warns)";
  case HVD_SCOPE_SAME:
    return "all ranks (a difference fails `hvd_init`)";
  case HVD_SCOPE_HVDRUN:
    return "hvdrun";
  case HVD_SCOPE_PYTHON:
    return "the Python package";
  }
  return "?";
}

/* "`--cycle-time-ms`; `params.cycle_time_ms`", or "—". */
static void where_text(const struct hvd_setting_info *s, char *out, size_t size) {
  size_t used = 0;
  const char *parts[] = {s->flag, s->flag_alt, s->flag_off, s->key, s->key_off};
  const char *notes[] = {"", "", " (0)", "", " (true: 0)"};
  for (size_t i = 0; i < HVD_ARRAY_SIZE(parts) && used < size; i++) {
    if (parts[i] != NULL)
      used += (size_t)snprintf(out + used, size - used, "%s`%s`%s", used > 0 ? ", " : "",
                               parts[i], notes[i]);
  }
  if (used == 0)
    snprintf(out, size, "—");
}

void hvd_setting_doc_table(const char *section, FILE *out) {
  fputs("| variable | default | scope | valid values | hvdrun flag, config key | meaning |\n"
        "|---|---|---|---|---|---|\n",
        out);
  for (int id = 1; id < HVD_SETTING_COUNT; id++) {
    const struct hvd_setting_info *s = &TABLE[id];
    char def[512], valid[512], where[256];
    if (strcmp(s->section, section) != 0)
      continue;
    default_text(s, def, sizeof(def));
    valid_text(s, valid, sizeof(valid));
    where_text(s, where, sizeof(where));
    fprintf(out, "| `%s` | %s | %s | %s | %s | %s |\n", s->env, def, scope_text(s->scope), valid,
            where, s->doc);
  }
}

/* ---- hvdrun --help ------------------------------------------------------ */

enum { HELP_INDENT = 30, HELP_WIDTH = 80 };

/* Writes text from column `at`, wrapped at HELP_WIDTH with HELP_INDENT. */
static void help_wrapped(const char *text, int at, FILE *out) {
  const char *p = text;
  while (*p != '\0') {
    int room = HELP_WIDTH - at;
    size_t n = strlen(p), cut = n;
    if ((int)n > room) {
      cut = (size_t)room;
      while (cut > 0 && p[cut] != ' ')
        cut--;
      if (cut == 0)
        cut = strcspn(p, " ");
    }
    fprintf(out, "%.*s\n", (int)cut, p);
    p += cut;
    while (*p == ' ')
      p++;
    if (*p != '\0') {
      fprintf(out, "%*s", HELP_INDENT, "");
      at = HELP_INDENT;
    }
  }
}

void hvd_setting_flag_help(FILE *out) {
  for (int id = 1; id < HVD_SETTING_COUNT; id++) {
    const struct hvd_setting_info *s = &TABLE[id];
    char head[96], text[512], def[64] = "";
    size_t used;
    int at;
    if (s->flag == NULL)
      continue;
    snprintf(head, sizeof(head), "  %s%s%s", s->flag, s->flag_arg != NULL ? " " : "",
             s->flag_arg != NULL ? s->flag_arg : "");
    if (s->type == HVD_SETTING_INT && s->def >= s->lo && s->def <= s->hi)
      number_text((double)s->def / (double)(s->flag_scale > 1 ? s->flag_scale : 1), def,
                  sizeof(def));
    else if (s->type == HVD_SETTING_NUMBER)
      number_text(s->ddef, def, sizeof(def));
    else if (s->type == HVD_SETTING_WORD && s->def >= 0)
      word_text(s, (int)s->def, def, sizeof(def));
    used = (size_t)snprintf(text, sizeof(text), "%s%s: %s", s->env,
                            s->type == HVD_SETTING_BOOL ? "=1" : "", s->help);
    if (def[0] != '\0')
      used += (size_t)snprintf(text + used, sizeof(text) - used, " (default %s)", def);
    if (s->flag_alt != NULL)
      used += (size_t)snprintf(text + used, sizeof(text) - used, "; also %s", s->flag_alt);
    if (s->flag_off != NULL)
      snprintf(text + used, sizeof(text) - used, "; %s: 0", s->flag_off);
    fputs(head, out);
    at = (int)strlen(head);
    if (at + 1 >= HELP_INDENT) /* the text starts on a line of its own */
      fprintf(out, "\n%*s", HELP_INDENT, "");
    else
      fprintf(out, "%*s", HELP_INDENT - at, "");
    help_wrapped(text, HELP_INDENT, out);
  }
}
