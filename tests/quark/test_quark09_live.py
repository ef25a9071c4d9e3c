"""histocal.quark.v0_9 against AMD Quark 0.9 itself: the same ranges, tensor for tensor, in every
configuration of both factories, on a small CNN, a model with empty tensors and (when cached)
MTCNN's ONet. Quark 0.9 as installed, or its wheel from PyPI loaded without torch
(tests/support/quark09.py)."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.calibrate import CalibrationMethod
from onnxruntime.quantization.quant_utils import QuantType
from support import models, quark09
from support.calibrator_runs import RewindReader

import histocal.quark
from histocal.quark import v0_9

pytestmark = pytest.mark.subprocess  # pip downloads Quark 0.9's wheel when it is not installed


@pytest.fixture(scope="module")
def q09():
    try:
        module = quark09.load()
    except RuntimeError as exc:
        pytest.fail(f"AMD Quark 0.9: {exc}")
    if module is None:
        pytest.fail("AMD Quark 0.9's calibration could not be loaded from its wheel (tests/support/quark09.py)")
    yield module
    quark09.unload()


def _quark_types(q09):
    quant_utils = __import__("quark.onnx.quant_utils", fromlist=["PowerOfTwoMethod"])
    return quant_utils.PowerOfTwoMethod, quant_utils.ExtendedQuantType


def configs(q09):
    pow2, ext = _quark_types(q09)
    mm, ent, pct, dist = (
        CalibrationMethod.MinMax,
        CalibrationMethod.Entropy,
        CalibrationMethod.Percentile,
        CalibrationMethod.Distribution,
    )

    def float_scale(method, extra=None):
        return lambda m, p, a: m.create_calibrator_float_scale(p, None, a, method, extra_options=extra or {})

    def min_mse(qtype, extra=None):
        return lambda m, p, a: m.create_calibrator_power_of_two(
            p, None, a, qtype, pow2.MinMSE if m is q09 else "MinMSE", extra_options=extra or {}
        )

    return {
        "minmax": float_scale(mm),
        "minmax symmetric moving average": float_scale(mm, {"symmetric": True, "moving_average": True}),
        "entropy": float_scale(ent),
        "percentile": float_scale(pct),
        "percentile asymmetric": float_scale(pct, {"symmetric": False}),
        "distribution": float_scale(dist),
        "non-overflow": lambda m, p, a: m.create_calibrator_power_of_two(p, None, a),
        "minmse int8": min_mse(QuantType.QInt8),
        "minmse int16": min_mse(ext.QInt16),
        "minmse onnxruntime QInt16": min_mse(QuantType.QInt16),
        "minmse asymmetric": min_mse(QuantType.QInt8, {"symmetric": False}),
        "minmse most common": min_mse(QuantType.QInt8, {"minmse_mode": "MostCommon"}),
        "minmse percentile": min_mse(QuantType.QInt8, {"minmse_mode": "Percentile"}),
    }


def ranges(cal):
    if hasattr(cal, "collector") and type(cal).__name__ == "PowOfTwoCalibrater":
        found = cal.compute_range()  # Quark 0.9's PowOfTwoCalibrater has no compute_data
    else:
        found = {k: v.range_value for k, v in cal.compute_data().data.items()}
    return {k: (np.asarray(v[0]).ravel().tolist(), np.asarray(v[1]).ravel().tolist()) for k, v in found.items()}


def run(module, make, path, feeds, aug):
    cal = make(module, path, str(aug))
    cal.collect_data(RewindReader(feeds))
    return ranges(cal)


def compare(q09, path, feeds, tmp_path, skip=()):
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for label, make in configs(q09).items():
                if label in skip:
                    continue
                theirs = run(q09, make, path, feeds, tmp_path / "q09.onnx")
                ours = run(v0_9, make, path, feeds, tmp_path / "ours.onnx")
                assert ours == theirs, label
    finally:
        logging.disable(logging.NOTSET)


def test_cnn_every_configuration(q09, tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(models.cnn(), path)
    compare(q09, str(path), models.cnn_feeds(6, batch=2, seed=3), tmp_path)


def test_empty_tensors(q09, tmp_path):
    """MinMax / NonOverflow give onnxruntime's (inf, -inf) / (-inf, inf); Quark 0.9 fails on an
    empty tensor's symmetric Percentile and in MinMSE MostCommon and Percentile modes, and its
    asymmetric Percentile range is inverted (histocal's: docs/deviations.md)."""
    path = tmp_path / "empty.onnx"
    onnx.save(models.empty_slice(), path)
    feeds = models.vector_feeds(4, batch=3, width=4, seed=1)
    broken = ("percentile", "percentile asymmetric", "minmse most common", "minmse percentile")
    compare(q09, str(path), feeds, tmp_path, skip=broken)
    with pytest.raises(ValueError):
        run(q09, configs(q09)["percentile"], str(path), feeds, tmp_path / "a.onnx")
    mm = configs(q09)["minmax"]
    assert run(q09, mm, str(path), feeds, tmp_path / "a.onnx")["e"] == ([np.inf], [-np.inf])
    cal = histocal.quark.create_calibrator_float_scale(str(path), calibrate_method=CalibrationMethod.MinMax)
    cal.collect_data(RewindReader(feeds))
    assert ranges(cal)["e"] == ([0.0], [0.0])  # Quark 0.13's


def test_entropy_differs_from_quark_013s_default(q09, tmp_path):
    """What v0_9 is for: Quark 0.13's per-batch merge (histocal.quark's default) is not 0.9's."""
    path = tmp_path / "cnn.onnx"
    onnx.save(models.cnn(), path)
    feeds = models.cnn_feeds(6, batch=2, seed=3)
    cal = histocal.quark.create_calibrator_float_scale(str(path), calibrate_method=CalibrationMethod.Entropy)
    cal.collect_data(RewindReader(feeds))
    assert ranges(cal) != run(q09, configs(q09)["entropy"], str(path), feeds, tmp_path / "b.onnx")


@pytest.mark.parity
def test_mtcnn_onet_every_configuration(q09, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benches is a package
    from benches.support import real_models

    spec = real_models.MODELS["mtcnn_onet"]
    try:
        path = real_models.prepare(spec, tmp_path)
    except RuntimeError as exc:
        pytest.fail(f"mtcnn_onet: {exc}")
    compare(q09, str(path), spec.feeds(np.random.default_rng(0), 8), tmp_path)
