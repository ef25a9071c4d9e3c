"""The collector parity library: runs histocal's ``HistogramCollector`` and onnxruntime's own
``onnxruntime.quantization.calibrate.HistogramCollector`` (the installed version is the
reference; docs/ort_parity.md says what is matched) on the same collects and compares them
exactly, tensor by tensor (check_parity), with the comparison helpers the other tests share
(assert_same, assert_hist_tuple_same, assert_result_same, quiet, argmin_spy).
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import warnings
from dataclasses import dataclass, field

import numpy as np
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector
from onnxruntime.quantization.calibrate import TensorData

# ----------------------------------------------------------------------------------------------
# Running the two collectors
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet():
    """Silence ORT's prints and numpy's warnings (All-NaN slice, invalid divide, ...)."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


@dataclass
class OrtRun:
    collector: OrtCollector
    error: BaseException | None = None
    stage: str | None = None  # "collect" or "compute" when error is set
    result: dict | None = None
    kl: dict = field(default_factory=dict)  # entropy: tensor name -> ORT's KL vector (f64 array)
    # |x| path: tensor name -> ±inf values ORT binned (accepted once its stored edges end in +inf)
    infs_binned: dict = field(default_factory=dict)


@contextlib.contextmanager
def argmin_spy(records: list):
    """Record every array passed to ``calibrate.np.argmin`` (ORT's KL vector) while active."""
    np_mod = ort_calibrate.np
    original = np_mod.argmin

    def spy(a, *args, **kwargs):
        records.append(np.array(a, copy=True))
        return original(a, *args, **kwargs)

    np_mod.argmin = spy
    try:
        yield
    finally:
        np_mod.argmin = original


# ----------------------------------------------------------------------------------------------
# Bounded memory: ORT's histogram growth, predicted before ORT runs
# ----------------------------------------------------------------------------------------------

# histocal's cap on a histogram's bins (rust/src/ort/histogram.rs). A later |x| far above a narrow
# first histogram makes ORT's rules build a histogram of any size: ORT then allocates without
# bound (an empty or all-NaN first collect, whose edges are [0, 1], followed by |x| = 63439
# needs ~130M bins and several GB; a random run used up 24 GB). histocal raises its "Too many
# bins" error naming the tensor instead.
MAX_BINS = 1 << 24


_WIDER = {np.dtype(np.float16): np.float32, np.dtype(np.float32): np.float64}


def _first_edges(a: np.ndarray, n: int) -> np.ndarray:
    """ORT's first |x| edges, ``np.histogram(a, n)[1]`` in a's type; where numpy refuses
    ("Too many bins", f16), histocal's: the same edges in the next wider type."""
    t = a.dtype.type
    while True:
        try:
            return np.histogram_bin_edges(a.astype(t), n).astype(t)
        except ValueError:
            t = _WIDER[np.dtype(t)]


def _abs_extension(last, width, amax):
    """ORT's ``np.arange(last + width, amax + width, width)`` on scalars of one float type,
    without building it (docs/ort_parity.md, *|x| histogram*): (its length, the stored last
    edge after it, +inf where the f64 edges pass the type's largest value), or None where numpy
    refuses (the length overflows the type or is NaN)."""
    t = type(last)
    start, stop = t(last + width), t(amax + width)
    length = np.ceil(t((stop - start) / width))
    if not np.isfinite(length):
        return None
    length = max(0, int(length))
    if length == 0:
        return 0, last
    end = float(start) + (length - 1) * (float(t(start + width)) - float(start)) if length > 1 else float(start)
    return length, t(end)


def ort_bins_needed(cfg: dict, collects: list[dict], name: str) -> int:
    """The most bins ORT's collector would give ``name``'s histogram over ``collects``, from
    scalars only (no histogram is built): ORT's own merge arithmetic (docs/ort_parity.md, *Histograms*).

    The rules are applied to each collect's finite values, as histocal applies them: a first
    collect without finite values starts from an empty batch, later ones add nothing; a step
    numpy refuses in float16/float32 is redone in the next wider type. Where the real input
    makes ORT raise first (NaN, Inf, ragged lists, float16 overflow), the count is what the
    finite values need: at worst ORT is skipped for an error it would have raised anyway.
    """
    with np.errstate(all="ignore"):  # float16/float32 overflow is detected, not warned about
        return _ort_bins_needed([flat_finite(c[name]) for c in collects if name in c], cfg)


