"""``MethodCalibrater``: histocal's own methods and registered ones, on onnxruntime's
calibrator interface."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxruntime.quantization import calibrate as ort_calibrate

from .. import _core, methods
from ..methods.settings import CollectionSettings
from ..methods.table import summaries_for
from ..state.channels import ChannelHistograms
from ..state.overrides import rule_summaries
from .common import PrivateShapeInference, augmented_path_for
from .histogram import HistogramCalibration

# The collection keywords' defaults (compared by identity: a keyword given with its default's value
# alongside ``settings`` is left unnoticed, which is harmless).
_KEYWORD_DEFAULTS: dict[str, Any] = dict(
    streaming_bins=None, show_progress=None, per_channel=False, axis=1, num_threads=None, session_options=None
)


class MethodCalibrater(HistogramCalibration, ort_calibrate.HistogramCalibrater, PrivateShapeInference):
    """histocal's own methods (mse, kl, pow2, auto) and registered ones, from one streaming
    pass: ``compute_data`` returns their ranges as MinMax-style TensorsData (see
    ``histocal.methods``). Always collects in streaming mode (the methods read the streaming
    histogram).

    Args:
        model_path: the float model.
        op_types_to_calibrate: calibrate only these operators' tensors (None: all).
        augmented_model_path: where the augmented model goes (default: a temporary folder).
        use_external_data_format: save the augmented model's weights as external data.
        method: a histocal or registered method's name.
        method_options: its options (``histocal.methods.METHOD_OPTIONS``).
        streaming_bins: the streaming histograms' bins (a power of two).
        show_progress: a progress bar (None: when the output is a terminal).
        per_channel: per-channel histograms.
        axis: their channel axis.
        num_threads: histocal's worker threads (None: the default).
        session_options: onnxruntime SessionOptions for the calibration session.
        settings: these collection settings as one ``methods.settings.CollectionSettings`` (what
            histocal's entry points pass), instead of the keywords; its mode is streaming here.

    Raises:
        ValueError: an onnxruntime method, an unknown method or option.
        TypeError: ``settings`` and collection keywords both given.
    """

    def __init__(
        self,
        model_path: str | Path,
        op_types_to_calibrate: Sequence[str] | None = None,
        augmented_model_path: str | Path | None = None,
        use_external_data_format: bool = False,
        method: str = "mse",
        method_options: dict[str, Any] | None = None,
        *,
        streaming_bins: int | None = None,
        show_progress: bool | None = None,
        per_channel: bool = False,
        axis: int = 1,
        num_threads: int | None = None,
        session_options: Any = None,
        settings: CollectionSettings | None = None,
    ) -> None:
        name = methods.canonical_name(method)
        if name in methods.ORT_METHODS:
            raise ValueError(f"{name} is an onnxruntime method: use its own calibrator (or create_calibrator)")
        self.method_options = methods.check_options(name, dict(method_options or {}))
        super().__init__(
            model_path,
            op_types_to_calibrate,
            augmented_path_for(self, augmented_model_path),
            use_external_data_format,
            method=name,
        )
        keywords = dict(
            streaming_bins=streaming_bins,
            show_progress=show_progress,
            per_channel=per_channel,
            axis=axis,
            num_threads=num_threads,
            session_options=session_options,
        )
        given = {k: v for k, v in keywords.items() if v is not _KEYWORD_DEFAULTS[k]}
        # its methods read the streaming histogram, whatever mode the settings name
        self._init_histocal(CollectionSettings.of(settings, **given).replace(mode="streaming"))

    def _check_settings(self) -> None:
        if self.per_channel:
            ChannelHistograms.check_summaries(summaries_for(self.method, self.method_options), self.axis)

    def new_stream(self) -> _core.StreamHistograms:
        """An empty streaming histogram set for this calibrator.

        Returns:
            Histograms that collect the summaries its method and overrides need.
        """
        # a method choosing per batch needs every batch's vote, collected as the batches come
        summaries = summaries_for(self.method, self.method_options) | rule_summaries(self.method_overrides)
        return _core.StreamHistograms(self.streaming_bins, summaries=sorted(summaries))

    def _new_channels(self) -> ChannelHistograms:
        summaries = summaries_for(self.method, self.method_options) | rule_summaries(self.method_overrides)
        return ChannelHistograms.collecting(self.streaming_bins, self.axis, summaries)
