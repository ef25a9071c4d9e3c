"""The kernels of the calibration methods of issue 6 (mse, kl, pow2, auto) and their error model (qerror),
checked against the plain numpy references of ``method_refs.py`` (a literal reading of
the definitions in ``histocal/methods.py``; the error model takes its scale and zero point from onnxruntime's own
``compute_scale_zp``).

* kernels (``histocal._core``) on random uniform signed histograms (hypothesis): qerror values,
  the mse grid search, the TensorRT KL search, pow2 NonOverflow / MinMSE (All, MostCommon);
* the Python layer is in test_methods_api.py.

Comparisons: error values to 1e-9 relative, plus a few ulps of the data's magnitude per value
(``error_tol``: the kernels work in bin coordinates); a search must return one of its grid's
candidates whose reference error is the reference minimum within that tolerance (a float near-tie
may pick another candidate than the reference; exact ties of zero error must follow the spec's tie
rule); pow2 exponents must be the brute-force ones exactly, exact ties decided in rational
arithmetic (searched over a much wider window than the spec's, which also shows that the spec's
window never misses a better exponent).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support import method_refs as R
from support.method_checks import (
    KL_ABS,
    POW2_QTYPES,
    QTYPES,
    _core,
    check_choice,
    close,
    err_close,
    error_tol,
    kernel_qerror,
    kernel_range,
)
from support.method_refs import Hist
from support.profiles import examples

# ----------------------------------------------------------------------------------------------
# Random histograms
# ----------------------------------------------------------------------------------------------

KINDS = ["dense", "sparse", "one", "const", "normal", "negative", "relu", "outliers", "outliers", "empty", "clamped"]
EXPONENTS = [0, 0, 0, 0, 0, 0, -125, -100, -40, -20, -8, 8, 20, 40, 100]


def make_hist(n: int, kind: str, geometry: str, exp: int, count_scale: str, seed: int) -> Hist:
    rng = np.random.default_rng(seed)
    if geometry == "stream":
        # the state's layout: 2H bins (H a power of two) over [-2^L, 2^L)
        n = 1 << max(3, int(n).bit_length() - 1)
        level = exp + int(rng.integers(-2, 3))
        left, width = -math.ldexp(1.0, level), math.ldexp(1.0, level) / (n // 2)
    else:
        width = math.ldexp(float(rng.uniform(0.5, 4.0)), exp) / n
        f = float(rng.choice([rng.uniform(0, 1), rng.uniform(1.0, 1.5), rng.uniform(-0.5, 0), 0.5, 1.0, 0.0]))
        left = -f * n * width
    idx = np.arange(n)
    lo_edge = left + idx * width
    hi_edge = left + (idx + 1) * width
    cmax = {"small": 10, "large": 10**6, "huge": 10**15}[count_scale]
    counts = np.zeros(n, np.uint64)

    def rand(size):
        return rng.integers(1, cmax + 1, size, dtype=np.uint64)

    if kind == "empty":
        return Hist(counts, left, width, 0.0, 0.0)
    if kind == "negative" and not np.any(hi_edge <= 0):
        kind = "dense"
    if kind == "relu" and not np.any(lo_edge >= 0):
        kind = "sparse"
    if kind == "dense":
        counts[:] = rng.integers(0, cmax + 1, n, dtype=np.uint64)
        counts[rng.integers(0, n)] += 1
    elif kind == "sparse":
        counts[rng.choice(n, int(rng.integers(1, 6)), replace=True)] = rand(1)[0]
    elif kind in ("one", "const"):
        counts[rng.integers(0, n)] = rand(1)[0]
    elif kind == "normal":
        c, s = rng.uniform(0, n), rng.uniform(1, n / 4)
        counts[:] = np.round(cmax * np.exp(-0.5 * ((idx - c) / s) ** 2)).astype(np.uint64)
        counts[int(min(n - 1, c))] += 1
    elif kind == "negative":
        neg = np.flatnonzero(hi_edge <= 0)
        counts[neg] = rng.integers(0, cmax + 1, neg.size, dtype=np.uint64)
        counts[neg[-1]] += 1
    elif kind == "relu":
        pos = np.flatnonzero(lo_edge >= 0)
        decay = np.exp(-(idx[pos] - pos[0]) / rng.uniform(1, n / 3))
        counts[pos] = np.round(cmax * decay).astype(np.uint64)
        counts[pos[0]] += rand(1)[0]  # the clipped zeros
    elif kind == "outliers":
        c = int(rng.integers(n // 3, 2 * n // 3 + 1))
        s = max(1, n // 50)
        bulk = np.arange(max(0, c - 3 * s), min(n, c + 3 * s + 1))
        counts[bulk] = np.round(cmax * np.exp(-0.5 * ((bulk - c) / s) ** 2)).astype(np.uint64) + 1
        far = rng.choice([0, 1, n - 2, n - 1], int(rng.integers(1, 4)))
        counts[far] += rng.integers(1, 4, far.size, dtype=np.uint64)
    elif kind == "clamped":
        # Almost all the data (up to ~2^62 values) at one tiny positive value: the min, far inside
        # bin 0 (every bin centre below the min stands for it), plus one or two values at the top.
        # The extreme count ratio probes pow2's search window and the moment sums' exactness.
        counts[0] = np.uint64(int(10 ** rng.uniform(6, 18.6)))
        counts[-1] = rng.integers(1, 3, dtype=np.uint64)
        top = float(hi_edge[-1])
        mn = abs(top) * 10 ** -rng.uniform(3, 15)
        return Hist(counts, float(left), float(width), mn, max(mn, float(left + (n - 0.5) * width)))
    nz = np.flatnonzero(counts)
    a, b = int(nz[0]), int(nz[-1])

    def inside(i: int) -> float:
        pick = int(rng.integers(0, 4))
        if pick == 0:
            return float(lo_edge[i])
        if pick == 1:
            return float(left + (i + 0.5) * width)
        v = float(lo_edge[i] + rng.uniform(0, 1) * width)
        return min(v, float(np.nextafter(hi_edge[i], -np.inf)))

    if kind == "one":
        mn = mx = inside(a)
    elif kind == "const":
        mn = mx = float(lo_edge[a])  # exactly on an edge: the bin's centre clamps onto it
    else:
        mn, mx = inside(a), inside(b)
        if mn > mx:
            mn, mx = mx, mn
        if kind == "relu" and lo_edge[a] <= 0 < hi_edge[a]:
            mn = 0.0
    return Hist(counts, float(left), float(width), float(mn), float(mx))


# Magnitudes of float16 data: normal, subnormal (below 2^-14) and near float16's largest.
F16_EXPONENTS = [0, 0, -4, -8, -12, -14, -16, -20, -24, 4, 8, 13]


@st.composite
def hists(draw, max_bins: int = 512, kinds=None, empty: bool = True, exponents=None):
    kinds = [k for k in (kinds or KINDS) if empty or k != "empty"]
    return make_hist(
        draw(st.integers(8, max_bins)),
        draw(st.sampled_from(kinds)),
        draw(st.sampled_from(["stream", "stream", "general"])),
        draw(st.sampled_from(exponents or EXPONENTS)),
        draw(st.sampled_from(["small", "small", "large", "huge"])),
        draw(st.integers(0, 2**32 - 1)),
    )


def describe(h: Hist) -> str:
    nz = np.flatnonzero(h.counts)
    return (
        f"Hist(counts=np.array({h.counts.tolist()!r}, np.uint64), left={h.left!r}, width={h.width!r}, "
        f"mn={h.mn!r}, mx={h.mx!r})  # {len(h.counts)} bins, {nz.size} non-empty"
    )


# ----------------------------------------------------------------------------------------------
# The references themselves (vectorised == literal / ORT's scalar path)
# ----------------------------------------------------------------------------------------------


@st.composite
def ranges_for(draw, h: Hist):
    """A (low, high) to evaluate on histogram h: data range, grid candidates, ties, extremes."""
    lo, hi = min(h.mn, 0.0), max(h.mx, 0.0)
    a = max(-lo, hi) or 1.0
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return h.mn, h.mx
    if kind == 1:
        i, j = draw(st.integers(0, 128)), draw(st.integers(0, 128))
        return lo * i / 128, hi * j / 128
    if kind == 2:
        t = a * draw(st.integers(1, 1024)) / 1024
        return -t, t  # also asymmetric: zero point on a .5 tie in exact arithmetic
    if kind == 3:
        return 0.0, 0.0
    if kind == 4:
        u = draw(st.floats(-2, 2)), draw(st.floats(-2, 2))
        return a * min(u), a * max(u)
    if kind == 5:
        return -a * draw(st.floats(1e-45, 1.0)), -a * 1e-3  # negative only: rmax = 0
    if kind == 6:
        if draw(st.booleans()):
            # a float64 scale just below / at / above float32's tiny (ORT: scale 1 below it),
            # from float32 ranges (ORT's range type)
            t = np.float32(np.finfo(np.float32).tiny * 255)
            step = draw(st.sampled_from([-1, 0, 1]))
            return 0.0, float(np.nextafter(t, np.float32(step * np.inf)) if step else t)
        t = draw(st.sampled_from([1e-45, 1e-39, 1e-38, 2e-36, 1e-30, 1e30, 1e36]))
        return -t, t * draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    k = draw(st.integers(-140, 100))
    q = R.POW2_RANGES[draw(st.sampled_from(POW2_QTYPES))]
    return math.ldexp(q[0], k), math.ldexp(q[1], k)


@st.composite
def f16_ranges_for(draw, h: Hist, qtype: str, symmetric: bool):
    """A (low, high) for a float16 tensor: as ranges_for, or one whose scale is near onnxruntime's
    float16 thresholds (2^-14: 1.31; 2^-25, halfway to the smallest subnormal: 1.32)."""
    if draw(st.booleans()):
        return draw(ranges_for(h))
    qmin, qmax = R.qrange(qtype, symmetric)
    s = draw(st.sampled_from([2.0**-14, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-20, 2.0**-10]))
    s *= draw(st.sampled_from([1.0, 1.0, 1 - 2**-9, 1 + 2**-9, 1 - 2**-30, 1 + 2**-30])) * (qmax - qmin)
    f = draw(st.sampled_from([0.0, 0.5, 1.0, 0.25]))
    low, high = np.float16(-s * f), np.float16(s * (1 - f))
    # neighbouring float16 ranges too
    step = draw(st.sampled_from([-1, 0, 0, 1]))
    if step:
        high = np.nextafter(high, np.float16(step * np.inf))
    return float(low), float(high)


@pytest.mark.parity
@settings(max_examples=examples(60))
@given(st.data(), st.sampled_from(QTYPES), st.booleans())
def test_reference_scale_zp_is_ort_float16(data, qtype, symmetric):
    """scale_zp_many == onnxruntime's compute_scale_zp on float16 ranges (its rule changed in 1.32)."""
    h = data.draw(hists(max_bins=64, empty=False, exponents=F16_EXPONENTS))
    pairs = [data.draw(f16_ranges_for(h, qtype, symmetric)) for _ in range(20)]
    lows, highs = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    scales, zps = R.scale_zp_many(lows, highs, qtype, symmetric, "float16")
    for (lo, hi), s, z in zip(pairs, scales, zps):
        assert (s, z) == R.ort_scale_zp(lo, hi, qtype, symmetric, "float16"), (lo, hi, qtype, symmetric, (s, z))


