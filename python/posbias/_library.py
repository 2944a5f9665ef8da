"""Finds and loads the op library (libposbias_torch_ops), which registers the
``torch.ops.posbias`` namespace.

Search order:

1. the environment variable ``POSBIAS_TORCH_OPS``: the path of the library file
   (ctest sets it to the build tree's library);
2. the package directory (where ``cmake --install`` puts the library beside
   ``__init__.py``).

When nothing is found (or loading fails) an ImportError names every place that
was tried.
"""
import glob
import os

import torch

ENV_VAR = "POSBIAS_TORCH_OPS"
_LIBRARY_GLOBS = ("libposbias_torch_ops.so*", "libposbias_torch_ops*.dylib",
                  "posbias_torch_ops*.dll")

library_path = None  # the file that was loaded


def _already_loaded():
    try:
        torch.ops.posbias.alibi_slopes  # noqa: B018 (attribute lookup is the test)
        return True
    except (AttributeError, RuntimeError):
        return False


def load():
    """Loads the op library once; returns its path."""
    global library_path
    if library_path is not None:
        return library_path
    if _already_loaded():  # the library was loaded by hand (torch.ops.load_library)
        library_path = "(already loaded)"
        return library_path
    tried = []
    candidates = []
    env = os.environ.get(ENV_VAR)
    if env:
        tried.append(f"${ENV_VAR}={env}")
        if os.path.isfile(env):
            candidates.append(env)
        else:
            tried[-1] += " (no such file)"
    else:
        tried.append(f"${ENV_VAR} (not set)")
    here = os.path.dirname(os.path.abspath(__file__))
    found_here = []
    for pattern in _LIBRARY_GLOBS:
        found_here.extend(sorted(glob.glob(os.path.join(here, pattern))))
    tried.append(os.path.join(here, "libposbias_torch_ops.so") +
                 ("" if found_here else " (not there)"))
    candidates.extend(found_here)
    errors = []
    for path in candidates:
        try:
            torch.ops.load_library(path)
        except (OSError, RuntimeError) as e:
            errors.append(f"{path}: {e}")
            continue
        if not _already_loaded():
            errors.append(f"{path}: loaded, but it registers no torch.ops.posbias ops")
            continue
        library_path = path
        return path
    msg = ("posbias: cannot load the op library libposbias_torch_ops (build the CMake "
           "target posbias_torch_ops and install it, or set " + ENV_VAR +
           " to the library file). Tried: " + "; ".join(tried))
    if errors:
        msg += ". Errors: " + "; ".join(errors)
    raise ImportError(msg)
