"""Quark 0.13's calibrator classes and factories (``quark.onnx.calibration``), backed by histocal.

The float-scale calibrators are onnxruntime's in Quark, so these are histocal's ORT-identical
ones under Quark's names, arguments and defaults, fed one batch at a time as Quark 0.13 feeds
them; histocal's own collection keywords (``histocal.methods.settings``) pass through to them.
``PowOfTwoCalibrater`` runs Quark's power-of-two MinMSE (:mod:`histocal.quark.pof2`,
:mod:`histocal.quark.pof2_histogram`) batch by batch through
:class:`~histocal.quark.collector.PowOfTwoCollector`. Every calibrator takes a path or an
``onnx.ModelProto`` and has ``compute_range()``.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnx
import onnxruntime
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData
from onnxruntime.quantization.quant_utils import QuantType

from .. import calibrators as hc
from ..calibrators.common import (
    PrivateShapeInference,
    augmented_path_for,
    run_batches,
)
from ..io.readers import DataSource
from ..methods.settings import MODE, STREAMING_BINS, CollectionSettings
from . import types
from .collector import PowOfTwoCollector
from .outputs import sanitize_first_batch, sanitized
from .types import CalibrationMethodLike, Pow2MethodLike, PowerOfTwoMethod, QuantTypeLike

logger = logging.getLogger(__name__)

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
# The collection settings Quark's float-scale factory reads from its extra_options.
QUARK_SETTINGS = (MODE, STREAMING_BINS)

ModelInput = str | Path | onnx.ModelProto


def _model_source(owner: Any, model_input: ModelInput) -> tuple[str | Path, onnx.ModelProto | None]:
    """A path for onnxruntime's constructor, and the ``ModelProto`` to calibrate instead when one
    is given (Quark's way: the constructor loads an empty model, then the calibrator takes a copy
    of the proto, without shape inference)."""
    if isinstance(model_input, onnx.ModelProto):
        empty = augmented_path_for(owner, None)
        graph = onnx.helper.make_graph([], "EmptyGraph", [], [])
        onnx.save(onnx.helper.make_model(graph, producer_name="empty-model"), str(empty))
        return empty, model_input
    if not isinstance(model_input, (str, Path)):
        raise ValueError(f"model_input must be a path or an onnx.ModelProto, not a {type(model_input).__name__}")
    return model_input, None


class _QuarkCalibrator:
    """What Quark's calibrators add to onnxruntime's: a ``ModelProto`` input and ``compute_range``."""

    model: Any
    compute_data: Any

    def _adopt(self, proto: onnx.ModelProto | None) -> None:
        if proto is None:
            return
        self.model = copy.deepcopy(proto)
        if hasattr(self, "num_model_outputs"):
            self.num_model_outputs = len(self.model.graph.output)
        if hasattr(self, "model_original_outputs"):
            self.model_original_outputs = {o.name for o in self.model.graph.output}

    def compute_range(self) -> dict[str, tuple[Any, Any]]:
        """``{tensor: (low, high)}``: ``compute_data()``'s ranges as Quark 0.9's ``compute_range``."""
        return {name: tuple(td.range_value) for name, td in self.compute_data().data.items()}


class MinMaxCalibrater(_QuarkCalibrator, hc.MinMaxCalibrater):
    """Quark's ``MinMaxCalibrater`` (onnxruntime's MinMax): histocal's, with Quark 0.13's
    arguments and its clean-up of each call's first batch (a tensor with no elements gets
    (0, 0), not onnxruntime's (inf, -inf): :func:`~histocal.quark.outputs.sanitize_first_batch`).
    ``optimize_mem`` is accepted and has no effect on the result."""

    # Quark 0.13 sanitizes the first buffered batch before onnxruntime's compute_data; 0.9 does not
    sanitize_outputs: bool = True

    def __init__(
        self,
        model_input: ModelInput,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        symmetric: bool = False,
        use_external_data_format: bool = False,
        moving_average: bool = False,
        averaging_constant: float = 0.01,
        optimize_mem: bool = True,
        **histocal_options: Any,
    ) -> None:
        if moving_average and not 0 <= averaging_constant <= 1:
            raise ValueError("Invalid averaging constant, which should not be < 0 or > 1.")
        path, proto = _model_source(self, model_input)
        super().__init__(
            path,
            op_types_to_calibrate,
            augmented_model_path,
            symmetric=symmetric,
            use_external_data_format=use_external_data_format,
            moving_average=moving_average,
            averaging_constant=averaging_constant,
            **histocal_options,
        )
        self._adopt(proto)
        self.optimize_mem = optimize_mem

    def compute_data(self) -> TensorsData:
        with self._lock:
            if self.sanitize_outputs and self.intermediate_outputs:
                names = [o.name for o in self.infer_session.get_outputs()]
                sanitize_first_batch(self.intermediate_outputs, names, self.gathered_outputs)
            return super().compute_data()


class _PerBatch(_QuarkCalibrator):
    """Quark 0.13's histogram calibrators add each batch to the histograms as it comes (ORT's
    merge rule between batches); ``merge_per_batch=False`` collects each call's batches at once
    (onnxruntime; Quark 0.9's Entropy and Distribution, while its Percentile too adds one batch at
    a time: :mod:`histocal.quark.v0_9`). Streaming mode treats all batches as one data set either way."""

    mode: str
    merge_per_batch: bool

    def collect_data(self, data_reader: Any, layer_wise: bool = False) -> None:
        """Collect ``data_reader``'s batches. ``layer_wise`` (Quark's switch for keeping the
        batches for LayerWisePercentile, which histocal does not support) has no effect on the
        histograms, as in Quark."""
        super().collect_data(data_reader)  # type: ignore[misc]

    def _collect_call(self, data_reader: Any) -> None:
        if not self.merge_per_batch or self.mode == "streaming":
            super()._collect_call(data_reader)  # type: ignore[misc]
            return
        n = 0
        for feed in DataSource(data_reader).read():
            super()._collect_call([feed])  # type: ignore[misc]
            n += 1
        if n == 0:
            super()._collect_call([])  # type: ignore[misc]


class EntropyCalibrater(_PerBatch, hc.EntropyCalibrater):
    """Quark's ``EntropyCalibrater`` (onnxruntime's Entropy, Quark 0.13's per-batch merging),
    with histocal's collection modes. ``optimize_mem``, ``worker_num``: no effect on the result."""

    def __init__(
        self,
        model_input: ModelInput,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "entropy",
        symmetric: bool = False,
        num_bins: int = 128,
        num_quantized_bins: int = 128,
        optimize_mem: bool = True,
        worker_num: int = 1,
        *,
        merge_per_batch: bool = True,
        **histocal_options: Any,
    ) -> None:
        _check_method(method, "entropy")
        path, proto = _model_source(self, model_input)
        super().__init__(
            path,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            symmetric=symmetric,
            num_bins=num_bins,
            num_quantized_bins=num_quantized_bins,
            **histocal_options,
        )
        self._adopt(proto)
        self.optimize_mem, self.worker_num, self.merge_per_batch = optimize_mem, worker_num, merge_per_batch