@pytest.mark.parity
@settings(max_examples=examples(60))
@given(st.data(), st.sampled_from(QTYPES), st.booleans())
def test_reference_scale_zp_is_ort(data, qtype, symmetric):
    """scale_zp_many (used by the searches) == onnxruntime's compute_scale_zp, range by range."""
    h = data.draw(hists(max_bins=64, empty=False))
    pairs = [data.draw(ranges_for(h)) for _ in range(20)]
    lows, highs = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    scales, zps = R.scale_zp_many(lows, highs, qtype, symmetric)
    for (lo, hi), s, z in zip(pairs, scales, zps):
        s_ort, z_ort = R.ort_scale_zp(lo, hi, qtype, symmetric)
        assert (s, z) == (s_ort, z_ort), (lo, hi, qtype, symmetric, (s, z), (s_ort, z_ort))
    many = R.qerror_many(h, lows, highs, qtype, symmetric)
    one = [R.qerror(h, lo, hi, qtype, symmetric) for lo, hi in pairs]
    assert all(close(a, b, 1e-12) for a, b in zip(many, one)), describe(h)


@settings(max_examples=examples(15))
@given(hists(max_bins=96, empty=False), st.sampled_from([4, 8, 16, 32]), st.integers(0, 64))
def test_reference_kl_vectorised_is_literal(h, nq, extra):
    assume(max(abs(h.mn), abs(h.mx)) > 0)  # A = 0: no |x| histogram (kl_search returns (0, 0))
    nb = nq + extra
    v, _ = R.kl_divergences(h, nb, nq)
    lit, _ = R.kl_divergences(h, nb, nq, literal=True)
    assert np.array_equal(np.isinf(v), np.isinf(lit))
    fin = np.isfinite(v)
    np.testing.assert_allclose(v[fin], lit[fin], rtol=1e-12, atol=1e-15)


