/*
 * A main() for the harnesses where libFuzzer is not linked (the gcc build,
 * sanitizer builds): runs LLVMFuzzerTestOneInput once on every file named,
 * or on every regular file of every directory named (in name order, so a
 * failure repeats), like `fuzz_x FILE...` does with libFuzzer. Arguments
 * starting with '-' are libFuzzer flags and are ignored. Each input lives
 * in a buffer of exactly its size so that AddressSanitizer sees overreads.
 * Exits 1 if nothing was run: an empty or missing corpus is a mistake.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  unsigned char *data;
  long size;

  if (f == NULL) {
    fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fprintf(stderr, "replay: cannot size %s\n", path);
    fclose(f);
    return -1;
  }
  /* malloc(0) may return NULL; libFuzzer never passes NULL. */
  data = malloc(size > 0 ? (size_t)size : 1);
  if (data == NULL || fread(data, 1, (size_t)size, f) != (size_t)size) {
    fprintf(stderr, "replay: cannot read %s\n", path);
    free(data);
    fclose(f);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(data, (size_t)size);
  free(data);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every regular file of dir; returns how many, or -1. */
static long run_dir(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char **names = NULL;
  size_t n = 0, cap = 0;
  long ran = 0;

  if (d == NULL) {
    fprintf(stderr, "replay: cannot open %s: %s\n", dir, strerror(errno));
    return -1;
  }
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    if (n == cap) {
      char **grown = realloc(names, (cap = cap ? 2 * cap : 64) * sizeof(*names));
      if (grown == NULL)
        break;
      names = grown;
    }
    if ((names[n] = strdup(e->d_name)) != NULL)
      n++;
  }
  closedir(d);
  qsort(names, n, sizeof(*names), by_name);
  for (size_t i = 0; i < n; i++) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
      if (run_file(path) != 0)
        ran = -1;
      else if (ran >= 0)
        ran++;
    }
    free(names[i]);
  }
  free(names);
  return ran;
}

/* libFuzzer calls this, when a harness defines it, before the first input. */
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

int main(int argc, char **argv) {
  long total = 0;

  if (LLVMFuzzerInitialize != NULL)
    LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++) {
    struct stat st;
    long ran;
    if (argv[i][0] == '-')
      continue;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
      return 1;
    }
    ran = S_ISDIR(st.st_mode) ? run_dir(argv[i]) : (run_file(argv[i]) == 0 ? 1 : -1);
    if (ran < 0)
      return 1;
    total += ran;
  }
  if (total == 0) {
    fprintf(stderr, "replay: no inputs (give corpus directories or files)\n");
    return 1;
  }
  printf("replay: %ld inputs, no failure\n", total);
  return 0;
}
