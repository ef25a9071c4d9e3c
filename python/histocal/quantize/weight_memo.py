"""onnxruntime's weight quantization computed once across the recipe's ``quantize_static`` calls.

The recipe quantizes the same prepared model several times with onnxruntime's own
``quantize_static``: one scoring model per placement, then the chosen model. Each call computes
every weight's per-channel parameters and quantized values again, in Python, channel by channel
(on MiniLM 10,000 ``compute_data_quant_params`` calls a quantization: most of each call's time,
issue 37), though they depend only on the weight and the settings, never on the activation ranges.

``shared_weight_quantization()`` memoizes, while it is held, the two functions onnxruntime's QDQ
quantizer calls for that, ``compute_data_quant_params`` and ``quantize_onnx_initializer``, by the
value of every argument (array arguments by dtype, shape and a 128-bit BLAKE2 digest of their
bytes): both are pure functions of their arguments, so a call answered from the memo returns what
the call would compute, and a model quantized meanwhile is byte for byte the one onnxruntime
writes without it (tests/quantize/test_recipe_speed.py checks both). Memory while held: a digest
per weight channel, its parameters, and each quantized weight (a quarter of the float weights at
int8); the memo is emptied when the last use ends.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx

from ..patching import CountedPatch, Replacement

_QDQ_MODULE = "onnxruntime.quantization.qdq_quantizer"
_memo: dict[tuple, Any] = {}
_memo_lock = threading.Lock()


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _key(value: Any) -> Any:
    """A hashable key of ``value`` that equal values share."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value), value)  # typed: 1 and True and 1.0 stay apart
    if isinstance(value, np.ndarray):
        # A digest, not the bytes: kept as a key, the bytes would double the weights' memory.
        return ("ndarray", value.dtype.str, value.shape, _digest(np.ascontiguousarray(value).data))
    if isinstance(value, onnx.TensorProto):
        # The whole message: name, type, dims and data (raw or typed fields) alike.
        return ("TensorProto", _digest(value.SerializeToString()))
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.tobytes())
    return (type(value).__name__, repr(value))


def _memoized(name: str, original: Callable[..., Any], copy: Callable[[Any], Any]) -> Callable[..., Any]:
    def memoized(*args: Any, **kwargs: Any) -> Any:
        # Keywords in the caller's order: another order is another key (a miss, never a wrong hit).
        key = (name, tuple(map(_key, args)), tuple((k, _key(v)) for k, v in kwargs.items()))
        with _memo_lock:
            hit = _memo.get(key)
        if hit is None:
            hit = original(*args, **kwargs)  # an exception is not kept: the next call raises it again
            with _memo_lock:
                _memo[key] = hit
        return copy(hit)  # the caller may keep or change what it gets

    return memoized


def _copy_pair(pair: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return pair[0].copy(), pair[1].copy()


def _copy_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    return out


def _channel_params(original: Callable[..., Any]) -> Callable[..., Any]:
    """``compute_data_quant_params`` memoized, its common call (one weight channel, no overrides:
    tens of thousands a model) keyed at the cost of one digest and one tuple; other calls as
    ``_memoized``'s."""
    generic = _memoized("compute_data_quant_params", original, _copy_pair)

    def channel_params(
        data: Any,
        quant_type: Any,
        symmetric: Any,
        reduce_range: Any = False,
        min_real_range: Any = None,
        rmin_override: Any = None,
        rmax_override: Any = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        if (
            rmin_override is not None
            or rmax_override is not None
            or not isinstance(data, np.ndarray)
            or not all(isinstance(v, (bool, int, float, type(None))) for v in (symmetric, reduce_range, min_real_range))
        ):
            return generic(data, quant_type, symmetric, reduce_range, min_real_range, rmin_override, rmax_override)
        key = (
            "channel",
            data.dtype.str,
            data.shape,
            _digest(np.ascontiguousarray(data).data),
            quant_type,
            symmetric,
            reduce_range,
            min_real_range,
        )
        with _memo_lock:
            hit = _memo.get(key)
        if hit is None:
            hit = original(data, quant_type, symmetric, reduce_range=reduce_range, min_real_range=min_real_range)
            with _memo_lock:
                _memo[key] = hit
        return _copy_pair(hit)

    return channel_params


def _replacements() -> list[Replacement]:
    module = importlib.import_module(_QDQ_MODULE)
    params, initializer = module.compute_data_quant_params, module.quantize_onnx_initializer
    # Routed: a name bound while patched goes back to onnxruntime's own (and the memo fills no
    # more) once the last use ends.
    return [
        (module, "compute_data_quant_params", _PATCH.route(_channel_params(params), params)),
        (
            module,
            "quantize_onnx_initializer",
            _PATCH.route(_memoized("quantize_onnx_initializer", initializer, _copy_tensor), initializer),
        ),
    ]


_PATCH = CountedPatch(_replacements)


@contextmanager
def shared_weight_quantization() -> Iterator[None]:
    """While held, onnxruntime's QDQ quantizer computes each weight's parameters and quantized
    values once (module docstring); uses nest."""
    _PATCH.apply()
    try:
        yield
    finally:
        _PATCH.undo()
        if not _PATCH.active:
            with _memo_lock:
                _memo.clear()


__all__ = ["shared_weight_quantization"]
