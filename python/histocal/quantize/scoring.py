"""One QDQ model that every candidate range set is scored on: quantization parameters as inputs.

onnxruntime's ``quantize_static`` on the same model with the same settings builds the same graph
whatever the activation ranges are: the ranges only decide the values of a few initializers,

* per quantized activation tensor ``T``: ``T_scale`` and ``T_zero_point`` (``compute_scale_zp``
  of T's range, after ORT's own range adjustments: a Relu/Clip input takes its output's range,
  a Softmax output gets (0, 1); tensors sharing parameters, such as a MaxPool output, use their
  input's initializers);
* per bias quantized to int32, ``B_quantized`` and ``B_quantized_scale``: ``round(B / (s_x ·
  s_w · beta))`` with ``s_x`` the scale of the node's input.

``ScoringModel`` quantizes once (with the first range set given), turns exactly those
initializers into graph inputs and computes their values for any other range set: the activation
parameters by onnxruntime's own ``QDQQuantizer.calc_graph_quant_params`` (the function its
``quantize_static`` calls, adjustments and overrides included), the biases by the arithmetic of
ORT's ``quantize_bias_static_impl``. So one session scores every candidate and fold, and a
candidate's parameters are, value for value, the initializers ``quantize_static`` would write for
its ranges (tests/quantize/test_scoring.py checks the two byte for byte and the outputs for equality).

What it cannot express falls back to one ``quantize_static`` per candidate (``parameters``
returns None for that candidate, ``build`` returns None for the model): a range set under which
ORT would enlarge a weight's scale so that an int32 bias fits (the weight itself changes), a
graph whose quantized initializers do not follow ORT's naming, QOperator format.

Outputs: scales given as inputs keep onnxruntime from fusing DequantizeLinear → op →
QuantizeLinear into its integer kernels, so the scoring session computes the QDQ graph's
definition (float ops on dequantized values), which is what the real quantized model computes
with graph optimizations off; with them on, ORT's integer kernels round intermediate results
slightly differently (measured by the former real-model auto benchmark: benches/NOTES.md).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.calibrate import TensorsData

from ..io.cache import round_trip
from ..io.models import INLINE_MODEL_BYTES, load_model
from .ort import QuantizationArgs, quantize_with_ranges
from .runs import dequantized

logger = logging.getLogger(__name__)

_SCALE = "_scale"
_ZERO_POINT = "_zero_point"
_BIAS = "_quantized"
_CONVERT = "_convert"


@dataclass(frozen=True)
class _Bias:
    name: str  # the float bias initializer
    quantized: str  # its int32 initializer, B_quantized
    scale: str  # B_quantized_scale
    input_scale: str  # the activation scale initializer of the node's input
    weight_scale: np.ndarray
    weight: str
    beta: float
    per_channel: bool
    node: str  # the node reading it
    source: str  # the float model's initializer it quantizes (``_float_bias``)


class ScoringModel:
    """The QDQ model of a set of quantization arguments with its range-dependent initializers as
    graph inputs (module docstring). ``path``: the model file; ``parameters(ranges)``: the inputs
    that make it the model ``quantize_static`` gives for ``ranges`` (None if it cannot)."""

    def __init__(
        self,
        path: Path,
        quantizer: Any,
        activations: dict[str, tuple[str, str]],
        biases: list[_Bias],
        float_biases: dict[str, np.ndarray],
        dtypes: dict[str, Any],
        weights: dict[str, np.ndarray] | None = None,
        qdq_path: Path | None = None,
    ) -> None:
        self.path = path
        self.qdq_path = qdq_path  # onnxruntime's QDQ model of the base ranges it was built from
        self._quantizer = quantizer
        self._activations = activations  # scale initializer -> (tensor, which params: "" or "_convert")
        self._biases = biases
        self._float_biases = float_biases
        self._dtypes = dtypes  # input name -> numpy dtype
        # The dequantized weights, fed to every run (``_dequantized_weights``).
        self.weights: dict[str, np.ndarray] = weights or {}

    @property
    def input_names(self) -> list[str]:
        return list(self._dtypes)

    @functools.cached_property
    def range_tensors(self) -> frozenset[str]:
        """The tensors whose ranges its parameters come from: the quantized activations, and the
        Relu or Clip input or output whose range onnxruntime gives the other
        (``adjust_tensor_ranges``). Ranges of other tensors change nothing."""
        tensors = {tensor for tensor, _ in self._activations.values()}
        for node in self._quantizer.model.nodes():
            adjusted = node.op_type in ("Clip", "Relu") and node.input and node.output
            if adjusted and (node.input[0] in tensors or node.output[0] in tensors):
                tensors |= {node.input[0], node.output[0]}
        return frozenset(tensors)

    @property
    def float_biases(self) -> dict[str, np.ndarray]:
        """The float biases onnxruntime quantized to int32, by initializer name."""
        return dict(self._float_biases)

    @property
    def bias_inputs(self) -> dict[str, str]:
        """Per float bias, the name of the graph input its int32 values are fed by."""
        return {b.name: b.quantized for b in self._biases}

    @property
    def bias_readers(self) -> dict[str, tuple[str, str]]:
        """Per float bias, the node that reads it and the float model's initializer it quantizes
        (another name where onnxruntime gave each of several readers its own copy)."""
        return {b.name: (b.node, b.source) for b in self._biases}

    def parameters(
        self, ranges: TensorsData, biases: Mapping[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray] | None:
        """The values of every range-dependent initializer of ``quantize_static`` on ``ranges``,
        by name; None when this range set changes more than those (see module docstring).
        ``biases``: float bias values to quantize instead of the model's (by initializer name;
        bias correction's), as ``quantize_static`` would quantize a model holding them."""
        # The ranges as ORT reads them back from the calibration cache they travel through.
        params = self._quantizer_params(ranges)
        out: dict[str, np.ndarray] = {}
        for scale_name, (tensor, which) in self._activations.items():
            qp = params.get(tensor)
            if qp is None:
                return None
            p = qp.converted if which else qp.original
            if p is None:
                return None
            zp_name = scale_name[: -len(_SCALE + which)] + _ZERO_POINT + which
            out[scale_name] = np.asarray(p["scale"], self._dtypes[scale_name])
            out[zp_name] = np.asarray(p["zero_point"], self._dtypes[zp_name])
        for b in self._biases:
            input_scale = out[b.input_scale]
            weight_scale = b.weight_scale.copy()
            data = (biases or {}).get(b.name, self._float_biases[b.name])
            if self._weight_adjusted(b, input_scale, weight_scale, data):
                return None
            # quantize_bias_static_impl's arithmetic, value for value.
            bias_scale = input_scale * weight_scale * b.beta
            q = np.asarray(data, np.float64) / np.asarray(bias_scale, np.float64)
            q = np.clip(q.round(), np.float64(np.iinfo(np.int32).min), np.float64(np.iinfo(np.int32).max))
            out[b.quantized] = q.astype(np.int32).reshape(data.shape)
            out[b.scale] = np.asarray(bias_scale, data.dtype).reshape(-1)
        return out

    def quantized_model(
        self, ranges: TensorsData, biases: Mapping[str, np.ndarray] | None = None
    ) -> onnx.ModelProto | None:
        """The QDQ model ``quantize_static`` writes for ``ranges`` (and the float biases
        ``biases``, as ``parameters``), without quantizing again: the base ranges' QDQ model with
        its range-dependent initializers set to ``parameters``' values, the only ones a range set
        changes (module docstring), each stored as onnxruntime stored it, so that the model
        serializes to onnxruntime's bytes. None where ``parameters`` is."""
        parameters = self.parameters(ranges, biases)
        if parameters is None or self.qdq_path is None:
            return None
        model = load_model(self.qdq_path)
        for tensor in model.graph.initializer:
            if tensor.name in parameters:
                tensor.CopyFrom(_stored_like(tensor, parameters[tensor.name]))
        return model

    def _quantizer_params(self, ranges: TensorsData) -> dict[str, Any]:
        q = self._quantizer
        q.tensors_range = TensorsData(ranges.calibration_method, dict(ranges.data))  # adjusted in place
        return q.calc_graph_quant_params()

    def _weight_adjusted(self, b: _Bias, input_scale: np.ndarray, weight_scale: np.ndarray, bias: np.ndarray) -> bool:
        q = self._quantizer
        if q.qdq_disable_weight_adjust_for_int32_bias or np.asarray(weight_scale).dtype.kind != "f":
            return False
        if b.per_channel and _bias_scales_clearly_valid(input_scale, weight_scale, bias):
            return False
        bias_tp = numpy_helper.from_array(bias, b.name)
        updated, _ = q._adjust_weight_scale_for_int32_bias(input_scale, weight_scale, b.weight, bias_tp, b.per_channel)
        return bool(updated)


