"""The default memory budget respects an address-space limit (``ulimit -v``, RLIMIT_AS).

The review measured a MemoryError at 977 MiB of ``ulimit -v`` where ``memory_budget="500M"``
succeeded: the default budget (a quarter of MemAvailable) ignored the limit, so exact mode kept
outputs past it. Each run is a subprocess that sets the limit itself, once histocal and
onnxruntime are loaded (their mapped size is then known), with a timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import onnx
import pytest
from support.graphs import GraphBuilder, tensor

pytestmark = pytest.mark.subprocess

SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import numpy as np
    import histocal
    from histocal.calibrators import budget

    HEADROOM = int(sys.argv[2]) << 20

    def vm_size():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))

    cal = histocal.create_calibrator(
        sys.argv[1], calibrate_method="Percentile",
        extra_options={"CollectionMode": "exact", "NumThreads": 1, **eval(sys.argv[3])},
    )
    limit = vm_size() + HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print("budget", budget.resolve_memory_budget(None), flush=True)

    def feeds():  # 64 batches of 4 MiB inputs: 512 MiB of outputs (X and Y) in all
        for i in range(64):
            yield {"X": np.random.default_rng(i).normal(size=(1, 1 << 20)).astype(np.float32)}

    cal.collect_data(feeds)  # a callable: data that can be read again
    print("tensors", len(cal.compute_data().data))
    """
)


def _run(model: str, headroom_mib: int, extra: str = "{}") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HISTOCAL_MEMORY_BUDGET"}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, model, str(headroom_mib), extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def _model(tmp_path) -> str:
    g = GraphBuilder()
    g.node("Relu", ["X"], output="Y")
    path = tmp_path / "relu.onnx"
    onnx.save(g.model("relu", [tensor("X", ["N", 1 << 20])], [tensor("Y", ["N", 1 << 20])], 17), path.as_posix())
    return path.as_posix()


def test_default_budget_fits_under_the_address_space_limit(tmp_path):
    model = _model(tmp_path)
    result = _run(model, 400)
    assert result.returncode == 0, result.stderr[-3000:]
    budget = int(result.stdout.split("budget ")[1].split()[0])
    assert budget <= 100 << 20  # a quarter of the 400 MiB left, not of MemAvailable
    assert "tensors 2" in result.stdout
    # the same limit and an explicit budget past it: the allocation fails, as the default did before
    explicit = _run(model, 400, "{'MemoryBudget': '4G'}")
    assert explicit.returncode != 0 and "MemoryError" in explicit.stderr, explicit.stderr[-2000:]
