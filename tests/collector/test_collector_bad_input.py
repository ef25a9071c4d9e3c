"""histocal.HistogramCollector on bad or unusual input: clear errors where the input is wrong,
and well-defined results where ORT would crash (non-finite data, empty and all-NaN tensors,
float16 with 2048 bins), plus layout independence and thread-count determinism."""

from __future__ import annotations

import numpy as np
import pytest
from support.parity import (
    assert_counts,
    assert_hist_tuple_same,
    assert_result_same,
    assert_same,
    check_parity,
    quiet,
    result_range,
    run_histocal,
    run_ort,
)

f32, f16 = np.float32, np.float16

CFGS = {
    "entropy": dict(
        method="entropy", symmetric=False, num_bins=128, num_quantized_bins=8, percentile=99.999, scenario="same"
    ),
    "percentile": dict(
        method="percentile", symmetric=False, num_bins=1000, num_quantized_bins=128, percentile=99.9, scenario="same"
    ),
    "percentile-sym": dict(
        method="percentile", symmetric=True, num_bins=1000, num_quantized_bins=128, percentile=99.9, scenario="same"
    ),
    "distribution": dict(
        method="distribution", symmetric=False, num_bins=512, num_quantized_bins=128, percentile=99.999, scenario="same"
    ),
    "distribution-p3": dict(
        method="distribution", symmetric=False, num_bins=1000, num_quantized_bins=128, percentile=99.999, scenario="p3"
    ),
}
ALL = sorted(CFGS)


def _cfg(key, **kw):
    return {**CFGS[key], **kw}


def _histocal():
    import histocal

    return histocal


def _new(cfg):
    return _histocal().HistogramCollector(**cfg)


def _raises_somewhere(exc, cfg, collects=({"t": np.arange(4, dtype=f32)},)):  # noqa: B008 - read only
    """The error may come from the constructor, collect() or compute_collection_result()."""
    with pytest.raises(exc) as info, quiet():
        hc = _new(cfg)
        for c in collects:
            hc.collect(c)
        hc.compute_collection_result()
    return info


def _compare_with_ort(cfg, ours_collects, ort_collects):
    """histocal on ``ours_collects`` must equal ORT on ``ort_collects`` exactly (all fields)."""
    ref = run_ort(cfg, ort_collects)
    assert ref.error is None, f"ORT reference failed: {ref.error!r}"
    hc, ours = run_histocal(cfg, ours_collects)
    assert set(hc.histogram_dict) == set(ref.collector.histogram_dict)
    assert set(ours) == set(ref.result)
    is_abs = cfg["method"] == "percentile" and cfg["symmetric"]
    for name, ort_t in ref.collector.histogram_dict.items():
        finite = sum(int(np.isfinite(b).sum()) for c in ours_collects if name in c for b in _batches(c[name]))
        ours_t = hc.histogram_dict[name]
        if is_abs and int(ort_t[0].sum()) != finite:
            # Deviation (2): ORT's |x| merge dropped values; histocal keeps every finite value.
            assert int(ours_t[0].sum()) == finite, f"{name}: histocal holds {int(ours_t[0].sum())} of {finite} values"
            assert_same(ort_t[2], ours_t[2], f"{name}.min", zero_sign=True)
            assert_same(ort_t[3], ours_t[3], f"{name}.max", zero_sign=True)
            continue
        assert_hist_tuple_same(ort_t, ours_t, f"histogram_dict[{name!r}]")
        assert_result_same(cfg, name, ref.result[name], ours[name], ort_t, ref.kl.get(name))
    return hc, ours


def _batches(v):
    return v if isinstance(v, list) else [v]


# ----------------------------------------------------------------------------------------------
# Wrong input types and settings
# ----------------------------------------------------------------------------------------------

BAD_ARRAYS = {
    "int32": np.arange(6, dtype=np.int32).reshape(2, 3),
    "int64": np.arange(3, dtype=np.int64),
    "uint8": np.arange(3, dtype=np.uint8),
    "bool": np.array([True, False, True]),
    "object": np.array([1.0, "x", None], dtype=object),
    "object-floats": np.array([1.0, 2.0], dtype=object),
    "complex64": np.array([1 + 2j, 3], dtype=np.complex64),
    "complex128": np.array([1 + 2j, 3], dtype=np.complex128),
}


