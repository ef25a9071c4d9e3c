"""Calibration methods beyond onnxruntime's, computed from a state's streaming histogram.

Every histocal state holds, per tensor, a streaming histogram (a signed histogram of equal-width
bins over ``[-2^level, 2^level)`` plus the finite min/max). From it, without running the model:

* ``"mse"``: the range with the least mean squared quantization error (rounding plus clipping)
  for the target type, under onnxruntime's own scale/zero-point rule (symmetric or not);
* ``"kl"``: TensorRT's entropy calibration (one-sided |x| histogram of ``num_bins`` bins,
  thresholds from ``num_quantized_bins`` bins upward, KL divergence with the quantized
  distribution zero where the reference is zero; the low end is raised to the data's min when
  that is above -t, so a Relu output gets (0, t));
* ``"pow2"``: power-of-two scales as in AMD Quark (its options: :mod:`histocal.methods.table`); the
  range returned is ``(qmin * s, qmax * s)``, which onnxruntime's asymmetric rule turns back into
  scale ``s`` and zero point 0. Only scales whose range the tensor's type holds are candidates
  (float32: up to 2^120 for int8); data whose covering scale is larger is an error;
* ``"isotone"``: PPQ's order-preserving scale for classification outputs, from the per-row top-two
  summaries an isotone collection keeps beside the histogram (:mod:`histocal.methods.isotone`);
* ``"auto"``: per tensor, whichever of minmax, percentile (99.99 and 99.999), ORT entropy, kl and
  mse has the least estimated quantization error (the ``mse`` error model); its candidates
  (``AUTO_CANDIDATES``) include ORT's methods, so the state computes it (``histocal.state.auto``). This is what
  ``CalibrationState.compute("auto")`` (and ``calibrate``, ``create_calibrator``) return: a state
  has no model to run. The least error per tensor is not always the best model output, so
  ``histocal.quantize_static(calibrate_method="auto")`` and ``histocal quantize --method auto
  --data ...``, which have the model and data at hand, choose at the model level instead (see
  ``histocal.quantize.selection``): among ``MODEL_AUTO_CANDIDATES`` (this per-tensor estimate and every
  single method's full range set), the one whose quantized model's output is closest to the float
  model's, K-fold cross-validated (option ``folds``) on the first ``eval_samples`` calibration feeds. Option
  ``per_tensor_estimate=True`` keeps the per-tensor estimate there too.

``register_method(name, fn)`` adds a method: ``fn`` receives a :class:`TensorHistogram` and
returns ``(low, high)``; the name then works wherever the built-in ones do (``CalibrationState.
compute``, ``create_calibrator``/``quantize_static``'s ``calibrate_method``, the CLI with
``--plugin``). Tensors without finite values get ``(0.0, 0.0)`` from every method (custom ones
are not called for them).

The error model (``qerror``): the bins' centres (clamped to the data's min/max) stand for their
values; onnxruntime's ``compute_scale_zp`` maps the range, in the tensor's type (float16 or
float32, as TensorData holds it), to a scale of that type and a zero point, under the installed
onnxruntime's degenerate-scale rule (``histocal.methods.scale_rule``: 1.32 changed it for float16); the
error is the count-weighted mean of ``(x - dequantize(quantize(x)))^2``. mse searches with this
model, and pow2 keeps to the exponents whose range that rule maps back to scale ``2^k``.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from .isotone import isotone_ranges
from .scale_rule import SCALE_RULE
from .table import (
    ALL_DATA,
    HISTOCAL_METHODS,
    HISTOCAL_TABLE,
    MIN_MSE,
    NON_OVERFLOW,
    ORT_METHODS,
    POW2_QTYPES,
    QTYPES,
    TABLE,
)

if TYPE_CHECKING:
    from .. import _core

logger = logging.getLogger(__name__)

# Options of the histocal methods and their defaults (from the method table).
METHOD_OPTIONS: dict[str, dict[str, Any]] = {m.name: m.defaults for m in HISTOCAL_TABLE}
# auto's candidates: (label, method, options), in tie-breaking order.
AUTO_CANDIDATES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("minmax", "minmax", {"symmetric": False}),
    ("percentile 99.99", "percentile", {"symmetric": True, "num_bins": 2048, "percentile": 99.99}),
    ("percentile 99.999", "percentile", {"symmetric": True, "num_bins": 2048, "percentile": 99.999}),
    ("entropy", "entropy", {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128}),
    ("kl", "kl", {}),
    ("mse", "mse", {}),
)

# auto's model-level choice (quantize_static / the CLI's quantize): (label, method, options), in
# tie-breaking order. Options are completed per run by ``model_candidate_options``: qtype from the
# activation type, and symmetric (auto, mse, percentile) from ActivationSymmetric.
MODEL_AUTO_CANDIDATES: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("per-tensor estimate", "auto", {}),
    ("minmax", "minmax", {"symmetric": False}),
    # ORT's Distribution (its quantize_static defaults): for integer types its ranges are the
    # histogram's symmetric edges, +-(max |x| rounded up to a bin), a clip-free symmetric MinMax.
    ("distribution", "distribution", {"num_bins": 2048, "scenario": "same"}),
    ("percentile 99.99", "percentile", {"num_bins": 2048, "percentile": 99.99}),
    ("percentile 99.999", "percentile", {"num_bins": 2048, "percentile": 99.999}),
    ("entropy 128", "entropy", {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128}),
    ("entropy 2048", "entropy", {"symmetric": False, "num_bins": 2048, "num_quantized_bins": 128}),
    ("kl", "kl", {}),
    ("mse", "mse", {}),
    (f"pow2 {NON_OVERFLOW}", "pow2", {"pow2_method": NON_OVERFLOW}),
    (f"pow2 {MIN_MSE}", "pow2", {"pow2_method": MIN_MSE, "minmse_mode": ALL_DATA}),
)
# Options of auto's model-level choice (not of the per-tensor method: a state cannot use them).
AUTO_SELECTION_OPTIONS: dict[str, Any] = {"eval_samples": 16, "folds": 4, "per_tensor_estimate": False}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")


@dataclass(frozen=True)
class TensorHistogram:
    """One tensor's collected state, as a custom method sees it.

    ``counts[i]`` values lie in ``[edges[i], edges[i + 1])`` (a signed histogram of equal-width
    bins); ``min``/``max`` are the exact finite extremes; non-finite values are only counted.

    Attributes:
        name: the tensor.
        dtype: its data type's name.
        counts: the bins' counts (uint64).
        edges: the bins' edges (float64, one more than the counts).
        min: the smallest finite value.
        max: the largest finite value.
        n_nan: NaN values.
        n_posinf: +inf values.
        n_neginf: -inf values.
        batches: the batches collected.
    """

    name: str
    dtype: str
    counts: np.ndarray  # uint64
    edges: np.ndarray  # float64, len(counts) + 1
    min: float
    max: float
    n_nan: int
    n_posinf: int
    n_neginf: int
    batches: int


MethodFn = Callable[[TensorHistogram], "tuple[float, float]"]

_registry: dict[str, MethodFn] = {}
_lock = threading.Lock()


def register_method(name: str, fn: MethodFn, *, replace: bool = False) -> None:
    """Make ``fn`` available as calibration method ``name``.

    The name then works wherever a method name does: ``CalibrationState.compute``,
    ``create_calibrator`` and ``quantize_static``'s ``calibrate_method``, and the command line
    (``--plugin``). Registered methods take no options (docs/methods.md, "Registered methods").

    Args:
        name: matches ``[A-Za-z_][A-Za-z0-9_.:-]{0,63}`` and is no built-in method's name, in
            any case.
        fn: maps one tensor's (or channel's) streaming histogram, a ``TensorHistogram``, to
            ``(low, high)``; tensors without finite values get ``(0, 0)`` without a call.
        replace: replace an earlier registration of ``name``.

    Raises:
        ValueError: a malformed or built-in name, or a name already registered without
            ``replace``. (Later, a result that is not finite with ``low <= high``, or an
            exception inside ``fn``, is a ``ValueError`` naming the method and the tensor.)
        TypeError: ``fn`` is not callable.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"method name must be an identifier-like string of at most 64 characters, got {name!r}")
    if name.lower() in ORT_METHODS + HISTOCAL_METHODS:
        raise ValueError(f"{name!r} is a built-in method and cannot be replaced")
    if not callable(fn):
        raise TypeError(f"method {name!r}: fn must be callable, got {type(fn).__name__}")
    with _lock:
        if name in _registry and not replace:
            raise ValueError(f"method {name!r} is already registered (pass replace=True to replace it)")
        _registry[name] = fn


