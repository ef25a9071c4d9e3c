"""histocal: Rust-accelerated, ORT-identical histogram calibration for ONNX quantization."""

from ._version import __version__
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
from .quantize.integration import calibrate, calibrate_and_select, quantize_static
from .quantize.patch import is_patched, patch_onnxruntime, unpatch_onnxruntime
from .quantize.selection import Selection, select_ranges, select_ranges_cross_validated, state_candidates
from .quark import is_quark_patched, patch_quark, unpatch_quark
from .state import CalibrationState, Collection, compute_with_overrides, merge_states, model_fingerprint
from .stats import (
    TensorStats,
    channel_min_max,
    moving_average,
    nanmean_pairwise,
    nanmean_sequential,
    tensor_stats,
)
from .threads import get_num_threads, set_num_threads

__all__ = [
    "AUTO_SELECTION_OPTIONS",
    "DEFAULT_STREAMING_BINS",
    "MODEL_AUTO_CANDIDATES",
    "MODES",
    "CalibrationState",
    "Collection",
    "DistributionCalibrater",
    "EntropyCalibrater",
    "HistogramCollector",
    "MethodCalibrater",
    "MinMaxCalibrater",
    "PercentileCalibrater",
    "Selection",
    "TensorHistogram",
    "TensorStats",
    "ValueCounts",
    "__version__",
    "calibrate",
    "calibrate_and_select",
    "channel_min_max",
    "compute_with_overrides",
    "create_calibrator",
    "get_num_threads",
    "is_patched",
    "is_quark_patched",
    "merge_states",
    "model_fingerprint",
    "moving_average",
    "nanmean_pairwise",
    "nanmean_sequential",
    "patch_onnxruntime",
    "patch_quark",
    "quantize_static",
    "register_method",
    "registered_methods",
    "select_ranges",
    "select_ranges_cross_validated",
    "set_num_threads",
    "state_candidates",
    "tensor_stats",
    "unpatch_onnxruntime",
    "unpatch_quark",
    "unregister_method",
]
