"""histocal.quark against AMD Quark 0.13 (quark.onnx.calibration): its recorded signatures, its
histogram MinMSE (checked against a numpy transcription of Quark 0.13's arithmetic written here),
its per-batch histogram merging (against onnxruntime's calibrators fed batch by batch), a
ModelProto input, compute_range, and patch_quark (on a stand-in module tree always; on Quark
itself where amd-quark 0.13 is installed)."""

from __future__ import annotations

import enum
import inspect
import json
import logging
import math
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnxruntime.quantization.calibrate import CalibrationMethod
from onnxruntime.quantization.quant_utils import QuantType
from support import models
from support.calibrator_runs import DIST, ENT, PCT, RewindReader, assert_tensors_same, run_ort

import histocal
from histocal import quark

RECORDED = json.loads((Path(__file__).parent / "data" / "quark013_signatures.json").read_text())

# histocal's defaults that differ from Quark 0.13's, on purpose: no augmented model in the current
# folder (a temporary one instead); None for Quark's mutable {} defaults (the same meaning)
DEFAULT_DEVIATIONS = {"augmented_model_path": None, "quantized_tensor_type": None, "extra_options": None}


def _ours(name):
    owner, _, method = name.partition(".")
    obj = getattr(quark, owner)
    return getattr(obj, method) if method else obj