def unregister_method(name: str) -> None:
    """Remove a method added by ``register_method``.

    Args:
        name: the method's name.

    Raises:
        KeyError: no method of that name is registered.
    """
    with _lock:
        if name not in _registry:
            raise KeyError(f"no registered method {name!r}")
        del _registry[name]


def registered_methods() -> list[str]:
    """The methods added by ``register_method``.

    Returns:
        Their names, sorted.
    """
    with _lock:
        return sorted(_registry)


def method_names() -> list[str]:
    """Every method name ``CalibrationState.compute`` accepts."""
    return list(ORT_METHODS + HISTOCAL_METHODS) + registered_methods()


def canonical_name(method: Any) -> str:
    """The method's name: ORT's enum or any built-in name (any case), or a registered name."""
    if isinstance(method, CalibrationMethod):
        return method.name.lower()
    if isinstance(method, str):
        if method.lower() in ORT_METHODS + HISTOCAL_METHODS:
            return method.lower()
        with _lock:
            if method in _registry:
                return method
    raise ValueError(f"unknown calibration method {method!r}; known: {method_names()}")


def check_options(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a histocal method with defaults filled in; ValueError names a bad one."""
    if method in _registry:
        if options:
            raise ValueError(f"registered method {method!r} takes no options, got {sorted(options)}")
        return {}
    allowed = METHOD_OPTIONS[method]
    unknown = set(options) - set(allowed)
    if method == "auto" and unknown and unknown <= set(AUTO_SELECTION_OPTIONS):
        raise ValueError(
            f"auto: {sorted(unknown)} are options of auto's model-level choice, which needs the model and data: "
            "histocal.quantize_static or `histocal quantize --data` (a state or calibrator gives the per-tensor estimate)"
        )
    if unknown:
        raise ValueError(f"unknown options for {method}: {sorted(unknown)} (allowed: {sorted(allowed)})")
    out = {**allowed, **options}
    for option in TABLE[method].options:
        option.check(method, out[option.name])
    if method == "kl" and out["num_bins"] < out["num_quantized_bins"]:
        raise ValueError(
            f"kl: num_bins ({out['num_bins']}) must be at least num_quantized_bins ({out['num_quantized_bins']})"
        )
    return out


def qtype_of(activation_type: Any) -> str:
    """histocal's qtype name for an onnxruntime ``QuantType`` (or a qtype name)."""
    name = getattr(activation_type, "name", activation_type)
    table = {"QInt8": "int8", "QUInt8": "uint8", "QInt16": "int16", "QUInt16": "uint16"}
    if name in table:
        return table[name]
    if name in QTYPES:
        return str(name)
    raise ValueError(f"histocal methods quantize to int8/uint8/int16/uint16, not {activation_type!r}")


def tensor_histogram(stream: _core.StreamHistograms, name: str) -> TensorHistogram:
    """A tensor's streaming histogram as a :class:`TensorHistogram`."""
    ex = stream.export(name)
    half = len(ex.bins) // 2
    top = math.ldexp(1.0, ex.level if ex.level is not None else 0)
    edges = np.linspace(-top, top, 2 * half + 1)  # exact: power-of-two steps
    _, n_nan, n_posinf, n_neginf, batches = ex.counts  # a plain tuple
    nan = math.nan
    return TensorHistogram(
        name=name,
        dtype=ex.dtype,
        counts=np.asarray(ex.bins),
        edges=edges,
        min=nan if ex.finite_min is None else ex.finite_min,
        max=nan if ex.finite_max is None else ex.finite_max,
        n_nan=n_nan,
        n_posinf=n_posinf,
        n_neginf=n_neginf,
        batches=batches,
    )


def _custom_ranges(stream: Any, names: Sequence[str], method: str) -> list[tuple[float, float]]:
    with _lock:
        fn = _registry[method]
    out = []
    for name in names:
        t = tensor_histogram(stream, name)
        if not int(t.counts.sum()):
            out.append((0.0, 0.0))
            continue
        try:
            low, high = fn(t)
            low, high = float(low), float(high)
        except Exception as exc:  # a user's function: report which tensor it failed on
            raise ValueError(f"method {method!r} failed on tensor {name!r}: {exc!r}") from exc
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(
                f"method {method!r} returned ({low}, {high}) for tensor {name!r}: expected finite low <= high"
            )
        out.append((low, high))
    return out


def ranges(stream: Any, names: Sequence[str], method: str, options: Mapping[str, Any]) -> list[tuple[float, float]]:
    """Per-tensor ``(low, high)`` of a histocal method but ``auto`` (whose candidates include ORT's
    methods: ``histocal.state.auto``) or of a registered method, from the streaming histograms."""
    if method in _registry:
        return _custom_ranges(stream, names, method)
    if method == "isotone":
        return isotone_ranges(stream, names, options)
    return list(stream.ranges(method, list(names), scale_rule=SCALE_RULE, **options))


def model_candidate_options(qtype: str, symmetric: bool) -> list[tuple[str, str, dict[str, Any]]]:
    """``MODEL_AUTO_CANDIDATES`` with the run's qtype and symmetry filled in, without the
    candidates the qtype rules out (pow2 has no uint16)."""
    out = []
    for label, method, options in MODEL_AUTO_CANDIDATES:
        if method == "pow2" and qtype not in POW2_QTYPES:
            continue
        options = dict(options)
        if method in METHOD_OPTIONS:
            allowed = METHOD_OPTIONS[method]
            options.update({k: v for k, v in (("qtype", qtype), ("symmetric", symmetric)) if k in allowed})
        elif method == "percentile":
            options["symmetric"] = symmetric
        out.append((label, method, options))
    return out


def check_selection_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """auto's model-level options with defaults filled in; ValueError names a bad one."""
    unknown = set(options) - set(AUTO_SELECTION_OPTIONS)
    if unknown:
        raise ValueError(
            f"unknown options for auto's model-level choice: {sorted(unknown)} (allowed: {sorted(AUTO_SELECTION_OPTIONS)})"
        )
    out = {**AUTO_SELECTION_OPTIONS, **options}
    n = out["eval_samples"]
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"auto: eval_samples must be a positive integer, got {n!r}")
    k = out["folds"]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"auto: folds must be an integer of at least 2, got {k!r}")
    if not isinstance(out["per_tensor_estimate"], (bool, np.bool_)):
        raise ValueError(f"auto: per_tensor_estimate must be a boolean, got {out['per_tensor_estimate']!r}")
    return {"eval_samples": int(n), "folds": int(k), "per_tensor_estimate": bool(out["per_tensor_estimate"])}


