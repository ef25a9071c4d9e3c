"""Each benchmark script behind BENCHMARKS.md runs to the end at its smallest size, so the scripts
cannot rot between measurements. Every script of benches/ must have an entry (a new bench without
one fails here); the sizes are the smallest each script offers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = ROOT / "benches"

SMOKE_ARGS = {
    "bench_adaptive_exact.py": ["--cnn", "32", "--samples", "2", "--repeat", "1", "--warmup", "0"],
    # The real models (PyPI wheels) are not in CI: re-score the recorded measurements instead.
    "bench_auto_real.py": ["--rescore", "benches/RESULTS_auto_real.json"],
    "bench_bounds.py": ["--size", "32", "--samples", "2", "--repeat", "1"],
    "bench_calibrate.py": ["--quick", "--no-growth"],
    "bench_channel_ratio.py": ["--streaming-bins", "128", "--batches", "1", "--rounds", "1"],
    "bench_collector.py": ["--quick"],
    "bench_diagnose.py": ["--models", "encoder", "--calibration", "2", "--held-back", "2"],
    "bench_distributed.py": ["--quick", "--samples", "2", "--shards", "2", "--max-workers", "1", "--repeat", "1"],
    "bench_floor.py": ["--sizes", "32", "--samples", "2", "--repeat", "1", "--warmup", "0"],
    "bench_isotone.py": ["--smoke"],
    "bench_long_stream.py": ["--tensors", "4", "--batches", "10"],
    "bench_method_compute.py": ["--smoke"],
    # The matrix's models are PyPI wheels (tests/quantize/test_real_models.py runs a subset of its
    # cells): rebuild the table from the recorded run instead.
    "bench_model_matrix.py": ["--markdown-from", "benches/RESULTS_model_matrix.json"],
    "bench_methods.py": ["--quick", "--models", "cnn", "--calib", "2", "--held", "2"],
    "bench_overlap.py": ["--samples", "2", "--saved", "1", "--repeat", "1"],
    "bench_per_channel.py": ["--streaming-bins", "128", "--batches", "1", "--runs", "1"],
    "bench_quantize_memory.py": ["--quick", "--samples", "2", "--methods", "Percentile"],
    "bench_quark.py": ["--batches", "2", "--shape", "2x4x8x8"],
    # Side by side with amd-quark 0.13, which needs torch and is never installed in CI: only its
    # arguments are checked here (it imports Quark once it runs).
    "bench_quark013.py": ["--help"],
    "bench_search_time.py": ["--smoke", "--skip-ort"],
    "bench_setup.py": ["--sizes", "20", "--models", ""],
    "bench_state.py": ["--tensors", "4", "--bins", "128", "--streaming-bins", "256", "--runs", "1"],
}


def test_every_bench_has_a_smoke_run():
    assert sorted(p.name for p in BENCHES.glob("bench_*.py")) == sorted(SMOKE_ARGS)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("script", sorted(SMOKE_ARGS))
def test_bench_runs_at_its_smallest_size(script, tmp_path):
    env = {**os.environ, "HISTOCAL_NUM_THREADS": "2"}
    run = subprocess.run(
        [sys.executable, f"benches/{script}", *SMOKE_ARGS[script]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{script} exited {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