def _ort_bins_needed(per: list[np.ndarray], cfg: dict) -> int:
    if not per:
        return 0
    bins = int(cfg["num_bins"])
    if cfg["method"] == "percentile" and cfg["symmetric"]:
        # |x| path: a later max|x| above the last edge appends np.arange(last + w, amax + w, w).
        edges = _first_edges(np.abs(per[0]), bins)
        last, width = edges[-1], edges[-1].dtype.type(edges[1] - edges[0])
        for x in per[1:]:
            if x.size == 0:
                continue
            amax = np.abs(x).max()
            while True:
                t = type(last)
                amax_t = t(amax)
                if not amax_t > last:
                    break
                step = _abs_extension(last, width, amax_t)
                if step is not None and (step[0] <= MAX_BINS or t is np.float64):
                    bins += step[0]
                    last = step[1]
                    break
                wider = _WIDER[np.dtype(t)]
                last, width = wider(last), wider(width)
            if bins > MAX_BINS:
                return bins
        return bins
    # value path: a larger threshold t grows the histogram by h bins on each side.
    t_type = per[0].dtype.type

    def threshold(x):
        return max(abs(x.min()), abs(x.max())) if x.size else 0.0

    old_t = t_type(threshold(per[0]))
    for x in per[1:]:
        while True:
            t = t_type(threshold(x))
            if t <= old_t:
                break
            if old_t == 0:
                old_t = t  # re-binned over (-t, t) with the same number of bins
                break
            stride = t_type(2 * old_t / bins)
            h = (t - old_t) // stride + 1
            if np.isfinite(h):
                h = int(h)
                bins += 2 * h
                old_t = t_type(h * stride + old_t)
                break
            t_type = _WIDER[np.dtype(t_type)]  # np.float64 always has a finite h here
            old_t = t_type(old_t)
        if bins > MAX_BINS:
            return bins
    return bins


class _Refused(Exception):
    """histocal refuses a merge in one type (the caller widens, or refuses in float64)."""

    def __init__(self, bins: float):
        self.bins = bins  # the bins it would need (a lower bound; may be inf)


def histocal_bins_needed(cfg: dict, collects: list[dict], name: str) -> int:
    """The bins histocal's own rules give ``name``'s histogram over ``collects``, more than
    MAX_BINS where histocal refuses it, from scalars only (no histogram is built).

    ORT's rules (ort_bins_needed), except on the |x| path: there histocal also adds the bins
    that keep the values ORT drops (below the first collect's min|x|, above an extension that
    rounded short; docs/deviations.md), caps every merge at MAX_BINS bins, and redoes a
    refused merge in the next wider type (rust/src/abs_histogram.rs, whose arithmetic this
    follows step by step). Near the cap histocal can therefore refuse where ORT, dropping those
    values, still computes.
    """
    if not (cfg["method"] == "percentile" and cfg["symmetric"]):
        return ort_bins_needed(cfg, collects, name)
    with np.errstate(all="ignore"):
        return _histocal_abs_bins([flat_finite(c[name]) for c in collects if name in c], int(cfg["num_bins"]))


def _histocal_abs_bins(per: list[np.ndarray], bins: int) -> int:
    if not per:
        return 0
    edges = _first_edges(np.abs(per[0]), bins)
    state = (edges[0], edges[1], edges[-1], bins)  # first, second and last stored edge; bins
    for x in per[1:]:
        if x.size == 0:
            continue
        ax = np.abs(x)
        t = type(state[2])
        while True:
            try:
                state = _histocal_abs_merge(*(t(e) for e in state[:3]), state[3], t(ax.min()), t(ax.max()))
                break
            except _Refused as refused:
                if t is np.float64:
                    b = refused.bins
                    return max(MAX_BINS + 1, int(b)) if math.isfinite(b) else MAX_BINS + 1
                t = _WIDER[np.dtype(t)]
    return state[3]


def _histocal_abs_merge(first, second, last, bins, amin, amax):
    """AbsHistogram::merge on scalars of one float type: the new (first, second, last, bins)."""
    t = type(last)
    width = t(second - first)
    top = float(last)  # the last edge in float64, before it is stored in t
    if amax > last:
        start, stop = t(last + width), t(amax + width)
        quotient = float(t(t(stop - start) / width))
        length = math.ceil(quotient) if math.isfinite(quotient) else quotient
        if (math.isnan(quotient) and not (np.isfinite(start) and np.isfinite(stop))) or length > MAX_BINS:
            raise _Refused(bins + length)  # numpy's arange fails in t, or histocal's cap
        if length > 0:
            step = float(t(start + width)) - float(start)
            top = float(start) + (length - 1) * step if length > 1 else float(start)
            bins += length
    if bins > MAX_BINS:
        raise _Refused(bins)
    w = float(width)
    if w > 0 and top < float(amax):
        extra = (float(amax) - top) / w
        if not (math.isfinite(extra - 2.0) and bins + extra - 2.0 <= MAX_BINS):
            raise _Refused(bins + extra)
        pushed, top = _pushes_until(top, w, float(amax), MAX_BINS - bins)
        bins += pushed
        if not np.isfinite(t(top)):
            raise _Refused(bins)  # histocal's extra bins may not make an open top (widen)
    lo = float(first)
    if float(amin) < lo and w > 0:
        quotient = (lo - float(amin)) / w
        if not (math.isfinite(quotient) and bins + quotient <= MAX_BINS):
            raise _Refused(bins + quotient)
        below = math.ceil(quotient)
        while lo - below * w > float(amin):
            below += 1
        if bins + below > MAX_BINS:
            raise _Refused(bins + below)
        first, second = t(lo - below * w), t(lo - (below - 1) * w)
        bins += below
    return first, second, t(top), bins


def _pushes_until(top: float, w: float, amax: float, room: int) -> tuple[int, float]:
    """histocal's loop ``while top < amax: top += w`` (float64 sums, one at a time), refused
    beyond ``room`` additions: (the additions, the final top)."""
    pushed = 0
    while top < amax:
        n = min(room - pushed, 1 << 16)
        if n == 0:
            raise _Refused(MAX_BINS + 1)
        sums = np.add.accumulate(np.concatenate([[top], np.full(n, w)]))[1:]  # sequential, like the loop
        reached = np.flatnonzero(sums >= amax)
        if reached.size:
            return pushed + int(reached[0]) + 1, float(sums[reached[0]])
        pushed, top = pushed + n, float(sums[-1])
    return pushed, top


