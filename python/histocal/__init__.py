"""histocal: Rust-accelerated, ORT-identical histogram calibration for ONNX quantization."""

from ._core import get_num_threads, set_num_threads
from .calibrators import (
    DEFAULT_STREAMING_BINS,
    MODES,
    DistributionCalibrater,
    EntropyCalibrater,
    MethodCalibrater,
    MinMaxCalibrater,
    PercentileCalibrater,
    create_calibrator,
)
from .collector import HistogramCollector, ValueCounts
from .methods import TensorHistogram, register_method, registered_methods, unregister_method
from .state import CalibrationState, merge_states, model_fingerprint
from .integration import calibrate, is_patched, patch_onnxruntime, quantize_static, unpatch_onnxruntime
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
    "CalibrationState",
    "merge_states",
    "model_fingerprint",
    "MinMaxCalibrater",
    "EntropyCalibrater",
    "PercentileCalibrater",
    "DistributionCalibrater",
    "MethodCalibrater",
    "create_calibrator",
    "TensorHistogram",
    "register_method",
    "unregister_method",
    "registered_methods",
    "MODES",
    "DEFAULT_STREAMING_BINS",
    "patch_onnxruntime",
    "unpatch_onnxruntime",
    "is_patched",
    "calibrate",
    "quantize_static",
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
