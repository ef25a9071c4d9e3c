"""onnxruntime-compatible calibrators (MinMax, Entropy, Percentile, Distribution, histocal's methods)
and ``create_calibrator``."""

from ..methods.settings import DEFAULT_STREAMING_BINS, MODES
from .factory import create_calibrator
from .method import MethodCalibrater
from .minmax import MinMaxCalibrater
from .ort_methods import DistributionCalibrater, EntropyCalibrater, PercentileCalibrater

__all__ = [
    "DEFAULT_STREAMING_BINS",
    "MODES",
    "DistributionCalibrater",
    "EntropyCalibrater",
    "MethodCalibrater",
    "MinMaxCalibrater",
    "PercentileCalibrater",
    "create_calibrator",
]
