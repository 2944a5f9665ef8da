"""Builds the posbias Python package: setuptools for the package, CMake for
its op library (see pyproject.toml for the pip command lines).

The build step configures this repository with CMake (only the core and the
LibTorch front end: no tests, tool, benchmarks or examples) against the torch
of the running interpreter, builds the target posbias_torch_ops and puts
libposbias_torch_ops.so inside the package, beside __init__.py, where
posbias/_library.py finds it without any environment variable.

Environment (all optional):
  POSBIAS_PIP_BUILD_DIR  setuptools' build directory (default build-pip/ in the
                         repository; the CMake tree is its cmake/ folder, so a
                         second pip install rebuilds only what changed)
  CMAKE_BUILD_PARALLEL_LEVEL  parallel jobs of the CMake build (default: CPUs)
  CMAKE_CXX_COMPILER_LAUNCHER  e.g. ccache (default: ccache when on PATH)
  POSBIAS_CMAKE_ARGS     extra arguments for the CMake configure step
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_BASE = os.path.abspath(os.environ.get("POSBIAS_PIP_BUILD_DIR") or
                             os.path.join(HERE, "build-pip"))
OPS_TARGET = "posbias_torch_ops"
OPS_FILE = "libposbias_torch_ops.so"


def cmake_version():
    """The one version: project(posbias VERSION x.y.z) in CMakeLists.txt."""
    with open(os.path.join(HERE, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*posbias\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise RuntimeError("setup.py: no `project(posbias VERSION ...)` in CMakeLists.txt")
    return m.group(1)


class CMakeOpLibrary(Extension):
    """The op library, built by CMake (no sources for setuptools to compile)."""

    def __init__(self):
        super().__init__("posbias._ops", sources=[])


class BuildWithCMake(build_ext):
    def run(self):
        cmake = shutil.which("cmake")
        if cmake is None:
            raise RuntimeError("posbias: building the op library needs CMake (>= 3.16) on PATH")
        try:
            import torch.utils
        except ImportError as e:
            raise RuntimeError("posbias: building the op library needs torch importable by "
                               f"{sys.executable} (pip: --no-build-isolation): {e}") from e
        build_dir = os.path.join(BUILD_BASE, "cmake")
        args = [
            "-S", HERE, "-B", build_dir,
            "-DCMAKE_BUILD_TYPE=Release",
            "-DPOSBIAS_BUILD_TORCH=ON",
            "-DPOSBIAS_BUILD_TESTS=OFF", "-DPOSBIAS_BUILD_CLI=OFF",
            "-DPOSBIAS_BUILD_BENCHMARKS=OFF", "-DPOSBIAS_BUILD_EXAMPLES=OFF",
            "-DPOSBIAS_INSTALL=OFF", "-DBUILD_SHARED_LIBS=OFF",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPOSBIAS_PYTHON={sys.executable}",
        ]
        launcher = os.environ.get("CMAKE_CXX_COMPILER_LAUNCHER") or shutil.which("ccache")
        if launcher:
            args.append(f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}")
        args += shlex.split(os.environ.get("POSBIAS_CMAKE_ARGS", ""))
        subprocess.run([cmake] + args, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run([cmake, "--build", build_dir, "--target", OPS_TARGET,
                        "--parallel", jobs], check=True)
        built = os.path.join(build_dir, "torch", OPS_FILE)
        if not os.path.isfile(built):
            raise RuntimeError(f"posbias: CMake built no {built}: is libtorch-dev (LibTorch's "
                               "CMake files) installed? The configure output says.")
        dest_dirs = [os.path.join(self.build_lib, "posbias")]
        if self.inplace:  # pip install -e / build_ext --inplace
            dest_dirs = [os.path.join(HERE, "python", "posbias")]
        for d in dest_dirs:
            os.makedirs(d, exist_ok=True)
            self.copy_file(built, os.path.join(d, OPS_FILE))

    def get_outputs(self):
        return [os.path.join(self.build_lib, "posbias", OPS_FILE)]


os.makedirs(BUILD_BASE, exist_ok=True)
setup(
    version=cmake_version(),
    ext_modules=[CMakeOpLibrary()],
    cmdclass={"build_ext": BuildWithCMake},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
