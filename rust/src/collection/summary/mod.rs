//! Summaries a method collects beside a tensor's streaming histogram, because the histogram
//! alone cannot give its answer: pow2's per-batch votes ([`pow2_votes`]) and isotone's per-row
//! top-two pairs ([`isotone`]).
//!
//! A summary is one value per tensor ([`Summary`]); a [`StreamCollection`](super::StreamCollection)
//! holds, for every tensor, one of each kind it was made with, in [`REGISTERED`] order. A summary
//! sees each batch as it is collected, in one or both of two forms: its rows (the values in
//! logical order, the last axis a row: [`RowBatch`]) and its own histogram (at the batch's own
//! level, so independent of the batches before it: `StreamHistogram::add_observed`). It merges
//! (the result equals one collect over both data sets, whatever the order), and has a stored form
//! of named columns ([`Parts`]) that is untrusted when read back: [`Summary::restore`] checks it.
//!
//! **Adding a summary**: a file in this folder implementing [`Summary`], and its line in
//! [`REGISTERED`] (with its `mod`). Python then knows it by name (`StreamHistograms(..., name=True)`,
//! `export_summary`, `restore_summary`), and the state file stores it through its members class
//! (`histocal.state.file.summaries`). `row_count` (compiled into tests only) is such a summary.

pub mod isotone;
pub mod pow2_votes;
#[cfg(test)]
pub mod row_count;
pub mod rows;

use crate::methods::qerror::UniformHistogram;
pub use rows::{RowBatch, Rows};
use std::any::Any;

/// Every summary kind, by name: its empty summary. The order is the order summaries are kept,
/// collected and listed in.
pub const REGISTERED: &[(&str, MakeSummary)] = &[
    ("pow2_votes", pow2_votes::empty),
    ("isotone", isotone::empty),
    // a throwaway third summary, in tests only: what adding one takes (see `row_count`)
    #[cfg(test)]
    ("row_count", row_count::empty),
];

/// A summary kind's constructor: its empty summary.
pub type MakeSummary = fn() -> Box<dyn Summary>;

/// The empty summary of the kind called `name`, if there is one.
pub fn empty_summary(name: &str) -> Option<Box<dyn Summary>> {
    REGISTERED.iter().find(|(n, _)| *n == name).map(|(_, make)| make())
}

/// One column of a summary's stored form.
#[derive(Clone, Debug, PartialEq)]
pub enum Column {
    F64(Vec<f64>),
    U64(Vec<u64>),
    I64(Vec<i64>),
}

/// A summary's stored form: named columns (a scalar is a column of one value).
pub type Parts = Vec<(&'static str, Column)>;

/// A stored form as read back (untrusted): named columns.
pub type ReadParts = Vec<(String, Column)>;

/// A per-tensor summary collected beside the streaming histogram (see the module documentation).
pub trait Summary: Send + Sync + std::fmt::Debug {
    /// Its name: in [`REGISTERED`], in errors, in Python.
    fn name(&self) -> &'static str;

    /// Whether it reads each batch's rows ([`Summary::add_rows`]).
    fn reads_rows(&self) -> bool {
        false
    }

    /// Add one batch's rows (only called when [`Summary::reads_rows`]).
    fn add_rows(&mut self, _rows: &RowBatch<'_>) {}

    /// Whether it watches each batch's own histogram ([`Summary::add_batch_histogram`]); the
    /// histogram then counts batches through its slower, observed path.
    fn observes_batches(&self) -> bool {
        false
    }

    /// One batch's own histogram, with the largest finite value of the data's dtype.
    fn add_batch_histogram(&mut self, _hist: &UniformHistogram<'_>, _dtype_max: f64) {}

    /// Add the summary of other batches of the same tensor (`other` is of the same kind).
    fn merge(&mut self, other: &dyn Summary);

    /// The stored form.
    fn export(&self) -> Parts;

    /// A summary of this kind from its stored form, checked: an error unless a collect of
    /// `batches` batches could have built it.
    fn restore(&self, parts: ReadParts, batches: u64) -> Result<Box<dyn Summary>, String>;

    /// A copy, allocated by `fallible` (running out of memory unwinds rather than aborting).
    fn copied(&self) -> Box<dyn Summary>;

    /// Whether it equals `other` (the same kind and content).
    fn same(&self, other: &dyn Summary) -> bool;

    fn as_any(&self) -> &dyn Any;

    /// Bytes it holds beyond its own size (what its memory grows with).
    fn held_bytes(&self) -> usize {
        0
    }
}

/// `other` as a summary of type `S` (a merge or comparison of two summaries of one kind).
pub fn same_kind<'a, S: 'static>(me: &dyn Summary, other: &'a dyn Summary) -> &'a S {
    other
        .as_any()
        .downcast_ref::<S>()
        .unwrap_or_else(|| panic!("summaries of different kinds ({} and {}) combined", me.name(), other.name()))
}

/// The column called `name` of a stored form read back, as `want` gives it (None: missing or of
/// another type).
pub fn column<'a, T>(
    parts: &'a ReadParts,
    name: &str,
    want: fn(&'a Column) -> Option<&'a Vec<T>>,
) -> Result<&'a [T], String> {
    let found = parts.iter().find(|(n, _)| n == name).ok_or_else(|| format!("missing column {name:?}"))?;
    want(&found.1).map(Vec::as_slice).ok_or_else(|| format!("column {name:?} has the wrong type"))
}

/// A one-value column of a stored form read back.
pub fn scalar<'a, T: Copy>(
    parts: &'a ReadParts,
    name: &str,
    want: fn(&'a Column) -> Option<&'a Vec<T>>,
) -> Result<T, String> {
    match column(parts, name, want)? {
        [v] => Ok(*v),
        other => Err(format!("column {name:?} must hold one value, not {}", other.len())),
    }
}

impl Column {
    pub fn f64(&self) -> Option<&Vec<f64>> {
        if let Column::F64(v) = self {
            Some(v)
        } else {
            None
        }
    }

    pub fn u64(&self) -> Option<&Vec<u64>> {
        if let Column::U64(v) = self {
            Some(v)
        } else {
            None
        }
    }

    pub fn i64(&self) -> Option<&Vec<i64>> {
        if let Column::I64(v) = self {
            Some(v)
        } else {
            None
        }
    }
}
