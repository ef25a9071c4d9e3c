"""The rule of auto's cross-validated choice: which candidate the held-out per-feed output SQNRs
support (``decide``), and the in-sample one (``choose_pooled``). Pure functions of the scores;
the derivation and its measurements are in docs/methods.md ("auto: the model-level choice")."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from onnxruntime.quantization.calibrate import TensorsData


def choose_pooled(sqnr_db: Mapping[str, float]) -> str:
    """The first candidate of the highest pooled SQNR (the in-sample choice)."""
    chosen = next(iter(sqnr_db))
    for label, value in sqnr_db.items():
        if value > sqnr_db[chosen]:
            chosen = label
    return chosen


# The cross-validated choice's rule (``decide``), derived and measured in docs/methods.md.
DEFAULT_CANDIDATE = "minmax"  # ORT's default method: the widest ranges, which clip nothing seen
# Candidates whose ranges cover everything the calibration saw and only grow with the data (ORT's
# MinMax, and its Distribution: +-max |x| rounded up to a bin): cross-validation scores them with
# their ranges from all the data. Fitted on a fold's fewer feeds they would clip the held-out
# feed's extremes, which the final ranges do not, and be underrated against the rest.
ALL_DATA_CANDIDATES = (DEFAULT_CANDIDATE, "distribution")
MIN_GAIN_DB = 0.1  # a feed on which a candidate and the default differ by less says nothing
SIGN_TEST_ALPHA = 0.1  # one-sided sign test: P(this many wins of the informative feeds | no difference)
STANDARD_ERRORS = 1.0  # and the mean gain must beat 0 by this many standard errors
GAIN_CAP_DB = 100.0  # per-feed gains are clipped to +-this (an exact or failed output is +-inf)


@dataclass(frozen=True)
class Evidence:
    """What the held-out feeds say about one candidate against the default: the feeds on which
    they differ by more than ``MIN_GAIN_DB`` (informative), the candidate's wins among them, the
    one-sided sign test's p-value, the mean gain (dB, over all feeds), its standard error."""

    informative: int
    wins: int
    p_value: float
    mean_db: float
    se_db: float
    failed: bool

    def qualifies(self, alpha: float, standard_errors: float) -> bool:
        return not self.failed and self.p_value <= alpha and self.mean_db - standard_errors * self.se_db > 0.0


@dataclass(frozen=True)
class Decision:
    """The cross-validated choice, why, and each candidate's ``Evidence``."""

    label: str
    reason: str
    evidence: dict[str, Evidence]


def feed_gains_db(feed_sqnr_db: Mapping[str, Sequence[float]], default: str) -> dict[str, np.ndarray]:
    """Per candidate, its SQNR minus the default's on each evaluation feed (dB; the signal is the
    same float output for both, so this is 10 log10 of the default's error energy over the
    candidate's). Both exact (+inf): 0; other infinities clipped to +-``GAIN_CAP_DB``."""
    base = np.asarray(feed_sqnr_db[default], np.float64)
    out = {}
    for label, values in feed_sqnr_db.items():
        v = np.asarray(values, np.float64)
        if v.shape != base.shape:
            raise ValueError(f"candidate {label!r} has {v.size} feed scores, the default {base.size}")
        with np.errstate(invalid="ignore"):
            gain = np.where(v == base, 0.0, v - base)  # inf - inf: equal scores gain nothing
        out[label] = np.clip(np.nan_to_num(gain, nan=0.0), -GAIN_CAP_DB, GAIN_CAP_DB)
    return out


def sign_test_p(wins: int, informative: int) -> float:
    """P(at least ``wins`` heads in ``informative`` fair coin flips): the one-sided sign test."""
    return sum(math.comb(informative, k) for k in range(wins, informative + 1)) / 2.0**informative


def min_informative(alpha: float = SIGN_TEST_ALPHA) -> int:
    """The fewest informative feeds on which a candidate can pass the sign test (winning all)."""
    return max(1, math.ceil(math.log2(1.0 / alpha)))


def cannot_qualify(
    gains_db: Sequence[float] | np.ndarray,
    remaining: int,
    min_gain_db: float = MIN_GAIN_DB,
    alpha: float = SIGN_TEST_ALPHA,
) -> bool:
    """Whether a candidate with these per-feed gains over the default (``feed_gains_db``) so far
    fails the sign test whatever it scores on the ``remaining`` feeds. Its best case is to win
    every one of them: a win lowers the p-value, an uninformative feed leaves it, a loss raises
    it (P(Bin(k+1) >= w+1) <= P(Bin(k) >= w) <= P(Bin(k+1) >= w)). So the feeds left need not be
    scored for it: the choice is the same."""
    g = np.asarray(gains_db, np.float64)
    wins = int(np.count_nonzero(g > min_gain_db))
    losses = int(np.count_nonzero(g < -min_gain_db))
    return sign_test_p(wins + remaining, wins + losses + remaining) > alpha


def evidence(
    feed_sqnr_db: Mapping[str, Sequence[float]], default: str, min_gain_db: float = MIN_GAIN_DB
) -> dict[str, Evidence]:
    """Per candidate other than the default, its ``Evidence`` on these per-feed scores."""
    out = {}
    for label, gain in feed_gains_db(feed_sqnr_db, default).items():
        if label == default:
            continue
        informative = int(np.count_nonzero(np.abs(gain) > min_gain_db))
        wins = int(np.count_nonzero(gain > min_gain_db))
        n = len(gain)
        out[label] = Evidence(
            informative,
            wins,
            sign_test_p(wins, informative),
            float(gain.mean()) if n else 0.0,
            float(gain.std(ddof=1)) / math.sqrt(n) if n > 1 else math.inf,
            any(v == -math.inf for v in feed_sqnr_db[label]),
        )
    return out


