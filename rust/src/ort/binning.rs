//! How one collect's values are counted. ORT bins all batches of a `collect` call with the same
//! edges, fixed by the call's combined min/max; keeping that binning lets the batches arrive one
//! at a time (histocal's two-pass exact mode) and still give ORT's one-call histogram, because
//! counting is additive.

use crate::numeric::float::{Float, Widen};
use crate::numeric::view::View;
use crate::ort::explicit_edges::count_abs_explicit;
use crate::ort::histogram::UniformBins;

#[derive(Clone, Debug, Default)]
pub enum Binning<E> {
    /// Nothing to count (no finite values in the collect).
    #[default]
    Nothing,
    /// `np.histogram(x, n, range)` bins, of the values or of `|x|`.
    Uniform { bins: UniformBins<E>, abs: bool },
    /// `|x|` against explicit edges compared in f64 (symmetric-percentile merges).
    Explicit(Vec<f64>),
}

impl<E: Float> Binning<E> {
    pub fn count<D: Float + Widen<E>>(&self, view: &View<'_, D>, hist: &mut [i64]) {
        match self {
            Binning::Nothing => {}
            Binning::Uniform { bins, abs } => bins.count(view, *abs, hist),
            Binning::Explicit(edges) => count_abs_explicit(view, edges, hist),
        }
    }
}
