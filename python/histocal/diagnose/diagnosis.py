"""``diagnose``: what breaks a quantized model, and which nodes to leave in float.

Steps (costs in brackets):

1. Calibrate once: one streaming pass over the calibration data (every histogram method can be
   computed from its state), holding back the first ``eval_samples`` feeds when no separate
   evaluation data is given; the ranges are ``method``'s. [one calibration]
2. Quantize with ORT's ``quantize_static`` and measure the output SQNR against the float model
   on the held-back feeds. [one quantization, one run of each model over the held-back feeds]
3. Screen: on the switched model (``switches``: the float model with each quantized tensor's
   quantization switchable at run time) the best-first group screen of ``screen`` estimates, per
   quantized tensor, how much of the output noise leaving it alone in float removes, on the first
   ``screen_samples`` held-back feeds. [at most ``max_screen_runs`` runs over them]
4. Checks: the screen's candidates best first, then the quantized sentinel tensors (see
   ``findings``), each kept only if leaving its nodes in float, together with those kept before,
   gains at least ``min_gain_db`` on the switched model under ORT's exclusion rule (a tensor is
   in float when every quantized node next to it is excluded); until the predicted SQNR reaches
   the target, ``max_checks`` checks are made, or the next candidate would take the excluded nodes
   past ``max_excluded_fraction`` of the quantized nodes. [one run over the screen feeds each]
5. Measure: ORT's quantized model with the kept nodes excluded, on every held-back feed; if it
   does not gain ``min_gain_db``, none of them is kept. [one quantization, one run]
6. Exact checks, for what the switched model cannot judge: a sentinel tensor, or a tensor
   quantized with another tensor's scale (Slice, Transpose, Reshape... share their input's scale
   in ORT; excluding them gives the tensor its own range, which the switched model does not
   hold), whose check did not keep it is checked on ORT's quantized model, kept if it gains
   ``min_gain_db`` over the SQNR measured so far. [at most ``max_exact_checks`` quantizations]

The suggestion (``Diagnosis.nodes_to_exclude``) is the accepted exclusion list; its SQNR is
measured, not estimated. Leaving a tensor in float means excluding every quantized node next to
it (ORT quantizes a tensor when any neighbour is quantized), so a candidate adds one to three
node names. Unnamed nodes cannot be named in ``nodes_to_exclude``: the model is first given names
(``switches.name_nodes``, the same names every time), which ``histocal quantize --auto-exclude``
applies too.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData

from .. import calibrators, methods
from ..io.models import load_model
from ..io.readers import DataSource
from ..methods.settings import CollectionSettings
from ..quantize.exclusion import DiagnosisRun, TensorImpact
from ..quantize.findings import RangeFinding
from ..quantize.folds import collect_unless_empty, withholding_first
from ..quantize.integration import default_method_options
from ..quantize.ort import QUANTIZE_ARGUMENTS, QuantizationArgs, check_per_channel, model_file
from ..quantize.switches import model_ort_converts, name_nodes
from ..state import CalibrationState
from .report_text import summary_text

logger = logging.getLogger(__name__)

DEFAULTS: dict[str, Any] = {
    "method": "minmax",
    "eval_samples": 8,
    "screen_samples": 2,
    "max_excluded_fraction": 0.1,
    "max_screen_runs": 64,
    "max_checks": 16,
    "max_exact_checks": 2,
    "min_gain_db": 0.1,
}


@dataclass(frozen=True)
class Diagnosis:
    """The outcome of ``diagnose``. SQNRs are of the graph outputs against the float model on the
    held-back feeds, in dB. ``impacts``: candidate tensors, the screen's order; ``findings``: the
    quantized tensors whose ranges sentinels or outliers decide; ``nodes_to_exclude``: the
    suggestion and ``sqnr_excluded_db`` its SQNR measured on onnxruntime's quantized model;
    ``checks``: candidate checks on the switched model; ``quantizations``: onnxruntime
    quantizations after the first; ``unresolved``: groups the screen left
    unsplit (their first and last tensor, size and estimated gain); ``seconds``: calibration,
    quantization, screen, checks and total."""

    method: str
    sqnr_db: float
    quantized_nodes: int
    quantized_tensors: int
    impacts: tuple[TensorImpact, ...]
    findings: tuple[RangeFinding, ...]
    nodes_to_exclude: tuple[str, ...]
    sqnr_excluded_db: float
    target_sqnr_db: float | None
    max_excluded_fraction: float
    eval_samples: int
    screen_samples: int
    screen_runs: int
    checks: int
    quantizations: int
    unresolved: tuple[tuple[str, str, int, float], ...]
    seconds: Mapping[str, float]
    named_nodes: int = 0
    ranges: TensorsData | None = field(default=None, repr=False, compare=False)
    state: Any = field(default=None, repr=False, compare=False)

    @property
    def excluded_fraction(self) -> float:
        return len(self.nodes_to_exclude) / self.quantized_nodes if self.quantized_nodes else 0.0

    @property
    def gain_db(self) -> float:
        return self.sqnr_excluded_db - self.sqnr_db

    @property
    def target_reached(self) -> bool | None:
        return None if self.target_sqnr_db is None else self.sqnr_excluded_db >= self.target_sqnr_db

    def summary(self) -> str:
        """A plain-text account: SQNR before and after, the candidates, the findings."""
        return summary_text(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field but the ranges and the state (non-finite numbers as strings)."""

        def num(x: float | None) -> float | str | None:
            return x if x is None or math.isfinite(x) else str(x)

        return {
            "method": self.method,
            "sqnr_db": num(self.sqnr_db),
            "sqnr_excluded_db": num(self.sqnr_excluded_db),
            "gain_db": num(self.gain_db),
            "target_sqnr_db": self.target_sqnr_db,
            "target_reached": self.target_reached,
            "nodes_to_exclude": list(self.nodes_to_exclude),
            "excluded_fraction": self.excluded_fraction,
            "max_excluded_fraction": self.max_excluded_fraction,
            "quantized_nodes": self.quantized_nodes,
            "quantized_tensors": self.quantized_tensors,
            "named_nodes": self.named_nodes,
            "impacts": [
                {
                    "tensor": i.tensor,
                    "kind": i.kind,
                    "nodes": list(i.nodes),
                    "screen_gain_db": num(i.screen_gain_db),
                    "check_gain_db": num(i.check_gain_db),
                    "accepted": i.accepted,
                    "note": i.note,
                }
                for i in self.impacts
            ],
            "findings": [
                {
                    "tensor": f.tensor,
                    "kind": f.kind,
                    "min": num(f.min),
                    "max": num(f.max),
                    "ratio": num(f.ratio),
                    "share": f.share,
                    "detail": f.detail,
                }
                for f in self.findings
            ],
            "unresolved": [
                {"first": a, "last": b, "tensors": n, "screen_gain_db": num(g)} for a, b, n, g in self.unresolved
            ],
            "eval_samples": self.eval_samples,
            "screen_samples": self.screen_samples,
            "screen_runs": self.screen_runs,
            "checks": self.checks,
            "quantizations": self.quantizations,
            "seconds": dict(self.seconds),
        }


