"""A quantized model whose quantization can be switched off per tensor at run time.

ORT's QDQ model computes every quantized node on dequantized values: a quantized activation x
reaches its readers as DequantizeLinear(QuantizeLinear(x)), a quantized weight W as
DequantizeLinear(W_quantized). ``switched_model`` rewrites each such DequantizeLinear output d into

    d' = Where(quantized[i], d, x)

where ``quantized`` is one extra boolean graph input (one entry per quantized float tensor) and x
is the float tensor (the QuantizeLinear's input, or the float model's initializer of the weight).
With every entry true the model computes what the QDQ model computes (on float kernels: ORT does
not fuse a DequantizeLinear that feeds a Where); with every entry false it is the float model.
Any subset of tensors is left in float by feeding a different mask to the same session: no
quantization and no new session per configuration, which is what makes a screen over hundreds of
tensors affordable.

Leaving tensor x in float in the real quantizer means excluding every quantized node next to it
(ORT quantizes a tensor when any node that produces or reads it is quantized), so each tensor
carries those node names (``QuantizedTensor.nodes``).
"""

from __future__ import annotations

import heapq
import logging
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

logger = logging.getLogger(__name__)

SWITCH_INPUT = "histocal_diagnose_quantized"
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_QUANTIZED_SUFFIX = "_quantized"  # ORT's name for a quantized initializer W: W_quantized


@dataclass(frozen=True)
class QuantizedTensor:
    """One float tensor the QDQ model quantizes: its name in the float model, whether it is an
    activation or a weight (an initializer), and the quantized nodes next to it (its producer and
    its readers), which ``nodes_to_exclude`` must name to leave it in float."""

    name: str
    kind: str
    nodes: tuple[str, ...]


def quantized_nodes(qdq: onnx.ModelProto) -> list[str]:
    """The names of the QDQ model's nodes that compute on quantized values: every node other than
    QuantizeLinear/DequantizeLinear that reads a DequantizeLinear output or whose output is
    quantized; in graph order."""
    graph = qdq.graph
    dq_outputs = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    q_inputs = {n.input[0] for n in graph.node if n.op_type == "QuantizeLinear"}
    return [
        n.name
        for n in graph.node
        if n.op_type not in _QDQ and (any(i in dq_outputs for i in n.input) or any(o in q_inputs for o in n.output))
    ]


