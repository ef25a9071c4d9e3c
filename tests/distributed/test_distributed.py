"""histocal.distributed: shards collected on Ray workers merge into the state of one run.

In-process (no Ray): the workers' shard results, reduced in any order and over any split
(hypothesis), give the single-process state byte for byte. On a local Ray (``ray.init(num_cpus=2)``,
one per module): every ORT method and a histocal method, streaming and exact mode, against the
single-process state and onnxruntime on the concatenated data; per-channel histograms; empty shards;
a worker killed mid-shard; a shard past its timeout; a corrupt shard; the CLI; no worker files left
behind (the workers' TMPDIR is a private folder, checked after every test; a driver stopped by
Ctrl-C in a subprocess). Node loss: test_distributed_cluster.py.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import ray
from hypothesis import given, settings
from hypothesis import strategies as st
from support import models
from support.calibrator_runs import DIST, ENT, MM, ORT_CREATE, PCT, RewindReader, assert_tensors_same
from support.parity import quiet
from support.summaries import pow2_votes

import histocal
from histocal import CalibrationState
from histocal.cli import main as cli_main
from histocal.distributed import ShardError, calibrate_distributed, driver
from histocal.distributed.settings import check_seconds
from histocal.distributed.shards import make_shards
from histocal.distributed.worker import ShardWorker

pytestmark = pytest.mark.ray

FEEDS = models.cnn_feeds(8)
ORT_ENUM = {"entropy": ENT, "percentile": PCT, "distribution": DIST, "minmax": MM}

# The shard callables below run on Ray's workers, which cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "cnn.onnx"
    onnx.save(models.cnn(), path)
    return path.as_posix()


@pytest.fixture(scope="module")
def worker_tmp(tmp_path_factory):
    """The workers' TMPDIR."""
    return tmp_path_factory.mktemp("worker_tmp")


@pytest.fixture(scope="module")
def ray_session(worker_tmp):
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"TMPDIR": worker_tmp.as_posix()}},
    )
    yield
    ray.shutdown()


@pytest.fixture
def local_ray(ray_session, worker_tmp):
    """The module's local Ray; after the test, no worker left a folder of histocal's in its TMPDIR
    (whatever the test did to the workers: ran, failed, killed)."""
    yield
    assert sorted(p.name for p in worker_tmp.glob("histocal_*")) == []


def feed_shards(sizes):
    """Zero-argument callables over consecutive runs of FEEDS of these sizes (0: an empty shard)."""
    out, start = [], 0
    for n in sizes:
        out.append(functools.partial(list, FEEDS[start : start + n]))
        start += n
    assert start == len(FEEDS)
    return out


def single_run(model_path, method, options=None):
    """The state of one single-process run over FEEDS, recorded as the distributed job records it,
    at the workers' thread count (1 by default): onnxruntime's float outputs, so the histograms,
    can change with its intra-op thread count."""
    job = driver.make_job(method, options, None, None, 1)
    cal = histocal.create_calibrator(
        model_path, calibrate_method=job.collect_method, extra_options=job.extra_options, settings=job.settings
    )
    cal.collect_data(FEEDS)
    settings_ = cal.collection_settings if job.state_settings is None else job.state_settings
    return CalibrationState.from_collection(
        cal.collection.held(), model_fingerprint=cal.model_fingerprint, method=job.state_method, settings=settings_
    )


def _plain(value):
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if hasattr(value, "_fields"):  # records, read by field
        return tuple((f, _plain(getattr(value, f))) for f in type(value)._fields)
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    return value


def state_parts(state: CalibrationState):
    """Everything a state holds, per tensor: tensor order is Python set order (ORT's), which
    differs between processes, so states are compared as maps."""
    tensors = {}
    for name in state.names:
        stream = None if state.stream is None else (state.stream.export(name), pow2_votes(state.stream, name))
        exact = None
        if state.exact is not None:
            exact = (state.exact.state(name), state.exact.counts(name), state.exact.dtypes(name))
        tensors[name] = _plain((stream, exact))
    channels = None
    if state.channels is not None:
        ch = state.channels
        channels = (ch.axis, {t: _plain([ch.stream.export(k) for k in ch.channel_keys(t)]) for t in ch.channels})
    return tensors, channels, state.options, state.model_fingerprint, state.data_fingerprints


def assert_same_state(merged: CalibrationState, reference: CalibrationState) -> None:
    assert merged.mode == reference.mode
    assert state_parts(merged) == state_parts(reference)


