//! The two Python classes' data and their plain helpers; their Python methods are in
//! `histograms` and `stream_histograms`, which both depend on this module (and not on each
//! other).

use super::errors::named;
use crate::methods::isotone::TopPairs;
use crate::state::{Batches, CollectError, Kind, Scans, TensorState};
use crate::stream::stream_histogram::StreamHistogram;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::collections::HashMap;

/// Per-tensor histogram states of one kind, in first-collected order.
#[pyclass(module = "histocal._core")]
pub struct Histograms {
    pub(crate) kind: Kind,
    pub(crate) num_bins: usize,
    pub(crate) order: Vec<String>,
    pub(crate) states: HashMap<String, TensorState>,
    /// Two-pass collects: the combined scan and batch count of the collect being scanned.
    pub(crate) pending: HashMap<String, (Scans, u64)>,
}

impl Histograms {
    /// Add a tensor not held yet (the caller knows it is new: no search of `order`).
    pub(crate) fn insert_new(&mut self, name: &str, state: TensorState) {
        self.order.push(name.to_string());
        self.states.insert(name.to_string(), state);
    }

    pub(crate) fn insert(&mut self, name: &str, state: TensorState) {
        if !self.states.contains_key(name) && !self.order.iter().any(|o| o == name) {
            self.order.push(name.to_string());
        }
        self.states.insert(name.to_string(), state);
    }
}

/// Per-tensor streaming histograms (batch-invariant), in first-collected order.
#[pyclass(module = "histocal._core")]
pub struct StreamHistograms {
    pub(crate) log_half: u32,
    /// Whether new tensors collect the per-batch votes of pow2's most-common choice.
    pub(crate) pow2_votes: bool,
    pub(crate) order: Vec<String>,
    pub(crate) states: HashMap<String, StreamState>,
    /// isotone's per-row top-two summaries, per tensor, when collected (`None`: not collected).
    pub(crate) isotone: Option<HashMap<String, TopPairs>>,
}

/// A tensor's streaming histogram and its data dtype.
pub(crate) type StreamState = (&'static str, StreamHistogram);

impl StreamHistograms {
    /// Take out the histograms of these tensors (new ones for tensors not seen yet) to add
    /// batches to; an error, changing nothing, if a tensor's dtype changed.
    pub(crate) fn take(&mut self, batches: &[(&str, Batches<'_>)]) -> PyResult<Vec<StreamState>> {
        for (n, b) in batches {
            if let Some((d, _)) = self.states.get(*n) {
                if *d != b.dtype() {
                    return Err(named(n, CollectError::DtypeChanged { before: d, now: b.dtype() }));
                }
            }
        }
        // the new histograms first: running out of memory then changes nothing
        let fresh: Vec<Option<StreamHistogram>> =
            batches.iter().map(|(n, _)| (!self.states.contains_key(*n)).then(|| self.new_histogram())).collect();
        // New tensors join `order` here, where they are known to be new (`put` then only puts the
        // histograms back): checking `order` itself would cost O(tensors) per tensor, which
        // per-channel collections (a histogram per channel) cannot afford.
        let mut added = std::collections::HashSet::new();
        for ((n, _), new) in batches.iter().zip(&fresh) {
            if new.is_some() && added.insert(*n) {
                self.order.push(n.to_string());
            }
        }
        Ok(batches
            .iter()
            .zip(fresh)
            .map(|((n, b), new)| {
                let old = self.states.remove(*n);
                old.or_else(|| new.map(|h| (b.dtype(), h))).unwrap_or_else(|| (b.dtype(), self.new_histogram()))
            })
            .collect())
    }

    pub(crate) fn new_histogram(&self) -> StreamHistogram {
        if self.pow2_votes {
            StreamHistogram::with_pow2_votes(self.log_half)
        } else {
            StreamHistogram::new(self.log_half)
        }
    }

    /// Put back what `take` gave.
    pub(crate) fn put(&mut self, batches: &[(&str, Batches<'_>)], states: Vec<StreamState>) {
        for ((n, _), st) in batches.iter().zip(states) {
            self.states.insert(n.to_string(), st);
        }
    }
}

impl StreamHistograms {
    /// The data types and histograms of `names` (default: all, in `names()` order).
    pub(crate) fn selected(
        &self,
        names: Option<Vec<String>>,
    ) -> PyResult<Vec<(String, (&'static str, &StreamHistogram))>> {
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
