//! The two Python classes: each holds its core collection (`crate::collection`); their Python
//! methods are in `histograms` and `stream_histograms`.

use crate::collection::{ExactCollection, StreamCollection};
use pyo3::prelude::*;

/// Per-tensor histogram states of one kind, in first-collected order.
#[pyclass(module = "histocal._core")]
pub struct Histograms {
    pub(crate) inner: ExactCollection,
}

/// Per-tensor streaming histograms (batch-invariant), in first-collected order, with the
/// summaries they were made to collect.
#[pyclass(module = "histocal._core")]
pub struct StreamHistograms {
    pub(crate) inner: StreamCollection,
}
