"""The calibration methods of issue 6 (mse, kl, pow2, auto) through the Python layer
(``CalibrationState.compute``, ``register_method``, ``quantize_static(tensors_range=)``) on a small
model's state, against the numpy references of ``method_refs.py`` applied to each tensor's exported
streaming histogram; tolerances and check_choice as in test_methods.py (support/method_checks.py).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import method_refs as R
from support.method_checks import (
    KL_ABS,
    POW2_QTYPES,
    check_choice,
)
from support.method_refs import Hist
from support.summaries import pow2_votes

# ----------------------------------------------------------------------------------------------
# The Python layer: CalibrationState.compute, register_method, quantize_static(tensors_range=)
# ----------------------------------------------------------------------------------------------

STREAMING_BINS = 2048


def _api_model() -> onnx.ModelProto:
    """X[N,8] -MatMul-Add-> a -Relu-> r -MatMul-> Y; n = Neg(r) (all <= 0); z = X * 0 (all zero)."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.6, (8, 16)).astype(np.float32), "W1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (16,)).astype(np.float32), "B1"),
        numpy_helper.from_array(rng.normal(0, 0.5, (16, 4)).astype(np.float32), "W2"),
        numpy_helper.from_array(np.zeros((1, 8), np.float32), "Z"),
    ]
    nodes = [
        helper.make_node("MatMul", ["X", "W1"], ["mm1"]),
        helper.make_node("Add", ["mm1", "B1"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MatMul", ["r", "W2"], ["Y"]),
        helper.make_node("Neg", ["r"], ["n"]),
        helper.make_node("Mul", ["X", "Z"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "methods_api",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, ["N", s]) for t, s in (("Y", 4), ("n", 16), ("z", 8))],
        initializer=inits,
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _api_batches() -> list[dict[str, np.ndarray]]:
    """Six batches of different scales, one column with rare large outliers."""
    rng = np.random.default_rng(11)
    out = []
    for b in range(6):
        x = rng.normal(0, 0.5 * (1 + b), (5, 8))
        x[rng.integers(0, 5), 3] *= 40.0
        out.append({"X": x.astype(np.float32)})
    return out


@pytest.fixture(scope="module", params=[STREAMING_BINS, None], ids=["bins2048", "bins_default"])
def api(request, tmp_path_factory):
    """A streaming state of the model (2048 streaming bins, and histocal's default), and one
    state per batch (what each batch's histogram is on its own)."""
    from onnxruntime.quantization import CalibrationMethod

    import histocal

    bins = request.param
    tmp = tmp_path_factory.mktemp("methods_api")
    path = str(tmp / "model.onnx")
    onnx.save(_api_model(), path)

    def collect(batches, tag):
        cal = histocal.create_calibrator(
            path,
            augmented_model_path=str(tmp / f"aug_{tag}.onnx"),
            calibrate_method=CalibrationMethod.Entropy,
            extra_options={"CollectionMode": "streaming", **({"StreamingBins": bins} if bins else {})},
        )
        cal.collect_data(batches)
        return cal.state

    batches = _api_batches()
    state = collect(batches, "all")
    per_batch = [collect([b], f"b{i}") for i, b in enumerate(batches)]
    return {"path": path, "state": state, "per_batch": per_batch, "tmp": tmp, "bins": bins}


def _hist(state, name: str) -> Hist | None:
    return R.hist_from_export(state.stream.export(name))


def _range_of(td, name: str) -> tuple[float, float]:
    d = td[name]
    lo, hi = np.asarray(d.lowest), np.asarray(d.highest)
    assert lo.dtype == np.float32 and hi.dtype == np.float32, (name, lo.dtype, hi.dtype)
    return float(lo.reshape(-1)[0]), float(hi.reshape(-1)[0])


def _f32(v: float) -> float:
    return float(np.float32(v))


def test_api_state_tensors(api):
    """The model gives the shapes of data the checks below need."""
    state = api["state"]
    assert {"X", "a", "r", "Y", "n", "z"} <= set(state.names)
    assert _hist(state, "z").mx == 0.0 and _hist(state, "z").mn == 0.0
    assert _hist(state, "n").mx <= 0.0 < -_hist(state, "n").mn
    assert _hist(state, "r").mn == 0.0


@pytest.mark.parametrize("qtype,symmetric", [("int8", False), ("uint8", False), ("int8", True), ("int16", False)])
def test_api_mse(api, qtype, symmetric):
    state = api["state"]
    td = state.compute("mse", qtype=qtype, symmetric=symmetric)
    assert sorted(td.data) == sorted(state.names)
    for name in state.names:
        got = _range_of(td, name)
        h = _hist(state, name)
        ref = R.mse_search(h, qtype, symmetric) if h is not None else None
        what = f"compute('mse', qtype={qtype}, symmetric={symmetric})[{name!r}]"
        if ref is None or ref.best < 0:
            assert got == (0.0, 0.0), what
            continue
        hit = np.flatnonzero((ref.lows.astype(np.float32) == got[0]) & (ref.highs.astype(np.float32) == got[1]))
        assert hit.size, f"{what}: {got} is not a (float32) grid candidate; reference {ref.result}"
        best = min(hit, key=lambda i: ref.errors[i])
        check_choice(ref.errors, int(best), ref.best, what, h)


@pytest.mark.parametrize("options", [{}, {"num_bins": 512, "num_quantized_bins": 64}])
def test_api_kl(api, options):
    state = api["state"]
    td = state.compute("kl", **options)
    for name in state.names:
        got = _range_of(td, name)
        h = _hist(state, name)
        ref = R.kl_search(h, **options) if h is not None else None
        what = f"compute('kl', {options})[{name!r}]"
        if ref is None or ref.A == 0:
            assert got == (0.0, 0.0), what
            continue
        nb, nq = ref.num_bins, ref.nq
        cands = [i for i in range(nq, nb + 1) if _f32(ref.threshold(i)) == got[1]]
        assert got[0] == _f32(ref.low(got[1])) and cands, f"{what}: {got} is not a candidate; reference {ref.result}"
        i = min(cands, key=lambda c: ref.divergence[c - nq])
        check_choice(ref.divergence, i - nq, ref.best_i - nq, what, abs_tol=KL_ABS, strict_zero=False)


@pytest.mark.parity
@pytest.mark.parametrize("qtype", POW2_QTYPES)
@pytest.mark.parametrize("pow2_method", ["NonOverflow", "MinMSE"])
def test_api_pow2(api, qtype, pow2_method):
    state = api["state"]
    td = state.compute("pow2", qtype=qtype, pow2_method=pow2_method)
    for name in state.names:
        h = _hist(state, name)
        k = (
            None
            if h is None
            else (R.pow2_nonoverflow_k(h, qtype) if pow2_method == "NonOverflow" else R.pow2_minmse_k(h, qtype))
        )
        want = (0.0, 0.0) if k is None else R.pow2_range(k, qtype)
        assert _range_of(td, name) == want, f"compute('pow2', {qtype}, {pow2_method})[{name!r}]: brute force k={k}"


@pytest.mark.parity
@pytest.mark.parametrize("qtype", POW2_QTYPES)
def test_api_pow2_most_common(api, qtype):
    """Every batch votes for the MinMSE-All exponent of its own histogram; the most votes win.
    Votes are collected by a pow2 MostCommon calibrator (and survive saving the state)."""
    import histocal

    options = {"qtype": qtype, "pow2_method": "MinMSE", "minmse_mode": "MostCommon"}
    extra = {"MethodOptions": options, **({"StreamingBins": api["bins"]} if api["bins"] else {})}
    cal = histocal.create_calibrator(
        api["path"],
        augmented_model_path=str(api["tmp"] / "aug_votes.onnx"),
        calibrate_method="pow2",
        extra_options=extra,
    )
    cal.collect_data(_api_batches())
    cal.state.save(api["tmp"] / f"votes_{qtype}.hcs")
    state = histocal.CalibrationState.load(api["tmp"] / f"votes_{qtype}.hcs")
    td = state.compute("pow2", **options)
    from_calibrator = cal.compute_data()
    for name in state.names:
        assert _range_of(from_calibrator, name) == _range_of(td, name)
    with pytest.raises(ValueError, match="needs per-batch votes"):
        api["state"].compute("pow2", **options)  # collected without votes
    for name in state.names:
        votes = []
        for one in api["per_batch"]:
            h = _hist(one, name)
            k = None if h is None else R.pow2_minmse_k(h, qtype)
            if k is not None:
                votes.append((k, 1))
        want = R.pow2_range(R.most_common_k(votes), qtype) if votes else (0.0, 0.0)
        assert _range_of(td, name) == want, f"MostCommon {qtype} [{name!r}]: votes {votes}"


def _auto_reference(state, name: str, qtype: str, symmetric: bool) -> tuple[list, list]:
    """auto's candidates for one tensor (in tie order) and their reference errors."""
    h = _hist(state, name)
    cands = [
        _range_of(state.compute("minmax", symmetric=False), name),
        _range_of(state.compute("percentile", symmetric=True, num_bins=2048, percentile=99.99), name),
        _range_of(state.compute("percentile", symmetric=True, num_bins=2048, percentile=99.999), name),
        _range_of(state.compute("entropy", symmetric=False, num_bins=128, num_quantized_bins=128), name),
        R.kl_search(h).result,
        R.mse_search(h, qtype, symmetric).result,
    ]
    return cands, [R.qerror(h, lo, hi, qtype, symmetric) for lo, hi in cands]


@pytest.mark.parity
@pytest.mark.parametrize("qtype,symmetric", [("int8", False), ("uint8", True)])
def test_api_auto(api, qtype, symmetric):
    state = api["state"]
    td = state.compute("auto", qtype=qtype, symmetric=symmetric)
    for name in state.names:
        got = _range_of(td, name)
        what = f"compute('auto', {qtype}, symmetric={symmetric})[{name!r}]"
        if _hist(state, name) is None or max(abs(_hist(state, name).mn), abs(_hist(state, name).mx)) == 0:
            assert got == (0.0, 0.0), what
            continue
        cands, errors = _auto_reference(state, name, qtype, symmetric)
        hit = [i for i, (lo, hi) in enumerate(cands) if (_f32(lo), _f32(hi)) == got]
        assert hit, f"{what}: {got} is none of the candidates {cands}"
        i = min(hit, key=lambda j: errors[j])
        check_choice(np.array(errors), i, int(np.argmin(errors)), what, _hist(state, name))


def test_api_register_method_round_trip(api):
    import histocal
    from histocal import methods as hm

    state = api["state"]
    seen = {}

    def half_range(t):
        seen[t.name] = t
        return t.min, t.min + (t.max - t.min) / 2

    name = "test_half_range"
    histocal.register_method(name, half_range)
    try:
        assert name in hm.method_names()
        with pytest.raises(ValueError, match=name):
            histocal.register_method(name, half_range)  # already registered
        td = state.compute(name)
        for tensor in state.names:
            h = _hist(state, tensor)
            if h is None or h.total == 0:
                assert _range_of(td, tensor) == (0.0, 0.0)
                continue
            t = seen[tensor]
            assert np.array_equal(np.asarray(t.counts, np.uint64), h.counts)
            assert t.min == h.mn and t.max == h.mx
            edges = np.asarray(t.edges)
            assert edges[0] == h.left and np.allclose(np.diff(edges), h.width, rtol=0, atol=0)
            assert _range_of(td, tensor) == (_f32(h.mn), _f32(h.mn + (h.mx - h.mn) / 2))
        with pytest.raises(ValueError, match="option"):
            state.compute(name, qtype="int8")  # registered methods take no options
    finally:
        hm.unregister_method(name)
    with pytest.raises(ValueError, match=name):
        state.compute(name)


def test_api_register_method_bad_result_names_tensor(api):
    import histocal
    from histocal import methods as hm

    histocal.register_method("test_backwards", lambda t: (t.max + 1.0, t.min - 1.0))
    try:
        with pytest.raises(ValueError, match="test_backwards"):
            api["state"].compute("test_backwards")
    finally:
        hm.unregister_method("test_backwards")
    with pytest.raises(ValueError):
        histocal.register_method("mse", lambda t: (0.0, 1.0))  # built-ins cannot be replaced


@pytest.mark.parametrize(
    "method,options,option",
    [
        ("mse", {"qtype": "int4"}, "qtype"),
        ("mse", {"symmetric": "yes"}, "symmetric"),
        ("mse", {"bogus": 1}, "bogus"),
        ("auto", {"qtype": "float8"}, "qtype"),
        ("kl", {"num_bins": 64, "num_quantized_bins": 128}, "num_bins"),
        ("kl", {"num_bins": 0}, "num_bins"),
        ("kl", {"num_quantized_bins": -3}, "num_quantized_bins"),
        ("kl", {"qtype": "int8"}, "qtype"),
        ("pow2", {"qtype": "uint16"}, "qtype"),
        ("pow2", {"pow2_method": "Bogus"}, "pow2_method"),
        ("pow2", {"minmse_mode": "Bogus"}, "minmse_mode"),
    ],
)
def test_api_bad_options(api, method, options, option):
    with pytest.raises(ValueError, match=option):
        api["state"].compute(method, **options)


def test_api_unknown_method(api):
    with pytest.raises(ValueError, match="bogus_method"):
        api["state"].compute("bogus_method")


def test_api_quantize_static_with_pow2_ranges(api):
    """quantize_static(tensors_range=) uses the given ranges: pow2 ranges give power-of-two
    activation scales and zero point 0 in the QDQ model."""
    from onnxruntime.quantization import QuantFormat, QuantType

    import histocal

    state = api["state"]
    td = state.compute("pow2", qtype="int8", pow2_method="MinMSE")
    out = str(api["tmp"] / "pow2.qdq.onnx")
    histocal.quantize_static(
        api["path"],
        out,
        tensors_range=td,
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
    )
    q = onnx.load(out)
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    checked = 0
    for node in q.graph.node:
        if node.op_type != "QuantizeLinear" or node.input[0] not in td.data:
            continue
        lo, hi = _range_of(td, node.input[0])
        if (lo, hi) == (0.0, 0.0):
            continue
        scale, zp = float(inits[node.input[1]]), int(inits[node.input[2]])
        m, _ = math.frexp(scale)
        assert m == 0.5 and zp == 0 and scale * 127 == hi, (node.input[0], scale, zp, (lo, hi))
        checked += 1
    assert checked >= 3


def test_pow2_votes_merge_like_one_run(api):
    """States of two halves of the data merge into the state of one run over all of it, votes
    included; merged with a state without votes, MostCommon says it has none."""
    import histocal

    options = {"qtype": "int8", "pow2_method": "MinMSE", "minmse_mode": "MostCommon"}

    def collect(batches, tag, method="pow2"):
        cal = histocal.create_calibrator(
            api["path"],
            augmented_model_path=str(api["tmp"] / f"aug_m{tag}.onnx"),
            calibrate_method=method,
            extra_options={"MethodOptions": options if method == "pow2" else {}},
        )
        cal.collect_data(batches)
        return cal.state

    batches = _api_batches()
    whole = collect(batches, "w")
    merged = collect(batches[:2], "a").merge(collect(batches[2:], "b"))
    for name in whole.names:
        assert pow2_votes(merged.stream, name) == pow2_votes(whole.stream, name)
    assert _ranges(merged.compute("pow2", **options)) == _ranges(whole.compute("pow2", **options))
    without = merged.merge(collect(batches, "c", method="mse"))
    with pytest.raises(ValueError, match="needs per-batch votes"):
        without.compute("pow2", **options)


def _ranges(td) -> dict:
    return {name: _range_of(td, name) for name in td.data}
