/*
 * horovodrun's config file (--config-file), read with libyaml.
 *
 * DESIGN. The file is one YAML mapping: `controller`, and sections whose
 * keys are horovodrun's flags without the section's prefix
 * (params.cache_capacity is --cache-capacity, stall_check.warning_time_seconds
 * is --stall-check-warning-time-seconds). Each key is handed on as the flag
 * with the same effect, and options.c checks its value as it checks the
 * flag's: the file adds only YAML's types to the rules. Scalars resolve as
 * horovodrun's loader (PyYAML, YAML 1.1) resolves them: a plain true, yes
 * or on is a boolean, a plain 64 a number, a quoted '64' a string.
 * horovodrun skips keys it does not know; hvdrun stops on them, naming the
 * key, because a misspelt key would leave its setting at the default
 * without a word. Only the keys that horovodrun's own sample files carry
 * but horovodrun ignores, and those for MPI, CCL or several NCCL streams,
 * which hvd lacks, get a warning instead, so that such files work as they
 * are.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

#include "hvdrun.h"

enum kind {
  K_NUMBER,     /* an int or a float, passed as written */
  K_SWITCH,     /* a boolean, passed as "1" or "0" */
  K_TEXT,       /* any scalar, passed as written */
  K_CONTROLLER, /* gloo, or mpi (which --mpi refuses) */
  K_IGNORED,    /* known and unused: a warning */
};

struct key {
  const char *section; /* NULL: top level */
  const char *name;
  enum kind kind;
  const char *flag; /* K_IGNORED: why it is ignored */
  bool invert;      /* true in the file is the flag's "0" */
};

/* The keys that are no setting; the settings' own come from their table
 * (src/common/settings.def: .key, .key_off). */
static const struct key KEYS[] = {
    {NULL, "controller", K_CONTROLLER, NULL, false},
    {"autotune", "cycles_per_sample", K_IGNORED,
     "an old name that horovodrun ignores now (write steps_per_sample)", false},
    {"timeline", "enabled", K_IGNORED,
     "horovodrun ignores it too (timeline.filename turns the timeline on)", false},
    {"library_options", "mpi_threads_disable", K_IGNORED, "hvd has no MPI", false},
    {"library_options", "mpi_threads_disabled", K_IGNORED, "hvd has no MPI", false},
    {"library_options", "num_nccl_streams", K_IGNORED,
     "hvd has no setting for its number of NCCL streams", false},
    {"library_options", "ccl_bgt_affinity", K_IGNORED, "hvd has no oneCCL", false},
    {"library_options", "mlsl_bgt_affinity", K_IGNORED, "hvd has no MLSL", false},
};

static const char *const SECTIONS[] = {"params",      "autotune",        "timeline",
                                       "stall_check", "library_options", "logging"};

/* The file's bytes. */
struct text {
  unsigned char *data;
  size_t len;
};

/* What a node is, as PyYAML's loader would make it. */
enum type { T_NULL, T_BOOL, T_NUMBER, T_STRING, T_MAPPING, T_LIST };

struct reader {
  yaml_document_t *doc;
  const char *path;
  FILE *warn;
  hvdrun_config_cb cb;
  void *arg;
};

static bool one_of(const char *text, const char *const *words, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (strcmp(text, words[i]) == 0)
      return true;
  }
  return false;
}

static bool is_number(const char *text) {
  char *end;
  double v;
  if (text[0] == '\0' || strchr("+-.0123456789", text[0]) == NULL)
    return false;
  v = strtod(text, &end);
  return *end == '\0' && isfinite(v);
}

