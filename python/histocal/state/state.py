"""Calibration state: everything a histogram calibration collected, saved once, reusable and mergeable.

A :class:`CalibrationState` holds, per calibrated tensor:

* the **streaming histogram** (``_core.StreamHistograms``: a power-of-two-aligned histogram of
  ``streaming_bins`` bins, finite min/max, min |x|, counts of finite/NaN/+Inf/-Inf values and the
  number of batches). Streaming-mode calibrators build it; exact-mode calibrators build it too
  (during their counting pass), so that every state can serve every method (but isotone and pow2's most-common choice);
* in exact mode also the **exact ORT histogram** (``_core.Histograms`` of kind ``value`` or ``abs``
  with the calibrator's ``num_bins``: the histogram onnxruntime itself would hold).

``state.compute(method, **settings)`` returns onnxruntime's ``TensorsData`` for ``"minmax"``,
``"entropy"``, ``"percentile"`` or ``"distribution"``, without running the model:

* from the exact histogram when it has the kind and ``num_bins`` the request needs: then the result
  is identical to the exact calibrator's own ``compute_data``;
* otherwise from the streaming histogram (``to_histograms(kind, num_bins)``), identical to a
  streaming-mode calibrator with those settings (for an exact-mode state this is the streaming
  approximation, not ORT's exact histogram);
* ``"minmax"`` gives ORT's MinMax (non per-channel, no moving average) ranges: ``lowest``/``highest``
  as shape-(1,) arrays of the data dtype, NaN ignored, ±Inf included, ``symmetric`` supported.

Settings not given default to the state's own recorded settings when the method is the one it was
collected with, else to ``create_calibrator``'s defaults (entropy 128/128, percentile 2048 bins
99.999 symmetric, distribution 2048 bins "same").

Merging (:meth:`CalibrationState.merge`, :func:`merge_states`): the model fingerprint, the tensor
names, the mode and the collection options must match. Streaming parts merge exactly and in any
order (the result is the state of one run over all the data). Exact parts add their counts when
the two histograms have identical edges (then the result equals one exact run over all the data);
otherwise the second state's histogram is merged into the first one by ORT's rule between two
``collect_data`` calls (``merge_histogram`` for value histograms, bin extension for |x| histograms),
with the second histogram's counts placed at its bin centres: the approximation is only in where
inside a bin a value sits, and (like ORT's rule) the result depends on the order. A float16 |x|
histogram whose edges end in +inf (ORT's extension past 65504) places a bin ``[e, inf)`` at ``e``
and its ``[inf, inf]`` infinities at inf, kept only where the merged edges end in +inf too.
The file format and its checks: :mod:`histocal.state.file` (its spec and limits: ``file.format``; each
summary's members: ``file.summaries``; reading a file back: ``file.read``; writing one: ``file.write``).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Union, cast

from onnxruntime.quantization.calibrate import TensorsData

from .. import _core, methods
from .._version import __version__
from ..collector import CollectedData, export_exact, restore_exact
from ..io.files import atomic_write_bytes, open_untrusted_file
from ..methods.table import ORT_TABLE, POW2_VOTES, summaries_for
from ..ort_results import ort_settings
from .auto import ORT_AUTO_CANDIDATES, auto_ranges
from .channels import NO_CHANNEL_VOTES, ChannelHistograms
from .compute import check_compute_memory, chunk_size, minmax_result, ort_result
from .file.format import FORMAT_NAME, FORMAT_VERSION, MAX_STATE_BYTES
from .file.header import check_fingerprint, plain_value
from .file.read import read_state_fields
from .file.write import state_bytes
from .fingerprint import model_fingerprint
from .merge import merge_exact

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "CalibrationState", "merge_states", "model_fingerprint"]

PathLike = Union[str, "os.PathLike[str]"]

_ORT_METHODS = {m.name: m.ort for m in ORT_TABLE}
# create_calibrator's defaults (what quantize_static uses); _FULL: every ORT option at its first table default
_DEFAULTS: dict[str, dict[str, Any]] = {m.name: m.defaults for m in ORT_TABLE}
_FULL = {o.name: o.default for m in reversed(ORT_TABLE) for o in m.options}


def _version() -> str:
    return __version__


@dataclass
class CalibrationState:
    """Reusable, mergeable histogram state of a calibration (see the module docstring).

    Build it with ``calibrator.state`` / ``CalibrationState.from_calibrator`` or ``load``; use it
    with ``compute``, ``merge``, ``save`` and ``calibrator.load_state``.

    Args:
        names: the calibrated tensors, in calibration order.
        mode: the collection mode, ``"streaming"`` or ``"exact"``.
        stream: the streaming histograms (every histocal state has them).
        exact: exact mode's ORT histograms.
        exact_kind: their kind, ``"value"`` or ``"abs"``.
        exact_num_bins: their bin count.
        model_fingerprint: the calibrated model's fingerprint (``model_fingerprint``).
        data_fingerprints: the fingerprints of the data of each run merged into the state.
        method: the method it was collected for.
        settings: that method's settings.
        histocal_version: the histocal version that collected it.
        channels: per-channel streaming histograms, when collected.
    """

    names: list[str]
    mode: str
    stream: _core.StreamHistograms | None = None
    exact: _core.Histograms | None = None
    exact_kind: str | None = None
    exact_num_bins: int | None = None
    model_fingerprint: str | None = None
    data_fingerprints: tuple[str, ...] = ()
    method: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    histocal_version: str = field(default_factory=_version)
    channels: ChannelHistograms | None = None  # per-channel streaming histograms, when collected

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_calibrator(cls, cal: Any, data_fingerprint: str | None = None) -> CalibrationState:
        """A copy of what a histocal Entropy/Percentile/Distribution/Method calibrator has collected
        (through its public interface: ``collected()``, ``model_fingerprint``, ``collection_settings``).

        Args:
            cal: the calibrator, after ``collect_data``.
            data_fingerprint: the fingerprint of the data it collected (``sha256:`` and 64 hex digits).

        Returns:
            The state.

        Raises:
            ValueError: a malformed ``data_fingerprint``.
        """
        return cls.from_collected(
            cal.collected(),
            model_fingerprint=cal.model_fingerprint,
            method=cal.method,
            settings=cal.collection_settings,
            data_fingerprint=data_fingerprint,
        )

    @classmethod
    def from_collected(
        cls,
        data: CollectedData,
        *,
        model_fingerprint: str | None,
        method: str | None,
        settings: dict[str, Any],
        data_fingerprint: str | None = None,
    ) -> CalibrationState:
        """The state holding ``data`` (shared, not copied) and how it was collected.

        Args:
            data: the collected histograms.
            model_fingerprint: the calibrated model's fingerprint.
            method: the method they were collected for.
            settings: that method's settings.
            data_fingerprint: the fingerprint of the data collected.

        Returns:
            The state.

        Raises:
            ValueError: a malformed ``data_fingerprint``.
        """
        return cls(
            names=data.names,
            mode=data.mode,
            stream=data.stream,
            exact=data.exact,
            exact_kind=data.exact_kind,
            exact_num_bins=data.exact_num_bins,
            model_fingerprint=model_fingerprint,
            data_fingerprints=() if data_fingerprint is None else (check_fingerprint(data_fingerprint),),
            method=method,
            settings={k: plain_value(v) for k, v in settings.items()},
            channels=data.channels,
        )

    def collected(self) -> CollectedData:
        """The state's histograms as a calibrator holds them.

        Returns:
            The state's histograms (shared, not copied).
        """
        return CollectedData(self.mode, self.stream, self.exact, self.exact_kind, self.exact_num_bins, self.channels)

    @property
    def streaming_bins(self) -> int | None:
        """The streaming histograms' bin count (None: no streaming histograms)."""
        return None if self.stream is None else int(self.stream.num_bins)

    @property
    def data_fingerprint(self) -> str | None:
        """The data fingerprint of a single run (None when absent or when merged from several)."""
        return self.data_fingerprints[0] if len(self.data_fingerprints) == 1 else None

    @property
    def options(self) -> dict[str, Any]:
        """How the state was collected: mode, bins, exact histograms' kind and bins, method, settings."""
        return {
            "mode": self.mode,
            "streaming_bins": self.streaming_bins,
            "exact_kind": self.exact_kind,
            "exact_num_bins": self.exact_num_bins,
            "method": self.method,
            "settings": dict(self.settings),
        }

    def counts(self, name: str) -> tuple[int, int, int, int, int]:
        """A tensor's value counts.

        Args:
            name: the tensor.

        Returns:
            ``(finite, nan, posinf, neginf, batches)``.

        Raises:
            KeyError: no such tensor.
        """
        c = (self.stream if self.stream is not None else cast(_core.Histograms, self.exact)).counts(name)
        return (c.n_finite, c.n_nan, c.n_posinf, c.n_neginf, c.batches)

    def dtype(self, name: str) -> str:
        """A tensor's data type.

        Args:
            name: the tensor.

        Returns:
            Its numpy dtype's name (``"float32"``, ``"float16"``, ...).

        Raises:
            KeyError: no such tensor.
        """
        if self.stream is not None:
            return self.stream.summary(name).dtype
        return cast(_core.Histograms, self.exact).state(name).dtype

    # -- results --------------------------------------------------------------------------------

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
        name = methods.canonical_name(method)
        if per_channel or (per_channel is None and self.channels is not None):
            ch = self.channels
            if ch is None:
                raise ValueError("per-channel results need per-channel histograms, which this state does not hold")
            if POW2_VOTES in summaries_for(name, {**(self.settings if name == self.method else {}), **settings}):
                raise ValueError(NO_CHANNEL_VOTES)

            def keyed(keys: list[str]) -> TensorsData:
                part = CalibrationState(keys, "streaming", ch.stream, method=self.method, settings=self.settings)
                return part.compute(name, per_channel=False, **settings)

            # the channels' ORT histograms (2048 bins for auto's candidates) a chunk at a time
            bins = settings.get("num_bins", self.settings.get("num_bins") if name == self.method else None)
            num_bins = max(bins, 2048) if isinstance(bins, int) and 1 <= bins <= _core.MAX_BINS else 2048
            size = chunk_size(num_bins, ch.count)
            check_compute_memory(name, num_bins, ch.count, size, size, size, ch.count, "channels")
            return ch.compute(keyed, size)
        if name in methods.ORT_METHODS:
            return self._compute_ort(name, settings)
        pairs, _ = self.method_ranges(name, **settings)
        return methods.to_tensors_data(self.names, pairs, {n: self.dtype(n) for n in self.names})

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
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            raise ValueError(f"{name} is an onnxruntime method: use compute()")
        if name == self.method:
            options = {
                **{k: self.settings[k] for k in methods.METHOD_OPTIONS.get(name, ()) if k in self.settings},
                **options,
            }
        options = methods.check_options(name, options)
        if self.stream is None:
            raise ValueError(f"{name} needs the streaming histogram, and this state holds only exact histograms")
        if name == "auto":
            ort = {label: self._compute_ort(m, dict(settings)) for label, m, settings in ORT_AUTO_CANDIDATES}
            return auto_ranges(self.stream, self.names, options, ort)
        return methods.ranges(self.stream, self.names, name, options), None

    def _compute_ort(self, method: str, settings: dict[str, Any]) -> TensorsData:
        allowed = _DEFAULTS[method]
        unknown = set(settings) - set(allowed)
        if unknown:
            raise ValueError(f"unknown settings for {method}: {sorted(unknown)} (allowed: {sorted(allowed)})")
        base = {k: self.settings[k] for k in allowed if k in self.settings} if method == self.method else {}
        s = {**_FULL, **allowed, **base, **settings}
        if method == "minmax":
            return minmax_result(self.names, self.stream, self.exact, bool(s["symmetric"]))
        checked = ort_settings(
            method, s["symmetric"], s["num_bins"], s["num_quantized_bins"], s["percentile"], s["scenario"]
        )
        kind, num_bins = checked.kind, checked.num_bins
        if self.exact is not None and self.exact_kind == kind and self.exact_num_bins == num_bins:
            result = ort_result(checked, self.names, None, self.exact)
        elif self.stream is not None:
            result = ort_result(checked, self.names, self.stream, None)
        else:
            raise ValueError(
                f"this state holds only exact {self.exact_kind} histograms of {self.exact_num_bins} bins; "
                f"{method} with num_bins={num_bins} needs {kind} histograms of {num_bins} bins: "
                "collect with those settings, or keep the streaming histogram (histocal calibrators do)"
            )
        return TensorsData(_ORT_METHODS[method], result)

    # -- merging --------------------------------------------------------------------------------

    def check_compatible(self, other: CalibrationState) -> None:
        """Check that ``other`` can be merged into this state.

        Args:
            other: the other state.

        Raises:
            ValueError: ``other`` comes from another model or tensors, or was collected with other
                options (naming the difference).
        """
        if self.model_fingerprint != other.model_fingerprint:
            raise ValueError(
                f"the states come from different models (fingerprints {self.model_fingerprint} and "
                f"{other.model_fingerprint})"
            )
        if set(self.names) != set(other.names):
            diff = sorted(set(self.names) ^ set(other.names))[:5]
            raise ValueError(f"the states calibrate different tensors (e.g. {diff})")
        for key in ("mode", "streaming_bins", "exact_kind", "exact_num_bins"):
            a, b = getattr(self, key), getattr(other, key)
            if a != b:
                raise ValueError(f"incompatible collection options: {key} is {a!r} in one state and {b!r} in the other")
        if (self.channels is None) != (other.channels is None):
            raise ValueError("incompatible collection options: one state holds per-channel histograms, the other not")
        if self.channels is not None and other.channels is not None:
            self.channels.check_compatible(other.channels)

    def merge(self, other: CalibrationState) -> CalibrationState:
        """Combine two states (see the module docstring).

        Args:
            other: a compatible state (``check_compatible``).

        Returns:
            A new state holding both; neither is changed.

        Raises:
            ValueError: incompatible states, or exact histograms that cannot be merged (naming
                the tensor).
        """
        self.check_compatible(other)
        stream = None
        if self.stream is not None:
            if other.stream is None:
                raise ValueError("incompatible states: one holds streaming histograms, the other not")
            stream = self.stream.copy()
            stream.merge(other.stream)
        exact = None
        if self.exact is not None:
            if self.exact_kind is None or self.exact_num_bins is None:
                raise ValueError("the state holds exact histograms without their kind and bin count")
            exact = _core.Histograms(self.exact_kind, self.exact_num_bins)
            for name in self.exact.names():
                try:
                    merged = merge_exact(
                        export_exact(self.exact, name), export_exact(other.exact, name), self.exact_kind
                    )
                    restore_exact(exact, name, merged)
                except ValueError as exc:
                    raise ValueError(f"cannot merge tensor {name!r}: {exc}") from None
        return CalibrationState(
            names=list(self.names),
            mode=self.mode,
            stream=stream,
            exact=exact,
            exact_kind=self.exact_kind,
            exact_num_bins=self.exact_num_bins,
            model_fingerprint=self.model_fingerprint,
            data_fingerprints=tuple(sorted(self.data_fingerprints + other.data_fingerprints)),
            method=self.method,
            settings=dict(self.settings),
            channels=None if self.channels is None or other.channels is None else self.channels.merge(other.channels),
        )

    # -- files ----------------------------------------------------------------------------------

    def to_bytes(self, compress: bool = False) -> bytes:
        """The state file's bytes (equal states give equal bytes).

        Args:
            compress: deflate the members.

        Returns:
            The file's contents (an ``.npz`` archive).

        Raises:
            ValueError: a state too large for the format.
        """
        return state_bytes(self, compress)

    def save(self, path: PathLike, compress: bool = False) -> None:
        """Write the state atomically (a temp file renamed over ``path``; mode 0600, like caches).

        Args:
            path: the file to write.
            compress: deflate the members.

        Raises:
            ValueError: a state too large for the format.
            OSError: the file cannot be written.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, self.to_bytes(compress), prefix=".histocal_state_")

    @classmethod
    def load(cls, path: PathLike) -> CalibrationState:
        """Read a state file (untrusted input: every member is checked).

        Args:
            path: the file.

        Returns:
            The state.

        Raises:
            ValueError: the file is no valid state (naming the file and what is wrong).
            OSError: the file cannot be read.
        """
        path = Path(path)
        with open_untrusted_file(path, MAX_STATE_BYTES, what="calibration state") as (file, size):
            return cls._read(file, size, str(path))

    @classmethod
    def from_bytes(cls, raw: bytes, what: str = "<bytes>") -> CalibrationState:
        """Read a state from the bytes of a state file (as ``load``).

        Args:
            raw: the file's contents.
            what: the name messages give it.

        Returns:
            The state.

        Raises:
            ValueError: no valid state.
        """
        return cls._read(io.BytesIO(raw), len(raw), what)

    @classmethod
    def _read(cls, source: BinaryIO, size: int, what: str) -> CalibrationState:
        return cls(**read_state_fields(source, size, what))


def merge_states(*states: CalibrationState | PathLike) -> CalibrationState:
    """Merge states (or state files) left to right.

    Args:
        *states: states or state file paths (or one list of them).

    Returns:
        The merged state.

    Raises:
        ValueError: no state, a file that is no valid state, or incompatible states.
    """
    if len(states) == 1 and isinstance(states[0], (list, tuple)):
        states = tuple(states[0])
    if not states:
        raise ValueError("merge_states needs at least one state")
    loaded = [s if isinstance(s, CalibrationState) else CalibrationState.load(s) for s in states]
    out = loaded[0]
    for s in loaded[1:]:
        out = out.merge(s)
    return out
