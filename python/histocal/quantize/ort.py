"""onnxruntime's quantize_static with ranges already computed: the step every histocal path ends in
(the ranges reach ORT through an ORT-format calibration cache)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import QuantFormat, QuantType
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

from ..calibrators.range_checks import check_quantized_ranges, check_ranges_before_ort, scale_issue_named
from ..io.cache import save_tensors_data
from ..io.models import load_model, save_model
from ..io.outputs import external_data_output, model_files, refuse_overwriting
from .float_reads import read_float
from .per_channel_weights import check_per_channel_weights
from .weight_memo import every_channel_at_once


@dataclass(frozen=True)
class QuantizationArgs:
    """onnxruntime ``quantize_static``'s quantization arguments (what a caller may pass through with
    given ranges), with ORT's defaults: built once from the caller's arguments and passed down,
    then given to ORT by name (``keywords()``).

    Args:
        quant_format: ORT's ``QuantFormat`` (QDQ or QOperator).
        op_types_to_quantize: the operator types to quantize (None: all ORT can).
        per_channel: quantize weights per channel.
        reduce_range: 7-bit weights.
        activation_type: ORT's ``QuantType`` of the activations.
        weight_type: ORT's ``QuantType`` of the weights.
        nodes_to_quantize: only these nodes (None: all).
        nodes_to_exclude: leave these nodes in float.
        use_external_data_format: write the weights as external data.
        calibration_providers: onnxruntime execution providers for calibration.
        extra_options: ORT's ``extra_options``.
    """

    quant_format: Any = QuantFormat.QDQ
    op_types_to_quantize: list[str] | None = None
    per_channel: bool = False
    reduce_range: bool = False
    activation_type: Any = QuantType.QInt8
    weight_type: Any = QuantType.QInt8
    nodes_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] | None = None
    use_external_data_format: bool = False
    calibration_providers: list[Any] | None = None
    extra_options: dict[str, Any] | None = None

    def keywords(self) -> dict[str, Any]:
        """The arguments as ``quantize_static``'s keywords.

        Returns:
            A dict from each of ``QUANTIZE_ARGUMENTS`` to its value.
        """
        return {f.name: getattr(self, f.name) for f in fields(self)}


# quantize_static's quantization arguments, by name.
QUANTIZE_ARGUMENTS = tuple(f.name for f in fields(QuantizationArgs))
SMOOTH_QUANT_NEEDS_ORT = (
    "SmoothQuant recalibrates a rewritten model inside onnxruntime: use one of ORT's methods and no tensors_range"
)


def ort_quantize_static(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    *,
    calibrate_method: CalibrationMethod | str,
    calibration_data_reader: Any = None,
    calibration_cache_path: str | Path | None = None,
    **quantization: Any,
) -> None:
    """onnxruntime's quantize_static, every argument passed by name (``quantization``: those of
    ``QUANTIZE_ARGUMENTS``), so a reordering of ORT's parameters cannot shift them."""
    unknown = sorted(set(quantization) - set(QUANTIZE_ARGUMENTS))
    if unknown:
        raise TypeError(f"not quantize_static quantization arguments: {unknown}")
    # `onnxruntime.quantization.quantize` is shadowed by a function of that name: go by module.
    with _model_file_lock(model_input), every_channel_at_once():
        importlib.import_module("onnxruntime.quantization.quantize").quantize_static(
            model_input,
            model_output,
            calibration_data_reader=calibration_data_reader,
            calibrate_method=calibrate_method,
            calibration_cache_path=calibration_cache_path,
            **quantization,
        )


# Per model file being quantized: its lock and how many calls hold or wait for it (dropped at 0:
# a long-lived process quantizing many files keeps none of their entries).
_model_file_locks: dict[str, tuple[threading.Lock, int]] = {}
_model_file_locks_guard = threading.Lock()


@contextlib.contextmanager
def _model_file_lock(model_input: str | Path | onnx.ModelProto) -> Iterator[None]:
    """Calls on one model file take turns: onnxruntime's quantize_static writes the shape-inferred
    model beside a model given by path (``<name>-inferred.onnx``) and removes it, so two calls on
    one file at once (the recipe builds a placement's scorer while another quantizes) would read
    and remove each other's."""
    if isinstance(model_input, onnx.ModelProto):
        yield
        return
    key = os.path.realpath(model_input)
    with _model_file_locks_guard:
        lock, users = _model_file_locks.get(key, (threading.Lock(), 0))
        _model_file_locks[key] = (lock, users + 1)
    try:
        with lock:
            yield
    finally:
        with _model_file_locks_guard:
            lock, users = _model_file_locks[key]
            if users == 1:
                del _model_file_locks[key]
            else:
                _model_file_locks[key] = (lock, users - 1)


