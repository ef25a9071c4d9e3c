"""Per-tensor ``auto``: each tensor's range from whichever candidate has the least estimated error.

The candidates (``methods.AUTO_CANDIDATES``, in tie-breaking order) are of both families: ORT's
minmax, percentile and entropy, which a state computes from its histograms (``ORT_AUTO_CANDIDATES``:
the caller passes their ``TensorsData``, computed as ``CalibrationState.compute`` computes them), and
histocal's kl and mse, computed here from the streaming histogram. Each candidate's range of each
tensor is scored by ``StreamHistograms.qerrors`` (the ``mse`` error model under onnxruntime's scale
rule, in the tensor's type); the least error wins, the earlier candidate on a tie. A range that is
not finite is no candidate; a tensor without any gets ``(0.0, 0.0)``.

It lives with the state, not in ``histocal.methods``: it needs ORT's results, which the methods
layer (a streaming histogram's ranges only) cannot compute.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnxruntime.quantization.calibrate import TensorData, TensorsData

from ..methods import AUTO_CANDIDATES, METHOD_OPTIONS, ORT_METHODS
from ..methods.scale_rule import SCALE_RULE

# auto's candidates that are ORT methods: (label, method, settings), in AUTO_CANDIDATES' order.
ORT_AUTO_CANDIDATES: tuple[tuple[str, str, dict[str, Any]], ...] = tuple(
    c for c in AUTO_CANDIDATES if c[1] in ORT_METHODS
)


def auto_ranges(
    stream: Any, names: Sequence[str], options: Mapping[str, Any], ort_candidates: Mapping[str, TensorsData]
) -> tuple[list[tuple[float, float]], list[str]]:
    """Per tensor auto's ``(low, high)`` and the label of the candidate chosen.

    Args:
        stream: the state's streaming histograms.
        names: the tensors.
        options: auto's options, checked (``methods.check_options``).
        ort_candidates: per label of ``ORT_AUTO_CANDIDATES``, that method's result on the same state.

    Returns:
        The ranges and the labels, in ``names`` order.
    """
    qtype, symmetric = options["qtype"], bool(options["symmetric"])
    best = [(math.inf, (0.0, 0.0), "mse")] * len(names)
    for label, cand, _ in AUTO_CANDIDATES:
        if cand in ORT_METHODS:
            td = ort_candidates[label]
            cand_ranges = [_pair(td[n]) for n in names]
        else:
            cand_options = {k: v for k, v in options.items() if k in METHOD_OPTIONS[cand]}
            cand_ranges = list(stream.ranges(cand, list(names), scale_rule=SCALE_RULE, **cand_options))
        finite = [i for i, r in enumerate(cand_ranges) if math.isfinite(r[0]) and math.isfinite(r[1])]
        errors = stream.qerrors(
            [names[i] for i in finite],
            [cand_ranges[i] for i in finite],
            scale_rule=SCALE_RULE,
            qtype=qtype,
            symmetric=symmetric,
        )
        for i, err in zip(finite, errors):
            if err < best[i][0]:
                best[i] = (err, cand_ranges[i], label)
    return [b[1] for b in best], [b[2] for b in best]


def _pair(td: TensorData) -> tuple[float, float]:
    return float(np.asarray(td.range_value[0]).reshape(-1)[0]), float(np.asarray(td.range_value[1]).reshape(-1)[0])
