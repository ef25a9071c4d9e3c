"""The state file's declared sizes and compute's memory: each defect reproduced in a fresh interpreter under an
address-space cap and a timeout (``run_capped``), where it aborted or took gigabytes before.

* compute builds ORT histograms a chunk of tensors or channels at a time, and estimates its whole memory
  (results, a chunk, work arrays) against what the process can still take before it starts;
* the loader checks nested states, channel counts, the channels member and isotone's pair counts from the
  header and the zip directory before reading or recursing;
* a state histocal would not read back is refused when saving, before anything is written.
"""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from test_hostile_inputs import (
    GiB,
    MiB,
    header_of,
    members,
    npy,
    outcome,
    rezip,
    run_capped,
    stream_state,
    with_header,
    zip_with_deflate_bomb,
)

from histocal import CalibrationState, Collection, _core
from histocal.state.channels import ChannelHistograms
from histocal.state.file import format as file_format

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS and /proc")


def channel_state(channels: int, tensors: int = 1, bins: int = 8, isotone: bool = False) -> CalibrationState:
    """A state of ``tensors`` tensors of ``channels`` channels each (also imported by the capped interpreters)."""
    rng = np.random.default_rng(0)
    shape = (2, channels, 3) if isotone else (2, channels)
    items = [(f"t{i}", [rng.normal(size=shape).astype(np.float32)]) for i in range(tensors)]
    ch = ChannelHistograms(bins, axis=1, isotone=isotone)
    ch.collect(items)
    stream = _core.StreamHistograms(bins, summaries=["isotone"] if isotone else [])
    stream.collect(items)
    return CalibrationState(Collection("streaming", stream, channels=ch))


# ----------------------------------------------------------------------------------------------
# compute's memory
# ----------------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_per_channel_compute_builds_the_channels_histograms_a_chunk_at_a_time():
    """3 tensors x 40k channels: every channel's 2048-bin ORT histogram at once (~47 KB each, 5.6 GB) aborted
    under a cap; a chunk at a time it fits in 1 GiB, with the results of a computation per channel."""
    r = run_capped(
        """
from test_state_limits import channel_state
state = channel_state(40_000, tensors=3)
"""
        + outcome("result = state.compute('percentile')", "compute")
        + """
keys = [state.channels.channel_keys("t1")[c] for c in (0, 39_999)]
one = CalibrationState(Collection("streaming", state.channels.stream, only=tuple(keys))).compute("percentile", per_channel=False)
report(same=[float(result["t1"].range_value[1][c]) == float(one[k].range_value[1]) for c, k in zip((0, 39_999), keys)])
report(shape=list(result["t2"].range_value[0].shape))
""",
        1 * GiB,
        timeout=300,
    )
    assert r["compute"] == "ok" and r["same"] == [True, True] and r["shape"] == [40_000], r


