"""Type stubs for histocal's compiled core (rust/src/bindings.rs)."""

from collections.abc import Sequence

import numpy as np

#: The most bins a histogram may have (ORT-shaped histograms: ``num_bins`` and growth).
MAX_BINS: int
#: How many exponents a pow2 vote can have.
POW2_EXPONENTS: int

class Histograms:
    def __init__(self, kind: str, num_bins: int) -> None: ...
    def collect(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None: ...
    def scan(
        self, items: Sequence[tuple[str, Sequence[np.ndarray]]], stream: StreamHistograms | None = None
    ) -> None: ...
    def plan(self) -> None: ...
    def count(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None: ...
    def names(self) -> list[str]: ...
    def state(
        self, name: str
    ) -> tuple[
        np.ndarray,
        np.ndarray,
        tuple[float, bool],
        tuple[float, bool],
        tuple[float, bool] | None,
        str,
    ]: ...
    def counts(self, name: str) -> tuple[int, int, int, int, int]: ...
    def edge_dtype(self, name: str) -> str: ...
    def entropy(self, num_quantized_bins: int) -> list[tuple[str, int, int]]: ...
    def percentile(self, percentile: float, symmetric: bool) -> list[tuple[str, int, int]]: ...
    def distribution(self) -> list[tuple[str, float, float]]: ...

class StreamHistograms:
    def __init__(self, num_bins: int, pow2_votes: bool = False) -> None: ...
    @property
    def num_bins(self) -> int: ...
    @property
    def pow2_votes(self) -> bool: ...
    def export(
        self, name: str
    ) -> tuple[
        str, int | None, np.ndarray, float | None, float | None, float | None, tuple[int, int, int, int, int]
    ]: ...
    def summary(
        self, name: str
    ) -> tuple[str, int | None, float | None, float | None, float | None, tuple[int, int, int, int, int]]: ...
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
    def votes(self, name: str) -> list[tuple[int, int, int]] | None: ...
    def restore_votes(self, name: str, votes: Sequence[tuple[int, int, int]] | None) -> None: ...
    def collect(self, items: Sequence[tuple[str, Sequence[np.ndarray]]]) -> None: ...
    def names(self) -> list[str]: ...
    def to_histograms(self, kind: str, num_bins: int) -> Histograms: ...
    def counts(self, name: str) -> tuple[int, int, int, int, int]: ...
    def ranges(
        self,
        method: str,
        names: Sequence[str] | None = None,
        *,
        scale_rule: str,
        qtype: str = "int8",
        symmetric: bool = False,
        num_bins: int = 2048,
        num_quantized_bins: int = 128,
        pow2_method: str = "MinMSE",
        minmse_mode: str = "All",
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
def tensor_stats(
    arr: np.ndarray,
) -> tuple[float | None, float | None, float | None, float | None, int, int, int, int]: ...
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
    qtype: str = "int8",
    symmetric: bool = False,
    num_bins: int = 2048,
    num_quantized_bins: int = 128,
    pow2_method: str = "MinMSE",
    minmse_mode: str = "All",
    votes: Sequence[tuple[int, int]] | None = None,
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
) -> tuple[float, int]: ...
def pow2_error(
    counts: np.ndarray,
    left: float,
    width: float,
    min: float,
    max: float,
    exponent: int,
    qtype: str,
) -> float: ...
