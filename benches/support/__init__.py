"""What the benchmarks share: the harness (timing, floor, memory, records), the report that
generates BENCHMARKS.md, the synthetic model and the real models with their inputs. Its modules
also include those of tests/support (``benches.support.graphs``: the ONNX graph builder the tests
use), so the benchmarks build models the way the tests do."""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2] / "tests" / "support")]
