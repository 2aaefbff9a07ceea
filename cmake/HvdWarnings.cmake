# Compiler warnings for every hvd target; -Werror when HVD_WERROR is on (CI).
# The CUDA sources (cuda/*.cu) get the host compiler's warnings through nvcc.
add_compile_options($<$<COMPILE_LANGUAGE:C>:-Wall> $<$<COMPILE_LANGUAGE:C>:-Wextra>
                    $<$<COMPILE_LANGUAGE:C>:-Wshadow> $<$<COMPILE_LANGUAGE:C>:-Wformat=2>
                    $<$<COMPILE_LANGUAGE:C>:-Wstrict-prototypes>
                    $<$<COMPILE_LANGUAGE:C>:-Wmissing-prototypes>
                    $<$<COMPILE_LANGUAGE:C>:-Wno-unused-parameter>
                    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
if(HVD_WERROR)
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-Werror>
                      $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings>)
endif()
add_compile_definitions(_GNU_SOURCE)
