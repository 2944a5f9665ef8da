#!/usr/bin/env bash
# Installs the Debian 12 packages that building and testing posbias need.
#
#   sudo bash scripts/setup-debian.sh      (or as root, as CI runs it)
#
# Idempotent and quick to repeat: when every package is already installed it
# runs no apt-get at all, so scripts/demo.sh and scripts/test.sh call it every
# time. Nothing else is downloaded, by this script or by the build.
set -euo pipefail

packages=(
  build-essential     # g++ (its libgomp is our OpenMP) and make
  cmake
  pkg-config          # the packaging test checks posbias.pc
  git
  libhwy-dev          # Highway: vectorised kernels with run-time dispatch
  nlohmann-json3-dev  # JSON output of the CLI, the golden reference file
  libcli11-dev        # the CLI's arguments
  libgtest-dev        # unit tests
  libbenchmark-dev    # Google Benchmark programs
  libopenblas-dev     # GEMM for attention baselines
  libpng-dev          # PNG heatmaps (posbias ... --plot FILE.png)
  libtorch-dev        # the LibTorch front end (posbias::torch, the ops)
  python3-torch       # the Python package and its tests (/usr/bin/python3)
  python3-pytest      # the Python tests, run by ctest
  python3-matplotlib  # the DynamicPositionBias seed example "Inspecting the Bias" (examples/python)
  clang               # libFuzzer harnesses (-fsanitize=fuzzer)
  libclang-rt-dev     # clang's sanitizer and libFuzzer runtimes
  libomp-dev          # clang's OpenMP (omp.h, libomp) for the fuzz build; not pulled in by clang
  doxygen             # the API reference and its completeness test
  vim-runtime         # the English corpus of the extrapolation example
)

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "setup-debian: not a Debian system (no dpkg-query); install the" \
       "equivalents of these by hand: ${packages[*]}" >&2
  exit 0
fi

missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)"
  if [[ "$status" != installed ]]; then
    missing+=("$package")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup-debian: all ${#packages[@]} packages are installed"
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "setup-debian: missing packages (${missing[*]}); run this script as" \
         "root to install them" >&2
    exit 1
  fi
  sudo=(sudo)
fi
echo "setup-debian: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
