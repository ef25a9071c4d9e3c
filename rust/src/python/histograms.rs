//! `Histograms`: per-tensor ORT-shaped histogram states.

use super::arrays::Borrowed;
use super::arrays::*;
use super::classes::{Histograms, StreamHistograms, StreamState};
use super::errors::*;
use super::records::{BinRange, HistogramState, Moments, TensorCounts};
use super::threads::*;
use crate::numeric::fallible::{self};
use crate::numeric::float::Float;
use crate::ort::distribution::avg_std;
use crate::ort::entropy::{entropy_threshold, search_work as entropy_search_work};
use crate::ort::histogram::MAX_BINS;
use crate::ort::percentile::percentile_indices;
use crate::state::{
    collect, count, histogram_from_parts, plan, Batches, CollectError, Counts, Family, Histogram, Kind, Scans,
    TensorState, Typed, TypedBinning,
};
use half::f16;
use numpy::{Element, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use rayon::prelude::*;
use std::collections::HashMap;

/// Apply `f` to a typed histogram whatever its arithmetic type.
macro_rules! with_typed {
    ($h:expr, |$x:ident, $E:ident| $body:expr) => {
        match $h {
            Typed::F16($x) => {
                type $E = f16;
                $body
            }
            Typed::F32($x) => {
                type $E = f32;
                $body
            }
            Typed::F64($x) => {
                type $E = f64;
                $body
            }
        }
    };
}

pub(crate) fn typed_dtype<Fm: Family>(t: &Typed<Fm>) -> &'static str {
    match t {
        Typed::F16(_) => "float16",
        Typed::F32(_) => "float32",
        Typed::F64(_) => "float64",
    }
}

/// A scan's `(finite_min, finite_max, finite_abs_min, finite_abs_max)`.
type Extremes = (Option<f64>, Option<f64>, Option<f64>, Option<f64>);
/// A pending scan as Python sees it: `(name, dtype, extremes, (finite, nan, posinf, neginf), batches)`.
type ScanRecord<Dtype> = (String, Dtype, Extremes, (u64, u64, u64, u64), u64);

pub(crate) fn held<E: Float>(h: crate::ort::value_histogram::Held<E>) -> (f64, bool) {
    (h.value.to_f64(), h.is_array)
}

#[pymethods]
impl Histograms {
    #[new]
    pub(crate) fn new(kind: &str, num_bins: usize) -> PyResult<Self> {
        guard(|| {
            let kind = match kind {
                "value" => Kind::Value,
                "abs" => Kind::Abs,
                _ => return Err(PyValueError::new_err(format!("unknown histogram kind {kind:?}"))),
            };
            if !(1..=MAX_BINS).contains(&num_bins) {
                return Err(PyValueError::new_err(format!("num_bins must be in [1, {MAX_BINS}], got {num_bins}")));
            }
            Ok(Histograms { kind, num_bins, order: Vec::new(), states: HashMap::new(), pending: HashMap::new() })
        })
    }

