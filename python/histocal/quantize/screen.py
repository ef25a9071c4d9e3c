"""Output error of a model against the float model, and the group screen over quantized tensors.

The error of a run is its noise energy: the sum over every float graph output of every feed of
(y - y_q)^2, y the float model's output (the SQNR is 10 log10(sum y^2 / noise)). Outputs that
cannot be compared (another shape, a non-finite value where the float one is finite) make the
noise infinite.

The screen (``screen_tensors``) estimates, for each quantized tensor t, how much of the quantized
model's output noise goes away when t alone is left in float: ``reduction(G) = noise(all) -
noise(all but G)`` for a group G of tensors, on the switched model (``switches``). It starts from
the group of all tensors and refines best first: the group with the largest reduction is split in
two halves (contiguous in graph order, so neighbouring tensors share a group); the first half is
measured with one run over the screen feeds, the second is given the parent's reduction minus
the first's (reductions add up when the tensors' noises are independent), and both go back into
the queue; a group of one tensor leaving the queue is the next candidate once its own reduction
is measured (a second half's is only inferred). It stops when it has
``max_candidates`` candidates, when ``max_runs`` runs are spent, or when the best group left
reduces the noise by less than ``min_share`` of it. When a few tensors carry most of the noise,
each is found in about log2(n) runs; when the noise is spread evenly over many tensors, no small
group recovers much, which the screen reports as such (the best groups it reached and their
reductions).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io.readers import Feed, run_session
from .runs import PreparedOutput, run_all, run_pool, sqnr_db

logger = logging.getLogger(__name__)


def session(path: Path, providers: list[Any]) -> Any:
    """A session on one onnxruntime thread: the feeds of a run go on histocal's threads instead
    (``histocal.quantize.runs``); same outputs bit for bit."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    return ort.InferenceSession(path.as_posix(), options, providers=providers)


class Reference:
    """The float model's numeric outputs on some feeds (kept in memory), and the noise energy of
    another model's outputs on the same feeds."""

    def __init__(self, float_session: Any, feeds: Sequence[Feed]) -> None:
        self.feeds = list(feeds)
        names = [o.name for o in float_session.get_outputs()]
        self.outputs: list[list[PreparedOutput]] = []
        numeric: list[str] | None = None
        runs = run_all(
            run_pool(), lambda i: dict(zip(names, run_session(float_session, names, feeds[i], i))), len(feeds)
        )
        for arrays in runs:
            if numeric is None:
                # Float outputs only: integer outputs (ids echoed back, argmax) are not quantized,
                # and their energy would inflate the SQNR.
                numeric = [n for n in names if isinstance(arrays[n], np.ndarray) and arrays[n].dtype.kind == "f"]
                if not numeric:
                    raise ValueError(f"diagnose: the model has no float tensor output to compare (outputs {names})")
            self.outputs.append([PreparedOutput(np.asarray(arrays[n])) for n in numeric])
        self.names = numeric or []
        self.signal = self.signal_of(None)

    def noise(self, model_session: Any, extra: Feed | None = None, limit: int | None = None) -> float:
        """sum (y - y_q)^2 of ``model_session``'s outputs over the first ``limit`` feeds (default
        all), each feed extended by ``extra``; inf when an output cannot be compared."""
        return self.total(self.output_noises(model_session, extra, limit))

    @staticmethod
    def total(output_noises: Sequence[list[float] | None]) -> float:
        """The sum of ``output_noises``'s result, in feed and output order (as one run after the
        other adds them); inf when a feed's outputs cannot be compared."""
        total = 0.0
        for parts in output_noises:
            if parts is None:
                return math.inf
            for noise in parts:
                total += noise
        return total

    def output_noises(
        self, model_session: Any, extra: Feed | None = None, limit: int | None = None
    ) -> list[list[float] | None]:
        """Per feed (the first ``limit``), sum (y - y_q)^2 of each output of ``model_session``; None
        for a feed whose outputs cannot be compared."""
        feeds = self.feeds[:limit]

        def noises_of(i: int) -> list[float] | None:
            got = run_session(model_session, self.names, {**feeds[i], **extra} if extra else feeds[i], i)
            parts = [y.sums(yq) for y, yq in zip(self.outputs[i], got)]
            return None if any(part is None for part in parts) else [part[1] for part in parts if part is not None]

        return list(run_all(run_pool(), noises_of, len(feeds)))

    def feed_sqnr_db(self, output_noises: Sequence[list[float] | None]) -> list[float]:
        """Per feed, the output SQNR (dB) of ``output_noises`` (``output_noises``'s result):
        -inf for a feed whose outputs cannot be compared."""
        out = []
        for i, parts in enumerate(output_noises):
            signal = float(sum(y.signal for y in self.outputs[i]))
            out.append(-math.inf if parts is None else sqnr_db(signal, float(sum(parts))))
        return out

    def signal_of(self, limit: int | None) -> float:
        return float(sum(y.signal for ys in self.outputs[:limit] for y in ys))


