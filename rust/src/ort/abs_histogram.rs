//! ORT's `collect_absolute_value` histogram (symmetric Percentile): a histogram of |x| whose
//! first batch fixes `[min|x|, max|x|]` and whose later batches extend it upwards with
//! `np.arange` edges that numpy evaluates in float64.
//!
//! Deviation, documented: ORT silently drops later values below the first batch's min|x| (and
//! values above an extension that `np.arange`'s rounding left short). histocal keeps them by
//! adding bins of the same width below (or above); where ORT drops nothing, the result is
//! identical.
//!
//! Cap: after a merge the histogram has at most `MAX_BINS` bins, ORT's extension and those
//! extra bins counted alike; beyond, the merge fails with `TooManyBins`. Near the cap histocal
//! can therefore refuse where ORT, dropping the values, still computes.
//!
//! Open top: numpy computes the extension in f64, so its edges may pass the largest finite `E`
//! (65504 for f16); ORT counts against those finite f64 edges and then stores them in `E`,
//! where they become `+inf`. ORT keeps that state, and so does histocal: from then on
//! `amax > edges[-1]` never holds (no more extensions), and `np.histogram` against the stored
//! edges puts every finite `|x| >= ` the last finite edge in the bin ending at the first `inf`,
//! and `|x| == inf` in the last bin, which makes infinities (and their `nanmin`/`nanmax`)
//! part of ORT's result rather than an error.

use crate::numeric::fallible;
use crate::numeric::float::{Float, Widen};
use crate::numeric::scan::Scan;
use crate::ort::binning::Binning;
use crate::ort::histogram::{arange_f64, HistError, UniformBins, MAX_BINS};
use crate::ort::value_histogram::{batch_min_max, first_min_max, Held};

#[derive(Clone, Debug, PartialEq)]
pub struct AbsHistogram<E> {
    pub hist: Vec<i64>,
    pub edges: Vec<E>,
    pub min: Held<E>,
    pub max: Held<E>,
}

impl<E: Float> AbsHistogram<E> {
    /// The first collect: `np.histogram(|x|, n)` over the automatic range `[min|x|, max|x|]`.
    /// Returns the empty histogram and the binning its batches are then counted with.
    pub fn first<D: Float + Widen<E>>(scan: &Scan<D>, n_bins: usize) -> Result<(Self, Binning<E>), HistError> {
        let (mn, mx) = first_min_max::<D, E>(scan);
        let (edges, binning) = match (scan.finite_abs_min, scan.finite_abs_max) {
            (Some(lo), Some(hi)) => {
                let bins = UniformBins::new(lo.widen(), hi.widen(), n_bins)?;
                (fallible::copy(&bins.edges), Binning::Uniform { bins, abs: true })
            }
            _ => (UniformBins::<E>::empty_auto(n_bins)?.edges, Binning::Nothing),
        };
        Ok((AbsHistogram { hist: fallible::zeroed(n_bins), edges, min: mn, max: mx }, binning))
    }

