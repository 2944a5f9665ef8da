# The add_subdirectory packaging test (run by ctest with cmake -P): configures
# add_subdirectory_consumer/, which add_subdirectory()s the posbias source
# tree, with BUILD_SHARED_LIBS=ON (the main build is static by default, so
# this is where the shared library is built and used), builds it and runs it.
# The consumer's CMakeLists.txt fails the configure step if posbias turned on
# its tests, CLI or benchmarks as a subproject; this script also checks that
# it generated no install rules.
cmake_minimum_required(VERSION 3.20)  # ctest --test-dir, file(REAL_PATH)
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
posbias_pkg_require(POSBIAS_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER CONFIG
  JOBS ONE_TARGET_FLAGS)

set(consumer_source ${CMAKE_CURRENT_LIST_DIR}/add_subdirectory_consumer)
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
posbias_pkg_config_args(config_args)
# The consumer compiles posbias's kernels for one instruction set
# (ONE_TARGET_FLAGS, from CMakeLists.txt beside this script, which says why).
set(CXX_FLAGS "${CXX_FLAGS} ${ONE_TARGET_FLAGS}")
posbias_pkg_configure_args(configure_args)

posbias_pkg_step("configure add_subdirectory_consumer (BUILD_SHARED_LIBS=ON)"
  COMMAND ${CMAKE_COMMAND} -S ${consumer_source} -B ${consumer_build}
          ${configure_args}
          -DBUILD_SHARED_LIBS=ON
          "-DPOSBIAS_SOURCE_DIR=${POSBIAS_SOURCE_DIR}")

# POSBIAS_INSTALL off: posbias's directory must install nothing.
file(READ ${consumer_build}/posbias/cmake_install.cmake install_script)
if(install_script MATCHES "file\\(INSTALL")
  posbias_pkg_fail("posbias generated install rules as a subproject (see "
                   "${consumer_build}/posbias/cmake_install.cmake)")
endif()

posbias_pkg_step("build add_subdirectory_consumer (posbias as a shared library)"
  COMMAND ${CMAKE_COMMAND} --build ${consumer_build} ${config_args}
          --parallel ${JOBS})
# Exactly one test, the consumer's own: posbias added none.
posbias_pkg_step("run add_subdirectory_consumer" OUTPUT_VARIABLE ctest_output
  COMMAND ${CMAKE_CTEST_COMMAND} --test-dir ${consumer_build} ${config_args}
          --output-on-failure --no-tests=error)
if(NOT ctest_output MATCHES "tests passed, 0 tests failed out of 1\n")
  message("${ctest_output}")
  posbias_pkg_fail("the consumer's build has other tests than its own: "
                   "posbias added tests as a subproject")
endif()
message(STATUS "[packaging] add_subdirectory consumer passed")
