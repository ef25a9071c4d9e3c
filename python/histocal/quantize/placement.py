"""Which tensors the recipe quantizes (its placement candidates), from patterns of the graph.

onnxruntime's quantizer puts Q/DQ around every tensor of every operator it supports: residual
Adds, additive attention masks, Softmax and LayerNormalization outputs, and the outputs of the
compute operators: 118 activations on paraphrase-MiniLM-L3. The candidates besides it:

- **compute operators**: onnxruntime told to quantize only Conv, ConvTranspose, Gemm and MatMul.
  It still quantizes their outputs (and every consumer of a quantized tensor reads the dequantized
  value), so on a transformer the residual stream is rounded at every MatMul and LayerNorm (48
  activations on MiniLM).
- **transformer** (offered where a Softmax reads attention scores): NNCF 3.4's ONNX placement for
  ``model_type=TRANSFORMER``, which ignores Add, Sub, Mul, Div, Pow, Sqrt, reductions and
  comparisons, and the MatMul that reads a Softmax (its ``MULTIHEAD_ATTENTION_OUTPUT`` pattern):
  the inputs of the compute operators only, never their outputs, and an operator left in float
  reads the float tensor even where a quantized one reads the same tensor (NNCF puts Q/DQ on the
  edge). On the MiniLM encoder both quantize the same 18 activations; NNCF without SmoothQuant
  gives 22.0 dB held-back output SQNR, this placement with minmax ranges 22.8 dB, "compute
  operators" 11.0 dB (docs/methods.md, "The recipe").

Which is best for a model is a measurement: the recipe scores them on calibration feeds and keeps
onnxruntime's unless another wins (``recipe``). The edge placement is not one of onnxruntime's
options: the model onnxruntime writes is rewired after it (``float_reads.read_float``), under
the ``FLOAT_CONSUMERS_KEY`` extra option, on every route through ``quantize_with_ranges``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import onnx

from .float_reads import FLOAT_CONSUMERS_KEY

if TYPE_CHECKING:
    from .ort import QuantizationArgs

logger = logging.getLogger(__name__)

# Operators whose inputs (weights and activations) NNCF's placement quantizes.
COMPUTE_OP_TYPES = ("Conv", "ConvTranspose", "Gemm", "MatMul")
ORT_PLACEMENT = "onnxruntime"
COMPUTE_PLACEMENT = "compute operators"
TRANSFORMER_PLACEMENT = "transformer"
INPUTS_PLACEMENT = "compute inputs"
# extra_options key (histocal's, onnxruntime ignores it): after onnxruntime quantizes, operators it
# was not told to quantize read the float tensor instead of the dequantized one.
# What may sit between a Softmax and the MatMul reading it in NNCF's MULTIHEAD_ATTENTION_OUTPUT
# pattern (nncf/onnx/quantization/ignored_patterns.py).
_SOFTMAX_TO_MATMUL = ("Reshape",)


@dataclass(frozen=True)
class Placement:
    """One placement candidate.

    Attributes:
        label: ``ORT_PLACEMENT``, ``COMPUTE_PLACEMENT``, ``INPUTS_PLACEMENT``, ``TRANSFORMER_PLACEMENT``
            or ``"given"``.
        op_types_to_quantize: onnxruntime's ``op_types_to_quantize`` for it (None: all).
        pattern: why it is a candidate, for the log and the docs.
        nodes_to_exclude: nodes it leaves in float (added to the caller's).
        extra_options: onnxruntime extra options it sets (over the caller's).
    """

    label: str
    op_types_to_quantize: list[str] | None
    pattern: str
    nodes_to_exclude: tuple[str, ...] = ()
    extra_options: Mapping[str, Any] = field(default_factory=dict)

    def arguments(self, quantization: QuantizationArgs) -> QuantizationArgs:
        """``quantization`` under this placement."""
        excluded = [*(quantization.nodes_to_exclude or []), *self.nodes_to_exclude]
        return replace(
            quantization,
            op_types_to_quantize=self.op_types_to_quantize,
            nodes_to_exclude=excluded or None,
            extra_options={**(quantization.extra_options or {}), **self.extra_options},
        )


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def attention_scores(model: onnx.ModelProto) -> int:
    """How many Softmax nodes read attention scores: a MatMul of two activations, possibly through
    a scaling (Div, Mul) and an additive mask (Add, Where)."""
    initializers = {i.name for i in model.graph.initializer}
    producer = _producers(model)
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


def attention_outputs(model: onnx.ModelProto) -> list[str]:
    """The MatMul/Gemm nodes NNCF's MULTIHEAD_ATTENTION_OUTPUT pattern leaves in float: one input a
    Softmax's output (directly or through a Reshape), the other an activation (the values).
    NNCF also asks the values to come from a Reshape, Transpose, Split, Gather, Squeeze or Concat,
    which every multi-head export has; a single-head graph reads them from their projection, and
    is the same attention. Quantizing the probabilities costs the most where a few dominate a row.
    Empty where such a node has no name (onnxruntime excludes nodes by name; the recipe's
    preparation names them)."""
    producer = _producers(model)
    initializers = {i.name for i in model.graph.initializer}

    def op(tensor: str) -> str:
        return producer[tensor].op_type if tensor in producer else ""

    def from_softmax(tensor: str) -> bool:
        return op(tensor) == "Softmax" or (
            op(tensor) in _SOFTMAX_TO_MATMUL and op(producer[tensor].input[0]) == "Softmax"
        )

    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        a, b = node.input[0], node.input[1]
        if (from_softmax(a) and b not in initializers) or (from_softmax(b) and a not in initializers):
            found.append(node.name)
    if any(not name for name in found):  # onnxruntime excludes nodes by name
        return []
    return found


def placements(model: onnx.ModelProto, op_types_to_quantize: list[str] | None) -> list[Placement]:
    """The placement candidates for ``model``: onnxruntime's first (the default), then onnxruntime on
    the compute operators where the model has them, then NNCF's: its transformer placement where a
    Softmax reads attention scores, else its default (the compute operators' inputs only). A
    caller's ``op_types_to_quantize`` is the only candidate."""
    if op_types_to_quantize:
        return [Placement("given", list(op_types_to_quantize), "the caller's op_types_to_quantize")]
    present = {n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")}
    compute = [t for t in COMPUTE_OP_TYPES if t in present]
    found = [Placement(ORT_PLACEMENT, None, "every operator onnxruntime quantizes")]
    if not compute:
        return found
    found.append(Placement(COMPUTE_PLACEMENT, compute, "onnxruntime on the compute operators only"))
    heads = attention_scores(model)
    if not heads:
        found.append(
            Placement(
                INPUTS_PLACEMENT,
                compute,
                "NNCF's default: the compute operators' inputs only; their outputs and every other operator read "
                "float (onnxruntime's CPU provider then runs a Conv in float: no QLinearConv without a quantized output)",
                (),
                {"OpTypesToExcludeOutputQuantization": compute, FLOAT_CONSUMERS_KEY: True},
            )
        )
        return found
    if heads:
        excluded = attention_outputs(model)
        found.append(
            Placement(
                TRANSFORMER_PLACEMENT,
                compute,
                f"NNCF's TRANSFORMER ({heads} attention Softmax, {len(excluded)} attention-output MatMuls in float): "
                "compute operators' inputs only; residual Adds, masked scores, Softmax and normalisations read float",
                tuple(excluded),
                # The compute operators' outputs are left to their consumers: a float consumer
                # (a residual Add, a bias Add) reads them unrounded.
                {"OpTypesToExcludeOutputQuantization": compute, FLOAT_CONSUMERS_KEY: True},
            )
        )
    return found


__all__ = [
    "COMPUTE_OP_TYPES",
    "COMPUTE_PLACEMENT",
    "INPUTS_PLACEMENT",
    "ORT_PLACEMENT",
    "TRANSFORMER_PLACEMENT",
    "Placement",
    "attention_outputs",
    "attention_scores",
    "placements",
]
