//! The range methods over a [`StreamCollection`]: each tensor's range from its histogram and
//! the summaries the method reads (pow2's votes of the method's type, isotone's pairs), and the
//! quantization error of given ranges, in parallel over tensors.

use super::stream::{StreamCollection, StreamState};
use super::summary::pow2_votes::Pow2Votes;
use super::tensor_set::{par_map, TensorError};
use crate::methods::isotone::{self, IsotoneChoice, TopPairs};
use crate::methods::qerror::{ErrorTable, OrtRule, QType, Quantizer};
use crate::methods::range_method::{largest_finite, range_rule, RangeMethod};
use crate::numeric::fallible;
use crate::stream::stream_histogram::as_uniform;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;

/// A tensor's isotone result: its range, the rows the scale keeps in order (`satisfied`, weighted
/// by their counts), the rows summarised and skipped, and whether it fell back to `(0, max)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IsotoneResult {
    pub low: f64,
    pub high: f64,
    pub satisfied: u128,
    pub rows: u128,
    pub skipped: u64,
    pub fell_back: bool,
}

impl IsotoneResult {
    /// The counts beside the range, by name (`fell_back` as 0 or 1).
    pub fn notes(&self) -> BTreeMap<&'static str, u128> {
        let (rows, skipped, fell_back) = (self.rows, u128::from(self.skipped), u128::from(self.fell_back));
        BTreeMap::from([("satisfied", self.satisfied), ("rows", rows), ("skipped", skipped), ("fell_back", fell_back)])
    }
}