# ----------------------------------------------------------------------------------------------
# In process: any split, any order (the same worker code, no Ray)
# ----------------------------------------------------------------------------------------------


class InProcessPool:
    """``driver.collect``'s pool, running one ShardWorker in this process in a given order."""

    def __init__(self, worker, order):
        self.worker, self.order = worker, order

    def share(self, value):
        return value

    def map(self, method, shards, args):
        for i in self.order:
            yield shards[i].index, getattr(self.worker, method)(shards[i], *args(shards[i]))


@pytest.fixture(scope="module")
def in_process(model_path):
    """Per (method, mode): the worker and the single-process reference state."""
    out = {}
    for method, options in (
        ("entropy", {"CollectionMode": "streaming"}),
        ("entropy", {"CollectionMode": "exact"}),
        ("percentile", {"CollectionMode": "exact"}),  # |x| histograms (symmetric by default)
    ):
        job = driver.make_job(method, options, None, None, 1)
        with open(model_path, "rb") as f:
            worker = ShardWorker(f.read(), job)
        out[method, job.mode] = (job, worker, single_run(model_path, method, options))
    return out


@st.composite
def splits_and_orders(draw):
    # cuts may repeat or fall on the ends: empty shards
    cuts = sorted(draw(st.lists(st.integers(0, len(FEEDS)), max_size=len(FEEDS))))
    sizes = [b - a for a, b in zip([0, *cuts], [*cuts, len(FEEDS)])]
    order = draw(st.permutations(range(len(sizes))))
    return sizes, order


@pytest.mark.parametrize("key", [("entropy", "streaming"), ("entropy", "exact"), ("percentile", "exact")])
@settings(max_examples=12, deadline=None)
@given(split=splits_and_orders())
def test_shards_merge_to_the_single_run_state_for_any_split_and_order(in_process, key, split):
    job, worker, reference = in_process[key]
    sizes, order = split
    merged = driver.collect(InProcessPool(worker, order), make_shards(feed_shards(sizes)), job)
    assert_same_state(merged, reference)


def test_a_partial_run_is_never_merged_and_a_shard_counts_once(in_process):
    _, worker, reference = in_process["entropy", "streaming"]
    shards = make_shards(feed_shards([4, 4]))
    results = [(s.index, worker.streaming(s)) for s in shards]
    with pytest.raises(RuntimeError, match=r"no result for shard\(s\) \[1\]: a partial run is never merged"):
        driver.reduce_states(results[:1], 2)
    # a shard's second result (a redone shard) replaces, never adds
    assert_same_state(driver.reduce_states([results[0], results[1], results[0]], 2), reference)


