#!/usr/bin/env bash
# Static checks, run by CI before the tests: formatting, lints, and the `_core` stub against the
# built extension (so `_core.pyi` cannot drift from the Rust bindings).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo clippy --release --all-targets --features python -- -D warnings
python -m mypy.stubtest histocal._core