@pytest.mark.subprocess
def test_per_tensor_compute_too_large_for_memory_is_refused_up_front_naming_num_bins(tmp_path):
    """A version-1 state of many empty tensors (the review's: 300k, 925 KB; here 150k): recompute --method
    percentile built a 2048-bin result for each (4.9 GB here) and aborted under `ulimit -v 2000000` (exit
    134). Refused before it starts, naming num_bins."""
    path, cache = tmp_path / "many.npz", tmp_path / "cache.json"
    stream_state(150_000, 8, empty=True).save(path, compress=True)
    assert path.stat().st_size < 4 * MiB

    def cap() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (2_000_000 * 1024, 2_000_000 * 1024))

    cmd = [sys.executable, "-m", "histocal", "recompute", str(path), "--method", "percentile", "--cache", str(cache)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "percentile with num_bins=2048 on 150000 tensors" in r.stderr and "lower num_bins" in r.stderr, r.stderr
    assert not cache.exists()


@pytest.mark.subprocess
def test_num_bins_at_the_maximum_is_refused_with_the_estimate_before_computing(tmp_path):
    """Entropy at num_bins 2^24 (the documented maximum, kept): 12 tensors need ~6 GiB; refused in
    milliseconds naming the option and the estimate, and a smaller num_bins still works."""
    path = tmp_path / "state.npz"
    stream_state(12, 1024).save(path)
    r = run_capped(
        f"state = CalibrationState.load({str(path)!r})\n"
        + outcome(f"state.compute('entropy', num_bins={_core.MAX_BINS})", "compute")
        + outcome("state.compute('entropy', num_bins=256)", "after"),
        1 * GiB,
    )
    assert r["compute"].startswith(f"MemoryError: entropy with num_bins={_core.MAX_BINS} on 12 tensors"), r
    assert "needs about" in r["compute"] and r["compute_is_exception"] and r["compute_seconds"] < 1, r
    assert r["after"] == "ok", r


@pytest.mark.subprocess
def test_exact_calibrator_at_max_num_bins_is_refused_before_collecting(tmp_path):
    """EntropyCalibrater(num_bins=2^24) on a real classifier grew to 20 GB and was killed by the kernel after
    52 s (overcommit: no MemoryError). The estimate (tensors x bins x bytes + work) refuses it up front."""
    import onnx
    from support.models import cnn

    model = tmp_path / "cnn.onnx"
    onnx.save(cnn(), model)
    r = run_capped(
        f"""
import histocal
from support.models import cnn_feeds
cal = histocal.EntropyCalibrater({str(model)!r}, num_bins={_core.MAX_BINS}, mode="exact")
cal.augment_graph()
cal.create_inference_session()
"""
        + outcome("cal.collect_data(cnn_feeds(4))", "collect"),
        1 * GiB,
    )
    assert r["collect"].startswith(f"MemoryError: entropy with num_bins={_core.MAX_BINS} on "), r
    assert r["collect_seconds"] < 5, r


# ----------------------------------------------------------------------------------------------
# the loader: declared sizes checked before reading or recursing
# ----------------------------------------------------------------------------------------------


def nested_channels(levels: int, padding: int) -> bytes:
    """A per-channel state whose channels member is ``padding`` zero bytes (which zip readers skip, as the
    prefix of a self-extracting archive) and a per-channel state whose channels member is ... ; deflated,
    every level inflates by ``padding`` while the file grows by a few hundred bytes."""
    base = members(channel_state(1).to_bytes())
    raw = channel_state(1).to_bytes()
    for _ in range(levels):
        inner = np.frombuffer(bytes(padding) + raw, np.uint8)
        raw = rezip({**base, "channels.npy": npy(inner)}, zipfile.ZIP_DEFLATED)
    return raw


@pytest.mark.subprocess
def test_nested_channels_members_are_refused_before_recursing(tmp_path):
    """Nested channels members: the loader read each level and recursed into it before checking that inner
    states have no channels, keeping two copies per level (a 26 KB file: 4.5 GB RSS in 8-13 s, then a
    27,000-character error). Here 200 levels of 512 KiB each (200 MiB inflated, two copies each): refused
    from the first inner state's zip directory, with a short error."""
    path = tmp_path / "nested.npz"
    path.write_bytes(nested_channels(200, 512 << 10))
    assert path.stat().st_size < 1 * MiB
    r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 128 * MiB, timeout=120)
    assert "per-channel states do not nest" in r["load"] and len(r["load"]) < 400, r
    assert r["load_seconds"] < 2, r


@pytest.mark.subprocess
def test_channels_member_zip_bomb_is_refused_from_the_directory(tmp_path):
    """A channels member could declare up to 4 GiB (4.1 MB file: 24-50 s, 8 GB). It is bounded by the header
    (one channel of 8 bins here) and by its deflate ratio: refused before it is inflated."""
    raw = channel_state(1).to_bytes()
    stored = {n: d for n, d in members(raw).items() if n != "channels.npy"}
    path = tmp_path / "bomb.npz"
    path.write_bytes(zip_with_deflate_bomb(stored, "channels.npy", GiB))
    r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 256 * MiB)
    assert "zip member 'channels.npy' declares 1073741824 bytes, more than the" in r["load"], r
    assert r["load_seconds"] < 2, r


