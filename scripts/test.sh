#!/usr/bin/env bash
# The one test command (README; .ci/run runs it too). It installs what the tests need into the
# current Python environment, then runs the Rust kernel tests and the Python suite (parity
# against the installed onnxruntime):
#   1. the build and test tools (requirements-dev.txt: maturin, pytest, pytest-timeout, hypothesis, matplotlib);
#   2. histocal itself, editable, built from this checkout (with its runtime dependencies).
# numpy, onnx and onnxruntime are the parity reference, so they are never changed silently:
# the versions already installed are pinned for both installs (pip fails rather than replace
# them), and missing ones are installed as pyproject.toml allows. With HISTOCAL_TEST_CONSTRAINTS
# set to a constraints file (CI: constraints-ci.txt), those exact versions are installed instead.
set -euo pipefail
cd "$(dirname "$0")/.."

pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
if [[ -n "${HISTOCAL_TEST_CONSTRAINTS:-}" ]]; then
    cp "$HISTOCAL_TEST_CONSTRAINTS" "$pins"
else
    python3 - >"$pins" <<'PY'
from importlib.metadata import PackageNotFoundError, version

for name in ("numpy", "onnx", "onnxruntime"):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        pass
PY
fi

install() {
    python3 -m pip install -q --disable-pip-version-check -c "$pins" "$@" || {
        echo "scripts/test.sh: 'pip install $*' failed; numpy, onnx and onnxruntime were held at:" >&2
        sed 's/^/    /' "$pins" >&2
        echo "(the test command never changes these; if they conflict with pyproject.toml, change them yourself)" >&2
        exit 1
    }
}
install -r requirements-dev.txt
if [[ -n "${HISTOCAL_TEST_CONSTRAINTS:-}" ]]; then
    install numpy onnx onnxruntime  # the constrained versions, whatever was installed
fi
# maturin is in the environment now, so the build needs no isolated environment of its own.
install --no-build-isolation -e .
python3 -c 'import numpy, onnx, onnxruntime; print(f"testing against numpy {numpy.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}")'

cargo test --release --quiet
# -m "": every test, the slow and Ray ones included (pyproject.toml deselects those by default).
python3 -m pytest -q -m "" tests
