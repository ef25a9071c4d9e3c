"""Per-channel streaming histograms: one streaming histogram per channel of each calibrated tensor.

A tensor's channels are the slices along its channel axis (ORT's per-channel MinMax keeps axis 1;
negative axes count from the end, as numpy's do). Channel ``c`` of tensor ``T`` is collected as if it
were a tensor of its own, named ``T[c]`` (the last ``[`` of a key starts its channel index, so keys
never collide), into one ``_core.StreamHistograms``: each batch adds every channel's values as a batch of
that channel's histogram (the Rust core reads the batch in memory order, all channels at once:
``stream::channel_rows``; the keys are built once per tensor), so a per-channel histogram is exactly the
per-tensor streaming histogram of that channel's values. It is therefore batch-invariant and merges exactly,
in any order, and every method computed per channel equals the per-tensor method applied to that
channel's values (``CalibrationState.compute`` assembles the per-channel results into arrays).

With ``isotone=True`` every channel also gets isotone's per-row top-two summary (``methods::isotone``),
from the rows of its slice: the slice keeps the tensor's other axes in order, so its last axis is still
the class axis, and isotone per channel equals per-tensor isotone on each channel's slice. A channel axis
that is the tensor's last axis is refused for isotone (each channel would be one class column, with no
row of two values).

A tensor with too few dimensions for the channel axis (a scalar, or a 1-D tensor such as a batch norm
parameter held by a Constant node, with axis 1) has no channels: it is collected whole, as one channel
``T[0]``, and its result is the per-tensor one in per-channel form (arrays of one value). This is what
onnxruntime's ``MinMaxCalibrater(per_channel=True)`` gives a 1-D tensor (its ReduceMin/ReduceMax over axis
0 leave one value; onnxruntime refuses a scalar when it loads the augmented model).

Memory is ``channels x bins x 8`` bytes per tensor (while collecting, one more byte per bin: the streaming kernel's
narrow counts, not charged to ``max_bytes``, and a 256 KiB gathering buffer per collection thread; plus, for isotone, 24 bytes per distinct
top-two pair of each channel, at most ``_core.ISOTONE_MAX_PAIRS`` pairs per channel), within ``max_bytes``
(default ``DEFAULT_MAX_CHANNEL_BYTES``, or the environment variable ``HISTOCAL_MAX_CHANNEL_BYTES``). The
bins are ``streaming_bins``, or fewer where the first batch's channels would not fit the limit: the
largest power of two that fits, down to ``MIN_FITTED_BINS``, with a warning (a transformer's tensors
have hundreds of channels each along any axis, a few hundred tensors, so 16384 bins per channel would
need several GiB). A collection that does not fit even then, or a tensor first seen in a later call
that does not fit, is refused before the memory is taken, with an error naming the tensor. Isotone's summaries grow with the data (distinct pairs, at most one per row), so they are
counted after each tensor's batch is added: a collection whose histograms and summaries together pass
``max_bytes`` is refused then, naming the tensor (the memory over the limit is at most that batch's
rows x 24 bytes; the calibrators undo the failed call).

Computing ORT's methods per channel (``compute``) goes through the channels a chunk at a time
(``state.compute``): only a chunk's ORT histograms of ``num_bins`` bins and per-key results are alive at
once, and the results keep one value per channel; the whole computation's memory is checked first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import TensorData, TensorsData

from .. import _core

logger = logging.getLogger(__name__)

# 2^28 bins of uint64 counts: what a state file may hold (file.format.MAX_STATE_BINS), so that
# every collection within the default limit can be saved and loaded.
DEFAULT_MAX_CHANNEL_BYTES = 2 << 30
ISOTONE_PAIR_BYTES = 24  # one distinct (top, second, rows) pair of an isotone summary
MAX_CHANNEL_BYTES_ENV = "HISTOCAL_MAX_CHANNEL_BYTES"
NO_CHANNEL_VOTES = "pow2's most-common choice is per tensor only (its per-batch votes are not kept per channel)"
ISOTONE_CLASS_AXIS = (
    "isotone per channel needs a channel axis other than the last, the class axis (each channel would be a "
    "single class column, with no row of two values)"
)


def channel_key(tensor: str, channel: int) -> str:
    """The name channel ``channel`` of ``tensor`` is collected under."""
    return f"{tensor}[{channel}]"


def whole_or_channels(a: np.ndarray, axis: int) -> tuple[np.ndarray, int]:
    """``a`` and its channel axis (non-negative; negative axes count from the end); a tensor without
    axis ``axis`` (too few dimensions) as one channel holding the whole tensor: ``a[None]``, axis 0
    (a scalar as ``(1, 1)``, one row of one value, as the per-tensor collection reads it)."""
    if -a.ndim <= axis < a.ndim:
        return a, int(axis) % a.ndim
    return (a.reshape(1, *a.shape) if a.ndim else a.reshape(1, 1)), 0


def max_channel_bytes(value: int | None = None) -> int:
    """The per-channel memory limit: ``value``, else ``HISTOCAL_MAX_CHANNEL_BYTES``, else the default."""
    if value is None:
        raw = os.environ.get(MAX_CHANNEL_BYTES_ENV)
        if raw is None:
            return DEFAULT_MAX_CHANNEL_BYTES
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{MAX_CHANNEL_BYTES_ENV} must be a number of bytes, got {raw!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"the per-channel memory limit must be a positive number of bytes, got {value!r}")
    return int(value)


# The fewest bins per channel a collection is fitted down to (see ChannelHistograms._fit_bins).
MIN_FITTED_BINS = 1024


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


@dataclass
class ChannelHistograms:
    """Per-channel streaming histograms of a collection (see the module docstring).

    ``channels`` maps each tensor (in collection order) to its number of channels; ``axis`` is the
    axis as given (each tensor resolves it against its own rank). ``isotone``: also collect isotone's
    summaries per channel (a given ``stream`` decides it: its own ``isotone``)."""

    num_bins: int
    axis: int = 1
    max_bytes: int | None = None
    channels: dict[str, int] = field(default_factory=dict)
    stream: Any = None  # _core.StreamHistograms keyed by channel_key
    isotone: bool = False
    # each tensor's channel keys, built once (a collection passes them with every batch)
    _keys: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def collecting(cls, num_bins: int, axis: int, summaries: Collection[str]) -> ChannelHistograms:
        """Per-channel histograms that also collect, of ``summaries`` (``methods.table.summaries_for``),
        those kept per channel (see ``check_summaries``)."""
        return cls(num_bins, axis, isotone="isotone" in summaries)

    @staticmethod
    def check_summaries(summaries: Collection[str], axis: int) -> None:
        """ValueError when ``summaries`` cannot be collected per channel on ``axis``."""
        if "pow2_votes" in summaries:
            raise ValueError(NO_CHANNEL_VOTES)
        if "isotone" in summaries and axis == -1:
            raise ValueError(ISOTONE_CLASS_AXIS)

    def __post_init__(self) -> None:
        if isinstance(self.axis, bool) or not isinstance(self.axis, (int, np.integer)):
            raise ValueError(f"the channel axis must be an integer, got {self.axis!r}")
        if self.stream is None:
            self.stream = _core.StreamHistograms(self.num_bins, summaries=["isotone"] if self.isotone else [])
        self.isotone = "isotone" in self.stream.summaries
        self.max_bytes = max_channel_bytes(self.max_bytes)

    @property
    def names(self) -> list[str]:
        return list(self.channels)

    @property
    def held_bytes(self) -> int:
        return 8 * self.num_bins * sum(self.channels.values())

    def channel_keys(self, tensor: str | None = None) -> list[str]:
        """Every channel key, tensor by tensor (or only ``tensor``'s)."""
        if tensor is not None:
            keys = self._keys.get(tensor)
            if keys is None or len(keys) != self.channels[tensor]:
                keys = self._keys[tensor] = [channel_key(tensor, c) for c in range(self.channels[tensor])]
            return keys
        return [k for t in self.channels for k in self.channel_keys(t)]

    def collect(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None:
        """Add ``[(tensor, [batch arrays...]), ...]``: every array's channels into their histograms.
        Shapes and the memory limit are checked before anything is added; the tensors are then added in
        one call per channel axis, whose dtypes are checked first (an error names the channel; one
        while adding, such as running out of memory, may leave some tensors added: the calibrators undo
        a failed call as a whole)."""
        if not self.channels and not self.stream.names():
            self._fit_bins(items)
        held = self.held_bytes
        new: dict[str, int] = {}
        feeds: list[tuple[str, list[tuple[np.ndarray, int]]]] = []
        for tensor, arrays in items:
            moved = []
            for a in arrays:
                a, axis = whole_or_channels(np.asarray(a), self.axis)
                if self.isotone and axis == a.ndim - 1:
                    raise ValueError(
                        f"tensor {tensor!r}: {ISOTONE_CLASS_AXIS}; channel axis {self.axis} is the last axis of "
                        f"its shape {a.shape}"
                    )
                count = self.channels.get(tensor, new.get(tensor))
                if count is None:
                    count = new[tensor] = int(a.shape[axis])
                    if count == 0:
                        raise ValueError(f"tensor {tensor!r}: its channel axis {self.axis} has no channels")
                    need = 8 * self.num_bins * count
                    assert self.max_bytes is not None
                    if held + need > self.max_bytes:
                        raise ValueError(
                            f"tensor {tensor!r}: per-channel histograms of its {count} channels x {self.num_bins} "
                            f"bins need {_size(need)}, which would bring this collection's per-channel histograms to "
                            f"{_size(held + need)}, over the limit of {_size(self.max_bytes)}: lower streaming_bins, "
                            f"calibrate fewer tensors per channel, or raise the limit (max_channel_bytes or "
                            f"{MAX_CHANNEL_BYTES_ENV})"
                        )
                    held += need
                elif a.shape[axis] != count:
                    raise ValueError(
                        f"tensor {tensor!r}: {a.shape[axis]} channels along axis {self.axis} in this batch, "
                        f"{count} before (shape {a.shape})"
                    )
                moved.append((a, axis))
            feeds.append((tensor, moved))
        for tensor, count in new.items():
            self.channels[tensor] = count
        if self.isotone:  # tensor by tensor: the summaries' memory is checked after each
            for tensor, located in feeds:
                for a, axis in located:
                    self.stream.collect_channels([(self.channel_keys(tensor), [a])], axis)
                self._check_isotone_bytes(tensor, held)
            return
        # The tensors in order, consecutive ones of one channel axis in one call (the order keeps new
        # channels' keys in collection order). The arrays go as they are: the core reads each in memory
        # order, all its channels at once, and copies only an array not in C order.
        calls: list[tuple[int, list[tuple[list[str], list[np.ndarray]]]]] = []
        for tensor, located in feeds:
            by_axis: dict[int, list[np.ndarray]] = {}
            for a, axis in located:
                by_axis.setdefault(axis, []).append(a)
            for axis, arrays in by_axis.items():
                if not calls or calls[-1][0] != axis:
                    calls.append((axis, []))
                calls[-1][1].append((self.channel_keys(tensor), arrays))
        for axis, call in calls:
            self.stream.collect_channels(call, axis)

    def _fit_bins(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None:
        """Before the first collection: fewer bins per channel (a power of two, at least
        ``MIN_FITTED_BINS``) where the first batch's channels at ``num_bins`` would pass ``max_bytes``."""
        counts = {}
        for tensor, arrays in items:
            if arrays:
                a, axis = whole_or_channels(np.asarray(arrays[0]), self.axis)
                counts[tensor] = int(a.shape[axis])
        total = sum(counts.values())
        assert self.max_bytes is not None
        bins = self.num_bins
        while bins > min(self.num_bins, MIN_FITTED_BINS) and 8 * bins * total > self.max_bytes:
            bins //= 2
        if bins == self.num_bins:
            return
        if 8 * bins * total > self.max_bytes:  # not even at the fewest bins: collect() refuses naming the tensor
            self.num_bins, self.stream = (
                bins,
                _core.StreamHistograms(bins, summaries=["isotone"] if self.isotone else []),
            )
            return
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:3]
        logger.warning(
            "per-channel histograms: %d channels in %d tensors (largest: %s) x %d bins would need %s, over the "
            "per-channel memory limit of %s; using %d bins per channel (%s). For the full resolution calibrate fewer "
            "tensors per channel (op_types_to_calibrate), choose a channel axis with fewer channels, or raise the "
            "limit (max_channel_bytes or %s)",
            total, len(counts), ", ".join(f"{t!r} {n}" for t, n in top), self.num_bins,
            _size(8 * self.num_bins * total), _size(self.max_bytes), bins, _size(8 * bins * total),
            MAX_CHANNEL_BYTES_ENV,
        )  # fmt: skip
        self.num_bins = bins
        self.stream = _core.StreamHistograms(bins, summaries=["isotone"] if self.isotone else [])

    def _check_isotone_bytes(self, tensor: str, histogram_bytes: int) -> None:
        pairs = self.stream.summary_bytes("isotone") // ISOTONE_PAIR_BYTES
        total = histogram_bytes + ISOTONE_PAIR_BYTES * pairs
        assert self.max_bytes is not None
        if total > self.max_bytes:
            raise ValueError(
                f"tensor {tensor!r}: per-channel isotone summaries now hold {pairs} distinct top-two pairs "
                f"({_size(ISOTONE_PAIR_BYTES * pairs)}), which with the histograms ({_size(histogram_bytes)}) is over "
                f"the limit of {_size(self.max_bytes)}: calibrate fewer tensors per channel with isotone, or raise "
                f"the limit (max_channel_bytes or {MAX_CHANNEL_BYTES_ENV})"
            )

    def copy(self) -> ChannelHistograms:
        return ChannelHistograms(self.num_bins, self.axis, self.max_bytes, dict(self.channels), self.stream.copy())

    def check_compatible(self, other: ChannelHistograms) -> None:
        if self.axis != other.axis:
            raise ValueError(f"the per-channel histograms were collected along axis {self.axis} and {other.axis}")
        if self.num_bins != other.num_bins:
            raise ValueError(f"the per-channel histograms have {self.num_bins} and {other.num_bins} bins")
        for tensor in set(self.channels) & set(other.channels):
            if self.channels[tensor] != other.channels[tensor]:
                raise ValueError(
                    f"tensor {tensor!r}: {self.channels[tensor]} channels in one collection and "
                    f"{other.channels[tensor]} in the other"
                )

    def merge(self, other: ChannelHistograms) -> ChannelHistograms:
        """A new collection: ``self`` and ``other`` combined (exact, in any order)."""
        self.check_compatible(other)
        out = self.copy()
        out.stream.merge(other.stream)
        out.isotone = "isotone" in out.stream.summaries  # kept only when both collected it, as per tensor
        for tensor, count in other.channels.items():
            out.channels.setdefault(tensor, count)
        return out

    @classmethod
    def from_stream(cls, axis: int, channels: Mapping[str, int], stream: Any) -> ChannelHistograms:
        """The collection of a loaded stream, checked: its names must be exactly ``channels``' keys."""
        out = cls(int(stream.num_bins), axis, None, dict(channels), stream)
        names = stream.names()
        keys = (channel_key(t, c) for t, n in out.channels.items() for c in range(n))
        if len(names) != out.count or any(a != b for a, b in zip(names, keys)):
            raise ValueError("the per-channel histograms do not match the tensors' channel counts")
        return out

    @property
    def count(self) -> int:
        """The number of channels of every tensor together."""
        return sum(self.channels.values())

    def compute(self, keyed: Callable[[list[str]], TensorsData], chunk: int) -> TensorsData:
        """Per-channel results as ORT's per-channel TensorData: arrays of one value per channel for
        ``lowest``/``highest`` (and ``avg``/``std`` where the method gives them). ``keyed(keys)`` computes
        the channels ``keys`` (at most ``chunk`` at a time, so that their histograms and per-key results
        are alive only for that chunk) as per-tensor TensorsData keyed by channel key."""
        values: dict[str, dict[str, list[np.ndarray]]] = {t: {} for t in self.channels}
        method = None
        keys: list[tuple[str, str]] = []

        def flush() -> None:
            nonlocal method
            result = keyed([k for _, k in keys])
            method = result.calibration_method
            for tensor, key in keys:
                part, held = result[key], values[tensor]
                for attr in ("lowest", "highest", "avg", "std"):
                    if hasattr(part, attr) and held.get(attr, ()) is not None:
                        held.setdefault(attr, []).append(np.asarray(getattr(part, attr)).reshape(1))
                    else:  # kept only where every channel has it
                        held[attr] = None  # type: ignore[assignment]
            keys.clear()

        for tensor, n in self.channels.items():
            for c in range(n):
                keys.append((tensor, channel_key(tensor, c)))
                if len(keys) == chunk:
                    flush()
        if keys:
            flush()
        out = {
            tensor: TensorData(**{a: np.concatenate(v) for a, v in held.items() if v is not None})
            for tensor, held in values.items()
        }
        return TensorsData(method, out)