def switched_model(qdq: onnx.ModelProto, float_model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[QuantizedTensor]]:
    """The QDQ model with one run-time switch per quantized float tensor (module docstring), and
    those tensors in switch order (entry i of the ``SWITCH_INPUT`` mask switches tensor i).
    Dequantized values with no float counterpart (a quantized initializer the float model does
    not hold under ORT's name) stay quantized."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in graph.node:
        for i in n.input:
            readers[i].append(n)
    initializers = {t.name for t in graph.initializer}
    float_weights = {t.name: t for t in float_model.graph.initializer}

    index: dict[str, int] = {}  # float tensor -> switch entry
    kinds: dict[str, str] = {}
    nodes: dict[str, dict[str, None]] = {}
    rewired: list[tuple[str, str, str, str]] = []  # (DequantizeLinear output, its new name, float value, tensor)
    for n in list(graph.node):
        if n.op_type != "DequantizeLinear":
            continue
        source = n.input[0]
        q = producer.get(source)
        if q is not None and q.op_type == "QuantizeLinear":
            float_name, kind = q.input[0], "activation"
        elif source in initializers and source.endswith(_QUANTIZED_SUFFIX):
            float_name, kind = source[: -len(_QUANTIZED_SUFFIX)], "weight"
            if float_name not in float_weights:
                logger.debug("diagnose: %s has no float initializer %r; it stays quantized", source, float_name)
                continue
        else:
            continue
        adjacent = nodes.setdefault(float_name, {})
        made_by = producer.get(float_name)
        if made_by is not None and made_by.op_type not in _QDQ and made_by.name:
            adjacent[made_by.name] = None
        for r in readers.get(n.output[0], ()):
            if r.op_type not in _QDQ and r.name:
                adjacent[r.name] = None
        kinds.setdefault(float_name, kind)
        index.setdefault(float_name, len(index))
        value = float_name
        if kind == "weight":
            # ORT may give the dequantized weight the float weight's own name: a copy of it, renamed.
            value = f"{float_name}__histocal_float"
            if value not in initializers:
                copy = onnx.TensorProto()
                copy.CopyFrom(float_weights[float_name])
                copy.name = value
                graph.initializer.append(copy)
                initializers.add(value)
        rewired.append((n.output[0], f"{n.output[0]}__histocal_dq", value, float_name))

    if not index:
        raise ValueError("the quantized model has no QuantizeLinear/DequantizeLinear pairs to switch (QDQ format only)")
    renamed = {old: new for old, new, _, _ in rewired}
    for n in graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] in renamed:
            n.output[0] = renamed[n.output[0]]
    flags: dict[str, str] = {}
    for name, i in index.items():
        position = f"histocal_switch_index_{i}"
        graph.initializer.append(numpy_helper.from_array(np.array(i, np.int64), position))
        flags[name] = f"histocal_switch_{i}"
        graph.node.append(helper.make_node("Gather", [SWITCH_INPUT, position], [flags[name]], axis=0))
    for old, new, value, float_name in rewired:
        graph.node.append(helper.make_node("Where", [flags[float_name], new, value], [old]))
    graph.input.append(helper.make_tensor_value_info(SWITCH_INPUT, TensorProto.BOOL, [len(index)]))
    # Value infos of the renamed outputs would now describe the wrong tensors: shapes are re-inferred.
    kept = [v for v in graph.value_info if v.name not in renamed]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    _sort_topologically(graph)
    tensors = [QuantizedTensor(_display_name(name), kinds[name], tuple(nodes[name])) for name in index]
    return model, tensors


def _sort_topologically(graph: onnx.GraphProto) -> None:
    """Reorder the nodes so that each comes after the producers of its inputs (the appended Where
    nodes must precede their readers)."""
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    waiting: dict[str, list[int]] = defaultdict(list)
    missing = []
    for k, n in enumerate(pending):
        need = {i for i in n.input if i not in available}
        missing.append(len(need))
        for i in need:
            waiting[i].append(k)
    ready = [k for k, m in enumerate(missing) if m == 0]
    heapq.heapify(ready)  # the original order wherever the dependencies allow it
    while ready:
        k = heapq.heappop(ready)
        ordered.append(pending[k])
        for o in pending[k].output:
            if o in available:
                continue
            available.add(o)
            for j in waiting.pop(o, ()):
                missing[j] -= 1
                if missing[j] == 0:
                    heapq.heappush(ready, j)
    if len(ordered) != len(pending):
        raise ValueError("diagnose: the switched model's graph has a cycle or an unproduced input")
    del graph.node[:]
    graph.node.extend(ordered)


def _display_name(name: str) -> str:
    """The float model's name of a tensor (ORT renames a quantized graph output Y's producer
    output to Y_QuantizeLinear_Input)."""
    suffix = "_QuantizeLinear_Input"
    return name[: -len(suffix)] if name.endswith(suffix) else name


def name_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with a name for every unnamed node (``nodes_to_exclude`` can only name named
    nodes): ``<op_type>_<position in the graph>``, made unique; and how many were named. The same
    model always gets the same names; a model whose nodes are all named is returned as is."""
    graph = model.graph
    if all(n.name for n in graph.node):
        return model, 0
    named = onnx.ModelProto()
    named.CopyFrom(model)
    used = {n.name for n in named.graph.node if n.name}
    count = 0
    for i, n in enumerate(named.graph.node):
        if n.name:
            continue
        name, k = f"{n.op_type}_{i}", 1
        while name in used:
            name, k = f"{n.op_type}_{i}_{k}", k + 1
        n.name = name
        used.add(name)
        count += 1
    return named, count