    /// Collect `[(name, [arrays...]), ...]`: each tensor's arrays form one ORT collect call.
    fn collect(&mut self, py: Python<'_>, items: Vec<(String, Vec<Bound<'_, PyAny>>)>) -> PyResult<()> {
        guard(|| {
            let borrowed = borrow_items(&items)?;
            let mut work: Vec<(&str, Batches<'_>, Option<TensorState>)> =
                borrowed.iter().map(|(n, b)| (n.as_str(), batches_of(b), self.states.remove(n))).collect();
            let (kind, n_bins) = (self.kind, self.num_bins);
            let results: Vec<PyResult<()>> = run(py, || {
                work.par_iter_mut()
                    .map(|(name, batches, state)| for_tensor(name, || collect(state, kind, batches, n_bins)))
                    .collect()
            });
            let mut first_error = None;
            for ((name, _, state), r) in work.into_iter().zip(results) {
                if let Some(s) = state {
                    self.insert(name, s);
                }
                first_error = first_error.or(r.err());
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    /// Two-pass collect, pass 1: add batches to each tensor's pending scan (nothing is binned
    /// here). With `stream`, the batches also go into those streaming histograms, reusing the
    /// scans.
    #[pyo3(signature = (items, stream=None))]
    fn scan(
        &mut self,
        py: Python<'_>,
        items: Vec<(String, Vec<Bound<'_, PyAny>>)>,
        mut stream: Option<PyRefMut<'_, StreamHistograms>>,
    ) -> PyResult<()> {
        guard(|| {
            let borrowed = borrow_items(&items)?;
            let batches: Vec<(&str, Batches<'_>)> = borrowed.iter().map(|(n, b)| (n.as_str(), batches_of(b))).collect();
            // Check every dtype before changing anything.
            for (name, b) in &batches {
                if let Some((p, _)) = self.pending.get(*name) {
                    if p.dtype() != b.dtype() {
                        return Err(named(name, CollectError::DtypeChanged { before: p.dtype(), now: b.dtype() }));
                    }
                }
            }
            let mut streams: Vec<Option<StreamState>> = match stream.as_deref_mut() {
                Some(s) => s.take(&batches)?.into_iter().map(Some).collect(),
                None => batches.iter().map(|_| None).collect(),
            };
            let scans: Vec<PyResult<(Scans, u64)>> = run(py, || {
                batches
                    .par_iter()
                    .zip(streams.par_iter_mut())
                    .map(|((name, b), st)| {
                        for_tensor(name, || {
                            let scan = match st {
                                Some((_, h)) => Scans::of_streamed(b, h),
                                None => Scans::of(b),
                            };
                            Ok::<_, CollectError>((scan, b.len() as u64))
                        })
                    })
                    .collect()
            });
            if let Some(s) = stream.as_deref_mut() {
                s.put(&batches, streams.into_iter().flatten().collect());
            }
            let scans = scans.into_iter().collect::<PyResult<Vec<_>>>()?;
            for ((name, _), (scan, n)) in batches.iter().zip(scans) {
                let merged = match self.pending.remove(*name) {
                    None => (scan, n),
                    Some((old, m)) => (old.merge(scan).map_err(|e| named(name, e))?, m + n),
                };
                self.pending.insert(name.to_string(), merged);
            }
            Ok(())
        })
    }

    /// Two-pass collect split across processes: the pending scans of the collect in progress
    /// (what `scan` gathered), in name order, as
    /// `(name, dtype, (finite_min, finite_max, finite_abs_min, finite_abs_max), (finite, nan, posinf, neginf), batches)`.
    fn pending_scans(&self) -> Vec<ScanRecord<&'static str>> {
        let mut out: Vec<_> = self
            .pending
            .iter()
            .map(|(name, (scan, n))| {
                let (dtype, [a, b, c, d], [e, f, g, h]) = scan.to_parts();
                (name.clone(), dtype, (a, b, c, d), (e, f, g, h), *n)
            })
            .collect();
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    }

    /// Add scans `pending_scans` exported elsewhere (another process's pass 1) to the pending
    /// scans, as if their batches had been scanned here. Every record is checked (see
    /// `Scans::from_parts`) before anything changes.
    fn add_scans(&mut self, scans: Vec<ScanRecord<String>>) -> PyResult<()> {
        guard(|| {
            let mut merged: HashMap<String, (Scans, u64)> = HashMap::new();
            for (name, dtype, (a, b, c, d), (e, f, g, h), n) in scans {
                let scan = Scans::from_parts(&dtype, [a, b, c, d], [e, f, g, h])
                    .map_err(|why| PyValueError::new_err(format!("tensor {name:?}: {why}")))?;
                let before = merged.remove(&name).or_else(|| self.pending.get(&name).copied());
                let next = match before {
                    None => (scan, n),
                    Some((old, m)) => (old.merge(scan).map_err(|e| named(&name, e))?, m + n),
                };
                merged.insert(name, next);
            }
            self.pending.extend(merged);
            Ok(())
        })
    }

    /// Two-pass collect, between the passes: start each scanned tensor's collect from its
    /// combined scan (ORT's ranges for the whole call). Pass 2 then `count`s every batch.
    fn plan(&mut self, py: Python<'_>) -> PyResult<()> {
        guard(|| {
            let mut work: Vec<(String, (Scans, u64), Option<TensorState>)> = self
                .pending
                .drain()
                .map(|(n, p)| {
                    let st = self.states.remove(&n);
                    (n, p, st)
                })
                .collect();
            work.sort_by(|a, b| a.0.cmp(&b.0));
            let (kind, n_bins) = (self.kind, self.num_bins);
            let results: Vec<PyResult<()>> = run(py, || {
                work.par_iter_mut()
                    .map(|(name, (scan, n), state)| for_tensor(name, || plan(state, kind, scan, *n, n_bins)))
                    .collect()
            });
            let mut first_error = None;
            for ((name, _, state), r) in work.into_iter().zip(results) {
                if let Some(s) = state {
                    self.insert(&name, s);
                }
                first_error = first_error.or(r.err());
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    /// Two-pass collect, pass 2: count batches with the binning `plan` fixed.
    fn count(&mut self, py: Python<'_>, items: Vec<(String, Vec<Bound<'_, PyAny>>)>) -> PyResult<()> {
        guard(|| {
            let borrowed = borrow_items(&items)?;
            let mut work: Vec<(&str, Batches<'_>, TensorState)> = Vec::with_capacity(borrowed.len());
            for (n, b) in &borrowed {
                let st = self
                    .states
                    .remove(n)
                    .ok_or_else(|| PyValueError::new_err(format!("tensor {n:?}: counted before it was planned")))?;
                work.push((n.as_str(), batches_of(b), st));
            }
            // counting never runs out of memory (it falls back to counting without scratch)
            let results: Vec<PyResult<()>> =
                run(py, || work.par_iter_mut().map(|(name, b, st)| for_tensor(name, || count(st, b))).collect());
            let mut first_error = None;
            for ((name, _, state), r) in work.into_iter().zip(results) {
                self.states.insert(name.to_string(), state);
                first_error = first_error.or(r.err());
            }
            first_error.map_or(Ok(()), Err)
        })
    }

    fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// `(hist, edges, (min, is_array), (max, is_array), threshold or None, data dtype)`.
    fn state(&self, py: Python<'_>, name: &str) -> PyResult<HistogramState> {
        guard(|| {
            let st = self
                .states
                .get(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            Ok(match &st.histogram {
                Histogram::Value(t) => with_typed!(t, |h, E| {
                    let _: &crate::ort::value_histogram::ValueHistogram<E> = h;
                    HistogramState {
                        hist: array(py, &h.hist).into_any().unbind(),
                        edges: array(py, &h.edges).into_any().unbind(),
                        min: held(h.min),
                        max: held(h.max),
                        threshold: Some(held(h.threshold)),
                        dtype: st.dtype.to_string(),
                    }
                }),
                Histogram::Abs(t) => with_typed!(t, |h, E| {
                    let _: &crate::ort::abs_histogram::AbsHistogram<E> = h;
                    HistogramState {
                        hist: array(py, &h.hist).into_any().unbind(),
                        edges: array(py, &h.edges).into_any().unbind(),
                        min: held(h.min),
                        max: held(h.max),
                        threshold: None,
                        dtype: st.dtype.to_string(),
                    }
                }),
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
        let Some(st) = self.states.get(name) else { return false };
        match &st.histogram {
            Histogram::Value(t) => with_typed!(t, |h, E| {
                let _: &crate::ort::value_histogram::ValueHistogram<E> = h;
                same_hist(&h.hist)
                    && same_values::<E>(edges, &h.edges)
                    && min.to_bits() == bits(h.min.value)
                    && max.to_bits() == bits(h.max.value)
                    && threshold.is_some_and(|t| t.to_bits() == bits(h.threshold.value))
            }),
            Histogram::Abs(t) => with_typed!(t, |h, E| {
                let _: &crate::ort::abs_histogram::AbsHistogram<E> = h;
                same_hist(&h.hist)
                    && same_values::<E>(edges, &h.edges)
                    && min.to_bits() == bits(h.min.value)
                    && max.to_bits() == bits(h.max.value)
                    && threshold.is_none()
            }),
        }
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
            let bad = |why: String| PyValueError::new_err(format!("tensor {name:?}: {why}"));
            let dtype: &'static str = match dtype {
                "float16" => "float16",
                "float32" => "float32",
                "float64" => "float64",
                _ => return Err(bad(format!("unsupported dtype {dtype:?}"))),
            };
            let hist = fallible::copy(hist.as_slice().map_err(|_| bad("hist must be contiguous".into()))?);
            if hist.is_empty() || hist.iter().any(|&c| c < 0) {
                return Err(bad("hist must be non-empty with counts >= 0".into()));
            }
            let (finite, nan, posinf, neginf, batches) = counts;
            // An |x| histogram with an open top also bins infinities (see abs_histogram).
            let binnable =
                if self.kind == Kind::Abs { finite as u128 + posinf as u128 + neginf as u128 } else { finite as u128 };
            if hist.iter().map(|&c| c as u128).sum::<u128>() > binnable {
                return Err(bad("hist holds more values than were collected".into()));
            }
            if (self.kind == Kind::Value) != threshold.is_some() {
                return Err(bad("threshold must be given for value histograms only".into()));
            }
            let b = borrow_all(name, std::slice::from_ref(&edges))?;
            let err = |e: String| bad(e);
            let edge_slice =
                |ok: bool| if ok { Ok(()) } else { Err(bad("edges must be a contiguous 1-D array".into())) };
            let (histogram, edge_dtype) = match &b {
                Borrowed::F16(v) => {
                    edge_slice(v[0].as_slice().is_ok())?;
                    histogram_from_parts(self.kind, hist, v[0].as_slice().unwrap(), min, max, threshold).map_err(err)?
                }
                Borrowed::F32(v) => {
                    edge_slice(v[0].as_slice().is_ok())?;
                    histogram_from_parts(self.kind, hist, v[0].as_slice().unwrap(), min, max, threshold).map_err(err)?
                }
                Borrowed::F64(v) => {
                    edge_slice(v[0].as_slice().is_ok())?;
                    histogram_from_parts(self.kind, hist, v[0].as_slice().unwrap(), min, max, threshold).map_err(err)?
                }
            };
            let rank = |d: &str| ["float16", "float32", "float64"].iter().position(|x| *x == d);
            if rank(edge_dtype) < rank(dtype) {
                return Err(bad(format!("{edge_dtype} edges cannot hold {dtype} data")));
            }
            let counts = Counts { finite, nan, posinf, neginf, batches };
            self.states.remove(name);
            self.insert(name, TensorState { dtype, histogram, binning: TypedBinning::Nothing, counts });
            Ok(())
        })
    }

    /// `(finite, nan, posinf, neginf, batches)`.
    fn counts(&self, name: &str) -> PyResult<TensorCounts> {
        guard(|| {
            let c = self
                .states
                .get(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?
                .counts;
            Ok(TensorCounts {
                n_finite: c.finite,
                n_nan: c.nan,
                n_posinf: c.posinf,
                n_neginf: c.neginf,
                batches: c.batches,
            })
        })
    }

    /// The histogram's arithmetic dtype (the data dtype unless numpy would have failed).
    fn edge_dtype(&self, name: &str) -> PyResult<&'static str> {
        guard(|| {
            let st = self
                .states
                .get(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            Ok(match &st.histogram {
                Histogram::Value(t) => typed_dtype(t),
                Histogram::Abs(t) => typed_dtype(t),
            })
        })
    }

    /// Entropy: `[(name, start, end)]`, thresholds `(edges[start], edges[end])` before clipping.
    /// Every tensor's search is checked against the work limit before any starts.
    fn entropy(&self, py: Python<'_>, num_quantized_bins: usize) -> PyResult<Vec<BinRange>> {
        guard(|| {
            let states: Vec<(&String, &TensorState)> = self.order.iter().map(|n| (n, &self.states[n])).collect();
            let limit = max_search_work()?;
            for (name, st) in &states {
                let n = match &st.histogram {
                    Histogram::Value(t) => with_typed!(t, |h, E| {
                        let _: &crate::ort::value_histogram::ValueHistogram<E> = h;
                        h.hist.len()
                    }),
                    Histogram::Abs(t) => with_typed!(t, |h, E| {
                        let _: &crate::ort::abs_histogram::AbsHistogram<E> = h;
                        h.hist.len()
                    }),
                };
                let grown = if n > self.num_bins {
                    format!(
                        " (grown from {} bins: a later collect had a much wider range, such as an outlier)",
                        self.num_bins
                    )
                } else {
                    String::new()
                };
                let what = format!("tensor {name:?}: the entropy search over its histogram of {n} bins{grown}");
                check_search_work(&what, entropy_search_work(n, num_quantized_bins), limit)?;
            }
            let out: Vec<PyResult<BinRange>> = run_stoppable(py, |stop| {
                states
                    .par_iter()
                    .map(|(name, st)| {
                        let choice = for_tensor(name, || match &st.histogram {
                            Histogram::Value(t) => {
                                with_typed!(t, |h, E| entropy_threshold::<E>(&h.hist, num_quantized_bins, stop))
                            }
                            Histogram::Abs(t) => {
                                with_typed!(t, |h, E| entropy_threshold::<E>(&h.hist, num_quantized_bins, stop))
                            }
                        });
                        choice.map(|c| BinRange { name: (*name).clone(), start: c.start, end: c.end })
                    })
                    .collect()
            })?;
            out.into_iter().collect()
        })
    }

    /// Percentile: `[(name, low_index, high_index)]` into each tensor's edges.
    fn percentile(&self, py: Python<'_>, percentile: f64, symmetric: bool) -> PyResult<Vec<BinRange>> {
        guard(|| {
            let states: Vec<(&String, &TensorState)> = self.order.iter().map(|n| (n, &self.states[n])).collect();
            Ok(run(py, || {
                states
                    .par_iter()
                    .map(|(name, st)| {
                        let hist = match &st.histogram {
                            Histogram::Value(t) => with_typed!(t, |h, E| {
                                let _: &crate::ort::value_histogram::ValueHistogram<E> = h;
                                &h.hist
                            }),
                            Histogram::Abs(t) => with_typed!(t, |h, E| {
                                let _: &crate::ort::abs_histogram::AbsHistogram<E> = h;
                                &h.hist
                            }),
                        };
                        let (lo, hi) = percentile_indices(hist, percentile, symmetric);
                        BinRange { name: (*name).clone(), start: lo, end: hi }
                    })
                    .collect()
            }))
        })
    }

    /// Distribution (scenario "same"): `[(name, avg, std)]` in f64, before rounding to the
    /// edge dtype.
    fn distribution(&self, py: Python<'_>) -> PyResult<Vec<Moments>> {
        guard(|| {
            let states: Vec<(&String, &TensorState)> = self.order.iter().map(|n| (n, &self.states[n])).collect();
            Ok(run(py, || {
                states
                    .par_iter()
                    .map(|(name, st)| {
                        let (a, s) = match &st.histogram {
                            Histogram::Value(t) => with_typed!(t, |h, E| avg_std::<E>(&h.hist, &h.edges)),
                            Histogram::Abs(t) => with_typed!(t, |h, E| avg_std::<E>(&h.hist, &h.edges)),
                        };
                        Moments { name: (*name).clone(), avg: a, std: s }
                    })
                    .collect()
            }))
        })
    }
}
