/*
 * The ranks' Python path: hvdrun puts its own hvd package first on every
 * rank's PYTHONPATH, so that `import hvd` in a rank gets the package that
 * goes with this hvdrun and its libhvd.so rather than whatever else is
 * installed.
 *
 * DESIGN. The package sits at <libdir>/hvd/python/hvd, next to libhvd.so,
 * in the build tree (symlinks to the sources) as in an install, and finds
 * the library three directories up. hvdrun finds it from its own
 * executable: /proc/self/exe has no symlinks and no "..", so the directory
 * above the executable's is the prefix, and the candidates are
 * <prefix>/lib/hvd/python (the build tree) and
 * <prefix>/<install libdir>/hvd/python. --horovod-compat adds the
 * compatibility tree beside the package (<that dir>/compat) in front of it,
 * so that `import horovod` resolves to hvd's. Remote ranks get the same
 * path: hvd must be at the same place on their hosts, as the program must.
 * The tree's bin directory holds a `horovodrun` script that runs the
 * hvdrun named by HVD_HVDRUN: with --horovod-compat, hvdrun puts that
 * directory first on the ranks' PATH (an export, as -x PATH=... would be)
 * and itself in HVD_HVDRUN, so that a script which starts horovodrun gets
 * this hvdrun.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hvdrun.h"

#ifndef HVD_INSTALL_LIBDIR
#error "HVD_INSTALL_LIBDIR (CMAKE_INSTALL_LIBDIR) must be defined"
#endif

static bool is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* "<dir>/<name>" in a buffer of PATH_MAX; false when it does not fit. */
static bool join(char *out, const char *dir, const char *name) {
  int n = snprintf(out, PATH_MAX, "%s/%s", dir, name);
  return n > 0 && n < PATH_MAX;
}

hvd_status hvdrun_python_candidates(const char *exe, const char *libdir,
                                    char *out[HVDRUN_PYTHON_CANDIDATES], size_t *n) {
  struct hvd_buf build = {0}, install = {0};
  const char *slash = strrchr(exe, '/');
  int plen;
  hvd_status st;

  if (exe[0] != '/')
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "'%s' is not an absolute path", exe);
  /* Up two: the executable's directory, then the prefix ("" for "/"). */
  plen = (int)(slash - exe);
  while (plen > 0 && exe[plen - 1] != '/')
    plen--;
  plen = plen > 0 ? plen - 1 : 0;
  st = hvd_buf_printf(&build, "%.*s/lib/hvd/python", plen, exe);
  if (st == HVD_OK && libdir[0] == '/')
    st = hvd_buf_printf(&install, "%s/hvd/python", libdir);
  else if (st == HVD_OK)
    st = hvd_buf_printf(&install, "%.*s/%s/hvd/python", plen, exe, libdir);
  if (st != HVD_OK) {
    hvd_buf_fini(&build);
    hvd_buf_fini(&install);
    return hvd_error_prefix("finding hvd's Python packages");
  }
  out[0] = hvd_buf_detach(&build, NULL);
  *n = 1;
  if (strcmp(out[0], install.data) != 0)
    out[(*n)++] = hvd_buf_detach(&install, NULL);
  hvd_buf_fini(&install);
  return HVD_OK;
}

/* The first candidate whose hvd directory has __init__.py; failing that,
 * the first with a directory hvd at all (a package still being written). */
static const char *package_dir(const char *const *candidates, size_t n) {
  char path[PATH_MAX];
  for (size_t i = 0; i < n; i++) {
    if (join(path, candidates[i], "hvd/__init__.py") && exists(path))
      return candidates[i];
  }
  for (size_t i = 0; i < n; i++) {
    if (join(path, candidates[i], "hvd") && is_dir(path))
      return candidates[i];
  }
  return NULL;
}

/* --horovod-compat without its tree: one line naming where hvdrun looked
 * (the chosen package's dir, or every candidate when none had one). */
