"""Fixtures shared by the test files, and the hypothesis profile (support/profiles.py) selected
with ``HYPOTHESIS_PROFILE=<name>``.

The helpers are the package tests/support (``from support import parity``; pyproject.toml puts
tests/ on the import path). tests/README.md says which folder a test file belongs in.
"""

from __future__ import annotations

import onnx
import pytest
from support import profiles
from support.calibrator_runs import BUILDERS

from histocal.calibrators import budget

profiles.load()


@pytest.fixture(autouse=True, scope="session")
def hold_for_free():
    """The memory budget alone decides which outputs exact mode keeps, as if holding them cost
    nothing: otherwise whether a batch is read once or twice follows timings of the machine the
    tests run on (a loaded CI machine read a callable twice within the budget). Outputs kept or
    read again give the same result; tests of the cost model set their own cost."""
    saved, budget._hold_seconds_per_byte = budget._hold_seconds_per_byte, 0.0
    yield
    budget._hold_seconds_per_byte = saved


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Model name -> path of the saved calibrator test models (calibrator_runs.BUILDERS)."""
    d = tmp_path_factory.mktemp("models")
    out = {}
    for name, build in BUILDERS.items():
        p = d / f"{name}.onnx"
        onnx.save(build(), p.as_posix())
        out[name] = p.as_posix()
    return out
