"""Parity of histocal.HistogramCollector with onnxruntime's HistogramCollector.

Wherever ORT produces a result, histocal must produce the identical one: histogram counts,
edges (dtype and bits), min/max/threshold (value and Python object kind), and the per-method
results. The only accepted differences are the documented deviations (docs/ort_parity.md and the
docs/deviations.md):

1. ORT raises (non-finite data, empty + non-empty or differently shaped batches in one list,
   "Too many bins", entropy smoothing assertion, an empty later batch on the |x| path, and
   float16 overflow of the |x| extension's np.arange): histocal returns a
   result. (Where numpy's float64 extension edges merely pass 65504, ORT does not raise: it
   stores them as float16 inf and then bins later ±inf; that is compared exactly.) It is compared exactly with ORT run on the finite values flattened per collect when
   ORT can compute that (parity.fallback_variants), else checked for sanity: finite range and
   every finite value in the histogram.
2. Symmetric percentile merges where ORT drops values: histocal keeps every finite value.
3. The sign of a zero min/max (numpy's nanmin is order-dependent on 0.0 vs -0.0).

Entropy thresholds must be identical; a different threshold is only accepted when ORT's own KL
vector (captured with a spy on ``calibrate.np.argmin``) shows a float near-tie (<= 4 ulps of the
tensor's float type) between ORT's choice and histocal's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, note, settings
from hypothesis import strategies as st
from support.parity import (
    MAX_BINS,
    argmin_spy,
    assert_hist_tuple_same,
    check_parity,
    run_histocal,
    run_ort,
)
from support.profiles import examples
from support.strategies import NUM_BINS, PERCENTILES, build_collects, plans


def _cfg(method, symmetric=False, num_bins=128, num_quantized_bins=128, percentile=99.999, scenario="same"):
    return dict(
        method=method,
        symmetric=symmetric,
        num_bins=num_bins,
        num_quantized_bins=num_quantized_bins,
        percentile=percentile,
        scenario=scenario,
    )


def _describe(collects):
    lines = []
    for i, c in enumerate(collects):
        for name, v in c.items():
            bs = v if isinstance(v, list) else [v]
            desc = ", ".join(f"{b.dtype}{list(b.shape)}" for b in bs)
            lines.append(f"  collect {i} {name!r}: {'list ' if isinstance(v, list) else ''}[{desc}]")
    return "\n".join(lines)


def _run_property(cfg, plan, growth):
    collects = build_collects(plan, cfg, growth)
    note(f"cfg={cfg}\nplan={plan}\n{_describe(collects)}")
    report = check_parity(cfg, collects)
    for reason in report.deviations.values():
        event(f"deviation: {reason}")
    for _name in report.near_ties:
        event("entropy threshold differs: accepted as a KL near-tie")
    for reason in report.fallback.values():
        event(f"compared against ORT on flattened finite values: {reason}")
    event(f"tensors compared exactly: {min(len(report.compared), 2)}{'+' if len(report.compared) > 2 else ''}")


# ----------------------------------------------------------------------------------------------
# Property tests, one per method / histogram family
# ----------------------------------------------------------------------------------------------

# ORT's entropy search is a slow Python loop: 2048 bins is drawn rarely (and also has example tests).
ENTROPY_BINS = [7, 8, 128, 129, 512, 1000] * 2 + [2048]


@st.composite
def entropy_cfgs(draw):
    nb = draw(st.sampled_from(ENTROPY_BINS))
    nq = draw(st.sampled_from([q for q in (4, 5, 8, 128) if q <= nb]))
    return _cfg("entropy", symmetric=draw(st.booleans()), num_bins=nb, num_quantized_bins=nq)


@pytest.mark.parity
@settings(max_examples=examples(100))
@given(cfg=entropy_cfgs(), plan=plans(max_tensors=2, max_collects=4))
def test_entropy_parity(cfg, plan):
    # ORT's entropy search is a Python loop over every candidate: keep grown histograms ~<= 1500 bins.
    growth = 1.0 if cfg["num_bins"] == 2048 else max(1.5, 1024 / cfg["num_bins"])
    _run_property(cfg, plan, growth)


@pytest.mark.parity
@settings(max_examples=examples(150))
@given(
    nb=st.sampled_from(NUM_BINS),
    p=st.sampled_from(PERCENTILES),
    plan=plans(),
)
def test_percentile_parity(nb, p, plan):
    _run_property(_cfg("percentile", symmetric=False, num_bins=nb, percentile=p), plan, growth=32.0)


@pytest.mark.parity
@settings(max_examples=examples(150))
@given(
    nb=st.sampled_from(NUM_BINS),
    p=st.sampled_from(PERCENTILES),
    plan=plans(),
)
def test_percentile_symmetric_parity(nb, p, plan):
    _run_property(_cfg("percentile", symmetric=True, num_bins=nb, percentile=p), plan, growth=32.0)


@pytest.mark.parity
@settings(max_examples=examples(120))
@given(
    nb=st.sampled_from([512, 1000, 2048]),
    scenario=st.sampled_from(["same", "p3"]),
    symmetric=st.booleans(),
    plan=plans(f16_weight=1),  # f16 mostly fails "Too many bins" here: fewer f16 tensors
)
def test_distribution_parity(nb, scenario, symmetric, plan):
    _run_property(_cfg("distribution", symmetric=symmetric, num_bins=nb, scenario=scenario), plan, growth=16.0)


@pytest.mark.parity
@settings(max_examples=examples(60))
@given(
    method=st.sampled_from(["entropy", "percentile", "percentile-sym", "distribution"]),
    plan=plans(max_tensors=3, max_collects=3, nonfinite=False, allow_empty=False, ragged=False),
)
def test_parity_clean_inputs_compare_everything(method, plan):
    """Finite, non-empty, same-shape inputs (f32/f16 with <= 1024 bins): no tensor may deviate
    except through the documented f16 "Too many bins" or the |x|-path drops."""
    if method == "entropy":
        cfg = _cfg("entropy", num_bins=129, num_quantized_bins=8)
    elif method == "percentile":
        cfg = _cfg("percentile", num_bins=1000, percentile=99.9)
    elif method == "percentile-sym":
        cfg = _cfg("percentile", symmetric=True, num_bins=1000, percentile=99.9)
    else:
        cfg = _cfg("distribution", num_bins=1000, scenario="same")
    collects = build_collects(plan, cfg, growth=4.0)
    note(f"cfg={cfg}\n{_describe(collects)}")
    report = check_parity(cfg, collects)
    allowed = {"too many bins", "symmetric percentile dropped values", "|x| extension overflow (later +inf or float16)"}
    assert set(report.deviations.values()) <= allowed, report.deviations


# ----------------------------------------------------------------------------------------------
# Worked examples: ORT's exact behaviour at known corner cases
# ----------------------------------------------------------------------------------------------

f32 = np.float32
f16 = np.float16


def _parity(cfg, collects):
    return check_parity(cfg, collects)


@pytest.mark.parity
@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_worked_example_value_path_merges(method):
    """§4.1 table: first, t_new <= t_old, growth, growth by an exact multiple of the stride."""
    nb = 8 if method != "distribution" else 512
    cfg = _cfg(method, num_bins=nb, num_quantized_bins=4, percentile=50.0)
    seq = [[-1, 0.5, 2], [1.5, -0.2], [3.3], [-4.5]]
    collects = [{"t": np.array(x, f32)} for x in seq]
    rep = _parity(cfg, collects)
    assert rep.compared == ["t"]
    if method == "entropy":
        ort = run_ort(cfg, collects)
        assert ort.collector.histogram_dict["t"][0].size == 20  # the exact-multiple growth really happened


@pytest.mark.parity
@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
def test_worked_example_zero_threshold_then_growth(method):
    """§4.1: old_t == 0 (all zeros first) adds the old counts index-wise without re-binning."""
    nb = 8 if method != "distribution" else 512
    cfg = _cfg(method, num_bins=nb, num_quantized_bins=4, percentile=99.9)
    collects = [{"z": np.zeros(5, f32)}, {"z": np.array([0.3, -1], f32)}]
    assert _parity(cfg, collects).compared == ["z"]


@pytest.mark.parity
@pytest.mark.parametrize("method", ["entropy", "percentile", "percentile-sym", "distribution"])
def test_empty_batch_injects_zero_into_min_max(method):
    """§4.1/§8: an empty later collect injects 0 into min/max (0-d arrays for empty batches)."""
    sym = method == "percentile-sym"
    m = "percentile" if sym else method
    cfg = _cfg(m, symmetric=sym, num_bins=512, num_quantized_bins=8, percentile=99.9)
    collects = [{"e": np.zeros(0, f32)}, {"e": np.array([1, 2], f32)}]
    assert _parity(cfg, collects).compared == ["e"]
    if not sym:  # the |x| path raises on an empty *later* batch (documented deviation)
        collects = [{"e": np.array([1, 2], f32)}, {"e": np.zeros((0, 3), f32)}]
        assert _parity(cfg, collects).compared == ["e"]


@pytest.mark.parity
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("dtype", [f32, f16])
def test_empty_only(sym, dtype):
    """§8: empty data only: Entropy (0,0); Percentile (0.0, -0.5) / (-0.0, 0.0); Distribution NaN."""
    for cfg in (
        _cfg("entropy", symmetric=sym, num_bins=8, num_quantized_bins=4),
        _cfg("percentile", symmetric=sym, num_bins=1000, percentile=99.999),
        _cfg("distribution", symmetric=sym, num_bins=512, scenario="same"),
        _cfg("distribution", symmetric=sym, num_bins=512, scenario="p3"),
    ):
        collects = [{"e": np.zeros((0, 4), dtype), "f": [np.zeros((2, 0), dtype), np.zeros((2, 0), dtype)]}]
        rep = _parity(cfg, collects)
        assert sorted(rep.compared) == ["e", "f"], (cfg, rep)


@pytest.mark.parity
@pytest.mark.parametrize("c", [0.0, 3.0, -3.0, 1e-3, 65504.0])
@pytest.mark.parametrize("dtype", [f32, f16])
def test_constant_data(c, dtype):
    """§8: constant data: ±0.5 ranges, lo > hi for non-symmetric percentile at c=3."""
    data = {"c": np.full((3, 7), c, dtype)}
    for cfg in (
        _cfg("entropy", num_bins=128, num_quantized_bins=4),
        _cfg("percentile", num_bins=1000, percentile=99.999),
        _cfg("percentile", num_bins=2048, percentile=99.999),
        _cfg("percentile", symmetric=True, num_bins=2048, percentile=99.999),
        _cfg("distribution", num_bins=512, scenario="p3"),
    ):
        _parity(cfg, [data, data])


@pytest.mark.parity
@pytest.mark.parametrize("p", PERCENTILES)
def test_percentile_worked_example(p):
    """§5.1: data [0.1,0.2,0.3,-0.9,1.0,0.15], 8 bins, both symmetric modes."""
    x = np.array([0.1, 0.2, 0.3, -0.9, 1.0, 0.15], f32)
    for sym in (False, True):
        assert _parity(_cfg("percentile", symmetric=sym, num_bins=8, percentile=p), [{"x": x}]).compared == ["x"]


@pytest.mark.parity
@pytest.mark.parametrize("n", [3, 10, 129])
def test_percentile_100_depends_on_cdf_last_bits(n):
    """§5.1: p=100 with n equal bins: cdf[-1] == 1.0 or 0.9999999999999999 picks e[n-1] or e[n]."""
    x = (np.arange(n, dtype=np.float64) + 0.5).astype(f32) * np.float32(3 / n)
    for sym in (False, True):
        _parity(_cfg("percentile", symmetric=sym, num_bins=n, percentile=100.0), [{"x": x}])


@pytest.mark.parity
def test_symmetric_percentile_extension_and_drop():
    """§4.2: extension with f64 arange edges (overshoot); values below the first min|x| dropped by
    ORT (deviation 2: histocal keeps them, so its count is the number of finite values)."""
    cfg = _cfg("percentile", symmetric=True, num_bins=4, percentile=99.9)
    collects = [{"a": np.array([0.5, -1.0], f32)}, {"a": np.array([0.75, 2.2, -1.9], f32)}]
    assert _parity(cfg, collects).compared == ["a"]  # extension only, nothing dropped
    collects = [{"a": np.array([0.5, -1.0], f32)}, {"a": np.array([0.1, -0.2, 0.0, 0.75, 2.2], f32)}]
    rep = _parity(cfg, collects)
    assert rep.deviations == {"a": "symmetric percentile dropped values"}
    ort = run_ort(cfg, collects)
    assert int(ort.collector.histogram_dict["a"][0].sum()) == 4  # ORT really dropped 3 of 7


@pytest.mark.parity
def test_symmetric_percentile_empty_extension():
    """§4.2: edges [0,3.5,...,14] and amax=14.000001: ORT's extension is empty and drops the value."""
    cfg = _cfg("percentile", symmetric=True, num_bins=4, percentile=100.0)
    collects = [{"a": np.array([0, 14], f32)}, {"a": np.array([14.000001, 1], f32)}]
    rep = _parity(cfg, collects)
    ort = run_ort(cfg, collects)
    if int(ort.collector.histogram_dict["a"][0].sum()) == 3:
        assert rep.deviations == {"a": "symmetric percentile dropped values"}


