/* A build without CUDA: no GPU backend (HVD_WITH_CUDA found no toolkit). */
#include "coord.h"

const struct coord_gpu_backend *coord_gpu_builtin(void) { return NULL; }
