//! The streaming histogram: one pass, bounded memory, and a final content that does not depend
//! on how the data was split into batches or in which order they came.
//!
//! `2H` bins (H a power of two) cover `[-2^level, 2^level)`; bin `s` (from `-H` to `H - 1`) holds
//! `[s w, (s + 1) w)` with `w = 2^level / H`. Both the bin of a value (`floor(v * 2^-k)`, a
//! power-of-two scaling) and a level increase (bins `2j` and `2j + 1` become bin `j`) are exact,
//! so the histogram after any sequence of batches equals the histogram of all values binned
//! directly at the final level, which only depends on the largest |x|. Non-finite values are
//! counted, never binned. ORT-shaped histograms for ORT's methods are derived from it at the end.
//!
//! Batches are counted into one byte per bin (`narrow`, exact: see `stream::narrow`) that is
//! added into the u64 bins when the level rises or the bins are read (`bins()`, `settle`).

use crate::methods::pow2;
use crate::methods::qerror::UniformHistogram;
use crate::numeric::fallible;
use crate::numeric::float::{py_max, Float};
use crate::numeric::scan::{scan, Scan, PAR_CHUNK};
use crate::numeric::view::View;
use crate::ort::histogram::{HistError, UniformBins};
use crate::ort::value_histogram::Held;
pub use crate::stream::levels::{level_for, raise_bins, MIN_LEVEL};
use crate::stream::narrow::{add_narrow, count_narrow, narrow_len, settle, window_of, with_blocks, CountsAt};
use crate::stream::stream_bins::{add_direct, batch_bins};
use std::borrow::Cow;

/// Batches from this many values on are counted by the direct kernel (`stream_bins::add_direct`):
/// its flush over the batch's span costs little per value there, and its u16 scatter is faster
/// than the narrow kernel's byte scatter with carries (measured by the former `examples/many_tensors.rs`;
/// `cargo bench --bench kernels` times the add today).
const NARROW_MAX: usize = 32768;

#[derive(Clone, Debug)]
pub struct StreamHistogram {
    /// log2 of H, the number of bins on each side of zero.
    pub log_half: u32,
    /// None until a finite value arrives.
    pub level: Option<i32>,
    /// `2H` counts, bin `s` at index `s + H`, less those still in `narrow` (read them with `bins()`).
    bins: Vec<u64>,
    /// The narrow counts (`stream::narrow`): empty until the first batch counted there.
    narrow: Vec<u8>,
    /// Whether `narrow` may hold counts (`bins` alone is the histogram otherwise).
    unsettled: bool,
    /// Whether every count lies between the bins of `finite_min` and `finite_max` (true unless
    /// restored otherwise): a level rise then only touches those bins.
    in_extremes: bool,
    /// Extremes over finite values, exact (the data's own values).
    pub finite_min: Option<f64>,
    pub finite_max: Option<f64>,
    pub abs_min: Option<f64>,
    pub n_finite: u64,
    pub n_nan: u64,
    pub n_posinf: u64,
    pub n_neginf: u64,
    pub batches: u64,
}

