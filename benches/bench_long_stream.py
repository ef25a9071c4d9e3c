"""Peak memory of one ``collect_data`` call over a long stream of tiny batches.

A model of ``--tensors`` calibrated tensors (a chain of Relu/Neg on X[N, 4]) is calibrated with
PercentileCalibrater on N batches of one 1x4 feed, in exact mode with a memory budget of 0 (a
callable: every batch runs twice, nothing is kept) and in streaming mode, each N in a fresh
interpreter. The peak RSS (VmHWM) is what the process needed;
with memory that is flat per batch it does not grow with N.

    python3 benches/bench_long_stream.py [--tensors 100] [--batches 1000,10000,100000] [--out FILE]

Runs whatever ``histocal`` the interpreter imports (set PYTHONPATH to compare two checkouts).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
import histocal

model, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
feed = {"X": np.ones((1, 4), np.float32)}
cal = histocal.PercentileCalibrater(model, mode=mode, show_progress=False, memory_budget=0)
cal.augment_graph()
cal.create_inference_session()
t = time.perf_counter()
cal.collect_data(lambda: (feed for _ in range(n)))
seconds = time.perf_counter() - t
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "peak_rss_mib": hwm / 1024, "tensors": len(cal.state.names)}))
"""


def chain_model(path: Path, tensors: int) -> None:
    import onnx
    from support.graphs import GraphBuilder, tensor

    g, prev = GraphBuilder(), "X"
    for i in range(tensors - 1):
        prev = g.node("Relu" if i % 2 == 0 else "Neg", [prev], output=f"t{i}")
    onnx.save(g.model("chain", [tensor("X", ["N", 4])], [tensor(prev, ["N", 4])]), path.as_posix())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--batches", default="1000,10000,100000")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    counts = [int(x) for x in a.batches.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp, "chain.onnx")
        chain_model(model, a.tensors)
        for mode in ("exact", "streaming"):
            for n in counts:
                t = time.perf_counter()
                run = subprocess.run(
                    [sys.executable, "-c", CHILD, model.as_posix(), mode, str(n)],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=tmp,
                )
                r = json.loads(run.stdout.strip().splitlines()[-1])
                rows.append((mode, n, r))
                print(
                    f"{mode:9} {n:>7} batches: peak RSS {r['peak_rss_mib']:.1f} MiB, "
                    f"{r['seconds']:.1f} s ({time.perf_counter() - t:.1f} s with start-up)",
                    flush=True,
                )
    lines = [
        f"{rows[0][2]['tensors']} calibrated tensors, one 1x4 float32 feed per batch, PercentileCalibrater.",
        "",
        "| mode | batches | peak RSS (MiB) | collect_data (s) |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {m} | {n} | {r['peak_rss_mib']:.1f} | {r['seconds']:.1f} |" for m, n, r in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