def test_without_ray_the_error_names_the_extra(monkeypatch, model_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(
        ImportError, match=r"needs Ray, which is not installed: pip install 'ray>=2.40' \(histocal's ray extra"
    ):
        calibrate_distributed(model_path, feed_shards([8]), calibrate_method="entropy")


def test_moving_average_and_per_channel_minmax_are_refused():
    for option in ("moving_average", "per_channel"):
        with pytest.raises(ValueError, match=f"distributed MinMax supports neither {option}"):
            driver.make_job("minmax", {option: True}, None, None, 1)


@pytest.mark.parametrize("key", [("entropy", "streaming"), ("entropy", "exact")])
def test_data_empty_in_every_shard_is_refused_as_one_process_refuses_no_data(in_process, key):
    job, worker, _ = in_process[key]
    with pytest.raises(ValueError, match=r"^No data is collected\. \(all 3 shards are empty\)$"):
        driver.collect(InProcessPool(worker, [2, 0, 1]), make_shards([functools.partial(list, [])] * 3), job)


def test_mode_is_create_calibrators_collection_mode():
    def mode(method, options=None, mode=None):
        return driver.make_job(method, options, None, None, 1, mode).mode

    assert mode("entropy") == mode("entropy", mode="auto") == "exact"  # shards can be read twice
    assert mode("entropy", mode="streaming") == mode("entropy", {"CollectionMode": "streaming"}) == "streaming"
    assert mode("percentile", mode="exact") == mode("percentile", {"CollectionMode": "exact"}, "exact") == "exact"
    # per-channel histograms are streaming ones: auto collects them so, as in one process
    assert mode("entropy", {"per_channel": True}) == mode("entropy", {"per_channel": True}, "auto") == "streaming"
    assert mode("mse", mode="streaming") == mode("minmax", mode="auto") == "streaming"


class _RayMustNotStart:
    """What ``import_ray`` returns in tests of settings refused before Ray starts."""

    def __getattr__(self, name):
        raise AssertionError(f"ray.{name} used before the settings were checked")


@pytest.mark.parametrize(
    "method, kwargs, message",
    [
        ("entropy", {"mode": "fast"}, r"^mode must be one of auto, exact, streaming, got 'fast'$"),
        (
            "entropy",
            {"extra_options": {"CollectionMode": "fast"}},
            r"^extra_options\['CollectionMode'\] must be one of auto, exact, streaming, got 'fast'$",
        ),
        (
            "entropy",
            {"mode": "streaming", "extra_options": {"CollectionMode": "exact"}},
            r"^mode='streaming' and extra_options\['CollectionMode'\]='exact' disagree",
        ),
        (
            "percentile",
            {"mode": "exact", "extra_options": {"per_channel": True}},
            r"^per-channel histograms are collected in streaming mode only \(mode='exact' given\)$",
        ),
        (
            "entropy",
            {"extra_options": {"per_channel": True, "CollectionMode": "exact"}},
            r"streaming mode only \(extra_options\['CollectionMode'\]='exact' given\)$",
        ),
        # the calibrators' own checks, on a stand-in model
        ("entropy", {"extra_options": {"per_channel": "yes"}}, r"^per_channel must be a boolean, got 'yes'$"),
        ("distribution", {"extra_options": {"StreamingBins": 1000}}, r"streaming_bins must be a power of two"),
        ("mse", {"extra_options": {"MethodOptions": {"qtype": "int5"}}}, r"qtype"),
        ("entropy", {"mode": None, "shard_timeout": 0}, r"^shard_timeout must be a number of seconds > 0, got 0$"),
        ("entropy", {"shard_timeout": True}, r"^shard_timeout must be a number of seconds > 0, got True$"),
        ("entropy", {"num_workers": 0}, r"^num_workers must be an integer in \[1, 2147483647\], got 0$"),
        # every number bounded before Ray starts (past the bounds Ray's C++ overflows)
        ("entropy", {"shard_timeout": float("nan")}, r"^shard_timeout must be a number of seconds > 0, got nan$"),
        ("entropy", {"shard_timeout": -1.0}, r"^shard_timeout must be a number of seconds > 0, got -1.0$"),
        ("entropy", {"shard_timeout": "10"}, r"^shard_timeout must be a number of seconds > 0, got '10'$"),
        (
            "entropy",
            {"shard_timeout": 1e300},
            r"^shard_timeout must be at most 1e\+09 seconds \(inf or None: no limit\)",
        ),
        (
            "entropy",
            {"num_workers": 2**40},
            r"^num_workers must be an integer in \[1, 2147483647\], got 1099511627776$",
        ),
        ("entropy", {"cpus_per_worker": 2**40}, r"^cpus_per_worker must be an integer in \[1, 2147483647\]"),
        ("entropy", {"max_shard_attempts": 2**63}, r"^max_shard_attempts must be an integer in \[1, 2147483647\]"),
        ("entropy", {"max_restarts": 2**63}, r"^max_restarts must be an integer in \[-1, 2147483647\] \(-1: "),
        ("entropy", {"max_restarts": -2}, r"^max_restarts must be an integer in \[-1, 2147483647\]"),
        ("entropy", {"max_task_retries": 1.5}, r"^max_task_retries must be an integer in \[-1, 2147483647\]"),
        ("entropy", {"max_task_retries": True}, r"^max_task_retries must be an integer in \[-1, 2147483647\]"),
    ],
)
def test_settings_are_refused_before_ray_starts(monkeypatch, model_path, method, kwargs, message):
    monkeypatch.setattr(driver, "import_ray", _RayMustNotStart)
    with pytest.raises(ValueError, match=message):
        calibrate_distributed(model_path, feed_shards([8]), calibrate_method=method, **kwargs)


@pytest.mark.parametrize("no_limit", [None, float("inf")])
def test_an_infinite_shard_timeout_is_no_limit(no_limit):
    assert check_seconds("shard_timeout", no_limit) is None
    assert check_seconds("shard_timeout", 2.5) == 2.5


def test_a_model_that_is_no_model_is_refused_before_ray_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(driver, "import_ray", _RayMustNotStart)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^{bad}: not an ONNX model \(0 bytes\)$"):
        calibrate_distributed(bad, feed_shards([8]), calibrate_method="entropy")


# ----------------------------------------------------------------------------------------------
# On a local Ray
# ----------------------------------------------------------------------------------------------


def run_ort_one_thread(model_path, method, options, aug):
    """onnxruntime's calibrator on FEEDS at one intra-op thread, the workers' default (ORT's own
    session takes every core; its float outputs can change with the thread count)."""
    import onnxruntime

    with quiet():
        cal = ORT_CREATE(model_path, None, aug.as_posix(), method, extra_options=dict(options))
    session_options = onnxruntime.SessionOptions()
    session_options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session_options.intra_op_num_threads = 1
    cal.infer_session = onnxruntime.InferenceSession(
        cal.augmented_model_path, sess_options=session_options, providers=cal.execution_providers
    )
    with quiet():
        cal.collect_data(RewindReader(FEEDS))
        return cal.compute_data()


def _external_data_model(folder: Path, location: str) -> Path:
    """The CNN saved with every weight in the file ``location`` (relative to ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "cnn_external.onnx"
    onnx.save_model(models.cnn(), path.as_posix(), save_as_external_data=True, location=location, size_threshold=0)
    return path


def test_a_model_with_external_data_calibrates_on_the_workers(local_ray, tmp_path):
    """The workers get the model's external-data files beside their copy of it (they got the
    .onnx file alone and failed to start: "should be stored in ... but it is not regular file")."""
    path = _external_data_model(tmp_path / "m", "cnn_weights.data")
    assert (tmp_path / "m" / "cnn_weights.data").is_file()
    options = {"CollectionMode": "streaming"}
    merged = calibrate_distributed(
        path, feed_shards([3, 5]), calibrate_method="entropy", num_workers=2, extra_options=options
    )
    assert_same_state(merged, single_run(path, "entropy", options))


def test_external_data_outside_the_model_folder_is_refused_before_ray_starts(monkeypatch, tmp_path):
    path = _external_data_model(tmp_path / "m", "weights.data")
    proto = onnx.load(path.as_posix(), load_external_data=False)
    for t in proto.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"
    onnx.save(proto, path.as_posix())
    (tmp_path / "elsewhere.data").write_bytes((tmp_path / "m" / "weights.data").read_bytes())
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    with pytest.raises(ValueError, match=r"external data .*elsewhere.data is outside the model's folder"):
        calibrate_distributed(path, feed_shards([8]), calibrate_method="entropy", num_workers=1)


def test_streaming_mode_equals_one_streaming_run(local_ray, model_path):
    options = {"CollectionMode": "streaming"}
    reference = single_run(model_path, "entropy", options)
    for sizes, how in (([3, 5], {"extra_options": options}), ([1, 1, 2, 4], {"mode": "streaming"})):
        merged = calibrate_distributed(model_path, feed_shards(sizes), calibrate_method="entropy", num_workers=2, **how)
        assert_same_state(merged, reference)


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_per_channel_with_default_settings_equals_one_process(local_ray, model_path, method):
    """Per-channel histograms with no mode given: one process collects streaming ones, and so do
    the workers (no mode the user did not give is refused)."""
    options = {"per_channel": True}
    one = histocal.create_calibrator(model_path, calibrate_method=method, extra_options={**options, "NumThreads": 1})
    one.collect_data(FEEDS)
    reference = CalibrationState.from_collection(
        one.collection.held(), model_fingerprint=one.model_fingerprint, method=method, settings=one.collection_settings
    )
    merged = calibrate_distributed(
        model_path, feed_shards([3, 5]), calibrate_method=method, extra_options=options, num_workers=2
    )
    assert merged.channels is not None and merged.mode == "streaming"
    assert_same_state(merged, reference)
    expected, got = one.compute_data().data, merged.compute(method).data
    assert set(got) == set(expected)
    for name, ranges in expected.items():  # per-channel ranges: arrays
        assert np.array_equal(got[name].range_value, ranges.range_value), name


def test_an_empty_shard_adds_nothing(local_ray, model_path):
    merged = calibrate_distributed(model_path, feed_shards([3, 0, 5, 0]), calibrate_method="entropy", num_workers=2)
    assert_same_state(merged, single_run(model_path, "entropy"))
    with pytest.raises(ValueError, match=r"^No data is collected\. \(all 2 shards are empty\)$"):
        calibrate_distributed(model_path, [functools.partial(list, [])] * 2, calibrate_method="entropy", num_workers=2)


@pytest.mark.parity
@pytest.mark.parametrize(
    "method, options, sizes",
    [
        ("entropy", {}, [2, 6]),
        ("percentile", {}, [1, 3, 4]),  # symmetric: |x| histograms
        ("distribution", {}, [5, 1, 1, 1]),
    ],
)
def test_exact_mode_equals_onnxruntime_on_all_the_data(local_ray, model_path, tmp_path, method, options, sizes):
    merged = calibrate_distributed(
        model_path, feed_shards(sizes), calibrate_method=method, extra_options=options, num_workers=2
    )
    assert merged.mode == "exact"
    assert_same_state(merged, single_run(model_path, method, options))
    ort = run_ort_one_thread(model_path, ORT_ENUM[method], options, tmp_path / "aug.onnx")
    assert_tensors_same(ort, merged.compute(method, **options), f"{method} {sizes}")


@pytest.mark.parity
@pytest.mark.parametrize("symmetric", [False, True])
def test_minmax_reduces_min_and_max_as_onnxruntime(local_ray, model_path, tmp_path, symmetric):
    options = {"symmetric": symmetric}
    merged = calibrate_distributed(
        model_path, feed_shards([4, 1, 3]), calibrate_method="minmax", extra_options=options, num_workers=2
    )
    assert merged.method == "minmax"
    ort = run_ort_one_thread(model_path, MM, options, tmp_path / "aug.onnx")
    assert_tensors_same(ort, merged.compute("minmax"), "minmax")


def test_histocal_methods_collect_streaming_states(local_ray, model_path):
    options = {"MethodOptions": {"qtype": "int8"}}
    merged = calibrate_distributed(model_path, feed_shards([6, 2]), calibrate_method="mse", extra_options=options)
    reference = single_run(model_path, "mse", options)
    assert_same_state(merged, reference)
    assert merged.compute("mse").data.keys() == reference.compute("mse").data.keys()


def dies_once(marker, on_read, feeds):
    """Feeds; the ``on_read``-th call (exact mode reads twice) kills its process after one batch,
    the first time only."""
    reads = marker + ".reads"
    with open(reads, "a") as f:
        f.write("x")
    first = not os.path.exists(marker) and os.path.getsize(reads) == on_read
    for i, feed in enumerate(feeds):
        if i == 1 and first:
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        yield feed


@pytest.mark.parametrize(
    "options, on_read, ray_knobs",
    [
        ({}, 2, {}),  # exact mode, killed in pass 2: the driver redoes the shard on another worker
        ({"CollectionMode": "streaming"}, 1, {"max_restarts": 1, "max_task_retries": 1}),  # Ray restarts it
    ],
)
def test_a_worker_killed_mid_shard_gives_the_identical_state(
    local_ray, model_path, tmp_path, options, on_read, ray_knobs
):
    marker = (tmp_path / "killed").as_posix()
    shards = feed_shards([3, 5])
    shards[1] = functools.partial(dies_once, marker, on_read, FEEDS[3:])
    merged = calibrate_distributed(
        model_path, shards, calibrate_method="entropy", extra_options=options, num_workers=2, **ray_knobs
    )
    assert os.path.exists(marker), "the worker was not killed"
    assert_same_state(merged, single_run(model_path, "entropy", options))


def hangs(marker, feeds, *, always=False):
    """``feeds``, after hanging (until its worker is killed) the first time, or every time."""
    if always or not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(600)
    return feeds


@pytest.mark.parametrize("workers", [2, 1])  # 1: the other shard is queued behind the hung one
def test_a_shard_past_its_timeout_is_redone_and_the_state_is_identical(local_ray, model_path, tmp_path, workers):
    marker = (tmp_path / "hung").as_posix()
    shards = feed_shards([3, 5])
    shards[0] = functools.partial(hangs, marker, FEEDS[:3])
    started = time.monotonic()
    merged = calibrate_distributed(
        model_path, shards, calibrate_method="entropy", num_workers=workers, shard_timeout=10
    )
    assert os.path.exists(marker), "the shard did not hang"
    assert time.monotonic() - started < 300
    assert_same_state(merged, single_run(model_path, "entropy"))


def slow(seconds, feeds):
    time.sleep(seconds)
    return feeds


def test_a_shard_s_clock_starts_when_its_worker_starts_it(local_ray, model_path):
    """One worker runs its shards one after the other: the second, queued behind the first, is
    timed from its own start (from its dispatch it would be past the timeout)."""
    shards = [functools.partial(slow, 3, FEEDS[:4]), functools.partial(slow, 3, FEEDS[4:])]
    merged = calibrate_distributed(
        model_path,
        shards,
        calibrate_method="entropy",
        mode="streaming",
        num_workers=1,
        shard_timeout=5,
        max_shard_attempts=1,
    )
    assert_same_state(merged, single_run(model_path, "entropy", {"CollectionMode": "streaming"}))


def test_a_shard_that_always_hangs_fails_naming_the_shard_and_the_timeout(local_ray, model_path, tmp_path):
    shards = feed_shards([3, 5])
    shards[1] = functools.partial(hangs, (tmp_path / "hung").as_posix(), FEEDS[3:], always=True)
    with pytest.raises(ShardError) as info:
        calibrate_distributed(
            model_path, shards, calibrate_method="entropy", mode="streaming", shard_timeout=5, max_shard_attempts=2
        )
    assert info.value.shard == 1
    assert str(info.value) == (
        "shard 1 (hangs): no result within the shard timeout of 5 s, on each of its 2 attempts (max_shard_attempts=2)"
    )


CTRL_C_DRIVER = """
import functools, os, sys, time
sys.path.insert(0, sys.argv[3])
from support import models
from histocal.distributed import calibrate_distributed