@pytest.mark.subprocess
def test_isotone_pair_counts_are_checked_before_the_pairs_are_read(tmp_path):
    """isotone's 2^20 pairs per tensor was checked after reading the pairs (3.15 MB file: 14-25 s, 3.2 GB). Such
    a deflated bomb is now refused from the zip directory (what its compressed bytes can inflate to); the pair
    counts are still checked before the pairs are read (here a pairs member that is no .npy array at all)."""
    s = _core.StreamHistograms(64, summaries=["isotone"])
    s.collect([("t", [np.arange(12, dtype=np.float32).reshape(4, 3)])])
    raw = CalibrationState(Collection("streaming", s)).to_bytes()
    parts = members(raw)
    pairs = 1 << 26  # 1 GiB of pairs, 64 times the limit for one tensor
    parts["isotone_tensors.npy"] = npy(np.array([[pairs, 0, 0]], np.uint64))
    stored = {n: d for n, d in parts.items() if n != "isotone_pairs.npy"}
    path = tmp_path / "pairs.npz"
    path.write_bytes(zip_with_deflate_bomb(stored, "isotone_pairs.npy", GiB))
    r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 256 * MiB)
    assert "zip member 'isotone_pairs.npy' declares 1073741824 bytes, more than the" in r["load"], r
    assert r["load_seconds"] < 2, r
    with pytest.raises(ValueError, match=f"more than {_core.ISOTONE_MAX_PAIRS} pairs for one tensor"):
        CalibrationState.from_bytes(rezip({**stored, "isotone_pairs.npy": bytes(MiB)}))
    # within the per-tensor limit, but together more than the state may hold
    header = header_of(raw)
    header["tensors"] = [dict(header["tensors"][0], name=f"t{i}") for i in range(100)]
    parts = members(with_header(raw, header))
    for key in ("stream_stats", "stream_counts"):
        parts[f"{key}.npy"] = npy(np.repeat(np.load(io.BytesIO(parts[f"{key}.npy"])), 100, 0))
    parts["isotone_tensors.npy"] = npy(np.array([[_core.ISOTONE_MAX_PAIRS, 0, 0]] * 100, np.uint64))
    with pytest.raises(ValueError, match="isotone_tensors: 104857600 pairs .* more than the limit of"):
        CalibrationState.from_bytes(rezip(parts))


@pytest.mark.subprocess
def test_declared_channel_counts_are_checked_before_keys_are_built(tmp_path):
    """One header number set to 2^28 in a 173 KB file: 2^28 key strings (38 s, 11.7 GB, MemoryError)."""
    raw = channel_state(4).to_bytes()
    for count, problem in [
        (1 << 28, "would hold 2147483656 bins (tensors x streaming_bins + exact bins + channels x streaming_bins)"),
        (1 << 20, "channels member: 4 channel histograms, the outer header declares 1048576"),
    ]:
        header = header_of(raw)
        header["channels"]["tensors"][0][1] = count
        path = tmp_path / f"count{count}.npz"
        path.write_bytes(with_header(raw, header))
        r = run_capped(outcome(f"CalibrationState.load({str(path)!r})", "load"), 256 * MiB)
        assert problem in r["load"] and r["load_seconds"] < 2, r


# ----------------------------------------------------------------------------------------------
# every state histocal writes, it reads back
# ----------------------------------------------------------------------------------------------


def test_state_too_large_to_read_back_is_refused_when_saving(tmp_path):
    """900k channels: save_state wrote 157 MB whose inner header (over 64 MiB) load refused. Now save refuses
    it before writing; one within the limits saves and loads."""
    state = channel_state(700_000)
    path = tmp_path / "big.npz"
    with pytest.raises(
        ValueError, match="too large to be read back.*header of \\d+ bytes is over the limit of 67108864"
    ):
        state.save(path)
    assert not path.exists()
    small = channel_state(50_000, tensors=2)
    small.save(path)
    loaded = CalibrationState.load(path)
    assert loaded.channels is not None and loaded.channels.count == 100_000


def test_save_refuses_what_the_loader_refuses_at_any_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(file_format, "MAX_HEADER_BYTES", 64 << 10)
    with pytest.raises(ValueError, match="too large to be read back"):
        channel_state(2000).save(tmp_path / "x.npz")
    channel_state(200).save(tmp_path / "y.npz")
    assert CalibrationState.load(tmp_path / "y.npz").channels.count == 200
    monkeypatch.setattr(file_format, "MAX_STATE_BINS", 1000)
    with pytest.raises(
        ValueError, match="too large to be read back, so it is not written: the state would hold 1600 bins"
    ):
        channel_state(200).to_bytes()
