"""Bounded time for the threshold searches: the work limit checked before a search starts
(``HISTOCAL_MAX_SEARCH_WORK``), and Ctrl-C (SIGINT) stopping a running search promptly.

ORT's entropy search is quadratic in the histogram's bin count, and a histogram grows without
bound when a later collect has a much wider range: a float16 tensor of |x| ~ 3 followed by a
batch holding 65504 grows to ~2.1M bins, a search of 1.2e12 bin evaluations (12 minutes to an
hour on two cores). The tests that would hang without the limit run in a subprocess with a
timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from support.parity import run_ort

import histocal
from histocal.methods.scale_rule import SCALE_RULE

TESTS = Path(__file__).parents[1]  # tests/, the folder holding the support package
LIMIT_VAR = "HISTOCAL_MAX_SEARCH_WORK"


def entropy_work(n_bins: int, num_quantized_bins: int) -> int:
    """The entropy search's work as ORT's loop defines it: the candidates' slice lengths."""
    zb, hq = n_bins // 2, num_quantized_bins // 2
    return sum(min(zb + i + 1, n_bins) - (zb - i) for i in range(hq, zb + 1))


def kl_work(num_bins: int, num_quantized_bins: int) -> int:
    """The kl search's worst case: two literal sums of 8 units per bin for every candidate."""
    return 2 * 8 * sum(range(num_quantized_bins, num_bins + 1)) + num_bins


def sci(x: float) -> str:
    """``x`` as the error messages write it (Rust's ``{:.2e}``: 1.16e12)."""
    return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", f"{x:.2e}")


def run_python(body: str, timeout: float) -> subprocess.CompletedProcess:
    """``body`` in a fresh interpreter (tests/ importable) with the default limit."""
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent(body)
    env = {k: v for k, v in os.environ.items() if k != LIMIT_VAR}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)


# ----------------------------------------------------------------------------------------------
# The defect: a float16 outlier batch
# ----------------------------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.parametrize("outlier", ["65504", "np.finfo(np.float16).min"])
def test_float16_outlier_batch_is_a_prompt_clear_error(outlier):
    """|x| ~ 3, then a batch with +-65504 (or a finfo(float16).min mask): ORT raises
    OverflowError at once; histocal grows the histogram to ~2.1M bins, whose search would take
    12 minutes to an hour. It must refuse at once, naming the tensor and the bin count."""
    r = run_python(
        f"""
        import time
        import numpy as np, histocal
        c = histocal.HistogramCollector("entropy", False, 128, 128, 99.999, "same")
        c.collect({{"x": np.random.default_rng(0).normal(0, 1, 4000).astype(np.float16)}})
        c.collect({{"x": np.array([{outlier}, 1.0, -2.0], np.float16)}})
        print(len(c.histogram_dict["x"][0]))
        t = time.perf_counter()
        try:
            c.compute_collection_result()
        except ValueError as e:
            print(f"{{time.perf_counter() - t:.3f}}")
            print(e)
    """,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    bins, seconds, message = r.stdout.splitlines()[:3]
    assert int(bins) > 2_000_000
    assert float(seconds) < 1.0
    assert message.startswith(f'tensor "x": the entropy search over its histogram of {bins} bins (grown from 128 bins')
    assert f"needs {sci(entropy_work(int(bins), 128))} bin evaluations" in message
    assert f"set the environment variable {LIMIT_VAR}=" in message


@pytest.mark.subprocess
def test_float16_model_outlier_batch_through_the_calibrator(tmp_path):
    """The same through a float16 model's calibrator (exact mode): compute_data refuses promptly."""
    r = run_python(
        f"""
        import numpy as np, onnx, histocal
        from support import models
        from onnxruntime.quantization.calibrate import CalibrationMethod
        path = {str(tmp_path / "fp16.onnx")!r}
        onnx.save(models.fp16(), path)
        class Reader:
            def __init__(self, feeds): self.feeds = iter(feeds)
            def get_next(self): return next(self.feeds, None)
        cal = histocal.create_calibrator(path, None, {str(tmp_path / "aug.onnx")!r},
                                         CalibrationMethod.Entropy, extra_options={{"CollectionMode": "exact"}})
        cal.collect_data(Reader(models.vector_feeds(4, width=16, dtype=np.float16)))
        x = np.ones((1, 16), np.float16); x[0, 3] = 65504; x[0, 5] = -65504
        cal.collect_data(Reader([{{"X": x}}]))
        try:
            cal.compute_data()
        except ValueError as e:
            print(e)
    """,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.match(r'tensor "X": the entropy search over its histogram of \d{7} bins \(grown from 128 bins', r.stdout)
    assert LIMIT_VAR in r.stdout


# ----------------------------------------------------------------------------------------------
# The limit
# ----------------------------------------------------------------------------------------------

CFG = dict(method="entropy", symmetric=False, num_bins=1024, num_quantized_bins=128, percentile=99.999, scenario="same")


def _collects():
    rng = np.random.default_rng(3)
    return [{"small": rng.normal(0, 1, 500).astype(np.float32), "big": rng.normal(0, 2, 3000).astype(np.float32)}]


@pytest.mark.parity
def test_limit_is_checked_before_the_search_and_names_tensor_and_bins(monkeypatch):
    collects = _collects()
    work = entropy_work(1024, 128)
    hc = histocal.HistogramCollector(**CFG)
    for c in collects:
        hc.collect(c)
    monkeypatch.setenv(LIMIT_VAR, str(work - 1))
    with pytest.raises(ValueError) as info:
        hc.compute_collection_result()
    message = str(info.value)
    # the first tensor over the limit, by collection order; its histogram did not grow
    assert message.startswith('tensor "small": the entropy search over its histogram of 1024 bins needs ')
    assert f"needs {sci(work)} bin evaluations, above the limit of {sci(work - 1)} " in message
    assert f"set the environment variable {LIMIT_VAR}=" in message
    raise_to = float(message.rsplit("=", 1)[1].split()[0])
    assert raise_to >= work
    # At the limit the search runs, with ORT's result.
    monkeypatch.setenv(LIMIT_VAR, f"{raise_to}")
    ours = hc.compute_collection_result()
    ref = run_ort(CFG, collects)
    assert ref.error is None
    for name in ("small", "big"):
        assert ours[name][0] == ref.result[name][0] and ours[name][1] == ref.result[name][1], name


def test_default_limit(monkeypatch):
    """3e10 bin evaluations (entropy over about 346,000 bins, tens of seconds on two cores; ORT
    would take over an hour). ORT's defaults (128 bins) are far below it."""
    monkeypatch.delenv(LIMIT_VAR, raising=False)
    hc = histocal.HistogramCollector(**{**CFG, "num_bins": 128})
    hc.collect(_collects()[0])
    assert set(hc.compute_collection_result()) == {"small", "big"}
    assert entropy_work(346_000, 128) < 3e10 < entropy_work(347_000, 128)
    hc = histocal.HistogramCollector(**{**CFG, "num_bins": 347_000})
    hc.collect({"t": np.arange(10, dtype=np.float32)})
    with pytest.raises(
        ValueError,
        match=r"^tensor \"t\": the entropy search over its histogram of 347000 bins needs .* above the limit of 3\.00e10 ",
    ):
        hc.compute_collection_result()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "1e"])