def hangs(marker, feeds):
    open(marker, "w").close()
    time.sleep(600)
    return feeds

feeds = models.cnn_feeds(8)
shards = [functools.partial(hangs, sys.argv[2], feeds[:4]), functools.partial(list, feeds[4:])]
calibrate_distributed(sys.argv[1], shards, calibrate_method="entropy", num_workers=2)
"""


@pytest.mark.subprocess
def test_ctrl_c_on_the_driver_leaves_no_worker_files(model_path, tmp_path):
    """A driver (with its own local Ray) interrupted mid-run: the workers, which inherit its TMPDIR,
    leave nothing there."""
    tmp = Path(tempfile.mkdtemp(prefix="hc", dir="/tmp"))  # short: Ray's sockets live under it
    marker = tmp_path / "running"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own Ray, not the module's
    driver_process = None
    try:
        driver_process = subprocess.Popen(
            [sys.executable, "-c", CTRL_C_DRIVER, model_path, marker.as_posix(), Path(__file__).parents[1].as_posix()],
            env={**env, "TMPDIR": tmp.as_posix()},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 240
        while not marker.exists() and driver_process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), f"no shard started: {driver_process.poll()}"
        driver_process.send_signal(signal.SIGINT)
        _, err = driver_process.communicate(timeout=120)
        assert driver_process.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
        assert sorted(p.name for p in tmp.glob("histocal_*")) == []
    finally:
        if driver_process is not None and driver_process.poll() is None:
            driver_process.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def save_npy_shards(folder, sizes):
    """FEEDS as .npy files (one batch each), in one subfolder per shard."""
    out, start = [], 0
    for k, n in enumerate(sizes):
        d = folder / f"shard{k}"
        d.mkdir()
        for i in range(start, start + n):
            np.save(d / f"x{i}.npy", FEEDS[i]["X"])
        out.append(d.as_posix())
        start += n
    return out


def test_a_corrupt_shard_fails_the_run_naming_shard_and_file(local_ray, model_path, tmp_path):
    shards = save_npy_shards(tmp_path, [4, 4])
    bad = tmp_path / "shard1" / "x5.npy"
    bad.write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(ShardError, match=r"shard 1 \(.*shard1\).*x5\.npy") as info:
        calibrate_distributed(model_path, shards, calibrate_method="entropy", num_workers=2)
    assert info.value.shard == 1


def test_a_model_no_worker_could_load_is_refused_naming_the_file_before_ray_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(driver, "import_ray", _RayMustNotStart)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ValueError, match=rf"^{bad}: not an ONNX model \(cannot be parsed: .*\)$"):
        calibrate_distributed(bad.as_posix(), feed_shards([8]), calibrate_method="entropy", num_workers=1)


def test_cli_workers_writes_the_single_process_state(local_ray, model_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HISTOCAL_NUM_THREADS", "1")  # the one process at the workers' thread count
    data = save_npy_shards(tmp_path, [8])[0]
    one, sharded = tmp_path / "one.hcs", tmp_path / "sharded.hcs"
    base = ["calibrate", model_path, "--data", data, "--method", "percentile", "--no-progress"]
    assert cli_main([*base, "--state", one.as_posix()]) == 0
    assert (
        cli_main([*base, "--state", sharded.as_posix(), "--cache", (tmp_path / "c.json").as_posix(), "--workers", "2"])
        == 0
    )
    assert "8 shards on Ray" in capsys.readouterr().out
    assert_same_state(CalibrationState.load(sharded), CalibrationState.load(one))


@pytest.mark.parametrize("flag", [["--shards", "2"], ["--shard-timeout", "60"]])
def test_cli_shard_options_need_workers_or_an_address(model_path, tmp_path, capsys, flag):
    data = save_npy_shards(tmp_path, [8])[0]
    argv = ["calibrate", model_path, "--data", data, "--cache", (tmp_path / "c.json").as_posix(), *flag]
    assert cli_main(argv) == 2
    assert f"{flag[0]} applies with --workers or --address" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, message",
    [
        (
            ["--shard-timeout", "1e300"],
            "--shard-timeout: expected seconds in (0, 1e+09] or inf (no limit), got '1e300'",
        ),
        (["--shard-timeout", "nan"], "--shard-timeout: expected seconds in (0, 1e+09] or inf (no limit), got 'nan'"),
        (["--shard-timeout", "-5"], "--shard-timeout: expected seconds in (0, 1e+09] or inf (no limit), got '-5'"),
        (["--shard-timeout", "soon"], "--shard-timeout: expected seconds in (0, 1e+09] or inf (no limit), got 'soon'"),
        (["--workers", str(2**40)], "--workers: expected an integer in [1, 2147483647]"),
    ],
)
def test_cli_distributed_numbers_are_bounded_before_ray_starts(
    monkeypatch, model_path, tmp_path, capsys, flag, message
):
    monkeypatch.setattr(driver, "import_ray", _RayMustNotStart)
    data = save_npy_shards(tmp_path, [8])[0]
    argv = ["calibrate", model_path, "--data", data, "--cache", (tmp_path / "c.json").as_posix(), "--workers", "1"]
    assert cli_main([*argv, *flag]) == 2
    assert message in capsys.readouterr().err


def test_cli_an_infinite_shard_timeout_is_no_limit(monkeypatch, model_path, tmp_path):
    seen = {}

    def calibrate_distributed(model, shards, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(histocal.distributed, "calibrate_distributed", calibrate_distributed)
    data = save_npy_shards(tmp_path, [8])[0]
    argv = ["calibrate", model_path, "--data", data, "--cache", (tmp_path / "c.json").as_posix(), "--workers", "1"]
    assert cli_main([*argv, "--shard-timeout", "inf"]) == 1
    assert seen["shard_timeout"] == float("inf")


def test_cli_workers_refuse_settings_as_one_process_before_ray_starts(monkeypatch, model_path, tmp_path, capsys):
    monkeypatch.setattr(driver, "import_ray", _RayMustNotStart)
    data = save_npy_shards(tmp_path, [8])[0]
    base = ["calibrate", model_path, "--data", data, "--method", "entropy", "--per-channel", "--mode", "exact"]
    base += ["--cache", (tmp_path / "c.json").as_posix()]
    errors = []
    for extra in ([], ["--workers", "2"]):
        assert cli_main([*base, *extra]) == 1
        errors.append(capsys.readouterr().err)
    assert errors[0] == errors[1] != ""
    assert "streaming mode only (mode='exact' given)" in errors[1]


def test_cli_per_channel_on_workers_writes_the_single_process_state(
    local_ray, model_path, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("HISTOCAL_NUM_THREADS", "1")  # the one process at the workers' thread count
    data = save_npy_shards(tmp_path, [8])[0]
    one, sharded = tmp_path / "one.hcs", tmp_path / "sharded.hcs"
    base = ["calibrate", model_path, "--data", data, "--method", "entropy", "--per-channel", "--no-progress"]
    assert cli_main([*base, "--state", one.as_posix()]) == 0
    argv = [*base, "--state", sharded.as_posix(), "--workers", "2", "--shards", "3", "--shard-timeout", "120"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert "3 shards on Ray" in capsys.readouterr().out
    assert CalibrationState.load(sharded).channels is not None
    assert_same_state(CalibrationState.load(sharded), CalibrationState.load(one))
