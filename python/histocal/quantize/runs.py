"""Running the float and quantized models on evaluation feeds, and the squared sums of their
outputs (shared by auto's scoring, ``selection``, and ``histocal diagnose``).

Cost (issue 27): the runs are independent (feed x candidate), so they go on a small pool of
Python threads (onnxruntime releases the GIL), each session on one onnxruntime thread: on small
and LSTM models onnxruntime's intra-op threads scale poorly, and on a shared machine they spin
against each other (ddddocr's scoring model, 2 cores: 96 ms a run on 2 intra-op threads, 59 ms on
one, 41 ms on two Python threads of one; BENCHMARKS.md). Every output is the same bit for bit
whatever the threads (checked by tests/quantize/test_scoring.py on real and random models).

The scoring model's weights are dequantized once, not every run (``scoring``'s
``_dequantized_weights``).
"""

from __future__ import annotations

import copy
import logging
import math
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
from onnx import helper

from ..io.models import save_model
from ..io.readers import Feed, run_session
from ..threads import get_num_threads

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


# Each run holds its own intermediate tensors: at most this many at once, whatever the cores.
MAX_RUNS_AT_ONCE = 4


def run_threads() -> int:
    """How many runs go at once: histocal's thread count (``histocal.set_num_threads``), at most
    ``MAX_RUNS_AT_ONCE``. Each session runs on one onnxruntime thread whatever this is, so the
    outputs do not depend on it."""
    return max(1, min(get_num_threads(), MAX_RUNS_AT_ONCE))


_pools_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _forget_pools() -> None:
    # A forked child has the pools' objects but none of their threads: it makes its own.
    global _pools_lock
    _pools_lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_forget_pools)


def run_pool() -> Executor | None:
    """The pool the runs go on: ``run_threads()`` threads, None where that is 1. One pool per size
    for the process, not one per call: the recipe asks for one some 60 times, and starting a
    pool's threads again each time cost a few percent of a small model's recipe. Shared by every
    caller (a task never submits to it and waits, so callers in several threads cannot deadlock
    it); its idle threads end with the process."""
    threads = run_threads()
    if threads < 2:
        return None
    with _pools_lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="histocal-runs")
        return _pools[threads]


@contextmanager
def ahead(function: Callable[..., _T], *args: Any) -> Iterator[Future[_T]]:
    """``function(*args)`` on a thread of its own while the block runs, for Python work whose
    inputs are known while the block waits on runs (onnxruntime releases the GIL). The block gets
    its future; the work has ended when the block has (on an exception in the block: cancelled if
    not started, else waited for, and the block's exception raised)."""
    with ThreadPoolExecutor(1, thread_name_prefix="histocal-ahead") as thread:
        future = thread.submit(function, *args)
        try:
            yield future
        except BaseException:
            future.cancel()
            raise


