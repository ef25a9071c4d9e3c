#!/usr/bin/env python3
"""histocal.HistogramCollector vs onnxruntime's HistogramCollector, in one run.

(a) ``collect`` of 64Mi float32 values (16 batches of 4Mi, as ORT receives per-batch outputs)
    into 2048 bins: a first collect (new histogram) and a merge collect (a second call whose
    range is larger, so the histogram grows), for the value histogram (percentile with
    symmetric=False; entropy's collect is the same path and is reported too) and, as an extra,
    the |x| histogram of symmetric percentile.
(b) ``compute_collection_result`` for method='entropy' (2048 bins, 128 quantized bins) over the
    activation histograms of a small conv/relu CNN (~100 intermediate tensors) run with
    onnxruntime, and a check that every threshold is identical to ORT's.
(c) the streaming histogram's add (``_core.StreamHistograms``, 16384 bins, what streaming
    calibration and exact mode's state feed per batch; no ORT counterpart): the (a) batches as
    float32, their ReLU (half exact zeros), and the first four as float16 and float64, in GB/s
    of input.

histocal is timed with its default thread count and with 1 thread. ORT's print() output is
silenced while it is timed. Times are medians of the repeats (perf_counter).

Usage:
    python3 benches/bench_collector.py            # full sizes (a few minutes on 2 cores)
    python3 benches/bench_collector.py --quick    # smoke test, a few seconds
    python3 benches/bench_collector.py --only stream   # one section: collect, entropy or stream
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector
from support.graphs import GraphBuilder, tensor

import histocal

NUM_BINS = 2048
NUM_QUANTIZED_BINS = 128


# ----------------------------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def quiet():
    """Swallow ORT's print() output."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_s(x: float) -> str:
    if x != x:  # NaN
        return "-"
    if x >= 10:
        return f"{x:.1f} s"
    if x >= 1:
        return f"{x:.2f} s"
    if x >= 0.1:
        return f"{x * 1e3:.0f} ms"
    if x >= 1e-3:
        return f"{x * 1e3:.3g} ms"
    return f"{x * 1e6:.3g} µs"


def fmt_ratio(x: float) -> str:
    if x != x:
        return "-"
    return f"{x:.0f}x" if x >= 100 else f"{x:.1f}x"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def core_build() -> str:
    """Which compiled core was loaded (others may rebuild it during a run)."""
    import hashlib

    path = histocal._core.__file__
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:12]
        mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(path)))
        return f"{os.path.basename(path)} sha256 {digest}, built {mtime}"
    except OSError:
        return os.path.basename(path)


def set_threads(n: int) -> None:
    """n = 0: histocal's default pool (HISTOCAL_NUM_THREADS or all cores)."""
    histocal.set_num_threads(n)


@dataclass
class Row:
    name: str
    ort: list[float] = field(default_factory=list)
    hc: list[float] = field(default_factory=list)  # histocal, default threads
    hc1: list[float] = field(default_factory=list)  # histocal, 1 thread
    nbytes: int = 0  # input bytes (for GB/s), 0 if not meaningful
    per: int = 0  # divide times by this for a per-item figure (e.g. per tensor), 0 = no

    def med(self, which: str) -> float:
        return median(getattr(self, which))


# ----------------------------------------------------------------------------------------------
# (a) collect of a large tensor


def activation_batches(rng: np.random.Generator, n_batches: int, batch: int, scale: float) -> list[np.ndarray]:
    """Conv-output-like activations: normal, with per-batch scale jitter and a heavier tail."""
    out = []
    for _ in range(n_batches):
        x = rng.standard_normal(batch, dtype=np.float32)
        x *= np.float32(scale * rng.uniform(0.9, 1.1))
        # ~0.1% outliers 3x wider (real activations are heavier-tailed than a normal).
        k = batch // 1000
        idx = rng.integers(0, batch, size=k)
        x[idx] *= np.float32(3.0)
        out.append(x)
    return out


