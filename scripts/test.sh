#!/usr/bin/env bash
# Sets up a Debian 12 machine and runs every test, as CI does (.ci/run):
#
#   bash scripts/test.sh
#
#  1. Release build with warnings as errors; ctest (unit tests, the CLI and
#     golden checks, the packaging tests).
#  2. A build under AddressSanitizer and UndefinedBehaviorSanitizer; ctest
#     again (all but the add_subdirectory packaging test, see below).
#  3. A build under ThreadSanitizer of the concurrency tests alone; run them
#     (ctest -L sanitize).
#  4. The libFuzzer harnesses (fuzz/, clang): each fuzzes for FUZZ_SECONDS
#     from a copy of its committed corpus (fuzz/corpus/<name>).
# Both gcc builds also replay every committed fuzz input (ctest
# posbias.fuzz.*.replay). docs/hardening.md describes the stages and their
# times. Exits non-zero on the first failure.
#
# Environment: BUILD_DIR (default: build), ASAN_BUILD_DIR (build-asan),
# TSAN_BUILD_DIR (build-tsan), FUZZ_BUILD_DIR (build-fuzz), all under the
# repository unless absolute, reused when they exist; JOBS (parallel jobs,
# default 2: the machines have 2 cores); SKIP_SETUP=1 to skip the package
# check; SKIP_SANITIZERS=1 to stop after 1; SKIP_TSAN=1, SKIP_FUZZ=1 to leave
# out stage 3 or 4; FUZZ_SECONDS (default 60) per fuzzer; FUZZ_ARTIFACTS
# (default: $FUZZ_BUILD_DIR/artifacts), where a crashing input is written.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir="${BUILD_DIR:-build}"
asan_build_dir="${ASAN_BUILD_DIR:-build-asan}"
tsan_build_dir="${TSAN_BUILD_DIR:-build-tsan}"
fuzz_build_dir="${FUZZ_BUILD_DIR:-build-fuzz}"
fuzz_seconds="${FUZZ_SECONDS:-60}"
jobs="${JOBS:-2}"
start=$SECONDS
stage="setup"

elapsed() {
  local s=$((SECONDS - start))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}
