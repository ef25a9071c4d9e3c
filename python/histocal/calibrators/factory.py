"""``create_calibrator``: ORT's factory, returning histocal's calibrators.

ORT's boundary: ``extra_options`` (ORT's keys, and histocal's, as ORT-style callers spell them)
are parsed here and nowhere else: the method's options from the method table, the collection
settings by ``CollectionSettings.from_extra_options`` (only those the method's calibrator reads,
``settings_for``: the keys of other settings are ignored, as ORT ignores the keys of other
methods). histocal's own entry points (``quantize_static``, the command line, the distributed
workers, ``diagnose``) build their ``CollectionSettings`` once and pass the object as
``settings=``; their ``extra_options`` then hold the method's options alone.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxruntime.quantization.calibrate import CalibrationMethod

from .. import methods
from ..methods.settings import EXTRA_KEYS, METHOD_OPTIONS_KEY, METHOD_OVERRIDES_KEY, CollectionSettings, settings_for
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
    *,
    settings: CollectionSettings | None = None,
) -> Any:
    """onnxruntime's ``create_calibrator`` with histocal's calibrators.

    Same arguments, same ``extra_options`` keys and defaults as ORT's, plus histocal's keys.

    Args:
        model: path of the float model.
        op_types_to_calibrate: op types whose outputs are calibrated (default: all).
        augmented_model_path: where to write the augmented model (default: a temporary folder
            of the calibrator's own).
        calibrate_method: an ORT ``CalibrationMethod``, or a histocal method's name (the rows of
            ``methods.table.TABLE``) or a registered one's (then a ``MethodCalibrater``).
        use_external_data_format: as ORT's.
        providers: onnxruntime execution providers for the calibration session.
        extra_options: a dict of:
            ORT's keys: ``symmetric`` (default False; Percentile True), ``moving_average``
            (False), ``averaging_constant`` (0.01), ``max_intermediate_outputs`` (None),
            ``per_channel`` (False), ``num_bins`` (Entropy 128, Percentile and Distribution
            2048), ``num_quantized_bins`` (128), ``percentile`` (99.999), ``scenario``
            (``"same"``).
            histocal's keys: the collection settings' (``CollectionMode``, ``StreamingBins``,
            ...: each row of ``methods.settings.SETTINGS`` gives its key, default and
            environment fallback); ``MethodOptions`` (a dict: a histocal method's options);
            ``MethodOverrides`` (other methods for chosen tensors, by name or by the op type of
            their producing node, e.g. ``{"op:Softmax": "mse", "name:logits": "kl"}``; every method
            but MinMax's in-graph calibrator; docs/methods.md).
        settings: the collection settings as an object (``histocal.methods.settings``), for
            histocal's callers, instead of their ``extra_options`` keys (not both).

    Returns:
        The calibrator (``MinMaxCalibrater``, ``EntropyCalibrater``, ``PercentileCalibrater``,
        ``DistributionCalibrater`` or ``MethodCalibrater``), its inference session created.

    Raises:
        ValueError: an unknown method, option or option value, or a model that cannot be read.
        TypeError: ``settings`` and settings' ``extra_options`` keys both given.
    """
    opts = dict(extra_options or {})
    overrides = opts.get(METHOD_OVERRIDES_KEY)
    if isinstance(calibrate_method, str):
        name = methods.canonical_name(calibrate_method)
        if name in methods.ORT_METHODS:
            calibrate_method = CalibrationMethod[{m.name.lower(): m.name for m in CalibrationMethod}[name]]
    else:
        name = next((m.name for m in ORT_TABLE if m.ort == calibrate_method), "")
        if not name:
            raise ValueError(f"Unsupported calibration method {calibrate_method}")
    if settings is None:
        settings = CollectionSettings.from_extra_options(opts, settings_for(name))
    elif given := sorted(k for k in opts if k in EXTRA_KEYS):
        raise TypeError(f"settings= and the settings' extra_options keys {given} given: pass one of them")
    calibrator: Any
    if name not in methods.ORT_METHODS:
        calibrator = MethodCalibrater(
            model,
            op_types_to_calibrate,
            augmented_model_path,
            use_external_data_format,
            method=name,
            method_options=opts.get(METHOD_OPTIONS_KEY),
            settings=settings,
        )
        return _prepare(calibrator, providers, overrides)
    method = next(m for m in ORT_TABLE if m.name == name)
    # ORT's options and defaults, as onnxruntime's create_calibrator reads them
    method_options = {name: opts.get(name, default) for name, default in method.calibrator_defaults.items()}
    cls = MinMaxCalibrater if method.name == "minmax" else _HISTOGRAM_CALIBRATORS[method.name]
    calibrator = cls(
        model,
        op_types_to_calibrate,
        augmented_model_path,
        use_external_data_format=use_external_data_format,
        **method_options,
        settings=settings,
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
