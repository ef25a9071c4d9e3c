"""argparse types of the command line's values: integers within bounds, finite numbers, shapes."""

from __future__ import annotations

import argparse
import math

# The largest integer an option takes: what the Rust kernels and numpy index with (int64).
MAX_INT = 2**63 - 1


def int_at_least(minimum: int, text: str, maximum: int = MAX_INT) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum and maximum == MAX_INT:
        raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
    if not minimum <= value <= maximum:
        raise argparse.ArgumentTypeError(f"expected an integer in [{minimum}, {maximum}], got {value}")
    return value


def bin_count(text: str) -> int:
    """A histogram's bin count: at most what histocal's histograms take (``_core.MAX_BINS``)."""
    from .._core import MAX_BINS

    return int_at_least(1, text, MAX_BINS)


def positive_int(text: str) -> int:
    return int_at_least(1, text)


def fold_count(text: str) -> int:
    return int_at_least(2, text)


def non_negative_int(text: str) -> int:
    return int_at_least(0, text)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def number_in(bounds: tuple[float, float] | None, what: str, text: str) -> float:
    value = finite_float(text)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        raise argparse.ArgumentTypeError(f"expected a {what} in [{bounds[0]}, {bounds[1]}], got {value}")
    return value


def input_shape(text: str) -> str:
    dims = [d.strip() for d in text.split(",")]
    for d in dims:
        if d not in ("?", "None"):
            try:
                int(d)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated ints ('?' or <= 0: dynamic), got {text!r}"
                ) from None
    return text
