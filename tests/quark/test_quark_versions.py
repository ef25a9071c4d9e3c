"""histocal.quark (Quark 0.13) and histocal.quark.v0_9 (Quark 0.9): what each version does, as
read in Quark's source (0.9's ``quark/onnx/calibrate.py``, 0.13's ``quark/onnx/calibration/``),
checked against onnxruntime's calibrators fed per batch or per call. No Quark needed; the live
comparison with Quark 0.9 itself is tests/quark/test_quark09_live.py."""

from __future__ import annotations

import enum
import inspect

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization.calibrate import CalibrationMethod
from onnxruntime.quantization.quant_utils import QuantType
from support import models
from support.calibrator_runs import DIST, ENT, MM, PCT, RewindReader, assert_tensors_same, run_ort

import histocal
from histocal import quark
from histocal.quark import v0_9

FEEDS = models.cnn_feeds(5, batch=2, seed=3)
DEFAULTS = {ENT: {"num_bins": 128}, PCT: {"num_bins": 2048, "symmetric": True}, DIST: {"num_bins": 2048}, MM: {}}

# Quark 0.9's positional parameters (quark/onnx/calibrate.py), in order
SIGNATURES_0_9 = {
    "create_calibrator_float_scale": [
        "model_input",
        "op_types_to_calibrate",
        "augmented_model_path",
        "calibrate_method",
        "use_external_data_format",
        "execution_providers",
        "extra_options",
    ],
    "create_calibrator_power_of_two": [
        "model_input",
        "op_types_to_calibrate",
        "augmented_model_path",
        "activation_type",
        "method",
        "use_external_data_format",
        "execution_providers",
        "quantized_tensor_type",
        "extra_options",
    ],
    "PowOfTwoCalibrater": [
        "model_input",
        "op_types_to_calibrate",
        "augmented_model_path",
        "use_external_data_format",
        "activation_type",
        "method",
        "symmetric",
        "minmse_mode",
        "percentile",
        "quantized_tensor_type",
    ],
    "PowOfTwoCollector": [
        "activation_type",
        "method",
        "symmetric",
        "minmse_mode",
        "percentile",
        "quantized_tensor_type",
    ],
    "MinMaxCalibrater": [
        "model_input",
        "op_types_to_calibrate",
        "augmented_model_path",
        "symmetric",
        "use_external_data_format",
        "moving_average",
        "averaging_constant",
    ],
    "EntropyCalibrater": [
        "model_input",
        "op_types_to_calibrate",
        "augmented_model_path",
        "use_external_data_format",
        "method",
        "symmetric",
        "num_bins",
        "num_quantized_bins",
    ],
    "PercentileCalibrater": [
        "model_input",
        "op_types_to_calibrate",
        "augmented_model_path",
        "use_external_data_format",
        "method",
        "symmetric",
        "num_bins",
        "percentile",
    ],
    "DistributionCalibrater": [
        "model_input",
        "op_types_to_calibrate",
        "augmented_model_path",
        "use_external_data_format",
        "method",
        "num_bins",
        "scenario",
    ],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES_0_9))
