//! The streaming histogram's binning kernel: one batch's counts at a given level, vectorised.
//!
//! At level `l` with `H = 2^log_half` bins per side, value `x` goes to bin
//! `s = floor(x * 2^k)`, `k = log_half - l`, clamped to `[-H, H - 1]`, stored at index `s + H`.
//! That is the exact (real-number) floor: the product by a power of two is exact unless it
//! underflows, and an underflowed product has |x * 2^k| < 1, so its bin is 0 for x >= 0 and -1
//! for x < 0 whatever the rounding (a product rounded to -0 is sent to -1 explicitly; -0.0 itself
//! is not below zero and goes to bin 0). Because the floor is exact, computing it in f32 gives
//! the same bins as in f64, provided the scaling is a single rounding of exact factors. The
//! lane type is f32 for f16 and f32 data (f16 widens to f32 exactly), f64 for f64 data, and
//! `2^k` is exact in it, as a normal or subnormal number, except:
//!
//! * `k` above the largest exponent (f32 data below `2^(log_half - 127)`: tiny values, or all
//!   zeros at `MIN_LEVEL`): `x` is first multiplied by `2^(k - 127)`, exact because it only
//!   scales up values that stay far below overflow (`|x| < 2^level`), then by `2^127`;
//! * `2^k` below the smallest subnormal (only for levels far above the data type's range):
//!   the factor rounds to 0, and `x * 0 = ±0` gives bin 0 or -1, which is right because
//!   `|x| < 2^128` (f32) or `2^1024` (f64) makes `|x * 2^k| < 1` there.
//!
//! NaN and ±Inf are not binned. Only the window of bins between those of the batch's finite
//! minimum and maximum is counted and added (ReLU-like data spans half the bins).

use crate::numeric::fallible;
use crate::numeric::float::Float;
use crate::numeric::lanes::{widen_f16, Lane};
use crate::numeric::scan::{retype, scan_lanes_block, Scan, PAR_CHUNK};
use crate::numeric::view::View;
use crate::stream::levels::{level_for, raise_bins};
use half::f16;
use rayon::prelude::*;
use std::any::TypeId;
use std::cell::RefCell;

/// Values binned per kernel call (the index buffer stays in L1).
pub(crate) const BLOCK: usize = 2048;
/// Counters that exact zeros are spread over.
pub(crate) const ZERO_SLOTS: usize = 8;

/// A level's mapping from values to bins, in lanes of type `T`, restricted to a window of
/// bins `first..=last` (signed bin numbers) that holds every finite value to be counted.
#[derive(Clone, Copy)]
pub(crate) struct Pow2Bins<T> {
    /// `x * pre * scale = x * 2^k`, each product exact or (the last) the one rounding.
    pre: T,
    scale: T,
    /// The window's end bins, as `T`.
    lo: T,
    hi: T,
    first: i32,
    /// Bins in the window (the dummy index).
    len: u32,
}

impl<T: Lane> Pow2Bins<T> {
    /// The mapping at `level`, restricted to the bins of `min` and `max`.
    fn new(log_half: u32, level: i32, min: T, max: T) -> Self {
        let half = 1i32 << log_half;
        let all = Self::window(log_half, level, -half, half - 1);
        Self::window(log_half, level, all.bin(min), all.bin(max))
    }

    pub(crate) fn window(log_half: u32, level: i32, first: i32, last: i32) -> Self {
        let k = log_half as i32 - level;
        let scale = T::pow2(k.min(T::MAX_EXP));
        let pre = T::pow2((k - T::MAX_EXP).max(0));
        Pow2Bins { pre, scale, lo: T::of_i32(first), hi: T::of_i32(last), first, len: (last - first + 1) as u32 }
    }

    /// The bin of `x` (see the module doc), clamped to the window; NaN goes to `first`.
    #[inline(always)]
    fn bin(&self, x: T) -> i32 {
        let v = x * self.pre * self.scale;
        // Clamp first so the truncation is in range; floor commutes with clamping to integers.
        let c = if v > self.lo { v } else { self.lo };
        let c = if c < self.hi { c } else { self.hi };
        // SAFETY: c is finite and in [-H, H - 1], H <= 2^24.
        let t = unsafe { c.trunc_i32() };
        // floor = trunc - 1 below a non-integer negative; a negative x scaled to -0 is bin -1.
        let down = (T::of_i32(t) > c) | ((c == T::ZERO) & (x < T::ZERO));
        t - down as i32
    }
}

