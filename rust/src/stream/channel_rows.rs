//! Per-channel streaming histograms of one tensor, read once in memory order.
//!
//! A C-order tensor seen as `[outer, C, inner]` (`outer` the product of the axes before the channel
//! axis, `inner` of those after it) holds channel `c`'s values in the runs of `inner` contiguous
//! values whose run index `o * C + c` is `c` modulo `C`. `add_channels` adds channel `c`'s values as
//! one batch of histogram `hists[c]`, for every channel:
//!
//! 1. the tensor is read in memory order, a chunk of consecutive channels at a time: each row's
//!    segment holding the chunk's runs (contiguous) is copied, run by run, into a buffer that holds
//!    the chunk channel after channel (`GATHER` values, or one channel where a channel is bigger);
//! 2. each channel of the chunk, now contiguous in the buffer (in cache), is added to its histogram
//!    with `StreamHistogram::add`: one scan-and-bin read of its values, its counts in cache while it
//!    is counted (the next channel's counts are prefetched meanwhile: `prefetch_counts`). Where
//!    `outer` is 1 a channel's values are one run already, added in place.
//!
//! The tensor is read from memory once, whatever the channel axis, and each channel's counts are
//! touched once per batch: a strided read per channel instead brings every cache line of the tensor
//! in once per channel where runs are short, and counting the runs in memory order instead touches
//! every channel's counts once per row (`C` histograms of `2H` bins are far beyond the caches).
//!
//! Why the result is bit-identical to adding each channel's strided view with `StreamHistogram::add`
//! (the path this replaces): the same function adds the same values, in the same order (the view's
//! C order: row by row, each run in order), as one batch; only where they are read from differs (a
//! copy instead of the tensor). And a streaming histogram after a batch depends only on the batch's
//! values as a multiset anyway (`stream_histogram`'s module doc).

use crate::numeric::fallible;
use crate::numeric::float::Float;
use crate::numeric::scan::PAR_CHUNK;
use crate::numeric::view::View;
use crate::stream::stream_histogram::StreamHistogram;
use rayon::prelude::*;
use std::cell::RefCell;

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
/// into groups of channels added in parallel (each group reads its part of every row).
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

/// Values gathered per chunk of channels (256 KiB of f32: in L2 with a histogram's counts).
const GATHER: usize = 1 << 16;
/// Runs shorter than this are gathered by a tiled transpose (`TILE` x `TILE` runs), longer ones
/// copied run by run.
const SHORT_RUN: usize = 16;
const TILE: usize = 16;

/// Add the channels `first..first + hists.len()`.
fn add_group<D: Float>(data: &[D], layout: ChannelLayout, first: usize, hists: &mut [&mut StreamHistogram]) {
    let (outer, inner) = (layout.outer, layout.inner);
    let per_channel = outer * inner;
    if outer <= 1 || per_channel == 0 {
        // each channel one run (or none): in place, as a slice (what `channel_view` holds, built
        // without its strides)
        let run = |k| if outer == 0 { &data[..0] } else { &data[layout.run_start(0, first + k)..][..inner] };
        StreamHistogram::add_each(hists, run, prefetch_next);
        return;
    }
    // Channels lie `pitch` values apart in the buffer: not a multiple of 4 KiB, so that the runs
    // a row scatters into the chunk's channels do not all fall in one cache set.
    let pitch = per_channel + 16;
    let chunk = (GATHER / pitch).clamp(1, hists.len());
    let words = (chunk * pitch * std::mem::size_of::<D>()).div_ceil(8);
    let mut gather = |held: &mut Vec<u64>| {
        if held.len() < words {
            held.clear();
            fallible::resize(held, words, 0);
        }
        // SAFETY: `held` holds at least chunk * pitch values of D (f16, f32 or f64: any bits are a
        // value, alignment at most 8), and is borrowed for this call only.
        let buffer: &mut [D] = unsafe { std::slice::from_raw_parts_mut(held.as_mut_ptr() as *mut D, chunk * pitch) };
        gather_and_add(data, layout, first, hists, chunk, pitch, buffer);
    };
    GATHERED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut held) => {
            gather(&mut held);
            if held.len() > GATHER {
                *held = Vec::new(); // a channel bigger than a chunk: not kept
            }
        }
        // this thread is inside another tensor's gathering (a big channel's `add` runs on the pool)
        Err(_) => gather(&mut Vec::new()),
    });
}

thread_local! {
    /// Each thread's gathering buffer, kept between tensors (8-byte words: any float type fits).
    static GATHERED: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Gather chunks of `chunk` channels into `buffer` (channels `pitch` values apart) and add each.
fn gather_and_add<D: Float>(
    data: &[D],
    layout: ChannelLayout,
    first: usize,
    hists: &mut [&mut StreamHistogram],
    chunk: usize,
    pitch: usize,
    buffer: &mut [D],
) {
    let (outer, inner, per_channel) = (layout.outer, layout.inner, layout.outer * layout.inner);
    for (i, part) in hists.chunks_mut(chunk).enumerate() {
        let (k0, n) = (first + i * chunk, part.len());
        if inner >= SHORT_RUN {
            for o in 0..outer {
                let row = &data[layout.run_start(o, k0)..layout.run_start(o, k0 + n)];
                for (k, run) in row.chunks_exact(inner).enumerate() {
                    buffer[k * pitch + o * inner..][..inner].copy_from_slice(run);
                }
            }
        } else {
            // short runs: a tiled transpose (`TILE` rows by `TILE` channels), both sides in L1
            for o0 in (0..outer).step_by(TILE) {
                // the chunk's part of the rows two tiles on (strided rows: the hardware would not)
                for o in (o0 + 2 * TILE)..(o0 + 3 * TILE).min(outer) {
                    prefetch(&data[layout.run_start(o, k0)..layout.run_start(o, k0 + n)]);
                }
                for c0 in (0..n).step_by(TILE) {
                    let c1 = (c0 + TILE).min(n);
                    for o in o0..(o0 + TILE).min(outer) {
                        let row = &data[layout.run_start(o, k0 + c0)..layout.run_start(o, k0 + c1)];
                        for (k, run) in row.chunks_exact(inner).enumerate() {
                            let at = (c0 + k) * pitch + o * inner;
                            for (j, &x) in run.iter().enumerate() {
                                buffer[at + j] = x;
                            }
                        }
                    }
                }
            }
        }
        StreamHistogram::add_each(part, |k| &buffer[k * pitch..][..per_channel], prefetch_next);
    }
}

/// Ask the caches for `values`.
fn prefetch<D>(values: &[D]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(values);
        let base = values.as_ptr() as *const i8;
        for at in (0..bytes).step_by(64) {
            // SAFETY: inside `values`; a prefetch never faults anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(at)) };
        }
    }
}

/// The next histogram's counts into the caches while histogram `k` counts its batch: the channels'
/// counts together are far beyond the caches, and each would otherwise be fetched line by line as
/// its values hit them. The histogram after it is asked for too (its fields, which say where its
/// counts are: read by the next call), the channels' histograms lying far apart.
fn prefetch_next(hists: &[&mut StreamHistogram], k: usize) {
    if let Some(next) = hists.get(k + 1) {
        next.prefetch_counts();
    }
    if let Some(after) = hists.get(k + 2) {
        prefetch(std::slice::from_ref::<StreamHistogram>(after));
    }
}

#[cfg(test)]
mod tests;
