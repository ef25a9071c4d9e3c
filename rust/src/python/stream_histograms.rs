//! `StreamHistograms`: per-tensor streaming histograms, the summaries collected beside them, and
//! the range methods over them. Borrow, call `collection::StreamCollection`, build the record.

use super::arrays::Borrowed;
use super::arrays::*;
use super::classes::{Histograms, StreamHistograms};
use super::errors::*;
use super::functions::method_options;
use super::records::{StreamExport, StreamSummary, TensorCounts};
use super::threads::*;
use crate::collection::stream::ChannelBatches;
use crate::collection::stream_ranges::SummaryRange;
use crate::collection::summary::{Column, ReadParts, RowBatch, Rows, REGISTERED};
use crate::collection::tensor::Kind;
use crate::collection::StreamCollection;
use crate::methods::range_method::*;
use crate::numeric::fallible;
use numpy::ndarray::Axis;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

/// One item of `collect_channels`: the channels' keys and the tensor's batch arrays.
type ChannelItem<'py> = (Vec<Bound<'py, PyString>>, Vec<Bound<'py, PyAny>>);

#[pymethods]
impl StreamHistograms {
    /// `summaries`: the names of the summaries to collect beside the histograms (each a
    /// registered one: `pow2_votes`, the per-batch votes of pow2 MinMSE's most-common choice,
    /// which cost one pow2 search per batch and tensor; `isotone`, isotone's per-row top-two
    /// summaries).
    #[new]
    #[pyo3(signature = (num_bins, summaries=Vec::new()))]
    fn new(num_bins: usize, summaries: Vec<String>) -> PyResult<Self> {
        guard(|| {
            for name in &summaries {
                if !REGISTERED.iter().any(|(n, _)| n == name) {
                    return Err(PyValueError::new_err(format!(
                        "unknown summary {name:?} (summaries: {:?})",
                        REGISTERED.iter().map(|(n, _)| *n).collect::<Vec<_>>()
                    )));
                }
            }
            let wanted: Vec<&str> = summaries.iter().map(String::as_str).collect();
            Ok(StreamHistograms { inner: StreamCollection::new(num_bins, &wanted).map_err(PyValueError::new_err)? })
        })
    }

