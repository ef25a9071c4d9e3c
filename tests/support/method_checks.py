"""Tolerances and checks shared by the method tests (tests/methods/test_methods*.py): the kernels
called under the installed onnxruntime's scale rule, closeness of errors in bin coordinates, and
check_choice (a search's choice against the reference's errors and the spec's tie rule)."""

from __future__ import annotations

import math

import numpy as np

from .method_refs import Hist

REL = 1e-9
ABS = 1e-300
QTYPES = ["int8", "uint8", "int16", "uint16"]
POW2_QTYPES = ["int8", "uint8", "int16"]


def _core():
    from histocal import _core

    return _core


def kernel_range(method: str, *args, **kwargs) -> tuple[float, float]:
    """``histogram_range`` under the installed onnxruntime's scale rule."""
    from histocal.methods.scale_rule import SCALE_RULE

    return _core().histogram_range(method, *args, scale_rule=SCALE_RULE, **kwargs)


def kernel_qerror(*args, **kwargs) -> float:
    """``histogram_qerror`` under the installed onnxruntime's scale rule."""
    from histocal.methods.scale_rule import SCALE_RULE

    return _core().histogram_qerror(*args, scale_rule=SCALE_RULE, **kwargs)


def close(a: float, b: float, rel: float = REL) -> bool:
    if a == b:
        return True
    return abs(a - b) <= rel * max(abs(a), abs(b)) + ABS


# The kernels place values and quantization levels in bin coordinates ((x - left) / width), so each
# value's error x - dequantize(x) carries an absolute rounding error of a few ulps of the
# histogram's magnitude X = max|edge|; a mean squared error E then moves by up to
# 2 sqrt(E) * that (Cauchy-Schwarz). This matters only where E is tiny (a range that represents the
# data almost exactly, e.g. a one-value histogram with range (x, x)): there relative accuracy is
# impossible for any implementation that does not subtract x - dequantize(x) directly.
COORD_ULPS = 64


def error_tol(h: Hist, e: float) -> float:
    """Allowed |kernel - reference| for a mean squared error e on histogram h."""
    x = max(abs(h.left), abs(h.left + len(h.counts) * h.width), abs(h.mn), abs(h.mx))
    return REL * abs(e) + 2 * math.sqrt(abs(e)) * COORD_ULPS * np.finfo(np.float64).eps * x + ABS


def err_close(h: Hist, got: float, want: float) -> bool:
    return got == want or abs(got - want) <= error_tol(h, max(abs(got), abs(want)))


# KL divergences are O(1) sums of up to num_bins terms P ln(P/Q); where P == Q in exact arithmetic
# (e.g. every candidate below the data's extent with one bin per group) both computations give
# rounding noise of either sign around 0 (~1e-17): an absolute tolerance far above that noise.
KL_ABS = 1e-12


def check_choice(
    errors: np.ndarray,
    chosen: int,
    rule_pick: int,
    what: str,
    h: Hist | None = None,
    abs_tol: float = ABS,
    strict_zero: bool = True,
) -> None:
    """The chosen candidate's reference error is the minimum (1e-9 relative + abs_tol, or for an
    error model on histogram h, error_tol); when the minimum is an exact zero (no float
    ambiguity), the spec's tie rule decides (rule_pick)."""
    m = float(np.min(errors))
    e = float(errors[chosen])
    tol = error_tol(h, m) if h is not None else REL * abs(m) + abs_tol
    assert e <= m + tol, (
        f"{what}: chosen candidate #{chosen} has reference error {e!r}, the minimum is {m!r} "
        f"at #{rule_pick} (relative excess {(e - m) / m if m else math.inf:.3g})"
    )
    if m == 0.0 and strict_zero:
        assert chosen == rule_pick, f"{what}: zero-error tie: chose #{chosen}, the spec's tie rule picks #{rule_pick}"
