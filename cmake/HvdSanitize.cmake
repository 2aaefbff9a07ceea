# HVD_SANITIZE=address,undefined or HVD_SANITIZE=thread instruments every target.
if(HVD_SANITIZE)
  string(REPLACE "," ";" _hvd_sanitizers "${HVD_SANITIZE}")
  foreach(_s IN LISTS _hvd_sanitizers)
    if(NOT _s MATCHES "^(address|undefined|thread|leak)$")
      message(FATAL_ERROR "HVD_SANITIZE: unknown sanitizer '${_s}' (use address,undefined or thread)")
    endif()
  endforeach()
  if("thread" IN_LIST _hvd_sanitizers AND "address" IN_LIST _hvd_sanitizers)
    message(FATAL_ERROR "HVD_SANITIZE: thread cannot be combined with address")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:C>:-fsanitize=${HVD_SANITIZE}>
                      $<$<COMPILE_LANGUAGE:C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:C>:-fno-sanitize-recover=all>)
  add_link_options(-fsanitize=${HVD_SANITIZE})
  # GCC leaves out-of-range float-to-integer conversions out of "undefined".
  if("undefined" IN_LIST _hvd_sanitizers)
    add_compile_options($<$<COMPILE_LANGUAGE:C>:-fsanitize=float-cast-overflow>)
  endif()
  message(STATUS "hvd: sanitizers ${HVD_SANITIZE}")
endif()