static hvd_status no_compat(const char *const *candidates, size_t n, const char *dir) {
  struct hvd_buf tried = {0};
  hvd_status st = HVD_OK;

  if (dir != NULL) {
    candidates = &dir;
    n = 1;
  }
  for (size_t i = 0; i < n && st == HVD_OK; i++)
    st = hvd_buf_printf(&tried, "%s%s/compat", i == 0 ? "" : " or ", candidates[i]);
  if (st == HVD_OK)
    st = hvd_error(HVD_ERR_NOT_FOUND,
                   "--horovod-compat: no hvd compatibility tree at %s (hvdrun looks beside its "
                   "own executable; build hvd, or install it with cmake --install)",
                   tried.data != NULL ? tried.data : "(no candidates)");
  hvd_buf_fini(&tried);
  return st;
}

hvd_status hvdrun_python_path(const char *const *candidates, size_t n, bool compat,
                              const char *current, const char **dir, char **value) {
  const char *found = package_dir(candidates, n);
  char path[PATH_MAX];
  struct hvd_buf text = {0};
  hvd_status st = HVD_OK;

  if (compat && (found == NULL || !join(path, found, "compat") || !is_dir(path)))
    return no_compat(candidates, n, found);
  if (found == NULL) {
    *dir = NULL;
    *value = NULL;
    return HVD_OK;
  }
  if (compat)
    st = hvd_buf_printf(&text, "%s/compat:", found);
  if (st == HVD_OK)
    st = hvd_buf_printf(&text, "%s", found);
  if (st == HVD_OK && current != NULL && current[0] != '\0')
    st = hvd_buf_printf(&text, ":%s", current);
  if (st != HVD_OK) {
    hvd_buf_fini(&text);
    return hvd_error_prefix("building the ranks' PYTHONPATH");
  }
  *dir = found;
  *value = hvd_buf_detach(&text, NULL);
  return HVD_OK;
}

/* The path of hvdrun's executable, symlinks resolved. */
static hvd_status own_executable(char *out, size_t size) {
  ssize_t n = readlink("/proc/self/exe", out, size);
  if (n < 0)
    return hvd_error(HVD_ERR_IO, "cannot find hvdrun's executable: readlink /proc/self/exe: %s",
                     strerror(errno));
  if ((size_t)n >= size)
    return hvd_error(HVD_ERR_TOO_LARGE,
                     "cannot find hvdrun's executable: its path is longer than %zu bytes",
                     size - 1);
  out[n] = '\0';
  return HVD_OK;
}

/* The user's value of a variable for the ranks: the last -x NAME=VALUE,
 * else hvdrun's own (which a bare -x NAME exports anyway). */
static const char *user_value(const struct hvdrun_options *o, const char *name) {
  const char *value = getenv(name);
  size_t len = strlen(name);
  for (size_t i = 0; i < o->nexports; i++) {
    if (strncmp(o->exports[i], name, len) == 0 && o->exports[i][len] == '=')
      value = o->exports[i] + len + 1;
  }
  return value;
}

/* --horovod-compat's horovodrun: PATH=<dir>/compat/bin:<the user's PATH>
 * among the exports (after the user's, so it wins), and HVD_HVDRUN=exe. A
 * tree without an executable horovodrun (an install that dropped the
 * mode) gets a warning and no PATH. */
