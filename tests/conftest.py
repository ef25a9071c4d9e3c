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

profiles.load()


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
