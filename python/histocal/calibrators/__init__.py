"""onnxruntime-compatible calibrators (MinMax, Entropy, Percentile, Distribution, histocal's methods)
and ``create_calibrator``."""

from ..methods.settings import DEFAULT_STREAMING_BINS, MODES
from .budget import MEMORY_BUDGET_ENV
from .common import MEMORY_BUDGET_OPTION, METHOD_OPTIONS_OPTION, MODE_OPTION, STREAMING_BINS_OPTION
from .factory import create_calibrator
from .method import MethodCalibrater
from .minmax import MinMaxCalibrater
from .ort_methods import DistributionCalibrater, EntropyCalibrater, PercentileCalibrater

__all__ = [
    "DEFAULT_STREAMING_BINS",
    "MEMORY_BUDGET_ENV",
    "MEMORY_BUDGET_OPTION",
    "METHOD_OPTIONS_OPTION",
    "MODES",
    "MODE_OPTION",
    "STREAMING_BINS_OPTION",
    "DistributionCalibrater",
    "EntropyCalibrater",
    "MethodCalibrater",
    "MinMaxCalibrater",
    "PercentileCalibrater",
    "create_calibrator",
]
