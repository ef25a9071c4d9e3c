"""The float model with switchable quantization per tensor, at run time.

ORT's QDQ model computes every quantized node on dequantized values: a quantized activation x
reaches its readers as DequantizeLinear(QuantizeLinear(x)), a quantized weight W as
DequantizeLinear(W_quantized). ``switched_model`` puts exactly those QuantizeLinear /
DequantizeLinear nodes (same scales, zero points and attributes, taken from the QDQ model) into
the *float* model, behind a switch per tensor:

    x' = Where(quantized[i], DequantizeLinear(QuantizeLinear(x)), x)

where ``quantized`` is one extra boolean graph input (one entry per quantized tensor). Every
reader of x reads x' instead. With every entry false the model is the float model; with every
entry true it computes what ORT's QDQ model computes, on float kernels (the QDQ model may also
fold a Relu into the quantization's clamp at 0; the float model keeps the Relu, same values).
A weight's switch is not in the graph: its readers read a graph input, which ``SwitchedSession``
feeds DequantizeLinear(W_quantized) (computed once, by onnxruntime) or W, by the mask: the same
values, without a Where and a DequantizeLinear over every weight each run.
Any subset of tensors is left in float by feeding a different mask to the same session: no
quantization and no new session per configuration, which is what makes a screen over hundreds of
tensors affordable. Quantized biases (int32, which QuantizeLinear cannot produce) are switched
by their DequantizeLinear from the QDQ model.

Leaving tensor x in float in the real quantizer means excluding every quantized node next to it
(ORT quantizes a tensor when any node that produces or reads it is quantized), so each tensor
carries those node names (``QuantizedTensor.nodes``).
"""

from __future__ import annotations

import heapq
import logging
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import preparation, runs
from .ort import QuantizationArgs, model_ort_quantizes

logger = logging.getLogger(__name__)

SWITCH_INPUT = "histocal_diagnose_quantized"
_QDQ = ("QuantizeLinear", "DequantizeLinear")
_QUANTIZED_SUFFIX = "_quantized"  # ORT's name for a quantized initializer W: W_quantized
_OUTPUT_SUFFIX = "_QuantizeLinear_Input"  # ORT's name for the producer output of a quantized graph output


@dataclass(frozen=True)
class QuantizedTensor:
    """One float tensor the QDQ model quantizes: its name in the float model, whether it is an
    activation or a weight (an initializer), and the quantized nodes next to it (its producer and
    its readers), which ``nodes_to_exclude`` must name to leave it in float; ``shared_scale``: its
    quantization uses a scale other tensors' quantization uses too (ORT gives the output of ops
    such as Slice or Transpose their input's scale)."""

    name: str
    kind: str
    nodes: tuple[str, ...]
    shared_scale: bool = False


@dataclass(frozen=True)
class SwitchedWeight:
    """A switched weight: the graph input its readers read, fed ``quantized`` (its
    DequantizeLinear's output, computed once by onnxruntime) where the mask's entry ``index`` is
    true, else its float ``value``: what Where(mask[index], DequantizeLinear(W_quantized), W)
    gives, without running that Where and DequantizeLinear over the weight every run (on ddddocr's
    8210 x 1024 Gemm weight they were half of a run)."""

    index: int
    input: str
    quantized: np.ndarray
    value: np.ndarray


class SwitchedSession:
    """A session on the switched model that feeds each switched weight's value for the mask."""

    def __init__(self, session: Any, weights: list[SwitchedWeight]) -> None:
        self.session = session
        self.weights = weights

    def get_outputs(self) -> Any:
        return self.session.get_outputs()

    def run(self, output_names: list[str] | None, feed: Mapping[str, Any]) -> Any:
        mask = feed[SWITCH_INPUT]
        values = {w.input: w.quantized if mask[w.index] else w.value for w in self.weights}
        return self.session.run(output_names, {**feed, **values})


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


def _float_name(name: str) -> str:
    return name[: -len(_OUTPUT_SUFFIX)] if name.endswith(_OUTPUT_SUFFIX) else name


