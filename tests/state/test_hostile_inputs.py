"""Hostile state and cache files, and running out of memory: bounded memory, ordinary exceptions.

Each check runs in a fresh interpreter whose address space may grow only by a set amount past its baseline
(RLIMIT_AS, see ``run_capped``) and under a timeout, because what it guards against is a process that
aborts (Rust's default on a failed allocation), exhausts the machine, or reads gigabytes for seconds:

* small files declaring huge content (bins x tensors, zip members, sparse files) are refused from the
  declared sizes, before the memory is taken or the file is read;
* loading reserves nothing beyond the file (a valid state loads under a tight cap);
* running out of memory inside the Rust core is a ``MemoryError`` (an ``Exception``), never an abort or
  PyO3's ``PanicException`` (a ``BaseException``);
* a seeded fuzz run of both loaders, with hostile sizes, under a 2 GiB cap: version 1's members and version
  2's (the channels member's nested state, isotone's pair counts and pairs).
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from histocal import CalibrationState, Collection, _core
from histocal.state import MAX_STATE_BINS

HERE = Path(__file__).parent  # the bodies of test_state_limits.py import that module
TESTS = HERE.parent  # tests/, the folder holding the support package
MiB = 1 << 20
GiB = 1 << 30

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")


def run_capped(body: str, headroom: int, timeout: float = 120) -> dict:
    """Run ``body`` in a fresh interpreter once histocal is imported and its two worker threads started, with
    an address space that may grow by ``headroom`` bytes (parity's ``bounded_address_space``). The body
    ``report``s what happened; the result is the report, and an abort, a crash or a hang fails the test."""
    code = (
        f"import sys; sys.path[:0] = [{str(TESTS)!r}, {str(HERE)!r}]\n"
        "import json\nimport numpy as np\nimport histocal\nfrom histocal import _core, CalibrationState, Collection\n"
        "from support.parity import bounded_address_space\n"
        "_core.get_num_threads()\n"  # the pool's threads (their stacks) exist before the cap
        "out = {}\n"
        "def report(**kw): out.update(kw)\n"
        f"with bounded_address_space({headroom}):\n"
        + textwrap.indent(textwrap.dedent(body).strip(), "    ")
        + "\nprint('REPORT', json.dumps(out))\n"
    )
    # A fixed baseline whatever the machine: two worker threads, two malloc arenas.
    env = {**os.environ, "HISTOCAL_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}"
    lines = [line for line in r.stdout.splitlines() if line.startswith("REPORT ")]
    assert lines, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(lines[-1][len("REPORT ") :])


def outcome(expr: str, name: str) -> str:
    """Body lines that run ``expr`` and report its outcome (``ok`` or the exception's type and text) and time."""
    return f"""
import time
t = time.perf_counter()
try:
    {expr}
    report({name}="ok")
except BaseException as e:
    report({name}=f"{{type(e).__name__}}: {{e}}", {name}_is_exception=isinstance(e, Exception))
report({name}_seconds=time.perf_counter() - t)
"""


# ----------------------------------------------------------------------------------------------
# building states without a model
# ----------------------------------------------------------------------------------------------


def stream_state(
    n_tensors: int, streaming_bins: int, *, empty: bool = False, settings: dict | None = None
) -> CalibrationState:
    rng = np.random.default_rng(n_tensors)
    stream = _core.StreamHistograms(streaming_bins)
    items = [
        (f"t{i}", [np.zeros(0, np.float32) if empty else rng.normal(0, 1 + i, 500).astype(np.float32)])
        for i in range(n_tensors)
    ]
    stream.collect(items)
    return CalibrationState(Collection("streaming", stream), method="percentile", settings=settings or {})


def exact_state(n_tensors: int, kind: str = "value", num_bins: int = 64) -> CalibrationState:
    rng = np.random.default_rng(7)
    stream, exact = _core.StreamHistograms(64), _core.Histograms(kind, num_bins)
    for _ in range(2):
        items = [(f"t{i}", [rng.normal(0, 1 + i, 300).astype(np.float32)]) for i in range(n_tensors)]
        stream.collect(items)
        exact.collect(items)
    return CalibrationState(
        Collection("exact", stream, exact),
        method="entropy",
        settings={"num_bins": num_bins},
    )


def members(raw: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def rezip(parts: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in parts.items():
            zf.writestr(name, data)
    return buf.getvalue()


def header_of(raw: bytes) -> dict:
    return json.loads(np.load(io.BytesIO(members(raw)["header.npy"])).tobytes())


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array)
    return buf.getvalue()


def with_header(raw: bytes, header: dict) -> bytes:
    return rezip({**members(raw), "header.npy": npy(np.frombuffer(json.dumps(header).encode(), np.uint8))})


def zip_with_deflate_bomb(stored: dict[str, bytes], name: str, zeros: int, prefix: bytes = b"") -> bytes:
    """A zip of ``stored`` members plus member ``name``: ``prefix`` (a .npy header) and ``zeros`` (a multiple of
    1 MiB) zero bytes deflated ~1000:1, built from one compressed MiB repeated (each ends in a full flush, so
    none refers to another) rather than by compressing them all. The CRC is not computed (nothing should get
    that far)."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(MiB)) + c.flush(zlib.Z_FULL_FLUSH)
    body = head + block * (zeros // MiB) + c.flush(zlib.Z_FINISH)
    out, central = io.BytesIO(), io.BytesIO()
    entries = [(n, d, 0, zlib.crc32(d), len(d)) for n, d in stored.items()]
    entries.append((name, body, 8, 0, len(prefix) + zeros))
    for n, data, method, crc, size in entries:
        offset, fname = out.tell(), n.encode()
        out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0x21, crc, len(data), size, len(fname), 0))
        out.write(fname + data)
        central.write(
            struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                20,
                20,
                0,
                method,
                0,
                0x21,
                crc,
                len(data),
                size,
                len(fname),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
            + fname
        )
    start = out.tell()
    out.write(central.getvalue())
    out.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central.getvalue()), start, 0))
    return out.getvalue()


# ----------------------------------------------------------------------------------------------
# hostile files: refused from their declared sizes
# ----------------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_small_state_declaring_huge_bins_x_tensors_is_refused_before_allocating(tmp_path):
    """68 KB, 400 empty tensors, streaming_bins 2^25: 100 GiB of bins once loaded (it reached 9.5 GB)."""
    raw = stream_state(400, 8, empty=True).to_bytes()
    header = header_of(raw)
    header["options"]["streaming_bins"] = 1 << 25
    path = tmp_path / "huge.npz"
    path.write_bytes(with_header(raw, header))
    assert path.stat().st_size < 100_000
    r = run_capped(
        f"from histocal import CalibrationState\n{outcome(f'CalibrationState.load({str(path)!r})', 'load')}", 256 * MiB
    )
    assert (
        r["load"].startswith("ValueError: Invalid calibration state") and "would hold 13421772800 bins" in r["load"]
    ), r
    assert f"limit of {MAX_STATE_BINS}" in r["load"]
    assert r["load_seconds"] < 5


@pytest.mark.subprocess
def test_zip_bomb_member_is_refused_before_decompressing(tmp_path):
    """A ~1 MB file whose stream_bins member inflates to 1 GiB, for a header that allows 16 bins."""
    raw = stream_state(2, 16).to_bytes()
    stored = {n: d for n, d in members(raw).items() if n != "stream_bins.npy"}
    path = tmp_path / "bomb.npz"
    path.write_bytes(zip_with_deflate_bomb(stored, "stream_bins.npy", GiB))
    assert path.stat().st_size < 4 * MiB
    r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 256 * MiB)
    assert "zip member 'stream_bins.npy' declares 1073741824 bytes, more than the" in r["load"], r
    assert r["load_seconds"] < 5


def test_compressed_size_beyond_any_deflate_stream_is_refused():
    raw = stream_state(2, 16).to_bytes()
    stored = {n: d for n, d in members(raw).items() if n != "stream_bins.npy"}
    bomb = bytearray(zip_with_deflate_bomb(stored, "stream_bins.npy", MiB))
    # the central directory's uncompressed size of the last member: 1 MiB -> 10 bytes
    at = bomb.rindex(struct.pack("<I", MiB))
    bomb[at : at + 4] = struct.pack("<I", 10)
    with pytest.raises(ValueError, match="compressed bytes for 10 bytes"):
        CalibrationState.from_bytes(bytes(bomb))


@pytest.mark.subprocess
def test_sparse_state_file_is_refused_without_reading_it(tmp_path):
    """A 4 GiB sparse file was read whole (18 s) before "not a zip file"."""
    path = tmp_path / "sparse.npz"
    with open(path, "wb") as f:
        f.truncate(4 * GiB)
    r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 256 * MiB)
    assert "not a zip/npz file" in r["load"], r
    assert r["load_seconds"] < 2


@pytest.mark.subprocess
def test_sparse_cache_file_stops_at_its_first_chunk(tmp_path):
    """A 1 GiB sparse cache was read and decoded (8 s, 3.1 GB) before "malformed JSON"."""
    path = tmp_path / "sparse.json"
    with open(path, "wb") as f:
        f.truncate(GiB)
    r = run_capped(
        "from histocal.io import cache\n" + outcome(f"cache.load_tensors_data({str(path)!r})", "load"), 256 * MiB
    )
    assert r["load"].startswith("ValueError: Invalid calibration cache") and "control character" in r["load"], r
    assert r["load_seconds"] < 2


def test_states_settings_and_bins_are_capped_at_max_bins():
    raw = stream_state(3, 64).to_bytes()
    for edit, problem in [
        (lambda h: h["options"]["settings"].update(num_bins=_core.MAX_BINS + 1), "options.settings.num_bins"),
        (
            lambda h: h["options"].update(exact_kind="value", exact_num_bins=_core.MAX_BINS + 1),
            "options.exact_num_bins",
        ),
    ]:
        header = header_of(raw)
        edit(header)
        with pytest.raises(ValueError, match=problem):
            CalibrationState.from_bytes(with_header(raw, header))
    state = CalibrationState.from_bytes(raw)
    with pytest.raises(ValueError, match=f"num_bins must be in \\[1, {_core.MAX_BINS}\\]"):
        state.compute("percentile", num_bins=_core.MAX_BINS + 1)
    with pytest.raises(ValueError, match="num_bins .*16777216"):
        state.compute("kl", num_bins=_core.MAX_BINS + 1)


def test_members_beyond_what_the_header_declares_are_refused():
    raw = exact_state(3).to_bytes()
    parts = members(raw)
    hist = np.load(io.BytesIO(parts["exact_hist.npy"]))
    for key, array in [
        ("exact_hist", np.concatenate([hist, np.zeros(50_000, hist.dtype)])),
        ("stream_counts", np.zeros((400, 5), np.uint64)),
    ]:
        with pytest.raises(
            ValueError, match=f"zip member '{key}.npy' declares .* bytes, more than the .* its header allows"
        ):
            CalibrationState.from_bytes(rezip({**parts, f"{key}.npy": npy(array)}))
    # votes: at most one row per batch, type and exponent
    s = _core.StreamHistograms(64, summaries=["pow2_votes"])
    s.collect([("t", [np.arange(5, dtype=np.float32)])])
    voted = CalibrationState(Collection("streaming", s)).to_bytes()
    rows = np.array([(0, t, k, 1) for t in range(3) for k in range(60)], np.int64)
    with pytest.raises(ValueError, match="zip member 'stream_votes.npy' declares"):
        CalibrationState.from_bytes(rezip({**members(voted), "stream_votes.npy": npy(rows)}))


# ----------------------------------------------------------------------------------------------
# no reservation of the maximum: valid files load under a tight cap
# ----------------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_valid_files_load_merge_and_inspect_under_a_tight_address_space(tmp_path):
    """Every load reserved 4 GiB (the cache loader 1 GiB): under `ulimit -v 4G` a valid 1.1 MB state failed
    with a bare MemoryError, the CLI's --state/recompute/inspect and merge_states with it."""
    state_path, cache_path = tmp_path / "state.npz", tmp_path / "cache.json"
    stream_state(80, 16384).save(state_path)
    assert 500_000 < state_path.stat().st_size < 2_000_000
    histocal_cache = stream_state(5, 1024).compute("percentile", num_bins=64)
    from histocal.io.cache import save_tensors_data

    save_tensors_data(histocal_cache, cache_path)
    r = run_capped(
        f"""
from histocal import merge_states
from histocal.io.cache import load_tensors_data
from histocal.cli import main
{outcome(f"CalibrationState.load({str(state_path)!r}).compute('percentile', num_bins=512)", "load")}
{outcome(f"merge_states({str(state_path)!r}, {str(state_path)!r})", "merge")}
{outcome(f"load_tensors_data({str(cache_path)!r})", "cache")}
{outcome(f"assert main(['--quiet', 'inspect', {str(state_path)!r}]) == 0", "inspect")}
""",
        512 * MiB,
    )
    assert (r["load"], r["merge"], r["cache"], r["inspect"]) == ("ok", "ok", "ok", "ok"), r


# ----------------------------------------------------------------------------------------------
# out of memory in the Rust core: MemoryError, never an abort or a PanicException
# ----------------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_computing_beyond_memory_is_refused_up_front_naming_num_bins(tmp_path):
    """A 30 KB state whose settings ask for 2^24 bins, 12 tensors (~3 GiB of ORT histograms): computing
    percentile aborted the interpreter (or raised PanicException, with more memory). The whole computation's
    memory is estimated before it starts (tests/state/test_state_limits.py has more)."""
    path = tmp_path / "many_bins.npz"
    stream_state(12, 1024, settings={"num_bins": _core.MAX_BINS, "symmetric": True, "percentile": 99.9}).save(path)
    r = run_capped(
        f"""
state = CalibrationState.load({str(path)!r})
{outcome("state.compute('percentile')", "compute")}
{outcome("state.compute('percentile', num_bins=2048)", "after")}
""",
        1 * GiB,
        timeout=300,
    )
    assert r["compute"].startswith(f"MemoryError: percentile with num_bins={_core.MAX_BINS} on 12 tensors"), r
    assert r["compute_is_exception"] and r["after"] == "ok", r


@pytest.mark.subprocess
def test_out_of_memory_exporting_arrays_is_a_memory_error():
    """numpy failing to allocate inside rust-numpy was a panic: to_bytes / StreamHistograms.export / state."""
    r = run_capped(
        """
stream = _core.StreamHistograms(1 << 25)  # 256 MiB of bins, already in the address space
stream.collect([("t", [np.linspace(-3, 3, 101, dtype=np.float32)])])
exact = _core.Histograms("value", _core.MAX_BINS)
exact.collect([("t", [np.linspace(-3, 3, 101, dtype=np.float32)])])
state = CalibrationState(Collection("streaming", stream))
with bounded_address_space(64 << 20):
"""
        + textwrap.indent(
            outcome("stream.export('t')", "export")
            + outcome("state.to_bytes()", "to_bytes")
            + outcome("exact.state('t')", "state"),
            "    ",
        ),
        2 * GiB,
    )
    for key in ("export", "to_bytes", "state"):
        assert r[key].startswith("MemoryError") and r[f"{key}_is_exception"], r


@pytest.mark.subprocess
def test_out_of_memory_collecting_keeps_the_histogram_and_names_the_tensor():
    r = run_capped(
        """
h = _core.Histograms("value", 1 << 20)
small = np.linspace(-1, 1, 1000, dtype=np.float32)
h.collect([("t", [small])])
before = h.state("t").hist.sum()
# growth to ~2^24 bins: 128 MiB of counts that the cap does not leave room for
with bounded_address_space(32 << 20):
"""
        + textwrap.indent(outcome("h.collect([('t', [small * 15])])", "grow"), "    ")
        + """
report(kept=bool(h.state("t").hist.sum() == before), counts=h.counts("t").n_finite)
""",
        2 * GiB,
    )
    assert r["grow"].startswith('MemoryError: tensor "t": out of memory'), r
    assert r["kept"] and r["counts"] == 1000, r


# ----------------------------------------------------------------------------------------------
# fuzz: both loaders, hostile sizes, under a 2 GiB cap
# ----------------------------------------------------------------------------------------------

FUZZ_BODY = r"""
import io, random, time, zipfile
from histocal.io import cache
rng = random.Random(SEED)
bases = {name: open(path, "rb").read() for name, path in BASES.items()}
huge = [1 << 24, 1 << 25, (1 << 25) + 1, 1 << 31, 1 << 62, -1, 0, 2 ** 64, 16777217, 99999999999]
stats = {"load_ok": 0, "load_refused": 0, "compute_ok": 0, "compute_refused": 0, "oom": 0, "cache_ok": 0, "cache_refused": 0}

def members(raw):
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}

def rezip(parts, method):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        for n, d in parts.items():
            zf.writestr(n, d)
    return buf.getvalue()

def paths(node, prefix=()):
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield from paths(v, prefix + (k,))

def hostile_header(raw):
    parts = members(raw)
    h = json.loads(np.load(io.BytesIO(parts["header.npy"])).tobytes())
    if rng.random() < 0.4:
        # sizes a valid state may declare, up to the caps: what loading and computing must hold in memory
        if h["options"]["streaming_bins"] is not None and rng.random() < 0.5:
            h["options"]["streaming_bins"] = 1 << rng.choice([3, 10, 14, 20, 25])
        h["options"]["settings"]["num_bins"] = rng.choice([1 << 11, 1 << 16, 1 << 20, 1 << 24])
        h["options"]["settings"]["num_quantized_bins"] = 128
    # and numbers replaced by hostile sizes (bins, spans, counts, settings) or by other types
    for _ in range(rng.randint(0, 3)):
        spots = [p for p in paths(h) if p]
        p = rng.choice(spots)
        node = h
        for k in p[:-1]:
            node = node[k]
        node[p[-1]] = rng.choice(huge) if rng.random() < 0.8 else rng.choice([None, "x", [], {}, 1.5])
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(json.dumps(h).encode(), np.uint8))
    parts["header.npy"] = buf.getvalue()
    return rezip(parts, rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))

def npy_bytes(array):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array)
    return buf.getvalue()

def hostile_members(raw):
    # version 2's members: the channels member's state (its header, its bytes, or a nested per-channel
    # state), isotone's declared pair counts and pairs
    parts = members(raw)
    if "channels.npy" in parts and rng.random() < 0.6:
        inner = np.load(io.BytesIO(parts["channels.npy"])).tobytes()
        pick = rng.random()
        inner = hostile_header(inner) if pick < 0.4 else mutated(inner) if pick < 0.8 else raw
        parts["channels.npy"] = npy_bytes(np.frombuffer(inner, np.uint8))
    if "isotone_tensors.npy" in parts and rng.random() < 0.6:
        t = np.load(io.BytesIO(parts["isotone_tensors.npy"])).copy()
        if t.size:
            t[rng.randrange(len(t)), rng.randrange(3)] = rng.choice([1 << 20, (1 << 20) + 1, 1 << 40, 1 << 63, 0, 2, 7])
        parts["isotone_tensors.npy"] = npy_bytes(t)
    if "isotone_pairs.npy" in parts and rng.random() < 0.4:
        p = np.load(io.BytesIO(parts["isotone_pairs.npy"])).copy()
        if p.size:
            p[rng.randrange(len(p)), rng.randrange(2)] = rng.choice([np.nan, np.inf, -0.0, 1e300, -1.0])
        parts["isotone_pairs.npy"] = npy_bytes(p[::-1] if rng.random() < 0.3 else p)
    return rezip(parts, rng.choice([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))

def mutated(raw):
    b = bytearray(raw)
    if rng.random() < 0.5:  # the zip's size and offset fields: in the directory records at the end
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(max(0, len(b) - 600), len(b) - 4)
            b[at : at + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x40", b"\x00\x00\x00\x00", rng.randbytes(4)])
    else:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    if rng.random() < 0.2:
        b = b[: rng.randrange(len(b) + 1)]
    return bytes(b)

def check_state(raw):
    try:
        state = CalibrationState.from_bytes(raw, what="fuzz")
    except ValueError as e:
        assert str(e).startswith("Invalid calibration state fuzz: ") and "internal error" not in str(e), e
        stats["load_refused"] += 1
        return False
    stats["load_ok"] += 1
    # what a loaded state allows: ORT's methods with its own settings, and writing it back
    # (entropy with the state's own num_bins: its search is quadratic in the bins, a matter of time, not memory)
    methods = [lambda: state.compute("entropy", num_bins=128, num_quantized_bins=128),
               lambda: state.compute(rng.choice(["percentile", "distribution", "minmax"]))]
    if state.stream is not None and "isotone" in state.stream.summaries:
        methods.append(lambda: state.compute("isotone"))
    for work in (rng.choice(methods), state.to_bytes):
        try:
            work()
            stats["compute_ok"] += 1
        except MemoryError:
            stats["oom"] += 1
        except ValueError:
            stats["compute_refused"] += 1
    return True

def check_cache(raw):
    with open(CACHE_PATH, "wb") as f:
        f.write(raw)
    try:
        cache.load_tensors_data(CACHE_PATH)
        stats["cache_ok"] += 1
    except ValueError as e:
        assert "Invalid calibration cache" in str(e), e
        stats["cache_refused"] += 1

t0 = time.perf_counter()
for i in range(ROUNDS):
    name = rng.choice(sorted(bases))
    raw = bases[name]
    if name.endswith(".json"):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] = rng.choice([0, 0x22, 0x5B, 0x7B, 0x39, rng.randrange(256)])
        check_cache(bytes(b))
    else:
        pick = rng.random()
        if name.startswith("v2") and pick < 0.4:
            loaded = check_state(hostile_members(raw))
        else:
            loaded = check_state(hostile_header(raw) if pick < 0.7 else mutated(raw))
        if name.startswith("v2"):
            stats["v2_ok" if loaded else "v2_refused"] = stats.get("v2_ok" if loaded else "v2_refused", 0) + 1
report(seconds=time.perf_counter() - t0, **stats)
"""


def channel_state(channels: int, tensors: int = 1, isotone: bool = False) -> CalibrationState:
    """Per-channel histograms (format version 2's channels member), with isotone's summaries per channel."""
    from histocal.state.channels import ChannelHistograms

    rng = np.random.default_rng(channels)
    items = [(f"t{i}", [rng.normal(size=(2, channels, 3)).astype(np.float32)]) for i in range(tensors)]
    ch = ChannelHistograms(16, axis=1, isotone=isotone)
    ch.collect(items)
    stream = _core.StreamHistograms(16, summaries=["isotone"] if isotone else [])
    stream.collect(items)
    return CalibrationState(Collection("streaming", stream, channels=ch))


def isotone_state() -> CalibrationState:
    """isotone's per-tensor summaries (format version 2's isotone members)."""
    rng = np.random.default_rng(3)
    stream = _core.StreamHistograms(64, summaries=["isotone"])
    stream.collect([(f"t{i}", [rng.normal(size=(20, 5)).astype(np.float32)]) for i in range(3)])
    return CalibrationState(Collection("streaming", stream), method="isotone")


@pytest.mark.subprocess
@pytest.mark.parametrize("seed", [1, 2])
def test_fuzz_loaders_under_a_2_gib_cap(tmp_path, seed):
    """Seeded rounds of hostile headers (sizes, bins, settings), zip field and byte mutations of states, and
    byte mutations of caches: loading gives a state or a ValueError; computing and writing a loaded state
    give a result, a ValueError or a MemoryError; never an abort, a panic, another exception or a hang."""
    bases = {}
    # many.npz: 16 tensors, whose histograms of 2^24 bins need more than the cap
    for name, state in [
        ("stream.npz", stream_state(3, 64)),
        ("exact.npz", exact_state(3)),
        ("abs.npz", exact_state(2, "abs", 32)),
        ("many.npz", stream_state(16, 64)),
        ("v2_channels.npz", channel_state(3, tensors=2)),
        ("v2_isotone.npz", isotone_state()),
        ("v2_channels_isotone.npz", channel_state(4, tensors=2, isotone=True)),
    ]:
        bases[name] = str(tmp_path / name)
        state.save(bases[name], compress=name in ("exact.npz", "v2_channels.npz"))
    from histocal.io.cache import save_tensors_data

    bases["cache.json"] = str(tmp_path / "cache.json")
    save_tensors_data(stream_state(3, 64).compute("distribution", num_bins=512), bases["cache.json"])
    body = f"SEED, ROUNDS, BASES, CACHE_PATH = {seed}, 1000, {bases!r}, {str(tmp_path / 'fuzz.json')!r}\n" + FUZZ_BODY
    r = run_capped(body, 2 * GiB, timeout=300)
    assert r["load_ok"] > 50 and r["load_refused"] > 300 and r["cache_refused"] > 50, r
    assert r["v2_ok"] > 10 and r["v2_refused"] > 100, r