@pytest.mark.parity
def test_reference_pow2_range_maps_back_to_the_scale():
    """(qmin 2^k, qmax 2^k) gives ORT's asymmetric compute_scale_zp exactly scale 2^k, zero point 0."""
    for qtype, (_qmin, _qmax) in R.POW2_RANGES.items():
        for k in range(-120, 100, 7):
            lo, hi = R.pow2_range(k, qtype)
            assert R.ort_scale_zp(lo, hi, qtype, False) == (math.ldexp(1.0, k), 0), (qtype, k)


# ----------------------------------------------------------------------------------------------
# qerror / pow2_error kernels
# ----------------------------------------------------------------------------------------------


@pytest.mark.parity
@settings(max_examples=examples(300))
@given(st.data(), hists(), st.sampled_from(QTYPES), st.booleans())
def test_qerror(data, h, qtype, symmetric):
    low, high = data.draw(ranges_for(h))
    got = kernel_qerror(*h.args, low, high, qtype=qtype, symmetric=symmetric)
    want = R.qerror(h, low, high, qtype, symmetric)
    assert isinstance(got, float)
    assert err_close(h, got, want), (
        f"qerror {got!r} != reference {want!r} for range ({low!r}, {high!r}) "
        f"{qtype} symmetric={symmetric} on {describe(h)}"
    )


