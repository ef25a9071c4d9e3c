"""What the calibrators share: the batch loop (with its read digests), the method names, one call at a time."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Container, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.quant_utils import add_infer_metadata

from .. import _core
from ..io.models import load_model
from ..io.readers import DataSource, FeedChecker, progress, run_session
from ..methods.table import ORT_TABLE
from .cores import pool_threads_for

logger = logging.getLogger(__name__)


METHODS = {m.name: m.ort for m in ORT_TABLE if m.histogram == "exact"}


def check_channels_loadable(channels: Any, per_channel: bool, axis: int) -> None:
    """ValueError unless a state's per-channel histograms (or None) are what the calibrator collects."""
    if per_channel != (channels is not None) or (channels is not None and channels.axis != axis):
        held = f"per-channel histograms along axis {channels.axis}" if channels else "none per channel"
        uses = f"per_channel=True, axis={axis}" if per_channel else "per_channel=False"
        raise ValueError(f"incompatible options: the state holds {held}, the calibrator uses {uses}")


def augmented_path_for(owner: Any, path: str | Path | None) -> str | Path:
    """``path``, or where none is given a file in a temporary folder of ``owner``'s own (removed
    with it): calibrators created at once with ORT's shared default path would write and load
    each other's augmented models."""
    if path is not None:
        return path
    folder = tempfile.mkdtemp(prefix="histocal_augmented_")
    weakref.finalize(owner, shutil.rmtree, folder, ignore_errors=True)
    return os.path.join(folder, "augmented_model.onnx")


def load_model_with_shape_infer(model_path: Path) -> onnx.ModelProto:
    """onnxruntime's ``load_model_with_shape_infer`` (the same ModelProto) without its file:
    ORT writes ``<model>-inferred.onnx`` beside the model and deletes it, so two calibrators of
    one model created at once delete each other's file, and a model in a read-only folder
    cannot be calibrated. Inferred in memory instead: the graph without its external data (so
    models over 2 GB fit protobuf's limit, as ORT's file-to-file inference does), whose
    external data is then loaded from the model's folder, as ``onnx.load`` of ORT's file does."""
    model = load_model(model_path, load_external_data=False)  # a file that is not a model: named
    inferred = onnx.shape_inference.infer_shapes(model)
    onnx.load_external_data_for_model(inferred, os.fspath(model_path.parent))
    add_infer_metadata(inferred)
    return inferred


