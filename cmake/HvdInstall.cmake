# cmake --install: the libraries, the public header, the tools, the Python packages
# and a pkg-config file.
include(GNUInstallDirs)
install(TARGETS hvd hvd_static hvd-rendezvous hvdrun
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/hvd DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The Python packages beside the library, where the hvd package looks for
# libhvd.so (three directories up) and hvdrun looks for them; the
# compatibility tree's `horovod` stays there too, never in a site directory,
# so that it shadows Horovod only for jobs that ask (hvdrun --horovod-compat).
# The tree's `horovodrun` (hvdrun under horovodrun's name, first on the
# ranks' PATH with --horovod-compat) keeps its execute bit.
install(DIRECTORY python/hvd python/compat DESTINATION ${CMAKE_INSTALL_LIBDIR}/hvd/python
  PATTERN __pycache__ EXCLUDE
  PATTERN "*.pyc" EXCLUDE
  PATTERN horovodrun
    PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ
                WORLD_EXECUTE)
# The pkg-config file finds the prefix from its own place, so that
# `cmake --install build --prefix DIR` (a prefix chosen after configuring)
# gives a file that points into DIR.
set(HVD_PC_PREFIX "\${pcfiledir}")
string(REPLACE "/" ";" _hvd_libdir_parts "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
foreach(_part IN LISTS _hvd_libdir_parts)
  string(APPEND HVD_PC_PREFIX "/..")
endforeach()
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(HVD_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
endif()
# A static link of the CUDA build also needs the CUDA runtime, NCCL and the
# C++ runtime the kernels' object uses.
set(HVD_PC_GPU_LIBS "")
if(HVD_CUDA_FOUND)
  get_filename_component(_hvd_nccl_dir "${HVD_NCCL_LIBRARY}" DIRECTORY)
  set(HVD_PC_GPU_LIBS " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -L${_hvd_nccl_dir} -lnccl -lstdc++")
endif()
configure_file(cmake/hvd.pc.in ${CMAKE_BINARY_DIR}/hvd.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/hvd.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
