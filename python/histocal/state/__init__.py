"""The calibration state: what a calibration collected, reusable and mergeable, and its file format."""

from .collection import Collection
from .file.errors import StateError
from .file.format import FORMAT_NAME, FORMAT_VERSION, MAX_STATE_BINS, MAX_STATE_BYTES
from .overrides import compute_with_overrides, parse_method_overrides
from .state import CalibrationState, merge_states, model_fingerprint

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_STATE_BINS",
    "MAX_STATE_BYTES",
    "CalibrationState",
    "Collection",
    "StateError",
    "compute_with_overrides",
    "merge_states",
    "model_fingerprint",
    "parse_method_overrides",
]
