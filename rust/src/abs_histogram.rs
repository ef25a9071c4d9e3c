//! ORT's `collect_absolute_value` histogram (symmetric Percentile): a histogram of |x| whose
//! first batch fixes `[min|x|, max|x|]` and whose later batches extend it upwards with
//! `np.arange` edges that numpy evaluates in float64.
//!
//! Deviation, documented: ORT silently drops later values below the first batch's min|x| (and,
//! rarely, values above an extension that rounded to nothing). histocal keeps them by adding
//! bins of the same width below (or above); where ORT drops nothing, the result is identical.

use crate::float::{Float, Widen};
use crate::binning::Binning;
use crate::histogram::{arange_f64, HistError, UniformBins, MAX_BINS};
use crate::scan::Scan;
use crate::value_histogram::{batch_min_max, first_min_max, Held};

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
                (bins.edges.clone(), Binning::Uniform { bins, abs: true })
            }
            _ => (UniformBins::<E>::empty_auto(n_bins)?.edges, Binning::Nothing),
        };
        Ok((AbsHistogram { hist: vec![0i64; n_bins], edges, min: mn, max: mx }, binning))
    }

    /// A later collect: extend the edges if needed and lay the old counts on them; returns the
    /// binning (|x| against those edges) the collect's batches are counted with. Fails, leaving
    /// the state unchanged, where the edges would overflow `E` or exceed `MAX_BINS` (the caller
    /// then widens `E`).
    pub fn merge<D: Float + Widen<E>>(&mut self, scan: &Scan<D>) -> Result<Binning<E>, HistError> {
        let Some((mn, mx)) = batch_min_max::<D, E>(scan) else {
            return Ok(Binning::Nothing); // ORT: an all-NaN batch counts nothing and keeps min/max
        };
        let (new_min, new_max) = (self.min.py_min(mn), self.max.py_max(mx));
        let (Some(amin), Some(amax)) = (scan.finite_abs_min, scan.finite_abs_max) else {
            // An empty batch (ORT raises; histocal injects 0 like ORT's value path).
            (self.min, self.max) = (new_min, new_max);
            return Ok(Binning::Nothing);
        };
        let (amin, amax): (E, E) = (amin.widen(), amax.widen());
        let n = self.edges.len();
        let last = self.edges[n - 1];
        let width = self.edges[1].sub(self.edges[0]);
        let mut edges: Vec<f64> = self.edges.iter().map(|e| e.to_f64()).collect();
        if amax > last {
            edges.extend(arange_f64(last.add(width), amax.add(width), width)?);
        }
        let w = width.to_f64();
        let too_many = |have: usize, extra: f64| !(extra.is_finite() && (have as f64 + extra) < MAX_BINS as f64);
        // histocal: keep values ORT would drop (see the module docs).
        if w > 0.0 && *edges.last().unwrap() < amax.to_f64() {
            if too_many(edges.len(), (amax.to_f64() - edges.last().unwrap()) / w) {
                return Err(HistError::TooManyBins(MAX_BINS));
            }
            while *edges.last().unwrap() < amax.to_f64() {
                let next = edges[edges.len() - 1] + w;
                edges.push(next);
            }
        }
        let mut below = 0usize;
        if amin.to_f64() < edges[0] && w > 0.0 {
            let e0 = edges[0];
            if too_many(edges.len(), (e0 - amin.to_f64()) / w) {
                return Err(HistError::TooManyBins(MAX_BINS));
            }
            below = ((e0 - amin.to_f64()) / w).ceil() as usize;
            while e0 - below as f64 * w > amin.to_f64() {
                below += 1;
            }
            let mut lower: Vec<f64> = (1..=below).rev().map(|k| e0 - k as f64 * w).collect();
            lower.extend_from_slice(&edges);
            edges = lower;
        }
        let stored: Vec<E> = edges.iter().map(|&e| E::from_f64(e)).collect();
        if !stored.last().unwrap().is_finite() {
            return Err(HistError::NonFiniteRange); // the edges overflow E (f16): widen
        }
        let mut hist = vec![0i64; edges.len() - 1];
        hist[below..below + self.hist.len()].copy_from_slice(&self.hist);
        self.hist = hist;
        self.edges = stored;
        (self.min, self.max) = (new_min, new_max);
        Ok(Binning::Explicit(edges))
    }

    pub fn widen<F: Float>(&self) -> AbsHistogram<F> {
        AbsHistogram {
            hist: self.hist.clone(),
            edges: self.edges.iter().map(|e| F::from_f64(e.to_f64())).collect(),
            min: self.min.cast(),
            max: self.max.cast(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::scan;
    use crate::view::View;

    fn step(h: &mut Option<AbsHistogram<f32>>, x: &[f32], n: usize) {
        let v = View::from_slice(x);
        let s = scan(&v);
        let binning = match h {
            None => {
                let (st, b) = AbsHistogram::first(&s, n).unwrap();
                *h = Some(st);
                b
            }
            Some(st) => st.merge(&s).unwrap(),
        };
        binning.count(&v, &mut h.as_mut().unwrap().hist);
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
}
