"""Small ONNX models for the calibrator tests, built with the shared builder (graphs.py).

Every model is ORT-loadable: IR version 10 (onnxruntime 1.31 refuses the IR 14 that onnx 1.23
writes by default) and an explicit default-domain opset.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .graphs import F16, GraphBuilder, tensor


def cnn(opset: int = 17, seed: int = 0) -> onnx.ModelProto:
    """X[N,3,8,8] -Conv-Relu-MaxPool-> p; p + Conv1x1(p) -Resize(x2)-GlobalAveragePool-> Y[N,4,1,1]."""
    g = GraphBuilder(seed)
    rng = g.rng
    g.const(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "W1")
    g.const(rng.normal(0, 0.1, (4,)).astype(np.float32), "B1")
    g.const(rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32), "W2")
    g.const(np.array([1, 1, 2, 2], np.float32), "scales")
    g.node("Conv", ["X", "W1", "B1"], output="conv1", name="conv1", pads=[1, 1, 1, 1])
    g.node("Relu", ["conv1"], output="relu1", name="relu1")
    g.node("MaxPool", ["relu1"], output="pool", name="pool", kernel_shape=[2, 2], strides=[2, 2])
    g.node("Conv", ["pool", "W2"], output="conv2", name="conv2")
    g.node("Add", ["pool", "conv2"], output="add", name="add")
    g.node("Resize", ["add", "", "scales"], output="resize", name="resize", mode="nearest")
    g.node("GlobalAveragePool", ["resize"], output="Y", name="gap")
    return g.model("cnn", [tensor("X", ["N", 3, 8, 8])], [tensor("Y", ["N", 4, 1, 1])], opset)


LOWEST = float(np.finfo(np.float32).min)


def transformer(
    opset: int = 17, d: int = 8, ff: int = 16, seed: int = 1, padding_mask: bool = False
) -> onnx.ModelProto:
    """One encoder block on X[B,S,D] with an additive attention mask M[B,S,S] (dynamic B and S):
    single-head attention (MatMul, Softmax), residual, LayerNormalization, Erf-GELU feed-forward.

    ``padding_mask``: the model takes a 0/1 padding mask A[B,S] instead and builds the additive
    mask in the graph as recent Hugging Face exports do, ``(1 - A) * finfo(float32).min``
    (M[B,1,S]: 0 or -3.4028235e38), so M and the masked scores reach float32's lowest value."""
    g = GraphBuilder(seed)

    def w(name, *shape):
        g.const((g.rng.normal(0, 1, shape) / np.sqrt(shape[0])).astype(np.float32), name)

    for name, shape in (
        ("Wq", (d, d)),
        ("Wk", (d, d)),
        ("Wv", (d, d)),
        ("Wo", (d, d)),
        ("W1", (d, ff)),
        ("W2", (ff, d)),
    ):
        w(name, *shape)
    g.const(np.array(1 / np.sqrt(d), np.float32), "scale")
    g.const((1 + 0.1 * g.rng.normal(size=d)).astype(np.float32), "gamma")
    g.const((0.1 * g.rng.normal(size=d)).astype(np.float32), "beta")
    g.const(np.array(np.sqrt(2), np.float32), "sqrt2")
    g.const(np.array(1, np.float32), "one")
    g.const(np.array(0.5, np.float32), "half")
    if padding_mask:
        g.const(np.array(LOWEST, np.float32), "lowest")
        g.const(np.array([1], np.int64), "mask_axes")
        g.node("Sub", ["one", "A"], output="inverted")
        g.node("Mul", ["inverted", "lowest"], output="mask2d")
        g.node("Unsqueeze", ["mask2d", "mask_axes"], output="M")
    for op, inputs, output, attrs in (
        ("MatMul", ["X", "Wq"], "q", {}),
        ("MatMul", ["X", "Wk"], "k", {}),
        ("MatMul", ["X", "Wv"], "v", {}),
        ("Transpose", ["k"], "kt", {"perm": [0, 2, 1]}),
        ("MatMul", ["q", "kt"], "scores", {}),
        ("Mul", ["scores", "scale"], "scaled", {}),
        ("Add", ["scaled", "M"], "masked", {}),
        ("Softmax", ["masked"], "probs", {"axis": -1}),
        ("MatMul", ["probs", "v"], "ctx", {}),
        ("MatMul", ["ctx", "Wo"], "attn", {}),
        ("Add", ["X", "attn"], "res1", {}),
        ("LayerNormalization", ["res1", "gamma", "beta"], "ln", {"axis": -1, "epsilon": 1e-5}),
        ("MatMul", ["ln", "W1"], "h", {}),
        ("Div", ["h", "sqrt2"], "h_div", {}),
        ("Erf", ["h_div"], "h_erf", {}),
        ("Add", ["h_erf", "one"], "h_erf1", {}),
        ("Mul", ["h", "h_erf1"], "h_mul", {}),
        ("Mul", ["h_mul", "half"], "gelu", {}),
        ("MatMul", ["gelu", "W2"], "ffn", {}),
        ("Add", ["ln", "ffn"], "Y", {}),
    ):
        g.node(op, inputs, output=output, **attrs)
    mask = tensor("A", ["B", "S"]) if padding_mask else tensor("M", ["B", "S", "S"])
    return g.model("transformer", [tensor("X", ["B", "S", d]), mask], [tensor("Y", ["B", "S", d])], opset)


