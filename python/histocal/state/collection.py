"""What a histogram calibration collected, as one object: a :class:`Collection`.

A calibrator holds one (``calibrator.collection``) and collects into it; a ``CalibrationState`` is one
plus where it came from (model and data fingerprints, method, settings, version). Its parts are the
Rust core's collections:

* ``stream``: the streaming histograms (``_core.StreamHistograms``, with the summaries collected
  beside them). Exact-mode calibrators feed them too, from the same scans, so every collection
  serves every method;
* ``exact``: exact mode's ORT histograms (``_core.Histograms``; their ``kind`` and ``num_bins`` are
  their own). In a calibrator they are the ones its ORT ``collector`` holds, so edits of
  ``collector.histogram_dict`` are what was collected;
* ``channels``: the per-channel streaming histograms (``ChannelHistograms``), when collected.

A snapshot is ``copy()``; merging is :mod:`histocal.state.merge`'s (streaming and per-channel parts
exactly, exact parts by ORT's rule). ``subset`` shares the histograms of some tensors (per-tensor
method rules compute a group of tensors from it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from .. import _core
from .channels import ChannelHistograms

NOTHING_COLLECTED = "the calibrator has not collected any data yet (call collect_data first)"


@dataclass
class Collection:
    """The histograms a calibration collected (see the module docstring).

    Args:
        mode: how they were collected, ``"exact"`` or ``"streaming"``.
        stream: the streaming histograms.
        exact: exact mode's ORT histograms.
        channels: the per-channel streaming histograms.
        only: the tensors of a ``subset`` (None: every tensor the histograms hold).
    """

    mode: str
    stream: _core.StreamHistograms | None = None
    exact: _core.Histograms | None = None
    channels: ChannelHistograms | None = None
    only: tuple[str, ...] | None = None

    @property
    def names(self) -> list[str]:
        """The tensors collected, in collection order."""
        if self.only is not None:
            return list(self.only)
        if self.stream is not None:
            return list(self.stream.names())
        return [] if self.exact is None else list(self.exact.names())

    @property
    def streaming_bins(self) -> int | None:
        """The streaming histograms' bin count (None: no streaming histograms)."""
        return None if self.stream is None else int(self.stream.num_bins)

    @property
    def exact_kind_and_bins(self) -> tuple[str | None, int | None]:
        """The exact histograms' kind and bin count (``(None, None)`` without them)."""
        return (None, None) if self.exact is None else (self.exact.kind, int(self.exact.num_bins))

    @property
    def options(self) -> dict[str, Any]:
        """How the histograms were collected: mode, streaming bins, exact histograms' kind and bins
        (the keys of a state file's ``options``)."""
        kind, num_bins = self.exact_kind_and_bins
        return {
            "mode": self.mode,
            "streaming_bins": self.streaming_bins,
            "exact_kind": kind,
            "exact_num_bins": num_bins,
        }

    def copy(self) -> Collection:
        """A copy: a snapshot a calibrator can roll back to.

        Returns:
            The collection with each part copied.
        """
        return Collection(
            self.mode,
            None if self.stream is None else self.stream.copy(),
            None if self.exact is None else self.exact.copy(),
            None if self.channels is None else self.channels.copy(),
            self.only,
        )

    def held(self) -> Collection:
        """This collection as a state holds it: an exact part that holds no tensor left out.

        Returns:
            The collection (its parts shared, not copied).

        Raises:
            ValueError: nothing was collected.
        """
        exact = self.exact if self.exact is not None and self.exact.names() else None
        if self.stream is None and exact is None:
            raise ValueError(NOTHING_COLLECTED)
        return replace(self, exact=exact)

    def subset(self, tensors: Sequence[str]) -> Collection:
        """The collection of some tensors only.

        Args:
            tensors: the tensors, in the order results list them.

        Returns:
            The collection of ``tensors`` (their histograms shared, not copied).
        """
        ch = self.channels
        if ch is not None:
            ch = ChannelHistograms(ch.num_bins, ch.axis, ch.max_bytes, {t: ch.channels[t] for t in tensors}, ch.stream)
        return replace(self, channels=ch, only=tuple(tensors))

    def counts(self, name: str) -> tuple[int, int, int, int, int]:
        """A tensor's value counts.

        Args:
            name: the tensor.

        Returns:
            ``(finite, nan, posinf, neginf, batches)``.

        Raises:
            KeyError: no such tensor.
        """
        held = self.stream if self.stream is not None else self.exact
        if held is None:
            raise KeyError(name)
        c = held.counts(name)
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
        if self.exact is None:
            raise KeyError(name)
        return self.exact.dtypes(name)[0]