@pytest.mark.parametrize("name", sorted(RECORDED["signatures"]))
def test_signatures_bind_as_quark_013(name):
    """Every parameter of Quark 0.13 in its position, with its name and default; histocal's own
    additions are keyword-only after them."""
    recorded = RECORDED["signatures"][name]
    params = [p for p in inspect.signature(_ours(name)).parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in positional] == [r["name"] for r in recorded]
    assert all(p.kind in (p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params[len(positional) :])
    for p, r in zip(positional, recorded, strict=True):
        if r.get("required"):
            assert p.default is p.empty, p.name
        elif p.name in DEFAULT_DEVIATIONS:
            assert p.default == DEFAULT_DEVIATIONS[p.name], p.name
        elif "enum" in r:
            assert p.default.name == r["enum"], p.name
        else:
            want = r["value"]
            got = list(p.default) if isinstance(p.default, tuple) else p.default
            assert got == want, p.name


# ---------------------------------------------------------------------------------------------
# Quark 0.13's histogram MinMSE: a transcription of its arithmetic (np.histogram with explicit
# edges, as Quark calls it)
# ---------------------------------------------------------------------------------------------

QRANGE = {"int8": (-127, 127, np.int8), "uint8": (0, 255, np.uint8), "int16": (-32767, 32767, np.int16)}


def reference_histogram(batches, num_bins):
    hist = edges = rmin = rmax = None
    for raw in batches:
        data = np.nan_to_num(np.ravel(raw).astype(np.float32), nan=0.0)
        lo_v, hi_v = np.array(data.min(), raw.dtype), np.array(data.max(), raw.dtype)
        if hist is None:
            hist, edges = np.histogram(data.astype(np.float64), bins=num_bins)
            rmin, rmax = lo_v, hi_v
            continue
        lo, hi, width = edges[0], edges[-1], float(edges[1] - edges[0])
        if float(lo_v) < lo or float(hi_v) > hi:
            left = max(0, int(np.ceil((lo - float(lo_v)) / width)))
            right = max(0, int(np.ceil((float(hi_v) - hi) / width)))
            grown = np.zeros(len(hist) + left + right, hist.dtype)
            grown[left : left + len(hist)] = hist
            hist, edges = grown, np.linspace(lo - left * width, hi + right * width, len(grown) + 1)
        hist = hist + np.histogram(data.astype(np.float64), bins=edges)[0]
        rmin, rmax = np.minimum(rmin, lo_v), np.maximum(rmax, hi_v)
    return hist, edges, rmin, rmax


def reference_result(hist, edges, rmin, rmax, qtype):
    qmin, qmax, dt = QRANGE[qtype]
    dt = rmax.dtype
    lo, hi = np.minimum(rmin, np.array(0, dt)), np.maximum(rmax, np.array(0, dt))
    half = np.finfo(np.float32).max / 2
    lo, hi = (np.full_like(lo, -half) if lo < -half else lo), (np.full_like(hi, half) if hi > half else hi)
    a = np.maximum(np.abs(lo), np.abs(hi))
    s = np.array(np.array(a - (-a), np.float64) / np.float64(qmax - qmin))
    s = np.array(1.0, dt) if s < np.finfo(dt).tiny else s.astype(dt)
    zp = 128 if qtype == "uint8" else 0
    pos = int(np.rint(-np.log2(min(max(float(s), 2.0**-127), 2.0**127))))
    centres = ((edges[:-1] + edges[1:]) / 2).astype(np.float32)
    best, best_s = np.inf, np.array(2.0**-pos, np.float32)
    for i in range(5):
        si = np.array(2.0 ** -(pos + i - 1), np.float32)
        with np.errstate(invalid="ignore"):
            q = np.clip(np.round(centres / si).astype(np.int32) + zp, qmin, qmax)
        err = float(np.sum(hist.astype(np.float64) * (centres.astype(np.float64) - (q - zp) * float(si)) ** 2))
        if err < best:
            best, best_s = err, si
    with np.errstate(over="ignore"):  # a float16 tensor's int16 range may pass 65504: inf, as Quark casts it
        return np.array((qmin - zp) * float(best_s), rmin.dtype), np.array((qmax - zp) * float(best_s), rmax.dtype)


finite = st.floats(-1e4, 1e4, allow_nan=False, width=32)
batch = st.lists(finite, min_size=1, max_size=40).map(lambda v: np.array(v, np.float32))


@settings(max_examples=150, deadline=None)
@given(
    batches=st.lists(batch, min_size=1, max_size=5),
    qtype=st.sampled_from(["int8", "int16"]),
    dtype=st.sampled_from([np.float32, np.float16]),
)
def test_histogram_min_mse_is_quark_013s(batches, qtype, dtype):
    batches = [b.astype(dtype) for b in batches]
    num_bins = 64
    c = quark.PowOfTwoCollector(activation_type=qtype.replace("int", "QInt"), num_bins=num_bins)
    try:
        for b in batches:
            c.collect({"t": [b]})
    except ValueError as e:  # a batch far outside the first ones' bins: see the next tests
        assert "num_bins=0" in str(e)
        assume(False)
    low, high = c.compute_collection_result()["t"]
    hist, edges, rmin, rmax = reference_histogram(batches, num_bins)
    kept = c._tensors["t"].histogram
    assert np.array_equal(kept.hist, hist) and np.array_equal(kept.edges(), edges)
    ref = reference_result(hist, edges, rmin, rmax, qtype)
    assert (float(low), float(high)) == (float(ref[0]), float(ref[1]))
    assert low.dtype == ref[0].dtype


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(width=32, allow_infinity=False), max_size=300),
    num_bins=st.integers(1, 5000),
    ends=st.lists(st.floats(-1e30, 1e30), min_size=2, max_size=2, unique=True).map(sorted),
    near=st.booleans(),
)
def test_histogram_counts_kernel_is_numpys_equal_bins(values, num_bins, ends, near):
    """histocal's counting kernel: numpy's equal-bins histogram of the values as float64."""
    from histocal._core import quark_histogram_counts

    x = np.array(values, np.float32)
    if near and np.isfinite(x).any():  # the range of the values themselves, as the collector asks
        lo, hi = float(np.nanmin(x)), float(np.nanmax(x))
        ends = [lo - 0.5, hi + 0.5] if lo == hi else [lo, hi]
    try:
        with np.errstate(invalid="ignore"):
            want = np.histogram(x.astype(np.float64), bins=num_bins, range=tuple(ends))[0]
    except ValueError:  # numpy: "Too many bins for data range" (edges not increasing)
        with pytest.raises(ValueError, match="Too many bins"):
            quark_histogram_counts(x, num_bins, *ends)
        return
    assert np.array_equal(quark_histogram_counts(x, num_bins, *ends), want)