def fp16(opset: int = 17) -> onnx.ModelProto:
    """X[N,16] float16 -Mul-Relu-> r; Y = Sigmoid(r) + Add const (all float16)."""
    g = GraphBuilder()
    g.const(np.array(1.5, np.float16), "c")
    g.const(np.array(-0.25, np.float16), "b")
    g.node("Mul", ["X", "c"], output="mul")
    g.node("Relu", ["mul"], output="relu")
    g.node("Sigmoid", ["relu"], output="sig")
    g.node("Add", ["sig", "b"], output="Y")
    return g.model("fp16", [tensor("X", ["N", 16], F16)], [tensor("Y", ["N", 16], F16)], opset)


def empty_slice(opset: int = 17) -> onnx.ModelProto:
    """X[N,4] -Relu-> r; Slice(r, 0:0 on axis 1) -> empty [N,0] -Relu-> e; Y = Concat(r, e) * 2.
    ``empty`` and ``e`` always have 0 elements; feeding N=0 makes every tensor empty."""
    g = GraphBuilder()
    g.const(np.array([0], np.int64), "starts")
    g.const(np.array([0], np.int64), "ends")
    g.const(np.array([1], np.int64), "axes")
    g.const(np.array(2, np.float32), "two")
    g.node("Relu", ["X"], output="r")
    g.node("Slice", ["r", "starts", "ends", "axes"], output="empty")
    g.node("Relu", ["empty"], output="e")
    g.node("Concat", ["r", "e"], output="cat", axis=1)
    g.node("Mul", ["cat", "two"], output="Y")
    return g.model("empty", [tensor("X", ["N", 4])], [tensor("Y", ["N", 4])], opset)


def passthrough(opset: int = 17) -> onnx.ModelProto:
    """Graph input X is also a graph output; Z = Identity(X) and Y = Relu(Z) are outputs too."""
    g = GraphBuilder()
    g.node("Identity", ["X"], output="Z")
    g.node("Relu", ["Z"], output="Y")
    return g.model("passthrough", [tensor("X", ["N", 4])], [tensor(n, ["N", 4]) for n in ("X", "Z", "Y")], opset)


def paddle_detector(opset: int = 11, initializers_as_inputs: bool = False) -> onnx.ModelProto:
    """A text detector shaped as paddle2onnx exports one (opset 11, DB head): X[N,3,16,16]
    -Conv-Relu-> c1 -Conv(stride 2)-Relu-> c2 -Resize(x2, by ``sizes``)-> up; Y = Sigmoid(Conv(c1 + up)).
    The Resizes' ``roi`` and ``scales`` inputs are empty float tensors from Constant nodes named
    ``p2o.helper.constant.<n>`` (what paddle2onnx writes): calibrated, never quantized by ORT.
    With ``initializers_as_inputs`` every weight is also a graph input (older exporters)."""
    g = GraphBuilder(3)
    rng = g.rng
    g.const(rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32), "conv1.w")
    g.const(rng.normal(0, 0.2, (8, 8, 3, 3)).astype(np.float32), "conv2.w")
    g.const(rng.normal(0, 0.3, (1, 8, 1, 1)).astype(np.float32), "head.w")
    for i, name in enumerate(("roi", "scales")):
        empty = helper.make_tensor(f"p2o.helper.constant.{140 + i}", TensorProto.FLOAT, [0], [])
        g.nodes.append(
            helper.make_node("Constant", [], [f"p2o.helper.constant.{140 + i}"], name=f"p2o.{name}", value=empty)
        )
    g.const(np.array([1, 8, 16, 16], np.int64), "sizes")
    g.node("Conv", ["X", "conv1.w"], output="c1", name="conv1", pads=[1, 1, 1, 1])
    g.node("Relu", ["c1"], output="r1", name="relu1")
    g.node("Conv", ["r1", "conv2.w"], output="c2", name="conv2", pads=[1, 1, 1, 1], strides=[2, 2])
    g.node("Relu", ["c2"], output="r2", name="relu2")
    g.node(
        "Resize", ["r2", "p2o.helper.constant.140", "p2o.helper.constant.141", "sizes"], output="up",
        name="resize", mode="nearest",
    )  # fmt: skip
    g.node("Add", ["r1", "up"], output="fused", name="add")
    g.node("Conv", ["fused", "head.w"], output="logits", name="head")
    g.node("Sigmoid", ["logits"], output="Y", name="sigmoid")
    inputs = [tensor("X", ["N", 3, 16, 16])]
    if initializers_as_inputs:
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.inits]
    return g.model("paddle_detector", inputs, [tensor("Y", ["N", 1, 16, 16])], opset)


def detector_feeds(n: int, batch: int = 1, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"X": rng.uniform(0, 1, (batch, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


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
        {"X": rng.normal(0, 1, (batch, s, d)).astype(np.float32), "M": causal_mask(batch, s, fill)} for s in seq_lens
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