def tensors_beyond_max_bins(cfg: dict, collects: list[dict]) -> dict[str, int]:
    """Tensor -> bins ORT would need, for the tensors that need more than MAX_BINS."""
    names = {n for c in collects for n in c}
    need = {n: ort_bins_needed(cfg, collects, n) for n in sorted(names)}
    return {n: b for n, b in need.items() if b > MAX_BINS}


class OrtNotRun(ValueError):
    """ORT was not run: its histogram would exceed MAX_BINS (its allocation has no bound)."""


# Address-space headroom for one ORT or histocal run: a safety net behind ort_bins_needed.
# A run near MAX_BINS bins peaks at ~0.7 GB (ORT or histocal); generated inputs need far less.
RUN_ADDRESS_SPACE = 4 << 30


def _address_space_in_use() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def bounded_address_space(headroom: int = RUN_ADDRESS_SPACE):
    """Lower RLIMIT_AS to the current address space + ``headroom`` while active, so that a
    runaway allocation fails (numpy: MemoryError; Rust: abort with a message) instead of
    exhausting the machine. The soft limit is only ever lowered, and restored after."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not Linux
        yield
        return
    in_use = _address_space_in_use()
    if in_use is None:  # pragma: no cover
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = in_use + headroom
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield  # already tighter
        return
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def run_ort(cfg: dict, collects: list[dict], compute: bool = True) -> OrtRun:
    """Run ORT's collector; never raises, the exception (if any) is stored in the run.

    ORT is not run at all when a tensor would need more than MAX_BINS bins (run.error is then an
    OrtNotRun classified as "too many bins"), and it runs under bounded_address_space.
    """
    hc = OrtCollector(**cfg)
    run = OrtRun(hc)
    too_big = tensors_beyond_max_bins(cfg, collects)
    if too_big:
        name, bins = next(iter(too_big.items()))
        run.error = OrtNotRun(
            f"Too many bins for data range: ORT's rules need {bins} bins for tensor {name!r} "
            f"(> MAX_BINS = {MAX_BINS}); ORT not run"
        )
        run.stage = "collect"
        return run
    with quiet(), bounded_address_space():
        try:
            for c in collects:
                c = _resolve_open_top(hc, c)
                _count_infs_binned(hc, c, run.infs_binned)
                hc.collect(c)
        except Exception as e:
            run.error, run.stage = e, "collect"
            return run
        if not compute:
            return run
        records: list = []
        try:
            if cfg["method"] == "entropy":
                with argmin_spy(records):
                    run.result = hc.compute_collection_result()
            else:
                run.result = hc.compute_collection_result()
        except Exception as e:
            run.error, run.stage = e, "compute"
        # compute_entropy visits histogram_dict in order and calls argmin once per tensor.
        run.kl = dict(zip(list(hc.histogram_dict), records))
    return run


def ort_has_open_top(hc: OrtCollector, name: str) -> bool:
    """Whether ORT's |x| histogram for ``name`` has stored edges ending in +inf (an f16 extension
    past 65504): ORT then never extends it again and bins |x| == inf in its last bin instead of
    raising, so later infinities are part of its result (docs/deviations.md)."""
    t = hc.histogram_dict.get(name)
    return t is not None and len(t) == 4 and bool(np.isposinf(t[1][-1]))


@dataclass
class InfinitiesIfOpenTop:
    """A fallback collect value: ``with_infs`` (finite values and ±inf) when ORT's |x| histogram
    has an open top at that collect, else ``finite`` (see fallback_variants)."""

    finite: np.ndarray
    with_infs: np.ndarray


def _resolve_open_top(hc: OrtCollector, c: dict) -> dict:
    return {
        n: ((v.with_infs if ort_has_open_top(hc, n) else v.finite) if isinstance(v, InfinitiesIfOpenTop) else v)
        for n, v in c.items()
    }


def _count_infs_binned(hc: OrtCollector, c: dict, out: dict) -> None:
    for n, v in c.items():
        if ort_has_open_top(hc, n):
            k = sum(int(np.isinf(np.asarray(b)).sum()) for b in batches_of(v))
            out[n] = out.get(n, 0) + k


def histocal_infs_binned(cfg: dict, collects: list[dict], name: str) -> int:
    """The ±inf values of ``name`` that arrived after histocal's own |x| edges ended in +inf
    (histocal bins exactly those), found by collecting again one collect at a time."""
    import histocal

    hc = histocal.HistogramCollector(**cfg)
    k = 0
    with quiet(), bounded_address_space():
        for c in collects:
            if name not in c:
                continue
            if name in hc.histogram_dict and np.isposinf(hc.histogram_dict[name][1][-1]):
                k += sum(int(np.isinf(np.asarray(b)).sum()) for b in batches_of(c[name]))
            hc.collect({name: c[name]})
    return k


def collects_of(hc) -> list[dict]:
    """The collects run_histocal fed ``hc``."""
    return hc._parity_collects


def run_histocal(cfg: dict, collects: list[dict]):
    """Run histocal's collector. It must not raise on any input the parity tests generate,
    except as run_histocal_or_too_many_bins allows."""
    import histocal

    hc = histocal.HistogramCollector(**cfg)
    hc._parity_collects = collects  # for histocal_infs_binned
    with quiet(), bounded_address_space():
        for c in collects:
            hc.collect(c)
        result = hc.compute_collection_result()
    return hc, result


_TOO_MANY_BINS = re.compile(
    r'^tensor "(?P<name>.*)": Too many bins for data range\. Cannot create \d+ finite-sized bins\.$'
)


def run_histocal_or_too_many_bins(cfg: dict, collects: list[dict]):
    """run_histocal, except that histocal may refuse a tensor with its "Too many bins" error
    (naming the tensor) when its own rules need more than MAX_BINS bins for it
    (histocal_bins_needed): that tensor is then left out and histocal re-run on the others.
    Every |x| histogram it keeps has the bins those rules give. Returns (hc, result, refused),
    refused mapping each such tensor to histocal's message; hc and result are None if none is
    left."""
    refused: dict[str, str] = {}
    while True:
        remaining = [{n: v for n, v in c.items() if n not in refused} for c in collects]
        if not any(remaining):
            return None, None, refused
        try:
            hc, result = run_histocal(cfg, remaining)
            for name, hist_t in hc.histogram_dict.items():
                assert hist_t[0].size <= MAX_BINS, f"histocal's histogram for {name!r} has {hist_t[0].size} bins"
                # The value path's count (ort_bins_needed) can be a few bins off histocal's
                # (a guard against MAX_BINS); the |x| path's is exact.
                if cfg["method"] == "percentile" and cfg["symmetric"]:
                    bins = histocal_bins_needed(cfg, remaining, name)
                    assert hist_t[0].size == bins, (
                        f"histocal's histogram for {name!r} has {hist_t[0].size} bins, its own rules give {bins}"
                    )
            return hc, result, refused
        except ValueError as err:
            msg = str(err)
            m = _TOO_MANY_BINS.match(msg)
            if m is None:
                raise
            name = m["name"]
            assert name in {n for c in remaining for n in c}, f"histocal's error names no collected tensor: {msg}"
            bins = histocal_bins_needed(cfg, collects, name)
            assert bins > MAX_BINS, (
                f"histocal raised {msg!r} but its own rules need only {bins} bins (MAX_BINS = {MAX_BINS}) for {name!r}"
            )
            refused[name] = msg


# ORT failures that are documented deviations (docs/deviations.md).
# histocal returns a result in all of these cases.
KNOWN_ORT_ERRORS = {
    "non-finite data": (
        "is not finite",  # supplied/autodetected range of [nan, nan] / [-inf, inf]
        "cannot convert float NaN to integer",  # later +-inf or all-NaN batch (value path)
    ),
    "batches of different shapes / empty+non-empty in one list": ("inhomogeneous",),
    "too many bins": ("Too many bins for data range",),
    "entropy smoothing": ("n_zeros=",),
    "empty later batch (abs path)": ("zero-size array to reduction operation",),
    # np.arange in the |x| extension fails: a later +inf, or float16
    # overflow of the extension's start (edges[-1] + width) or of its length (> 65504 bins).
    "|x| extension overflow (later +inf or float16)": (
        "Maximum allowed size exceeded",
        "arange: cannot compute length",
    ),
}


def classify_ort_error(err: BaseException) -> str:
    if isinstance(err, MemoryError):
        raise AssertionError(
            f"ORT ran out of its address-space budget ({err!r}): ort_bins_needed missed an input that makes "
            "ORT's histogram grow without bound"
        )
    msg = f"{type(err).__name__}: {err}"
    for reason, needles in KNOWN_ORT_ERRORS.items():
        if any(n in msg for n in needles):
            return reason
    raise AssertionError(f"ORT raised an error that is not a documented deviation: {msg}")


# ----------------------------------------------------------------------------------------------
# Exact comparison of ORT objects
# ----------------------------------------------------------------------------------------------

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _ordinal(x: np.ndarray) -> np.ndarray:
    """Map floats to integers whose difference is the distance in ulps (same dtype)."""
    x = np.asarray(x)
    bits = x.view(_UINT[x.dtype.itemsize]).astype(np.int64)
    sign = np.int64(1) << np.int64(8 * x.dtype.itemsize - 1)
    return np.where(bits & sign, -(bits & (sign - 1)), bits)


def ulp_distance(a, b) -> int:
    a, b = np.asarray(a), np.asarray(b)
    return int(np.max(np.abs(_ordinal(a) - _ordinal(b)), initial=0))


def _float_equal(a: np.ndarray, b: np.ndarray, zero_sign: bool, ulps: int) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a) & np.isnan(b)
    if ulps:
        fin = ~np.isnan(a) & ~np.isnan(b)
        ok = nan | (fin & (np.abs(_ordinal(a) - _ordinal(b)) <= ulps)) | (fin & (a == b))
        return bool(np.all(ok))
    same_bits = a.view(_UINT[a.dtype.itemsize]) == b.view(_UINT[b.dtype.itemsize])
    ok = same_bits | nan
    if zero_sign:
        ok |= (a == 0) & (b == 0)
    return bool(np.all(ok))


def assert_same(ort, ours, where: str, *, zero_sign: bool = False, ulps: int = 0, check_type: bool = True):
    """ORT object vs histocal object: same Python type, dtype, shape, and bit-identical value.

    ``zero_sign`` accepts +0.0 vs -0.0 (numpy's nanmin of data with both zeros is
    order-dependent); ``ulps`` allows a distance in units of the dtype's last place.
    """
    if check_type:
        assert type(ours) is type(ort), (
            f"{where}: type {type(ours).__name__} != ORT's {type(ort).__name__} ({ours!r} vs {ort!r})"
        )
    if isinstance(ort, (np.ndarray, np.generic)):
        assert isinstance(ours, (np.ndarray, np.generic)), f"{where}: {ours!r} is not a numpy object"
        assert ours.dtype == ort.dtype, f"{where}: dtype {ours.dtype} != ORT's {ort.dtype}"
        assert np.shape(ours) == np.shape(ort), f"{where}: shape {np.shape(ours)} != ORT's {np.shape(ort)}"
        if ort.dtype.kind == "f":
            if not _float_equal(np.asarray(ort), np.asarray(ours), zero_sign, ulps):
                a, b = np.atleast_1d(np.asarray(ort)), np.atleast_1d(np.asarray(ours))
                bad = np.flatnonzero(~(a.view(_UINT[a.dtype.itemsize]) == b.view(_UINT[b.dtype.itemsize])))
                i = int(bad[0]) if bad.size else 0
                raise AssertionError(
                    f"{where}: values differ (allowed ulps={ulps}, zero_sign={zero_sign}); "
                    f"{bad.size} of {a.size} elements, first at [{i}]: histocal {b[i]!r} vs ORT {a[i]!r} "
                    f"({ulp_distance(a[i], b[i])} ulp)"
                )
        else:
            assert np.array_equal(np.asarray(ours), np.asarray(ort)), (
                f"{where}: values differ:\nhistocal {ours!r}\nORT      {ort!r}"
            )
    else:
        assert ours == ort, f"{where}: {ours!r} != ORT's {ort!r}"


def assert_hist_tuple_same(ort_t: tuple, ours_t: tuple, where: str):
    """A histogram_dict entry: value (hist, edges, min, max, threshold) or abs (hist, edges, min, max)."""
    assert isinstance(ours_t, tuple), f"{where}: histogram entry is a {type(ours_t).__name__}, not a tuple"
    assert len(ours_t) == len(ort_t), f"{where}: histogram entry has {len(ours_t)} fields, ORT {len(ort_t)}"
    labels = ["hist", "edges", "min", "max", "threshold"]
    for k, (a, b) in enumerate(zip(ort_t, ours_t)):
        assert_same(a, b, f"{where}.{labels[k]}", zero_sign=labels[k] in ("min", "max"))


# ----------------------------------------------------------------------------------------------
# Helpers about the data fed in
# ----------------------------------------------------------------------------------------------


def batches_of(value) -> list[np.ndarray]:
    if isinstance(value, InfinitiesIfOpenTop):
        return [value.finite]  # only for the scalar bin estimate: infinities never grow an open top
    return list(value) if isinstance(value, list) else [value]


def flat_finite(value) -> np.ndarray:
    """One collect's value for a tensor, flattened, with non-finite values removed (1-D, same dtype)."""
    bs = batches_of(value)
    flat = np.concatenate([np.asarray(b).ravel() for b in bs]) if bs else np.zeros(0, np.float32)
    return flat[np.isfinite(flat)]