@pytest.mark.parity
@settings(max_examples=examples(200))
@given(st.data(), hists(exponents=F16_EXPONENTS), st.sampled_from(QTYPES), st.booleans())
def test_qerror_float16(data, h, qtype, symmetric):
    """A float16 tensor's error: onnxruntime's scale and zero point of the float16 range, under the
    installed version's rule."""
    low, high = data.draw(f16_ranges_for(h, qtype, symmetric))
    got = kernel_qerror(*h.args, low, high, dtype="float16", qtype=qtype, symmetric=symmetric)
    want = R.qerror(h, low, high, qtype, symmetric, "float16")
    assert err_close(h, got, want), (
        f"float16 qerror {got!r} != reference {want!r} for range ({low!r}, {high!r}) "
        f"{qtype} symmetric={symmetric} on {describe(h)}"
    )


@pytest.mark.parity
@settings(max_examples=examples(100))
@given(hists(), st.sampled_from(POW2_QTYPES), st.integers(-40, 10))
def test_pow2_error(h, qtype, dk):
    k0 = R.pow2_nonoverflow_k(h, qtype)
    k = (k0 if k0 is not None else 0) + dk
    got = _core().pow2_error(*h.args, k, qtype)
    want = R.pow2_error(h, k, qtype)
    assert err_close(h, got, want), f"pow2_error(k={k}) {got!r} != reference {want!r}, {qtype}, {describe(h)}"


