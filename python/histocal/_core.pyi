"""Type stubs for histocal's compiled core (rust/src/python/), checked by mypy.stubtest."""

from collections.abc import Mapping, Sequence
from typing import ClassVar, TypedDict, final

import numpy as np
from typing_extensions import Unpack

__version__: str

# The range methods' options (histocal's method table), keyword arguments of ``histogram_range``
# and ``StreamHistograms.ranges``; each method reads its own, the rest keep these defaults.
class _MethodOptions(TypedDict, total=False):
    qtype: str  # "int8"
    symmetric: bool  # False
    num_bins: int  # 2048
    num_quantized_bins: int  # 128
    pow2_method: str  # "MinMSE"
    minmse_mode: str  # "All"

__all__ = [
    "ISOTONE_MAX_PAIRS",
    "MAX_BINS",
    "POW2_EXPONENTS",
    "BinRange",
    "HistogramState",
    "Histograms",
    "Moments",
    "ScaleZeroPoint",
    "StreamExport",
    "StreamHistograms",
    "StreamSummary",
    "TensorCounts",
    "TensorStats",
    "__version__",
    "channel_min_max",
    "get_num_threads",
    "histogram_qerror",
    "histogram_range",
    "nanmean_pairwise",
    "nanmean_sequential",
    "pow2_error",
    "quark_histogram_counts",
    "quark_pow2_error_sums",
    "scale_zero_point",
    "set_caller_threads",
    "set_num_threads",
    "tensor_stats",
]

#: The most distinct top-two pairs a tensor's isotone summary may hold (24 bytes each).
ISOTONE_MAX_PAIRS: int
#: The most bins a histogram may have (ORT-shaped histograms: ``num_bins`` and growth).
MAX_BINS: int
#: How many exponents a pow2 vote can have.
POW2_EXPONENTS: int

# Named records: frozen, read by field; equal (and hashed) by their fields, within one class.
class _Record:
    _fields: ClassVar[list[str]]
    def __hash__(self) -> int: ...

@final
class TensorCounts(_Record):
    @property
    def n_finite(self) -> int: ...
    @property
    def n_nan(self) -> int: ...
    @property
    def n_posinf(self) -> int: ...
    @property
    def n_neginf(self) -> int: ...
    @property
    def batches(self) -> int: ...

@final
class HistogramState(_Record):
    @property
    def hist(self) -> np.ndarray: ...
    @property
    def edges(self) -> np.ndarray: ...
    @property
    def min(self) -> tuple[float, bool]: ...
    @property
    def max(self) -> tuple[float, bool]: ...
    @property
    def threshold(self) -> tuple[float, bool] | None: ...
    @property
    def dtype(self) -> str: ...

@final
class StreamSummary(_Record):
    @property
    def dtype(self) -> str: ...
    @property
    def level(self) -> int | None: ...
    @property
    def finite_min(self) -> float | None: ...
    @property
    def finite_max(self) -> float | None: ...
    @property
    def abs_min(self) -> float | None: ...
    @property
    def counts(self) -> tuple[int, int, int, int, int]: ...

@final
class StreamExport(_Record):
    @property
    def dtype(self) -> str: ...
    @property
    def level(self) -> int | None: ...
    @property
    def bins(self) -> np.ndarray: ...
    @property
    def finite_min(self) -> float | None: ...
    @property
    def finite_max(self) -> float | None: ...
    @property
    def abs_min(self) -> float | None: ...
    @property
    def counts(self) -> tuple[int, int, int, int, int]: ...