def bench_collect(
    label: str,
    method: str,
    symmetric: bool,
    first: list[np.ndarray],
    merge: list[np.ndarray],
    reps_hc: int,
    reps_hc1: int,
    reps_ort: int,
    default_threads: int,
) -> tuple[Row, Row, str]:
    """Time first + merge collect for ORT and histocal (both thread settings), interleaved."""
    nbytes_first = sum(a.nbytes for a in first)
    nbytes_merge = sum(a.nbytes for a in merge)
    r_first = Row(f"(a) {label}: first collect", nbytes=nbytes_first)
    r_merge = Row(f"(a) {label}: merge collect (range grows)", nbytes=nbytes_merge)
    args = (method, symmetric, NUM_BINS, NUM_QUANTIZED_BINS, 99.999, "same")
    last = {}

    def one(kind: str) -> None:
        if kind == "ort":
            c = OrtCollector(*args)
        else:
            set_threads(1 if kind == "hc1" else default_threads)
            c = histocal.HistogramCollector(*args)
        gc.collect()
        with quiet():
            t0 = time.perf_counter()
            c.collect({"x": first})
            t1 = time.perf_counter()
            c.collect({"x": merge})
            t2 = time.perf_counter()
        getattr(r_first, kind).append(t1 - t0)
        getattr(r_merge, kind).append(t2 - t1)
        last[kind] = c

    for i in range(max(reps_hc, reps_hc1, reps_ort)):
        if i < reps_hc:
            one("hc")
        if i < reps_hc1:
            one("hc1")
        if i < reps_ort:
            one("ort")
    set_threads(default_threads)

    # Same histogram as ORT?
    check = "not checked"
    if "ort" in last and "hc" in last:
        o = last["ort"].histogram_dict["x"]
        h = last["hc"].histogram_dict["x"]
        same = (
            len(o) == len(h)
            and np.array_equal(o[0], h[0])
            and np.array_equal(o[1], h[1])
            and o[1].dtype == h[1].dtype
            and all(np.asarray(a) == np.asarray(b) for a, b in zip(o[2:], h[2:]))
        )
        check = f"identical to ORT ({len(h[0])} bins after merge)" if same else "DIFFERS from ORT"
    return r_first, r_merge, check


