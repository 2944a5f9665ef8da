# Runs `posbias check-golden GOLDEN` and checks both its exit code and its
# summary line (a plain add_test can check one or the other, not both).
#
#   cmake -DPOSBIAS=<tool> -DGOLDEN=<file> -DEXPECT_EXIT=0
#         -DEXPECT_SUMMARY="60 passed, 0 failed, 0 skipped"
#         [-DSKIP_IF_MISSING=ON] -P check_golden_run.cmake
#
# With SKIP_IF_MISSING, a missing GOLDEN prints POSBIAS_TEST_SKIPPED (the
# test's SKIP_REGULAR_EXPRESSION) instead of failing.
foreach(var POSBIAS GOLDEN EXPECT_EXIT EXPECT_SUMMARY)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_golden_run.cmake: -D${var}=... is required")
  endif()
endforeach()

if(NOT EXISTS "${GOLDEN}")
  if(SKIP_IF_MISSING)
    message(STATUS "POSBIAS_TEST_SKIPPED: ${GOLDEN} does not exist")
    return()
  endif()
  message(FATAL_ERROR "golden file ${GOLDEN} does not exist")
endif()

execute_process(
  COMMAND "${POSBIAS}" check-golden "${GOLDEN}"
  RESULT_VARIABLE exit_code
  OUTPUT_VARIABLE out
  ERROR_VARIABLE err)
message(STATUS "posbias check-golden ${GOLDEN}:\n${out}${err}")

if(NOT exit_code STREQUAL "${EXPECT_EXIT}")
  message(FATAL_ERROR "exit code ${exit_code}, expected ${EXPECT_EXIT}")
endif()
# The summary must be the last line, exactly.
string(REGEX MATCH "[^\n]*\n?$" last_line "${out}")
string(STRIP "${last_line}" last_line)
if(NOT last_line STREQUAL "${EXPECT_SUMMARY}")
  message(FATAL_ERROR "last line '${last_line}', expected '${EXPECT_SUMMARY}'")
endif()
