"""MinMax's augmented graph in linear time: onnxruntime's ReduceMin/ReduceMax nodes and outputs,
the same ones in the same order.

ORT's ``MinMaxCalibrater.augment_graph`` (1.31, 1.32) is quadratic in the calibrated tensors: for
each tensor and each reduce op it scans the node list for the tensor's first consumer and
rebuilds a dict of every value info. The result is fixed by that order, though: every tensor's
nodes go just before its first consumer among the model's nodes (at the end when it has none),
the ReduceMax pair before the ReduceMin pair (ORT inserts ReduceMin first, and then finds it as the
tensor's first consumer), the tensors of one consumer in the order ORT visits them. This module
computes that order with one pass over the nodes, then moves the nodes into it with one sort of
the node list (pointers moved, the model's nodes never copied). A model whose tensor names
collide with the names ORT gives its added nodes' outputs (``<tensor>_ReduceMin``, ...) changes
ORT's later look-ups, so :func:`names_collide` sends it to ORT's own code.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

REDUCE_OPS = ("ReduceMin", "ReduceMax")


def added_names(tensor: str) -> list[str]:
    """The names ORT's MinMax gives the outputs it adds for ``tensor``: each reduce op's output
    (a graph output) and its output before the Reshape."""
    return [n for op in REDUCE_OPS for n in (f"{tensor}_{op}", f"{tensor}_{op}_Reshape")]


def names_collide(tensors: Iterable[str]) -> bool:
    """Whether a calibrated tensor has a name ORT's MinMax gives an added output of another
    (ORT's look-ups of the tensor's consumers and value info would then see the added ones)."""
    names = set(tensors)
    return any(added in names for tensor in names for added in added_names(tensor))


def op_version(op_type: str, model: onnx.ModelProto) -> int:
    """ORT's ``get_op_version``: the version of the first imported opset that defines ``op_type``."""
    for opset_import in model.opset_import:
        if onnx.defs.has(op_type, opset_import.domain):
            return int(opset_import.version)
    raise RuntimeError(f"Model does not contain a version for '{op_type}'.")


def first_consumers(nodes: Iterable[onnx.NodeProto]) -> dict[str, int]:
    """Each tensor name's first consuming node (its index); a name no node reads is absent."""
    first: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            first.setdefault(name, i)
    return first


def add_reduce_min_max(
    model: onnx.ModelProto,
    tensors: Iterable[str],
    value_infos: Mapping[str, onnx.ValueInfoProto],
    per_channel: bool,
    scalars_whole: bool = True,
) -> None:
    """Add ORT's MinMax nodes and outputs for ``tensors`` (in their iteration order, as ORT's
    loop over the same set) to ``model`` in place: what ``MinMaxCalibrater.augment_graph`` adds,
    the initializers and outputs appended in its order and the nodes where it inserts them.

    Args:
        model: the model to augment (shape-inferred, as ORT's calibrators load it).
        tensors: the tensors to calibrate, as ``select_tensors_to_calibrate`` returns them.
        value_infos: their value infos, as ``select_tensors_to_calibrate`` returns them.
        per_channel: reduce over every axis but 1 (ORT's per-channel ranges).
        scalars_whole: per channel, reduce a tensor known to be rank 0 over every axis (no
            axes) instead of ORT's axis 0, which onnxruntime cannot load for a scalar.

    Raises:
        ValueError: a tensor without a value info (ORT's error and message).
        RuntimeError: per channel, no imported opset defines the reduce ops (ORT's).
    """
    graph = model.graph
    count = len(graph.node)
    first = first_consumers(graph.node)
    shape_name = str(uuid.uuid4())
    graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), shape_name))
    versions: dict[str, int] = {}
    before: dict[int, list[list[onnx.NodeProto]]] = {}  # a consumer's index -> its tensors' nodes
    for tensor in tensors:
        if tensor not in value_infos:
            raise ValueError(
                f"Unable to guess tensor type for tensor {tensor!r}, "
                "running shape inference before quantization may resolve this issue."
            )
        tensor_type = value_infos[tensor].type.tensor_type
        axes = None
        if per_channel:
            rank = len(tensor_type.shape.dim)
            if not (scalars_whole and rank == 0 and tensor_type.HasField("shape")):
                axes = [0, *range(2, rank)]
        pairs = []
        for op in REDUCE_OPS:
            output = f"{tensor}_{op}"
            reshaped = f"{output}_Reshape"
            reduce_node = helper.make_node(op, [tensor], [reshaped], keepdims=1, name=output)
            if axes is not None:
                if op not in versions:
                    versions[op] = op_version(op, model)
                if versions[op] < 18:
                    reduce_node.attribute.append(helper.make_attribute("axes", axes))
                else:
                    axes_name = str(uuid.uuid4())
                    reduce_node.input.append(axes_name)
                    graph.initializer.append(numpy_helper.from_array(np.array(axes, dtype=np.int64), axes_name))
            reshape = helper.make_node("Reshape", [reshaped, shape_name], [output], name=reshaped)
            pairs.append([reduce_node, reshape])
            graph.output.append(helper.make_tensor_value_info(output, tensor_type.elem_type, [None]))
        # ORT inserts the ReduceMin pair first, then the ReduceMax pair before it
        before.setdefault(first.get(tensor, count), []).append(pairs[1] + pairs[0])
    _insert(graph, count, before)