/// The index (`bin + H`) of finite `x`'s bin at `level` over all `2H` bins, as the kernels bin it.
pub(crate) fn bin_index(log_half: u32, level: i32, x: f64) -> usize {
    let half = 1i32 << log_half;
    let p = Pow2Bins::<f64>::window(log_half, level, -half, half - 1);
    (p.bin(x) + half) as usize
}

/// Window indices of a block: bin - first. NaN and ±Inf get the dummy index `len`, exact zeros
/// one of the `ZERO_SLOTS` indices after it, by position, so that a run of zeros (ReLU)
/// increments several counters in turn instead of serialising on one.
#[inline(always)]
fn bins_impl<T: Lane>(p: &Pow2Bins<T>, block: &[T], idx: &mut [u32]) {
    for (j, (o, &x)) in idx.iter_mut().zip(block).enumerate() {
        *o = window_index(p, x, j);
    }
}

/// The window index of value `x` at position `j` of its block (see `bins_impl`).
#[inline(always)]
fn window_index<T: Lane>(p: &Pow2Bins<T>, x: T, j: usize) -> u32 {
    let i = (p.bin(x) - p.first) as u32;
    let i = if x == T::ZERO { p.len + 1 + (j % ZERO_SLOTS) as u32 } else { i };
    if x.abs() < T::INFINITY {
        i
    } else {
        p.len
    }
}

crate::numeric::simd::dispatch_avx512!(pub(crate) fn bins<T: Lane>(p: &Pow2Bins<T>, block: &[T], idx: &mut [u32]) -> () => bins_impl);

/// A lane type that is also a data type (f32, f64): one bound for the dispatch macro.
pub(crate) trait LaneFloat: Lane + Float {}
impl<T: Lane + Float> LaneFloat for T {}

/// `bins_impl` and the block's scan in one loop: min/max and min |x| over finite values and
/// the counts of finite, +Inf and -Inf values (the rest is NaN). A block holds at most
/// `BLOCK` values, so u32 lane counters cannot overflow.
#[inline(always)]
fn bins_scan_impl<T: LaneFloat>(p: &Pow2Bins<T>, block: &[T], idx: &mut [u32]) -> Scan<T> {
    const L: usize = 16;
    let mut mn = [T::INFINITY; L];
    let mut mx = [T::NEG_INFINITY; L];
    let mut amn = [T::INFINITY; L];
    let mut n_fin = [0u32; L];
    let mut n_pinf = [0u32; L];
    let mut n_ninf = [0u32; L];
    let whole = block.len() / L * L;
    for (c, o) in block[..whole].chunks_exact(L).zip(idx[..whole].chunks_exact_mut(L)) {
        for j in 0..L {
            let x = c[j];
            o[j] = window_index(p, x, j); // j is the position mod 16, the same mod ZERO_SLOTS
            let a = Lane::abs(x);
            let fin = a < T::INFINITY;
            let vf = if fin { x } else { T::INFINITY };
            let vg = if fin { x } else { T::NEG_INFINITY };
            let af = if fin { a } else { T::INFINITY };
            mn[j] = if vf < mn[j] { vf } else { mn[j] };
            mx[j] = if vg > mx[j] { vg } else { mx[j] };
            amn[j] = if af < amn[j] { af } else { amn[j] };
            n_fin[j] += fin as u32;
            n_pinf[j] += (x == T::INFINITY) as u32;
            n_ninf[j] += (x == T::NEG_INFINITY) as u32;
        }
    }
    let mut tail = Scan::empty();
    if whole < block.len() {
        bins_impl(p, &block[whole..], &mut idx[whole..block.len()]);
        tail = scan_lanes_block(&block[whole..]);
    }
    let sum = |a: [u32; L]| a.iter().map(|&n| n as u64).sum::<u64>();
    let (n_fin, n_pinf, n_ninf) = (sum(n_fin), sum(n_pinf), sum(n_ninf));
    let red = |a: [T; L], f: fn(T, T) -> T| (n_fin > 0).then(|| a.iter().copied().fold(a[0], f));
    let body = Scan {
        finite_min: red(mn, Lane::min),
        finite_max: red(mx, Lane::max),
        finite_abs_min: red(amn, Lane::min),
        finite_abs_max: None, // not needed here
        n_finite: n_fin,
        n_nan: whole as u64 - n_fin - n_pinf - n_ninf,
        n_posinf: n_pinf,
        n_neginf: n_ninf,
    };
    body.merge(tail)
}

