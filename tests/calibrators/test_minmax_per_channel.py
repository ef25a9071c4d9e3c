"""histocal's MinMax per channel (ORT's in-graph ReduceMin/ReduceMax over every axis but 1) on the
tensors real models hold: onnxruntime's result for tensors of rank 1 and more, one channel for a
scalar (ORT's augmented model does not load), and an error naming the tensor when a tensor's
channel count changes between batches (ORT's numpy stacking fails naming nothing)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization.calibrate import CalibrationMethod
from onnxruntime.quantization.calibrate import MinMaxCalibrater as OrtMinMax
from support.parity import quiet

from histocal.calibrators import create_calibrator


def _model(rank: int, opset: int, scalar: bool) -> onnx.ModelProto:
    """X (rank ``rank``, dynamic dims) -> Relu -> Mul by a 1-D constant -> Y; with ``scalar``, a
    rank-0 Constant k and Y * k too (calibrated tensors of rank 0, 1 and ``rank``)."""
    nodes = [
        helper.make_node("Relu", ["X"], ["R"]),
        helper.make_node("Constant", [], ["v"], value=numpy_helper.from_array(np.array([0.5, -2.0], np.float32))),
        helper.make_node("Abs", ["R"], ["m"]),
        helper.make_node("Mul", ["v", "v"], ["vv"]),
    ]
    outputs = [
        helper.make_tensor_value_info("m", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("vv", TensorProto.FLOAT, [2]),
    ]
    if scalar:
        nodes += [
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(2.5, np.float32))),
            helper.make_node("Mul", ["R", "k"], ["Y"]),
        ]
        outputs.append(helper.make_tensor_value_info("Y", TensorProto.FLOAT, None))
    dims = [f"d{i}" for i in range(rank)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _ort_minmax(path: str, aug: str, feeds: list[dict[str, np.ndarray]], **options) -> dict:
    ort = OrtMinMax(path, augmented_model_path=aug, **options)
    ort.augment_graph()
    ort.create_inference_session()
    it = iter(feeds)

    class Reader:
        def get_next(self):
            return next(it, None)

    with quiet():
        ort.collect_data(Reader())
    return ort.compute_data().data


def _histocal_minmax(path: str, aug: str, calls: list[list[dict[str, np.ndarray]]], **extra) -> dict:
    cal = create_calibrator(
        path, augmented_model_path=aug, calibrate_method=CalibrationMethod.MinMax, extra_options=extra
    )
    for feeds in calls:
        cal.collect_data(feeds)
    return cal.compute_data().data


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


@pytest.mark.parity
@settings(max_examples=25, deadline=None)
@given(
    rank=st.integers(1, 4),
    opset=st.sampled_from([13, 17, 18, 21]),
    seed=st.integers(0, 2**16),
    batches=st.integers(1, 4),
    symmetric=st.booleans(),
    nan=st.booleans(),
)
def test_per_channel_equals_onnxruntimes_for_rank_1_and_more(
    tmp_path_factory, rank, opset, seed, batches, symmetric, nan
):
    tmp = tmp_path_factory.mktemp("pc")
    path = (tmp / "m.onnx").as_posix()
    onnx.save(_model(rank, opset, scalar=False), path)
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 4, rank))
    feeds = []
    for _ in range(batches):
        x = (rng.standard_normal(shape) * 10).astype(np.float32)
        if nan:
            x.reshape(-1)[0] = np.nan
        feeds.append({"X": x})
    expected = _ort_minmax(path, (tmp / "o.onnx").as_posix(), feeds, per_channel=True, symmetric=symmetric)
    got = _histocal_minmax(path, (tmp / "h.onnx").as_posix(), [feeds], per_channel=True, symmetric=symmetric)
    assert set(got) == set(expected)
    for name, td in expected.items():
        for attr in ("lowest", "highest"):
            assert _same(getattr(got[name], attr), getattr(td, attr)), (name, attr, got[name], td)


@pytest.mark.parity
@pytest.mark.parametrize("opset", [13, 17, 18, 21])
def test_a_scalar_per_channel_gets_its_range_as_one_channel(tmp_path, opset):
    """ORT's per-channel augmented model does not load (ReduceMin over axis 0 of a rank-0 tensor);
    histocal's gives the scalar ORT's per-tensor range (shape (1,)) and every other tensor ORT's
    per-channel range (computed on the model without the scalar)."""
    path, plain = (tmp_path / "s.onnx").as_posix(), (tmp_path / "p.onnx").as_posix()
    onnx.save(_model(3, opset, scalar=True), path)
    onnx.save(_model(3, opset, scalar=False), plain)
    rng = np.random.default_rng(opset)
    feeds = [{"X": rng.standard_normal((2, 3, 4)).astype(np.float32)} for _ in range(3)]
    ort = OrtMinMax(path, augmented_model_path=(tmp_path / "o.onnx").as_posix(), per_channel=True)
    ort.augment_graph()
    with pytest.raises(Exception, match="rank"):
        ort.create_inference_session()
    got = _histocal_minmax(path, (tmp_path / "h.onnx").as_posix(), [feeds[:2], feeds[2:]], per_channel=True)
    per_tensor = _ort_minmax(path, (tmp_path / "t.onnx").as_posix(), feeds)
    assert got["k"].lowest.shape == (1,) and got["k"].lowest.tolist() == got["k"].highest.tolist() == [2.5]
    for attr in ("lowest", "highest"):
        assert _same(getattr(got["k"], attr), getattr(per_tensor["k"], attr))
    expected = _ort_minmax(plain, (tmp_path / "o2.onnx").as_posix(), feeds, per_channel=True)
    for name, td in expected.items():
        for attr in ("lowest", "highest"):
            assert _same(getattr(got[name], attr), getattr(td, attr)), (name, attr)
    assert got["Y"].lowest.shape == (3,)


def test_a_scalar_per_channel_with_external_data(tmp_path):
    """The augmented model is saved a second time: its weights (external data) must survive it."""
    path = (tmp_path / "s.onnx").as_posix()
    model = _model(3, 17, scalar=True)
    model.graph.node.append(helper.make_node("Add", ["Y", "w"], ["Z"]))
    model.graph.output.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, None))
    model.graph.initializer.append(numpy_helper.from_array(np.full((4,), 7.0, np.float32), "w"))
    onnx.save(model, path, save_as_external_data=True, size_threshold=0)
    cal = create_calibrator(
        path, augmented_model_path=(tmp_path / "h.onnx").as_posix(), calibrate_method=CalibrationMethod.MinMax,
        use_external_data_format=True, extra_options={"per_channel": True},
    )  # fmt: skip
    cal.collect_data([{"X": np.ones((2, 3, 4), np.float32)}])
    data = cal.compute_data().data
    assert data["Z"].lowest.tolist() == [9.5, 9.5, 9.5] and data["k"].lowest.tolist() == [2.5]


def test_a_channel_count_that_changes_between_batches_is_named(tmp_path):
    path = (tmp_path / "m.onnx").as_posix()
    onnx.save(_model(4, 17, scalar=False), path)
    feeds = [{"X": np.ones((1, 3, 2, 2), np.float32)}, {"X": np.ones((1, 5, 2, 2), np.float32)}]
    with pytest.raises(ValueError, match=r"batch 1: tensor '[XRm]': 5 channels along axis 1 in this batch, 3 before"):
        _histocal_minmax(path, (tmp_path / "h.onnx").as_posix(), [feeds], per_channel=True)


def test_a_channel_count_that_changes_between_calls_is_named_and_keeps_the_range(tmp_path):
    path = (tmp_path / "m.onnx").as_posix()
    onnx.save(_model(4, 17, scalar=False), path)
    cal = create_calibrator(
        path, augmented_model_path=(tmp_path / "h.onnx").as_posix(), calibrate_method=CalibrationMethod.MinMax,
        extra_options={"per_channel": True, "max_intermediate_outputs": 1},
    )  # fmt: skip
    cal.collect_data([{"X": np.full((1, 3, 2, 2), 4.0, np.float32)}])
    with pytest.raises(ValueError, match=r"batch 0: tensor '[XRm]': 2 channels along axis 1 in this batch, 3 before"):
        cal.collect_data([{"X": np.ones((1, 2, 2, 2), np.float32)}])
    assert cal.compute_data().data["R"].highest.tolist() == [4.0, 4.0, 4.0]


@pytest.mark.parity
def test_a_scalar_per_channel_through_patched_onnxruntime(tmp_path):
    """ORT's create_calibrator under patch_onnxruntime (where ORT's module names histocal's class)."""
    from onnxruntime.quantization import calibrate as ort_calibrate

    import histocal

    path = (tmp_path / "s.onnx").as_posix()
    onnx.save(_model(3, 17, scalar=True), path)
    with histocal.patch_onnxruntime():
        cal = ort_calibrate.create_calibrator(
            path, augmented_model_path=(tmp_path / "h.onnx").as_posix(), calibrate_method=CalibrationMethod.MinMax,
            extra_options={"per_channel": True},
        )  # fmt: skip
    cal.collect_data([{"X": np.ones((2, 3, 4), np.float32)}])
    assert cal.compute_data().data["k"].lowest.tolist() == [2.5]
