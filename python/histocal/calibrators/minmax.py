"""``MinMaxCalibrater``: ORT's in-graph ReduceMin/ReduceMax, chunks folded into the range."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.calibrate import TensorData

from ..io.readers import DataSource, FeedChecker, progress, run_session
from .common import PrivateShapeInference, augmented_path_for, one_call_at_a_time
from .cores import CalibrationThreads, calibration_threads, session_options_for

logger = logging.getLogger(__name__)


def _nan_min(old: Any, new: Any) -> Any:
    """Python ``min(old, new)`` (ORT's merge: ``old`` on ties, so the same object), except that
    a NaN never wins over a number; elementwise for per-channel arrays."""
    if np.ndim(old) == 0 or np.size(old) == 1:
        return new if new < old or np.isnan(old) else old
    return np.where((new < old) | np.isnan(old), new, old)


def _nan_max(old: Any, new: Any) -> Any:
    if np.ndim(old) == 0 or np.size(old) == 1:
        return new if new > old or np.isnan(old) else old
    return np.where((new > old) | np.isnan(old), new, old)


class MinMaxCalibrater(ort_calibrate.MinMaxCalibrater, PrivateShapeInference):
    """ORT's MinMax (in-graph ReduceMin/ReduceMax, identical results), with readers of any kind,
    a progress bar, only the reduced outputs fetched, ``max_intermediate_outputs`` folding
    chunks instead of discarding them, and per-channel ranges that merge across calls, NaN
    ignored: the range is the NaN-ignoring one of all batches, however they are chunked."""

    # set by ORT's untyped base class
    intermediate_outputs: list[Any]
    calibrate_tensors_range: Any

    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        symmetric: bool = False,
        use_external_data_format: bool = False,
        moving_average: bool = False,
        averaging_constant: float = 0.01,
        max_intermediate_outputs: int | None = None,
        per_channel: bool = False,
        *,
        show_progress: bool | None = None,
        num_threads: int | None = None,
        session_options: Any = None,
    ) -> None:
        super().__init__(
            model_path,
            op_types_to_calibrate,
            augmented_path_for(self, augmented_model_path),
            symmetric=symmetric,
            use_external_data_format=use_external_data_format,
            moving_average=moving_average,
            averaging_constant=averaging_constant,
            max_intermediate_outputs=max_intermediate_outputs,
            per_channel=per_channel,
        )
        if max_intermediate_outputs is not None and (
            isinstance(max_intermediate_outputs, bool)
            or not isinstance(max_intermediate_outputs, (int, np.integer))
            or max_intermediate_outputs < 1
        ):
            raise ValueError(f"max_intermediate_outputs must be a positive integer, got {max_intermediate_outputs!r}")
        self.show_progress = show_progress
        self._lock = threading.RLock()
        # No Rust work runs alongside MinMax's inference: every CPU of the calibration goes to
        # onnxruntime (ORT's own default ignores cgroup quotas), spinning only where the split
        # spins (on a shared machine, spinning threads made the inference pass 1.7-4x slower:
        # BENCHMARKS.md, W sleeping vs spinning).
        split = calibration_threads(num_threads)
        self.threads = CalibrationThreads(split.total, split.total, split.ort_spinning, 0)
        self.session_options = session_options

    augment_graph = one_call_at_a_time(ort_calibrate.MinMaxCalibrater.augment_graph)

    @one_call_at_a_time
    def create_inference_session(self) -> None:
        """ORT's session (graph optimizations off), with ``self.threads``' intra-op threads, or
        ``session_options`` as given."""
        options = self.session_options or session_options_for(self.threads)
        self.infer_session = onnxruntime.InferenceSession(
            self.augmented_model_path, sess_options=options, providers=self.execution_providers
        )

    compute_data = one_call_at_a_time(ort_calibrate.MinMaxCalibrater.compute_data)
    clear_collected_data = one_call_at_a_time(ort_calibrate.MinMaxCalibrater.clear_collected_data)

    @one_call_at_a_time
    def collect_data(self, data_reader: Any) -> None:
        """ORT's collect_data, except that a call that fails leaves what earlier calls collected
        unchanged, as in the histogram calibrators (ORT keeps the failed call's batches)."""
        # compute_data replaces the range rather than changing it, so a reference is a snapshot
        saved = list(self.intermediate_outputs), self.calibrate_tensors_range
        try:
            self._collect_call(data_reader)
        except BaseException:
            self.intermediate_outputs, self.calibrate_tensors_range = saved
            raise

    def _collect_call(self, data_reader: Any) -> None:
        source = DataSource(data_reader)
        session = self.infer_session
        checker = FeedChecker(session)
        outputs = [o.name for o in session.get_outputs()]
        fetch = outputs[self.num_model_outputs :]
        head = [None] * self.num_model_outputs
        for i, feed in enumerate(progress(source.read(), "histocal collect", self.show_progress)):
            self.intermediate_outputs.append(head + run_session(session, fetch, checker.check(feed, i), i))
            if (
                self.max_intermediate_outputs is not None
                and len(self.intermediate_outputs) == self.max_intermediate_outputs
            ):
                # ORT discards the chunk here; histocal folds it into the range.
                self.compute_data()
                self.clear_collected_data()
        if len(self.intermediate_outputs) == 0 and self.calibrate_tensors_range is None:
            raise ValueError("No data is collected.")
        self.compute_data()
        self.clear_collected_data()

    def merge_range(self, old_range: Any, new_range: Any) -> Any:
        if not old_range:
            return new_range
        for key, value in old_range.items():
            old_min, old_max = value.range_value if isinstance(value, TensorData) else value
            new = new_range[key]
            new_min, new_max = new.range_value if isinstance(new, TensorData) else new
            if self.moving_average:
                # ORT's arithmetic exactly: a NaN (e.g. an all-NaN chunk's mean) stays NaN, as in ORT
                min_value = old_min + self.averaging_constant * (new_min - old_min)
                max_value = old_max + self.averaging_constant * (new_max - old_max)
            else:
                min_value, max_value = _nan_min(old_min, new_min), _nan_max(old_max, new_max)
            if isinstance(value, TensorData) or isinstance(new, TensorData):
                new_range[key] = TensorData(lowest=min_value, highest=max_value)
            else:
                new_range[key] = (min_value, max_value)
        return new_range
