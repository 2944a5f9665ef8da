"""pytest setup for the posbias Python package tests.

ctest runs these with PYTHONPATH=<repo>/python, POSBIAS_TORCH_OPS=<the built op
library> and POSBIAS_REQUIRE_OPS=1: there a missing or unloadable library is an
error. Run by hand without the library, every test is skipped with the reason."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
for p in (HERE, os.path.join(REPO, "python")):
    if p not in sys.path:
        sys.path.insert(0, p)

IMPORT_ERROR = None
try:
    import posbias  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the build
    if os.environ.get("POSBIAS_REQUIRE_OPS") == "1":
        raise
    IMPORT_ERROR = str(e)


def pytest_collection_modifyitems(config, items):
    if IMPORT_ERROR:
        mark = pytest.mark.skip(reason=f"posbias op library not available: {IMPORT_ERROR}")
        for item in items:
            item.add_marker(mark)


def golden_path():
    """The golden vectors: the repository copy (kept identical to
    ../shared/golden by a test elsewhere)."""
    return os.environ.get("POSBIAS_GOLDEN", os.path.join(REPO, "tests", "data", "golden",
                                                         "golden.json"))
