"""Tensors with nothing to bin: empty, or every value NaN or infinite.

onnxruntime raises on NaN/Inf-only data ("autodetected range of [nan, nan] is not finite") and,
on empty data, gives asymmetric Percentile the inverted range (0.0, -0.5). Where ORT returns a
non-inverted result histocal returns the identical one; otherwise histocal's range is
non-inverted and finite (docs/deviations.md). Either way a warning names the tensor.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector
from support import models
from support.calibrator_runs import RewindReader
from support.parity import assert_result_same, quiet

import histocal
from histocal.collector import HistogramCollector

f32, f16 = np.float32, np.float16

DATA = {
    "all-nan": [np.nan] * 6,
    "all-posinf": [np.inf] * 6,
    "all-neginf": [-np.inf] * 6,
    "both-infs": [np.inf, -np.inf, np.inf],
    "nan-and-inf": [np.nan, np.inf, -np.inf, np.nan],
    "empty": [],
}
CONFIGS = {
    "percentile": dict(method="percentile", symmetric=False, num_bins=2048, percentile=99.999),
    "percentile-sym": dict(method="percentile", symmetric=True, num_bins=2048, percentile=99.999),
    "entropy": dict(method="entropy", symmetric=False, num_bins=128, num_quantized_bins=128),
    "distribution": dict(method="distribution", symmetric=False, num_bins=2048, scenario="same"),
    "distribution-p3": dict(method="distribution", symmetric=False, num_bins=2048, scenario="p3"),
}


def _collector(cls, cfg):
    full = dict(num_quantized_bins=128, percentile=99.999, scenario="same") | cfg
    return cls(
        full["method"],
        full["symmetric"],
        full["num_bins"],
        full["num_quantized_bins"],
        full["percentile"],
        full["scenario"],
    )


def _range(res):
    return tuple(float(v) for v in (res.range_value if hasattr(res, "range_value") else res[:2]))


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize("data", sorted(DATA))
@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_ort_s_result_or_a_non_inverted_one_with_a_warning(key, data, dtype, caplog):
    cfg = CONFIGS[key]
    values = np.array(DATA[data], dtype)
    ort = _collector(OrtCollector, cfg)
    try:
        with quiet():
            ort.collect({"t": [values]})
            ort_res = ort.compute_collection_result()["t"]
    except ValueError as e:
        assert "is not finite" in str(e)  # ORT's np.histogram on NaN/Inf-only data
        ort_res = None
    hc = _collector(HistogramCollector, cfg)
    hc.collect({"t": [values], "ok": [np.array([0.5, -1.0, 2.0], dtype)]})
    with caplog.at_level(logging.WARNING, logger="histocal.collector"):
        ours = hc.compute_collection_result()
    lo, hi = _range(ours["t"])
    assert np.isfinite(lo) and np.isfinite(hi) and lo <= hi, (lo, hi)
    if ort_res is not None and not _range(ort_res)[0] > _range(ort_res)[1]:
        with quiet():
            assert_result_same(cfg, "t", ort_res, ours["t"], ort.histogram_dict["t"], None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'t' (" in warnings[0], warnings
    assert "'ok'" not in warnings[0]
    if data == "all-nan":
        assert "6 NaN" in warnings[0]


def test_asymmetric_percentile_of_nothing_is_not_inverted():
    """The case the review measured: ORT's (0.0, -0.5), now (0.0, 0.0) of ORT's kinds."""
    for values in (np.full(4, np.nan, f32), np.zeros(0, f32)):
        hc = _collector(HistogramCollector, CONFIGS["percentile"])
        hc.collect({"t": values})
        lo, hi, *_ = hc.compute_collection_result()["t"]
        assert (float(lo), float(hi)) == (0.0, 0.0)
        assert isinstance(hi, np.ndarray) and hi.dtype == f32 and hi.shape == ()


@pytest.mark.parametrize("mode", ["exact", "streaming"])
@pytest.mark.parametrize("method", ["Percentile", "Entropy", "Distribution"])
def test_calibrator_names_the_tensors(tmp_path, method, mode, caplog):
    path = tmp_path / "m.onnx"
    onnx.save(models.empty_slice(), path.as_posix())
    options = {"CollectionMode": mode, "symmetric": False}
    if method == "Distribution":
        options.pop("symmetric")
    with quiet():
        cal = histocal.create_calibrator(
            path, augmented_model_path=os.fspath(tmp_path / "aug.onnx"), calibrate_method=method, extra_options=options
        )
        cal.collect_data(RewindReader([{"X": np.full((2, 4), np.nan, f32)}]))
    with caplog.at_level(logging.WARNING, logger="histocal.collector"):
        ranges = cal.compute_data()
    for name, td in ranges.data.items():
        lo, hi = (float(v) for v in td.range_value)
        assert lo <= hi, (name, lo, hi)
    text = " ".join(r.getMessage() for r in caplog.records)
    for name in ("'Y' (8 NaN", "'r' (8 NaN", "'empty' (no values"):
        assert name in text, text