    /// A later collect: extend the edges if needed and lay the old counts on them; returns the
    /// binning (|x| against those edges) the collect's batches are counted with. Fails, leaving
    /// the state unchanged, where numpy's `arange` fails (ORT raises), where the bins histocal
    /// adds to keep values ORT drops would overflow `E`, or where the merged histogram would
    /// have more than `MAX_BINS` bins (the caller then widens `E`).
    pub fn merge<D: Float + Widen<E>>(&mut self, scan: &Scan<D>) -> Result<Binning<E>, HistError> {
        // ORT raises on a later infinity only through the extension's `arange`; with an open
        // top there is no extension, so infinities are accepted, min/max included.
        let open_top = self.has_open_top();
        let batch = if open_top { nan_min_max_with_infinities::<D, E>(scan) } else { batch_min_max::<D, E>(scan) };
        let Some((mn, mx)) = batch else {
            return Ok(Binning::Nothing); // ORT: an all-NaN batch counts nothing and keeps min/max
        };
        let (new_min, new_max) = (self.min.py_min(mn), self.max.py_max(mx));
        let (Some(amin), Some(amax)) = (scan.finite_abs_min, scan.finite_abs_max) else {
            // No finite values: an empty batch (ORT raises; histocal injects 0 like ORT's value
            // path), or only infinities (counted in the last bin when the top is open).
            (self.min, self.max) = (new_min, new_max);
            let infinities = scan.n_posinf + scan.n_neginf > 0;
            return Ok(if open_top && infinities { Binning::Explicit(self.edges_f64()) } else { Binning::Nothing });
        };
        let (amin, amax): (E, E) = (amin.widen(), amax.widen());
        let n = self.edges.len();
        let last = self.edges[n - 1];
        let width = self.edges[1].sub(self.edges[0]);
        let mut edges = self.edges_f64();
        if amax > last {
            fallible::extend(&mut edges, arange_f64(last.add(width), amax.add(width), width)?);
        }
        // One cap for every merge: at most MAX_BINS bins, ORT's extension and the bins histocal
        // adds to keep values ORT drops counted alike (a chain of extensions, each within
        // arange's own limit, would otherwise grow without bound).
        let beyond_cap = |bins: usize, extra: f64| !(extra.is_finite() && bins as f64 + extra <= MAX_BINS as f64);
        if edges.len() - 1 > MAX_BINS {
            return Err(HistError::TooManyBins(MAX_BINS));
        }
        let w = width.to_f64();
        // histocal: keep values ORT would drop (see the module docs).
        if w > 0.0 && *edges.last().unwrap() < amax.to_f64() {
            // The loop's sums round, so it may add a bin more or less than the quotient: the
            // quotient only rules out what is clearly beyond the cap (bounding the work), and
            // the loop itself stops at the cap.
            let extra = (amax.to_f64() - edges.last().unwrap()) / w;
            if beyond_cap(edges.len() - 1, extra - 2.0) {
                return Err(HistError::TooManyBins(MAX_BINS));
            }
            // the bins the loop adds, and a few for rounding (extra pushes would grow `edges`
            // with the ordinary allocator)
            fallible::reserve(&mut edges, extra as usize + 4);
            while *edges.last().unwrap() < amax.to_f64() {
                if edges.len() - 1 == MAX_BINS {
                    return Err(HistError::TooManyBins(MAX_BINS));
                }
                let next = edges[edges.len() - 1] + w;
                edges.push(next);
            }
            // Only ORT's own edges may overflow `E` (ORT stores them so); an open top made by
            // these extra bins would accept infinities where ORT raises.
            if !E::from_f64(*edges.last().unwrap()).is_finite() {
                return Err(HistError::NonFiniteRange);
            }
        }
        let mut below = 0usize;
        if amin.to_f64() < edges[0] && w > 0.0 {
            let e0 = edges[0];
            // `below` is at least this quotient.
            if beyond_cap(edges.len() - 1, (e0 - amin.to_f64()) / w) {
                return Err(HistError::TooManyBins(MAX_BINS));
            }
            below = ((e0 - amin.to_f64()) / w).ceil() as usize;
            while e0 - below as f64 * w > amin.to_f64() {
                below += 1;
            }
            if edges.len() - 1 + below > MAX_BINS {
                return Err(HistError::TooManyBins(MAX_BINS));
            }
            let mut lower: Vec<f64> = fallible::with_capacity(below + edges.len());
            lower.extend((1..=below).rev().map(|k| e0 - k as f64 * w));
            lower.extend_from_slice(&edges);
            edges = lower;
        }
        let mut hist = fallible::zeroed(edges.len() - 1);
        hist[below..below + self.hist.len()].copy_from_slice(&self.hist);
        let stored = fallible::collect(edges.iter().map(|&e| E::from_f64(e))); // astype(E): may overflow to inf
        (self.hist, self.edges) = (hist, stored);
        (self.min, self.max) = (new_min, new_max);
        Ok(Binning::Explicit(edges))
    }

