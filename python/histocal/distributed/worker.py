"""What one worker does: one calibrator (one ORT session on the augmented model) for all its shards,
and per shard a state (streaming mode), or exact mode's pass 1 scans and pass 2 state.

Every result is a function of the shard alone (nothing of an earlier shard is carried over), so a
shard redone on another worker gives the same result, and the driver keeps one result per shard.
States travel as their file format's bytes (``CalibrationState.to_bytes``): checked when read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field
from typing import Any

from .. import _core
from ..calibrators import MODE_OPTION, create_calibrator
from ..calibrators.common import NUM_THREADS_OPTION
from ..calibrators.split_exact import ExactScan, count_exact, scan_exact
from ..collector import CollectedData
from ..state import CalibrationState
from .shards import Shard


@dataclass(frozen=True)
class Job:
    """How every worker calibrates: the calibrator to build and the state to report."""

    collect_method: str  # the calibrator's method (minmax collects streaming histograms)
    mode: str  # "streaming" or "exact"
    state_method: str  # the method the states record
    extra_options: dict[str, Any] = field(default_factory=dict)
    state_settings: dict[str, Any] | None = None  # None: the calibrator's own settings
    op_types: list[str] | None = None
    providers: list[Any] | None = None
    threads: int = 1


class ShardWorker:
    """Collects shards of the data for one :class:`Job` (a Ray actor runs one; tests call it directly)."""

    def __init__(self, model: bytes, job: Job) -> None:
        folder = tempfile.mkdtemp(prefix="histocal_worker_")
        weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        self.model_path = os.path.join(folder, "model.onnx")
        with open(self.model_path, "wb") as f:
            f.write(model)
        self.job = job
        _core.set_num_threads(job.threads)
        calibrator = create_calibrator(
            self.model_path,
            job.op_types,
            augmented_model_path=os.path.join(folder, "augmented_model.onnx"),
            calibrate_method=job.collect_method,
            providers=job.providers,
            # the worker's share of its machine, unless the user's extra_options say otherwise
            extra_options={NUM_THREADS_OPTION: job.threads, **job.extra_options, MODE_OPTION: job.mode},
        )
        calibrator.show_progress = False
        self.calibrator = calibrator

    def pid(self) -> int:
        return os.getpid()

    def _state(self, data: CollectedData) -> bytes:
        cal, job = self.calibrator, self.job
        settings = cal.collection_settings if job.state_settings is None else job.state_settings
        state = CalibrationState.from_collected(
            data, model_fingerprint=cal.model_fingerprint, method=job.state_method, settings=settings
        )
        return state.to_bytes()

    def streaming(self, shard: Shard) -> bytes:
        """The state of one streaming collect over the shard."""

        def work() -> bytes:
            data = shard.open(self.model_path)
            self.calibrator._restart_collection()
            self.calibrator.collect_data(data)
            return self._state(self.calibrator.collected())

        return shard.run(work)

    def scan(self, shard: Shard) -> ExactScan:
        """Exact mode, pass 1 over the shard: its scans (ranges and counts) and read digest."""
        return shard.run(lambda: scan_exact(self.calibrator, shard.open(self.model_path)))

    def count(self, shard: Shard, part: ExactScan, planned_from: list[Any]) -> bytes:
        """Exact mode, pass 2: the shard's state, counted on the bins every shard's scans plan."""
        return shard.run(
            lambda: self._state(count_exact(self.calibrator, shard.open(self.model_path), part, planned_from))
        )
