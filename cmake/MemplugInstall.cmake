# Installation: headers, the host C API libraries (libmemplug_host.so.X.Y.Z
# with its SONAME link .so.X and the link .so; libmemplug_host.a), the CPU
# plugin in the plugin directory, a CMake package (find_package(memplug) ->
# memplug::headers, memplug::host, memplug::host_static, MEMPLUG_PLUGIN_DIR)
# and a pkg-config file (memplug-host.pc, variable plugindir). The packaging
# test configures cmake/consumer-test against an install prefix.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Where plugins are installed, relative to the prefix; the package and the
# .pc file hand it to users (MEMPLUG_PLUGIN_DIR, `pkg-config
# --variable=plugindir memplug-host`).
set(MEMPLUG_INSTALL_PLUGINDIR "${CMAKE_INSTALL_LIBDIR}/memplug/plugins" CACHE STRING
  "plugin directory, relative to the install prefix")

install(FILES
    ${PROJECT_SOURCE_DIR}/include/memplug.h
    ${PROJECT_SOURCE_DIR}/include/memplug_host.h
    ${PROJECT_SOURCE_DIR}/include/memplug.hpp
    ${PROJECT_SOURCE_DIR}/include/memplug_cache.hpp
    ${PROJECT_SOURCE_DIR}/include/memplug_offload.hpp
    ${PROJECT_SOURCE_DIR}/include/memplug_ucx.hpp
    ${PROJECT_SOURCE_DIR}/include/memplug_node.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# memplug_host.h includes one header per topic, memplug/host/*.h: every one
# of them, whatever topics there are.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/memplug/host/
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/memplug/host
  FILES_MATCHING PATTERN "*.h")
# memplug/host/dlpack_export.h includes "dlpack/dlpack.h" (the DLPack
# export, API 1.3).
install(FILES
    ${PROJECT_SOURCE_DIR}/include/dlpack/dlpack.h
    ${PROJECT_SOURCE_DIR}/include/dlpack/LICENSE
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dlpack)
install(PROGRAMS ${MEMPLUG_HOST_SHARED} DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The two links are installed as links.
install(FILES ${MEMPLUG_LIB_OUT}/${MEMPLUG_HOST_SONAME} ${MEMPLUG_LIB_OUT}/${MEMPLUG_HOST_LINK_NAME}
  DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES ${MEMPLUG_HOST_STATIC} DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(PROGRAMS ${MEMPLUG_CPU_PLUGIN} DESTINATION ${MEMPLUG_INSTALL_PLUGINDIR})
# `cmake --install --strip` strips only targets CMake built itself; these
# libraries come from cargo, so they are stripped here (the archive of its
# debug info only, keeping the symbols a link needs).
install(CODE "
  if(CMAKE_INSTALL_DO_STRIP)
    set(dest \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
    execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-unneeded
      \"\${dest}/${CMAKE_INSTALL_LIBDIR}/${MEMPLUG_HOST_REAL_NAME}\"
      \"\${dest}/${MEMPLUG_INSTALL_PLUGINDIR}/${CMAKE_SHARED_LIBRARY_PREFIX}memplug_plugin_cpu${CMAKE_SHARED_LIBRARY_SUFFIX}\"
      COMMAND_ERROR_IS_FATAL ANY)
    execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug
      \"\${dest}/${CMAKE_INSTALL_LIBDIR}/${CMAKE_STATIC_LIBRARY_PREFIX}memplug_host${CMAKE_STATIC_LIBRARY_SUFFIX}\"
      COMMAND_ERROR_IS_FATAL ANY)
  endif()
")

set(MEMPLUG_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/memplug)
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/memplugConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/memplugConfig.cmake
  INSTALL_DESTINATION ${MEMPLUG_CMAKE_INSTALL_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR MEMPLUG_INSTALL_PLUGINDIR)
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/memplugConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
    ${CMAKE_CURRENT_BINARY_DIR}/memplugConfig.cmake
    ${CMAKE_CURRENT_BINARY_DIR}/memplugConfigVersion.cmake
  DESTINATION ${MEMPLUG_CMAKE_INSTALL_DIR})

# pkg-config: memplug-host (shared; `--static` adds what the .a needs).
# The prefix is the one the files are installed under, known only at install
# time (`cmake --install --prefix P` may differ from CMAKE_INSTALL_PREFIX at
# configure time): the configure step fills everything else and leaves the
# prefix placeholder, and an install step writes the final file.
set(MEMPLUG_PC_STATIC_LIBS "-lpthread -ldl -lm -lrt -lutil -lgcc_s")
set(MEMPLUG_PC_PREFIX "@MEMPLUG_PC_PREFIX@")
configure_file(${CMAKE_CURRENT_LIST_DIR}/memplug-host.pc.in
  ${CMAKE_CURRENT_BINARY_DIR}/memplug-host.pc.in @ONLY)
install(CODE "
  set(MEMPLUG_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  configure_file(\"${CMAKE_CURRENT_BINARY_DIR}/memplug-host.pc.in\"
    \"${CMAKE_CURRENT_BINARY_DIR}/pc-install/memplug-host.pc\" @ONLY)
")
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/pc-install/memplug-host.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Packaging test: install into a scratch prefix, then build and run the
# consumer project (find_package and pkg-config) against it.
if(NOT MEMPLUG_BUILD_TESTS)
  return()
endif()
add_test(NAME install_consumer
  COMMAND ${CMAKE_COMMAND}
    -DBUILD_DIR=${CMAKE_BINARY_DIR}
    -DWORK_DIR=${CMAKE_BINARY_DIR}/consumer-test
    -DCONSUMER_SOURCE=${CMAKE_CURRENT_LIST_DIR}/consumer-test
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCONFIG=$<CONFIG>
    -DC_COMPILER=${CMAKE_C_COMPILER}
    -DLIBDIR=${CMAKE_INSTALL_LIBDIR}
    -DPLUGINDIR=${MEMPLUG_INSTALL_PLUGINDIR}
    -DSONAME=${MEMPLUG_HOST_SONAME}
    -DREAL_NAME=${MEMPLUG_HOST_REAL_NAME}
    -DREADELF=${CMAKE_READELF}
    -P ${CMAKE_CURRENT_LIST_DIR}/RunConsumerTest.cmake)
set_tests_properties(install_consumer PROPERTIES RESOURCE_LOCK memplug_build_tree TIMEOUT 600)

# Added to another project, memplug builds no tests unless asked.
add_test(NAME subproject_no_tests
  COMMAND ${CMAKE_COMMAND}
    -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DWORK_DIR=${CMAKE_BINARY_DIR}/subproject-test
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCARGO_TARGET_DIR=${MEMPLUG_CARGO_TARGET_DIR}
    -P ${CMAKE_CURRENT_LIST_DIR}/RunSubprojectTest.cmake)
set_tests_properties(subproject_no_tests PROPERTIES TIMEOUT 120)
