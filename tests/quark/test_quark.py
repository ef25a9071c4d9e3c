"""histocal.quark: AMD Quark's calibration API without Quark: the MinMSE on the values (Quark 0.9's,
0.13's with ``num_bins=0``) and what 0.9 and 0.13 share.

The power-of-two MinMSE is checked against a numpy reference of Quark's definition written here
(quantize_data_pof2s with method MinMSE, on all values at once or per batch); the float-scale
calibrators and NonOverflow against the installed onnxruntime's calibrators. Quark 0.13's own
additions (signatures, histogram MinMSE, per-batch merging, patch_quark): tests/test_quark013.py.
"""

from __future__ import annotations

import enum
import math

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
from onnxruntime.quantization.quant_utils import QuantType
from support import models
from support.calibrator_runs import RewindReader, assert_tensors_same, run_ort

from histocal import quark

# ---------------------------------------------------------------------------------------------
# numpy reference: Quark's power-of-two MinMSE
# ---------------------------------------------------------------------------------------------

FULL = {"int8": (-128, 127, np.int8), "uint8": (0, 255, np.uint8), "int16": (-32768, 32767, np.int16)}
FULL["uint16"] = (0, 65535, np.uint16)
SYMMETRIC = {"int8": (-127, 127), "int16": (-32767, 32767)}


def q_limits(qtype, symmetric):
    lo, hi, dt = FULL[qtype]
    if symmetric and qtype in SYMMETRIC:
        lo, hi = SYMMETRIC[qtype]
    return np.array(lo, dt), np.array(hi, dt)


def position(scale):
    return int(np.rint(-np.log2(min(max(scale, 2.0**-127), 2.0**127))))


def reference_min_mse(x, qtype, symmetric):
    """(low, high) of Quark's MinMSE on all of x: squared errors summed in float64."""
    x = np.ravel(x)
    dt = x.dtype
    qmin, qmax = q_limits(qtype, symmetric)
    rmin = np.array(x.min() if x.size else 0.0, dt)
    rmax = np.array(x.max() if x.size else 0.0, dt)
    rmin, rmax = np.minimum(rmin, np.array(0, dt)), np.maximum(rmax, np.array(0, dt))
    half = np.finfo(np.float32).max / 2  # Quark's stand-in for infinite ends
    rmin = np.full_like(rmin, -half) if rmin < -half else rmin
    rmax = np.full_like(rmax, half) if rmax > half else rmax
    if symmetric:
        a = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -a, a
    s = np.array(np.array(rmax - rmin, np.float64) / (np.float64(qmax) - np.float64(qmin)))
    if s < np.finfo(dt).tiny:
        s, z = np.array(1.0, dt), np.array(0, qmin.dtype)
    else:
        z, s = np.array(np.round(qmin - rmin / s), qmin.dtype), s.astype(dt)
    p = position(s.item())
    s2 = np.array(2.0**-p, dt)
    new_rmin = np.minimum((qmin.astype(np.float32) - z.astype(np.float32)) * s2, np.array(0, dt))
    z = np.array(np.round(qmin - new_rmin / s2), qmin.dtype)
    if symmetric and qtype == "uint8" and z == 127:
        z = np.array(128, qmin.dtype)
    clip_lo, clip_hi = q_limits(qtype, True)
    best, best_err = s2, math.inf
    for i in range(5):
        cand = np.array(2.0 ** -(p + i - 1), dt)
        q = np.clip((x.astype(np.float32) / cand).round() + z, clip_lo, clip_hi).astype(clip_lo.dtype)
        deq = ((q.astype(np.float32) - z.astype(np.float32)) * cand).astype(np.float32)
        err = float(np.sum((deq - x) ** 2, dtype=np.float64))
        if err < best_err:
            best, best_err = cand, err
    low = (qmin.astype(np.float32) - z.astype(np.float32)) * best
    high = (qmax.astype(np.float32) - z.astype(np.float32)) * best
    return low, high, float(best)


def reference_most_common(batches, qtype):
    """Quark's MostCommon (symmetric): each batch's MinMSE scale; the most frequent, smallest on ties."""
    results = [reference_min_mse(b, qtype, True) for b in batches]
    scales = [r[2] for r in results]
    by_scale = {r[2]: r[:2] for r in results}
    u, idx = np.unique(scales, return_inverse=True)
    return by_scale[float(u[np.argmax(np.bincount(idx))])]


