//! numpy arrays in and out: borrowed read-only views of float arrays and copies handed back.

use crate::collection::stream::ChannelBatches;
use crate::collection::tensor::Batches;
use crate::numeric::fallible::{self};
use crate::numeric::view::View;
use crate::stream::channel_rows::ChannelLayout;
use half::f16;
use numpy::{Element, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::borrow::Cow;

/// `$e` on the value `$v` of whichever float variant (`F16`, `F32`, `F64`) of enum `$in` `$b` is,
/// wrapped in the same variant of `$out` when given: one arm per dtype, written once.
macro_rules! per_dtype {
    ($in:ident => $out:ident, $b:expr, |$v:ident| $e:expr) => {
        per_dtype!($in, $b, |$v| $out::F16($e), $out::F32($e), $out::F64($e))
    };
    ($in:ident, $b:expr, |$v:ident| $e:expr) => {
        per_dtype!($in, $b, |$v| $e, $e, $e)
    };
    ($in:ident, $b:expr, |$v:ident| $e16:expr, $e32:expr, $e64:expr) => {
        match $b {
            $in::F16($v) => $e16,
            $in::F32($v) => $e32,
            $in::F64($v) => $e64,
        }
    };
}
pub(crate) use per_dtype;

/// A numpy array holding a copy of `values`.
pub(crate) fn array<'py, T: Element + Clone>(py: Python<'py>, values: &[T]) -> Bound<'py, PyArray1<T>> {
    PyArray1::from_vec(py, fallible::copy(values))
}

pub(crate) fn view_of<'a, T: Element + Copy>(a: &'a PyReadonlyArrayDyn<'_, T>) -> View<'a, T> {
    let v = a.as_array();
    // SAFETY: the readonly borrow keeps the buffer alive and unmodified for 'a; ndarray's
    // shape/strides (in elements) describe it.
    unsafe { View::from_raw(v.as_ptr(), v.shape(), v.strides()) }
}

/// Borrowed arrays of one dtype.
pub(crate) enum Borrowed<'py> {
    F16(Vec<PyReadonlyArrayDyn<'py, f16>>),
    F32(Vec<PyReadonlyArrayDyn<'py, f32>>),
    F64(Vec<PyReadonlyArrayDyn<'py, f64>>),
}

pub(crate) fn borrow_all<'py>(name: &str, arrays: &[Bound<'py, PyAny>]) -> PyResult<Borrowed<'py>> {
    fn all<'py, T: Element>(arrays: &[Bound<'py, PyAny>]) -> Option<Vec<PyReadonlyArrayDyn<'py, T>>> {
        arrays.iter().map(|a| a.cast::<PyArrayDyn<T>>().ok().map(|x| x.readonly())).collect()
    }
    let first = arrays.first();
    let is = |f: fn(&Bound<'py, PyAny>) -> bool| first.map(f).unwrap_or(false);
    let out = if is(|a| a.cast::<PyArrayDyn<f32>>().is_ok()) {
        all::<f32>(arrays).map(Borrowed::F32)
    } else if is(|a| a.cast::<PyArrayDyn<f16>>().is_ok()) {
        all::<f16>(arrays).map(Borrowed::F16)
    } else if is(|a| a.cast::<PyArrayDyn<f64>>().is_ok()) {
        all::<f64>(arrays).map(Borrowed::F64)
    } else {
        None
    };
    out.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "tensor {name:?}: expected native-endian float16/float32/float64 arrays of one dtype"
        ))
    })
}

pub(crate) fn batches_of<'a>(b: &'a Borrowed<'_>) -> Batches<'a> {
    per_dtype!(Borrowed => Batches, b, |v| v.iter().map(view_of).collect())
}

