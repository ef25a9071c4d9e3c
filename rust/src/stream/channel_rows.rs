//! Per-channel streaming histograms of one tensor, read in memory order.
//!
//! A C-order tensor seen as `[outer, C, inner]` (`outer` the product of the axes before the channel
//! axis, `inner` of those after it) holds channel `c`'s values in the runs of `inner` contiguous
//! values whose run index `o * C + c` is `c` modulo `C`. `add_channels` adds channel `c`'s values as
//! one batch of histogram `hists[c]`, for every channel, in two reads of the tensor in memory order
//! (instead of one strided read per channel, which for short runs brings every cache line of the
//! tensor in once per channel):
//!
//! 1. the scan: each channel's finite min, max and min |x| and its counts of finite, +Inf, -Inf and
//!    NaN values. Runs of at least `SHORT_RUN` values are scanned run by run (`numeric::scan`'s
//!    kernel); shorter runs position by position: a chunk of a row's positions keeps a running
//!    min/max/min |x| and counts per position over the rows (vectorised across positions), folded
//!    into each channel's scan at the end.
//! 2. the binning: each channel's histogram records its scan and raises its level to
//!    `max(level, level_for(largest finite |x|))` (`StreamHistogram::begin_counted`); each run's
//!    values are then binned at their channel's level (`stream_bins`' `Pow2Bins` over the whole `2H`
//!    window, with its indices for zeros and non-finite values) and counted in the channel's narrow
//!    counts (`stream::narrow`'s scatter, carrying a wrapped byte's 256 counts into the u64 bin).
//!
//! Why the result is bit-identical to adding each channel's strided view with `StreamHistogram::add`:
//! a streaming histogram after a batch depends only on the batch's values as a multiset, whichever
//! kernel counted them and in whatever order (`stream_histogram`'s module doc: a value's bin at a level
//! is exact and a level increase merges bins exactly; `stream::narrow`: the narrow counts carry
//! exactly). After the batch the level is `max(level before, level_for(largest finite |x|))`, the bins
//! are those before, raised to that level, plus one count in each finite value's bin at that level,
//! the extremes are the minimum and maximum over the finite values (values of the data, compared
//! exactly; -0 recorded as +0) and the counts are sums: all of which the two passes compute from the
//! same values (f16 data in f32 lanes, widened exactly). Channels whose histograms collect pow2 votes
//! (a search over each batch's own histogram) are added through their strided view with `add`.

use crate::numeric::fallible;
use crate::numeric::float::Float;
use crate::numeric::lanes::Lane;
use crate::numeric::scan::{retype, scan_lanes_block, Scan, PAR_CHUNK};
use crate::numeric::view::View;
use crate::stream::narrow::scatter;
use crate::stream::stream_bins::{bins as bin_indices, lanes_of, window_index, LaneFloat, Pow2Bins, BLOCK};
use crate::stream::stream_histogram::StreamHistogram;
use rayon::prelude::*;
use std::any::TypeId;

/// Runs shorter than this are scanned and binned value by value, position-wise (a run scan's
/// fixed cost would dominate).
const SHORT_RUN: usize = 16;
/// Positions per chunk of a row in the position-wise scan (its per-position state stays in L1).
const PLANE_CHUNK: usize = 1024;

/// A C-order tensor's shape around its channel axis: `[outer, channels, inner]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelLayout {
    pub outer: usize,
    pub channels: usize,
    pub inner: usize,
}

impl ChannelLayout {
    /// `shape` around axis `axis` (`axis < shape.len()`).
    pub fn new(shape: &[usize], axis: usize) -> Self {
        ChannelLayout {
            outer: shape[..axis].iter().product(),
            channels: shape[axis],
            inner: shape[axis + 1..].iter().product(),
        }
    }

