# install() + exported TesseraConfig.cmake: find_package(Tessera) then link tessera::tessera.
include(CMakePackageConfigHelpers)

install(TARGETS tessera EXPORT TesseraTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
# Public headers only: detail/ (one layer's own) and internal/ (a layer's interface to the later
# layers of the library) folders are not installed.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tessera DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.hpp" PATTERN "detail" EXCLUDE PATTERN "internal" EXCLUDE)
install(EXPORT TesseraTargets NAMESPACE tessera:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
  ${PROJECT_BINARY_DIR}/TesseraConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/TesseraConfig.cmake ${PROJECT_BINARY_DIR}/TesseraConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)
