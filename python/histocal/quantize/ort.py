"""onnxruntime's quantize_static with ranges already computed: the step every histocal path ends in
(the ranges reach ORT through an ORT-format calibration cache)."""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any

import onnx
from onnxruntime.quantization import QuantFormat, QuantType
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

from ..io.cache import save_tensors_data

# quantize_static's quantization arguments (what a caller may pass through with given ranges).
QUANTIZE_ARGUMENTS = (
    "quant_format",
    "op_types_to_quantize",
    "per_channel",
    "reduce_range",
    "activation_type",
    "weight_type",
    "nodes_to_quantize",
    "nodes_to_exclude",
    "use_external_data_format",
    "calibration_providers",
    "extra_options",
)
SMOOTH_QUANT_NEEDS_ORT = (
    "SmoothQuant recalibrates a rewritten model inside onnxruntime: use one of ORT's methods and no tensors_range"
)


def ort_quantize_static(*args: Any) -> None:
    # `onnxruntime.quantization.quantize` is shadowed by a function of that name: go by module.
    importlib.import_module("onnxruntime.quantization.quantize").quantize_static(*args)


def model_file(model_input: str | Path | onnx.ModelProto, tmp: Path) -> Path:
    """The model's path: as given, or a ModelProto saved into ``tmp`` (its weights as external
    data, so models over 2 GB work). The caller's ModelProto is left as it is: onnx moves the
    weights of the proto it saves as external data out of it, so a copy is saved."""
    if isinstance(model_input, onnx.ModelProto):
        path = tmp / "model_input.onnx"
        copy = onnx.ModelProto()
        copy.CopyFrom(model_input)
        onnx.save_model(copy, path.as_posix(), save_as_external_data=True)
        return path
    return Path(model_input)


def quantize_with_ranges(
    model_input: str | Path | onnx.ModelProto,
    model_output: str | Path,
    ranges: TensorsData,
    quant_format: Any = QuantFormat.QDQ,
    op_types_to_quantize: list[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
    activation_type: Any = QuantType.QInt8,
    weight_type: Any = QuantType.QInt8,
    nodes_to_quantize: list[str] | None = None,
    nodes_to_exclude: list[str] | None = None,
    use_external_data_format: bool = False,
    calibration_providers: list[Any] | None = None,
    extra_options: dict[str, Any] | None = None,
    *,
    calibrate_method: CalibrationMethod | str | None = None,
) -> None:
    """ORT's quantize_static on ``ranges`` (no calibration). ``calibrate_method``: what ORT is told
    the ranges are (default: ``ranges.calibration_method``)."""
    extra = dict(extra_options or {})
    smooth_quant = bool(extra.get("SmoothQuant", False))
    if calibrate_method is None:
        if smooth_quant:
            raise ValueError(SMOOTH_QUANT_NEEDS_ORT)
        calibrate_method = ranges.calibration_method
    with tempfile.TemporaryDirectory(prefix="histocal.") as tmp:
        cache = Path(tmp, "ranges.json")
        save_tensors_data(ranges, cache, smooth_quant=smooth_quant)
        ort_quantize_static(
            model_input,
            model_output,
            None,
            quant_format,
            op_types_to_quantize,
            per_channel,
            reduce_range,
            activation_type,
            weight_type,
            nodes_to_quantize,
            nodes_to_exclude,
            use_external_data_format,
            calibrate_method,
            calibration_providers,
            extra,
            cache,
        )
