"""onnxruntime's weight quantization computed every channel at once, and once across the recipe's
and diagnose's ``quantize_static`` calls.

onnxruntime's quantizer computes every per-channel weight's parameters and quantized values in
Python, channel by channel (on MiniLM 10,000 ``compute_data_quant_params`` calls a quantization:
most of each call's time, issue 37). ``every_channel_at_once()``, held by every histocal call of
onnxruntime's ``quantize_static`` (``quantize.ort.ort_quantize_static``), computes them for every
channel of a weight at once instead (``channel_quantization``: the same values bit for bit, where
onnxruntime's sources are the ones it was checked against): a per-channel quantization of MiniLM
0.92 -> 0.45 s, ddddocr 0.69 -> 0.40 s, the same file.

The recipe quantizes the same prepared model several times (one scoring model per placement, then
the chosen model), diagnose once and then per exact check; the weights' quantization depends only on
the weight and the settings, never on the activation ranges. ``shared_weight_quantization()``
memoizes, while it is held (the patch alone keeps nothing):

- each initializer's parameters, as the quantizer's ``_calc_initializer_quant_params`` computes
  them (one loop iteration per weight channel, in Python: 26 us a channel, 0.33 s for ddddocr's
  8,210-class head, 0.7 s for MiniLM). That method is not a pure function: it reads the
  quantizer's settings and its tensors' entries. So it is memoized only while its source is one
  this module was checked against (``_KNOWN_INITIALIZER_PARAMS``: onnxruntime 1.31.1's and
  1.32.0's, which are the same), per initializer without overrides, keyed by everything that
  source reads for it: the tensor's entry (type, axis, data type), the initializer (name, type,
  dims, data), and the quantizer's weight and activation types, their symmetry, ``reduce_range``,
  ``MinimumRealRange`` and block size. A per-channel float32 weight missing from the memo is
  computed every channel at once (``channel_quantization``, bit for bit the loop's) where the functions
  the loop calls are sources that module was checked against, else by the method. With another
  source of the method, the function that loop calls, ``compute_data_quant_params``, is memoized
  instead, per channel (5 us a channel answered);
- each quantized weight, ``quantize_onnx_initializer``'s result.

Those two functions are pure: memoized by the value of every argument (array arguments by dtype,
shape and a SHA-256 digest of their bytes; a tensor by its fields and a digest of its raw data), a
call answered from the memo returns what the call would compute. A weight is digested once a
quantization: its parameters' key is kept for the duration of the ``quantize_model`` call, with the
message it was computed from, and that call's ``quantize_onnx_initializer`` of the same message
uses it (ddddocr's 33 MB head: 55 ms a digest). A model quantized meanwhile is byte for byte the one onnxruntime writes without the
memo (tests/quantize/test_recipe_speed.py checks it, with and without the per-initializer memo).
Memory while held: a digest per initializer (or weight channel), its parameters, and each quantized
weight (a quarter of the float weights at int8); the memo is emptied when the last use ends.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx

from ..patching import CountedPatch, Replacement
from . import channel_quantization

_QDQ_MODULE = "onnxruntime.quantization.qdq_quantizer"
_QUANT_UTILS = "onnxruntime.quantization.quant_utils"
_memo: dict[tuple, Any] = {}
_memo_lock = threading.Lock()
# How many ``shared_weight_quantization`` uses are held: without one, the patch only computes every
# channel at once (``every_channel_at_once``) and keeps nothing.
_memo_uses = 0
# Per thread, during one ``quantize_model`` call: each initializer's key as the per-initializer memo
# computed it, with the message it was computed from, so that the call's quantize_onnx_initializer
# of the same message needs no second digest (module docstring).
_call_keys: dict[int, dict[str, tuple[onnx.TensorProto, tuple]]] = {}
# SHA-256 of ``inspect.getsource(QDQQuantizer._calc_initializer_quant_params)`` in the onnxruntime
# versions whose method the per-initializer memo's key was written from (module docstring).
_KNOWN_INITIALIZER_PARAMS = frozenset({"1fcb03ec6e2665b1b47321c3b2ad22f7bc695bad3cb3864967aa366c846dbda5"})


def _digest(data: bytes | memoryview) -> bytes:
    # SHA-256: the CPU's SHA instructions make it the fastest of hashlib's here (1.7 GB/s, BLAKE2b 0.9)
    return hashlib.sha256(data).digest()


def _key(value: Any) -> Any:
    """A hashable key of ``value`` that equal values share."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value), value)  # typed: 1 and True and 1.0 stay apart
    if isinstance(value, np.ndarray):
        # A digest, not the bytes: kept as a key, the bytes would double the weights' memory.
        return ("ndarray", value.dtype.str, value.shape, _digest(np.ascontiguousarray(value).data))
    if isinstance(value, onnx.TensorProto):
        with _memo_lock:
            known = _call_keys.get(threading.get_ident(), {}).get(value.name)
        # The same message (held by the entry, so never another at its address): its key.
        return known[1] if known is not None and known[0] is value else _tensor_key(value)
    if isinstance(value, np.generic):
        return ("scalar", value.dtype.str, value.tobytes())
    return (type(value).__name__, repr(value))


