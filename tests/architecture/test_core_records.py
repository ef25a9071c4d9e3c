"""`_core`'s named records: fields by name, and the tuple they replace, unchanged."""

import numpy as np
import pytest

from histocal import _core


def _stream() -> _core.StreamHistograms:
    s = _core.StreamHistograms(64)
    s.collect([("x", [np.array([-1.0, 0.5, np.nan, np.inf, 3.0], dtype=np.float32)])])
    return s


def _exact() -> _core.Histograms:
    h = _core.Histograms("value", 8)
    h.collect([("x", [np.arange(10, dtype=np.float32)])])
    return h


def test_records_read_by_name_and_as_tuples() -> None:
    summary = _stream().summary("x")
    assert (summary.dtype, summary.finite_min, summary.finite_max) == ("float32", -1.0, 3.0)
    assert summary.counts == (3, 1, 1, 0, 1)
    assert len(summary) == 6 and summary[0] == "float32" and summary[-1] == summary.counts
    _, _, fmin, fmax, _, _ = summary
    assert (fmin, fmax) == (-1.0, 3.0)
    assert summary == tuple(summary) and summary[:2] == ("float32", summary.level)
    assert not (summary != tuple(summary))  # noqa: SIM202 (checks __ne__ itself)
    assert hash(summary) == hash(tuple(summary))
    assert type(summary)._fields == ["dtype", "level", "finite_min", "finite_max", "abs_min", "counts"]


def test_every_record_matches_its_fields() -> None:
    stream, exact = _stream(), _exact()
    state = exact.state("x")
    records = [
        stream.summary("x"),
        stream.export("x"),
        stream.counts("x"),
        exact.counts("x"),
        *exact.entropy(4),
        *exact.percentile(99.0, False),
        *exact.distribution(),
        _core.tensor_stats(np.array([1.0, np.nan], dtype=np.float32)),
        _core.scale_zero_point(0.0, 1.0, scale_rule="1.31"),
    ]
    for r in records:
        assert tuple(r) == tuple(getattr(r, f) for f in type(r)._fields)
        assert repr(r).startswith(type(r).__name__ + "(")
    assert np.array_equal(state.hist, state[0]) and np.array_equal(state.edges, state[1])
    assert state.threshold is not None and state[2:] == (state.min, state.max, state.threshold, "float32")
    assert tuple(exact.counts("x")) == (10, 0, 0, 0, 1)


def test_records_are_frozen_and_compare_only_with_tuples() -> None:
    counts = _exact().counts("x")
    with pytest.raises(AttributeError):
        counts.n_nan = 1  # type: ignore[misc]
    assert counts != [10, 0, 0, 0, 1]
    assert counts == _exact().counts("x")
    with pytest.raises(IndexError):
        counts[5]


def test_version_comes_from_the_crate() -> None:
    assert isinstance(_core.__version__, str) and _core.__version__.count(".") == 2
