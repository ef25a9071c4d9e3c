"""Which quantized nodes to leave in float, by evidence: the search of a diagnosis (steps 2-6 of
``histocal.diagnose.diagnosis``'s module docstring): quantize, screen the quantized tensors on the
switched model, check the candidates, measure, and the exact checks. ``histocal diagnose`` and the
recipe (``recipe``, its evidence step) both run it."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.calibrate import TensorsData

from ..io.models import save_model, written_files
from ..state import CalibrationState
from . import runs
from . import screen as _screen
from .findings import range_findings
from .ort import QuantizationArgs, quantize_with_ranges
from .switches import SWITCH_INPUT, QuantizedTensor, SwitchedSession, quantized_nodes, switched_model
from .weight_memo import shared_weight_quantization

# a diagnosis logs through one logger, diagnosis's
logger = logging.getLogger("histocal.diagnose.diagnosis")

SCREEN_MIN_SHARE = 0.002  # groups removing less than 0.2% of the noise (< 0.01 dB) are not split


@dataclass(frozen=True)
class TensorImpact:
    """One candidate tensor: its name, kind ("activation" or "weight"), the quantized nodes to
    exclude to leave it in float, the screen's estimate of the SQNR gain of leaving it alone in
    float, and, when checked, the gain its nodes added to the suggestion (``accepted``) or would
    have added (not accepted) on the switched model; ``note`` says why it was not checked, if so."""

    tensor: str
    kind: str
    nodes: tuple[str, ...]
    screen_gain_db: float | None
    check_gain_db: float | None = None
    accepted: bool = False
    note: str = ""


class DiagnosisRun:
    """One diagnosis over a saved model (steps 2-6 of ``diagnosis``'s module docstring)."""

    def __init__(
        self,
        model_path: Path,
        float_model: onnx.ModelProto,
        ranges: TensorsData,
        feeds: list[dict[str, np.ndarray]],
        providers: list[Any],
        quantization: QuantizationArgs,
        tmp: Path,
        quantized: onnx.ModelProto | None = None,
    ) -> None:
        """``quantized``: onnxruntime's QDQ model of ``model_path`` with ``ranges`` and
        ``quantization``, when the caller has it (the recipe's scoring model gives it without
        quantizing again: ``ScoringModel.quantized_model``); None: quantized here."""
        self.model_path = model_path
        self.quantized = quantized
        self.float_model = float_model
        self.ranges = ranges
        self.providers = providers
        # the models here are run by ``providers``: calibration's are not used
        self.quantization = replace(quantization, nodes_to_exclude=None, calibration_providers=None)
        self.user_excluded = list(quantization.nodes_to_exclude or [])
        self.tmp = tmp
        self.reference = _screen.Reference(_screen.session(model_path, providers), feeds)
        self.checks = 0  # candidate checks on the switched model
        self.quantizations = 0  # onnxruntime quantizations beyond the first
        # onnxruntime's model of each exact check that may still be the result, by its excluded
        # nodes (the best accepted one: at most two files at once, in ``tmp``)
        self._checked: dict[tuple[str, ...], Path] = {}
        # Per set of excluded nodes measured on onnxruntime's model (() : none), each feed's SQNR (dB).
        self.feed_sqnr_db: dict[tuple[str, ...], list[float]] = {}

    def _quantize(self, path: Path, exclude: Sequence[str], **override: Any) -> None:
        excluded = [*self.user_excluded, *exclude] or None
        quantize_with_ranges(
            self.model_path, path, self.ranges, self.quantization, nodes_to_exclude=excluded, **override
        )

    def exact_sqnr(self, exclude: Sequence[str]) -> float:
        """The output SQNR of onnxruntime's quantized model with ``exclude`` left in float."""
        self.quantizations += 1
        path = self.tmp / f"check{self.quantizations}.onnx"
        self._quantize(path, exclude)
        self._checked[tuple(exclude)] = path
        return self._measured(tuple(exclude), path)

    def checked_model(self, exclude: Sequence[str]) -> Path | None:
        """The file of onnxruntime's quantized model with ``exclude`` left in float, if an exact
        check quantized it and it is the search's result (else None). Removed with ``tmp``."""
        return self._checked.get(tuple(exclude))

    def _keep_only(self, exclude: Sequence[str]) -> None:
        """Remove the exact checks' models but ``exclude``'s (the search's result so far)."""
        for key in [k for k in self._checked if k != tuple(exclude)]:
            for f in written_files(self._checked.pop(key)):
                f.unlink()

    def _measured(self, exclude: tuple[str, ...], path: Path) -> float:
        """The output SQNR of the model at ``path`` (``exclude`` left in float), its per-feed SQNRs
        kept in ``feed_sqnr_db``."""
        noises = self.reference.output_noises(_screen.session(path, self.providers))
        self.feed_sqnr_db[exclude] = self.reference.feed_sqnr_db(noises)
        return _screen.sqnr_db(self.reference.signal, self.reference.total(noises))

    # Its quantizations (the QDQ model, the exact checks) compute each weight's quantization once
    # (``weight_memo``; a context manager made by ``contextmanager`` decorates: held for each call).
    @shared_weight_quantization()
    def diagnose(
        self,
        state: CalibrationState | None,
        screen_samples: int,
        max_screen_runs: int,
        max_checks: int,
        max_exact_checks: int,
        min_gain_db: float,
        target: float | None,
        max_fraction: float,
        seconds: dict[str, float],
        screen_min_share: float = SCREEN_MIN_SHARE,
    ) -> tuple[Any, ...]:
        t = time.perf_counter()
        qdq_path = self.tmp / "qdq.onnx"
        if self.quantized is not None and self.quantization.quant_format == QuantFormat.QDQ:
            qdq, self.quantized = self.quantized, None
            written = onnx.ModelProto()
            written.CopyFrom(qdq)  # the file for the sessions; ``qdq`` keeps its weights
            save_model(written, qdq_path)
        else:
            self._quantize(qdq_path, (), quant_format=QuantFormat.QDQ, use_external_data_format=True)
            qdq = onnx.load(qdq_path.as_posix())
        nodes = quantized_nodes(qdq)
        if not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in qdq.graph.node):
            logger.warning("diagnose: onnxruntime quantizes nothing in this model: nothing to diagnose")
            sqnr = _screen.sqnr_db(
                self.reference.signal, self.reference.noise(_screen.session(qdq_path, self.providers))
            )
            seconds["quantization"] = time.perf_counter() - t
            return [], [], sqnr, sqnr, {"nodes": 0, "tensors": [], "checks": 0}, 0, 0, [], []
        switched_path = self.tmp / "switched.onnx"
        # The QDQ model's runs (onnxruntime, the GIL released) while the switched model is built
        # and written (Python).
        qdq_format = self.quantization.quant_format == QuantFormat.QDQ
        with runs.ahead(self._measured, (), qdq_path) if qdq_format else nullcontext() as measured:
            switched, tensors, weights = switched_model(qdq, self.float_model)
            del qdq
            save_model(switched, switched_path)
            del switched
        sqnr = measured.result() if measured is not None else self.exact_sqnr(())
        seconds["quantization"] = time.perf_counter() - t
        logger.info(
            "diagnose: %d quantized nodes, %d quantized tensors, output SQNR %.2f dB", len(nodes), len(tensors), sqnr
        )

        t = time.perf_counter()
        switched_session = SwitchedSession(_screen.session(switched_path, self.providers), weights)
        result = _screen.screen_tensors(
            switched_session,
            SWITCH_INPUT,
            self.reference,
            len(tensors),
            limit=screen_samples,
            max_candidates=max(2 * max_checks, 8),
            max_runs=max_screen_runs,
            min_share=screen_min_share,
        )
        seconds["screen"] = time.perf_counter() - t

        t = time.perf_counter()
        candidates: list[tuple[QuantizedTensor, float | None]] = [
            (tensors[i], result.gain_db(r)) for i, r in result.candidates
        ]
        # Without a state (the recipe's call), no sentinel or outlier findings: the screen alone.
        findings = range_findings(state, [x.name for x in tensors]) if state is not None else []
        # sentinel tensors the screen did not rank come after its candidates (their check decides)
        screened = {c.name for c, _ in candidates}
        by_name = {x.name: x for x in tensors}
        candidates += [(by_name[f.tensor], None) for f in findings if f.kind == "sentinel" and f.tensor not in screened]
        impacts, excluded = self._greedy(
            switched_session, tensors, candidates, result, len(nodes), sqnr, screen_samples, max_checks, min_gain_db,
            target, max_fraction,
        )  # fmt: skip
        sqnr_excluded = sqnr
        if excluded:
            sqnr_excluded = self.exact_sqnr(excluded)
            if sqnr_excluded < sqnr + min_gain_db:
                logger.warning(
                    "diagnose: onnxruntime's model with the candidates in float measures %.2f dB (%.2f dB without): "
                    "no suggestion",
                    sqnr_excluded,
                    sqnr,
                )
                impacts = [dataclasses.replace(i, accepted=False) for i in impacts]
                excluded, sqnr_excluded = [], sqnr
            self._keep_only(excluded)
        sentinels = {f.tensor for f in findings if f.kind == "sentinel"}
        impacts, excluded, sqnr_excluded = self._exact(
            impacts, by_name, sentinels, excluded, sqnr_excluded, len(nodes), max_exact_checks, min_gain_db,
            target, max_fraction,
        )  # fmt: skip
        seconds["checks"] = time.perf_counter() - t
        unresolved = [
            (tensors[a].name, tensors[b - 1].name, b - a, result.gain_db(r))
            for a, b, r in result.unresolved
            if b - a > 1 and r > 0
        ][:5]
        counts = {"nodes": len(nodes), "tensors": [x.name for x in tensors], "checks": self.checks}
        return impacts, excluded, sqnr, sqnr_excluded, counts, result.runs, self.quantizations, unresolved, findings

    def _exact(
        self,
        impacts: list[TensorImpact],
        by_name: dict[str, QuantizedTensor],
        sentinels: set[str],
        excluded: list[str],
        current: float,
        node_count: int,
        max_exact_checks: int,
        min_gain_db: float,
        target: float | None,
        max_fraction: float,
    ) -> tuple[list[TensorImpact], list[str], float]:
        """Checks on onnxruntime's own quantized model for the candidates the switched model
        cannot judge: sentinel tensors and tensors quantized with another tensor's scale (an op
        such as Slice or Transpose shares its input's scale; excluding it gives the tensor its own
        range, which the switched model does not hold), when their switched check did not keep
        them; each kept if it gains at least ``min_gain_db`` over the measured SQNR so far."""
        limit = math.floor(max_fraction * node_count + 1e-9)
        spent = 0
        out = []
        for impact in impacts:
            tensor = by_name[impact.tensor]
            new = [n for n in tensor.nodes if n not in excluded and n not in self.user_excluded]
            if (
                impact.accepted
                or not (tensor.shared_scale or tensor.name in sentinels)
                or not new
                or len(excluded) + len(new) > limit
                or spent >= max_exact_checks
                or (target is not None and current >= target)
            ):
                out.append(impact)
                continue
            spent += 1
            got = self.exact_sqnr([*excluded, *new])
            accepted = got - current >= min_gain_db
            out.append(
                dataclasses.replace(
                    impact, check_gain_db=got - current, accepted=accepted, note="checked on onnxruntime's model"
                )
            )
            if accepted:
                excluded = [*excluded, *new]
                current = got
            self._keep_only(excluded)
        return out, excluded, current

    def _greedy(
        self,
        switched_session: Any,
        tensors: list[QuantizedTensor],
        candidates: list[tuple[QuantizedTensor, float | None]],
        screen: _screen.ScreenResult,
        node_count: int,
        sqnr: float,
        screen_samples: int,
        max_checks: int,
        min_gain_db: float,
        target: float | None,
        max_fraction: float,
    ) -> tuple[list[TensorImpact], list[str]]:
        """Candidates best first, each kept if leaving its nodes in float (with those kept before)
        gains at least ``min_gain_db`` on the switched model. A tensor is in float when every
        quantized node next to it is excluded: ORT's rule, so the check sees what ORT will do."""
        excluded: list[str] = []
        impacts = []
        limit = math.floor(max_fraction * node_count + 1e-9)
        base = _screen.sqnr_db(screen.signal, screen.noise)  # every tensor quantized, screen feeds
        current = base
        for tensor, gain in candidates:
            new = [n for n in tensor.nodes if n not in excluded and n not in self.user_excluded]
            note = ""
            # predicted SQNR of ORT's model: its measured one plus the gain seen on the switched model
            if target is not None and sqnr + (current - base) >= target:
                note = "target reached"
            elif not tensor.nodes:
                note = "no named node next to it"
            elif not new:
                note = "already left in float"
            elif len(excluded) + len(new) > limit:
                note = f"would exceed {max_fraction:.0%} of the quantized nodes"
            elif self.checks >= max_checks:
                note = "check budget spent"
            if note:
                impacts.append(TensorImpact(tensor.name, tensor.kind, tensor.nodes, gain, note=note))
                continue
            left = {*excluded, *new}
            mask = np.array([not (t.nodes and all(n in left for n in t.nodes)) for t in tensors], np.bool_)
            noise = self.reference.noise(switched_session, {SWITCH_INPUT: mask}, screen_samples)
            got = _screen.sqnr_db(screen.signal, noise)
            self.checks += 1
            accepted = got - current >= min_gain_db
            logger.debug("diagnose: leaving %s in float: %.2f dB (%s)", tensor.name, got, accepted)
            impacts.append(TensorImpact(tensor.name, tensor.kind, tensor.nodes, gain, got - current, accepted))
            if accepted:
                excluded += new
                current = got
        return impacts, excluded
