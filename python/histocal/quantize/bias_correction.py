"""Bias correction: each quantized layer's mean output error moved into its bias.

Quantizing a layer's weights and input shifts the mean of its output: for a Conv, ConvTranspose
or Gemm ``N`` with a bias that onnxruntime quantizes to int32, reading the float tensor ``x``
through ``DQ(Q(x))``, the shift of output channel ``c`` is

    shift_c = mean over feeds and positions of [N(x; W, B) - N(DQ(Q(x)); DQ(W_q), DQ(B_q))]_c

with the same ``x``, the float model's (``twin_model`` puts the quantized copy of every such layer
beside the float one, so one run of the float model per feed measures every layer). Adding
``shift_c`` to the float bias and quantizing again (``round((B + shift) / s_B)``) makes the layer's
output mean on those feeds the float layer's, to within the int32 rounding. Only the layer's own
error is corrected: the error upstream layers pass on is theirs, and corrected there. Correcting
each layer by its whole output error instead (the quantized model's mean against the float
model's), all layers at once, counts the upstream errors again at every depth: on nudenet's YOLOv8n
that took held-back output SQNR from 30.3 dB to 17.1 dB, where the layer's own error gives 35.8.
This is NNCF's fast bias correction, measured on the data rather than on a mean input.

A channel is corrected only where its shift is measured, not noise: at least
``SHIFT_STANDARD_ERRORS`` standard errors of the per-feed means from 0. On ddddocr with 16
calibration feeds, the whole shift from 8 kept feeds passed the evidence rule on the folds (+0.65
dB, 6 of 7 feeds) and lost 2.9 dB on 32 held-back feeds (the Convs' shifts alone lose as much);
with the filter the folds reject it (4 of 8), and where the correction carries over (nudenet +4.9
dB, ddddocr with 32 calibration feeds +3.1 dB held-back) the filtered shift does as well.

Whether to correct is a measurement like the recipe's other choices (``correct_biases``): per fold
of the kept feeds, the shift is measured on the other folds' feeds and the corrected model scored
on the fold's; the correction is kept only if auto's evidence rule (``rule.decide``) prefers it to
the uncorrected model. The shift kept is then measured on every kept feed. The twin's quantization
parameters are those of the chosen ranges from all the data (the folds' ranges differ from them by
a few feeds' worth; measuring per fold would cost one pass of the kept feeds per fold).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization.calibrate import TensorsData

from ..io.models import INLINE_MODEL_BYTES, load_model, save_model
from ..io.readers import Feed, run_session
from . import runs
from .rule import decide
from .runs import sqnr_db
from .scorer import Energies, Scorer
from .scoring import ScoringModel

logger = logging.getLogger(__name__)

BIASED_OP_TYPES = ("Conv", "ConvTranspose", "Gemm")  # the operators whose bias onnxruntime quantizes to int32
UNCORRECTED = "uncorrected"
CORRECTED = "bias corrected"
# A channel's shift is corrected only where it is this many standard errors (over the feeds) from 0.
SHIFT_STANDARD_ERRORS = 2.0
_TWIN = "__histocal_twin"


@dataclass(frozen=True)
class Layer:
    """One corrected layer: its node, the float bias it adds, and its output and its quantized
    twin's output in the twin model."""

    node: str
    bias: str
    output: str
    twin_output: str


@dataclass(frozen=True)
class Twin:
    """The float model with a quantized twin of every correctable layer (``twin_model``).

    Attributes:
        model: the model; its outputs are the layers' outputs and their twins'.
        layers: the layers it measures.
        inputs: the graph inputs the twins read that a feed of the float model lacks (quantization
            parameters, dequantized weights, int32 biases).
    """

    model: onnx.ModelProto
    layers: list[Layer]
    inputs: list[str]


@dataclass(frozen=True)
class BiasCorrection:
    """What ``correct_biases`` decided.

    Attributes:
        biases: the corrected float biases by the quantized model's bias name (empty: not
            corrected), each with the node reading it and the float model's initializer it replaces.
        reason: why, in words.
        layers: how many layers it could measure.
        sqnr_db: the cross-validated output SQNR (dB) with the correction, pooled over the folds
            (empty where not scored).
    """

    biases: dict[str, tuple[str, str, np.ndarray]]
    reason: str
    layers: int
    sqnr_db: dict[str, float]

    def without(self, nodes: Collection[str]) -> BiasCorrection:
        """This correction less the biases that ``nodes`` read (nodes left in float have no
        quantization error to correct)."""
        return replace(self, biases={k: v for k, v in self.biases.items() if v[0] not in nodes})