class PercentileCalibrater(_PerBatch, hc.PercentileCalibrater):
    """Quark's ``PercentileCalibrater`` (onnxruntime's Percentile, Quark 0.13's per-batch merging;
    note Quark's class default ``symmetric=False``, its factory's ``True``)."""

    def __init__(
        self,
        model_input: ModelInput,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "percentile",
        symmetric: bool = False,
        num_bins: int = 2048,
        percentile: float = 99.999,
        optimize_mem: bool = True,
        worker_num: int = 1,
        *,
        merge_per_batch: bool = True,
        **histocal_options: Any,
    ) -> None:
        _check_method(method, "percentile")
        path, proto = _model_source(self, model_input)
        super().__init__(
            path,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            symmetric=symmetric,
            num_bins=num_bins,
            percentile=percentile,
            **histocal_options,
        )
        self._adopt(proto)
        self.optimize_mem, self.worker_num, self.merge_per_batch = optimize_mem, worker_num, merge_per_batch


class DistributionCalibrater(_PerBatch, hc.DistributionCalibrater):
    """Quark's ``DistributionCalibrater`` (onnxruntime's Distribution, Quark 0.13's per-batch
    merging; Quark's class default ``num_bins=128``, its factory's 2048)."""

    def __init__(
        self,
        model_input: ModelInput,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "distribution",
        num_bins: int = 128,
        scenario: str = "same",
        optimize_mem: bool = True,
        worker_num: int = 1,
        *,
        merge_per_batch: bool = True,
        **histocal_options: Any,
    ) -> None:
        _check_method(method, "distribution")
        path, proto = _model_source(self, model_input)
        super().__init__(
            path,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            num_bins=num_bins,
            scenario=scenario,
            **histocal_options,
        )
        self._adopt(proto)
        self.optimize_mem, self.worker_num, self.merge_per_batch = optimize_mem, worker_num, merge_per_batch