def _stored_like(tensor: onnx.TensorProto, value: np.ndarray) -> onnx.TensorProto:
    """``value`` as an initializer of ``tensor``'s name, type and shape, stored as ``tensor`` is:
    in raw bytes (as onnxruntime stores a quantized bias) or in the typed field (``make_tensor``, as
    it stores a scale or a zero point)."""
    value = np.asarray(value).reshape(tuple(tensor.dims))
    if tensor.HasField("raw_data"):
        return numpy_helper.from_array(value, tensor.name)
    return helper.make_tensor(tensor.name, tensor.data_type, tuple(tensor.dims), value.ravel().tolist())


# A margin well above the float32 roundings by which onnxruntime's smallest valid bias scale can
# differ from the float64 one computed here (two roundings: a few 1e-7 relative).
_BIAS_MARGIN = 1e-5


def _bias_scales_clearly_valid(input_scale: np.ndarray, weight_scale: np.ndarray, bias: np.ndarray) -> bool:
    """Whether onnxruntime's ``_adjust_weight_scale_for_int32_bias`` certainly leaves these
    per-channel weight scales as they are: every channel's bias scale (input scale x weight scale,
    in float64 as ORT computes it) is not positive, or above the smallest valid one with a margin.
    Its channel-by-channel Python loop is most of a candidate's parameter arithmetic on a model
    with many biased convolutions (ddddocr: 0.8 s of the recipe, issue 37); where this says no,
    the caller asks onnxruntime's own function."""
    if weight_scale.ndim != 1 or bias.shape != weight_scale.shape or np.size(input_scale) != 1:
        return False
    qrange = np.float64(np.iinfo(np.int32).max) - np.float64(np.iinfo(np.int32).min + 1)
    smallest = 1.0001 * (2.0 * np.abs(bias.astype(np.float64))) / qrange
    candidate = np.float64(np.asarray(input_scale).item()) * weight_scale.astype(np.float64)
    return bool(np.all((candidate <= 0.0) | (candidate >= smallest * (1.0 + _BIAS_MARGIN))))