def collector_result(batches, qtype, symmetric, mode, dtype=np.float32, calls=1):
    c = quark.PowOfTwoCollector(activation_type=qtype_enum(qtype), symmetric=symmetric, minmse_mode=mode, num_bins=0)
    for part in np.array_split(np.arange(len(batches)), calls):
        c.collect({"t": [batches[i] for i in part]})
    return c.compute_collection_result()["t"]


def qtype_enum(qtype):
    return {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8, "int16": QuantType.QInt16}.get(qtype, "QUInt16")


def assert_range(ours, ref, where):
    for o, r in zip(ours, ref[:2]):
        assert np.asarray(o).dtype == np.float32, where
        assert np.array_equal(np.asarray(o), np.asarray(r)), f"{where}: {ours} != {ref[:2]}"


# Values spread over many magnitudes, with zeros, repeats, and all of one sign or both.
magnitude = st.sampled_from([1e-3, 0.1, 1.0, 3.7, 100.0, 4096.0])
values = st.lists(
    st.one_of(st.floats(-1, 1, width=32), st.sampled_from([0.0, 0.5, -0.5, 1.0, -1.0])), min_size=0, max_size=40
)


def _scaled(t):
    scale, lists, both_signs = t
    return [(np.array(v, np.float64) * scale if both_signs else np.abs(v) * scale).astype(np.float32) for v in lists]


batches_st = st.tuples(magnitude, st.lists(values, min_size=1, max_size=5), st.booleans()).map(_scaled)
QTYPES = ("int8", "uint8", "int16", "uint16")


@settings(max_examples=150, deadline=None)
@given(batches_st, st.sampled_from(QTYPES), st.booleans(), st.integers(1, 3))
def test_min_mse_all_matches_reference(batches, qtype, symmetric, calls):
    ours = collector_result(batches, qtype, symmetric, "All", calls=calls)
    assert_range(ours, reference_min_mse(np.concatenate(batches), qtype, symmetric), f"{qtype} sym={symmetric}")


@settings(max_examples=100, deadline=None)
@given(batches_st, st.sampled_from(("int8", "uint8", "int16")))
def test_min_mse_most_common_matches_reference(batches, qtype):
    ours = collector_result(batches, qtype, True, "MostCommon")
    assert_range(ours, reference_most_common(batches, qtype), qtype)


@settings(max_examples=40, deadline=None)
@given(batches_st, st.sampled_from(("int8", "int16")))
def test_min_mse_float16_values(batches, qtype):
    batches = [b.astype(np.float16) for b in batches]
    ours = collector_result(batches, qtype, True, "All")
    assert_range(ours, reference_min_mse(np.concatenate(batches), qtype, True), qtype)


def reference_percentile_mode(x, qtype, symmetric, percentile):
    """Quark's Percentile mode: MinMSE on the values within the percentile."""
    if symmetric:
        hi = np.percentile(np.abs(x), percentile)
        lo = -hi
    else:
        lo, hi = np.percentile(x, (100 - percentile) / 2), np.percentile(x, 100 - (100 - percentile) / 2)
    return reference_min_mse(x[(x >= lo) & (x <= hi)], qtype, symmetric)


@settings(max_examples=60, deadline=None)
@given(batches_st, st.sampled_from(QTYPES), st.booleans(), st.sampled_from([50.0, 99.0, 99.999, 100.0]))
def test_min_mse_percentile_mode_matches_reference(batches, qtype, symmetric, percentile):
    c = quark.PowOfTwoCollector(qtype_enum(qtype), symmetric=symmetric, minmse_mode="Percentile", percentile=percentile)
    c.collect({"t": batches})
    x = np.concatenate(batches)
    ref = (
        reference_percentile_mode(x, qtype, symmetric, percentile) if x.size else reference_min_mse(x, qtype, symmetric)
    )
    assert_range(c.compute_collection_result()["t"], ref, f"{qtype} {percentile}")


def test_min_mse_asymmetric_most_common_is_all():
    rng = np.random.default_rng(3)
    batches = [rng.normal(1, 2, 50).astype(np.float32) for _ in range(4)]
    ours = collector_result(batches, "int8", False, "MostCommon")
    assert_range(ours, reference_min_mse(np.concatenate(batches), "int8", False), "asym")


def test_most_common_votes_and_ties():
    # two batches at scale 2^-7 (max 1), two at 2^-5 (max 4): a tie, the smaller scale wins
    b = [np.linspace(-1, 1, 64, dtype=np.float32), np.linspace(-4, 4, 64, dtype=np.float32)]
    ours = collector_result([b[0], b[1], b[1], b[0]], "int8", True, "MostCommon")
    ref = reference_most_common([b[0], b[1], b[1], b[0]], "int8")
    assert_range(ours, ref, "tie")
    assert float(ours[1]) == min(reference_min_mse(x, "int8", True)[1] for x in b)


