"""The collection settings, declared once: how the calibrators collect, whatever the method.

Each :class:`Setting` row gives one setting's keyword (the calibrators', ``quantize_static``'s),
its ``create_calibrator`` ``extra_options`` key, its command-line flag, its environment fallback and
its help. A :class:`CollectionSettings` is built once, where the caller's spelling comes in, and
checked then: ``from_keywords`` (the calibrators' and ``quantize_static``'s keywords),
``from_extra_options`` (ORT-style ``extra_options``: ``create_calibrator`` and Quark's factory, the
boundaries that take them), ``from_cli`` (the command line's flags). The object is what travels
from there on: histocal's entry points hand it to ``create_calibrator(settings=...)`` or a
calibrator's ``settings=``, and a distributed job carries it to its workers (a frozen dataclass:
Ray pickles it). ``settings_for`` says which settings each kind of calibrator reads.

The environment fallbacks (``HISTOCAL_MEMORY_BUDGET``, ``HISTOCAL_NUM_THREADS``) are read where the
value is used (each ``collect_data`` call, each calibrator), so a setting left unset here follows
the environment of that moment.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from ..io.memory import parse_size

MODES = ("auto", "exact", "streaming")
DEFAULT_STREAMING_BINS = 16384

# extra_options keys that are not collection settings: the options of a histocal method (a dict),
# and other methods for chosen tensors (histocal.state.overrides), as create_calibrator and
# quantize_static spell them.
METHOD_OPTIONS_KEY = "MethodOptions"
METHOD_OVERRIDES_KEY = "MethodOverrides"
QUANTIZE_METHOD_OVERRIDES_KEY = "CalibMethodOverrides"


@dataclass(frozen=True)
class Setting:
    """One collection setting and every name it goes by."""

    name: str  # the calibrators' and quantize_static's keyword
    extra_key: str  # create_calibrator's extra_options key ("": keyword only)
    help: str
    flag: str = ""  # the command line's flag ("": not on the command line)
    env: str = ""  # the environment variable read where the setting is left unset
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    cli_dest: str | None = None  # where argparse stores the flag, where not under ``name``

    @property
    def dest(self) -> str:
        return self.cli_dest or self.name

    @property
    def how_to_set(self) -> str:
        """Every way to give it, for messages."""
        ways = [f"{self.name}=", f"extra_options[{self.extra_key!r}]" if self.extra_key else "", self.env]
        return ", ".join(w for w in ways[:-1] if w) + (f" or {self.env}" if self.env else "")


MODE = Setting(
    "mode",
    "CollectionMode",
    "histogram collection: exact (ORT-identical; one inference pass while the outputs fit the memory budget, "
    "the rest run again), streaming (one pass, bounded memory), auto (default: exact, but streaming for data "
    "read once whose outputs outgrow the budget)",
    flag="--mode",
    choices=MODES,
)
STREAMING_BINS = Setting(
    "streaming_bins",
    "StreamingBins",
    f"streaming mode: bins of the batch-invariant histogram (power of two, default {DEFAULT_STREAMING_BINS})",
    flag="--streaming-bins",
    metavar="N",
)
MEMORY_BUDGET = Setting(
    "memory_budget",
    "MemoryBudget",
    "exact mode: outputs kept to save a second inference pass, in bytes or e.g. 512M, 2GiB "
    "(default: HISTOCAL_MEMORY_BUDGET, else the lesser of 25%% of available memory and 8 GiB)",
    flag="--memory-budget",
    env="HISTOCAL_MEMORY_BUDGET",
    metavar="SIZE",
)
PER_CHANNEL = Setting(
    "per_channel",
    "per_channel",  # ORT's own MinMax key
    "per-channel ranges (minmax: ORT's, along axis 1; histogram methods: per-channel histograms along --axis)",
    flag="--per-channel",
    cli_dest="calib_per_channel",  # `quantize --per-channel` is ORT's per-channel weights
)
AXIS = Setting(
    "axis",
    "channel_axis",
    "with --per-channel, histogram methods: the channel axis (default 1; negative counts from the end)",
    flag="--axis",
    metavar="N",
    cli_dest="calib_axis",
)
NUM_THREADS = Setting(
    "num_threads",
    "NumThreads",
    "the CPUs calibration may use (default: HISTOCAL_NUM_THREADS, else the usable CPUs)",
    env="HISTOCAL_NUM_THREADS",
)
SESSION_OPTIONS = Setting(
    "session_options", "SessionOptions", "an onnxruntime.SessionOptions for the calibration session, used as given"
)
SHOW_PROGRESS = Setting("show_progress", "", "a progress bar (default: when the output is a terminal)")

SETTINGS: tuple[Setting, ...] = (
    MODE,
    STREAMING_BINS,
    MEMORY_BUDGET,
    PER_CHANNEL,
    AXIS,
    NUM_THREADS,
    SESSION_OPTIONS,
    SHOW_PROGRESS,
)
# The extra_options keys of the settings, and the command-line flag of each key.
EXTRA_KEYS: dict[str, Setting] = {s.extra_key: s for s in SETTINGS if s.extra_key}
# The settings each kind of calibrator reads (what the others are given does not apply to it):
# MinMax's in-graph ranges collect no histogram; histocal's methods always collect streaming ones.
MINMAX_SETTINGS = (PER_CHANNEL, NUM_THREADS, SESSION_OPTIONS, SHOW_PROGRESS)
STREAMING_SETTINGS = (STREAMING_BINS, PER_CHANNEL, AXIS, NUM_THREADS, SESSION_OPTIONS, SHOW_PROGRESS)
# The collection flags of the commands that calibrate on data (per-channel ones are each command's).
COLLECTION_FLAGS = (MODE, MEMORY_BUDGET, STREAMING_BINS)


def settings_for(method: str) -> tuple[Setting, ...]:
    """The settings the calibrator of ``method`` (a canonical name) reads: MinMax's, ORT's
    histogram methods' (every one) or a streaming method's (histocal's, registered ones)."""
    from .table import TABLE

    row = TABLE.get(method)
    histogram = row.histogram if row is not None else "stream"
    return MINMAX_SETTINGS if histogram == "minmax" else SETTINGS if histogram == "exact" else STREAMING_SETTINGS


def mode_given(mode: Any, extra_options: Mapping[str, Any]) -> tuple[str, str]:
    """The collection mode asked for by the ``mode`` keyword or ``extra_options``'s key (``auto``
    unless given; ValueError where both are given and disagree, or for a mode that is none), and
    the name it was given by, for messages."""
    option = extra_options.get(MODE.extra_key)
    if mode is not None and option is not None and mode != option:
        raise ValueError(f"mode={mode!r} and extra_options[{MODE.extra_key!r}]={option!r} disagree: give one of them")
    source, value = ("mode", mode) if mode is not None else (f"extra_options[{MODE.extra_key!r}]", option)
    if value is None:
        return "auto", source
    if value not in MODES:
        raise ValueError(f"{source} must be one of {', '.join(MODES)}, got {value!r}")
    return value, source


class CollectionKwargs(TypedDict, total=False):
    """The calibrators' collection keywords (see :data:`SETTINGS`)."""

    mode: str | None
    streaming_bins: int | None
    memory_budget: int | str | None
    per_channel: bool
    axis: int
    num_threads: int | None
    session_options: Any
    show_progress: bool | None


def check_mode(mode: Any, what: str = "mode") -> str:
    mode = "auto" if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"{what} must be one of {MODES}, got {mode!r}")
    return str(mode)