/// Watches each batch's own histogram (at the batch's own level, so independent of the batches
/// before it) as the batch is counted, with the largest finite value of the data's dtype: how a
/// collected summary such as pow2's per-batch votes sees a batch (`collection::summary`).
pub type BatchObserver<'o> = &'o mut (dyn FnMut(&UniformHistogram<'_>, f64) + Send);

fn pow2(k: i32) -> f64 {
    // exact for the exponent range used here (|k| < 1100), built in two steps to stay normal
    let half = k / 2;
    f64::powi(2.0, half) * f64::powi(2.0, k - half)
}

/// Equal histograms: the same content, wherever the counts are held (bins or narrow counts).
impl PartialEq for StreamHistogram {
    fn eq(&self, o: &Self) -> bool {
        self.log_half == o.log_half
            && self.level == o.level
            && self.finite_min == o.finite_min
            && self.finite_max == o.finite_max
            && self.abs_min == o.abs_min
            && (self.n_finite, self.n_nan, self.n_posinf, self.n_neginf, self.batches)
                == (o.n_finite, o.n_nan, o.n_posinf, o.n_neginf, o.batches)
            && self.bins() == o.bins()
    }
}

impl StreamHistogram {
    pub fn new(log_half: u32) -> Self {
        assert!((2..=24).contains(&log_half), "log_half must be in 2..=24");
        StreamHistogram {
            log_half,
            level: None,
            bins: fallible::zeroed(2 << log_half),
            narrow: Vec::new(),
            unsettled: false,
            in_extremes: true,
            finite_min: None,
            finite_max: None,
            abs_min: None,
            n_finite: 0,
            n_nan: 0,
            n_posinf: 0,
            n_neginf: 0,
            batches: 0,
        }
    }

    /// A copy with settled bins (allocated by `fallible`) and no narrow counts.
    pub fn copied(&self) -> Self {
        let bins = match self.bins() {
            Cow::Borrowed(b) => fallible::copy(b),
            Cow::Owned(b) => b,
        };
        StreamHistogram { bins, narrow: Vec::new(), unsettled: false, ..*self }
    }

    /// The `2H` counts, bin `s` at index `s + H`: borrowed when settled, else the bins plus the
    /// narrow counts (a copy; `settle` first to read them in place).
    pub fn bins(&self) -> Cow<'_, [u64]> {
        if !self.unsettled {
            return Cow::Borrowed(&self.bins);
        }
        let mut bins = fallible::copy(&self.bins);
        let mut narrow = fallible::copy(&self.narrow);
        settle(&mut bins, &mut narrow);
        Cow::Owned(bins)
    }

    /// Add the narrow counts into the bins (`bins()` then borrows them).
    pub fn settle(&mut self) {
        if self.unsettled {
            settle(&mut self.bins, &mut self.narrow);
            self.unsettled = false;
        }
    }

    /// Allocate the narrow counts on first use (before anything changes).
    fn allocate_narrow(&mut self) {
        if self.narrow.is_empty() {
            self.narrow = fallible::zeroed(narrow_len(self.log_half));
        }
    }

    /// Add one batch with the direct kernel (`stream_bins::add_direct`, no narrow counts): the
    /// reference the narrow kernel is tested and timed against.
    #[doc(hidden)]
    pub fn add_unbuffered<D: Float>(&mut self, view: &View<'_, D>) {
        self.settle();
        let sc = add_direct(view, self.log_half, &mut self.level, &mut self.bins);
        self.record(&sc);
    }

    pub fn half(&self) -> usize {
        1 << self.log_half
    }

    /// Bin width at the current level (None before any finite value).
    pub fn width(&self) -> Option<f64> {
        self.level.map(|l| pow2(l - self.log_half as i32))
    }

    /// Raise the level to `level` (if higher), merging bins exactly.
    pub fn raise(&mut self, level: i32) {
        match self.level {
            Some(cur) if level > cur => {
                self.settle();
                raise_bins(&mut self.bins, (level - cur) as u32)
            }
            Some(_) => return,
            None => {}
        }
        self.level = Some(level);
    }

    /// Add one batch.
    pub fn add<D: Float>(&mut self, view: &View<'_, D>) {
        self.add_observed(view, None)
    }

    /// Add one batch, showing its own histogram to `observe` (see [`BatchObserver`]).
    pub fn add_observed<D: Float>(&mut self, view: &View<'_, D>, observe: Option<BatchObserver<'_>>) {
        if observe.is_some() || view.len() > PAR_CHUNK {
            let sc = scan(view);
            self.add_scanned_observed(view, &sc, observe);
            return;
        }
        if view.len() >= NARROW_MAX {
            // the direct kernel's flush of a batch's span is paid by this many values
            self.add_unbuffered(view);
            return;
        }
        // one read of the data, into the narrow counts
        self.allocate_narrow();
        self.unsettled = true;
        let held = self.held();
        let sc = add_narrow(view, self.log_half, &mut self.level, &mut self.bins, &mut self.narrow, held);
        self.record(&sc);
    }

    /// Add `values(k)` as one batch of `hists[k]`, for each `k` in turn, calling `before(hists, k)`
    /// first: what `add` of each slice does, with the narrow kernel's setup (its buffers, the
    /// view of each batch) done once for all, which weighs where each holds a few hundred values
    /// (`stream::channel_rows`).
    pub fn add_each<'v, D: Float + 'v>(
        hists: &mut [&mut StreamHistogram],
        values: impl Fn(usize) -> &'v [D],
        before: impl Fn(&[&mut StreamHistogram], usize),
    ) {
        with_blocks(|blocks| {
            for k in 0..hists.len() {
                before(hists, k);
                let (v, h) = (values(k), &mut *hists[k]);
                if v.len() >= NARROW_MAX {
                    h.add(&View::from_slice(v)); // the direct kernel or parallel chunks, as `add`
                    continue;
                }
                h.allocate_narrow();
                h.unsettled = true;
                let held = h.held();
                let mut batch = blocks.batch::<D>(h.log_half, &mut h.level, &mut h.bins, &mut h.narrow, held);
                batch.add(v);
                let sc = batch.total;
                h.record(&sc);
            }
        })
    }

    /// Where the counts lie, for the narrow kernel's level rises.
    fn held(&self) -> CountsAt {
        match (self.in_extremes, self.finite_min, self.finite_max) {
            (false, _, _) => CountsAt::Anywhere,
            (true, Some(a), Some(b)) => CountsAt::Extremes(Some((a, b))),
            _ => CountsAt::Extremes(None),
        }
    }

    /// Count a batch's scan in the totals and extremes; its finite `(min, max)` if any.
    fn record<D: Float>(&mut self, sc: &Scan<D>) -> Option<(f64, f64)> {
        self.batches += 1;
        self.n_nan += sc.n_nan;
        self.n_posinf += sc.n_posinf;
        self.n_neginf += sc.n_neginf;
        let (Some(mn), Some(mx), Some(amn)) = (sc.finite_min, sc.finite_max, sc.finite_abs_min) else {
            return None;
        };
        // + 0.0 turns -0 into +0: which zero a scan returns depends on how the data was split
        let (mn, mx, amn) = (mn.to_f64() + 0.0, mx.to_f64() + 0.0, amn.to_f64());
        self.n_finite += sc.n_finite;
        self.finite_min = Some(self.finite_min.map_or(mn, |m| m.min(mn)));
        self.finite_max = Some(self.finite_max.map_or(mx, |m| m.max(mx)));
        self.abs_min = Some(self.abs_min.map_or(amn, |m| m.min(amn)));
        Some((mn, mx))
    }

    /// Add one batch whose scan is already known.
    pub fn add_scanned<D: Float>(&mut self, view: &View<'_, D>, sc: &Scan<D>) {
        self.add_scanned_observed(view, sc, None)
    }

    /// Add one batch whose scan is already known, showing its own histogram to `observe`.
    /// Everything that allocates (the batch's own histogram, what `observe` adds) happens before
    /// the histogram changes.
    pub fn add_scanned_observed<D: Float>(
        &mut self,
        view: &View<'_, D>,
        sc: &Scan<D>,
        observe: Option<BatchObserver<'_>>,
    ) {
        let (Some(lo), Some(hi), Some(_)) = (sc.finite_min, sc.finite_max, sc.finite_abs_min) else {
            self.record(sc);
            return;
        };
        let (mn, mx) = (lo.to_f64() + 0.0, hi.to_f64() + 0.0); // as `record` sees them
        let own = level_for(mn.abs().max(mx.abs()));
        let level = self.level.map_or(own, |l| l.max(own));
        let Some(observe) = observe else {
            if view.len() <= PAR_CHUNK {
                self.allocate_narrow();
                self.record(sc);
                self.raise(level); // settles, where the level rises
                self.unsettled = true;
                count_narrow(view, self.log_half, level, &mut self.bins, &mut self.narrow);
            } else {
                // big batches: the batch's own histogram, counted in parallel chunks, then added
                let batch = batch_bins(view, sc, self.log_half, level);
                self.record(sc);
                self.raise(level);
                batch.add_to(&mut self.bins);
            }
            return;
        };
        // The observer sees the batch's histogram at its own level (not the running level,
        // which depends on the batches before it); folding it up to the running level is exact.
        let batch = batch_bins(view, sc, self.log_half, own);
        let w = pow2(own - self.log_half as i32);
        let left = -pow2(own) + batch.first as f64 * w;
        // the batch's values are finite and inside its level's range: a valid histogram
        let hist = UniformHistogram::new(&batch.counts, left, w, mn, mx).expect("a batch histogram is valid");
        observe(&hist, D::MAX);
        self.record(sc);
        self.raise(level);
        let (h, shift) = (self.half() as i64, (level - own).min(62) as u32);
        for (i, &c) in batch.counts.iter().enumerate() {
            let s = (batch.first + i) as i64 - h;
            self.bins[((s >> shift) + h) as usize] += c;
        }
    }

    /// Ask the caches for the narrow counts that a batch like the ones before will touch, those
    /// between the bins of the finite minimum and maximum: a hint that changes nothing (used where
    /// many histograms take a batch each in turn, `stream::channel_rows`).
    pub fn prefetch_counts(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let (Some(level), Some(mn), Some(mx)) = (self.level, self.finite_min, self.finite_max) else { return };
            if self.narrow.is_empty() {
                return;
            }
            // x's bin, give or take one (a hint: truncation instead of floor, no division)
            let h = self.half() as f64;
            let scale = pow2::pow2((self.log_half as i32 - level).clamp(-1000, 1000));
            let at = |x: f64| (x * scale + h).clamp(0.0, 2.0 * h - 1.0) as usize;
            let base = self.narrow.as_ptr();
            for i in (at(mn)..=at(mx)).step_by(64) {
                // SAFETY: i < 2H < narrow.len(); a prefetch never faults anyway.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(i) as *const i8) };
            }
            // zeros (ReLU outputs: often most values) count in the zero slots after the 2H bytes,
            // and their bytes carry into bin 0 every 256: those lines too
            let h = self.half();
            // SAFETY: 2H + 1 < narrow.len() and H < bins.len().
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(base.add(2 * h + 1) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(self.bins.as_ptr().add(h) as *const i8);
            }
        }
    }

    /// Add another streaming histogram's data (same `log_half`): the result equals one
    /// histogram over both data sets.
    pub fn merge(&mut self, o: &StreamHistogram) -> Result<(), String> {
        if o.log_half != self.log_half {
            return Err(format!(
                "streaming histograms differ in size ({} vs {} bins)",
                2usize << self.log_half,
                2usize << o.log_half
            ));
        }
        let mut o = o.copied();
        if let Some(l) = o.level {
            self.raise(l);
        }
        if let Some(l) = self.level {
            o.raise(l);
        }
        self.bins.iter_mut().zip(&o.bins).for_each(|(a, b)| *a += b);
        let pick = |a: Option<f64>, b: Option<f64>, f: fn(f64, f64) -> f64| match (a, b) {
            (Some(x), Some(y)) => Some(f(x, y)),
            (x, None) => x,
            (None, y) => y,
        };
        self.finite_min = pick(self.finite_min, o.finite_min, f64::min);
        self.finite_max = pick(self.finite_max, o.finite_max, f64::max);
        self.abs_min = pick(self.abs_min, o.abs_min, f64::min);
        self.n_finite += o.n_finite;
        self.n_nan += o.n_nan;
        self.n_posinf += o.n_posinf;
        self.n_neginf += o.n_neginf;
        self.batches += o.batches;
        self.in_extremes &= o.in_extremes;
        Ok(())
    }

    /// The centre of signed bin index `i` (`0..2H`), as a function.
    fn signed_centre(&self) -> impl Fn(usize) -> f64 {
        let (w, h) = (self.width().unwrap_or(0.0), self.half() as i64);
        move |i| ((i as i64 - h) as f64 + 0.5) * w
    }

    /// The count of |x| bin `j` (`0..H`): bins `s` and `-s - 1` hold the same |x|.
    #[cfg(test)]
    fn abs_count(&self, j: usize) -> u64 {
        let h = self.half();
        let bins = self.bins();
        bins[h + j] + bins[h - 1 - j]
    }
}

