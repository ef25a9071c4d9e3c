"""MinMax ranges when the data is folded in chunks (``max_intermediate_outputs``, several
``collect_data`` calls) and some chunks hold only NaN.

Within one chunk ORT reduces the batches' ReduceMin/ReduceMax with ``np.nanmin``/``np.nanmax``
(``np.nanmean`` for the moving average), so one ``collect_data`` call without
``max_intermediate_outputs`` gives the NaN-ignoring range of all the data. histocal must give
that same result however the data is chunked:

* ``max_intermediate_outputs=k``: ORT 1.31.1 discards every full chunk; histocal folds it in.
* a chunk or call whose values are all NaN: its NaN range must not win the merge (ORT 1.31.1's
  ``min(old, new)`` keeps an earlier NaN; per-channel merges raise in ORT).
* ``moving_average``: ``max_intermediate_outputs=k`` in one call equals calls of k batches each,
  merged with ORT's own arithmetic.

The reference is ORT itself on one call where it is right, and the NaN-ignoring numpy reduction
of all the data, checked to agree with it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization import calibrate as oc
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
from support.graphs import GraphBuilder, tensor
from support.parity import assert_same, quiet
from support.profiles import examples

import histocal

pytestmark = pytest.mark.parity

MM = CalibrationMethod.MinMax
CHANNELS = 3
OPSETS = (13, 18)  # per-channel ReduceMin/ReduceMax take axes as an attribute before 18, an input from 18


def identity_model(opset: int) -> onnx.ModelProto:
    """X[N, 3] -Identity-> Y: both tensors are calibrated, and hold exactly the fed values."""
    g = GraphBuilder()
    g.node("Identity", ["X"], output="Y")
    return g.model("identity", [tensor("X", ["N", CHANNELS])], [tensor("Y", ["N", CHANNELS])], opset)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("minmax_chunks")
    out = {}
    for opset in OPSETS:
        p = d / f"identity{opset}.onnx"
        onnx.save(identity_model(opset), p.as_posix())
        out[opset] = p.as_posix()
    return out


class Reader(oc.CalibrationDataReader):
    def __init__(self, batches: list[np.ndarray]):
        self.it = iter([{"X": b} for b in batches])

    def get_next(self):
        return next(self.it, None)


def calibrate(create, path, aug, opts: dict, calls: list[list[np.ndarray]]) -> TensorsData:
    """``create``'s MinMax calibrator fed one ``collect_data`` call per entry of ``calls``."""
    with quiet():
        cal = create(path, None, aug, MM, extra_options=dict(opts))
        for batches in calls:
            cal.collect_data(Reader(batches))
        return cal.compute_data()