@pytest.mark.parity
def test_symmetric_percentile_all_nan_later_batch_is_ignored():
    """§4.2/§8: an all-NaN later batch on the |x| path leaves ORT's state (including min/max) unchanged."""
    cfg = _cfg("percentile", symmetric=True, num_bins=8, percentile=99.9)
    collects = [{"a": np.array([1, 2], f32)}, {"a": np.array([np.nan, np.nan], f32)}]
    assert _parity(cfg, collects).compared == ["a"]


@pytest.mark.parity
def test_symmetric_percentile_nan_in_later_batch_dropped():
    cfg = _cfg("percentile", symmetric=True, num_bins=8, percentile=50.0)
    collects = [{"a": np.array([1, -2, 0.5], f32)}, {"a": [np.array([np.nan, 3], f32), np.array([-0.7, np.nan], f32)]}]
    assert _parity(cfg, collects).compared == ["a"]


@pytest.mark.parity
def test_value_path_nan_dropped_silently():
    for cfg in (_cfg("entropy", num_bins=8, num_quantized_bins=4), _cfg("distribution", num_bins=512)):
        collects = [{"a": np.array([1, np.nan, -2], f32)}, {"a": np.array([np.nan, 3.0, 0.25], f32)}]
        assert _parity(cfg, collects).compared == ["a"]


