"""How long the threshold searches take as histograms grow, which sets the default of
``HISTOCAL_MAX_SEARCH_WORK``, and how fast Ctrl-C stops a running search.

    python3 benches/bench_search_time.py [--out benches/RESULTS_search_time.md]

* entropy (ORT's search, num_quantized_bins 128) on one tensor's histogram of n bins (1M
  N(0, 1) float32 values), histocal at 47,536 / 144,456 / 346,000 bins (the last is the default
  limit, 3e10 bin evaluations) and ORT at 5,000 / 20,000 bins; time per bin evaluation
  (``entropy_work``: the candidates' slice lengths);
* the float16 outlier case: |x| ~ 3, then a batch with 65504: time until histocal's error;
* SIGINT during an entropy search over 1M bins (limit lifted): time until KeyboardInterrupt;
* mse int16 (asymmetric and symmetric) on 2^22 and 2^25 streaming bins (Cauchy data), the
  largest search without a limit.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time

import numpy as np

import histocal
from histocal import _core
from histocal.methods.scale_rule import SCALE_RULE

LIMIT_VAR = "HISTOCAL_MAX_SEARCH_WORK"


def entropy_work(n_bins: int, nq: int = 128) -> int:
    zb, hq = n_bins // 2, nq // 2
    return (zb + 1) ** 2 - hq**2 - (n_bins % 2 == 0)


def entropy_time(make, n_bins: int, data: np.ndarray) -> float:
    c = make("entropy", False, n_bins, 128, 99.999, "same")
    c.collect({"x": [data]})
    start = time.perf_counter()
    c.compute_collection_result()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--skip-ort", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="small searches: the code paths in seconds")
    args = ap.parse_args()
    os.environ.pop(LIMIT_VAR, None)
    lines = [f"threads: {histocal.get_num_threads()}, load average: {os.getloadavg()[0]:.2f}", ""]
    data = np.random.default_rng(0).normal(0, 1, 1_000_000).astype(np.float32)

    lines += ["| search | bins | bin evaluations | time (s) | ns per bin evaluation |", "|---|---:|---:|---:|---:|"]
    for n in (4_096,) if args.smoke else (47_536, 144_456, 346_000):
        dt = entropy_time(histocal.HistogramCollector, n, data)
        lines.append(
            f"| histocal entropy | {n} | {entropy_work(n):.3g} | {dt:.2f} | {dt / entropy_work(n) * 1e9:.2f} |"
        )
        print(lines[-1], flush=True)
    if not args.skip_ort:
        import logging

        from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector

        logging.disable(logging.INFO)
        for n in (4_096,) if args.smoke else (5_000, 20_000):
            dt = entropy_time(OrtCollector, n, data)
            lines.append(f"| ORT entropy | {n} | {entropy_work(n):.3g} | {dt:.2f} | {dt / entropy_work(n) * 1e9:.1f} |")
            print(lines[-1], flush=True)

    c = histocal.HistogramCollector("entropy", False, 128, 128, 99.999, "same")
    c.collect({"x": data[:4000].astype(np.float16)})
    c.collect({"x": np.array([65504, 1.0], np.float16)})
    bins = len(c.histogram_dict["x"][0])
    start = time.perf_counter()
    try:
        c.compute_collection_result()
        outcome = "no error"
    except ValueError:
        outcome = "ValueError"
    lines += [
        "",
        f"float16 outlier case: {bins} bins ({entropy_work(bins):.3g} bin evaluations): "
        f"{outcome} after {(time.perf_counter() - start) * 1e3:.2f} ms",
    ]
    print(lines[-1], flush=True)

    os.environ[LIMIT_VAR] = "inf"
    c = histocal.HistogramCollector("entropy", False, 1_000_000, 128, 99.999, "same")
    c.collect({"x": data[:1000]})
    sent: list[float] = []

    def interrupt() -> None:
        time.sleep(1.0)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        c.compute_collection_result()
        lines.append("SIGINT: the search finished first")
    except KeyboardInterrupt:
        lines.append(
            f"SIGINT 1 s into an entropy search over 1M bins: KeyboardInterrupt after "
            f"{(time.perf_counter() - sent[0]) * 1e3:.0f} ms"
        )
    print(lines[-1], flush=True)
    os.environ.pop(LIMIT_VAR)

    lines += ["", "| mse int16 | streaming bins | asymmetric (s) | symmetric (s) |", "|---|---:|---:|---:|"]
    cauchy = np.random.default_rng(1).standard_cauchy(100_000 if args.smoke else 4_000_000).astype(np.float32)
    for bins in (1 << 16,) if args.smoke else (1 << 22, 1 << 25):
        s = _core.StreamHistograms(bins)
        s.collect([("x", [cauchy])])
        times = []
        for symmetric in (False, True):
            start = time.perf_counter()
            s.ranges("mse", scale_rule=SCALE_RULE, qtype="int16", symmetric=symmetric)
            times.append(time.perf_counter() - start)
        lines.append(f"| one tensor | {bins} | {times[0]:.2f} | {times[1]:.2f} |")
        print(lines[-1], flush=True)
        del s

    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write("# Search time (benches/bench_search_time.py)\n\n" + text)
    else:
        print(text)


if __name__ == "__main__":
    main()