    pub fn len(&self) -> usize {
        self.outer * self.channels * self.inner
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where channel `c`'s run of row `o` starts.
    fn run_start(&self, o: usize, c: usize) -> usize {
        (o * self.channels + c) * self.inner
    }
}

/// Channel `c` of `data` (laid out as `layout`) as a strided view: `[outer, inner]`, rows
/// `channels * inner` apart.
pub fn channel_view<D: Float>(data: &[D], layout: ChannelLayout, c: usize) -> View<'_, D> {
    assert!(c < layout.channels && data.len() == layout.len(), "a channel of the data");
    if data.is_empty() {
        return View::from_slice(data);
    }
    let row = (layout.channels * layout.inner) as isize;
    // SAFETY: element (o, i) is data[(o * channels + c) * inner + i], inside `data`.
    unsafe { View::from_raw(data.as_ptr().add(c * layout.inner), &[layout.outer, layout.inner], &[row, 1]) }
}

/// Add channel `c`'s values of `data` (a C-order tensor laid out as `layout`) as one batch of
/// `hists[c]`, for every channel (see the module doc). Tensors from `PAR_CHUNK` values on are split
/// into groups of channels counted in parallel (each group reads its part of every row).
pub fn add_channels<D: Float>(data: &[D], layout: ChannelLayout, hists: &mut [&mut StreamHistogram]) {
    assert_eq!(hists.len(), layout.channels, "one histogram per channel");
    assert_eq!(data.len(), layout.len(), "the data fills its layout");
    let groups = data.len().div_ceil(PAR_CHUNK).clamp(1, hists.len().max(1));
    if groups == 1 {
        add_group(data, layout, 0, hists);
        return;
    }
    let per = hists.len().div_ceil(groups);
    hists.par_chunks_mut(per).enumerate().for_each(|(g, part)| add_group(data, layout, g * per, part));
}

/// Add the channels `first..first + hists.len()`.
fn add_group<D: Float>(data: &[D], layout: ChannelLayout, first: usize, hists: &mut [&mut StreamHistogram]) {
    if hists.iter().any(|h| h.pow2_votes.is_some()) {
        for (k, h) in hists.iter_mut().enumerate() {
            h.add(&channel_view(data, layout, first + k));
        }
    } else if TypeId::of::<D>() == TypeId::of::<f64>() {
        group_lanes::<D, f64>(data, layout, first, hists);
    } else {
        group_lanes::<D, f32>(data, layout, first, hists); // f16 widens to f32 exactly
    }
}

/// A channel's mapping at its level and its counts.
struct Target<'a, T> {
    p: Pow2Bins<T>,
    bins: &'a mut [u64],
    narrow: &'a mut [u8],
    /// The narrow counts its finite values fall in (indices of its min and max).
    span: (usize, usize),
}

/// Ask for the cache lines of a channel's narrow counts its values fall in (`span`), while the run
/// before it is counted: the channels' counts together are far beyond the caches, and a run's
/// scattered increments would each wait for memory.
#[inline(always)]
fn prefetch<T>(t: &Target<'_, T>) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let (lo, hi) = t.span;
        let base = t.narrow.as_ptr();
        for i in (lo..=hi).step_by(64).chain([hi]) {
            // SAFETY: a prefetch never faults; i < narrow.len() anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(i) as *const i8) };
        }
    }
}

