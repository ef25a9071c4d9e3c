//! Histograms bit-identical to `np.histogram` as ORT's `HistogramCollector` calls it.
//!
//! Uniform bins (`bins=int`): numpy builds the edges with a linspace evaluated entirely in the
//! element type `E` and places each value with an estimate `E(E(E(v - first) / norm) * E(n))`
//! followed by one correction step each way. Both are reproduced literally, because for f16 the
//! result differs from exact membership against the edges.
//!
//! One exception, where numpy raises in every type: a float64 range `[c, c]` whose `+-0.5`
//! leaves no room for the bins (`|c|` from about `2^53 / n`) is widened by `|c| 2^-24` instead
//! (see [`UniformBins::new`]).
//!
//! Explicit edges (`bins=array`, the symmetric-percentile merges): exact membership, compared in
//! f64, with the interior bins half-open and the last bin closed.

use crate::fallible;
use crate::float::{Float, Widen};
use crate::scan::PAR_CHUNK;
use crate::view::View;
use rayon::prelude::*;
use std::hint::assert_unchecked;

/// The most bins a histogram may grow to (2^24 bins: 128 MiB of counts). Beyond that ORT
/// exhausts memory or numpy refuses; histocal reports an error naming the tensor.
pub const MAX_BINS: usize = 1 << 24;

#[derive(Clone, Debug, PartialEq)]
pub enum HistError {
    /// numpy: "Too many bins for data range. Cannot create {n} finite-sized bins."
    TooManyBins(usize),
    /// The range is not finite (numpy: "supplied range of [..] is not finite").
    NonFiniteRange,
}

impl std::fmt::Display for HistError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HistError::TooManyBins(n) => {
                write!(f, "Too many bins for data range. Cannot create {n} finite-sized bins.")
            }
            HistError::NonFiniteRange => write!(f, "histogram range is not finite"),
        }
    }
}

/// Equal-width bins over `[first, last]`, as `np.histogram(x, n, range=(first, last))` makes them.
#[derive(Clone, Debug)]
pub struct UniformBins<E> {
    pub first: E,
    pub last: E,
    pub edges: Vec<E>,
    norm: E,
    n_e: E,
}

impl<E: Float> UniformBins<E> {
    /// numpy's `_get_outer_edges` with an explicit range, then its T-typed linspace.
    pub fn new(first: E, last: E, n: usize) -> Result<Self, HistError> {
        assert!(n >= 1, "number of bins must be >= 1");
        if !(first.is_finite() && last.is_finite()) {
            return Err(HistError::NonFiniteRange);
        }
        if n > MAX_BINS {
            return Err(HistError::TooManyBins(n)); // an error, not an allocation that aborts
        }
        if first != last {
            return Self::linspace(first, last, n);
        }
        let half = E::from_f64(0.5);
        match Self::linspace(first.sub(half), last.add(half), n) {
            // numpy's +-0.5 around a single value leaves no room for n float64 bins from about
            // |x| = 2^53 / n on, and numpy raises in every type (ORT fails there). histocal's
            // last resort, float64, widens by 2^-24 of |x| instead (exact): more than 2^5 ulps
            // per bin even at MAX_BINS.
            Err(_) if E::NAME == "float64" => {
                let h = E::from_f64(first.to_f64().abs() * f64::powi(2.0, -24));
                Self::linspace(first.sub(h), last.add(h), n)
            }
            r => r,
        }
    }

    /// numpy's linspace in `E` over `[first, last]`, `n` bins; "Too many bins" where two edges
    /// are not increasing.
    fn linspace(first: E, last: E, n: usize) -> Result<Self, HistError> {
        let n_e = E::from_usize(n);
        let delta = last.sub(first);
        let step = delta.div(n_e);
        let mut edges: Vec<E> = fallible::with_capacity(n + 1);
        if step != E::ZERO {
            for i in 0..n {
                edges.push(E::from_usize(i).mul(step).add(first));
            }
        } else {
            for i in 0..n {
                edges.push(E::from_usize(i).div(n_e).mul(delta).add(first));
            }
        }
        edges.push(last);
        if edges.windows(2).any(|w| !(w[0] < w[1])) {
            return Err(HistError::TooManyBins(n));
        }
        Ok(UniformBins { first, last, edges, norm: delta, n_e })
    }

    /// numpy's edges for `np.histogram(empty, n)` with no range: an f64 linspace over (0, 1),
    /// rounded to `E`. Nothing is ever counted in these bins.
    pub fn empty_auto(n: usize) -> Result<Self, HistError> {
        let step = 1.0 / n as f64;
        let mut edges: Vec<E> = fallible::with_capacity(n + 1);
        edges.extend((0..n).map(|i| E::from_f64(i as f64 * step)));
        edges.push(E::from_f64(1.0));
        if edges.windows(2).any(|w| !(w[0] < w[1])) {
            return Err(HistError::TooManyBins(n));
        }
        Ok(UniformBins { first: E::ZERO, last: E::from_f64(1.0), edges, norm: E::from_f64(1.0), n_e: E::from_usize(n) })
    }

    pub fn n_bins(&self) -> usize {
        self.edges.len() - 1
    }

    /// The bin numpy puts `v` in, or None when `v` is outside `[first, last]` or NaN.
    #[inline(always)]
    pub fn bin_of(&self, v: E) -> Option<usize> {
        if !(v >= self.first && v <= self.last) {
            return None;
        }
        let n = self.edges.len() - 1;
        let f = v.sub(self.first).div(self.norm).mul(self.n_e);
        let mut idx = f.to_f64() as usize;
        if idx >= n {
            idx = n - 1;
        }
        // SAFETY-free indexing: idx <= n - 1 so idx + 1 <= n is in bounds.
        if v < self.edges[idx] {
            idx -= 1;
        }
        if v >= self.edges[idx + 1] && idx != n - 1 {
            idx += 1;
        }
        Some(idx)
    }

