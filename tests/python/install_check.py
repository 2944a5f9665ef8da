"""ctest python.install: `cmake --install <build> --prefix <scratch> --component
python`, then import the installed package in a fresh interpreter without
POSBIAS_TORCH_OPS and check that it loaded the library beside itself and that
an op works.

Usage: install_check.py CMAKE BUILD_DIR PYTHON_INSTALL_DIR SCRATCH_PREFIX"""
import os
import shutil
import subprocess
import sys


def main():
    cmake, build, pydir, prefix = sys.argv[1:5]
    shutil.rmtree(prefix, ignore_errors=True)
    subprocess.run([cmake, "--install", build, "--prefix", prefix, "--component", "python"],
                   check=True, stdout=subprocess.DEVNULL)
    site = pydir if os.path.isabs(pydir) else os.path.join(prefix, pydir)
    pkg = os.path.join(site, "posbias")
    libs = [f for f in os.listdir(pkg) if f.startswith("libposbias_torch_ops")]
    assert libs, f"no op library installed in {pkg}: {os.listdir(pkg)}"
    env = {k: v for k, v in os.environ.items()
           if k not in ("POSBIAS_TORCH_OPS", "PYTHONPATH")}
    env["PYTHONPATH"] = site
    code = ("import posbias, os, sys; "
            "assert os.path.dirname(posbias.library_path) == os.path.dirname(posbias.__file__), "
            "posbias.library_path; "
            "print(posbias.__file__, posbias.library_path); "
            "print(posbias.AlibiPositionalBias(4, 8)(2, 3).shape)")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=prefix, timeout=120)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, "the installed package does not import"
    assert pkg in r.stdout, f"imported from somewhere else than {pkg}"
    assert "torch.Size([8, 2, 3])" in r.stdout
    print("ok")


if __name__ == "__main__":
    main()
