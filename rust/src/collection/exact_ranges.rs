//! ORT's three histogram results over an [`ExactCollection`], in parallel over tensors: Entropy's
//! thresholds (`ort::entropy`), Percentile's edge indices (`ort::percentile`) and Distribution's
//! moments (`ort::distribution`), each computed in the histogram's own arithmetic type as ORT
//! computes it (float16, float32 or float64: the type its edges are held in), so the results are
//! ORT's bit for bit. Also a typed view of a histogram ([`HistogramView`]) for what reads it
//! whole (the bindings' exports): the arithmetic type is chosen here, once, not by each reader.

use super::exact::ExactCollection;
use super::tensor_set::{on_tensor, par_map, TensorError};
use crate::collection::tensor::{Family, Histogram, TensorState, Typed};
use crate::numeric::float::Float;
use crate::ort::distribution::avg_std;
use crate::ort::entropy::{entropy_threshold, search_work, EntropyChoice, EntropyError};
use crate::ort::percentile::percentile_indices;
use crate::ort::value_histogram::Held;
use half::f16;
use std::sync::atomic::AtomicBool;

/// A histogram's edges in their arithmetic type.
#[derive(Clone, Copy, Debug)]
pub enum EdgesRef<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    F64(&'a [f64]),
}

/// What one histogram holds, as ORT's collector keeps it: `hist`, `edges`, the running `min` and
/// `max` (their values widened to f64, which is exact, and whether ORT holds them as arrays) and
/// the value histogram's `threshold` (None for the |x| histogram).
#[derive(Clone, Copy, Debug)]
pub struct HistogramView<'a> {
    pub hist: &'a [i64],
    pub edges: EdgesRef<'a>,
    pub min: (f64, bool),
    pub max: (f64, bool),
    pub threshold: Option<(f64, bool)>,
}

fn held<E: Float>(h: Held<E>) -> (f64, bool) {
    (h.value.to_f64(), h.is_array)
}

/// `f` applied to a typed histogram whatever its arithmetic type (`E` in the body).
macro_rules! on_typed {
    ($t:expr, |$h:ident, $E:ident| $body:expr) => {
        match $t {
            Typed::F16($h) => {
                type $E = f16;
                $body
            }
            Typed::F32($h) => {
                type $E = f32;
                $body
            }
            Typed::F64($h) => {
                type $E = f64;
                $body
            }
        }
    };
}

fn dtype_of<Fm: Family>(t: &Typed<Fm>) -> &'static str {
    on_typed!(t, |_h, E| E::NAME)
}

/// The edges of one arithmetic type as an [`EdgesRef`].
trait Edges: Float {
    fn edges_ref(edges: &[Self]) -> EdgesRef<'_>;
}

impl Edges for f16 {
    fn edges_ref(edges: &[Self]) -> EdgesRef<'_> {
        EdgesRef::F16(edges)
    }
}

impl Edges for f32 {
    fn edges_ref(edges: &[Self]) -> EdgesRef<'_> {
        EdgesRef::F32(edges)
    }
}

impl Edges for f64 {
    fn edges_ref(edges: &[Self]) -> EdgesRef<'_> {
        EdgesRef::F64(edges)
    }
}

impl Histogram {
    /// The histogram's contents, its edges in their own type.
    pub fn view(&self) -> HistogramView<'_> {
        match self {
            Histogram::Value(t) => on_typed!(t, |h, E| HistogramView {
                hist: &h.hist,
                edges: E::edges_ref(&h.edges),
                min: held(h.min),
                max: held(h.max),
                threshold: Some(held(h.threshold)),
            }),
            Histogram::Abs(t) => on_typed!(t, |h, E| HistogramView {
                hist: &h.hist,
                edges: E::edges_ref(&h.edges),
                min: held(h.min),
                max: held(h.max),
                threshold: None,
            }),
        }
    }

    /// The arithmetic dtype of the edges (the data's unless numpy would have failed).
    pub fn edge_dtype(&self) -> &'static str {
        match self {
            Histogram::Value(t) => dtype_of(t),
            Histogram::Abs(t) => dtype_of(t),
        }
    }

    /// The values binned (the counts' sum) and whether the edges end in +inf (an |x| histogram
    /// past float16's range, which bins later infinities in its last bin, as ORT's does).
    pub fn binned_and_open_top(&self) -> (u64, bool) {
        let v = self.view();
        let open_top = match v.edges {
            EdgesRef::F16(e) => e.last().is_some_and(|x| x.to_f64() == f64::INFINITY),
            EdgesRef::F32(e) => e.last().is_some_and(|x| *x == f32::INFINITY),
            EdgesRef::F64(e) => e.last().is_some_and(|x| *x == f64::INFINITY),
        };
        (v.hist.iter().map(|&c| c as u64).sum(), open_top)
    }

    /// ORT's entropy threshold over this histogram, in its arithmetic type.
    pub fn entropy_threshold(
        &self,
        num_quantized_bins: usize,
        stop: &AtomicBool,
    ) -> Result<EntropyChoice, EntropyError> {
        match self {
            Histogram::Value(t) => on_typed!(t, |h, E| entropy_threshold::<E>(&h.hist, num_quantized_bins, stop)),
            Histogram::Abs(t) => on_typed!(t, |h, E| entropy_threshold::<E>(&h.hist, num_quantized_bins, stop)),
        }
    }

    /// ORT's Distribution moments `(avg, std)` over this histogram, in f64 before rounding to the
    /// edge dtype.
    pub fn avg_std(&self) -> (f64, f64) {
        match self {
            Histogram::Value(t) => on_typed!(t, |h, E| avg_std::<E>(&h.hist, &h.edges)),
            Histogram::Abs(t) => on_typed!(t, |h, E| avg_std::<E>(&h.hist, &h.edges)),
        }
    }
}