    /// Whether the stored edges end in `+inf` (an extension overflowed `E`): ORT never extends
    /// such a histogram again and bins infinities in its last bin.
    pub fn has_open_top(&self) -> bool {
        self.edges.last().is_some_and(|e| e.to_f64() == f64::INFINITY)
    }

    fn edges_f64(&self) -> Vec<f64> {
        fallible::collect(self.edges.iter().map(|e| e.to_f64()))
    }

    pub fn widen<F: Float>(&self) -> AbsHistogram<F> {
        AbsHistogram {
            hist: fallible::copy(&self.hist),
            edges: fallible::collect(self.edges.iter().map(|e| F::from_f64(e.to_f64()))),
            min: self.min.cast(),
            max: self.max.cast(),
        }
    }
}

/// Whether `edges` (with `hist`) can be an |x| histogram's: the first two edges finite and
/// increasing (the first collect's uniform bins), then non-decreasing (f16 extension edges
/// repeat where their f64 spacing is below f16's), possibly ending in `+inf` (an open top),
/// with nothing counted in a `[inf, inf)` bin (only the last bin holds infinities).
pub fn check_edges<E: Float>(edges: &[E], hist: &[i64]) -> Result<(), String> {
    let e = |i: usize| edges[i].to_f64();
    if edges.len() < 2 || !(e(0).is_finite() && e(1).is_finite() && e(0) < e(1)) {
        return Err("the first two edges must be finite and increasing".into());
    }
    if (1..edges.len()).any(|i| !(e(i - 1) <= e(i))) {
        return Err("edges must be non-decreasing (no NaN)".into());
    }
    let n = hist.len().min(edges.len());
    if (0..n.saturating_sub(1)).any(|i| e(i) == f64::INFINITY && hist[i] != 0) {
        return Err("a bin between infinite edges holds values".into());
    }
    Ok(())
}