    /// Count the values of `view` (widened exactly to `E`; `|x|` when `abs`) into `counts`.
    /// Never fails for lack of memory: without room for the per-chunk counters, the values are
    /// counted one by one straight into `counts` (same result, slower).
    pub fn count<D: Float + Widen<E>>(&self, view: &View<D>, abs: bool, counts: &mut [i64]) {
        let n = self.n_bins();
        assert_eq!(counts.len(), n);
        let len = view.len();
        let fast = self.fast_f32::<D>();
        let counted = count_chunks(len, n, |range, local| {
                match &fast {
                    Some(f) => {
                    let mut sub = SubHist::new(n)?;
                        // SAFETY: `fast_f32` is Some only when D is f32.
                        view.for_each_block(range, |b| f.count(unsafe { std::mem::transmute::<&[D], &[f32]>(b) }, abs, &mut sub));
                    sub.add_to(local);
                    }
                None => view.for_each_block(range, |b| self.count_block(b, abs, local)),
                }
            Some(())
            });
        if !add_counted(counted, counts) {
            view.for_each_block(0..len, |b| self.count_block(b, abs, counts));
        }
    }

    fn count_block<D: Float + Widen<E>>(&self, block: &[D], abs: bool, counts: &mut [i64]) {
        for &d in block {
            let v: E = d.widen();
            if let Some(i) = self.bin_of(if abs { v.abs() } else { v }) {
                counts[i] += 1;
            }
        }
    }

    /// The vectorised f32 kernel's tables, when both data and bins are f32.
    fn fast_f32<D: 'static>(&self) -> Option<FastF32> {
        use std::any::TypeId;
        if TypeId::of::<D>() != TypeId::of::<f32>() || TypeId::of::<E>() != TypeId::of::<f32>() || self.n_bins() > 1 << 24 {
            return None;
        }
        let f = |x: E| x.to_f32();
        let n = self.n_bins();
        let (first, norm, n_f) = (f(self.first), f(self.norm), f(self.n_e));
        // The edges below `last` are `f32(i) * step + first` (linspace, `step != 0`): then the
        // kernel recomputes them instead of loading them. Checked bit for bit, else tables.
        let step = norm / n_f;
        let arith = step != 0.0 && (0..n).all(|i| ((i as f32) * step + first).to_bits() == f(self.edges[i]).to_bits());
        // Padded edges: index n is a dummy bin for out-of-range values; its neighbours make
        // both corrections no-ops (-inf below, NaN above).
        // no room for the table: the scalar path needs none
        let mut edges: Vec<f32> = fallible::try_zeroed(n + 2)?;
        edges.iter_mut().zip(&self.edges).for_each(|(t, &e)| *t = f(e));
        edges.truncate(n + 1);
        edges[n] = f32::NEG_INFINITY;
        edges.push(f32::NAN);
        Some(FastF32 { first, last: f(self.last), norm, n_f, step, arith, n, edges })
    }
}

/// numpy's f32 estimate-and-correct binning, in two passes per block: a vectorised pass that
/// computes each value's bin (or, when the edges cannot be recomputed arithmetically, only the
/// estimate, corrected in the second pass against the edge table), then the increments, spread
/// over interleaved u32 sub-histograms so runs of equal bins (e.g. ReLU zeros) don't serialise
/// on one counter.
struct FastF32 {
    first: f32,
    last: f32,
    norm: f32,
    n_f: f32,
    /// `norm / n_f`, linspace's step.
    step: f32,
    /// True when edge i (< n) is exactly `f32(i) * step + first`.
    arith: bool,
    n: usize,
    edges: Vec<f32>,
}

const FAST_BLOCK: usize = 2048;
/// Interleaved sub-histograms (value k of a block goes to copy k % SUB). Two copies of u32
/// counters keep a 2048-bin histogram at 16 KiB, well inside L1.
const SUB: usize = 2;

/// A chunk's counters: SUB interleaved u32 copies of n + 1 bins (bin n is the dummy bin that
/// out-of-range values go to). At most `PAR_CHUNK` values are counted per instance.
struct SubHist {
    sub: Vec<u32>,
    stride: usize,
}

impl SubHist {
    /// None without the memory.
    fn new(n: usize) -> Option<Self> {
        Some(SubHist { sub: fallible::try_zeroed(SUB * (n + 1))?, stride: n + 1 })
    }

    /// `sub[(k % SUB) * stride + idx[k]] += 1` for every k; every index must be <= n.
    #[inline(always)]
    fn add(&mut self, idx: &[u32]) {
        let stride = self.stride;
        let chunks = idx.chunks_exact(SUB);
        let rest = chunks.remainder();
        let p = self.sub.as_mut_ptr();
        for c in chunks {
            for (s, &i) in c.iter().enumerate() {
                // SAFETY: the kernels only produce indices <= n < stride.
                unsafe {
                    assert_unchecked((i as usize) < stride);
                    *p.add(s * stride + i as usize) += 1;
                }
            }
        }
        for (s, &i) in rest.iter().enumerate() {
            self.sub[s * stride + i as usize] += 1;
        }
    }

