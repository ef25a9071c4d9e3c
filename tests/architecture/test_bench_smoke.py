"""Every benchmark runs to the end through the harness at its smallest size (``python -m benches
NAME --smoke``), so the benchmarks cannot rot between measurements, and the benchmarks stay a
suite: one command line, no benchmark module importing another."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHES = ROOT / "benches"
sys.path.insert(0, str(ROOT))

from benches import BENCHES as NAMES  # noqa: E402


def test_every_bench_module_is_registered():
    modules = {p.stem for p in BENCHES.glob("*.py") if not p.name.startswith("_")}
    assert modules == set(NAMES)


def test_no_bench_imports_another():
    """What benchmarks share is in benches/support, never in another benchmark."""
    for name in NAMES:
        imported = set()
        for node in ast.walk(ast.parse((BENCHES / f"{name}.py").read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        others = {f"benches.{other}" for other in NAMES if other != name}
        assert not imported & others, f"{name} imports {imported & others}"


def test_one_command_line():
    """At most two files of benches/ build an ArgumentParser (the runner builds the one)."""
    parsers = [p for p in BENCHES.rglob("*.py") if "ArgumentParser(" in p.read_text(encoding="utf-8")]
    assert len(parsers) <= 2, parsers


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("name", NAMES)
def test_bench_runs_at_its_smallest_size(name, tmp_path):
    env = {
        **os.environ,
        "HISTOCAL_NUM_THREADS": "2",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    run = subprocess.run(
        [sys.executable, "-m", "benches", name, "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"{name} exited {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    assert (tmp_path / f"{name}.json").exists()