def twin_model(float_model: onnx.ModelProto, scoring: onnx.ModelProto, model: ScoringModel) -> Twin:
    """``float_model`` (the scoring model's float model) with, per layer of ``scoring`` that reads
    ``DQ(Q(x))`` of a float tensor ``x`` and adds a bias quantized to int32, a copy of that layer's
    quantized nodes reading the float ``x`` (module docstring)."""
    graph = scoring.graph
    producer = {o: n for n in graph.node for o in n.output}
    graph_inputs = {i.name: i for i in graph.input}
    initializers = {t.name: t for t in graph.initializer}
    float_tensors = {i.name for i in float_model.graph.input} | {t.name for t in float_model.graph.initializer}
    float_tensors |= {o for n in float_model.graph.node for o in n.output}
    # By name: onnxruntime renames outputs (a Relu it drops, a graph output it quantizes).
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}
    bias_of = {quantized: bias for bias, quantized in model.bias_inputs.items()}

    def dequantize(name: str) -> onnx.NodeProto | None:
        node = producer.get(name)
        return node if node is not None and node.op_type == "DequantizeLinear" else None

    nodes: list[onnx.NodeProto] = []
    layers: list[Layer] = []
    read: set[str] = set()
    for node in graph.node:
        if node.op_type not in BIASED_OP_TYPES or len(node.input) < 3 or not node.input[2]:
            continue
        x_dq, b_dq = dequantize(node.input[0]), dequantize(node.input[2])
        x_q = producer.get(x_dq.input[0]) if x_dq is not None else None
        if x_q is None or x_q.op_type != "QuantizeLinear" or b_dq is None or b_dq.input[0] not in bias_of:
            continue
        original = float_nodes.get(node.name)
        if x_q.input[0] not in float_tensors or original is None or original.op_type != node.op_type:
            continue
        suffix = f"{_TWIN}{len(layers)}"
        w_dq = dequantize(node.input[1])
        copied = [x_q, x_dq, b_dq, *([w_dq] if w_dq is not None and node.input[1] not in graph_inputs else []), node]
        internal = {o for n in copied for o in n.output}
        for source in copied:
            twin = onnx.NodeProto()
            twin.CopyFrom(source)
            twin.name = source.name + suffix
            twin.input[:] = [i + suffix if i in internal else i for i in source.input]
            twin.output[:] = [o + suffix for o in source.output]
            nodes.append(twin)
            read.update(i for i in source.input if i and i not in internal and i not in float_tensors)
        layers.append(Layer(node.name, bias_of[b_dq.input[0]], original.output[0], node.output[0] + suffix))
    twin = onnx.ModelProto()
    twin.CopyFrom(float_model)
    del twin.opset_import[:]
    twin.opset_import.extend(scoring.opset_import)  # the QDQ nodes' (per-axis DequantizeLinear: 13)
    twin.graph.node.extend(nodes)
    inputs = sorted(r for r in read if r in graph_inputs)
    twin.graph.input.extend(graph_inputs[r] for r in inputs)
    twin.graph.initializer.extend(initializers[r] for r in sorted(read) if r in initializers)
    del twin.graph.output[:]
    for layer in layers:
        twin.graph.output.extend([onnx.ValueInfoProto(name=layer.output), onnx.ValueInfoProto(name=layer.twin_output)])
    return Twin(twin, layers, inputs)