def quantize_base(model_path: Path, ranges: TensorsData, workdir: Path, quantization: QuantizationArgs) -> Path | None:
    """onnxruntime's QDQ model of ``model_path`` under ``ranges`` (as onnxruntime reads them back
    from its calibration cache) and ``quantization``, written to ``workdir``/qdq.onnx: a scoring
    model's base. None in QOperator format (no scoring model)."""
    if quantization.quant_format not in (QuantFormat.QDQ, "QDQ"):
        return None
    return _quantized_base(model_path, round_trip(ranges), workdir, quantization)


def _quantized_base(model_path: Path, rounded: TensorsData, workdir: Path, quantization: QuantizationArgs) -> Path:
    qdq_path = workdir / "qdq.onnx"
    quantize_with_ranges(model_path, qdq_path, rounded, quantization)
    return qdq_path


def build_scoring_model(
    model_path: Path,
    ranges: TensorsData,
    workdir: Path,
    quantization: QuantizationArgs,
    qdq_path: Path | None = None,
) -> ScoringModel | None:
    """Quantize ``model_path`` once with ``ranges`` and make its range-dependent initializers
    inputs; None (with the reason logged) where the model or the arguments need one
    ``quantize_static`` per range set.

    Args:
        model_path: the float model.
        ranges: the base candidate's ranges.
        workdir: where the models are written.
        quantization: ``quantize_static``'s quantization arguments.
        qdq_path: ``quantize_base``'s model for these arguments, if already written.

    Returns:
        The scoring model, or None.
    """
    if quantization.quant_format not in (QuantFormat.QDQ, "QDQ"):
        logger.info("auto: QOperator format: every candidate is quantized on its own")
        return None
    ranges = round_trip(ranges)  # as ORT reads them back from the calibration cache
    if qdq_path is None:
        qdq_path = _quantized_base(model_path, ranges, workdir, quantization)
    qdq = onnx.load(qdq_path.as_posix())
    # The float model as the quantizer reads it: its nodes and initializers are the file's (shape
    # inference adds value infos), read here, not changed.
    float_model = _shape_inferred(model_path, workdir)
    quantizer = _quantizer(float_model, ranges, quantization)
    expected = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    scoring = _inputs_model(qdq, float_model, quantizer, ranges, workdir, qdq_path)
    if scoring is None:
        return None
    # Self-check: the base ranges must give back the QDQ model's own initializer values.
    got = scoring.parameters(ranges)
    if got is None or any(
        name not in expected or expected[name].dtype != v.dtype or expected[name].tobytes() != v.tobytes()
        for name, v in got.items()
    ):
        bad = [n for n, v in (got or {}).items() if n not in expected or expected[n].tobytes() != v.tobytes()]
        logger.warning(
            "auto: the scoring model does not reproduce onnxruntime's parameters (%s): "
            "every candidate is quantized on its own",
            bad[:3] or "weight scale adjusted",
        )
        return None
    return scoring


