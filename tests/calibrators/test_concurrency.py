"""One calibrator, collector or state used from several threads at once (the README's rule).

Calls on one object take turns (a lock per object; a calibrator's collector shares its lock), so
no thread ever sees PyO3's "Already borrowed", and a ``collect_data`` that fails undoes only its
own work: every call that returned normally is in the result. Each test starts its threads at a
barrier, so that the calls overlap, and repeats the round a few times; the result must equal a
calibrator that made the same successful calls one after another (the same data in every call,
so the order the lock gives them does not matter).

Also here: calibrators created without an ``augmented_model_path`` each get their own, so two
of them never load each other's augmented model (ORT's shared default path allows that).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
from support import models
from support.calibrator_runs import assert_tensors_same
from support.parity import assert_hist_tuple_same, assert_same, quiet

import histocal

THREADS = 4  # collecting threads per round
ROUNDS = 3


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "cnn.onnx"
    onnx.save(models.cnn(), path.as_posix())
    return path.as_posix()


def run_at_once(calls: list[Callable[[], Any]]) -> list[BaseException | None]:
    """Run each call on its own thread, all released at one barrier; each call's exception."""
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            calls[i]()
        except BaseException as exc:
            errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


CASES = [
    (CalibrationMethod.Percentile, {"CollectionMode": "streaming"}),
    (CalibrationMethod.Entropy, {"CollectionMode": "exact"}),
    (CalibrationMethod.Distribution, {"CollectionMode": "exact", "num_bins": 512}),
    ("mse", {}),
    (CalibrationMethod.MinMax, {}),
]


def _calibrator(path: str, method: Any, extra: dict) -> Any:
    return histocal.create_calibrator(path, calibrate_method=method, extra_options=dict(extra))


@pytest.mark.parametrize("method,extra", CASES, ids=lambda v: str(v) if not isinstance(v, dict) else "")
def test_one_calibrator_from_several_threads(cnn_path, method, extra):
    """Collecting threads, a thread whose data fails midway, and threads reading results, on one
    calibrator at once: the failed call raises its own error and leaves no trace, every call
    that returned is kept, and the reads see a consistent calibrator (before the fix: PyO3's
    "Already borrowed", lost collections, and "'NoneType' object has no attribute '_dict'")."""
    histogram = method != CalibrationMethod.MinMax

    def good(k: int) -> list[dict]:
        # MinMax merges ranges in any order: each thread gets its own data, so a lost call shows
        scale = 1 if histogram else 1 + k
        return [{"X": f["X"] * np.float32(scale)} for f in models.cnn_feeds(4)]

    # the failing call's first batches are far out: keeping them would show
    bad = [{"X": f["X"] * np.float32(1000)} for f in models.cnn_feeds(2)] + [{"X": np.zeros((1, 2), np.float32)}]
    with quiet():
        ref = _calibrator(cnn_path, method, extra)
        for k in range(1 + THREADS):
            ref.collect_data(good(k))
        expected = ref.compute_data()
        for _ in range(ROUNDS):
            cal = _calibrator(cnn_path, method, extra)
            cal.collect_data(good(0))
            calls: list[Callable[[], Any]] = [lambda k=k: cal.collect_data(good(k)) for k in range(1, 1 + THREADS)]
            calls += [lambda: cal.collect_data(list(bad)), cal.compute_data]
            if histogram:
                calls.append(lambda: cal.state)
            errors = run_at_once(calls)
            assert errors[:THREADS] == [None] * THREADS, errors
            assert isinstance(errors[THREADS], ValueError) and "batch 2" in str(errors[THREADS]), errors[THREADS]
            assert errors[THREADS + 1 :] == [None] * (len(calls) - THREADS - 1), errors
            assert_tensors_same(expected, cal.compute_data(), "after concurrent calls")
            if histogram:
                state = cal.state
                for name in state.names:
                    assert state.counts(name)[4] == (1 + THREADS) * 4, name


def _entropy_collector() -> histocal.HistogramCollector:
    return histocal.HistogramCollector("entropy", False, 256, 128, 99.999, "same")


