//! The named records `_core` returns: frozen classes with a field per value, read by name
//! (`summary(name).finite_min`), equal when they are of one class with equal fields.

use pyo3::basic::CompareOp;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::IntoPyObjectExt;

/// A frozen record class with named fields, compared and hashed by its fields in order.
macro_rules! record {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $ty:ty),+ $(,)? }) => {
        $(#[$doc])*
        #[pyclass(module = "histocal._core", frozen, get_all)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $ty),+
        }

        impl $name {
            /// The fields as a tuple, in declaration order.
            fn as_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
                PyTuple::new(py, [$((&self.$field).into_bound_py_any(py)?),+])
            }
        }

        #[pymethods]
        impl $name {
            /// The field names, in declaration order.
            #[classattr]
            fn _fields() -> Vec<&'static str> {
                vec![$(stringify!($field)),+]
            }

            fn __richcmp__<'py>(&self, py: Python<'py>, other: &Bound<'py, PyAny>, op: CompareOp) -> PyResult<Py<PyAny>> {
                let Ok(other) = other.cast::<$name>() else {
                    return Ok(py.NotImplemented());
                };
                let other = other.get().as_tuple(py)?.into_any();
                Ok(self.as_tuple(py)?.as_any().rich_compare(other, op)?.unbind())
            }

            fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
                self.as_tuple(py)?.as_any().hash()
            }

            fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
                let values: Vec<String> = vec![$(
                    format!("{}={}", stringify!($field), (&self.$field).into_bound_py_any(py)?.repr()?)
                ),+];
                Ok(format!("{}({})", stringify!($name), values.join(", ")))
            }
        }
    };
}

record! {
    /// A tensor's value counts: finite, NaN, +inf and -inf values, and the batches seen.
    TensorCounts { n_finite: u64, n_nan: u64, n_posinf: u64, n_neginf: u64, batches: u64 }
}

impl TensorCounts {
    pub(crate) fn new([n_finite, n_nan, n_posinf, n_neginf, batches]: [u64; 5]) -> Self {
        TensorCounts { n_finite, n_nan, n_posinf, n_neginf, batches }
    }
}

record! {
    /// One ORT-shaped histogram: counts and edges (numpy arrays), the extremes and threshold as
    /// `(value, is_array)` (ORT keeps some as numpy scalars, some as 0-d arrays; None: no
    /// threshold), and the dtype of its arithmetic.
    HistogramState {
        hist: Py<PyAny>,
        edges: Py<PyAny>,
        min: (f64, bool),
        max: (f64, bool),
        threshold: Option<(f64, bool)>,
        dtype: String,
    }
}

record! {
    /// A streaming histogram without its bins: data dtype, level, finite extremes, smallest
    /// |x|, and its counts `(n_finite, n_nan, n_posinf, n_neginf, batches)`.
    StreamSummary {
        dtype: String,
        level: Option<i32>,
        finite_min: Option<f64>,
        finite_max: Option<f64>,
        abs_min: Option<f64>,
        counts: (u64, u64, u64, u64, u64),
    }
}

record! {
    /// A streaming histogram in full, as `StreamHistograms.restore` takes it back.
    StreamExport {
        dtype: String,
        level: Option<i32>,
        bins: Py<PyAny>,
        finite_min: Option<f64>,
        finite_max: Option<f64>,
        abs_min: Option<f64>,
        counts: (u64, u64, u64, u64, u64),
    }
}

record! {
    /// A tensor's threshold as a bin range of its histogram: ORT's edges `[start]` and `[end]`.
    BinRange { name: String, start: usize, end: usize }
}

record! {
    /// ORT's distribution method's moments of a tensor.
    Moments { name: String, avg: f64, std: f64 }
}

record! {
    /// One tensor's statistics: NaN-ignoring and finite extremes (None: none), and counts.
    TensorStats {
        nanmin: Option<f64>,
        nanmax: Option<f64>,
        finite_min: Option<f64>,
        finite_max: Option<f64>,
        n_finite: u64,
        n_nan: u64,
        n_posinf: u64,
        n_neginf: u64,
    }
}

record! {
    /// ORT's scale and zero point for a range.
    ScaleZeroPoint { scale: f64, zero_point: i64 }
}

/// Register the record classes on the module.
pub(crate) fn add_records(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TensorCounts>()?;
    m.add_class::<HistogramState>()?;
    m.add_class::<StreamSummary>()?;
    m.add_class::<StreamExport>()?;
    m.add_class::<BinRange>()?;
    m.add_class::<Moments>()?;
    m.add_class::<TensorStats>()?;
    m.add_class::<ScaleZeroPoint>()?;
    Ok(())
}