def _is_repeated(field: Any) -> bool:
    is_repeated = getattr(field, "is_repeated", None)  # protobuf >= 6; ``label`` before (gone in 7)
    return bool(is_repeated) if is_repeated is not None else field.label == field.LABEL_REPEATED


_RAW_TENSOR_FIELDS = ("name", "dims", "data_type", "raw_data")
# Every other field of TensorProto, and whether it is repeated (set: not empty) or not (set: present).
_OTHER_TENSOR_FIELDS = tuple(
    (f.name, _is_repeated(f)) for f in onnx.TensorProto.DESCRIPTOR.fields if f.name not in _RAW_TENSOR_FIELDS
)


def _tensor_key(tensor: onnx.TensorProto) -> tuple:
    """A tensor's key: everything the message holds. A tensor of only a name, dims, a type and
    raw data (every weight onnx loads from a file) by those fields and a digest of the raw data:
    a third cheaper than serializing it (one copy of the data, not a copy into a new message's
    bytes: 55 ms for ddddocr's 33 MB head, not 85); any other tensor by its whole serialized
    message. The two kinds of key never equal each other (a miss, never a wrong hit)."""
    others = any(
        len(getattr(tensor, name)) if repeated else tensor.HasField(name) for name, repeated in _OTHER_TENSOR_FIELDS
    )
    if tensor.HasField("raw_data") and not others:
        return ("TensorProto", tensor.name, tuple(tensor.dims), tensor.data_type, _digest(tensor.raw_data))
    return ("TensorProto", _digest(tensor.SerializeToString()))