@pytest.mark.parametrize("key", ALL)
@pytest.mark.parametrize("kind", sorted(BAD_ARRAYS))
@pytest.mark.parametrize("as_list", [False, True])
def test_non_float_data_is_type_error_naming_tensor(key, kind, as_list):
    hc = _new(_cfg(key))
    bad = BAD_ARRAYS[kind]
    value = [np.ones(bad.shape, f32), bad] if as_list else bad
    name = "layer3/Conv_out:0"
    with pytest.raises(TypeError) as info, quiet():
        hc.collect({"fine": np.arange(3, dtype=f32), name: value})
    assert name in str(info.value), f"message does not name the tensor: {info.value}"
    # The collector stays usable and the bad tensor has no state.
    assert name not in hc.histogram_dict
    with quiet():
        hc.collect({"fine": np.arange(3, dtype=f32)})
        res = hc.compute_collection_result()
    assert name not in res and "fine" in res


@pytest.mark.parametrize("key", ALL)
@pytest.mark.parametrize("num_bins", [0, -1, -2048])
def test_num_bins_below_one_is_value_error(key, num_bins):
    _raises_somewhere(ValueError, _cfg(key, num_bins=num_bins))


@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("p", [-1.0, -1e-9, 100.000001, 101.0, 1e9])
def test_percentile_out_of_range_is_value_error(sym, p):
    _raises_somewhere(ValueError, _cfg("percentile", symmetric=sym, percentile=p))


@pytest.mark.parity
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("p", [0.0, 100.0, 0, 100])
def test_percentile_bounds_are_valid(sym, p):
    cfg = _cfg("percentile", symmetric=sym, percentile=p)
    _compare_with_ort(cfg, [{"t": np.arange(-5, 7, dtype=f32)}], [{"t": np.arange(-5, 7, dtype=f32)}])


@pytest.mark.parity
@pytest.mark.parametrize("num_bins,nq", [(127, 128), (126, 128), (100, 128), (7, 8), (1, 4)])
def test_entropy_fewer_bins_than_quantized_bins_is_clear_value_error(num_bins, nq):
    cfg = _cfg("entropy", num_bins=num_bins, num_quantized_bins=nq)
    # ORT fails here with a cryptic numpy error (or not at all for some odd sizes).
    ort = run_ort(cfg, [{"t": np.arange(-5, 7, dtype=f32)}])
    if ort.error is not None:
        assert isinstance(ort.error, ValueError)
    info = _raises_somewhere(ValueError, cfg)
    msg = str(info.value)
    assert "argmin of an empty sequence" not in msg and "negative dimensions" not in msg, msg
    assert "num_quantized_bins" in msg or "quantized" in msg, f"message does not explain the problem: {msg}"


@pytest.mark.parametrize("method", ["minmax", "Entropy", "kl", "", "percentiles"])
def test_unknown_method_is_value_error(method):
    _raises_somewhere(ValueError, _cfg("entropy", method=method))


# ----------------------------------------------------------------------------------------------
# Non-finite, empty and all-NaN data
# ----------------------------------------------------------------------------------------------


def _finite_only(collects):
    out = []
    for c in collects:
        d = {}
        for name, v in c.items():
            bs = v if isinstance(v, list) else [v]
            flat = np.concatenate([b.ravel() for b in bs])
            d[name] = flat[np.isfinite(flat)]
        out.append(d)
    return out


NONFINITE_CASES = {
    "nan-first": [[1.5, np.nan, -0.75, 0.25], [0.5, -1.25, 2.0]],
    "nan-later": [[0.5, -1.25, 2.0], [1.5, np.nan, -0.75, np.nan, 3.5]],
    "posinf-first": [[1.5, np.inf, -0.75, 0.25], [0.5, -1.25, 2.0]],
    "posinf-later": [[0.5, -1.25, 2.0], [1.5, np.inf, -0.75, 4.5]],
    "neginf-first": [[1.5, -np.inf, -0.75, 0.25], [0.5, -1.25, 2.0]],
    "neginf-later": [[0.5, -1.25, 2.0], [1.5, -np.inf, -0.75, -4.5]],
    "all-kinds": [[np.nan, 1.0, np.inf, -np.inf, -3.0, 0.25], [np.inf, 2.5, np.nan], [-np.inf, -0.5, 0.5, 7.0]],
}


