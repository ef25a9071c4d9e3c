//! The only PyO3 code: numpy arrays in, plain kernel calls (GIL released, on histocal's
//! thread pool), Python values out. Type fidelity to ORT's objects lives in the Python layer.
//!
//! Every entry point runs inside [`guard`], so that nothing reaches Python as an abort or as
//! PyO3's `PanicException` (a `BaseException`: `except Exception` misses it): running out of
//! memory (`fallible`'s unwind) is a `MemoryError`, naming the tensor where one is being
//! worked on ([`for_tensor`]), and any other panic, a bug, a `RuntimeError`. Arrays handed to
//! Python are built from vectors allocated the same way (`PyArray1::from_vec` takes them
//! over), since numpy's own allocation failing inside rust-numpy is a panic.

use crate::distribution::avg_std;
use crate::entropy::{entropy_threshold, search_work as entropy_search_work};
use crate::fallible::{self, OutOfMemory};
use crate::float::Float;
use crate::kl_tensorrt;
use crate::minmax;
use crate::mse::mse_range;
use crate::pow2::{self, Pow2Type};
use crate::qerror::{ErrorTable, OrtRule, QType, Quantizer, ScaleRule, UniformHistogram};
use crate::percentile::percentile_indices;
use crate::scan::{scan, Scan};
use crate::state::{collect, count, plan, Batches, CollectError, Counts, Family, Histogram, Kind, Scans, TensorState, Typed, TypedBinning};
use crate::stream_histogram::StreamHistogram;
use crate::histogram::{HistError, MAX_BINS};
use crate::view::View;
use half::f16;
use numpy::{Element, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn};
use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};
use rayon::prelude::*;
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

static POOL: Mutex<Option<Arc<ThreadPool>>> = Mutex::new(None);
/// `HISTOCAL_NUM_THREADS` as read when the module was imported (None: unset, empty or 0).
static ENV_THREADS: OnceLock<Option<usize>> = OnceLock::new();

/// `HISTOCAL_NUM_THREADS`: a thread count, or None for one per core (unset, empty or 0).
fn threads_from_env() -> Result<Option<usize>, String> {
    let raw = match std::env::var("HISTOCAL_NUM_THREADS") {
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => return Err(format!("{v:?}")),
        Ok(v) => v,
    };
    match raw.trim() {
        "" => Ok(None),
        t => t.parse::<usize>().map(|n| (n > 0).then_some(n)).map_err(|_| format!("{raw:?}")),
    }
    .map_err(|got| format!("HISTOCAL_NUM_THREADS must be a whole number of threads >= 0 (0 or unset: one per core), got {got}"))
}

fn default_threads() -> usize {
    ENV_THREADS.get().copied().flatten().unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

fn pool() -> Arc<ThreadPool> {
    let mut g = POOL.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(|| Arc::new(ThreadPoolBuilder::new().num_threads(default_threads()).build().expect("thread pool")))
        .clone()
}

/// `f`, with an unwind out of it turned into an ordinary exception (see the module docs).
fn guard<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(match payload.downcast::<OutOfMemory>() {
            Ok(oom) => PyMemoryError::new_err(oom.to_string()),
            Err(other) => {
                let what = other.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| other.downcast_ref::<String>().cloned());
                PyRuntimeError::new_err(format!("histocal internal error: {}", what.as_deref().unwrap_or("a panic in the Rust core")))
            }
        })
    })
}

/// `f`'s work on tensor `name`: its error as a `ValueError`, running out of memory as a
/// `MemoryError`, both naming the tensor.
fn for_tensor<T, E: std::fmt::Display>(name: &str, f: impl FnOnce() -> Result<T, E>) -> PyResult<T> {
    match fallible::catch(f) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(PyValueError::new_err(format!("tensor {name:?}: {e}"))),
        Err(oom) => Err(out_of_memory(name, oom)),
    }
}

fn out_of_memory(name: &str, oom: OutOfMemory) -> PyErr {
    PyMemoryError::new_err(format!("tensor {name:?}: {oom}"))
}

/// A numpy array holding a copy of `values`.
fn array<'py, T: Element + Clone>(py: Python<'py>, values: &[T]) -> Bound<'py, PyArray1<T>> {
    PyArray1::from_vec(py, fallible::copy(values))
}

/// Run `f` on histocal's pool with the GIL released.
fn run<T: Send, F: FnOnce() -> T + Send>(py: Python<'_>, f: F) -> T {
    let p = pool();
    py.detach(|| p.install(f))
}

/// How often a running search checks for Python signals.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Run a search `f` on histocal's pool with the GIL released, taking the GIL back every
/// [`SIGNAL_POLL`] to run Python's signal handlers. When one raises (Ctrl-C:
/// KeyboardInterrupt), `f`'s stop flag is set, its workers stop at their next check, and the
/// exception is raised once they all have. `f` must leave no state half-changed when stopped.
fn run_stoppable<T: Send, F: FnOnce(&AtomicBool) -> T + Send>(py: Python<'_>, f: F) -> PyResult<T> {
    let p = pool();
    let stop = AtomicBool::new(false);
    let done: (Mutex<Option<std::thread::Result<T>>>, Condvar) = (Mutex::new(None), Condvar::new());
    let mut signal: Option<PyErr> = None;
    let result = py.detach(|| {
        p.in_place_scope(|scope| {
            scope.spawn(|_| {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&stop)));
                *done.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                done.1.notify_all();
            });
            let mut slot = done.0.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if let Some(r) = slot.take() {
                    return r;
                }
                let (s, wait) = done.1.wait_timeout(slot, SIGNAL_POLL).unwrap_or_else(|e| e.into_inner());
                slot = s;
                if wait.timed_out() && slot.is_none() && signal.is_none() {
                    drop(slot);
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
                        signal = Some(e);
                        stop.store(true, Ordering::Relaxed);
                    }
                    slot = done.0.lock().unwrap_or_else(|e| e.into_inner());
                }
            }
        })
    });
    match (signal, result) {
        (Some(e), _) => Err(e),
        (None, Ok(v)) => Ok(v),
        (None, Err(panic)) => std::panic::resume_unwind(panic),
    }
}

const MAX_SEARCH_WORK_VAR: &str = "HISTOCAL_MAX_SEARCH_WORK";

/// The default of `HISTOCAL_MAX_SEARCH_WORK`: an entropy search over about 346,000 bins
/// (tens of seconds on two cores; onnxruntime would take over an hour).
const DEFAULT_MAX_SEARCH_WORK: u64 = 30_000_000_000;

/// The most work one tensor's search may take, in the bin evaluations of
/// [`crate::entropy::search_work`]: `HISTOCAL_MAX_SEARCH_WORK` (a number; `inf`: no limit),
/// read at each search, else (unset or empty) [`DEFAULT_MAX_SEARCH_WORK`].
fn max_search_work() -> PyResult<u64> {
    let v = std::env::var(MAX_SEARCH_WORK_VAR).unwrap_or_default();
    if v.trim().is_empty() {
        return Ok(DEFAULT_MAX_SEARCH_WORK);
    }
    match v.trim().parse::<f64>() {
        Ok(x) if x >= 1.0 => Ok(if x >= u64::MAX as f64 { u64::MAX } else { x as u64 }),
        _ => Err(PyValueError::new_err(format!("{MAX_SEARCH_WORK_VAR} must be a number >= 1 (or inf), got {v:?}"))),
    }
}

