"""Small ONNX models for the calibrator tests, built with onnx.helper.

Every model is ORT-loadable: IR version 10 (onnxruntime 1.31 refuses the IR 14 that onnx 1.23
writes by default) and an explicit default-domain opset.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, F16, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64


def _model(nodes, name, inputs, outputs, inits, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def cnn(opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """X[N,3,8,8] -Conv-Relu-MaxPool-> p; p + Conv1x1(p) -Resize(x2)-GlobalAveragePool-> Y[N,4,1,1]."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("W1", rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)),
        _init("B1", rng.normal(0, 0.1, (4,)).astype(np.float32)),
        _init("W2", rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32)),
        _init("scales", np.array([1, 1, 2, 2], np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["conv1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1"),
        helper.make_node("MaxPool", ["relu1"], ["pool"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Conv", ["pool", "W2"], ["conv2"], name="conv2"),
        helper.make_node("Add", ["pool", "conv2"], ["add"], name="add"),
        helper.make_node("Resize", ["add", "", "scales"], ["resize"], mode="nearest", name="resize"),
        helper.make_node("GlobalAveragePool", ["resize"], ["Y"], name="gap"),
    ]
    return _model(
        nodes, "cnn",
        [helper.make_tensor_value_info("X", F32, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("Y", F32, ["N", 4, 1, 1])],
        inits, opset,
    )


LOWEST = float(np.finfo(np.float32).min)


def transformer(opset: int = 17, d: int = 8, ff: int = 16, seed: int = 1, padding_mask: bool = False) -> onnx.ModelProto:
    """One encoder block on X[B,S,D] with an additive attention mask M[B,S,S] (dynamic B and S):
    single-head attention (MatMul, Softmax), residual, LayerNormalization, Erf-GELU feed-forward.

    ``padding_mask``: the model takes a 0/1 padding mask A[B,S] instead and builds the additive
    mask in the graph as recent Hugging Face exports do, ``(1 - A) * finfo(float32).min``
    (M[B,1,S]: 0 or -3.4028235e38), so M and the masked scores reach float32's lowest value."""
    rng = np.random.default_rng(seed)

    def w(name, *shape):
        return _init(name, (rng.normal(0, 1, shape) / np.sqrt(shape[0])).astype(np.float32))

    inits = [
        w("Wq", d, d), w("Wk", d, d), w("Wv", d, d), w("Wo", d, d), w("W1", d, ff), w("W2", ff, d),
        _init("scale", np.array(1 / np.sqrt(d), np.float32)),
        _init("gamma", (1 + 0.1 * rng.normal(size=d)).astype(np.float32)),
        _init("beta", (0.1 * rng.normal(size=d)).astype(np.float32)),
        _init("sqrt2", np.array(np.sqrt(2), np.float32)),
        _init("one", np.array(1, np.float32)),
        _init("half", np.array(0.5, np.float32)),
    ]
    mask_nodes = []
    if padding_mask:
        inits += [_init("lowest", np.array(LOWEST, np.float32)), _init("mask_axes", np.array([1], np.int64))]
        mask_nodes = [
            helper.make_node("Sub", ["one", "A"], ["inverted"]),
            helper.make_node("Mul", ["inverted", "lowest"], ["mask2d"]),
            helper.make_node("Unsqueeze", ["mask2d", "mask_axes"], ["M"]),
        ]
    nodes = mask_nodes + [
        helper.make_node("MatMul", ["X", "Wq"], ["q"]),
        helper.make_node("MatMul", ["X", "Wk"], ["k"]),
        helper.make_node("MatMul", ["X", "Wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "M"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
        helper.make_node("MatMul", ["ctx", "Wo"], ["attn"]),
        helper.make_node("Add", ["X", "attn"], ["res1"]),
        helper.make_node("LayerNormalization", ["res1", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "W1"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["h_div"]),
        helper.make_node("Erf", ["h_div"], ["h_erf"]),
        helper.make_node("Add", ["h_erf", "one"], ["h_erf1"]),
        helper.make_node("Mul", ["h", "h_erf1"], ["h_mul"]),
        helper.make_node("Mul", ["h_mul", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "W2"], ["ffn"]),
        helper.make_node("Add", ["ln", "ffn"], ["Y"]),
    ]
    return _model(
        nodes, "transformer",
        [
            helper.make_tensor_value_info("X", F32, ["B", "S", d]),
            helper.make_tensor_value_info("A", F32, ["B", "S"]) if padding_mask
            else helper.make_tensor_value_info("M", F32, ["B", "S", "S"]),
        ],
        [helper.make_tensor_value_info("Y", F32, ["B", "S", d])],
        inits, opset,
    )


def fp16(opset: int = 17) -> onnx.ModelProto:
    """X[N,16] float16 -Mul-Relu-> r; Y = Sigmoid(r) + Add const (all float16)."""
    inits = [_init("c", np.array(1.5, np.float16)), _init("b", np.array(-0.25, np.float16))]
    nodes = [
        helper.make_node("Mul", ["X", "c"], ["mul"]),
        helper.make_node("Relu", ["mul"], ["relu"]),
        helper.make_node("Sigmoid", ["relu"], ["sig"]),
        helper.make_node("Add", ["sig", "b"], ["Y"]),
    ]
    return _model(
        nodes, "fp16",
        [helper.make_tensor_value_info("X", F16, ["N", 16])],
        [helper.make_tensor_value_info("Y", F16, ["N", 16])],
        inits, opset,
    )


def empty_slice(opset: int = 17) -> onnx.ModelProto:
    """X[N,4] -Relu-> r; Slice(r, 0:0 on axis 1) -> empty [N,0] -Relu-> e; Y = Concat(r, e) * 2.
    ``empty`` and ``e`` always have 0 elements; feeding N=0 makes every tensor empty."""
    inits = [
        _init("starts", np.array([0], np.int64)),
        _init("ends", np.array([0], np.int64)),
        _init("axes", np.array([1], np.int64)),
        _init("two", np.array(2, np.float32)),
    ]
    nodes = [
        helper.make_node("Relu", ["X"], ["r"]),
        helper.make_node("Slice", ["r", "starts", "ends", "axes"], ["empty"]),
        helper.make_node("Relu", ["empty"], ["e"]),
        helper.make_node("Concat", ["r", "e"], ["cat"], axis=1),
        helper.make_node("Mul", ["cat", "two"], ["Y"]),
    ]
    return _model(
        nodes, "empty",
        [helper.make_tensor_value_info("X", F32, ["N", 4])],
        [helper.make_tensor_value_info("Y", F32, ["N", 4])],
        inits, opset,
    )


def passthrough(opset: int = 17) -> onnx.ModelProto:
    """Graph input X is also a graph output; Z = Identity(X) and Y = Relu(Z) are outputs too."""
    nodes = [
        helper.make_node("Identity", ["X"], ["Z"]),
        helper.make_node("Relu", ["Z"], ["Y"]),
    ]
    return _model(
        nodes, "passthrough",
        [helper.make_tensor_value_info("X", F32, ["N", 4])],
        [
            helper.make_tensor_value_info("X", F32, ["N", 4]),
            helper.make_tensor_value_info("Z", F32, ["N", 4]),
            helper.make_tensor_value_info("Y", F32, ["N", 4]),
        ],
        [], opset,
    )


# ------------------------------------------------------------------------------------------ data


def cnn_feeds(n: int, batch: int = 2, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.normal(0, 1, (batch, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def causal_mask(b: int, s: int, fill: float) -> np.ndarray:
    m = np.triu(np.ones((s, s), bool), k=1)
    return np.broadcast_to(np.where(m, np.float32(fill), np.float32(0)), (b, s, s)).astype(np.float32)


def transformer_feeds(seq_lens, batch: int = 2, fill: float = -1e4, d: int = 8, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        {"X": rng.normal(0, 1, (batch, s, d)).astype(np.float32), "M": causal_mask(batch, s, fill)}
        for s in seq_lens
    ]


def padding_feeds(seq_lens, batch: int = 2, d: int = 8, seed: int = 0) -> list[dict]:
    """Feeds for ``transformer(padding_mask=True)``: each row pads 0 to S-1 trailing positions."""
    rng = np.random.default_rng(seed)
    feeds = []
    for s in seq_lens:
        keep = rng.integers(1, s + 1, batch)
        a = (np.arange(s)[None, :] < keep[:, None]).astype(np.float32)
        feeds.append({"X": rng.normal(0, 1, (batch, s, d)).astype(np.float32), "A": a})
    return feeds


def vector_feeds(n: int, batch: int = 3, width: int = 4, dtype=np.float32, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.normal(0, 2, (batch, width)).astype(dtype)} for _ in range(n)]
