# Compiler warnings for every hvd target; -Werror when HVD_WERROR is on (CI).
add_compile_options(-Wall -Wextra -Wshadow -Wformat=2 -Wstrict-prototypes
                    -Wmissing-prototypes -Wno-unused-parameter)
if(HVD_WERROR)
  add_compile_options(-Werror)
endif()
add_compile_definitions(_GNU_SOURCE)
