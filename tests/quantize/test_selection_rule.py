"""The rule of auto's cross-validated choice (``selection.choose_robust``), on per-feed scores
alone (no model): properties of the rule, and the cases that motivated it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
from support.profiles import examples

from histocal.quantize import selection
from histocal.quantize.selection import choose_robust

LABELS = ["per-tensor estimate", "minmax", "percentile 99.99", "entropy 128", "mse"]
score = st.floats(min_value=-20.0, max_value=60.0, allow_nan=False)


@st.composite
def feed_scores(draw, n_min: int = 2, n_max: int = 16) -> dict[str, list[float]]:
    n = draw(st.integers(n_min, n_max))
    labels = draw(st.lists(st.sampled_from(LABELS), min_size=1, max_size=len(LABELS), unique=True))
    if "minmax" not in labels:
        labels.append("minmax")
    return {label: draw(st.lists(score, min_size=n, max_size=n)) for label in labels}


def _bound(gain: np.ndarray) -> float:
    return float(gain.mean() - selection.STANDARD_ERRORS * gain.std(ddof=1) / math.sqrt(len(gain)))


def _sign_p(gain: np.ndarray) -> float:
    """The one-sided sign test, spelled out: wins among the feeds beyond MIN_GAIN_DB."""
    informative = gain[np.abs(gain) > selection.MIN_GAIN_DB]
    wins, n = int(np.sum(informative > 0)), len(informative)
    return sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n


def _qualifies(scores: dict, label: str) -> bool:
    gain = selection.feed_gains_db(scores, "minmax")[label]
    return (
        _bound(gain) > 0 and _sign_p(gain) <= selection.SIGN_TEST_ALPHA and all(v != -math.inf for v in scores[label])
    )


@settings(max_examples=examples(100))
@given(feed_scores())
def test_the_choice_qualifies_and_has_the_best_bound(scores):
    """The chosen candidate is the default or one that passes the sign test on its informative
    feeds and whose gain over the default has a positive lower bound (mean minus
    STANDARD_ERRORS standard errors); no qualifying candidate has a higher bound."""
    chosen = choose_robust(scores)
    gains = selection.feed_gains_db(scores, "minmax")
    assert chosen in scores
    qualifying = {label: _bound(gains[label]) for label in scores if label != "minmax" and _qualifies(scores, label)}
    if chosen != "minmax":
        assert chosen in qualifying and gains[chosen].mean() > 0
        assert qualifying[chosen] == pytest.approx(max(qualifying.values()))
    else:
        assert not qualifying


@settings(max_examples=examples(50))
@given(feed_scores(), st.lists(st.floats(-30.0, 30.0), min_size=16, max_size=16))
def test_only_the_gain_over_the_default_on_each_feed_counts(scores, shifts):
    """Shifting every candidate's score on a feed by the same amount (a feed whose signal is
    larger or smaller) changes nothing: the rule reads paired per-feed gains."""
    shifted = {label: [v + s for v, s in zip(values, shifts)] for label, values in scores.items()}
    gains, shifted_gains = (selection.feed_gains_db(x, "minmax") for x in (scores, shifted))
    for label in scores:
        np.testing.assert_allclose(gains[label], shifted_gains[label], atol=1e-9)
    assert choose_robust(shifted) == choose_robust(scores) or any(
        abs(_bound(gains[a]) - _bound(gains[b])) < 1e-9 for a in scores for b in scores if a != b
    )


@settings(max_examples=examples(50))
@given(feed_scores(n_min=selection.min_informative()), st.floats(0.5, 20.0))
def test_a_candidate_better_on_every_feed_by_a_margin_beats_the_default(scores, margin):
    """A candidate that beats the default by at least ``margin`` on every one of at least
    ``min_informative()`` feeds qualifies, so the default is never kept against it."""
    scores = dict(scores)
    scores["better"] = [v + margin for v in scores["minmax"]]
    assert choose_robust(scores) != "minmax"


@settings(max_examples=examples(50))
@given(feed_scores(n_min=2), st.integers(0, 15))
def test_a_failed_feed_disqualifies(scores, worst):
    n = len(scores["minmax"])
    failed = dict(scores, great=[-math.inf if i == worst % n else v + 30.0 for i, v in enumerate(scores["minmax"])])
    assert choose_robust(failed) != "great"


@settings(max_examples=examples(100))
@given(st.lists(st.sampled_from([-5.0, -0.05, 0.0, 0.05, 5.0]), min_size=1, max_size=16), st.data())
def test_a_candidate_that_cannot_qualify_never_does(prefix, data):
    """``cannot_qualify``: then no scores on the remaining feeds make it pass the sign test (so
    auto may stop scoring it); when it can still qualify, winning every remaining feed does."""
    remaining = data.draw(st.integers(0, 12))
    rest = data.draw(st.lists(st.floats(-60.0, 60.0), min_size=remaining, max_size=remaining))
    gains = prefix + rest
    scores = {"minmax": [0.0] * len(gains), "c": gains}
    e = selection.evidence(scores, "minmax")["c"]
    if selection.cannot_qualify(prefix, remaining):
        assert e.p_value > selection.SIGN_TEST_ALPHA
    else:
        best = selection.evidence({"minmax": [0.0] * len(gains), "c": prefix + [5.0] * remaining}, "minmax")["c"]
        assert best.p_value <= selection.SIGN_TEST_ALPHA


def test_the_default_is_kept_without_a_consistent_gain():
    # The issue's case, in small: percentile wins the pooled score on 8 feeds thanks to one
    # feed and loses on the others, so minmax stays.
    scores = {
        "minmax": [16.0, 15.5, 16.2, 15.8, 16.1, 15.9, 16.0, 15.7],
        "percentile 99.99": [33.0, 15.0, 16.0, 15.0, 16.0, 12.9, 15.5, 15.2],
    }
    assert selection.choose_pooled({k: float(np.mean(v)) for k, v in scores.items()}) == "percentile 99.99"
    assert choose_robust(scores) == "minmax"
    # A steady gain on every feed is taken, even a smaller one.
    scores["entropy 128"] = [v + 0.5 + 0.1 * (i % 3) for i, v in enumerate(scores["minmax"])]
    assert choose_robust(scores) == "entropy 128"
    # Of two steady gains, the higher bound wins; a higher mean carried by one feed does not.
    scores["mse"] = [v + (6.0 if i == 0 else 0.2) for i, v in enumerate(scores["minmax"])]
    assert float(np.mean(scores["mse"])) > float(np.mean(scores["entropy 128"]))
    assert choose_robust(scores) == "entropy 128"


@settings(max_examples=examples(100))
@given(
    st.integers(1, 16),
    st.integers(0, selection.min_informative() - 1),
    st.floats(0.2, 60.0),
    st.floats(-20.0, 60.0),
)
def test_too_few_informative_feeds_keep_the_default(n, informative, gain, level):
    """Feeds on which every candidate scores alike (saturated outputs) carry no evidence: with
    fewer than ``min_informative()`` feeds that tell a candidate from the default, however large
    its gain there, the default stays, and the reason says so."""
    informative = min(informative, n)
    scores = {
        "minmax": [level] * n,
        "percentile 99.999": [level + (gain if i < informative else 0.0) for i in range(n)],
    }
    decision = selection.decide(scores)
    assert decision.label == "minmax"
    assert decision.evidence["percentile 99.999"].informative == informative
    assert f"only {informative} of {n} held-out feeds" in decision.reason


def test_the_issue_27_case():
    """A 2-class classifier, 8 feeds: 6 saturated (every candidate 48.13 dB), 2 informative, one
    favouring percentile 99.999 by 12.7 dB. The 4-fold pooled score chose percentile; the rule
    keeps minmax and says that 2 feeds are too few."""
    sat = [48.13] * 6
    scores = {
        "minmax": [*sat, 14.0, 20.0],
        "percentile 99.99": [*sat, 20.0, 19.0],
        "percentile 99.999": [*sat, 26.7, 19.5],
        "mse": [*sat, 25.0, 18.0],
    }
    assert (
        selection.choose_pooled({k: -10 * math.log10(np.mean(10 ** (-np.array(v) / 10))) for k, v in scores.items()})
        != "minmax"
    )
    decision = selection.decide(scores)
    assert decision.label == "minmax"
    assert "only 2 of 8 held-out feeds" in decision.reason


def test_exact_outputs_and_default_choice():
    # Both exact on a feed: that feed gains nothing; the first candidate is the default when
    # there is no minmax.
    assert choose_robust({"minmax": [math.inf, 10.0], "a": [math.inf, 10.0]}) == "minmax"
    assert choose_robust({"a": [10.0] * 4, "b": [12.0, 12.5, 12.0, 12.5]}) == "b"
    assert choose_robust({"a": [10.0] * 4, "b": [12.0, 12.5, 12.0, 12.5]}, default="b") == "b"
    with pytest.raises(ValueError):
        choose_robust({})
    with pytest.raises(ValueError, match="feed scores"):
        choose_robust({"minmax": [1.0, 2.0], "a": [1.0]})


@settings(max_examples=examples(100))
@given(feed_scores(), st.data())
def test_with_widths_the_widest_of_the_near_best_is_chosen(scores, data):
    """With widths: the choice qualifies (positive bound), its mean gain is within one standard
    error of the mean of the best-bound candidate, and no other such candidate is wider."""
    widths = {label: data.draw(st.floats(-10.0, 10.0)) for label in scores}
    chosen = choose_robust(scores, widths=widths)
    best = choose_robust(scores)
    gains = selection.feed_gains_db(scores, "minmax")
    if best == "minmax":
        assert chosen == "minmax"
        return
    n = len(scores["minmax"])
    se = {label: float(g.std(ddof=1)) / math.sqrt(n) for label, g in gains.items()}
    near = [
        label
        for label in scores
        if label != "minmax"
        and _bound(gains[label]) > 0
        and gains[label].mean() >= gains[best].mean() - se[best] - 1e-12
    ]
    near = [label for label in near if _qualifies(scores, label)]
    assert chosen in near and best in near
    assert widths[chosen] == max(widths[label] for label in near)


def test_near_tied_gains_go_to_the_widest_ranges():
    # A recognizer at 32 samples, in small: three candidates gain about 1.2 dB over minmax with
    # a spread of about 0.3 dB; cross-validation cannot order them, new inputs did (the widest,
    # percentile 99.999, was the best of the three there).
    base = [16.0, 17.0, 15.5, 16.5, 16.2, 15.8, 16.9, 16.1]
    noise = [0.75, -0.5, 1.25, -1.0, 0.25, 1.5, -0.75, 0.0]
    scores = {
        "minmax": base,
        "percentile 99.99": [b + 1.3 + e for b, e in zip(base, noise)],
        "percentile 99.999": [b + 1.15 + e for b, e in zip(base, noise[::-1])],
        "mse": [b + 1.1 + e for b, e in zip(base, noise[1:] + noise[:1])],
        "entropy 2048": [b - 0.3 + e for b, e in zip(base, noise)],
    }
    widths = {"minmax": 3.3, "percentile 99.99": 2.98, "percentile 99.999": 3.17, "mse": 3.04, "entropy 2048": 2.97}
    assert choose_robust(scores) == "percentile 99.99"
    assert choose_robust(scores, widths=widths) == "percentile 99.999"
    # A gain more than one standard error below the best's is not traded for width: the widest
    # of those left near the best is mse.
    scores["percentile 99.999"] = [b + 0.5 + e for b, e in zip(base, noise[::-1])]
    assert choose_robust(scores, widths=widths) == "mse"
    del scores["mse"]
    assert choose_robust(scores, widths=widths) == "percentile 99.99"


def test_range_widths():
    td = TensorsData(
        CalibrationMethod.MinMax,
        {
            "a": TensorData(lowest=np.array([-1.0], np.float32), highest=np.array([3.0], np.float32)),
            "b": TensorData(lowest=np.array([2.0], np.float32), highest=np.array([8.0], np.float32)),
            "c": TensorData(lowest=np.array([0.0], np.float32), highest=np.array([0.0], np.float32)),
            "d": TensorData(lowest=np.array([-np.inf], np.float32), highest=np.array([1.0], np.float32)),
        },
    )
    # a spans 4 (2), b spans 8 with zero included (3); c (empty) and d (infinite) do not count.
    assert selection.range_widths({"x": td}) == {"x": 2.5}
    empty = TensorsData(CalibrationMethod.MinMax, {"c": td.data["c"]})
    assert selection.range_widths({"y": empty}) == {"y": -math.inf}
