"""A state's results (``CalibrationState.compute``): which histograms and which code give them.

``compute(method, **settings)`` returns onnxruntime's ``TensorsData`` for ``"minmax"``,
``"entropy"``, ``"percentile"`` or ``"distribution"``, without running the model:

* from the exact histogram when it has the kind and ``num_bins`` the request needs: then the result
  is identical to the exact calibrator's own ``compute_data``;
* otherwise from the streaming histogram (``to_histograms(kind, num_bins)``), identical to a
  streaming-mode calibrator with those settings (for an exact-mode state this is the streaming
  approximation, not ORT's exact histogram);
* ``"minmax"`` gives ORT's MinMax (non per-channel, no moving average) ranges: ``lowest``/``highest``
  as shape-(1,) arrays of the data dtype, NaN ignored, ±Inf included, ``symmetric`` supported.

histocal's methods (mse, kl, pow2, auto) and registered ones read the streaming histogram
(``histocal.methods``; per-tensor ``auto`` in :mod:`histocal.state.auto`), their ranges travelling as
MinMax-style ``TensorsData``; per-channel results come from the per-channel streaming histograms
(``ChannelHistograms.compute``), a chunk of channels at a time.

Settings not given default to the state's own recorded settings when the method is the one it was
collected with, else to ``create_calibrator``'s defaults (entropy 128/128, percentile 2048 bins
99.999 symmetric, distribution 2048 bins "same").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, cast

from onnxruntime.quantization.calibrate import TensorsData

from .. import _core, methods
from ..methods.table import ORT_TABLE, POW2_VOTES, summaries_for
from ..ort_results import ort_settings
from .auto import ORT_AUTO_CANDIDATES, auto_ranges
from .channels import NO_CHANNEL_VOTES
from .compute import check_compute_memory, chunk_size, minmax_result, ort_result

_ORT_METHODS = {m.name: m.ort for m in ORT_TABLE}
# create_calibrator's defaults (what quantize_static uses); _FULL: every ORT option at its first table default
_DEFAULTS: dict[str, dict[str, Any]] = {m.name: m.defaults for m in ORT_TABLE}
_FULL = {o.name: o.default for m in reversed(ORT_TABLE) for o in m.options}


class StateHistograms(Protocol):
    """What results are computed from: a state's histograms (its collection's parts) and the method
    they were collected for."""

    @property
    def names(self) -> list[str]: ...
    @property
    def stream(self) -> _core.StreamHistograms | None: ...
    @property
    def exact(self) -> _core.Histograms | None: ...
    @property
    def exact_kind_and_bins(self) -> tuple[str | None, int | None]: ...
    @property
    def channels(self) -> Any: ...
    @property
    def method(self) -> str | None: ...
    @property
    def settings(self) -> dict[str, Any]: ...
    def dtype(self, name: str) -> str: ...


@dataclass(frozen=True)
class StreamingPart:
    """Some tensors' streaming histograms (a chunk of channels), computed as a streaming-only state."""

    names: list[str]
    stream: _core.StreamHistograms
    method: str | None
    settings: dict[str, Any]
    exact: None = None
    exact_kind_and_bins: tuple[None, None] = (None, None)
    channels: None = None

    def dtype(self, name: str) -> str:
        """A tensor's data type."""
        return self.stream.summary(name).dtype


def results_of(state: StateHistograms, method: Any, per_channel: bool | None, settings: dict[str, Any]) -> TensorsData:
    """``state``'s results for ``method`` and ``settings`` (``StateResults.compute``)."""
    name = methods.canonical_name(method)
    if per_channel or (per_channel is None and state.channels is not None):
        ch = state.channels
        if ch is None:
            raise ValueError("per-channel results need per-channel histograms, which this state does not hold")
        if POW2_VOTES in summaries_for(name, {**(state.settings if name == state.method else {}), **settings}):
            raise ValueError(NO_CHANNEL_VOTES)

        def keyed(keys: list[str]) -> TensorsData:
            part = StreamingPart(keys, ch.stream, state.method, state.settings)
            return results_of(part, name, False, settings)

        # the channels' ORT histograms (2048 bins for auto's candidates) a chunk at a time
        bins = settings.get("num_bins", state.settings.get("num_bins") if name == state.method else None)
        num_bins = max(bins, 2048) if isinstance(bins, int) and 1 <= bins <= _core.MAX_BINS else 2048
        size = chunk_size(num_bins, ch.count)
        check_compute_memory(name, num_bins, ch.count, size, size, size, ch.count, "channels")
        return ch.compute(keyed, size)
    if name in methods.ORT_METHODS:
        return ort_results_of(state, name, settings)
    pairs, _ = ranges_of(state, name, settings)
    return methods.to_tensors_data(state.names, pairs, {n: state.dtype(n) for n in state.names})


