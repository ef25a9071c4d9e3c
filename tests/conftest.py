"""Fixtures shared by the test files, and the hypothesis profile (profiles.py) selected with
``HYPOTHESIS_PROFILE=<name>``.

The helper libraries are plain modules of this directory (pyproject.toml puts it on the import
path): parity.py (collector parity with onnxruntime), calibrator_runs.py (the calibrator
tests' readers and runners), models.py and graphs.py (ONNX models), strategies.py and
method_refs.py.
"""

from __future__ import annotations

import onnx
import profiles
import pytest
from calibrator_runs import BUILDERS

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
