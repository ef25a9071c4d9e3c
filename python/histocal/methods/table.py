"""The method table: every built-in calibration method, declared once.

Each entry says what the method is called, which histogram it reads, its options (type, default,
allowed values, help) and a one-line description. The calibrators, the calibration state and its
file format, the command line and the report all read this table. Adding a method that reads the
streaming histogram is its Rust kernel, its ``RangeMethod`` arm (``rust/src/methods/range_method.rs``),
one entry here (with its report ``colour``) and its tests. Registered methods
(``histocal.register_method``) take no options and read the streaming histogram.

The option values of ``pow2`` follow AMD Quark: ``pow2_method`` is ``NonOverflow`` (the smallest
power-of-two scale whose range covers the data) or ``MinMSE`` (the power-of-two scale with the least
squared error); ``minmse_mode`` says over what: all the data (``All``) or each batch, keeping the most
common choice (``MostCommon``, which needs every batch's vote collected as the batches come).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import CalibrationMethod

from .._core import MAX_BINS

QTYPES = ("int8", "uint8", "int16", "uint16")
POW2_QTYPES = ("int8", "uint8", "int16")
POW2_METHODS = ("NonOverflow", "MinMSE")
MINMSE_MODES = ("All", "MostCommon")
SCENARIOS = ("same", "p3")

NON_OVERFLOW, MIN_MSE = POW2_METHODS
# The pow2 setting that collects per-batch votes.
ALL_DATA, MOST_COMMON = MINMSE_MODES
POW2_VOTING = ("minmse_mode", MOST_COMMON)
# The summaries the core collects beside a streaming histogram (rust/src/collection/summary), by name.
POW2_VOTES, ISOTONE = "pow2_votes", "isotone"


@dataclass(frozen=True)
class Option:
    """One option of a method: its type, default, allowed values (``choices``, or ``bounds``: the
    inclusive range of a number) and help. Its ``extra_options`` key is its name (ORT's methods;
    histocal's go in ``MethodOptions``), its command-line flag ``flag``."""

    name: str
    kind: type  # bool, int, float or str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    bounds: tuple[float, float] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, method: str, value: Any) -> Any:
        """``value`` if it is a valid value of this option; ValueError naming the method and option."""
        if self.kind is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{method}: {self.name} must be a boolean, got {value!r}")
        elif self.kind is int and (
            isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not _within(value, self.bounds)
        ):
            low, high = self.bounds or (-math.inf, math.inf)
            raise ValueError(f"{method}: {self.name} must be an integer in [{low}, {high}], got {value!r}")
        if self.choices is not None and value not in self.choices:
            if self.name == "qtype":
                raise ValueError(f"{method}: qtype must be one of {list(self.choices)}, got {value!r}")
            expected = " or ".join(map(repr, self.choices))
            raise ValueError(f"{method}: {self.name} must be {expected}, got {value!r}")
        return value


def _within(value: Any, bounds: tuple[float, float] | None) -> bool:
    return bounds is None or bounds[0] <= value <= bounds[1]


@dataclass(frozen=True)
class Method:
    """One calibration method."""

    name: str
    help: str
    ort: CalibrationMethod | None = None  # onnxruntime's enum, for ORT's own methods
    # what it reads: "minmax" (ranges), "exact" (ORT's histogram or the stream), "stream", "isotone"
    # (the per-row top-two summaries collected beside the stream)
    histogram: str = "stream"
    options: tuple[Option, ...] = field(default_factory=tuple)
    # ORT's options that change what its calibrator collects, which no state holds (MinMax's
    # averaging and chunking): create_calibrator and the command line take them, compute does not
    collect_options: tuple[Option, ...] = field(default_factory=tuple)
    colour: str | None = None  # its colour in ``histocal report``; None: not in the report
    label: str | None = None  # its name in the report, if not ``name``

    @property
    def report_label(self) -> str:
        return self.label or self.name

    @property
    def defaults(self) -> dict[str, Any]:
        return {o.name: o.default for o in self.options}

    @property
    def calibrator_defaults(self) -> dict[str, Any]:
        """Every option its calibrator takes, with ORT's defaults (``create_calibrator``'s)."""
        return {o.name: o.default for o in (*self.options, *self.collect_options)}

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def summaries(self, options: Mapping[str, Any]) -> frozenset[str]:
        """The summaries this method with ``options`` reads beside the streaming histogram: isotone's
        per-row pairs, or pow2's per-batch votes for its most-common choice."""
        if self.histogram == ISOTONE:
            return frozenset({ISOTONE})
        key, value = POW2_VOTING
        return frozenset({POW2_VOTES}) if self.name == "pow2" and options.get(key) == value else frozenset()


def _symmetric(default: bool) -> Option:
    return Option("symmetric", bool, default, "symmetric ranges")


def _num_bins(default: int) -> Option:
    return Option("num_bins", int, default, "histogram bins", bounds=(1, MAX_BINS))


def _qtype(choices: tuple[str, ...] = QTYPES) -> Option:
    return Option("qtype", str, "int8", "target type of the error model; quantize: the activation type", choices)


_NUM_QUANTIZED_BINS = Option("num_quantized_bins", int, 128, "quantized bins", bounds=(1, MAX_BINS))

# ORT's methods: options and defaults as onnxruntime's create_calibrator (what quantize_static uses).
ORT_TABLE = (
    Method(
        "minmax",
        "the data's min and max",
        CalibrationMethod.MinMax,
        "minmax",
        (_symmetric(False),),
        collect_options=(
            Option("moving_average", bool, False, "moving average of the batches' ranges"),
            Option("averaging_constant", float, 0.01, "moving-average constant"),
            Option("max_intermediate_outputs", int, None, "fold the ranges every N batches (default: at the end)"),
        ),
        colour="#6b6b6b",
    ),
    Method(
        "entropy",
        "ORT's KL-divergence threshold (TensorRT style)",
        CalibrationMethod.Entropy,
        "exact",
        (_symmetric(False), _num_bins(128), _NUM_QUANTIZED_BINS),
        colour="#1f77b4",
    ),
    Method(
        "percentile",
        "a percentile of the values (|x| when symmetric)",
        CalibrationMethod.Percentile,
        "exact",
        (_symmetric(True), _num_bins(2048), Option("percentile", float, 99.999, "the percentile", bounds=(0, 100))),
        colour="#2ca02c",
    ),
    Method(
        "distribution",
        "ORT's distribution ranges (float8)",
        CalibrationMethod.Distribution,
        "exact",
        (_num_bins(2048), Option("scenario", str, "same", "scenario", SCENARIOS)),
    ),
)
# histocal's methods: ranges computed from the streaming histogram.
HISTOCAL_TABLE = (
    Method(
        "mse", "the range with the least quantization error", options=(_qtype(), _symmetric(False)), colour="#d62728"
    ),
    Method(
        "kl",
        "KL-divergence threshold on the streaming histogram",
        options=(_num_bins(2048), _NUM_QUANTIZED_BINS),
        colour="#9467bd",
    ),
    Method(
        "pow2",
        "power-of-two scales (AMD Quark)",
        options=(
            _qtype(POW2_QTYPES),
            Option("pow2_method", str, POW2_METHODS[1], "scale choice", POW2_METHODS),
            Option(
                "minmse_mode",
                str,
                MINMSE_MODES[0],
                "MinMSE over all data, or the most common per-batch choice",
                MINMSE_MODES,
            ),
        ),
        colour="#ff7f0e",
        label=f"pow2 ({MIN_MSE}, {ALL_DATA})",
    ),
    Method(
        "auto",
        "per tensor, the candidate with the least quantization error",
        options=(_qtype(), _symmetric(False)),
        colour="#111111",
    ),
    Method(
        "isotone",
        "the scale that keeps each row's top value above its second (PPQ; last axis = classes)",
        histogram="isotone",
        options=(_qtype(), _symmetric(False)),
        colour="#17becf",
    ),
)
TABLE: dict[str, Method] = {m.name: m for m in ORT_TABLE + HISTOCAL_TABLE}
ORT_METHODS = tuple(m.name for m in ORT_TABLE)
HISTOCAL_METHODS = tuple(m.name for m in HISTOCAL_TABLE)
# Every option of every built-in method, as the state file and the command line know them.
ALL_OPTIONS: dict[str, Option] = {o.name: o for m in TABLE.values() for o in m.options}
# The options only a calibrator takes (no state holds them), as the command line knows them.
COLLECT_OPTIONS: dict[str, Option] = {o.name: o for m in TABLE.values() for o in m.collect_options}


def summaries_for(method: str, options: Mapping[str, Any]) -> frozenset[str]:
    """The summaries ``method`` with ``options`` needs collected beside the streaming histogram
    (none for a method outside the table, such as a registered one).

    Args:
        method: a method's canonical name.
        options: its options as given (a default is not a vote).

    Returns:
        Summary names, each registered in the core (``pow2_votes``, ``isotone``).
    """
    row = TABLE.get(method)
    return row.summaries(options) if row is not None else frozenset()