def _as_minmax(ranges: TensorsData) -> TensorsData:
    return TensorsData(
        CalibrationMethod.MinMax,
        {name: TensorData(lowest=d.lowest, highest=d.highest) for name, d in ranges.data.items()},
    )


def _calibrate(
    model_path: Path,
    data: Any,
    hold_back: int,
    settings: CollectionSettings,
    quantization: QuantizationArgs,
) -> tuple[CalibrationState, list[dict[str, np.ndarray]]]:
    """One streaming collection over ``data`` (every method can be computed from its state),
    keeping its first ``hold_back`` feeds out of it; (state, the kept feeds)."""
    kept: list[dict[str, np.ndarray]] = []
    with tempfile.TemporaryDirectory(prefix="histocal.diagnose.") as tmp:
        calibrator = calibrators.create_calibrator(
            model_path,
            quantization.op_types_to_quantize,
            augmented_model_path=Path(tmp, "augmented_model.onnx").as_posix(),
            calibrate_method="auto",
            use_external_data_format=quantization.use_external_data_format,
            providers=quantization.calibration_providers,
            settings=settings,
        )
        if not collect_unless_empty(calibrator, withholding_first(data, kept, hold_back)):
            raise ValueError(
                f"diagnose: no calibration data left after holding back {len(kept)} feeds for evaluation; "
                "give more data, separate evaluation data, or fewer held-back feeds"
            )
        return calibrator.state, kept