def decide(
    feed_sqnr_db: Mapping[str, Sequence[float]],
    *,
    default: str | None = None,
    widths: Mapping[str, float] | None = None,
    min_gain_db: float = MIN_GAIN_DB,
    alpha: float = SIGN_TEST_ALPHA,
    standard_errors: float = STANDARD_ERRORS,
    feeds: str = "held-out feeds",
) -> Decision:
    """The cross-validated choice: the default candidate (``DEFAULT_CANDIDATE`` if it is one,
    else the first) unless another has evidence from enough held-out feeds. Per candidate and
    feed, the gain over the default (``feed_gains_db``); a feed on which it is within
    ``min_gain_db`` is uninformative (saturated outputs score alike under every candidate: they
    say nothing about the choice). A candidate qualifies when (1) it wins on so many of its
    informative feeds that a fair coin would do as well with probability at most ``alpha`` (the
    one-sided sign test: at least ``min_informative(alpha)`` informative feeds, all won), (2) its
    mean gain over all feeds is above ``standard_errors`` standard errors, and (3) it failed on
    no feed. Of the qualifying candidates the one of the highest bound ``mean - standard_errors *
    se`` is the best; with ``widths`` (``range_widths``), the widest of the qualifying
    candidates whose mean is within one standard error of the best's is chosen. The reason
    says which held or failed, calling the feeds ``feeds``."""
    if not feed_sqnr_db:
        raise ValueError("the choice needs at least one candidate")
    if default is None:
        default = DEFAULT_CANDIDATE if DEFAULT_CANDIDATE in feed_sqnr_db else next(iter(feed_sqnr_db))
    ev = evidence(feed_sqnr_db, default, min_gain_db)
    qualifying = {label: e for label, e in ev.items() if e.qualifies(alpha, standard_errors)}
    n = len(next(iter(feed_sqnr_db.values())))
    if not qualifying:
        return Decision(default, _kept_reason(default, ev, n, min_gain_db, alpha, feeds), ev)

    def bound(label: str) -> float:
        return qualifying[label].mean_db - standard_errors * qualifying[label].se_db

    best = max(qualifying, key=bound)  # the first of equal bounds
    chosen = best
    if widths is not None:
        near = [
            label for label, e in qualifying.items() if e.mean_db >= qualifying[best].mean_db - qualifying[best].se_db
        ]
        chosen = max(near, key=lambda label: widths.get(label, -math.inf))
    e = ev[chosen]
    reason = (
        f"{chosen} won on {e.wins} of the {e.informative} of {n} {feeds} on which it differs from {default} "
        f"by more than {min_gain_db:g} dB (sign test p = {e.p_value:.3g} <= {alpha:g}), mean gain "
        f"{e.mean_db:+.2f} dB (standard error {e.se_db:.2f})"
    )
    return Decision(chosen, reason, ev)


def _kept_reason(default: str, ev: Mapping[str, Evidence], n: int, min_gain_db: float, alpha: float, feeds: str) -> str:
    if not ev:
        return f"kept {default}: no other candidate"
    top = max(ev, key=lambda label: (-ev[label].p_value, ev[label].mean_db))
    e = ev[top]
    need = min_informative(alpha)
    if e.failed:
        why = "it failed on a feed"
    elif e.informative < need:
        why = (
            f"only {e.informative} of {n} {feeds} tell it from {default} by more than {min_gain_db:g} dB "
            f"(the others score alike), and the sign test needs at least {need}"
        )
    elif e.p_value > alpha:
        why = f"it won on {e.wins} of the {e.informative} informative feeds (sign test p = {e.p_value:.3g} > {alpha:g})"
    else:
        why = f"its mean gain {e.mean_db:+.2f} dB is within the standard error {e.se_db:.2f} dB of 0"
    return f"kept {default}: the strongest other candidate, {top}, has too little evidence: {why}"


def choose_robust(
    feed_sqnr_db: Mapping[str, Sequence[float]],
    *,
    default: str | None = None,
    standard_errors: float = STANDARD_ERRORS,
    widths: Mapping[str, float] | None = None,
) -> str:
    """``decide``'s label."""
    return decide(feed_sqnr_db, default=default, standard_errors=standard_errors, widths=widths).label


def range_widths(candidates: Mapping[str, TensorsData]) -> dict[str, float]:
    """Per candidate, how wide its ranges are: the mean over tensors of ``log2(max(high, 0) -
    min(low, 0))`` (the span a quantizer's range must cover, zero included), over the tensors
    every candidate has (the recipe computes some only for the tensors its placement quantizes)
    whose span is finite and positive."""
    out = {}
    shared: set[str] | None = None
    for ranges in candidates.values():
        shared = set(ranges.data) if shared is None else shared & set(ranges.data)
    for label, ranges in candidates.items():
        logs = []
        for name, d in ranges.data.items():
            if shared is None or name not in shared:
                continue
            low, high = float(np.min(d.lowest)), float(np.max(d.highest))
            span = max(high, 0.0) - min(low, 0.0)
            if 0.0 < span < math.inf:
                logs.append(math.log2(span))
        out[label] = float(np.mean(logs)) if logs else -math.inf
    return out