def flat_non_nan(value) -> np.ndarray:
    """flat_finite, keeping ±inf."""
    bs = batches_of(value)
    flat = np.concatenate([np.asarray(b).ravel() for b in bs]) if bs else np.zeros(0, np.float32)
    return flat[~np.isnan(flat)]


@dataclass
class Expected:
    finite: int = 0
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    batches: int = 0


def expected_counts(collects: list[dict]) -> dict[str, Expected]:
    out: dict[str, Expected] = {}
    for c in collects:
        for name, v in c.items():
            e = out.setdefault(name, Expected())
            for b in batches_of(v):
                b = np.asarray(b)
                e.finite += int(np.isfinite(b).sum())
                e.nan += int(np.isnan(b).sum())
                e.posinf += int(np.isposinf(b).sum())
                e.neginf += int(np.isneginf(b).sum())
                e.batches += 1
    return out


def assert_counts(hc, collects: list[dict]):
    counts = hc.counts
    exp = expected_counts(collects)
    assert set(counts) == set(exp), f"counts keys {sorted(counts)} != {sorted(exp)}"
    for name, e in exp.items():
        c = counts[name]
        got = Expected(int(c.finite), int(c.nan), int(c.posinf), int(c.neginf), int(c.batches))
        assert got == e, f"counts[{name!r}]: {got} != expected {e}"