# ----------------------------------------------------------------------------------------------
# Searches
# ----------------------------------------------------------------------------------------------


@settings(max_examples=examples(100))
@given(hists(), st.sampled_from(QTYPES), st.booleans())
def test_mse(h, qtype, symmetric):
    got = kernel_range("mse", *h.args, qtype=qtype, symmetric=symmetric)
    ref = R.mse_search(h, qtype, symmetric)
    what = f"mse {qtype} symmetric={symmetric} on {describe(h)}"
    if ref.best < 0:
        assert tuple(got) == (0.0, 0.0), f"{what}: {got} for an empty / all-zero histogram"
        return
    hit = ref.index_of(*got)
    assert hit.size, f"{what}: result {got} is not a grid candidate; reference {ref.result}"
    check_choice(ref.errors, int(hit[0]), ref.best, what, h)
    # the kernel's own qerror of its choice is the reference error of it
    e = kernel_qerror(*h.args, *got, qtype=qtype, symmetric=symmetric)
    assert err_close(h, e, float(ref.errors[hit[0]])), what


@settings(max_examples=examples(40))
@given(hists(max_bins=128, exponents=F16_EXPONENTS), st.sampled_from(QTYPES), st.booleans())
def test_mse_float16(h, qtype, symmetric):
    """mse for a float16 tensor searches with the float16 error model of the installed onnxruntime."""
    got = kernel_range("mse", *h.args, dtype="float16", qtype=qtype, symmetric=symmetric)
    ref = R.mse_search(h, qtype, symmetric, "float16")
    what = f"mse float16 {qtype} symmetric={symmetric} on {describe(h)}"
    if ref.best < 0:
        assert tuple(got) == (0.0, 0.0), what
        return
    hit = ref.index_of(*got)
    assert hit.size, f"{what}: result {got} is not a grid candidate; reference {ref.result}"
    check_choice(ref.errors, int(hit[0]), ref.best, what, h)


@settings(max_examples=examples(60))
@given(hists(max_bins=256), st.sampled_from([4, 8, 16, 32, 128]), st.integers(0, 400))
def test_kl(h, nq, extra):
    nb = nq + extra
    got = kernel_range("kl", *h.args, num_bins=nb, num_quantized_bins=nq)
    ref = R.kl_search(h, nb, nq)
    what = f"kl num_bins={nb} nq={nq} on {describe(h)}"
    if ref.A == 0:
        assert tuple(got) == (0.0, 0.0), what
        return
    low, high = got
    assert low == ref.low(high), f"{what}: low end {low} is not max(-t, min(min, 0)): {got}"
    i = int(round(high / ref.A * nb))
    assert nq <= i <= nb and high == ref.threshold(i), (
        f"{what}: {high!r} is not a candidate threshold A*i/num_bins (A={ref.A!r}); reference {ref.result}"
    )
    d = ref.divergence
    if np.all(np.isinf(d)):
        assert i == nq, f"{what}: every divergence is +inf, the first candidate must win"
        return
    check_choice(d, i - nq, ref.best_i - nq, what, abs_tol=KL_ABS, strict_zero=False)


