//! The streaming histogram's collection kernel for many mid-sized tensors: each histogram keeps
//! one byte per bin (its *narrow counts*) next to its `2H` u64 bins, and a batch is counted into
//! the bytes alone.
//!
//! A calibration adds one batch of every tensor in turn, so with hundreds of tensors a histogram's
//! counts have left the caches by the time its next batch comes. Counting a batch straight into
//! the u64 bins (`stream_bins::add_direct`) then reads and writes every 64-byte line of bins in
//! the batch's span, 8 bins a line, from memory: for a 16K-value tensor over most of the 16384
//! bins that is 128 KiB moved in and out for 64 KiB of data. The narrow counts are 8 times
//! smaller (16 KiB for 16384 bins: the counts of some 600 tensors fit a 32 MiB L3 cache), so a
//! batch moves a line of 64 bins for each line of 8 before.
//!
//! Why the counts stay exact: a value's bin is computed exactly as in `stream_bins` (the same
//! `Pow2Bins` at the same level over the whole `2H` window, the same indices for zeros and
//! non-finite values), and where a bin's byte wraps from 255 to 0 the 256 counts it held are
//! added to its u64 bin at once (zero slots carry into bin 0, the non-finite dummy's carries are
//! dropped: those values are counted by the scan, never binned). So at every moment
//! `bins[i] + narrow[i]` (plus, for bin 0, the zero slots) is the number of values counted in bin
//! `i`, an integer sum that does not depend on when bytes carry. `settle` adds the bytes into the
//! bins and zeroes them; the level rises only on settled bins (`raise_bins`, exact as before), so
//! the settled bins equal, bit for bit, those of the direct kernel after the same batches. A rise
//! settles and merges only the bins between those of the histogram's finite extremes
//! (`settle_and_raise`): binning is monotone, so every count lies there, and the rest is zero.

use crate::numeric::float::Float;
use crate::numeric::scan::{retype, scan_lanes_block, Scan};
use crate::numeric::view::View;
use crate::stream::levels::{level_for, raise_bins, raise_bins_window};
use crate::stream::stream_bins::{
    bin_index, bins as bin_indices, bins_scan, lanes_of, LaneFloat, Pow2Bins, BLOCK, ZERO_SLOTS,
};
use std::any::TypeId;
use std::cell::RefCell;

/// Narrow counts a histogram of `2 << log_half` bins needs: one byte per bin, the dummy (NaN,
/// ±Inf), the zero slots.
pub fn narrow_len(log_half: u32) -> usize {
    (2 << log_half) + 1 + ZERO_SLOTS
}

/// Per-thread buffers: a block's window indices and its values widened to f32 (f16 data).
#[derive(Default)]
struct Blocks {
    idx: Vec<u32>,
    wide: Vec<f32>,
}

thread_local! {
    static BLOCKS: RefCell<Blocks> = RefCell::new(Blocks::default());
}

/// The 256 counts of index `i`'s wrapped byte, into the u64 bins.
#[cold]
#[inline(never)]
fn carry(bins: &mut [u64], i: usize) {
    let n = bins.len();
    if i < n {
        bins[i] += 256;
    } else if i > n {
        bins[n / 2] += 256; // a zero slot: bin 0 is at index H
    }
}

/// Count the values of window indices `idx` (all < `narrow.len()`) in the narrow counts.
#[inline(always)]
fn scatter(idx: &[u32], narrow: &mut [u8], bins: &mut [u64]) {
    let p = narrow.as_mut_ptr();
    for &i in idx {
        // SAFETY: `Pow2Bins::bin` clamps every bin into the whole 2H window, so the indices (bins,
        // the dummy, the zero slots) are < 2H + 1 + ZERO_SLOTS = narrow.len() (checked by callers).
        unsafe {
            let c = p.add(i as usize);
            let v = (*c).wrapping_add(1);
            *c = v;
            if v == 0 {
                carry(bins, i as usize);
            }
        }
    }
}

#[inline(always)]
fn add_u8_impl(bins: &mut [u64], narrow: &[u8]) {
    bins.iter_mut().zip(narrow).for_each(|(b, &c)| *b += c as u64);
}

crate::numeric::simd::dispatch_avx512!(fn add_u8(bins: &mut [u64], narrow: &[u8]) -> () => add_u8_impl);

/// Add the narrow counts into the `2H` bins (zero slots into bin 0) and zero them.
pub fn settle(bins: &mut [u64], narrow: &mut [u8]) {
    let n = bins.len();
    if narrow.len() != n + 1 + ZERO_SLOTS {
        return; // never counted
    }
    add_u8(bins, &narrow[..n]);
    bins[n / 2] += narrow[n + 1..].iter().map(|&c| c as u64).sum::<u64>();
    narrow.fill(0);
}