@pytest.mark.parity
def test_f16_bin_misplacement_is_reproduced():
    """§4.3.5: with f16, numpy's estimate-and-correct puts 19.83 in bin 967 (not 966) for n=1000,
    t=f16(21.22). A port must reproduce this, not a binary search."""
    x = np.array([21.22, -3.0, 19.83], f16)
    for cfg in (_cfg("percentile", num_bins=1000, percentile=50.0), _cfg("distribution", num_bins=1000)):
        assert _parity(cfg, [{"h": x}]).compared == ["h"]
    ort = run_ort(_cfg("percentile", num_bins=1000), [{"h": x}])
    assert ort.collector.histogram_dict["h"][0][967] == 1


@pytest.mark.parity
def test_f32_values_on_edges_and_one_ulp_away():
    """§4.3.5: f32 values exactly on edges and ±1 ulp, fed into a second collect (no growth)."""
    rng = np.random.default_rng(5)
    for nb in (7, 128, 1000, 2048):
        for method, sym in (("percentile", False), ("percentile", True), ("distribution", False)):
            if method == "distribution" and nb < 512:
                continue
            cfg = _cfg(method, symmetric=sym, num_bins=nb, percentile=99.9)
            first = {"e": (rng.standard_normal(500) * 3.7).astype(f32)}
            ort = run_ort(cfg, [first])
            edges = ort.collector.histogram_dict["e"][1]
            second = np.concatenate([edges, np.nextafter(edges, f32(np.inf)), np.nextafter(edges, f32(-np.inf))])
            if not sym:
                second = second[(second >= edges[0]) & (second <= edges[-1])]
            _parity(cfg, [first, {"e": second}, {"e": -second}])


@pytest.mark.parity
def test_entropy_default_128_bins_is_minmax():
    """§5.2: 128/128 has a single candidate and returns exactly the data (min, max)."""
    x = (np.random.default_rng(1).standard_normal(10000) * 2 + 0.3).astype(f32)
    cfg = _cfg("entropy", num_bins=128, num_quantized_bins=128)
    assert _parity(cfg, [{"x": x}]).compared == ["x"]
    _, res = run_histocal(cfg, [{"x": x}])
    assert res["x"][0] == x.min() and res["x"][1] == x.max()


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [f32, f16])
def test_entropy_2048_bins(dtype):
    """The percentile/distribution default bin count, with entropy (ORT's slow path, one example).
    f16 with 2048 bins only works in ORT when t is a power of two (§4.3.6)."""
    x = (np.random.default_rng(2).standard_t(3, 20000)).astype(dtype)
    cfg = _cfg("entropy", num_bins=2048, num_quantized_bins=128)
    if dtype == f16:
        x = np.clip(x, -2, 2).astype(f16)  # t = 2: ORT can make 2048 f16 bins
        x[0] = 2
    assert _parity(cfg, [{"x": x}]).compared == ["x"]
    if dtype == f16:
        y = (x * f16(1.5)).astype(f16)  # t = 3: "Too many bins" in ORT
        assert _parity(cfg, [{"y": y}]).deviations == {"y": "too many bins"}


@pytest.mark.parity
def test_entropy_grown_histogram_f16_ties():
    """§5.2: f16 KL is rounded to f16 and ties are common; first-minimum tie breaking."""
    rng = np.random.default_rng(3)
    cfg = _cfg("entropy", num_bins=128, num_quantized_bins=8)
    collects = [{"h": (rng.standard_normal(4000)).astype(f16)}, {"h": (rng.standard_normal(4000) * 3).astype(f16)}]
    assert _parity(cfg, collects).compared == ["h"]


@pytest.mark.parity
def test_entropy_worked_example_p_q():
    """§5.2: n=8, nq=4, hist [0,3,0,1,2,0,0,4]-like data; even-n asymmetric candidates."""
    x = np.array([-1.5, -1.5, -1.5, -0.25, 0.25, 0.25, 1.9, 1.9, 1.9, 2.0], f32)
    for nq in (2, 4, 5, 8):
        assert _parity(_cfg("entropy", num_bins=8, num_quantized_bins=nq), [{"x": x}]).compared == ["x"]


