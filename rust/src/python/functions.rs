//! Module-level functions: one histogram's range, error or scale, and tensor statistics.

use super::arrays::Borrowed;
use super::arrays::*;
use super::errors::*;
use super::records::{ScaleZeroPoint, TensorStats};
use super::threads::*;
use crate::collection::par_map;
use crate::collection::tensor::Batches;
use crate::methods::pow2::{self};
use crate::methods::qerror::{ErrorTable, Quantizer, UniformHistogram};
use crate::methods::quark_pow2;
use crate::methods::range_method::*;
use crate::numeric::fallible::{self};
use crate::numeric::float::Float;
use crate::numeric::scan::{scan, Scan};
use crate::numeric::view::View;
use crate::ort::histogram::{HistError, UniformBins};
use crate::ort::minmax;
use numpy::{Element, PyArray1, PyReadonlyArrayDyn};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

pub(crate) fn uniform(counts: &[u64], left: f64, width: f64, min: f64, max: f64) -> PyResult<UniformHistogram<'_>> {
    UniformHistogram::new(counts, left, width, min, max).map_err(PyValueError::new_err)
}

/// A range method's options from keyword arguments named as the method table names them
/// (`qtype`, `symmetric`, `num_bins`, `num_quantized_bins`, `pow2_method`, `minmse_mode`);
/// those not given keep `MethodOptions`' defaults. An unknown name or a wrong type is a
/// TypeError naming it.
pub(crate) fn method_options(options: Option<&Bound<'_, PyDict>>) -> PyResult<MethodOptions> {
    let mut out = MethodOptions::default();
    for (key, value) in options.into_iter().flat_map(|d| d.iter()) {
        let key: String = key.extract()?;
        let typed = |what: &'static str| {
            let got = value.repr().map(|r| r.to_string()).unwrap_or_default();
            let key = key.clone();
            move |_: PyErr| PyTypeError::new_err(format!("option {key:?} must be {what}, got {got}"))
        };
        match key.as_str() {
            "qtype" => out.qtype = value.extract().map_err(typed("a str"))?,
            "symmetric" => out.symmetric = value.extract().map_err(typed("a bool"))?,
            "num_bins" => out.num_bins = value.extract().map_err(typed("an integer"))?,
            "num_quantized_bins" => out.num_quantized_bins = value.extract().map_err(typed("an integer"))?,
            "pow2_method" => out.pow2_method = value.extract().map_err(typed("a str"))?,
            "minmse_mode" => out.minmse_mode = value.extract().map_err(typed("a str"))?,
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "unexpected option {key:?}: expected qtype, symmetric, num_bins, num_quantized_bins, \
                     pow2_method or minmse_mode"
                )))
            }
        }
    }
    Ok(out)
}

/// `(low, high)` of `method` (one of `RangeMethod::NAMES`) on one uniform signed histogram:
/// `counts` (uint64) over bins of `width` from `left`, of data with finite extremes
/// `min <= max`; `options` as for `method_options`. `votes`, `(exponent, count)` pairs, are
/// what pow2 MinMSE's most-common choice decides from. The range is for a tensor of `dtype`
/// ("float16" or "float32") under ORT's scale rule `scale_rule` ("1.31" or "1.32"): mse's
/// errors and pow2's exponents follow it.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (method, counts, left, width, min, max, *, scale_rule, dtype="float32", votes=None, **options))]
pub(crate) fn histogram_range(
    py: Python<'_>,
    method: &str,
    counts: Bound<'_, PyAny>,
    left: f64,
    width: f64,
    min: f64,
    max: f64,
    scale_rule: &str,
    dtype: &str,
    votes: Option<Vec<(i32, u64)>>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(f64, f64)> {
    guard(|| {
        let method = RangeMethod::parse(method, &method_options(options)?).map_err(PyValueError::new_err)?;
        let rule = parse_scale_rule(scale_rule, dtype).map_err(PyValueError::new_err)?;
        if method.needs_votes() && votes.is_none() {
            return Err(PyValueError::new_err("pow2's most-common choice needs votes: a list of (exponent, count)"));
        }
        let counts = counts_array(&counts)?;
        let counts = counts_of(&counts);
        let hist = uniform(&counts, left, width, min, max)?;
        let votes = votes.unwrap_or_default();
        check_method_work(&method)?;
        run_stoppable(py, |stop| method.range(hist, &votes, f64::MAX, rule, stop))?.map_err(PyValueError::new_err)
    })
}

/// The mean squared error of quantizing the histogram's values with the range `(low, high)`
/// (ORT's scale and zero point for `qtype`, `symmetric`, the range being of `dtype` under
/// ORT's scale rule `scale_rule`, as for `histogram_range`).
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (counts, left, width, min, max, low, high, *, scale_rule, dtype="float32", qtype="int8", symmetric=false))]
pub(crate) fn histogram_qerror(
    py: Python<'_>,
    counts: Bound<'_, PyAny>,
    left: f64,
    width: f64,
    min: f64,
    max: f64,
    low: f64,
    high: f64,
    scale_rule: &str,
    dtype: &str,
    qtype: &str,
    symmetric: bool,
) -> PyResult<f64> {
    guard(|| {
        let q = quantizer_for(low, high, scale_rule, dtype, qtype, symmetric)?;
        let counts = counts_array(&counts)?;
        let counts = counts_of(&counts);
        let hist = uniform(&counts, left, width, min, max)?;
        Ok(run(py, || ErrorTable::new(hist).mean_squared_error(&q)))
    })
}