@dataclass(frozen=True)
class ScreenResult:
    """The screen's outcome: the noise of the fully quantized switched model on the screen feeds
    (``noise``, with ``signal`` its reference energy), the candidate tensors (switch index,
    reduction) best first, the groups still queued when it stopped ((first, end) index range,
    reduction), and the runs it made."""

    signal: float
    noise: float
    candidates: list[tuple[int, float]]
    unresolved: list[tuple[int, int, float]]
    runs: int

    def gain_db(self, reduction: float) -> float:
        """The SQNR gain of removing ``reduction`` from the noise, in dB."""
        left = self.noise - reduction
        if left <= 0:
            return math.inf
        return 10.0 * math.log10(self.noise / left)


def screen_tensors(
    switched_session: Any,
    switch_input: str,
    reference: Reference,
    count: int,
    *,
    limit: int | None,
    max_candidates: int,
    max_runs: int,
    min_share: float,
) -> ScreenResult:
    """The best-first group screen (module docstring) over ``count`` switches, on the first
    ``limit`` feeds of ``reference``."""
    everything = np.ones(count, np.bool_)
    runs = 0

    def noise_without(first: int, end: int) -> float:
        nonlocal runs
        mask = everything.copy()
        mask[first:end] = False
        runs += 1
        return reference.noise(switched_session, {switch_input: mask}, limit)

    full = noise_without(0, 0)
    signal = reference.signal_of(limit)
    if math.isinf(full):
        # An output the float model has finite became non-finite: every split reduces by inf, so
        # rank by whether the rest still fails, the same bisection.
        logger.warning("diagnose: the quantized model's output is not finite where the float model's is")
    queue: list[tuple[float, int, int, bool]] = [(-full, 0, count, True)]  # (-reduction, first, end, measured)
    candidates: list[tuple[int, float]] = []
    while queue and len(candidates) < max_candidates:
        negative, first, end, measured = queue[0]
        reduction = -negative
        if not math.isinf(full) and reduction < min_share * full:
            break
        if end - first == 1 and measured:
            heapq.heappop(queue)
            candidates.append((first, reduction))
            continue
        if runs + 1 > max_runs:
            break
        heapq.heappop(queue)
        if end - first == 1:  # an inferred reduction: a candidate only once measured
            rest = noise_without(first, end)
            found = (0.0 if math.isinf(rest) else math.inf) if math.isinf(full) else max(full - rest, 0.0)
            heapq.heappush(queue, (-found, first, end, True))
            continue
        middle = (first + end) // 2
        rest = noise_without(first, middle)
        if math.isinf(full):
            # a non-finite output: a group whose float version makes the rest finite holds the culprit
            left = 0.0 if math.isinf(rest) else math.inf
            right = math.inf if math.isinf(rest) else 0.0
        else:
            # one run per split: the other half's reduction is the parent's minus this one's
            # (exact when reductions add up; the checks measure what the screen only ranks)
            left = max(full - rest, 0.0)
            right = max(reduction - left, 0.0)
        heapq.heappush(queue, (-left, first, middle, True))
        heapq.heappush(queue, (-right, middle, end, False))
        logger.debug("diagnose: screen split [%d, %d) at %d (%d runs)", first, end, middle, runs)
    unresolved = sorted(((a, b, -r) for r, a, b, _ in queue), key=lambda g: -g[2])
    return ScreenResult(signal, full, candidates, unresolved, runs)
