"""What the recipe's tests measure and feed on every route: the output SQNR of a quantized model
against its float model, and calibration feeds written as the command line's data folder."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort


def output_sqnr(float_path: str | Path, quantized_path: str | Path, held: Sequence[Mapping[str, np.ndarray]]) -> float:
    """Output SQNR (dB) of the quantized model against the float model over every output and feed."""
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (float_path, quantized_path)]
    signal = noise = 0.0
    for feed in held:
        for a, b in zip(*(s.run(None, dict(feed)) for s in sessions)):
            signal += float((a.astype(np.float64) ** 2).sum())
            noise += float(((a.astype(np.float64) - b) ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def data_folder(folder: Path, feeds: Sequence[Mapping[str, np.ndarray]], name: str = "X") -> Path:
    """``folder`` holding input ``name`` of each feed as a numbered .npy file (the command line's --data)."""
    folder.mkdir()
    for i, feed in enumerate(feeds):
        np.save(folder / f"{i:02d}.npy", feed[name])
    return folder
