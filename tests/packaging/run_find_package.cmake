# The find_package / pkg-config packaging test (run by ctest with cmake -P):
#  1. installs the posbias build tree into a fresh prefix inside WORK_DIR and
#     checks that the expected files are there and no internal ones;
#  2. configures, builds and runs find_package_consumer/ against that prefix
#     (CMAKE_PREFIX_PATH), like the build that runs the test;
#  3. compiles and links find_package_consumer/main.cc with
#     `pkg-config --cflags --libs posbias` (PKG_CONFIG_PATH into the prefix)
#     and runs it. Without pkg-config the test ends as skipped after steps 1
#     and 2.
cmake_minimum_required(VERSION 3.20)  # ctest --test-dir, file(REAL_PATH)
include(${CMAKE_CURRENT_LIST_DIR}/common.cmake)
posbias_pkg_require(POSBIAS_SOURCE_DIR POSBIAS_BINARY_DIR POSBIAS_VERSION
  WORK_DIR GENERATOR CXX_COMPILER CONFIG INSTALL_LIBDIR INSTALL_INCLUDEDIR
  INSTALL_BINDIR LIB_FILE_NAME LIB_LINKER_FILE_NAME)

set(consumer_source ${CMAKE_CURRENT_LIST_DIR}/find_package_consumer)
set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/consumer-build)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
posbias_pkg_config_args(config_args)

# 1. Install, and check what was installed.
posbias_pkg_step("install ${POSBIAS_BINARY_DIR} into ${prefix}"
  COMMAND ${CMAKE_COMMAND} --install ${POSBIAS_BINARY_DIR} --prefix ${prefix}
          ${config_args})

