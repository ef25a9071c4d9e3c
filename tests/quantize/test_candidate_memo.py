"""auto's candidates computed through one memo per state equal each method computed on its own."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import models

import histocal
from histocal import methods
from histocal.quantize import candidates as candidates_module
from histocal.quantize import selection
from histocal.state import merge_states


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("memo") / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    return path


def _state(path, feeds, tmp):
    cal = histocal.create_calibrator(path, augmented_model_path=str(tmp / "aug.onnx"), calibrate_method="auto")
    cal.collect_data(iter(feeds))
    return cal.state


def _pairs(td):
    return {n: (np.asarray(d.lowest).tobytes(), np.asarray(d.highest).tobytes()) for n, d in td.data.items()}


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(1e-3, 1e3),
    n=st.integers(2, 5),
    qtype=st.sampled_from(["int8", "uint8", "int16", "uint16"]),
    symmetric=st.booleans(),
)
def test_memo_equals_each_method_on_its_own(cnn_path, tmp_path, seed, scale, n, qtype, symmetric):
    rng = np.random.default_rng(seed)
    feeds = [
        {"X": (rng.standard_normal((2, 3, 8, 8)) * scale * rng.uniform(0.1, 2)).astype(np.float32)} for _ in range(n)
    ]
    # a merged state, as auto's fold states are
    state = merge_states(_state(cnn_path, feeds[:1], tmp_path), _state(cnn_path, feeds[1:], tmp_path))
    requested = methods.model_candidate_options(qtype, symmetric)
    got = candidates_module.candidate_ranges(state, [(m, o) for _, m, o in requested])
    for (label, method, options), td in zip(requested, got):
        try:
            expected = state.compute(method, **options)
        except ValueError as exc:
            assert isinstance(td, ValueError) and str(td) == str(exc), label
            continue
        assert not isinstance(td, ValueError), label
        assert _pairs(td) == _pairs(expected), label
    assert list(selection.state_candidates(state, qtype, symmetric)) == [
        label for (label, _, _), td in zip(requested, got) if not isinstance(td, ValueError)
    ]


def test_shared_work_is_done_once(cnn_path, tmp_path, monkeypatch):
    """The per-tensor estimate reuses the candidates' kernel calls (entropy 128, kl, mse)."""
    state = _state(cnn_path, models.cnn_feeds(3), tmp_path)
    calls = []
    real = type(state.stream).ranges

    class Counting:
        def __init__(self, stream):
            self.stream = stream

        def ranges(self, method, names, **options):
            calls.append(method)
            return real(self.stream, method, names, **options)

        def __getattr__(self, name):
            return getattr(self.stream, name)

    monkeypatch.setattr(state.collection, "stream", Counting(state.stream))
    selection.state_candidates(state, "int8", False)
    assert sorted(calls) == ["kl", "mse", "pow2", "pow2"]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**31 - 1),
    scale=st.floats(1e-3, 1e3),
    qtype=st.sampled_from(["int8", "uint8"]),
    symmetric=st.booleans(),
    data=st.data(),
)
def test_restricted_candidates_are_the_state_s_own_for_those_tensors(
    cnn_path, tmp_path, seed, scale, qtype, symmetric, data
):
    """The recipe computes a fold's candidates only for the tensors its placement quantizes
    (``LazyCandidates.restricted``): each is, tensor for tensor, the state's own ``compute``, and
    the all-data candidates keep every tensor."""
    rng = np.random.default_rng(seed)
    feeds = [{"X": (rng.standard_normal((2, 3, 8, 8)) * scale).astype(np.float32)} for _ in range(4)]
    states = [_state(cnn_path, feeds[:2], tmp_path), _state(cnn_path, feeds[2:], tmp_path)]
    merged = merge_states(*states)
    names = data.draw(st.lists(st.sampled_from(merged.names), min_size=1, unique=True))
    requested = methods.model_candidate_options(qtype, symmetric)
    labels = [label for label, _, _ in requested]
    view = candidates_module.LazyCandidates(states, qtype, symmetric, labels).restricted(names)
    for label, method, options in requested:
        try:
            expected = merged.compute(method, **options)
        except ValueError:
            with pytest.raises(ValueError):
                view[label]
            continue
        got = _pairs(view[label])
        if label in selection.ALL_DATA_CANDIDATES:
            assert set(got) == set(merged.names), label
        else:
            assert set(got) == set(names), label
        want = _pairs(expected)
        assert got == {n: want[n] for n in got}, label


def test_range_widths_compare_the_tensors_every_candidate_has():
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

    from histocal.quantize.rule import range_widths

    def ranges(**spans):
        return TensorsData(
            CalibrationMethod.MinMax,
            {n: TensorData(lowest=np.float32(0), highest=np.float32(s)) for n, s in spans.items()},
        )

    widths = range_widths({"all": ranges(a=4.0, b=1024.0), "some": ranges(a=8.0)})
    assert widths == {"all": 2.0, "some": 3.0}  # b, which "some" lacks, is not compared
