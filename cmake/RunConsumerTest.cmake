# Installs the build tree into a scratch prefix (stripped), checks the installed
# layout (the shared library's link chain and SONAME, the CPU plugin in the
# plugin directory), then configures, builds and runs cmake/consumer-test
# against it (find_package(memplug), shared and static), and compiles the
# consumer once more through pkg-config. The consumers load the installed
# CPU plugin from the directory the package names, as a user's program
# would. Run by the install_consumer ctest test.
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGV}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

# The dynamic section line of `readelf -d FILE` that names TAG (SONAME,
# NEEDED), as "TAG: [value] ..." joined; empty when there is none.
function(dynamic_entries out file tag)
  execute_process(COMMAND ${READELF} -d ${file} OUTPUT_VARIABLE text RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf -d ${file} failed")
  endif()
  string(REGEX MATCHALL "\\(${tag}\\)[^\n]*" lines "${text}")
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()

# CONFIG is empty for a single-configuration build without CMAKE_BUILD_TYPE.
set(config_args)
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()
# Stripped, as a distribution installs it: the libraries must still link
# and load without their debug info.
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} --strip ${config_args})

# The shared library: the real file behind the SONAME link behind the
# development link, and the SONAME recorded in the file.
set(libdir ${prefix}/${LIBDIR})
string(REGEX REPLACE "\\.[^.]+$" "" link_name "${SONAME}")
foreach(pair "${link_name}=${SONAME}" "${SONAME}=${REAL_NAME}")
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 link)
  list(GET pair 1 target)
  if(NOT IS_SYMLINK ${libdir}/${link})
    message(FATAL_ERROR "${libdir}/${link} is not a symbolic link")
  endif()
  file(READ_SYMLINK ${libdir}/${link} got)
  if(NOT got STREQUAL target)
    message(FATAL_ERROR "${libdir}/${link} points at ${got}, not ${target}")
  endif()
endforeach()
if(IS_SYMLINK ${libdir}/${REAL_NAME} OR NOT EXISTS ${libdir}/${REAL_NAME})
  message(FATAL_ERROR "${libdir}/${REAL_NAME} is not the installed library file")
endif()
dynamic_entries(soname ${libdir}/${REAL_NAME} SONAME)
if(NOT soname MATCHES "\\[${SONAME}\\]")
  message(FATAL_ERROR "${libdir}/${REAL_NAME} has SONAME '${soname}', not ${SONAME}")
endif()
set(plugin ${prefix}/${PLUGINDIR}/libmemplug_plugin_cpu.so)
if(NOT EXISTS ${plugin})
  message(FATAL_ERROR "the CPU plugin is not installed at ${plugin}")
endif()

run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=${CONFIG})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
# A program linked against the package records the SONAME, not a path.
dynamic_entries(needed ${WORK_DIR}/build/consumer_shared NEEDED)
if(NOT needed MATCHES "\\[${SONAME}\\]")
  message(FATAL_ERROR "consumer_shared does not need ${SONAME}: ${needed}")
endif()
run(${WORK_DIR}/build/consumer_shared)
run(${WORK_DIR}/build/consumer_static)

# pkg-config as a user runs it: only the search path points at the prefix;
# the .pc file must name the prefix it was installed under by itself, and
# the plugin directory as the variable plugindir.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${libdir}/pkgconfig)
function(pkg_config out)
  execute_process(COMMAND ${PKG_CONFIG} ${ARGN} memplug-host
    OUTPUT_VARIABLE text OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "pkg-config ${ARGN} memplug-host failed")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()
pkg_config(flags --cflags --libs)
if(NOT flags MATCHES "-I${prefix}/")
  message(FATAL_ERROR "pkg-config memplug-host names another prefix than ${prefix}: ${flags}")
endif()
pkg_config(plugindir --variable=plugindir)
if(NOT plugindir STREQUAL "${prefix}/${PLUGINDIR}")
  message(FATAL_ERROR "pkg-config's plugindir is '${plugindir}', not ${prefix}/${PLUGINDIR}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
# A prefix outside the loader's search path: the program finds the library
# through the run path the README gives (-Wl,-rpath,$(pkg-config
# --variable=libdir memplug-host)), with no LD_LIBRARY_PATH.
pkg_config(pc_libdir --variable=libdir)
run(${C_COMPILER} -std=c99 -Wall -Wextra -Wpedantic -Werror
    "-DMEMPLUG_CONSUMER_PLUGIN=\"${plugindir}/libmemplug_plugin_cpu.so\""
    ${CONSUMER_SOURCE}/consumer.c ${flags} -Wl,-rpath,${pc_libdir} -o ${WORK_DIR}/consumer_pkgconfig)
unset(ENV{LD_LIBRARY_PATH})
run(${WORK_DIR}/consumer_pkgconfig)
# Without the run path the same program does not start: what a user meets
# (the README's Install section says so), and proof that the run path above
# is what found the library.
run(${C_COMPILER} -std=c99 ${CONSUMER_SOURCE}/consumer.c ${flags}
    "-DMEMPLUG_CONSUMER_PLUGIN=\"${plugindir}/libmemplug_plugin_cpu.so\""
    -o ${WORK_DIR}/consumer_no_rpath)
execute_process(COMMAND ${WORK_DIR}/consumer_no_rpath RESULT_VARIABLE rc ERROR_VARIABLE err)
if(rc EQUAL 0 OR NOT err MATCHES "${SONAME}")
  message(FATAL_ERROR "without a run path the consumer ran (${rc}): is ${libdir} on the loader's path? ${err}")
endif()
message(STATUS "consumer built and ran against ${prefix}")