def _check_streaming_bins(n: Any) -> int:
    n = DEFAULT_STREAMING_BINS if n is None else n
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 8 or n & (n - 1):
        raise ValueError(f"streaming_bins must be a power of two >= 8, got {n!r}")
    return int(n)


@dataclass(frozen=True)
class CollectionSettings:
    """How a calibrator collects, checked once. ``mode`` is the mode collection starts in: per-channel
    histograms are streaming ones, so ``per_channel`` turns ``auto`` into ``streaming`` (and refuses
    ``exact``). ``memory_budget`` and ``num_threads`` left None follow the environment where used."""

    mode: str = "auto"
    streaming_bins: int = DEFAULT_STREAMING_BINS
    memory_budget: int | None = None  # bytes
    per_channel: bool = False
    axis: int = 1
    num_threads: int | None = None
    session_options: Any = None
    show_progress: bool | None = None

    @classmethod
    def from_keywords(cls, **keywords: Any) -> CollectionSettings:
        """From the calibrators' keywords (None: the default); TypeError names an unknown one."""
        unknown = set(keywords) - {s.name for s in SETTINGS}
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {sorted(unknown)}")
        memory_budget = keywords.get("memory_budget")
        # checked in the order the calibrators always did: an error names the first bad one
        budget = None if memory_budget is None else parse_size(memory_budget, MEMORY_BUDGET.name)
        mode = check_mode(keywords.get("mode"))
        streaming_bins = _check_streaming_bins(keywords.get("streaming_bins"))
        per_channel = keywords.get("per_channel", False)
        axis = keywords.get("axis", 1)
        if not isinstance(per_channel, (bool, np.bool_)):
            raise ValueError(f"per_channel must be a boolean, got {per_channel!r}")
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"axis must be an integer, got {axis!r}")
        if per_channel and mode == "exact":
            raise ValueError("per-channel histograms are collected in streaming mode only (mode='exact' given)")
        return cls(
            mode="streaming" if per_channel else mode,
            streaming_bins=streaming_bins,
            memory_budget=budget,
            per_channel=bool(per_channel),
            axis=int(axis),
            num_threads=keywords.get("num_threads"),
            session_options=keywords.get("session_options"),
            show_progress=keywords.get("show_progress"),
        )

    @classmethod
    def of(cls, settings: CollectionSettings | None, **keywords: Any) -> CollectionSettings:
        """A calibrator's settings: ``settings`` as built by histocal's entry points, or those of
        the keywords an ORT-style caller gave; TypeError for both."""
        if settings is None:
            return cls.from_keywords(**keywords)
        if keywords:
            raise TypeError(f"give settings= or the keywords {sorted(keywords)}, not both")
        return settings

    @classmethod
    def from_extra_options(
        cls, extra_options: Mapping[str, Any], settings: tuple[Setting, ...] = SETTINGS
    ) -> CollectionSettings:
        """From ORT-style ``extra_options``: the keys of ``settings`` (those a calibrator reads; its
        other keys, and keys of other settings, are left alone). The values are checked here: ORT's
        API is untyped."""
        given = {s.name: extra_options[s.extra_key] for s in settings if s.extra_key in extra_options}
        return cls.from_keywords(**given)

    def replace(self, **changes: Any) -> CollectionSettings:
        return dataclasses.replace(self, **changes)

    # -- the command line ---------------------------------------------------------------------------

    @staticmethod
    def add_cli_arguments(
        group: Any, settings: tuple[Setting, ...], types: Mapping[str, Callable[[str], Any]] | None = None
    ) -> None:
        """One flag per setting of ``settings`` (with a flag), stored under the setting's name."""
        for s in settings:
            if not s.flag:
                continue
            kwargs: dict[str, Any] = {"dest": s.dest, "help": s.help}
            if s in (PER_CHANNEL,):
                kwargs.update(action="store_true", default=None)
            else:
                kwargs.update(
                    choices=s.choices, metavar=s.metavar, type=(types or {}).get(s.name, AXIS_TYPES.get(s.name))
                )
            group.add_argument(s.flag, **kwargs)

    @classmethod
    def from_cli(cls, args: argparse.Namespace, settings: tuple[Setting, ...] = SETTINGS) -> CollectionSettings:
        """From the command line's flags of ``settings`` (those not given: the defaults)."""
        given = {s.name: getattr(args, s.dest, None) for s in settings if s.flag}
        return cls.from_keywords(**{k: v for k, v in given.items() if v is not None})


AXIS_TYPES: dict[str, Callable[[str], Any]] = {"axis": int}


def flag_of(name: str) -> str:
    """The command-line flag of a setting's or an option's name."""
    setting = next((s for s in SETTINGS if s.name == name and s.flag), None)
    return setting.flag if setting is not None else "--" + name.replace("_", "-")