def _check_method(method: str, expected: str) -> None:
    if method != expected:
        raise ValueError(f"method must be {expected!r} for this calibrator, got {method!r}")


class PowOfTwoCalibrater(_QuarkCalibrator, PrivateShapeInference):
    """Quark's ``PowOfTwoCalibrater``: power-of-two MinMSE ranges (``method=MinMSE``; Quark's
    NonOverflow is ``MinMaxCalibrater(symmetric=True)``, see ``create_calibrator_power_of_two``).
    Every calibrated tensor becomes a graph output; each batch's outputs go to the collector as
    they come (Quark keeps them all first, on disk as float16 by default). ``num_bins``,
    ``optimize_mem``, ``worker_num``: see :class:`PowOfTwoCollector`. ``compute_range()`` returns
    Quark 0.9's dict, ``compute_data()`` the same as onnxruntime ``TensorsData`` (MinMax kind, as
    Quark wraps it)."""

    # Quark 0.13 replaces non-finite outputs (sanitize_model_outputs); 0.9 takes them as they are
    sanitize_outputs: bool = True

    def __init__(
        self,
        model_input: ModelInput,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        activation_type: QuantTypeLike = QuantType.QInt8,
        method: Pow2MethodLike = PowerOfTwoMethod.MinMSE,
        symmetric: bool = True,
        minmse_mode: str = "All",
        num_bins: int = 2048,
        percentile: float = 99.999,
        optimize_mem: bool = True,
        worker_num: int = 1,
        quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
        *,
        show_progress: bool | None = None,
    ) -> None:
        path, proto = _model_source(self, model_input)
        super().__init__(
            path,
            op_types_to_calibrate,
            augmented_path_for(self, augmented_model_path),
            symmetric,
            use_external_data_format,
        )
        self._adopt(proto)
        self.method = types.pow2_method(method)
        self.activation_type = activation_type
        self.minmse_mode = types.minmse_mode(minmse_mode)
        self.num_bins, self.percentile = num_bins, percentile
        self.optimize_mem, self.worker_num = optimize_mem, worker_num
        self.quantized_tensor_type = dict(quantized_tensor_type or {})
        self._new_collector()  # the options checked now rather than at the first batch
        self.collector: PowOfTwoCollector | None = None
        self.tensors_to_calibrate: set[str] | None = None
        self.show_progress = show_progress
        self._lock = threading.RLock()

    def augment_graph(self) -> None:
        """Make every tensor to calibrate a graph output; save the model to ``augmented_model_path``."""
        with self._lock:
            model = self.model
            self.tensors_to_calibrate, value_infos = self.select_tensors_to_calibrate(model)
            outputs = {o.name for o in model.graph.output}
            for name in sorted(self.tensors_to_calibrate):
                if name not in outputs:
                    model.graph.output.append(value_infos[name])
            onnx.save(model, str(self.augmented_model_path), save_as_external_data=self.use_external_data_format)
            self.augment_model = model

    def create_inference_session(self) -> None:
        with self._lock:
            options = onnxruntime.SessionOptions()
            options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.infer_session = onnxruntime.InferenceSession(
                str(self.augmented_model_path), sess_options=options, providers=self.execution_providers
            )

    def clear_collected_data(self) -> None:
        """Nothing to clear: batches are not kept (the collector's sums are the collection)."""

    def collect_data(self, data_reader: Any) -> None:
        """Collect every batch of ``data_reader`` (an ORT ``CalibrationDataReader``, an iterable of
        feed dicts or a callable returning one). Several calls add up; a call that fails leaves
        what earlier calls collected."""
        with self._lock:
            if self.tensors_to_calibrate is None or self.infer_session is None:
                raise RuntimeError("call augment_graph() and create_inference_session() before collect_data()")
            if self.collector is None:
                self.collector = self._new_collector()
            collector = self.collector
            fetch = [o.name for o in self.infer_session.get_outputs() if o.name in self.tensors_to_calibrate]
            saved = collector.snapshot()
            try:
                n = run_batches(
                    self,
                    DataSource(data_reader),
                    fetch,
                    lambda _, items: collector.collect(
                        {name: sanitized(name, v) if self.sanitize_outputs else v for name, v in items}
                    ),
                    "histocal pow2",
                )
                if n == 0:
                    raise ValueError("No data is collected.")
            except BaseException:
                collector.restore(saved)
                raise

    def _new_collector(self) -> PowOfTwoCollector:
        return PowOfTwoCollector(
            activation_type=self.activation_type,
            method=self.method,
            symmetric=self.symmetric,
            minmse_mode=self.minmse_mode,
            num_bins=self.num_bins,
            percentile=self.percentile,
            optimize_mem=self.optimize_mem,
            worker_num=self.worker_num,
            quantized_tensor_type=self.quantized_tensor_type,
        )

    def compute_range(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{tensor: (low, high)}`` (0-d arrays of the values' type), as Quark 0.9's ``compute_range``."""
        with self._lock:
            if not self.collector:
                raise ValueError("No collector created and can't generate calibration data.")
            return self.collector.compute_collection_result()

    def compute_data(self) -> TensorsData:
        return TensorsData(CalibrationMethod.MinMax, self.compute_range())


_Calibrator = TypeVar("_Calibrator", bound=ort_calibrate.CalibraterBase)


def _prepare(calibrator: _Calibrator, execution_providers: Sequence[str] | None) -> _Calibrator:
    calibrator.augment_graph()
    calibrator.execution_providers = list(execution_providers) if execution_providers else None
    calibrator.create_inference_session()
    return calibrator


def _keyword(value: Any, alias: Any, name: str, alias_name: str) -> Any:
    if alias is not None:
        if value is not None:
            raise TypeError(f"give {name} or its Quark 0.9 name {alias_name}, not both")
        return alias
    return value


def create_calibrator_power_of_two(
    model_input: ModelInput,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    activation_type: QuantTypeLike = QuantType.QInt8,
    calibrate_method: Pow2MethodLike | None = PowerOfTwoMethod.NonOverflow,
    use_external_data_format: bool = False,
    execution_providers: Sequence[str] | None = DEFAULT_PROVIDERS,
    quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
    extra_options: Mapping[str, Any] | None = None,
    *,
    method: Pow2MethodLike | None = None,
) -> MinMaxCalibrater | PowOfTwoCalibrater:
    """Quark 0.13's factory for power-of-two calibration (``method=``: Quark 0.9's name of
    ``calibrate_method``). ``NonOverflow``: ``MinMaxCalibrater`` with ``symmetric`` (default
    True), ``moving_average``, ``averaging_constant`` from ``extra_options`` (Quark's quantizer
    then takes the power of two nearest to the range's scale). ``MinMSE``:
    ``PowOfTwoCalibrater`` with ``symmetric``, ``minmse_mode`` (default "All"), ``num_bins``
    (default 2048: Quark 0.13's histogram MinMSE; 0: the MinMSE on the values, Quark 0.9's),
    ``percentile``; ``optimize_mem`` and ``worker_num`` have no effect on the result. An
    activation type outside Quark's list becomes int8, as in Quark."""
    if method is not None and calibrate_method == PowerOfTwoMethod.NonOverflow:
        calibrate_method = None  # the default, not a choice: the alias gives it
    opts = dict(extra_options or {})
    pow2 = types.pow2_method(_keyword(calibrate_method, method, "calibrate_method", "method"))
    symmetric = opts.get("symmetric", True)
    optimize_mem = opts.get("optimize_mem", True)
    if pow2 == PowerOfTwoMethod.NonOverflow:
        calibrator: MinMaxCalibrater | PowOfTwoCalibrater = MinMaxCalibrater(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format=use_external_data_format,
            symmetric=symmetric,
            moving_average=opts.get("moving_average", False),
            averaging_constant=opts.get("averaging_constant", 0.01),
            optimize_mem=optimize_mem,
        )
    else:
        calibrator = PowOfTwoCalibrater(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format=use_external_data_format,
            activation_type=activation_type,
            method=pow2,
            symmetric=symmetric,
            minmse_mode=opts.get("minmse_mode", "All"),
            num_bins=opts.get("num_bins", 2048),
            percentile=opts.get("percentile", 99.999),
            optimize_mem=optimize_mem,
            worker_num=opts.get("worker_num", 1),
            quantized_tensor_type=quantized_tensor_type,
        )
    return _prepare(calibrator, execution_providers)


def create_calibrator_float_scale(
    model_input: ModelInput,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    activation_type: QuantTypeLike = QuantType.QInt8,
    calibrate_method: CalibrationMethodLike = CalibrationMethod.MinMax,
    use_external_data_format: bool = False,
    execution_providers: Sequence[str] | None = DEFAULT_PROVIDERS,
    extra_options: Mapping[str, Any] | None = None,
    *,
    settings: CollectionSettings | None = None,
) -> MinMaxCalibrater | EntropyCalibrater | PercentileCalibrater | DistributionCalibrater:
    """Quark 0.13's factory for float scales: onnxruntime's four calibrators with Quark's
    ``extra_options`` keys and defaults, plus histocal's ``CollectionMode``, ``StreamingBins`` and
    ``MergePerBatch`` (default True: Quark 0.13 adds each batch to the histograms as it comes;
    False: each call's batches at once, as onnxruntime and Quark 0.9's Entropy and Distribution;
    Quark 0.9's own defaults: :mod:`histocal.quark.v0_9`). ``activation_type`` (used
    by Quark only for LayerWisePercentile, not supported here), ``optimize_mem`` and
    ``worker_num`` have no effect on the result. ``settings``: histocal's callers' collection
    settings as one object, instead of the ``CollectionMode`` and ``StreamingBins`` keys."""
    if getattr(activation_type, "name", None) in CalibrationMethod.__members__ or isinstance(
        activation_type, CalibrationMethod
    ):
        raise TypeError(
            f"activation_type is {activation_type!r}: Quark 0.13 inserted activation_type as the 4th argument "
            "of create_calibrator_float_scale; pass calibrate_method by keyword"
        )
    opts = dict(extra_options or {})
    if settings is None:
        settings = CollectionSettings.from_extra_options(opts, QUARK_SETTINGS)
    histocal = {
        "settings": settings,
        # False collects each call's batches at once (onnxruntime), not one at a time (Quark 0.13)
        "merge_per_batch": opts.get("MergePerBatch", True),
        "optimize_mem": opts.get("optimize_mem", True),
        "worker_num": opts.get("worker_num", 1),
    }
    method = types.calibration_method(calibrate_method)
    args = (model_input, op_types_to_calibrate, augmented_model_path, use_external_data_format)
    calibrator: MinMaxCalibrater | EntropyCalibrater | PercentileCalibrater | DistributionCalibrater
    if method == CalibrationMethod.MinMax:
        calibrator = MinMaxCalibrater(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format=use_external_data_format,
            symmetric=opts.get("symmetric", False),
            moving_average=opts.get("moving_average", False),
            averaging_constant=opts.get("averaging_constant", 0.01),
            optimize_mem=histocal["optimize_mem"],
        )
    elif method == CalibrationMethod.Entropy:
        calibrator = EntropyCalibrater(
            *args,
            symmetric=opts.get("symmetric", False),
            num_bins=opts.get("num_bins", 128),
            num_quantized_bins=opts.get("num_quantized_bins", 128),
            **histocal,
        )
    elif method == CalibrationMethod.Percentile:
        calibrator = PercentileCalibrater(
            *args,
            symmetric=opts.get("symmetric", True),
            num_bins=opts.get("num_bins", 2048),
            percentile=opts.get("percentile", 99.999),
            **histocal,
        )
    else:
        calibrator = DistributionCalibrater(
            *args, num_bins=opts.get("num_bins", 2048), scenario=opts.get("scenario", "same"), **histocal
        )
    return _prepare(calibrator, execution_providers)