def result_range(method: str, res):
    """(lowest, highest) of one tensor's result."""
    if method == "distribution":
        return res.lowest, res.highest
    return res[0], res[1]


# ----------------------------------------------------------------------------------------------
# Result comparison per method
# ----------------------------------------------------------------------------------------------


def entropy_candidates(hist_t: tuple, nq: int):
    """ORT's candidate thresholds after clipping, in KL-vector order (docs/methods.md, *entropy*)."""
    hist, edges, mn, mx = hist_t[:4]
    n = hist.size
    zb, hq = n // 2, nq // 2
    out = []
    for i in range(hq, zb + 1):
        s, e = zb - i, min(zb + i + 1, n)
        lo, hi = edges[s], edges[e]
        if lo < mn:
            lo = mn
        if hi > mx:
            hi = mx
        out.append((lo, hi))
    return out


def assert_entropy_threshold(name, ort_res, ours_res, hist_t, kl, nq):
    """Entropy thresholds must match; a mismatch is only accepted as a float near-tie of ORT's KL."""
    lo_o, hi_o = ort_res[0], ort_res[1]
    lo_h, hi_h = ours_res[0], ours_res[1]
    same = (lo_o == lo_h) and (hi_o == hi_h)
    if same:
        assert_same(lo_o, lo_h, f"entropy[{name!r}].lowest", zero_sign=True)
        assert_same(hi_o, hi_h, f"entropy[{name!r}].highest", zero_sign=True)
        return False
    # Different threshold: it must be one of ORT's candidates whose KL ties ORT's minimum.
    assert kl is not None, f"entropy[{name!r}]: thresholds differ and ORT's KL vector was not captured"
    dtype = hist_t[1].dtype
    assert np.asarray(lo_h).dtype == dtype and np.asarray(hi_h).dtype == dtype, f"entropy[{name!r}]: dtype"
    cands = entropy_candidates(hist_t, nq)
    assert len(cands) == kl.size, f"entropy[{name!r}]: {len(cands)} candidates but KL has {kl.size} entries"
    chosen = [k for k, (lo, hi) in enumerate(cands) if lo == lo_h and hi == hi_h]
    assert chosen, (
        f"entropy[{name!r}]: histocal's threshold ({lo_h!r}, {hi_h!r}) is not one of ORT's candidates; "
        f"ORT chose ({lo_o!r}, {hi_o!r})"
    )
    kmin = float(np.min(kl))
    best = min(float(kl[k]) for k in chosen)
    t = np.float16 if dtype == np.float16 else np.float32
    if np.isinf(kmin):
        ok = np.isinf(best)
        tol = 0.0
    else:
        tol = 4.0 * float(np.spacing(t(abs(kmin))))
        ok = best - kmin <= tol
    assert ok, (
        f"entropy[{name!r}]: histocal threshold ({lo_h!r}, {hi_h!r}) at candidate(s) {chosen} has ORT KL "
        f"{best!r}, ORT's minimum is {kmin!r} at {int(np.argmin(kl))} ({ort_res[0]!r}, {ort_res[1]!r}); "
        f"difference {best - kmin!r} > 4 {t.__name__} ulps ({tol!r}) - not a near-tie"
    )
    return True  # an accepted near-tie


