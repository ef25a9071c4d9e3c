"""Which tensors the recipe quantizes (its placement candidates), from patterns of the graph.

onnxruntime's quantizer puts Q/DQ around every tensor of every operator it supports: residual
Adds, additive attention masks, Softmax outputs and LayerNormalization included. NNCF's
``model_type=TRANSFORMER`` (and its default placement on convolutional models) quantizes the
inputs of the compute operators (Conv, Gemm, MatMul) and leaves the rest in float: on a MiniLM
encoder 48 quantized activations against onnxruntime's 111, and +9 dB of output SQNR. Which of the
two is better for a model is a measurement: the recipe scores both on calibration feeds and keeps
onnxruntime's unless the other wins (``recipe``).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

# Operators whose inputs (weights and activations) NNCF's placement quantizes.
COMPUTE_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
ORT_PLACEMENT = "onnxruntime"
COMPUTE_PLACEMENT = "compute operators"


@dataclass(frozen=True)
class Placement:
    """One placement candidate.

    Attributes:
        label: ``"onnxruntime"`` (every operator ORT quantizes) or ``"compute operators"``.
        op_types_to_quantize: onnxruntime's ``op_types_to_quantize`` for it (None: all).
        pattern: why it is a candidate, for the log and the docs.
    """

    label: str
    op_types_to_quantize: list[str] | None
    pattern: str


def attention_scores(model: onnx.ModelProto) -> int:
    """How many Softmax nodes read attention scores: a MatMul of two activations, possibly through
    a scaling (Div, Mul) and an additive mask (Add, Where)."""
    initializers = {i.name for i in model.graph.initializer}
    producer = {out: node for node in model.graph.node for out in node.output}
    found = 0
    for node in model.graph.node:
        if node.op_type != "Softmax":
            continue
        seen, tensor = 0, node.input[0]
        while tensor in producer and seen < 4:
            source = producer[tensor]
            if source.op_type == "MatMul":
                found += all(i not in initializers and i in producer for i in source.input[:2])
                break
            if source.op_type not in ("Add", "Div", "Mul", "Where", "Sub"):
                break
            activations = [i for i in source.input if i in producer and i not in initializers]
            tensor, seen = (activations[0] if activations else ""), seen + 1
    return found


def placements(model: onnx.ModelProto, op_types_to_quantize: list[str] | None) -> list[Placement]:
    """The placement candidates for ``model``: onnxruntime's first (the default), then the compute
    operators' inputs where the model has other quantizable operators. A caller's
    ``op_types_to_quantize`` is the only candidate."""
    if op_types_to_quantize:
        return [Placement("given", list(op_types_to_quantize), "the caller's op_types_to_quantize")]
    present = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
    compute = [t for t in COMPUTE_OP_TYPES if t in present]
    found = [Placement(ORT_PLACEMENT, None, "every operator onnxruntime quantizes")]
    if compute:
        heads = attention_scores(model)
        pattern = (
            f"transformer ({heads} attention Softmax): residual Adds, masked scores, Softmax outputs and "
            "normalisations in float"
            if heads
            else "the inputs of the compute operators only"
        )
        found.append(Placement(COMPUTE_PLACEMENT, compute, pattern))
    return found


__all__ = ["COMPUTE_OP_TYPES", "COMPUTE_PLACEMENT", "ORT_PLACEMENT", "Placement", "attention_scores", "placements"]
