# cmake -DNM=<nm> -DLIBRARY=<lib.so> -DEXPECTED=<sym;sym...> -P check_exports.cmake
#
# Fails unless the dynamic symbols LIBRARY defines are exactly EXPECTED
# (ARCHITECTURE.md section 3, Symbols: a plugin exports only its entry symbols).
foreach(var NM LIBRARY EXPECTED)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_exports.cmake: -D${var}=... is required")
  endif()
endforeach()

execute_process(
  COMMAND ${NM} -D --defined-only ${LIBRARY}
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIBRARY} failed (${rc}): ${err}")
endif()

# Lines look like "0000000000001234 T memplug_plugin_v1".
string(REPLACE "\n" ";" lines "${out}")
set(found "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] +([^ ]+)$")
    list(APPEND found "${CMAKE_MATCH_1}")
  endif()
endforeach()
list(SORT found)
set(expected ${EXPECTED})
list(SORT expected)
if(NOT found STREQUAL expected)
  message(FATAL_ERROR
    "${LIBRARY} exports [${found}]; expected exactly [${expected}]. "
    "Build with -fvisibility=hidden and mark only the entry symbol MEMPLUG_EXPORT.")
endif()
message(STATUS "${LIBRARY} exports exactly [${found}]")
