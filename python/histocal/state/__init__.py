"""The calibration state: what a calibration collected, reusable and mergeable, and its file format."""

from .file_format import FORMAT_NAME, FORMAT_VERSION, MAX_STATE_BINS, MAX_STATE_BYTES, StateError
from .state import CalibrationState, merge_states, model_fingerprint

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_STATE_BINS",
    "MAX_STATE_BYTES",
    "CalibrationState",
    "StateError",
    "merge_states",
    "model_fingerprint",
]