fn group_lanes<D: Float, T: LaneFloat>(
    data: &[D],
    layout: ChannelLayout,
    first: usize,
    hists: &mut [&mut StreamHistogram],
) {
    let n = hists.len();
    let scans = if layout.inner < SHORT_RUN {
        scan_positions::<D, T>(data, layout, first, n)
    } else {
        scan_runs::<D, T>(data, layout, first, n)
    };
    // Everything that allocates comes before the first histogram changes.
    let mut targets: Vec<Option<Target<'_, T>>> = fallible::with_capacity(n);
    for (h, sc) in hists.iter_mut().zip(&scans) {
        if sc.n_finite > 0 {
            h.allocate_narrow();
        }
    }
    let (mut idx, mut wide) = (vec![0u32; BLOCK], vec![0f32; BLOCK]);
    for (h, sc) in hists.iter_mut().zip(&scans) {
        let log_half = h.log_half;
        targets.push(h.begin_counted(&retype::<T, D>(*sc)).map(|level| {
            let half = 1i32 << log_half;
            let (bins, narrow) = h.narrow_counts();
            let p = Pow2Bins::window(log_half, level, -half, half - 1);
            let at = |x: Option<T>| (p.bin(x.expect("finite values")) - p.first) as usize;
            Target { p, bins, narrow, span: (at(sc.finite_min), at(sc.finite_max)) }
        }));
    }
    let inner = layout.inner;
    for o in 0..layout.outer {
        if inner >= SHORT_RUN {
            for k in 0..n {
                // the next run's counts, where it has fewer lines to fetch than values
                if let Some(next) = &targets[(k + 1) % n] {
                    if (next.span.1 - next.span.0) / 64 < inner / 2 {
                        prefetch(next);
                    }
                }
                let Some(t) = &mut targets[k] else { continue }; // nothing finite in this channel
                let start = layout.run_start(o, first + k);
                for piece in data[start..start + inner].chunks(BLOCK) {
                    let lanes: &[T] = lanes_of(piece, &mut wide);
                    let idx = &mut idx[..lanes.len()];
                    bin_indices(&t.p, lanes, idx);
                    scatter(idx, t.narrow, t.bins);
                }
            }
            continue;
        }
        // short runs: value by value, the channel advancing every `inner` values
        let row = &data[layout.run_start(o, first)..layout.run_start(o, first + n)];
        let (mut k, mut r) = (0, 0);
        for piece in row.chunks(BLOCK) {
            let lanes: &[T] = lanes_of(piece, &mut wide);
            for (j, &x) in lanes.iter().enumerate() {
                if let Some(t) = &mut targets[k] {
                    scatter(&[window_index(&t.p, x, j)], t.narrow, t.bins);
                }
                r += 1;
                if r == inner {
                    (k, r) = (k + 1, 0);
                }
            }
        }
    }
}

/// The scans of channels `first..first + n`, run by run.
fn scan_runs<D: Float, T: LaneFloat>(data: &[D], layout: ChannelLayout, first: usize, n: usize) -> Vec<Scan<T>> {
    let mut scans = fallible::collect((0..n).map(|_| Scan::<T>::empty()));
    let mut wide = vec![0f32; BLOCK];
    for o in 0..layout.outer {
        for (k, scan) in scans.iter_mut().enumerate() {
            let start = layout.run_start(o, first + k);
            for piece in data[start..start + layout.inner].chunks(BLOCK) {
                *scan = scan.merge(scan_lanes_block(lanes_of::<D, T>(piece, &mut wide)));
            }
        }
    }
    scans
}

/// Running per-position scan state of a chunk of positions (see `positions_add`).
struct Positions<T> {
    mn: Vec<T>,
    mx: Vec<T>,
    amn: Vec<T>,
    fin: Vec<u32>,
    pinf: Vec<u32>,
    ninf: Vec<u32>,
    rows: u64,
}

impl<T: LaneFloat> Positions<T> {
    fn new(len: usize) -> Self {
        Positions {
            mn: vec![T::INFINITY; len],
            mx: vec![T::NEG_INFINITY; len],
            amn: vec![T::INFINITY; len],
            fin: vec![0; len],
            pinf: vec![0; len],
            ninf: vec![0; len],
            rows: 0,
        }
    }

    fn reset(&mut self) {
        self.mn.fill(T::INFINITY);
        self.mx.fill(T::NEG_INFINITY);
        self.amn.fill(T::INFINITY);
        self.fin.fill(0);
        self.pinf.fill(0);
        self.ninf.fill(0);
        self.rows = 0;
    }

