"""AMD Quark 0.9's ONNX calibration API (``quark.onnx.calibrate``), backed by histocal.

A Quark 0.9 user swaps ``from quark.onnx.calibrate import ...`` for ``from histocal.quark.v0_9
import ...`` and gets Quark 0.9's signatures, defaults and results; :mod:`histocal.quark` itself
is Quark 0.13's. What differs between the two (from Quark's source, checked side by side):

- ``create_calibrator_float_scale`` has no ``activation_type`` (0.13 inserted it 4th), so
  ``calibrate_method`` is the 4th positional argument.
- Entropy and Distribution collect each ``collect_data`` call's batches at once (onnxruntime's
  calibrators), Percentile one batch at a time (0.9's own ``collect_data``), where 0.13 adds
  every method's batches one at a time. ``extra_options={"MergePerBatch": ...}`` still chooses.
- ``create_calibrator_power_of_two`` names its method ``method`` (0.13: ``calibrate_method``);
  MinMSE has no histogram: the MinMSE on the values (0.13's ``num_bins=0``), asymmetric included.
  ``PowOfTwoCalibrater`` and ``PowOfTwoCollector`` have no ``num_bins``, ``optimize_mem``,
  ``worker_num`` (so ``percentile`` and ``quantized_tensor_type`` sit earlier).
- Activation types: the factory makes anything outside Quark 0.9's list (``QuantType.QInt8`` /
  ``QUInt8``, Quark's ``ExtendedQuantType.QInt16`` / ``QUInt16``) int8 silently, onnxruntime's
  ``QuantType.QInt16`` included; ``quantized_tensor_type`` entries outside it are ignored.
- Outputs are taken as they are (0.13 replaces NaN and infinities): a tensor with no elements
  gets onnxruntime's MinMax / NonOverflow range, ``(inf, -inf)`` / ``(-inf, inf)`` (0.13: 0, 0).

Every class also has ``compute_range()`` and ``compute_data()``, takes a path or an
``onnx.ModelProto``, and accepts histocal's keywords as :mod:`histocal.quark` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnxruntime.quantization.calibrate import CalibrationMethod
from onnxruntime.quantization.quant_utils import QuantType

from ..methods.settings import CollectionSettings
from . import calibrators as v013
from . import collector as c013
from . import types
from .calibrators import DEFAULT_PROVIDERS, QUARK_SETTINGS, ModelInput, _prepare
from .types import CalibrationMethodLike, Pow2MethodLike, PowerOfTwoMethod, QuantTypeLike

# Quark 0.9's way of adding batches to the histograms, per method: True one batch at a time
MERGE_PER_BATCH = {
    CalibrationMethod.Entropy: False,
    CalibrationMethod.Percentile: True,
    CalibrationMethod.Distribution: False,
}


class MinMaxCalibrater(v013.MinMaxCalibrater):
    """Quark 0.9's ``MinMaxCalibrater``: onnxruntime's MinMax on the outputs as they are."""

    sanitize_outputs = False

    def __init__(
        self,
        model_input: ModelInput,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        symmetric: bool = False,
        use_external_data_format: bool = False,
        moving_average: bool = False,
        averaging_constant: float = 0.01,
        **histocal_options: Any,
    ) -> None:
        super().__init__(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            symmetric,
            use_external_data_format,
            moving_average,
            averaging_constant,
            **histocal_options,
        )


class EntropyCalibrater(v013.EntropyCalibrater):
    """Quark 0.9's ``EntropyCalibrater``: onnxruntime's, each call's batches at once."""

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
        *,
        merge_per_batch: bool = False,
        **histocal_options: Any,
    ) -> None:
        super().__init__(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            method,
            symmetric,
            num_bins,
            num_quantized_bins,
            merge_per_batch=merge_per_batch,
            **histocal_options,
        )


class PercentileCalibrater(v013.PercentileCalibrater):
    """Quark 0.9's ``PercentileCalibrater``: onnxruntime's, one batch at a time (Quark 0.9's own
    ``collect_data``)."""

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
        *,
        merge_per_batch: bool = True,
        **histocal_options: Any,
    ) -> None:
        super().__init__(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            method,
            symmetric,
            num_bins,
            percentile,
            merge_per_batch=merge_per_batch,
            **histocal_options,
        )


class DistributionCalibrater(v013.DistributionCalibrater):
    """Quark 0.9's ``DistributionCalibrater``: onnxruntime's, each call's batches at once."""

    def __init__(
        self,
        model_input: ModelInput,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "distribution",
        num_bins: int = 128,
        scenario: str = "same",
        *,
        merge_per_batch: bool = False,
        **histocal_options: Any,
    ) -> None:
        super().__init__(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            method,
            num_bins,
            scenario,
            merge_per_batch=merge_per_batch,
            **histocal_options,
        )


