# Fails when PROGRAM needs (ELF NEEDED entries, read with READELF -d) a
# shared library whose name matches FORBIDDEN. CONTROL, when given, is a
# program that must need one of them: it shows that the pattern and the
# reading of readelf's output do find such a library when it is there.
#
#   cmake -DREADELF=... -DPROGRAM=... -DFORBIDDEN=regex [-DCONTROL=...] -P check_needed.cmake
function(needed_libraries program out)
  execute_process(COMMAND ${READELF} -d ${program}
    OUTPUT_VARIABLE text ERROR_VARIABLE error RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "${READELF} -d ${program} failed (${status}): ${error}")
  endif()
  string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]\n]+\\]" lines "${text}")
  set(names "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE ".*\\[([^]]+)\\]$" "\\1" name "${line}")
    list(APPEND names ${name})
  endforeach()
  if(NOT names)
    message(FATAL_ERROR "${program}: readelf -d lists no NEEDED library at all:\n${text}")
  endif()
  set(${out} ${names} PARENT_SCOPE)
endfunction()

needed_libraries(${PROGRAM} needed)
message(STATUS "${PROGRAM} needs: ${needed}")
set(bad "")
foreach(name IN LISTS needed)
  if(name MATCHES "${FORBIDDEN}")
    list(APPEND bad ${name})
  endif()
endforeach()
if(bad)
  message(FATAL_ERROR "${PROGRAM} links ${bad} (matching '${FORBIDDEN}'); it must not")
endif()

if(CONTROL)
  needed_libraries(${CONTROL} control_needed)
  set(found "")
  foreach(name IN LISTS control_needed)
    if(name MATCHES "${FORBIDDEN}")
      list(APPEND found ${name})
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "control ${CONTROL} needs none of '${FORBIDDEN}' (${control_needed}): "
      "the check would not see such a library")
  endif()
  message(STATUS "control ${CONTROL} needs ${found}: the check sees them")
endif()