def test_v0_9_signatures_are_quark_0_9s(name):
    params = [p for p in inspect.signature(getattr(v0_9, name)).parameters.values() if p.name != "self"]
    positional = [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == SIGNATURES_0_9[name]


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("versions") / "cnn.onnx"
    onnx.save(models.cnn(), path)
    return str(path)


def _f(x):
    return float(np.ravel(x)[0])


def _collect(cal, feeds=FEEDS):
    cal.collect_data(RewindReader(feeds))
    return cal.compute_data()


# ---------------------------------------------------------------------------------------------
# MergePerBatch, per method and version: per batch is onnxruntime fed one batch per call, per
# call onnxruntime fed the call's batches at once
# ---------------------------------------------------------------------------------------------

# (module, method): whether the version adds the histograms' batches one at a time by default
PER_BATCH = {
    (quark, ENT): True,
    (quark, PCT): True,
    (quark, DIST): True,
    (v0_9, ENT): False,
    (v0_9, PCT): True,  # Quark 0.9's PercentileCalibrater has its own per-batch collect_data
    (v0_9, DIST): False,
}


@pytest.mark.parity
@pytest.mark.parametrize("module, method", list(PER_BATCH), ids=lambda v: getattr(v, "__name__", str(v)))
@pytest.mark.parametrize("merge", [None, True, False])
def test_merge_per_batch_for_every_histogram_method(cnn_path, tmp_path, module, method, merge):
    extra = {} if merge is None else {"MergePerBatch": merge}
    per_batch = PER_BATCH[(module, method)] if merge is None else merge
    cal = module.create_calibrator_float_scale(cnn_path, calibrate_method=method, extra_options=extra)
    ours = _collect(cal)
    chunks = [[f] for f in FEEDS] if per_batch else [FEEDS]
    if method == PCT:  # histocal's percentile merge between calls (docs/deviations.md): its own calls
        own = histocal.PercentileCalibrater(cnn_path, symmetric=True, num_bins=2048)
        own.augment_graph()
        own.create_inference_session()
        for chunk in chunks:
            own.collect_data(chunk)
        assert_tensors_same(own.compute_data(), ours, f"{module.__name__} percentile")
        return
    ort = run_ort(cnn_path, method, DEFAULTS[method], chunks, tmp_path / "aug.onnx")
    assert_tensors_same(ort.td, ours, f"{module.__name__} {method}", ort_run=ort)


@pytest.mark.parity
@pytest.mark.parametrize("module", [quark, v0_9], ids=lambda m: m.__name__)
@pytest.mark.parametrize("extra", [{}, {"symmetric": True, "moving_average": True}])
def test_minmax_ignores_merge_per_batch(cnn_path, tmp_path, module, extra):
    """MinMax (and NonOverflow, its symmetric form) reduces each batch in the graph and folds a
    call's batches at once in either version; MergePerBatch is not read."""
    results = [
        _collect(module.create_calibrator_float_scale(cnn_path, calibrate_method=MM, extra_options={**extra, **m}))
        for m in ({}, {"MergePerBatch": True}, {"MergePerBatch": False})
    ]
    ort = run_ort(cnn_path, MM, extra, [FEEDS], tmp_path / "aug.onnx")
    for td in results:
        assert_tensors_same(ort.td, td, "minmax")


@pytest.mark.parametrize(
    "make",
    [
        lambda p, e: v0_9.create_calibrator_power_of_two(p, method="MinMSE", extra_options=e),
        lambda p, e: quark.create_calibrator_power_of_two(p, method="MinMSE", extra_options={"num_bins": 0, **e}),
        lambda p, e: quark.create_calibrator_power_of_two(p, method="MinMSE", extra_options=e),
        lambda p, e: quark.create_calibrator_power_of_two(
            p, method="MinMSE", extra_options={"minmse_mode": "MostCommon", **e}
        ),
    ],
)
def test_power_of_two_ignores_merge_per_batch(cnn_path, make):
    """Power of two has its own rule (MinMSE All on the values: all batches at once; the histogram
    MinMSE and MostCommon: batch by batch, in both versions); MergePerBatch is not read."""
    ranges = []
    for e in ({}, {"MergePerBatch": False}, {"MergePerBatch": True}):
        cal = make(cnn_path, e)
        cal.collect_data(RewindReader(FEEDS))
        ranges.append({k: (float(v[0]), float(v[1])) for k, v in cal.compute_range().items()})
    assert ranges[0] == ranges[1] == ranges[2] and ranges[0]


@pytest.mark.parity
@settings(max_examples=12, deadline=None)
@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=4), seed=st.integers(0, 2**16))
def test_v0_9_entropy_is_onnxruntimes_per_call(tmp_path_factory, sizes, seed):
    """Any split of the batches into collect_data calls: Quark 0.9's Entropy is onnxruntime's
    calibrator given the same calls."""
    path = tmp_path_factory.mktemp("hyp") / "cnn.onnx"
    onnx.save(models.cnn(), path)
    feeds = models.cnn_feeds(sum(sizes), batch=2, seed=seed)
    chunks, i = [], 0
    for s in sizes:
        chunks.append(feeds[i : i + s])
        i += s
    cal = v0_9.create_calibrator_float_scale(str(path), calibrate_method=ENT)
    for c in chunks:
        cal.collect_data(RewindReader(c))
    ort = run_ort(str(path), ENT, {"num_bins": 128}, chunks, path.parent / "aug.onnx")
    assert_tensors_same(ort.td, cal.compute_data(), "entropy", ort_run=ort)