def _insert(graph: onnx.GraphProto, count: int, before: dict[int, list[list[onnx.NodeProto]]]) -> None:
    """Put each block of ``before[i]`` just before the graph's node ``i`` of ``count`` (after the
    last for ``count``): the blocks appended, then moved into place by one sort."""
    final: list[int] = []  # the final order, as indices into the graph's nodes + the added ones
    added = count
    for i in range(count + 1):
        for block in before.get(i, ()):
            graph.node.extend(block)
            final.extend(range(added, added + len(block)))
            added += len(block)
        if i < count:
            final.append(i)
    # protobuf keeps one wrapper per message while it lives: held here, the sort sees the same
    # objects, so each is found by its id; the sort moves pointers and copies no node
    wrappers = list(graph.node)
    rank = {id(wrappers[k]): r for r, k in enumerate(final)}
    graph.node.sort(key=lambda node: rank[id(node)])


# Concat inputs per node: onnxruntime's session build is quadratic in one node's inputs (one
# Concat of 16k outputs took 29 s to load), so the gathering is a tree of Concats of this fan-in.
GATHER_FAN_IN = 64


@dataclass(frozen=True)
class GatheredOutputs:
    """The session's view of MinMax's per-tensor outputs: each element type's added outputs (one
    element each: ORT reshapes a full reduce to ``[-1]``) concatenated in ORT's order into one
    graph output, by a tree of Concat nodes.

    onnxruntime's session build is quadratic in the graph's outputs (ORT's augmented model has two
    per calibrated tensor: 644 µs per tensor to load at 8k tensors, 145 µs at 1k), and each run
    returns every output as its own array. The gathered outputs hold the same elements, only
    moved, so the ranges are identical to those from ORT's outputs.

    Attributes:
        names: the gathered outputs, one per element type.
        members: each gathered output's ORT outputs, in ORT's order (element ``i`` is member ``i``;
            a tensor's ReduceMin output, then its ReduceMax output).
        order: all of ORT's added outputs, in ORT's order.
        elem_types: each gathered output's element type.
        nodes: the Concat nodes that gather them.
    """

    names: tuple[str, ...]
    members: tuple[tuple[str, ...], ...]
    order: tuple[str, ...]
    elem_types: tuple[int, ...]
    nodes: tuple[onnx.NodeProto, ...]

    @classmethod
    def of(cls, graph: onnx.GraphProto, first_added: int) -> GatheredOutputs | None:
        """The gathering of ``graph``'s outputs from index ``first_added`` on (ORT's per-tensor
        ones); None when there are none."""
        by_type: dict[int, list[str]] = {}
        order = tuple(output.name for output in graph.output[first_added:])
        for output in graph.output[first_added:]:
            by_type.setdefault(output.type.tensor_type.elem_type, []).append(output.name)
        if not by_type:
            return None
        prefix = f"histocal_gathered_{uuid.uuid4().hex}"
        names, nodes = [], []
        for elem_type, members in by_type.items():
            level, step = members, 0
            while True:
                groups = [level[i : i + GATHER_FAN_IN] for i in range(0, len(level), GATHER_FAN_IN)]
                if len(groups) == 1:
                    names.append(f"{prefix}_{elem_type}")
                    nodes.append(helper.make_node("Concat", groups[0], [names[-1]], name=names[-1], axis=0))
                    break
                level = [f"{prefix}_{elem_type}_{step}_{k}" for k in range(len(groups))]
                nodes += [
                    helper.make_node("Concat", g, [o], name=o, axis=0) for g, o in zip(groups, level, strict=True)
                ]
                step += 1
        return cls(tuple(names), tuple(map(tuple, by_type.values())), order, tuple(by_type), tuple(nodes))

    @contextmanager
    def applied(self, model: onnx.ModelProto, first_added: int) -> Iterator[None]:
        """``model`` with the gathered outputs in place of its outputs from ``first_added`` on,
        put back as they were on exit (the model's own nodes are never copied)."""
        graph = model.graph
        count = len(graph.node)
        added = [onnx.ValueInfoProto.FromString(o.SerializeToString()) for o in graph.output[first_added:]]
        del graph.output[first_added:]
        graph.node.extend(self.nodes)
        for name, members, elem_type in zip(self.names, self.members, self.elem_types, strict=True):
            graph.output.append(helper.make_tensor_value_info(name, elem_type, [len(members)]))
        try:
            yield
        finally:
            del graph.node[count:]
            del graph.output[first_added:]
            graph.output.extend(added)
