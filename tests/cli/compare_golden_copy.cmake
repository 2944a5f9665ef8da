# Checks that tests/data/golden holds a byte-identical copy of every file of
# ../shared/golden (see tests/data/golden/PROVENANCE.md).
#
#   cmake -DSHARED_DIR=<../shared/golden> -DCOPY_DIR=<tests/data/golden>
#         -P compare_golden_copy.cmake
#
# Skipped (POSBIAS_TEST_SKIPPED, the test's SKIP_REGULAR_EXPRESSION) only when
# SHARED_DIR does not exist; any difference or missing file fails.
foreach(var SHARED_DIR COPY_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "compare_golden_copy.cmake: -D${var}=... is required")
  endif()
endforeach()

if(NOT IS_DIRECTORY "${SHARED_DIR}")
  message(STATUS "POSBIAS_TEST_SKIPPED: ${SHARED_DIR} does not exist, nothing to compare")
  return()
endif()

file(GLOB shared_files RELATIVE "${SHARED_DIR}" "${SHARED_DIR}/*")
if(NOT shared_files)
  message(FATAL_ERROR "${SHARED_DIR} exists but holds no files")
endif()

set(problems "")
foreach(name IN LISTS shared_files)
  set(shared "${SHARED_DIR}/${name}")
  set(copy "${COPY_DIR}/${name}")
  if(IS_DIRECTORY "${shared}")
    continue()
  endif()
  if(NOT EXISTS "${copy}")
    string(APPEND problems "\n  ${copy} is missing")
    continue()
  endif()
  file(SHA256 "${shared}" shared_hash)
  file(SHA256 "${copy}" copy_hash)
  if(NOT shared_hash STREQUAL copy_hash)
    string(APPEND problems
      "\n  ${copy} differs from ${shared} (sha256 ${copy_hash} vs ${shared_hash})")
  else()
    message(STATUS "identical: ${name}")
  endif()
endforeach()

if(problems)
  message(FATAL_ERROR
    "The golden copy in ${COPY_DIR} is not identical to ${SHARED_DIR}:${problems}\n"
    "Copy the files again from ${SHARED_DIR}; never edit the copy.")
endif()