crate::numeric::simd::dispatch_avx512!(pub(crate) fn bins_scan<T: LaneFloat>(p: &Pow2Bins<T>, block: &[T], idx: &mut [u32]) -> Scan<T> => bins_scan_impl);

/// `block` as a slice of `T` when `D` is `T`.
fn cast<D: 'static, T: 'static>(block: &[D]) -> Option<&[T]> {
    // SAFETY: D and T are the same type.
    (TypeId::of::<D>() == TypeId::of::<T>())
        .then(|| unsafe { std::slice::from_raw_parts(block.as_ptr() as *const T, block.len()) })
}

/// A block (at most `BLOCK` values) as lanes `T`: the data itself, or f16 data widened into `wide`.
pub(crate) fn lanes_of<'a, D: 'static, T: 'static>(block: &'a [D], wide: &'a mut [f32]) -> &'a [T] {
    match cast::<D, f16>(block) {
        Some(h) => {
            let w = &mut wide[..h.len()];
            widen_f16(h, w);
            let w: &'a [f32] = w;
            cast::<f32, T>(w).expect("f16 data counts in f32 lanes")
        }
        None => cast::<D, T>(block).expect("lanes match the data type"),
    }
}

/// Counts the values of one data type `D` in lanes `T` (f32 for f16 and f32 data, f64 for
/// f64): u16 counters, so that 16384 bins (32 KiB) stay in L1, added into the u64 counts
/// before any can overflow.
struct Counter<T> {
    p: Pow2Bins<T>,
    /// The window's bins, the dummy bin, then the zero slots.
    small: Vec<u16>,
    /// Values counted in `small` since it was last flushed.
    pending: usize,
    /// The window's counts flushed so far (empty before the first flush).
    counts: Vec<u64>,
    /// A block's indices, and its values widened to f32 (f16 data).
    idx: Vec<u32>,
    wide: Vec<f32>,
}

impl<T: Lane> Counter<T> {
    fn new(p: Pow2Bins<T>) -> Self {
        let small = fallible::zeroed(p.len as usize + 1 + ZERO_SLOTS);
        Counter { p, small, pending: 0, counts: Vec::new(), idx: vec![0; BLOCK], wide: vec![0.0; BLOCK] }
    }

    fn count<D: Float>(&mut self, data: &[D]) {
        for block in data.chunks(BLOCK) {
            if self.pending + block.len() > u16::MAX as usize {
                self.flush(true);
            }
            let idx = &mut self.idx[..block.len()];
            bins(&self.p, lanes_of(block, &mut self.wide), idx);
            let small = self.small.as_mut_ptr();
            for &i in idx.iter() {
                // SAFETY: `bins` clamps every bin into the window, so its indices (window bins,
                // the dummy, the zero slots) are < len + 1 + ZERO_SLOTS = small.len().
                unsafe { *small.add(i as usize) += 1 };
            }
            self.pending += block.len();
        }
    }

    /// Move the u16 counts into the u64 ones (`reuse`: zero them for more values).
    fn flush(&mut self, reuse: bool) {
        let len = self.p.len as usize;
        let zeros: u64 = self.small[len + 1..].iter().map(|&s| s as u64).sum();
        let small = &self.small[..len];
        if self.counts.is_empty() {
            self.counts = widen(small);
        } else {
            add_u16(&mut self.counts, small);
        }
        if zeros > 0 {
            // zeros exist, so the window holds bin 0
            self.counts[(-self.p.first) as usize] += zeros;
        }
        if reuse {
            self.small.fill(0);
            self.pending = 0;
        }
    }

    fn finish(mut self) -> Vec<u64> {
        self.flush(false);
        self.counts
    }
}

// Whole-window passes (once per batch or flush), vectorised.
#[inline(always)]
fn widen_impl(small: &[u16]) -> Vec<u64> {
    fallible::collect(small.iter().map(|&s| s as u64))
}

#[inline(always)]
fn add_u16_impl(counts: &mut [u64], small: &[u16]) {
    counts.iter_mut().zip(small).for_each(|(c, &s)| *c += s as u64);
}

#[inline(always)]
fn add_u64_impl(bins: &mut [u64], counts: &[u64]) {
    bins.iter_mut().zip(counts).for_each(|(b, &c)| *b += c);
}

