"""`_core`'s named records: read by field only (no tuple access), equal by their fields."""

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


def test_records_read_by_name_not_as_tuples() -> None:
    summary = _stream().summary("x")
    assert (summary.dtype, summary.finite_min, summary.finite_max) == ("float32", -1.0, 3.0)
    assert summary.counts == (3, 1, 1, 0, 1)
    assert type(summary)._fields == ["dtype", "level", "finite_min", "finite_max", "abs_min", "counts"]
    with pytest.raises(TypeError):
        summary[0]  # type: ignore[index]
    with pytest.raises(TypeError):
        len(summary)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _, _, _fmin, _fmax, _, _ = summary  # type: ignore[misc]


def test_every_record_matches_its_fields() -> None:
    stream, exact = _stream(), _exact()
    state = exact.state("x")
    records = [
        stream.summary("x"),
        stream.export("x"),
        stream.counts("x"),
        exact.counts("x"),
        state,
        *exact.entropy(4),
        *exact.percentile(99.0, False),
        *exact.distribution(),
        _core.tensor_stats(np.array([1.0, np.nan], dtype=np.float32)),
        _core.scale_zero_point(0.0, 1.0, scale_rule="1.31"),
    ]
    for r in records:
        values = [getattr(r, f) for f in type(r)._fields]
        assert repr(r).startswith(type(r).__name__ + "(") and len(values) == len(type(r)._fields)
    assert state.threshold is not None and state.dtype == "float32"
    c = exact.counts("x")
    assert (c.n_finite, c.n_nan, c.n_posinf, c.n_neginf, c.batches) == (10, 0, 0, 0, 1)


def test_records_are_frozen_and_compare_only_with_their_class() -> None:
    counts = _exact().counts("x")
    with pytest.raises(AttributeError):
        counts.n_nan = 1  # type: ignore[misc]
    assert counts != [10, 0, 0, 0, 1] and counts != (10, 0, 0, 0, 1)
    assert counts == _exact().counts("x") and hash(counts) == hash(_exact().counts("x"))
    assert counts != _stream().counts("x")


def test_version_comes_from_the_crate() -> None:
    assert isinstance(_core.__version__, str) and _core.__version__.count(".") == 2