# ---------------------------------------------------------------------------------------------
# Tensors with no elements, and non-finite extremes in MinMax
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def empty_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("versions") / "empty.onnx"
    onnx.save(models.empty_slice(), path)
    return str(path)


EMPTY_FEEDS = models.vector_feeds(4, batch=3, width=4, seed=1)


@pytest.mark.parametrize(
    "module, pow2, expected",
    [
        (quark, False, (0.0, 0.0)),  # Quark 0.13 sanitizes the first batch's ReduceMin/Max (inf -> 0)
        (quark, True, (0.0, 0.0)),
        (v0_9, False, (np.inf, -np.inf)),  # onnxruntime's, as Quark 0.9 (checked live)
        (v0_9, True, (-np.inf, np.inf)),
    ],
)
def test_empty_tensors_minmax_and_non_overflow(empty_path, module, pow2, expected):
    if pow2:
        cal = module.create_calibrator_power_of_two(empty_path)
    else:
        cal = module.create_calibrator_float_scale(empty_path, calibrate_method=MM)
    td = _collect(cal, EMPTY_FEEDS)
    for name in ("empty", "e"):
        low, high = td.data[name].range_value
        assert (_f(low), _f(high)) == expected, name
    assert np.isfinite(_f(td.data["X"].range_value[1]))


def test_quark_013_minmax_zeroes_a_non_finite_extreme_of_each_calls_first_batch(cnn_path):
    """Quark 0.13 sanitizes only the first buffered batch of a call: an infinity there counts as
    0, a later batch's stays; Quark 0.9 (onnxruntime) keeps it."""
    first = {"X": FEEDS[0]["X"].copy()}
    first["X"][0, 0, 0, 0] = np.inf
    feeds = [first, *FEEDS[1:]]
    finite_max = max(float(f["X"].max()) for f in FEEDS[1:])
    r13 = _collect(quark.create_calibrator_float_scale(cnn_path, calibrate_method=MM), feeds).data["X"]
    r09 = _collect(v0_9.create_calibrator_float_scale(cnn_path, calibrate_method=MM), feeds).data["X"]
    assert _f(r13.range_value[1]) == finite_max and _f(r09.range_value[1]) == np.inf
    late = _collect(quark.create_calibrator_float_scale(cnn_path, calibrate_method=MM), [*FEEDS[1:], first])
    assert _f(late.data["X"].range_value[1]) == np.inf


# ---------------------------------------------------------------------------------------------
# Quark 0.9's power of two: MinMSE on the values, its activation-type rules, its positional calls
# ---------------------------------------------------------------------------------------------


class ExtendedQuantType(enum.Enum):  # the shape of Quark's own enum
    QInt8 = 1
    QUInt8 = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5


def _collector_values_ranges(cnn_path, qtype, symmetric=True):
    cal = quark.create_calibrator_power_of_two(
        cnn_path, None, None, qtype, "MinMSE", extra_options={"num_bins": 0, "symmetric": symmetric}
    )
    cal.collect_data(RewindReader(FEEDS))
    return {k: (float(v[0]), float(v[1])) for k, v in cal.compute_range().items()}