/// The bin of `x` in `bins` as ORT's histogram would count it, values outside its range clamped
/// to the end bins.
fn target_bin<E: Float>(bins: &UniformBins<E>, x: f64) -> usize {
    let n = bins.n_bins();
    if x <= bins.first.to_f64() {
        0
    } else if x >= bins.last.to_f64() {
        n - 1
    } else {
        bins.bin_of(E::from_f64(x)).unwrap_or(if x < 0.0 { 0 } else { n - 1 })
    }
}

/// Put `(value, count)` pairs into `bins`, one value at a time.
fn rebin<E: Float>(bins: &UniformBins<E>, items: impl Iterator<Item = (f64, u64)>) -> Vec<i64> {
    let mut hist = fallible::zeroed(bins.n_bins());
    for (x, c) in items.filter(|&(_, c)| c != 0) {
        hist[target_bin(bins, x)] += c as i64;
    }
    hist
}

/// `rebin` of the `n` source bins with centres `centre(i)`, increasing with `i`, and counts
/// `count(i)`. In f32 and f64 numpy's bin of a value is exact (its estimate is within one bin of
/// the truth and corrected against the edges), so the target bin never decreases with `i`: each
/// run of source bins with one target is found by galloping and summed whole, a few bin lookups
/// per target bin instead of one per non-empty source bin, which pays when runs are long (16+
/// source bins per target). f16's estimate can be off by more than one bin: there every
/// non-empty bin is looked up.
fn rebin_increasing<E: Float>(
    bins: &UniformBins<E>,
    n: usize,
    centre: impl Fn(usize) -> f64,
    count: impl Fn(usize) -> u64,
) -> Vec<i64> {
    if E::NAME == "float16" || n < 16 * bins.n_bins() {
        return rebin(bins, (0..n).map(|i| (centre(i), count(i))));
    }
    let target = |i: usize| target_bin(bins, centre(i));
    let mut hist = fallible::zeroed(bins.n_bins());
    let mut start = 0;
    while start < n {
        let t = target(start);
        // the last index of the run: gallop to a bound, then bisect
        let (mut last, mut step, mut bound) = (start, 1, n);
        while last + step < n {
            if target(last + step) == t {
                last += step;
                step *= 2;
            } else {
                bound = last + step;
                break;
            }
        }
        while bound - last > 1 {
            let mid = last + (bound - last) / 2;
            if target(mid) == t {
                last = mid;
            } else {
                bound = mid;
            }
        }
        hist[t] += (start..=last).map(&count).sum::<u64>() as i64;
        start = last + 1;
    }
    hist
}