def test_nearest_power_of_two_not_ceiling():
    """Quark's position rounds -log2(scale) to the nearest integer: max |x| = 1 gives scale 2^-7,
    whose int8 range (±127/128) clips 1 slightly (NonOverflow's name notwithstanding)."""
    x = np.linspace(-1, 1, 1001, dtype=np.float32)
    low, high = collector_result([x], "int8", True, "All")
    assert (float(low), float(high)) == (-127 / 128, 127 / 128)


def test_large_batches_bounded_state():
    """Symmetric All keeps error sums, not values: the state does not grow with the data."""
    rng = np.random.default_rng(0)
    c = quark.PowOfTwoCollector(num_bins=0)
    c.collect({"t": [rng.normal(0, 1, 1000).astype(np.float32)]})
    first = len(c._tensors["t"].errors.sums)
    for _ in range(20):
        c.collect({"t": [rng.normal(0, 1, 1000).astype(np.float32)]})
    assert len(c._tensors["t"].errors.sums) <= first + 4


# ---------------------------------------------------------------------------------------------
# enums and options without Quark
# ---------------------------------------------------------------------------------------------


class FakePowerOfTwoMethod(enum.Enum):  # the shape of Quark's enum
    NonOverflow = 0
    MinMSE = 1


class FakeExtendedQuantType(enum.Enum):  # the shape of Quark's ExtendedQuantType
    QInt8 = 1
    QUInt8 = 2
    QInt16 = 3
    QUInt16 = 4
    QInt32 = 7


@pytest.mark.parametrize("method", [FakePowerOfTwoMethod.MinMSE, quark.PowerOfTwoMethod.MinMSE, "MinMSE"])
@pytest.mark.parametrize("qtype", [FakeExtendedQuantType.QInt16, QuantType.QInt16, "QInt16"])
def test_enums_by_value_or_name(method, qtype):
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    c = quark.PowOfTwoCollector(activation_type=qtype, method=method, num_bins=0)
    c.collect({"t": x})
    assert_range(c.compute_collection_result()["t"], reference_min_mse(x, "int16", True), "int16")


def test_quantized_tensor_type_per_tensor():
    x = np.linspace(-3, 3, 100, dtype=np.float32)
    c = quark.PowOfTwoCollector(num_bins=0, quantized_tensor_type={"b": FakeExtendedQuantType.QInt16, "c": "QFloat16"})
    c.collect({"a": [x], "b": [x], "c": [x]})
    out = c.compute_collection_result()
    assert_range(out["a"], reference_min_mse(x, "int8", True), "a")
    assert_range(out["b"], reference_min_mse(x, "int16", True), "b")
    assert_range(out["c"], reference_min_mse(x, "int8", True), "c")  # not a calibration type: ignored


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "Ceil"}, "method must be"),
        ({"activation_type": FakeExtendedQuantType.QInt32}, "not supported"),
        ({"activation_type": 8}, "activation type must be"),
        ({"num_bins": 2.5}, "num_bins must be an integer"),
        ({"symmetric": False}, "supports only symmetric"),
        ({"minmse_mode": "Median"}, "minmse_mode must be"),
    ],
)
def test_bad_options_are_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        quark.PowOfTwoCollector(**kwargs)


def test_non_overflow_collector_refuses_like_quark():
    c = quark.PowOfTwoCollector(method=FakePowerOfTwoMethod.NonOverflow)
    c.collect({"t": np.ones(3, np.float32)})
    with pytest.raises(ValueError, match="Only 'MinMSE'"):
        c.compute_collection_result()
    with pytest.raises(ValueError, match="has not been collected"):
        quark.PowOfTwoCollector().compute_collection_result()


def test_nan_is_an_error_naming_the_tensor_and_keeps_earlier_batches():
    c = quark.PowOfTwoCollector(num_bins=0)
    x = np.linspace(-2, 2, 50, dtype=np.float32)
    c.collect({"t": [x]})
    with pytest.raises(ValueError, match="'t'.*NaN"):
        c.collect({"t": [x * 10, np.array([np.nan], np.float32)]})
    assert_range(c.compute_collection_result()["t"], reference_min_mse(x, "int8", True), "kept")
    with pytest.raises(ValueError, match="'u'.*int32"):
        c.collect({"u": [np.arange(3, dtype=np.int32)]})


