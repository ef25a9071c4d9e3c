"""Shared helpers for the collector parity and bad-input tests.

Everything here compares ``histocal.HistogramCollector`` with onnxruntime's own
``onnxruntime.quantization.calibrate.HistogramCollector`` (the installed version is the
reference, see ../../shared/ORT_PARITY.md).

Hypothesis profiles (select with ``HYPOTHESIS_PROFILE=<name>``):

* ``default``: random examples, no deadline, the example counts written in the tests;
* ``ci``:      the same counts, derandomized (reproducible runs);
* ``thorough``: 5x the example counts (slow; for local bug hunting).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, settings
from onnxruntime.quantization import calibrate as ort_calibrate
from onnxruntime.quantization.calibrate import HistogramCollector as OrtCollector
from onnxruntime.quantization.calibrate import TensorData

_COMMON = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)
settings.register_profile("default", **_COMMON)
settings.register_profile("ci", derandomize=True, **_COMMON)
settings.register_profile("thorough", **_COMMON)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
settings.load_profile(PROFILE)
_SCALE = 5.0 if PROFILE == "thorough" else 1.0


def examples(n: int) -> int:
    """Example count for a property, scaled by the active profile."""
    return max(1, int(n * _SCALE))


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


def run_ort(cfg: dict, collects: list[dict], compute: bool = True) -> OrtRun:
    """Run ORT's collector; never raises, the exception (if any) is stored in the run."""
    hc = OrtCollector(**cfg)
    run = OrtRun(hc)
    with quiet():
        try:
            for c in collects:
                hc.collect(c)
        except Exception as e:  # noqa: BLE001 - every ORT failure is classified by the caller
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
        except Exception as e:  # noqa: BLE001
            run.error, run.stage = e, "compute"
        # compute_entropy visits histogram_dict in order and calls argmin once per tensor.
        run.kl = dict(zip(list(hc.histogram_dict), records))
    return run


def run_histocal(cfg: dict, collects: list[dict]):
    """Run histocal's collector. It must not raise on any input the parity tests generate."""
    import histocal

    hc = histocal.HistogramCollector(**cfg)
    with quiet():
        for c in collects:
            hc.collect(c)
        result = hc.compute_collection_result()
    return hc, result


# ORT failures that are documented deviations (ORT_PARITY.md §3.4, §4.2, §4.3.6, §5.2, §8).
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
    # np.arange in the |x| extension fails: a later +inf (§8), or (not in ORT_PARITY) float16
    # overflow of the extension's start (edges[-1] + width) or of its length (> 65504 bins).
    "|x| extension overflow (later +inf or float16)": (
        "Maximum allowed size exceeded",
        "arange: cannot compute length",
    ),
}


def classify_ort_error(err: BaseException) -> str:
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
        assert type(ours) is type(ort), f"{where}: type {type(ours).__name__} != ORT's {type(ort).__name__} ({ours!r} vs {ort!r})"
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
    return list(value) if isinstance(value, list) else [value]


def flat_finite(value) -> np.ndarray:
    """One collect's value for a tensor, flattened, with non-finite values removed (1-D, same dtype)."""
    bs = batches_of(value)
    flat = np.concatenate([np.asarray(b).ravel() for b in bs]) if bs else np.zeros(0, np.float32)
    return flat[np.isfinite(flat)]


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
    """ORT's candidate thresholds after clipping, in KL-vector order (ORT_PARITY §5.2)."""
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
        assert_same(ort_res[1], ours_res[1], f"{where}.highest", zero_sign=True)
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