@pytest.mark.parity
def test_kl_spy_captures_ort_kl_vector():
    """Self-test of the near-tie machinery: the spy sees one KL vector per tensor, of length K."""
    rng = np.random.default_rng(4)
    cfg = _cfg("entropy", num_bins=129, num_quantized_bins=8)
    run = run_ort(cfg, [{"a": rng.standard_normal(100).astype(f32), "b": rng.standard_normal(50).astype(f16)}])
    assert run.error is None
    assert set(run.kl) == {"a", "b"}
    assert run.kl["a"].size == 129 // 2 - 8 // 2 + 1
    assert int(np.argmin(run.kl["a"])) in range(run.kl["a"].size)
    records: list = []
    with argmin_spy(records):
        pass
    assert np.argmin is not None and "spy" not in np.argmin.__name__  # restored


@pytest.mark.parity
def test_near_tie_checker_accepts_ties_and_rejects_real_differences():
    """Self-test of the KL near-tie rule used when entropy thresholds differ."""
    from support.parity import assert_entropy_threshold, entropy_candidates

    rng = np.random.default_rng(8)
    cfg = _cfg("entropy", num_bins=129, num_quantized_bins=8)
    run = run_ort(cfg, [{"a": rng.standard_normal(3000).astype(f32)}])
    hist_t, res, kl = run.collector.histogram_dict["a"], run.result["a"], run.kl["a"].copy()
    cands = entropy_candidates(hist_t, 8)
    j = int(np.argmin(kl))
    assert (cands[j][0], cands[j][1]) == (res[0], res[1])  # the candidate model matches ORT
    k = next(i for i, c in enumerate(cands) if c != cands[j])
    other = (cands[k][0], cands[k][1], res[2], res[3])
    # identical threshold: accepted, no near-tie
    assert assert_entropy_threshold("a", res, res, hist_t, kl, 8) is False
    # candidate k within 1 f32 ulp of the minimum: accepted as a near-tie
    tie = kl.copy()
    tie[k] = float(np.nextafter(f32(tie[j]), f32(np.inf)))
    assert assert_entropy_threshold("a", res, other, hist_t, tie, 8) is True
    # candidate k clearly worse: rejected
    far = kl.copy()
    far[k] = kl[j] * 1.01 + 1e-3
    with pytest.raises(AssertionError, match="not a near-tie"):
        assert_entropy_threshold("a", res, other, hist_t, far, 8)
    # a threshold that is no candidate at all: rejected
    with pytest.raises(AssertionError, match="not one of ORT's candidates"):
        assert_entropy_threshold("a", res, (f32(-123.0), f32(77.0), res[2], res[3]), hist_t, kl, 8)


# ----------------------------------------------------------------------------------------------
# Documented ORT crashes: histocal returns a result instead
# ----------------------------------------------------------------------------------------------


@pytest.mark.parity
@pytest.mark.parametrize("method", ["entropy", "percentile", "percentile-sym", "distribution"])
def test_deviation_ragged_batches(method):
    """§3.4: batches of different shapes (and empty + non-empty) in one list: ORT raises
    'inhomogeneous'; histocal equals ORT on the flattened concatenation."""
    sym = method == "percentile-sym"
    m = "percentile" if sym else method
    cfg = _cfg(m, symmetric=sym, num_bins=512, num_quantized_bins=8, percentile=99.9)
    rng = np.random.default_rng(6)
    for batches in (
        [rng.standard_normal((1, 3)).astype(f32), rng.standard_normal((1, 2)).astype(f32)],
        [rng.standard_normal((2, 3)).astype(f32), rng.standard_normal((3, 2)).astype(f32)],
        [np.zeros((0, 4), f32), rng.standard_normal((1, 4)).astype(f32)],
    ):
        # later |x| >= 3, above the first min|x|, so the |x| path drops nothing and compares exactly
        later = [
            np.copysign(3 + np.abs(rng.standard_normal(s)), rng.standard_normal(s)).astype(f32) for s in ((7, 5), (2,))
        ]
        collects = [{"r": batches}, {"r": later}]
        ort = run_ort(cfg, collects)
        assert ort.error is not None and "inhomogeneous" in str(ort.error)
        rep = _parity(cfg, collects)
        assert rep.compared == ["r"], rep  # flattened reference computed and compared exactly


@pytest.mark.parity
@pytest.mark.parametrize("method", ["percentile", "percentile-sym", "distribution"])
def test_deviation_f16_too_many_bins(method):
    """§4.3.6: f16 with 2048 bins raises 'Too many bins' in ORT; histocal returns a result."""
    sym = method == "percentile-sym"
    m = "percentile" if sym else method
    cfg = _cfg(m, symmetric=sym, num_bins=2048, percentile=99.999)
    x = (np.random.default_rng(7).standard_normal(3000) * 1.5).astype(f16)
    ort = run_ort(cfg, [{"h": x}])
    assert ort.error is not None and "Too many bins" in str(ort.error)
    rep = _parity(cfg, [{"h": x}, {"h": x * f16(2)}])
    assert rep.deviations == {"h": "too many bins"}


@pytest.mark.parity
def test_deviation_entropy_smoothing_assertion():
    """§5.2: ORT's smooth_distribution asserts (eps1 >= 1) on very sparse wide histograms."""
    x = np.zeros(1001, f32)
    x[-1] = 1
    cfg = _cfg("entropy", num_bins=20480, num_quantized_bins=20000)
    ort = run_ort(cfg, [{"s": x}])
    assert isinstance(ort.error, AssertionError) and "n_zeros=" in str(ort.error)
    rep = _parity(cfg, [{"s": x}])
    assert rep.deviations == {"s": "entropy smoothing"}
    # the histogram state is still compared exactly (ORT's collect succeeded)
    hc, _ = run_histocal(cfg, [{"s": x}])
    assert_hist_tuple_same(ort.collector.histogram_dict["s"], hc.histogram_dict["s"], "histogram_dict['s']")


@pytest.mark.parity
@pytest.mark.parametrize("method", ["entropy", "percentile", "percentile-sym", "distribution"])
@pytest.mark.parametrize("where", ["first", "later"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, "all-nan"])
def test_deviation_non_finite(method, where, bad):
    """§8: NaN/Inf data. Where ORT raises, histocal equals ORT on the finite values."""
    sym = method == "percentile-sym"
    m = "percentile" if sym else method
    cfg = _cfg(m, symmetric=sym, num_bins=512, num_quantized_bins=8, percentile=99.9)
    good = np.array([[0.5, -1.25, 2.0], [0.1, 0.0, -0.3]], f32)
    badarr = np.full((2, 2), np.nan, f32) if bad == "all-nan" else np.array([1.5, bad, -0.75], f32)
    collects = [{"n": badarr}, {"n": good}] if where == "first" else [{"n": good}, {"n": badarr}]
    rep = _parity(cfg, collects)
    assert set(rep.compared) | set(rep.deviations) == {"n"}