class LayerErrors:
    """Per feed and layer, the sum over output positions of (float output - twin output) per channel,
    and the positions counted: any set of feeds' shifts without running them again."""

    def __init__(self, twin: Twin, session: Any, values: Mapping[str, np.ndarray], feeds: Sequence[Feed]) -> None:
        names = [o for layer in twin.layers for o in (layer.output, layer.twin_output)]
        extra = {name: values[name] for name in twin.inputs}
        self.layers = twin.layers
        self.sums: list[list[np.ndarray | None]] = []
        self.counts: list[list[int]] = []
        outputs = runs.run_all(
            runs.run_pool(), lambda i: run_session(session, names, {**feeds[i], **extra}, i), len(feeds)
        )
        for got in outputs:
            sums: list[np.ndarray | None] = []
            counts: list[int] = []
            for k in range(len(twin.layers)):
                y, y_twin = np.asarray(got[2 * k], np.float64), np.asarray(got[2 * k + 1], np.float64)
                if y.ndim < 2 or y.shape != y_twin.shape:
                    sums.append(None)
                    counts.append(0)
                    continue
                axes = tuple(a for a in range(y.ndim) if a != 1)  # the channel axis: 1 for all three
                sums.append((y - y_twin).sum(axis=axes))
                counts.append(y.size // y.shape[1])
            self.sums.append(sums)
            self.counts.append(counts)

    def shifts(self, feeds: Sequence[int], float_biases: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per bias, the mean channel shift over ``feeds`` (their indices): the layers whose errors
        are finite and shaped as their bias. Over two feeds or more, a channel's shift is set to 0
        unless it is at least ``SHIFT_STANDARD_ERRORS`` standard errors of the feeds' own means
        (each feed's mean over its positions, unweighted) from 0: noise is not corrected."""
        out: dict[str, np.ndarray] = {}
        for k, layer in enumerate(self.layers):
            parts = [self.sums[i][k] for i in feeds]
            count = sum(self.counts[i][k] for i in feeds)
            bias = float_biases.get(layer.bias)
            present = [p for p in parts if p is not None and p.shape == bias.shape] if bias is not None else []
            if count == 0 or len(present) != len(parts):
                continue
            shift = np.sum(present, axis=0) / count
            if not np.all(np.isfinite(shift)):
                continue
            if len(present) >= 2:  # a channel whose shift the feeds do not agree on keeps its bias
                means = np.stack([p / self.counts[i][k] for p, i in zip(present, feeds)])
                se = means.std(axis=0, ddof=1) / np.sqrt(len(present))
                shift = np.where(np.abs(shift) >= SHIFT_STANDARD_ERRORS * se, shift, 0.0)
            out[layer.bias] = shift
        return out


def corrected_biases(float_biases: Mapping[str, np.ndarray], shifts: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float biases plus their shifts, in each bias's dtype."""
    return {
        name: (float_biases[name].astype(np.float64) + s).astype(float_biases[name].dtype) for name, s in shifts.items()
    }


def _feed_sqnr(energies: Energies | None) -> list[float] | None:
    return None if energies is None else [sqnr_db(signal, noise) for signal, noise in energies]


def _pooled(energies: list[tuple[float, float]]) -> float:
    return sqnr_db(sum(e[0] for e in energies), sum(e[1] for e in energies))


@dataclass(frozen=True)
class TwinSession:
    """The twin model of a scorer's model (``twin_model``) and its session (None: no layer to
    measure); it does not depend on the ranges, so the recipe builds it while it chooses them."""

    twin: Twin
    session: Any


def twin_session(scorer: Scorer, workdir: Path) -> TwinSession | None:
    """The twin model of the model ``scorer`` scores, written into ``workdir``, and its session;
    None where ``scorer`` has no scoring model or it quantizes no bias to int32."""
    model = scorer.model
    if model is None or not model.bias_inputs:
        return None
    twin = twin_model(load_model(scorer.shared.model_path), onnx.load(model.path.as_posix()), model)
    if not twin.layers:
        return TwinSession(twin, None)
    path = workdir / "twin.onnx"
    onnx.save_model(twin.model, path.as_posix(), save_as_external_data=twin.model.ByteSize() > INLINE_MODEL_BYTES)
    return TwinSession(twin, runs.session(path, scorer.shared.providers, quantized=True))


def correct_biases(
    scorer: Scorer,
    label: str,
    ranges: TensorsData,
    folds: Sequence[tuple[Mapping[str, TensorsData], Sequence[Feed]]],
    workdir: Path,
    uncorrected: Sequence[float] | None = None,
    twin: Callable[[], TwinSession | None] | None = None,
) -> BiasCorrection:
    """The bias correction of the model ``scorer`` scores, under the chosen candidate ``label``
    whose ranges from all the data are ``ranges``, decided on ``folds`` (each fold's candidates
    fitted without its feeds), as the module docstring says. ``workdir`` takes the twin model.
    ``uncorrected``: the candidate's per-feed SQNR on the folds (in fold order) where the selection
    has scored it on this scorer already (the same runs: not repeated). ``twin``: a function giving
    ``twin_session``'s result for ``scorer`` (the recipe's makes it in the background, while it
    chooses the ranges), called only where needed; None: made here."""
    model = scorer.model
    if model is None or not model.bias_inputs:
        why = "no bias quantized to int32" if model is not None else "no shared scoring model"
        return BiasCorrection({}, f"not corrected: {why}", 0, {})
    if len(folds) < 2:
        return BiasCorrection({}, "not corrected: fewer than two kept feeds, no held-out evidence", 0, {})
    parameters = model.parameters(ranges)
    if parameters is None:
        return BiasCorrection({}, "not corrected: the scoring model cannot express the chosen ranges", 0, {})
    made = twin() if twin is not None else twin_session(scorer, workdir)
    if made is None or made.session is None:
        return BiasCorrection({}, "not corrected: no layer reads a quantized float tensor", 0, {})
    session, measured = made.session, made.twin
    feeds = [f for _, fold in folds for f in fold]
    errors = LayerErrors(measured, session, {**parameters, **scorer.weights}, feeds)
    session = made = None  # the twin session's memory
    float_biases = model.float_biases
    given = list(uncorrected) if uncorrected is not None else []
    known = len(given) == len(feeds) and not np.isnan(given).any()
    scores: dict[str, list[float]] = {UNCORRECTED: given if known else [], CORRECTED: []}
    energies: list[tuple[float, float]] = []
    start = 0
    for candidates, fold in folds:
        held = range(start, start + len(fold))
        start += len(fold)
        shifts = errors.shifts([i for i in range(len(feeds)) if i not in held], float_biases)
        for which, biases in ((UNCORRECTED, None), (CORRECTED, corrected_biases(float_biases, shifts))):
            if which == UNCORRECTED and known:  # scored by the selection
                continue
            got = scorer.biased_energies(list(fold), candidates[label], biases)
            sqnr = _feed_sqnr(got)
            if got is None or sqnr is None:
                return BiasCorrection({}, "not corrected: the scoring model cannot score it", len(measured.layers), {})
            scores[which].extend(sqnr)
            if which == CORRECTED:
                energies.extend(got)
    pooled = {CORRECTED: _pooled(energies)}
    decision = decide(scores, default=UNCORRECTED)
    if decision.label != CORRECTED:
        return BiasCorrection({}, decision.reason, len(measured.layers), pooled)
    biases = corrected_biases(float_biases, errors.shifts(range(len(feeds)), float_biases))
    readers = model.bias_readers
    return BiasCorrection(
        {name: (*readers[name], value) for name, value in biases.items()}, decision.reason, len(measured.layers), pooled
    )


def write_corrected(model_path: Path, biases: Mapping[str, tuple[str, str, np.ndarray]], out: Path) -> Path:
    """``model_path``'s model with ``BiasCorrection.biases`` in place, saved to ``out``
    (``io.models.save_model``): a bias only its node reads is replaced, one that other
    nodes read too becomes that node's own initializer."""
    model = load_model(model_path)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in set(node.input):
            readers[name] = readers.get(name, 0) + 1
    nodes = {n.name: n for n in graph.node if n.name}
    for name, (node_name, source, value) in biases.items():
        node, tensor = nodes.get(node_name), initializers.get(source)
        if node is None or tensor is None or len(node.input) < 3 or node.input[2] != source:
            raise ValueError(f"bias correction: node {node_name!r} does not read bias {source!r} in {model_path}")
        if readers[source] == 1:
            tensor.CopyFrom(numpy_helper.from_array(np.asarray(value), source))
            continue
        own = _unused_name(f"{name}_corrected", initializers)
        initializers[own] = numpy_helper.from_array(np.asarray(value), own)
        graph.initializer.append(initializers[own])
        node.input[2] = own
        readers[source] -= 1
    save_model(model, out)
    return out


def _unused_name(name: str, taken: Mapping[str, Any]) -> str:
    k, candidate = 0, name
    while candidate in taken:
        k += 1
        candidate = f"{name}{k}"
    return candidate


__all__ = [
    "BIASED_OP_TYPES",
    "CORRECTED",
    "SHIFT_STANDARD_ERRORS",
    "UNCORRECTED",
    "BiasCorrection",
    "LayerErrors",
    "Twin",
    "TwinSession",
    "correct_biases",
    "corrected_biases",
    "twin_model",
    "twin_session",
    "write_corrected",
]