/// `settle`, then `raise_bins` by `shift` levels, where every count (bins and narrow counts, the
/// zero slots counting in bin 0) lies at indices `window` (`lo..=hi`, holding `H`): only the
/// window is touched (None: all `2H` bins). The same bins as `settle` and `raise_bins`: both
/// leave every count outside the window where it is, and there are none.
pub fn settle_and_raise(bins: &mut [u64], narrow: &mut [u8], shift: u32, window: Option<(usize, usize)>) {
    let n = bins.len();
    let Some((lo, hi)) = window else {
        settle(bins, narrow);
        raise_bins(bins, shift);
        return;
    };
    if narrow.len() == n + 1 + ZERO_SLOTS {
        add_u8(&mut bins[lo..=hi], &narrow[lo..=hi]);
        bins[n / 2] += narrow[n + 1..].iter().map(|&c| c as u64).sum::<u64>();
        narrow[lo..=hi].fill(0);
        narrow[n..].fill(0); // the dummy (never carried) and the zero slots
    }
    raise_bins_window(bins, shift, lo, hi);
}

/// The indices `lo..=hi` (holding `H`) of the bins at `level` between finite values `min` and
/// `max`: where a histogram whose values all lie in `[min, max]` holds its counts (binning is
/// monotone).
pub fn window_of(log_half: u32, level: i32, min: f64, max: f64) -> (usize, usize) {
    let h = 1usize << log_half;
    // a bin more on each side: a margin that costs nothing
    let lo = bin_index(log_half, level, min).saturating_sub(1).min(h);
    let hi = (bin_index(log_half, level, max) + 1).clamp(h, 2 * h - 1);
    (lo, hi)
}

/// The mapping of `level` over all `2H` bins.
fn whole<T: LaneFloat>(log_half: u32, level: i32) -> Pow2Bins<T> {
    let half = 1i32 << log_half;
    Pow2Bins::window(log_half, level, -half, half - 1)
}

/// Add one batch to a streaming histogram (`bins`: its `2H` counts at `*level`, None before any
/// finite value; `narrow`: its narrow counts, `narrow_len` bytes; `held`: where its counts lie)
/// in a single read of the data:
/// each block is scanned and binned while in L1, the level raised (on settled bins) when the
/// block holds a value beyond it, and the block counted in the narrow counts. Returns the
/// batch's scan. Sequential.
pub fn add_narrow<D: Float>(
    view: &View<'_, D>,
    log_half: u32,
    level: &mut Option<i32>,
    bins: &mut [u64],
    narrow: &mut [u8],
    held: CountsAt,
) -> Scan<D> {
    with_blocks(|blocks| {
        let mut batch = blocks.batch::<D>(log_half, level, bins, narrow, held);
        view.for_each_block(0..view.len(), |block| batch.add(block));
        batch.total
    })
}

/// The narrow kernel's block buffers, borrowed once for many batches (`NarrowBlocks::batch`):
/// where thousands of channels take a few hundred values each, the per-batch setup weighs.
pub struct NarrowBlocks<'s>(&'s mut Blocks);

/// Run `f` with this thread's block buffers (fresh ones where they are already borrowed).
pub fn with_blocks<R>(f: impl FnOnce(&mut NarrowBlocks<'_>) -> R) -> R {
    BLOCKS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut NarrowBlocks(&mut s)),
        Err(_) => f(&mut NarrowBlocks(&mut Blocks::default())),
    })
}

impl NarrowBlocks<'_> {
    /// One batch of a histogram, as `add_narrow` counts it: feed its values in order with
    /// `NarrowBatch::add` (in pieces of any size), then read its scan (`total`).
    pub fn batch<'b, D: Float>(
        &'b mut self,
        log_half: u32,
        level: &'b mut Option<i32>,
        bins: &'b mut [u64],
        narrow: &'b mut [u8],
        held: CountsAt,
    ) -> NarrowBatch<'b, D> {
        assert_eq!(bins.len(), 2 << log_half, "bins hold 2H counts");
        assert_eq!(narrow.len(), narrow_len(log_half), "narrow counts hold 2H + 1 + ZERO_SLOTS bytes");
        let s = &mut *self.0;
        if s.idx.len() < BLOCK {
            s.idx.resize(BLOCK, 0);
            s.wide.resize(BLOCK, 0.0);
        }
        let wide_lanes = TypeId::of::<D>() == TypeId::of::<f64>();
        let (map32, map64) = match *level {
            Some(l) if wide_lanes => (None, Some(whole::<f64>(log_half, l))),
            Some(l) => (Some(whole::<f32>(log_half, l)), None),
            None => (None, None),
        };
        NarrowBatch { s, log_half, level, bins, narrow, held, map32, map64, total: Scan::empty() }
    }
}