/// Every one of `count` values is `x` (the min equals the max): all go to the bin ORT's
/// histogram puts `x` in, exactly as ORT counts them (bin centres would be up to half a
/// streaming bin off).
fn single_value<E: Float>(bins: &UniformBins<E>, x: f64, count: u64) -> Vec<i64> {
    let mut hist = vec![0i64; bins.n_bins()];
    hist[target_bin(bins, x)] = count as i64;
    hist
}

fn held<E: Float>(v: Option<f64>) -> Held<E> {
    match v {
        Some(x) => Held::scalar(E::from_f64(x)),
        None => Held::array(E::ZERO),
    }
}

impl StreamHistogram {
    /// ORT's value histogram (`collect_value`) as one collect of all the data would build it:
    /// `n_bins` over `(-t, t)`, `t = max(|min|, |max|)`, counts re-binned from the streaming
    /// bins by their centres; where min equals max, all in that value's bin (ORT's histogram).
    pub fn to_value<E: Float>(
        &self,
        n_bins: usize,
    ) -> Result<crate::ort::value_histogram::ValueHistogram<E>, HistError> {
        let (mn, mx) = (held::<E>(self.finite_min), held::<E>(self.finite_max));
        let t = py_max(mn.value.abs(), mx.value.abs());
        let bins = UniformBins::new(t.neg(), t, n_bins)?;
        let hist = match (self.finite_min, self.finite_max) {
            (Some(a), Some(b)) if a == b => single_value(&bins, a, self.n_finite),
            _ => {
                let counts = self.bins();
                rebin_increasing(&bins, counts.len(), self.signed_centre(), |i| counts[i])
            }
        };
        Ok(crate::ort::value_histogram::ValueHistogram {
            hist,
            edges: bins.edges,
            min: mn,
            max: mx,
            threshold: Held::array(t),
        })
    }

