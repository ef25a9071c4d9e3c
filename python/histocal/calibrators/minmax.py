"""``MinMaxCalibrater``: ORT's in-graph ReduceMin/ReduceMax, chunks folded into the range."""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.calibrate import TensorData, TensorsData

from ..io.readers import DataSource, FeedChecker, progress, run_session
from ..methods.settings import CollectionSettings
from .common import PrivateShapeInference, augmented_path_for, one_call_at_a_time
from .cores import CalibrationThreads, calibration_threads, session_options_for
from .reduce_outputs import GatheredOutputs, add_reduce_min_max, names_collide

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


def _scalars(model: onnx.ModelProto) -> set[str]:
    """The tensors whose shape is known to be rank 0 (a value info without a shape is unknown)."""
    graph = model.graph
    infos = [*graph.value_info, *graph.output, *graph.input]
    return {
        v.name
        for v in infos
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape") and not v.type.tensor_type.shape.dim
    }


def _reduce_scalars_whole(model: onnx.ModelProto) -> bool:
    """Drop the axes of the per-channel ReduceMin/ReduceMax ORT's augment_graph added for scalars
    (named ``<tensor>_ReduceMin``/``_ReduceMax``); whether any was changed."""
    scalars = _scalars(model)
    changed = False
    unused: set[str] = set()
    for node in model.graph.node:
        if node.op_type in ("ReduceMin", "ReduceMax") and node.input and node.input[0] in scalars:
            if node.name != f"{node.input[0]}_{node.op_type}":
                continue  # a node of the model, not ORT's
            kept = [a for a in node.attribute if a.name != "axes"]
            if len(kept) != len(node.attribute) or len(node.input) > 1:
                del node.attribute[:]
                node.attribute.extend(kept)
                unused.update(node.input[1:])  # opset 18+: the axes input, an initializer of its own
                del node.input[1:]
                changed = True
    inits = model.graph.initializer
    for i in reversed(range(len(inits))):  # in place: no copy of the weights
        if inits[i].name in unused:
            del inits[i]
    return changed


def _channel_count_error(tensor: str, count: int, before: int, batch: int) -> ValueError:
    return ValueError(
        f"batch {batch}: tensor {tensor!r}: {count} channels along axis 1 in this batch, {before} before: "
        "per-channel ranges need the same number of channels in every batch"
    )