class PrivateShapeInference(ort_calibrate.CalibraterBase):
    """onnxruntime's ``CalibraterBase`` with the model loaded by :func:`load_model_with_shape_infer`:
    nothing is written beside the user's model. Put after ORT's calibrator class in the bases,
    so that its ``super().__init__`` lands here (tests compare the attributes with ORT's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # ORT's signature, taken loosely: ORT's classes are untyped, so type checkers resolve
        # the subclasses' own super().__init__ calls (ORT's keywords) to this one
        self._init_base(*args, **kwargs)

    def _init_base(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Any = None,
        augmented_model_path: Any = "augmented_model.onnx",
        symmetric: bool = False,
        use_external_data_format: bool = False,
        per_channel: bool = False,
    ) -> None:
        if not isinstance(model_path, (str, Path)):
            raise ValueError("model_path should be model path.")  # ORT's check and message
        self.model = load_model_with_shape_infer(Path(model_path))
        self.op_types_to_calibrate = op_types_to_calibrate
        self.augmented_model_path = augmented_model_path
        self.symmetric = symmetric
        self.use_external_data_format = use_external_data_format
        self.per_channel = per_channel
        self.augment_model: Any = None
        self.infer_session: Any = None
        self.execution_providers: list[str] | None = ["CPUExecutionProvider"]


def one_call_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the calibrator's lock: calls from several threads take turns."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def is_checkpoint(i: int) -> bool:
    return i & (i + 1) == 0  # i = 2^k - 1: batches 0, 1, 3, 7, 15, ...


class ReadDigest:
    """One read's feeds in O(log batches) memory: a running blake2b digest of every feed (its
    inputs' names, dtypes, shapes and bytes, as checked: cast where the model's input type
    differs), kept after batches 0, 1, 3, 7, ... (2^k - 1). Feeds, not outputs: a reader that
    yields the same batches in another order on its second read (a rewound shuffling loader)
    gives outputs of the same shapes, and exact mode would count some batches twice and others
    never. A second read is checked against it by :class:`ReadCheck`. Plain bytes, ints and a
    dict: it travels (pickled) between the passes of histocal.distributed."""

    def __init__(self) -> None:
        self.digest = b""
        self.kept: dict[int, bytes] = {}
        self.batches = 0

    def add(self, feed: Mapping[str, np.ndarray]) -> None:
        h = hashlib.blake2b(self.digest, digest_size=16)
        # by input name: two reads may build their dicts in different orders
        for name in sorted(feed):
            arr = feed[name]
            h.update(f"{name}\0{arr.dtype.str}{arr.shape};".encode())
            h.update(_hashable(arr))
        self.digest = h.digest()
        if is_checkpoint(self.batches):
            self.kept[self.batches] = self.digest
        self.batches += 1

    def finish(self) -> None:
        """The end of the read (nothing to check on a first read)."""


def _hashable(arr: np.ndarray) -> Any:
    if arr.dtype.hasobject:  # no buffer of its own (pointers): its values' text stands for it
        return repr(arr.tolist()).encode()
    return np.ascontiguousarray(arr)  # hashlib reads the buffer in place; a copy only if strided


class ReadCheck:
    """A second read checked, as it goes, against the first read's :class:`ReadDigest`: at each
    checkpoint (a difference is caught by twice the batch where it starts, before that batch
    runs), on a batch past the first read's count, and at the end (the count, the final digest).
    ``why`` says in the errors why the data is read again."""

    def __init__(self, first: ReadDigest, why: str) -> None:
        self.first, self.why, self.read = first, why, ReadDigest()

    def add(self, feed: Mapping[str, np.ndarray]) -> None:
        i, n = self.read.batches, self.first.batches
        if i >= n:
            raise ValueError(f"the data reader returned {n} batches on its first read and more on its second{self.why}")
        self.read.add(feed)
        if is_checkpoint(i) and self.read.digest != self.first.kept[i]:
            # the reads match up to the previous checkpoint, (i - 1) // 2
            raise second_read_differs((i + 1) // 2, i, self.why)

    def finish(self) -> None:
        n, n2 = self.first.batches, self.read.batches
        if n2 != n:
            raise ValueError(f"the data reader returned {n} batches on its first read and {n2} on its second{self.why}")
        if self.read.digest != self.first.digest:
            raise second_read_differs(max(self.first.kept) + 1, n - 1, self.why)


def second_read_differs(first: int, last: int, why: str) -> ValueError:
    where = f"batch {last}" if first == last else f"batches {first} to {last}"
    return ValueError(f"{where}: the data reader returned different data on its second read{why}")


def run_batches(
    calibrator: Any,
    source: DataSource,
    fetch: list[str],
    consume: Callable[[int, list[tuple[str, list[np.ndarray]]]], None],
    desc: str,
    skip: Container[int] = (),
    timed: Callable[[int, float, int, float], None] | None = None,
    wants_timing: Callable[[int], bool] = lambda i: False,
    digest: ReadDigest | ReadCheck | None = None,
) -> int:
    """Run every batch of one read and hand its outputs to ``consume``. ``consume`` (Rust work,
    GIL released) runs on a worker thread while ORT infers the next batch, so at most two
    batches of outputs are alive; its Rust pool is the calibrator's share of the cores
    (``calibrator.threads``). The feeds of the batches in ``skip`` are read but not run (their
    outputs are known already). For the batches where ``wants_timing(i)``, ``timed(i, seconds,
    faults, system)`` learns what reading and running batch ``i`` alone cost before ``consume``
    gets it: the previous batch's ``consume`` is waited for first (its work would be counted
    otherwise), then the lesser of the wall seconds and the process's CPU seconds (on a loaded
    machine the wall time is mostly waiting; on idle cores the CPU time is spread over them), the
    page faults meanwhile, and the part of those seconds that was system CPU time, in
    proportion (mostly those faults: fresh memory for the outputs). Every feed, a skipped one's
    too, goes to ``digest`` as it is read: the one place every read of exact mode passes, its
    first read recorded (``ReadDigest``), its second checked against it (``ReadCheck``, which
    raises before the batch runs). Returns the number of batches, skipped ones included."""
    session = calibrator.infer_session
    checker = FeedChecker(session)
    inputs = set(checker.inputs)
    pending: Future | None = None
    n = 0
    pool_threads = pool_threads_for(getattr(calibrator, "threads", None))

    def clocks() -> tuple[float, float, int, float]:
        return (time.perf_counter(), time.process_time(), *faults_and_system_time())

    with ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="histocal", initializer=_core.set_caller_threads, initargs=(pool_threads,)
    ) as pool:
        start, alone = clocks(), timed is not None and wants_timing(0)
        for feed in progress(source.read(), desc, calibrator.show_progress):
            skipped = n in skip
            if skipped and digest is None:
                n += 1
                continue
            checked = checker.check(feed, n)
            if digest is not None:
                # here, not on the worker thread: the reader may reuse the feed's buffers for the next batch
                digest.add(checked)
            if skipped:
                n += 1
                continue
            outputs = run_session(session, fetch, checked, n)
            end = clocks()
            # ORT returns outputs that are also inputs as views of the feed (ORT issue #21922):
            # copy them, as ORT does, since the reader may reuse its buffers for the next batch.
            items = [(name, [a.copy() if name in inputs else a]) for name, a in zip(fetch, outputs)]
            if pending is not None:
                pending.result()
            if timed is not None and alone:  # after the previous consume: it may read what timed records
                wall, cpu, faults, system = (e - s for e, s in zip(end, start))
                # wall or CPU, the lesser, and the system time's share of it
                seconds = min(wall, cpu)
                timed(n, seconds, int(faults), seconds * min(1.0, system / cpu) if cpu > 0 else 0.0)
            pending = pool.submit(consume, n, items)
            n += 1
            alone = timed is not None and wants_timing(n)
            if alone:
                pending.result()  # the next batch is timed alone
            start = clocks()
        if pending is not None:
            pending.result()
    if digest is not None:
        digest.finish()
    return n


def faults_and_system_time() -> tuple[int, float]:
    """The process's minor page faults and system CPU seconds so far ((0, 0.0) where
    ``resource`` is missing: Windows)."""
    try:
        import resource
    except ImportError:
        return 0, 0.0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt, usage.ru_stime


def binned_and_binnable(hist: _core.Histograms) -> dict[str, tuple[int, int, int, bool]]:
    """Per tensor: values in the histogram, finite values and infinities collected, and whether
    the edges end in +inf (an |x| histogram past float16's range: like ORT, it then bins later
    infinities in its last bin)."""
    out = {}
    for n, binned, open_top in hist.binned_totals():  # (no histogram exported)
        c = hist.counts(n)
        out[n] = (binned, c.n_finite, c.n_posinf + c.n_neginf, open_top)
    return out