    /// ORT's |x| histogram (`collect_absolute_value`, symmetric percentile) as one collect of
    /// all the data would build it: `n_bins` over `[min|x|, max|x|]`; where those are equal,
    /// every count in that value's bin (ORT's histogram).
    pub fn to_abs<E: Float>(&self, n_bins: usize) -> Result<crate::ort::abs_histogram::AbsHistogram<E>, HistError> {
        let (mn, mx) = (held::<E>(self.finite_min), held::<E>(self.finite_max));
        let (hist, edges) = match (self.abs_min, self.finite_min, self.finite_max) {
            (Some(lo), Some(a), Some(b)) => {
                let hi = a.abs().max(b.abs());
                let bins = UniformBins::new(E::from_f64(lo), E::from_f64(hi), n_bins)?;
                let hist = if lo == hi {
                    single_value(&bins, lo, self.n_finite)
                } else {
                    let w = self.width().unwrap_or(0.0);
                    let (counts, h) = (self.bins(), self.half());
                    rebin_increasing(&bins, h, |j| (j as f64 + 0.5) * w, |j| counts[h + j] + counts[h - 1 - j])
                };
                (hist, bins.edges)
            }
            _ => (fallible::zeroed(n_bins), UniformBins::<E>::empty_auto(n_bins)?.edges),
        };
        Ok(crate::ort::abs_histogram::AbsHistogram { hist, edges, min: mn, max: mx })
    }
}

