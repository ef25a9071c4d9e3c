"""auto's model-level candidates from one calibration state, each shared computation done once.

The per-tensor estimate (``methods.ranges(..., "auto", ...)``) computes minmax, percentile, ORT
entropy, kl and mse itself, and several of them are model-level candidates of their own with the
same options: computed one after the other through ``CalibrationState.compute``, the costliest
(entropy, kl, mse) ran twice per state. ``candidate_ranges`` routes every candidate through one
memo: ORT methods by (method, settings) through ``state.compute``, histocal methods by
(method, tensors, options) on the state's streaming histogram. Every call is one the state would
make itself with the same arguments, so each candidate equals ``state.compute(method, **options)``
(tests/test_selection.py checks them value for value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onnxruntime.quantization.calibrate import TensorsData

from .. import methods
from ..methods.table import TABLE


class _MemoStream:
    """A streaming histogram whose ``ranges`` results are kept by their arguments."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._ranges: dict[tuple, list[tuple[float, float]]] = {}

    def ranges(self, method: str, names: list[str], **options: Any) -> list[tuple[float, float]]:
        # Keyed by the options the kernel applies, the method table's defaults included (kl is
        # asked with them spelled out as a candidate and without them inside the per-tensor estimate).
        table = TABLE.get(method)
        given = {**(table.defaults if table is not None else {}), **options}
        key = (method, tuple(names), tuple(sorted((k, repr(v)) for k, v in given.items())))
        if key not in self._ranges:
            self._ranges[key] = list(self._stream.ranges(method, names, **options))
        return self._ranges[key]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def candidate_ranges(state: Any, requests: Sequence[tuple[str, dict[str, Any]]]) -> list[TensorsData | ValueError]:
    """Per (method, options) of ``requests``, ``state.compute(method, **options)`` (or the
    ValueError it raises), each shared part computed once. A per-channel state or one without
    its streaming histogram is computed request by request."""
    if state.channels is not None or state.stream is None:
        return [_compute(lambda m=m, o=o: state.compute(m, **o)) for m, o in requests]
    ort: dict[tuple, TensorsData] = {}

    def ort_ranges(method: str, settings: dict[str, Any]) -> TensorsData:
        key = (method, tuple(sorted((k, repr(v)) for k, v in settings.items())))
        if key not in ort:
            ort[key] = state.compute(method, per_channel=False, **settings)
        return ort[key]

    stream = _MemoStream(state.stream)
    names = list(state.names)
    dtypes = {n: state.dtype(n) for n in names}

    def histocal_ranges(name: str, options: dict[str, Any]) -> TensorsData:
        if name == state.method:  # as CalibrationState.method_ranges: the state's settings first
            allowed = methods.METHOD_OPTIONS.get(name, ())
            options = {**{k: state.settings[k] for k in allowed if k in state.settings}, **options}
        options = methods.check_options(name, options)
        pairs, _ = methods.ranges(stream, names, name, options, ort_ranges)
        return methods.to_tensors_data(names, pairs, dtypes)

    out: list[TensorsData | ValueError] = []
    for method, options in requests:
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            out.append(_compute(lambda n=name, o=options: ort_ranges(n, dict(o))))
        else:
            out.append(_compute(lambda n=name, o=options: histocal_ranges(n, dict(o))))
    return out


def _compute(fn: Any) -> TensorsData | ValueError:
    try:
        return fn()
    except ValueError as exc:
        return exc
