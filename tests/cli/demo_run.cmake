# cli.demo: runs `posbias demo` into a fresh folder and checks what it says
# and what it writes.
#   cmake -DPOSBIAS=... -DOUT_DIR=... -DLENGTH=... -P demo_run.cmake
file(REMOVE_RECURSE ${OUT_DIR})
execute_process(
  COMMAND ${POSBIAS} demo --out ${OUT_DIR} --length ${LENGTH} --repetitions 2 --progress never
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE code)
message("${out}")
if(NOT code EQUAL 0)
  message(FATAL_ERROR "posbias demo exited with ${code}: ${err}")
endif()
if(NOT err STREQUAL "")
  message(FATAL_ERROR "posbias demo wrote to stderr with --progress never: ${err}")
endif()
# Every section, in order, and the checks' verdict.
set(at 0)
foreach(expected
    "== AlibiPositionalBias(heads=4, total_heads=8) =="
    "Example 1: bias = bias_module(10, 10)"
    "Example 2: bias = bias_module(5, 5)"
    "Example 3: bias = bias_module(8, 15)"
    "== The \"ALiBi\" seed's worked example =="
    "tensor([[1.0000, 1.8000, 2.6000],"
    "== The \"ALiBi\" seed's generic builder, causal and not =="
    "== DynamicPositionBias(dim=64, heads=8) =="
    "Shape [8, 0, 5], 0 elements"
    "== Inspecting the bias"
    "== Why the fused attention matters =="
    "materialised   "
    "fused          "
    "The two outputs agree"
    "== Pictures =="
    "The heatmaps of this demo are in ${OUT_DIR}/ :"
    "Every statement above was checked while printing it.")
  string(FIND "${out}" "${expected}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "missing from the demo's output: ${expected}")
  endif()
  if(pos LESS at)
    message(FATAL_ERROR "out of order in the demo's output: ${expected}")
  endif()
  set(at ${pos})
endforeach()
if(out MATCHES "UNEXPECTED")
  message(FATAL_ERROR "a statement of the demo did not hold")
endif()
# Every picture it lists exists, is not empty, and is a PNG or an SVG.
string(REGEX MATCHALL "\n  ([a-z0-9_]+\\.(png|svg))  " listed "${out}")
list(LENGTH listed n)
if(n LESS 8)
  message(FATAL_ERROR "the demo lists ${n} pictures, expected at least 8")
endif()
foreach(entry ${listed})
  string(STRIP "${entry}" name)
  set(file ${OUT_DIR}/${name})
  if(NOT EXISTS ${file})
    message(FATAL_ERROR "listed but not written: ${file}")
  endif()
  file(READ ${file} head LIMIT 8 HEX)
  if(name MATCHES "png$" AND NOT head STREQUAL "89504e470d0a1a0a")
    message(FATAL_ERROR "not a PNG: ${file} (${head})")
  endif()
  if(name MATCHES "svg$" AND NOT head STREQUAL "3c3f786d6c207665")
    message(FATAL_ERROR "not an SVG: ${file} (${head})")
  endif()
endforeach()
# Nothing else in the folder (no temporary files, no empty.png).
file(GLOB written RELATIVE ${OUT_DIR} ${OUT_DIR}/* ${OUT_DIR}/.*)
list(LENGTH written n_written)
if(NOT n_written EQUAL n)
  message(FATAL_ERROR "the folder holds ${n_written} files, the demo listed ${n}: ${written}")
endif()
