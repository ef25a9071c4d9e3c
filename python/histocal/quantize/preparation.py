"""The recipe's preparation of a float model for quantization (``recipe="best"``): weights held in
Constant nodes become initializers (onnxruntime's quantizer treats a Constant node's output as an
activation: no per-channel weights, a calibrated per-tensor range), the opset is raised to 13 (the
first where DequantizeLinear takes the ``axis`` of per-channel weights), and onnxruntime's own
pre-processing runs (``quant_pre_process``: its graph optimizer folds BatchNormalization into the
Conv before it, then onnx shape inference). The prepared model must compute what the float model
computes: its outputs are compared on calibration feeds before anything else runs.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ..io.models import load_model, save_model
from .runs import run_all, run_pool

logger = logging.getLogger(__name__)

# DequantizeLinear's ``axis`` (per-channel weights) is opset 13's.
PER_CHANNEL_OPSET = 13
# The prepared model's outputs may differ from the float model's by float rounding only (BatchNorm
# folded into a Conv's weights rounds differently): |y' - y| <= ATOL + RTOL * max|y| per output.
RTOL = 1e-3
ATOL = 1e-5


@dataclass(frozen=True)
class Preparation:
    """What preparing a model did.

    Attributes:
        model: the prepared model, its weights in ``path``'s external data file.
        path: the prepared model's file.
        constants_lifted: Constant nodes turned into initializers.
        opset_from: the model's default-domain opset before (equal to ``opset_to`` when kept).
        opset_to: the prepared model's default-domain opset.
        nodes_before: the float model's node count.
        nodes_after: the prepared model's node count (BatchNormalization folded: fewer).
        max_relative_difference: the largest ``max|y' - y| / max|y|`` over the outputs and feeds
            checked.
    """

    model: onnx.ModelProto
    path: Path
    constants_lifted: int
    opset_from: int
    opset_to: int
    nodes_before: int
    nodes_after: int
    max_relative_difference: float


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default (``ai.onnx``) domain."""
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def lift_constants(model: onnx.ModelProto) -> int:
    """Turn every Constant node holding a non-empty tensor (``value``) into an initializer of its
    output's name, in place; empty ones (paddle2onnx's Resize ``roi``) and graph outputs stay
    nodes. Returns how many were lifted."""
    outputs = {o.name for o in model.graph.output}
    keep, lifted = [], []
    for node in model.graph.node:
        value = None
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.attribute) == 1:
            value = node.attribute[0].t if node.attribute[0].name == "value" else None
        if value is None or node.output[0] in outputs or int(np.prod(value.dims)) == 0:
            keep.append(node)
            continue
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
        tensor.name = node.output[0]
        lifted.append(tensor)
    if lifted:
        model.graph.ClearField("node")
        model.graph.node.extend(keep)
        model.graph.initializer.extend(lifted)
    return len(lifted)


def _raise_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    from onnx import version_converter

    ir_version = model.ir_version
    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as exc:  # onnx's converter raises bare RuntimeErrors naming the adapter
        raise ValueError(
            f"recipe: cannot convert the model from opset {default_opset(model)} to {opset} (needed for "
            f"per-channel weights): {exc}"
        ) from exc
    converted.ir_version = max(ir_version, 7)  # opset 13 needs IR 7; never above what the model had
    return converted


