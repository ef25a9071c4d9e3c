"""tests/support under its own name, for the benchmarks: a script run as ``python3 benches/bench_x.py``
has benches/ first on its import path, so ``from support import graphs`` finds this package, whose
modules are those of tests/support (the ONNX model builder and helpers the tests use) and the
benchmarks' own shared code here (``floor_rounds``)."""

from pathlib import Path

__path__ = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[2] / "tests" / "support")]
