"""What one worker does: one calibrator (one ORT session on the augmented model) for all its shards,
and per shard a state (streaming mode), or exact mode's pass 1 scans and pass 2 state.

Every result is a function of the shard alone (nothing of an earlier shard is carried over), so a
shard redone on another worker gives the same result, and the driver keeps one result per shard.
States travel as their file format's bytes (``CalibrationState.to_bytes``): checked when read.
An empty shard's result is ``None``: it adds nothing to the merge.

The worker's model copy and augmented model exist on disk only while its session is built: a
worker killed later (by Ray, a shard timeout, the driver's Ctrl-C) leaves no files behind.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _core
from ..calibrators import create_calibrator
from ..calibrators.split_exact import ExactScan, count_exact, scan_exact
from ..io.readers import DataSource
from ..methods.settings import CollectionSettings
from ..state import CalibrationState, Collection
from .shards import Shard

WORKER_FOLDER_PREFIX = "histocal_worker_"


@dataclass(frozen=True)
class Job:
    """How every worker calibrates: the calibrator to build and the state to report."""

    collect_method: str  # the calibrator's method (minmax collects streaming histograms)
    state_method: str  # the method the states record
    settings: CollectionSettings  # its mode "streaming" or "exact"; Ray pickles the frozen dataclass
    extra_options: dict[str, Any] = field(default_factory=dict)  # the method's options
    state_settings: dict[str, Any] | None = None  # None: the calibrator's own settings
    op_types: list[str] | None = None
    providers: list[Any] | None = None
    threads: int = 1
    model_name: str = "model.onnx"  # the user's model file, named in errors instead of the worker's copy

    @property
    def mode(self) -> str:
        """``"streaming"`` or ``"exact"``."""
        return self.settings.mode


def build_calibrator(model_path: str, folder: str, job: Job, providers: Any = None) -> Any:
    """``job``'s calibrator on ``model_path``, its augmented model written in ``folder``."""
    return create_calibrator(
        model_path,
        job.op_types,
        augmented_model_path=os.path.join(folder, "augmented_model.onnx"),
        calibrate_method=job.collect_method,
        providers=providers,
        extra_options=job.extra_options,
        settings=job.settings,
    )


class ShardWorker:
    """Collects shards of the data for one :class:`Job` (a Ray actor runs one; tests call it directly)."""

    def __init__(self, model: bytes, job: Job, external_data: Mapping[str, bytes] | None = None) -> None:
        """``model``: the model file's bytes; ``external_data``: its external-data files' bytes, by
        the ``location`` its tensors give (relative to the model's folder, as onnx resolves it)."""
        self.job = job
        self.error: str | None = None  # why the calibrator could not be built (see ready)
        _core.set_num_threads(job.threads)
        try:
            # the session holds the augmented model in memory and the calibrator the model (whose
            # inputs the data files are mapped to): neither file is read again once it is built
            with tempfile.TemporaryDirectory(prefix=WORKER_FOLDER_PREFIX) as folder:
                model_path = os.path.join(folder, "model.onnx")
                with open(model_path, "wb") as f:
                    f.write(model)
                for location, data in (external_data or {}).items():
                    path = os.path.join(folder, location)
                    if os.path.commonpath([folder, os.path.normpath(path)]) != folder:  # the driver refuses these
                        raise ValueError(f"external data location {location!r} is outside the model's folder")
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as f:
                        f.write(data)
                self.calibrator = build_calibrator(model_path, folder, job, job.providers)
        except Exception as exc:  # reported by ready(): raised here, Ray would print its traceback
            self.error = f"{type(exc).__name__}: {exc}".replace(model_path, job.model_name)
            return
        self.calibrator.show_progress = False

    def ready(self) -> tuple[int, str | None]:
        """This worker's process id, and why it cannot calibrate (None: it can)."""
        return os.getpid(), self.error

    def _open(self, shard: Shard) -> Any:
        return shard.open(self.calibrator.model)

    def _state(self, collection: Collection) -> bytes:
        cal, job = self.calibrator, self.job
        settings = cal.collection_settings if job.state_settings is None else job.state_settings
        state = CalibrationState.from_collection(
            collection, model_fingerprint=cal.model_fingerprint, method=job.state_method, settings=settings
        )
        return state.to_bytes()

    def streaming(self, shard: Shard) -> bytes | None:
        """The state of one streaming collect over the shard (None: the shard is empty)."""

        def work() -> bytes | None:
            feeds = iter(DataSource(self._open(shard)).read())
            end = object()
            first = next(feeds, end)
            if first is end:
                return None
            self.calibrator.restart()
            self.calibrator.collect_data(itertools.chain([first], feeds))
            return self._state(self.calibrator.collection.held())

        return shard.run(work)

    def scan(self, shard: Shard) -> ExactScan:
        """Exact mode, pass 1 over the shard: its scans (ranges and counts) and read digest
        (no batches and no scans for an empty shard)."""
        return shard.run(lambda: scan_exact(self.calibrator, self._open(shard)))

    def count(self, shard: Shard, part: ExactScan, planned_from: list[Any]) -> bytes | None:
        """Exact mode, pass 2: the shard's state, counted on the bins every shard's scans plan
        (None for a shard empty on both reads: count_exact checks the second read as for any)."""

        def work() -> bytes | None:
            data = count_exact(self.calibrator, self._open(shard), part, planned_from)
            return None if part.batches == 0 else self._state(data)

        return shard.run(work)
