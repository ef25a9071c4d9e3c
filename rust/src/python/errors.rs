//! Errors as Python exceptions: panics and memory exhaustion caught ([`guard`]), errors named
//! by tensor.

use crate::collection::TensorError;
use crate::numeric::fallible::OutOfMemory;
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// `f`, with an unwind out of it turned into an ordinary exception (see the module docs).
pub(crate) fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(match payload.downcast::<OutOfMemory>() {
            Ok(oom) => PyMemoryError::new_err(oom.to_string()),
            Err(other) => {
                let what = other
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| other.downcast_ref::<String>().cloned());
                PyRuntimeError::new_err(format!(
                    "histocal internal error: {}",
                    what.as_deref().unwrap_or("a panic in the Rust core")
                ))
            }
        })
    })
}

/// A core collection's error as an exception: running out of memory a `MemoryError`, anything
/// else a `ValueError` (both naming the tensor where there is one).
pub(crate) fn tensor_error(e: TensorError) -> PyErr {
    match e {
        TensorError::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}