def test_one_collect_calls_arrays_are_one_histogram_update():
    parts = [np.array([0.5, -0.25], np.float32), np.array([[40.0, -3.0]], np.float32)]
    c = quark.PowOfTwoCollector(num_bins=16)
    c.collect({"t": parts})
    h = reference_histogram([np.concatenate([p.ravel() for p in parts])], 16)[0]
    assert np.array_equal(c._tensors["t"].histogram.hist, h)
    with pytest.raises(ValueError, match="'t'.*types"):
        c.collect({"t": [parts[0], parts[0].astype(np.float16)]})


def test_histogram_min_mse_keeps_float32_ranges():
    """Quark 0.13's default (optimize_mem) caches outputs as float16, which turns a batch-norm
    tensor of ±1.3e8 into ±inf; histocal keeps the values' type."""
    x = np.array([-1.3e8, 5.0, 1.3e8], np.float32)
    c = quark.PowOfTwoCollector(optimize_mem=True)
    c.collect({"t": [x]})
    low, high = c.compute_collection_result()["t"]
    assert np.isfinite(high) and float(high) >= 1.3e8 and float(low) == -float(high)


def test_empty_batches_add_nothing_to_the_histogram():
    c = quark.PowOfTwoCollector(num_bins=16)
    c.collect({"t": [np.zeros(0, np.float32), np.array([1.0, -2.0], np.float32)], "e": [np.zeros(0, np.float32)]})
    out = c.compute_collection_result()
    h, e, lo, hi = reference_histogram([np.array([1.0, -2.0], np.float32)], 16)
    assert float(out["t"][1]) == float(reference_result(h, e, lo, hi, "int8")[1])
    assert np.isfinite(float(out["e"][1]))  # Quark 0.9's MinMSE of no values


def test_a_far_outlier_batch_is_a_clear_error():
    c = quark.PowOfTwoCollector(num_bins=2048)
    c.collect({"t": [np.linspace(-1, 1, 100, dtype=np.float32)]})
    with pytest.raises(ValueError, match="'t'.*num_bins=0"):
        c.collect({"t": [np.array([3e38], np.float32)]})
    assert np.isfinite(float(c.compute_collection_result()["t"][1]))  # the failed call left nothing


class QuarkQuantType(enum.Enum):  # the shape of Quark's ExtendedQuantType
    QInt16 = 3
    QBFloat16 = 20


@pytest.mark.parametrize("qtype", [QuantType.QInt16, QuarkQuantType.QInt16, "QInt16"])
def test_qint16_of_either_enum_is_int16(qtype):
    """Quark 0.13 calibrates onnxruntime's QuantType.QInt16 as int16 (0.9: as int8)."""
    assert quark.PowOfTwoCollector(activation_type=qtype).activation_qtype == "int16"


def test_a_type_outside_quarks_list_is_int8_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        c = quark.PowOfTwoCollector(activation_type=QuarkQuantType.QBFloat16)
    assert c.activation_qtype == "int8" and "applying Int8" in caplog.text


# ---------------------------------------------------------------------------------------------
# calibrators on a model
# ---------------------------------------------------------------------------------------------

FEEDS = models.cnn_feeds(5, batch=2, seed=3)


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("quark013") / "cnn.onnx"
    onnx.save(models.cnn(), path)
    return str(path)


@pytest.mark.parity
@pytest.mark.parametrize("method, extra", [(ENT, {}), (DIST, {}), (ENT, {"symmetric": True, "num_bins": 256})])
def test_histograms_merge_batch_by_batch_as_quark_013(cnn_path, tmp_path, method, extra):
    """Quark 0.13 adds each batch to the histograms as it comes: onnxruntime's merge rule between
    batches, as onnxruntime's own calibrator fed one batch per collect_data call."""
    cal = quark.create_calibrator_float_scale(cnn_path, calibrate_method=method, extra_options=extra)
    cal.collect_data(RewindReader(FEEDS))
    opts = {"num_bins": 2048, **extra} if method == DIST else {"num_bins": 128, **extra}
    ort = run_ort(cnn_path, method, opts, [[f] for f in FEEDS], tmp_path / "aug.onnx")
    assert_tensors_same(ort.td, cal.compute_data(), str(method), ort_run=ort)


