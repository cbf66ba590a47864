# Installs the build tree into a scratch prefix, then configures, builds and
# runs cmake/consumer-test against it (find_package(memplug), shared and
# static), and compiles the consumer once more through pkg-config.
# Run by the install_consumer ctest test.
set(prefix ${WORK_DIR}/prefix)
file(REMOVE_RECURSE ${WORK_DIR})

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGV}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()

# CONFIG is empty for a single-configuration build without CMAKE_BUILD_TYPE.
set(config_args)
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix} ${config_args})
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${WORK_DIR}/build -G ${GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=${CONFIG})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build)
run(${WORK_DIR}/build/consumer_shared ${PLUGIN})
run(${WORK_DIR}/build/consumer_static ${PLUGIN})

# pkg-config as a user runs it: only the search path points at the prefix;
# the .pc file must name the prefix it was installed under by itself.
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${prefix}/${LIBDIR}/pkgconfig)
execute_process(COMMAND ${PKG_CONFIG} --cflags --libs memplug-host
  OUTPUT_VARIABLE flags OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pkg-config memplug-host failed")
endif()
if(NOT flags MATCHES "-I${prefix}/")
  message(FATAL_ERROR "pkg-config memplug-host names another prefix than ${prefix}: ${flags}")
endif()
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} -std=c99 -Wall -Wextra -Wpedantic -Werror ${CONSUMER_SOURCE}/consumer.c ${flags}
    -o ${WORK_DIR}/consumer_pkgconfig)
set(ENV{LD_LIBRARY_PATH} ${prefix}/${LIBDIR})
run(${WORK_DIR}/consumer_pkgconfig ${PLUGIN})
message(STATUS "consumer built and ran against ${prefix}")