static const char *text_of(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static enum type type_of(const yaml_node_t *n, bool *truth) {
  static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const char *const no[] = {"false", "False", "FALSE", "no", "No",
                                   "NO",    "off",   "Off",   "OFF"};
  static const char *const null[] = {"", "~", "null", "Null", "NULL"};
  const char *text, *tag = (const char *)n->tag;

  if (n->type == YAML_MAPPING_NODE)
    return T_MAPPING;
  if (n->type == YAML_SEQUENCE_NODE)
    return T_LIST;
  text = text_of(n);
  /* A quoted scalar is a string unless a tag says otherwise (libyaml gives
   * an untagged scalar the str tag whatever its style). */
  if (tag != NULL && strcmp(tag, YAML_STR_TAG) == 0 &&
      n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
    return T_STRING;
  if (one_of(text, null, HVD_ARRAY_SIZE(null)))
    return T_NULL;
  if (one_of(text, yes, HVD_ARRAY_SIZE(yes)) || one_of(text, no, HVD_ARRAY_SIZE(no))) {
    *truth = one_of(text, yes, HVD_ARRAY_SIZE(yes));
    return T_BOOL;
  }
  return is_number(text) ? T_NUMBER : T_STRING;
}

/* "the string 'abc'", "a mapping": what was found where something else was expected. */
static void describe(const yaml_node_t *n, enum type t, char *out, size_t size) {
  char text[81]; /* the file's text, without control characters (they reach a terminal) */
  hvd_printable(n->type == YAML_SCALAR_NODE ? text_of(n) : "", text, sizeof(text));
  switch (t) {
  case T_MAPPING:
    snprintf(out, size, "a mapping");
    break;
  case T_LIST:
    snprintf(out, size, "a list");
    break;
  case T_NULL:
    snprintf(out, size, "null");
    break;
  case T_BOOL:
    snprintf(out, size, "the boolean %s", text);
    break;
  case T_NUMBER:
    snprintf(out, size, "the number %s", text);
    break;
  case T_STRING:
    snprintf(out, size, "the string '%s'", text);
    break;
  }
}

static size_t line_of(const yaml_node_t *n) { return n->start_mark.line + 1; }

/* libyaml's reader (bad UTF-8 and such) gives a byte offset alone: the
 * line and column of that byte, both from 1. */
static void place_of(const struct text *t, size_t offset, size_t *line, size_t *column) {
  *line = 1;
  *column = 1;
  for (size_t i = 0; i < offset && i < t->len; i++) {
    if (t->data[i] == '\n') {
      ++*line;
      *column = 1;
    } else {
      ++*column;
    }
  }
}

static hvd_status yaml_failure(const yaml_parser_t *p, const struct text *t, const char *path) {
  const char *problem = p->problem != NULL ? p->problem : "unknown error";
  size_t line, column;

  switch (p->error) {
  case YAML_MEMORY_ERROR:
    return hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory reading the YAML", path);
  case YAML_READER_ERROR:
    place_of(t, p->problem_offset, &line, &column);
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s:%zu:%zu: invalid YAML: %s (byte %zu)", path,
                     line, column, problem, p->problem_offset);
  default:
    if (p->context != NULL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s:%zu:%zu: invalid YAML: %s (%s from line %zu)",
                       path, p->problem_mark.line + 1, p->problem_mark.column + 1, problem,
                       p->context, p->context_mark.line + 1);
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s:%zu:%zu: invalid YAML: %s", path,
                     p->problem_mark.line + 1, p->problem_mark.column + 1, problem);
  }
}

/* The key's name when `full` ("section.key") is in section, else NULL. */
static const char *in_section(const char *full, const char *section) {
  size_t n = strlen(section);
  return full != NULL && strncmp(full, section, n) == 0 && full[n] == '.' ? full + n + 1 : NULL;
}

/* The names known in a section ("" for the top level), for an unknown key's message. */
static hvd_status known_names(const char *section, struct hvd_buf *out) {
  hvd_status st = HVD_OK;
  if (section == NULL) {
    for (size_t i = 0; i < HVD_ARRAY_SIZE(SECTIONS) && st == HVD_OK; i++)
      st = hvd_buf_printf(out, "%s, ", SECTIONS[i]);
    return st == HVD_OK ? hvd_buf_printf(out, "controller") : st;
  }
  for (int id = 1; id < HVD_SETTING_COUNT && st == HVD_OK; id++) {
    const struct hvd_setting_info *s = hvd_setting_info((enum hvd_setting)id);
    const char *keys[] = {in_section(s->key, section), in_section(s->key_off, section)};
    for (size_t i = 0; i < HVD_ARRAY_SIZE(keys) && st == HVD_OK; i++) {
      if (keys[i] != NULL)
        st = hvd_buf_printf(out, "%s%s", out->len > 0 ? ", " : "", keys[i]);
    }
  }
  return st;
}