@contextlib.contextmanager
def _quiet_opset_warning() -> Iterator[None]:
    """Drop the warning ORT's ``update_opset_version`` logs (on the root logger): ORT logs it again
    when it quantizes, and once is what ORT's own quantize_static says."""

    def keep(record: logging.LogRecord) -> bool:
        return record.funcName != "update_opset_version"

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def _upgrades_opset(model: onnx.ModelProto, weight_type: Any, activation_type: Any, extra: dict[str, Any]) -> bool:
    """Whether ORT's quantize_static converts ``model`` to another opset before it calibrates and
    quantizes (decided on an empty graph with the model's opsets: no conversion of the model)."""
    from onnxruntime.quantization.quant_utils import update_opset_version

    probe = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import)
    probe.graph.name = "opset-probe"
    with _quiet_opset_warning():
        return update_opset_version(probe, weight_type, activation_type, **_opset_options(extra)) is not probe


def _opset_options(extra: dict[str, Any]) -> dict[str, Any]:
    return {"tensor_quant_overrides": extra.get("TensorQuantOverrides"), "block_size": extra.get("BlockSize", 0)}


def quantizing_opset(model: onnx.ModelProto, weight_type: Any, activation_type: Any, extra: dict[str, Any]) -> int:
    """The default-domain opset of the model ORT's quantize_static quantizes (after the conversion it
    makes for the types, decided on an empty graph with the model's opsets)."""
    from onnxruntime.quantization.quant_utils import update_opset_version

    probe = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import)
    probe.graph.name = "opset-probe"
    with _quiet_opset_warning():
        return _default_opset(update_opset_version(probe, weight_type, activation_type, **_opset_options(extra)))


def check_per_channel(model_input: str | Path | onnx.ModelProto, quantization: QuantizationArgs) -> None:
    """With ``quantization.per_channel``: ValueError when the model cannot get per-channel weights
    (opset below 13, weights in Constant nodes; ``per_channel_weights``), naming why. Every route
    checks it before calibrating, and ``quantize_with_ranges`` again."""
    if not quantization.per_channel:
        return
    header = _header(model_input)
    extra = dict(quantization.extra_options or {})
    opset = quantizing_opset(header, quantization.weight_type, quantization.activation_type, extra)
    shown = "the model" if isinstance(model_input, onnx.ModelProto) else str(model_input)
    check_per_channel_weights(header, opset, quantization.op_types_to_quantize, shown)


def model_ort_quantizes(
    model_input: str | Path | onnx.ModelProto,
    weight_type: Any = QuantType.QInt8,
    activation_type: Any = QuantType.QInt8,
    extra_options: dict[str, Any] | None = None,
    *,
    header: onnx.ModelProto | None = None,
) -> onnx.ModelProto | None:
    """The model onnxruntime's quantize_static calibrates and quantizes when it is not
    ``model_input``, else None. ORT first converts a model whose opset cannot express the
    quantization (16-bit types: opset 21; float 8: 19; block-wise: 21; below 10: 11), and the
    conversion can add tensors (opset 11's Softmax on a non-last axis becomes Flatten, Softmax
    ``<output>_intermediate``, Reshape): ranges computed on the original model miss them. Built by
    ORT's own steps (shape inference, ``update_opset_version``), so calibrating it gives ORT's ranges.
    ``header``: ``model_input`` already loaded (without external data), to spare a load."""
    from onnxruntime.quantization.quant_utils import (
        load_model_with_shape_infer,
        save_and_reload_model_with_shape_infer,
        update_opset_version,
    )

    extra = dict(extra_options or {})
    if not _upgrades_opset(header or _header(model_input), weight_type, activation_type, extra):
        return None
    model = (
        save_and_reload_model_with_shape_infer(model_input)
        if isinstance(model_input, onnx.ModelProto)
        else load_model_with_shape_infer(Path(model_input))
    )
    with _quiet_opset_warning():
        return update_opset_version(model, weight_type, activation_type, **_opset_options(extra))


