# Configures a parent project that adds memplug with add_subdirectory, as
# a user vendoring it (or FetchContent) does, and checks that memplug then
# builds no tests or examples by default (MEMPLUG_BUILD_TESTS is OFF when
# memplug is not the top-level project) while its libraries are still
# there. Run by the subproject_no_tests ctest test.
file(REMOVE_RECURSE ${WORK_DIR})
file(WRITE ${WORK_DIR}/src/CMakeLists.txt "
cmake_minimum_required(VERSION 3.20)
project(parent C CXX)
add_subdirectory(\"${SOURCE_DIR}\" memplug)
")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${WORK_DIR}/src -B ${WORK_DIR}/build -G ${GENERATOR}
  -DMEMPLUG_CARGO_TARGET_DIR=${CARGO_TARGET_DIR}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring a parent project failed:\n${out}")
endif()
file(STRINGS ${WORK_DIR}/build/CMakeCache.txt option REGEX "^MEMPLUG_BUILD_TESTS:")
if(NOT option STREQUAL "MEMPLUG_BUILD_TESTS:BOOL=OFF")
  message(FATAL_ERROR "as a subproject, memplug's tests default to '${option}', not OFF")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build --target help
  OUTPUT_VARIABLE targets RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT targets MATCHES "memplug_cargo")
  message(FATAL_ERROR "the parent project has no memplug_cargo target:\n${targets}")
endif()
foreach(test_target memplug_bad_input memplug_kv_cache_c memplug_bad_input_asan memplug_example_plugin)
  if(targets MATCHES "${test_target}[:\n ]")
    message(FATAL_ERROR "a parent project builds memplug's ${test_target}")
  endif()
endforeach()
message(STATUS "as a subproject memplug builds its libraries and no tests")