def _ranges(
    state: CalibrationState, method: str, method_options: dict[str, Any] | None, quantization: QuantizationArgs
) -> Any:
    name = methods.canonical_name(method)
    options = dict(method_options or {})
    if name not in methods.ORT_METHODS:
        extra = dict(quantization.extra_options or {})
        options = default_method_options(name, options, quantization.activation_type, extra)
    return _as_minmax(state.compute(name, **options))


def _check_fraction(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"max_excluded_fraction must be a number in [0, 1], got {value!r}")
    return float(value)


def diagnose(
    model_input: str | Path | onnx.ModelProto,
    calibration_data: Any = None,
    eval_data: Any = None,
    *,
    method: str = DEFAULTS["method"],
    method_options: dict[str, Any] | None = None,
    state: CalibrationState | None = None,
    eval_samples: int = DEFAULTS["eval_samples"],
    target_sqnr_db: float | None = None,
    max_excluded_fraction: float = DEFAULTS["max_excluded_fraction"],
    screen_samples: int = DEFAULTS["screen_samples"],
    max_screen_runs: int = DEFAULTS["max_screen_runs"],
    max_checks: int = DEFAULTS["max_checks"],
    max_exact_checks: int = DEFAULTS["max_exact_checks"],
    min_gain_db: float = DEFAULTS["min_gain_db"],
    streaming_bins: int | None = None,
    show_progress: bool | None = None,
    providers: Sequence[Any] | None = None,
    **quantize_kwargs: Any,
) -> Diagnosis:
    """Diagnose the int8 (or other ``activation_type``) quantization of ``model_input``: see the
    module docstring.

    Args:
        model_input: the float model (path or ModelProto).
        calibration_data: any data source histocal calibrates on (its first ``eval_samples``
            feeds are held back for evaluation unless ``eval_data`` is given).
        eval_data: evaluation feeds (needed with ``state``).
        method: the range method (any histogram method or registered one).
        method_options: its options.
        state: a ``CalibrationState`` to take the ranges from instead of calibrating.
        eval_samples: feeds held back for evaluation.
        target_sqnr_db: stop suggesting once the predicted output SQNR reaches it.
        max_excluded_fraction: the largest share of the quantized nodes to suggest excluding.
        screen_samples: feeds the screen runs on.
        max_screen_runs: the screen's runs at most.
        max_checks: candidate checks at most.
        max_exact_checks: checks on onnxruntime's quantized model at most.
        min_gain_db: the SQNR gain a candidate must add to be kept.
        streaming_bins: the streaming histograms' bins.
        show_progress: a progress bar (None: when the output is a terminal).
        providers: onnxruntime execution providers that run the models.
        **quantize_kwargs: ``quantize_static``'s quantization arguments (the screen always uses
            the QDQ format; the exact checks use ``quant_format``).

    Returns:
        The ``Diagnosis``: SQNRs, per-tensor impacts, findings and the suggested ``nodes_to_exclude``.

    Raises:
        ValueError: bad options, no calibration or evaluation data.
        TypeError: an unknown quantization argument.
    """
    start = time.perf_counter()
    unknown = sorted(set(quantize_kwargs) - set(QUANTIZE_ARGUMENTS))
    if unknown:
        raise TypeError(f"diagnose: unknown quantize_static arguments {unknown}")
    quantization = QuantizationArgs(**quantize_kwargs)
    check_per_channel(model_input, quantization)  # before calibrating: per_channel that cannot work
    settings = CollectionSettings.from_keywords(streaming_bins=streaming_bins, show_progress=show_progress)
    max_excluded_fraction = _check_fraction(max_excluded_fraction)
    for label, value in (
        ("eval_samples", eval_samples),
        ("screen_samples", screen_samples),
        ("max_screen_runs", max_screen_runs),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be a positive integer, got {value!r}")
    for label, value in (("max_checks", max_checks), ("max_exact_checks", max_exact_checks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{label} must be a non-negative integer, got {value!r}")
    if state is None and calibration_data is None:
        raise ValueError("diagnose needs calibration_data or a state")
    if state is not None and eval_data is None:
        raise ValueError("diagnose with a state needs eval_data (held-back feeds the state was not collected on)")
    providers = list(providers) if providers else ["CPUExecutionProvider"]
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="histocal.diagnose.") as tmp_name:
        tmp = Path(tmp_name)
        float_model = model_input if isinstance(model_input, onnx.ModelProto) else load_model(model_input)
        float_model, named = name_nodes(float_model)
        if named:
            logger.warning(
                "diagnose: %d nodes have no name; they are named <op_type>_<position> (histocal quantize "
                "--auto-exclude applies the same names)",
                named,
            )
        float_model = model_ort_converts(float_model, quantization)  # 16-bit types: opset 21
        model_path = model_file(float_model, tmp)
        t = time.perf_counter()
        feeds: list[dict[str, np.ndarray]]
        if state is None:
            state, feeds = _calibrate(
                model_path, calibration_data, 0 if eval_data is not None else eval_samples,
                settings, quantization,
            )  # fmt: skip
        else:
            feeds = []
        if eval_data is not None:
            # copies: a reader may reuse its buffers for its next feed
            feeds = [{k: np.array(v, copy=True) for k, v in f.items()} for f in DataSource(eval_data).read()]
        if not feeds:
            raise ValueError("diagnose: no evaluation feeds")
        seconds["calibration"] = time.perf_counter() - t
        ranges = _ranges(state, method, method_options, quantization)
        result = DiagnosisRun(model_path, float_model, ranges, feeds, providers, quantization, tmp).diagnose(
            state,
            screen_samples,
            max_screen_runs,
            max_checks,
            max_exact_checks,
            min_gain_db,
            target_sqnr_db,
            max_excluded_fraction,
            seconds,
        )
    seconds["total"] = time.perf_counter() - start
    impacts, excluded, sqnr, sqnr_excluded, counts, screen_runs, quantizations, unresolved, findings = result
    diagnosis = Diagnosis(
        method=methods.canonical_name(method),
        sqnr_db=sqnr,
        quantized_nodes=counts["nodes"],
        quantized_tensors=len(counts["tensors"]),
        impacts=tuple(impacts),
        findings=tuple(findings),
        nodes_to_exclude=tuple(excluded),
        sqnr_excluded_db=sqnr_excluded,
        target_sqnr_db=target_sqnr_db,
        max_excluded_fraction=max_excluded_fraction,
        eval_samples=len(feeds),
        screen_samples=min(screen_samples, len(feeds)),
        screen_runs=screen_runs,
        checks=counts["checks"],
        quantizations=quantizations,
        unresolved=tuple(unresolved),
        seconds=seconds,
        named_nodes=named,
        ranges=ranges,
        state=state,
    )
    logger.info("diagnose: %s", diagnosis.summary().splitlines()[0])
    return diagnosis
