"""The calibration cache tests' shared pieces (tests/io/test_cache*.py): comparing TensorsData
exactly, ORT's own load, the temp files a write may leave, and the small Conv model with its
reader whose ORT calibration results the tests round-trip (fixtures in tests/io/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from onnxruntime.quantization import calibrate as ort
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

from .parity import quiet

METHODS = list(CalibrationMethod)


def canonical(value):
    """Exact, NaN-safe identity of a TensorData attribute: type, dtype, shape and bits."""
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, np.generic):
        return (type(value).__name__, value.tobytes())
    if isinstance(value, float):
        return ("float", np.float64(value).tobytes())
    return (type(value).__name__, value)


def as_map(td: TensorsData) -> dict:
    method = td.calibration_method
    return {
        "method": method if isinstance(method, CalibrationMethod) else ("raw", json.dumps(method)),
        "tensors": {name: [(k, canonical(getattr(d, k))) for k in d._attrs] for name, d in td.items()},
    }


def assert_same(a: TensorsData, b: TensorsData) -> None:
    assert type(a) is TensorsData and type(b) is TensorsData
    assert as_map(a) == as_map(b)


def ort_load(path):
    with quiet():  # ORT warns on overflowing casts
        return ort.load_tensors_data(path)


def temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith((".calibcache_", ".histocal_")))


class Reader(ort.CalibrationDataReader):
    def __init__(self, batches: int = 3):
        rng = np.random.default_rng(1)
        self.batches = iter([{"X": rng.standard_normal((1, 1, 4, 4)).astype(np.float32)} for _ in range(batches)])

    def get_next(self):
        return next(self.batches, None)