def test_one_collector_from_several_threads():
    """The HistogramCollector drop-in: collects, results and histogram reads at once."""
    rng = np.random.default_rng(0)
    data = {f"t{i}": [rng.normal(0, 1, (64, 64)).astype(np.float32) for _ in range(3)] for i in range(4)}
    ref = _entropy_collector()
    for _ in range(1 + THREADS):
        ref.collect(data)
    for _ in range(ROUNDS):
        collector = _entropy_collector()
        collector.collect(data)
        calls = [lambda: collector.collect(data)] * THREADS
        calls += [collector.compute_collection_result, lambda: collector.histogram_dict, lambda: collector.counts]
        assert run_at_once(calls) == [None] * len(calls)
        expected, got = ref.compute_collection_result(), collector.compute_collection_result()
        assert set(got) == set(expected)
        for name in expected:
            for i, (theirs, ours) in enumerate(zip(expected[name], got[name])):
                assert_same(theirs, ours, f"{name}[{i}]")
        assert set(collector.histogram_dict) == set(ref.histogram_dict)
        for name, entry in ref.histogram_dict.items():
            assert_hist_tuple_same(entry, collector.histogram_dict[name], name)


def test_one_state_from_several_threads(cnn_path, tmp_path):
    """A CalibrationState read by several threads at once (results, merges, saves) gives what it
    gives one thread at a time."""
    with quiet():
        cal = _calibrator(cnn_path, CalibrationMethod.Entropy, {"CollectionMode": "exact"})
        cal.collect_data(models.cnn_feeds(4))
    state = cal.state
    work: dict[str, Callable[[], Any]] = {
        "entropy": lambda: state.compute("entropy"),
        "percentile": lambda: state.compute("percentile", percentile=99.9),
        "mse": lambda: state.compute("mse"),
        "merge": lambda: state.merge(state).compute("percentile"),
        "save": lambda: (
            state.save(tmp_path / f"{threading.get_ident()}.hcs"),
            histocal.CalibrationState.load(tmp_path / f"{threading.get_ident()}.hcs").compute("entropy"),
        ),
    }
    with quiet():
        expected = {key: f() for key, f in work.items()}
    for _ in range(ROUNDS):
        results: dict[str, list[Any]] = {key: [] for key in work}
        calls = [lambda key=key: results[key].append(work[key]()) for key in work for _ in range(2)]
        with quiet():
            assert run_at_once(calls) == [None] * len(calls)
        for key, got in results.items():
            for value in got:
                want = expected[key][1] if key == "save" else expected[key]
                value = value[1] if key == "save" else value
                assert isinstance(value, TensorsData)
                assert_tensors_same(want, value, key)


# ----------------------------------------------------------------------------------------------
# augmented_model_path
# ----------------------------------------------------------------------------------------------


def _two_output_model(name: str, op: str) -> onnx.ModelProto:
    """X -> op -> Y: two models whose augmented models calibrate different tensors."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node(op, ["X"], [f"{name}_out"])],
        name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, ["N", 4])],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("method", [CalibrationMethod.MinMax, CalibrationMethod.Percentile])
def test_calibrators_created_at_once_keep_their_own_augmented_model(tmp_path, monkeypatch, method):
    """With ORT's shared default path, the second augment_graph overwrites the first calibrator's
    augmented model before its session loads it, and the first calibrator then returns the
    other model's tensors. Each calibrator now gets its own path unless one is given."""
    monkeypatch.chdir(tmp_path)  # where ORT's default path would put the file
    paths = []
    for name, op in (("relu", "Relu"), ("neg", "Neg")):
        paths.append((tmp_path / f"{name}.onnx").as_posix())
        onnx.save(_two_output_model(name, op), paths[-1])
    factory = histocal.MinMaxCalibrater if method == CalibrationMethod.MinMax else histocal.PercentileCalibrater
    first, second = factory(paths[0]), factory(paths[1])
    first.augment_graph()
    second.augment_graph()  # the interleaving of two calibrators created at once
    first.create_inference_session()
    second.create_inference_session()
    assert first.augmented_model_path != second.augmented_model_path
    feeds = [{"X": np.array([[-2, -1, 1, 3]], np.float32)}]
    with quiet():
        first.collect_data(list(feeds))
        second.collect_data(list(feeds))
        assert set(first.compute_data().data) == {"X", "relu_out"}
        assert set(second.compute_data().data) == {"X", "neg_out"}
    assert not (tmp_path / "augmented_model.onnx").exists()
    # a private folder, removed with its calibrator; a path the user names is used as given
    folder = Path(first.augmented_model_path).parent
    assert folder.is_dir() and folder != tmp_path
    del first
    gc.collect()
    assert not folder.exists()
    named = factory(paths[0], augmented_model_path="mine.onnx")
    named.augment_graph()
    assert named.augmented_model_path == "mine.onnx" and (tmp_path / "mine.onnx").exists()
