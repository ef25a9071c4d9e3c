"""The test suite's helper library, shared with the benchmarks (benches/support points here).

Imported as a package, ``from support import parity`` (pyproject.toml puts tests/ on pytest's
import path): parity (collector parity with onnxruntime, address-space caps), calibrator_runs (the
calibrator tests' readers and runners), graphs and models (ONNX models), strategies (hypothesis
strategies of collect sequences), method_refs and isotone_refs (numpy references of the methods),
profiles (the hypothesis profiles).
"""
