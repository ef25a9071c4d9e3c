"""onnxruntime's histogram calibrators (Entropy, Percentile, Distribution) on histocal's
collection (``histogram.HistogramCalibration``): the same constructors and results as ORT's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from onnxruntime.quantization import calibrate as ort_calibrate

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's
    from typing_extensions import Unpack

from ..methods.settings import CollectionKwargs, CollectionSettings
from .common import PrivateShapeInference, augmented_path_for
from .histogram import HistogramCalibration


class EntropyCalibrater(HistogramCalibration, ort_calibrate.EntropyCalibrater, PrivateShapeInference):
    """onnxruntime's Entropy calibrator (KL-divergence threshold) on histocal's histograms.

    Args:
        model_path: the float model.
        op_types_to_calibrate: calibrate only these operators' tensors (None: all).
        augmented_model_path: where the augmented model goes (default: a temporary folder).
        use_external_data_format: save the augmented model's weights as external data.
        method: ``"entropy"``.
        symmetric: symmetric ranges.
        num_bins: histogram bins.
        num_quantized_bins: the quantized distribution's bins.
        settings: the collection settings as one ``methods.settings.CollectionSettings`` (what
            histocal's entry points pass), instead of the keywords.
        **collection: the collection settings as keywords (``methods.settings.CollectionKwargs``,
            one per row of ``methods.settings.SETTINGS``).

    Raises:
        ValueError: a bad setting (naming it).
        TypeError: ``settings`` and collection keywords both given.
    """

    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "entropy",
        symmetric: bool = False,
        num_bins: int = 128,
        num_quantized_bins: int = 128,
        *,
        settings: CollectionSettings | None = None,
        **collection: Unpack[CollectionKwargs],
    ) -> None:
        super().__init__(
            model_path,
            op_types_to_calibrate,
            augmented_path_for(self, augmented_model_path),
            use_external_data_format,
            method=method,
            symmetric=symmetric,
            num_bins=num_bins,
            num_quantized_bins=num_quantized_bins,
        )
        self._init_histocal(CollectionSettings.of(settings, **collection))


class PercentileCalibrater(HistogramCalibration, ort_calibrate.PercentileCalibrater, PrivateShapeInference):
    """onnxruntime's Percentile calibrator on histocal's histograms.

    Args:
        model_path: the float model.
        op_types_to_calibrate: calibrate only these operators' tensors (None: all).
        augmented_model_path: where the augmented model goes (default: a temporary folder).
        use_external_data_format: save the augmented model's weights as external data.
        method: ``"percentile"``.
        symmetric: ranges symmetric about 0 (then the histograms are of |x|).
        num_bins: histogram bins.
        percentile: the percentile of the values the range holds.
        settings: the collection settings as one ``methods.settings.CollectionSettings`` (what
            histocal's entry points pass), instead of the keywords.
        **collection: the collection settings as keywords (``methods.settings.CollectionKwargs``,
            one per row of ``methods.settings.SETTINGS``).

    Raises:
        ValueError: a bad setting (naming it).
        TypeError: ``settings`` and collection keywords both given.
    """

    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "percentile",
        symmetric: bool = False,
        num_bins: int = 2048,
        percentile: float = 99.999,
        *,
        settings: CollectionSettings | None = None,
        **collection: Unpack[CollectionKwargs],
    ) -> None:
        super().__init__(
            model_path,
            op_types_to_calibrate,
            augmented_path_for(self, augmented_model_path),
            use_external_data_format,
            method=method,
            symmetric=symmetric,
            num_bins=num_bins,
            percentile=percentile,
        )
        self._init_histocal(CollectionSettings.of(settings, **collection))


class DistributionCalibrater(HistogramCalibration, ort_calibrate.DistributionCalibrater, PrivateShapeInference):
    """onnxruntime's Distribution calibrator (mean and standard deviation per tensor) on histocal's
    histograms.

    Args:
        model_path: the float model.
        op_types_to_calibrate: calibrate only these operators' tensors (None: all).
        augmented_model_path: where the augmented model goes (default: a temporary folder).
        use_external_data_format: save the augmented model's weights as external data.
        method: ``"distribution"``.
        num_bins: histogram bins (at least 512 when computing).
        scenario: ``"same"`` or ``"p3"``.
        settings: the collection settings as one ``methods.settings.CollectionSettings`` (what
            histocal's entry points pass), instead of the keywords.
        **collection: the collection settings as keywords (``methods.settings.CollectionKwargs``,
            one per row of ``methods.settings.SETTINGS``).

    Raises:
        ValueError: a bad setting (naming it).
        TypeError: ``settings`` and collection keywords both given.
    """

    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "distribution",
        num_bins: int = 128,
        scenario: str = "same",
        *,
        settings: CollectionSettings | None = None,
        **collection: Unpack[CollectionKwargs],
    ) -> None:
        super().__init__(
            model_path,
            op_types_to_calibrate,
            augmented_path_for(self, augmented_model_path),
            use_external_data_format,
            method=method,
            num_bins=num_bins,
            scenario=scenario,
        )
        self._init_histocal(CollectionSettings.of(settings, **collection))
