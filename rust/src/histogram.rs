//! Histograms bit-identical to `np.histogram` as ORT's `HistogramCollector` calls it.
//!
//! Uniform bins (`bins=int`): numpy builds the edges with a linspace evaluated entirely in the
//! element type `E` and places each value with an estimate `E(E(E(v - first) / norm) * E(n))`
//! followed by one correction step each way. Both are reproduced literally, because for f16 the
//! result differs from exact membership against the edges.
//!
//! Explicit edges (`bins=array`, the symmetric-percentile merges): exact membership, compared in
//! f64, with the interior bins half-open and the last bin closed.

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
        let (first, last) = if first == last {
            (first.sub(E::from_f64(0.5)), last.add(E::from_f64(0.5)))
        } else {
            (first, last)
        };
        let n_e = E::from_usize(n);
        let delta = last.sub(first);
        let step = delta.div(n_e);
        let mut edges: Vec<E> = Vec::with_capacity(n + 1);
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
        let mut edges: Vec<E> = (0..n).map(|i| E::from_f64(i as f64 * step)).collect();
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
    pub fn count<D: Float + Widen<E>>(&self, view: &View<D>, abs: bool, counts: &mut [i64]) {
        let n = self.n_bins();
        assert_eq!(counts.len(), n);
        let len = view.len();
        let chunks = len.div_ceil(PAR_CHUNK);
        let fast = self.fast_f32::<D>();
        let total = (0..chunks)
            .into_par_iter()
            .map(|c| {
                let mut local = vec![0i64; n];
                view.for_each_block(c * PAR_CHUNK..((c + 1) * PAR_CHUNK).min(len), |b| match &fast {
                    // SAFETY: `fast_f32` is Some only when D is f32.
                    Some(f) => f.count(unsafe { std::mem::transmute::<&[D], &[f32]>(b) }, abs, &mut local),
                    None => self.count_block(b, abs, &mut local),
                });
                local
            })
            .reduce_with(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            });
        if let Some(t) = total {
            counts.iter_mut().zip(&t).for_each(|(x, y)| *x += y);
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
        let mut edges: Vec<f32> = self.edges.iter().map(|&e| f(e)).collect();
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
/// Interleaved sub-histograms (value k of a block goes to copy k % SUB).
const SUB: usize = 4;

impl FastF32 {
    fn count(&self, data: &[f32], abs: bool, counts: &mut [i64]) {
        let stride = self.n + 1;
        let mut sub = vec![0u32; SUB * stride];
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
            scatter(idx, &mut sub, stride);
        }
        for (i, c) in counts.iter_mut().enumerate() {
            *c += (0..SUB).map(|s| sub[s * stride + i] as i64).sum::<i64>();
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

crate::simd::dispatch_avx2!(fn bins_arith(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => bins_arith_plain);
crate::simd::dispatch_avx2!(fn bins_arith_abs(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => bins_arith_abs_impl);

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

/// `sub[(k % SUB) * stride + idx[k]] += 1` for every k.
#[inline(always)]
fn scatter(idx: &[u32], sub: &mut [u32], stride: usize) {
    assert!(sub.len() == SUB * stride);
    let chunks = idx.chunks_exact(SUB);
    let rest = chunks.remainder();
    let p = sub.as_mut_ptr();
    for c in chunks {
        // SAFETY: every index is <= n < stride, so each address is inside `sub`.
        unsafe {
            for (s, &i) in c.iter().enumerate() {
                assert_unchecked((i as usize) < stride);
                *p.add(s * stride + i as usize) += 1;
            }
        }
    }
    for (s, &i) in rest.iter().enumerate() {
        sub[s * stride + i as usize] += 1;
    }
}

/// Count the absolute values of `view` into explicit, non-decreasing f64 `edges` (numpy's `searchsorted` rule):
/// bin i holds `edges[i] <= v < edges[i+1]`, the last bin also `v == edges[n]`.
pub fn count_abs_explicit<D: Float>(view: &View<D>, edges: &[f64], counts: &mut [i64]) {
    let n = edges.len() - 1;
    assert_eq!(counts.len(), n);
    let (lo, hi) = (edges[0], edges[n]);
    // Bins are close to uniform: estimate from the mean width, then walk to the exact bin.
    let width = (hi - lo) / n as f64;
    let bin_of = |v: f64| -> Option<usize> {
        if !(v >= lo && v <= hi) {
            return None;
        }
        let mut i = if width > 0.0 { (((v - lo) / width) as usize).min(n - 1) } else { 0 };
        while i > 0 && v < edges[i] {
            i -= 1;
        }
        while i < n - 1 && v >= edges[i + 1] {
            i += 1;
        }
        Some(i)
    };
    let len = view.len();
    let chunks = len.div_ceil(PAR_CHUNK);
    let total = (0..chunks)
        .into_par_iter()
        .map(|c| {
            let mut local = vec![0i64; n];
            view.for_each_block(c * PAR_CHUNK..((c + 1) * PAR_CHUNK).min(len), |b| {
                for &d in b {
                    let v = d.to_f64().abs();
                    if !v.is_finite() {
                        continue; // never binned, even if an edge is infinite
                    }
                    if let Some(i) = bin_of(v) {
                        local[i] += 1;
                    }
                }
            });
            local
        })
        .reduce_with(|mut a, b| {
            a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
            a
        });
    if let Some(t) = total {
        counts.iter_mut().zip(&t).for_each(|(x, y)| *x += y);
    }
}

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
    let mut out = Vec::with_capacity(len);
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
                let mut tab = vec![0; n];
                table.count(&x, abs, &mut tab);
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
    fn equal_range_expands_by_half() {
        let (c, e) = hist_of(&[0.0; 5], 8, 0.0);
        assert_eq!(c, vec![0, 0, 0, 0, 5, 0, 0, 0]);
        assert_eq!(e[0], -0.5);
        assert_eq!(e[8], 0.5);
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
