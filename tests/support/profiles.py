"""Hypothesis profiles, selected with ``HYPOTHESIS_PROFILE=<name>`` (conftest.py loads it):

* ``default``: random examples, no deadline, the example counts written in the tests;
* ``ci``:       the same counts, derandomized (the same examples on every run; no example
                database); CI selects it (.ci/run);
* ``thorough``: 5x the example counts (slow; for local bug hunting).

No profile has a deadline: the tests run onnxruntime and numpy on shared CI machines, where a
per-example time limit fails runs for the machine's load, not for histocal.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
PROFILES = {
    "default": dict(_COMMON),
    "ci": dict(_COMMON, derandomize=True),
    "thorough": dict(_COMMON),
}
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
_SCALE = 5.0 if PROFILE == "thorough" else 1.0


def load() -> None:
    """Register every profile and load the one HYPOTHESIS_PROFILE names."""
    for name, options in PROFILES.items():
        settings.register_profile(name, **options)
    settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """Example count for a property, scaled by the active profile."""
    return max(1, int(n * _SCALE))