    /// Add the real bins (not the dummy) to `counts`.
    fn add_to(&self, counts: &mut [i64]) {
        for (i, c) in counts.iter_mut().enumerate() {
            *c += (0..SUB).map(|s| self.sub[s * self.stride + i] as i64).sum::<i64>();
        }
    }
}

impl FastF32 {
    fn count(&self, data: &[f32], abs: bool, sub: &mut SubHist) {
        let mut idx = [0u32; FAST_BLOCK];
        for block in data.chunks(FAST_BLOCK) {
            let idx = &mut idx[..block.len()];
            match (self.arith, abs) {
                (true, false) => bins_arith(self, block, idx),
                (true, true) => bins_arith_abs(self, block, idx),
                (false, false) => {
                    estimate(self, block, idx);
                    correct::<false>(self, block, idx);
                }
                (false, true) => {
                    estimate_abs(self, block, idx);
                    correct::<true>(self, block, idx);
                }
            }
            sub.add(idx);
        }
    }
}

/// numpy's estimate `trunc(f32(f32(f32(v - first) / norm) * n))` with the `== n` rule, for
/// an in-range `v` (anything else, NaN included, gives some index in `[0, n-1]`).
#[inline(always)]
fn estimate_one(v: f32, first: f32, norm: f32, n_f: f32, top: f32) -> i32 {
    let f = ((v - first) / norm) * n_f;
    // f is in [0, n] for in-range values; clamping to n-1 first is numpy's `== n` rule
    // (truncation of anything in [n-1, n] gives n-1), and NaN/negative go to 0.
    let f = if f > 0.0 { f } else { 0.0 };
    let f = if f < top { f } else { top };
    // SAFETY: f is finite and in [0, n-1].
    unsafe { f.to_int_unchecked::<i32>() }
}

/// The whole of numpy's placement, vectorised: estimate, then one correction each way
/// against the recomputed edges `f32(i) * step + first` (never `last`: the up-correction is
/// disabled in the last bin). Out-of-range values and NaN get the dummy bin n.
#[inline(always)]
fn bins_arith_impl<const ABS: bool>(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    let (first, last, norm, n_f, step) = (t.first, t.last, t.norm, t.n_f, t.step);
    let top = (t.n - 1) as f32; // exact: fast_f32 requires n <= 2^24
    let last_bin = (t.n - 1) as i32;
    let dummy = t.n as i32;
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = if ABS { x.abs() } else { x };
        let i = estimate_one(v, first, norm, n_f, top);
        // In range, v >= first = edge 0, so i never goes below 0.
        let i = i - (v < (i as f32) * step + first) as i32;
        let i = i + ((v >= ((i + 1) as f32) * step + first) & (i != last_bin)) as i32;
        *o = (if v >= first && v <= last { i } else { dummy }) as u32;
    }
}

#[inline(always)]
fn bins_arith_plain(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    bins_arith_impl::<false>(t, block, idx)
}

#[inline(always)]
fn bins_arith_abs_impl(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    bins_arith_impl::<true>(t, block, idx)
}