/// numpy's `nanmin`/`nanmax` of the batch with its infinities (ORT's min/max once the top is
/// open); None when there is nothing but NaN, as `batch_min_max`.
fn nan_min_max_with_infinities<D: Float + Widen<E>, E: Float>(scan: &Scan<D>) -> Option<(Held<E>, Held<E>)> {
    if scan.n_posinf + scan.n_neginf == 0 {
        return batch_min_max(scan);
    }
    let inf = E::from_f64(f64::INFINITY);
    let mn = if scan.n_neginf > 0 { inf.neg() } else { scan.finite_min.map_or(inf, |v| v.widen()) };
    let mx = if scan.n_posinf > 0 { inf } else { scan.finite_max.map_or(inf.neg(), |v| v.widen()) };
    Some((Held::scalar(mn), Held::scalar(mx)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::scan::scan;
    use crate::numeric::view::View;
    use half::f16;

    fn step(h: &mut Option<AbsHistogram<f32>>, x: &[f32], n: usize) {
        try_step(h, x, n).unwrap();
    }

    fn try_step<E: Float + Widen<E>>(h: &mut Option<AbsHistogram<E>>, x: &[E], n: usize) -> Result<(), HistError> {
        let v = View::from_slice(x);
        let s = scan(&v);
        let binning = match h {
            None => {
                let (st, b) = AbsHistogram::first(&s, n)?;
                *h = Some(st);
                b
            }
            Some(st) => st.merge(&s)?,
        };
        binning.count(&v, &mut h.as_mut().unwrap().hist);
        Ok(())
    }

    #[test]
    fn first_batch_uses_auto_range_of_abs() {
        let mut h = None;
        step(&mut h, &[0.1, 0.2, 0.3, -0.9, 1.0, 0.15], 8);
        let st = h.unwrap();
        assert_eq!(st.hist, vec![3, 1, 0, 0, 0, 0, 0, 2]);
        assert_eq!(st.edges[0], 0.1);
        assert_eq!(st.edges[8], 1.0);
    }

    fn f16s(x: &[f64]) -> Vec<f16> {
        x.iter().map(|&v| f16::from_f64(v)).collect()
    }

    /// One collect of f16 data into an f16 |x| histogram (merge errors returned, state kept).
    fn step16(h: &mut Option<AbsHistogram<f16>>, x: &[f64], n: usize) -> Result<(), HistError> {
        let data = f16s(x);
        let v = View::from_slice(&data);
        let s = scan(&v);
        let binning = match h {
            None => {
                let (st, b) = AbsHistogram::first(&s, n)?;
                *h = Some(st);
                b
            }
            Some(st) => st.merge(&s)?,
        };
        binning.count(&v, &mut h.as_mut().unwrap().hist);
        Ok(())
    }

    fn nonzero(h: &AbsHistogram<f16>) -> Vec<(usize, i64)> {
        h.hist.iter().enumerate().filter(|(_, &c)| c != 0).map(|(i, &c)| (i, c)).collect()
    }

    #[test]
    fn f16_extension_past_65504_keeps_orts_infinite_edges() {
        // ORT 1.31.1 on [0, 1664] (1000 bins) then [-54900]: arange's f16 length (32000) and
        // second element (1668: an f64 step of 2, not 1.664) carry the f64 edges past 65504;
        // stored as f16 the last 73 become inf. Counts at bins 0, 999 and 27624.
        let mut h = None;
        step16(&mut h, &[0.0, 1664.0], 1000).unwrap();
        step16(&mut h, &[-54900.0], 1000).unwrap();
        let st = h.unwrap();
        assert_eq!(st.hist.len(), 33000);
        assert_eq!(st.edges.iter().filter(|e| e.is_infinite()).count(), 73);
        assert!(st.has_open_top());
        assert_eq!(nonzero(&st), vec![(0, 1), (999, 1), (27624, 1)]);
        assert_eq!(st.min.value, f16::from_f64(-54900.0));
    }

    #[test]
    fn open_top_is_never_extended_and_bins_infinities_last() {
        let mut h = None;
        step16(&mut h, &[0.0, 1664.0], 1000).unwrap();
        step16(&mut h, &[-54900.0], 1000).unwrap();
        let edges = h.as_ref().unwrap().edges.clone();
        let k = edges.iter().position(|e| e.is_infinite()).unwrap(); // first inf edge
        let last_finite = edges[k - 1].to_f64();
        // 65504 and the last finite edge itself: bin k-1 [last finite, inf); +-inf: the last
        // bin [inf, inf]; NaN: nowhere.
        step16(&mut h, &[65504.0, -last_finite, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 3.0], 1000).unwrap();
        let st = h.unwrap();
        assert_eq!(st.edges, edges, "no extension once the top is open");
        let n = st.hist.len();
        assert_eq!(
            nonzero(&st),
            vec![(0, 1), (1, 1), (999, 1), (k - 1, 2), (27624, 1), (n - 1, 2)].into_iter().fold(
                Vec::new(),
                |mut v, x| {
                    v.push(x);
                    v.sort();
                    v
                }
            )
        );
        // nanmin/nanmax see the infinities.
        assert_eq!(st.min.value, f16::NEG_INFINITY);
        assert_eq!(st.max.value, f16::INFINITY);
    }

    #[test]
    fn open_top_bins_a_batch_of_only_infinities() {
        let mut h = None;
        step16(&mut h, &[0.0, 1664.0], 1000).unwrap();
        step16(&mut h, &[-54900.0], 1000).unwrap();
        step16(&mut h, &[f64::INFINITY, f64::INFINITY], 1000).unwrap();
        let st = h.unwrap();
        assert_eq!(*st.hist.last().unwrap(), 2);
        assert_eq!((st.min.value, st.max.value), (f16::from_f64(-54900.0), f16::INFINITY));
    }

    #[test]
    fn a_later_infinity_below_a_finite_top_is_not_binned() {
        // ORT raises ("Maximum allowed size exceeded": arange up to inf); histocal's deviation
        // extends to the finite max and leaves the infinity out, min/max included.
        let mut h = None;
        step16(&mut h, &[0.0, 1664.0], 1000).unwrap();
        step16(&mut h, &[f64::INFINITY, 2000.0], 1000).unwrap();
        let st = h.unwrap();
        assert!(!st.has_open_top());
        assert_eq!(st.hist.iter().sum::<i64>(), 3);
        assert_eq!(st.max.value, f16::from_f64(2000.0));
    }

    #[test]
    fn arange_overflow_in_f16_is_an_error() {
        // [1, 60000] in 7 bins: start = f16(60000 + 8568) = inf, ORT "arange: cannot compute length".
        let mut h = None;
        step16(&mut h, &[1.0, 60000.0], 7).unwrap();
        let before = h.clone();
        assert!(step16(&mut h, &[60030.0], 7).is_err());
        assert_eq!(h, before, "state unchanged on error");
    }

    #[test]
    fn check_edges_accepts_open_tops_and_repeats_only() {
        let inf = f64::INFINITY;
        assert!(check_edges(&[0.0, 1.0, 2.0, 2.0, inf, inf], &[1, 0, 0, 4, 5]).is_ok());
        assert!(check_edges(&[0.0, 1.0, inf, inf], &[1, 2, 3]).is_ok(), "the last bin [inf, inf] holds infinities");
        assert!(check_edges(&[0.0, 1.0, inf, inf, inf], &[1, 2, 3, 0]).is_err(), "a [inf, inf) bin holds values");
        assert!(check_edges(&[0.0, inf, inf], &[1, 0]).is_err(), "the first bin is finite");
        assert!(check_edges(&[0.0, 1.0, f64::NAN], &[1, 0]).is_err());
        assert!(check_edges(&[0.0, 2.0, 1.0], &[1, 0]).is_err());
    }

    #[test]
    fn later_values_below_first_min_are_kept() {
        let mut h = None;
        step(&mut h, &[0.5, -1.0], 4);
        step(&mut h, &[0.1, -0.2, 0.0, 0.75, 2.2], 4);
        let st = h.unwrap();
        // ORT would keep 4 of 7; histocal keeps all 7.
        assert_eq!(st.hist.iter().sum::<i64>(), 7);
        assert!(st.edges[0] <= 0.0);
        assert!(*st.edges.last().unwrap() >= 2.2);
    }

    #[test]
    fn kept_values_may_fill_the_cap_exactly() {
        // [1, 1] in 512 bins: edges [0.5, 1.5], width 1/512. ORT extends to 32767.998 in
        // 16776959 bins and drops both 0 and 32768; histocal adds 1 bin above and 256 below.
        let mut h = None;
        try_step(&mut h, &[1.0, 1.0], 512).unwrap();
        try_step(&mut h, &[32768.0, 0.0], 512).unwrap();
        let st = h.unwrap();
        assert_eq!(st.hist.len(), MAX_BINS);
        assert_eq!(st.hist.iter().sum::<i64>(), 4);
        assert_eq!((st.edges[0], *st.edges.last().unwrap()), (0.0, 32768.0));
    }

    #[test]
    fn kept_values_beyond_the_cap_are_refused() {
        // One f32 step higher: ORT's 16776963 bins fit, histocal's 16777218 do not.
        let mut h = None;
        try_step(&mut h, &[1.0, 1.0], 512).unwrap();
        let before = h.clone();
        assert_eq!(try_step(&mut h, &[32768.004, 0.0], 512), Err(HistError::TooManyBins(MAX_BINS)));
        assert_eq!(h, before, "state unchanged on error");
    }

    #[test]
    fn a_chain_of_extensions_stops_at_the_cap() {
        // Each extension is within arange's own limit; together they pass the cap (in float64,
        // where the extensions need no extra bins of histocal's).
        let mut h = None;
        try_step(&mut h, &[1.0f64, 1.0], 512).unwrap();
        try_step(&mut h, &[20000.0], 512).unwrap();
        assert_eq!(h.as_ref().unwrap().hist.len(), 10239744);
        assert_eq!(try_step(&mut h, &[40000.0], 512), Err(HistError::TooManyBins(MAX_BINS)));
    }
}