crate::numeric::simd::dispatch_avx512!(fn widen(small: &[u16]) -> Vec<u64> => widen_impl);
crate::numeric::simd::dispatch_avx512!(fn add_u16(counts: &mut [u64], small: &[u16]) -> () => add_u16_impl);
crate::numeric::simd::dispatch_avx512!(fn add_u64(bins: &mut [u64], counts: &[u64]) -> () => add_u64_impl);

/// One batch's own histogram at a level: the counts of bins `first..first + counts.len()`
/// (indices into the `2H` bins), the span of the batch's finite values; all other bins are 0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchBins {
    pub first: usize,
    pub counts: Vec<u64>,
}

impl BatchBins {
    /// Add these counts to a histogram's `2H` bins.
    pub fn add_to(&self, bins: &mut [u64]) {
        add_u64(&mut bins[self.first..self.first + self.counts.len()], &self.counts);
    }
}

/// The histogram of one batch (`scan` is its scan) alone at `level`, which must hold every
/// finite value of the batch (`|x| < 2^level`).
pub fn batch_bins<D: Float>(view: &View<'_, D>, scan: &Scan<D>, log_half: u32, level: i32) -> BatchBins {
    let (Some(min), Some(max)) = (scan.finite_min, scan.finite_max) else {
        return BatchBins::default();
    };
    let half = 1i64 << log_half;
    let (first, counts) = if TypeId::of::<D>() == TypeId::of::<f64>() {
        let p = Pow2Bins::<f64>::new(log_half, level, min.to_f64(), max.to_f64());
        (p.first, count_view(view, p))
    } else {
        // f16 and f32 values are exact in f32
        let p = Pow2Bins::<f32>::new(log_half, level, min.to_f32(), max.to_f32());
        (p.first, count_view(view, p))
    };
    BatchBins { first: (first as i64 + half) as usize, counts }
}

/// The window's counts of every value of `view`, in parallel over fixed chunks.
fn count_view<D: Float, T: Lane + Send + Sync>(view: &View<'_, D>, p: Pow2Bins<T>) -> Vec<u64> {
    let n = view.len();
    (0..n.div_ceil(PAR_CHUNK))
        .into_par_iter()
        .fold(
            || Counter::new(p),
            |mut counter, c| {
                view.for_each_block(c * PAR_CHUNK..((c + 1) * PAR_CHUNK).min(n), |b| counter.count(b));
                counter
            },
        )
        .map(Counter::finish)
        .reduce_with(|mut a, b| {
            a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
            a
        })
        .unwrap_or_else(|| fallible::zeroed(p.len as usize))
}

/// Per-thread buffers of the direct path, kept between batches: `copies(2H)` sets of u16
/// counters for all `2H` bins plus the dummy and zero slots (all zero between uses), a block's
/// indices and widened values.
#[derive(Default)]
struct Scratch {
    small: Vec<u16>,
    idx: Vec<u32>,
    wide: Vec<f32>,
    /// Set while counters may be non-zero (a panic mid-batch leaves it set: zero them next time).
    dirty: bool,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

impl Scratch {
    fn ready(&mut self, n_small: usize) {
        if self.small.len() != n_small || self.dirty {
            self.small.clear();
            fallible::resize(&mut self.small, n_small, 0);
        }
        self.idx.resize(BLOCK, 0);
        self.wide.resize(BLOCK, 0.0);
        self.dirty = true;
    }
}

/// The most copies of the direct path's counters: value `j` of a block is counted in copy
/// `j % COPIES`, the copies summed at the flush (exact: integer counts, added in any order).
/// On real activations 11-15 % of values fall in the bin of the value d places before, for
/// each d from 1 to 8; in one set of u16 counters each such increment waits on the store of
/// the one before it. With four copies, and the next block asked into L1 during the scatter
/// (`DirectCounter::scatter`), the add on PaddleOCR's detector outputs takes 0.90x the time
/// of one copy without it over its tensors from 32K values (data from memory), 0.78x on
/// tensors that stay in cache; the copies alone help only the latter (measured by the
/// former `examples/real_batch.rs`; benches/NOTES.md).
const COPIES: usize = 4;

/// Histograms from this many bins on (`2H`) count in one copy: the copies' 8 bytes per bin would
/// no longer fit the caches, and the scratch would grow to 4 x 64 MiB at the largest size.
const COPIES_MAX_BINS: usize = 1 << 16;

/// How many copies of the counters a histogram of `n_bins` bins counts in.
fn copies(n_bins: usize) -> usize {
    if n_bins <= COPIES_MAX_BINS {
        COPIES
    } else {
        1
    }
}

/// Counts values straight into a histogram's `2H` bins at one level: the window is all `2H`
/// bins, counted in the scratch's u16 counters (`copies` sets of `stride` counters: the window,
/// the dummy, the zero slots) and flushed into the u64 bins over the span touched since the
/// last flush (no per-batch allocation, no batch histogram to add).
struct DirectCounter<T> {
    p: Pow2Bins<T>,
    copies: usize,
    pending: usize,
    /// Touched window indices `lo..=hi` since the last flush (`lo > hi`: none).
    lo: usize,
    hi: usize,
}

impl<T: Lane> DirectCounter<T> {
    fn new(log_half: u32, level: i32) -> Self {
        let half = 1i32 << log_half;
        let p = Pow2Bins::window(log_half, level, -half, half - 1);
        DirectCounter { p, copies: copies(2 << log_half), pending: 0, lo: usize::MAX, hi: 0 }
    }