def assert_result_same(cfg: dict, name: str, ort_res, ours_res, hist_t, kl) -> bool:
    """Returns True when an entropy threshold differed by an accepted KL near-tie."""
    method = cfg["method"]
    where = f"{method}[{name!r}]"
    if method == "entropy":
        assert isinstance(ours_res, tuple) and len(ours_res) == 4, f"{where}: {type(ours_res)} {ours_res!r}"
        assert_same(ort_res[2], ours_res[2], f"{where}.hist")
        assert_same(ort_res[3], ours_res[3], f"{where}.edges")
        return assert_entropy_threshold(name, ort_res, ours_res, hist_t, kl, cfg["num_quantized_bins"])
    elif method == "percentile":
        assert isinstance(ours_res, tuple) and len(ours_res) == 4, f"{where}: {type(ours_res)} {ours_res!r}"
        assert_same(ort_res[0], ours_res[0], f"{where}.lowest", zero_sign=True)
        ort_hi = ort_res[1]
        if ort_hi < ort_res[0] and not np.any(hist_t[0]):  # nothing binned: histocal's [lo, lo] (docs/deviations.md)
            ort_hi = (
                np.array(ort_res[0], ort_hi.dtype) if isinstance(ort_hi, np.ndarray) else ort_hi.dtype.type(ort_res[0])
            )
        assert_same(ort_hi, ours_res[1], f"{where}.highest", zero_sign=True)
        assert_same(ort_res[2], ours_res[2], f"{where}.hist[0]")
        assert_same(ort_res[3], ours_res[3], f"{where}.hist[1]")
    elif method == "distribution":
        assert isinstance(ours_res, TensorData), f"{where}: {type(ours_res)} is not onnxruntime TensorData"
        assert_same(ort_res.avg, ours_res.avg, f"{where}.avg")
        assert_same(ort_res.std, ours_res.std, f"{where}.std")
        assert_same(ort_res.hist, ours_res.hist, f"{where}.hist")
        assert_same(ort_res.hist_edges, ours_res.hist_edges, f"{where}.hist_edges")
        assert_same(ort_res.lowest, ours_res.lowest, f"{where}.lowest")
        assert_same(ort_res.highest, ours_res.highest, f"{where}.highest")
    else:  # pragma: no cover
        raise AssertionError(method)
    return False


# ----------------------------------------------------------------------------------------------
# The parity driver
# ----------------------------------------------------------------------------------------------


