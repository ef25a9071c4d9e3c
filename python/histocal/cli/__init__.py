"""The ``histocal`` command line: calibrate, quantize, recompute, inspect, report, demo."""

from .common import AUTO_EVAL_SAMPLES, AUTO_FOLDS
from .main import main

__all__ = ["AUTO_EVAL_SAMPLES", "AUTO_FOLDS", "main"]