on_exit() {
  local status=$?
  if [[ -n "${fuzz_tmp:-}" ]]; then rm -rf "$fuzz_tmp"; fi
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
  -DPOSBIAS_SANITIZE= -DPOSBIAS_BUILD_FUZZERS=ON
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
  -DPOSBIAS_BUILD_TORCH=OFF -DPOSBIAS_BUILD_FUZZERS=ON
cmake --build "$asan_build_dir" --parallel "$jobs"

# Every test but posbias.packaging.add_subdirectory: it compiles the library
# once more (instrumented, minutes on 2 cores) only to re-check CMake logic
# that the Release run has just checked; the library code it runs is what
# the unit tests run here. The find_package packaging test stays: it is
# quick and checks that an instrumented install links into a consumer.
section "ctest (AddressSanitizer + UndefinedBehaviorSanitizer)"
ctest --test-dir "$asan_build_dir" --output-on-failure --no-tests=error \
  -j "$jobs" -E '^posbias\.packaging\.add_subdirectory$'

# ThreadSanitizer: only the concurrency tests (tests/unit/*_concurrency_test.cc
# in their own executable, the ctest labelled `sanitize` in this build), at
# -O1 (TSan at -O0 is several times slower to run).
# The threads are the tests' own std::threads. OpenMP inside the library is
# held to one thread: Debian's libgomp is not built with TSan, so TSan cannot
# see its barriers and reports races between a parallel region's threads
# that are not races (false positives); with one OpenMP thread per caller
# there is nothing to misreport, and the races TSan can still find are the
# ones these tests are about (module caches, shared tensors, the kernels'
# per-call state). The OpenMP code itself runs multi-threaded under ASan.
if [[ "${SKIP_TSAN:-0}" != 1 ]]; then
  section "ThreadSanitizer build (concurrency tests)"
  cmake -S . -B "$tsan_build_dir" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DPOSBIAS_WERROR=OFF \
    -DPOSBIAS_SANITIZE=thread -DPOSBIAS_BUILD_BENCHMARKS=OFF \
    -DPOSBIAS_BUILD_TORCH=OFF -DPOSBIAS_BUILD_CLI=OFF -DPOSBIAS_BUILD_EXAMPLES=OFF \
    -DPOSBIAS_INSTALL=OFF
  cmake --build "$tsan_build_dir" --parallel "$jobs" --target posbias_concurrency_tests

  # The test sets OMP_NUM_THREADS=1 itself (tests/unit/CMakeLists.txt).
  section "ThreadSanitizer: concurrency tests"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1${TSAN_OPTIONS:+:$TSAN_OPTIONS}" \
    ctest --test-dir "$tsan_build_dir" -L sanitize --output-on-failure --no-tests=error
fi

# libFuzzer: clang++ with -fsanitize=fuzzer,address,undefined (fuzz/
# CMakeLists.txt). OpenMP: CMake's FindOpenMP gives clang -fopenmp=libomp
# (LLVM's libomp, Debian package libomp-dev), so the fuzzers never mix it
# with gcc's libgomp; Highway is a plain C++ library and links as it is.
# Each fuzzer starts from a copy of the committed corpus (the corpus in the
# repository is not modified); a crash stops the run with the input saved
# under $artifacts and the libFuzzer report on stderr.
# The fuzzers are built for this machine's own instruction set only
# (-march=native with HWY_COMPILE_ONLY_STATIC): a fuzzer runs the best target
# anyway, and compiling every Highway target of the kernels under clang's
# sanitizers took about 33 of the run's 92 minutes on the 2-core machine
# (6 minutes with one target). The other targets are the gcc builds' job:
# their tests run each kernel on every target the machine has.
if [[ "${SKIP_FUZZ:-0}" != 1 ]]; then
  section "libFuzzer build (clang, ASan + UBSan)"
  cmake -S . -B "$fuzz_build_dir" -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS="-DHWY_COMPILE_ONLY_STATIC=1 -march=native" \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DPOSBIAS_WERROR=OFF \
    -DPOSBIAS_SANITIZE=address,undefined -DPOSBIAS_BUILD_FUZZERS=ON \
    -DPOSBIAS_BUILD_TORCH=OFF -DPOSBIAS_BUILD_TESTS=OFF -DPOSBIAS_BUILD_BENCHMARKS=OFF \
    -DPOSBIAS_BUILD_EXAMPLES=OFF -DPOSBIAS_INSTALL=OFF
  cmake --build "$fuzz_build_dir" --parallel "$jobs" --target posbias_fuzz_safetensors \
    posbias_fuzz_golden posbias_fuzz_cli posbias_fuzz_attention posbias_fuzz_kvcache

  artifacts="${FUZZ_ARTIFACTS:-$fuzz_build_dir/artifacts}"
  mkdir -p "$artifacts"
  artifacts="$(cd "$artifacts" && pwd)"
  fuzz_tmp="$(mktemp -d)"  # removed by on_exit
  for name in safetensors golden cli attention kvcache; do
    section "fuzz $name (${fuzz_seconds} s)"
    mkdir -p "$fuzz_tmp/$name"
    cp fuzz/corpus/"$name"/* "$fuzz_tmp/$name"/
    max_len=4096
    [[ "$name" == golden ]] && max_len=16384
    [[ "$name" == cli ]] && max_len=512
    ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
      "$fuzz_build_dir/fuzz/posbias_fuzz_$name" "$fuzz_tmp/$name" \
      -max_total_time="$fuzz_seconds" -timeout=20 -rss_limit_mb=2560 -max_len="$max_len" \
      -artifact_prefix="$artifacts/$name-" -print_final_stats=1 2>"$fuzz_tmp/$name.log" ||
      { tail -n 60 "$fuzz_tmp/$name.log" >&2
        echo "test.sh: fuzzer $name failed; the input is in $artifacts (replay:" \
             "$fuzz_build_dir/fuzz/posbias_fuzz_$name FILE)" >&2
        exit 1; }
    grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb)|^#[0-9]+ *DONE' \
      "$fuzz_tmp/$name.log" || true
  done
fi

stage="done"
echo "test.sh: all passed in $(elapsed)"
