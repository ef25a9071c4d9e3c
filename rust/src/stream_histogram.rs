//! The streaming histogram: one pass, bounded memory, and a final content that does not depend
//! on how the data was split into batches or in which order they came.
//!
//! `2H` bins (H a power of two) cover `[-2^level, 2^level)`; bin `s` (from `-H` to `H - 1`) holds
//! `[s w, (s + 1) w)` with `w = 2^level / H`. Both the bin of a value (`floor(v * 2^-k)`, a
//! power-of-two scaling) and a level increase (bins `2j` and `2j + 1` become bin `j`) are exact,
//! so the histogram after any sequence of batches equals the histogram of all values binned
//! directly at the final level, which only depends on the largest |x|. Non-finite values are
//! counted, never binned. ORT-shaped histograms for ORT's methods are derived from it at the end.

use crate::fallible;
use crate::float::{py_max, Float};
use crate::histogram::{HistError, UniformBins};
use crate::scan::{scan, Scan, PAR_CHUNK};
use crate::pow2;
use crate::qerror::UniformHistogram;
use crate::stream_bins::{add_direct, batch_bins, count_direct, prepare_direct};
use std::collections::BTreeMap;
use crate::value_histogram::Held;
use crate::view::View;

/// The lowest level: every |x| below `2^MIN_LEVEL` shares the two centre bins.
pub const MIN_LEVEL: i32 = -140;

#[derive(Clone, Debug, PartialEq)]
pub struct StreamHistogram {
    /// log2 of H, the number of bins on each side of zero.
    pub log_half: u32,
    /// None until a finite value arrives.
    pub level: Option<i32>,
    /// `2H` counts, bin `s` at index `s + H`.
    pub bins: Vec<u64>,
    /// Extremes over finite values, exact (the data's own values).
    pub finite_min: Option<f64>,
    pub finite_max: Option<f64>,
    pub abs_min: Option<f64>,
    pub n_finite: u64,
    pub n_nan: u64,
    pub n_posinf: u64,
    pub n_neginf: u64,
    pub batches: u64,
    /// pow2 MinMSE MostCommon's per-batch votes, when collected: `(type index in
    /// Pow2Type::ALL, exponent) -> batches` (each batch votes for its own MinMSE exponent).
    pub pow2_votes: Option<BTreeMap<(u8, i32), u64>>,
}

/// The smallest level whose range holds `m` (`m < 2^level`), at least `MIN_LEVEL`.
pub fn level_for(m: f64) -> i32 {
    if !(m > 0.0) {
        return MIN_LEVEL;
    }
    let bits = m.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    // m = 1.f * 2^(exp - 1023) for normal m, so 2^(exp - 1022) is the first power above it.
    let level = if exp == 0 { -1022 } else { exp - 1022 };
    level.max(MIN_LEVEL)
}

/// Merge `2H` bins (bin `s` at index `s + H`) up by `shift` levels in place: bin `s` goes to
/// `s >> shift`. Bins `s >= 0` move down (to `s >> shift <= s`) and negative ones up, so
/// walking each side away from zero only writes to bins already visited.
pub fn raise_bins(bins: &mut [u64], shift: u32) {
    let h = bins.len() / 2;
    let k = shift.min(62);
    for i in (h..bins.len()).chain((0..h).rev()) {
        let c = std::mem::take(&mut bins[i]);
        if c != 0 {
            bins[(((i as i64 - h as i64) >> k) + h as i64) as usize] += c;
        }
    }
}

fn pow2(k: i32) -> f64 {
    // exact for the exponent range used here (|k| < 1100), built in two steps to stay normal
    let half = k / 2;
    f64::powi(2.0, half) * f64::powi(2.0, k - half)
}

impl StreamHistogram {
    pub fn new(log_half: u32) -> Self {
        assert!((2..=24).contains(&log_half), "log_half must be in 2..=24");
        StreamHistogram {
            log_half,
            level: None,
            bins: fallible::zeroed(2 << log_half),
            finite_min: None,
            finite_max: None,
            abs_min: None,
            n_finite: 0,
            n_nan: 0,
            n_posinf: 0,
            n_neginf: 0,
            batches: 0,
            pow2_votes: None,
        }
    }

    /// A copy (`clone`, with the bins allocated by `fallible`).
    pub fn copied(&self) -> Self {
        StreamHistogram { bins: fallible::copy(&self.bins), pow2_votes: self.pow2_votes.clone(), ..*self }
    }

