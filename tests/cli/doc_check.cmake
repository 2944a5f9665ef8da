# The documentation check (docs/check_documented.py).
#   MODE=headers: every public header (include/posbias/*.h and, when present,
#                 torch/include/posbias/*.h, globbed when the test runs) passes.
#   MODE=fixture: on data/undocumented_fixture.h the checker fails, naming
#                 exactly its one undocumented function.
#   cmake -DPYTHON=... -DSOURCE_DIR=... -DMODE=... -P doc_check.cmake
set(checker ${SOURCE_DIR}/docs/check_documented.py)
if(MODE STREQUAL "headers")
  file(GLOB headers ${SOURCE_DIR}/include/posbias/*.h ${SOURCE_DIR}/torch/include/posbias/*.h)
  execute_process(COMMAND ${PYTHON} ${checker} ${headers} RESULT_VARIABLE code
    OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT code EQUAL 0)
    message(FATAL_ERROR "public declarations without a documentation comment (see above)")
  endif()
else()
  set(fixture ${SOURCE_DIR}/tests/cli/data/undocumented_fixture.h)
  execute_process(COMMAND ${PYTHON} ${checker} ${fixture} RESULT_VARIABLE code
    OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT code EQUAL 1)
    message(FATAL_ERROR "the checker exited with ${code} on the fixture, expected 1")
  endif()
  string(FIND "${out}" "undocumented_fixture.h:51: undocumented: int undocumented_function(int x);" at)
  string(FIND "${out}" "1 undocumented public declaration(s) in 1 header(s)" summary)
  if(at EQUAL -1 OR summary EQUAL -1)
    message(FATAL_ERROR "the checker did not report exactly the one undocumented function")
  endif()
endif()
