#!/usr/bin/env bash
# Sets up a Debian 12 machine and runs every test, as CI does (.ci/run):
#
#   bash scripts/test.sh
#
#  1. Release build with warnings as errors; ctest (unit tests, the CLI and
#     golden checks, the packaging tests).
#  2. A build under AddressSanitizer and UndefinedBehaviorSanitizer; ctest
#     again (all but the add_subdirectory packaging test, see below).
# Exits non-zero on the first failure.
#
# Environment: BUILD_DIR (default: build) and ASAN_BUILD_DIR (default:
# build-asan), both under the repository unless absolute, reused when they
# exist; JOBS (parallel jobs, default 2: the machines have 2 cores);
# SKIP_SETUP=1 to skip the package check; SKIP_SANITIZERS=1 to stop after 1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir="${BUILD_DIR:-build}"
asan_build_dir="${ASAN_BUILD_DIR:-build-asan}"
jobs="${JOBS:-2}"
start=$SECONDS
stage="setup"

elapsed() {
  local s=$((SECONDS - start))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}
on_exit() {
  local status=$?
  if ((status != 0)); then
    echo "test.sh: FAILED during: $stage (exit status $status, after $(elapsed))" >&2
  fi
}
trap on_exit EXIT
section() {
  stage="$1"
  echo
  echo "==== $1 ($(elapsed))"
}

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  bash scripts/setup-debian.sh
fi

section "Release build, warnings as errors"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DPOSBIAS_WERROR=ON \
  -DPOSBIAS_SANITIZE=
cmake --build "$build_dir" --parallel "$jobs"

section "ctest (Release)"
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error -j "$jobs"

if [[ "${SKIP_SANITIZERS:-0}" == 1 ]]; then
  echo "test.sh: all passed (sanitizer run skipped) in $(elapsed)"
  exit 0
fi

# The sanitizer build: Debug (-O0 -g), so that internal assertions are
# checked. Measured on the 2-core machine: it builds in about half the time
# of -O1 (the Highway kernels and the test files dominate) and its tests run
# no slower in total. Warnings are the Release build's job (optimisation
# levels change what GCC warns about). The benchmark programs are not tests
# and are left out.
section "AddressSanitizer + UndefinedBehaviorSanitizer build"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:check_initialization_order=1:strict_init_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
cmake -S . -B "$asan_build_dir" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-g -DPOSBIAS_WERROR=OFF \
  -DPOSBIAS_SANITIZE=address,undefined -DPOSBIAS_BUILD_BENCHMARKS=OFF \
  -DPOSBIAS_BUILD_TORCH=OFF
cmake --build "$asan_build_dir" --parallel "$jobs"

# Every test but posbias.packaging.add_subdirectory: it compiles the library
# once more (instrumented, minutes on 2 cores) only to re-check CMake logic
# that the Release run has just checked; the library code it runs is what
# the unit tests run here. The find_package packaging test stays: it is
# quick and checks that an instrumented install links into a consumer.
section "ctest (AddressSanitizer + UndefinedBehaviorSanitizer)"
ctest --test-dir "$asan_build_dir" --output-on-failure --no-tests=error \
  -j "$jobs" -E '^posbias\.packaging\.add_subdirectory$'

stage="done"
echo "test.sh: all passed in $(elapsed)"
