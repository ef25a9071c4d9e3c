"""onnxruntime-compatible calibrators (MinMax, Entropy, Percentile, Distribution, histocal's methods)
and ``create_calibrator``."""

from .histogram import *  # noqa: F403
from .histogram import __all__ as __all__
