# Helpers shared by the packaging test scripts (run_*.cmake, run with
# `cmake -P`): each step is announced, and a failing step prints its command
# line and its whole output before stopping the script with a clear message.

# posbias_pkg_require(VAR...): every VAR must have been given with -DVAR=...
function(posbias_pkg_require)
  foreach(_var IN LISTS ARGN)
    if(NOT DEFINED ${_var})
      message(FATAL_ERROR "[packaging] missing -D${_var}=... (this script is "
                          "run by ctest; see tests/packaging/CMakeLists.txt)")
    endif()
  endforeach()
endfunction()

# posbias_pkg_fail(MESSAGE...): stops the test with MESSAGE.
function(posbias_pkg_fail)
  string(JOIN "" _text ${ARGN})
  message(FATAL_ERROR "[packaging] FAILED: ${_text}")
endfunction()

# posbias_pkg_step(DESCRIPTION [OUTPUT_VARIABLE var] COMMAND cmd arg...):
# runs the command, stops the test with its output if it fails, and otherwise
# stores its standard output (stripped) in `var` when asked.
function(posbias_pkg_step description)
  cmake_parse_arguments(PARSE_ARGV 1 _step "" "OUTPUT_VARIABLE" "COMMAND")
  if(NOT _step_COMMAND)
    message(FATAL_ERROR "posbias_pkg_step(${description}): no COMMAND")
  endif()
  list(JOIN _step_COMMAND "' '" _command_line)
  message(STATUS "[packaging] ${description}")
  execute_process(COMMAND ${_step_COMMAND}
    RESULT_VARIABLE _result
    OUTPUT_VARIABLE _stdout
    ERROR_VARIABLE _stderr)
  if(NOT _result EQUAL 0)
    message("---- command:\n'${_command_line}'\n"
            "---- standard output:\n${_stdout}\n"
            "---- standard error:\n${_stderr}\n----")
    posbias_pkg_fail("${description} (exit status: ${_result})")
  endif()
  if(_step_OUTPUT_VARIABLE)
    string(STRIP "${_stdout}" _stdout)
    set(${_step_OUTPUT_VARIABLE} "${_stdout}" PARENT_SCOPE)
  endif()
endfunction()

# posbias_pkg_configure_args(var): the arguments that configure a consumer
# project like the posbias build that runs the test: same generator,
# compiler, build type, flags (sanitizers included) and warnings policy.
function(posbias_pkg_configure_args var)
  set(_args -G "${GENERATOR}")
  if(GENERATOR_PLATFORM)
    list(APPEND _args -A "${GENERATOR_PLATFORM}")
  endif()
  if(GENERATOR_TOOLSET)
    list(APPEND _args -T "${GENERATOR_TOOLSET}")
  endif()
  if(MAKE_PROGRAM)
    list(APPEND _args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
  endif()
  if(CXX_COMPILER_LAUNCHER)
    list(APPEND _args "-DCMAKE_CXX_COMPILER_LAUNCHER=${CXX_COMPILER_LAUNCHER}")
  endif()
  if(CONFIG)
    list(APPEND _args "-DCMAKE_BUILD_TYPE=${CONFIG}")
  endif()
  list(APPEND _args
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
    "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}"
    "-DCMAKE_SHARED_LINKER_FLAGS=${LINKER_FLAGS}"
    "-DCONSUMER_WERROR=${WERROR}")
  set(${var} "${_args}" PARENT_SCOPE)
endfunction()

# posbias_pkg_config_args(var): `--config CONFIG` when a configuration is set
# (needed by multi-configuration generators, harmless otherwise).
function(posbias_pkg_config_args var)
  if(CONFIG)
    set(${var} --config "${CONFIG}" PARENT_SCOPE)
  else()
    set(${var} "" PARENT_SCOPE)
  endif()
endfunction()
