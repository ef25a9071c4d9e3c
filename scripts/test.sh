#!/usr/bin/env bash
# The one test command (README): builds and installs histocal, then runs the Rust kernel tests
# and the Python test suite (parity against the installed onnxruntime).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check --no-build-isolation -e .
cargo test --release --quiet
python3 -m pytest -q tests
