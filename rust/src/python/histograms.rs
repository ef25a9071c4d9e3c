//! `Histograms`: per-tensor ORT-shaped histogram states.

use super::arrays::Borrowed;
use super::arrays::*;
use super::classes::{Histograms, StreamHistograms};
use super::errors::*;
use super::records::{BinRange, HistogramState, Moments, TensorCounts};
use super::threads::*;
use crate::collection::tensor::{Counts, Kind};
use crate::collection::{EdgesRef, ExactCollection};
use crate::numeric::float::Float;
use numpy::{Element, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A scan's `(finite_min, finite_max, finite_abs_min, finite_abs_max)`.
type Extremes = (Option<f64>, Option<f64>, Option<f64>, Option<f64>);
/// A pending scan as Python sees it: `(name, dtype, extremes, (finite, nan, posinf, neginf), batches)`.
type ScanRecord<Dtype> = (String, Dtype, Extremes, (u64, u64, u64, u64), u64);

#[pymethods]
impl Histograms {
    #[new]
    pub(crate) fn new(kind: &str, num_bins: usize) -> PyResult<Self> {
        let inner = Kind::parse(kind).and_then(|kind| ExactCollection::new(kind, num_bins));
        guard(|| Ok(Histograms { inner: inner.map_err(PyValueError::new_err)? }))
    }

    /// The histograms' kind, `"value"` or `"abs"`.
    #[getter]
    fn kind(&self) -> &'static str {
        self.inner.kind().name()
    }

    /// Their bin count.
    #[getter]
    fn num_bins(&self) -> usize {
        self.inner.num_bins()
    }

    /// Collect `[(name, [arrays...]), ...]`: each tensor's arrays form one ORT collect call.
    fn collect(&mut self, py: Python<'_>, items: Items<'_>) -> PyResult<()> {
        guard(|| with_batches(&items, |_, batches| run(py, || self.inner.collect(batches)))?.map_err(tensor_error))
    }

    /// Two-pass collect, pass 1: add batches to each tensor's pending scan (nothing is binned
    /// here). With `stream`, the batches also go into those streaming histograms, reusing the
    /// scans.
    #[pyo3(signature = (items, stream=None))]
    fn scan(
        &mut self,
        py: Python<'_>,
        items: Items<'_>,
        mut stream: Option<PyRefMut<'_, StreamHistograms>>,
    ) -> PyResult<()> {
        let stream = stream.as_deref_mut().map(|s| &mut s.inner);
        guard(|| with_batches(&items, |_, batches| run(py, || self.inner.scan(batches, stream)))?.map_err(tensor_error))
    }

    /// Two-pass collect split across processes: the pending scans of the collect in progress
    /// (what `scan` gathered), in name order, as
    /// `(name, dtype, (finite_min, finite_max, finite_abs_min, finite_abs_max), (finite, nan, posinf, neginf), batches)`.
    fn pending_scans(&self) -> Vec<ScanRecord<&'static str>> {
        self.inner
            .pending_scans()
            .into_iter()
            .map(|(name, dtype, [a, b, c, d], [e, f, g, h], n)| (name, dtype, (a, b, c, d), (e, f, g, h), n))
            .collect()
    }

    /// Add scans `pending_scans` exported elsewhere (another process's pass 1) to the pending
    /// scans, as if their batches had been scanned here. Every record is checked (see
    /// `Scans::from_parts`) before anything changes.
    fn add_scans(&mut self, scans: Vec<ScanRecord<String>>) -> PyResult<()> {
        guard(|| {
            let parts = scans
                .into_iter()
                .map(|(name, dtype, (a, b, c, d), (e, f, g, h), n)| (name, dtype, [a, b, c, d], [e, f, g, h], n))
                .collect();
            self.inner.add_scans(parts).map_err(tensor_error)
        })
    }

    /// Two-pass collect, between the passes: start each scanned tensor's collect from its
    /// combined scan (ORT's ranges for the whole call). Pass 2 then `count`s every batch.
    fn plan(&mut self, py: Python<'_>) -> PyResult<()> {
        guard(|| run(py, || self.inner.plan()).map_err(tensor_error))
    }

    /// Two-pass collect, pass 2: count batches with the binning `plan` fixed.
    fn count(&mut self, py: Python<'_>, items: Items<'_>) -> PyResult<()> {
        guard(|| with_batches(&items, |_, batches| run(py, || self.inner.count(batches)))?.map_err(tensor_error))
    }

    /// A copy of the collected histograms (no two-pass collect in progress); `MemoryError`, the
    /// original unchanged, when the memory is not there.
    fn copy(&self, py: Python<'_>) -> PyResult<Histograms> {
        guard(|| Ok(Histograms { inner: run(py, || self.inner.copied()) }))
    }

    fn names(&self) -> Vec<String> {
        self.inner.tensors().names().to_vec()
    }

    /// `(hist, edges, (min, is_array), (max, is_array), threshold or None, data dtype)`.
    fn state(&self, py: Python<'_>, name: &str) -> PyResult<HistogramState> {
        guard(|| {
            let st = self.inner.tensors().get(name).map_err(tensor_error)?;
            let v = st.histogram.view();
            let edges = per_dtype!(EdgesRef, v.edges, |e| array(py, e).into_any().unbind());
            Ok(HistogramState {
                hist: array(py, v.hist).into_any().unbind(),
                edges,
                min: v.min,
                max: v.max,
                threshold: v.threshold,
                dtype: st.dtype.to_string(),
            })
        })
    }

    /// Whether `(hist, edges, min, max[, threshold])` (a `histogram_dict` entry) still holds
    /// exactly this tensor's state: `hist` int64 and `edges` of the state's dtype, equal element
    /// for element, and the values bit for bit. Anything else (another dtype or length, an edit
    /// in place) is `false`: a cheap check that lets the Python view skip unedited entries.
    #[pyo3(signature = (name, hist, edges, min, max, threshold=None))]
    #[allow(clippy::too_many_arguments)]
    fn unchanged(
        &self,
        name: &str,
        hist: &Bound<'_, PyAny>,
        edges: &Bound<'_, PyAny>,
        min: f64,
        max: f64,
        threshold: Option<f64>,
    ) -> bool {
        fn bits<E: Float>(x: E) -> u64 {
            x.to_f64().to_bits()
        }
        fn same_values<E: Float + Element>(a: &Bound<'_, PyAny>, b: &[E]) -> bool {
            let Ok(a) = a.cast::<numpy::PyArray1<E>>() else { return false };
            let a = a.readonly();
            match a.as_slice() {
                // no short circuit: the loop vectorizes
                Ok(s) => s.len() == b.len() && s.iter().zip(b).fold(true, |ok, (&x, &y)| ok & (bits(x) == bits(y))),
                Err(_) => a.as_array().iter().map(|&x| bits(x)).eq(b.iter().map(|&x| bits(x))),
            }
        }
        let same_hist = |b: &[i64]| {
            let Ok(a) = hist.cast::<numpy::PyArray1<i64>>() else { return false };
            let a = a.readonly();
            match a.as_slice() {
                Ok(s) => s == b,
                Err(_) => a.as_array().iter().eq(b.iter()),
            }
        };
        let Some(st) = self.inner.tensors().find(name) else { return false };
        let v = st.histogram.view();
        let same_edges = per_dtype!(EdgesRef, v.edges, |e| same_values(edges, e));
        same_hist(v.hist)
            && same_edges
            && min.to_bits() == v.min.0.to_bits()
            && max.to_bits() == v.max.0.to_bits()
            && threshold.map(f64::to_bits) == v.threshold.map(|t| t.0.to_bits())
    }

    /// Put back a state `state()` and `counts()` exported (e.g. from a state file), after
    /// checking it is one histocal could have built. Replaces any state of that name.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, dtype, hist, edges, min, max, threshold, counts))]
    fn restore(
        &mut self,
        name: &str,
        dtype: &str,
        hist: numpy::PyReadonlyArray1<'_, i64>,
        edges: Bound<'_, PyAny>,
        min: (f64, bool),
        max: (f64, bool),
        threshold: Option<(f64, bool)>,
        counts: (u64, u64, u64, u64, u64),
    ) -> PyResult<()> {
        guard(|| {
            let bad = |why: &str| PyValueError::new_err(format!("tensor {name:?}: {why}"));
            let hist = hist.as_slice().map_err(|_| bad("hist must be contiguous"))?;
            let (finite, nan, posinf, neginf, batches) = counts;
            let counts = Counts { finite, nan, posinf, neginf, batches };
            let b = borrow_all(name, std::slice::from_ref(&edges))?;
            let contiguous = || bad("edges must be a contiguous 1-D array");
            let restored = per_dtype!(Borrowed, &b, |v| {
                v[0].as_slice().map(|e| self.inner.restore(name, dtype, hist, e, min, max, threshold, counts))
            });
            restored.map_err(|_| contiguous())?.map_err(tensor_error)
        })
    }

    /// `(finite, nan, posinf, neginf, batches)`.
    fn counts(&self, name: &str) -> PyResult<TensorCounts> {
        guard(|| {
            let c = self.inner.tensors().get(name).map_err(tensor_error)?.counts;
            Ok(TensorCounts::new([c.finite, c.nan, c.posinf, c.neginf, c.batches]))
        })
    }

    /// `(data dtype, edge dtype)`: the histogram's arithmetic dtype is the data's unless numpy
    /// would have failed.
    fn dtypes(&self, name: &str) -> PyResult<(&'static str, &'static str)> {
        guard(|| self.inner.tensors().get(name).map(|st| (st.dtype, st.histogram.edge_dtype())).map_err(tensor_error))
    }

    /// Per tensor `(name, values binned, edges end in +inf)`, without exporting the histograms.
    fn binned_totals(&self) -> Vec<(String, u64, bool)> {
        self.inner.binned_totals()
    }

    /// Entropy: `[(name, start, end)]`, thresholds `(edges[start], edges[end])` before clipping.
    /// Every tensor's search is checked against the work limit before any starts.
    fn entropy(&self, py: Python<'_>, num_quantized_bins: usize) -> PyResult<Vec<BinRange>> {
        guard(|| {
            let limit = max_search_work()?;
            for (_, what, work) in self.inner.entropy_work(num_quantized_bins) {
                check_search_work(&what, work, limit)?;
            }
            let out = run_stoppable(py, |stop| self.inner.entropy_thresholds(num_quantized_bins, stop))?;
            Ok(out.map_err(tensor_error)?.into_iter().map(|(name, start, end)| BinRange { name, start, end }).collect())
        })
    }

    /// Percentile: `[(name, low_index, high_index)]` into each tensor's edges.
    fn percentile(&self, py: Python<'_>, percentile: f64, symmetric: bool) -> PyResult<Vec<BinRange>> {
        guard(|| {
            let out = run(py, || self.inner.percentile_indices(percentile, symmetric));
            Ok(out.into_iter().map(|(name, start, end)| BinRange { name, start, end }).collect())
        })
    }

    /// Distribution (scenario "same"): `[(name, avg, std)]` in f64, before rounding to the
    /// edge dtype.
    fn distribution(&self, py: Python<'_>) -> PyResult<Vec<Moments>> {
        guard(|| {
            Ok(run(py, || self.inner.distribution_moments())
                .into_iter()
                .map(|(name, avg, std)| Moments { name, avg, std })
                .collect())
        })
    }
}