def _memoized(
    name: str,
    original: Callable[..., Any],
    copy: Callable[[Any], Any],
    at_once: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """``original`` memoized by its arguments' keys; ``at_once``: computes a miss where it can
    (``channel_quantization``: the same result), None where ``original`` must."""

    def memoized(*args: Any, **kwargs: Any) -> Any:
        if not _memo_uses:  # a quantization on its own: nothing to share, no key to compute
            hit = at_once(*args, **kwargs) if at_once is not None else None
            return original(*args, **kwargs) if hit is None else hit
        # Keywords in the caller's order: another order is another key (a miss, never a wrong hit).
        key = (name, tuple(map(_key, args)), tuple((k, _key(v)) for k, v in kwargs.items()))
        with _memo_lock:
            hit = _memo.get(key)
        if hit is None:
            hit = at_once(*args, **kwargs) if at_once is not None else None
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
        if not _memo_uses:
            return original(data, quant_type, symmetric, reduce_range, min_real_range, rmin_override, rmax_override)
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


def _initializer_params(
    original: Callable[[Any], dict[str, Any]], module: Any, every_channel_at_once: bool
) -> Callable[[Any], dict[str, Any]]:
    """``QDQQuantizer._calc_initializer_quant_params`` memoized per initializer (module docstring)
    while a ``shared_weight_quantization`` use is held: the entries the memo lacks are computed on
    the quantizer with only those tensors, by ``_at_once`` where ``every_channel_at_once``
    (onnxruntime's functions are sources it was checked against), else by the method; the result
    lists every entry in the order the method gives them. ``module``: onnxruntime's
    ``qdq_quantizer``."""

    def computed_by_either(quantizer: Any) -> dict[str, Any]:
        return _at_once(quantizer, original, module) if every_channel_at_once else original(quantizer)

    def initializer_params(quantizer: Any) -> dict[str, Any]:
        if not _memo_uses:
            return computed_by_either(quantizer)
        settings = tuple(
            map(
                _key,
                (
                    quantizer.weight_qType,
                    quantizer.activation_qType,
                    quantizer.is_weight_symmetric(quantizer.weight_qType),
                    quantizer.is_activation_symmetric,
                    quantizer.reduce_range,
                    quantizer.min_real_range,
                    quantizer.block_size,
                ),
            )
        )
        tensors = _initializers_computed(quantizer)
        keys = {}
        for name, tensor in tensors.items():
            info = quantizer.tensors_to_quantize[name]
            entry = (_key(info.tensor_type), _key(info.axis), _key(info.data_type))
            keys[name] = ("initializer params", name, entry, _key(tensor), settings)
        with _memo_lock:
            hits = {name: _memo[key] for name, key in keys.items() if key in _memo}
            calls = _call_keys.get(threading.get_ident())
            if calls is not None:  # inside ``quantize_model``: for its quantize_onnx_initializer calls
                calls.update({name: (tensors[name], key[3]) for name, key in keys.items()})
        every = quantizer.tensors_to_quantize
        computed = _without(quantizer, hits.keys(), computed_by_either)
        with _memo_lock:
            for name, key in keys.items():
                if name in computed:
                    _memo[key] = copy.deepcopy(computed[name])  # the quantizer may change what it gets
        return {
            name: copy.deepcopy(hits[name]) if name in hits else computed[name]
            for name in every
            if name in hits or name in computed
        }

    return initializer_params


def _at_once(quantizer: Any, original: Callable[[Any], dict[str, Any]], module: Any) -> dict[str, Any]:
    """``_calc_initializer_quant_params``'s result, its per-channel initializers without overrides
    computed by ``channel_quantization`` where it computes them and the others by the method, on the
    quantizer with only those tensors; in the method's order."""
    every = quantizer.tensors_to_quantize
    computed: dict[str, Any] = {}
    for name, tensor in _initializers_computed(quantizer).items():
        params = channel_quantization.quantizer_parameters(quantizer, every[name], tensor, module)
        if params is not None:
            computed[name] = params
    if not computed:
        return original(quantizer)
    rest = _without(quantizer, computed.keys(), original)
    return {
        name: computed[name] if name in computed else rest[name] for name in every if name in computed or name in rest
    }


def _initializers_computed(quantizer: Any) -> dict[str, onnx.TensorProto]:
    """The initializers among the quantizer's tensors to quantize whose parameters the method
    computes (not given by overrides), by name, each the one its ``find_by_name`` takes (the first)."""
    initializers: dict[str, onnx.TensorProto] = {}
    for tensor in quantizer.model.initializer():
        initializers.setdefault(tensor.name, tensor)
    overrides = quantizer.tensor_quant_overrides
    return {
        name: initializers[name]
        for name in quantizer.tensors_to_quantize
        if name in initializers and name not in overrides
    }


def _without(quantizer: Any, names: Collection[str], method: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    """``method(quantizer)`` on the quantizer with ``names`` left out of its tensors to quantize."""
    every = quantizer.tensors_to_quantize
    quantizer.tensors_to_quantize = {name: info for name, info in every.items() if name not in names}
    try:
        return method(quantizer)
    finally:
        quantizer.tensors_to_quantize = every


def _quantize_model(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``QDQQuantizer.quantize_model`` with its initializers' keys kept for the call's duration
    (``_call_keys``): between ``_calc_initializer_quant_params`` and the weights'
    ``quantize_onnx_initializer`` onnxruntime adds initializers but changes none."""

    def quantize_model(quantizer: Any) -> Any:
        thread = threading.get_ident()
        with _memo_lock:
            _call_keys[thread] = {}
        try:
            return original(quantizer)
        finally:
            with _memo_lock:
                del _call_keys[thread]  # the messages (and so the model) are not held past the call

    return quantize_model


def _replacements() -> list[Replacement]:
    module = importlib.import_module(_QDQ_MODULE)
    params, initializer = module.compute_data_quant_params, module.quantize_onnx_initializer
    quantizer = module.QDQQuantizer
    method = quantizer._calc_initializer_quant_params
    known = channel_quantization.source_digest(method) in _KNOWN_INITIALIZER_PARAMS
    at_once = channel_quantization.known_sources(module, importlib.import_module(_QUANT_UTILS))
    # Routed: a name bound while patched goes back to onnxruntime's own (and the memo fills no
    # more) once the last use ends.
    # Per initializer where its method's source is known, else per channel (each channel's call
    # to the pure function): with both, a first computation would pay the channel memo for nothing.
    computed = (
        [
            (
                quantizer,
                "_calc_initializer_quant_params",
                _PATCH.route(_initializer_params(method, module, at_once), method),
            ),
            (
                quantizer,
                "quantize_model",
                _PATCH.route(_quantize_model(quantizer.quantize_model), quantizer.quantize_model),
            ),
        ]
        if known
        else [(module, "compute_data_quant_params", _PATCH.route(_channel_params(params), params))]
    )
    return [
        *computed,
        (
            module,
            "quantize_onnx_initializer",
            _PATCH.route(
                _memoized(
                    "quantize_onnx_initializer",
                    initializer,
                    _copy_tensor,
                    channel_quantization.quantized_weight if at_once else None,
                ),
                initializer,
            ),
        ),
    ]


_PATCH = CountedPatch(_replacements)


@contextmanager
def every_channel_at_once() -> Iterator[None]:
    """While held, onnxruntime's QDQ quantizer computes a per-channel weight's parameters and
    values every channel at once (``channel_quantization``, where its sources are known: the same
    results); uses nest. Held by every histocal call of onnxruntime's ``quantize_static``."""
    _PATCH.apply()
    try:
        yield
    finally:
        _PATCH.undo()


@contextmanager
def shared_weight_quantization() -> Iterator[None]:
    """While held, onnxruntime's QDQ quantizer computes each weight's parameters and quantized
    values once (module docstring), every channel at once; uses nest."""
    global _memo_uses
    with every_channel_at_once():
        with _memo_lock:
            _memo_uses += 1
        try:
            yield
        finally:
            with _memo_lock:
                _memo_uses -= 1
                if not _memo_uses:
                    _memo.clear()


__all__ = ["every_channel_at_once", "shared_weight_quantization"]