    /// Fold the first `scans.len() * inner` positions, `inner` per channel, into `scans`; reset.
    fn fold_into(&mut self, scans: &mut [Scan<T>], inner: usize) {
        for (k, scan) in scans.iter_mut().enumerate() {
            let at = k * inner..(k + 1) * inner;
            let sum = |v: &[u32]| v[at.clone()].iter().map(|&c| c as u64).sum::<u64>();
            let (fin, pinf, ninf) = (sum(&self.fin), sum(&self.pinf), sum(&self.ninf));
            let red = |v: &[T], f: fn(T, T) -> T| (fin > 0).then(|| v[at.clone()].iter().copied().fold(v[at.start], f));
            let part = Scan {
                finite_min: red(&self.mn, Lane::min),
                finite_max: red(&self.mx, Lane::max),
                finite_abs_min: red(&self.amn, Lane::min),
                finite_abs_max: None,
                n_finite: fin,
                n_nan: self.rows * inner as u64 - fin - pinf - ninf,
                n_posinf: pinf,
                n_neginf: ninf,
            };
            *scan = scan.merge(part);
        }
        self.reset();
    }
}

/// The scans of channels `first..first + n` (runs shorter than `SHORT_RUN`), position by position:
/// a chunk of whole channels' positions at a time, over every row.
fn scan_positions<D: Float, T: LaneFloat>(data: &[D], layout: ChannelLayout, first: usize, n: usize) -> Vec<Scan<T>> {
    let mut scans = fallible::collect((0..n).map(|_| Scan::<T>::empty()));
    let inner = layout.inner;
    if inner == 0 {
        return scans; // no values
    }
    let per = (PLANE_CHUNK / inner).max(1);
    let mut acc = Positions::<T>::new(per * inner);
    let mut wide = vec![0f32; BLOCK];
    for k0 in (0..n).step_by(per) {
        let k1 = (k0 + per).min(n);
        let len = (k1 - k0) * inner;
        for o in 0..layout.outer {
            let start = layout.run_start(o, first + k0);
            let lanes: &[T] = lanes_of(&data[start..start + len], &mut wide);
            let a = &mut acc;
            positions_add(&mut a.mn, &mut a.mx, &mut a.amn, &mut a.fin, &mut a.pinf, &mut a.ninf, lanes);
            a.rows += 1;
            if a.rows == u32::MAX as u64 {
                a.fold_into(&mut scans[k0..k1], inner); // before the u32 counts could overflow
            }
        }
        acc.fold_into(&mut scans[k0..k1], inner);
    }
    scans
}

/// Add one row's values `x` to the running per-position state: min/max and min |x| over finite
/// values, counts of finite, +Inf and -Inf values.
#[inline(always)]
fn positions_add_impl<T: LaneFloat>(
    mn: &mut [T],
    mx: &mut [T],
    amn: &mut [T],
    fin: &mut [u32],
    pinf: &mut [u32],
    ninf: &mut [u32],
    x: &[T],
) {
    let n = x.len();
    let (mn, mx, amn) = (&mut mn[..n], &mut mx[..n], &mut amn[..n]);
    let (fin, pinf, ninf) = (&mut fin[..n], &mut pinf[..n], &mut ninf[..n]);
    for j in 0..n {
        let v = x[j];
        let a = Lane::abs(v);
        let finite = a < T::INFINITY; // false for NaN and ±Inf
        let vf = if finite { v } else { T::INFINITY };
        let vg = if finite { v } else { T::NEG_INFINITY };
        let af = if finite { a } else { T::INFINITY };
        mn[j] = if vf < mn[j] { vf } else { mn[j] };
        mx[j] = if vg > mx[j] { vg } else { mx[j] };
        amn[j] = if af < amn[j] { af } else { amn[j] };
        fin[j] += finite as u32;
        pinf[j] += (v == T::INFINITY) as u32;
        ninf[j] += (v == T::NEG_INFINITY) as u32;
    }
}

crate::numeric::simd::dispatch_avx512!(fn positions_add<T: LaneFloat>(mn: &mut [T], mx: &mut [T], amn: &mut [T], fin: &mut [u32], pinf: &mut [u32], ninf: &mut [u32], x: &[T]) -> () => positions_add_impl);

#[cfg(test)]
mod tests;
