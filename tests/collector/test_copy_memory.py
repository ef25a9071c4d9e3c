"""``Histograms.copy`` and ``StreamHistograms.copy`` allocate fallibly: a copy that does not fit in memory is
a ``MemoryError`` (the original unchanged), never an abort. They replaced the Python copies (export and
restore, or a merge into an empty collection); a Rust ``Clone`` on the infallible allocator would abort the
process instead (exit 134)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")

SCRIPT = """
import resource
import numpy as np
from histocal import _core

def vm_bytes():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

data = np.linspace(-3, 3, 1000, dtype=np.float32)
big = {make}
big.collect([(name, [data]) for name in ("a", "b")])  # also starts the thread pool
before = [big.counts(n).batches for n in ("a", "b")]
cap = vm_bytes() + 96 * 2**20  # far less than a copy of the histograms ({copy_mib} MiB)
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
try:
    big.copy()
    print("copied")
except MemoryError as exc:
    print("MemoryError", exc)
resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
assert [big.counts(n).batches for n in ("a", "b")] == before
small = {make_small}
small.collect([("a", [data])])
copy = small.copy()
small.collect([("a", [data])])
assert copy.counts("a").batches == 1 and small.counts("a").batches == 2
print("intact")
"""


@pytest.mark.subprocess
@pytest.mark.parametrize(
    "make, make_small, copy_mib",
    [
        # two tensors of 2^25 streaming bins: 2 x 256 MiB
        (
            "_core.StreamHistograms(1 << 25, summaries=['pow2_votes'])",
            "_core.StreamHistograms(64, summaries=['isotone'])",
            512,
        ),
        # two tensors of 2^24 exact bins: 2 x (128 MiB of counts + 64 MiB of float32 edges)
        ("_core.Histograms('value', 1 << 24)", "_core.Histograms('abs', 64)", 384),
    ],
)
def test_a_copy_too_large_for_memory_is_a_memory_error_not_an_abort(make, make_small, copy_mib):
    script = textwrap.dedent(SCRIPT).format(make=make, make_small=make_small, copy_mib=copy_mib)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "MemoryError" in r.stdout and "out of memory" in r.stdout, r.stdout
    assert r.stdout.strip().endswith("intact"), r.stdout