@pytest.mark.parity
def test_deviation_f16_abs_extension_overflows_f16_max():
    """An f16 |x| extension past 65504. ORT: 'arange: cannot compute length'.
    histocal must keep finite edges and never bin the later +inf."""
    cfg = _cfg("percentile", symmetric=True, num_bins=7, percentile=100.0)
    collects = [
        {"t": np.array([1, 60000], f16)},
        {"t": np.array([60030], f16)},
        {"t": np.array([np.inf, 2], f16)},
    ]
    ort = run_ort(cfg, collects[:2])
    assert ort.error is not None and "arange" in str(ort.error)
    rep = _parity(cfg, collects)  # checks: hist sum == 4 finite values, finite range
    assert "t" in rep.deviations
    hc, _ = run_histocal(cfg, collects)
    assert np.all(np.isfinite(hc.histogram_dict["t"][1].astype(np.float64))), hc.histogram_dict["t"][1]


@pytest.mark.parity
@pytest.mark.parametrize(
    "first,later",
    [
        ([0, 0.0003], [0.009895]),
        ([0, 1], [40.0]),  # the default 2048 bins: any later |x| > ~33 after a [0, 1] batch
        ([], [40.0]),  # an empty first batch gives edges over [0, 1]
        ([np.nan], [40.0]),  # so does an all-NaN one (histocal)
    ],
)
def test_deviation_f16_abs_extension_length_overflow(first, later):
    """An f16 |x| extension of more than 65504 bins (its length overflows
    f16). ORT: 'Maximum allowed size exceeded'; histocal returns a result."""
    cfg = _cfg("percentile", symmetric=True, num_bins=2048, percentile=99.9)
    collects = [{"x": np.array(first, f16)}, {"x": np.array(later, f16)}]
    ort = run_ort(cfg, collects if first != [np.nan] else [{"x": np.zeros(0, f16)}, collects[1]])
    assert ort.error is not None and "Maximum allowed size exceeded" in str(ort.error)
    rep = _parity(cfg, collects)
    assert "x" in rep.deviations


@pytest.mark.parity
def test_deviation_f16_all_nan_first_then_extension_overflow_with_few_bins():
    """A random run: histocal starts an all-NaN first collect like an empty one ([0, 1], 7 bins);
    ORT cannot extend that in float16 ('Maximum allowed size exceeded'), while the variant that
    skips the all-NaN collect ([9056, 13032] in 7 bins) is no reference for histocal."""
    cfg = _cfg("percentile", symmetric=True, num_bins=7, percentile=99.9)
    collects = [{"x": np.array(np.nan, f16)}, {}, {"x": np.array([-1.303e04, 9.056e03], f16)}]
    assert check_parity(cfg, collects).deviations == {"x": "non-finite data"}
    hc, _ = run_histocal(cfg, collects)
    assert hc.histogram_dict["x"][1][0] == 0 and hc.histogram_dict["x"][0].sum() == 2


# ----------------------------------------------------------------------------------------------
# float16 |x| extensions past 65504: ORT's edges end in +inf ("open top") and ORT carries on
# ----------------------------------------------------------------------------------------------


def _open_top(hist_t) -> bool:
    return bool(np.isposinf(hist_t[1][-1]))


@pytest.mark.parity
def test_f16_abs_extension_past_f16_max_keeps_orts_infinite_edges():
    """Regression (hypothesis, thorough profile): numpy's f64 arange carries the f16 extension
    edges past 65504 and ORT stores them as float16 +inf, without raising. histocal used to
    widen to float32 (32999 bins instead of 33000, an f32 result); it must hold ORT's state."""
    cfg = _cfg("percentile", symmetric=True, num_bins=1000, num_quantized_bins=128, percentile=99.9)
    collects = [{"x": np.array([0, 1664], f16)}, {"x": np.array([-54900], f16)}]
    ort = run_ort(cfg, collects)
    assert ort.error is None and _open_top(ort.collector.histogram_dict["x"])
    rep = check_parity(cfg, collects)
    assert rep.compared == ["x"] and not rep.deviations and not rep.fallback, rep
    hc, res = run_histocal(cfg, collects)
    assert hc.histogram_dict["x"][1].dtype == f16 and res["x"][0].dtype == f16


@pytest.mark.parity
def test_f16_open_top_bins_later_infinities_like_ort():
    """Once the top is open, `amax > edges[-1]` never holds: no further extension, a later
    ±inf is binned in the last bin [inf, inf] and enters nanmin/nanmax (ORT raises on a later
    inf only below a finite top). Values at the last finite edge and at 65504 land in the bin
    [last finite edge, inf); NaN is ignored; infinities alone, in lists, at p=100 and p=50."""
    cfg = _cfg("percentile", symmetric=True, num_bins=1000, percentile=99.9)
    head = [{"x": np.array([0, 1664], f16)}, {"x": np.array([-54900], f16)}]
    ort = run_ort(cfg, head, compute=False)
    edges = ort.collector.histogram_dict["x"][1]
    last_finite = edges[np.isfinite(edges)][-1]
    tails = [
        [{"x": np.array([65504, -last_finite, 7, np.nan], f16)}],
        [{"x": np.array([np.inf, 3, -65504, 65000], f16)}, {"x": np.array([-np.inf, np.nan], f16)}],
        [{"x": np.full(20, np.inf, f16)}],
        [{"x": [np.array([np.inf, 1], f16), np.array([2, -np.inf], f16)]}, {"x": np.array([1e4], f16)}],
    ]
    for tail in tails:
        for p in (50.0, 99.9, 100.0):
            c = dict(cfg, percentile=p)
            ort = run_ort(c, head + tail)
            assert ort.error is None, ort.error
            rep = check_parity(c, head + tail)
            assert rep.compared == ["x"] and not rep.deviations, (tail, p, rep)
            n_inf = sum(
                int(np.isinf(b).sum()) for t in tail for b in (t["x"] if isinstance(t["x"], list) else [t["x"]])
            )
            assert ort.infs_binned.get("x", 0) == n_inf  # ORT binned every later infinity