def diagnostics_collect(batches: list[np.ndarray], default_threads: int, reps: int) -> list[str]:
    """Where histocal's collect time goes: scan-only pass vs. full collect, by size and threads."""
    lines = []
    flat = np.concatenate(batches)
    for threads in sorted({1, default_threads}):
        set_threads(threads)
        scan = []
        for _ in range(reps):
            t0 = time.perf_counter()
            histocal.tensor_stats(flat)
            scan.append(time.perf_counter() - t0)
        ts = median(scan)
        lines.append(
            f"  threads={threads}: scan only (tensor_stats, min/max/counts) on {flat.size / 2**20:.3g}Mi values: "
            f"{fmt_s(ts)} = {flat.nbytes / ts / 1e9:.2f} GB/s"
        )
        for nb in sorted({1, max(1, len(batches) // 4), len(batches)}):
            sub = batches[:nb]
            n = sum(a.size for a in sub)
            ts = []
            for _ in range(reps):
                c = histocal.HistogramCollector("percentile", False, NUM_BINS, NUM_QUANTIZED_BINS, 99.999, "same")
                t0 = time.perf_counter()
                c.collect({"x": sub})
                ts.append(time.perf_counter() - t0)
            t = median(ts)
            lines.append(
                f"  threads={threads}: first collect of {n / 2**20:.3g}Mi values ({nb} batches): {fmt_s(t)} "
                f"= {t / n * 1e9:.2f} ns/value, {n * 4 / t / 1e9:.2f} GB/s"
            )
    set_threads(default_threads)
    del flat
    return lines


# ----------------------------------------------------------------------------------------------
# (b) entropy thresholds over CNN activations


def build_cnn(n_blocks: int, channels: int, hw: int, seed: int) -> onnx.ModelProto:
    """Residual conv blocks (Conv -> act -> Add skip -> Mul rescale) and a small classifier head.

    Activations vary per block: Relu, Clip(0, 6) (Relu6) and LeakyRelu. All intermediate tensors
    are graph outputs.
    """
    g = GraphBuilder(seed)
    rng = g.rng
    outputs = []
    x = "input"
    fan_in = channels * 9

    def const(name: str, arr: np.ndarray) -> str:
        return g.const(np.asarray(arr).astype(np.float32), name)

    const("relu6_lo", np.array(0.0))
    const("relu6_hi", np.array(6.0))
    for i in range(n_blocks):
        gain = rng.uniform(0.8, 1.2)
        w = rng.standard_normal((channels, channels, 3, 3)) * gain * np.sqrt(1.0 / fan_in)
        b = rng.standard_normal(channels) * 0.1
        conv, act, add, out = f"b{i}_conv", f"b{i}_act", f"b{i}_add", f"b{i}_out"
        g.node(
            "Conv", [x, const(f"b{i}_w", w), const(f"b{i}_b", b)], output=conv, kernel_shape=[3, 3], pads=[1, 1, 1, 1]
        )
        kind = i % 3
        if kind == 0:
            g.node("Relu", [conv], output=act)
        elif kind == 1:
            g.node("Clip", [conv, "relu6_lo", "relu6_hi"], output=act)
        else:
            g.node("LeakyRelu", [conv], output=act, alpha=0.1)
        g.node("Add", [act, x], output=add)
        g.node("Mul", [add, const(f"b{i}_s", np.array(rng.uniform(0.65, 0.8)))], output=out)
        outputs += [conv, act, add, out]
        x = out
    # head
    g.node("GlobalAveragePool", [x], output="gap")
    g.node("Flatten", ["gap"], output="flat")
    wfc = rng.standard_normal((10, channels)) / np.sqrt(channels)
    g.node("Gemm", ["flat", const("fc_w", wfc), const("fc_b", np.zeros(10))], output="logits", transB=1)
    outputs += ["gap", "flat"]
    shapes = {"logits": [1, 10], "gap": [1, channels, 1, 1], "flat": [1, channels]}
    return g.model(
        "histocal_bench_cnn",
        [tensor("input", [1, channels, hw, hw])],
        [tensor(o, shapes.get(o, [1, channels, hw, hw])) for o in ["logits", *outputs]],
    )


def image_like(rng: np.random.Generator, channels: int, hw: int, contrast: float) -> np.ndarray:
    """Smooth random 'images': upsampled low-res noise plus fine noise, normalised, scaled."""
    low = rng.standard_normal((1, channels, hw // 8, hw // 8))
    img = np.kron(low, np.ones((1, 1, 8, 8))) + 0.3 * rng.standard_normal((1, channels, hw, hw))
    img = (img - img.mean()) / img.std()
    return (img * contrast).astype(np.float32)


def cnn_activations(
    n_blocks: int, n_inputs: int, channels: int, hw: int, seed: int
) -> tuple[list[str], list[list[np.ndarray]]]:
    model = build_cnn(n_blocks, channels, hw, seed)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs() if o.name != "logits"]
    rng = np.random.default_rng(seed + 1)
    # Contrast varies per input, so later collect calls can exceed the range (histograms grow).
    runs = []
    for _k in range(n_inputs):
        img = image_like(rng, channels, hw, contrast=rng.uniform(0.7, 1.5))
        runs.append(sess.run(names, {"input": img}))
    return names, runs


def collect_calls(names: list[str], runs: list[list[np.ndarray]], per_call: int) -> list[dict]:
    """ORT's strided calibration: one collect() per stride, each a list of per-batch outputs."""
    calls = []
    for s in range(0, len(runs), per_call):
        chunk = runs[s : s + per_call]
        calls.append({n: [r[j] for r in chunk] for j, n in enumerate(names)})
    return calls


def compare_thresholds(ort_res: dict, hc_res: dict) -> tuple[int, int, list[str]]:
    problems = []
    matches = 0
    keys = list(dict.fromkeys(list(ort_res) + list(hc_res)))
    for k in keys:
        if k not in ort_res or k not in hc_res:
            problems.append(f"{k}: only in {'ORT' if k in ort_res else 'histocal'}")
            continue
        o, h = ort_res[k], hc_res[k]
        same = (
            len(o) == len(h)
            and np.asarray(o[0]) == np.asarray(h[0])
            and np.asarray(o[1]) == np.asarray(h[1])
            and np.asarray(o[0]).dtype == np.asarray(h[0]).dtype
            and np.asarray(o[1]).dtype == np.asarray(h[1]).dtype
            and np.array_equal(o[2], h[2])
            and np.array_equal(o[3], h[3])
        )
        if same:
            matches += 1
        else:
            problems.append(
                f"{k}: ORT ({o[0]!r}, {o[1]!r}) vs histocal ({h[0]!r}, {h[1]!r}); "
                f"hist equal={np.array_equal(o[2], h[2])}, edges equal={np.array_equal(o[3], h[3])}"
            )
    return matches, len(keys), problems


def bench_entropy(
    calls: list[dict], n_bins: int, n_qbins: int, reps_hc: int, reps_hc1: int, reps_ort: int, default_threads: int
):
    args = ("entropy", False, n_bins, n_qbins, 99.999, "same")
    n_tensors = len(calls[0])
    r_collect = Row(f"(b) collect: {n_tensors} CNN tensors, {len(calls)} calls", per=n_tensors)
    r_entropy = Row(
        f"(b) compute_collection_result entropy ({n_bins} bins, {n_qbins} quantized), {n_tensors} tensors",
        per=n_tensors,
    )

    def fresh(kind: str):
        c = OrtCollector(*args) if kind == "ort" else histocal.HistogramCollector(*args)
        gc.collect()
        with quiet():
            t0 = time.perf_counter()
            for call in calls:
                c.collect(call)
            getattr(r_collect, kind).append(time.perf_counter() - t0)
        return c

    ort_res = hc_res = None
    for i in range(max(reps_hc, reps_hc1, reps_ort)):
        for kind, reps in (("hc", reps_hc), ("hc1", reps_hc1), ("ort", reps_ort)):
            if i >= reps:
                continue
            if kind != "ort":
                set_threads(1 if kind == "hc1" else default_threads)
            c = fresh(kind)
            with quiet():
                t0 = time.perf_counter()
                res = c.compute_collection_result()
                getattr(r_entropy, kind).append(time.perf_counter() - t0)
            if kind == "ort":
                ort_res = res
            elif kind == "hc":
                hc_res = res
    set_threads(default_threads)
    bins = sorted(len(v[2]) for v in hc_res.values())
    return r_collect, r_entropy, ort_res, hc_res, bins


# ----------------------------------------------------------------------------------------------
# (c) streaming histogram


STREAM_BINS = 16384


def bench_stream(batches: list[np.ndarray], reps_hc: int, reps_hc1: int, default_threads: int) -> list[Row]:
    """``StreamHistograms.collect`` of whole batch lists, default threads and 1 thread."""
    sets = [
        ("float32 N(0,1)", batches),
        ("float32 ReLU (half zeros)", [np.maximum(b, np.float32(0)) for b in batches]),
        ("float16 N(0,1)", [b.astype(np.float16) for b in batches[:4]]),
        ("float64 N(0,1)", [b.astype(np.float64) for b in batches[:4]]),
    ]
    rows = []
    for label, data in sets:
        n = sum(a.size for a in data)
        r = Row(f"(c) streaming add, {STREAM_BINS} bins: {n / 2**20:.3g}Mi {label}", nbytes=sum(a.nbytes for a in data))
        for i in range(max(reps_hc, reps_hc1)):
            for kind, reps in (("hc", reps_hc), ("hc1", reps_hc1)):
                if i < reps:
                    set_threads(1 if kind == "hc1" else default_threads)
                    s = histocal._core.StreamHistograms(STREAM_BINS)
                    t0 = time.perf_counter()
                    s.collect([("x", data)])
                    getattr(r, kind).append(time.perf_counter() - t0)
        rows.append(r)
        print(
            f"  {r.name}: {fmt_s(r.med('hc'))} ({r.nbytes / r.med('hc') / 1e9:.2f} GB/s, "
            f"{r.med('hc') / n * 1e9:.2f} ns/value), 1 thread {fmt_s(r.med('hc1'))} "
            f"({r.nbytes / r.med('hc1') / 1e9:.2f} GB/s)"
        )
        del data
    set_threads(default_threads)
    return rows


# ----------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, for a smoke test of a few seconds")
    ap.add_argument("--note", default="", help="free-text note printed with the machine info")
    ap.add_argument(
        "--only",
        nargs="+",
        choices=("collect", "entropy", "stream"),
        default=("collect", "entropy", "stream"),
        help="run only these sections: (a) collect, (b) entropy, (c) stream",
    )
    opts = ap.parse_args()

    if opts.quick:
        n_batches, batch = 4, 1 << 16
        reps_hc, reps_hc1, reps_ort = 3, 3, 2
        n_blocks, n_inputs, per_call = 2, 4, 2
        ent_bins, ent_qbins = 256, 32
        e_hc, e_hc1, e_ort = 3, 2, 1
        diag_reps = 2
    else:
        n_batches, batch = 16, 4 << 20  # 64Mi float32 values = 256 MiB per collect
        reps_hc, reps_hc1, reps_ort = 5, 3, 3
        n_blocks, n_inputs, per_call = 25, 8, 2  # 25*4 + 2 = 102 tensors, 4 collect calls
        ent_bins, ent_qbins = NUM_BINS, NUM_QUANTIZED_BINS
        e_hc, e_hc1, e_ort = 5, 3, 1
        diag_reps = 3

    t_start = time.perf_counter()
    load_start = loadavg()
    default_threads = histocal.get_num_threads()
    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    print(f"command: {command}")
    build = core_build()
    print(
        f"histocal {histocal.__version__} ({build}), default threads {default_threads}; load average at start {load_start}"
    )
    if opts.note:
        print(f"note: {opts.note}")

    # warm-up: imports, thread pool, first-call costs (tiny, untimed)
    w = [np.ones(1024, np.float32)]
    with quiet():
        for cls in (OrtCollector, histocal.HistogramCollector):
            c = cls("entropy", False, 64, 8, 99.0, "same")
            c.collect({"w": w})
            c.compute_collection_result()

    rows: list[Row] = []
    notes: list[str] = []

    # (a) ------------------------------------------------------------------------------------
    rng = np.random.default_rng(1234)
    t0 = time.perf_counter()
    first = activation_batches(rng, n_batches, batch, scale=1.0)
    n_vals = n_batches * batch
    if "collect" in opts.only:
        merge = activation_batches(rng, n_batches, batch, scale=1.5)
        print(
            f"\n(a) data: first collect {n_batches} x {batch / 2**20:g}Mi float32 (N(0,1), 0.1% 3x outliers), "
            f"merge collect {n_batches} x {batch / 2**20:g}Mi (1.5x wider); generated in {time.perf_counter() - t0:.1f}s"
        )
        for label, method, sym in (
            ("percentile sym=False (value hist)", "percentile", False),
            ("entropy (value hist)", "entropy", False),
            ("percentile sym=True (|x| hist)", "percentile", True),
        ):
            t0 = time.perf_counter()
            rf, rm, check = bench_collect(
                label, method, sym, first, merge, reps_hc, reps_hc1, reps_ort, default_threads
            )
            rows += [rf, rm]
            notes.append(f"{label}: histogram {check}")
            for r in (rf, rm):
                print(
                    f"  {r.name}: ORT {fmt_s(r.med('ort'))}, histocal {fmt_s(r.med('hc'))} "
                    f"({r.nbytes / r.med('hc') / 1e9:.2f} GB/s), 1 thread {fmt_s(r.med('hc1'))}; "
                    f"ORT/histocal {fmt_ratio(r.med('ort') / r.med('hc'))}"
                )
            print(f"  {label}: histogram {check}  [{time.perf_counter() - t0:.1f}s]")

        print("\n(a) diagnostics (histocal only):")
        diag = diagnostics_collect(first, default_threads, diag_reps)
        for line in diag:
            print(line)
        del merge

    # (c) ------------------------------------------------------------------------------------
    if "stream" in opts.only:
        print("\n(c) streaming histogram add (histocal only):")
        rows += bench_stream(first, reps_hc, reps_hc1, default_threads)
    del first
    gc.collect()

    # (b) ------------------------------------------------------------------------------------
    problems: list[str] = []
    if "entropy" in opts.only:
        t0 = time.perf_counter()
        names, runs = cnn_activations(n_blocks, n_inputs, channels=8, hw=32, seed=7)
        calls = collect_calls(names, runs, per_call)
        amax = [max(float(np.abs(r[j]).max()) for r in runs) for j in range(len(names))]
        astd = [float(np.std(np.concatenate([r[j].ravel() for r in runs]))) for j in range(len(names))]
        print(
            f"\n(b) CNN: {n_blocks} residual blocks on 1x8x32x32 inputs, {len(names)} intermediate tensors, "
            f"{n_inputs} inputs in {len(calls)} collect calls of {per_call}; |activation| max "
            f"min/median/max over tensors = {min(amax):.3g}/{np.median(amax):.3g}/{max(amax):.3g}, "
            f"std {min(astd):.2g}/{np.median(astd):.2g}/{max(astd):.2g} "
            f"[{time.perf_counter() - t0:.1f}s]"
        )
        t0 = time.perf_counter()
        r_coll, r_ent, ort_res, hc_res, bins = bench_entropy(
            calls, ent_bins, ent_qbins, e_hc, e_hc1, e_ort, default_threads
        )
        rows += [r_coll, r_ent]
        matches, total, problems = compare_thresholds(ort_res, hc_res)
        print(
            f"  bins per histogram after collect: min {bins[0]}, median {bins[len(bins) // 2]}, max {bins[-1]}; "
            f"{sum(b > ent_bins for b in bins)} of {len(bins)} grew"
        )
        print(
            f"  entropy: ORT {fmt_s(r_ent.med('ort'))} ({fmt_s(r_ent.med('ort') / r_ent.per)}/tensor), "
            f"histocal {fmt_s(r_ent.med('hc'))} ({fmt_s(r_ent.med('hc') / r_ent.per)}/tensor), "
            f"1 thread {fmt_s(r_ent.med('hc1'))}; ORT/histocal {fmt_ratio(r_ent.med('ort') / r_ent.med('hc'))}"
            f"  [{time.perf_counter() - t0:.1f}s]"
        )
        print(f"  thresholds identical (lo, hi, dtype, hist, edges): {matches}/{total}")
        for p in problems:
            print(f"  MISMATCH {p}")
        notes.append(f"entropy thresholds identical to ORT: {matches}/{total} tensors")
        notes.append(f"entropy histograms: {min(bins)}..{max(bins)} bins (median {bins[len(bins) // 2]})")

    # summary --------------------------------------------------------------------------------
    load_end = loadavg()
    wall = time.perf_counter() - t_start
    print("\n## Results\n")
    print(f"Command: `{command}`\n")
    print(
        f"Machine: {cpu_model()}, nproc {os.cpu_count()} (usable {len(os.sched_getaffinity(0))}), "
        f"Python {platform.python_version()}, numpy {np.__version__}, onnxruntime {ort.__version__}, "
        f"onnx {onnx.__version__}, histocal {histocal.__version__} ({build}; default threads {default_threads}). "
        f"Load average start {load_start}, end {load_end}. Total wall time {wall:.0f}s."
    )
    if opts.note:
        print(f"\nNote: {opts.note}")
    print(
        f"\nRepeats (median): (a) histocal {reps_hc}, histocal 1-thread {reps_hc1}, ORT {reps_ort}; "
        f"(b) histocal {e_hc}, 1-thread {e_hc1}, ORT {e_ort}; (c) histocal {reps_hc}, 1-thread {reps_hc1}. "
        f"Sections run: {', '.join(opts.only)}. (a) input {n_vals / 2**20:.3g}Mi float32 = {n_vals * 4 / 1e9:.3f} GB per collect.\n"
    )
    print("| benchmark | ORT | histocal | histocal GB/s | ORT / histocal | histocal 1 thread | 1 thread / default |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        o, h, h1 = r.med("ort"), r.med("hc"), r.med("hc1")
        if r.per:
            so = f"{fmt_s(o)} ({fmt_s(o / r.per)}/tensor)"
            sh = f"{fmt_s(h)} ({fmt_s(h / r.per)}/tensor)"
            sh1 = f"{fmt_s(h1)} ({fmt_s(h1 / r.per)}/tensor)"
        else:
            so, sh, sh1 = fmt_s(o), fmt_s(h), fmt_s(h1)
        gbs = f"{r.nbytes / h / 1e9:.2f}" if r.nbytes else "-"
        print(f"| {r.name} | {so} | {sh} | {gbs} | {fmt_ratio(o / h)} | {sh1} | {h1 / h:.2f}x |")
    print()
    for n in notes:
        print(f"- {n}")
    for p in problems:
        print(f"- MISMATCH {p}")


if __name__ == "__main__":
    main()
