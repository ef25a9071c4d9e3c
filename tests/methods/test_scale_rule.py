"""histocal follows the installed onnxruntime's scale rule (``histocal.scale_rule``).

onnxruntime 1.32 changed ``compute_scale_zp`` for float16 ranges (the degenerate-scale threshold is
float16's smallest subnormal, tested on the scale rounded to float16, where 1.31 tests the float64
scale against float16's smallest normal). These tests pass under either version: they compare
histocal with the installed onnxruntime's own ``compute_scale_zp``.

* the detected rule is the installed version's;
* ``_core.scale_zero_point`` (what every error estimate and range method uses) equals
  ``compute_scale_zp`` on float16 and float32 ranges, including scales at both versions' float16
  thresholds (hypothesis);
* through the Python layer, a float16 tensor of small values: pow2's range is one onnxruntime
  quantizes with a power-of-two scale, and every method's error estimate is the error of the
  parameters onnxruntime computes from the TensorData histocal returns.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import onnxruntime
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType
from support import method_refs as R
from support.profiles import examples

from histocal import _core, methods
from histocal.methods import scale_rule
from histocal.methods.scale_rule import SCALE_RULE
from histocal.state.auto import ORT_AUTO_CANDIDATES, auto_ranges

QTYPES = ["int8", "uint8", "int16", "uint16"]


def ort_version() -> tuple[int, int]:
    return tuple(int(p) for p in onnxruntime.__version__.split(".")[:2])  # type: ignore[return-value]


def test_detected_rule_is_the_installed_versions():
    assert ("1.32" if ort_version() >= (1, 32) else "1.31") == SCALE_RULE, (onnxruntime.__version__, SCALE_RULE)


def test_unknown_behaviour_falls_back_on_the_version_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(scale_rule, "compute_scale_zp", lambda *a: [np.array(0, np.int8), np.array(0.5, np.float16)])
    with caplog.at_level(logging.WARNING, logger="histocal.methods.scale_rule"):
        assert scale_rule.detect_scale_rule() == SCALE_RULE
    assert "neither known float16 scale rule" in caplog.text


def test_kernels_reject_an_unknown_rule():
    with pytest.raises(ValueError, match="scale_rule"):
        _core.scale_zero_point(0.0, 1.0, scale_rule="1.30")
    with pytest.raises(ValueError, match="dtype"):
        _core.scale_zero_point(0.0, 1.0, scale_rule=SCALE_RULE, dtype="float64")


def ort(low: float, high: float, qtype: str, symmetric: bool, dtype: str) -> tuple[float, int]:
    """onnxruntime's own compute_scale_zp on the range as TensorData holds it (in dtype)."""
    qmin, qmax = get_qmin_qmax_for_qType(R.QTYPES[qtype], reduce_range=False, symmetric=symmetric)
    dt = np.dtype(dtype)
    zp, scale = compute_scale_zp(np.array([low], dt), np.array([high], dt), qmin, qmax, symmetric)
    return float(np.asarray(scale).reshape(-1)[0]), int(np.asarray(zp).reshape(-1)[0])


def histocal(low: float, high: float, qtype: str, symmetric: bool, dtype: str) -> tuple[float, int]:
    r = _core.scale_zero_point(low, high, scale_rule=SCALE_RULE, dtype=dtype, qtype=qtype, symmetric=symmetric)
    return r.scale, r.zero_point


# Scales at the float16 thresholds: 2^-14 (1.31), 2^-25 (1.32: rounds to 0 or to 2^-24) and
# float16 subnormals between them, then normal ones.
F16_SCALES = [2.0**-14, 2.0**-25, 1.5 * 2.0**-25, 2.0**-24, 2.0**-20, 2.0**-15, 2.0**-10, 1.0]


@st.composite
def f16_range(draw, qtype: str, symmetric: bool) -> tuple[float, float]:
    """A float16 range: random float16 values, or one whose scale is near a threshold."""
    if draw(st.booleans()):
        bits = st.integers(0, 0x7BFF)  # finite, non-negative
        low = -float(np.uint16(draw(bits)).view(np.float16)) * draw(st.sampled_from([1, 1, 0]))
        high = float(np.uint16(draw(bits)).view(np.float16)) * draw(st.sampled_from([1, 1, 0, -1]))
        return low, high
    qmin, qmax = R.qrange(qtype, symmetric)
    width = draw(st.sampled_from(F16_SCALES)) * (qmax - qmin)
    width *= draw(st.sampled_from([1.0, 1 - 2**-11, 1 + 2**-11, 1 - 2**-40, 1 + 2**-40]))
    width = min(width, 30000.0)  # within float16, neighbours included
    f = draw(st.sampled_from([0.0, 1.0, 0.5, 0.3]))
    low, high = np.float16(-width * f), np.float16(width * (1 - f))
    for _ in range(draw(st.integers(0, 2))):  # float16 neighbours
        high = np.nextafter(high, np.float16(draw(st.sampled_from([np.inf, -np.inf]))))
    return float(low), float(high)


@pytest.mark.parity
@settings(max_examples=examples(400))
@given(st.data(), st.sampled_from(QTYPES), st.booleans())
def test_float16_scale_and_zero_point_are_orts(data, qtype, symmetric):
    low, high = data.draw(f16_range(qtype, symmetric))
    assert histocal(low, high, qtype, symmetric, "float16") == ort(low, high, qtype, symmetric, "float16"), (
        low,
        high,
        qtype,
        symmetric,
        SCALE_RULE,
    )