    /// A histogram that also collects pow2 MostCommon's per-batch votes (one pow2 MinMSE
    /// search per batch and type: opt-in).
    pub fn with_pow2_votes(log_half: u32) -> Self {
        StreamHistogram { pow2_votes: Some(BTreeMap::new()), ..StreamHistogram::new(log_half) }
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
            Some(cur) if level > cur => raise_bins(&mut self.bins, (level - cur) as u32),
            Some(_) => return,
            None => {}
        }
        self.level = Some(level);
    }

    /// Add one batch.
    pub fn add<D: Float>(&mut self, view: &View<D>) {
        if self.pow2_votes.is_some() || view.len() > PAR_CHUNK {
            let sc = scan(view);
            self.add_scanned(view, &sc);
            return;
        }
        // one read of the data, straight into the bins
        let sc = add_direct(view, self.log_half, &mut self.level, &mut self.bins);
        self.record(&sc);
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

    /// Add one batch whose scan is already known. Everything that allocates (the batch's own
    /// histogram, the pow2 votes) happens before the histogram changes.
    pub fn add_scanned<D: Float>(&mut self, view: &View<D>, sc: &Scan<D>) {
        let (Some(lo), Some(hi), Some(_)) = (sc.finite_min, sc.finite_max, sc.finite_abs_min) else {
            self.record(sc);
            return;
        };
        let (mn, mx) = (lo.to_f64() + 0.0, hi.to_f64() + 0.0); // as `record` sees them
        let own = level_for(mn.abs().max(mx.abs()));
        let level = self.level.map_or(own, |l| l.max(own));
        if self.pow2_votes.is_none() {
            if view.len() <= PAR_CHUNK {
                prepare_direct(self.log_half);
                self.record(sc);
                self.raise(level);
                count_direct(view, self.log_half, level, lo, hi, &mut self.bins);
            } else {
                // big batches: the batch's own histogram, counted in parallel chunks, then added
                let batch = batch_bins(view, sc, self.log_half, level);
                self.record(sc);
                self.raise(level);
                batch.add_to(&mut self.bins);
            }
            return;
        }
        // The vote comes from the batch's histogram at its own level (not the running level,
        // which depends on the batches before it); folding it up to the running level is exact.
        let batch = batch_bins(view, sc, self.log_half, own);
        let w = pow2(own - self.log_half as i32);
        let left = -pow2(own) + batch.first as f64 * w;
        // the batch's values are finite and inside its level's range: a valid histogram
        let hist = UniformHistogram::new(&batch.counts, left, w, mn, mx).expect("a batch histogram is valid");
        let batch_votes = pow2::batch_votes(hist, D::MAX);
        self.record(sc);
        self.raise(level);
        let votes = self.pow2_votes.as_mut().expect("checked above");
        for (t, k) in batch_votes.into_iter().enumerate() {
            if let Some(k) = k {
                *votes.entry((t as u8, k)).or_insert(0) += 1;
            }
        }
        let (h, shift) = (self.half() as i64, (level - own).min(62) as u32);
        for (i, &c) in batch.counts.iter().enumerate() {
            let s = (batch.first + i) as i64 - h;
            self.bins[((s >> shift) + h) as usize] += c;
        }
    }

    /// Add another streaming histogram's data (same `log_half`): the result equals one
    /// histogram over both data sets.
    pub fn merge(&mut self, o: &StreamHistogram) -> Result<(), String> {
        if o.log_half != self.log_half {
            return Err(format!("streaming histograms differ in size ({} vs {} bins)", 2usize << self.log_half, 2usize << o.log_half));
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
        // votes survive only when both sides have them (otherwise some batches never voted)
        self.pow2_votes = match (self.pow2_votes.take(), &o.pow2_votes) {
            (Some(mut a), Some(b)) => {
                for (key, n) in b {
                    *a.entry(*key).or_insert(0) += n;
                }
                Some(a)
            }
            _ => None,
        };
        Ok(())
    }

    /// The centre of signed bin index `i` (`0..2H`), as a function.
    fn signed_centre(&self) -> impl Fn(usize) -> f64 {
        let (w, h) = (self.width().unwrap_or(0.0), self.half() as i64);
        move |i| ((i as i64 - h) as f64 + 0.5) * w
    }

    /// The count of |x| bin `j` (`0..H`): bins `s` and `-s - 1` hold the same |x|.
    fn abs_count(&self, j: usize) -> u64 {
        let h = self.half();
        self.bins[h + j] + self.bins[h - 1 - j]
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
fn rebin_increasing<E: Float>(bins: &UniformBins<E>, n: usize, centre: impl Fn(usize) -> f64, count: impl Fn(usize) -> u64) -> Vec<i64> {
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
    pub fn to_value<E: Float>(&self, n_bins: usize) -> Result<crate::value_histogram::ValueHistogram<E>, HistError> {
        let (mn, mx) = (held::<E>(self.finite_min), held::<E>(self.finite_max));
        let t = py_max(mn.value.abs(), mx.value.abs());
        let bins = UniformBins::new(t.neg(), t, n_bins)?;
        let hist = match (self.finite_min, self.finite_max) {
            (Some(a), Some(b)) if a == b => single_value(&bins, a, self.n_finite),
            _ => rebin_increasing(&bins, self.bins.len(), self.signed_centre(), |i| self.bins[i]),
        };
        Ok(crate::value_histogram::ValueHistogram { hist, edges: bins.edges, min: mn, max: mx, threshold: Held::array(t) })
    }

    /// ORT's |x| histogram (`collect_absolute_value`, symmetric percentile) as one collect of
    /// all the data would build it: `n_bins` over `[min|x|, max|x|]`; where those are equal,
    /// every count in that value's bin (ORT's histogram).
    pub fn to_abs<E: Float>(&self, n_bins: usize) -> Result<crate::abs_histogram::AbsHistogram<E>, HistError> {
        let (mn, mx) = (held::<E>(self.finite_min), held::<E>(self.finite_max));
        let (hist, edges) = match (self.abs_min, self.finite_min, self.finite_max) {
            (Some(lo), Some(a), Some(b)) => {
                let hi = a.abs().max(b.abs());
                let bins = UniformBins::new(E::from_f64(lo), E::from_f64(hi), n_bins)?;
                let hist = if lo == hi {
                    single_value(&bins, lo, self.n_finite)
                } else {
                    let w = self.width().unwrap_or(0.0);
                    rebin_increasing(&bins, self.half(), |j| (j as f64 + 0.5) * w, |j| self.abs_count(j))
                };
                (hist, bins.edges)
            }
            _ => (fallible::zeroed(n_bins), UniformBins::<E>::empty_auto(n_bins)?.edges),
        };
        Ok(crate::abs_histogram::AbsHistogram { hist, edges, min: mn, max: mx })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    /// The scalar algorithm the vectorised kernel replaced, kept as the reference: each value
    /// widened to f64, scaled by `2^k`, floored, clamped.
    fn reference_bins<D: Float>(data: &[D], log_half: u32, level: i32) -> Vec<u64> {
        let scale = pow2(log_half as i32 - level);
        let h = 1i64 << log_half;
        let mut counts = vec![0u64; 2 * h as usize];
        for &x in data {
            let v = x.to_f64();
            if v.is_finite() {
                let f = (v * scale).floor();
                // a negative value whose scaled form underflowed to -0 belongs below zero
                let s = if f == 0.0 && v < 0.0 { -1 } else { f as i64 };
                counts[(s.clamp(-h, h - 1) + h) as usize] += 1;
            }
        }
        counts
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Values that sit on or next to the bin edges `j * 2^(level - log_half)` of `level`, the
    /// powers of two, the ends of the type's range, signed zeros and subnormals.
    fn edge_values(log_half: u32, level: i32, rng: &mut Rng) -> Vec<f64> {
        let w = pow2(level - log_half as i32);
        let h = 1i64 << log_half;
        let mut v = Vec::new();
        for _ in 0..2000 {
            let j = rng.below(2 * h as u64 + 3) as i64 - h - 1;
            v.push(j as f64 * w);
        }
        for e in -1080..1030 {
            v.push(pow2(e));
        }
        v.extend([0.0, f64::MIN_POSITIVE, 5e-324, f64::MAX, f32::MAX as f64, f32::MIN_POSITIVE as f64, 1e-45, 65504.0, 6e-8]);
        let pos: Vec<f64> = v.clone();
        for x in pos {
            v.extend([-x, f64::from_bits(x.to_bits() + 1), f64::from_bits(x.to_bits().saturating_sub(1))]);
        }
        v
    }

    /// `batch_bins` as all `2H` bins.
    fn dense_bins<D: Float>(data: &[D], log_half: u32, level: i32) -> Vec<u64> {
        let v = View::from_slice(data);
        let mut bins = vec![0; 2 << log_half];
        batch_bins(&v, &scan(&v), log_half, level).add_to(&mut bins);
        bins
    }

    /// `batch_bins` against the reference for data of type `D` at `level`, at every SIMD tier,
    /// contiguous and strided.
    fn check<D: Float>(data: &[D], log_half: u32, level: i32) {
        let want = reference_bins(data, log_half, level);
        for tier in [0u8, 1, 2] {
            crate::simd::set_max_tier(tier);
            assert!(dense_bins(data, log_half, level) == want, "{} tier {tier} log_half {log_half} level {level}", D::NAME);
        }
        crate::simd::set_max_tier(2);
        if data.len() >= 2 {
            // every other element: the gathered-block path
            let odd = data.len() / 2;
            let v = unsafe { View::from_raw(data.as_ptr(), &[odd], &[2]) };
            let every_other: Vec<D> = data.iter().step_by(2).take(odd).copied().collect();
            let mut got = vec![0; 2 << log_half];
            batch_bins(&v, &scan(&v), log_half, level).add_to(&mut got);
            assert!(got == reference_bins(&every_other, log_half, level), "strided");
        }
    }

    #[test]
    fn f16_bins_match_the_reference_for_every_value_and_level() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for log_half in [2, 13] {
            for level in (MIN_LEVEL..=40).chain([127, 128, 129, 300, 1100]) {
                check(&all, log_half, level);
            }
        }
    }

    #[test]
    fn f32_bins_match_the_reference() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for log_half in [2, 3, 8, 13] {
            for level in (MIN_LEVEL..=140).chain([200, 1024, 1100]) {
                let mut data: Vec<f32> = (0..3000).map(|_| f32::from_bits(rng.next() as u32)).collect();
                data.extend(edge_values(log_half, level, &mut rng).iter().map(|&x| x as f32));
                check(&data, log_half, level);
            }
        }
    }

    #[test]
    fn f64_bins_match_the_reference() {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        for log_half in [2, 3, 8, 13] {
            let levels: Vec<i32> = (MIN_LEVEL..=140).step_by(7).chain([-1, 0, 1, 960, 1021, 1022, 1023, 1024, 1025, 1074, 1076, 1100]).collect();
            for level in levels {
                let mut data: Vec<f64> = (0..3000).map(|_| f64::from_bits(rng.next())).collect();
                data.extend(edge_values(log_half, level, &mut rng));
                check(&data, log_half, level);
            }
        }
    }

    #[test]
    fn large_batches_and_streams_match_the_reference() {
        // Several parallel chunks, ReLU-like data (half exact zeros), runs of one value longer
        // than a u16 counter holds, and whole streams of batches through `add` (levels raised
        // by the data as it comes).
        let mut rng = Rng(7);
        let mut data: Vec<f32> = (0..(3 << 20) + 5).map(|i| if i % 2 == 0 { 0.0 } else { (rng.below(1 << 20) as f32 - 4e5) * 1e-3 }).collect();
        data[..200_000].fill(0.25);
        data[200_000..800_000].fill(0.0);
        check(&data, 13, 10);
        let batches: Vec<&[f32]> = data.chunks(1 << 19).collect();
        let mut h = StreamHistogram::new(13);
        let mut want = StreamHistogram::new(13);
        for (i, b) in batches.iter().enumerate() {
            let scaled: Vec<f32> = b.iter().map(|&x| x * (i + 1) as f32).collect();
            h.add(&View::from_slice(&scaled));
            let level = h.level.unwrap();
            want.raise(level);
            want.bins.iter_mut().zip(reference_bins(&scaled, 13, level)).for_each(|(a, b)| *a += b);
            assert!(h.bins == want.bins, "batch {i}");
        }
    }

    fn hist_of(batches: &[Vec<f32>], log_half: u32) -> StreamHistogram {
        let mut h = StreamHistogram::new(log_half);
        for b in batches {
            h.add(&View::from_slice(b));
        }
        h
    }

    #[test]
    fn level_is_the_first_power_of_two_above() {
        assert_eq!(level_for(1.0), 1);
        assert_eq!(level_for(0.99), 0);
        assert_eq!(level_for(3.0), 2);
        assert_eq!(level_for(4.0), 3);
        assert_eq!(level_for(0.0), MIN_LEVEL);
    }

    #[test]
    fn bins_are_half_open_and_exact() {
        let h = hist_of(&[vec![-1.0, -0.25, 0.0, 0.25, 0.999]], 2);
        // level 1: [-2, 2) in 8 bins of 0.5
        assert_eq!(h.level, Some(1));
        assert_eq!(h.bins, vec![0, 0, 1, 1, 2, 1, 0, 0]);
    }

    /// Batches through `add` (one read, levels raised mid-batch as blocks bring larger values)
    /// against the reference binning of all values at the final level, at every SIMD tier,
    /// contiguous and strided; totals and extremes against a plain count.
    fn check_stream<D: Float>(batches: &[Vec<D>], log_half: u32) {
        let all: Vec<D> = batches.concat();
        let finite: Vec<f64> = all.iter().map(|x| x.to_f64()).filter(|x| x.is_finite()).collect();
        let top = finite.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        let level = (!finite.is_empty()).then(|| level_for(top));
        for tier in [0u8, 1, 2] {
            crate::simd::set_max_tier(tier);
            let mut h = StreamHistogram::new(log_half);
            let mut strided = StreamHistogram::new(log_half);
            for b in batches {
                h.add(&View::from_slice(b));
                // the same values, every other element of a buffer twice as long
                let doubled: Vec<D> = b.iter().flat_map(|&x| [x, D::ZERO]).collect();
                strided.add(&unsafe { View::from_raw(doubled.as_ptr(), &[b.len()], &[2]) });
            }
            assert_eq!(h.level, level, "{} tier {tier}", D::NAME);
            let want = level.map_or(vec![0; 2 << log_half], |l| reference_bins(&all, log_half, l));
            assert!(h.bins == want, "{} tier {tier} log_half {log_half}", D::NAME);
            assert_eq!(strided, h, "{} strided, tier {tier}", D::NAME);
            assert_eq!(h.n_finite as usize, finite.len());
            assert_eq!(h.n_nan as usize, all.iter().filter(|x| x.to_f64().is_nan()).count());
            assert_eq!(h.finite_min, finite.iter().copied().reduce(f64::min).map(|m| m + 0.0));
            assert_eq!(h.finite_max, finite.iter().copied().reduce(f64::max).map(|m| m + 0.0));
        }
        crate::simd::set_max_tier(2);
    }

    /// Mixed-magnitude batches: small values first (a low level), then larger ones mid-batch.
    fn growing<D: Float>(values: &[f64], n_batches: usize) -> Vec<Vec<D>> {
        let mut sorted = values.to_vec();
        sorted.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
        let per = sorted.len().div_ceil(n_batches);
        sorted.chunks(per).map(|c| c.iter().map(|&x| D::from_f64(x)).collect()).collect()
    }

    #[test]
    fn one_read_add_matches_the_reference() {
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        // every f16, in batches of growing magnitude (NaN and Inf among them)
        let halves: Vec<f64> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f64()).collect();
        for log_half in [2, 13] {
            check_stream::<f16>(&growing(&halves, 5), log_half);
        }
        for log_half in [3, 13] {
            let mut v: Vec<f64> = (0..20_000).map(|_| f32::from_bits(rng.next() as u32) as f64).collect();
            for level in [-140, -20, 0, 3, 40, 127] {
                v.extend(edge_values(log_half, level, &mut rng).iter().map(|&x| x as f32 as f64));
            }
            check_stream::<f32>(&growing(&v, 7), log_half);
            // the same values shuffled: levels rise inside blocks
            let mut shuffled = v.clone();
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, rng.below(i as u64 + 1) as usize);
            }
            check_stream::<f32>(&growing(&shuffled[..5000], 1), log_half);
            let mut w: Vec<f64> = (0..20_000).map(|_| f64::from_bits(rng.next())).collect();
            for level in [-140, 0, 40, 1022, 1024] {
                w.extend(edge_values(log_half, level, &mut rng));
            }
            check_stream::<f64>(&growing(&w, 7), log_half);
        }
        // empty batches, all-NaN batches, all zeros (with -0), then data
        let nan = f32::NAN;
        check_stream::<f32>(&[vec![], vec![nan, f32::INFINITY], vec![-0.0, 0.0, -0.0], vec![1.5, -3.0, nan]], 13);
    }

    /// to_value/to_abs (galloping over runs of source bins) against one lookup per source bin.
    fn check_rebin<E: Float>(h: &StreamHistogram, nb: usize) {
        let Ok(v) = h.to_value::<E>(nb) else {
            return; // no such histogram in E (f16 out of range): nothing to re-bin
        };
        let bins = UniformBins::new(v.edges[0], v.edges[nb], nb).unwrap();
        assert_eq!(bins.edges, v.edges);
        let c = h.signed_centre();
        // (a single value goes to its own bin instead: constant_tensors_get_orts_histograms)
        if h.finite_min != h.finite_max {
            assert_eq!(v.hist, rebin(&bins, (0..h.bins.len()).map(|i| (c(i), h.bins[i]))), "{} value, {nb} bins", E::NAME);
        }
        let single_abs = h.abs_min == h.finite_min.zip(h.finite_max).map(|(a, b)| a.abs().max(b.abs()));
        if let (true, false, Ok(a)) = (h.n_finite > 0, single_abs, h.to_abs::<E>(nb)) {
            let bins = UniformBins::new(a.edges[0], a.edges[nb], nb).unwrap();
            let w = h.width().unwrap();
            assert_eq!(a.hist, rebin(&bins, (0..h.half()).map(|j| ((j as f64 + 0.5) * w, h.abs_count(j)))), "{} abs, {nb} bins", E::NAME);
        }
    }

    #[test]
    fn galloping_rebin_equals_one_lookup_per_bin() {
        let mut rng = Rng(0xC0FF_EE00_1234_5678);
        for case in 0..300 {
            let log_half = [3u32, 8, 13][case % 3];
            let scale = pow2(rng.below(80) as i32 - 40);
            let n = 1 + rng.below(6000) as usize;
            let data: Vec<f32> = (0..n)
                .map(|i| {
                    let u = (rng.below(1 << 24) as f64 / (1 << 23) as f64 - 1.0) * scale;
                    match case % 5 {
                        0 => u as f32,                                                  // uniform, both signs
                        1 => u.max(0.0) as f32,                                         // ReLU
                        2 => if i % 997 == 0 { (u * 300.0) as f32 } else { u as f32 },  // outliers
                        3 => (scale * 0.75) as f32,                                     // constant
                        _ => (u * u / scale + scale) as f32,                            // skewed, positive
                    }
                })
                .collect();
            let mut h = StreamHistogram::new(log_half);
            h.add(&View::from_slice(&data));
            for nb in [1usize, 7, 128, 1000, 2048] {
                check_rebin::<f32>(&h, nb);
                check_rebin::<f64>(&h, nb);
                check_rebin::<half::f16>(&h, nb.min(64));
            }
        }
    }

    #[test]
    fn raise_in_place_equals_merging_bins() {
        let mut rng = Rng(99);
        for log_half in [2u32, 5, 13] {
            let h = 1i64 << log_half;
            let bins: Vec<u64> = (0..2 * h).map(|_| if rng.below(3) == 0 { 0 } else { rng.below(1000) }).collect();
            for shift in [1u32, 2, 3, 7, 30, 62, 100] {
                let mut want = vec![0u64; bins.len()];
                for (i, &c) in bins.iter().enumerate() {
                    want[(((i as i64 - h) >> shift.min(62)) + h) as usize] += c;
                }
                let mut got = bins.clone();
                raise_bins(&mut got, shift);
                assert_eq!(got, want, "log_half {log_half} shift {shift}");
            }
        }
    }

    #[test]
    fn result_does_not_depend_on_split_or_order() {
        let data: Vec<f32> = (0..20_000).map(|i| ((i * 7919 % 10007) as f32 - 5000.0) * 1e-3 * (1 + i % 7) as f32).collect();
        let whole = hist_of(&[data.clone()], 8);
        let mut parts: Vec<Vec<f32>> = data.chunks(777).map(|c| c.to_vec()).collect();
        parts.reverse();
        let split = hist_of(&parts, 8);
        assert_eq!(whole.bins, split.bins);
        assert_eq!(whole.level, split.level);
        // a small batch first, then the large ones: the level grows by merging
        let mut grow = vec![vec![1e-6f32, -2e-7]];
        grow.extend(parts);
        let mut direct = vec![vec![1e-6f32, -2e-7]];
        direct.push(data);
        assert_eq!(hist_of(&grow, 8).bins, hist_of(&direct, 8).bins);
    }

    #[test]
    fn pow2_votes_do_not_change_the_histogram_or_depend_on_order() {
        let big: Vec<f32> = (0..3000).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.37).collect();
        let small: Vec<f32> = (0..3000).map(|i| ((i * 31 % 997) as f32 - 498.0) * 1e-3).collect();
        for order in [[&big, &small], [&small, &big]] {
            let mut voting = StreamHistogram::with_pow2_votes(10);
            let mut plain = StreamHistogram::new(10);
            for b in order {
                voting.add(&View::from_slice(b));
                plain.add(&View::from_slice(b));
            }
            assert_eq!(voting.bins, plain.bins);
            // each batch votes as it would alone
            let mut alone = StreamHistogram::with_pow2_votes(10);
            alone.add(&View::from_slice(&small));
            let mut want = alone.pow2_votes.clone().unwrap();
            let mut other = StreamHistogram::with_pow2_votes(10);
            other.add(&View::from_slice(&big));
            for (k, n) in other.pow2_votes.unwrap() {
                *want.entry(k).or_insert(0) += n;
            }
            assert_eq!(voting.pow2_votes.unwrap(), want);
        }
    }

    #[test]
    fn merge_equals_one_pass() {
        let a: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01 - 3.0).collect();
        let b: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 100.0).collect();
        let mut ha = hist_of(&[a.clone()], 6);
        ha.merge(&hist_of(&[b.clone()], 6)).unwrap();
        assert_eq!(ha, hist_of(&[a, b], 6));
    }

    #[test]
    fn non_finite_values_are_counted_not_binned() {
        let h = hist_of(&[vec![f32::NAN, f32::INFINITY, -1.0, f32::NEG_INFINITY]], 3);
        assert_eq!((h.n_finite, h.n_nan, h.n_posinf, h.n_neginf), (1, 1, 1, 1));
        assert_eq!(h.bins.iter().sum::<u64>(), 1);
    }

    #[test]
    fn ort_shaped_histograms_hold_every_value() {
        let data: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let h = hist_of(&[data], 13);
        let v = h.to_value::<f32>(2048).unwrap();
        assert_eq!(v.hist.iter().sum::<i64>(), 5000);
        let a = h.to_abs::<f32>(2048).unwrap();
        assert_eq!(a.hist.iter().sum::<i64>(), 5000);
    }

    /// numpy's histogram of `x` (or `|x|`) over `[first, last]`, counted in `E`.
    fn numpy_hist<E: Float>(x: &[f32], first: E, last: E, n: usize, abs: bool) -> (Vec<i64>, Vec<E>)
    where
        f32: crate::float::Widen<E>,
    {
        let bins = UniformBins::new(first, last, n).unwrap();
        let mut c = vec![0; n];
        bins.count(&View::from_slice(x), abs, &mut c);
        (c, bins.edges)
    }

    #[test]
    fn constant_tensors_get_orts_histograms() {
        // Bin centres sit up to half a streaming bin from the value: where min == max the
        // counts go to the value's own bin, as ORT counts them.
        for c in [0.0f32, -0.0, 1.0, -2.5, 3.7, 1e-30, -7.0, 1e20, f32::MAX, f32::MIN, 3e38] {
            let data = vec![c; 37];
            let h = hist_of(&[data[..20].to_vec(), data[20..].to_vec()], 13);
            for n in [7, 128, 2048] {
                let v = h.to_value::<f32>(n);
                let t = c.abs();
                match UniformBins::new(-t, t, n) {
                    Ok(_) => {
                        let v = v.unwrap();
                        assert_eq!((v.hist, v.edges), numpy_hist(&data, -t, t, n, false), "value c={c} n={n}");
                    }
                    Err(_) => {
                        let v = h.to_value::<f64>(n).unwrap();
                        assert_eq!((v.hist, v.edges), numpy_hist(&data, -(t as f64), t as f64, n, false), "value f64 c={c} n={n}");
                    }
                }
                match h.to_abs::<f32>(n) {
                    Ok(a) => assert_eq!((a.hist, a.edges), numpy_hist(&data, t, t, n, true), "abs c={c} n={n}"),
                    Err(_) => {
                        let a = h.to_abs::<f64>(n).unwrap();
                        assert_eq!((a.hist, a.edges), numpy_hist(&data, t as f64, t as f64, n, true), "abs f64 c={c} n={n}");
                    }
                }
            }
        }
    }
}