def test_percentile_merges_batch_by_batch(cnn_path):
    cal = quark.create_calibrator_float_scale(cnn_path, calibrate_method=PCT)
    cal.collect_data(iter(FEEDS))
    own = histocal.PercentileCalibrater(cnn_path, symmetric=True, num_bins=2048)
    own.augment_graph()
    own.create_inference_session()
    for f in FEEDS:
        own.collect_data([f])
    assert_tensors_same(own.compute_data(), cal.compute_data(), "percentile")


def test_a_failed_per_batch_call_leaves_the_earlier_calls(cnn_path):
    cal = quark.create_calibrator_float_scale(cnn_path, calibrate_method=ENT)
    cal.collect_data(FEEDS[:2])
    before = cal.compute_range()
    bad = {"X": FEEDS[3]["X"][:, :2]}
    with pytest.raises(ValueError):
        cal.collect_data([FEEDS[3], bad])
    after = cal.compute_range()
    assert all(np.array_equal(before[k][1], after[k][1]) for k in before)


@pytest.mark.parity
def test_merge_per_batch_false_is_one_collect(cnn_path, tmp_path):
    cal = quark.create_calibrator_float_scale(cnn_path, calibrate_method=ENT, extra_options={"MergePerBatch": False})
    cal.collect_data(FEEDS)
    ort = run_ort(cnn_path, ENT, {}, [FEEDS], tmp_path / "aug.onnx")
    assert_tensors_same(ort.td, cal.compute_data(), "entropy", ort_run=ort)


FACTORIES = [
    lambda m: quark.create_calibrator_power_of_two(m, calibrate_method="MinMSE"),
    lambda m: quark.create_calibrator_power_of_two(m, method="MinMSE", extra_options={"minmse_mode": "MostCommon"}),
    lambda m: quark.create_calibrator_power_of_two(m),
    lambda m: quark.create_calibrator_float_scale(m, calibrate_method="Entropy"),
    lambda m: quark.create_calibrator_float_scale(m, calibrate_method="Percentile"),
    lambda m: quark.create_calibrator_float_scale(m, extra_options={"optimize_mem": False, "worker_num": 4}),
]


@pytest.mark.parametrize("make", FACTORIES)
def test_a_model_proto_gives_the_paths_result_and_compute_range(cnn_path, make):
    """A ModelProto is taken as it is, without shape inference, as Quark does: with its shapes
    inferred, the path's result."""
    results = []
    for model in (cnn_path, onnx.shape_inference.infer_shapes(onnx.load(cnn_path))):
        cal = make(model)
        cal.collect_data(RewindReader(FEEDS))
        results.append(cal.compute_range())
    assert results[0].keys() == results[1].keys() and results[0]
    for name, (low, high) in results[0].items():
        assert np.array_equal(low, results[1][name][0]) and np.array_equal(high, results[1][name][1]), name
        td = cal.compute_data().data[name]
        assert np.array_equal(td.range_value[0], low) and np.array_equal(td.range_value[1], high)


def test_a_model_proto_without_shapes_calibrates_what_has_a_type(cnn_path):
    cal = quark.create_calibrator_float_scale(onnx.load(cnn_path))
    cal.collect_data(FEEDS)
    assert set(cal.compute_range()) == {"X", "Y"}  # Quark 0.13 too: its value_info is the model's


def test_method_alias_and_positional_order(cnn_path):
    cal = quark.create_calibrator_power_of_two(cnn_path, None, None, "QInt8", "MinMSE")
    assert isinstance(cal, quark.PowOfTwoCalibrater) and cal.num_bins == 2048
    assert isinstance(quark.create_calibrator_power_of_two(cnn_path, method="MinMSE"), quark.PowOfTwoCalibrater)
    with pytest.raises(TypeError, match="not both"):
        quark.create_calibrator_power_of_two(cnn_path, calibrate_method="MinMSE", method="NonOverflow")
    with pytest.raises(TypeError, match="4th argument"):
        quark.create_calibrator_float_scale(cnn_path, None, None, CalibrationMethod.Entropy)
    e = quark.EntropyCalibrater(cnn_path, None, None, False, "entropy", False, 128, 128, False, 2)
    assert (e.optimize_mem, e.worker_num) == (False, 2)
    e.augment_graph()
    e.create_inference_session()
    e.collect_data(FEEDS, layer_wise=True)
    assert e.compute_range()