static hvd_status unknown(const struct reader *r, const yaml_node_t *key, const char *section) {
  struct hvd_buf names = {0};
  hvd_status st = known_names(section, &names);
  char name[81];

  hvd_printable(text_of(key), name, sizeof(name));
  if (st == HVD_OK && section == NULL)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                   "%s:%zu: unknown section '%s' (horovodrun's config file has %s)", r->path,
                   line_of(key), name, names.data);
  else if (st == HVD_OK)
    st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s:%zu: unknown key '%s.%s' (%s has %s)", r->path,
                   line_of(key), section, name, section, names.data);
  else
    st = hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory", r->path);
  hvd_buf_fini(&names);
  return st;
}

/* One key's value, handed on as its flag's. */
static hvd_status set(const struct reader *r, const struct key *k, const yaml_node_t *key,
                      const yaml_node_t *value) {
  char where[PATH_MAX + 96], found[128];
  bool truth = false;
  enum type t = type_of(value, &truth);

  snprintf(where, sizeof(where), "%s:%zu: %s%s%s", r->path, line_of(key),
           k->section != NULL ? k->section : "", k->section != NULL ? "." : "", k->name);
  describe(value, t, found, sizeof(found));
  if (t == T_NULL)
    return HVD_OK; /* as horovodrun: no value, no setting */
  if (k->kind != K_SWITCH && k->kind != K_IGNORED && (t == T_MAPPING || t == T_LIST))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: expected a %s, not %s", where,
                     k->kind == K_NUMBER ? "number" : "single value", found);
  if (value->type == YAML_SCALAR_NODE && strlen(text_of(value)) != value->data.scalar.length)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: the value holds a NUL byte", where);
  switch (k->kind) {
  case K_IGNORED:
    if (r->warn != NULL)
      fprintf(r->warn, "hvdrun: %s is ignored: %s\n", where, k->flag);
    return HVD_OK;
  case K_NUMBER:
    if (t != T_NUMBER)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: expected a number, not %s", where, found);
    return r->cb(r->arg, k->flag, text_of(value), where);
  case K_SWITCH:
    if (t != T_BOOL)
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s: expected true or false, not %s", where,
                       found);
    return r->cb(r->arg, k->flag, truth != k->invert ? "1" : "0", where);
  case K_TEXT:
    return r->cb(r->arg, k->flag, text_of(value), where);
  case K_CONTROLLER:
    if (strcasecmp(text_of(value), "gloo") == 0)
      return r->cb(r->arg, "--gloo", NULL, where);
    if (strcasecmp(text_of(value), "mpi") == 0)
      return r->cb(r->arg, "--mpi", NULL, where);
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s: expected gloo (hvd's controller is horovodrun's Gloo one), not %s", where,
                     found);
  }
  return HVD_OK;
}

/* The key of a mapping pair, which must be a plain name given once. */
static hvd_status key_of(const struct reader *r, const yaml_node_t *map,
                         const yaml_node_pair_t *pair, const yaml_node_t **out) {
  const yaml_node_t *key = yaml_document_get_node(r->doc, pair->key);
  bool ignored;
  char found[128];

  if (key->type != YAML_SCALAR_NODE || strlen(text_of(key)) != key->data.scalar.length) {
    describe(key, type_of(key, &ignored), found, sizeof(found));
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s:%zu: expected a key name, not %s", r->path,
                     line_of(key), found);
  }
  for (const yaml_node_pair_t *p = map->data.mapping.pairs.start; p < pair; p++) {
    const yaml_node_t *before = yaml_document_get_node(r->doc, p->key);
    if (before->type == YAML_SCALAR_NODE && strcmp(text_of(before), text_of(key)) == 0) {
      hvd_printable(text_of(key), found, sizeof(found));
      return hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s:%zu: '%s' is given twice (also on line %zu)",
                       r->path, line_of(key), found, line_of(before));
    }
  }
  *out = key;
  return HVD_OK;
}