set(cmake_dir ${INSTALL_LIBDIR}/cmake/posbias)
# The public headers, as the source tree has them, plus the generated one.
file(GLOB public_headers RELATIVE ${POSBIAS_SOURCE_DIR}/include
     ${POSBIAS_SOURCE_DIR}/include/posbias/*.h)
list(APPEND public_headers posbias/version.h)
if(TORCH_HEADER)
  list(APPEND public_headers ${TORCH_HEADER})
endif()
list(TRANSFORM public_headers PREPEND ${INSTALL_INCLUDEDIR}/)
set(expected
  ${public_headers}
  ${INSTALL_LIBDIR}/${LIB_FILE_NAME}
  ${INSTALL_LIBDIR}/${LIB_LINKER_FILE_NAME}
  ${cmake_dir}/posbias-config.cmake
  ${cmake_dir}/posbias-config-version.cmake
  ${cmake_dir}/posbias-targets.cmake
  ${INSTALL_LIBDIR}/pkgconfig/posbias.pc)
if(LIB_SONAME_FILE_NAME)
  list(APPEND expected ${INSTALL_LIBDIR}/${LIB_SONAME_FILE_NAME})
endif()
if(CLI_FILE_NAME)
  list(APPEND expected ${INSTALL_BINDIR}/${CLI_FILE_NAME})
endif()
if(BENCH_FILE_NAME)  # posbias-bench, which `posbias bench` runs
  list(APPEND expected ${INSTALL_BINDIR}/${BENCH_FILE_NAME})
endif()
list(REMOVE_DUPLICATES expected)

file(GLOB_RECURSE installed RELATIVE ${prefix} LIST_DIRECTORIES false
     ${prefix}/*)
list(SORT installed)
list(JOIN installed "\n  " installed_text)
message(STATUS "[packaging] installed files:\n  ${installed_text}")
set(problems "")
foreach(file IN LISTS expected)
  if(NOT file IN_LIST installed)
    list(APPEND problems "missing: ${file}")
  endif()
endforeach()
if(NOT installed MATCHES "(^|;)${cmake_dir}/posbias-targets-[^;/]+\\.cmake(;|$)")
  list(APPEND problems
    "missing: ${cmake_dir}/posbias-targets-<config>.cmake")
endif()
foreach(file IN LISTS installed)
  # Only the public headers (and the generated version.h) are installed:
  # never src/ or src/kernels/ headers, templates or test helpers.
  if(file MATCHES "^${INSTALL_INCLUDEDIR}/" AND NOT file IN_LIST expected)
    list(APPEND problems "unexpected header: ${file}")
  endif()
  # Our build-only libraries (the benchmark suite) and test frameworks stay
  # in the build tree.
  if(file MATCHES "bench|gtest|gmock|benchmark" AND NOT file IN_LIST expected)
    list(APPEND problems "unexpected file: ${file}")
  endif()
endforeach()
if(problems)
  list(JOIN problems "\n  " problems)
  posbias_pkg_fail("the installed tree is wrong:\n  ${problems}")
endif()

# 2. find_package(posbias) from a consumer project.
posbias_pkg_configure_args(configure_args)
posbias_pkg_step("configure find_package_consumer against ${prefix}"
  COMMAND ${CMAKE_COMMAND} -S ${consumer_source} -B ${consumer_build}
          ${configure_args}
          "-DCMAKE_PREFIX_PATH=${prefix}"
          -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
          "-DPOSBIAS_EXPECTED_DIR=${prefix}/${cmake_dir}"
          "-DPOSBIAS_EXPECTED_VERSION=${POSBIAS_VERSION}")
posbias_pkg_step("build find_package_consumer"
  COMMAND ${CMAKE_COMMAND} --build ${consumer_build} ${config_args})
posbias_pkg_step("run find_package_consumer"
  COMMAND ${CMAKE_CTEST_COMMAND} --test-dir ${consumer_build} ${config_args}
          --output-on-failure --no-tests=error)

# 3. pkg-config.
if(NOT PKG_CONFIG_EXECUTABLE)
  # ctest marks the test as skipped on this line (SKIP_REGULAR_EXPRESSION).
  message(STATUS "[packaging] SKIPPED the pkg-config check: pkg-config was "
                 "not found (scripts/setup-debian.sh installs it)")
  return()
endif()
if(DEFINED ENV{PKG_CONFIG_PATH} AND NOT "$ENV{PKG_CONFIG_PATH}" STREQUAL "")
  set(ENV{PKG_CONFIG_PATH} "${prefix}/${INSTALL_LIBDIR}/pkgconfig:$ENV{PKG_CONFIG_PATH}")
else()
  set(ENV{PKG_CONFIG_PATH} "${prefix}/${INSTALL_LIBDIR}/pkgconfig")
endif()
posbias_pkg_step("pkg-config finds posbias in the prefix"
  OUTPUT_VARIABLE pcfiledir
  COMMAND ${PKG_CONFIG_EXECUTABLE} --variable=pcfiledir posbias)
file(REAL_PATH "${pcfiledir}" pcfiledir)
file(REAL_PATH "${prefix}/${INSTALL_LIBDIR}/pkgconfig" expected_pcfiledir)
if(NOT pcfiledir STREQUAL expected_pcfiledir)
  posbias_pkg_fail("pkg-config found posbias.pc in ${pcfiledir}, expected "
                   "${expected_pcfiledir}")
endif()
posbias_pkg_step("pkg-config --modversion posbias"
  OUTPUT_VARIABLE modversion
  COMMAND ${PKG_CONFIG_EXECUTABLE} --modversion posbias)
if(NOT modversion STREQUAL POSBIAS_VERSION)
  posbias_pkg_fail("pkg-config says version '${modversion}', the build is "
                   "${POSBIAS_VERSION}")
endif()
posbias_pkg_step("pkg-config --cflags posbias" OUTPUT_VARIABLE cflags
  COMMAND ${PKG_CONFIG_EXECUTABLE} --cflags posbias)
posbias_pkg_step("pkg-config --libs posbias" OUTPUT_VARIABLE libs
  COMMAND ${PKG_CONFIG_EXECUTABLE} --libs posbias)
posbias_pkg_step("pkg-config --variable=libdir posbias" OUTPUT_VARIABLE libdir
  COMMAND ${PKG_CONFIG_EXECUTABLE} --variable=libdir posbias)
message(STATUS "[packaging] pkg-config: ${cflags} ${libs}")
separate_arguments(cflags UNIX_COMMAND "${cflags}")
separate_arguments(libs UNIX_COMMAND "${libs}")
separate_arguments(user_cxx_flags UNIX_COMMAND "${CXX_FLAGS}")
separate_arguments(user_linker_flags UNIX_COMMAND "${LINKER_FLAGS}")
# A user of pkg-config chooses the language standard (posbias needs C++17);
# the RPATH lets the program find a shared libposbias at run time.
set(pkg_config_program ${WORK_DIR}/pkg_config_consumer)
posbias_pkg_step("compile and link main.cc with pkg-config's flags"
  COMMAND ${CXX_COMPILER} -std=c++17 ${user_cxx_flags} ${cflags}
          ${consumer_source}/main.cc -o ${pkg_config_program}
          ${user_linker_flags} ${libs} "-Wl,-rpath,${libdir}")
posbias_pkg_step("run the pkg-config consumer"
  COMMAND ${pkg_config_program})
message(STATUS "[packaging] find_package and pkg-config consumers passed")
