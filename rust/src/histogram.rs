//! Histograms bit-identical to `np.histogram` as ORT's `HistogramCollector` calls it.
//!
//! Uniform bins (`bins=int`): numpy builds the edges with a linspace evaluated entirely in the
//! element type `E` and places each value with an estimate `E(E(E(v - first) / norm) * E(n))`
//! followed by one correction step each way. Both are reproduced literally, because for f16 the
//! result differs from exact membership against the edges.
//!
//! Explicit edges (`bins=array`, the symmetric-percentile merges): exact membership, compared in
//! f64, with the interior bins half-open and the last bin closed.

use crate::float::Float;
use crate::scan::PAR_CHUNK;
use crate::view::View;
use rayon::prelude::*;

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

    /// Count the values of `view` (mapped to `E` by `map`, e.g. an exact widening) into `counts`.
    pub fn count<D: Float, F: Fn(D) -> E + Sync>(&self, view: &View<D>, map: F, counts: &mut [i64]) {
        let n = self.n_bins();
        assert_eq!(counts.len(), n);
        let len = view.len();
        let chunks = len.div_ceil(PAR_CHUNK);
        let total = (0..chunks)
            .into_par_iter()
            .map(|c| {
                let mut local = vec![0i64; n];
                view.for_each_block(c * PAR_CHUNK..((c + 1) * PAR_CHUNK).min(len), |b| {
                    self.count_block(b, &map, &mut local)
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

    fn count_block<D: Float, F: Fn(D) -> E>(&self, block: &[D], map: &F, counts: &mut [i64]) {
        for &d in block {
            if let Some(i) = self.bin_of(map(d)) {
                counts[i] += 1;
            }
        }
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
                    if let Some(i) = bin_of(d.to_f64().abs()) {
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
pub fn arange_f64<E: Float>(start: E, stop: E, step: E) -> Vec<f64> {
    let len_e = stop.sub(start).div(step).to_f64().ceil();
    if !(len_e > 0.0) {
        return Vec::new();
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    fn hist_of(x: &[f32], n: usize, t: f32) -> (Vec<i64>, Vec<f32>) {
        let b = UniformBins::new(-t, t, n).unwrap();
        let mut c = vec![0; n];
        b.count(&View::from_slice(x), |v| v, &mut c);
        (c, b.edges)
    }

    #[test]
    fn orts_worked_example() {
        let (c, e) = hist_of(&[-1.0, 0.5, 2.0], 8, 2.0);
        assert_eq!(c, vec![0, 0, 1, 0, 0, 1, 0, 1]);
        assert_eq!(e, vec![-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0]);
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
        let e = arange_f64(1.125f32, 2.2f32 + 0.125, 0.125);
        assert_eq!(e.first(), Some(&1.125));
        assert_eq!(e.last(), Some(&2.25));
        assert_eq!(e.len(), 10);
        // start == stop after rounding: empty.
        assert!(arange_f64(17.5f32, 17.5f32, 3.5).is_empty());
    }
}
