# HVD_FUZZ=ON builds the libFuzzer harnesses of tests/fuzz (ctest label fuzz)
# and instruments every target for coverage (-fsanitize=fuzzer-no-link), so
# that the fuzzers see inside the library. It needs clang and its libFuzzer
# runtime (Debian: clang, libclang-rt-14-dev); without them the fuzz tests
# are still registered and skip (exit 77) naming what is missing.
# HVD_FUZZ_SECONDS is how long each fuzz test fuzzes.
option(HVD_FUZZ "Build the libFuzzer harnesses (clang)" OFF)
set(HVD_FUZZ_SECONDS 15 CACHE STRING "Seconds each ctest fuzz.<name> fuzzes")
set(HVD_FUZZ_READY OFF)
set(HVD_FUZZ_MISSING "")
if(HVD_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    set(HVD_FUZZ_MISSING
        "libFuzzer needs clang, the C compiler is ${CMAKE_C_COMPILER_ID} (configure with CC=clang)")
  else()
    include(CheckCSourceCompiles)
    set(CMAKE_REQUIRED_FLAGS -fsanitize=fuzzer)
    check_c_source_compiles([[
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return data[0] + (int)size; }
]] HVD_HAVE_LIBFUZZER)
    unset(CMAKE_REQUIRED_FLAGS)
    if(HVD_HAVE_LIBFUZZER)
      set(HVD_FUZZ_READY ON)
      add_compile_options($<$<COMPILE_LANGUAGE:C>:-fsanitize=fuzzer-no-link>)
    else()
      set(HVD_FUZZ_MISSING
          "${CMAKE_C_COMPILER} cannot link -fsanitize=fuzzer (install libclang-rt-14-dev)")
    endif()
  endif()
  if(HVD_FUZZ_READY)
    message(STATUS "hvd: fuzz harnesses with libFuzzer, ${HVD_FUZZ_SECONDS} s each")
  else()
    message(WARNING "hvd: HVD_FUZZ=ON but ${HVD_FUZZ_MISSING}; the fuzz tests will skip")
  endif()
endif()
