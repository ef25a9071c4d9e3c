"""Save/load time and size of a CalibrationState of 700 tensors x 2048 bins.

The state is built directly (no model): synthetic float32 batches per tensor collected into an
exact ``_core.Histograms`` (value kind, 2048 bins, like an exact PercentileCalibrater) and into a
``_core.StreamHistograms`` (what every histocal calibrator also keeps; default 16384 bins, or
``--streaming-bins``).

    python3 benches/bench_state.py [--tensors 700] [--bins 2048] [--streaming-bins 16384] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from histocal import _core
from histocal.state import CalibrationState, Collection


def build(n_tensors: int, bins: int, streaming_bins: int, seed: int = 0) -> CalibrationState:
    rng = np.random.default_rng(seed)
    exact = _core.Histograms("value", bins)
    stream = _core.StreamHistograms(streaming_bins)
    for i in range(0, n_tensors, 50):
        items = []
        for k in range(i, min(i + 50, n_tensors)):
            scale = float(10 ** rng.uniform(-2, 2))
            items.append((f"tensor_{k:04d}", [rng.normal(0, scale, 20000).astype(np.float32) for _ in range(2)]))
        exact.collect(items)
        stream.collect(items)
    return CalibrationState(
        Collection("exact", stream, exact),
        model_fingerprint="0" * 64,
        method="percentile",
        settings={
            "symmetric": False,
            "num_bins": bins,
            "num_quantized_bins": 128,
            "percentile": 99.999,
            "scenario": "same",
        },
    )


def timed(f, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=700)
    ap.add_argument("--bins", type=int, default=2048)
    ap.add_argument("--streaming-bins", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    state = build(a.tensors, a.bins, a.streaming_bins)
    with tempfile.TemporaryDirectory() as d:
        for compress in (False, True):
            path = os.path.join(d, f"state{int(compress)}.npz")
            t_save = timed(lambda: state.save(path, compress=compress), a.runs)
            t_load = timed(lambda: CalibrationState.load(path), a.runs)
            loaded = CalibrationState.load(path)
            assert loaded.to_bytes() == state.to_bytes()
            t_compute = timed(lambda: loaded.compute("percentile", num_bins=a.bins, symmetric=False), 3)
            print(
                f"{a.tensors} tensors x {a.bins} exact bins + {a.streaming_bins} streaming bins, "
                f"compress={compress}: size {os.path.getsize(path) / 1e6:.2f} MB, "
                f"save {t_save * 1e3:.0f} ms, load {t_load * 1e3:.0f} ms (median of {a.runs}); "
                f"compute(percentile) from the loaded state {t_compute * 1e3:.0f} ms"
            )


if __name__ == "__main__":
    main()
