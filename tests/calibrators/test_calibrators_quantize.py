"""quantize_static with histocal's calibrators, through ``patch_onnxruntime()`` and
``histocal.quantize_static``: the same quantized models as onnxruntime's own.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.quantization import QuantFormat, QuantType
from onnxruntime.quantization import calibrate as oc
from support import models
from support.calibrator_runs import (
    DIST,
    ENT,
    MM,
    ORT_CREATE,
    ORT_QUANTIZE,
    PCT,
    OnceReader,
    RewindReader,
    StridedReader,
    assert_tensors_same,
    chunks_for,
    flat,
    ranges,
    run_ort,
)
from support.parity import quiet

import histocal


def _quantize_ort(path, out, feeds, method, extra=None, **kw):
    with quiet():
        ORT_QUANTIZE.quantize_static(
            path, out.as_posix(), RewindReader(feeds), calibrate_method=method, extra_options=dict(extra or {}), **kw
        )
    return out.read_bytes()


def assert_models_same(a: bytes, b: bytes, where: str):
    if a == b:
        return
    ma, mb = onnx.load_from_string(a), onnx.load_from_string(b)
    inits_a = {t.name: onnx.numpy_helper.to_array(t) for t in ma.graph.initializer}
    inits_b = {t.name: onnx.numpy_helper.to_array(t) for t in mb.graph.initializer}
    assert set(inits_a) == set(inits_b), f"{where}: initializer names differ"
    for n in inits_a:
        assert inits_a[n].dtype == inits_b[n].dtype and np.array_equal(inits_a[n], inits_b[n]), f"{where}: {n}"
    assert [str(n) for n in ma.graph.node] == [str(n) for n in mb.graph.node], f"{where}: nodes differ"
    raise AssertionError(f"{where}: same initializers and nodes, but the model bytes differ")


QS_CASES = [
    ("cnn", MM, {}),
    ("cnn", ENT, {}),
    ("cnn", PCT, {}),
    ("cnn", PCT, {"CalibTensorRangeSymmetric": False, "CalibPercentile": 99.9}),
    ("cnn", DIST, {}),
    ("transformer", MM, {"CalibMovingAverage": True, "CalibMovingAverageConstant": 0.2}),
    ("transformer", ENT, {}),
    ("transformer", PCT, {}),
    ("transformer", DIST, {}),
]


@pytest.mark.parity
@pytest.mark.parametrize("model,method,extra", QS_CASES, ids=lambda v: getattr(v, "name", None) or str(v))
def test_quantize_static_patched_and_unpatched(paths, tmp_path, model, method, extra):
    feeds = flat(chunks_for(model, 1))
    plain = _quantize_ort(paths[model], tmp_path / "ort.onnx", feeds, method, extra)
    assert ORT_QUANTIZE.create_calibrator is ORT_CREATE
    with histocal.patch_onnxruntime():
        assert histocal.is_patched()
        assert ORT_QUANTIZE.create_calibrator.__wrapped__ is histocal.create_calibrator
        patched = _quantize_ort(paths[model], tmp_path / "patched.onnx", feeds, method, extra)
    assert not histocal.is_patched()
    assert ORT_QUANTIZE.create_calibrator is ORT_CREATE and oc.create_calibrator is ORT_CREATE
    assert_models_same(plain, patched, "patched")
    with quiet():
        histocal.quantize_static(
            paths[model],
            (tmp_path / "hc.onnx").as_posix(),
            RewindReader(feeds),
            calibrate_method=method,
            extra_options=dict(extra),
        )
    assert_models_same(plain, (tmp_path / "hc.onnx").read_bytes(), "histocal.quantize_static")
    # A list (auto mode -> exact) gives the same model too.
    with quiet():
        histocal.quantize_static(
            paths[model], (tmp_path / "list.onnx").as_posix(), feeds, calibrate_method=method, extra_options=dict(extra)
        )
    assert_models_same(plain, (tmp_path / "list.onnx").read_bytes(), "histocal.quantize_static(list)")
    # A reader without rewind: auto mode keeps the outputs within the memory budget and gives
    # ORT's model too, as does mode="exact".
    with quiet():
        histocal.quantize_static(
            paths[model],
            (tmp_path / "once.onnx").as_posix(),
            OnceReader(feeds),
            calibrate_method=method,
            extra_options=dict(extra),
        )
        histocal.quantize_static(
            paths[model],
            (tmp_path / "once_exact.onnx").as_posix(),
            OnceReader(feeds),
            calibrate_method=method,
            extra_options=dict(extra),
            mode="exact",
        )
    assert_models_same(plain, (tmp_path / "once_exact.onnx").read_bytes(), "histocal.quantize_static(once, exact)")
    assert_models_same(plain, (tmp_path / "once.onnx").read_bytes(), "histocal.quantize_static(once)")
    # Over the budget (here 0), auto mode is streaming: a valid model, not necessarily ORT's.
    with quiet():
        histocal.quantize_static(
            paths[model],
            (tmp_path / "stream.onnx").as_posix(),
            OnceReader(feeds),
            calibrate_method=method,
            extra_options=dict(extra),
            memory_budget=0,
        )
    streamed = onnx.load((tmp_path / "stream.onnx").as_posix())
    onnx.checker.check_model(streamed)
    ort.InferenceSession(streamed.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds[0])


@pytest.mark.parity
def test_patch_without_context_manager_and_nesting(paths, tmp_path):
    feeds = flat(chunks_for("cnn", 1))
    p = histocal.patch_onnxruntime()
    try:
        assert ORT_QUANTIZE.create_calibrator.__wrapped__ is histocal.create_calibrator
        with histocal.patch_onnxruntime():
            assert histocal.is_patched()
        assert ORT_QUANTIZE.create_calibrator.__wrapped__ is histocal.create_calibrator, "inner exit must not unpatch"
        cal = oc.create_calibrator(paths["cnn"], None, (tmp_path / "a.onnx").as_posix(), ENT)
        assert isinstance(cal, histocal.EntropyCalibrater)
    finally:
        histocal.unpatch_onnxruntime()
    assert not histocal.is_patched()
    assert ORT_QUANTIZE.create_calibrator is ORT_CREATE and oc.create_calibrator is ORT_CREATE
    histocal.unpatch_onnxruntime()  # extra call is harmless
    assert ORT_QUANTIZE.create_calibrator is ORT_CREATE
    del p
    # Restored on an exception inside the block too.
    with pytest.raises(RuntimeError), histocal.patch_onnxruntime():
        raise RuntimeError
    assert ORT_QUANTIZE.create_calibrator is ORT_CREATE
    plain = _quantize_ort(paths["cnn"], tmp_path / "o.onnx", feeds, MM)
    assert plain == _quantize_ort(paths["cnn"], tmp_path / "o2.onnx", feeds, MM)


def test_quantize_static_strided_and_options(paths, tmp_path):
    """CalibStridedMinMax (several collect_data calls) and QOperator/uint8 give ORT's model."""
    feeds = models.cnn_feeds(6, seed=9)
    for method, extra, kw in (
        (MM, {"CalibStridedMinMax": 2}, {}),
        (PCT, {"CalibStridedMinMax": 3}, {}),
        (MM, {}, dict(quant_format=QuantFormat.QOperator, activation_type=QuantType.QUInt8, per_channel=True)),
    ):
        plain = ORT_QUANTIZE.quantize_static
        with quiet():
            plain(
                paths["cnn"],
                (tmp_path / "o.onnx").as_posix(),
                StridedReader(feeds),
                calibrate_method=method,
                extra_options=dict(extra),
                **kw,
            )
            with histocal.patch_onnxruntime():
                plain(
                    paths["cnn"],
                    (tmp_path / "p.onnx").as_posix(),
                    StridedReader(feeds),
                    calibrate_method=method,
                    extra_options=dict(extra),
                    **kw,
                )
            histocal.quantize_static(
                paths["cnn"],
                (tmp_path / "h.onnx").as_posix(),
                StridedReader(feeds),
                calibrate_method=method,
                extra_options=dict(extra),
                **kw,
            )
        ref = (tmp_path / "o.onnx").read_bytes()
        assert_models_same(ref, (tmp_path / "p.onnx").read_bytes(), f"{method.name} {extra} patched")
        assert_models_same(ref, (tmp_path / "h.onnx").read_bytes(), f"{method.name} {extra} histocal")


