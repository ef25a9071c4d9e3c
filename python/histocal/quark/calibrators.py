"""Quark's calibrator classes and factories (``quark.onnx.calibrate``), backed by histocal.

The float-scale calibrators are onnxruntime's in Quark, so these are histocal's ORT-identical
ones under Quark's names, arguments and defaults; histocal's own collection keywords
(``histocal.methods.settings``) pass through to them. ``PowOfTwoCalibrater`` runs Quark's
power-of-two MinMSE (:mod:`histocal.quark.pof2`) batch by batch through
:class:`~histocal.quark.collector.PowOfTwoCollector`.
"""

from __future__ import annotations

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
    MODE_OPTION,
    STREAMING_BINS_OPTION,
    _augmented_model_path,
    _PrivateShapeInference,
    _run_batches,
)
from ..io.readers import DataSource
from . import types
from .collector import PowOfTwoCollector
from .types import CalibrationMethodLike, Pow2MethodLike, PowerOfTwoMethod, QuantTypeLike

logger = logging.getLogger(__name__)

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)


def _model_path(model_input: str | Path) -> str | Path:
    if not isinstance(model_input, (str, Path)):
        raise ValueError(
            f"histocal.quark takes the model as a path, not a {type(model_input).__name__} "
            "(Quark also takes an onnx.ModelProto: save it with onnx.save first)"
        )
    return model_input


class MinMaxCalibrater(hc.MinMaxCalibrater):
    """Quark's ``MinMaxCalibrater`` (onnxruntime's MinMax): histocal's, with Quark's arguments."""

    def __init__(
        self,
        model_input: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        symmetric: bool = False,
        use_external_data_format: bool = False,
        moving_average: bool = False,
        averaging_constant: float = 0.01,
        **histocal_options: Any,
    ) -> None:
        if moving_average and not 0 <= averaging_constant <= 1:
            raise ValueError("Invalid averaging constant, which should not be < 0 or > 1.")
        super().__init__(
            _model_path(model_input),
            op_types_to_calibrate,
            augmented_model_path,
            symmetric=symmetric,
            use_external_data_format=use_external_data_format,
            moving_average=moving_average,
            averaging_constant=averaging_constant,
            **histocal_options,
        )


class EntropyCalibrater(hc.EntropyCalibrater):
    """Quark's ``EntropyCalibrater`` (onnxruntime's Entropy), with histocal's collection modes."""

    def __init__(
        self,
        model_input: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "entropy",
        symmetric: bool = False,
        num_bins: int = 128,
        num_quantized_bins: int = 128,
        **histocal_options: Any,
    ) -> None:
        _check_method(method, "entropy")
        super().__init__(
            _model_path(model_input),
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            symmetric=symmetric,
            num_bins=num_bins,
            num_quantized_bins=num_quantized_bins,
            **histocal_options,
        )


class PercentileCalibrater(hc.PercentileCalibrater):
    """Quark's ``PercentileCalibrater`` (onnxruntime's Percentile; note Quark's class default
    ``symmetric=False``, its factory's ``True``)."""

    def __init__(
        self,
        model_input: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "percentile",
        symmetric: bool = False,
        num_bins: int = 2048,
        percentile: float = 99.999,
        **histocal_options: Any,
    ) -> None:
        _check_method(method, "percentile")
        super().__init__(
            _model_path(model_input),
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            symmetric=symmetric,
            num_bins=num_bins,
            percentile=percentile,
            **histocal_options,
        )


class DistributionCalibrater(hc.DistributionCalibrater):
    """Quark's ``DistributionCalibrater`` (onnxruntime's Distribution; Quark's class default
    ``num_bins=128``, its factory's 2048)."""

    def __init__(
        self,
        model_input: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "distribution",
        num_bins: int = 128,
        scenario: str = "same",
        **histocal_options: Any,
    ) -> None:
        _check_method(method, "distribution")
        super().__init__(
            _model_path(model_input),
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            num_bins=num_bins,
            scenario=scenario,
            **histocal_options,
        )


def _check_method(method: str, expected: str) -> None:
    if method != expected:
        raise ValueError(f"method must be {expected!r} for this calibrator, got {method!r}")