def session(path: Path, providers: Sequence[Any], *, quantized: bool = False) -> Any:
    """A session on one onnxruntime thread (the runs go in parallel instead: module docstring).
    ``quantized``: a QDQ model run as its graph defines it, with basic optimizations only
    (constant folding), since the extended ones fuse QDQ groups into integer kernels for some scales-as-inputs and not others, which would make
    candidates scored on the shared model and on their own model incomparable: ``scoring``'s
    docstring)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    if quantized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(path.as_posix(), options, providers=list(providers))


def dequantized(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> dict[str, np.ndarray]:
    """The outputs of ``model``'s DequantizeLinear ``nodes``, whose inputs are initializers, as
    onnxruntime's own kernel computes them (one small session, run once): the values those nodes
    give at run time, bit for bit."""
    import onnxruntime as ort

    init = {t.name: t for t in model.graph.initializer}
    tiny = helper.make_model(
        helper.make_graph(
            [copy.deepcopy(n) for n in nodes],
            "dequantized",
            [],
            # a DequantizeLinear gives its scale's type
            [helper.make_tensor_value_info(n.output[0], init[n.input[1]].data_type, None) for n in nodes],
            [init[i] for i in sorted({i for n in nodes for i in n.input if i})],
        ),
        opset_imports=model.opset_import,
        ir_version=model.ir_version,
    )
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.TemporaryDirectory(prefix="histocal.dequantized.") as tmp:
        path = Path(tmp) / "weights.onnx"  # a file: the weights may pass protobuf's 2 GB
        save_model(tiny, path)
        session = ort.InferenceSession(path.as_posix(), options, providers=["CPUExecutionProvider"])
        return dict(zip([n.output[0] for n in nodes], session.run(None, {})))


def run_all(pool: Executor | None, function: Callable[[int], Any], count: int) -> Iterator[Any]:
    """``function(i)`` for i in range(count), on ``pool`` if given, yielded in order (an
    exception where its result would be): a reader that stops early sees what one run after the
    other would have given it."""
    if pool is None or count < 2:
        return (function(i) for i in range(count))
    return pool.map(function, range(count))


class ReferenceOutputs:
    """The float model's numeric outputs on the evaluation feeds, and the squared sums of a
    quantized model's against them. (Stacking the feeds into one run was measured slower on a
    small CNN: one run per feed.)"""

    def __init__(self, session: Any, feeds: list[Feed], pool: Executor | None = None) -> None:
        self.feeds = feeds
        names = [o.name for o in session.get_outputs()]
        runs = run_all(pool, lambda i: dict(zip(names, run_session(session, names, feeds[i], i))), len(feeds))
        self.outputs: list[list[PreparedOutput]] = []
        numeric: list[str] | None = None
        for arrays in runs:
            if numeric is None:
                # Sequences, maps and strings have no SQNR: only numeric tensors count.
                numeric = [n for n in names if isinstance(arrays[n], np.ndarray) and arrays[n].dtype.kind in "biuf"]
                if not numeric:
                    raise ValueError(f"auto: the model has no numeric tensor output to compare (outputs {names})")
            self.outputs.append([PreparedOutput(np.asarray(arrays[n])) for n in numeric])
        self.names = numeric or []

    def feed_energy(self, session: Any, parameters: Mapping[str, np.ndarray], i: int) -> tuple[float, float] | None:
        """(sum y^2, sum (y - y_q)^2) over feed ``i``'s outputs of a quantized model (``session``
        fed the feed plus ``parameters``); None if they cannot be compared."""
        feed = self.feeds[i]
        got = run_session(session, self.names, {**feed, **parameters} if parameters else feed, i)
        signal = noise = 0.0
        for name, y, yq in zip(self.names, self.outputs[i], got):
            part = y.sums(yq)
            if part is None:
                logger.debug("auto: output %r of sample %d differs where it must not", name, i)
                return None
            signal += part[0]
            noise += part[1]
        return signal, noise

    def feed_energies(
        self,
        session: Any,
        parameters: Mapping[str, np.ndarray],
        until: Callable[[list[tuple[float, float]]], bool] | None = None,
        pool: Executor | None = None,
    ) -> list[tuple[float, float]] | None:
        """``feed_energy`` of each feed in order, stopping after a feed where ``until`` of those
        so far is true; None if a feed's outputs cannot be compared. Without ``until``, the
        feeds run on ``pool``; the result is the sequential one (read in feed order, the first
        None or exception decides)."""
        if until is None and pool is not None and len(self.feeds) > 1:
            done = []
            for energy in run_all(pool, lambda i: self.feed_energy(session, parameters, i), len(self.feeds)):
                if energy is None:
                    return None
                done.append(energy)
            return done
        out: list[tuple[float, float]] = []
        for i in range(len(self.feeds)):
            if out and until is not None and until(out):
                break
            energy = self.feed_energy(session, parameters, i)
            if energy is None:
                return None
            out.append(energy)
        return out


class PreparedOutput:
    """One float output, prepared once (as float64, its non-finite values apart) for the squared
    sums of every quantized output against it: ``signal`` is sum y^2 over its finite values."""

    def __init__(self, reference: np.ndarray) -> None:
        self.shape = reference.shape
        y = np.asarray(reference, np.float64).ravel()
        finite = np.isfinite(y)
        self.nonfinite: np.ndarray | None = None  # where the reference is not finite
        self.nonfinite_values = y[:0]
        if not finite.all():
            self.nonfinite = ~finite
            self.nonfinite_values = y[self.nonfinite]
            y = y[finite]
        self.values = y
        self.signal = sum_of_squares(y)

    def sums(self, quantized: Any) -> tuple[float, float] | None:
        """``squared_sums`` of the reference and ``quantized``."""
        yq = np.asarray(quantized)
        if yq.shape != self.shape or yq.dtype.kind not in "biuf":
            return None
        yq = yq.ravel()
        if self.nonfinite is not None:
            if not np.array_equal(self.nonfinite_values, yq[self.nonfinite].astype(np.float64), equal_nan=True):
                return None
            yq = yq[~self.nonfinite]
        diff = np.subtract(self.values, yq, dtype=np.float64)
        noise = sum_of_squares(diff)
        if not math.isfinite(noise) and not np.isfinite(yq).all():
            return None  # a non-finite quantized value where the reference is finite
        return self.signal, noise


def sum_of_squares(values: np.ndarray) -> float:
    """sum x^2 of a 1-D float64 array, in numpy's own loop (``einsum``), not BLAS's ``ddot``
    (``np.dot``): OpenBLAS splits a long dot product over its threads, whose count is the
    machine's, and after each call they spin waiting for the next. Called after every run of
    every scoring model, that spinning took a core from the runs (ddddocr's recipe: 4 of its
    15 CPU seconds), and the sum's rounding depended on the core count."""
    return float(np.einsum("i,i->", values, values))


def sqnr_db(signal: float, noise: float) -> float:
    """10 log10(signal / noise): +inf without noise, -inf without signal or with infinite noise
    (outputs that cannot be compared)."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0 or math.isinf(noise):
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def squared_sums(reference: np.ndarray, quantized: Any) -> tuple[float, float] | None:
    """(sum y^2, sum (y - y_q)^2) over the finite values of the reference; None when the outputs
    cannot be compared: another shape, a non-finite quantized value where the reference is finite,
    or a different value where the reference is not finite."""
    return PreparedOutput(np.asarray(reference)).sums(quantized)


__all__ = [
    "MAX_RUNS_AT_ONCE",
    "PreparedOutput",
    "ReferenceOutputs",
    "dequantized",
    "run_all",
    "run_threads",
    "session",
    "sqnr_db",
    "squared_sums",
    "sum_of_squares",
]