class MinMaxCalibrater(ort_calibrate.MinMaxCalibrater, PrivateShapeInference):
    """ORT's MinMax (in-graph ReduceMin/ReduceMax, identical results), with readers of any kind,
    a progress bar, only the reduced outputs fetched, ``max_intermediate_outputs`` folding
    chunks instead of discarding them, and per-channel ranges that merge across calls, NaN
    ignored: the range is the NaN-ignoring one of all batches, however they are chunked.

    Args:
        model_path: the float model.
        op_types_to_calibrate: calibrate only these operators' tensors (None: all).
        augmented_model_path: where the augmented model goes (default: a temporary folder).
        symmetric: ranges symmetric about 0.
        use_external_data_format: save the augmented model's weights as external data.
        moving_average: a moving average of the batches' ranges (ORT's).
        averaging_constant: its constant.
        max_intermediate_outputs: fold the ranges every this many batches (None: at the end).
        per_channel: per-channel ranges (along axis 1).
        show_progress: a progress bar (None: when the output is a terminal).
        num_threads: onnxruntime's threads (None: the default).
        session_options: onnxruntime SessionOptions for the calibration session.
        settings: ``per_channel``, ``show_progress``, ``num_threads`` and ``session_options`` as one
            ``methods.settings.CollectionSettings`` (what histocal's entry points pass), instead of
            those arguments.

    Raises:
        ValueError: a bad ``max_intermediate_outputs``.
        TypeError: ``settings`` and those arguments both given.
    """

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
        settings: CollectionSettings | None = None,
    ) -> None:
        if settings is not None:
            # ORT's per_channel is given as ORT gives it (any truth value); settings' is checked
            keywords = dict(
                per_channel=per_channel,
                show_progress=show_progress,
                num_threads=num_threads,
                session_options=session_options,
            )
            CollectionSettings.of(settings, **{k: v for k, v in keywords.items() if v not in (None, False)})
            per_channel, show_progress = settings.per_channel, settings.show_progress
            num_threads, session_options = settings.num_threads, settings.session_options
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
        self._gathered: GatheredOutputs | None = None  # how the session returns per-tensor outputs

    @one_call_at_a_time
    def augment_graph(self) -> None:
        """ORT's augmented model as ``self.model`` (a ReduceMin and a ReduceMax of every calibrated
        tensor as graph outputs: the same nodes, outputs and order), built in time linear in the
        graph where ORT's is quadratic (histocal.calibrators.reduce_outputs), except that per
        channel a scalar's reduce over every axis (none) instead of ORT's axis 0, which onnxruntime
        cannot load for a rank-0 tensor: the scalar gets its range as one channel, as a 1-D tensor
        does in ORT.

        The file the session loads (``augmented_model_path``) gathers the per-tensor outputs into
        one per element type (``reduce_outputs.GatheredOutputs``): onnxruntime builds a session in
        time quadratic in the graph's outputs. Per channel, and for a model whose names collide
        with the added ones, it is ORT's model."""
        tensors, value_infos = self.select_tensors_to_calibrate(self.model)
        if not names_collide(tensors):
            add_reduce_min_max(self.model, tensors, value_infos, bool(self.per_channel))
            # per channel, an output's length is the channel count, known only at run time
            self._gathered = None if self.per_channel else GatheredOutputs.of(self.model.graph, self.num_model_outputs)
            if self._gathered is None:
                onnx.save(self.model, self.augmented_model_path, save_as_external_data=self.use_external_data_format)
                return
            with self._gathered.applied(self.model, self.num_model_outputs):
                onnx.save(self.model, self.augmented_model_path, save_as_external_data=self.use_external_data_format)
            return
        logger.info(
            "tensor names like the outputs MinMax adds: onnxruntime's augment_graph (quadratic) builds the model"
        )
        super().augment_graph()  # ORT's (the module's name is histocal's class while patched)
        if self.per_channel and _reduce_scalars_whole(self.model):
            # ORT saved the model once already: its weights are external data now when
            # use_external_data_format, written then, so this save writes only the graph.
            onnx.save(self.model, self.augmented_model_path, save_as_external_data=self.use_external_data_format)

    @property
    def gathered_outputs(self) -> GatheredOutputs | None:
        """How the session returns the per-tensor ReduceMin/ReduceMax outputs, gathered by element
        type (None: as ORT's outputs, per channel or where names collide)."""
        return self._gathered

    @one_call_at_a_time
    def create_inference_session(self) -> None:
        """ORT's session (graph optimizations off), with ``self.threads``' intra-op threads, or
        ``session_options`` as given."""
        options = self.session_options or session_options_for(self.threads)
        self.infer_session = onnxruntime.InferenceSession(
            self.augmented_model_path, sess_options=options, providers=self.execution_providers
        )

    @one_call_at_a_time
    def compute_data(self) -> Any:
        """ORT's MinMax ranges of what has been collected.

        Returns:
            onnxruntime ``TensorsData`` of every calibrated tensor.

        Raises:
            ValueError: nothing collected yet.
        """
        if self._gathered is None or not self.intermediate_outputs:
            return super().compute_data()  # ORT's class (the module's name may be patched to a subclass of this one)
        return self._compute_gathered(self._gathered)

    @one_call_at_a_time
    def clear_collected_data(self) -> None:
        """Drop the buffered batch outputs (ORT's; the ranges computed so far stay)."""
        super().clear_collected_data()

    @one_call_at_a_time
    def collect_data(self, data_reader: Any) -> None:
        """ORT's collect_data, except that a call that fails leaves what earlier calls collected
        unchanged, as in the histogram calibrators (ORT keeps the failed call's batches).

        Args:
            data_reader: a CalibrationDataReader, an iterable of feed dicts, or a callable
                returning one.

        Raises:
            ValueError: no data, or bad data (naming the input and batch).
        """
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
        if self._gathered is not None:
            fetch = list(self._gathered.names)
        else:
            fetch = [o.name for o in session.get_outputs()][self.num_model_outputs :]
        head = [None] * self.num_model_outputs
        # per channel: each tensor's channel count (its reduced outputs' length), which every
        # batch must keep (numpy's stacking fails on the first that does not, naming nothing)
        channels = self._channel_counts(fetch) if self.per_channel else {}
        for i, feed in enumerate(progress(source.read(), "histocal collect", self.show_progress)):
            reduced = run_session(session, fetch, checker.check(feed, i), i)
            if self._gathered is not None:
                for name, value, members in zip(fetch, reduced, self._gathered.members, strict=True):
                    if np.shape(value) != (len(members),):
                        raise ValueError(
                            f"batch {i}: the gathered MinMax output {name!r} has shape "
                            f"{np.shape(value)}, not ({len(members)},): the augmented model was changed"
                        )
            if self.per_channel:
                for name, value in zip(fetch, reduced, strict=True):
                    tensor = name.rpartition("_")[0]
                    before = channels.setdefault(tensor, len(value))
                    if len(value) != before:
                        raise _channel_count_error(tensor, len(value), before, i)
            self.intermediate_outputs.append(head + reduced)
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

    def _compute_gathered(self, gathered: GatheredOutputs) -> Any:
        """ORT's ``compute_data`` on the gathered outputs: each tensor's NaN-ignoring min and max
        (or ORT's moving average) over the batches, symmetric as ORT makes it, merged into the
        ranges so far. A min or max picks one of the values, so taking it over a batch-by-tensor
        array gives ORT's result; the mean is taken per tensor over the same (batches, 1) array
        as ORT's, so it sums in the same order."""
        with warnings.catch_warnings():
            # numpy's bare "All-NaN slice" / "Mean of empty slice": the tensors are named below
            warnings.filterwarnings("ignore", r"(All-NaN|Mean of empty)", RuntimeWarning)
            pairs = self._gathered_pairs(gathered)
        no_values = [name for name, (low, high) in pairs.items() if np.isnan(low).any() or np.isnan(high).any()]
        if no_values:
            logger.warning(
                "MinMax: %d tensor(s) had only NaN in every batch, so their range is NaN, as in onnxruntime: %s",
                len(no_values),
                ", ".join(repr(n) for n in no_values[:10]) + (" ..." if len(no_values) > 10 else ""),
            )
        ranges = TensorsData(ort_calibrate.CalibrationMethod.MinMax, pairs)
        if self.calibrate_tensors_range:
            self.calibrate_tensors_range = self.merge_range(self.calibrate_tensors_range, ranges)
        else:
            self.calibrate_tensors_range = ranges
        return self.calibrate_tensors_range

    def _gathered_pairs(self, gathered: GatheredOutputs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each tensor's (low, high) from the buffered batches, as ORT's ``compute_data`` pairs them."""
        first = len(self.intermediate_outputs[0]) - len(gathered.names)
        lows: dict[str, np.ndarray] = {}
        highs: dict[str, np.ndarray] = {}
        for k, members in enumerate(gathered.members):
            values = np.stack([batch[first + k] for batch in self.intermediate_outputs])
            low_names, high_names = members[0::2], members[1::2]
            if self.moving_average:
                low = [
                    np.nanmean(np.ascontiguousarray(values[:, i : i + 1]), axis=0) for i in range(0, len(members), 2)
                ]
                high = [
                    np.nanmean(np.ascontiguousarray(values[:, i : i + 1]), axis=0) for i in range(1, len(members), 2)
                ]
            else:
                low_all, high_all = np.nanmin(values[:, 0::2], axis=0), np.nanmax(values[:, 1::2], axis=0)
                low = [low_all[i : i + 1].copy() for i in range(len(low_all))]
                high = [high_all[i : i + 1].copy() for i in range(len(high_all))]
            lows.update(zip(low_names, low, strict=True))
            highs.update(zip(high_names, high, strict=True))
        pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for i in range(0, len(gathered.order), 2):
            tensor_low, tensor_high = lows[gathered.order[i]], highs[gathered.order[i + 1]]
            if self.symmetric:
                bound = np.nanmax([np.abs(tensor_low), np.abs(tensor_high)], axis=0)
                pairs[gathered.order[i].rpartition("_")[0]] = (-bound, bound)
            else:
                pairs[gathered.order[i].rpartition("_")[0]] = (tensor_low, tensor_high)
        return pairs

    def _channel_counts(self, fetch: list[str]) -> dict[str, int]:
        """The channel counts of the tensors that earlier calls gave ranges to."""
        counts: dict[str, int] = {}
        if self.calibrate_tensors_range:
            for name in fetch:
                tensor = name.rpartition("_")[0]
                if tensor in self.calibrate_tensors_range.data:
                    counts[tensor] = int(np.size(self.calibrate_tensors_range.data[tensor].range_value[0]))
        return counts

    def merge_range(self, old_range: Any, new_range: Any) -> Any:
        """Fold a chunk's ranges into the ranges so far: ORT's moving average, else the
        NaN-ignoring union (ORT's keeps a NaN).

        Args:
            old_range: the ranges so far (per tensor), or empty.
            new_range: the chunk's ranges (per tensor).

        Returns:
            ``new_range`` holding the merged ranges.
        """
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