@settings(max_examples=examples(5))
@given(hists(max_bins=512, empty=False))
def test_kl_default_bins(h):
    """Default settings (2048 / 128) on histograms of up to 512 bins."""
    got = kernel_range("kl", *h.args)
    ref = R.kl_search(h)
    if ref.A == 0:
        assert tuple(got) == (0.0, 0.0)
        return
    i = int(round(got[1] / ref.A * 2048))
    assert got == (ref.low(ref.threshold(i)), ref.threshold(i))
    check_choice(
        ref.divergence, i - 128, ref.best_i - 128, f"kl default on {describe(h)}", abs_tol=KL_ABS, strict_zero=False
    )


def pow2_k_of(got: tuple, qtype: str) -> int | None:
    low, high = got
    if (low, high) == (0.0, 0.0):
        return None
    m, e = math.frexp(high / R.POW2_RANGES[qtype][1])
    assert m == 0.5, f"{got} is not (qmin 2^k, qmax 2^k) for {qtype}"
    k = e - 1
    assert (low, high) == R.pow2_range(k, qtype), f"{got} is not the {qtype} range of 2^{k}"
    return k


@pytest.mark.parity
@settings(max_examples=examples(200))
@given(hists(), st.sampled_from(POW2_QTYPES))
def test_pow2_nonoverflow(h, qtype):
    got = kernel_range("pow2", *h.args, qtype=qtype, pow2_method="NonOverflow")
    want = R.pow2_nonoverflow_k(h, qtype)
    assert pow2_k_of(tuple(got), qtype) == want, f"pow2 NonOverflow {qtype}: {got}, brute force k={want}, {describe(h)}"


def check_pow2_choice(h: Hist, qtype: str, window: R.Pow2Scan, k: int, what: str) -> None:
    """k is the brute-force MinMSE exponent: exactly when the minimum is unique by a margin; among
    candidates within float tolerance of it, exact (rational) errors decide: an exact tie must go
    to the larger k (the spec's rule), a float near-tie of different exact errors may go either way."""
    m = float(window.errors.min())
    near = [int(j) for j in window.ks[window.errors <= m + error_tol(h, m)]]
    if len(near) == 1:
        assert k == near[0], f"{what}: k={k}, brute force {near[0]} (errors {window.error(k)!r} vs {m!r})"
        return
    assert k in near, f"{what}: k={k} has error {window.error(k)!r}, the minimum is {m!r} at k in {near}"
    exact = {j: R.pow2_error_exact(h, j, qtype) for j in near}
    e_min = min(exact.values())
    rule = max(j for j in near if exact[j] == e_min)
    assert k == rule or exact[k] != e_min, (
        f"{what}: exact tie E({k}) = E({rule}) = {float(e_min)!r}: the spec's tie rule picks the larger k={rule}, "
        f"the kernel k={k}"
    )


@pytest.mark.parity
@settings(max_examples=examples(150))
@given(hists(), st.sampled_from(POW2_QTYPES))
def test_pow2_minmse(h, qtype):
    got = kernel_range("pow2", *h.args, qtype=qtype, pow2_method="MinMSE", minmse_mode="All")
    k0 = R.pow2_nonoverflow_k(h, qtype)
    what = f"pow2 MinMSE {qtype} on {describe(h)}"
    k = pow2_k_of(tuple(got), qtype)
    if k0 is None:
        assert k is None, what
        return
    lo, hi = R.pow2_bounds(qtype)
    window = R.pow2_scan(h, qtype, max(k0 - 30, lo), k0)
    wide = R.pow2_scan(h, qtype, max(k0 - 60, lo), min(k0 + 10, hi))
    assert max(k0 - 30, lo) <= k <= k0, f"{what}: k={k} outside the spec's window [{k0 - 30}, {k0}] within {(lo, hi)}"
    check_pow2_choice(h, qtype, window, k, what)
    # the window never misses: nothing in [k0-60, k0+10] beats it
    m = float(wide.errors.min())
    assert window.error(k) <= m + error_tol(h, m), (
        f"{what}: best k in the window {k} (error {window.error(k)!r}) misses k={wide.best()} (error {m!r}) outside it"
    )


