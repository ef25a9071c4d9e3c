"""``histocal demo``: a small model calibrated by onnxruntime and by histocal, side by side."""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..methods.settings import CollectionSettings
from .arguments import int_at_least
from .inspect import format_table
from .options import HISTOGRAM_METHODS

logger = logging.getLogger("histocal.cli")

# The most samples (and batch size) the demo takes: 10000 samples are 120 MB of .npy files in its
# temp folder, written before anything is printed.
MAX_DEMO_SAMPLES = 10_000


def demo_count(text: str) -> int:
    """--samples' and --batch-size's value: an integer in [1, MAX_DEMO_SAMPLES]."""
    return int_at_least(1, text, MAX_DEMO_SAMPLES)


class _StoppedByTerm(KeyboardInterrupt):
    """SIGTERM during the demo: raised as an interrupt, so that its temp folder is removed on the
    way out (the default SIGTERM ends the process without running ``finally`` blocks)."""


@contextlib.contextmanager
def _term_interrupts() -> Any:
    """SIGTERM raises ``_StoppedByTerm`` in the block (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise _StoppedByTerm

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------------------------
# Demo


def _demo_model(seed: int = 0) -> Any:
    """A small CNN: X[N,3,32,32] -> 3 convs (ReLU) -> global average pool -> Gemm -> Y[N,10]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(name: str, *shape: int) -> Any:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        return numpy_helper.from_array((rng.normal(0, 1, shape) * np.sqrt(2 / fan_in)).astype(np.float32), name)

    inits = [
        w("W1", 16, 3, 3, 3),
        numpy_helper.from_array(np.zeros(16, np.float32), "B1"),
        w("W2", 32, 16, 3, 3),
        numpy_helper.from_array(np.full(32, 0.01, np.float32), "B2"),
        w("W3", 32, 32, 3, 3),
        numpy_helper.from_array(np.zeros(32, np.float32), "B3"),
        w("Wfc", 10, 32),
        numpy_helper.from_array(np.zeros(10, np.float32), "Bfc"),
    ]
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "W3", "B3"], ["c3"], pads=[1, 1, 1, 1], name="conv3"),
        helper.make_node("Add", ["c3", "r2"], ["res"], name="residual"),
        helper.make_node("Relu", ["res"], ["r3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "Wfc", "Bfc"], ["Y"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "histocal_demo_cnn",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def _release_free_memory() -> None:
    """Give freed heap memory back to the OS (glibc), so that RSS growth measures one run."""
    import gc

    gc.collect()
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _PeakRss:
    """Peak resident-set growth while active, sampled from /proc/self/statm (Linux; else None)."""

    _PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def __init__(self, interval: float = 0.002) -> None:
        self.interval = interval
        self.peak: int | None = None

    @classmethod
    def _rss(cls) -> int | None:
        try:
            with open("/proc/self/statm", "rb") as f:
                return int(f.read().split()[1]) * cls._PAGE
        except (OSError, ValueError, IndexError):
            return None

    def __enter__(self) -> _PeakRss:
        _release_free_memory()
        base = self._rss()
        self._base = base
        self._stop = threading.Event()
        if base is not None:
            self._max = base
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            rss = self._rss()
            if rss is not None and rss > self._max:
                self._max = rss

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._base is not None:
            self._thread.join()
            rss = self._rss() or 0
            self.peak = max(self._max, rss) - self._base


def _run_calibrator(
    factory: Callable[..., Any], model: Path, tmp: Path, method: Any, options: dict[str, Any], data: Any
) -> tuple[Any, float, int | None]:
    data.rewind()
    with contextlib.redirect_stdout(io.StringIO()), np.errstate(all="ignore"), _PeakRss() as mem:
        start = time.perf_counter()
        calibrator = factory(
            model,
            None,
            augmented_model_path=str(tmp / "augmented.onnx"),
            calibrate_method=method,
            extra_options=options,
        )
        if hasattr(calibrator, "show_progress"):
            calibrator.show_progress = False
        calibrator.collect_data(data)
        ranges = calibrator.compute_data()
        elapsed = time.perf_counter() - start
        del calibrator
    return ranges, elapsed, mem.peak


def _same_ranges(a: Any, b: Any) -> bool:
    """Same tensors and bit-identical (lowest, highest) for each (NaN equal to NaN)."""
    if set(a.data) != set(b.data):
        return False
    for name, ta in a.data.items():
        for x, y in zip(ta.range_value, b.data[name].range_value):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape:
                return False
            if not np.array_equal(x, y, equal_nan=True):
                return False
    return True


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{max(n, 0) / 2**20:.0f} MiB"


def cmd_demo(args: argparse.Namespace) -> int:
    import onnx
    from onnxruntime.quantization import calibrate as ort_calibrate
    from onnxruntime.quantization.calibrate import CalibrationMethod

    from .. import calibrators
    from ..io.data import open_calibration_data

    runs: list[tuple[str, CalibrationMethod, dict[str, Any]]] = [
        ("Entropy", CalibrationMethod.Entropy, {"num_bins": 2048, "num_quantized_bins": 128}),
        ("Percentile", CalibrationMethod.Percentile, {"num_bins": 2048, "percentile": 99.99}),
        ("Distribution", CalibrationMethod.Distribution, {"num_bins": 2048}),
    ]
    if args.methods:
        runs = [r for r in runs if r[0].lower() in args.methods]
    rng = np.random.default_rng(0)
    # the folder goes on Ctrl-C and on SIGTERM too (kill, a CI job's timeout)
    with _term_interrupts(), tempfile.TemporaryDirectory(prefix="histocal-demo.") as tmp_name:
        tmp = Path(tmp_name)
        model = tmp / "cnn.onnx"
        onnx.save_model(_demo_model(), model.as_posix())
        folder = tmp / "data"
        folder.mkdir()
        for i in range(args.samples):
            x = rng.normal(0, 1, (3, 32, 32)).astype(np.float32) * rng.uniform(0.5, 2.0)
            np.save(folder / f"sample_{i:04d}.npy", x)
        data = open_calibration_data(model, folder, batch_size=args.batch_size)
        sys.stdout.write(
            f"histocal demo: CNN [N,3,32,32] (3 conv + residual + fc), {args.samples} samples in "
            f"{len(data)} batches of {args.batch_size}, exact mode\n\n"
        )
        # Warm-up (untimed): library loading and ORT's first-session costs are not a method's.
        _run_calibrator(calibrators.create_calibrator, model, tmp, CalibrationMethod.MinMax, {}, data)
        rows = []
        all_same = True
        for label, method, options in runs:
            ours, t_ours, m_ours = _run_calibrator(
                functools.partial(calibrators.create_calibrator, settings=CollectionSettings(mode="exact")),
                model,
                tmp,
                method,
                options,
                data,
            )
            ort, t_ort, m_ort = _run_calibrator(ort_calibrate.create_calibrator, model, tmp, method, options, data)
            same = _same_ranges(ort, ours)
            all_same &= same
            settings = ", ".join(f"{k}={v}" for k, v in options.items())
            rows.append(
                [
                    f"{label} ({settings})",
                    str(len(ours.data)),
                    f"{t_ort:.2f} s",
                    f"{t_ours:.2f} s",
                    f"{t_ort / t_ours:.1f}x" if t_ours > 0 else "-",
                    _mib(m_ort),
                    _mib(m_ours),
                    "yes" if same else "NO",
                ]
            )
            sys.stdout.flush()
    sys.stdout.write(
        format_table(
            [
                "method",
                "tensors",
                "ORT",
                "histocal",
                "speedup",
                "ORT peak mem",
                "histocal peak mem",
                "identical ranges",
            ],
            rows,
        )
    )
    sys.stdout.write(
        "\n(time: calibrator creation + collect_data + compute_data; peak mem: resident-set "
        "growth during the run, approximate)\n"
    )
    if not all_same:
        logger.error("ranges differ from onnxruntime's")
        return 1
    return 0


def register(sub: Any) -> None:
    """The ``demo`` command's parser."""
    p = sub.add_parser(
        "demo",
        help="compare histocal with onnxruntime on a small CNN (time, memory, ranges)",
        description="Build a small CNN and synthetic data in a temp folder, calibrate with "
        "onnxruntime and with histocal (exact mode) and print time, peak memory and "
        "whether the ranges are identical.",
    )
    p.add_argument(
        "--samples",
        type=demo_count,
        default=64,
        metavar="N",
        help=f"calibration samples (default 64, at most {MAX_DEMO_SAMPLES})",
    )
    p.add_argument(
        "--batch-size",
        type=demo_count,
        default=8,
        metavar="N",
        help=f"batch size (default 8, at most {MAX_DEMO_SAMPLES})",
    )
    p.add_argument(
        "--methods",
        nargs="+",
        choices=HISTOGRAM_METHODS,
        metavar="METHOD",
        help="only these methods (entropy percentile distribution; default all)",
    )
    p.set_defaults(func=cmd_demo)
