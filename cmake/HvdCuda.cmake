# HVD_WITH_CUDA: AUTO detects nvcc and NCCL (nothing is built from cuda/ yet),
# ON requires them, OFF skips the search.
set(HVD_CUDA_FOUND OFF)
if(NOT HVD_WITH_CUDA MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "HVD_WITH_CUDA must be AUTO, ON or OFF, not '${HVD_WITH_CUDA}'")
endif()
if(NOT HVD_WITH_CUDA STREQUAL "OFF")
  set(_hvd_cuda_hints /usr/local/cuda $ENV{CUDA_HOME})
  find_program(HVD_NVCC nvcc HINTS ${_hvd_cuda_hints} PATH_SUFFIXES bin)
  find_path(HVD_NCCL_INCLUDE_DIR nccl.h HINTS ${_hvd_cuda_hints} PATH_SUFFIXES include)
  find_library(HVD_NCCL_LIBRARY nccl HINTS ${_hvd_cuda_hints} PATH_SUFFIXES lib64 lib)
  if(HVD_NVCC AND HVD_NCCL_INCLUDE_DIR AND HVD_NCCL_LIBRARY)
    set(HVD_CUDA_FOUND ON)
    message(STATUS "hvd: CUDA found (nvcc ${HVD_NVCC}, NCCL ${HVD_NCCL_LIBRARY})")
  elseif(HVD_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "HVD_WITH_CUDA=ON but the CUDA toolkit or NCCL was not found "
                        "(nvcc: ${HVD_NVCC}, nccl.h: ${HVD_NCCL_INCLUDE_DIR}, libnccl: ${HVD_NCCL_LIBRARY}); "
                        "install them under /usr/local/cuda or set CUDA_HOME")
  else()
    message(STATUS "hvd: CUDA or NCCL not found; building without the GPU path")
  endif()
endif()
