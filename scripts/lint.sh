#!/usr/bin/env bash
# Static checks, run by CI (.ci/run) before the tests, and by the pre-commit hook: Python lint,
# format and types; Rust format and clippy; and the `_core` stub against the built extension (so
# `_core.pyi` cannot drift from the Rust bindings). Installs its pinned tools and builds histocal
# (editable) first; numpy/onnx/onnxruntime already installed are kept, as scripts/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
if [[ -n "${HISTOCAL_TEST_CONSTRAINTS:-}" ]]; then
    cp "$HISTOCAL_TEST_CONSTRAINTS" "$pins"
fi
python3 -m pip install -q --disable-pip-version-check -c "$pins" -r requirements-lint.txt
python3 -m pip install -q --disable-pip-version-check -c "$pins" --no-build-isolation -e .

python3 -m ruff check python tests benches
python3 -m ruff format --check python tests benches
python3 -m mypy python/histocal
cargo fmt --check
cargo clippy --release --all-targets -- -D warnings
cargo clippy --release --all-targets --features python -- -D warnings
python3 -m mypy.stubtest histocal._core
