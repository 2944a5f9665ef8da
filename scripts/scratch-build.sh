#!/usr/bin/env bash
# A scratch build of one revision, for timing a change against another build
# (scripts/alternate.py alternates them):
#
#   bash scripts/scratch-build.sh REV DIR [TARGET...]
#
# makes DIR a git worktree of REV (or reuses it: then the worktree's own
# edits are built), configures DIR/build as a Release build without the
# torch front end, tests, fuzzers or examples, and builds TARGET (default:
# posbias-attention-loop and posbias-bench). It compiles the kernels for
# this machine's best Highway target only (HWY_COMPILE_ONLY_STATIC), about
# two minutes on 2 cores where the full build takes 14, with the same code
# generation as that target in the full build: the instruction sets Highway
# enables for it (AVX-512 F/VL/DQ/BW, or AVX2 with FMA, F16C and BMI2) under
# GCC's generic tuning. -march=native also sets -mtune=native, and GCC then
# schedules and folds loads differently: on a Zen 3 the grouped-query decode
# of such a build ran 1.22x as long as the shipped one (its score tile loaded
# 12 vectors per 8 FMAs instead of 6; docs/performance-notes.md, nineteenth
# round). A CPU without AVX2 gets -march=x86-64-v2 (Highway's SSE4 target).
# SCRATCH_ISA=avx2 (or sse4) builds a lesser target than the CPU's best, to
# time the AVX2 code on an AVX-512 machine.
#
# Remove a scratch tree with `git worktree remove --force DIR`.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: bash scripts/scratch-build.sh REV DIR [TARGET...]" >&2
  exit 2
fi
rev="$1"
dir="$2"
shift 2
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(posbias-attention-loop posbias-bench)
fi
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

flags="$(grep -m1 '^flags' /proc/cpuinfo || true)"
has() { [[ " ${flags} " == *" $1 "* ]]; }
want="${SCRATCH_ISA:-best}"
if [[ "${want}" != best && "${want}" != avx2 && "${want}" != sse4 ]]; then
  echo "scratch-build: SCRATCH_ISA is best, avx2 or sse4, not '${want}'" >&2
  exit 2
fi
if [[ "${want}" == best ]] && has avx512f && has avx512vl && has avx512dq && has avx512bw; then
  isa="-march=x86-64-v4 -mpclmul -maes"  # Highway's AVX3
elif [[ "${want}" != sse4 ]] && has avx2 && has fma && has f16c && has bmi2; then
  isa="-march=x86-64-v3 -mpclmul -maes"  # Highway's AVX2
else
  isa="-march=x86-64-v2 -mpclmul -maes"  # Highway's SSE4
fi

if [[ ! -e "${dir}/.git" ]]; then
  git -C "${repo}" worktree add --force --detach "${dir}" "${rev}"
fi
log="${dir}/build-configure.log"
if ! cmake -S "${dir}" -B "${dir}/build" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CXX_FLAGS=-DHWY_COMPILE_ONLY_STATIC=1 ${isa}" \
  -DPOSBIAS_BUILD_TORCH=OFF -DPOSBIAS_BUILD_TESTS=OFF -DPOSBIAS_BUILD_FUZZERS=OFF \
  -DPOSBIAS_BUILD_EXAMPLES=OFF > "${log}" 2>&1; then
  cat "${log}" >&2
  echo "scratch-build: configuring ${dir} failed (log above, also in ${log})" >&2
  exit 1
fi
cmake --build "${dir}/build" --parallel "${JOBS:-2}" --target "${targets[@]}"
echo "scratch-build: ${dir}/build (${rev}, ${isa})"