class PowOfTwoCollector(c013.PowOfTwoCollector):
    """Quark 0.9's ``PowOfTwoCollector``: the MinMSE on the values (no histogram), Quark 0.9's
    arguments; the activation type and ``quantized_tensor_type`` entries by Quark 0.9's rules
    (:func:`~histocal.quark.types.is_listed_qtype_0_9`)."""

    def __init__(
        self,
        activation_type: QuantTypeLike = QuantType.QInt8,
        method: Pow2MethodLike = PowerOfTwoMethod.MinMSE,
        symmetric: bool = True,
        minmse_mode: str = "All",
        percentile: float = 99.999,
        quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
    ) -> None:
        qtype = types.qtype(activation_type)  # Quark 0.9 fails on a type it does not know
        super().__init__(
            activation_type,
            method,
            symmetric,
            minmse_mode,
            num_bins=0,
            percentile=percentile,
            quantized_tensor_type=quantized_tensor_type,
        )
        self.activation_qtype = qtype

    def tensor_qtype(self, name: str) -> str:
        t = self.quantized_tensor_type.get(name)
        return types.qtype(t) if t is not None and types.is_listed_qtype_0_9(t) else self.activation_qtype


class PowOfTwoCalibrater(v013.PowOfTwoCalibrater):
    """Quark 0.9's ``PowOfTwoCalibrater``: the MinMSE on the values, outputs as they are (a NaN
    is an error naming the tensor, as Quark 0.9 fails on it)."""

    sanitize_outputs = False

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
        percentile: float = 99.999,
        quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
        *,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            activation_type,
            method,
            symmetric,
            minmse_mode,
            num_bins=0,
            percentile=percentile,
            quantized_tensor_type=quantized_tensor_type,
            show_progress=show_progress,
        )

    def _new_collector(self) -> PowOfTwoCollector:
        return PowOfTwoCollector(
            activation_type=self.activation_type,
            method=self.method,
            symmetric=self.symmetric,
            minmse_mode=self.minmse_mode,
            percentile=self.percentile,
            quantized_tensor_type=self.quantized_tensor_type,
        )


def create_calibrator_power_of_two(
    model_input: ModelInput,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    activation_type: QuantTypeLike = QuantType.QInt8,
    method: Pow2MethodLike = PowerOfTwoMethod.NonOverflow,
    use_external_data_format: bool = False,
    execution_providers: Sequence[str] | None = DEFAULT_PROVIDERS,
    quantized_tensor_type: Mapping[str, QuantTypeLike] | None = None,
    extra_options: Mapping[str, Any] | None = None,
) -> MinMaxCalibrater | PowOfTwoCalibrater:
    """Quark 0.9's factory for power-of-two calibration. ``NonOverflow``: ``MinMaxCalibrater``
    with ``symmetric`` (default True), ``moving_average``, ``averaging_constant`` from
    ``extra_options``. ``MinMSE``: ``PowOfTwoCalibrater`` with ``symmetric``, ``minmse_mode``
    (default "All"), ``percentile``; the MinMSE on the values (``num_bins`` is not read, as in
    Quark 0.9). An activation type outside Quark 0.9's list becomes ``QuantType.QInt8``."""
    opts = dict(extra_options or {})
    pow2 = types.pow2_method(method)
    symmetric = opts.get("symmetric", True)
    calibrator: MinMaxCalibrater | PowOfTwoCalibrater
    if pow2 == PowerOfTwoMethod.NonOverflow:
        calibrator = MinMaxCalibrater(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format=use_external_data_format,
            symmetric=symmetric,
            moving_average=opts.get("moving_average", False),
            averaging_constant=opts.get("averaging_constant", 0.01),
        )
    else:
        calibrator = PowOfTwoCalibrater(
            model_input,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format=use_external_data_format,
            activation_type=types.factory_activation_0_9(activation_type),
            method=pow2,
            symmetric=symmetric,
            minmse_mode=opts.get("minmse_mode", "All"),
            percentile=opts.get("percentile", 99.999),
            quantized_tensor_type=quantized_tensor_type,
        )
    return _prepare(calibrator, execution_providers)


def create_calibrator_float_scale(
    model_input: ModelInput,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    calibrate_method: CalibrationMethodLike = CalibrationMethod.MinMax,
    use_external_data_format: bool = False,
    execution_providers: Sequence[str] | None = DEFAULT_PROVIDERS,
    extra_options: Mapping[str, Any] | None = None,
    *,
    settings: CollectionSettings | None = None,
) -> MinMaxCalibrater | EntropyCalibrater | PercentileCalibrater | DistributionCalibrater:
    """Quark 0.9's factory for float scales (no ``activation_type``): onnxruntime's four
    calibrators with Quark's ``extra_options`` keys and defaults, plus histocal's
    ``CollectionMode``, ``StreamingBins`` and ``MergePerBatch`` (default: Quark 0.9's way per
    method, :data:`MERGE_PER_BATCH`). ``settings``: as in :mod:`histocal.quark`."""
    opts = dict(extra_options or {})
    if settings is None:
        settings = CollectionSettings.from_extra_options(opts, QUARK_SETTINGS)
    method = types.calibration_method(calibrate_method)
    args = (model_input, op_types_to_calibrate, augmented_model_path, use_external_data_format)
    histocal: dict[str, Any] = {
        "settings": settings,
        "merge_per_batch": opts.get("MergePerBatch", MERGE_PER_BATCH.get(method)),
    }
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


__all__ = [
    "DistributionCalibrater",
    "EntropyCalibrater",
    "MinMaxCalibrater",
    "PercentileCalibrater",
    "PowOfTwoCalibrater",
    "PowOfTwoCollector",
    "PowerOfTwoMethod",
    "create_calibrator_float_scale",
    "create_calibrator_power_of_two",
]