def switched_model(
    qdq: onnx.ModelProto, float_model: onnx.ModelProto
) -> tuple[onnx.ModelProto, list[QuantizedTensor], list[SwitchedWeight]]:
    """The float model with one run-time switch per tensor the QDQ model quantizes (module
    docstring), those tensors in switch order (entry i of the ``SWITCH_INPUT`` mask switches
    tensor i), and the switched weights, which ``SwitchedSession`` feeds. A quantized value with
    no float counterpart under ORT's names is not switched."""
    qgraph = qdq.graph
    qproducer = {o: n for n in qgraph.node for o in n.output}
    qreaders: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in qgraph.node:
        for i in n.input:
            qreaders[i].append(n)
    qinit = {t.name: t for t in qgraph.initializer}

    model = onnx.ModelProto()
    model.CopyFrom(float_model)
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    graph_inputs = {i.name for i in graph.input}
    initializers = {t.name for t in graph.initializer}

    order: dict[str, int] = {}  # float tensor -> switch entry
    kinds: dict[str, str] = {}
    nodes: dict[str, dict[str, None]] = {}
    pairs: dict[str, tuple[onnx.NodeProto | None, onnx.NodeProto]] = {}  # tensor -> (Q or None, DQ)
    for dq in qgraph.node:
        if dq.op_type != "DequantizeLinear":
            continue
        q = qproducer.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear":
            source, name, kind = q.input[0], _float_name(q.input[0]), "activation"
            if name not in producer and name not in graph_inputs:
                continue
        elif dq.input[0] in qinit and dq.input[0].endswith(_QUANTIZED_SUFFIX):
            source, name, kind = None, dq.input[0][: -len(_QUANTIZED_SUFFIX)], "weight"
            if name not in initializers:
                logger.debug("diagnose: %s has no float initializer %r; it is not switched", dq.input[0], name)
                continue
        else:
            continue
        adjacent = nodes.setdefault(name, {})
        made_by = qproducer.get(source) if source is not None else None
        if made_by is not None and made_by.op_type not in _QDQ and made_by.name:
            adjacent[made_by.name] = None
        for r in qreaders.get(dq.output[0], ()):
            if r.op_type not in _QDQ and r.name:
                adjacent[r.name] = None
        if name not in order:
            order[name] = len(order)
            kinds[name] = kind
            pairs[name] = (q if kind == "activation" else None, dq)
    if not order:
        raise ValueError("the quantized model has no QuantizeLinear/DequantizeLinear pairs to switch (QDQ format only)")

    copied: set[str] = set()

    def copy_initializer(name: str) -> None:
        if name and name in qinit and name not in copied:
            copied.add(name)
            t = onnx.TensorProto()
            t.CopyFrom(qinit[name])
            t.name = f"histocal_q_{name}"
            graph.initializer.append(t)

    renamed_outputs: dict[str, str] = {}  # activation produced by a node -> its float value's new name
    rewired_reads: dict[str, str] = {}  # graph input or weight -> its switched value's name
    new_nodes = []
    weights: list[tuple[int, str, onnx.NodeProto]] = []  # (switch entry, float initializer, its DequantizeLinear)
    for name, i in order.items():
        q, dq = pairs[name]
        if q is None:  # a weight: its readers read an input, fed its value for the mask (``SwitchedSession``)
            rewired_reads[name] = f"{name}__histocal_switched"
            weights.append((i, name, dq))
            continue
        position = f"histocal_switch_index_{i}"
        graph.initializer.append(numpy_helper.from_array(np.array(i, np.int64), position))
        flag = f"histocal_switch_{i}"
        new_nodes.append(helper.make_node("Gather", [SWITCH_INPUT, position], [flag], axis=0))
        if name in producer:  # the producer writes the float value; the Where writes the name
            value, switched = f"{name}__histocal_float", name
            renamed_outputs[name] = value
        else:  # a graph input or a weight: its readers are rewired to the Where
            value, switched = name, f"{name}__histocal_switched"
            rewired_reads[name] = switched
        for t in [*(q.input[1:] if q is not None else [dq.input[0]]), *dq.input[1:]]:
            copy_initializer(t)
        quantized = f"{name}__histocal_q"
        if q is not None:
            new_nodes.append(
                helper.make_node(
                    "QuantizeLinear", [value, *(f"histocal_q_{t}" if t else "" for t in q.input[1:])], [quantized]
                )
            )
            new_nodes[-1].attribute.extend(q.attribute)
            dq_source = quantized
        else:
            dq_source = f"histocal_q_{dq.input[0]}"
        dequantized = f"{name}__histocal_dq"
        new_nodes.append(
            helper.make_node(
                "DequantizeLinear", [dq_source, *(f"histocal_q_{t}" if t else "" for t in dq.input[1:])], [dequantized]
            )
        )
        new_nodes[-1].attribute.extend(dq.attribute)
        new_nodes.append(helper.make_node("Where", [flag, dequantized, value], [switched]))
    for n in graph.node:
        for k, o in enumerate(n.output):
            if o in renamed_outputs:
                n.output[k] = renamed_outputs[o]
        for k, i in enumerate(n.input):
            if i in rewired_reads:
                n.input[k] = rewired_reads[i]
    graph.node.extend(new_nodes)
    graph.input.append(helper.make_tensor_value_info(SWITCH_INPUT, TensorProto.BOOL, [len(order)]))
    floats = {t.name: t for t in graph.initializer}
    weight_dq = runs.dequantized(qdq, [dq for _, _, dq in weights]) if weights else {}
    switched_weights = []
    for i, name, dq in weights:
        weight = numpy_helper.to_array(floats[name])
        graph.input.append(helper.make_tensor_value_info(rewired_reads[name], floats[name].data_type, weight.shape))
        switched_weights.append(SwitchedWeight(i, rewired_reads[name], weight_dq[dq.output[0]], weight))
    read = _names_read(graph) | {o.name for o in graph.output}
    unread = {name for _, name, _ in weights if name not in read}  # fed instead: not kept twice
    kept_initializers = [t for t in graph.initializer if t.name not in unread]
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers)
    # a weight also listed as a graph input (older exporters) goes with its initializer: an input
    # left behind would be required from every feed
    kept_inputs = [i for i in graph.input if i.name not in unread]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    kept = [v for v in graph.value_info if v.name not in renamed_outputs]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    _sort_topologically(graph)
    scale_users: dict[str, int] = defaultdict(int)
    for n in qgraph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 1:
            scale_users[n.input[1]] += 1
    tensors = [
        QuantizedTensor(
            name,
            kinds[name],
            tuple(nodes[name]),
            pairs[name][0] is not None and scale_users[pairs[name][0].input[1]] > 1,  # type: ignore[union-attr]
        )
        for name in order
    ]
    return model, tensors, switched_weights


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of ``graph`` or of its subgraphs reads."""
    out: set[str] = set()
    for n in graph.node:
        out.update(n.input)
        for a in n.attribute:
            for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                out |= _names_read(g)
    return out


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


def name_nodes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with a name for every unnamed node (``nodes_to_exclude`` can only name named
    nodes): ``<op_type>_<position in the graph>``, made unique; and how many were named. The same
    model always gets the same names; a model whose nodes are all named is returned as is.

    Args:
        model: the model.

    Returns:
        ``(model with every node named, how many nodes were named)``.
    """
    if all(n.name for n in model.graph.node):
        return model, 0
    named = onnx.ModelProto()
    named.CopyFrom(model)
    return named, preparation.name_nodes(named)


def model_ort_converts(model: onnx.ModelProto, quantization: QuantizationArgs) -> onnx.ModelProto:
    """The float model onnxruntime quantizes with ``quantization`` (quantize_static's): ``model``,
    or where its opset cannot express the quantization (16-bit types: opset 21) ORT's conversion of
    it, which can add tensors, and whose opset takes the switches' QuantizeLinear types. Nodes the
    conversion adds have no name (nor in ORT's conversion): they cannot be left in float."""
    converted = model_ort_quantizes(
        model,
        quantization.weight_type,
        quantization.activation_type,
        quantization.extra_options,
    )
    return model if converted is None else converted
