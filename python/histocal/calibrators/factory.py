"""``create_calibrator``: ORT's factory, returning histocal's calibrators."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxruntime.quantization.calibrate import CalibrationMethod

from .. import methods
from ..methods.settings import (
    AXIS,
    MEMORY_BUDGET,
    METHOD_OPTIONS_KEY,
    METHOD_OVERRIDES_KEY,
    MODE,
    NUM_THREADS,
    PER_CHANNEL,
    SESSION_OPTIONS,
    STREAMING_BINS,
    CollectionSettings,
)
from ..methods.table import ORT_TABLE
from .method import MethodCalibrater
from .minmax import MinMaxCalibrater
from .ort_methods import DistributionCalibrater, EntropyCalibrater, PercentileCalibrater

logger = logging.getLogger(__name__)


def create_calibrator(
    model: str | Path,
    op_types_to_calibrate: Sequence[str] | None = None,
    augmented_model_path: str | Path | None = None,
    calibrate_method: CalibrationMethod | str = CalibrationMethod.MinMax,
    use_external_data_format: bool = False,
    providers: Sequence[Any] | None = None,
    extra_options: dict[str, Any] | None = None,
) -> Any:
    """onnxruntime's ``create_calibrator`` with histocal's calibrators.

    Same arguments, same ``extra_options`` keys and defaults as ORT's, plus histocal's keys.

    Args:
        model: path of the float model.
        op_types_to_calibrate: op types whose outputs are calibrated (default: all).
        augmented_model_path: where to write the augmented model (default: a temporary folder
            of the calibrator's own).
        calibrate_method: an ORT ``CalibrationMethod``, or a histocal (mse, kl, pow2, isotone,
            auto) or registered method's name (then a ``MethodCalibrater``).
        use_external_data_format: as ORT's.
        providers: onnxruntime execution providers for the calibration session.
        extra_options: a dict of:
            ORT's keys: ``symmetric`` (default False; Percentile True), ``moving_average``
            (False), ``averaging_constant`` (0.01), ``max_intermediate_outputs`` (None),
            ``per_channel`` (False), ``num_bins`` (Entropy 128, Percentile and Distribution
            2048), ``num_quantized_bins`` (128), ``percentile`` (99.999), ``scenario``
            (``"same"``).
            histocal's keys: ``CollectionMode`` (``"auto"``, ``"exact"`` or ``"streaming"``),
            ``StreamingBins`` (16384), ``MemoryBudget`` (bytes, or e.g. ``"2GiB"``; default
            ``HISTOCAL_MEMORY_BUDGET``, else a quarter of the available memory, at most 8 GiB)
            for the histogram methods; ``channel_axis`` (1) with ``per_channel`` for per-channel
            histograms; ``NumThreads`` (the CPUs calibration may use; default
            ``HISTOCAL_NUM_THREADS``, else the usable CPUs); ``SessionOptions`` (an
            ``onnxruntime.SessionOptions`` for the calibration session, used as given);
            ``MethodOptions`` (a dict: a histocal method's options); ``MethodOverrides`` (other
            methods for chosen tensors, by name or by the op type of their producing node, e.g.
            ``{"op:Softmax": "isotone", "name:logits": "isotone"}``; every method but MinMax's
            in-graph calibrator; docs/methods.md).

    Returns:
        The calibrator (``MinMaxCalibrater``, ``EntropyCalibrater``, ``PercentileCalibrater``,
        ``DistributionCalibrater`` or ``MethodCalibrater``), its inference session created.

    Raises:
        ValueError: an unknown method, option or option value, or a model that cannot be read.
    """
    opts = dict(extra_options or {})
    overrides = opts.get(METHOD_OVERRIDES_KEY)
    # extra_options values are untyped (ORT's API); the calibrators check them
    common: dict[str, Any] = dict(
        use_external_data_format=use_external_data_format,
        **CollectionSettings.keywords_from_extra_options(opts, (NUM_THREADS, SESSION_OPTIONS)),
    )
    channels = CollectionSettings.keywords_from_extra_options(opts, (PER_CHANNEL, AXIS))
    if isinstance(calibrate_method, str):
        name = methods.canonical_name(calibrate_method)
        if name not in methods.ORT_METHODS:
            calibrator: Any = MethodCalibrater(
                model,
                op_types_to_calibrate,
                augmented_model_path,
                **common,
                method=name,
                method_options=opts.get(METHOD_OPTIONS_KEY),
                **CollectionSettings.keywords_from_extra_options(opts, (STREAMING_BINS, PER_CHANNEL, AXIS)),
            )
            return _prepare(calibrator, providers, overrides)
        calibrate_method = CalibrationMethod[{m.name.lower(): m.name for m in CalibrationMethod}[name]]
    method = next((m for m in ORT_TABLE if m.ort == calibrate_method), None)
    if method is None:
        raise ValueError(f"Unsupported calibration method {calibrate_method}")
    # ORT's options and defaults, as onnxruntime's create_calibrator reads them
    method_options = {o.name: opts.get(o.name, o.default) for o in method.options}
    if method.name == "minmax":
        calibrator = MinMaxCalibrater(
            model,
            op_types_to_calibrate,
            augmented_model_path,
            **common,
            **method_options,
            moving_average=opts.get("moving_average", False),
            averaging_constant=opts.get("averaging_constant", 0.01),
            max_intermediate_outputs=opts.get("max_intermediate_outputs"),
            per_channel=opts.get(PER_CHANNEL.extra_key, False),
        )
    else:
        calibrator = _HISTOGRAM_CALIBRATORS[method.name](
            model,
            op_types_to_calibrate,
            augmented_model_path,
            **common,
            **method_options,
            **CollectionSettings.keywords_from_extra_options(opts, (MODE, STREAMING_BINS, MEMORY_BUDGET)),
            **channels,
        )
    return _prepare(calibrator, providers, overrides)


_HISTOGRAM_CALIBRATORS: dict[str, Any] = {
    "entropy": EntropyCalibrater,
    "percentile": PercentileCalibrater,
    "distribution": DistributionCalibrater,
}


def _prepare(calibrator: Any, providers: Sequence[Any] | None, overrides: Any = None) -> Any:
    if overrides:
        if isinstance(calibrator, MinMaxCalibrater):
            raise ValueError(
                f"extra_options[{METHOD_OVERRIDES_KEY!r}] needs a histogram method as the main method "
                "(MinMax's calibrator collects no histograms): e.g. calibrate_method='percentile'"
            )
        calibrator.method_overrides = overrides
    calibrator.augment_graph()
    if providers:
        calibrator.execution_providers = providers
    calibrator.create_inference_session()
    return calibrator