def _shape_inferred(model_path: Path, workdir: Path) -> onnx.ModelProto:
    """The model as onnxruntime's quantize_static loads it (``load_model_with_shape_infer``: shapes
    inferred from its file, the inference metadata added), the inferred file written into
    ``workdir`` rather than beside the model. (Given a model without that metadata, the quantizer
    would save a copy and infer its shapes again: 0.2 s a build on ddddocr, issue 37.)"""
    from onnx.external_data_helper import load_external_data_for_model
    from onnxruntime.quantization.quant_utils import add_infer_metadata

    inferred = workdir / "inferred.onnx"
    onnx.shape_inference.infer_shapes_path(model_path.as_posix(), inferred.as_posix())
    model = onnx.load(inferred.as_posix(), load_external_data=False)
    inferred.unlink()
    load_external_data_for_model(model, model_path.parent.as_posix())  # where its locations point
    add_infer_metadata(model)
    return model


def _quantizer(float_model: onnx.ModelProto, ranges: TensorsData, quantization: QuantizationArgs) -> Any:
    """onnxruntime's QDQQuantizer as its quantize_static makes it, for its parameter arithmetic
    (``float_model``: as ``_shape_inferred`` loads it; the quantizer keeps it)."""
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    op_types = quantization.op_types_to_quantize or list(set(QLinearOpsRegistry) | set(QDQRegistry))
    return QDQQuantizer(
        float_model,
        quantization.per_channel,
        quantization.reduce_range,
        quantization.weight_type,
        quantization.activation_type,
        TensorsData(ranges.calibration_method, dict(ranges.data)),
        quantization.nodes_to_quantize or [],
        quantization.nodes_to_exclude or [],
        op_types,
        dict(quantization.extra_options or {}),
    )


