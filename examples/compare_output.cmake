# Runs PROGRAM and checks that its standard output contains the text of
# EXPECTED (a file) verbatim, and that it exits 0.
#   cmake -DPROGRAM=... -DEXPECTED=... -P compare_output.cmake
execute_process(COMMAND ${PROGRAM} OUTPUT_VARIABLE out RESULT_VARIABLE code)
file(READ ${EXPECTED} expected)
message("${out}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} exited with ${code}")
endif()
string(FIND "${out}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the output does not contain the text of ${EXPECTED}:\n${expected}")
endif()