@pytest.mark.parity
@settings(max_examples=examples(80))
@given(
    hists(exponents=F16_EXPONENTS),
    st.sampled_from(POW2_QTYPES),
    st.sampled_from(["NonOverflow", "All", "MostCommon"]),
    st.lists(st.tuples(st.integers(-40, 12), st.integers(1, 5)), min_size=1, max_size=8),
)
def test_pow2_float16(h, qtype, choice, votes):
    """A float16 tensor's pow2 exponent stays where the installed onnxruntime maps its range back
    to scale 2^k (onnxruntime 1.31: from 2^-14, 1.32: from 2^-24)."""
    lo, hi = R.pow2_bounds(qtype, "float16")
    method = (
        {"pow2_method": "NonOverflow"} if choice == "NonOverflow" else {"pow2_method": "MinMSE", "minmse_mode": choice}
    )
    got = kernel_range("pow2", *h.args, dtype="float16", qtype=qtype, votes=votes, **method)
    k = pow2_k_of(tuple(got), qtype)
    what = f"pow2 {choice} float16 {qtype} on {describe(h)}"
    if choice == "MostCommon":
        assert k == R.most_common_k(votes, (lo, hi)), (what, votes)
        return
    k0 = R.pow2_nonoverflow_k(h, qtype, "float16")
    if choice == "NonOverflow" or k0 is None:
        assert k == k0, what
        return
    assert max(k0 - 30, lo) <= k <= k0 <= hi, what
    check_pow2_choice(h, qtype, R.pow2_scan(h, qtype, max(k0 - 30, lo), k0), k, what)
    # the range the kernel returns is one onnxruntime quantizes with scale 2^k
    assert R.ort_scale_zp(*got, qtype, False, "float16") == (math.ldexp(1.0, k), 0), what


@settings(max_examples=examples(60))
@given(
    hists(empty=False),
    st.sampled_from(POW2_QTYPES),
    st.lists(st.tuples(st.integers(-30, 10), st.integers(1, 5)), min_size=1, max_size=8),
)
def test_pow2_most_common(h, qtype, votes):
    got = kernel_range("pow2", *h.args, qtype=qtype, pow2_method="MinMSE", minmse_mode="MostCommon", votes=votes)
    assert tuple(got) == R.pow2_range(R.most_common_k(votes), qtype), (votes, got)


# ----------------------------------------------------------------------------------------------
# Hand-picked cases: exact ties, degenerate histograms
# ----------------------------------------------------------------------------------------------


def _one_value(v: float, count: int = 7) -> Hist:
    counts = np.zeros(16, np.uint64)
    counts[12] = count
    return Hist(counts, -8.0, 1.0, v, v)  # bin 12 is [4, 5)


@pytest.mark.parametrize(
    "method,options",
    [
        ("mse", {}),
        ("mse", {"symmetric": True}),
        ("kl", {"num_bins": 64, "num_quantized_bins": 16}),
        ("pow2", {"pow2_method": "NonOverflow"}),
        ("pow2", {"pow2_method": "MinMSE"}),
    ],
)
def test_empty_histogram_is_zero_range(method, options):
    h = Hist(np.zeros(32, np.uint64), -4.0, 0.25, 0.0, 0.0)
    assert tuple(kernel_range(method, *h.args, **options)) == (0.0, 0.0)
    assert kernel_qerror(*h.args, -1.0, 1.0) == 0.0