def _inputs_model(
    qdq: onnx.ModelProto,
    float_model: onnx.ModelProto,
    quantizer: Any,
    ranges: TensorsData,
    workdir: Path,
    qdq_path: Path,
) -> ScoringModel | None:
    graph = qdq.graph
    init = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    float_init = {t.name: t for t in float_model.graph.initializer}
    float_nodes = {n.name: n for n in float_model.graph.node if n.name}

    activations: dict[str, tuple[str, str]] = {}
    for n in graph.node:
        if n.op_type != "QuantizeLinear" or n.input[0] in init or len(n.input) < 3:
            continue
        scale, zp = n.input[1], n.input[2]
        which = _CONVERT if scale.endswith(_SCALE + _CONVERT) else ""
        if not scale.endswith(_SCALE + which) or scale not in init or zp not in init:
            logger.info("auto: QuantizeLinear %r has parameters %r, %r not named by ORT's rule", n.name, scale, zp)
            return None
        tensor = scale[: -len(_SCALE + which)]
        if not which and zp == tensor + _ZERO_POINT and tensor in float_init and tensor not in ranges.data:
            # A weight's own parameters, shared by an operator's output (a Gather of an embedding
            # table quantizes its output as its input): computed from the weight alone, the same
            # for every range set, so they stay initializers.
            continue
        if zp != tensor + _ZERO_POINT + which or tensor not in ranges.data:
            logger.info("auto: activation parameters %r have no range of their own", scale)
            return None
        activations[scale] = (tensor, which)

    biases: list[_Bias] = []
    float_biases: dict[str, np.ndarray] = {}
    for n in graph.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in init:
            continue
        if init[n.input[0]].data_type != onnx.TensorProto.INT32:
            continue
        quantized = n.input[0]
        bias = quantized[: -len(_BIAS)] if quantized.endswith(_BIAS) else None
        users = readers.get(n.output[0], [])
        if bias is None or len(users) != 1 or len(users[0].input) < 3:
            logger.info("auto: int32 initializer %r is not a bias by ORT's rule", quantized)
            return None
        node = users[0]
        source = _float_bias(bias, float_init, float_nodes.get(node.name))
        if source is None:
            logger.info("auto: int32 initializer %r is not a bias by ORT's rule", quantized)
            return None
        x_dq, w_dq = producer.get(node.input[0]), producer.get(node.input[1])
        if (
            x_dq is None
            or w_dq is None
            or x_dq.op_type != "DequantizeLinear"
            or w_dq.op_type != "DequantizeLinear"
            or x_dq.input[1] not in activations
            or w_dq.input[1] not in init
        ):
            logger.info("auto: bias %r of %r: its input or weight is not quantized by ORT's rule", bias, node.name)
            return None
        original = float_nodes.get(node.name)
        beta = 1.0
        if node.op_type == "Gemm":
            if original is None:
                return None
            beta = next((a.f for a in original.attribute if a.name == "beta"), 1.0)
        weight_scale = numpy_helper.to_array(init[w_dq.input[1]])
        biases.append(
            _Bias(
                bias,
                quantized,
                n.input[1],
                x_dq.input[1],
                weight_scale,
                w_dq.input[0],
                beta,
                weight_scale.ndim > 0,
                node.name,
                source,
            )
        )
        float_biases[bias] = numpy_helper.to_array(float_init[source])

    names = set(activations) | {s[: -len(_SCALE + w)] + _ZERO_POINT + w for s, (_, w) in activations.items()}
    names |= {b.quantized for b in biases} | {b.scale for b in biases}
    dtypes: dict[str, Any] = {}
    for t in graph.initializer:
        if t.name in names:
            dtypes[t.name] = helper.tensor_dtype_to_np_dtype(t.data_type)
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    weights = _dequantized_weights(qdq, names)
    used = {i for n in graph.node for i in n.input}
    kept = [t for t in graph.initializer if t.name not in names and t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    path = workdir / "scoring.onnx"
    onnx.save_model(qdq, path.as_posix(), save_as_external_data=qdq.ByteSize() > INLINE_MODEL_BYTES)
    return ScoringModel(path, quantizer, activations, biases, float_biases, dtypes, weights, qdq_path)


def _float_bias(bias: str, float_init: Mapping[str, Any], original: onnx.NodeProto | None) -> str | None:
    """The float model's initializer that ORT's bias ``bias`` quantizes: itself, or where several
    nodes read one bias, the one ``original`` (the float node) reads, which ORT copied under the name
    ``bias`` for that node (``QDQQuantizer._dup_initializer``: the name and a number), its values
    unchanged."""
    if bias in float_init:
        return bias
    if original is None or len(original.input) < 3 or original.input[2] not in float_init:
        return None
    read = original.input[2]
    return read if bias.startswith(read) and bias[len(read) :].isdigit() else None


def _dequantized_weights(qdq: onnx.ModelProto, inputs: set[str]) -> dict[str, np.ndarray]:
    """Every DequantizeLinear of initializers alone (the weights: the same for every candidate)
    leaves ``qdq``'s graph: its output becomes a graph input, whose value, computed here once by
    onnxruntime's own DequantizeLinear kernel, every run is fed. So the runs skip dequantizing the
    weights and compute the same outputs bit for bit. (Folding them into constants instead,
    ``session.disable_quant_qdq``, lets onnxruntime pick other kernels for constant weights, such
    as a prepacked Gemm, which round differently on a few feeds: measured on ddddocr.)"""
    graph = qdq.graph
    init = {t.name: t for t in graph.initializer if t.name not in inputs}
    outputs = {o.name for o in graph.output}
    weights = [
        n
        for n in graph.node
        if n.op_type == "DequantizeLinear" and all(i in init for i in n.input if i) and n.output[0] not in outputs
    ]
    if not weights:
        return {}
    values = dequantized(qdq, weights)
    dropped = {id(n) for n in weights}
    kept = [n for n in graph.node if id(n) not in dropped]
    del graph.node[:]
    graph.node.extend(kept)
    for name, value in values.items():
        graph.input.append(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))
        )
    return values


def scoring_feed(feed: Mapping[str, Any], parameters: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """A feed of the float model with a candidate's parameters added."""
    return {**feed, **parameters}


__all__ = ["ScoringModel", "build_scoring_model", "scoring_feed"]
