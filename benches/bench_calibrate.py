#!/usr/bin/env python3
"""End-to-end calibration benchmark: onnxruntime's calibrators vs histocal's.

Every configuration runs ``create_calibrator`` -> ``collect_data`` -> ``compute_data`` in its
own subprocess (``sys.executable``), so each run's peak RSS (``ru_maxrss``) is its own. Per run:

* setup    ``create_calibrator`` (shape inference, graph augmentation, session creation)
* collect  ``collect_data`` (minus the time the synthetic reader spends making inputs)
* compute  ``compute_data``
* peak RSS of the child (read before the inference pass below); its RSS after imports is
  reported as the baseline
* inference: then, in the same child, a fresh session (created as the calibrators create
  theirs) of the same augmented model runs the same samples, all outputs fetched, only
  ``session.run`` timed, so it sees the same machine load as the run it is compared with
* beyond inference = collect + compute - inference

Configurations (``--only`` names): minmax (ORT, histocal), entropy (default 128 bins),
entropy2048 (num_bins=2048, num_quantized_bins=128), percentile (default: 2048 bins,
symmetric) and distribution (default: 2048 bins), the histogram ones as ORT, histocal
``exact`` (two-pass) and histocal ``streaming`` (one-pass). histocal exact ranges are compared
with ORT's (TensorsData as maps of ``range_value``, bit-exact, NaN == NaN); streaming ranges are
reported as their largest deviation from ORT's, relative to ORT's range width.

A memory-growth check reruns the entropy configurations and the streaming percentile and
distribution ones with ``--growth-samples`` (default 64) samples.

ORT's entropy with 2048 bins costs ~1-2 s per tensor in ``compute_data`` on a small machine;
``--ort-cap K`` (default 32, --quick 2, 0 = no cap) makes that ORT run compute only K tensors' thresholds
and extrapolates its compute time to all tensors (marked "~" in the table; its ranges are then
compared on those K tensors).

The model is a CNN built here with tests/support/graphs.py (BatchNorm folded into Conv biases): a stem
Conv + MaxPool, ResNet basic blocks (Relu) at 1/4 and 1/8 resolution, MobileNetV2 inverted
residual blocks (Clip 0..6, depthwise Convs) at 1/16 and 1/32, an FPN-like top-down path
(Resize x2 + Add), and a GlobalAveragePool / Gemm head: 92 Convs, 203 calibrated tensors at
1x3x224x224. ``--model PATH`` benchmarks any model instead (random inputs from its declared
shapes and dtypes, symbolic/unknown dims set to ``--dim``). Inputs are generated on the fly
from ``--seed`` by a rewindable CalibrationDataReader (ORT reads it once, histocal exact
twice), so input data does not accumulate in memory and is identical across runs.

Usage:
    python3 benches/bench_calibrate.py                      # full run (~10 min on 2 cores)
    python3 benches/bench_calibrate.py --quick              # smoke test, tiny model, 2 samples
    python3 benches/bench_calibrate.py --only entropy percentile --samples 16
    python3 benches/bench_calibrate.py --model my.onnx --dim 1 --out RESULTS_calibrate.md
    python3 benches/bench_calibrate.py --ort-cap 0          # ORT entropy2048 on every tensor
    python3 benches/bench_calibrate.py --repeat 3           # best of 3 per run (noisy machines)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------
# configurations


@dataclass(frozen=True)
class Config:
    name: str
    method: str  # MinMax | Entropy | Percentile | Distribution (CalibrationMethod member names)
    extra_options: dict[str, Any]
    impls: tuple[str, ...]
    label: str


HIST_IMPLS = ("ort", "exact", "streaming")
CONFIGS = {
    c.name: c
    for c in (
        Config("minmax", "MinMax", {}, ("ort", "histocal"), "MinMax"),
        Config("entropy", "Entropy", {}, HIST_IMPLS, "Entropy (128 bins)"),
        Config(
            "entropy2048",
            "Entropy",
            {"num_bins": 2048, "num_quantized_bins": 128},
            HIST_IMPLS,
            "Entropy (2048 bins, 128 q)",
        ),
        Config("percentile", "Percentile", {}, HIST_IMPLS, "Percentile (2048, sym)"),
        Config("distribution", "Distribution", {}, HIST_IMPLS, "Distribution (2048)"),
    )
}
# (config, impl) pairs rerun with --growth-samples for the memory-growth check.
GROWTH_RUNS = (
    ("entropy", "ort"),
    ("entropy", "exact"),
    ("entropy", "streaming"),
    ("percentile", "streaming"),
    ("distribution", "streaming"),
)
TARGET_SPEEDUP_ENTROPY2048 = 100.0
TARGET_BEYOND_INFERENCE_PCT = 15.0
TARGET_RSS_GROWTH_PCT = 10.0


# ----------------------------------------------------------------------------------------------
# the model


def build_cnn(size: int, depth: tuple[int, int, int, int], width: int, seed: int) -> Any:
    """A ResNet/MobileNetV2-like CNN with an FPN-like top-down path; input 1x3xSIZExSIZE
    (BatchNorm-folded Conv blocks from graphs.GraphBuilder)."""
    from support.graphs import GraphBuilder, tensor

    g = GraphBuilder(seed)
    up2 = g.const(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "up2")
    w1, w2, w3, w4 = width, 2 * width, 3 * width, 5 * width
    x = g.conv("input", 3, w1, 3, 2)  # 1/2
    x = g.node("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])  # 1/4
    for _ in range(depth[0]):
        x = g.basic_block(x, w1, w1, 1)
    c2 = x
    x = g.basic_block(x, w1, w2, 2)  # 1/8
    for _ in range(depth[1] - 1):
        x = g.basic_block(x, w2, w2, 1)
    c3 = x
    x = g.inverted_residual(x, w2, w3, 2, 4)  # 1/16
    for _ in range(depth[2] - 1):
        x = g.inverted_residual(x, w3, w3, 1, 4)
    c4 = x
    x = g.inverted_residual(x, w3, w4, 2, 4)  # 1/32
    for _ in range(depth[3] - 1):
        x = g.inverted_residual(x, w4, w4, 1, 4)
    c5 = x
    # FPN-like top-down path: lateral 1x1 convs, nearest x2 Resize, Add.
    p = g.conv(c5, w4, w2, 1, act=None)
    for c, cin in ((c4, w3), (c3, w2)):
        up = g.node("Resize", [p, "", up2], "resize", mode="nearest")
        p = g.node("Add", [up, g.conv(c, cin, w2, 1, act=None)], "add")
    p = g.conv(p, w2, w2, 3)
    feats = [g.node("GlobalAveragePool", [t], "gap") for t in (p, c2, c5)]
    head = g.node("Concat", feats, "concat", axis=1)
    head = g.node("Flatten", [head], "flat")
    fc_w = g.rng.standard_normal((1000, w2 + w1 + w4)) / np.sqrt(w2 + w1 + w4)
    g.node(
        "Gemm",
        [head, g.const(fc_w.astype(np.float32), "fc_w"), g.const(np.zeros(1000, np.float32), "fc_b")],
        output="logits",
        transB=1,
    )
    return g.model("histocal_bench_cnn", [tensor("input", [1, 3, size, size])], [tensor("logits", [1, 1000])])


def describe_model(path: str) -> str:
    import onnx

    m = onnx.load(path, load_external_data=False)
    ops: dict[str, int] = {}
    for n in m.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1]))
    inits = {i.name for i in m.graph.initializer}
    ins = [
        f"{i.name} {[d.dim_value or d.dim_param or '?' for d in i.type.tensor_type.shape.dim]}"
        for i in m.graph.input
        if i.name not in inits
    ]
    return f"{len(m.graph.node)} nodes ({top}); inputs: {', '.join(ins)}"


# ----------------------------------------------------------------------------------------------
# synthetic input data


def input_specs(model_path: str, dim: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, numpy dtype name) of the model's non-initializer inputs; symbolic or
    unknown dims become ``dim``."""
    import onnx
    from onnx import helper

    m = onnx.load(model_path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    specs = []
    for i in m.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else dim for d in tt.shape.dim)
        specs.append((i.name, shape, np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)).name))
    return specs