/// ORT's `(scale, zero_point)` for the range `(low, high)`: `compute_scale_zp` on the range in
/// `dtype` under `scale_rule` (as for `histogram_qerror`), the scale as a float64 (infinite for
/// a range beyond `dtype`).
#[pyfunction]
#[pyo3(signature = (low, high, *, scale_rule, dtype="float32", qtype="int8", symmetric=false))]
pub(crate) fn scale_zero_point(
    low: f64,
    high: f64,
    scale_rule: &str,
    dtype: &str,
    qtype: &str,
    symmetric: bool,
) -> PyResult<ScaleZeroPoint> {
    guard(|| {
        let q = quantizer_for(low, high, scale_rule, dtype, qtype, symmetric)?;
        Ok(ScaleZeroPoint { scale: q.scale, zero_point: q.zero_point as i64 })
    })
}

/// ORT's quantizer for the finite range `(low, high)`, the settings given by name.
fn quantizer_for(
    low: f64,
    high: f64,
    scale_rule: &str,
    dtype: &str,
    qtype: &str,
    symmetric: bool,
) -> PyResult<Quantizer> {
    let qtype = parse_qtype(qtype).map_err(PyValueError::new_err)?;
    let rule = parse_scale_rule(scale_rule, dtype).map_err(PyValueError::new_err)?;
    if !(low.is_finite() && high.is_finite()) {
        return Err(PyValueError::new_err(format!("range ({low}, {high}) is not finite")));
    }
    Ok(Quantizer::for_range(low, high, qtype, symmetric, rule))
}

/// pow2's `E(k)`: the mean squared error of scale `2^exponent`, zero point 0, in `qtype`.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
pub(crate) fn pow2_error(
    py: Python<'_>,
    counts: Bound<'_, PyAny>,
    left: f64,
    width: f64,
    min: f64,
    max: f64,
    exponent: i64,
    qtype: &str,
) -> PyResult<f64> {
    guard(|| {
        let qtype = parse_pow2_type(qtype).map_err(PyValueError::new_err)?;
        let k = i32::try_from(exponent)
            .ok()
            .filter(|k| (pow2::MIN_EXPONENT..=pow2::MAX_EXPONENT).contains(k))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "exponent must be in [{}, {}], got {exponent}",
                    pow2::MIN_EXPONENT,
                    pow2::MAX_EXPONENT
                ))
            })?;
        let counts = counts_array(&counts)?;
        let counts = counts_of(&counts);
        let hist = uniform(&counts, left, width, min, max)?;
        Ok(run(py, || pow2::error(&ErrorTable::new(hist), k, qtype)))
    })
}

/// AMD Quark's power-of-two MinMSE squared-error sums of `values` (a 1-D float32 array of
/// finite values) at each of `scales` (finite, non-zero powers of two): see
/// `methods::quark_pow2::error_sums`.
#[pyfunction]
pub(crate) fn quark_pow2_error_sums(
    py: Python<'_>,
    values: Bound<'_, PyAny>,
    scales: Vec<f32>,
    zero_point: f32,
    qmin: f32,
    qmax: f32,
) -> PyResult<Vec<f64>> {
    guard(|| {
        let values = float32_values(&values)?;
        let values = values.as_slice().map_err(|_| PyValueError::new_err("values must be contiguous"))?;
        if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s != 0.0)) {
            return Err(PyValueError::new_err(format!("scales must be finite and non-zero, got {s}")));
        }
        Ok(run(py, || quark_pow2::error_sums(values, &scales, zero_point, qmin, qmax)))
    })
}