@dataclass
class ParityReport:
    compared: list = field(default_factory=list)  # tensors compared exactly with an ORT reference
    fallback: dict = field(default_factory=dict)  # compared tensor -> why ORT needed flattened finite input
    deviations: dict = field(default_factory=dict)  # tensor -> documented reason, sanity checks only
    near_ties: list = field(default_factory=list)  # entropy tensors whose threshold differed by a KL near-tie


def _tensor_collects(collects, name):
    return [{name: c[name]} for c in collects if name in c]


def fallback_variants(collects: list[dict], name: str) -> dict[str, list[dict]]:
    """ORT inputs holding only ``name``'s finite values, flattened to one array per collect.

    Where ORT raises, histocal promises the result computed from the finite values. The only
    ambiguity is a collect whose values are *all* non-finite: it may act like an empty batch
    (ORT's empty batch injects 0 into min/max) or not count at all. Variants, in order:
    "as empty": such a collect becomes an empty array; "skipped unless first": it is skipped
    unless it is the tensor's first collect; "always skipped" (if anything is left).
    """
    per = [c[name] for c in collects if name in c]
    # Once ORT's |x| edges end in +inf it bins infinities (histocal too): there a later collect
    # keeps its ±inf (InfinitiesIfOpenTop); everywhere else only the finite values.
    flat = [flat_finite(v) for v in per]
    value = [InfinitiesIfOpenTop(f, flat_non_nan(v)) if i > 0 else f for i, (v, f) in enumerate(zip(per, flat))]
    no_finite = [f.size == 0 and sum(np.asarray(b).size for b in batches_of(v)) > 0 for v, f in zip(per, flat)]
    a = [{name: f} for f in value]
    b = [{name: f} for i, (f, nf) in enumerate(zip(value, no_finite)) if not (nf and i > 0)]
    c = [{name: f} for f, nf in zip(value, no_finite) if not nf]
    out = {"as empty": a}
    for label, v in (("skipped unless first", b), ("always skipped", c)):
        if v and len(v) != len(a) and all(len(v) != len(o) for o in out.values()):
            out[label] = v
    return out


def _compare_tensor(cfg, name, ref, reason, hc, ours, e: Expected, report: ParityReport):
    """Compare one tensor with one ORT reference run (raises AssertionError on a mismatch)."""
    method = cfg["method"]
    is_abs = method == "percentile" and cfg["symmetric"]
    where = f"{method}[{name!r}]"
    ours_t = hc.histogram_dict[name]
    # Values ORT's histogram must hold: every finite one, plus the infinities ORT binned once its
    # |x| edges ended in +inf (it accepts them there instead of raising: docs/deviations.md).
    binned = e.finite + (ref.infs_binned.get(name, 0) if ref is not None else 0)
    strict_hist = ref is not None
    if strict_hist and is_abs:
        ort_t = ref.collector.histogram_dict[name]
        if int(ort_t[0].sum()) != binned:
            # Deviation (2): ORT dropped values below the first min|x| (or above an extension
            # that rounded short); histocal keeps every finite value. min/max are unaffected,
            # unless the edges' divergence since made only one of the two bin infinities.
            strict_hist = False
            reason = reason or "symmetric percentile dropped values"
            if histocal_infs_binned(cfg, collects_of(hc), name) == binned - e.finite:
                ours_mn, ours_mx = _kept_values_widened(ort_t, ours_t, where)
                assert_same(ort_t[2], ours_mn, f"{where}.min", zero_sign=True)
                assert_same(ort_t[3], ours_mx, f"{where}.max", zero_sign=True)
    if strict_hist:
        ort_t = ref.collector.histogram_dict[name]
        assert_hist_tuple_same(ort_t, ours_t, f"histogram_dict[{name!r}]")
        assert_hist_tuple_same(ort_t, hc.get_histogram_dict()[name], f"get_histogram_dict()[{name!r}]")
    else:
        # histocal holds every finite value, and the infinities that came after its own |x|
        # edges ended in +inf (where ORT, with those edges, would bin them too).
        binned = e.finite + (histocal_infs_binned(cfg, collects_of(hc), name) if is_abs else 0)
        assert int(ours_t[0].sum()) == binned, (
            f"{where}: deviation ({reason}): histocal's histogram holds {int(ours_t[0].sum())} values, "
            f"but {e.finite} finite values (and {binned - e.finite} infinities after an open top) were collected"
        )
    if strict_hist and ref.error is None:
        if assert_result_same(
            cfg, name, ref.result[name], ours[name], ref.collector.histogram_dict[name], ref.kl.get(name)
        ):
            report.near_ties.append(name)
        report.compared.append(name)
        if reason is not None:
            report.fallback[name] = reason
        return
    if ref is not None and ref.error is not None:
        reason = classify_ort_error(ref.error)  # compute-stage error (entropy smoothing)
    assert reason is not None, f"{where}: no comparison and no documented reason"
    report.deviations[name] = reason
    lo, hi = result_range(method, ours[name])
    if e.finite > 0 and binned == e.finite:  # binned infinities may make the range infinite, as in ORT
        assert np.isfinite(lo) and np.isfinite(hi), f"{where}: deviation ({reason}): range ({lo!r}, {hi!r})"


