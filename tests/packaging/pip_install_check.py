"""ctest posbias.packaging.pip_install: the README's pip line, then the seed
examples run from the installed package.

1. `python -m pip install --no-build-isolation --no-index --target DIR SRC`
   (no network; the op library built by setup.py through CMake, in
   POSBIAS_PIP_BUILD_DIR = WORK/pip-build, kept between runs so a second run
   only rebuilds what changed; ccache when on PATH);
2. in a fresh interpreter with PYTHONPATH=DIR only (no POSBIAS_TORCH_OPS),
   from DIR: posbias imports from DIR, loads the op library beside its
   __init__.py, has py.typed, and the version of the installed distribution,
   posbias.__version__ (the C++ library's) and CMake's project version are
   one;
3. the seed documents' examples (examples/python/*.py) run from DIR against
   the installed package.

Usage: pip_install_check.py PYTHON SOURCE_DIR CMAKE_VERSION WORK_DIR"""
import os
import shutil
import subprocess
import sys

EXAMPLES = ("alibi_positional_bias", "alibi_bias", "dynamic_position_bias", "custom_attention")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("POSBIAS_TORCH_OPS", "PYTHONPATH", "PYTHONHOME")}
    env.update(extra)
    return env


def main():
    python, source, version, work = sys.argv[1:5]
    target = os.path.join(work, "site")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    env = clean_env(POSBIAS_PIP_BUILD_DIR=os.path.join(work, "pip-build"),
                    CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"),
                    PIP_DISABLE_PIP_VERSION_CHECK="1")
    subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                    "--no-cache-dir", "--target", target, source], check=True, env=env)
    pkg = os.path.join(target, "posbias")
    installed = sorted(os.listdir(pkg))
    assert any(f.startswith("libposbias_torch_ops") for f in installed), installed
    assert "py.typed" in installed, installed
    dist_info = [d for d in os.listdir(target) if d.startswith("posbias-")]
    assert dist_info == [f"posbias-{version}.dist-info"], (dist_info, version)

    run_env = clean_env(PYTHONPATH=target, PYTHONDONTWRITEBYTECODE="1", MPLBACKEND="Agg")
    code = ("import os, importlib.metadata as md, posbias\n"
            "print('file', posbias.__file__)\n"
            "print('library', posbias.library_path)\n"
            "print('version', posbias.__version__, md.version('posbias'))\n"
            "assert os.path.dirname(posbias.library_path) == os.path.dirname(posbias.__file__)\n"
            "print(posbias.AlibiPositionalBias(4, 8)(2, 3).shape)\n")
    r = subprocess.run([python, "-c", code], env=run_env, cwd=target, capture_output=True,
                       text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, "the installed package does not import"
    assert f"file {os.path.join(pkg, '__init__.py')}" in r.stdout, "imported from elsewhere"
    assert f"version {version} {version}\n" in r.stdout, f"versions differ from CMake's {version}"
    assert "torch.Size([8, 2, 3])" in r.stdout

    out_dir = os.path.join(work, "examples-out")
    os.makedirs(out_dir, exist_ok=True)
    for name in EXAMPLES:
        script = os.path.join(source, "examples", "python", name + ".py")
        r = subprocess.run([python, script, out_dir], env=run_env, cwd=target,
                           capture_output=True, text=True, timeout=300)
        print(f"--- {name}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-4000:]}")
        assert r.returncode == 0, f"seed example {name} failed from the installed package"
    print("ok")


if __name__ == "__main__":
    main()
