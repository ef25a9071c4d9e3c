"""The ``histocal`` command line: calibrate, recompute, quantize, diagnose, inspect, report, demo (and Quark's)."""

from .main import main

__all__ = ["main"]