def _kept_values_widened(ort_t: tuple, ours_t: tuple, where: str):
    """histocal's min/max for comparison with ORT's in the dropped-values deviation. The one case
    where their dtypes differ: once ORT dropped values its float16 edges and histocal's differ,
    and a later extension can fail in float16 for histocal only (its arange overflows, or the
    bins it adds to keep ORT's dropped values would pass 65504), which widens that tensor to
    float32. Its min/max then hold the same float16 values."""
    mn, mx = ours_t[2], ours_t[3]
    if ours_t[1].dtype == ort_t[1].dtype:
        return mn, mx
    assert ort_t[1].dtype == np.float16 and ours_t[1].dtype == np.float32, (
        f"{where}: edge dtype {ours_t[1].dtype} != ORT's {ort_t[1].dtype}"
    )
    out = []
    for x in (mn, mx):
        y = x.astype(np.float16)
        assert float(y) == float(x) or (np.isnan(x) and np.isnan(y)), f"{where}: {x!r} is not a float16 value"
        out.append(y)
    return tuple(out)


def _state_matches(ort_run: OrtRun, hc, name: str) -> bool:
    try:
        assert_hist_tuple_same(ort_run.collector.histogram_dict[name], hc.histogram_dict[name], name)
        return True
    except AssertionError:
        return False


def check_parity(cfg: dict, collects: list[dict]) -> ParityReport:
    """Run ORT and histocal on the same collects and compare everything, tensor by tensor.

    Where ORT raises on a tensor the error must be a documented deviation; ORT is then re-run on
    that tensor's finite values, flattened into one array per collect (see fallback_variants),
    and histocal must match one such reference exactly. If ORT cannot produce any reference,
    histocal's result is only checked for sanity (it exists, its range is finite, every finite
    value is counted). A tensor whose histogram ORT's rules would grow beyond MAX_BINS is never
    run through ORT, and histocal may refuse it with its "Too many bins" error (a deviation).
    """
    all_names = sorted({n for c in collects for n in c})
    exp = expected_counts(collects)

    # histocal may refuse a tensor that ORT's rules would grow beyond MAX_BINS; the others are
    # compared as usual (collects without the refused tensors: histocal's state for them).
    hc, ours, refused = run_histocal_or_too_many_bins(cfg, collects)
    report = ParityReport()
    for name in refused:
        report.deviations[name] = "too many bins"
    names = [n for n in all_names if n not in refused]
    if not names:
        return report
    kept = [{n: v for n, v in c.items() if n not in refused} for c in collects]
    ours_hd = hc.histogram_dict
    ours_hd2 = hc.get_histogram_dict()
    assert set(ours_hd) == set(names), f"histogram_dict keys {sorted(ours_hd)} != {names}"
    assert set(ours_hd2) == set(names), f"get_histogram_dict() keys {sorted(ours_hd2)} != {names}"
    assert isinstance(ours, dict) and set(ours) == set(names), f"result keys {sorted(ours)} != {names}"
    assert_counts(hc, kept)

    full = run_ort(cfg, collects)
    for name in names:
        if full.error is None:
            _compare_tensor(cfg, name, full, None, hc, ours, exp[name], report)
            continue
        ref = run_ort(cfg, _tensor_collects(collects, name))
        if ref.error is None or ref.stage == "compute":
            _compare_tensor(cfg, name, ref, None, hc, ours, exp[name], report)
            continue
        reason = classify_ort_error(ref.error)
        refs = []
        unavailable = []  # variants ORT cannot collect either
        variants = fallback_variants(collects, name)
        for label, variant in variants.items():
            r = run_ort(cfg, variant, compute=False)  # ORT's entropy compute is slow: only when needed
            if r.error is not None and r.stage == "collect":
                classify_ort_error(r.error)
                unavailable.append(label)
            else:
                refs.append((variant, r))
        if not refs:  # ORT cannot compute this tensor at all: sanity checks only
            _compare_tensor(cfg, name, None, reason, hc, ours, exp[name], report)
            continue
        # Try the references whose histogram state equals histocal's first.
        refs.sort(key=lambda vr: not _state_matches(vr[1], hc, name))
        first_failure = None
        for variant, _ in refs:
            r = run_ort(cfg, variant)  # now with compute_collection_result
            trial = ParityReport()
            try:
                _compare_tensor(cfg, name, r, reason, hc, ours, exp[name], trial)
            except AssertionError as err:
                first_failure = first_failure or err
                continue
            for k in ("compared", "near_ties"):
                getattr(report, k).extend(getattr(trial, k))
            report.fallback.update(trial.fallback)
            report.deviations.update(trial.deviations)
            break
        else:
            # histocal starts from an empty batch where a first collect has no finite values and
            # skips later such collects. Where ORT cannot collect that variant (e.g. its float16
            # |x| extension overflows), the others are no reference for histocal: sanity only.
            histocal_like = "skipped unless first" if "skipped unless first" in variants else "as empty"
            if histocal_like in unavailable:
                _compare_tensor(cfg, name, None, reason, hc, ours, exp[name], report)
                continue
            raise AssertionError(
                f"{name!r}: ORT raised ({reason}: {ref.error!r}); histocal matches no ORT reference on the "
                f"finite values ({len(refs)} tried). First mismatch: {first_failure}"
            ) from first_failure
    # The whole-dict ORT run must have failed only if some tensor deviates.
    if full.error is not None:
        assert report.deviations or report.fallback, (
            f"ORT failed on the whole dict but on no single tensor: {full.error!r}"
        )
    return report