@pytest.mark.parity
def test_quantize_static_histogram_options(paths, tmp_path):
    """num_bins / num_quantized_bins (which ORT's quantize_static cannot pass) take effect: the
    model equals ORT's quantize_static fed with ranges from ORT's calibrator with those options."""
    feeds = flat(chunks_for("cnn", 1))
    opts = {"num_bins": 2048, "num_quantized_bins": 128}
    ref = run_ort(paths["cnn"], ENT, opts, [feeds], tmp_path / "o.onnx", ["Add"])
    default = run_ort(paths["cnn"], ENT, {}, [feeds], tmp_path / "d.onnx", ["Add"])
    assert ranges(ref.td) != ranges(default.td), "the options must change the ranges for this test to mean anything"
    with quiet():
        ours = histocal.calibrate(paths["cnn"], RewindReader(feeds), ENT, ["Add"], **opts)
    assert_tensors_same(ref.td, ours, "calibrate(num_bins=2048)", ref)
    cache = tmp_path / "ranges.json"
    oc.save_tensors_data(ref.td, cache)
    with quiet():
        ORT_QUANTIZE.quantize_static(
            paths["cnn"],
            (tmp_path / "ort.onnx").as_posix(),
            None,
            op_types_to_quantize=["Add"],
            calibrate_method=ENT,
            calibration_cache_path=cache,
        )
        histocal.quantize_static(
            paths["cnn"],
            (tmp_path / "hc.onnx").as_posix(),
            RewindReader(feeds),
            op_types_to_quantize=["Add"],
            calibrate_method=ENT,
            **opts,
        )
        histocal.quantize_static(
            paths["cnn"],
            (tmp_path / "hc_default.onnx").as_posix(),
            RewindReader(feeds),
            op_types_to_quantize=["Add"],
            calibrate_method=ENT,
        )
    assert_models_same((tmp_path / "ort.onnx").read_bytes(), (tmp_path / "hc.onnx").read_bytes(), "num_bins")
    assert (tmp_path / "hc.onnx").read_bytes() != (tmp_path / "hc_default.onnx").read_bytes()
    # Distribution p3 through histocal.quantize_static's scenario argument.
    with quiet():
        p3 = histocal.calibrate(paths["cnn"], RewindReader(feeds), DIST, scenario="p3")
    assert_tensors_same(run_ort(paths["cnn"], DIST, {"scenario": "p3"}, [feeds], tmp_path / "p3.onnx").td, p3, "p3")


@pytest.mark.parametrize("name", ["minmax", "entropy", "Percentile", "distribution"])
def test_quantize_static_takes_ort_methods_by_name(paths, tmp_path, name):
    """A method named by string is ORT's method: the same model as ORT's with its enum (ORT's cache
    check compares the enum, so the name must not reach it)."""
    method = {"minmax": MM, "entropy": ENT, "percentile": PCT, "distribution": DIST}[name.lower()]
    feeds = flat(chunks_for("cnn", 1))
    plain = _quantize_ort(paths["cnn"], tmp_path / "ort.onnx", feeds, method)
    with quiet():
        histocal.quantize_static(paths["cnn"], (tmp_path / "hc.onnx").as_posix(), feeds, calibrate_method=name)
    assert_models_same(plain, (tmp_path / "hc.onnx").read_bytes(), f"calibrate_method={name!r}")