def test_asymmetric_histogram_min_mse_is_refused_with_the_way_out(cnn_path):
    with pytest.raises(ValueError, match="num_bins=0"):
        quark.create_calibrator_power_of_two(cnn_path, method="MinMSE", extra_options={"symmetric": False})
    cal = quark.create_calibrator_power_of_two(
        cnn_path, method="MinMSE", extra_options={"symmetric": False, "num_bins": 0}
    )
    cal.collect_data(FEEDS)
    assert cal.compute_range()


# ---------------------------------------------------------------------------------------------
# patch_quark
# ---------------------------------------------------------------------------------------------

STAND_IN = (
    "quark",
    "quark.onnx",
    "quark.onnx.calibration",
    "quark.onnx.calibration.calibrators",
    "quark.onnx.calibration.calibrate",
    "quark.onnx.calibration.calib_utils",
)


@pytest.fixture
def stand_in_quark(monkeypatch):
    """Quark 0.13's module layout: the factories defined in calibrators and bound by name in
    calibrate, calib_utils, the calibration package and quark.onnx."""

    def power_of_two(*a, **k):
        return "quark pof2"

    def float_scale(*a, **k):
        return "quark float"

    mods = {}
    for name in STAND_IN:
        mods[name] = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, mods[name])
    for name in STAND_IN[2:]:
        mods[name].create_calibrator_power_of_two = power_of_two
        mods[name].create_calibrator_float_scale = float_scale
    mods["quark.onnx"].create_calibrator_float_scale = float_scale
    return mods, power_of_two, float_scale


def test_patch_quark_swaps_every_binding_and_undoes_it(stand_in_quark):
    mods, power_of_two, float_scale = stand_in_quark
    with histocal.patch_quark():
        assert histocal.is_quark_patched()
        with histocal.patch_quark():
            pass
        for name in STAND_IN[2:]:
            assert mods[name].create_calibrator_power_of_two.__wrapped__ is quark.create_calibrator_power_of_two
        assert mods["quark.onnx"].create_calibrator_float_scale.__wrapped__ is quark.create_calibrator_float_scale
    assert not histocal.is_quark_patched()
    for name in STAND_IN[2:]:
        assert mods[name].create_calibrator_power_of_two is power_of_two
        assert mods[name].create_calibrator_float_scale is float_scale
    histocal.patch_quark()
    histocal.unpatch_quark()
    histocal.unpatch_quark()  # one too many: a no-op
    assert mods["quark.onnx"].create_calibrator_float_scale is float_scale


def test_patch_quark_names_bound_while_patched_go_back_to_quarks(stand_in_quark, monkeypatch):
    _mods, power_of_two, float_scale = stand_in_quark
    late = types.ModuleType("quark.onnx.late")  # a quark module (or a client) imported while patched
    monkeypatch.setitem(sys.modules, late.__name__, late)
    with histocal.patch_quark():
        exec("from quark.onnx.calibration.calibrators import *", late.__dict__)
        assert late.create_calibrator_power_of_two.__wrapped__ is quark.create_calibrator_power_of_two
    assert late.create_calibrator_power_of_two() == power_of_two() == "quark pof2"
    assert late.create_calibrator_float_scale() == float_scale() == "quark float"


def test_patch_quark_without_quark_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "quark", None)
    with pytest.raises(ImportError, match="needs AMD Quark 0.13"):
        histocal.patch_quark()
    assert not histocal.is_quark_patched()


