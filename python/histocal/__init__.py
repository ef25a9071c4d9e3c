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
from .methods import (
    AUTO_SELECTION_OPTIONS,
    MODEL_AUTO_CANDIDATES,
    TensorHistogram,
    register_method,
    registered_methods,
    unregister_method,
)
from .state import CalibrationState, merge_states, model_fingerprint
from .quantize.integration import (
    calibrate,
    calibrate_and_select,
    is_patched,
    patch_onnxruntime,
    quantize_static,
    unpatch_onnxruntime,
)
from .quantize.selection import Selection, select_ranges, select_ranges_cross_validated, state_candidates
from .stats import (
    TensorStats,
    channel_min_max,
    moving_average,
    nanmean_pairwise,
    nanmean_sequential,
    tensor_stats,
)

from ._version import __version__

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
    "MODEL_AUTO_CANDIDATES",
    "AUTO_SELECTION_OPTIONS",
    "MODES",
    "DEFAULT_STREAMING_BINS",
    "patch_onnxruntime",
    "unpatch_onnxruntime",
    "is_patched",
    "calibrate",
    "quantize_static",
    "calibrate_and_select",
    "select_ranges",
    "select_ranges_cross_validated",
    "state_candidates",
    "Selection",
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
