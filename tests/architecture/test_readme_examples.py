"""The Python examples of the README and of the manual pages run as written.

Each ```python block of README.md, docs/usage.md and docs/methods.md is one test, named by its
file and the heading above it, and runs in a temporary directory holding what the examples take as given:

* ``model.onnx``: the test CNN (tests/support/models.py), whose input ``X`` takes the feeds below;
* ``run.hcs``: a state collected from it (Entropy calibrator, exact mode);
* ``batches``: its calibration data, a list of feed dicts; ``reader``: the same feeds as an
  onnxruntime CalibrationDataReader (with rewind());
* for the HistogramCollector drop-in, one tensor ``conv1_out``: ``batch_array``, ``b1``, ``b2``,
  ``b3`` (batches of its values, of two shapes) and ``saved_tuple`` (its histogram_dict entry
  from onnxruntime's own collector).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod
from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector
from support import models
from support.parity import quiet

import histocal

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_FILES = ["README.md", "docs/usage.md", "docs/methods.md"]


def python_blocks(text: str, where: str = "README.md") -> list[tuple[str, int, str]]:
    """(``where``: heading, line number, source) of each ```python block, in order."""
    blocks, heading, lines = [], f"{where}: top", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := re.match(r"#+\s+(.*)", line):
            heading = f"{where}: {m.group(1).strip()}"
        elif line.strip() == "```python":
            start = i + 1
            end = next(j for j in range(start, len(lines)) if lines[j].strip() == "```")
            blocks.append((heading, start + 1, "\n".join(lines[start:end]) + "\n"))
            i = end
        i += 1
    return blocks


def _ids(blocks) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for heading, _, _ in blocks:
        seen[heading] = seen.get(heading, 0) + 1
        out.append(heading if seen[heading] == 1 else f"{heading} ({seen[heading]})")
    return out


BLOCKS = [b for name in EXAMPLE_FILES for b in python_blocks((ROOT / name).read_text(encoding="utf-8"), name)]


class FeedReader(CalibrationDataReader):
    def __init__(self, feeds: list[dict]) -> None:
        self.feeds, self.i = feeds, 0

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self) -> None:
        self.i = 0


def example_namespace(workdir: Path) -> dict:
    """Writes model.onnx and run.hcs into ``workdir``; returns the names the examples use."""
    onnx.save(models.cnn(), (workdir / "model.onnx").as_posix())
    batches = models.cnn_feeds(8)
    with quiet():
        cal = histocal.create_calibrator(
            (workdir / "model.onnx").as_posix(),
            calibrate_method=CalibrationMethod.Entropy,
            augmented_model_path=(workdir / "augmented.onnx").as_posix(),
            extra_options={"CollectionMode": "exact"},
        )
        cal.collect_data(batches)
        cal.save_state((workdir / "run.hcs").as_posix())
    rng = np.random.default_rng(0)
    batch_array = rng.normal(0, 1, (2, 4, 8, 8)).astype(np.float32)
    b1, b2, b3 = (rng.normal(0, 1, shape).astype(np.float32) for shape in [(2, 4, 8, 8), (1, 4, 8, 8), (2, 4, 6, 6)])
    ort_collector = OrtCollector(
        method="entropy", symmetric=False, num_bins=2048, num_quantized_bins=128, percentile=99.999, scenario="same"
    )
    with quiet():
        ort_collector.collect({"conv1_out": batch_array})
    return {
        "batches": batches,
        "reader": FeedReader(batches),
        "batch_array": batch_array,
        "b1": b1,
        "b2": b2,
        "b3": b3,
        "saved_tuple": ort_collector.histogram_dict["conv1_out"],
    }


def test_the_readme_has_python_examples():
    readme = [h for h, _, _ in BLOCKS if h.startswith("README.md")]
    assert len(readme) >= 3, readme


@pytest.mark.parity
@pytest.mark.parametrize("heading,line,source", BLOCKS, ids=_ids(BLOCKS))
def test_readme_example_runs(tmp_path, monkeypatch, heading, line, source):
    monkeypatch.chdir(tmp_path)
    namespace = example_namespace(tmp_path)
    where, _, title = heading.partition(": ")
    code = compile(source, f"{where}:{line} ({title})", "exec")
    with quiet():
        exec(code, namespace)
