"""Quark's ``PowOfTwoCollector``: power-of-two MinMSE ranges, in bounded memory where it can be.

- mode ``All`` with ``num_bins > 0`` (Quark 0.13's default, 2048): Quark 0.13's histogram MinMSE
  (:mod:`histocal.quark.pof2_histogram`), symmetric only, as in Quark.
- mode ``All`` with ``num_bins <= 0`` (Quark 0.9's MinMSE on the values), symmetric, int8/uint8/int16: per tensor a few dozen error sums
  (:class:`~histocal.quark.pof2.SymmetricErrors`), not the values.
- mode ``MostCommon``, symmetric: each batch votes for its own MinMSE scale as it comes; the
  scale with the most votes wins, the smallest on ties (Quark's ``np.unique`` + ``argmax``).
- asymmetric (Quark then ignores ``MostCommon``, with a warning) or uint16: the zero point depends
  on the range of all the data, so the values are kept until the result, as Quark keeps them;
  so does mode ``Percentile`` (MinMSE on the values within a percentile of all the data).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationDataCollector
from onnxruntime.quantization.quant_utils import QuantType

from . import pof2, types
from .pof2_histogram import MinMSEHistogram
from .types import Pow2MethodLike, PowerOfTwoMethod, QuantTypeLike

logger = logging.getLogger(__name__)

_BOUNDED_QTYPES = ("int8", "uint8", "int16")


class _MostCommon:
    """One tensor's votes: scale -> [count, range of the last batch that voted for it]."""

    def __init__(self) -> None:
        self.votes: dict[float, list[Any]] = {}

    def copy(self) -> _MostCommon:
        new = _MostCommon()
        new.votes = {scale: list(vote) for scale, vote in self.votes.items()}  # a vote changes in place
        return new

    def add(self, x: np.ndarray, qtype: str) -> None:
        pos, zero_point = pof2.min_mse(x, qtype, True)
        scale = float(pof2.position_to_scale(pos, x.dtype))
        vote = self.votes.setdefault(scale, [0, None])
        vote[0] += 1
        vote[1] = pof2.value_range(pos, zero_point, qtype, True, x.dtype)

    def result(self) -> tuple[Any, Any]:
        if not self.votes:
            raise ValueError("no values collected")
        most = max(count for count, _ in self.votes.values())
        return self.votes[min(s for s, (count, _) in self.votes.items() if count == most)][1]


class _Values:
    """One tensor's values, kept (asymmetric or uint16 MinMSE, mode Percentile)."""

    def __init__(self, qtype: str, symmetric: bool, percentile: float | None = None) -> None:
        self.qtype, self.symmetric, self.percentile = qtype, symmetric, percentile
        self.parts: list[np.ndarray] = []

    def copy(self) -> _Values:
        new = _Values(self.qtype, self.symmetric, self.percentile)
        new.parts = list(self.parts)  # the arrays themselves never change
        return new

    def add(self, x: np.ndarray, qtype: str) -> None:
        if self.parts and x.dtype != self.parts[0].dtype:
            raise ValueError(f"values of type {x.dtype} after values of type {self.parts[0].dtype}")
        self.parts.append(np.array(x, copy=True).ravel())

    def result(self) -> tuple[Any, Any]:
        if not self.parts:
            raise ValueError("no values collected")
        x = np.concatenate(self.parts)
        if self.percentile is not None:
            x = _within_percentile(x, self.percentile, self.symmetric)
        pos, zero_point = pof2.min_mse(x, self.qtype, self.symmetric)
        return pof2.value_range(pos, zero_point, self.qtype, self.symmetric, x.dtype)


def _within_percentile(x: np.ndarray, percentile: float, symmetric: bool) -> np.ndarray:
    """Quark's Percentile mode: the values within the percentile (of |x| when symmetric, else
    the central ``percentile`` percent)."""
    if x.size == 0:
        return x
    if symmetric:
        high = np.percentile(np.abs(x), percentile)
        low = -high
    else:
        low = np.percentile(x, (100 - percentile) / 2)
        high = np.percentile(x, 100 - (100 - percentile) / 2)
    return x[(x >= low) & (x <= high)]