@pytest.mark.parity
def test_f16_open_top_fallback_keeps_infinities():
    """A ragged list after the top opened: ORT raises ('inhomogeneous'); the reference on the
    flattened values keeps the ±inf ORT accepts with an open top, and histocal equals it."""
    cfg = _cfg("percentile", symmetric=True, num_bins=1000, percentile=100.0)
    collects = [
        {"x": np.array([0, 1664], f16)},
        {"x": np.array([-54900], f16)},
        {"x": [np.array([np.inf, 1, 5], f16), np.array([2, -np.inf], f16)]},
    ]
    rep = check_parity(cfg, collects)
    assert rep.compared == ["x"] and "x" in rep.fallback, rep
    hc, res = run_histocal(cfg, collects)
    assert hc.histogram_dict["x"][0][-1] == 2 and np.isposinf(res["x"][1])


@pytest.mark.parity
def test_f16_edges_diverge_after_dropped_values():
    """A random run: ORT's f16 extension to 65000 falls short (it drops the value), histocal's
    extra bins keep it; from there their edges differ. ORT's next extension opens its top, while
    histocal's own edges later fail in f16 and widen to f32. A dropped-values deviation: every
    finite value held, min/max equal as f16 values; a later inf is binned by ORT only."""
    cfg = _cfg("percentile", symmetric=True, num_bins=512, percentile=99.9)
    collects = [{"x": np.array([0, 27970], f16)}] + [{"x": np.array([v], f16)} for v in (65000, 65000, 65472)]
    ort = run_ort(cfg, collects, compute=False)
    assert ort.error is None and _open_top(ort.collector.histogram_dict["x"])
    hc, _ = run_histocal(cfg, collects)
    assert hc.histogram_dict["x"][1].dtype == f32
    for tail in ([], [{"x": np.array([np.inf, 3], f16)}]):
        rep = check_parity(cfg, collects + tail)
        assert rep.deviations == {"x": "symmetric percentile dropped values"}, rep


# Scales near and past f16's largest value (65504), and small ones (values below min|x|).
# The largest ones most often carry the f64 extension edges past 65504.
_F16_BIG = (
    [65504.0] * 3 + [65472.0] * 2 + [65440.0, 65000.0, 64000.0, 60000.0, 54900.0, 50000.0, 40000.0, 32768.0, 20000.0]
)
_F16_FIRST = [1.0, 10.0, 100.0, 1000.0, 1664.0, 5000.0, 20000.0, 40000.0, 60000.0, 65504.0]


@st.composite
def _f16_values(draw, hi, n_max=6):
    n = draw(st.integers(1, n_max))
    xs = draw(st.lists(st.floats(0, hi, width=16), min_size=n, max_size=n))
    signs = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return [(-x if s else x) for x, s in zip(xs, signs)]


@st.composite
def _f16_later_collect(draw, first_max, kinds=("big", "big", "big", "random", "small", "inf", "nan", "list")):
    kind = draw(st.sampled_from(kinds))
    vals = [draw(st.sampled_from(_F16_BIG)) * draw(st.sampled_from([1, -1]))]
    if kind in ("big", "list"):
        vals += draw(_f16_values(65504.0, 3))
    elif kind == "random":
        vals = draw(_f16_values(65504.0))
    elif kind == "small":  # below the first collect's min|x|: dropped by ORT, kept by histocal
        vals += draw(_f16_values(float(f16(max(first_max / 100, 1e-3))), 3))
    elif kind == "inf":
        vals += [draw(st.sampled_from([np.inf, -np.inf]))]
    elif kind == "nan":
        vals += [np.nan]
    draw(st.randoms()).shuffle(vals)
    a = np.array(vals, f16)
    if kind == "list" and a.size >= 2:
        k = a.size // 2
        return [a[:k], a[k : 2 * k]] if draw(st.booleans()) else [a[:k], a[k:]]  # same shapes or ragged
    return a


@st.composite
def _f16_overflow_cases(draw):
    nb = draw(st.sampled_from([7, 8, 100, 128, 129, 512, 512, 1000, 1000, 1024]))
    p = draw(st.sampled_from([0.0, 50.0, 99.0, 99.9, 99.999, 100.0]))
    if draw(st.integers(0, 3)) == 0:
        first_max = draw(st.sampled_from(_F16_FIRST))
    else:  # bins about 1 to 40 wide: the extensions that reach 65504 without overflowing arange
        first_max = float(
            f16(min(65504.0, nb * draw(st.sampled_from([1.0, 1.3, 1.664, 2.5, 3.0, 5.0, 10.0, 17.0, 40.0]))))
        )
    below = draw(_f16_values(first_max)) if draw(st.booleans()) else [0.0]
    first = np.array([*below, first_max * draw(st.sampled_from([1, -1]))], f16)
    # The first later collect extends towards 65504; the others may follow an open top.
    later = [draw(_f16_later_collect(first_max, ("big",))), *draw(st.lists(_f16_later_collect(first_max), max_size=3))]
    return _cfg("percentile", symmetric=True, num_bins=nb, percentile=p), [{"x": first}] + [{"x": v} for v in later]


@pytest.mark.parity
@settings(max_examples=examples(300))
@given(case=_f16_overflow_cases())
def test_f16_abs_extensions_near_f16_max_match_ort(case):
    """float16 |x| histograms extended up to and past 65504, against ORT itself: where ORT's
    edges end in +inf, histocal must hold the identical state and result; where ORT raises
    (arange's start, stop or length overflow f16, a later +inf below a finite top), histocal's
    documented widening applies."""
    cfg, collects = case
    note(f"cfg={cfg}\n{_describe(collects)}\n{collects}")
    ort = run_ort(cfg, collects, compute=False)
    if ort.error is None:
        event(f"ORT collects, open top: {_open_top(ort.collector.histogram_dict['x'])}")
    else:
        event(f"ORT raises: {type(ort.error).__name__}: {str(ort.error)[:40]}")
    report = check_parity(cfg, collects)
    for reason in report.deviations.values():
        event(f"deviation: {reason}")
    for reason in report.fallback.values():
        event(f"fallback: {reason}")
    if ort.error is None and "x" in report.compared:
        hc, _ = run_histocal(cfg, collects)
        assert _open_top(hc.histogram_dict["x"]) == _open_top(ort.collector.histogram_dict["x"])


# ----------------------------------------------------------------------------------------------
# Histograms beyond MAX_BINS: histocal's clear error, and no unbounded allocation anywhere
# ----------------------------------------------------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from support.parity import (  # noqa: E402
    OrtNotRun,
    classify_ort_error,
    histocal_bins_needed,
    ort_bins_needed,
    run_histocal_or_too_many_bins,
)