crate::simd::dispatch_avx512!(fn bins_arith(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => bins_arith_plain);
crate::simd::dispatch_avx512!(fn bins_arith_abs(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => bins_arith_abs_impl);

/// Estimate only (table path); out-of-range values get the dummy bin n.
#[inline(always)]
fn estimate_impl<const ABS: bool>(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    let (first, last, norm, n_f) = (t.first, t.last, t.norm, t.n_f);
    let top = (t.n - 1) as f32;
    let dummy = t.n as u32;
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = if ABS { x.abs() } else { x };
        let i = estimate_one(v, first, norm, n_f, top) as u32;
        *o = if v >= first && v <= last { i } else { dummy };
    }
}

#[inline(always)]
fn estimate_plain(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    estimate_impl::<false>(t, block, idx)
}

#[inline(always)]
fn estimate_abs_impl(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    estimate_impl::<true>(t, block, idx)
}

crate::simd::dispatch_avx2!(fn estimate(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => estimate_plain);
crate::simd::dispatch_avx2!(fn estimate_abs(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => estimate_abs_impl);

/// numpy's two corrections against the padded edge table, in place.
#[inline(always)]
fn correct<const ABS: bool>(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    let e = &t.edges[..];
    let last_bin = t.n - 1;
    assert!(e.len() == t.n + 2 && idx.len() == block.len());
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = if ABS { x.abs() } else { x };
        let mut i = *o as usize;
        // SAFETY: i <= n; an in-range v never moves below bin 0 (v >= e[0]) and the dummy bin
        // n never moves (e[n] = -inf, e[n+1] = NaN), so every index stays < n + 2.
        unsafe {
            i -= (v < *e.get_unchecked(i)) as usize;
            i += ((v >= *e.get_unchecked(i + 1)) & (i != last_bin)) as usize;
        }
        *o = i as u32;
    }
}

/// Count the absolute values of `view` into explicit, non-decreasing f64 `edges` (numpy's `searchsorted` rule):
/// bin i holds `edges[i] <= v < edges[i+1]`, the last bin also `v == edges[n]`.
///
/// The edges may end in `+inf` (ORT's stored f16 edges past 65504): then the bin ending at the
/// first `inf` holds every finite `v` from the edge before it, the `[inf, inf)` bins stay empty
/// and `v == inf` goes to the last bin, as numpy's searchsorted puts it.
pub fn count_abs_explicit<D: Float>(view: &View<D>, edges: &[f64], counts: &mut [i64]) {
    let n = edges.len() - 1;
    assert_eq!(counts.len(), n);
    let fast = ExplicitF32::new::<D>(edges);
    let (lo, hi) = (edges[0], edges[n]);
    // Bins are close to uniform up to the last finite edge: estimate from their mean width, then
    // walk to the exact bin (a finite v never walks into the infinite edges).
    let top = edges.iter().rposition(|e| e.is_finite()).unwrap_or(0);
    let width = if top > 0 { (edges[top] - lo) / top as f64 } else { 0.0 };
    let bin_of = |v: f64| -> Option<usize> {
        if !(v >= lo && v <= hi) {
            return None;
        }
        if v == f64::INFINITY {
            return Some(n - 1); // only in range when hi is inf: the closed last bin
        }
        let mut i = if width > 0.0 { (((v - lo) / width) as usize).min(top).min(n - 1) } else { 0 };
        while i > 0 && v < edges[i] {
            i -= 1;
        }
        while i < n - 1 && v >= edges[i + 1] {
            i += 1;
        }
        Some(i)
    };
    let count_scalar = |b: &[D], local: &mut [i64]| {
                for &d in b {
            if let Some(i) = bin_of(d.to_f64().abs()) {
                        local[i] += 1;
                    }
                }
    };
    let len = view.len();
    let counted = count_chunks(len, n, |range, local| {
        if let Some(f) = &fast {
            let mut sub = SubHist::new(n)?;
            // SAFETY: `ExplicitF32::new` is Some only when D is f32.
            view.for_each_block(range, |b| f.count(unsafe { std::mem::transmute::<&[D], &[f32]>(b) }, &mut sub));
            sub.add_to(local);
        } else {
            view.for_each_block(range, |b| count_scalar(b, local));
        }
        Some(())
            });
    if !add_counted(counted, counts) {
        view.for_each_block(0..len, |b| count_scalar(b, counts));
    }
}

/// Count `len` values in parallel `PAR_CHUNK` chunks, each into its own `n` counters:
/// `count(range, counters)`, None when it lacked memory. The summed counters; `Some(None)`
/// when any chunk lacked memory (for its counters or in `count`), `None` when `len` is 0.
fn count_chunks(len: usize, n: usize, count: impl Fn(std::ops::Range<usize>, &mut [i64]) -> Option<()> + Sync) -> Option<Option<Vec<i64>>> {
    (0..len.div_ceil(PAR_CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut local = fallible::try_zeroed::<i64>(n)?;
            count(c * PAR_CHUNK..((c + 1) * PAR_CHUNK).min(len), &mut local)?;
            Some(local)
        })
        .reduce_with(|a, b| {
            let (mut a, b) = (a?, b?);
            a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
            Some(a)
        })
}

/// Add what `count_chunks` counted to `counts`; false when it ran out of memory (and nothing
/// was added).
fn add_counted(counted: Option<Option<Vec<i64>>>, counts: &mut [i64]) -> bool {
    match counted {
        None => true,
        Some(None) => false,
        Some(Some(t)) => {
        counts.iter_mut().zip(&t).for_each(|(x, y)| *x += y);
            true
        }
    }
}

/// The smallest f32 >= x (+inf above f32::MAX); x finite.
fn f32_at_or_above(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x {
        f32_next_up(f)
    } else {
        f
    }
}

/// The largest f32 <= x (-inf below -f32::MAX); x finite.
fn f32_at_or_below(x: f64) -> f32 {
    -f32_at_or_above(-x)
}

/// The largest f32 below `f` (f finite or +inf).
fn f32_next_down(f: f32) -> f32 {
    -f32_next_up(-f)
}

fn f32_next_up(f: f32) -> f32 {
    // f is finite or -inf, never NaN or +inf here.
    if f == 0.0 {
        f32::from_bits(1)
    } else if f > 0.0 {
        f32::from_bits(f.to_bits() + 1)
    } else {
        f32::from_bits(f.to_bits() - 1)
    }
}

/// `count_abs_explicit` for f32 data. For an f32 `v`, `v >= e` (compared in f64) is exactly
/// `v >= e32` with `e32` the smallest f32 at or above `e`, and `v <= e` is `v <= ` the
/// largest f32 at or below `e`; so the f64 edges become f32 thresholds without changing any
/// comparison. A vectorised pass estimates each bin from the mean width; the scalar pass
/// corrects it one step each way, checks the result, and walks in the (rare) remaining cases.
struct ExplicitF32 {
    lo: f32,
    hi: f32,
    scale: f32,
    n: usize,
    /// Thresholds 0..n, then -inf and NaN so the dummy bin n never moves.
    t: Vec<f32>,
    /// True when the biased estimate of every in-range value is its bin or the next one
    /// (checked at setup), so one compare gives the bin.
    one_step: bool,
}

impl ExplicitF32 {
    fn new<D: 'static>(edges: &[f64]) -> Option<Self> {
        let n = edges.len() - 1;
        if std::any::TypeId::of::<D>() != std::any::TypeId::of::<f32>() || n == 0 || n > 1 << 24 || !edges.iter().all(|e| e.is_finite()) {
            return None;
        }
        // no room for the thresholds: the scalar path needs none
        let mut t: Vec<f32> = fallible::try_zeroed(n + 2)?;
        t.iter_mut().zip(&edges[..n]).for_each(|(o, &e)| *o = f32_at_or_above(e));
        t.truncate(n);
        t.push(f32::NEG_INFINITY);
        t.push(f32::NAN);
        let (lo, hi) = (t[0], f32_at_or_below(edges[n]));
        // Any finite scale is correct (the scalar pass fixes the estimate); this one is close.
        let scale = if hi > lo { n as f32 / (hi - lo) } else { 0.0 };
        let scale = if scale.is_finite() { scale } else { 0.0 };
        // The biased estimate is monotone in v, so it is enough to check each bin's smallest
        // and largest value.
        let top = (n - 1) as f32;
        let one_step = (0..n).all(|i| {
            let a = t[i];
            let b = if i + 1 < n { f32_next_down(t[i + 1]).min(hi) } else { hi };
            a > b || (biased_estimate(a, lo, scale, top) >= i as i32 && biased_estimate(b, lo, scale, top) <= i as i32 + 1)
        });
        Some(ExplicitF32 { lo, hi, scale, n, t, one_step })
    }

    fn count(&self, data: &[f32], sub: &mut SubHist) {
        let mut idx = [0u32; FAST_BLOCK];
        let t = &self.t[..];
        let last_bin = self.n - 1;
        assert!(t.len() == self.n + 2);
        for block in data.chunks(FAST_BLOCK) {
            let idx = &mut idx[..block.len()];
            if self.one_step {
                explicit_one_step(self, block, idx);
                sub.add(idx);
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if crate::simd::has_avx512() {
                // SAFETY: the CPU features were just detected.
                if unsafe { self.bins_avx512(block, idx) } {
                    sub.add(idx);
                    continue;
                }
                // Some lane needed more than one step: redo the block with the scalar pass.
            }
            explicit_estimate(self, block, idx);
            for (o, &x) in idx.iter_mut().zip(block) {
                let v = x.abs();
                let mut i = *o as usize;
                // SAFETY: i <= n. An in-range v satisfies t[0] <= v, so no step goes below 0,
                // and the dummy bin n never moves (t[n] = -inf, t[n + 1] = NaN): every index
                // read is < n + 2.
                unsafe {
                    i -= (v < *t.get_unchecked(i)) as usize;
                    i += ((v >= *t.get_unchecked(i + 1)) & (i != last_bin)) as usize;
                    if v < *t.get_unchecked(i) || (i != last_bin && v >= *t.get_unchecked(i + 1)) {
                        while v < *t.get_unchecked(i) {
                            i -= 1;
                        }
                        while i != last_bin && v >= *t.get_unchecked(i + 1) {
                            i += 1;
                        }
                    }
                }
                *o = i as u32;
            }
            sub.add(idx);
        }
    }
}

impl ExplicitF32 {
    /// The exact bins of a block, 16 values at a time: the estimate, one correction step
    /// (gathering the two thresholds around it) and a check (one more gather) that the
    /// corrected bin holds the value. Returns false, leaving `idx` partly written, if any
    /// value is further than one bin from its estimate.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
    unsafe fn bins_avx512(&self, block: &[f32], idx: &mut [u32]) -> bool {
        use std::arch::x86_64::*;
        let t = self.t.as_ptr();
        let lo = _mm512_set1_ps(self.lo);
        let hi = _mm512_set1_ps(self.hi);
        let scale = _mm512_set1_ps(self.scale);
        let zero = _mm512_setzero_ps();
        let top = _mm512_set1_ps((self.n - 1) as f32);
        let one = _mm512_set1_epi32(1);
        let last = _mm512_set1_epi32((self.n - 1) as i32);
        let dummy = _mm512_set1_epi32(self.n as i32);
        let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
        let mut ok = true;
        let mut k = 0;
        while k + 16 <= block.len() {
            let x = _mm512_loadu_ps(block.as_ptr().add(k));
            let v = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), abs_mask));
            // The same estimate as `explicit_estimate_impl` (max/min order: NaN -> 0).
            let f = _mm512_mul_ps(_mm512_sub_ps(v, lo), scale);
            let f = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(f, zero), zero, f);
            let f = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(f, top), top, f);
            let i = _mm512_cvttps_epi32(f);
            let in_range = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, lo) & _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, hi);
            // i in [0, n-1]: t[i] and t[i + 1] are inside the padded table.
            let t_i = _mm512_i32gather_ps::<4>(i, t);
            let t_j = _mm512_i32gather_ps::<4>(_mm512_add_epi32(i, one), t);
            let down = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, t_i);
            let not_last = _mm512_cmpneq_epi32_mask(i, last);
            let up = !down & _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, t_j) & not_last;
            let moved = (down | up) & in_range;
            let i = _mm512_mask_sub_epi32(i, down, i, one);
            let i = _mm512_mask_add_epi32(i, up, i, one);
            if moved != 0 {
                // Down to i: needs t[i] <= v. Up to i: needs i == n-1 or v < t[i + 1].
                let probe = _mm512_mask_add_epi32(i, up, i, one);
                let g = _mm512_mask_i32gather_ps::<4>(zero, moved, probe, t);
                let good_down = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, g);
                let good_up = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, g) | _mm512_cmpeq_epi32_mask(i, last);
                let bad = moved & ((down & !good_down) | (up & !good_up));
                if bad != 0 {
                    ok = false;
                    break;
                }
            }
            let i = _mm512_mask_blend_epi32(in_range, dummy, i);
            _mm512_storeu_si512(idx.as_mut_ptr().add(k) as *mut _, i);
            k += 16;
        }
        if ok && k < block.len() {
            // Tail: scalar, same rule.
            let (b, o) = (&block[k..], &mut idx[k..]);
            explicit_estimate_impl(self, b, o);
            ok = self.correct_checked(b, o);
        }
        ok
    }

    /// One correction step each way from the estimates in `idx`; false if a value needs more.
    fn correct_checked(&self, block: &[f32], idx: &mut [u32]) -> bool {
        let t = &self.t[..];
        let last_bin = self.n - 1;
        for (o, &x) in idx.iter_mut().zip(block) {
            let v = x.abs();
            let mut i = *o as usize;
            i -= (v < t[i]) as usize;
            i += ((v >= t[i + 1]) & (i != last_bin)) as usize;
            if v < t[i] || (i != last_bin && v >= t[i + 1]) {
                return false;
            }
            *o = i as u32;
        }
        true
    }
}