@pytest.mark.parametrize(
    "given_type, as_type",
    [
        (QuantType.QInt8, QuantType.QInt8),
        (ExtendedQuantType.QInt16, QuantType.QInt16),
        (QuantType.QInt16, QuantType.QInt8),  # not in Quark 0.9's list (enum identity): int8
        (ExtendedQuantType.QUInt8, QuantType.QInt8),  # not in the list either
        (ExtendedQuantType.QInt4, QuantType.QInt8),
    ],
    ids=str,
)
def test_v0_9_min_mse_is_on_the_values_with_0_9s_types(cnn_path, given_type, as_type):
    cal = v0_9.create_calibrator_power_of_two(
        cnn_path,
        None,
        None,
        given_type,
        "MinMSE",
        extra_options={"num_bins": 2048},  # num_bins: not read
    )
    cal.collect_data(RewindReader(FEEDS))
    got = {k: (float(v[0]), float(v[1])) for k, v in cal.compute_range().items()}
    assert got == _collector_values_ranges(cnn_path, as_type)


def test_v0_9_asymmetric_min_mse_all_works(cnn_path):
    cal = v0_9.create_calibrator_power_of_two(cnn_path, method="MinMSE", extra_options={"symmetric": False})
    cal.collect_data(RewindReader(FEEDS))
    got = {k: (float(v[0]), float(v[1])) for k, v in cal.compute_range().items()}
    assert got == _collector_values_ranges(cnn_path, QuantType.QInt8, symmetric=False)
    with pytest.raises(ValueError, match="num_bins=0"):  # Quark 0.13's default refuses it
        quark.create_calibrator_power_of_two(cnn_path, method="MinMSE", extra_options={"symmetric": False})


def test_v0_9_collector_types():
    """Quark 0.9's PowOfTwoCollector takes the activation type as given (onnxruntime's QInt16 is
    int16 here, unlike the factory); a quantized_tensor_type entry outside its list is ignored."""
    c = v0_9.PowOfTwoCollector(QuantType.QInt16, "MinMSE", True, "All", 99.999, {"a": QuantType.QInt16})
    assert c.num_bins == 0 and c.activation_qtype == "int16"
    c = v0_9.PowOfTwoCollector(quantized_tensor_type={"a": QuantType.QInt16, "b": ExtendedQuantType.QInt16})
    assert (c.tensor_qtype("a"), c.tensor_qtype("b"), c.tensor_qtype("z")) == ("int8", "int16", "int8")
    with pytest.raises(ValueError):
        v0_9.PowOfTwoCollector(ExtendedQuantType.QInt4)


def test_v0_9_positional_calls(cnn_path):
    cal = v0_9.create_calibrator_float_scale(cnn_path, None, None, CalibrationMethod.Entropy)
    assert isinstance(cal, v0_9.EntropyCalibrater) and not cal.merge_per_batch
    with pytest.raises(TypeError, match="4th argument"):  # the same call on Quark 0.13's API
        quark.create_calibrator_float_scale(cnn_path, None, None, CalibrationMethod.Entropy)
    cal = v0_9.PowOfTwoCalibrater(cnn_path, None, None, False, QuantType.QInt8, "MinMSE", True, "Percentile", 99.9)
    assert (cal.percentile, cal.num_bins, cal.minmse_mode) == (99.9, 0, "Percentile")
    cal = v0_9.create_calibrator_power_of_two(cnn_path, None, None, QuantType.QInt8, "MinMSE")
    assert isinstance(cal, v0_9.PowOfTwoCalibrater)
    assert isinstance(v0_9.create_calibrator_power_of_two(cnn_path), v0_9.MinMaxCalibrater)


def test_v0_9_power_of_two_keeps_nan_outputs_an_error():
    """Quark 0.9 takes the outputs as they are and fails on NaN; 0.13 replaces it by 0."""
    assert not v0_9.PowOfTwoCalibrater.sanitize_outputs and quark.PowOfTwoCalibrater.sanitize_outputs
    c = v0_9.PowOfTwoCollector()
    with pytest.raises(ValueError, match="NaN"):
        c.collect({"t": [np.array([1.0, np.nan], np.float32)]})
