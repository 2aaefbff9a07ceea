# hvd's Python packages in the build tree: <library dir>/hvd/python/hvd (the
# hvd package, which finds libhvd.so three directories up) and .../compat
# (the opt-in `horovod` import tree), as an install lays them out
# (HvdInstall.cmake), so that build/bin/hvdrun finds them as an installed
# hvdrun does. Symlinks to the sources: an edit takes effect without a build.
set(_hvd_python_dir ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/hvd/python)
file(MAKE_DIRECTORY ${_hvd_python_dir})
foreach(_pkg hvd compat)
  set(_src ${CMAKE_SOURCE_DIR}/python/${_pkg})
  set(_link ${_hvd_python_dir}/${_pkg})
  if(NOT EXISTS ${_src})
    file(MAKE_DIRECTORY ${_src})
  endif()
  if(EXISTS ${_link} AND NOT IS_SYMLINK ${_link})
    message(FATAL_ERROR "${_link} is not a symlink to ${_src}: remove it and configure again")
  endif()
  file(CREATE_LINK ${_src} ${_link} RESULT _result SYMBOLIC)
  if(NOT _result STREQUAL "0")
    message(FATAL_ERROR "cannot link ${_link} to ${_src}: ${_result}")
  endif()
endforeach()
