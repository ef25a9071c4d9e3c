//! histocal's thread pool and the GIL-free, signal-checking runs on it.

use super::errors::*;
use crate::methods::range_method::*;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};
use rayon::{ThreadPool, ThreadPoolBuilder};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

pub(crate) static POOL: Mutex<Option<Arc<ThreadPool>>> = Mutex::new(None);
/// `HISTOCAL_NUM_THREADS` as read when the module was imported (None: unset, empty or 0).
pub(crate) static ENV_THREADS: OnceLock<Option<usize>> = OnceLock::new();

/// `HISTOCAL_NUM_THREADS`: a thread count, or None for one per core (unset, empty or 0).
pub(crate) fn threads_from_env() -> Result<Option<usize>, String> {
    let raw = match std::env::var("HISTOCAL_NUM_THREADS") {
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => return Err(format!("{v:?}")),
        Ok(v) => v,
    };
    match raw.trim() {
        "" => Ok(None),
        t => t.parse::<usize>().map(|n| (n > 0).then_some(n)).map_err(|_| format!("{raw:?}")),
    }
    .map_err(|got| {
        format!("HISTOCAL_NUM_THREADS must be a whole number of threads >= 0 (0 or unset: one per core), got {got}")
    })
}

pub(crate) fn default_threads() -> usize {
    ENV_THREADS
        .get()
        .copied()
        .flatten()
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// Pools of a given size made for [`set_caller_threads`], kept so that each calibration does
/// not start threads anew.
static SIZED_POOLS: Mutex<Option<HashMap<usize, Arc<ThreadPool>>>> = Mutex::new(None);

thread_local! {
    /// The pool the calling thread's work runs on instead of [`POOL`] (a calibration's share of
    /// the cores, set on its worker thread), if any.
    static CALLER_POOL: RefCell<Option<Arc<ThreadPool>>> = const { RefCell::new(None) };
}

pub(crate) fn pool() -> Arc<ThreadPool> {
    if let Some(p) = CALLER_POOL.with(|c| c.borrow().clone()) {
        return p;
    }
    let mut g = POOL.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(|| {
        Arc::new(ThreadPoolBuilder::new().num_threads(default_threads()).build().expect("thread pool"))
    })
    .clone()
}

/// Run `f` on histocal's pool with the GIL released.
pub(crate) fn run<T: Send, F: FnOnce() -> T + Send>(py: Python<'_>, f: F) -> T {
    let p = pool();
    py.detach(|| p.install(f))
}

/// How often a running search checks for Python signals.
pub(crate) const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// Run a search `f` on histocal's pool with the GIL released, taking the GIL back every
/// [`SIGNAL_POLL`] to run Python's signal handlers. When one raises (Ctrl-C:
/// KeyboardInterrupt), `f`'s stop flag is set, its workers stop at their next check, and the
/// exception is raised once they all have. `f` must leave no state half-changed when stopped.
pub(crate) fn run_stoppable<T: Send, F: FnOnce(&AtomicBool) -> T + Send>(py: Python<'_>, f: F) -> PyResult<T> {
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

pub(crate) const MAX_SEARCH_WORK_VAR: &str = "HISTOCAL_MAX_SEARCH_WORK";

/// The default of `HISTOCAL_MAX_SEARCH_WORK`: an entropy search over about 346,000 bins
/// (tens of seconds on two cores; onnxruntime would take over an hour).
pub(crate) const DEFAULT_MAX_SEARCH_WORK: u64 = 30_000_000_000;

/// The most work one tensor's search may take, in the bin evaluations of
/// [`crate::ort::entropy::search_work`]: `HISTOCAL_MAX_SEARCH_WORK` (a number; `inf`: no limit),
/// read at each search, else (unset or empty) [`DEFAULT_MAX_SEARCH_WORK`].
pub(crate) fn max_search_work() -> PyResult<u64> {
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
pub(crate) fn check_search_work(what: &str, work: u64, limit: u64) -> PyResult<()> {
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
pub(crate) fn set_num_threads(n: &Bound<'_, PyAny>) -> PyResult<()> {
    let expected = format!(
        "set_num_threads: n must be a whole number of threads >= 0 (0: HISTOCAL_NUM_THREADS or one per core), got {}",
        n.repr()?
    );
    let count = n.extract::<i64>();
    let whole = !n.is_instance_of::<PyBool>() && (count.is_ok() || n.is_instance_of::<PyInt>());
    if !whole {
        return Err(PyTypeError::new_err(expected));
    }
    let n = count.ok().and_then(|v| usize::try_from(v).ok()).ok_or_else(|| PyValueError::new_err(expected))?;
    guard(|| {
        let n = if n == 0 { default_threads() } else { n };
        let p = ThreadPoolBuilder::new().num_threads(n).build().map_err(|e| PyValueError::new_err(e.to_string()))?;
        *POOL.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(p));
        Ok(())
    })
}

/// Run the calling thread's later work on a pool of `n` threads (0: the shared pool again);
/// other threads are unaffected.
#[pyfunction]
pub(crate) fn set_caller_threads(n: &Bound<'_, PyAny>) -> PyResult<()> {
    let n = n.extract::<usize>().ok().filter(|_| !n.is_instance_of::<PyBool>()).ok_or_else(|| {
        PyValueError::new_err(format!("set_caller_threads: n must be a whole number >= 0, got {}", n))
    })?;
    guard(|| {
        let p = if n == 0 {
            None
        } else {
            let mut g = SIZED_POOLS.lock().unwrap_or_else(|e| e.into_inner());
            let pools = g.get_or_insert_with(HashMap::new);
            let p = match pools.get(&n) {
                Some(p) => p.clone(),
                None => {
                    let p = ThreadPoolBuilder::new()
                        .num_threads(n)
                        .build()
                        .map_err(|e| PyValueError::new_err(e.to_string()))?;
                    pools.insert(n, Arc::new(p));
                    pools[&n].clone()
                }
            };
            Some(p)
        };
        CALLER_POOL.with(|c| *c.borrow_mut() = p);
        Ok(())
    })
}

#[pyfunction]
pub(crate) fn get_num_threads() -> PyResult<usize> {
    guard(|| Ok(pool().current_num_threads()))
}

/// An error if one histogram's search by `method` could take more than the work limit.
pub(crate) fn check_method_work(method: &RangeMethod) -> PyResult<()> {
    if let Some((what, work)) = method.search_work() {
        check_search_work(&what, work, max_search_work()?)?;
    }
    Ok(())
}
