"""The ``histocal`` command line: calibrate, quantize, recompute, inspect, report, demo."""

from .main import AUTO_EVAL_SAMPLES, AUTO_FOLDS, main

__all__ = ["AUTO_EVAL_SAMPLES", "AUTO_FOLDS", "main"]