COLLECTOR_MODES = [
    dict(minmse_mode="All", num_bins=0),
    dict(minmse_mode="All", num_bins=0, symmetric=False),
    dict(minmse_mode="All", num_bins=64),
    dict(minmse_mode="MostCommon", num_bins=0),
    dict(minmse_mode="Percentile", num_bins=0),
]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(batches_st, min_size=2, max_size=4),
    st.sampled_from(COLLECTOR_MODES),
    st.sampled_from(("int8", "int16")),
    st.integers(0, 3),
)
def test_a_failed_call_leaves_every_tensor_as_before(tensors, options, qtype, bad_at):
    """A call that fails on one tensor, after others were added to (or created), leaves the
    collection as if the call had not been made: every tensor's result, and no new tensor."""
    items = [(f"t{i}", [b * 3 for b in batches]) for i, batches in enumerate(tensors)]
    failing = dict([*items[:bad_at], ("bad", [np.arange(3, dtype=np.int32)]), *items[bad_at:]])
    failing["new"] = [np.ones(4, np.float32)]
    kept = quark.PowOfTwoCollector(activation_type=qtype_enum(qtype), **options)
    clean = quark.PowOfTwoCollector(activation_type=qtype_enum(qtype), **options)
    for c in (kept, clean):
        c.collect({f"t{i}": batches for i, batches in enumerate(tensors)})
    with pytest.raises(ValueError, match="'bad'.*int32"):
        kept.collect(failing)
    with np.errstate(all="ignore"):
        expected, got = clean.compute_collection_result(), kept.compute_collection_result()
    assert set(got) == set(expected)
    for name, ref in expected.items():
        assert_range(got[name], ref, name)
    for c in (kept, clean):  # and both go on the same
        c.collect({"t0": [np.linspace(-5, 5, 9, dtype=np.float32)]})
    with np.errstate(all="ignore"):
        assert_range(kept.compute_collection_result()["t0"], clean.compute_collection_result()["t0"], "after")


def test_infinities_choose_quarks_default_position():
    x = np.array([1.0, np.inf, -2.0], np.float32)
    ours = collector_result([x[:2], x[2:]], "int8", True, "All")
    with np.errstate(invalid="ignore", over="ignore"):
        ref = reference_min_mse(x, "int8", True)
    assert_range(ours, ref, "inf")


# ---------------------------------------------------------------------------------------------
# calibrators on a model
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("quark") / "cnn.onnx"
    onnx.save(models.cnn(), path)
    return str(path)


FEEDS = models.cnn_feeds(5, batch=2, seed=7)


def outputs_of(path, feeds):
    """Every calibrated tensor's value per feed, from histocal's own augmented model."""
    cal = quark.create_calibrator_power_of_two(path, method="MinMSE")
    sess = cal.infer_session
    names = sorted(cal.tensors_to_calibrate)
    return {n: [dict(zip([o.name for o in sess.get_outputs()], sess.run(None, f)))[n] for f in feeds] for n in names}


@pytest.mark.parametrize("mode, symmetric", [("All", True), ("MostCommon", True), ("All", False)])
def test_pow2_calibrater_matches_reference(cnn_path, mode, symmetric):
    cal = quark.create_calibrator_power_of_two(
        cnn_path,
        method=FakePowerOfTwoMethod.MinMSE,
        extra_options={"minmse_mode": mode, "symmetric": symmetric, "num_bins": 0},
    )
    cal.collect_data(RewindReader(FEEDS[:3]))
    cal.collect_data(iter(FEEDS[3:]))  # calls add up
    td = cal.compute_data()
    assert isinstance(td, TensorsData) and td.calibration_method == CalibrationMethod.MinMax
    outs = outputs_of(cnn_path, FEEDS)
    assert set(cal.compute_range()) == set(outs)
    for name, batches in outs.items():
        if mode == "MostCommon":
            ref = reference_most_common(batches, "int8")
        else:
            ref = reference_min_mse(np.concatenate([b.ravel() for b in batches]), "int8", symmetric)
        assert_range(cal.compute_range()[name], ref, name)
        assert float(td.data[name].lowest) == float(ref[0]) and float(td.data[name].highest) == float(ref[1])