@pytest.mark.parity
@pytest.mark.parametrize("key", ALL)
@pytest.mark.parametrize("case", sorted(NONFINITE_CASES))
@pytest.mark.parametrize("dtype", [f32, f16])
def test_non_finite_values_are_counted_and_excluded(key, case, dtype):
    """The result equals ORT's on the finite values (where ORT mostly crashes), and ``counts``
    reports the NaN/+Inf/-Inf values."""
    cfg = _cfg(key)
    if dtype == f16 and cfg["num_bins"] > 512:
        cfg = _cfg(key, num_bins=512)  # keep ORT's f16 reference away from "Too many bins"
    seqs = NONFINITE_CASES[case]
    # ORT's |x| path drops later values below the first min|x|: later |x| stay above it here.
    collects = [{"t": np.array(s, dtype), "u": [np.array(s, dtype), np.array(s[::-1], dtype)]} for s in seqs]
    hc, _ = _compare_with_ort(cfg, collects, _finite_only(collects))
    assert_counts(hc, collects)
    counts = hc.counts["t"]
    flat = np.concatenate([np.array(s, dtype) for s in seqs])
    assert counts.nan == int(np.isnan(flat).sum()) and counts.posinf == int(np.isposinf(flat).sum())
    assert counts.neginf == int(np.isneginf(flat).sum()) and counts.finite == int(np.isfinite(flat).sum())
    assert counts.batches == len(seqs) and hc.counts["u"].batches == 2 * len(seqs)
    for attr in ("finite", "nan", "posinf", "neginf", "batches"):
        assert isinstance(getattr(counts, attr), int), attr


@pytest.mark.parity
@pytest.mark.parametrize("key", ALL)
@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize("shape", [(0,), (3, 0), (2, 2)])
def test_all_nan_and_empty_tensors_give_ort_empty_result(key, dtype, shape):
    """An empty tensor gives exactly ORT's result for empty data; an all-NaN tensor gives the
    same (ORT raises on it). No exception, no warning turned error."""
    cfg = _cfg(key)
    empty = np.zeros((0,), dtype)
    data = np.full(shape, np.nan, dtype)
    hc, _ours = _compare_with_ort(cfg, [{"n": data, "e": empty}], [{"n": empty, "e": empty}])
    c = hc.counts["n"]
    assert (c.finite, c.nan, c.posinf, c.neginf, c.batches) == (0, data.size, 0, 0, 1)
    c = hc.counts["e"]
    assert (c.finite, c.nan, c.posinf, c.neginf, c.batches) == (0, 0, 0, 0, 1)


@pytest.mark.parametrize("key", ALL)
def test_all_nan_tensor_as_list_and_repeated(key):
    cfg = _cfg(key)
    nan = np.full((2, 3), np.nan, f32)
    hc, res = run_histocal(cfg, [{"n": [nan, nan]}, {"n": nan}])
    assert hc.counts["n"].nan == 18 and hc.counts["n"].batches == 3
    assert "n" in res


@pytest.mark.parity
@pytest.mark.parametrize("key", ["percentile", "percentile-sym", "distribution", "distribution-p3", "entropy"])
@pytest.mark.parametrize("scale", [1.5, 0.37, 3.7, 1000.0])
def test_float16_with_2048_bins_works(key, scale):
    """ORT raises "Too many bins ... 2048" for most float16 ranges; histocal returns a result."""
    cfg = _cfg(key, num_bins=2048)
    rng = np.random.default_rng(11)
    batches = [(rng.standard_normal((64, 32)) * scale).astype(f16) for _ in range(3)]
    collects = [{"h": batches[0]}, {"h": [batches[1], batches[2]]}]
    ort = run_ort(cfg, collects)
    if ort.error is None:  # a lucky range (ORT can do it): must then be identical
        check_parity(cfg, collects)
        return
    assert "Too many bins" in str(ort.error), ort.error
    hc, res = run_histocal(cfg, collects)
    data = np.concatenate([b.ravel() for b in batches]).astype(np.float64)
    hist, edges = hc.histogram_dict["h"][:2]
    assert int(hist.sum()) == data.size
    assert np.all(np.diff(edges.astype(np.float64)) > 0), "edges must increase"
    if cfg["method"] == "percentile" and cfg["symmetric"]:
        assert edges[0] <= np.abs(data).min() and edges[-1] >= np.abs(data).max()
    else:
        assert edges[0] <= data.min() and edges[-1] >= data.max()
    lo, hi = result_range(cfg["method"], res["h"])
    assert np.isfinite(lo) and np.isfinite(hi)
    if cfg["method"] == "distribution":
        assert np.isfinite(res["h"].avg) and np.isfinite(res["h"].std)
    if cfg["method"] == "entropy":
        return  # the KL minimum is not stable under re-binning; no closeness check
    # The thresholds are near ORT's on the same values in float32 (within two bins' width).
    ref = run_ort(cfg, [{"h": batches[0].astype(f32)}, {"h": [batches[1].astype(f32), batches[2].astype(f32)]}])
    assert ref.error is None
    rlo, rhi = result_range(cfg["method"], ref.result["h"])
    width = 2 * float(np.max(np.diff(edges.astype(np.float64))))
    assert abs(float(lo) - float(rlo)) <= width + 1e-3 * abs(float(rlo)), (lo, rlo)
    assert abs(float(hi) - float(rhi)) <= width + 1e-3 * abs(float(rhi)), (hi, rhi)