/// An error, before a search of `work` starts, if that is above `limit`; `what` names the
/// search.
fn check_search_work(what: &str, work: u64, limit: u64) -> PyResult<()> {
    if work <= limit {
        return Ok(());
    }
    // the value to suggest: work rounded up to three significant digits, so that it is enough
    let unit = 10f64.powi((work as f64).log10().floor() as i32 - 2);
    Err(PyValueError::new_err(format!(
        "{what} needs {work:.2e} bin evaluations, above the limit of {limit:.2e} (its time grows with the square of \
         the bin count); to run it anyway, set the environment variable {MAX_SEARCH_WORK_VAR}={raise:.2e} or more",
        work = work as f64,
        limit = limit as f64,
        raise = (work as f64 / unit).ceil() * unit,
    )))
}

/// Set the number of worker threads (0: the default, `HISTOCAL_NUM_THREADS` or all cores).
#[pyfunction]
fn set_num_threads(n: &Bound<'_, PyAny>) -> PyResult<()> {
    let expected = format!(
        "set_num_threads: n must be a whole number of threads >= 0 (0: HISTOCAL_NUM_THREADS or one per core), got {}",
        n.repr()?
    );
    let count = n.extract::<i64>();
    let whole = !n.is_instance_of::<PyBool>() && (count.is_ok() || n.is_instance_of::<PyInt>());
    if !whole {
        return Err(PyTypeError::new_err(expected));
    }
    let n = count
        .ok()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| PyValueError::new_err(expected))?;
    guard(|| {
    let n = if n == 0 { default_threads() } else { n };
    let p = ThreadPoolBuilder::new().num_threads(n).build().map_err(|e| PyValueError::new_err(e.to_string()))?;
    *POOL.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(p));
    Ok(())
    })
}

#[pyfunction]
fn get_num_threads() -> PyResult<usize> {
    guard(|| Ok(pool().current_num_threads()))
}

fn view_of<'a, T: Element + Copy>(a: &'a PyReadonlyArrayDyn<'_, T>) -> View<'a, T> {
    let v = a.as_array();
    // SAFETY: the readonly borrow keeps the buffer alive and unmodified for 'a; ndarray's
    // shape/strides (in elements) describe it.
    unsafe { View::from_raw(v.as_ptr(), v.shape(), v.strides()) }
}

/// Borrowed arrays of one dtype.
enum Borrowed<'py> {
    F16(Vec<PyReadonlyArrayDyn<'py, f16>>),
    F32(Vec<PyReadonlyArrayDyn<'py, f32>>),
    F64(Vec<PyReadonlyArrayDyn<'py, f64>>),
}

fn borrow_all<'py>(name: &str, arrays: &[Bound<'py, PyAny>]) -> PyResult<Borrowed<'py>> {
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

fn batches_of<'a>(b: &'a Borrowed<'_>) -> Batches<'a> {
    match b {
        Borrowed::F16(v) => Batches::F16(v.iter().map(view_of).collect()),
        Borrowed::F32(v) => Batches::F32(v.iter().map(view_of).collect()),
        Borrowed::F64(v) => Batches::F64(v.iter().map(view_of).collect()),
    }
}

/// Per-tensor histogram states of one kind, in first-collected order.
#[pyclass(module = "histocal._core")]
pub struct Histograms {
    kind: Kind,
    num_bins: usize,
    order: Vec<String>,
    states: HashMap<String, TensorState>,
    /// Two-pass collects: the combined scan and batch count of the collect being scanned.
    pending: HashMap<String, (Scans, u64)>,
}

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

fn typed_dtype<Fm: Family>(t: &Typed<Fm>) -> &'static str {
    match t {
        Typed::F16(_) => "float16",
        Typed::F32(_) => "float32",
        Typed::F64(_) => "float64",
    }
}

fn held<E: Float>(h: crate::value_histogram::Held<E>) -> (f64, bool) {
    (h.value.to_f64(), h.is_array)
}

fn borrow_items<'py>(items: &[(String, Vec<Bound<'py, PyAny>>)]) -> PyResult<Vec<(String, Borrowed<'py>)>> {
    items.iter().map(|(n, a)| Ok((n.clone(), borrow_all(n, a)?))).collect()
}

fn named(name: &str, e: CollectError) -> PyErr {
    PyValueError::new_err(format!("tensor {name:?}: {e}"))
}

impl Histograms {
    fn insert(&mut self, name: &str, state: TensorState) {
        if !self.states.contains_key(name) && !self.order.iter().any(|o| o == name) {
            self.order.push(name.to_string());
        }
        self.states.insert(name.to_string(), state);
    }
}