@pytest.mark.parametrize(
    "method,options",
    [
        ("mse", {}),
        ("mse", {"symmetric": True}),
        ("kl", {}),
        ("pow2", {"pow2_method": "NonOverflow"}),
        ("pow2", {"pow2_method": "MinMSE"}),
    ],
)
def test_all_zero_data_is_zero_range(method, options):
    counts = np.zeros(16, np.uint64)
    counts[8] = 5  # [0, 1): the data is all 0.0
    h = Hist(counts, -8.0, 1.0, 0.0, 0.0)
    assert tuple(kernel_range(method, *h.args, **options)) == (0.0, 0.0)


@pytest.mark.parity
@pytest.mark.parametrize("v", [4.0, 4.5, 4.75, 4.125])
@pytest.mark.parametrize("qtype", POW2_QTYPES)
def test_pow2_one_value_exact_tie_takes_the_larger_exponent(v, qtype):
    """A value representable at several exponents: E(k) = 0 for all of them; the largest wins."""
    h = _one_value(v)
    k = pow2_k_of(tuple(kernel_range("pow2", *h.args, qtype=qtype, pow2_method="MinMSE")), qtype)
    k0 = R.pow2_nonoverflow_k(h, qtype)
    assert k == R.pow2_scan(h, qtype, k0 - 30, k0).best()
    assert R.pow2_error(h, k, qtype) == 0.0


@pytest.mark.parity
def test_pow2_exact_tie_with_large_counts_takes_the_larger_exponent():
    """Odd-integer values (bins of width 2 centred on -255..255, a level-8 streaming histogram of
    256 bins): every value is off by exactly 1 with scale 2 (k=1: halves, rounded) and with scale
    4 (k=2: quarters), so E(1) = E(2) = 1 exactly and the spec's tie rule picks k = 2. Counts of
    very different sizes (sums above 2^53) must not turn the exact tie into a float one."""
    c = np.array([10**15 if i % 2 else 1 for i in range(256)], np.uint64)
    h = Hist(c, -256.0, 2.0, -255.0, 255.0)
    assert R.pow2_error_exact(h, 1, "int8") == R.pow2_error_exact(h, 2, "int8") == 1
    assert R.pow2_nonoverflow_k(h, "int8") == 2
    got = tuple(kernel_range("pow2", *h.args, qtype="int8", pow2_method="MinMSE"))
    assert got == R.pow2_range(2, "int8") == (-512.0, 508.0), got


@pytest.mark.parametrize("v", [4.0, 4.5, -4.25])
@pytest.mark.parametrize("symmetric", [False, True])
def test_mse_one_value_exact_tie_takes_the_first_candidate(v, symmetric):
    counts = np.zeros(16, np.uint64)
    counts[12 if v > 0 else 3] = 3
    h = Hist(counts, -8.0, 1.0, v, v)
    ref = R.mse_search(h, "int8", symmetric)
    got = kernel_range("mse", *h.args, symmetric=symmetric)
    check_choice(ref.errors, int(ref.index_of(*got)[0]), ref.best, f"mse one value {v}", h)


def test_kl_requires_enough_bins():
    h = _one_value(4.5)
    with pytest.raises(ValueError, match="num_bins|num_quantized_bins"):
        kernel_range("kl", *h.args, num_bins=64, num_quantized_bins=128)


@pytest.mark.parametrize(
    "kwargs,option",
    [
        ({"qtype": "int4"}, "qtype"),
        ({"pow2_method": "Bogus"}, "pow2_method"),
        ({"minmse_mode": "Bogus"}, "minmse_mode"),
    ],
)
def test_kernel_bad_options(kwargs, option):
    h = _one_value(4.5)
    method = "mse" if option == "qtype" else "pow2"
    with pytest.raises(ValueError, match=option):
        kernel_range(method, *h.args, **kwargs)


def test_kernel_pow2_rejects_uint16():
    h = _one_value(4.5)
    with pytest.raises(ValueError, match="qtype"):
        kernel_range("pow2", *h.args, qtype="uint16")


def test_kernel_unknown_method():
    h = _one_value(4.5)
    with pytest.raises(ValueError, match="method"):
        kernel_range("bogus", *h.args)
