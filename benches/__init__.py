"""histocal's benchmarks, one module per question, run through one harness
(``python -m benches NAME [--quick]``; ``support/harness.py``). Each module defines:

* ``QUESTION``: what it answers, and ``TITLE``: its section's heading in BENCHMARKS.md;
* ``SIZES``: its settings at the sizes ``smoke`` (the test suite's), ``quick`` and ``full``;
* ``run(run, settings)``: measures, adding one record per measurement to ``run``;
* ``section(result)``: its section's tables from a result (the records of one run);
* ``summary(result)``: its rows of BENCHMARKS.md's summary, (what, figure and comparison);
* optionally ``plot(result, folder)``: PNGs, returning (file name, caption) pairs.

No benchmark module imports another: what they share is in ``support/``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# In BENCHMARKS.md's order.
BENCHES = [
    "speed",
    "memory",
    "floor",
    "setup",
    "per_channel",
    "auto_diagnose",
    "recipe",
    "model_matrix",
    "state_files",
    "limits",
    "kernels",
    "distributed",
    "peers",
]


def bench_module(name: str) -> ModuleType:
    return importlib.import_module(f"benches.{name}")