/// A range from a summary and the counts, by name, of how it was reached.
pub type SummaryRange = (f64, f64, BTreeMap<&'static str, u128>);

/// isotone's range from a tensor's pairs: without a separable row `(0, max(largest top value,
/// 0))` (`fell_back`), and `(0, 0)` without any row; an error when its rows overflowed.
pub fn isotone_result(t: &TopPairs, qtype: QType, symmetric: bool) -> Result<IsotoneResult, String> {
    if t.overflowed {
        return Err(format!(
            "its rows had more than {} distinct top-two pairs, more than isotone's summary holds (isotone is \
             meant for classification outputs: calibrate only those with it)",
            isotone::MAX_PAIRS
        ));
    }
    let (rows, skipped) = (t.rows(), t.skipped);
    Ok(match isotone::isotone_scale(t, isotone::positive_levels(qtype, symmetric), symmetric) {
        IsotoneChoice::Scale(s, n) => {
            let (low, high) = isotone::isotone_range(s, qtype, symmetric);
            IsotoneResult { low, high, satisfied: n, rows, skipped, fell_back: false }
        }
        IsotoneChoice::None(m) => IsotoneResult {
            low: 0.0,
            high: m.unwrap_or(0.0).max(0.0),
            satisfied: 0,
            rows,
            skipped,
            fell_back: m.is_some(),
        },
    })
}

/// `f` on a tensor, its error and running out of memory named by the tensor.
fn named<T>(name: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, TensorError> {
    match fallible::catch(f) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(TensorError::invalid(name, e)),
        Err(oom) => Err(TensorError::OutOfMemory { name: name.to_string(), oom }),
    }
}

impl StreamCollection {
    /// The states of `names` (default: all, in order).
    fn states(&self, names: Option<Vec<String>>) -> Result<Vec<(String, &StreamState)>, TensorError> {
        self.tensors().selected(names)
    }

    /// `(low, high)` of `method` for each tensor of `names` (default: all, in order); (0, 0) for
    /// a tensor without finite values. pow2's most-common choice reads the votes of its type.
    pub fn ranges(
        &self,
        method: &RangeMethod,
        names: Option<Vec<String>>,
        ort: OrtRule,
        stop: &AtomicBool,
    ) -> Result<Vec<(f64, f64)>, TensorError> {
        let selected = self.states(names)?;
        let votes_at = self.summary_index("pow2_votes");
        let out = par_map(&selected, |(name, st)| {
            named(name, || {
                let counts = st.histogram.bins();
                let Some(hist) = as_uniform(&st.histogram, &counts)? else { return Ok((0.0, 0.0)) };
                let votes = match (method, votes_at) {
                    (RangeMethod::Pow2 { qtype, .. }, Some(i)) if method.needs_votes() => {
                        let v: &Pow2Votes = st.summaries[i].as_any().downcast_ref().expect("pow2 votes");
                        v.of_type(*qtype)
                    }
                    (_, None) if method.needs_votes() => {
                        return Err(
                            "pow2 MinMSE's most-common choice needs per-batch votes, which this collection did \
                                    not record (collect with the pow2 method and its most-common minmse_mode, or \
                                    StreamHistograms(..., summaries=[\"pow2_votes\"]))"
                                .to_string(),
                        )
                    }
                    _ => Vec::new(),
                };
                method.range(hist, &votes, largest_finite(st.dtype), range_rule(ort, st.dtype), stop)
            })
        });
        out.into_iter().collect()
    }

    /// The mean squared quantization error of `ranges[k]` on tensor `names[k]` (0.0 for a tensor
    /// without finite values).
    pub fn qerrors(
        &self,
        names: Vec<String>,
        ranges: &[(f64, f64)],
        qtype: QType,
        symmetric: bool,
        ort: OrtRule,
    ) -> Result<Vec<f64>, TensorError> {
        if names.len() != ranges.len() {
            return Err(TensorError::Collection(format!("{} names but {} ranges", names.len(), ranges.len())));
        }
        for (name, &(low, high)) in names.iter().zip(ranges) {
            if !(low.is_finite() && high.is_finite()) {
                return Err(TensorError::invalid(name, format!("range ({low}, {high}) is not finite")));
            }
        }
        let selected = self.states(Some(names))?;
        let work: Vec<(String, &StreamState, (f64, f64))> =
            selected.into_iter().zip(ranges.iter().copied()).map(|((n, st), r)| (n, st, r)).collect();
        let out = par_map(&work, |(name, st, (low, high))| {
            named(name, || {
                let q = Quantizer::for_range(*low, *high, qtype, symmetric, range_rule(ort, st.dtype));
                let counts = st.histogram.bins();
                Ok(as_uniform(&st.histogram, &counts)?.map_or(0.0, |hist| ErrorTable::new(hist).mean_squared_error(&q)))
            })
        });
        out.into_iter().collect()
    }

    /// The ranges of the method that reads summary `summary` alone (isotone's) for `names`
    /// (default: all), with their notes ([`IsotoneResult::notes`]).
    pub fn summary_ranges(
        &self,
        summary: &str,
        names: Option<Vec<String>>,
        qtype: QType,
        symmetric: bool,
    ) -> Result<Vec<SummaryRange>, TensorError> {
        match summary {
            "isotone" => {
                let out = self.isotone_ranges(names, qtype, symmetric)?;
                Ok(out.into_iter().map(|r| (r.low, r.high, r.notes())).collect())
            }
            _ => Err(TensorError::Collection(format!("no range method reads the summary {summary:?} alone"))),
        }
    }

    /// isotone's results for `names` (default: all); see [`isotone_result`].
    pub fn isotone_ranges(
        &self,
        names: Option<Vec<String>>,
        qtype: QType,
        symmetric: bool,
    ) -> Result<Vec<IsotoneResult>, TensorError> {
        let selected = self.states(names)?;
        let Some(i) = self.summary_index("isotone") else {
            let name = selected.first().map(|s| s.0.clone()).unwrap_or_default();
            return Err(TensorError::invalid(
                &name,
                "isotone needs per-row top-two summaries, which this collection did not record (collect with the \
                 isotone method, or StreamHistograms(..., summaries=[\"isotone\"]))",
            ));
        };
        let out = par_map(&selected, |(name, st)| {
            let t: &TopPairs = st.summaries[i].as_any().downcast_ref().expect("isotone pairs");
            named(name, || isotone_result(t, qtype, symmetric))
        });
        out.into_iter().collect()
    }
}
