"""The ``histocal`` command line: calibrate, quantize, recompute, inspect, report, demo."""

from .main import main
from .options import AUTO_EVAL_SAMPLES, AUTO_FOLDS

__all__ = ["AUTO_EVAL_SAMPLES", "AUTO_FOLDS", "main"]