    /// Counters in one copy: the window, the dummy, the zero slots.
    fn stride(&self) -> usize {
        self.p.len as usize + 1 + ZERO_SLOTS
    }

    /// Count the block whose window indices are `s.idx[..n]` and whose finite values lie in
    /// `[min, max]`, inside the level's range. Every counter of every copy stays below 2^16:
    /// the copies together count at most `u16::MAX` values between flushes. `ahead`, the next
    /// block's data, is asked into L1 meanwhile, one line per 16 values, so that its binning
    /// does not wait on memory (the scatter alone leaves the loads idle).
    fn scatter(&mut self, n: usize, min: T, max: T, s: &mut Scratch, bins: &mut [u64], ahead: &[u8]) {
        if self.pending + n > u16::MAX as usize {
            self.flush(s, bins);
        }
        let stride = self.stride();
        assert!(s.small.len() >= self.copies * stride, "the scratch holds every copy");
        let small = s.small.as_mut_ptr();
        let four = self.copies == COPIES;
        // one line of `ahead` asked for per 16 values (f32: 64 bytes, the whole next piece)
        let step = ahead.len().div_ceil(n.div_ceil(16)).max(1);
        for (k, sixteen) in s.idx[..n].chunks(16).enumerate() {
            let at = k * step;
            if at < ahead.len() {
                prefetch(&ahead[at]);
                if step > 64 && at + 64 < ahead.len() {
                    prefetch(&ahead[at + 64]); // f64: two lines per 16 values
                }
            }
            let rest = if four {
                let quads = sixteen.chunks_exact(COPIES);
                let rest = quads.remainder();
                for q in quads {
                    // SAFETY: `bins` clamps every bin into the window, so its indices (window
                    // bins, the dummy, the zero slots) are < stride; copy c starts at
                    // c * stride, and the scratch holds COPIES copies (asserted above).
                    unsafe {
                        *small.add(q[0] as usize) += 1;
                        *small.add(stride + q[1] as usize) += 1;
                        *small.add(2 * stride + q[2] as usize) += 1;
                        *small.add(3 * stride + q[3] as usize) += 1;
                    }
                }
                rest
            } else {
                sixteen
            };
            for &i in rest {
                // SAFETY: as above, in copy 0.
                unsafe { *small.add(i as usize) += 1 };
            }
        }
        self.pending += n;
        self.lo = self.lo.min((self.p.bin(min) - self.p.first) as usize);
        self.hi = self.hi.max((self.p.bin(max) - self.p.first) as usize);
    }