/// Each borrowed array's values in C order (a copy where the array is not) with its layout
/// around `axis` (`axis` < each array's dimensions: see `check_channels`).
pub(crate) fn channel_batches_of<'a>(b: &'a Borrowed<'_>, axis: usize) -> ChannelBatches<'a> {
    fn each<'a, T: Element + Copy>(
        arrays: &'a [PyReadonlyArrayDyn<'_, T>],
        axis: usize,
    ) -> Vec<(ChannelLayout, Cow<'a, [T]>)> {
        arrays
            .iter()
            .map(|a| {
                let v = a.as_array();
                let layout = ChannelLayout::new(v.shape(), axis);
                let data = match (v.is_standard_layout(), a.as_slice()) {
                    (true, Ok(s)) => Cow::Borrowed(s),
                    _ => Cow::Owned(fallible::collect(v.iter().copied())), // C order
                };
                (layout, data)
            })
            .collect()
    }
    per_dtype!(Borrowed => ChannelBatches, b, |v| each(v, axis))
}

/// A collect's items `[(name, [arrays...]), ...]`.
pub(crate) type Items<'py> = Vec<(String, Vec<Bound<'py, PyAny>>)>;

/// `f` on the items borrowed, and as each tensor's batches.
pub(crate) fn with_batches<R>(
    items: &Items<'_>,
    f: impl FnOnce(&[(String, Borrowed<'_>)], &[(&str, Batches<'_>)]) -> R,
) -> PyResult<R> {
    let borrowed: Vec<(String, Borrowed<'_>)> =
        items.iter().map(|(n, a)| Ok((n.clone(), borrow_all(n, a)?))).collect::<PyResult<_>>()?;
    let batches: Vec<(&str, Batches<'_>)> = borrowed.iter().map(|(n, b)| (n.as_str(), batches_of(b))).collect();
    Ok(f(&borrowed, &batches))
}

/// `values` as a read-only 1-D float32 array (the Quark kernels' values).
pub(crate) fn float32_values<'py>(values: &Bound<'py, PyAny>) -> PyResult<numpy::PyReadonlyArray1<'py, f32>> {
    Ok(values
        .cast::<PyArray1<f32>>()
        .map_err(|_| PyValueError::new_err("values must be a 1-D numpy array of float32"))?
        .readonly())
}

pub(crate) fn counts_array<'py>(counts: &Bound<'py, PyAny>) -> PyResult<numpy::PyReadonlyArray1<'py, u64>> {
    Ok(counts
        .cast::<PyArray1<u64>>()
        .map_err(|_| PyTypeError::new_err("counts must be a 1-D numpy array of uint64"))?
        .readonly())
}

/// The counts as a slice, copied only when the array is not contiguous.
pub(crate) fn counts_of<'a>(counts: &'a numpy::PyReadonlyArray1<'_, u64>) -> std::borrow::Cow<'a, [u64]> {
    match counts.as_slice() {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(fallible::collect(counts.as_array().iter().copied())),
    }
}

pub(crate) fn channel_views<'a, T: Element + Copy>(a: &'a PyReadonlyArrayDyn<'_, T>, axis: usize) -> Vec<View<'a, T>> {
    let v = a.as_array();
    let (shape, strides) = (v.shape(), v.strides());
    let rest_shape: Vec<usize> = shape.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &s)| s).collect();
    let rest_strides: Vec<isize> = strides.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &s)| s).collect();
    fallible::collect((0..shape[axis]).map(|c| {
        // SAFETY: channel c's elements lie inside the borrowed array.
        unsafe { View::from_raw(v.as_ptr().offset(c as isize * strides[axis]), &rest_shape, &rest_strides) }
    }))
}

/// An error (naming `name`) unless every borrowed array has `channels` channels along `axis`.
pub(crate) fn check_channels(name: &str, b: &Borrowed<'_>, axis: usize, channels: usize) -> PyResult<()> {
    fn check<T: Element>(
        name: &str,
        arrays: &[PyReadonlyArrayDyn<'_, T>],
        axis: usize,
        channels: usize,
    ) -> PyResult<()> {
        for a in arrays {
            let shape = a.as_array().shape().to_vec();
            if shape.get(axis) != Some(&channels) {
                return Err(PyValueError::new_err(format!(
                    "tensor {name:?}: expected {channels} channels along axis {axis}, got shape {shape:?}"
                )));
            }
        }
        Ok(())
    }
    per_dtype!(Borrowed, b, |v| check(name, v, axis, channels))
}
