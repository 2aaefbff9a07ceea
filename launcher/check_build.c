/*
 * hvdrun --check-build: what this build has, in horovodrun's layout, so
 * that scripts which read horovodrun's answer ("[X] Gloo") read hvdrun's.
 * Only what hvd has gets an X: hvd's controller and TCP collectives stand
 * where horovodrun's Gloo does (they are what its Gloo path does, without
 * the Gloo library); MPI, DDL and CCL never; NCCL when the library was
 * built with it. PyTorch means hvd's torch package sits beside this
 * hvdrun; whether the ranks' Python has torch itself is not checked.
 */
#include <limits.h>
#include <sys/stat.h>

#include "hvdrun.h"

static const char *mark(bool on) { return on ? "X" : " "; }

static bool has_torch(const char *python_dir) {
  char path[PATH_MAX];
  struct stat st;
  int n;
  if (python_dir == NULL)
    return false;
  n = snprintf(path, sizeof(path), "%s/hvd/torch/__init__.py", python_dir);
  return n > 0 && (size_t)n < sizeof(path) && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void hvdrun_check_build(FILE *out, const char *python_dir, int nccl_version) {
  char nccl[48] = "";

  /* NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 before. */
  if (nccl_version >= 10000)
    snprintf(nccl, sizeof(nccl), " (%d.%d.%d)", nccl_version / 10000, nccl_version / 100 % 100,
             nccl_version % 100);
  else if (nccl_version > 0)
    snprintf(nccl, sizeof(nccl), " (%d.%d.%d)", nccl_version / 1000, nccl_version / 100 % 10,
             nccl_version % 100);
  fprintf(out,
          "hvd v%s:\n"
          "\n"
          "Available Frameworks:\n"
          "    [ ] TensorFlow\n"
          "    [%s] PyTorch\n"
          "    [ ] MXNet\n"
          "\n"
          "Available Controllers:\n"
          "    [ ] MPI\n"
          "    [X] Gloo (hvd's own controller, Gloo-compatible)\n"
          "\n"
          "Available Tensor Operations:\n"
          "    [%s] NCCL%s\n"
          "    [ ] DDL\n"
          "    [ ] CCL\n"
          "    [ ] MPI\n"
          "    [X] Gloo (hvd's own TCP collectives)\n",
          hvd_version(), mark(has_torch(python_dir)), mark(nccl_version > 0), nccl);
}