def model_file(model_input: str | Path | onnx.ModelProto, tmp: Path) -> Path:
    """The model's path: as given, or a copy of a ModelProto saved into ``tmp``
    (``io.models.save_model``; the caller's ModelProto is left as it is)."""
    if isinstance(model_input, onnx.ModelProto):
        path = tmp / "model_input.onnx"
        copy = onnx.ModelProto()
        copy.CopyFrom(model_input)
        save_model(copy, path)
        return path
    return Path(model_input)


def refuse_overwriting_weights(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    use_external_data_format: bool,
    calibration_cache_path: str | Path | None,
) -> None:
    """OverwriteError (a ValueError) when quantize_static's outputs would land on the float
    model's external-data files, or on each other. ORT writes ``model_output``'s external data
    to ``<model_output>.data``, which a renamed export can use for its own weights. ORT's
    in-place quantization (``model_output`` the ``model_input`` file) stays allowed: ORT reads
    the whole model before writing, and what it replaces is what the caller named."""
    if isinstance(model_input, onnx.ModelProto):
        return  # its external data, if any, lies where the caller keeps it: no path to compare
    inputs = model_files(model_input, "model_input")[1:]
    data = external_data_output(model_output) if use_external_data_format else None
    outputs = [
        ("model_output", model_output),
        ("model_output's external data (use_external_data_format)", data),
        ("calibration_cache_path", calibration_cache_path),
    ]
    refuse_overwriting(outputs, inputs)
    refuse_overwriting([("calibration_cache_path", calibration_cache_path)], [("model_input", model_input)])