/// `trunc(f32(f32(f32(v - lo) * scale) + 0.5))` clamped to `[0, n-1]` (NaN -> 0): about half a
/// bin above the position, so for nearly uniform thresholds it is the bin or the next one.
#[inline(always)]
fn biased_estimate(v: f32, lo: f32, scale: f32, top: f32) -> i32 {
    let f = (v - lo) * scale + 0.5;
    let f = if f > 0.0 { f } else { 0.0 };
    let f = if f < top { f } else { top };
    // SAFETY: f is finite and in [0, n-1].
    unsafe { f.to_int_unchecked::<i32>() }
}

/// Exact bins when `one_step` holds: the biased estimate, minus one if below its threshold.
#[inline(always)]
fn explicit_one_step_impl(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) {
    let (lo, hi, scale) = (e.lo, e.hi, e.scale);
    let top = (e.n - 1) as f32;
    let dummy = e.n as i32;
    let t = &e.t[..];
    assert!(t.len() == e.n + 2);
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = x.abs();
        let i = biased_estimate(v, lo, scale, top);
        // SAFETY: 0 <= i <= n-1 (clamped); an in-range v never goes below 0 (t[0] = lo <= v).
        let i = i - (v < unsafe { *t.get_unchecked(i as usize) }) as i32;
        *o = (if v >= lo && v <= hi { i } else { dummy }) as u32;
    }
}