class _AllSymmetric:
    def __init__(self, qtype: str) -> None:
        self.errors = pof2.SymmetricErrors(qtype)

    def copy(self) -> _AllSymmetric:
        new = _AllSymmetric.__new__(_AllSymmetric)
        new.errors = self.errors.copy()
        return new

    def add(self, x: np.ndarray, qtype: str) -> None:
        self.errors.add(x)

    def result(self) -> tuple[Any, Any]:
        pos, zero_point = self.errors.result()
        return pof2.value_range(pos, zero_point, self.errors.qtype, True, self.errors.dtype)


class _Histogram:
    def __init__(self, num_bins: int) -> None:
        self.histogram = MinMSEHistogram(num_bins)

    def copy(self) -> _Histogram:
        new = _Histogram(self.histogram.num_bins)
        new.histogram = self.histogram.copy()
        if hasattr(self, "qtype"):  # the type of the batches added (int8 before any)
            new.qtype = self.qtype
        return new

    def add(self, x: np.ndarray, qtype: str) -> None:
        self.qtype = qtype
        self.histogram.add(x, qtype)

    def result(self) -> tuple[Any, Any]:
        return self.histogram.result(getattr(self, "qtype", "int8"))


class PowOfTwoCollector(CalibrationDataCollector):
    """Quark 0.13's ``PowOfTwoCollector`` (same arguments, order and defaults;
    ``quantized_tensor_type=None`` means Quark's ``{}``): ``collect({tensor: [batch, ...]})`` then
    ``compute_collection_result()`` -> ``{tensor: (low, high)}`` (0-d arrays of the values' type).

    ``num_bins`` (mode All): above 0, Quark 0.13's histogram MinMSE, each ``collect`` call's
    arrays merged into the tensor's histogram at once (symmetric only: Quark 0.13 fails on asymmetric
    ranges at the result, histocal at construction); 0 or less, the MinMSE on all the values
    (Quark 0.9's, and 0.13's with ``num_bins=0``). ``optimize_mem`` and ``worker_num`` are
    accepted and have no effect on the result: histocal never caches outputs on disk (Quark 0.13
    caches them as float16, which overflows beyond ±65504) and its own threads are set with
    ``histocal.set_num_threads``. An activation type outside Quark's list becomes int8 with a
    warning, as in Quark 0.13.

    Only ``method=MinMSE`` computes ranges (as in Quark; NonOverflow is Quark's symmetric MinMax).
    ``minmse_mode`` is ``All``, ``MostCommon`` or ``Percentile`` (MinMSE on the values within
    ``percentile``, kept until the result as in Quark); anything else is an error (Quark warns
    and uses All). Unlike Quark's raw-value modes, whose ``collect`` replaces what earlier calls
    collected, every call adds to it."""

    def __init__(
        self,
        activation_type: QuantTypeLike = QuantType.QInt8,
        method: Pow2MethodLike = PowerOfTwoMethod.MinMSE,
        symmetric: bool = True,
        minmse_mode: str = "All",
        num_bins: int = 2048,
        percentile: float = 99.999,
        optimize_mem: bool = True,
        worker_num: int = 1,
        quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
    ) -> None:
        self.method = types.pow2_method(method)
        self.activation_qtype = types.activation_qtype(activation_type)
        self.symmetric = bool(symmetric)
        self.minmse_mode = types.minmse_mode(minmse_mode)
        if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)):
            raise ValueError(f"num_bins must be an integer, got {num_bins!r}")
        self.num_bins = int(num_bins)
        if self.minmse_mode == "All" and self.num_bins > 0 and not self.symmetric:
            raise ValueError(
                "minmse_mode 'All' with num_bins > 0 (Quark 0.13's histogram MinMSE) supports only "
                "symmetric ranges (Quark 0.13 fails at the result); use num_bins=0 for the MinMSE on the values"
            )
        self.percentile = percentile
        self.optimize_mem, self.worker_num = optimize_mem, worker_num
        self.quantized_tensor_type = dict(quantized_tensor_type or {})
        if self.minmse_mode == "MostCommon" and not self.symmetric:
            logger.warning("Activation asymmetric does not support using 'most common' to calculate min mse")
        self._tensors: dict[str, Any] = {}

    def tensor_qtype(self, name: str) -> str:
        """The integer type of ``name``: its entry in ``quantized_tensor_type`` when Quark's power-of-two
        calibration supports that type, otherwise ``activation_type`` (Quark's rule)."""
        t = self.quantized_tensor_type.get(name)
        return types.qtype(t) if t is not None and types.is_supported_qtype(t) else self.activation_qtype

    def _new(self, qtype: str) -> Any:
        if self.minmse_mode == "MostCommon" and self.symmetric:
            return _MostCommon()
        if self.minmse_mode == "Percentile":
            return _Values(qtype, self.symmetric, self.percentile)
        if self.minmse_mode == "All" and self.num_bins > 0:
            return _Histogram(self.num_bins)
        if self.symmetric and qtype in _BOUNDED_QTYPES:
            return _AllSymmetric(qtype)
        return _Values(qtype, self.symmetric)

    def collect(self, name_to_arr: Mapping[str, Any]) -> None:
        """Add one or more batches per tensor (``{name: array or [array, ...]}``). A NaN counts as 0
        in the histogram MinMSE (as in Quark 0.13) and is an error naming the tensor elsewhere
        (Quark: 'NaN detected'); after an error nothing of this call is kept.
        ``PowOfTwoCalibrater`` first replaces non-finite outputs as Quark 0.13's calibrator does."""
        # the state before this call of each tensor it changes (None: a tensor it adds), copied
        # as the call first touches it, not the whole collection: a call that fails puts back
        # only those (a batch of many tiny tensors cost a deep copy of every state before)
        touched: dict[str, Any] = {}
        try:
            for name, batches in name_to_arr.items():
                arrays = [np.asarray(b) for b in (batches if isinstance(batches, (list, tuple)) else [batches])]
                for x in arrays:
                    if x.dtype not in (np.float32, np.float16):
                        raise ValueError(f"tensor {name!r}: values of type {x.dtype} (float32 or float16 expected)")
                qtype = self.tensor_qtype(name)
                tensor = self._tensors.get(name)
                if name not in touched:
                    touched[name] = None if tensor is None else tensor.copy()
                if tensor is None:
                    tensor = self._tensors[name] = self._new(qtype)
                histogram = isinstance(tensor, _Histogram)
                if histogram and len(arrays) > 1:
                    # Quark 0.13 merges one call's arrays into the histogram at once
                    if len({x.dtype for x in arrays}) > 1:
                        raise ValueError(f"tensor {name!r}: values of types {sorted({str(x.dtype) for x in arrays})}")
                    arrays = [np.concatenate([x.ravel() for x in arrays])]
                for x in arrays:
                    # the histogram counts NaN as 0, as Quark 0.13's; elsewhere Quark fails on it
                    if not histogram and np.isnan(x).any():
                        raise ValueError(f"tensor {name!r}: NaN in the values (Quark: 'NaN detected')")
                    try:
                        tensor.add(x, qtype)
                    except ValueError as e:
                        raise ValueError(f"tensor {name!r}: {e}") from None
        except BaseException:
            for name, before in touched.items():
                if before is None:
                    self._tensors.pop(name, None)
                else:
                    self._tensors[name] = before
            raise

    def snapshot(self) -> dict[str, Any]:
        """What has been collected, for :meth:`restore` (kept values are shared, not copied)."""
        return {name: tensor.copy() for name, tensor in self._tensors.items()}

    def restore(self, snapshot: dict[str, Any]) -> None:
        self._tensors = snapshot

    def compute_collection_result(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        if not self._tensors:
            raise ValueError("PowerOfTwoMethod has not been collected. Please run collect() first.")
        if self.method != PowerOfTwoMethod.MinMSE:
            raise ValueError("Only 'MinMSE' method are supported")
        out = {}
        for name, tensor in self._tensors.items():
            try:
                out[name] = tensor.result()
            except ValueError as e:
                raise ValueError(f"tensor {name!r}: {e}") from None
        return out