impl ExactCollection {
    /// Per tensor `(name, values binned, whether the edges end in +inf)` (`binned_and_open_top`).
    pub fn binned_totals(&self) -> Vec<(String, u64, bool)> {
        let totals = self.tensors().iter().map(|(n, st)| (n, st.histogram.binned_and_open_top()));
        totals.map(|(n, (binned, open_top))| (n.clone(), binned, open_top)).collect()
    }

    fn states(&self) -> Vec<(&String, &TensorState)> {
        self.tensors().iter().collect()
    }

    /// Each tensor's entropy search work (`ort::entropy::search_work`), in order, with a
    /// description of the search for a refusal: `(name, what, work)`. Checked before any search
    /// starts, so that one over the limit fails at once.
    pub fn entropy_work(&self, num_quantized_bins: usize) -> Vec<(String, String, u64)> {
        self.states()
            .into_iter()
            .map(|(name, st)| {
                let n = st.histogram.view().hist.len();
                let grown = if n > self.num_bins() {
                    format!(
                        " (grown from {} bins: a later collect had a much wider range, such as an outlier)",
                        self.num_bins()
                    )
                } else {
                    String::new()
                };
                let what = format!("tensor {name:?}: the entropy search over its histogram of {n} bins{grown}");
                (name.clone(), what, search_work(n, num_quantized_bins))
            })
            .collect()
    }

    /// Entropy: each tensor's threshold as `(name, start, end)`, the thresholds being
    /// `(edges[start], edges[end])` before clipping; the first error in tensor order.
    pub fn entropy_thresholds(
        &self,
        num_quantized_bins: usize,
        stop: &AtomicBool,
    ) -> Result<Vec<(String, usize, usize)>, TensorError> {
        let out = par_map(&self.states(), |(name, st)| {
            on_tensor(name, || st.histogram.entropy_threshold(num_quantized_bins, stop))
                .map(|c| ((*name).clone(), c.start, c.end))
        });
        out.into_iter().collect()
    }

    /// Percentile: each tensor's `(name, low_index, high_index)` into its edges.
    pub fn percentile_indices(&self, percentile: f64, symmetric: bool) -> Vec<(String, usize, usize)> {
        par_map(&self.states(), |(name, st)| {
            let (lo, hi) = percentile_indices(st.histogram.view().hist, percentile, symmetric);
            ((*name).clone(), lo, hi)
        })
    }

    /// Distribution (scenario "same"): each tensor's `(name, avg, std)` in f64, before rounding to
    /// the edge dtype.
    pub fn distribution_moments(&self) -> Vec<(String, f64, f64)> {
        par_map(&self.states(), |(name, st)| {
            let (avg, std) = st.histogram.avg_std();
            ((*name).clone(), avg, std)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collection::tensor::{Batches, Kind};
    use crate::numeric::view::View;

    fn collection(kind: Kind, values: &[f32]) -> ExactCollection {
        let mut c = ExactCollection::new(kind, 64).unwrap();
        let batches = Batches::F32(vec![View::from_slice(values)]);
        c.collect(&[("t", batches)]).unwrap();
        c
    }

    #[test]
    fn view_and_results_follow_the_arithmetic_type() {
        let values: Vec<f32> = (0..1000).map(|i| ((i * 37) % 200) as f32 / 10.0 - 10.0).collect();
        let c = collection(Kind::Value, &values);
        let st = c.tensors().get("t").unwrap();
        let view = st.histogram.view();
        assert_eq!(st.histogram.edge_dtype(), "float32");
        assert!(matches!(view.edges, EdgesRef::F32(e) if e.len() == view.hist.len() + 1));
        assert_eq!(view.hist.iter().sum::<i64>(), 1000);
        assert!(view.threshold.is_some());
        let stop = AtomicBool::new(false);
        let (name, start, end) = c.entropy_thresholds(16, &stop).unwrap().remove(0);
        assert_eq!(
            (name.as_str(), st.histogram.entropy_threshold(16, &stop).unwrap()),
            ("t", EntropyChoice { start, end })
        );
        assert_eq!(c.percentile_indices(99.0, false)[0].0, "t");
        let (_, avg, std) = c.distribution_moments().remove(0);
        assert_eq!((avg, std), st.histogram.avg_std());
        assert_eq!(c.entropy_work(16)[0].2, search_work(view.hist.len(), 16));
        let abs = collection(Kind::Abs, &values);
        assert!(abs.tensors().get("t").unwrap().histogram.view().threshold.is_none());
    }

    #[test]
    fn entropy_without_candidates_names_the_tensor() {
        let c = collection(Kind::Value, &[1.0, 2.0, 3.0]);
        let err = c.entropy_thresholds(1 << 20, &AtomicBool::new(false)).unwrap_err();
        assert!(err.to_string().starts_with("tensor \"t\": "), "{err}");
    }
}
