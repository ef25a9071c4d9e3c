"""onnxruntime's per-channel weight quantization, every channel of a weight at once.

onnxruntime's QDQ quantizer quantizes a per-channel weight one channel at a time, in Python, twice
over: its parameters (``_calc_initializer_quant_params``: ``compute_data_quant_params``, then
``compute_scale_zp``; 26 us a channel, 0.33 s for ddddocr's 8,210-class head, 0.7 s for MiniLM),
then its values (``quantize_onnx_initializer``: ``quantize_nparray`` per channel), on the way to
the recipe's first scoring model. For a float32 weight of finite values, without overrides or a
block size, those functions compute for channel c (a per-channel weight is always symmetric):

    rmin_c = min(min(w_c), 0)                     float32; rmax_c = max(max(w_c), 0)
    rmax_c = rmin_c + m   if rmin_c + m > rmax_c  (only with MinimumRealRange m; a float32 sum)
    a_c = max(|rmin_c|, |rmax_c|)                 float32
    s_c = (float64(a_c) - float64(-a_c)) / (float64(qmax) - float64(qmin))
    scale_c = 1, zero point 0                     where s_c < the smallest normal float32
    scale_c = float32(s_c), zero point round((qmin + qmax) / 2.0) in the quantized type, elsewhere
    q = clip(round(w_c / scale_c) + zero_point_c, qmin, qmax)   float32 (round half to even), then
                                                                the quantized type

``channel_parameters`` and ``quantized_weight`` do each step on every channel at once. They are
the loop's results bit for bit: a minimum and a maximum are exact whatever the order of the
reduction (a signed zero's sign is lost in the absolute value), so are the absolute value, the
negation and the rounding to an integer, and numpy's sum, subtraction, division and casts are
correctly rounded IEEE operations, the same on an array as on a scalar. The zero point is the
loop's own expression, computed once (it does not depend on the data). A weight outside that case
(float16, a non-finite value, an empty channel, another type, blocks) is left to onnxruntime's
loop.

Used only where onnxruntime's functions are sources this module was checked against
(``KNOWN_SOURCES``: onnxruntime 1.31.1's and 1.32.0's, whose ``compute_scale_zp`` differ for
float16 only); tests/quantize/test_channel_quantization.py compares both with the loop on random
weights.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

_QUANT_UTILS = "onnxruntime.quantization.quant_utils"
# SHA-256 of ``inspect.getsource`` of the functions the arithmetic above was read from.
KNOWN_SOURCES = {
    "compute_data_quant_params": frozenset({"3f573364c4842be1102c2e37476314cb36354129463472535d4eaea53139bd17"}),
    "compute_scale_zp": frozenset(
        {
            "ebd1c1e05a1ee98e5c34af484cd852920213466539a319725b661c071b5d405d",  # 1.31.1
            "615e86f6ccd6296821aa43d1a2ce14bac89d041daf1e260a6004c7c714fc0b36",  # 1.32.0
        }
    ),
    "get_qmin_qmax_for_qType": frozenset({"8dda1ebb6621c82b991adb7500c2259986367a257a27b5f7a5124ddf968a6d2a"}),
    "quantize_onnx_initializer": frozenset({"3474ff8220db56d1fa550b9abce8db32ef4efc20fbfe70b720bb09e33e0f8790"}),
    "quantize_nparray": frozenset({"364007f802236d9b350b520ad858c84b3edbdd54d37b4ff2db08dd605489d7b2"}),
}
_INTEGER_TYPES = (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16)


def known_sources(quantizer_module: Any, quant_utils: Any) -> bool:
    """Whether the functions onnxruntime's quantizer calls for a weight's parameters (from
    ``quantizer_module``, and what they call from ``quant_utils``) are the sources
    ``channel_parameters`` was checked against."""
    functions = {
        "compute_data_quant_params": quantizer_module.compute_data_quant_params,
        "compute_scale_zp": quant_utils.compute_scale_zp,
        "get_qmin_qmax_for_qType": quant_utils.get_qmin_qmax_for_qType,
        "quantize_onnx_initializer": quantizer_module.quantize_onnx_initializer,
        "quantize_nparray": quant_utils.quantize_nparray,
    }
    return all(source_digest(functions[name]) in sources for name, sources in KNOWN_SOURCES.items())


@functools.lru_cache(maxsize=64)
def source_digest(function: Callable[..., Any]) -> str:
    """SHA-256 of ``inspect.getsource(function)``, computed once per function object (reading and
    tokenizing the sources takes milliseconds, against a small model's whole quantization)."""
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()


def quantizer_parameters(quantizer: Any, info: Any, tensor: onnx.TensorProto, module: Any) -> Any:
    """onnxruntime's ``QuantizationParams`` of a per-channel initializer ``tensor`` (its entry
    ``info`` in the ``quantizer``'s tensors to quantize, without overrides), as its
    ``_calc_initializer_quant_params`` gives them; None where ``channel_parameters`` does not
    compute them, or the tensor is not a per-channel one (the method's own). ``module``:
    onnxruntime's ``qdq_quantizer``."""
    is_weight = info.tensor_type is module.QDQQuantTensorType.WEIGHT
    if info.axis is None or (is_weight and quantizer.block_size > 0):
        return None  # per tensor, or blocked: one call or another path
    quant_type = quantizer.weight_qType if is_weight else quantizer.activation_qType
    if tensor.data_type != onnx.TensorProto.FLOAT:
        return None
    weight = module.tensor_proto_to_array(tensor)
    valid, axis = module.normalize_axis(info.axis, weight.ndim)
    if not valid:
        return None  # the method raises, naming the weight
    quant_utils = importlib.import_module(_QUANT_UTILS)
    found = channel_parameters(weight, axis, quant_type, quantizer.reduce_range, quantizer.min_real_range, quant_utils)
    if found is None:
        return None
    zero_points, scales = found
    return module.QuantizationParams(zero_point=zero_points, scale=scales, quant_type=quant_type, axis=axis)


def channel_parameters(
    weight: np.ndarray, axis: int, quant_type: int, reduce_range: bool, min_real_range: float | None, quant_utils: Any
) -> tuple[np.ndarray, np.ndarray] | None:
    """The zero points and scales onnxruntime's loop gives ``weight`` per channel along ``axis``
    (normalized), as the arrays it builds from them; None where this module does not compute them
    (module docstring): the loop's. ``quant_utils``: onnxruntime's module (its ranges)."""
    if weight.dtype != np.float32 or quant_type not in _INTEGER_TYPES or weight.ndim == 0:
        return None
    channels = weight.shape[axis]
    if channels == 0 or weight.size == 0:
        return None
    rows = np.moveaxis(weight, axis, 0).reshape(channels, -1)
    low, high = rows.min(axis=1), rows.max(axis=1)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        return None  # onnxruntime's own handling (an assertion for NaN)
    qmin, qmax = quant_utils.get_qmin_qmax_for_qType(quant_type, reduce_range, symmetric=True)
    zero = np.float32(0)
    low, high = np.minimum(low, zero), np.maximum(high, zero)
    if min_real_range is not None:
        widened = low + np.asarray(min_real_range, dtype=np.float32)
        high = np.where(widened > high, widened, high)
    bound = np.maximum(np.abs(low), np.abs(high))
    scale = (bound.astype(np.float64) - (-bound).astype(np.float64)) / (
        np.array(qmax, dtype=np.float64) - np.array(qmin, dtype=np.float64)
    )
    flat = scale < np.finfo(np.float32).tiny
    middle = np.array(np.round((qmin + qmax) / np.array(2.0, dtype=np.float64)), dtype=qmin.dtype)
    zero_points = np.where(flat, np.array(0, dtype=qmin.dtype), middle).astype(qmin.dtype)
    scales = np.where(flat, np.float32(1.0), scale.astype(np.float32)).astype(np.float32)
    return zero_points, scales


def quantized_weight(
    weight: onnx.TensorProto,
    quant_type: int,
    zero_point: np.ndarray,
    scale: np.ndarray,
    axis: int | None = None,
    quant_weight_name: str | None = None,
    block_size: int = 0,
) -> onnx.TensorProto | None:
    """``quantize_onnx_initializer``'s result (same arguments) for a per-channel float32 weight of
    finite values and integer quantized type, every channel at once; None otherwise (the function's
    own)."""
    if axis is None or block_size or quant_type not in _INTEGER_TYPES or weight.data_type != onnx.TensorProto.FLOAT:
        return None
    quant_utils = importlib.import_module(_QUANT_UTILS)
    data = quant_utils.tensor_proto_to_array(weight)
    if data.ndim == 0 or not -data.ndim <= axis < data.ndim:
        return None
    channels = data.shape[axis]
    if not (
        isinstance(scale, np.ndarray)
        and isinstance(zero_point, np.ndarray)
        and scale.dtype == np.float32
        and scale.shape == zero_point.shape == (channels,)
        and data.size
        and np.isfinite(data).all()
    ):
        return None
    qmin, qmax = quant_utils.get_qmin_qmax_for_qType(quant_type, reduce_range=False, symmetric=False)
    moved = np.moveaxis(data, axis, 0)
    values = np.asarray((moved.reshape(channels, -1) / scale[:, None]).round() + zero_point[:, None])
    np.clip(values, qmin, qmax, out=values)
    quantized = np.moveaxis(
        values.astype(onnx.helper.tensor_dtype_to_np_dtype(quant_type)).reshape(moved.shape), 0, axis
    )
    name = quant_weight_name if quant_weight_name else f"{weight.name}{quant_utils.TENSOR_NAME_QUANT_SUFFIX}"
    return onnx.numpy_helper.from_array(quantized.reshape(weight.dims), name)


__all__ = [
    "KNOWN_SOURCES",
    "channel_parameters",
    "known_sources",
    "quantized_weight",
    "quantizer_parameters",
    "source_digest",
]