def nan_ignoring_range(batches: list[np.ndarray], per_channel: bool, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
    """The range of all the data, NaN ignored (NaN where a tensor or channel has no value)."""
    data = np.concatenate(batches)
    axis = 0 if per_channel else None
    with quiet():
        lo, hi = np.nanmin(data, axis=axis), np.nanmax(data, axis=axis)
    if symmetric:
        hi = np.maximum(np.abs(lo), np.abs(hi))
        lo = -hi
    return np.reshape(lo, -1), np.reshape(hi, -1)


def chunked(batches, k):
    return [batches[i : i + k] for i in range(0, len(batches), k)]


def assert_ranges_equal(expected: tuple[np.ndarray, np.ndarray], td: TensorsData, where: str) -> None:
    for name in ("X", "Y"):
        for got, want, attr in zip(td.data[name].range_value, expected, ("lowest", "highest")):
            assert got.dtype == np.float32, f"{where}[{name}].{attr}: {got.dtype}"
            np.testing.assert_array_equal(np.reshape(got, -1), want, err_msg=f"{where}[{name}].{attr}")


def assert_td_same(ref: TensorsData, ours: TensorsData, where: str) -> None:
    assert set(ours.data) == set(ref.data), where
    for name, o in ref.data.items():
        for attr in ("lowest", "highest"):
            assert_same(getattr(o, attr), getattr(ours.data[name], attr), f"{where}[{name}].{attr}")


# Values: small integers (no -0.0, so ties are exact). NaN comes as whole batches, whole channel
# columns of a batch, or scattered.
_finite = st.integers(-9, 9).map(float)


@st.composite
def batch_lists(draw, max_batches: int = 6) -> list[np.ndarray]:
    out = []
    for _ in range(draw(st.integers(1, max_batches))):
        rows = draw(st.integers(1, 2))
        b = np.array(draw(st.lists(_finite, min_size=rows * CHANNELS, max_size=rows * CHANNELS)), np.float32)
        b = b.reshape(rows, CHANNELS)
        kind = draw(st.sampled_from(["finite", "nan", "columns", "scattered"]))
        if kind == "nan":
            b[:] = np.nan
        elif kind == "columns":
            b[:, draw(st.lists(st.integers(0, CHANNELS - 1), min_size=1, unique=True))] = np.nan
        elif kind == "scattered":
            b.flat[draw(st.lists(st.integers(0, b.size - 1), min_size=1, unique=True))] = np.nan
        out.append(b)
    return out


def reductions_ignore_no_value(batches: list[np.ndarray], per_channel: bool) -> bool:
    """Whether each batch's in-graph ReduceMin/ReduceMax is NaN-free or wholly NaN. ORT's CPU
    ReduceMin/ReduceMax over values mixed with NaN depend on where the NaN is (a leading NaN
    wins, a later one is skipped), so only then is the result numpy's NaN-ignoring range."""
    units = [b[:, c] for b in batches for c in range(CHANNELS)] if per_channel else batches
    return all(np.isnan(u).all() or not np.isnan(u).any() for u in units)


@settings(max_examples=examples(30))
@given(
    batches=batch_lists(),
    per_channel=st.booleans(),
    symmetric=st.booleans(),
    opset=st.sampled_from(OPSETS),
    k=st.sampled_from([None, 1, 2, 3]),
    two_calls=st.booleans(),
)
def test_chunked_range_is_the_nan_ignoring_range_of_all_data(
    paths, tmp_path_factory, batches, per_channel, symmetric, opset, k, two_calls
):
    """However the batches are chunked (max_intermediate_outputs, several collect_data calls),
    and whichever chunks are all NaN, the range is ORT's one-call result: the NaN-ignoring
    min/max over the batches' reductions (numpy's over all the data where those are NaN-free
    or all NaN)."""
    tmp = tmp_path_factory.mktemp("r")
    opts = {"per_channel": per_channel, "symmetric": symmetric}
    ref = calibrate(oc.create_calibrator, paths[opset], (tmp / "o.onnx").as_posix(), opts, [batches])
    if reductions_ignore_no_value(batches, per_channel):
        assert_ranges_equal(nan_ignoring_range(batches, per_channel, symmetric), ref, "ORT, one call")
    cut = len(batches) // 2 if two_calls else 0
    calls = [batches[:cut], batches[cut:]] if cut else [batches]
    ours = calibrate(
        histocal.create_calibrator,
        paths[opset],
        (tmp / "h.onnx").as_posix(),
        dict(opts, max_intermediate_outputs=k),
        calls,
    )
    assert_td_same(ref, ours, f"k={k}, calls={len(calls)}")


@pytest.mark.parametrize("per_channel", [False, True])
def test_all_nan_first_chunk_does_not_stick(paths, tmp_path, per_channel):
    """The first chunk (or call) is all NaN, a later one has values: the range is theirs. ORT
    1.31.1 keeps the first call's NaN (per-tensor) or raises (per-channel); with
    max_intermediate_outputs it discards full chunks (test_calibrators_ort_failures.test_max_intermediate_outputs)."""
    batches = [
        np.full((1, CHANNELS), np.nan, np.float32),
        np.full((1, CHANNELS), np.nan, np.float32),
        np.array([[-4, 7, np.nan]], np.float32),
        np.array([[2, np.nan, np.nan]], np.float32),
    ]
    opts = {"per_channel": per_channel}
    expected = nan_ignoring_range(batches, per_channel, symmetric=False)
    path, chunks = paths[18], chunked(batches, 2)
    if per_channel:
        with quiet(), pytest.raises(ValueError, match="truth value of an array"):
            calibrate(oc.create_calibrator, path, (tmp_path / "o.onnx").as_posix(), opts, chunks)
    else:
        sticky = calibrate(oc.create_calibrator, path, (tmp_path / "o.onnx").as_posix(), opts, chunks)
        assert np.isnan(sticky.data["X"].lowest).all() and np.isnan(sticky.data["X"].highest).all()
    for how, extra, calls in (
        ("limit", {"max_intermediate_outputs": 2}, [batches]),
        ("calls", {}, chunks),
        ("limit+calls", {"max_intermediate_outputs": 1}, chunks),
    ):
        ours = calibrate(histocal.create_calibrator, path, (tmp_path / "h.onnx").as_posix(), dict(opts, **extra), calls)
        assert_ranges_equal(expected, ours, how)


def test_all_nan_everywhere_stays_nan(paths, tmp_path):
    """A tensor with no value at all has a NaN range, as in ORT (nothing to ignore it for)."""
    batches = [np.full((2, CHANNELS), np.nan, np.float32)] * 3
    ref = calibrate(oc.create_calibrator, paths[13], (tmp_path / "o.onnx").as_posix(), {}, [batches])
    ours = calibrate(
        histocal.create_calibrator,
        paths[13],
        (tmp_path / "h.onnx").as_posix(),
        {"max_intermediate_outputs": 2},
        [batches[:1], batches[1:]],
    )
    assert np.isnan(ref.data["X"].lowest).all()
    assert_td_same(ref, ours, "all NaN")


@settings(max_examples=examples(25))
@given(
    batches=batch_lists(),
    per_channel=st.booleans(),
    symmetric=st.booleans(),
    k=st.integers(1, 3),
    constant=st.sampled_from([0.01, 0.25, 0.5]),
)
def test_moving_average_limit_equals_explicit_calls(
    paths, tmp_path_factory, batches, per_channel, symmetric, k, constant
):
    """moving_average with max_intermediate_outputs=k in one call is ORT's result for calls of k
    batches each: chunk means merged by ORT's arithmetic (a NaN chunk mean included)."""
    tmp = tmp_path_factory.mktemp("ma")
    opts = {"moving_average": True, "averaging_constant": constant, "per_channel": per_channel, "symmetric": symmetric}
    ref = calibrate(oc.create_calibrator, paths[13], (tmp / "o.onnx").as_posix(), opts, chunked(batches, k))
    ours = calibrate(
        histocal.create_calibrator,
        paths[13],
        (tmp / "h.onnx").as_posix(),
        dict(opts, max_intermediate_outputs=k),
        [batches],
    )
    assert_td_same(ref, ours, f"k={k}")
    explicit = calibrate(histocal.create_calibrator, paths[13], (tmp / "h2.onnx").as_posix(), opts, chunked(batches, k))
    assert_td_same(ref, explicit, f"calls of {k}")


# ---------------------------------------------------------------------------------------------
# The augmented model (ORT's augment_graph, inherited): same ReduceMin/ReduceMax nodes and outputs
# ---------------------------------------------------------------------------------------------


def _conv_clip_matmul() -> onnx.ModelProto:
    g = GraphBuilder(3)
    g.const(g.rng.normal(size=(1, 1, 3, 3)).astype(np.float32), "W")
    g.node("Relu", ["A"], output="R", name="relu")
    g.node("Conv", ["R", "W"], output="C", name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g.node("Clip", ["C"], output="D", name="clip")
    g.node("MatMul", ["D", "E"], output="F", name="matmul")
    return g.model(
        "conv_clip_matmul", [tensor("A", [1, 1, 5, 5]), tensor("E", [1, 1, 5, 2])], [tensor("F", [1, 1, 5, 2])], 13
    )


def _resize_with_empty_inputs() -> onnx.ModelProto:
    """Zero-length float inputs (Resize's roi and scales): ORT's augmentation keeps keepdims=1
    for them."""
    g = GraphBuilder(4)
    g.const(g.rng.normal(size=(1, 1, 3, 3)).astype(np.float32), "W")
    g.node("Conv", ["G", "W"], output="I", name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    g.node("Resize", ["I", "roi", "scales"], output="O", name="resize")
    return g.model(
        "resize_empty",
        [tensor("G", [1, 1, 5, 5]), tensor("roi", [0]), tensor("scales", [0])],
        [tensor("O", [1, 1, 5, 5])],
        13,
    )


@pytest.mark.parametrize(
    "build,op_types",
    [
        (_conv_clip_matmul, ["Conv", "MatMul"]),
        (_conv_clip_matmul, None),
        (_resize_with_empty_inputs, []),
        (_resize_with_empty_inputs, ["Conv"]),
    ],
)
def test_augmented_model_matches_ort(tmp_path, build, op_types):
    path = tmp_path / "m.onnx"
    onnx.save(build(), path.as_posix())
    graphs = []
    for create, aug in ((oc.create_calibrator, "o.onnx"), (histocal.create_calibrator, "h.onnx")):
        with quiet():
            cal = create(path.as_posix(), op_types, (tmp_path / aug).as_posix(), MM)
        g = cal.get_augment_model().graph
        graphs.append((sorted((n.name, n.op_type) for n in g.node), sorted(o.name for o in g.output)))
    assert graphs[1] == graphs[0]
    nodes, outputs = graphs[1]
    added = [o for o in outputs if o.endswith(("_ReduceMin", "_ReduceMax"))]
    assert added and len(nodes) == len(build().graph.node) + 2 * len(added)  # Reduce + Reshape each