def _listed(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def check_ranges_fit(
    model_input: str | Path | onnx.ModelProto,
    ranges: TensorsData,
    source: str,
    *,
    op_types_to_quantize: list[str] | None = None,
    nodes_to_quantize: list[str] | None = None,
    nodes_to_exclude: list[str] | None = None,
    activation_type: Any = QuantType.QInt8,
    weight_type: Any = QuantType.QInt8,
    extra_options: dict[str, Any] | None = None,
    **_: Any,
) -> None:
    """Refuse, before ORT runs, ranges (``source``: the file or argument they come from, for the
    message) that do not belong to the model ORT quantizes: ranges of tensors the model does not
    have (another model's), or no range for the output of a Softmax ORT quantizes (ORT fails then:
    ``Only an existing tensor can be modified``), e.g. ranges of an opset-11 model that ORT converts
    to opset 21 for a 16-bit type. Arguments: quantize_static's (the others are ignored)."""
    header = _header(model_input)
    upgraded = model_ort_quantizes(model_input, weight_type, activation_type, extra_options, header=header)
    model = upgraded if upgraded is not None else header
    graph = model.graph
    tensors = {t.name for t in (*graph.input, *graph.initializer)}
    tensors.update(name for node in graph.node for name in (*node.input, *node.output))
    shown = "the model" if isinstance(model_input, onnx.ModelProto) else str(model_input)
    foreign = sorted(name for name in ranges.data if name not in tensors)
    if foreign:
        raise ValueError(
            f"{source}: ranges of {len(foreign)} of its {len(ranges.data)} tensors name no tensor of {shown} "
            f"({_listed(foreign)}): they come from another model"
        )
    excluded = set(nodes_to_exclude or ())
    missing = [
        node.output[0]
        for node in graph.node
        if node.op_type == "Softmax"
        and (not op_types_to_quantize or "Softmax" in op_types_to_quantize)
        and (not nodes_to_quantize or node.name in nodes_to_quantize)
        and node.name not in excluded
        and node.output[0] not in ranges.data
    ]
    if missing:
        why = ""
        if upgraded is not None:
            why = (
                f" (onnxruntime converts it from opset {_default_opset(header)} to {_default_opset(upgraded)} for "
                "this quantization, which adds tensors: calibrate for this quantization, e.g. quantize with "
                "calibration data)"
            )
        raise ValueError(f"{source}: no range for the Softmax output(s) {_listed(missing)} of {shown}{why}")


def _header(model_input: str | Path | onnx.ModelProto) -> onnx.ModelProto:
    """The model without its external data (enough for its opsets and tensor names)."""
    if isinstance(model_input, onnx.ModelProto):
        return model_input
    return load_model(model_input, load_external_data=False)


def _default_opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _check_one_range_per_tensor(ranges: TensorsData) -> None:
    """ORT's quantizer computes one scale per activation tensor: per-channel ranges of several values
    fail deep inside it (``The truth value of an array ... is ambiguous``); name the tensor instead."""
    for name, td in ranges.data.items():
        values = getattr(td, "lowest", None)
        if values is not None and np.size(values) > 1:
            raise ValueError(
                f"tensor {name!r}: per-channel ranges ({np.size(values)} values): onnxruntime's quantize_static "
                "takes one range per activation tensor (compute per-tensor ranges, e.g. "
                "state.compute(method, per_channel=False), or calibrate without per_channel)"
            )


def quantize_with_ranges(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    ranges: TensorsData,
    quantization: QuantizationArgs | None = None,
    *,
    calibrate_method: CalibrationMethod | str | None = None,
    quantized: onnx.ModelProto | None = None,
    **keywords: Any,
) -> None:
    """ORT's quantize_static on ``ranges`` (no calibration).

    Args:
        model_input: the float model (path or ModelProto).
        model_output: where the quantized model is written.
        ranges: the activation ranges, one per tensor.
        quantization: ORT's quantization arguments (default: ORT's defaults).
        calibrate_method: what ORT is told the ranges are (default: ``ranges.calibration_method``).
        quantized: the model ORT's quantize_static builds from these arguments, when the caller
            already has it (the recipe: ``ScoringModel.quantized_model``, which tests check byte
            for byte against ORT's): written by ORT's own save (``ONNXModel.save_model_to_file``)
            instead of quantizing again. Every check runs on the file as on ORT's.
        **keywords: quantization arguments by name (fields of ``QuantizationArgs``), over
            ``quantization``'s.

    Raises:
        TypeError: a keyword that is no quantization argument.
        ValueError: per-channel ranges, SmoothQuant without a method of ORT's, a range ORT
            cannot quantize with (naming the tensor), or ``per_channel`` on a model that cannot get
            per-channel weights (``check_per_channel``).
    """
    quantization = replace(quantization or QuantizationArgs(), **keywords)
    check_per_channel(model_input, quantization)
    extra = dict(quantization.extra_options or {})
    smooth_quant = bool(extra.get("SmoothQuant", False))
    _check_one_range_per_tensor(ranges)
    if calibrate_method is None:
        if smooth_quant:
            raise ValueError(SMOOTH_QUANT_NEEDS_ORT)
        calibrate_method = ranges.calibration_method
    check_ranges_before_ort(ranges)
    output = Path(model_output)
    output.parent.mkdir(parents=True, exist_ok=True)
    # ORT writes into a folder beside the output, so that a model refused after ORT wrote it (an
    # infinite scale) never replaces the output; side files (external data) move first, the model
    # last: a reader never sees a model without its data.
    with (
        tempfile.TemporaryDirectory(prefix="histocal.") as tmp,
        tempfile.TemporaryDirectory(prefix=f".{output.name}.", dir=output.parent) as staging,
        scale_issue_named(model_input),  # ORT's "scale issue" from a weight holding NaN/Inf names none
    ):
        staged = Path(staging, output.name)
        if quantized is not None:
            _save_as_onnxruntime(quantized, staged, quantization.use_external_data_format)
        else:
            cache = Path(tmp, "ranges.json")
            save_tensors_data(ranges, cache, smooth_quant=smooth_quant)
            ort_quantize_static(
                model_input,
                staged,
                calibrate_method=calibrate_method,
                calibration_cache_path=cache,
                **replace(quantization, extra_options=extra).keywords(),
            )
        read_float(staged, quantization)  # a placement's float operators read float tensors
        check_quantized_ranges(staged, ranges)
        for written in sorted(Path(staging).iterdir(), key=lambda f: f.name == output.name):
            os.replace(written, output.parent / written.name)


def _save_as_onnxruntime(model: onnx.ModelProto, path: Path, use_external_data_format: bool) -> None:
    """``model`` written as ORT's quantize_static writes its result (a copy: ORT's save moves the
    weights out into external data)."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    ONNXModel(copy).save_model_to_file(path.as_posix(), use_external_data_format)
