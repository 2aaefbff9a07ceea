# cmake --install: the libraries, the public header, the tools and a pkg-config file.
include(GNUInstallDirs)
install(TARGETS hvd hvd_static hvd-rendezvous
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/hvd DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
configure_file(cmake/hvd.pc.in ${CMAKE_BINARY_DIR}/hvd.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/hvd.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
