//! ORT's `collect_value` histogram (Entropy, Distribution, non-symmetric Percentile): a
//! symmetric `(-t, t)` histogram that grows by ORT's `merge_histogram` rule.
//!
//! Non-finite values are never binned (ORT raises on them); a batch without finite values is
//! treated exactly as ORT treats an empty batch.

use crate::numeric::fallible;
use crate::numeric::float::{py_max, Float, Widen};
use crate::numeric::scan::Scan;
use crate::ort::binning::Binning;
use crate::ort::histogram::{HistError, UniformBins, MAX_BINS};

/// A scalar as ORT holds it: numpy scalars from `nanmin`/arithmetic, or 0-d arrays (empty
/// batches, `np.array(threshold)`). The distinction only shows in the Python objects returned.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Held<E> {
    pub value: E,
    pub is_array: bool,
}

impl<E: Float> Held<E> {
    pub fn scalar(value: E) -> Self {
        Held { value, is_array: false }
    }
    pub fn array(value: E) -> Self {
        Held { value, is_array: true }
    }
    /// Python `min(self, other)`.
    pub fn py_min(self, o: Self) -> Self {
        if o.value < self.value {
            o
        } else {
            self
        }
    }
    /// Python `max(self, other)`.
    pub fn py_max(self, o: Self) -> Self {
        if o.value > self.value {
            o
        } else {
            self
        }
    }
    pub fn cast<F: Float>(self) -> Held<F> {
        Held { value: F::from_f64(self.value.to_f64()), is_array: self.is_array }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ValueHistogram<E> {
    pub hist: Vec<i64>,
    pub edges: Vec<E>,
    pub min: Held<E>,
    pub max: Held<E>,
    pub threshold: Held<E>,
}

/// The batch's (min, max) as ORT computes them: nanmin/nanmax scalars, or 0-d zeros if the
/// batch is empty. None for a non-empty batch without finite values: ORT's NaN min/max then
/// leave the merged min/max unchanged (Python `min(old, nan)` keeps `old`).
pub fn batch_min_max<D: Float + Widen<E>, E: Float>(scan: &Scan<D>) -> Option<(Held<E>, Held<E>)> {
    match (scan.finite_min, scan.finite_max) {
        (Some(mn), Some(mx)) => Some((Held::scalar(mn.widen()), Held::scalar(mx.widen()))),
        _ if scan.is_empty() => Some((Held::array(E::ZERO), Held::array(E::ZERO))),
        _ => None,
    }
}

/// A first batch without finite values starts the state like an empty batch (ORT raises).
pub fn first_min_max<D: Float + Widen<E>, E: Float>(scan: &Scan<D>) -> (Held<E>, Held<E>) {
    batch_min_max(scan).unwrap_or((Held::array(E::ZERO), Held::array(E::ZERO)))
}

/// Value bins, or nothing to count when the collect has no finite values.
fn uniform<D: Float, E: Float>(bins: UniformBins<E>, scan: &Scan<D>) -> Binning<E> {
    if scan.n_finite > 0 {
        Binning::Uniform { bins, abs: false }
    } else {
        Binning::Nothing
    }
}

impl<E: Float> ValueHistogram<E> {
    /// The first collect: `np.histogram(x, n, range=(-t, t))` with `t = max(|min|, |max|)`.
    /// Returns the empty histogram and the binning its batches are then counted with.
    pub fn first<D: Float + Widen<E>>(scan: &Scan<D>, n_bins: usize) -> Result<(Self, Binning<E>), HistError> {
        let (mn, mx) = first_min_max::<D, E>(scan);
        let t = py_max(mn.value.abs(), mx.value.abs());
        let bins = UniformBins::new(t.neg(), t, n_bins)?;
        let h = ValueHistogram {
            hist: fallible::zeroed(n_bins),
            edges: fallible::copy(&bins.edges),
            min: mn,
            max: mx,
            threshold: Held::array(t),
        };
        Ok((h, uniform(bins, scan)))
    }

    /// ORT's `merge_histogram`, up to counting: re-lays the old counts on the new edges and
    /// returns the binning the collect's batches are counted with. On error the state is
    /// left unchanged.
    pub fn merge<D: Float + Widen<E>>(&mut self, scan: &Scan<D>) -> Result<Binning<E>, HistError> {
        let Some((mn, mx)) = batch_min_max::<D, E>(scan) else {
            return Ok(Binning::Nothing); // nothing finite to count, min/max unchanged
        };
        let t = py_max(mn.value.abs(), mx.value.abs());
        let old_t = self.threshold.value;
        let n_old = self.hist.len();
        let binning = if t <= old_t {
            uniform(UniformBins::new(old_t.neg(), old_t, n_old)?, scan)
        } else if old_t == E::ZERO {
            // ORT re-bins nothing here: old counts are added index-wise (they all sit at 0,
            // in the centre bin of both histograms).
            let bins = UniformBins::new(t.neg(), t, n_old)?;
            self.edges = fallible::copy(&bins.edges);
            self.threshold = Held::array(t);
            uniform(bins, scan)
        } else {
            let stride = E::from_f64(2.0).mul(old_t).div(E::from_usize(n_old));
            let q = t.sub(old_t).floor_divide(stride).add(E::from_f64(1.0));
            let qf = q.to_f64();
            if !qf.is_finite() || qf < 0.0 || qf > (usize::MAX / 4) as f64 {
                return Err(HistError::NonFiniteRange);
            }
            let h = qf as usize;
            let n_new = n_old + 2 * h;
            if n_new > MAX_BINS {
                return Err(HistError::TooManyBins(n_new)); // ORT would allocate them all
            }
            let new_t = E::from_usize(h).mul(stride).add(old_t);
            let bins = UniformBins::new(new_t.neg(), new_t, n_new)?;
            let mut hist = fallible::zeroed(n_new);
            hist[h..n_new - h].copy_from_slice(&self.hist);
            (self.hist, self.edges) = (hist, fallible::copy(&bins.edges));
            self.threshold = Held::scalar(new_t);
            uniform(bins, scan)
        };
        self.min = self.min.py_min(mn);
        self.max = self.max.py_max(mx);
        Ok(binning)
    }

    /// The same state in a wider arithmetic type (every value converts exactly).
    pub fn widen<F: Float>(&self) -> ValueHistogram<F> {
        ValueHistogram {
            hist: fallible::copy(&self.hist),
            edges: fallible::collect(self.edges.iter().map(|e| F::from_f64(e.to_f64()))),
            min: self.min.cast(),
            max: self.max.cast(),
            threshold: self.threshold.cast(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::scan::scan;
    use crate::numeric::view::View;

    #[test]
    fn growth_beyond_max_bins_is_an_error_not_an_allocation() {
        let first = scan(&View::from_slice(&[1e-3f32]));
        let (mut h, _) = ValueHistogram::<f32>::first(&first, 2048).unwrap();
        let before = h.clone();
        let huge = scan(&View::from_slice(&[1e3f32]));
        assert!(matches!(h.merge(&huge), Err(HistError::TooManyBins(n)) if n > MAX_BINS));
        assert_eq!(h, before, "an error leaves the histogram unchanged");
        assert!(matches!(UniformBins::<f64>::new(0.0, 1.0, MAX_BINS + 1), Err(HistError::TooManyBins(_))));
    }

    fn step(h: &mut Option<ValueHistogram<f32>>, x: &[f32], n: usize) {
        let v = View::from_slice(x);
        let s = scan(&v);
        let binning = match h {
            None => {
                let (st, b) = ValueHistogram::first(&s, n).unwrap();
                *h = Some(st);
                b
            }
            Some(st) => st.merge(&s).unwrap(),
        };
        binning.count(&v, &mut h.as_mut().unwrap().hist);
    }

    #[test]
    fn orts_worked_merge_example() {
        let mut h = None;
        step(&mut h, &[-1.0, 0.5, 2.0], 8);
        step(&mut h, &[1.5, -0.2], 8);
        assert_eq!(h.as_ref().unwrap().hist, vec![0, 0, 1, 1, 0, 1, 0, 2]);
        step(&mut h, &[3.3], 8);
        let st = h.as_ref().unwrap();
        assert_eq!(st.hist, vec![0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 2, 0, 0, 1]);
        assert_eq!(st.threshold.value, 3.5);
        assert!(!st.threshold.is_array);
        assert_eq!((st.min.value, st.max.value), (-1.0, 3.3));
        step(&mut h, &[-4.5], 8);
        let st = h.as_ref().unwrap();
        assert_eq!(st.hist.len(), 20);
        assert_eq!(st.threshold.value, 5.0);
    }

    #[test]
    fn zero_threshold_then_growth_adds_index_wise() {
        let mut h = None;
        step(&mut h, &[0.0; 5], 8);
        assert_eq!(h.as_ref().unwrap().hist, vec![0, 0, 0, 0, 5, 0, 0, 0]);
        step(&mut h, &[0.3, -1.0], 8);
        let st = h.as_ref().unwrap();
        assert_eq!(st.hist, vec![1, 0, 0, 0, 5, 1, 0, 0]);
        assert_eq!(st.threshold.value, 1.0);
    }

    #[test]
    fn empty_batch_injects_zero_into_min_max() {
        let mut h = None;
        step(&mut h, &[1.0, 2.0], 8);
        step(&mut h, &[], 8);
        let st = h.as_ref().unwrap();
        assert_eq!(st.min, Held::array(0.0));
        assert_eq!(st.max, Held::scalar(2.0));
    }
}
