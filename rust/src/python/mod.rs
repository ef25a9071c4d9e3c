//! The only PyO3 code: numpy arrays in, plain kernel calls (GIL released, on histocal's
//! thread pool), Python values out. Type fidelity to ORT's objects lives in the Python layer.
//!
//! Every entry point runs inside [`guard`], so that nothing reaches Python as an abort or as
//! PyO3's `PanicException` (a `BaseException`: `except Exception` misses it): running out of
//! memory (`fallible`'s unwind) is a `MemoryError`, naming the tensor where one is being
//! worked on ([`for_tensor`]), and any other panic, a bug, a `RuntimeError`. Arrays handed to
//! Python are built from vectors allocated the same way (`PyArray1::from_vec` takes them
//! over), since numpy's own allocation failing inside rust-numpy is a panic.

mod arrays;
mod classes;
mod errors;
mod functions;
mod histograms;
mod records;
mod stream_histograms;
mod threads;

use crate::methods::pow2::{self};
use crate::ort::histogram::MAX_BINS;
use classes::{Histograms, StreamHistograms};
use functions::*;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use threads::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A bad value fails the import with a clear error rather than being silently ignored.
    let _ = ENV_THREADS.set(threads_from_env().map_err(PyValueError::new_err)?);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_BINS", MAX_BINS)?;
    m.add("ISOTONE_MAX_PAIRS", crate::methods::isotone::MAX_PAIRS)?;
    m.add("POW2_EXPONENTS", (pow2::MAX_EXPONENT - pow2::MIN_EXPONENT + 1) as usize)?;
    m.add_class::<Histograms>()?;
    m.add_class::<StreamHistograms>()?;
    records::add_records(m)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_caller_threads, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_stats, m)?)?;
    m.add_function(wrap_pyfunction!(channel_min_max, m)?)?;
    m.add_function(wrap_pyfunction!(nanmean_pairwise, m)?)?;
    m.add_function(wrap_pyfunction!(nanmean_sequential, m)?)?;
    m.add_function(wrap_pyfunction!(histogram_range, m)?)?;
    m.add_function(wrap_pyfunction!(histogram_qerror, m)?)?;
    m.add_function(wrap_pyfunction!(scale_zero_point, m)?)?;
    m.add_function(wrap_pyfunction!(pow2_error, m)?)?;
    m.add_function(wrap_pyfunction!(quark_pow2_error_sums, m)?)?;
    m.add_function(wrap_pyfunction!(quark_histogram_counts, m)?)?;
    Ok(())
}
