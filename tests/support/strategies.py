"""Hypothesis strategies for collector inputs: a *plan* (structure, drawn by hypothesis) plus a
seed for the numbers, turned into concrete ``collect()`` dicts by :func:`build_collects`.

The numbers come from a seeded numpy Generator so that examples stay cheap; hypothesis still
shrinks the structure (how many tensors, collects, batches, which data kinds, scales, dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from .parity import MAX_BINS, OrtCollector, bounded_address_space, flat_finite, ort_bins_needed, quiet

NUM_BINS = [7, 8, 128, 129, 512, 1000, 2048]
PERCENTILES = [0.0, 50.0, 99.9, 99.999, 100.0]

# Data kinds. "edges" feeds back ORT's current bin edges (and +-1 ulp); it needs a previous collect.
KINDS = [
    "normal",
    "normal",
    "shifted",
    "relu",
    "negative",
    "heavy",
    "outliers",
    "uniform",
    "zeros",
    "const",
    "grid",
    "ints",
    "edges",
    "edges",
]


@dataclass(frozen=True)
class BatchSpec:
    kind: str
    shape: tuple
    scale_exp: int  # relative to the tensor's base exponent
    nan_frac: float = 0.0
    inf: str = ""  # "", "pos", "neg", "both"
    all_nan: bool = False


@dataclass(frozen=True)
class CollectSpec:
    batches: tuple  # of BatchSpec; as_list decides list vs single ndarray
    as_list: bool


@dataclass(frozen=True)
class TensorPlan:
    name: str
    dtype: str  # "float32" | "float16"
    base_exp: int
    collects: tuple  # of CollectSpec or None (tensor absent from that collect)


@dataclass(frozen=True)
class Plan:
    tensors: tuple
    n_collects: int
    seed: int


_NAMES = ["t0", "conv1/output:0", "x", "a.b", "Relu_7"]


@st.composite
def shapes(draw, allow_empty: bool):
    ndim = draw(st.integers(0, 3))
    lo = 0 if allow_empty and draw(st.integers(0, 9)) == 0 else 1
    dims = [draw(st.integers(lo, 24)) for _ in range(ndim)]
    # keep one batch <= ~6000 elements
    while int(np.prod(dims, dtype=np.int64)) > 6000:
        dims[int(np.argmax(dims))] //= 2
    return tuple(dims)


@st.composite
def batch_specs(draw, shape, first: bool, nonfinite: bool):
    kind = draw(st.sampled_from([k for k in KINDS if not (first and k == "edges")]))
    scale_exp = draw(st.integers(-2, 2))
    nan_frac, inf, all_nan = 0.0, "", False
    if nonfinite and draw(st.integers(0, 9)) == 0:
        r = draw(st.integers(0, 3))
        if r == 0:
            all_nan = True
        elif r == 1:
            nan_frac = draw(st.sampled_from([0.01, 0.3]))
        else:
            inf = draw(st.sampled_from(["pos", "neg", "both"]))
            nan_frac = draw(st.sampled_from([0.0, 0.05]))
    return BatchSpec(kind, shape, scale_exp, nan_frac, inf, all_nan)


@st.composite
def plans(
    draw,
    *,
    max_tensors: int = 3,
    max_collects: int = 5,
    f16: bool = True,
    nonfinite: bool = True,
    allow_empty: bool = True,
    ragged: bool = True,
    f16_weight: int = 2,
):
    """f16_weight: float16 tensors in (f16_weight : 4) odds against float32."""
    n_tensors = draw(st.integers(1, max_tensors))
    n_collects = draw(st.integers(1, max_collects))
    names = draw(st.permutations(_NAMES))[:n_tensors]
    tensors = []
    for name in names:
        dtype = draw(st.sampled_from(["float32"] * 4 + ["float16"] * f16_weight if f16 else ["float32"]))
        base_exp = draw(st.integers(-3, 3) if dtype == "float32" else st.integers(-2, 2))
        collects = []
        seen = False
        for c in range(n_collects):
            if c > 0 and draw(st.integers(0, 7)) == 0:
                collects.append(None)  # tensor missing from this collect dict
                continue
            as_list = draw(st.booleans())
            n_b = draw(st.integers(1, 3)) if as_list else 1
            shape = draw(shapes(allow_empty))
            specs = []
            for b in range(n_b):
                bshape = shape
                if ragged and as_list and b > 0 and draw(st.integers(0, 11)) == 0:
                    bshape = draw(shapes(True))  # different shape in one list (ORT: inhomogeneous)
                specs.append(draw(batch_specs(bshape, first=not seen, nonfinite=nonfinite)))
            collects.append(CollectSpec(tuple(specs), as_list))
            seen = True
        tensors.append(TensorPlan(name, dtype, base_exp, tuple(collects)))
    seed = draw(st.integers(0, 2**32 - 1))
    return Plan(tuple(tensors), n_collects, seed)


def _raw(kind: str, size: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.standard_normal(size)
    if kind == "shifted":
        return rng.standard_normal(size) + rng.uniform(-4, 4)
    if kind == "relu":
        return np.maximum(rng.standard_normal(size), 0.0)
    if kind == "negative":
        return -np.abs(rng.standard_normal(size)) - rng.uniform(0, 2)
    if kind == "heavy":
        return rng.standard_t(rng.choice([1, 2, 3]), size)
    if kind == "outliers":
        x = rng.standard_normal(size)
        k = min(size, int(rng.integers(1, 4)))
        idx = rng.choice(size, k, replace=False) if size else []
        x[idx] *= 10.0 ** rng.uniform(1, 4, k) if size else 1
        return x
    if kind == "uniform":
        return rng.uniform(-1, 1, size)
    if kind == "zeros":
        return np.zeros(size)
    if kind == "const":
        return np.full(size, rng.choice([-1, 1]) * rng.uniform(0.1, 10))
    if kind == "grid":
        d = int(rng.choice([4, 64, 512, 1000, 1024]))
        return rng.integers(-d, d + 1, size) / d
    if kind == "ints":
        return rng.integers(-3, 4, size).astype(np.float64)
    raise AssertionError(kind)


_F16_MAX = 60000.0


def _edge_feedback(edges: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """Values exactly on ORT's current edges, and one ulp either side (in the edges' dtype)."""
    picks = edges[rng.integers(0, edges.size, size)] if size else edges[:0]
    which = rng.integers(0, 3, size)
    up = np.nextafter(picks, np.array(np.inf, edges.dtype))
    down = np.nextafter(picks, np.array(-np.inf, edges.dtype))
    out = np.where(which == 0, picks, np.where(which == 1, up, down))
    # Value histograms also see the mirrored (negative) edges through |x| symmetric ranges.
    return out


class _Bounds:
    """Keeps histogram growth (and so memory and ORT's runtime) bounded.

    value path: after the first collect with a non-zero finite max|x| (t_ref), later |x| are
    clipped to growth * t_ref.  abs path: after the first collect with finite data, later |x|
    are clipped to [amin - G*W, amax + G*W], W = amax - amin (1 if 0).
    """

    def __init__(self, is_abs: bool, growth: float):
        self.is_abs, self.growth = is_abs, growth
        self.ref = None

    def apply(self, x: np.ndarray) -> np.ndarray:
        fin = np.isfinite(x)
        if self.ref is None:
            return x
        a = np.abs(x)
        s = np.sign(x)
        s[s == 0] = 1
        if self.is_abs:
            amin, amax = self.ref
            w = (amax - amin) or 1.0
            lo, hi = max(0.0, amin - self.growth * w), amax + self.growth * w
            a = np.clip(a, lo, hi)
        else:
            a = np.minimum(a, self.growth * self.ref)
        return np.where(fin, s * a, x)

    def update(self, finite_vals: np.ndarray):
        if self.ref is not None or finite_vals.size == 0:
            return
        a = np.abs(finite_vals.astype(np.float64))
        if self.is_abs:
            self.ref = (float(a.min()), float(a.max()))
        elif a.max() > 0:
            self.ref = float(a.max())


def build_collects(plan: Plan, cfg: dict, growth: float) -> list[dict]:
    """Turn a plan into the list of dicts passed to collect(), identical for ORT and histocal."""
    rng = np.random.default_rng(plan.seed)
    is_abs = cfg["method"] == "percentile" and cfg["symmetric"]
    collects: list[dict] = [dict() for _ in range(plan.n_collects)]
    for tp in plan.tensors:
        dt = np.dtype(tp.dtype)
        bounds = _Bounds(is_abs, growth)
        # A private ORT collector (this tensor only) provides the current edges for "edges" batches.
        shadow = OrtCollector(**cfg)
        shadow_fed: list[dict] = []
        shadow_ok = True
        for ci, cs in enumerate(tp.collects):
            if cs is None:
                continue
            arrays = []
            for bs in cs.batches:
                size = int(np.prod(bs.shape, dtype=np.int64))
                kind = bs.kind
                if kind == "edges" and not (shadow_ok and tp.name in shadow.histogram_dict):
                    kind = "grid"
                if kind == "edges":
                    edges = shadow.histogram_dict[tp.name][1]
                    x = _edge_feedback(edges, size, rng)
                    if not is_abs:
                        x = np.where(rng.integers(0, 2, size) == 0, x, -x)
                    x = x.astype(dt)
                else:
                    x = _raw(kind, size, rng) * 10.0 ** (tp.base_exp + bs.scale_exp)
                    x = bounds.apply(x)
                    if dt == np.float16:
                        x = np.clip(x, -_F16_MAX, _F16_MAX)
                    x = x.astype(dt)
                if size:
                    if bs.all_nan:
                        x[...] = np.nan
                    elif bs.nan_frac:
                        x.reshape(-1)[rng.random(size) < bs.nan_frac] = np.nan
                    if bs.inf:
                        k = rng.integers(0, size)
                        x.reshape(-1)[k] = -np.inf if bs.inf == "neg" else np.inf
                        if bs.inf == "both" and size > 1:
                            x.reshape(-1)[(k + 1) % size] = -np.inf
                arrays.append(x.reshape(bs.shape))
            value = arrays if cs.as_list else arrays[0]
            collects[ci][tp.name] = value
            fin = flat_finite(value)
            bounds.update(fin)
            if shadow_ok:
                shadow_fed.append({tp.name: fin})
                # _Bounds cannot bound a histogram whose first collect had no finite values, and
                # ORT's growth beyond MAX_BINS has no memory bound: stop the feedback instead.
                shadow_ok = ort_bins_needed(cfg, shadow_fed, tp.name) <= MAX_BINS
            if shadow_ok:
                try:
                    with quiet(), bounded_address_space():
                        shadow.collect({tp.name: fin})
                except MemoryError:
                    raise  # the bins guard missed a runaway histogram: say so
                except Exception:
                    shadow_ok = False
    return collects