static hvd_status add_horovodrun(struct hvdrun_options *o, const char *dir, const char *exe) {
  char bin[PATH_MAX], script[PATH_MAX], *kv, *self = NULL;
  const char *path = user_value(o, "PATH");
  struct hvd_buf text = {0};
  hvd_status st;

  if (!join(bin, dir, "compat/bin") || !join(script, bin, "horovodrun") ||
      access(script, X_OK) != 0) {
    fprintf(stderr,
            "hvdrun: warning: --horovod-compat: no executable %s/compat/bin/horovodrun; the "
            "ranks have no horovodrun command\n",
            dir);
    return HVD_OK;
  }
  /* No PATH at all: the shell's default search after ours. */
  st = hvd_buf_printf(&text, "PATH=%s:%s", bin,
                      path != NULL && path[0] != '\0' ? path : "/usr/bin:/bin");
  if (st == HVD_OK &&
      hvd_array_reserve(&o->owned, &o->owned_cap, o->nowned + 1, sizeof(*o->owned), 16) != HVD_OK)
    st = HVD_ERR_NO_MEMORY;
  if (st == HVD_OK &&
      hvd_array_reserve(&o->exports, &o->exports_cap, o->nexports + 1, sizeof(*o->exports), 8) !=
          HVD_OK)
    st = HVD_ERR_NO_MEMORY;
  if (st == HVD_OK && (self = hvd_strndup(exe, strlen(exe))) == NULL)
    st = HVD_ERR_NO_MEMORY;
  if (st != HVD_OK) {
    hvd_buf_fini(&text);
    return hvd_error(HVD_ERR_NO_MEMORY, "--horovod-compat: out of memory");
  }
  kv = hvd_buf_detach(&text, NULL);
  o->owned[o->nowned++] = kv;
  o->exports[o->nexports++] = kv;
  free(o->settings[HVD_SET_HVDRUN]);
  o->settings[HVD_SET_HVDRUN] = self;
  return HVD_OK;
}

static void say_python(const struct hvdrun_options *o, const char *const *candidates, size_t n,
                       const char *dir) {
  if (dir == NULL)
    fprintf(stderr, "hvdrun: no hvd Python package in %s%s%s; PYTHONPATH left as it is\n",
            candidates[0], n > 1 ? " or " : "", n > 1 ? candidates[1] : "");
  else if (o->horovod_compat)
    fprintf(stderr,
            "hvdrun: the ranks' PYTHONPATH starts with %s/compat (--horovod-compat) and %s "
            "(hvd's Python package)\n",
            dir, dir);
  else
    fprintf(stderr, "hvdrun: the ranks' PYTHONPATH starts with %s (hvd's Python package)\n", dir);
  if (o->settings[HVD_SET_HVDRUN] != NULL)
    fprintf(stderr, "hvdrun: the ranks' PATH starts with %s/compat/bin (horovodrun)\n", dir);
}

hvd_status hvdrun_python_setup(struct hvdrun_options *o) {
  char exe[PATH_MAX], *candidates[HVDRUN_PYTHON_CANDIDATES] = {NULL};
  const char *dir = NULL;
  size_t n = 0;
  hvd_status st = own_executable(exe, sizeof(exe));

  if (st != HVD_OK && !o->horovod_compat) {
    /* Only Python jobs need the package: the others go on without it. */
    if (o->verbose)
      fprintf(stderr, "hvdrun: %s; PYTHONPATH left as it is\n", hvd_last_error_message());
    return HVD_OK;
  }
  if (st != HVD_OK)
    return hvd_error_prefix("--horovod-compat");
  st = hvdrun_python_candidates(exe, HVD_INSTALL_LIBDIR, candidates, &n);
  if (st == HVD_OK)
    st = hvdrun_python_path((const char *const *)candidates, n, o->horovod_compat,
                            user_value(o, "PYTHONPATH"), &dir, &o->pythonpath);
  if (st == HVD_OK && o->horovod_compat)
    st = add_horovodrun(o, dir, exe);
  if (st == HVD_OK && o->verbose)
    say_python(o, (const char *const *)candidates, n, dir);
  for (size_t i = 0; i < n; i++)
    free(candidates[i]);
  return st;
}

hvd_status hvdrun_python_find(char **dir) {
  char exe[PATH_MAX], *candidates[HVDRUN_PYTHON_CANDIDATES] = {NULL}, *found = NULL;
  const char *pkg;
  size_t n = 0;
  hvd_status st = own_executable(exe, sizeof(exe));

  if (st == HVD_OK)
    st = hvdrun_python_candidates(exe, HVD_INSTALL_LIBDIR, candidates, &n);
  if (st == HVD_OK && (pkg = package_dir((const char *const *)candidates, n)) != NULL &&
      (found = hvd_strndup(pkg, strlen(pkg))) == NULL)
    st = hvd_error(HVD_ERR_NO_MEMORY, "finding hvd's Python package: out of memory");
  for (size_t i = 0; i < n; i++)
    free(candidates[i]);
  if (st == HVD_OK)
    *dir = found;
  return st;
}