crate::simd::dispatch_avx512!(fn explicit_one_step(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) -> () => explicit_one_step_impl);

/// Estimated bin of |x| in `[0, n-1]`, or the dummy bin n when |x| is outside `[lo, hi]`
/// (NaN and infinities included: lo and hi are finite).
#[inline(always)]
fn explicit_estimate_impl(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) {
    let (lo, hi, scale) = (e.lo, e.hi, e.scale);
    let top = (e.n - 1) as f32;
    let dummy = e.n as u32;
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = x.abs();
        let f = (v - lo) * scale;
        let f = if f > 0.0 { f } else { 0.0 };
        let f = if f < top { f } else { top };
        // SAFETY: f is finite and in [0, n-1].
        let i = unsafe { f.to_int_unchecked::<i32>() } as u32;
        *o = if v >= lo && v <= hi { i } else { dummy };
    }
}

crate::simd::dispatch_avx512!(fn explicit_estimate(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) -> () => explicit_estimate_impl);

/// `np.arange(start, stop, step)` for scalars of type `E`, which numpy evaluates into float64:
/// the length in `E`, the second element in `E`, the rest as `start + i * (x1 - start)` in f64.
/// Fails where numpy would ("Maximum allowed size exceeded") or the length is beyond
/// `MAX_BINS`.
pub fn arange_f64<E: Float>(start: E, stop: E, step: E) -> Result<Vec<f64>, HistError> {
    let len_e = stop.sub(start).div(step).to_f64().ceil();
    if len_e.is_nan() && !(start.is_finite() && stop.is_finite()) || len_e > MAX_BINS as f64 {
        return Err(HistError::TooManyBins(MAX_BINS));
    }
    if !(len_e > 0.0) {
        return Ok(Vec::new());
    }
    let len = len_e as usize;
    let s = start.to_f64();
    let mut out = fallible::with_capacity(len);
    out.push(s);
    if len > 1 {
        let x1 = start.add(step).to_f64();
        out.push(x1);
        let d = x1 - s;
        for i in 2..len {
            out.push(s + i as f64 * d);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_without_memory_for_the_chunk_counters_reports_it_and_adds_nothing() {
        // more counters than can exist: every chunk's allocation fails
        let counted = count_chunks(3 * PAR_CHUNK, usize::MAX / 4, |_, _| Some(()));
        assert!(matches!(counted, Some(None)));
        let mut counts = vec![1i64, 2];
        assert!(!add_counted(counted, &mut counts));
        assert_eq!(counts, vec![1, 2]);
        assert!(add_counted(count_chunks(0, 2, |_, _| Some(())), &mut counts));
        assert!(add_counted(count_chunks(5, 2, |_, c| { c[1] += 5; Some(()) }), &mut counts));
        assert_eq!(counts, vec![1, 7]);
        // a chunk whose own scratch fails fails the whole count
        assert!(matches!(count_chunks(3 * PAR_CHUNK, 2, |r, _| (r.start != PAR_CHUNK).then_some(())), Some(None)));
    }
    use half::f16;

    fn hist_of(x: &[f32], n: usize, t: f32) -> (Vec<i64>, Vec<f32>) {
        let b = UniformBins::new(-t, t, n).unwrap();
        let mut c = vec![0; n];
        b.count(&View::from_slice(x), false, &mut c);
        (c, b.edges)
    }

    #[test]
    fn orts_worked_example() {
        let (c, e) = hist_of(&[-1.0, 0.5, 2.0], 8, 2.0);
        assert_eq!(c, vec![0, 0, 1, 0, 0, 1, 0, 1]);
        assert_eq!(e, vec![-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0]);
    }

    #[test]
    fn fast_f32_path_equals_the_literal_algorithm() {
        let mut x: Vec<f32> = (0..200_000).map(|i| ((i as f32) * 0.7071).sin() * 3.0).collect();
        x.extend([f32::NAN, f32::INFINITY, -f32::INFINITY, 5.0, -5.0, 0.0, -0.0]);
        for &(t, n) in &[(3.0f32, 2048usize), (2.9f32, 1000), (0.3, 7), (3.0, 1)] {
            let b = UniformBins::new(-t, t, n).unwrap();
            x.extend(b.edges.iter().flat_map(|&e| [e, f32::from_bits(e.to_bits() + 1), f32::from_bits(e.to_bits().wrapping_sub(1))]));
            for abs in [false, true] {
                let mut fast = vec![0; n];
                b.count(&View::from_slice(&x), abs, &mut fast);
                let mut slow = vec![0; n];
                b.count_block(&x, abs, &mut slow);
                assert_eq!(fast, slow, "t={t} n={n} abs={abs}");
                // The edge-table variant (used when the edges are not linspace's formula).
                let mut table = b.fast_f32::<f32>().unwrap();
                assert!(table.arith);
                table.arith = false;
                let mut sub = SubHist::new(n).unwrap();
                table.count(&x, abs, &mut sub);
                let mut tab = vec![0; n];
                sub.add_to(&mut tab);
                assert_eq!(tab, slow, "table path t={t} n={n} abs={abs}");
            }
        }
    }

    #[test]
    fn fast_f32_path_random_ranges() {
        // Asymmetric and odd ranges, bin counts up to a few thousand, values on and around
        // every edge.
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..60 {
            let a = ((rnd() - 0.5) * 10f64.powf(rnd() * 8.0 - 4.0)) as f32;
            let w = (10f64.powf(rnd() * 8.0 - 5.0)) as f32;
            let n = 1 + (rnd() * 4000.0) as usize;
            let Ok(b) = UniformBins::new(a, a + w, n) else { continue };
            let mut x: Vec<f32> = (0..20_000).map(|_| (a as f64 + (rnd() * 1.2 - 0.1) * w as f64) as f32).collect();
            x.extend(b.edges.iter().flat_map(|&e| [e, f32::from_bits(e.to_bits() + 1), f32::from_bits(e.to_bits().wrapping_sub(1)), -e]));
            for abs in [false, true] {
                let mut fast = vec![0; n];
                b.count(&View::from_slice(&x), abs, &mut fast);
                let mut slow = vec![0; n];
                b.count_block(&x, abs, &mut slow);
                assert_eq!(fast, slow, "a={a} w={w} n={n} abs={abs}");
            }
        }
    }

    #[test]
    fn every_dispatch_tier_gives_the_same_counts() {
        // One test runs all tiers in turn (the tier is process-wide; other tests running at the
        // same time stay correct, they only may use a lower tier).
        for tier in [0u8, 1, 2] {
            crate::simd::set_max_tier(tier);
            fast_f32_path_equals_the_literal_algorithm();
            fast_f32_path_random_ranges();
            explicit_f32_path_matches_f64_comparisons();
        }
        crate::simd::set_max_tier(2);
    }

    #[test]
    fn equal_range_expands_by_half() {
        let (c, e) = hist_of(&[0.0; 5], 8, 0.0);
        assert_eq!(c, vec![0, 0, 0, 0, 5, 0, 0, 0]);
        assert_eq!(e[0], -0.5);
        assert_eq!(e[8], 0.5);
    }

    #[test]
    fn a_single_float64_value_past_numpys_half_widens_relatively() {
        // +-0.5 still holds 2048 float64 bins at 2^40, not at 2^42 (numpy: "Too many bins"),
        // nor anywhere once it vanishes (1e20, float32's largest): then +-|c| 2^-24.
        let ok = UniformBins::<f64>::new(2f64.powi(40), 2f64.powi(40), 2048).unwrap();
        assert_eq!((ok.first, ok.last), (2f64.powi(40) - 0.5, 2f64.powi(40) + 0.5));
        for (c, ns) in [(2f64.powi(42), &[2048, MAX_BINS][..]), (-1e20, &[1, 7, 2048, MAX_BINS]), (f32::MAX as f64, &[1, 2048]), (f32::MIN as f64, &[7, 2048])] {
            for &n in ns {
                let b = UniformBins::<f64>::new(c, c, n).unwrap();
                let h = c.abs() * 2f64.powi(-24);
                assert_eq!((b.first, b.last), (c - h, c + h), "c={c} n={n}");
                assert_eq!(b.bin_of(c), Some(n / 2), "c={c} n={n}");
            }
            // float32 and float16 keep numpy's refusal (histocal then widens the type)
            assert!(UniformBins::<f32>::new(c as f32, c as f32, 2048).is_err());
        }
    }

    #[test]
    fn linspace_is_evaluated_in_the_element_type() {
        // t = 3.7f, n = 2048: index 142 is -3.186914 in f32 arithmetic (not f32(f64 linspace)).
        let b = UniformBins::<f32>::new(-3.7, 3.7, 2048).unwrap();
        assert_eq!(b.edges[142], -3.186914f32);
    }

    #[test]
    fn f16_runs_out_of_bins_like_numpy() {
        let t = f16::from_f32(1.5);
        assert_eq!(UniformBins::new(-t, t, 2048).unwrap_err(), HistError::TooManyBins(2048));
        let t = f16::from_f32(1.0);
        assert!(UniformBins::new(-t, t, 2048).is_ok());
    }

    #[test]
    fn explicit_edges_last_bin_closed() {
        let edges = [0.0, 1.0, 2.0, 3.0];
        let mut c = vec![0; 3];
        count_abs_explicit(&View::from_slice(&[0.0f32, 1.0, 2.999, 3.0, 3.5, -1.0]), &edges, &mut c);
        // |x| is counted: -1.0 -> 1.0
        assert_eq!(c, vec![1, 2, 2]);
    }

    #[test]
    fn explicit_edges_ending_in_infinity_follow_searchsorted() {
        // numpy: [0, 65472, 65504, inf, inf] puts 65504 in [65504, inf), nothing in [inf, inf)
        // and inf in the closed last bin; with one inf edge, 65504 and inf share the last bin.
        let inf = f64::INFINITY;
        let x: Vec<f16> = [0.0, 65472.0, 65504.0, inf, -inf, 60000.0, f64::NAN, -65504.0].iter().map(|&v| f16::from_f64(v)).collect();
        for (edges, want) in [
            (vec![0.0, 65472.0, 65504.0, inf, inf], vec![2, 1, 2, 2]),
            (vec![0.0, 65472.0, 65504.0, inf], vec![2, 1, 4]),
            (vec![0.0, 65472.0, inf, inf], vec![2, 3, 2]),
            (vec![0.0, 65472.0, 65504.0], vec![2, 3]),
        ] {
            let mut c = vec![0; edges.len() - 1];
            count_abs_explicit(&View::from_slice(&x), &edges, &mut c);
            assert_eq!(c, want, "{edges:?}");
        }
        // f32 data takes the scalar path with infinite edges.
        let mut c = vec![0; 3];
        count_abs_explicit(&View::from_slice(&[1.0f32, 1e30, f32::INFINITY, 0.5]), &[0.0, 1.0, inf, inf], &mut c);
        assert_eq!(c, vec![1, 2, 1]);
    }

    #[test]
    fn explicit_f32_path_matches_f64_comparisons() {
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut one_step_cases = 0;
        for case in 0..40 {
            let n0 = 1 + (rnd() * 3000.0) as usize;
            let lo = (rnd() * 10f64.powf(rnd() * 6.0 - 3.0)) as f32;
            let hi = lo + (10f64.powf(rnd() * 6.0 - 4.0)) as f32;
            let Ok(b) = UniformBins::new(lo, hi, n0) else { continue };
            // ORT's extension: f32 edges, then an f64 arange of the same width (or, in some
            // cases, duplicate and irregular edges).
            let w = b.edges[1] - b.edges[0];
            let mut edges: Vec<f64> = b.edges.iter().map(|&e| e as f64).collect();
            let ext = arange_f64(b.edges[n0] + w, b.edges[n0] + w * (1.0 + (rnd() * 500.0) as f32), w).unwrap();
            edges.extend(ext);
            if case % 5 == 0 {
                let k = edges.len() / 2;
                edges[k] = edges[k - 1]; // an empty bin
                edges[k + 1] = (edges[k + 1] + edges[k + 2]) / 2.0; // a narrow one
            }
            let top = *edges.last().unwrap();
            let mut x: Vec<f32> = (0..20_000).map(|_| ((rnd() * 1.3 - 0.1) * top) as f32 * if rnd() < 0.5 { -1.0 } else { 1.0 }).collect();
            for &e in &edges {
                let f = e as f32;
                x.extend([f, -f, f32::from_bits(f.to_bits() + 1), f32::from_bits(f.to_bits().wrapping_sub(1))]);
            }
            x.extend([f32::NAN, f32::INFINITY, -f32::INFINITY, 0.0, -0.0]);
            let n = edges.len() - 1;
            let mut fast = vec![0; n];
            count_abs_explicit(&View::from_slice(&x), &edges, &mut fast);
            // Also the general path (estimate, one step each way, check, walk).
            let mut general = ExplicitF32::new::<f32>(&edges).unwrap();
            one_step_cases += general.one_step as usize;
            general.one_step = false;
            let mut sub = SubHist::new(n).unwrap();
            general.count(&x, &mut sub);
            let mut gen = vec![0; n];
            sub.add_to(&mut gen);
            // Literal rule, in f64.
            let mut slow = vec![0i64; n];
            for &d in &x {
                let v = (d as f64).abs();
                if !v.is_finite() || !(v >= edges[0] && v <= edges[n]) {
                    continue;
                }
                let i = (0..n).rev().find(|&i| edges[i] <= v).unwrap();
                slow[i] += 1;
            }
            assert_eq!(fast, slow, "case {case} n={n}");
            assert_eq!(gen, slow, "general path, case {case} n={n}");
        }
        assert!(one_step_cases > 20, "{one_step_cases}");
    }

    #[test]
    fn arange_matches_numpy_example() {
        // edges up to 1.0 with width 0.125 and amax 2.2: ext = [1.125 .. 2.25]
        let e = arange_f64(1.125f32, 2.2f32 + 0.125, 0.125).unwrap();
        assert_eq!(e.first(), Some(&1.125));
        assert_eq!(e.last(), Some(&2.25));
        assert_eq!(e.len(), 10);
        // start == stop after rounding: empty.
        assert!(arange_f64(17.5f32, 17.5f32, 3.5).unwrap().is_empty());
        // f16 overflow and lengths beyond MAX_BINS are errors, not allocations.
        let inf = half::f16::INFINITY;
        assert!(arange_f64(inf, inf, half::f16::from_f32(8.0)).is_err());
        assert!(arange_f64(0.0f32, 1e9, 1e-3).is_err());
    }
}