def _pre_process(model: onnx.ModelProto, tmp: Path) -> onnx.ModelProto:
    """onnxruntime's ``quant_pre_process`` (optimizer: BatchNorm folding, constant folding; onnx
    shape inference)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    source, target = tmp / "prepare_in.onnx", tmp / "prepare_out.onnx"
    save_model(model, source)  # not read after: its weights may move out
    try:
        # onnx's shape inference: symbolic shape inference needs sympy and adds nothing the quantizer reads
        quant_pre_process(source.as_posix(), target.as_posix(), skip_symbolic_shape=True, save_as_external_data=True)
    except Exception as exc:
        raise ValueError(f"recipe: onnxruntime's pre-processing (quant_pre_process) failed: {exc}") from exc
    prepared = onnx.load_model(target.as_posix())
    prepared.ir_version = min(prepared.ir_version, max(model.ir_version, 7))
    return prepared


def _outputs(model_path: Path, feeds: Sequence[Mapping[str, Any]], providers: list[Any]) -> list[list[np.ndarray]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1  # the feeds go on histocal's threads instead (``runs``)
    session = ort.InferenceSession(model_path.as_posix(), options, providers=providers)
    names = {i.name for i in session.get_inputs()}
    return list(
        run_all(run_pool(), lambda i: session.run(None, {k: v for k, v in feeds[i].items() if k in names}), len(feeds))
    )


def check_same_outputs(
    float_model: Path,
    prepared: Path,
    feeds: Sequence[Mapping[str, Any]],
    output_names: Sequence[str],
    providers: list[Any] | None = None,
) -> float:
    """The largest relative output difference of ``prepared`` against ``float_model`` on ``feeds``;
    ValueError naming the output and the feed where it passes float tolerance."""
    providers = list(providers or ["CPUExecutionProvider"])
    worst = 0.0
    for i, (want, got) in enumerate(zip(_outputs(float_model, feeds, providers), _outputs(prepared, feeds, providers))):
        for name, a, b in zip(output_names, want, got):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                raise ValueError(
                    f"recipe: the prepared model's output {name!r} has shape {b.shape}, the float model's "
                    f"{a.shape} (calibration feed {i})"
                )
            if a.dtype.kind != "f":
                if not np.array_equal(a, b):
                    raise ValueError(f"recipe: the prepared model changes output {name!r} (calibration feed {i})")
                continue
            scale = float(np.nanmax(np.abs(a))) if a.size else 0.0
            diff = float(np.nanmax(np.abs(a.astype(np.float64) - b))) if a.size else 0.0
            if not np.isfinite(diff) and np.array_equal(np.isfinite(a), np.isfinite(b)):
                diff = float(np.nanmax(np.abs(np.where(np.isfinite(a), a - b, 0.0).astype(np.float64))))
            if not diff <= ATOL + RTOL * scale:
                raise ValueError(
                    f"recipe: the prepared model changes output {name!r} beyond float tolerance on calibration "
                    f"feed {i} (max |difference| {diff:.3g}, max |output| {scale:.3g}); quantize without the recipe"
                )
            worst = max(worst, diff / scale if scale else 0.0)
    return worst


def prepare_model(
    model_input: str | Path | onnx.ModelProto,
    feeds: Sequence[Mapping[str, Any]],
    folder: Path,
    *,
    per_channel: bool = True,
    providers: list[Any] | None = None,
) -> Preparation:
    """The model prepared for quantization, written to ``folder``/prepared.onnx (its weights beside
    it: ``io.models.save_model``) and checked on ``feeds``: the file checked is the one returned.

    Args:
        model_input: the float model (path or ModelProto).
        feeds: calibration feeds the prepared model's outputs are compared on.
        folder: where the prepared model is written.
        per_channel: raise the opset to 13 when below (per-channel weights need it).
        providers: onnxruntime execution providers for the check.

    Returns:
        The ``Preparation``: the prepared model and what was done.

    Raises:
        ValueError: a conversion or onnxruntime's pre-processing failed, or the prepared model's
            outputs differ from the float model's beyond float tolerance (naming the output).
    """
    model = load_model(model_input) if not isinstance(model_input, onnx.ModelProto) else _copy(model_input)
    nodes_before, opset_from = len(model.graph.node), default_opset(model)
    lifted = lift_constants(model)
    if per_channel and opset_from < PER_CHANNEL_OPSET:
        model = _raise_opset(model, PER_CHANNEL_OPSET)
    with tempfile.TemporaryDirectory(prefix="histocal.prepare.") as tmp:
        prepared = _pre_process(model, Path(tmp))
        name_nodes(prepared)  # placements leave nodes in float by name (onnxruntime's nodes_to_exclude)
        original = Path(tmp) / "float.onnx"
        if isinstance(model_input, onnx.ModelProto):
            save_model(_copy(model_input), original)
        else:
            original = Path(model_input)  # already checked by load_model
        path = folder / "prepared.onnx"
        save_model(prepared, path)  # the weights move into the file: written once
        names = [o.name for o in prepared.graph.output]
        worst = check_same_outputs(original, path, feeds, names, providers)
    done = Preparation(
        prepared, path, lifted, opset_from, default_opset(prepared), nodes_before, len(prepared.graph.node), worst
    )
    logger.info(
        "recipe: prepared the model: %d Constant node(s) lifted to initializers, opset %d -> %d, %d -> %d nodes "
        "(onnxruntime's pre-processing), outputs within %.2g of the float model's",
        lifted,
        opset_from,
        done.opset_to,
        nodes_before,
        done.nodes_after,
        worst,
    )
    return done


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def name_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed node of ``model`` a unique name (``<op type>_<index>``), in place;
    returns how many were named."""
    taken = {n.name for n in model.graph.node if n.name}
    named = 0
    for i, node in enumerate(model.graph.node):
        if node.name:
            continue
        name, k = f"{node.op_type}_{i}", 0
        while name in taken:
            k += 1
            name = f"{node.op_type}_{i}_{k}"
        node.name = name
        taken.add(name)
        named += 1
    return named


def constant_weights(model: onnx.ModelProto, op_types: Sequence[str]) -> list[str]:
    """Nodes of ``op_types`` whose weight (input 1) is a Constant node's output rather than an
    initializer: onnxruntime quantizes such a weight as an activation (per tensor)."""
    constants = {n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.output}
    initializers = {i.name for i in model.graph.initializer}
    return [
        node.name or f"{node.op_type}_{i}"
        for i, node in enumerate(model.graph.node)
        if node.op_type in op_types
        and len(node.input) > 1
        and node.input[1] in constants
        and node.input[1] not in initializers
    ]


__all__ = [
    "PER_CHANNEL_OPSET",
    "Preparation",
    "check_same_outputs",
    "constant_weights",
    "default_opset",
    "name_nodes",
    "prepare_model",
]
