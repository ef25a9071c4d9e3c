"""Calibration state: everything a histogram calibration collected, saved once, reusable and mergeable.

A :class:`CalibrationState` is a :class:`~histocal.state.collection.Collection` (what was collected)
and its provenance (model and data fingerprints, method, settings, version). It holds, per
calibrated tensor:

* the **streaming histogram** (``_core.StreamHistograms``: a power-of-two-aligned histogram of
  ``streaming_bins`` bins, finite min/max, min |x|, counts of finite/NaN/+Inf/-Inf values and the
  number of batches). Streaming-mode calibrators build it; exact-mode calibrators build it too
  (during their counting pass), so that every state can serve every method (but isotone and pow2's most-common choice);
* in exact mode also the **exact ORT histogram** (``_core.Histograms`` of kind ``value`` or ``abs``
  with the calibrator's ``num_bins``: the histogram onnxruntime itself would hold).

``state.compute(method, **settings)`` gives onnxruntime's ``TensorsData`` of any method without
running the model (which histograms and which code: :mod:`histocal.state.results`); states of the
same model and options merge (:meth:`CalibrationState.merge`, :func:`merge_states`; the rules:
:mod:`histocal.state.merge`).
The file format and its checks: :mod:`histocal.state.file` (its spec and limits: ``file.format``; each
summary's members: ``file.summaries``; reading a file back: ``file.read``; writing one: ``file.write``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO, Union

from .. import _core
from .._version import __version__
from ..io.files import atomic_write_bytes, open_untrusted_file
from .channels import ChannelHistograms
from .collection import NOTHING_COLLECTED, Collection
from .file.format import FORMAT_NAME, FORMAT_VERSION, MAX_STATE_BYTES
from .file.header import check_fingerprint, plain_value
from .file.read import read_state
from .file.write import state_bytes
from .fingerprint import model_fingerprint
from .merge import check_compatible, merge, merge_into
from .results import StateResults

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "CalibrationState", "merge_states", "model_fingerprint"]

PathLike = Union[str, "os.PathLike[str]"]


def _version() -> str:
    return __version__


@dataclass
class CalibrationState(StateResults):
    """Reusable, mergeable histogram state of a calibration (see the module docstring): a
    :class:`~histocal.state.collection.Collection` and where it came from.

    Build it with ``calibrator.state`` / ``CalibrationState.from_calibrator`` or ``load``; use it
    with ``compute``, ``merge``, ``save`` and ``calibrator.load_state``.

    Args:
        collection: the histograms collected.
        model_fingerprint: the calibrated model's fingerprint (``model_fingerprint``).
        data_fingerprints: the fingerprints of the data of each run merged into the state.
        method: the method it was collected for.
        settings: that method's settings.
        histocal_version: the histocal version that collected it.
    """

    collection: Collection
    model_fingerprint: str | None = None
    data_fingerprints: tuple[str, ...] = ()
    method: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    histocal_version: str = field(default_factory=_version)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_calibrator(cls, cal: Any, data_fingerprint: str | None = None) -> CalibrationState:
        """A copy of what a histocal Entropy/Percentile/Distribution/Method calibrator has collected
        (through its public interface: ``collection``, ``lock``, ``model_fingerprint``,
        ``collection_settings``).

        Args:
            cal: the calibrator, after ``collect_data``.
            data_fingerprint: the fingerprint of the data it collected (``sha256:`` and 64 hex digits).

        Returns:
            The state.

        Raises:
            ValueError: nothing collected yet, or a malformed ``data_fingerprint``.
        """
        with cal.lock:  # not while another thread collects
            if cal.collection is None:
                raise ValueError(NOTHING_COLLECTED)
            collection = cal.collection.held().copy()
        return cls.from_collection(
            collection,
            model_fingerprint=cal.model_fingerprint,
            method=cal.method,
            settings=cal.collection_settings,
            data_fingerprint=data_fingerprint,
        )

    @classmethod
    def from_collection(
        cls,
        collection: Collection,
        *,
        model_fingerprint: str | None,
        method: str | None,
        settings: dict[str, Any],
        data_fingerprint: str | None = None,
    ) -> CalibrationState:
        """The state holding ``collection`` (shared, not copied) and how it was collected.

        Args:
            collection: the collected histograms.
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
            collection,
            model_fingerprint=model_fingerprint,
            data_fingerprints=() if data_fingerprint is None else (check_fingerprint(data_fingerprint),),
            method=method,
            settings={k: plain_value(v) for k, v in settings.items()},
        )

    # -- the collection's parts -----------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The calibrated tensors, in calibration order."""
        return self.collection.names

    @property
    def mode(self) -> str:
        """The collection mode, ``"streaming"`` or ``"exact"``."""
        return self.collection.mode

    @property
    def stream(self) -> _core.StreamHistograms | None:
        """The streaming histograms (every histocal state has them)."""
        return self.collection.stream

    @property
    def exact(self) -> _core.Histograms | None:
        """Exact mode's ORT histograms."""
        return self.collection.exact

    @property
    def channels(self) -> ChannelHistograms | None:
        """The per-channel streaming histograms, when collected."""
        return self.collection.channels

    @property
    def streaming_bins(self) -> int | None:
        """The streaming histograms' bin count (None: no streaming histograms)."""
        return self.collection.streaming_bins

    @property
    def exact_kind_and_bins(self) -> tuple[str | None, int | None]:
        """The exact histograms' kind and bin count, as one pair (``(None, None)`` without them)."""
        return self.collection.exact_kind_and_bins

    @property
    def data_fingerprint(self) -> str | None:
        """The data fingerprint of a single run (None when absent or when merged from several)."""
        return self.data_fingerprints[0] if len(self.data_fingerprints) == 1 else None

    @property
    def options(self) -> dict[str, Any]:
        """How the state was collected: mode, bins, exact histograms' kind and bins, method, settings."""
        return {**self.collection.options, "method": self.method, "settings": dict(self.settings)}

    def counts(self, name: str) -> tuple[int, int, int, int, int]:
        """A tensor's value counts.

        Args:
            name: the tensor.

        Returns:
            ``(finite, nan, posinf, neginf, batches)``.

        Raises:
            KeyError: no such tensor.
        """
        return self.collection.counts(name)

    def dtype(self, name: str) -> str:
        """A tensor's data type.

        Args:
            name: the tensor.

        Returns:
            Its numpy dtype's name (``"float32"``, ``"float16"``, ...).

        Raises:
            KeyError: no such tensor.
        """
        return self.collection.dtype(name)

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
        check_compatible(self.collection, other.collection)

    def merge(self, other: CalibrationState) -> CalibrationState:
        """Combine two states (see :mod:`histocal.state.merge`).

        Args:
            other: a compatible state (``check_compatible``).

        Returns:
            A new state holding both; neither is changed.

        Raises:
            ValueError: incompatible states, or exact histograms that cannot be merged (naming
                the tensor).
        """
        return _merged(self, other, merge)

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
        collection, provenance = read_state(source, size, what)
        return cls(collection, **provenance)


def _merged(
    a: CalibrationState, b: CalibrationState, merged: Callable[[Collection, Collection], Collection]
) -> CalibrationState:
    """``a.merge(b)``, the collections merged by ``merged`` (``merge``, or ``merge_into`` where
    ``a`` is ``merge_states``' own running result)."""
    a.check_compatible(b)
    return replace(
        a,
        collection=merged(a.collection, b.collection),
        data_fingerprints=tuple(sorted(a.data_fingerprints + b.data_fingerprints)),
        settings=dict(a.settings),
        histocal_version=_version(),
    )


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
    for k, s in enumerate(loaded[1:]):
        # From the second merge on, ``out`` is this function's own: merged into in place.
        out = _merged(out, s, merge_into if k else merge)
    return out
