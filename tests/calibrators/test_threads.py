"""How calibration shares the CPUs: usable CPUs from affinity and cgroup quotas, the split
between onnxruntime's session and histocal's pool, and the user's overrides."""

from __future__ import annotations

import threading
from pathlib import Path

import onnx
import onnxruntime
import pytest
from support import models
from support.calibrator_runs import ENT, PCT, assert_tensors_same, run_ort
from support.calibrator_runs import MM as MINMAX
from support.parity import quiet

import histocal
from histocal import _core
from histocal.calibrators import cores
from histocal.calibrators.cores import CalibrationThreads, calibration_threads, cgroup_cpu_quota


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_is_the_tightest_on_the_path(tmp_path):
    _write(tmp_path / "proc", "0::/a/b\n")
    _write(tmp_path / "fs/cpu.max", "max 100000\n")
    _write(tmp_path / "fs/a/cpu.max", "150000 100000\n")
    _write(tmp_path / "fs/a/b/cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "fs") == 1.5


def test_cgroup_v2_under_a_hybrid_mount(tmp_path):
    _write(tmp_path / "proc", "4:memory:/x\n0::/\n")
    _write(tmp_path / "fs/unified/cpu.max", "300000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "fs") == 3.0


@pytest.mark.parametrize("mount", ["cpu,cpuacct", "cpu"])
def test_cgroup_v1_quota(tmp_path, mount):
    _write(tmp_path / "proc", "5:cpu,cpuacct:/job\n1:memory:/job\n")
    _write(tmp_path / f"fs/{mount}/job/cpu.cfs_quota_us", "250000\n")
    _write(tmp_path / f"fs/{mount}/job/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "fs") == 2.5


@pytest.mark.parametrize(
    "files",
    [
        {"proc": "0::/\n", "fs/cpu.max": "max 100000\n"},  # no limit
        {"proc": "3:cpu:/\n", "fs/cpu/cpu.cfs_quota_us": "-1\n", "fs/cpu/cpu.cfs_period_us": "100000\n"},
        {"proc": "0::/\n", "fs/cpu.max": "garbage\n"},
        {"proc": "no cgroups here\n"},
    ],
)
def test_no_quota(tmp_path, files):
    for name, text in files.items():
        _write(tmp_path / name, text)
    assert cgroup_cpu_quota(tmp_path / "proc", tmp_path / "fs") is None


def test_no_proc_file(tmp_path):
    assert cgroup_cpu_quota(tmp_path / "missing", tmp_path) is None


def test_usable_cpus_is_affinity_capped_by_the_quota(monkeypatch):
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _: set(range(64)))
    monkeypatch.setattr(cores, "cgroup_cpu_quota", lambda: 2.5)
    assert cores.usable_cpus() == 2
    monkeypatch.setattr(cores, "cgroup_cpu_quota", lambda: 0.2)
    assert cores.usable_cpus() == 1
    monkeypatch.setattr(cores, "cgroup_cpu_quota", lambda: None)
    monkeypatch.setattr(cores.os, "sched_getaffinity", lambda _: {3, 5, 7})
    assert cores.usable_cpus() == 3


def test_split_by_cpu_count():
    for n in (1, 2, 4, 7):
        assert calibration_threads(n) == CalibrationThreads(n, n, False, n)
    assert calibration_threads(8) == CalibrationThreads(8, 6, True, 2)
    assert calibration_threads(16) == CalibrationThreads(16, 12, True, 4)


def test_overrides_keyword_then_env_then_usable(monkeypatch):
    monkeypatch.setattr(cores, "usable_cpus", lambda: 5)
    monkeypatch.delenv("HISTOCAL_NUM_THREADS", raising=False)
    assert calibration_threads().total == 5
    monkeypatch.setenv("HISTOCAL_NUM_THREADS", "3")
    assert calibration_threads().total == 3
    assert calibration_threads(16).total == 16
    monkeypatch.setenv("HISTOCAL_NUM_THREADS", "0")
    assert calibration_threads().total == 5


@pytest.mark.parametrize("raw", ["two", "-1", "1.5"])
def test_bad_env_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv("HISTOCAL_NUM_THREADS", raw)
    with pytest.raises(ValueError, match="HISTOCAL_NUM_THREADS"):
        calibration_threads()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_bad_keyword(bad):
    with pytest.raises(ValueError, match="num_threads"):
        calibration_threads(bad)


def test_caller_threads_only_on_the_calling_thread():
    shared = _core.get_num_threads()
    seen = {}

    def worker():
        _core.set_caller_threads(3)
        seen["set"] = _core.get_num_threads()
        _core.set_caller_threads(0)
        seen["reset"] = _core.get_num_threads()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"set": 3, "reset": shared}
    assert _core.get_num_threads() == shared
    for bad in (-1, True, 1.5):
        with pytest.raises((ValueError, TypeError)):
            _core.set_caller_threads(bad)


def _spinning(session) -> str | None:
    return session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")


@pytest.mark.parametrize("method", [ENT, MINMAX, "mse"])
def test_session_threads_follow_the_split(paths, tmp_path, method):
    with quiet():
        cal = histocal.create_calibrator(
            paths["cnn"], None, (tmp_path / "aug.onnx").as_posix(), method, extra_options={"NumThreads": 3}
        )
    opts = cal.infer_session.get_session_options()
    assert opts.intra_op_num_threads == 3
    assert opts.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert _spinning(cal.infer_session) == "0"  # below 8 CPUs, threads sleep between operators


@pytest.mark.parametrize("method", [ENT, MINMAX, "mse"])
def test_session_options_are_used_as_given(paths, tmp_path, method):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    with quiet():
        cal = histocal.create_calibrator(
            paths["cnn"],
            None,
            (tmp_path / "aug.onnx").as_posix(),
            method,
            extra_options={"SessionOptions": options, "NumThreads": 4},
        )
    assert cal.infer_session.get_session_options().intra_op_num_threads == 1
    assert _spinning(cal.infer_session) == "1"


@pytest.mark.parity
@pytest.mark.parametrize("mode", ["exact", "streaming"])
def test_a_split_pool_gives_the_same_result(paths, tmp_path, mode):
    """A calibration whose Rust work runs on its own, smaller pool (as on 8+ CPUs) gives the
    same ranges as on the shared pool, and ORT's in exact mode."""
    chunks = [models.cnn_feeds(3, seed=5)]
    results = []
    for threads in (None, CalibrationThreads(8, 6, True, 2)):
        with quiet():
            cal = histocal.create_calibrator(
                paths["cnn"], None, (tmp_path / "aug.onnx").as_posix(), PCT, extra_options={"CollectionMode": mode}
            )
            if threads is not None:
                cal.threads = threads
                cal.create_inference_session()
            for chunk in chunks:
                cal.collect_data(chunk)
            results.append(cal.compute_data())
    assert_tensors_same(results[0], results[1], "split pool")
    if mode == "exact":
        assert_tensors_same(run_ort(paths["cnn"], PCT, {}, chunks, tmp_path / "ort.onnx").td, results[1], "vs ORT")


def test_model_without_calibrated_tensors_still_builds(tmp_path):
    # the split is settled at construction, before any session exists
    p = tmp_path / "m.onnx"
    onnx.save(models.cnn(), p.as_posix())
    cal = histocal.EntropyCalibrater(p.as_posix(), num_threads=2)
    assert cal.threads == CalibrationThreads(2, 2, False, 2)


def test_the_batch_loop_bins_on_the_calibration_share(paths, tmp_path):
    """The worker thread's Rust calls run on a pool of the split's size where the split gives
    the binning part of the cores, and on the shared pool otherwise."""
    from histocal.calibrators.common import run_batches
    from histocal.io.readers import DataSource

    with quiet():
        cal = histocal.create_calibrator(paths["cnn"], None, (tmp_path / "aug.onnx").as_posix(), PCT)
    fetch = cal.fetch_names()
    for threads, expected in (
        (CalibrationThreads(8, 6, True, 3), 3),
        (calibration_threads(2), _core.get_num_threads()),
    ):
        cal.threads = threads
        seen: list[int] = []
        n = run_batches(
            cal, DataSource(models.cnn_feeds(3)), fetch, lambda i, items: seen.append(_core.get_num_threads()), "t"
        )
        assert n == 3 and seen == [expected] * 3
    assert _core.get_num_threads() == expected  # the caller's pool is untouched