/// One batch being counted (`NarrowBlocks::batch`).
pub struct NarrowBatch<'b, D: Float> {
    s: &'b mut Blocks,
    log_half: u32,
    level: &'b mut Option<i32>,
    bins: &'b mut [u64],
    narrow: &'b mut [u8],
    held: CountsAt,
    /// The mapping at the current level, in the data's lanes (f64 data: `map64`).
    map32: Option<Pow2Bins<f32>>,
    map64: Option<Pow2Bins<f64>>,
    /// The scan of the values added so far.
    pub total: Scan<D>,
}

/// What a histogram's counts before a batch are known to lie between: `Extremes(min, max)`, its
/// finite extremes (None before any finite value), or `Anywhere` (a histogram restored with
/// counts outside its extremes' bins).
#[derive(Clone, Copy, Debug)]
pub enum CountsAt {
    Extremes(Option<(f64, f64)>),
    Anywhere,
}

/// Where a histogram's counts lie at `level`: those before the batch (`held`) and the batch's
/// blocks so far (`total`, which already holds the block that raises the level: a wider window
/// is as exact). None: anywhere.
fn window<D: Float>(held: CountsAt, total: &Scan<D>, log_half: u32, level: i32) -> Option<(usize, usize)> {
    let CountsAt::Extremes(before) = held else { return None };
    let now = match (total.finite_min, total.finite_max) {
        (Some(a), Some(b)) => Some((a.to_f64(), b.to_f64())),
        _ => None,
    };
    let (min, max) = match (before, now) {
        (Some((a, b)), Some((c, d))) => (a.min(c), b.max(d)),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => return None,
    };
    Some(window_of(log_half, level, min, max))
}

impl<D: Float> NarrowBatch<'_, D> {
    /// Count the next values of the batch.
    pub fn add(&mut self, values: &[D]) {
        if TypeId::of::<D>() == TypeId::of::<f64>() {
            let mut map = self.map64.take();
            self.add_lanes::<f64>(values, &mut map);
            self.map64 = map;
        } else {
            let mut map = self.map32.take();
            self.add_lanes::<f32>(values, &mut map);
            self.map32 = map;
        }
    }

    fn add_lanes<T: LaneFloat>(&mut self, values: &[D], map: &mut Option<Pow2Bins<T>>) {
        let (idx, wide) = (&mut self.s.idx, &mut self.s.wide);
        for piece in values.chunks(BLOCK) {
            let lanes: &[T] = lanes_of(piece, wide);
            let n = lanes.len();
            // bin at the current level while scanning; a block beyond it is binned again
            let sc = match &*map {
                Some(p) => bins_scan(p, lanes, &mut idx[..n]),
                None => scan_lanes_block(lanes),
            };
            self.total = self.total.merge(retype(sc));
            let (Some(min), Some(max)) = (sc.finite_min, sc.finite_max) else {
                continue; // nothing finite to count
            };
            let need = level_for(min.to_f64().abs().max(max.to_f64().abs()));
            if self.level.is_none_or(|l| need > l) {
                if let Some(l) = *self.level {
                    let window = window(self.held, &self.total, self.log_half, l);
                    settle_and_raise(self.bins, self.narrow, (need - l) as u32, window);
                }
                *self.level = Some(need);
                let p = whole(self.log_half, need);
                bin_indices(&p, lanes, &mut idx[..n]);
                *map = Some(p);
            }
            scatter(&idx[..n], self.narrow, self.bins);
        }
    }
}

/// Count a batch whose finite values all lie inside `level`'s range into the narrow counts (the
/// scan is already known). Sequential.
pub fn count_narrow<D: Float>(view: &View<'_, D>, log_half: u32, level: i32, bins: &mut [u64], narrow: &mut [u8]) {
    assert_eq!(bins.len(), 2 << log_half, "bins hold 2H counts");
    assert_eq!(narrow.len(), narrow_len(log_half), "narrow counts hold 2H + 1 + ZERO_SLOTS bytes");
    fn lanes<D: Float, T: LaneFloat>(
        view: &View<'_, D>,
        p: Pow2Bins<T>,
        bins: &mut [u64],
        narrow: &mut [u8],
        s: &mut Blocks,
    ) {
        let (idx, wide) = (&mut s.idx, &mut s.wide);
        view.for_each_block(0..view.len(), |block| {
            for piece in block.chunks(BLOCK) {
                let l: &[T] = lanes_of(piece, wide);
                bin_indices(&p, l, &mut idx[..l.len()]);
                scatter(&idx[..l.len()], narrow, bins);
            }
        });
    }
    BLOCKS.with(|cell| {
        let s = &mut *cell.borrow_mut();
        s.idx.resize(BLOCK, 0);
        s.wide.resize(BLOCK, 0.0);
        if TypeId::of::<D>() == TypeId::of::<f64>() {
            lanes::<D, f64>(view, whole(log_half, level), bins, narrow, s);
        } else {
            lanes::<D, f32>(view, whole(log_half, level), bins, narrow, s);
        }
    })
}

#[cfg(test)]
mod tests;