class PowOfTwoCalibrater(_PrivateShapeInference):
    """Quark's ``PowOfTwoCalibrater``: power-of-two MinMSE ranges (``method=MinMSE``; Quark's
    NonOverflow is ``MinMaxCalibrater(symmetric=True)``, see ``create_calibrator_power_of_two``).
    Every calibrated tensor becomes a graph output; each batch's outputs go to the collector as
    they come (Quark keeps them all first). ``compute_range()`` returns Quark's dict,
    ``compute_data()`` the same as onnxruntime ``TensorsData`` (MinMax kind, as Quark wraps it)."""

    def __init__(
        self,
        model_input: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        activation_type: QuantTypeLike = QuantType.QInt8,
        method: Pow2MethodLike = PowerOfTwoMethod.MinMSE,
        symmetric: bool = True,
        minmse_mode: str = "All",
        percentile: float = 99.999,
        quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
        *,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__(
            _model_path(model_input),
            op_types_to_calibrate,
            _augmented_model_path(self, augmented_model_path),
            symmetric,
            use_external_data_format,
        )
        self.method = types.pow2_method(method)
        self.activation_type = activation_type
        self.minmse_mode = types.minmse_mode(minmse_mode)
        self.percentile = percentile
        self.quantized_tensor_type = dict(quantized_tensor_type or {})
        types.qtype(activation_type)  # checked now rather than at the first batch
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
                self.collector = PowOfTwoCollector(
                    activation_type=self.activation_type,
                    method=self.method,
                    symmetric=self.symmetric,
                    minmse_mode=self.minmse_mode,
                    percentile=self.percentile,
                    quantized_tensor_type=self.quantized_tensor_type,
                )
            collector = self.collector
            fetch = [o.name for o in self.infer_session.get_outputs() if o.name in self.tensors_to_calibrate]
            saved = collector.snapshot()
            try:
                n = _run_batches(
                    self,
                    DataSource(data_reader),
                    fetch,
                    lambda _, items: collector.collect(dict(items)),
                    "histocal pow2",
                )
                if n == 0:
                    raise ValueError("No data is collected.")
            except BaseException:
                collector.restore(saved)
                raise

    def compute_range(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{tensor: (low, high)}`` (0-d float32 arrays), as Quark's ``compute_range``."""
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


def create_calibrator_power_of_two(
    model_input: str | Path,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    activation_type: QuantTypeLike = QuantType.QInt8,
    method: Pow2MethodLike = PowerOfTwoMethod.NonOverflow,
    use_external_data_format: bool = False,
    execution_providers: Sequence[str] | None = DEFAULT_PROVIDERS,
    quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
    extra_options: Mapping[str, Any] | None = None,
) -> MinMaxCalibrater | PowOfTwoCalibrater:
    """Quark's factory for power-of-two calibration. ``NonOverflow``: ``MinMaxCalibrater`` with
    ``symmetric`` (default True), ``moving_average``, ``averaging_constant`` from
    ``extra_options`` (Quark's quantizer then takes the power of two nearest to the range's
    scale). ``MinMSE``: ``PowOfTwoCalibrater`` with ``symmetric``, ``minmse_mode`` (default
    "All"), ``percentile``. An activation type outside Quark's list becomes int8, as in Quark."""
    opts = dict(extra_options or {})
    pow2 = types.pow2_method(method)
    symmetric = opts.get("symmetric", True)
    if pow2 == PowerOfTwoMethod.NonOverflow:
        calibrator: MinMaxCalibrater | PowOfTwoCalibrater = MinMaxCalibrater(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format=use_external_data_format,
            symmetric=symmetric,
            moving_average=opts.get("moving_average", False),
            averaging_constant=opts.get("averaging_constant", 0.01),
        )
    else:
        known = types.is_supported_qtype(activation_type) or getattr(activation_type, "name", activation_type) in (
            types.UNSUPPORTED_QTYPE_NAMES
        )
        calibrator = PowOfTwoCalibrater(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format=use_external_data_format,
            activation_type=activation_type if known else QuantType.QInt8,
            method=pow2,
            symmetric=symmetric,
            minmse_mode=opts.get("minmse_mode", "All"),
            percentile=opts.get("percentile", 99.999),
            quantized_tensor_type=quantized_tensor_type,
        )
    return _prepare(calibrator, execution_providers)


def create_calibrator_float_scale(
    model_input: str | Path,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    calibrate_method: CalibrationMethodLike = CalibrationMethod.MinMax,
    use_external_data_format: bool = False,
    execution_providers: Sequence[str] | None = DEFAULT_PROVIDERS,
    extra_options: Mapping[str, Any] | None = None,
) -> MinMaxCalibrater | EntropyCalibrater | PercentileCalibrater | DistributionCalibrater:
    """Quark's factory for float scales: onnxruntime's four calibrators with Quark's
    ``extra_options`` keys and defaults (those of onnxruntime's ``create_calibrator``, but no
    ``max_intermediate_outputs`` or ``per_channel``), plus histocal's ``CollectionMode`` and
    ``StreamingBins``. Quark's ``LayerWiseMethod.LayerWisePercentile`` is not supported."""
    opts = dict(extra_options or {})
    mode, streaming_bins = opts.get(MODE_OPTION), opts.get(STREAMING_BINS_OPTION)
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
        )
    elif method == CalibrationMethod.Entropy:
        calibrator = EntropyCalibrater(
            *args,
            symmetric=opts.get("symmetric", False),
            num_bins=opts.get("num_bins", 128),
            num_quantized_bins=opts.get("num_quantized_bins", 128),
            mode=mode,
            streaming_bins=streaming_bins,
        )
    elif method == CalibrationMethod.Percentile:
        calibrator = PercentileCalibrater(
            *args,
            symmetric=opts.get("symmetric", True),
            num_bins=opts.get("num_bins", 2048),
            percentile=opts.get("percentile", 99.999),
            mode=mode,
            streaming_bins=streaming_bins,
        )
    else:
        calibrator = DistributionCalibrater(
            *args,
            num_bins=opts.get("num_bins", 2048),
            scenario=opts.get("scenario", "same"),
            mode=mode,
            streaming_bins=streaming_bins,
        )
    return _prepare(calibrator, execution_providers)
