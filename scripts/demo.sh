#!/usr/bin/env bash
# Sets up a Debian 12 machine, builds posbias (Release) and runs the demo:
#
#   bash scripts/demo.sh
#
# Environment: BUILD_DIR (default: build, under the repository), JOBS
# (parallel compile jobs, default 2), SKIP_SETUP=1 to skip the package check.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build_dir="${BUILD_DIR:-build}"
jobs="${JOBS:-2}"

if [[ "${SKIP_SETUP:-0}" != 1 ]]; then
  bash scripts/setup-debian.sh
fi
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release
# Only the tool: the demo needs neither the tests nor the benchmarks.
cmake --build "$build_dir" --parallel "$jobs" --target posbias_cli
"$build_dir/cli/posbias" demo