# ----------------------------------------------------------------------------------------------
# Memory layout
# ----------------------------------------------------------------------------------------------


def _layouts(rng, dtype, scale):
    base = (rng.standard_normal((33, 17)) * scale).astype(dtype)
    big = (rng.standard_normal((40, 30, 6)) * scale / 3).astype(dtype)
    return {
        "transposed": base.T,
        "negative-strides": base[::-1, ::-1],
        "every-other": np.ascontiguousarray(np.repeat(base, 2, axis=1))[:, ::2],
        "every-other-3d": big[::2, 1::3, ::-2],
        "fortran": np.asfortranarray(base),
        "column": base[:, 3],
        "broadcast": np.broadcast_to(base[0], (5, 17)),
        "big-endian": base.astype(base.dtype.newbyteorder(">")),
        "readonly": np.frombuffer(base.tobytes(), dtype=dtype).reshape(base.shape),
    }


@pytest.mark.parity
@pytest.mark.parametrize("key", ALL)
@pytest.mark.parametrize("dtype", [f32, f16])
def test_non_contiguous_inputs_equal_contiguous_copies(key, dtype):
    cfg = _cfg(key)
    if dtype == f16:
        cfg = _cfg(key, num_bins=512)
    rng = np.random.default_rng(21)
    views = _layouts(rng, dtype, 2.5)
    second = _layouts(rng, dtype, 4.0)  # a larger range: the histograms grow
    for v in (views, second):
        assert not any(
            v[k].flags.c_contiguous
            for k in ("transposed", "negative-strides", "every-other", "every-other-3d", "column")
        )
    strided = [dict(views), {k: [v, v[::-1]] for k, v in second.items()}]
    contiguous = [
        {k: np.ascontiguousarray(v, dtype=dtype) for k, v in views.items()},
        {
            k: [np.ascontiguousarray(v, dtype=dtype), np.ascontiguousarray(v[::-1], dtype=dtype)]
            for k, v in second.items()
        },
    ]
    hc_s, res_s = run_histocal(cfg, strided)
    hc_c, res_c = run_histocal(cfg, contiguous)
    for name in views:
        assert_hist_tuple_same(hc_c.histogram_dict[name], hc_s.histogram_dict[name], f"{name}: histogram")
        a, b = res_c[name], res_s[name]
        if cfg["method"] == "distribution":
            for attr in ("avg", "std", "hist", "hist_edges", "lowest", "highest"):
                assert_same(getattr(a, attr), getattr(b, attr), f"{name}.{attr}")
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                assert_same(x, y, f"{name}[{i}]")
    # and both equal ORT on the contiguous copies
    check_parity(cfg, contiguous)


# ----------------------------------------------------------------------------------------------
# dtype changes and threads
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ALL)
@pytest.mark.parametrize("first,then", [(f32, f16), (f16, f32)])
def test_dtype_change_between_collects_is_clear_error(key, first, then):
    hc = _new(_cfg(key, num_bins=512))
    name = "block.2/attn/Softmax_output_0"
    with quiet():
        hc.collect({name: np.arange(-3, 5, dtype=first), "other": np.ones(3, f32)})
    before = tuple(hc.histogram_dict[name])
    with pytest.raises((TypeError, ValueError)) as info, quiet():
        hc.collect({name: np.arange(-3, 5, dtype=then)})
    msg = str(info.value)
    assert name in msg, f"message does not name the tensor: {msg}"
    assert "dtype" in msg or "float" in msg, msg
    after = hc.histogram_dict[name]
    assert_hist_tuple_same(before, after, "state after the rejected collect")


def _thread_case():
    rng = np.random.default_rng(31)
    big = (rng.standard_t(4, 1_500_000) * 3).astype(f32)
    big[::1000] = 0.0
    big[1::1000] = -0.0
    zs = np.zeros(300_000, f32)
    zs[::2] = -0.0
    zs[7] = 1.25
    return [
        {
            "big": big,
            "half": (rng.standard_normal(400_000)).astype(f16),
            "zeros": zs,
            **{f"t{i}": (rng.standard_normal((64, 129)) * (i + 1)).astype(f32) for i in range(12)},
        },
        {
            "big": [big[::-1] * f32(1.7), big[:1000]],
            "half": (rng.standard_normal(400_000) * 2).astype(f16),
            "zeros": -zs,
            **{f"t{i}": (rng.standard_normal((64, 129)) * (12 - i)).astype(f32) for i in range(12)},
        },
    ]


