/* What a binding that declares hvd.h's structures itself checks at load. */
#include <string.h>

#include "common.h"

HVD_API int hvd_abi_version(void) { return HVD_ABI_VERSION; }

HVD_API size_t hvd_abi_sizeof(const char *type_name) {
  static const struct {
    const char *name;
    size_t size;
  } types[] = {
      {"hvd_tensor", sizeof(hvd_tensor)},
      {"hvd_options", sizeof(hvd_options)},
      {"hvd_elastic_hooks", sizeof(hvd_elastic_hooks)},
  };
  if (type_name == NULL)
    return 0;
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    if (strcmp(types[i].name, type_name) == 0)
      return types[i].size;
  }
  return 0;
}
