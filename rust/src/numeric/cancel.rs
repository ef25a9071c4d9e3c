//! Cooperative cancellation of long searches.
//!
//! A search takes a shared `&AtomicBool` that its caller sets to ask it to stop; the search's
//! loops (on every worker thread) poll it between units of work of at most a few milliseconds
//! and then return [`Cancelled`]. The kernels know nothing about who sets it (the Python
//! bindings set it when a signal such as Ctrl-C arrives).

use std::sync::atomic::{AtomicBool, Ordering};

/// The search stopped because its stop flag was set; it has no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cancelled")
    }
}

/// `Err(Cancelled)` once `stop` is set.
#[inline]
pub fn check(stop: &AtomicBool) -> Result<(), Cancelled> {
    if stop.load(Ordering::Relaxed) {
        Err(Cancelled)
    } else {
        Ok(())
    }
}