/* A setting's key, as a key of this file: its flag and its YAML type. */
static bool setting_key(const char *section, const char *name, struct key *out) {
  static const enum kind kinds[] = {[HVD_SETTING_INT] = K_NUMBER,
                                    [HVD_SETTING_NUMBER] = K_NUMBER,
                                    [HVD_SETTING_BOOL] = K_SWITCH,
                                    [HVD_SETTING_TEXT] = K_TEXT,
                                    [HVD_SETTING_WORD] = K_TEXT};
  for (int id = 1; id < HVD_SETTING_COUNT && section != NULL; id++) {
    const struct hvd_setting_info *s = hvd_setting_info((enum hvd_setting)id);
    const char *on = in_section(s->key, section), *off = in_section(s->key_off, section);
    bool is_on = on != NULL && strcmp(on, name) == 0;
    if (is_on || (off != NULL && strcmp(off, name) == 0)) {
      *out = (struct key){section, name, kinds[s->type], s->flag, !is_on};
      return true;
    }
  }
  return false;
}

static bool find(const char *section, const char *name, struct key *out) {
  for (size_t i = 0; i < HVD_ARRAY_SIZE(KEYS); i++) {
    bool same_section = section == NULL
                            ? KEYS[i].section == NULL
                            : KEYS[i].section != NULL && strcmp(KEYS[i].section, section) == 0;
    if (same_section && strcmp(KEYS[i].name, name) == 0) {
      *out = KEYS[i];
      return true;
    }
  }
  return setting_key(section, name, out);
}

static hvd_status read_section(const struct reader *r, const char *section,
                               const yaml_node_t *map) {
  hvd_status st = HVD_OK;
  for (const yaml_node_pair_t *p = map->data.mapping.pairs.start;
       p < map->data.mapping.pairs.top && st == HVD_OK; p++) {
    const yaml_node_t *key;
    struct key k;
    if ((st = key_of(r, map, p, &key)) != HVD_OK)
      break;
    if (!find(section, text_of(key), &k))
      return unknown(r, key, section);
    st = set(r, &k, key, yaml_document_get_node(r->doc, p->value));
  }
  return st;
}

static hvd_status read_document(const struct reader *r) {
  const yaml_node_t *root = yaml_document_get_root_node(r->doc);
  hvd_status st = HVD_OK;
  bool ignored;
  char found[128];

  if (root == NULL || type_of(root, &ignored) == T_NULL)
    return HVD_OK; /* an empty file sets nothing */
  if (root->type != YAML_MAPPING_NODE) {
    describe(root, type_of(root, &ignored), found, sizeof(found));
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s:%zu: expected a mapping of sections (params:, stall_check:, ...), not %s",
                     r->path, line_of(root), found);
  }
  for (const yaml_node_pair_t *p = root->data.mapping.pairs.start;
       p < root->data.mapping.pairs.top && st == HVD_OK; p++) {
    const yaml_node_t *key, *value;
    struct key top;
    bool section = false;
    if ((st = key_of(r, root, p, &key)) != HVD_OK)
      break;
    value = yaml_document_get_node(r->doc, p->value);
    for (size_t i = 0; i < HVD_ARRAY_SIZE(SECTIONS); i++)
      section = section || strcmp(SECTIONS[i], text_of(key)) == 0;
    if (!section && find(NULL, text_of(key), &top)) {
      st = set(r, &top, key, value);
    } else if (!section) {
      st = unknown(r, key, NULL);
    } else if (value->type == YAML_MAPPING_NODE) {
      st = read_section(r, text_of(key), value);
    } else if (type_of(value, &ignored) != T_NULL) {
      describe(value, type_of(value, &ignored), found, sizeof(found));
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT, "%s:%zu: %s: expected a mapping of keys, not %s",
                     r->path, line_of(key), text_of(key), found);
    }
  }
  return st;
}

/* A config file is a few dozen lines: larger or deeper is refused before
 * anything is built from it, so that a hostile or mistaken file costs
 * neither memory (the document is built whole) nor libyaml's time, which
 * grows with the square of the nesting depth. */
enum { CONFIG_BYTES_MAX = 256 * 1024, CONFIG_DEPTH_MAX = 16 };