def test_patch_quark_on_quark_013(cnn_path, tmp_path, monkeypatch):
    """Quark's own calibrate_model (what ModelQuantizer calls) gives the same ranges patched."""
    monkeypatch.chdir(tmp_path)  # Quark writes quantized_info.csv into the current folder
    calibration = pytest.importorskip("quark.onnx.calibration", reason="amd-quark 0.13 (and torch) not installed")
    from quark.onnx.calibration import PowerOfTwoMethod

    class SizedReader(RewindReader):  # Quark needs len()
        def __len__(self):
            return len(self.feeds)

    def run():
        td = calibration.calibrate_model(
            cnn_path, SizedReader(FEEDS), calibrate_method=PowerOfTwoMethod.MinMSE, calib_extra_options={}
        )
        return {k: (float(v.range_value[0]), float(v.range_value[1])) for k, v in td.data.items()}

    stock = run()
    with histocal.patch_quark():
        calibrate = sys.modules["quark.onnx.calibration.calibrate"]
        assert calibrate.create_calibrator_power_of_two.__wrapped__ is quark.create_calibrator_power_of_two
        patched = run()
    assert patched == stock


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=300),
    qtype=st.sampled_from(["int8", "uint8", "int16"]),
    dtype=st.sampled_from([np.float32, np.float16]),
)
def test_error_sums_kernel_is_numpys_terms(values, qtype, dtype):
    """histocal's one-pass kernel adds the same float32 terms as numpy's per-position arithmetic."""
    from histocal.quark import pof2

    with np.errstate(over="ignore"):
        x = np.array(values, np.float32).astype(dtype)
    assume(np.isfinite(x).all())
    zero_point, pos = pof2.power_of_two(*pof2.data_range(x), qtype, True)
    positions = range(pos - 4, pos + 6)
    ours = pof2.error_sums(x, positions, zero_point, qtype)
    for p in positions:
        scale = pof2.position_to_scale(p, x.dtype)
        if not (np.isfinite(scale) and scale != 0):
            continue
        terms = pof2.squared_errors(x, scale, zero_point, qtype).astype(np.float64)
        assert ours[p] == pytest.approx(math.fsum(terms), rel=1e-12, abs=0), p


def test_nan_counts_as_zero_in_the_histogram_min_mse():
    x = np.array([np.nan, 3.0, -1.0, np.nan], np.float32)
    c = quark.PowOfTwoCollector(num_bins=32)
    c.collect({"t": [x]})
    hist, edges, rmin, rmax = reference_histogram([x], 32)
    assert [float(v) for v in c.compute_collection_result()["t"]] == [
        float(v) for v in reference_result(hist, edges, rmin, rmax, "int8")
    ]


def test_outputs_are_sanitized_as_quark_013s_calibrator_does():
    from histocal.quark.calibrators import sanitized

    x = np.array([np.nan, 1.0, np.inf, -np.inf, -2.0], np.float32)
    (got,) = sanitized("t", [x])
    assert np.array_equal(got, np.array([0.0, 1.0, np.inf, -np.inf, -2.0], np.float32))  # nanmax is inf
    (got,) = sanitized("t", np.array([np.nan, np.inf], np.float32))
    assert np.array_equal(got, np.zeros(2, np.float32))
    y = np.array([1.0, 2.0], np.float16)
    assert sanitized("t", [y])[0] is y


def test_patch_quark_model_quantizer_xint8_scales(cnn_path, tmp_path, monkeypatch):
    """Quark's ModelQuantizer with its power-of-two XINT8 config: the same scales patched."""
    monkeypatch.chdir(tmp_path)  # Quark writes quantized_info.csv into the current folder
    pytest.importorskip("quark.onnx.calibration", reason="amd-quark 0.13 (and torch) not installed")
    import copy

    from onnx import numpy_helper
    from quark.onnx import XINT8_QCONFIG, ModelQuantizer

    class SizedReader(RewindReader):
        def __len__(self):
            return len(self.feeds)

    def scales(out):
        # a copy: Quark 0.13's quantize_model changes the config it is given
        ModelQuantizer(copy.deepcopy(XINT8_QCONFIG)).quantize_model(cnn_path, str(out), SizedReader(FEEDS))
        model = onnx.load(str(out))
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        return {n.input[0]: float(inits[n.input[1]]) for n in model.graph.node if n.op_type == "QuantizeLinear"}

    stock = scales(tmp_path / "stock.onnx")
    with histocal.patch_quark():
        patched = scales(tmp_path / "patched.onnx")
    assert patched == stock and len(stock) > 3
