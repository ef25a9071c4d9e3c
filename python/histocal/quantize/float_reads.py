"""Operators left in float read the float tensor: the edge placement onnxruntime cannot write.

onnxruntime's QDQ quantizer rounds a tensor once (Q then DQ) and every consumer reads the
dequantized value, the operators it was not told to quantize included. NNCF puts Q/DQ on the
edge instead: only the quantized operator reads the rounded value. ``rewire_float_consumers``
gives an onnxruntime-written model that form (the float consumers read the tensor Q reads), and
``read_float`` applies it to a written file when the extra option ``FLOAT_CONSUMERS_KEY`` asks for
it (``placement``'s transformer candidate); ``quantize_with_ranges`` calls it on every route.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import onnx

logger = logging.getLogger(__name__)

FLOAT_CONSUMERS_KEY = "FloatConsumersReadFloat"


class Quantized(Protocol):
    """What onnxruntime was told to quantize (``ort.QuantizationArgs`` has these fields)."""

    @property
    def op_types_to_quantize(self) -> Sequence[str] | None: ...
    @property
    def nodes_to_quantize(self) -> Sequence[str] | None: ...
    @property
    def nodes_to_exclude(self) -> Sequence[str] | None: ...
    @property
    def extra_options(self) -> Mapping[str, Any] | None: ...


def _quantized_consumer(node: onnx.NodeProto, quantization: Quantized) -> bool:
    """Whether onnxruntime was told to quantize ``node`` (its type, its name)."""
    if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
        return True
    types, only = quantization.op_types_to_quantize, quantization.nodes_to_quantize
    return (
        (not types or node.op_type in types)
        and node.name not in (quantization.nodes_to_exclude or ())
        and (not only or node.name in only)
    )


def rewire_float_consumers(model: onnx.ModelProto, quantization: Quantized) -> int:
    """In a QDQ model onnxruntime wrote, make every operator it was not told to quantize read the
    float tensor where it reads an activation's DequantizeLinear output; Q/DQ pairs left unread are
    removed. Returns how many inputs were rewired."""
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    float_of: dict[str, str] = {}  # DQ output -> the float tensor its Q reads
    quantize_input = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in quantize_input:
            source = quantize_input[node.input[0]]
            if source not in initializers:
                float_of[node.output[0]] = source
    rewired = 0
    for node in graph.node:
        if _quantized_consumer(node, quantization):
            continue
        for i, name in enumerate(node.input):
            if name in float_of:
                node.input[i] = float_of[name]
                rewired += 1
    _drop_unread(graph, outputs | {i for n in graph.node for i in n.input})
    return rewired


def _drop_unread(graph: onnx.GraphProto, read: Collection[str]) -> None:
    """Remove the DequantizeLinear nodes no one reads, then the QuantizeLinear nodes that fed only them."""
    unread = [n for n in graph.node if n.op_type == "DequantizeLinear" and n.output[0] not in read]
    if not unread:
        return
    for node in unread:
        graph.node.remove(node)
    still = {o.name for o in graph.output} | {i for n in graph.node for i in n.input}
    for node in [n for n in graph.node if n.op_type == "QuantizeLinear" and n.output[0] not in still]:
        graph.node.remove(node)


def read_float(path: Path, quantization: Quantized) -> None:
    """``rewire_float_consumers`` on the model file at ``path`` when ``quantization`` asks for it
    (``FLOAT_CONSUMERS_KEY``); external data files are left as they are."""
    if not (quantization.extra_options or {}).get(FLOAT_CONSUMERS_KEY, False):
        return
    model = onnx.load(path.as_posix(), load_external_data=False)
    rewired = rewire_float_consumers(model, quantization)
    if rewired:
        onnx.save_model(model, path.as_posix())
    logger.debug("float reads: %d float operator inputs read the float tensor in %s", rewired, path.name)


__all__ = ["FLOAT_CONSUMERS_KEY", "Quantized", "read_float", "rewire_float_consumers"]