/* The whole file, if it is no larger than CONFIG_BYTES_MAX (read once:
 * it may be a pipe). */
static hvd_status slurp(FILE *f, const char *path, struct text *out) {
  size_t n;
  out->data = malloc(CONFIG_BYTES_MAX + 1);
  if (out->data == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory", path);
  n = fread(out->data, 1, CONFIG_BYTES_MAX + 1, f);
  if (ferror(f))
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "--config-file: cannot read '%s': %s", path,
                     strerror(errno));
  if (n > CONFIG_BYTES_MAX)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "--config-file: '%s' is larger than %d KiB; a config file is a few lines",
                     path, CONFIG_BYTES_MAX / 1024);
  out->len = n;
  return HVD_OK;
}

/* The events alone, stopping at the first error or at nesting deeper
 * than any config file has: before the document is built. */
static hvd_status screen(const struct text *t, const char *path) {
  yaml_parser_t p;
  yaml_event_t e;
  int depth = 0;
  bool end = false;
  hvd_status st = HVD_OK;

  if (!yaml_parser_initialize(&p))
    return hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory starting the YAML parser", path);
  yaml_parser_set_input_string(&p, t->data, t->len);
  while (!end && st == HVD_OK) {
    if (!yaml_parser_parse(&p, &e)) {
      st = yaml_failure(&p, t, path);
      break;
    }
    if (e.type == YAML_SEQUENCE_START_EVENT || e.type == YAML_MAPPING_START_EVENT) {
      if (++depth > CONFIG_DEPTH_MAX)
        st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                       "%s:%zu:%zu: nested more than %d deep; the config file holds sections "
                       "of keys",
                       path, e.start_mark.line + 1, e.start_mark.column + 1, CONFIG_DEPTH_MAX);
    } else if (e.type == YAML_SEQUENCE_END_EVENT || e.type == YAML_MAPPING_END_EVENT) {
      depth--;
    }
    end = e.type == YAML_STREAM_END_EVENT;
    yaml_event_delete(&e);
  }
  yaml_parser_delete(&p);
  return st;
}

hvd_status hvdrun_config_read(const char *path, FILE *warn, hvdrun_config_cb cb, void *arg) {
  yaml_parser_t parser;
  yaml_document_t doc, extra;
  struct reader r = {&doc, path, warn, cb, arg};
  struct stat info;
  bool have_doc = false;
  hvd_status st = HVD_OK;
  FILE *f = fopen(path, "re");
  struct text t = {NULL, 0};

  if (f == NULL)
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "--config-file: cannot open '%s': %s", path,
                     strerror(errno));
  if (fstat(fileno(f), &info) == 0 && S_ISDIR(info.st_mode)) {
    fclose(f);
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "--config-file: '%s' is a directory", path);
  }
  st = slurp(f, path, &t);
  fclose(f);
  if (st == HVD_OK)
    st = screen(&t, path);
  if (st != HVD_OK) {
    free(t.data);
    return st;
  }
  if (!yaml_parser_initialize(&parser)) {
    free(t.data);
    return hvd_error(HVD_ERR_NO_MEMORY, "%s: out of memory starting the YAML parser", path);
  }
  yaml_parser_set_input_string(&parser, t.data, t.len);
  if (!yaml_parser_load(&parser, &doc)) {
    st = yaml_failure(&parser, &t, path);
    goto out;
  }
  have_doc = true;
  /* horovodrun reads one document; a second is a mistake worth naming. */
  if (yaml_document_get_root_node(&doc) != NULL) {
    if (!yaml_parser_load(&parser, &extra)) {
      st = yaml_failure(&parser, &t, path);
      goto out;
    }
    if (yaml_document_get_root_node(&extra) != NULL)
      st = hvd_error(HVD_ERR_INVALID_ARGUMENT,
                     "%s:%zu: a second YAML document ('---'); the config file is one document",
                     path, extra.start_mark.line + 1);
    yaml_document_delete(&extra);
  }
  if (st == HVD_OK)
    st = read_document(&r);
out:
  if (have_doc)
    yaml_document_delete(&doc);
  yaml_parser_delete(&parser);
  free(t.data);
  return st;
}