def to_tensors_data(
    names: Sequence[str], pairs: Sequence[tuple[float, float]], dtypes: Mapping[str, str]
) -> TensorsData:
    """TensorsData carrying the ranges (as MinMax results: onnxruntime's TensorsData has no other
    way to carry plain ranges; quantize_static only reads lowest/highest from it), rounded to the
    nearest value of each tensor's type: the methods compute them in float64 as estimates, not
    as bounds of the data. A range beyond the type's largest value is an error naming the tensor."""
    out = {}
    for name, (low, high) in zip(names, pairs):
        dt = np.dtype(dtypes[name])
        with np.errstate(over="ignore"):
            lo, hi = np.array([low], dt), np.array([high], dt)
        if (np.isinf(lo[0]) and math.isfinite(low)) or (np.isinf(hi[0]) and math.isfinite(high)):
            raise ValueError(f"tensor {name!r}: range ({low!r}, {high!r}) is beyond {dt}'s range")
        out[name] = TensorData(lowest=lo, highest=hi)
    return TensorsData(CalibrationMethod.MinMax, out)


__all__ = [
    "AUTO_CANDIDATES",
    "AUTO_SELECTION_OPTIONS",
    "METHOD_OPTIONS",
    "MODEL_AUTO_CANDIDATES",
    "TensorHistogram",
    "method_names",
    "register_method",
    "registered_methods",
    "unregister_method",
]