    /// Add the counters of every copy into `bins` and zero them.
    fn flush(&mut self, s: &mut Scratch, bins: &mut [u64]) {
        let (len, stride) = (self.p.len as usize, self.stride());
        let small = &mut s.small[..self.copies * stride];
        let zeros: u64 = small.chunks_exact(stride).flat_map(|c| &c[len + 1..]).map(|&c| c as u64).sum();
        if self.lo <= self.hi {
            let r = self.lo..=self.hi;
            if self.copies == COPIES {
                let (a, rest) = small.split_at(stride);
                let (b, rest) = rest.split_at(stride);
                let (c, d) = rest.split_at(stride);
                add_u16x4(&mut bins[r.clone()], &a[r.clone()], &b[r.clone()], &c[r.clone()], &d[r.clone()]);
            } else {
                add_u16(&mut bins[r.clone()], &small[r.clone()]);
            }
            for copy in small.chunks_exact_mut(stride) {
                copy[r.clone()].fill(0);
            }
        }
        // bin 0 is at index H of the 2H bins
        bins[len / 2] += zeros;
        for copy in small.chunks_exact_mut(stride) {
            copy[len..].fill(0);
        }
        self.pending = 0;
        self.lo = usize::MAX;
        self.hi = 0;
    }
}

/// `counts += a + b + c + d`, the four u16 copies of the same counters (their sum < 2^16).
#[inline(always)]
fn add_u16x4_impl(counts: &mut [u64], a: &[u16], b: &[u16], c: &[u16], d: &[u16]) {
    let n = counts.len();
    let (a, b, c, d) = (&a[..n], &b[..n], &c[..n], &d[..n]);
    for (i, o) in counts.iter_mut().enumerate() {
        *o += (a[i] as u32 + b[i] as u32 + c[i] as u32 + d[i] as u32) as u64;
    }
}

crate::numeric::simd::dispatch_avx512!(fn add_u16x4(counts: &mut [u64], a: &[u16], b: &[u16], c: &[u16], d: &[u16]) -> () => add_u16x4_impl);

/// Add one batch to a streaming histogram (`bins`: its `2H` counts at `*level`, None before any
/// finite value) in a single read of the data: each block is scanned while in L1, the level
/// raised (`raise_bins`, exact) when the block holds a value beyond it, and the block counted
/// at the level. Returns the batch's scan. Sequential: for batches up to a few `PAR_CHUNK`s
/// (bigger ones are split by the caller's parallel path).
pub fn add_direct<D: Float>(view: &View<'_, D>, log_half: u32, level: &mut Option<i32>, bins: &mut [u64]) -> Scan<D> {
    assert_eq!(bins.len(), 2 << log_half, "bins hold 2H counts");
    SCRATCH.with(|cell| {
        let s = &mut *cell.borrow_mut();
        s.ready(copies(bins.len()) * (bins.len() + 1 + ZERO_SLOTS));
        let scan = if TypeId::of::<D>() == TypeId::of::<f64>() {
            add_direct_lanes::<D, f64>(view, log_half, level, bins, s)
        } else {
            add_direct_lanes::<D, f32>(view, log_half, level, bins, s)
        };
        s.dirty = false;
        scan
    })
}

fn add_direct_lanes<D: Float, T: Lane + Float>(
    view: &View<'_, D>,
    log_half: u32,
    level: &mut Option<i32>,
    bins: &mut [u64],
    s: &mut Scratch,
) -> Scan<D> {
    let mut total = Scan::<D>::empty();
    let mut counter: Option<DirectCounter<T>> = level.map(|l| DirectCounter::new(log_half, l));
    let mut wide = std::mem::take(&mut s.wide);
    view.for_each_block(0..view.len(), |block| {
        for (at, piece) in block.chunks(BLOCK).enumerate() {
            let lanes: &[T] = lanes_of(piece, &mut wide);
            let n = lanes.len();
            // bin at the current level while scanning; a block beyond it is binned again
            let sc = match &counter {
                Some(c) => bins_scan(&c.p, lanes, &mut s.idx[..n]),
                None => scan_lanes_block(lanes),
            };
            total = total.merge(retype(sc));
            let (Some(min), Some(max)) = (sc.finite_min, sc.finite_max) else {
                continue; // nothing finite to count
            };
            let need = level_for(min.to_f64().abs().max(max.to_f64().abs()));
            if level.is_none_or(|l| need > l) {
                if let Some(c) = counter.as_mut() {
                    c.flush(s, bins);
                }
                if let Some(l) = *level {
                    raise_bins(bins, (need - l) as u32);
                }
                *level = Some(need);
                let c = DirectCounter::new(log_half, need);
                self::bins(&c.p, lanes, &mut s.idx[..n]);
                counter = Some(c);
            }
            let next = &block[((at + 1) * BLOCK).min(block.len())..((at + 2) * BLOCK).min(block.len())];
            counter.as_mut().expect("a level is set").scatter(n, min, max, s, bins, as_bytes(next));
        }
    });
    s.wide = wide;
    if let Some(c) = counter.as_mut() {
        c.flush(s, bins);
    }
    total
}

/// The memory of `values`, as bytes.
fn as_bytes<D>(values: &[D]) -> &[u8] {
    // SAFETY: the same memory, read as bytes (every bit pattern is a valid u8).
    unsafe { std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values)) }
}

/// Ask for the cache line of `x` in L1 ahead of its use (a hint: it changes nothing).
#[inline(always)]
fn prefetch(x: &u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch of a valid address (it never faults anyway).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(x as *const u8 as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}