def ranges_of(
    state: StateHistograms, method: Any, options: dict[str, Any]
) -> tuple[list[tuple[float, float]], list[str] | None]:
    """A histocal or registered method's ranges from ``state``'s streaming histograms, and for
    ``auto`` each tensor's chosen candidate (``StateResults.method_ranges``)."""
    name = methods.canonical_name(method)
    if name in methods.ORT_METHODS:
        raise ValueError(f"{name} is an onnxruntime method: use compute()")
    if name == state.method:
        options = {
            **{k: state.settings[k] for k in methods.METHOD_OPTIONS.get(name, ()) if k in state.settings},
            **options,
        }
    options = methods.check_options(name, options)
    if state.stream is None:
        raise ValueError(f"{name} needs the streaming histogram, and this state holds only exact histograms")
    if name == "auto":
        ort = {label: ort_results_of(state, m, dict(settings)) for label, m, settings in ORT_AUTO_CANDIDATES}
        return auto_ranges(state.stream, state.names, options, ort)
    return methods.ranges(state.stream, state.names, name, options), None


def ort_results_of(state: StateHistograms, method: str, settings: dict[str, Any]) -> TensorsData:
    """One of onnxruntime's four methods on ``state``: from its exact histograms when they have the
    kind and bins the settings need, else from its streaming ones."""
    allowed = _DEFAULTS[method]
    unknown = set(settings) - set(allowed)
    if unknown:
        raise ValueError(f"unknown settings for {method}: {sorted(unknown)} (allowed: {sorted(allowed)})")
    base = {k: state.settings[k] for k in allowed if k in state.settings} if method == state.method else {}
    s = {**_FULL, **allowed, **base, **settings}
    if method == "minmax":
        return minmax_result(state.names, state.stream, state.exact, bool(s["symmetric"]))
    checked = ort_settings(
        method, s["symmetric"], s["num_bins"], s["num_quantized_bins"], s["percentile"], s["scenario"]
    )
    kind, num_bins = checked.kind, checked.num_bins
    if state.exact is not None and state.exact_kind_and_bins == (kind, num_bins):
        result = ort_result(checked, state.names, None, state.exact)
    elif state.stream is not None:
        result = ort_result(checked, state.names, state.stream, None)
    else:
        held_kind, held_bins = state.exact_kind_and_bins
        raise ValueError(
            f"this state holds only exact {held_kind} histograms of {held_bins} bins; "
            f"{method} with num_bins={num_bins} needs {kind} histograms of {num_bins} bins: "
            "collect with those settings, or keep the streaming histogram (histocal calibrators do)"
        )
    return TensorsData(_ORT_METHODS[method], result)


class StateResults:
    """A calibration state's results (``CalibrationState`` is one: its histograms, see the module)."""

    def compute(self, method: Any, *, per_channel: bool | None = None, **settings: Any) -> TensorsData:
        """onnxruntime ``TensorsData`` for ``method`` and its settings: ORT's four methods (name or
        CalibrationMethod), histocal's mse/kl/pow2/auto and registered methods (see
        ``histocal.methods``; their ranges travel as MinMax-style TensorsData).

        Args:
            method: the method (name or CalibrationMethod).
            per_channel: per-channel results (arrays, from the per-channel histograms); default:
                per channel when they were collected.
            **settings: the method's settings (num_bins, percentile, symmetric, qtype, ...);
                those not given: the state's own when ``method`` is the one it was collected
                with, else ``create_calibrator``'s defaults.

        Returns:
            onnxruntime ``TensorsData`` of every tensor.

        Raises:
            ValueError: an unknown method or setting, or a result the state's histograms cannot
                give (e.g. per channel without per-channel histograms).
        """
        return results_of(cast(StateHistograms, self), method, per_channel, settings)

    def method_ranges(self, method: Any, **options: Any) -> tuple[list[tuple[float, float]], list[str] | None]:
        """The ranges of a histocal or registered method.

        Args:
            method: the method's name.
            **options: its options (default: the state's own, then the method's).

        Returns:
            Per-tensor ``(low, high)`` (in ``names`` order), and for ``auto`` the candidate
            chosen for each tensor (else None).

        Raises:
            ValueError: an onnxruntime method (use ``compute``), an unknown option, or a state
                without streaming histograms.
        """
        return ranges_of(cast(StateHistograms, self), method, options)