#[pymethods]
impl Histograms {
    #[new]
    fn new(kind: &str, num_bins: usize) -> PyResult<Self> {
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
        let mut work: Vec<(&str, Batches, Option<TensorState>)> =
            borrowed.iter().map(|(n, b)| (n.as_str(), batches_of(b), self.states.remove(n))).collect();
        let (kind, n_bins) = (self.kind, self.num_bins);
            let results: Vec<PyResult<()>> = run(py, || {
                work.par_iter_mut().map(|(name, batches, state)| for_tensor(name, || collect(state, kind, batches, n_bins))).collect()
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
    fn scan(&mut self, py: Python<'_>, items: Vec<(String, Vec<Bound<'_, PyAny>>)>, mut stream: Option<PyRefMut<'_, StreamHistograms>>) -> PyResult<()> {
        guard(|| {
        let borrowed = borrow_items(&items)?;
        let batches: Vec<(&str, Batches)> = borrowed.iter().map(|(n, b)| (n.as_str(), batches_of(b))).collect();
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

    /// Two-pass collect, between the passes: start each scanned tensor's collect from its
    /// combined scan (ORT's ranges for the whole call). Pass 2 then `count`s every batch.
    fn plan(&mut self, py: Python<'_>) -> PyResult<()> {
        guard(|| {
        let mut work: Vec<(String, (Scans, u64), Option<TensorState>)> =
            self.pending.drain().map(|(n, p)| { let st = self.states.remove(&n); (n, p, st) }).collect();
        work.sort_by(|a, b| a.0.cmp(&b.0));
        let (kind, n_bins) = (self.kind, self.num_bins);
            let results: Vec<PyResult<()>> = run(py, || {
                work.par_iter_mut().map(|(name, (scan, n), state)| for_tensor(name, || plan(state, kind, scan, *n, n_bins))).collect()
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
        let mut work: Vec<(&str, Batches, TensorState)> = Vec::with_capacity(borrowed.len());
        for (n, b) in &borrowed {
            let st = self.states.remove(n).ok_or_else(|| PyValueError::new_err(format!("tensor {n:?}: counted before it was planned")))?;
            work.push((n.as_str(), batches_of(b), st));
        }
            // counting never runs out of memory (it falls back to counting without scratch)
            let results: Vec<PyResult<()>> = run(py, || work.par_iter_mut().map(|(name, b, st)| for_tensor(name, || count(st, b))).collect());
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
    #[allow(clippy::type_complexity)]
    fn state<'py>(
        &self,
        py: Python<'py>,
        name: &str,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>, (f64, bool), (f64, bool), Option<(f64, bool)>, &'static str)> {
        guard(|| {
        let st = self.states.get(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
        Ok(match &st.histogram {
            Histogram::Value(t) => with_typed!(t, |h, E| {
                let _: &crate::value_histogram::ValueHistogram<E> = h;
                (
                        array(py, &h.hist).into_any(),
                        array(py, &h.edges).into_any(),
                    held(h.min),
                    held(h.max),
                    Some(held(h.threshold)),
                    st.dtype,
                )
            }),
            Histogram::Abs(t) => with_typed!(t, |h, E| {
                let _: &crate::abs_histogram::AbsHistogram<E> = h;
                (
                        array(py, &h.hist).into_any(),
                        array(py, &h.edges).into_any(),
                    held(h.min),
                    held(h.max),
                    None,
                    st.dtype,
                )
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
                let _: &crate::value_histogram::ValueHistogram<E> = h;
                same_hist(&h.hist)
                    && same_values::<E>(edges, &h.edges)
                    && min.to_bits() == bits(h.min.value)
                    && max.to_bits() == bits(h.max.value)
                    && threshold.is_some_and(|t| t.to_bits() == bits(h.threshold.value))
            }),
            Histogram::Abs(t) => with_typed!(t, |h, E| {
                let _: &crate::abs_histogram::AbsHistogram<E> = h;
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
        let binnable = if self.kind == Kind::Abs { finite as u128 + posinf as u128 + neginf as u128 } else { finite as u128 };
        if hist.iter().map(|&c| c as u128).sum::<u128>() > binnable {
            return Err(bad("hist holds more values than were collected".into()));
        }
        if (self.kind == Kind::Value) != threshold.is_some() {
            return Err(bad("threshold must be given for value histograms only".into()));
        }
        let b = borrow_all(name, std::slice::from_ref(&edges))?;
        fn build<E: Float + Element>(
            kind: Kind, hist: Vec<i64>, edges: &[E], min: (f64, bool), max: (f64, bool), threshold: Option<(f64, bool)>,
        ) -> Result<(Histogram, &'static str), String>
        where
            Typed<crate::state::ValueFamily>: From<crate::value_histogram::ValueHistogram<E>>,
            Typed<crate::state::AbsFamily>: From<crate::abs_histogram::AbsHistogram<E>>,
        {
            if edges.len() != hist.len() + 1 {
                return Err(format!("{} edges for {} bins", edges.len(), hist.len()));
            }
            match kind {
                Kind::Value => {
                    if edges.iter().any(|e| !e.is_finite()) || edges.windows(2).any(|w| !(w[0] < w[1])) {
                        return Err("edges must be finite and increasing".into());
                    }
                }
                Kind::Abs => crate::abs_histogram::check_edges(edges, &hist)?,
            }
            let held = |(v, a): (f64, bool)| {
                let x = E::from_f64(v);
                if v.is_nan() || x.to_f64() != v { Err(format!("{v} is not a {} value", E::NAME)) } else { Ok(crate::value_histogram::Held { value: x, is_array: a }) }
            };
            let (mn, mx) = (held(min)?, held(max)?);
                let edges = fallible::copy(edges);
            Ok(match kind {
                Kind::Value => {
                    let t = held(threshold.expect("checked above"))?;
                    (Histogram::Value(crate::value_histogram::ValueHistogram { hist, edges, min: mn, max: mx, threshold: t }.into()), E::NAME)
                }
                Kind::Abs => (Histogram::Abs(crate::abs_histogram::AbsHistogram { hist, edges, min: mn, max: mx }.into()), E::NAME),
            })
        }
        let err = |e: String| bad(e);
        let edge_slice = |ok: bool| if ok { Ok(()) } else { Err(bad("edges must be a contiguous 1-D array".into())) };
        let (histogram, edge_dtype) = match &b {
            Borrowed::F16(v) => { edge_slice(v[0].as_slice().is_ok())?; build(self.kind, hist, v[0].as_slice().unwrap(), min, max, threshold).map_err(err)? }
            Borrowed::F32(v) => { edge_slice(v[0].as_slice().is_ok())?; build(self.kind, hist, v[0].as_slice().unwrap(), min, max, threshold).map_err(err)? }
            Borrowed::F64(v) => { edge_slice(v[0].as_slice().is_ok())?; build(self.kind, hist, v[0].as_slice().unwrap(), min, max, threshold).map_err(err)? }
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
    fn counts(&self, name: &str) -> PyResult<(u64, u64, u64, u64, u64)> {
        guard(|| {
        let c = self.states.get(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?.counts;
        Ok((c.finite, c.nan, c.posinf, c.neginf, c.batches))
        })
    }

    /// The histogram's arithmetic dtype (the data dtype unless numpy would have failed).
    fn edge_dtype(&self, name: &str) -> PyResult<&'static str> {
        guard(|| {
        let st = self.states.get(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
        Ok(match &st.histogram {
            Histogram::Value(t) => typed_dtype(t),
            Histogram::Abs(t) => typed_dtype(t),
        })
        })
    }

    /// Entropy: `[(name, start, end)]`, thresholds `(edges[start], edges[end])` before clipping.
    /// Every tensor's search is checked against the work limit before any starts.
    fn entropy(&self, py: Python<'_>, num_quantized_bins: usize) -> PyResult<Vec<(String, usize, usize)>> {
        guard(|| {
        let states: Vec<(&String, &TensorState)> = self.order.iter().map(|n| (n, &self.states[n])).collect();
        let limit = max_search_work()?;
        for (name, st) in &states {
            let n = match &st.histogram {
                Histogram::Value(t) => with_typed!(t, |h, E| {
                    let _: &crate::value_histogram::ValueHistogram<E> = h;
                    h.hist.len()
                }),
                Histogram::Abs(t) => with_typed!(t, |h, E| {
                    let _: &crate::abs_histogram::AbsHistogram<E> = h;
                    h.hist.len()
                }),
            };
            let grown = if n > self.num_bins {
                format!(" (grown from {} bins: a later collect had a much wider range, such as an outlier)", self.num_bins)
            } else {
                String::new()
            };
            let what = format!("tensor {name:?}: the entropy search over its histogram of {n} bins{grown}");
            check_search_work(&what, entropy_search_work(n, num_quantized_bins), limit)?;
        }
        let out: Vec<PyResult<(String, usize, usize)>> = run_stoppable(py, |stop| {
            states
                .par_iter()
                .map(|(name, st)| {
                    let choice = for_tensor(name, || match &st.histogram {
                        Histogram::Value(t) => with_typed!(t, |h, E| entropy_threshold::<E>(&h.hist, num_quantized_bins, stop)),
                        Histogram::Abs(t) => with_typed!(t, |h, E| entropy_threshold::<E>(&h.hist, num_quantized_bins, stop)),
                    });
                    choice.map(|c| ((*name).clone(), c.start, c.end))
                })
                .collect()
        })?;
        out.into_iter().collect()
        })
    }

    /// Percentile: `[(name, low_index, high_index)]` into each tensor's edges.
    fn percentile(&self, py: Python<'_>, percentile: f64, symmetric: bool) -> PyResult<Vec<(String, usize, usize)>> {
        guard(|| {
        let states: Vec<(&String, &TensorState)> = self.order.iter().map(|n| (n, &self.states[n])).collect();
            Ok(run(py, || {
            states
                .par_iter()
                .map(|(name, st)| {
                    let hist = match &st.histogram {
                        Histogram::Value(t) => with_typed!(t, |h, E| {
                            let _: &crate::value_histogram::ValueHistogram<E> = h;
                            &h.hist
                        }),
                        Histogram::Abs(t) => with_typed!(t, |h, E| {
                            let _: &crate::abs_histogram::AbsHistogram<E> = h;
                            &h.hist
                        }),
                    };
                    let (lo, hi) = percentile_indices(hist, percentile, symmetric);
                    ((*name).clone(), lo, hi)
                })
                .collect()
            }))
        })
    }

    /// Distribution (scenario "same"): `[(name, avg, std)]` in f64, before rounding to the
    /// edge dtype.
    fn distribution(&self, py: Python<'_>) -> PyResult<Vec<(String, f64, f64)>> {
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
                    ((*name).clone(), a, s)
                })
                .collect()
        }))
        })
    }
}

/// Per-tensor streaming histograms (batch-invariant), in first-collected order.
#[pyclass(module = "histocal._core")]
pub struct StreamHistograms {
    log_half: u32,
    /// Whether new tensors collect pow2 MostCommon's per-batch votes.
    pow2_votes: bool,
    order: Vec<String>,
    states: HashMap<String, StreamState>,
}

/// A tensor's streaming histogram and its data dtype.
type StreamState = (&'static str, StreamHistogram);

impl StreamHistograms {
    /// Take out the histograms of these tensors (new ones for tensors not seen yet) to add
    /// batches to; an error, changing nothing, if a tensor's dtype changed.
    fn take(&mut self, batches: &[(&str, Batches)]) -> PyResult<Vec<StreamState>> {
        for (n, b) in batches {
            if let Some((d, _)) = self.states.get(*n) {
                if *d != b.dtype() {
                    return Err(named(n, CollectError::DtypeChanged { before: d, now: b.dtype() }));
                }
            }
        }
        // the new histograms first: running out of memory then changes nothing
        let fresh: Vec<Option<StreamHistogram>> = batches.iter().map(|(n, _)| (!self.states.contains_key(*n)).then(|| self.new_histogram())).collect();
        Ok(batches
            .iter()
            .zip(fresh)
            .map(|((n, b), new)| {
                let old = self.states.remove(*n);
                old.or_else(|| new.map(|h| (b.dtype(), h))).unwrap_or_else(|| (b.dtype(), self.new_histogram()))
            })
            .collect())
    }

    fn new_histogram(&self) -> StreamHistogram {
        if self.pow2_votes {
            StreamHistogram::with_pow2_votes(self.log_half)
        } else {
            StreamHistogram::new(self.log_half)
        }
    }

    /// Put back what `take` gave.
    fn put(&mut self, batches: &[(&str, Batches)], states: Vec<StreamState>) {
        for ((n, _), st) in batches.iter().zip(states) {
            if !self.order.iter().any(|o| o == n) {
                self.order.push(n.to_string());
            }
            self.states.insert(n.to_string(), st);
        }
    }
}

/// ORT-shaped histogram of a streaming one, in the data's type or, where numpy would fail
/// ("Too many bins"), the next wider one.
fn ort_shaped(dtype: &str, h: &StreamHistogram, kind: Kind, n: usize) -> Result<Histogram, HistError> {
    fn value<E: Float>(h: &StreamHistogram, n: usize) -> Result<crate::value_histogram::ValueHistogram<E>, HistError> {
        h.to_value::<E>(n)
    }
    fn abs<E: Float>(h: &StreamHistogram, n: usize) -> Result<crate::abs_histogram::AbsHistogram<E>, HistError> {
        h.to_abs::<E>(n)
    }
    let start = match dtype {
        "float16" => 0,
        "float32" => 1,
        _ => 2,
    };
    let mut last = HistError::NonFiniteRange;
    for level in start..3 {
        let r = match (kind, level) {
            (Kind::Value, 0) => value::<f16>(h, n).map(|x| Histogram::Value(Typed::F16(x))),
            (Kind::Value, 1) => value::<f32>(h, n).map(|x| Histogram::Value(Typed::F32(x))),
            (Kind::Value, _) => value::<f64>(h, n).map(|x| Histogram::Value(Typed::F64(x))),
            (Kind::Abs, 0) => abs::<f16>(h, n).map(|x| Histogram::Abs(Typed::F16(x))),
            (Kind::Abs, 1) => abs::<f32>(h, n).map(|x| Histogram::Abs(Typed::F32(x))),
            (Kind::Abs, _) => abs::<f64>(h, n).map(|x| Histogram::Abs(Typed::F64(x))),
        };
        match r {
            Ok(x) => return Ok(x),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[pymethods]
impl StreamHistograms {
    /// `pow2_votes`: also collect pow2 MinMSE MostCommon's per-batch votes (costs one pow2
    /// search per batch and tensor).
    #[new]
    #[pyo3(signature = (num_bins, pow2_votes=false))]
    fn new(num_bins: usize, pow2_votes: bool) -> PyResult<Self> {
        guard(|| {
        if !num_bins.is_power_of_two() || !(8..=(1 << 25)).contains(&num_bins) {
            return Err(PyValueError::new_err(format!("streaming num_bins must be a power of two in [8, 2^25], got {num_bins}")));
        }
        Ok(StreamHistograms { log_half: num_bins.trailing_zeros() - 1, pow2_votes, order: Vec::new(), states: HashMap::new() })
        })
    }

    #[getter]
    fn pow2_votes(&self) -> bool {
        self.pow2_votes
    }

    /// A tensor's pow2 MostCommon votes, `[(type index (int8, uint8, int16), exponent,
    /// batches)]`, or None when they were not collected.
    fn votes(&self, name: &str) -> PyResult<Option<Vec<(u8, i32, u64)>>> {
        guard(|| {
        let (_, h) = self.states.get(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
        Ok(h.pow2_votes.as_ref().map(|v| v.iter().map(|(&(t, k), &n)| (t, k, n)).collect()))
        })
    }

    /// Put back what `votes` gave (None: not collected).
    fn restore_votes(&mut self, name: &str, votes: Option<Vec<(u8, i32, u64)>>) -> PyResult<()> {
        guard(|| {
        let (_, h) = self.states.get_mut(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
        h.pow2_votes = match votes {
            None => None,
            Some(v) => {
                let mut map = std::collections::BTreeMap::new();
                let mut per_type = [0u128; 3];
                for (t, k, n) in v {
                    if t > 2 || !(pow2::MIN_EXPONENT..=pow2::MAX_EXPONENT).contains(&k) || map.insert((t, k), n).is_some() {
                        return Err(PyValueError::new_err(format!("tensor {name:?}: bad or repeated pow2 vote ({t}, {k}, {n})")));
                    }
                    per_type[t as usize] += n as u128;
                }
                if per_type.iter().any(|&n| n > h.batches as u128) {
                    return Err(PyValueError::new_err(format!("tensor {name:?}: more pow2 votes than batches")));
                }
                Some(map)
            }
        };
        Ok(())
        })
    }

    #[getter]
    fn num_bins(&self) -> usize {
        2 << self.log_half
    }

    /// Add `[(name, [batch arrays...]), ...]`; how data is split into calls and batches, and
    /// their order, never changes the result.
    fn collect(&mut self, py: Python<'_>, items: Vec<(String, Vec<Bound<'_, PyAny>>)>) -> PyResult<()> {
        guard(|| {
        let borrowed = borrow_items(&items)?;
        let batches: Vec<(&str, Batches)> = borrowed.iter().map(|(n, b)| (n.as_str(), batches_of(b))).collect();
        let mut states = self.take(&batches)?;
            // Out of memory: the batches added before it stay added (each batch is added whole
            // or not at all), and the error names the tensor.
            let results: Vec<PyResult<()>> = run(py, || {
                batches
                    .par_iter()
                    .zip(states.par_iter_mut())
                    .map(|((name, batches), (_, h))| {
                        for_tensor(name, || {
                            match batches {
                Batches::F16(v) => v.iter().for_each(|x| h.add(x)),
                Batches::F32(v) => v.iter().for_each(|x| h.add(x)),
                Batches::F64(v) => v.iter().for_each(|x| h.add(x)),
                            }
                            Ok::<_, CollectError>(())
            })
                    })
                    .collect()
        });
        self.put(&batches, states);
            results.into_iter().collect()
        })
    }

    fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// ORT-shaped histograms (what one collect over all the data gives) for ORT's methods.
    fn to_histograms(&self, py: Python<'_>, kind: &str, num_bins: usize) -> PyResult<Histograms> {
        guard(|| {
        let mut out = Histograms::new(kind, num_bins)?;
        let kind = out.kind;
        let states: Vec<(&String, &(&'static str, StreamHistogram))> = self.order.iter().map(|n| (n, &self.states[n])).collect();
            let built: Vec<PyResult<TensorState>> = run(py, || {
            states
                .par_iter()
                .map(|(name, (dtype, h))| {
                        let histogram = for_tensor(name, || ort_shaped(dtype, h, kind, num_bins))?;
                    let counts = Counts { finite: h.n_finite, nan: h.n_nan, posinf: h.n_posinf, neginf: h.n_neginf, batches: h.batches };
                    Ok(TensorState { dtype, histogram, binning: TypedBinning::Nothing, counts })
                })
                .collect()
        });
        for (name, st) in self.order.iter().zip(built) {
                out.insert(name, st?);
        }
        Ok(out)
        })
    }

    /// `(dtype, level or None, bins (uint64), finite_min, finite_max, abs_min, counts)`.
    #[allow(clippy::type_complexity)]
    fn export<'py>(
        &self,
        py: Python<'py>,
        name: &str,
    ) -> PyResult<(&'static str, Option<i32>, Bound<'py, PyArray1<u64>>, Option<f64>, Option<f64>, Option<f64>, (u64, u64, u64, u64, u64))> {
        guard(|| {
        let (d, h) = self.states.get(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            Ok((*d, h.level, array(py, &h.bins), h.finite_min, h.finite_max, h.abs_min, (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches)))
        })
    }

    /// `export` without the bins: `(dtype, level or None, finite_min, finite_max, abs_min, counts)`.
    #[allow(clippy::type_complexity)]
    fn summary(&self, name: &str) -> PyResult<(&'static str, Option<i32>, Option<f64>, Option<f64>, Option<f64>, (u64, u64, u64, u64, u64))> {
        guard(|| {
        let (d, h) = self.states.get(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
        Ok((*d, h.level, h.finite_min, h.finite_max, h.abs_min, (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches)))
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
        let bad = |why: &str| PyValueError::new_err(format!("tensor {name:?}: {why}"));
        let dtype: &'static str = match dtype {
            "float16" => "float16",
            "float32" => "float32",
            "float64" => "float64",
            _ => return Err(bad("unsupported dtype")),
        };
        let bins = bins.as_slice().map_err(|_| bad("bins must be contiguous"))?;
        if bins.len() != 2usize << self.log_half {
            return Err(bad(&format!("{} bins, expected {}", bins.len(), 2usize << self.log_half)));
        }
        let mut h = StreamHistogram::new(self.log_half);
        let (n_finite, n_nan, n_posinf, n_neginf, batches) = counts;
        let total: u128 = bins.iter().map(|&c| c as u128).sum();
        if total != n_finite as u128 {
            return Err(bad("bin counts do not add up to the finite count"));
        }
        match (level, finite_min, finite_max, abs_min) {
            (None, None, None, None) if n_finite == 0 => {}
            (Some(l), Some(mn), Some(mx), Some(amn)) if n_finite > 0 => {
                let m = mn.abs().max(mx.abs());
                let ok = mn.is_finite() && mx.is_finite() && amn.is_finite() && mn <= mx && 0.0 <= amn && amn <= m
                    && (crate::stream_histogram::MIN_LEVEL..=1100).contains(&l) && crate::stream_histogram::level_for(m) <= l;
                if !ok {
                    return Err(bad("inconsistent level or extremes"));
                }
            }
            _ => return Err(bad("level and extremes must be given exactly when there are finite values")),
        }
        h.level = level;
        h.bins.copy_from_slice(bins);
        (h.finite_min, h.finite_max, h.abs_min) = (finite_min, finite_max, abs_min);
        (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches) = (n_finite, n_nan, n_posinf, n_neginf, batches);
        if !self.order.iter().any(|o| o == name) {
            self.order.push(name.to_string());
        }
        self.states.insert(name.to_string(), (dtype, h));
        Ok(())
        })
    }

    /// Add another run's histograms (same num_bins): the result equals one run over both
    /// data sets, whatever the order of merging.
    fn merge(&mut self, other: &StreamHistograms) -> PyResult<()> {
        guard(|| {
        if other.log_half != self.log_half {
            return Err(PyValueError::new_err(format!("cannot merge streaming histograms of {} and {} bins", 2usize << self.log_half, 2usize << other.log_half)));
        }
        for name in &other.order {
            let (d, _) = &other.states[name];
            if let Some((d0, _)) = self.states.get(name) {
                if d0 != d {
                    return Err(named(name, CollectError::DtypeChanged { before: d0, now: d }));
                }
            }
        }
        for name in &other.order {
            let (d, h) = &other.states[name];
            match self.states.get_mut(name) {
                Some((_, mine)) => mine.merge(h).map_err(PyValueError::new_err)?,
                None => {
                    self.order.push(name.clone());
                        self.states.insert(name.clone(), (d, h.copied()));
                }
            }
        }
        // pow2 votes stay only when both sides collected them (else some batches never voted)
        self.pow2_votes &= other.pow2_votes;
        if !self.pow2_votes {
            self.states.values_mut().for_each(|(_, h)| h.pow2_votes = None);
        }
        Ok(())
        })
    }

    /// `(low, high)` of `method` ("mse", "kl" or "pow2", options as for `histogram_range`)
    /// for each tensor of `names` (default: all, in `names()` order), computed in parallel;
    /// (0, 0) for a tensor without finite values. `scale_rule`: as for `histogram_range`, the
    /// range type being each tensor's.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (method, names=None, *, scale_rule, qtype="int8", symmetric=false, num_bins=2048, num_quantized_bins=128, pow2_method="MinMSE", minmse_mode="All"))]
    fn ranges(
        &self,
        py: Python<'_>,
        method: &str,
        names: Option<Vec<String>>,
        scale_rule: &str,
        qtype: &str,
        symmetric: bool,
        num_bins: i64,
        num_quantized_bins: i64,
        pow2_method: &str,
        minmse_mode: &str,
    ) -> PyResult<Vec<(f64, f64)>> {
        guard(|| {
        let method = RangeMethod::parse(method, qtype, symmetric, num_bins, num_quantized_bins, pow2_method, minmse_mode)?;
        let ort = parse_ort_rule(scale_rule)?;
        let selected = self.selected(names)?;
        method.check_work()?;
        let out: Vec<PyResult<(f64, f64)>> = run_stoppable(py, |stop| {
            selected
                .par_iter()
                .map(|(name, (dtype, h))| {
                        // the errors name the tensor already
                        let range = || -> Result<(f64, f64), String> {
                    let Some(hist) = stream_uniform(name, h)? else { return Ok((0.0, 0.0)) };
                    let votes = match (&method, &h.pow2_votes) {
                        (RangeMethod::Pow2 { qtype, .. }, Some(v)) if method.needs_votes() => {
                            let t = Pow2Type::ALL.iter().position(|x| x == qtype).expect("a pow2 type") as u8;
                            v.iter().filter(|((vt, _), _)| *vt == t).map(|(&(_, k), &n)| (k, n)).collect()
                        }
                        (_, None) if method.needs_votes() => {
                            return Err(format!(
                                "tensor {name:?}: pow2 MinMSE MostCommon needs per-batch votes, which this collection did not \
                                 record (collect with the pow2 method and minmse_mode='MostCommon', or \
                                 StreamHistograms(..., pow2_votes=True))"
                            ))
                        }
                        _ => Vec::new(),
                    };
                    method.range(hist, &votes, largest_finite(dtype), range_rule(ort, dtype), stop).map_err(|e| format!("tensor {name:?}: {e}"))
                        };
                        fallible::catch(range).map_err(|oom| out_of_memory(name, oom))?.map_err(PyValueError::new_err)
                    })
                    .collect()
            })?;
            out.into_iter().collect()
        })
    }

    /// The mean squared quantization error of `ranges[k]` on tensor `names[k]`, in parallel
    /// (0.0 for a tensor without finite values). `scale_rule`: as for `histogram_qerror`, the
    /// range type being each tensor's.
    #[pyo3(signature = (names, ranges, *, scale_rule, qtype="int8", symmetric=false))]
    fn qerrors(&self, py: Python<'_>, names: Vec<String>, ranges: Vec<(f64, f64)>, scale_rule: &str, qtype: &str, symmetric: bool) -> PyResult<Vec<f64>> {
        guard(|| {
        if names.len() != ranges.len() {
            return Err(PyValueError::new_err(format!("{} names but {} ranges", names.len(), ranges.len())));
        }
        let qtype = parse_qtype(qtype)?;
        let ort = parse_ort_rule(scale_rule)?;
        for (name, &(low, high)) in names.iter().zip(&ranges) {
            if !(low.is_finite() && high.is_finite()) {
                return Err(PyValueError::new_err(format!("tensor {name:?}: range ({low}, {high}) is not finite")));
            }
        }
        let selected = self.selected(Some(names))?;
            let out: Vec<PyResult<f64>> = run(py, || {
            selected
                .par_iter()
                .zip(&ranges)
                .map(|((name, (dtype, h)), &(low, high))| {
                        let error = || -> Result<f64, String> {
                    let q = Quantizer::for_range(low, high, qtype, symmetric, range_rule(ort, dtype));
                    Ok(stream_uniform(name, h)?.map_or(0.0, |hist| ErrorTable::new(hist).mean_squared_error(&q)))
                        };
                        fallible::catch(error).map_err(|oom| out_of_memory(name, oom))?.map_err(PyValueError::new_err)
                })
                .collect()
        });
            out.into_iter().collect()
        })
    }

    /// `(finite, nan, posinf, neginf, batches)`.
    fn counts(&self, name: &str) -> PyResult<(u64, u64, u64, u64, u64)> {
        guard(|| {
        let (_, h) = self.states.get(name).ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
        Ok((h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches))
        })
    }
}

impl StreamHistograms {
    /// The data types and histograms of `names` (default: all, in `names()` order).
    fn selected(&self, names: Option<Vec<String>>) -> PyResult<Vec<(String, (&'static str, &StreamHistogram))>> {
        names
            .unwrap_or_else(|| self.order.clone())
            .into_iter()
            .map(|n| match self.states.get(&n) {
                Some((d, h)) => Ok((n, (*d, h))),
                None => Err(PyValueError::new_err(format!("no histogram for tensor {n:?}"))),
            })
            .collect()
    }
}

/// A streaming histogram as a uniform signed histogram: `2H` bins of width `2^(level - log2 H)`
/// from `-2^level`; None without finite values. Levels from 1023 on (float64 data of
/// magnitude 2^1022 or more) have no finite right edge and are an error.
fn stream_uniform<'a>(name: &str, h: &'a StreamHistogram) -> Result<Option<UniformHistogram<'a>>, String> {
    let (Some(level), Some(min), Some(max)) = (h.level, h.finite_min, h.finite_max) else { return Ok(None) };
    if level >= 1023 {
        return Err(format!("tensor {name:?}: values of magnitude 2^1022 or more cannot be calibrated"));
    }
    UniformHistogram::new(&h.bins, -pow2::pow2(level), pow2::pow2(level - h.log_half as i32), min, max)
        .map(Some)
        .map_err(|e| format!("tensor {name:?}: {e}"))
}

/// The largest finite value of a data dtype (a histogram's `"float16"`, `"float32"` or `"float64"`).
fn largest_finite(dtype: &str) -> f64 {
    match dtype {
        "float16" => <f16 as Float>::MAX,
        "float32" => <f32 as Float>::MAX,
        _ => <f64 as Float>::MAX,
    }
}

fn parse_qtype(qtype: &str) -> PyResult<QType> {
    QType::parse(qtype).ok_or_else(|| PyValueError::new_err(format!("unknown qtype {qtype:?}: expected one of {}", QType::NAMES)))
}

fn parse_ort_rule(scale_rule: &str) -> PyResult<OrtRule> {
    OrtRule::parse(scale_rule)
        .ok_or_else(|| PyValueError::new_err(format!("unknown scale_rule {scale_rule:?}: expected one of {}", OrtRule::NAMES)))
}

/// ORT's scale rule for the ranges of a `dtype` tensor. ORT's TensorData holds float16 and
/// float32 ranges only; float64 tensors' ranges are taken as float32 ones.
fn range_rule(ort: OrtRule, dtype: &str) -> ScaleRule {
    ScaleRule::new(ort, dtype == "float16")
}

/// `scale_rule` and a range `dtype` given by name.
fn parse_scale_rule(scale_rule: &str, dtype: &str) -> PyResult<ScaleRule> {
    let ort = parse_ort_rule(scale_rule)?;
    match dtype {
        "float16" | "float32" => Ok(range_rule(ort, dtype)),
        _ => Err(PyValueError::new_err(format!("unknown range dtype {dtype:?}: expected 'float16' or 'float32'"))),
    }
}

fn parse_pow2_type(qtype: &str) -> PyResult<Pow2Type> {
    Pow2Type::parse(qtype).ok_or_else(|| PyValueError::new_err(format!("qtype {qtype:?} is not supported by pow2: expected one of {}", Pow2Type::NAMES)))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pow2Choice {
    NonOverflow,
    MinMseAll,
    MostCommon,
}

/// A histogram range method with validated options.
#[derive(Clone, Copy)]
enum RangeMethod {
    Mse { qtype: QType, symmetric: bool },
    Kl { num_bins: usize, num_quantized_bins: usize },
    Pow2 { qtype: Pow2Type, choice: Pow2Choice },
}

impl RangeMethod {
    /// The names (qtype, pow2_method, minmse_mode) are checked whatever the method, since a
    /// typo is an error either way; the bin counts only for kl, which uses them.
    fn parse(
        method: &str,
        qtype: &str,
        symmetric: bool,
        num_bins: i64,
        num_quantized_bins: i64,
        pow2_method: &str,
        minmse_mode: &str,
    ) -> PyResult<Self> {
        let bad = |msg: String| PyValueError::new_err(msg);
        let choice = match (pow2_method, minmse_mode) {
            (_, m) if m != "All" && m != "MostCommon" => return Err(bad(format!("unknown minmse_mode {m:?}: expected 'All' or 'MostCommon'"))),
            ("NonOverflow", _) => Pow2Choice::NonOverflow,
            ("MinMSE", "All") => Pow2Choice::MinMseAll,
            ("MinMSE", _) => Pow2Choice::MostCommon,
            (p, _) => return Err(bad(format!("unknown pow2_method {p:?}: expected 'NonOverflow' or 'MinMSE'"))),
        };
        let q = parse_qtype(qtype)?;
        match method {
            "mse" => Ok(RangeMethod::Mse { qtype: q, symmetric }),
            "kl" => {
                let count = |name: &str, v: i64| usize::try_from(v).map_err(|_| bad(format!("{name} must be >= 1, got {v}")));
                let (num_bins, num_quantized_bins) = (count("num_bins", num_bins)?, count("num_quantized_bins", num_quantized_bins)?);
                kl_tensorrt::check_settings(num_bins, num_quantized_bins).map_err(|e| bad(e.to_string()))?;
                Ok(RangeMethod::Kl { num_bins, num_quantized_bins })
            }
            "pow2" => Ok(RangeMethod::Pow2 { qtype: parse_pow2_type(qtype)?, choice }),
            _ => Err(bad(format!("unknown method {method:?}: expected 'mse', 'kl' or 'pow2'"))),
        }
    }

    fn needs_votes(&self) -> bool {
        matches!(self, RangeMethod::Pow2 { choice: Pow2Choice::MostCommon, .. })
    }

    /// An error if one histogram's search could take more than the work limit. Only kl's
    /// grows faster than linearly (with `num_bins`, whatever the histogram); mse and pow2 try
    /// a fixed number of candidates, each at most linear in the histogram's bins.
    fn check_work(&self) -> PyResult<()> {
        if let RangeMethod::Kl { num_bins, num_quantized_bins } = *self {
            let what = format!("kl with num_bins={num_bins}: the search");
            check_search_work(&what, kl_tensorrt::search_work(num_bins, num_quantized_bins), max_search_work()?)?;
        }
        Ok(())
    }

    /// The range of one histogram of data whose type's largest value is `largest`, for ranges
    /// under ORT's scale `rule`; `votes` (exponent, count) serve MostCommon only. Stops early
    /// once `stop` is set.
    fn range(&self, hist: UniformHistogram, votes: &[(i32, u64)], largest: f64, rule: ScaleRule, stop: &AtomicBool) -> Result<(f64, f64), String> {
        crate::cancel::check(stop).map_err(|e| e.to_string())?;
        Ok(match *self {
            RangeMethod::Mse { qtype, symmetric } => {
                mse_range(&ErrorTable::new(hist), qtype, symmetric, rule, stop).map_err(|e| format!("mse search {e}"))?
            }
            RangeMethod::Kl { num_bins, num_quantized_bins } => {
                kl_tensorrt::kl_range(&hist, num_bins, num_quantized_bins, stop).map_err(|e| e.to_string())?
            }
            RangeMethod::Pow2 { qtype, choice } => {
                let (lo, hi) = pow2::exponent_bounds(qtype, rule);
                // scales stop where the tensor's type can no longer hold the range
                let max_k = pow2::max_exponent(qtype, largest);
                let bounds = (lo.min(max_k), hi.min(max_k));
                let k = match choice {
                    Pow2Choice::NonOverflow => match pow2::non_overflow_exponent(&hist, qtype) {
                        Some(k) if k > max_k => {
                            return Err(format!(
                                "pow2 NonOverflow needs scale 2^{k}, whose {} range the tensor's type cannot hold \
                                 (its largest is 2^{max_k}); pow2_method='MinMSE' chooses among the scales it holds",
                                qtype.name()
                            ))
                        }
                        k => k.map(|k| k.clamp(bounds.0, bounds.1)),
                    },
                    Pow2Choice::MinMseAll => pow2::min_mse_exponent(&ErrorTable::new(hist), qtype, bounds),
                    // votes are cast within the data type's scales; others are brought inside
                    Pow2Choice::MostCommon => pow2::most_common(votes, bounds),
                };
                k.map_or((0.0, 0.0), |k| pow2::range(k, qtype))
            }
        })
    }
}

fn counts_array<'py>(counts: &Bound<'py, PyAny>) -> PyResult<numpy::PyReadonlyArray1<'py, u64>> {
    Ok(counts.cast::<PyArray1<u64>>().map_err(|_| PyTypeError::new_err("counts must be a 1-D numpy array of uint64"))?.readonly())
}

/// The counts as a slice, copied only when the array is not contiguous.
fn counts_of<'a>(counts: &'a numpy::PyReadonlyArray1<'_, u64>) -> std::borrow::Cow<'a, [u64]> {
    match counts.as_slice() {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(fallible::collect(counts.as_array().iter().copied())),
    }
}

fn uniform(counts: &[u64], left: f64, width: f64, min: f64, max: f64) -> PyResult<UniformHistogram<'_>> {
    UniformHistogram::new(counts, left, width, min, max).map_err(PyValueError::new_err)
}

/// `(low, high)` of `method` ("mse", "kl" or "pow2") on one uniform signed histogram: `counts`
/// (uint64) over bins of `width` from `left`, of data with finite extremes `min <= max`.
/// `votes`, `(exponent, count)` pairs, are what pow2 MinMSE with `minmse_mode="MostCommon"`
/// decides from. The range is for a tensor of `dtype` ("float16" or "float32") under ORT's
/// scale rule `scale_rule` ("1.31" or "1.32"): mse's errors and pow2's exponents follow it.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (method, counts, left, width, min, max, *, scale_rule, dtype="float32", qtype="int8", symmetric=false, num_bins=2048, num_quantized_bins=128, pow2_method="MinMSE", minmse_mode="All", votes=None))]
fn histogram_range(
    py: Python<'_>,
    method: &str,
    counts: Bound<'_, PyAny>,
    left: f64,
    width: f64,
    min: f64,
    max: f64,
    scale_rule: &str,
    dtype: &str,
    qtype: &str,
    symmetric: bool,
    num_bins: i64,
    num_quantized_bins: i64,
    pow2_method: &str,
    minmse_mode: &str,
    votes: Option<Vec<(i32, u64)>>,
) -> PyResult<(f64, f64)> {
    guard(|| {
    let method = RangeMethod::parse(method, qtype, symmetric, num_bins, num_quantized_bins, pow2_method, minmse_mode)?;
    let rule = parse_scale_rule(scale_rule, dtype)?;
    if method.needs_votes() && votes.is_none() {
        return Err(PyValueError::new_err("minmse_mode='MostCommon' needs votes: a list of (exponent, count)"));
    }
    let counts = counts_array(&counts)?;
    let counts = counts_of(&counts);
    let hist = uniform(&counts, left, width, min, max)?;
    let votes = votes.unwrap_or_default();
    method.check_work()?;
    run_stoppable(py, |stop| method.range(hist, &votes, f64::MAX, rule, stop))?.map_err(PyValueError::new_err)
    })
}

/// The mean squared error of quantizing the histogram's values with the range `(low, high)`
/// (ORT's scale and zero point for `qtype`, `symmetric`, the range being of `dtype` under
/// ORT's scale rule `scale_rule`, as for `histogram_range`).
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (counts, left, width, min, max, low, high, *, scale_rule, dtype="float32", qtype="int8", symmetric=false))]
fn histogram_qerror(
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
    let qtype = parse_qtype(qtype)?;
    let rule = parse_scale_rule(scale_rule, dtype)?;
    if !(low.is_finite() && high.is_finite()) {
        return Err(PyValueError::new_err(format!("range ({low}, {high}) is not finite")));
    }
    let counts = counts_array(&counts)?;
    let counts = counts_of(&counts);
    let hist = uniform(&counts, left, width, min, max)?;
    Ok(run(py, || ErrorTable::new(hist).mean_squared_error(&Quantizer::for_range(low, high, qtype, symmetric, rule))))
    })
}

/// ORT's `(scale, zero_point)` for the range `(low, high)`: `compute_scale_zp` on the range in
/// `dtype` under `scale_rule` (as for `histogram_qerror`), the scale as a float64 (infinite for
/// a range beyond `dtype`).
#[pyfunction]
#[pyo3(signature = (low, high, *, scale_rule, dtype="float32", qtype="int8", symmetric=false))]
fn scale_zero_point(low: f64, high: f64, scale_rule: &str, dtype: &str, qtype: &str, symmetric: bool) -> PyResult<(f64, i64)> {
    guard(|| {
        let qtype = parse_qtype(qtype)?;
        let rule = parse_scale_rule(scale_rule, dtype)?;
        if !(low.is_finite() && high.is_finite()) {
            return Err(PyValueError::new_err(format!("range ({low}, {high}) is not finite")));
        }
        let q = Quantizer::for_range(low, high, qtype, symmetric, rule);
        Ok((q.scale, q.zero_point as i64))
    })
}

/// pow2's `E(k)`: the mean squared error of scale `2^exponent`, zero point 0, in `qtype`.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
fn pow2_error(
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
    let qtype = parse_pow2_type(qtype)?;
    let k = i32::try_from(exponent)
        .ok()
        .filter(|k| (pow2::MIN_EXPONENT..=pow2::MAX_EXPONENT).contains(k))
        .ok_or_else(|| PyValueError::new_err(format!("exponent must be in [{}, {}], got {exponent}", pow2::MIN_EXPONENT, pow2::MAX_EXPONENT)))?;
    let counts = counts_array(&counts)?;
    let counts = counts_of(&counts);
    let hist = uniform(&counts, left, width, min, max)?;
    Ok(run(py, || pow2::error(&ErrorTable::new(hist), k, qtype)))
    })
}

type Stats = (Option<f64>, Option<f64>, Option<f64>, Option<f64>, u64, u64, u64, u64);

fn stats_of<T: Float>(s: &Scan<T>) -> Stats {
    let f = |v: Option<T>| v.map(|x| x.to_f64());
    (f(s.nan_min()), f(s.nan_max()), f(s.finite_min), f(s.finite_max), s.n_finite, s.n_nan, s.n_posinf, s.n_neginf)
}

/// `(nanmin, nanmax, finite_min, finite_max, n_finite, n_nan, n_posinf, n_neginf)` of a tensor.
#[pyfunction]
fn tensor_stats(py: Python<'_>, arr: Bound<'_, PyAny>) -> PyResult<Stats> {
    guard(|| {
    let b = borrow_all("array", std::slice::from_ref(&arr))?;
    let batches = batches_of(&b);
    Ok(run(py, || match &batches {
        Batches::F16(v) => stats_of(&scan(&v[0])),
        Batches::F32(v) => stats_of(&scan(&v[0])),
        Batches::F64(v) => stats_of(&scan(&v[0])),
    }))
    })
}

fn channel_views<'a, T: Element + Copy>(a: &'a PyReadonlyArrayDyn<'_, T>, axis: usize) -> Vec<View<'a, T>> {
    let v = a.as_array();
    let (shape, strides) = (v.shape(), v.strides());
    let rest_shape: Vec<usize> = shape.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &s)| s).collect();
    let rest_strides: Vec<isize> = strides.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &s)| s).collect();
    fallible::collect((0..shape[axis]).map(|c| {
            // SAFETY: channel c's elements lie inside the borrowed array.
            unsafe { View::from_raw(v.as_ptr().offset(c as isize * strides[axis]), &rest_shape, &rest_strides) }
    }))
}

/// Per-channel `(nanmin, nanmax)` along `axis` (NaN for an all-NaN channel), as arrays of the
/// input dtype: what ORT's ReduceMin/ReduceMax over the other axes give, NaN-ignoring.
#[pyfunction]
fn channel_min_max<'py>(py: Python<'py>, arr: Bound<'py, PyAny>, axis: usize) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    guard(|| {
    fn go<'py, T: Float + Element>(py: Python<'py>, a: &PyReadonlyArrayDyn<'_, T>, axis: usize) -> (Bound<'py, PyAny>, Bound<'py, PyAny>) {
        let views = channel_views(a, axis);
            let mut scans: Vec<Scan<T>> = fallible::with_capacity(views.len());
            run(py, || views.par_iter().map(scan).collect_into_vec(&mut scans));
        let nan = T::from_f64(f64::NAN);
            let mins: Vec<T> = fallible::collect(scans.iter().map(|s| s.nan_min().unwrap_or(nan)));
            let maxs: Vec<T> = fallible::collect(scans.iter().map(|s| s.nan_max().unwrap_or(nan)));
        (PyArray1::from_vec(py, mins).into_any(), PyArray1::from_vec(py, maxs).into_any())
    }
    let ndim = arr.getattr("ndim")?.extract::<usize>()?;
    if axis >= ndim.max(1) || ndim == 0 {
        return Err(PyValueError::new_err(format!("axis {axis} is out of range for an array of {ndim} dimensions")));
    }
    Ok(match borrow_all("array", std::slice::from_ref(&arr))? {
        Borrowed::F16(v) => go(py, &v[0], axis),
        Borrowed::F32(v) => go(py, &v[0], axis),
        Borrowed::F64(v) => go(py, &v[0], axis),
    })
    })
}

/// Apply a per-dtype function to a 1-D contiguous float array, returning a scalar as f64.
fn reduce_1d(arr: &Bound<'_, PyAny>, f16f: fn(&[f16]) -> f64, f32f: fn(&[f32]) -> f64, f64f: fn(&[f64]) -> f64) -> PyResult<f64> {
    let b = borrow_all("values", std::slice::from_ref(arr))?;
    let err = || PyValueError::new_err("values must be a contiguous 1-D array");
    Ok(match &b {
        Borrowed::F16(v) => f16f(v[0].as_slice().map_err(|_| err())?),
        Borrowed::F32(v) => f32f(v[0].as_slice().map_err(|_| err())?),
        Borrowed::F64(v) => f64f(v[0].as_slice().map_err(|_| err())?),
    })
}

/// ORT's per-tensor `np.nanmean` of per-batch values (pairwise order), as f64 of the dtype.
#[pyfunction]
fn nanmean_pairwise(values: Bound<'_, PyAny>) -> PyResult<f64> {
    guard(|| {
    reduce_1d(
        &values,
        |v| minmax::nanmean_pairwise(v).to_f64(),
        |v| minmax::nanmean_pairwise(v).to_f64(),
        |v| minmax::nanmean_pairwise(v).to_f64(),
    )
    })
}

/// ORT's per-channel `np.nanmean(axis=0)` of one column (sequential order).
#[pyfunction]
fn nanmean_sequential(values: Bound<'_, PyAny>) -> PyResult<f64> {
    guard(|| {
    reduce_1d(
        &values,
        |v| minmax::nanmean_sequential(v).to_f64(),
        |v| minmax::nanmean_sequential(v).to_f64(),
        |v| minmax::nanmean_sequential(v).to_f64(),
    )
    })
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A bad value fails the import with a clear error rather than being silently ignored.
    let _ = ENV_THREADS.set(threads_from_env().map_err(PyValueError::new_err)?);
    m.add("MAX_BINS", MAX_BINS)?;
    m.add("POW2_EXPONENTS", (pow2::MAX_EXPONENT - pow2::MIN_EXPONENT + 1) as usize)?;
    m.add_class::<Histograms>()?;
    m.add_class::<StreamHistograms>()?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(get_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(tensor_stats, m)?)?;
    m.add_function(wrap_pyfunction!(channel_min_max, m)?)?;
    m.add_function(wrap_pyfunction!(nanmean_pairwise, m)?)?;
    m.add_function(wrap_pyfunction!(nanmean_sequential, m)?)?;
    m.add_function(wrap_pyfunction!(histogram_range, m)?)?;
    m.add_function(wrap_pyfunction!(histogram_qerror, m)?)?;
    m.add_function(wrap_pyfunction!(scale_zero_point, m)?)?;
    m.add_function(wrap_pyfunction!(pow2_error, m)?)?;
    Ok(())
}