@pytest.mark.parametrize("key", ALL)
def test_results_identical_for_one_and_two_threads(key):
    histocal = _histocal()
    cfg = _cfg(key)
    if key == "entropy":
        cfg = _cfg(key, num_bins=129, num_quantized_bins=8)
    collects = _thread_case()
    saved = histocal.get_num_threads()
    try:
        histocal.set_num_threads(1)
        assert histocal.get_num_threads() == 1
        hc1, r1 = run_histocal(cfg, collects)
        histocal.set_num_threads(2)
        assert histocal.get_num_threads() == 2
        hc2, r2 = run_histocal(cfg, collects)
    finally:
        histocal.set_num_threads(saved)
    assert histocal.get_num_threads() == saved
    assert set(r1) == set(r2) == set(collects[0])
    for name in r1:
        # strict: bit-identical, including the sign of zero min/max
        t1, t2 = hc1.histogram_dict[name], hc2.histogram_dict[name]
        for i, (a, b) in enumerate(zip(t1, t2)):
            assert_same(a, b, f"{name}: histogram field {i}")
        a, b = r1[name], r2[name]
        if cfg["method"] == "distribution":
            for attr in ("avg", "std", "hist", "hist_edges", "lowest", "highest"):
                assert_same(getattr(a, attr), getattr(b, attr), f"{name}.{attr}")
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                assert_same(x, y, f"{name} result[{i}]")
        c1, c2 = hc1.counts[name], hc2.counts[name]
        assert (c1.finite, c1.nan, c1.posinf, c1.neginf, c1.batches) == (
            c2.finite,
            c2.nan,
            c2.posinf,
            c2.neginf,
            c2.batches,
        )


@pytest.mark.parity
@pytest.mark.parametrize("key", ALL)
def test_compute_before_collect_is_value_error(key):
    """Like ORT: 'Histogram has not been collected. Please run collect() first.'"""
    hc = _new(_cfg(key))
    with pytest.raises(ValueError, match="collect"), quiet():
        hc.compute_collection_result()
    with quiet():
        hc.collect({})  # an empty dict is a no-op
    with pytest.raises(ValueError, match="collect"), quiet():
        hc.compute_collection_result()
    ort = run_ort(_cfg(key), [{}])
    assert isinstance(ort.error, ValueError) and "collect" in str(ort.error)


def _threads_from_environment(value: str | None) -> tuple[str, str]:
    """``histocal.get_num_threads()`` in a fresh interpreter with HISTOCAL_NUM_THREADS=value
    (None: unset), and its stderr."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HISTOCAL_NUM_THREADS"}
    if value is not None:
        env["HISTOCAL_NUM_THREADS"] = value
    run = subprocess.run(
        [sys.executable, "-c", "import histocal; print(histocal.get_num_threads())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run.stdout.strip(), run.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_bad_thread_count_in_the_environment_is_an_error():
    """HISTOCAL_NUM_THREADS that is not a whole number >= 0 fails the import with an error naming
    it (it was silently ignored); blanks around a number, an empty value and 0 are fine."""
    for value in ("abc", "-3", "1.5"):
        out, err = _threads_from_environment(value)
        assert out == "" and (
            f'HISTOCAL_NUM_THREADS must be a whole number of threads >= 0 (0 or unset: one per core), got "{value}"'
            in err
        ), err
    one_per_core = _threads_from_environment(None)[0]
    got = [_threads_from_environment(v)[0] for v in ("3", " 2 ", "", "0")]
    assert got == ["3", "2", one_per_core, one_per_core]


@pytest.mark.parametrize(
    "value,error", [(-1, ValueError), (10**30, ValueError), (True, TypeError), (1.5, TypeError), ("2", TypeError)]
)
def test_bad_thread_count_argument_is_a_clear_error(value, error):
    """set_num_threads(-1) gave an OverflowError; a bool or a float was taken as a number."""
    histocal = _histocal()
    saved = histocal.get_num_threads()
    with pytest.raises(error, match=r"set_num_threads: n must be a whole number of threads >= 0"):
        histocal.set_num_threads(value)
    assert histocal.get_num_threads() == saved
    histocal.set_num_threads(np.int64(1))
    assert histocal.get_num_threads() == 1
    histocal.set_num_threads(saved)