@final
class BinRange(_Record):
    @property
    def name(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...

@final
class Moments(_Record):
    @property
    def name(self) -> str: ...
    @property
    def avg(self) -> float: ...
    @property
    def std(self) -> float: ...

@final
class TensorStats(_Record):
    @property
    def nanmin(self) -> float | None: ...
    @property
    def nanmax(self) -> float | None: ...
    @property
    def finite_min(self) -> float | None: ...
    @property
    def finite_max(self) -> float | None: ...
    @property
    def n_finite(self) -> int: ...
    @property
    def n_nan(self) -> int: ...
    @property
    def n_posinf(self) -> int: ...
    @property
    def n_neginf(self) -> int: ...

@final
class ScaleZeroPoint(_Record):
    @property
    def scale(self) -> float: ...
    @property
    def zero_point(self) -> int: ...

@final
class Histograms:
    def __new__(cls, kind: str, num_bins: int) -> Histograms: ...
    @property
    def kind(self) -> str: ...
    @property
    def num_bins(self) -> int: ...
    def copy(self) -> Histograms: ...
    def collect(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None: ...
    def scan(
        self, items: Sequence[tuple[str, Sequence[np.ndarray]]], stream: StreamHistograms | None = None
    ) -> None: ...
    def plan(self) -> None: ...
    def pending_scans(
        self,
    ) -> list[
        tuple[str, str, tuple[float | None, float | None, float | None, float | None], tuple[int, int, int, int], int]
    ]: ...
    def add_scans(
        self,
        scans: Sequence[
            tuple[
                str, str, tuple[float | None, float | None, float | None, float | None], tuple[int, int, int, int], int
            ]
        ],
    ) -> None: ...
    def count(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None: ...
    def names(self) -> list[str]: ...
    def state(self, name: str) -> HistogramState: ...
    def unchanged(
        self,
        name: str,
        hist: np.ndarray,
        edges: np.ndarray,
        min: float,
        max: float,
        threshold: float | None = None,
    ) -> bool: ...
    def restore(
        self,
        name: str,
        dtype: str,
        hist: np.ndarray,
        edges: np.ndarray,
        min: tuple[float, bool],
        max: tuple[float, bool],
        threshold: tuple[float, bool] | None,
        counts: tuple[int, int, int, int, int],
    ) -> None: ...
    def counts(self, name: str) -> TensorCounts: ...
    def dtypes(self, name: str) -> tuple[str, str]: ...
    def binned_totals(self) -> list[tuple[str, int, bool]]: ...
    def entropy(self, num_quantized_bins: int) -> list[BinRange]: ...
    def percentile(self, percentile: float, symmetric: bool) -> list[BinRange]: ...
    def distribution(self) -> list[Moments]: ...

@final
class StreamHistograms:
    def __new__(cls, num_bins: int, summaries: Sequence[str] = ...) -> StreamHistograms: ...
    def copy(self) -> StreamHistograms: ...
    @property
    def summaries(self) -> list[str]: ...
    def export_summary(self, name: str, summary: str) -> dict[str, np.ndarray] | None: ...
    def restore_summary(self, name: str, summary: str, parts: Mapping[str, np.ndarray]) -> None: ...
    @property
    def num_bins(self) -> int: ...
    def export(self, name: str) -> StreamExport: ...
    def summary(self, name: str) -> StreamSummary: ...
    def restore(
        self,
        name: str,
        dtype: str,
        level: int | None,
        bins: np.ndarray,
        finite_min: float | None,
        finite_max: float | None,
        abs_min: float | None,
        counts: tuple[int, int, int, int, int],
    ) -> None: ...
    def merge(self, other: StreamHistograms) -> None: ...
    def summary_bytes(self, summary: str) -> int: ...
    def summary_ranges(
        self, summary: str, names: Sequence[str] | None = None, *, qtype: str = "int8", symmetric: bool = False
    ) -> list[tuple[float, float, dict[str, int]]]: ...
    def collect(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None: ...
    def collect_channels(self, items: Sequence[tuple[Sequence[str], Sequence[np.ndarray]]], axis: int) -> None: ...
    def names(self) -> list[str]: ...
    def to_histograms(self, kind: str, num_bins: int, names: Sequence[str] | None = None) -> Histograms: ...
    def counts(self, name: str) -> TensorCounts: ...
    def ranges(
        self,
        method: str,
        names: Sequence[str] | None = None,
        *,
        scale_rule: str,
        **options: Unpack[_MethodOptions],
    ) -> list[tuple[float, float]]: ...
    def qerrors(
        self,
        names: Sequence[str],
        ranges: Sequence[tuple[float, float]],
        *,
        scale_rule: str,
        qtype: str = "int8",
        symmetric: bool = False,
    ) -> list[float]: ...

def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def set_caller_threads(n: int) -> None: ...
def tensor_stats(arr: np.ndarray) -> TensorStats: ...
def channel_min_max(arr: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]: ...
def nanmean_pairwise(values: np.ndarray) -> float: ...
def nanmean_sequential(values: np.ndarray) -> float: ...
def histogram_range(
    method: str,
    counts: np.ndarray,
    left: float,
    width: float,
    min: float,
    max: float,
    *,
    scale_rule: str,
    dtype: str = "float32",
    votes: Sequence[tuple[int, int]] | None = None,
    **options: Unpack[_MethodOptions],
) -> tuple[float, float]: ...
def histogram_qerror(
    counts: np.ndarray,
    left: float,
    width: float,
    min: float,
    max: float,
    low: float,
    high: float,
    *,
    scale_rule: str,
    dtype: str = "float32",
    qtype: str = "int8",
    symmetric: bool = False,
) -> float: ...
def scale_zero_point(
    low: float,
    high: float,
    *,
    scale_rule: str,
    dtype: str = "float32",
    qtype: str = "int8",
    symmetric: bool = False,
) -> ScaleZeroPoint: ...
def pow2_error(
    counts: np.ndarray,
    left: float,
    width: float,
    min: float,
    max: float,
    exponent: int,
    qtype: str,
) -> float: ...
def quark_pow2_error_sums(
    values: np.ndarray,
    scales: list[float],
    zero_point: float,
    qmin: float,
    qmax: float,
) -> list[float]: ...
def quark_histogram_counts(
    values: np.ndarray,
    num_bins: int,
    first: float,
    last: float,
) -> np.ndarray: ...
