"""histocal: Rust-accelerated, ORT-identical histogram calibration for ONNX quantization."""

from ._core import get_num_threads, set_num_threads
from .collector import HistogramCollector, ValueCounts
from .stats import (
    TensorStats,
    channel_min_max,
    moving_average,
    nanmean_pairwise,
    nanmean_sequential,
    tensor_stats,
)

__version__ = "0.1.0"

__all__ = [
    "HistogramCollector",
    "ValueCounts",
    "TensorStats",
    "tensor_stats",
    "channel_min_max",
    "nanmean_pairwise",
    "nanmean_sequential",
    "moving_average",
    "set_num_threads",
    "get_num_threads",
    "__version__",
]