    /// The names of the summaries this collection collects.
    #[getter]
    fn summaries(&self) -> Vec<&'static str> {
        self.inner.summary_names()
    }

    /// A tensor's summary `summary` in its stored form, `{column: 1-D array}` (a scalar is an array
    /// of one value), or None when this collection does not collect it.
    fn export_summary<'py>(&self, py: Python<'py>, name: &str, summary: &str) -> PyResult<Option<Bound<'py, PyDict>>> {
        guard(|| {
            let Some(parts) = self.inner.export_summary(name, summary).map_err(tensor_error)? else { return Ok(None) };
            let out = PyDict::new(py);
            for (column, values) in parts {
                match values {
                    Column::F64(v) => out.set_item(column, PyArray1::from_vec(py, v))?,
                    Column::U64(v) => out.set_item(column, PyArray1::from_vec(py, v))?,
                    Column::I64(v) => out.set_item(column, PyArray1::from_vec(py, v))?,
                }
            }
            Ok(Some(out))
        })
    }

    /// Put back what `export_summary` gave (float64, uint64 or int64 arrays, as it gave them),
    /// after checking it; the collection must collect `summary`.
    fn restore_summary(&mut self, name: &str, summary: &str, parts: &Bound<'_, PyDict>) -> PyResult<()> {
        guard(|| {
            let mut read: ReadParts = Vec::with_capacity(parts.len());
            for (k, v) in parts.iter() {
                let column: String = k.extract()?;
                let values = read_column(&v, Column::F64)
                    .or_else(|| read_column(&v, Column::U64))
                    .or_else(|| read_column(&v, Column::I64));
                let values = values.ok_or_else(|| {
                    PyTypeError::new_err(format!(
                        "tensor {name:?}: {summary} column {column:?} must be a 1-D float64, uint64 or int64 array"
                    ))
                })?;
                read.push((column, values));
            }
            self.inner.restore_summary(name, summary, read).map_err(tensor_error)
        })
    }

    /// The bytes the summaries named `summary` of all tensors hold together (0 when not
    /// collected): what their memory grows with.
    fn summary_bytes(&self, summary: &str) -> usize {
        self.inner.summary_bytes(summary)
    }

    /// The ranges of the method that reads summary `summary` alone (`isotone`) for `names`
    /// (default: all): `(low, high, notes)` per tensor, `notes` its counts by name
    /// (`collection::stream_ranges`).
    #[pyo3(signature = (summary, names=None, *, qtype="int8", symmetric=false))]
    fn summary_ranges(
        &self,
        py: Python<'_>,
        summary: &str,
        names: Option<Vec<String>>,
        qtype: &str,
        symmetric: bool,
    ) -> PyResult<Vec<SummaryRange>> {
        guard(|| {
            let qtype = parse_qtype(qtype).map_err(PyValueError::new_err)?;
            run(py, || self.inner.summary_ranges(summary, names, qtype, symmetric)).map_err(tensor_error)
        })
    }

    #[getter]
    fn num_bins(&self) -> usize {
        self.inner.num_bins()
    }

    /// Add `[(name, [batch arrays...]), ...]`; how data is split into calls and batches, and
    /// their order, never changes the result.
    fn collect(&mut self, py: Python<'_>, items: Items<'_>) -> PyResult<()> {
        let reads_rows = self.inner.reads_rows();
        guard(|| {
            with_batches(&items, |borrowed, batches| {
                let rows: Vec<(&str, RowBatch<'_>)> = match reads_rows {
                    true => borrowed.iter().map(|(n, b)| (n.as_str(), row_batch(b, None))).collect(),
                    false => Vec::new(),
                };
                run(py, || self.inner.collect(batches, &rows))
            })?
            .map_err(tensor_error)
        })
    }

    /// Add batches channel by channel: `[(keys, [batch arrays...]), ...]`, where channel `c` along
    /// `axis` of every array of an item is a batch of the histogram named `keys[c]`, as `collect`
    /// would add it. Each array is read in memory order, all its channels at once
    /// (`stream::channel_rows`; a non-C-order array is copied first). Every array of an item must
    /// have `len(keys)` channels along `axis`. With isotone on, channel `c`'s slice (the array
    /// without `axis`, its last axis the class axis) adds its rows to the isotone summary of
    /// `keys[c]`, as `collect` would add the slice.
    fn collect_channels(&mut self, py: Python<'_>, items: Vec<ChannelItem<'_>>, axis: usize) -> PyResult<()> {
        guard(|| {
            // the keys borrowed from the Python strings: no copy of a hundred thousand keys a batch
            let mut borrowed = Vec::with_capacity(items.len());
            for (keys, arrays) in &items {
                let keys = keys.iter().map(|k| k.to_str()).collect::<PyResult<Vec<&str>>>()?;
                let name = keys.first().copied().unwrap_or("");
                let b = borrow_all(name, arrays)?;
                check_channels(name, &b, axis, keys.len())?;
                borrowed.push((keys, b));
            }
            let batches: Vec<(&[&str], ChannelBatches<'_>)> =
                borrowed.iter().map(|(keys, b)| (keys.as_slice(), channel_batches_of(b, axis))).collect();
            // the shapes are checked (check_channels): each channel's slice as rows
            let mut rows: Vec<(&str, RowBatch<'_>)> = Vec::new();
            if self.inner.reads_rows() {
                for (keys, b) in &borrowed {
                    for (c, &key) in keys.iter().enumerate() {
                        rows.push((key, row_batch(b, Some((axis, c)))));
                    }
                }
            }
            run(py, || self.inner.collect_channels(&batches, &rows)).map_err(tensor_error)
        })
    }

    fn names(&self) -> Vec<String> {
        self.inner.tensors().names().to_vec()
    }

    /// A copy (histograms and summaries); `MemoryError`, the original unchanged, when the memory
    /// is not there.
    fn copy(&self, py: Python<'_>) -> PyResult<StreamHistograms> {
        guard(|| Ok(StreamHistograms { inner: run(py, || self.inner.copied()) }))
    }

    /// ORT-shaped histograms (what one collect over all the data gives) for ORT's methods, of
    /// every tensor or of `names` (in that order): callers convert a few at a time, so that
    /// only those tensors' histograms of `num_bins` bins are alive at once.
    #[pyo3(signature = (kind, num_bins, names=None))]
    fn to_histograms(
        &self,
        py: Python<'_>,
        kind: &str,
        num_bins: usize,
        names: Option<Vec<String>>,
    ) -> PyResult<Histograms> {
        guard(|| {
            let kind = Kind::parse(kind).map_err(PyValueError::new_err)?;
            Ok(Histograms { inner: run(py, || self.inner.to_exact(kind, num_bins, names)).map_err(tensor_error)? })
        })
    }

    /// `(dtype, level or None, bins (uint64), finite_min, finite_max, abs_min, counts)`.
    fn export(&self, py: Python<'_>, name: &str) -> PyResult<StreamExport> {
        let StreamSummary { dtype, level, finite_min, finite_max, abs_min, counts } = self.summary(name)?;
        let bins = guard(|| Ok(self.inner.tensors().get(name).map_err(tensor_error)?.histogram.bins()))?;
        let bins = array(py, &bins).into_any().unbind();
        Ok(StreamExport { dtype, level, bins, finite_min, finite_max, abs_min, counts })
    }

    /// `export` without the bins: `(dtype, level or None, finite_min, finite_max, abs_min, counts)`.
    fn summary(&self, name: &str) -> PyResult<StreamSummary> {
        guard(|| {
            let st = self.inner.tensors().get(name).map_err(tensor_error)?;
            let h = &st.histogram;
            Ok(StreamSummary {
                dtype: st.dtype.to_string(),
                level: h.level,
                finite_min: h.finite_min,
                finite_max: h.finite_max,
                abs_min: h.abs_min,
                counts: (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches),
            })
        })
    }

    /// Put back what `export` gave, after checking it is consistent.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, dtype, level, bins, finite_min, finite_max, abs_min, counts))]
    fn restore(
        &mut self,
        name: &str,
        dtype: &str,
        level: Option<i32>,
        bins: numpy::PyReadonlyArray1<'_, u64>,
        finite_min: Option<f64>,
        finite_max: Option<f64>,
        abs_min: Option<f64>,
        counts: (u64, u64, u64, u64, u64),
    ) -> PyResult<()> {
        guard(|| {
            let bins = bins
                .as_slice()
                .map_err(|_| PyValueError::new_err(format!("tensor {name:?}: bins must be contiguous")))?;
            self.inner.restore(name, dtype, level, bins, finite_min, finite_max, abs_min, counts).map_err(tensor_error)
        })
    }

    /// Add another run's histograms (same num_bins): the result equals one run over both
    /// data sets, whatever the order of merging. A summary stays only when both collected it.
    fn merge(&mut self, other: &StreamHistograms) -> PyResult<()> {
        guard(|| self.inner.merge(&other.inner).map_err(tensor_error))
    }

    /// `(low, high)` of `method` (options as for `histogram_range`) for each tensor of `names`
    /// (default: all, in `names()` order), computed in parallel; (0, 0) for a tensor without
    /// finite values. `scale_rule`: as for `histogram_range`, the range type being each tensor's.
    #[pyo3(signature = (method, names=None, *, scale_rule, **options))]
    fn ranges(
        &self,
        py: Python<'_>,
        method: &str,
        names: Option<Vec<String>>,
        scale_rule: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<(f64, f64)>> {
        guard(|| {
            let method = RangeMethod::parse(method, &method_options(options)?).map_err(PyValueError::new_err)?;
            let ort = parse_ort_rule(scale_rule).map_err(PyValueError::new_err)?;
            for name in names.iter().flatten() {
                self.inner.tensors().get(name).map_err(tensor_error)?;
            }
            check_method_work(&method)?;
            run_stoppable(py, |stop| self.inner.ranges(&method, names, ort, stop))?.map_err(tensor_error)
        })
    }

    /// The mean squared quantization error of `ranges[k]` on tensor `names[k]`, in parallel
    /// (0.0 for a tensor without finite values). `scale_rule`: as for `histogram_qerror`, the
    /// range type being each tensor's.
    #[pyo3(signature = (names, ranges, *, scale_rule, qtype="int8", symmetric=false))]
    fn qerrors(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        ranges: Vec<(f64, f64)>,
        scale_rule: &str,
        qtype: &str,
        symmetric: bool,
    ) -> PyResult<Vec<f64>> {
        guard(|| {
            if names.len() != ranges.len() {
                return Err(PyValueError::new_err(format!("{} names but {} ranges", names.len(), ranges.len())));
            }
            let qtype = parse_qtype(qtype).map_err(PyValueError::new_err)?;
            let ort = parse_ort_rule(scale_rule).map_err(PyValueError::new_err)?;
            run(py, || self.inner.qerrors(names, &ranges, qtype, symmetric, ort)).map_err(tensor_error)
        })
    }

    /// `(finite, nan, posinf, neginf, batches)`.
    fn counts(&self, name: &str) -> PyResult<TensorCounts> {
        guard(|| {
            let h = &self.inner.tensors().get(name).map_err(tensor_error)?.histogram;
            Ok(TensorCounts::new([h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches]))
        })
    }
}

/// One tensor's borrowed batches as rows (each array in its own axis order), or with
/// `channel = Some((axis, c))` channel `c`'s slice along `axis` (the array without that axis).
fn row_batch<'a>(b: &'a Borrowed<'_>, channel: Option<(usize, usize)>) -> RowBatch<'a> {
    fn part<'a, T: numpy::Element + Copy>(
        arrays: &'a [numpy::PyReadonlyArrayDyn<'_, T>],
        channel: Option<(usize, usize)>,
    ) -> Vec<Rows<'a, T>> {
        let rows = |a: &'a numpy::PyReadonlyArrayDyn<'_, T>| {
            let v = match channel {
                None => a.as_array(),
                Some((axis, c)) => a.as_array().index_axis_move(Axis(axis), c),
            };
            // SAFETY: the readonly borrow keeps the buffer alive and unmodified for 'a; the view's
            // pointer (its first element) and shape/strides (in elements) describe it.
            unsafe { Rows::from_raw(v.as_ptr(), v.shape(), v.strides()) }
        };
        arrays.iter().map(rows).collect()
    }
    per_dtype!(Borrowed => RowBatch, b, |v| part(v, channel))
}

/// `v` as a `Column` (`wrap` of its values) when it is a 1-D array of `T`.
fn read_column<T: numpy::Element + Copy>(v: &Bound<'_, PyAny>, wrap: fn(Vec<T>) -> Column) -> Option<Column> {
    v.cast::<PyArray1<T>>().ok().map(|a| wrap(fallible::collect(a.readonly().as_array().iter().copied())))
}