/// Quark 0.13's histogram MinMSE counting: `np.histogram(values.astype(np.float64), bins=num_bins,
/// range=(first, last))[0]` of a 1-D float32 array (numpy's equal-bins path, bit for bit: see
/// `ort::histogram::UniformBins`); NaN and values outside the range are not counted.
#[pyfunction]
pub(crate) fn quark_histogram_counts<'py>(
    py: Python<'py>,
    values: Bound<'py, PyAny>,
    num_bins: usize,
    first: f64,
    last: f64,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    guard(|| {
        let values = float32_values(&values)?;
        let values = values.as_slice().map_err(|_| PyValueError::new_err("values must be contiguous"))?;
        if num_bins == 0 || first > last {
            return Err(PyValueError::new_err(format!("bad bins: {num_bins} over [{first}, {last}]")));
        }
        // numpy's +-0.5 around a single value, and its error where that leaves no room for the
        // bins (UniformBins widens instead, for ORT's float64 fallback: not numpy's result)
        let (first, last) = if first == last { (first - 0.5, last + 0.5) } else { (first, last) };
        let bins = if first < last {
            UniformBins::<f64>::new(first, last, num_bins)
        } else {
            Err(HistError::TooManyBins(num_bins))
        }
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut counts: Vec<i64> = fallible::zeroed(num_bins);
        run(py, || bins.count(&View::from_slice(values), false, &mut counts));
        Ok(PyArray1::from_vec(py, counts))
    })
}

pub(crate) fn stats_of<T: Float>(s: &Scan<T>) -> TensorStats {
    let f = |v: Option<T>| v.map(|x| x.to_f64());
    TensorStats {
        nanmin: f(s.nan_min()),
        nanmax: f(s.nan_max()),
        finite_min: f(s.finite_min),
        finite_max: f(s.finite_max),
        n_finite: s.n_finite,
        n_nan: s.n_nan,
        n_posinf: s.n_posinf,
        n_neginf: s.n_neginf,
    }
}

/// `(nanmin, nanmax, finite_min, finite_max, n_finite, n_nan, n_posinf, n_neginf)` of a tensor.
#[pyfunction]
pub(crate) fn tensor_stats(py: Python<'_>, arr: Bound<'_, PyAny>) -> PyResult<TensorStats> {
    guard(|| {
        let b = borrow_all("array", std::slice::from_ref(&arr))?;
        let batches = batches_of(&b);
        Ok(run(py, || per_dtype!(Batches, &batches, |v| stats_of(&scan(&v[0])))))
    })
}
/// Per-channel `(nanmin, nanmax)` along `axis` (NaN for an all-NaN channel), as arrays of the
/// input dtype: what ORT's ReduceMin/ReduceMax over the other axes give, NaN-ignoring.
#[pyfunction]
pub(crate) fn channel_min_max<'py>(
    py: Python<'py>,
    arr: Bound<'py, PyAny>,
    axis: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    guard(|| {
        fn go<'py, T: Float + Element>(
            py: Python<'py>,
            a: &PyReadonlyArrayDyn<'_, T>,
            axis: usize,
        ) -> (Bound<'py, PyAny>, Bound<'py, PyAny>) {
            let views = channel_views(a, axis);
            let mut scans: Vec<Scan<T>> = fallible::with_capacity(views.len());
            run(py, || scans.extend(par_map(&views, scan)));
            let nan = T::from_f64(f64::NAN);
            let mins: Vec<T> = fallible::collect(scans.iter().map(|s| s.nan_min().unwrap_or(nan)));
            let maxs: Vec<T> = fallible::collect(scans.iter().map(|s| s.nan_max().unwrap_or(nan)));
            (PyArray1::from_vec(py, mins).into_any(), PyArray1::from_vec(py, maxs).into_any())
        }
        let ndim = arr.getattr("ndim")?.extract::<usize>()?;
        if axis >= ndim.max(1) || ndim == 0 {
            return Err(PyValueError::new_err(format!(
                "axis {axis} is out of range for an array of {ndim} dimensions"
            )));
        }
        Ok(per_dtype!(Borrowed, borrow_all("array", std::slice::from_ref(&arr))?, |v| go(py, &v[0], axis)))
    })
}

/// `$f` (generic over the float type) on a 1-D contiguous float array, its result as f64.
macro_rules! reduce_1d {
    ($arr:expr, $f:path) => {{
        let b = borrow_all("values", std::slice::from_ref($arr))?;
        let err = || PyValueError::new_err("values must be a contiguous 1-D array");
        Ok(per_dtype!(Borrowed, &b, |v| $f(v[0].as_slice().map_err(|_| err())?).to_f64()))
    }};
}

/// ORT's per-tensor `np.nanmean` of per-batch values (pairwise order), as f64 of the dtype.
#[pyfunction]
pub(crate) fn nanmean_pairwise(values: Bound<'_, PyAny>) -> PyResult<f64> {
    guard(|| reduce_1d!(&values, minmax::nanmean_pairwise))
}

/// ORT's per-channel `np.nanmean(axis=0)` of one column (sequential order).
#[pyfunction]
pub(crate) fn nanmean_sequential(values: Bound<'_, PyAny>) -> PyResult<f64> {
    guard(|| reduce_1d!(&values, minmax::nanmean_sequential))
}
