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

use crate::numeric::fallible;
use crate::numeric::float::{Float, Widen};
use crate::numeric::lanes::widen_f16;
use crate::numeric::scan::PAR_CHUNK;
use crate::numeric::view::View;
use half::f16;
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
    pub fn count<D: Float + Widen<E>>(&self, view: &View<'_, D>, abs: bool, counts: &mut [i64]) {
        let n = self.n_bins();
        assert_eq!(counts.len(), n);
        let len = view.len();
        let fast = self.fast_f32::<D>();
        let counted = count_chunks(len, n, |range, local| {
            match &fast {
                Some(f) if f.half => {
                    let mut sub = SubHist::new(n)?;
                    let mut wide = [0f32; FAST_BLOCK];
                    view.for_each_block(range, |b| {
                        // SAFETY: `fast_f32` sets `half` only when D is f16.
                        let halves = unsafe { std::mem::transmute::<&[D], &[f16]>(b) };
                        for piece in halves.chunks(FAST_BLOCK) {
                            let w = &mut wide[..piece.len()];
                            widen_f16(piece, w);
                            f.count(w, abs, &mut sub);
                        }
                    });
                    sub.add_to(local);
                }
                Some(f) => {
                    let mut sub = SubHist::new(n)?;
                    // SAFETY: `fast_f32` is Some without `half` only when D is f32.
                    view.for_each_block(range, |b| {
                        f.count(unsafe { std::mem::transmute::<&[D], &[f32]>(b) }, abs, &mut sub)
                    });
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

    /// The vectorised kernel's tables, when data and bins are both f32, or both f16 (computed
    /// in f32 lanes, each operation rounded to f16 as `E`'s arithmetic does).
    fn fast_f32<D: 'static>(&self) -> Option<FastF32> {
        use std::any::TypeId;
        let both = |t: TypeId| TypeId::of::<D>() == t && TypeId::of::<E>() == t;
        let half = both(TypeId::of::<f16>());
        if !(half || both(TypeId::of::<f32>())) || self.n_bins() > 1 << 24 {
            return None;
        }
        let f = |x: E| x.to_f32();
        let n = self.n_bins();
        let (first, norm, n_f) = (f(self.first), f(self.norm), f(self.n_e));
        // The edges below `last` are `f32(i) * step + first` (linspace, `step != 0`): then the
        // kernel recomputes them instead of loading them. Checked bit for bit, else tables.
        let step = norm / n_f;
        // (f16 edges come from f16 arithmetic: always the table)
        let arith =
            !half && step != 0.0 && (0..n).all(|i| ((i as f32) * step + first).to_bits() == f(self.edges[i]).to_bits());
        // Padded edges: index n is a dummy bin for out-of-range values; its neighbours make
        // both corrections no-ops (-inf below, NaN above).
        // no room for the table: the scalar path needs none
        let mut edges: Vec<f32> = fallible::try_zeroed(n + 2)?;
        edges.iter_mut().zip(&self.edges).for_each(|(t, &e)| *t = f(e));
        edges.truncate(n + 1);
        edges[n] = f32::NEG_INFINITY;
        edges.push(f32::NAN);
        Some(FastF32 { first, last: f(self.last), norm, n_f, step, arith, half, n, edges })
    }
}

/// numpy's f32 (or f16, in f32 lanes) estimate-and-correct binning, in two passes per block: a
/// vectorised pass that computes each value's bin (or, when the edges cannot be recomputed
/// arithmetically, and always for f16, only the estimate, corrected in the second pass against
/// the edge table), then the increments, spread
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
    /// f16 data and bins: the estimate's operations are rounded to f16.
    half: bool,
    n: usize,
    edges: Vec<f32>,
}

pub(crate) const FAST_BLOCK: usize = 2048;
/// Interleaved sub-histograms (value k of a block goes to copy k % SUB). Two copies of u32
/// counters keep a 2048-bin histogram at 16 KiB, well inside L1.
const SUB: usize = 2;

/// A chunk's counters: SUB interleaved u32 copies of n + 1 bins (bin n is the dummy bin that
/// out-of-range values go to). At most `PAR_CHUNK` values are counted per instance.
pub(crate) struct SubHist {
    sub: Vec<u32>,
    stride: usize,
}

impl SubHist {
    /// None without the memory.
    pub(crate) fn new(n: usize) -> Option<Self> {
        Some(SubHist { sub: fallible::try_zeroed(SUB * (n + 1))?, stride: n + 1 })
    }

    /// `sub[(k % SUB) * stride + idx[k]] += 1` for every k; every index must be <= n.
    #[inline(always)]
    pub(crate) fn add(&mut self, idx: &[u32]) {
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
    pub(crate) fn add_to(&self, counts: &mut [i64]) {
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
            if self.half {
                if abs {
                    estimate_half_abs(self, block, idx);
                    correct::<true>(self, block, idx);
                } else {
                    estimate_half(self, block, idx);
                    correct::<false>(self, block, idx);
                }
                sub.add(idx);
                continue;
            }
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

crate::numeric::simd::dispatch_avx512!(fn bins_arith(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => bins_arith_plain);
crate::numeric::simd::dispatch_avx512!(fn bins_arith_abs(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => bins_arith_abs_impl);

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

crate::numeric::simd::dispatch_avx2!(fn estimate(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => estimate_plain);
crate::numeric::simd::dispatch_avx2!(fn estimate_abs(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => estimate_abs_impl);

/// `f16::from_f32(x)` as an f32 (round to nearest even, beyond 65504 to infinity), branch-free
/// so it vectorises: f16's normal numbers keep 10 of f32's 23 fraction bits (rounding may carry
/// into the exponent, which is right), its subnormals are multiples of 2^-24, to which
/// `(a + 0.5) - 0.5` rounds (0.5's ulp in f32 is 2^-24). NaN stays NaN.
#[inline(always)]
pub(crate) fn round_to_f16(x: f32) -> f32 {
    let a = x.abs();
    let b = a.to_bits();
    let normal = f32::from_bits(b.wrapping_add(0xfff + ((b >> 13) & 1)) & !0x1fff);
    let r = if a < F16_MIN_NORMAL { (a + 0.5) - 0.5 } else { normal };
    let r = if r > 65504.0 { f32::INFINITY } else { r };
    let r = if a.is_nan() { a } else { r };
    f32::from_bits(r.to_bits() | (x.to_bits() & 0x8000_0000))
}

const F16_MIN_NORMAL: f32 = 6.103_515_6e-5; // 2^-14

/// numpy's f16 estimate `trunc(f16(f16(f16(v - first) / norm) * n))` in f32 lanes (f16 values
/// are exact in f32, and an f32 result rounded to f16 is the f16 operation's result, f32
/// having more than twice f16's precision), with the `== n` rule; out-of-range values get the
/// dummy bin n.
#[inline(always)]
fn estimate_half_impl<const ABS: bool>(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    let (first, last, norm, n_f) = (t.first, t.last, t.norm, t.n_f);
    let top = (t.n - 1) as f32;
    let dummy = t.n as u32;
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = if ABS { x.abs() } else { x };
        let f = round_to_f16(round_to_f16(round_to_f16(v - first) / norm) * n_f);
        // as `estimate_one`: NaN and negatives to 0, at most n - 1
        let f = if f > 0.0 { f } else { 0.0 };
        let f = if f < top { f } else { top };
        // SAFETY: f is finite and in [0, n-1].
        let i = unsafe { f.to_int_unchecked::<i32>() } as u32;
        *o = if v >= first && v <= last { i } else { dummy };
    }
}

#[inline(always)]
fn estimate_half_plain(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    estimate_half_impl::<false>(t, block, idx)
}

#[inline(always)]
fn estimate_half_abs_impl(t: &FastF32, block: &[f32], idx: &mut [u32]) {
    estimate_half_impl::<true>(t, block, idx)
}

crate::numeric::simd::dispatch_avx512!(fn estimate_half(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => estimate_half_plain);
crate::numeric::simd::dispatch_avx512!(fn estimate_half_abs(t: &FastF32, block: &[f32], idx: &mut [u32]) -> () => estimate_half_abs_impl);

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

/// Count `len` values in parallel `PAR_CHUNK` chunks, each into its own `n` counters:
/// `count(range, counters)`, None when it lacked memory. The summed counters; `Some(None)`
/// when any chunk lacked memory (for its counters or in `count`), `None` when `len` is 0.
pub(crate) fn count_chunks(
    len: usize,
    n: usize,
    count: impl Fn(std::ops::Range<usize>, &mut [i64]) -> Option<()> + Sync,
) -> Option<Option<Vec<i64>>> {
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
pub(crate) fn add_counted(counted: Option<Option<Vec<i64>>>, counts: &mut [i64]) -> bool {
    match counted {
        None => true,
        Some(None) => false,
        Some(Some(t)) => {
            counts.iter_mut().zip(&t).for_each(|(x, y)| *x += y);
            true
        }
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
mod tests;