def _in_bounded_subprocess(body: str, headroom: int = 1 << 30) -> subprocess.CompletedProcess:
    """Run ``body`` (with parity's names imported) in a fresh interpreter whose address space
    may grow by only ``headroom`` bytes: an unbounded allocation there fails that process (a Rust
    allocation failure aborts it), not the test session or the machine."""
    tests = Path(__file__).parents[1]
    code = (
        f"import sys; sys.path.insert(0, {str(tests)!r})\n"
        "import numpy as np\nfrom support.parity import *\nimport histocal\n"
        f"with bounded_address_space({headroom}):\n" + "".join(f"    {line}\n" for line in body.strip().splitlines())
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


# The random run that used up 24 GB, shrunk: an all-NaN first collect gives the |x| histogram
# numpy's empty-range edges [0, 1] (2048 bins of 1/2048); |x| = 63439 later needs ORT's
# np.arange extension by that width: ~130M bins.
ABS_ALL_NAN_THEN_HUGE_CFG = _cfg("percentile", symmetric=True, num_bins=2048, percentile=0.0)
ABS_ALL_NAN_THEN_HUGE = [
    {"t0": np.array(np.nan, f32)},
    {},
    {},
    {},
    {"t0": [np.array(63439.316, f32), np.array(np.nan, f32), np.array(-0.4546708, f32)]},
]


@pytest.mark.parity
def test_abs_path_all_nan_first_then_huge_is_clear_too_many_bins_error():
    cfg, collects = ABS_ALL_NAN_THEN_HUGE_CFG, ABS_ALL_NAN_THEN_HUGE
    assert ort_bins_needed(cfg, collects, "t0") > 100_000_000
    import histocal

    hc = histocal.HistogramCollector(**cfg)
    hc.collect(collects[0])
    with pytest.raises(
        ValueError, match=r'^tensor "t0": Too many bins for data range\. Cannot create 16777216 finite-sized bins\.$'
    ):
        for c in collects[1:]:
            hc.collect(c)
    # ORT is never run on it, neither the collects nor a finite-value fallback of them.
    ort = run_ort(cfg, collects)
    assert isinstance(ort.error, OrtNotRun) and classify_ort_error(ort.error) == "too many bins"
    assert isinstance(run_ort(cfg, [{"t0": np.zeros(0, f32)}, collects[-1]]).error, OrtNotRun)
    _, _, refused = run_histocal_or_too_many_bins(cfg, collects)
    assert list(refused) == ["t0"]
    assert check_parity(cfg, collects).deviations == {"t0": "too many bins"}
    # With another tensor alongside, that one is still compared exactly.
    other = [{**c, "ok": np.array([0.5, -2.0, 1.5], f32)} for c in collects]
    rep = check_parity(cfg, other)
    assert rep.deviations == {"t0": "too many bins"} and rep.compared == ["ok"]


@pytest.mark.subprocess
@pytest.mark.parametrize("first", ["empty", "all-nan"])
def test_abs_path_too_many_bins_allocates_boundedly(first):
    """The whole check (histocal, ORT references, fallbacks) within 1 GB of address space."""
    first_value = "np.zeros(0, np.float32)" if first == "empty" else "np.full(3, np.nan, np.float32)"
    r = _in_bounded_subprocess(f"""
cfg = dict(method='percentile', symmetric=True, num_bins=2048, num_quantized_bins=128, percentile=0.0, scenario='same')
collects = [{{'t0': {first_value}}}, {{'t0': np.array([63439.316, 1e7, -0.45], np.float32)}}]
assert check_parity(cfg, collects).deviations == {{'t0': 'too many bins'}}
""")
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parity
@pytest.mark.parametrize("method", ["entropy", "percentile", "distribution"])
@pytest.mark.parametrize("first", ["empty", "all-nan"])
def test_value_path_empty_or_all_nan_first_then_huge_does_not_grow(method, first):
    """The value-path analogue: a first threshold of 0 is re-binned over the later (-t, t) with
    the same number of bins (ORT's rule for an all-zero histogram, docs/ort_parity.md
    *Histograms*), so huge later values cost nothing."""
    nb = 8 if method == "entropy" else 2048
    cfg = _cfg(method, num_bins=nb, num_quantized_bins=4, percentile=99.9)
    head = np.zeros(0, f32) if first == "empty" else np.full(3, np.nan, f32)
    collects = [{"v": head}, {"v": np.array([63439.316, -1e7, 0.25], f32)}, {"v": np.array([5e6, -2.0], f32)}]
    assert ort_bins_needed(cfg, collects, "v") == nb
    rep = check_parity(cfg, collects)
    assert rep.compared == ["v"], rep
    hc, _ = run_histocal(cfg, collects)
    assert hc.histogram_dict["v"][0].size == nb


@pytest.mark.parity
@pytest.mark.subprocess
def test_value_path_growth_beyond_max_bins_is_clear_error():
    """Value path: a tiny first max|x| then a huge one grows ORT's histogram by
    2 * (t - old_t) / stride bins (here ~2e9). ORT is not run; histocal must raise its
    "Too many bins" error naming the tensor within bounded memory."""
    cfg = _cfg("percentile", num_bins=2048, percentile=99.9)
    collects = [{"v": np.array([1e-3], f32)}, {"v": np.array([1e3], f32)}]
    assert ort_bins_needed(cfg, collects, "v") > 1_000_000_000
    assert isinstance(run_ort(cfg, collects).error, OrtNotRun)
    r = _in_bounded_subprocess("""
cfg = dict(method='percentile', symmetric=False, num_bins=2048, num_quantized_bins=128, percentile=99.9, scenario='same')
hc = histocal.HistogramCollector(**cfg)
hc.collect({'v': np.array([1e-3], np.float32)})
try:
    hc.collect({'v': np.array([1e3], np.float32)})
except ValueError as e:
    assert str(e).startswith('tensor "v": Too many bins'), e
else:
    raise AssertionError('no error')
""")
    assert r.returncode == 0, r.stderr[-3000:]


def test_histocal_too_many_bins_is_accepted_only_beyond_max_bins(monkeypatch):
    """Self-test: a "Too many bins" error from histocal for a tensor ORT's rules can hold in
    MAX_BINS bins is a failure, not a deviation."""
    from support import parity

    def refuse(cfg, collects):
        raise ValueError('tensor "x": Too many bins for data range. Cannot create 16777216 finite-sized bins.')

    monkeypatch.setattr(parity, "run_histocal", refuse)
    cfg = _cfg("percentile", symmetric=True, num_bins=8, percentile=99.9)
    with pytest.raises(AssertionError, match="its own rules need only 8 bins"):
        run_histocal_or_too_many_bins(cfg, [{"x": np.array([1, 2], f32)}])


@pytest.mark.parity
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_ort_bins_needed_matches_ort(method, dtype, sym):
    """The bins guard predicts ORT's real histogram sizes exactly on growing data."""
    if method == "entropy" and sym:
        return  # same value path as non-symmetric
    rng = np.random.default_rng(9)
    cfg = _cfg(method, symmetric=sym, num_bins=129 if method == "entropy" else 512, num_quantized_bins=8)
    compared = 0
    for _ in range(100):
        collects = [
            {"g": (rng.standard_normal(int(rng.integers(2, 50))) * 10.0 ** rng.uniform(-2, 2) * k).astype(dtype)}
            for k in (1, rng.uniform(1, 6), rng.uniform(1, 20))
        ]
        ort = run_ort(cfg, collects, compute=False)
        if ort.error is not None:  # f16 "Too many bins" and the like
            continue
        actual = ort.collector.histogram_dict["g"][0].size
        assert ort_bins_needed(cfg, collects, "g") == actual, (collects, actual)
        compared += actual > cfg["num_bins"]
    assert compared >= 5  # histograms that really grew


# histocal keeps every finite value ORT's |x| merge drops (docs/deviations.md), so near
# MAX_BINS its histogram needs more bins than ORT's. [1, 1] in 512 bins: edges [0.5, 1.5], width
# 1/512. A later [32768, 0]: ORT extends to 32767.998 in 16776959 bins and drops both values;
# histocal adds 1 bin above and 256 below, MAX_BINS bins in all.
NEAR_CAP_CFG = _cfg("percentile", symmetric=True, num_bins=512, percentile=99.999)


@pytest.mark.parity
@pytest.mark.parametrize("dtype", [f16, f32])
def test_kept_values_may_fill_max_bins_exactly(dtype):
    """The derandomized CI profile's failing example: histocal refused, counting edges, not bins."""
    collects = [{"x": np.array([1, 1], dtype)}, {"x": np.array([32768, 0], dtype)}]
    assert ort_bins_needed(NEAR_CAP_CFG, collects, "x") == MAX_BINS - 257
    assert histocal_bins_needed(NEAR_CAP_CFG, collects, "x") == MAX_BINS
    # float32: ORT computes, dropping both later values; float16: ORT's arange overflows.
    reason = "symmetric percentile dropped values" if dtype == f32 else "|x| extension overflow (later +inf or float16)"
    assert check_parity(NEAR_CAP_CFG, collects).deviations == {"x": reason}
    hc, _ = run_histocal(NEAR_CAP_CFG, collects)
    hist = hc.histogram_dict["x"][0]
    assert hist.size == MAX_BINS and hist.sum() == 4


@pytest.mark.parity
def test_kept_values_beyond_max_bins_are_refused_where_ort_computes():
    """One float32 step higher, histocal's rules need more than MAX_BINS bins and it refuses;
    ORT fits in fewer by dropping the 0."""
    collects = [{"x": np.array([1, 1], f32)}, {"x": np.array([32768.004, 0], f32)}]
    assert ort_bins_needed(NEAR_CAP_CFG, collects, "x") <= MAX_BINS < histocal_bins_needed(NEAR_CAP_CFG, collects, "x")
    ort = run_ort(NEAR_CAP_CFG, collects, compute=False)
    assert ort.error is None and ort.collector.histogram_dict["x"][0].sum() == 3  # the 0 is dropped
    with pytest.raises(ValueError, match=r'^tensor "x": Too many bins for data range\.'):
        run_histocal(NEAR_CAP_CFG, collects)
    assert check_parity(NEAR_CAP_CFG, collects).deviations == {"x": "too many bins"}


@pytest.mark.parity
def test_abs_path_chain_of_extensions_stops_at_max_bins():
    """Each |x| extension within numpy's and histocal's per-step limits, together beyond
    MAX_BINS: histocal refuses the collect that passes the cap (it used to grow without bound)
    and keeps what it had."""
    import histocal

    collects = [{"x": np.array([1, 1], f32)}, {"x": np.array([20000], f32)}, {"x": np.array([40000], f32)}]
    assert ort_bins_needed(NEAR_CAP_CFG, collects, "x") > MAX_BINS
    hc = histocal.HistogramCollector(**NEAR_CAP_CFG)
    for c in collects[:2]:
        hc.collect(c)
    before = hc.histogram_dict["x"]
    assert before[0].size == 10239744
    with pytest.raises(ValueError, match=r'^tensor "x": Too many bins for data range\.'):
        hc.collect(collects[2])
    assert_hist_tuple_same(before, hc.histogram_dict["x"], "after the refused collect")
    assert check_parity(NEAR_CAP_CFG, collects).deviations == {"x": "too many bins"}


@pytest.mark.parametrize("dtype", [f32, f16])
def test_histocal_bins_needed_matches_histocal(dtype):
    """The refusal guard predicts histocal's real |x| histogram sizes exactly, on growing data
    whose small values ORT drops (histocal adds bins below for them)."""
    import histocal

    rng = np.random.default_rng(11)
    cfg = _cfg("percentile", symmetric=True, num_bins=512)
    below = refused = 0
    for _ in range(100):
        collects = [
            {"g": (rng.standard_normal(int(rng.integers(2, 50))) * 10.0 ** rng.uniform(-2, 2) * k).astype(dtype)}
            for k in (1, rng.uniform(0.5, 6), rng.uniform(0.5, 20))
        ]
        hc = histocal.HistogramCollector(**cfg)
        needed = histocal_bins_needed(cfg, collects, "g")
        try:
            for c in collects:
                hc.collect(c)
        except ValueError as err:
            assert "Too many bins" in str(err) and needed > MAX_BINS, (collects, needed)
            refused += 1
            continue
        actual = hc.histogram_dict["g"][0].size
        assert needed == actual, (collects, actual)
        below += actual != ort_bins_needed(cfg, collects, "g")
    assert below >= 20 and refused >= 1  # histograms with bins ORT does not have; beyond the cap