/// A streaming histogram's counts: `(n_finite, n_nan, n_posinf, n_neginf, batches)`.
pub type StreamCounts = (u64, u64, u64, u64, u64);

impl StreamHistogram {
    /// A histogram from its exported parts (untrusted: a state file), or why they are
    /// inconsistent: `2H` bins adding up to the finite count, and a level and extremes given
    /// exactly when there are finite values, the level holding them.
    pub fn from_parts(
        log_half: u32,
        level: Option<i32>,
        bins: &[u64],
        finite_min: Option<f64>,
        finite_max: Option<f64>,
        abs_min: Option<f64>,
        counts: StreamCounts,
    ) -> Result<Self, String> {
        if bins.len() != 2usize << log_half {
            return Err(format!("{} bins, expected {}", bins.len(), 2usize << log_half));
        }
        let mut h = StreamHistogram::new(log_half);
        let (n_finite, n_nan, n_posinf, n_neginf, batches) = counts;
        let total: u128 = bins.iter().map(|&c| c as u128).sum();
        if total != n_finite as u128 {
            return Err("bin counts do not add up to the finite count".to_string());
        }
        match (level, finite_min, finite_max, abs_min) {
            (None, None, None, None) if n_finite == 0 => {}
            (Some(l), Some(mn), Some(mx), Some(amn)) if n_finite > 0 => {
                let m = mn.abs().max(mx.abs());
                let ok = mn.is_finite()
                    && mx.is_finite()
                    && amn.is_finite()
                    && mn <= mx
                    && 0.0 <= amn
                    && amn <= m
                    && (MIN_LEVEL..=1100).contains(&l)
                    && level_for(m) <= l;
                if !ok {
                    return Err("inconsistent level or extremes".to_string());
                }
            }
            _ => return Err("level and extremes must be given exactly when there are finite values".to_string()),
        }
        h.level = level;
        h.bins.copy_from_slice(bins);
        if let (Some(l), Some(mn), Some(mx)) = (level, finite_min, finite_max) {
            // a state whose counts lie outside its extremes' bins is still read as it is
            let (lo, hi) = window_of(log_half, l, mn, mx);
            h.in_extremes = bins[..lo].iter().chain(&bins[hi + 1..]).all(|&c| c == 0);
        }
        (h.finite_min, h.finite_max, h.abs_min) = (finite_min, finite_max, abs_min);
        (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches) = (n_finite, n_nan, n_posinf, n_neginf, batches);
        Ok(h)
    }
}

/// A streaming histogram as a uniform signed histogram: `2H` bins of width `2^(level - log2 H)`
/// from `-2^level`, their counts `bins` (`h.bins()`); None without finite values. Levels from
/// 1023 on (float64 data of magnitude 2^1022 or more) have no finite right edge and are an error.
pub fn as_uniform<'a>(h: &StreamHistogram, bins: &'a [u64]) -> Result<Option<UniformHistogram<'a>>, String> {
    let (Some(level), Some(min), Some(max)) = (h.level, h.finite_min, h.finite_max) else { return Ok(None) };
    if level >= 1023 {
        return Err("values of magnitude 2^1022 or more cannot be calibrated".to_string());
    }
    UniformHistogram::new(bins, -pow2::pow2(level), pow2::pow2(level - h.log_half as i32), min, max).map(Some)
}

#[cfg(test)]
mod tests;
