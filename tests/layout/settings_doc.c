/*
 * docs/environment.md's tables, generated from the settings table
 * (src/common/settings.def):
 *   settings_doc --check DOC   exit 1, naming the section, when a table in
 *                              DOC differs from the generated one
 *   settings_doc --write DOC   rewrite DOC's tables (cmake --build build
 *                              --target settings-doc)
 * A table sits between "<!-- settings: SECTION -->" and
 * "<!-- end settings -->"; the prose around it is DOC's own. Every section
 * of the table must have exactly one such block.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

#define OPEN "<!-- settings: "
#define CLOSE "<!-- end settings -->"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *text = NULL;
  size_t cap = 0, len = 0, n;

  if (f == NULL)
    return NULL;
  do {
    if (len + 4096 + 1 > cap) {
      char *grown = realloc(text, cap = (len + 4096 + 1) * 2);
      if (grown == NULL) {
        free(text);
        fclose(f);
        return NULL;
      }
      text = grown;
    }
    n = fread(text + len, 1, cap - len - 1, f);
    len += n;
  } while (n > 0);
  fclose(f);
  text[len] = '\0';
  return text;
}

/* The doc with every block's table replaced by the generated one, or NULL
 * (with a message on stderr) when the blocks are malformed. */
static char *regenerate(const char *doc, const char *path) {
  char *out = NULL;
  size_t size = 0;
  FILE *f = open_memstream(&out, &size);
  const char *p = doc, *open;
  bool seen[HVD_SETTING_COUNT] = {false}, ok = true;

  if (f == NULL)
    return NULL;
  while ((open = strstr(p, OPEN)) != NULL && ok) {
    const char *name = open + strlen(OPEN), *name_end = strstr(name, " -->");
    const char *close = name_end != NULL ? strstr(name_end, CLOSE) : NULL;
    char section[64];
    int first = 0;

    if (name_end == NULL || close == NULL || (size_t)(name_end - name) >= sizeof(section)) {
      fprintf(stderr, "%s: a settings block is not closed by '%s'\n", path, CLOSE);
      ok = false;
      break;
    }
    snprintf(section, sizeof(section), "%.*s", (int)(name_end - name), name);
    for (int id = 1; id < HVD_SETTING_COUNT && first == 0; id++) {
      if (strcmp(hvd_setting_info((enum hvd_setting)id)->section, section) == 0)
        first = id;
    }
    if (first == 0 || seen[first]) {
      fprintf(stderr, "%s: '%s' is %s\n", path, section,
              first == 0 ? "no section of src/common/settings.def" : "in two blocks");
      ok = false;
      break;
    }
    seen[first] = true;
    fwrite(p, 1, (size_t)(name_end + strlen(" -->") - p), f);
    fputs("\n\n", f);
    hvd_setting_doc_table(section, f);
    fputs("\n", f);
    p = close;
  }
  fputs(p, f);
  for (int id = 1; id < HVD_SETTING_COUNT && ok; id++) {
    const char *section = hvd_setting_info((enum hvd_setting)id)->section;
    int first = id;
    for (int j = 1; j < id; j++) {
      if (strcmp(hvd_setting_info((enum hvd_setting)j)->section, section) == 0) {
        first = j;
        break;
      }
    }
    if (!seen[first]) {
      fprintf(stderr, "%s: no block '%s%s -->' for the settings of that section\n", path, OPEN,
              section);
      ok = false;
    }
  }
  fclose(f);
  if (!ok) {
    free(out);
    return NULL;
  }
  return out;
}

int main(int argc, char **argv) {
  char *doc, *fresh;
  bool write;
  int rc = 0;

  if (argc != 3 || (strcmp(argv[1], "--check") != 0 && strcmp(argv[1], "--write") != 0)) {
    fprintf(stderr, "usage: settings_doc --check|--write docs/environment.md\n");
    return 2;
  }
  write = strcmp(argv[1], "--write") == 0;
  if ((doc = slurp(argv[2])) == NULL) {
    perror(argv[2]);
    return 2;
  }
  if ((fresh = regenerate(doc, argv[2])) == NULL) {
    free(doc);
    return 1;
  }
  if (write) {
    FILE *f = fopen(argv[2], "wb");
    if (f == NULL || fputs(fresh, f) < 0 || fclose(f) != 0) {
      perror(argv[2]);
      rc = 2;
    }
  } else if (strcmp(doc, fresh) != 0) {
    size_t line = 1;
    for (size_t i = 0; doc[i] == fresh[i]; i++)
      line += doc[i] == '\n';
    fprintf(stderr,
            "%s:%zu differs from src/common/settings.def: run cmake --build build --target "
            "settings-doc, and commit both\n",
            argv[2], line);
    rc = 1;
  }
  free(doc);
  free(fresh);
  return rc;
}