def fallback_variants(collects: list[dict], name: str) -> list[list[dict]]:
    """ORT inputs holding only ``name``'s finite values, flattened to one array per collect.

    Where ORT raises, histocal promises the result computed from the finite values. The only
    ambiguity is a collect whose values are *all* non-finite: it may act like an empty batch
    (ORT's empty batch injects 0 into min/max) or not count at all. Variants, in order:
    A: such a collect becomes an empty array; B: it is skipped unless it is the tensor's first
    collect; C: it is always skipped (if anything is left).
    """
    per = [c[name] for c in collects if name in c]
    flat = [flat_finite(v) for v in per]
    no_finite = [f.size == 0 and sum(np.asarray(b).size for b in batches_of(v)) > 0 for v, f in zip(per, flat)]
    a = [{name: f} for f in flat]
    b = [{name: f} for i, (f, nf) in enumerate(zip(flat, no_finite)) if not (nf and i > 0)]
    c = [{name: f} for f, nf in zip(flat, no_finite) if not nf]
    out = [a]
    for v in (b, c):
        if v and len(v) != len(a) and all(len(v) != len(o) for o in out):
            out.append(v)
    return out


def _compare_tensor(cfg, name, ref, reason, hc, ours, e: Expected, report: ParityReport):
    """Compare one tensor with one ORT reference run (raises AssertionError on a mismatch)."""
    method = cfg["method"]
    is_abs = method == "percentile" and cfg["symmetric"]
    where = f"{method}[{name!r}]"
    ours_t = hc.histogram_dict[name]
    strict_hist = ref is not None
    if strict_hist and is_abs:
        ort_t = ref.collector.histogram_dict[name]
        if int(ort_t[0].sum()) != e.finite:
            # Deviation (2): ORT dropped values below the first min|x| (or above an extension
            # that rounded short); histocal keeps every finite value. min/max are unaffected.
            strict_hist = False
            reason = reason or "symmetric percentile dropped values"
            assert_same(ort_t[2], ours_t[2], f"{where}.min", zero_sign=True)
            assert_same(ort_t[3], ours_t[3], f"{where}.max", zero_sign=True)
    if strict_hist:
        ort_t = ref.collector.histogram_dict[name]
        assert_hist_tuple_same(ort_t, ours_t, f"histogram_dict[{name!r}]")
        assert_hist_tuple_same(ort_t, hc.get_histogram_dict()[name], f"get_histogram_dict()[{name!r}]")
    else:
        assert int(ours_t[0].sum()) == e.finite, (
            f"{where}: deviation ({reason}): histocal's histogram holds {int(ours_t[0].sum())} values, "
            f"but {e.finite} finite values were collected"
        )
    if strict_hist and ref.error is None:
        if assert_result_same(cfg, name, ref.result[name], ours[name], ref.collector.histogram_dict[name], ref.kl.get(name)):
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
    if e.finite > 0:
        assert np.isfinite(lo) and np.isfinite(hi), f"{where}: deviation ({reason}): range ({lo!r}, {hi!r})"


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
    value is counted).
    """
    names = sorted({n for c in collects for n in c})
    exp = expected_counts(collects)

    hc, ours = run_histocal(cfg, collects)
    ours_hd = hc.histogram_dict
    ours_hd2 = hc.get_histogram_dict()
    assert set(ours_hd) == set(names), f"histogram_dict keys {sorted(ours_hd)} != {names}"
    assert set(ours_hd2) == set(names), f"get_histogram_dict() keys {sorted(ours_hd2)} != {names}"
    assert isinstance(ours, dict) and set(ours) == set(names), f"result keys {sorted(ours)} != {names}"
    assert_counts(hc, collects)

    full = run_ort(cfg, collects)
    report = ParityReport()
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
        for variant in fallback_variants(collects, name):
            r = run_ort(cfg, variant, compute=False)  # ORT's entropy compute is slow: only when needed
            if r.error is not None and r.stage == "collect":
                classify_ort_error(r.error)
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
            raise AssertionError(
                f"{name!r}: ORT raised ({reason}: {ref.error!r}); histocal matches no ORT reference on the "
                f"finite values ({len(refs)} tried). First mismatch: {first_failure}"
            ) from first_failure
    # The whole-dict ORT run must have failed only if some tensor deviates.
    if full.error is not None:
        assert report.deviations or report.fallback, f"ORT failed on the whole dict but on no single tensor: {full.error!r}"
    return report