def test_bad_limit_value_is_a_clear_error(monkeypatch, value):
    hc = histocal.HistogramCollector(**CFG)
    hc.collect(_collects()[0])
    monkeypatch.setenv(LIMIT_VAR, value)
    with pytest.raises(ValueError, match=f'^{LIMIT_VAR} must be a number >= 1 \\(or inf\\), got "{value}"$'):
        hc.compute_collection_result()
    # empty is unset: the default
    monkeypatch.setenv(LIMIT_VAR, " ")
    assert set(hc.compute_collection_result()) == {"small", "big"}


def test_kl_limit_names_num_bins(monkeypatch):
    """kl's search is quadratic in its num_bins setting in the worst case (literal sums)."""
    monkeypatch.delenv(LIMIT_VAR, raising=False)
    s = histocal._core.StreamHistograms(1 << 12)
    s.collect([("t", [np.random.default_rng(4).normal(0, 1, 1000).astype(np.float32)])])
    assert s.ranges("kl", scale_rule=SCALE_RULE, num_bins=2048)[0][1] > 0
    with pytest.raises(ValueError) as info:
        s.ranges("kl", scale_rule=SCALE_RULE, num_bins=1_000_000)
    message = str(info.value)
    assert message.startswith("kl with num_bins=1000000: the search needs ")
    assert f"needs {sci(kl_work(1_000_000, 128))} bin evaluations" in message and LIMIT_VAR in message
    monkeypatch.setenv(LIMIT_VAR, "inf")
    assert s.ranges("kl", scale_rule=SCALE_RULE, num_bins=20_000)[0][1] > 0


# ----------------------------------------------------------------------------------------------
# Ctrl-C
# ----------------------------------------------------------------------------------------------

_SEARCHES = {
    # 1M bins: ~2.5e11 bin evaluations, minutes of work
    "entropy": """
        c = histocal.HistogramCollector("entropy", False, 1_000_000, 128, 99.999, "same")
        c.collect({"x": np.linspace(-1, 1, 1000, dtype=np.float32)})
        search = c.compute_collection_result
    """,
    # three non-zero values over 2M bins: the series cannot serve, every candidate is a literal sum
    "kl": """
        s = histocal._core.StreamHistograms(1 << 22)
        s.collect([("x", [np.array([1e-3, 0.7, -3.0], np.float32)]), ("y", [np.array([2e-3, 1.0], np.float32)])])
        search = lambda: s.ranges("kl", scale_rule=histocal.methods.scale_rule.SCALE_RULE, num_bins=2_000_000)
    """,
}


@pytest.mark.subprocess
@pytest.mark.parametrize("method", sorted(_SEARCHES))
def test_sigint_stops_a_long_search_promptly(method):
    """SIGINT one second into a minutes-long search (4 worker threads, limit lifted): the
    KeyboardInterrupt surfaces within 2 s, and the pool is free at once for the next search
    (every worker stopped)."""
    body = f"""
        import time
        import numpy as np, histocal
        {textwrap.indent(textwrap.dedent(_SEARCHES[method]), "        ").strip()}
        print("ready", flush=True)
        try:
            search()
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        t = time.perf_counter()
        c = histocal.HistogramCollector("entropy", False, 4096, 128, 99.999, "same")
        c.collect({{"y": np.linspace(-1, 1, 1000, dtype=np.float32)}})
        c.compute_collection_result()
        print(f"next {{time.perf_counter() - t:.3f}}", flush=True)
    """
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent(body)
    env = {**os.environ, LIMIT_VAR: "inf", "HISTOCAL_NUM_THREADS": "4"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    # where the search does not stop, the readline below would wait for minutes
    watchdog = threading.Timer(60, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(1.0)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        line = proc.stdout.readline().strip()
        elapsed = time.perf_counter() - sent
        assert line == "interrupted", (line, proc.stderr.read() if line == "" else "")
        assert elapsed < 2.0, f"KeyboardInterrupt after {elapsed:.2f} s"
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-3000:]
        assert float(out.split()[-1]) < 1.0, out
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
