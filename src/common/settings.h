/*
 * The settings table: every environment variable hvd reads, declared once
 * in settings.def with its type, range, default, scope, hvdrun flag,
 * config-file key and documentation. The library reads a setting through
 * hvd_setting_*() by its id (HVD_SET_<ID>), never by name; hvdrun's flags,
 * --help and config-file keys, the rank-wide agreement of the start-up
 * handshake and docs/environment.md all come from the same table. Only
 * settings.c and env.c look at the environment itself.
 */
#ifndef HVD_SETTINGS_H
#define HVD_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "hvd/hvd.h"

enum hvd_setting {
  HVD_SET_NONE, /* no setting: .needs of most entries */
#define HVD_SETTING(id, ...) HVD_SET_##id,
#include "settings.def"
#undef HVD_SETTING
  HVD_SETTING_COUNT
};

enum hvd_setting_type {
  HVD_SETTING_INT,    /* a whole number in [lo, hi] */
  HVD_SETTING_NUMBER, /* a decimal number in [dlo, dhi] */
  HVD_SETTING_BOOL,   /* 1/0, true/false, yes/no, on/off, y/n */
  HVD_SETTING_TEXT,   /* any text of at most hi bytes (0: no limit), taken as is */
  HVD_SETTING_WORD,   /* one of words: "a,b|b2,c" (b2 another spelling of b) */
};

/* Whose value counts; the docs' scope column says it in words. */
enum hvd_setting_scope {
  HVD_SCOPE_RANK,   /* each rank its own */
  HVD_SCOPE_RANK0,  /* only rank 0's matters */
  HVD_SCOPE_AGREE,  /* rank 0's, for every rank: a worker that differs warns (handshake) */
  HVD_SCOPE_SAME,   /* every rank must have the same: a difference fails hvd_init */
  HVD_SCOPE_HVDRUN, /* hvdrun's own; not passed to the ranks */
  HVD_SCOPE_PYTHON, /* read by the Python package */
};

struct hvd_setting_info {
  const char *env, *section;
  enum hvd_setting_scope scope;
  enum hvd_setting_type type;
  int64_t lo, hi, def; /* INT: range, default (outside the range: unset); BOOL: default;
                          WORD: default's index (-1: unset); TEXT: hi = most bytes */
  double dlo, dhi, ddef; /* NUMBER */
  const char *words;     /* WORD */
  bool any_case;         /* WORD: case does not matter */
  const char *unit;      /* "seconds", "bytes": in messages */
  const char *def_doc, *valid_doc; /* the docs' default and valid-values text, when given */
  /* hvdrun: the flag that sets it (a switch sets 1), another spelling, the
   * switch's "0" spelling, the value's name in --help, and what one unit
   * of the flag's value is in the variable's (--fusion-threshold-mb: MiB). */
  const char *flag, *flag_alt, *flag_off, *flag_arg;
  int64_t flag_scale;
  const char *key, *key_off; /* config file: "section.key"; key_off: true sets 0 */
  enum hvd_setting needs;    /* hvdrun passes the value on only when this one is on */
  const char *help, *doc;
};

/* Type helpers for settings.def. */
#define HVD_S_INT(l, h, d) .type = HVD_SETTING_INT, .lo = (l), .hi = (h), .def = (d)
#define HVD_S_NUMBER(l, h, d) .type = HVD_SETTING_NUMBER, .dlo = (l), .dhi = (h), .ddef = (d)
#define HVD_S_BOOL(d) .type = HVD_SETTING_BOOL, .def = (d)
#define HVD_S_TEXT(most) .type = HVD_SETTING_TEXT, .hi = (most)
#define HVD_S_WORD(w, d) .type = HVD_SETTING_WORD, .words = (w), .def = (d)

const struct hvd_setting_info *hvd_setting_info(enum hvd_setting id);
/* The variable's name (for messages). */
const char *hvd_setting_name(enum hvd_setting id);

/* The setting's value: the environment's, else one provided by the launch
 * module, else the default. An empty value counts as unset; blanks around
 * a number are ignored. A bad value is HVD_ERR_INVALID_ARGUMENT naming the
 * variable, the value and what is allowed; *out is written only on
 * success. Each takes only settings of its type. */
hvd_status hvd_setting_int(enum hvd_setting id, int64_t *out);
hvd_status hvd_setting_number(enum hvd_setting id, double *out);
hvd_status hvd_setting_bool(enum hvd_setting id, bool *out);
/* WORD: the index of the word given (a second spelling counts as its
 * first), or the default's (-1 when it has none). */
hvd_status hvd_setting_word(enum hvd_setting id, int *out);
/* A WORD setting's word given as text (a flag's value): its index, as
 * hvd_setting_word reads the variable; errors name label. */
hvd_status hvd_setting_word_of(enum hvd_setting id, const char *text, const char *label,
                               int *out);
/* TEXT: the value or NULL when unset; too long is an error. */
hvd_status hvd_setting_text(enum hvd_setting id, const char **out);
/* The value as given (any type), or NULL when unset. */
const char *hvd_setting_given(enum hvd_setting id);
/* The environment's value alone, NULL when unset or empty (the launch
 * module asks what the user set, before it provides). */
const char *hvd_setting_real(enum hvd_setting id);
/* A value for a setting the environment does not set (hvd_env_provide). */
hvd_status hvd_setting_provide(enum hvd_setting id, const char *value);

/* The value as 64 bits for the start-up handshake (INT, BOOL, WORD: the
 * number; NUMBER: its bits); the setting's own value, checked. */
hvd_status hvd_setting_bits(enum hvd_setting id, uint64_t *out);
/* Writes a handshake value as the user would write it ("8", "host"). */
void hvd_setting_format_bits(enum hvd_setting id, uint64_t bits, char *out, size_t size);

/* hvdrun: checks text as the ranks would read the variable, after
 * multiplying it by the flag's scale (scaled: a flag's value), and returns
 * the variable's value in *out (a switch's "1" or "0", whole bytes). Errors name `label` ("--cycle-time-ms",
 * "FILE:3: params.cycle_time_ms") instead of the variable. *out is
 * allocated; the caller frees it. */
hvd_status hvd_setting_check(enum hvd_setting id, const char *text, const char *label,
                             bool scaled, char **out);

/* docs/environment.md's table for a section, in Markdown. */
void hvd_setting_doc_table(const char *section, FILE *out);
/* hvdrun --help's lines for the settings that have a flag. */
void hvd_setting_flag_help(FILE *out);

#endif