@pytest.mark.parity
@settings(max_examples=examples(300))
@given(st.sampled_from(QTYPES), st.booleans(), st.data())
def test_float32_scale_and_zero_point_are_orts(qtype, symmetric, data):
    """float32 ranges (the same rule in both versions): random float32 values, and scales at
    float32's tiny."""
    if data.draw(st.booleans()):
        bits = st.integers(0, 0x7F7FFFFF)
        low = -float(np.uint32(data.draw(bits)).view(np.float32))
        high = float(np.uint32(data.draw(bits)).view(np.float32))
    else:
        qmin, qmax = R.qrange(qtype, symmetric)
        t = np.float32(float(np.finfo(np.float32).tiny) * (qmax - qmin))
        high = float(np.nextafter(t, np.float32(data.draw(st.sampled_from([np.inf, -np.inf])))))
        low = -data.draw(st.sampled_from([0.0, high]))
    assert histocal(low, high, qtype, symmetric, "float32") == ort(low, high, qtype, symmetric, "float32"), (
        low,
        high,
        qtype,
        symmetric,
    )


@pytest.mark.parity
@pytest.mark.parametrize("qtype", QTYPES)
def test_float16_threshold_cases(qtype):
    """Ranges whose float16 scale the two versions treat differently (and one both replace)."""
    qmin, qmax = R.qrange(qtype, False)
    cases = [(0.0, float(np.float16(s * (qmax - qmin)))) for s in (2.0**-15, 2.0**-20, 2.0**-24)]
    cases.append((0.0, float(np.float16(2.0**-26 * (qmax - qmin)))))
    for low, high in cases:
        scale, zp = histocal(low, high, qtype, False, "float16")
        assert (scale, zp) == ort(low, high, qtype, False, "float16"), (low, high)
        if SCALE_RULE == "1.31" or high < 2.0**-25 * (qmax - qmin):
            assert (scale, zp) == (1.0, 0), (low, high, SCALE_RULE)
        else:
            assert scale < 2.0**-14, (low, high, scale)


# ----------------------------------------------------------------------------------------------
# Through the Python layer
# ----------------------------------------------------------------------------------------------


def _small_values_stream() -> _core.StreamHistograms:
    """The same small values (|x| < 0.004: int8 scales below 2^-14) as float16 and float32 tensors."""
    rng = np.random.default_rng(3)
    batches = [rng.normal(0.0, 0.001, 4096) for _ in range(4)]
    stream = _core.StreamHistograms(2048, summaries=["pow2_votes"])
    stream.collect([("h", [b.astype(np.float16) for b in batches]), ("f", [b.astype(np.float32) for b in batches])])
    return stream


@pytest.mark.parity
@pytest.mark.parametrize(
    "options",
    [
        {"pow2_method": "NonOverflow"},
        {"pow2_method": "MinMSE", "minmse_mode": "All"},
        {"pow2_method": "MinMSE", "minmse_mode": "MostCommon"},
    ],
)
@pytest.mark.parametrize("qtype", ["int8", "uint8", "int16"])
def test_pow2_ranges_keep_a_power_of_two_scale_in_onnxruntime(options, qtype):
    """What onnxruntime computes from the TensorData histocal returns is scale 2^k, zero point 0,
    for float16 too (under 1.31 its smallest such scale is 2^-14, which small data goes below)."""
    stream = _small_values_stream()
    names = ["h", "f"]
    opts = methods.check_options("pow2", {"qtype": qtype, **options})
    pairs = methods.ranges(stream, names, "pow2", opts)
    td = methods.to_tensors_data(names, pairs, {"h": "float16", "f": "float32"})
    qmin, qmax = get_qmin_qmax_for_qType(R.QTYPES[qtype], reduce_range=False, symmetric=False)
    for name, (_low, high) in zip(names, pairs):
        lowest, highest = td[name].range_value
        zp, scale = compute_scale_zp(lowest, highest, qmin, qmax, False)
        scale, zp = float(np.asarray(scale).reshape(-1)[0]), int(np.asarray(zp).reshape(-1)[0])
        assert math.frexp(high / int(qmax))[0] == 0.5, (name, pairs)  # high = qmax 2^k
        assert (scale, zp) == (high / int(qmax), 0), (name, pairs, scale, zp)
        # under 1.32 the float16 tensor gets the float32 one's exponent (both above 2^-24)
        if SCALE_RULE == "1.32" or name == "f":
            assert pairs[names.index(name)] == pairs[1], (name, pairs)


@pytest.mark.parity
@pytest.mark.parametrize("method", ["mse", "pow2", "kl", "auto"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_error_estimates_are_the_errors_of_onnxruntimes_parameters(method, symmetric):
    """stream.qerrors (the report's, auto's) of each method's range equals the error of the scale
    and zero point onnxruntime computes from the returned TensorData (float16 and float32)."""
    stream = _small_values_stream()
    names = ["h", "f"]
    options = {
        k: v for k, v in {"qtype": "int8", "symmetric": symmetric}.items() if k in methods.METHOD_OPTIONS[method]
    }
    opts = methods.check_options(method, options)

    if method == "auto":  # auto's onnxruntime candidates: not what this test is about
        zero = methods.to_tensors_data(names, [(0.0, 0.0)] * 2, {"h": "float16", "f": "float32"})
        pairs, _ = auto_ranges(stream, names, opts, {label: zero for label, _, _ in ORT_AUTO_CANDIDATES})
    else:
        pairs = methods.ranges(stream, names, method, opts)
    errors = stream.qerrors(names, pairs, scale_rule=SCALE_RULE, qtype="int8", symmetric=symmetric)
    for name, (low, high), err in zip(names, pairs, errors):
        h = R.hist_from_export(stream.export(name))
        want = R.qerror(h, low, high, "int8", symmetric, "float16" if name == "h" else "float32")
        assert math.isclose(err, want, rel_tol=1e-9, abs_tol=1e-300), (name, method, (low, high), err, want)