def synthetic_input(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Image-like for float NCHW inputs with 1-4 channels (smooth blobs + a gradient + fine
    noise, roughly normalised), N(0, 1) for other floats, small integers or booleans else."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        if len(shape) == 4 and shape[1] <= 4 and shape[2] >= 8 and shape[3] >= 8:
            n, c, h, w = shape
            cell = 16 if min(h, w) >= 64 else 4
            low = rng.standard_normal((n, c, h // cell + 1, w // cell + 1))
            img = np.repeat(np.repeat(low, cell, axis=2), cell, axis=3)[:, :, :h, :w]
            ramp = np.linspace(-1.0, 1.0, w)[None, None, None, :] * rng.uniform(-1.0, 1.0, (n, c, 1, 1))
            img = 0.8 * img + ramp + 0.25 * rng.standard_normal(shape)
            return img.astype(dt)
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 16, size=shape).astype(dt)


class SyntheticReader:
    """A rewindable onnxruntime CalibrationDataReader making sample i from (seed, i) on demand,
    so every run sees the same data and no run keeps the inputs alive. ``gen_seconds`` is the
    time spent making inputs (subtracted from collect)."""

    def __init__(self, specs: list[tuple[str, tuple[int, ...], str]], samples: int, seed: int) -> None:
        self.specs, self.samples, self.seed = specs, samples, seed
        self.i = 0
        self.gen_seconds = 0.0

    def sample(self, i: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, i])
        return {name: synthetic_input(rng, shape, dtype) for name, shape, dtype in self.specs}

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self.i >= self.samples:
            return None
        t0 = time.perf_counter()
        feed = self.sample(self.i)
        self.gen_seconds += time.perf_counter() - t0
        self.i += 1
        return feed

    def rewind(self) -> None:
        self.i = 0

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(self.samples):
            yield self.sample(i)


# ----------------------------------------------------------------------------------------------
# child processes


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def ranges_of(tensors_data: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """TensorsData (or ORT MinMax's dict) -> {name: (low, high)} as numpy arrays."""
    out = {}
    for name, value in tensors_data.items():
        lo, hi = value.range_value if hasattr(value, "range_value") else value
        out[name] = (np.asarray(lo), np.asarray(hi))
    return out


def measure_augmented_inference(augmented_model: str, reader: SyntheticReader) -> tuple[float, int]:
    """The augmented model's own inference over the reader's samples, in a fresh session made
    as ORT's calibrators make theirs (cold, like theirs): (seconds in ``session.run``, outputs)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(augmented_model, sess_options=options, providers=["CPUExecutionProvider"])
    seconds, outputs = 0.0, 0
    for feed in reader:
        t0 = time.perf_counter()
        out = session.run(None, feed)
        seconds += time.perf_counter() - t0
        outputs = len(out)
        del out
    return seconds, outputs


def measure_calibration(spec: dict[str, Any]) -> dict[str, Any]:
    """One calibration run: setup / collect / compute times, peak RSS, ranges to a pickle, then
    the augmented model's own inference time over the same samples."""
    import onnxruntime.quantization.calibrate as ort_calibrate
    from onnxruntime.quantization.calibrate import CalibrationMethod

    import histocal

    reader = SyntheticReader([tuple(s) for s in spec["inputs"]], spec["samples"], spec["seed"])
    method = CalibrationMethod[spec["method"]]
    extra = dict(spec["extra_options"])
    impl = spec["impl"]
    if impl in ("exact", "streaming"):
        extra["CollectionMode"] = impl
    create = ort_calibrate.create_calibrator if impl == "ort" else histocal.create_calibrator
    base_rss = current_rss_mb()
    result: dict[str, Any] = {"base_rss_mb": base_rss, "threads": histocal.get_num_threads()}
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):  # ORT print()s
        t0 = time.perf_counter()
        cal = create(
            spec["model"], augmented_model_path=spec["augmented"], calibrate_method=method, extra_options=extra
        )
        t1 = time.perf_counter()
        cal.collect_data(reader)
        t2 = time.perf_counter()
        n_total = None
        cap = spec.get("ort_cap", 0)
        if impl == "ort" and cap and getattr(cal, "collector", None) is not None:
            hist = cal.collector.histogram_dict
            n_total = len(hist)
            if cap < n_total:
                cal.collector.histogram_dict = dict(sorted(hist.items())[:cap])
            else:
                n_total = None
        t3 = time.perf_counter()
        tensors_data = cal.compute_data()
        t4 = time.perf_counter()
    ranges = ranges_of(tensors_data)
    with open(spec["ranges_out"], "wb") as f:
        pickle.dump(ranges, f)
    compute = t4 - t3
    result.update(
        setup=t1 - t0,
        collect=t2 - t1 - reader.gen_seconds,
        data_gen=reader.gen_seconds,
        compute=compute,
        tensors=len(ranges),
        peak_rss_mb=peak_rss_mb(),
    )
    if n_total is not None:
        result.update(
            compute_measured=compute,
            tensors_computed=len(ranges),
            tensors=n_total,
            compute=compute * n_total / len(ranges),
        )
    del cal, tensors_data
    result["inference"], result["outputs"] = measure_augmented_inference(spec["augmented"], reader)
    return result


def child_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    print("RESULT " + json.dumps(measure_calibration(spec)), flush=True)


# ----------------------------------------------------------------------------------------------
# the parent: planning, running, comparing, reporting


@dataclass
class Run:
    config: str
    impl: str  # ort | histocal | exact | streaming
    samples: int
    result: dict[str, Any] = field(default_factory=dict)
    ranges: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    error: str | None = None

    @property
    def busy(self) -> float:
        """collect + compute (what 'beyond inference' is measured on)."""
        return self.result["collect"] + self.result["compute"]

    @property
    def total(self) -> float:
        return self.result["setup"] + self.busy


def run_child(spec: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    env = dict(os.environ, HISTOCAL_PROGRESS="0", PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")


def compare_ranges(ref: dict, got: dict) -> tuple[int, int, float]:
    """(tensors compared, bit-exact mismatches, max deviation relative to ref's range width)."""
    names = sorted(set(ref) & set(got))
    mismatches, worst = len(set(ref) - set(got)), 0.0  # a tensor ORT calibrated and histocal did not
    for name in names:
        (rl, rh), (gl, gh) = ref[name], got[name]
        same = (
            rl.shape == gl.shape
            and rh.shape == gh.shape
            and np.array_equal(rl, gl, equal_nan=True)
            and np.array_equal(rh, gh, equal_nan=True)
        )
        if not same:
            mismatches += 1
            try:
                width = np.maximum(np.abs(rh.astype(np.float64) - rl), 1e-12)
                dev = np.maximum(np.abs(gl.astype(np.float64) - rl), np.abs(gh.astype(np.float64) - rh)) / width
                worst = max(worst, float(np.nanmax(dev)))
            except ValueError:
                worst = float("inf")
    return len(names), mismatches, worst


def fmt_s(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    if abs(x) >= 100:
        return f"{x:.0f} s"
    if abs(x) >= 10:
        return f"{x:.1f} s"
    if abs(x) >= 1:
        return f"{x:.2f} s"
    return f"{x * 1e3:.0f} ms"


def fmt_ratio(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.0f}x" if x >= 100 else f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def machine_info() -> list[str]:
    import numpy
    import onnx
    import onnxruntime

    import histocal

    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    core = Path(histocal._core.__file__)
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(core.stat().st_mtime))
    return [
        f"nproc {os.cpu_count()} (usable {len(os.sched_getaffinity(0))}), CPU {cpu}, "
        f"{platform.system()} {platform.release()}",
        f"Python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, numpy {numpy.__version__}, "
        f"onnx {onnx.__version__}, histocal {histocal.__version__} ({core.name} built {built}, "
        f"{histocal.get_num_threads()} threads)",
    ]


class Benchmark:
    def __init__(self, args: argparse.Namespace, workdir: Path, model_path: str) -> None:
        self.args, self.workdir, self.model_path = args, workdir, model_path
        self.inputs = input_specs(model_path, args.dim)
        self.runs: list[Run] = []
        self.n = 0

    def spec(self, method: str, samples: int, **kw: Any) -> dict[str, Any]:
        self.n += 1
        return {
            "method": method,
            "samples": samples,
            "seed": self.args.seed,
            "model": self.model_path,
            "inputs": self.inputs,
            "augmented": str(self.workdir / f"augmented_{self.n}.onnx"),
            "ranges_out": str(self.workdir / f"ranges_{self.n}.pkl"),
            **kw,
        }

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def measure_run(self, config: Config, impl: str, samples: int) -> Run:
        run = Run(config.name, impl, samples)
        cap = self.args.ort_cap if (config.name == "entropy2048" and impl == "ort") else 0
        spec = self.spec(config.method, samples, impl=impl, extra_options=config.extra_options, ort_cap=cap)
        t0 = time.perf_counter()
        try:
            # Best of --repeat runs by total time (the machine is shared: the minimum is the least
            # disturbed run); the peak RSS reported is the largest seen.
            results = [run_child(spec, self.args.timeout) for _ in range(self.args.repeat)]
            run.result = dict(min(results, key=lambda r: r["setup"] + r["collect"] + r["compute"]))
            run.result["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
            with open(spec["ranges_out"], "rb") as f:
                run.ranges = pickle.load(f)
            os.unlink(spec["ranges_out"])
            r = run.result
            self.log(
                f"  {config.name:12s} {impl:9s} x{samples}: setup {fmt_s(r['setup'])}, collect "
                f"{fmt_s(r['collect'])}, compute {fmt_s(r['compute'])}"
                f"{' (extrapolated)' if 'compute_measured' in r else ''}, peak {r['peak_rss_mb']:.0f} MB, "
                f"inference {fmt_s(r['inference'])}"
                f" [{time.perf_counter() - t0:.1f} s]"
            )
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            run.error = str(e).splitlines()[-1] if str(e) else type(e).__name__
            self.log(f"  {config.name:12s} {impl:9s} x{samples}: FAILED: {e}")
        with contextlib.suppress(OSError):
            os.unlink(spec["augmented"])
        self.runs.append(run)
        return run

    def execute(self, configs: list[Config], growth: bool) -> None:
        samples = self.args.samples
        for config in configs:
            for impl in config.impls:
                self.measure_run(config, impl, samples)
        if growth:
            names = {c.name for c in configs}
            for config, impl in [(CONFIGS[c], i) for c, i in GROWTH_RUNS if c in names]:
                self.measure_run(config, impl, self.args.growth_samples)

    # -- reporting ------------------------------------------------------------------------------

    def find(self, config: str, impl: str, samples: int) -> Run | None:
        for r in self.runs:
            if (r.config, r.impl, r.samples) == (config, impl, samples) and r.error is None:
                return r
        return None

    @staticmethod
    def beyond(run: Run) -> tuple[float, float]:
        """collect + compute - the augmented model's own inference: (seconds, % of inference)."""
        inference = run.result["inference"]
        extra = run.busy - inference
        return extra, 100.0 * extra / inference

    def main_table(self, configs: list[Config]) -> list[str]:
        samples = self.args.samples
        lines = [
            "| config | impl | tensors | setup | collect | compute | total | inference | beyond inference "
            "(% of inference) | peak RSS (after imports) | ORT / this: total | ORT / this: collect+compute "
            "| ranges vs ORT |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for config in configs:
            ort = self.find(config.name, "ort", samples)
            for impl in config.impls:
                run = next(
                    (r for r in self.runs if (r.config, r.impl, r.samples) == (config.name, impl, samples)), None
                )
                if run is None:
                    continue
                if run.error is not None:
                    lines.append(f"| {config.label} | {impl} | FAILED: {run.error[:80]} |" + " |" * 10)
                    continue
                r = run.result
                capped = "compute_measured" in r
                tilde = "~" if capped else ""
                extra, pct = self.beyond(run)
                beyond = f"{tilde}{fmt_s(extra)} ({tilde}{pct:.0f}%)"
                rss = f"{r['peak_rss_mb']:.0f} MB ({r['base_rss_mb']:.0f})"
                ratio_total = ratio_busy = "-" if impl != "ort" else "1"
                verdict = "(reference)" if impl == "ort" else "-"
                if ort is not None and impl != "ort":
                    ort_tilde = "~" if "compute_measured" in ort.result else ""
                    ratio_total = ort_tilde + fmt_ratio(ort.total / run.total)
                    ratio_busy = ort_tilde + fmt_ratio(ort.busy / run.busy)
                    if ort.ranges is not None and run.ranges is not None:
                        n, bad, worst = compare_ranges(ort.ranges, run.ranges)
                        scope = f" of {n}" + (f" (ORT capped to {n})" if "compute_measured" in ort.result else "")
                        if bad == 0:
                            verdict = f"identical{scope}"
                        else:
                            verdict = f"{bad} differ{scope}, max dev {worst:.2%} of width"
                if capped:
                    verdict += (
                        f"; compute measured on {r['tensors_computed']} tensors "
                        f"({fmt_s(r['compute_measured'])}), extrapolated"
                    )
                compute = tilde + fmt_s(r["compute"])
                total = tilde + fmt_s(run.total)
                lines.append(
                    f"| {config.label} | {impl} | {r['tensors']} | {fmt_s(r['setup'])} | {fmt_s(r['collect'])} | "
                    f"{compute} | {total} | {fmt_s(r['inference'])} | {beyond} | {rss} | {ratio_total} | {ratio_busy} | {verdict} |"
                )
        return lines

    def growth_table(self) -> list[str]:
        small, big = self.args.samples, self.args.growth_samples
        lines = [
            f"| config | impl | peak RSS x{small} | peak RSS x{big} | growth | collect+compute x{big} | "
            f"beyond inference x{big} |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for cname, impl in GROWTH_RUNS:
            a, b = self.find(cname, impl, small), self.find(cname, impl, big)
            if a is None or b is None:
                continue
            ra, rb = a.result["peak_rss_mb"], b.result["peak_rss_mb"]
            extra, pct = self.beyond(b)
            beyond = f"{fmt_s(extra)} ({pct:.0f}%)"
            lines.append(
                f"| {CONFIGS[cname].label} | {impl} | {ra:.0f} MB | {rb:.0f} MB | "
                f"{100 * (rb - ra) / ra:+.1f}% | {fmt_s(b.busy)} | {beyond} |"
            )
        return lines if len(lines) > 2 else []

    def target_lines(self) -> list[str]:
        s, out = self.args.samples, []

        def verdict(ok: bool) -> str:
            return "MET" if ok else "MISSED"

        ort = self.find("entropy2048", "ort", s)
        for impl in ("exact", "streaming"):
            hc = self.find("entropy2048", impl, s)
            if ort and hc:
                x = ort.total / hc.total
                out.append(
                    f"- Entropy 2048 bins >= {TARGET_SPEEDUP_ENTROPY2048:.0f}x end to end ({impl}): "
                    f"{fmt_ratio(x)} -> {verdict(x >= TARGET_SPEEDUP_ENTROPY2048)}"
                    f" (collect+compute only: {fmt_ratio(ort.busy / hc.busy)})"
                )
        for cname in ("entropy", "percentile", "distribution"):
            hc, o = self.find(cname, "streaming", s), self.find(cname, "ort", s)
            if hc is None:
                continue
            _, pct = self.beyond(hc)
            ort_txt = ""
            if o is not None:
                ort_txt = f" (ORT {self.beyond(o)[1]:.0f}%)"
            out.append(
                f"- {CONFIGS[cname].label} streaming, time beyond inference <= "
                f"{TARGET_BEYOND_INFERENCE_PCT:.0f}%: {pct:.0f}%{ort_txt} -> "
                f"{verdict(pct <= TARGET_BEYOND_INFERENCE_PCT)}"
            )
        for cname, impl in GROWTH_RUNS:
            if impl != "streaming":
                continue
            a, b = self.find(cname, impl, s), self.find(cname, impl, self.args.growth_samples)
            if a and b:
                g = 100 * (b.result["peak_rss_mb"] - a.result["peak_rss_mb"]) / a.result["peak_rss_mb"]
                out.append(
                    f"- {CONFIGS[cname].label} streaming peak RSS growth x{s} -> "
                    f"x{self.args.growth_samples} <= +{TARGET_RSS_GROWTH_PCT:.0f}%: {g:+.1f}% -> "
                    f"{verdict(g <= TARGET_RSS_GROWTH_PCT)}"
                )
        o, hc = self.find("minmax", "ort", s), self.find("minmax", "histocal", s)
        if o and hc:
            x = o.total / hc.total
            noise = " (within the 5% allowed for noise)" if 0.95 <= x < 1 else ""
            out.append(
                f"- MinMax no slower than ORT: ORT/histocal total {fmt_ratio(x)}, "
                f"collect+compute {fmt_ratio(o.busy / hc.busy)} -> {verdict(x >= 0.95)}{noise}"
            )
        return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 samples, a few seconds (smoke test)")
    ap.add_argument("--samples", type=int, default=None, help="calibration samples (default 8; --quick: 2)")
    ap.add_argument(
        "--growth-samples", type=int, default=None, help="samples for the memory-growth check (default 64; --quick: 4)"
    )
    ap.add_argument("--no-growth", action="store_true", help="skip the memory-growth check")
    ap.add_argument("--model", help="benchmark this ONNX model instead of the built-in CNN")
    ap.add_argument("--dim", type=int, default=1, help="value for symbolic/unknown input dims (default 1)")
    ap.add_argument("--size", type=int, default=None, help="built-in CNN input size (default 224; --quick: 32)")
    ap.add_argument(
        "--width",
        type=int,
        default=32,
        help="built-in CNN base width (default 32; compute per activation value grows with it)",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        choices=sorted(CONFIGS),
        metavar="CONFIG",
        help=f"run only these configurations ({', '.join(CONFIGS)})",
    )
    ap.add_argument(
        "--ort-cap",
        type=int,
        default=None,
        help="ORT entropy2048: compute only this many tensors and extrapolate (0 = all; default 32; --quick: 2)",
    )
    ap.add_argument(
        "--repeat", type=int, default=1, help="run each configuration this many times, report the fastest (default 1)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per child run (default none)")
    ap.add_argument("--out", help="write a markdown section with the results to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (model, augmented models)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.samples = args.samples or (2 if args.quick else 8)
    args.growth_samples = args.growth_samples or (4 if args.quick else 64)
    args.size = args.size or (32 if args.quick else 224)
    if args.ort_cap is None:
        args.ort_cap = 2 if args.quick else 32
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.child:
        child_main(args.child)
        return
    command = "python3 " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__), *argv])
    load_start = loadavg()
    started = time.perf_counter()
    configs = [CONFIGS[n] for n in CONFIGS if not args.only or n in args.only]
    workdir = Path(tempfile.mkdtemp(prefix="bench_calibrate."))
    try:
        if args.model:
            model_path = os.path.abspath(args.model)
            model_desc = f"`{args.model}`: " + describe_model(model_path)
        else:
            import onnx

            depth, width = ((1, 1, 1, 1), 8) if args.quick else ((5, 8, 14, 6), args.width)
            model_path = str(workdir / "cnn.onnx")
            onnx.save(build_cnn(args.size, depth, width, args.seed), model_path)
            model_desc = (
                f"built-in CNN (stage depths {depth}, base width {width}, input 1x3x{args.size}x{args.size}): "
                + describe_model(model_path)
            )
        print(f"model: {model_desc}", file=sys.stderr)
        bench = Benchmark(args, workdir, model_path)
        bench.execute(configs, growth=not args.no_growth and args.growth_samples != args.samples)
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}", file=sys.stderr)
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    load_end = loadavg()
    elapsed = time.perf_counter() - started

    md = [
        "## End-to-end calibration: onnxruntime vs histocal",
        "",
        "Command (from the repository root):",
        "",
        "```",
        command,
        "```",
        "",
    ]
    md += [f"- {line}" for line in machine_info()]
    md += [
        f"- load average at start {load_start}, at end {load_end} (shared machine: times are noisy); "
        f"benchmark wall time {elapsed:.0f} s",
        f"- model: {model_desc}",
        f"- {args.samples} samples (batch as declared), seed {args.seed}, one subprocess per run; "
        + (
            "times are single runs"
            if args.repeat == 1
            else f"times are from the fastest of {args.repeat} runs by total"
        )
        + " (perf_counter); collect excludes the reader's input generation",
        "",
        f"### Per configuration, {args.samples} samples",
        "",
        *bench.main_table(configs),
        "",
        "total = setup + collect + compute. inference = the augmented model's own inference over the same "
        "samples, measured in the same process right after (fresh session, all outputs fetched). beyond "
        "inference = collect + compute - inference (histocal exact runs inference twice by design, so it is "
        ">= 100%). "
        'Ratios > 1 mean histocal is faster. "ranges vs ORT": bit-exact comparison of range_value per tensor '
        "(for streaming, deviations are expected: its histogram has different bin edges). "
        '"~": ORT\'s compute extrapolated from a subset of tensors (--ort-cap).',
    ]
    growth = bench.growth_table()
    if growth:
        md += ["", f"### Memory growth, {args.samples} -> {args.growth_samples} samples", "", *growth]
    targets = bench.target_lines()
    if targets:
        md += ["", "### Targets", "", *targets]
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