def test_pow2_calibrater_failed_call_keeps_earlier(cnn_path):
    cal = quark.create_calibrator_power_of_two(cnn_path, method="MinMSE")
    cal.collect_data(FEEDS[:2])
    before = cal.compute_range()
    bad = dict(FEEDS[2])
    bad["X"] = bad["X"][:, :2]
    with pytest.raises(ValueError):
        cal.collect_data([FEEDS[3], bad])
    after = cal.compute_range()
    assert all(np.array_equal(before[k][1], after[k][1]) for k in before)


def test_unknown_activation_type_becomes_int8_in_the_factory(cnn_path):
    cal = quark.create_calibrator_power_of_two(cnn_path, activation_type="QFloat16", method="MinMSE")
    assert cal.collector is None and quark.PowOfTwoCollector(cal.activation_type).activation_qtype == "int8"


@pytest.mark.parity
def test_non_overflow_is_symmetric_minmax(cnn_path, tmp_path):
    cal = quark.create_calibrator_power_of_two(cnn_path, method=FakePowerOfTwoMethod.NonOverflow)
    assert isinstance(cal, quark.MinMaxCalibrater)
    cal.collect_data(RewindReader(FEEDS))
    ort = run_ort(cnn_path, CalibrationMethod.MinMax, {"symmetric": True}, [FEEDS], tmp_path / "aug.onnx")
    assert_tensors_same(ort.td, cal.compute_data(), "NonOverflow")


FLOAT_CASES = [
    (CalibrationMethod.MinMax, {}, {"symmetric": False}),
    (CalibrationMethod.Entropy, {"num_bins": 256}, {"num_bins": 256, "symmetric": False}),
    ("Percentile", {}, {"symmetric": True}),  # the factory's default, not the class's
    (CalibrationMethod.Distribution, {}, {"num_bins": 2048}),
]


@pytest.mark.parity
@pytest.mark.parametrize("method, extra, ort_extra", FLOAT_CASES, ids=lambda c: str(c))
def test_float_scale_equals_onnxruntime(cnn_path, tmp_path, method, extra, ort_extra):
    # one collect of all the batches, as onnxruntime (Quark 0.13 merges batch by batch)
    options = {**extra, "MergePerBatch": False}
    cal = quark.create_calibrator_float_scale(cnn_path, calibrate_method=method, extra_options=options)
    cal.collect_data(RewindReader(FEEDS))
    ort_method = method if isinstance(method, CalibrationMethod) else CalibrationMethod[method]
    ort = run_ort(cnn_path, ort_method, ort_extra, [FEEDS], tmp_path / "aug.onnx")
    assert_tensors_same(ort.td, cal.compute_data(), str(method), ort_run=ort, nq=extra.get("num_quantized_bins", 128))


def test_float_scale_refuses_layerwise(cnn_path):
    class LayerWiseMethod(enum.Enum):
        LayerWisePercentile = 0

    with pytest.raises(ValueError, match="Unsupported calibration method"):
        quark.create_calibrator_float_scale(cnn_path, calibrate_method=LayerWiseMethod.LayerWisePercentile)


def test_class_defaults_are_quarks(cnn_path):
    assert quark.PercentileCalibrater(cnn_path).symmetric is False
    assert quark.DistributionCalibrater(cnn_path).num_bins == 128
    e = quark.EntropyCalibrater(cnn_path)
    assert (e.num_bins, e.num_quantized_bins, e.symmetric) == (128, 128, False)
    with pytest.raises(ValueError, match="averaging constant"):
        quark.MinMaxCalibrater(cnn_path, moving_average=True, averaging_constant=2)


@pytest.mark.parametrize(
    "batches",
    [
        [np.zeros(5, np.float32), np.zeros(3, np.float32)],  # scale falls back to 1
        [np.array([1e-38, -3e-39], np.float32), np.array([2e-45], np.float32)],  # tiny and subnormal
        [np.array([1e-38], np.float32), np.array([0.5, -0.25], np.float32)],  # a tiny batch, then a normal one
        [np.array([3e38, -1.0], np.float32), np.array([1e37], np.float32)],  # beyond half of float32's largest
        [np.array([], np.float32), np.array([2.0, -3.0], np.float32)],  # an empty batch
    ],
    ids=["zeros", "tiny", "tiny-then-normal", "huge", "empty"],
)
@pytest.mark.parametrize("qtype", ["int8", "uint8", "int16"])
def test_min_mse_extreme_ranges(batches, qtype):
    ours = collector_result(batches, qtype, True, "All")
    with np.errstate(all="ignore"):
        ref = reference_min_mse(np.concatenate(batches), qtype, True)
    assert_range(ours, ref, qtype)
