//! One tensor's collected state: its histogram in whichever arithmetic type numpy could
//! carry, its data dtype and its value counts. Collection writes it; methods read it.
//!
//! The histogram starts in the data's own type, exactly as ORT computes it. Where numpy would
//! raise instead (f16 "Too many bins", non-finite growth ranges, f32 subnormal ranges), the
//! state is widened exactly (f16 -> f32 -> f64) and that step is redone in the wider type
//! ([`super::widening`]).

use crate::numeric::float::Float;
use crate::numeric::scan::{scan, scan_all, Scan};
use crate::numeric::view::View;
use crate::ort::abs_histogram::AbsHistogram;
use crate::ort::histogram::HistError;
use crate::ort::value_histogram::ValueHistogram;
use crate::stream::stream_histogram::{BatchObserver, StreamHistogram};
use half::f16;

pub use super::widening::{AbsFamily, Chain, Family, Typed, TypedBinning, ValueFamily};

/// The batches of one collect, all of one dtype.
pub enum Batches<'a> {
    F16(Vec<View<'a, f16>>),
    F32(Vec<View<'a, f32>>),
    F64(Vec<View<'a, f64>>),
}

impl Batches<'_> {
    pub fn len(&self) -> usize {
        match self {
            Batches::F16(v) => v.len(),
            Batches::F32(v) => v.len(),
            Batches::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> &'static str {
        match self {
            Batches::F16(_) => "float16",
            Batches::F32(_) => "float32",
            Batches::F64(_) => "float64",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub finite: u64,
    pub nan: u64,
    pub posinf: u64,
    pub neginf: u64,
    pub batches: u64,
}

/// Which of ORT's two histograms a collector keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `collect_value`: symmetric (-t, t) histogram (entropy, distribution, percentile).
    Value,
    /// `collect_absolute_value`: |x| histogram (symmetric percentile).
    Abs,
}

impl Kind {
    /// The kind's name: `"value"` or `"abs"`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Value => "value",
            Kind::Abs => "abs",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "value" => Ok(Kind::Value),
            "abs" => Ok(Kind::Abs),
            _ => Err(format!("unknown histogram kind {name:?}")),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Histogram {
    Value(Typed<ValueFamily>),
    Abs(Typed<AbsFamily>),
}

#[derive(Clone, Debug)]
pub struct TensorState {
    pub dtype: &'static str,
    pub histogram: Histogram,
    /// How the batches of the collect in progress are counted (set by `plan`).
    pub binning: TypedBinning,
    pub counts: Counts,
}

impl TensorState {
    /// A copy of the collected histogram and counts, allocated by `fallible` (running out of
    /// memory unwinds rather than aborting); no collect is in progress in the copy.
    pub fn copied(&self) -> TensorState {
        use crate::numeric::fallible::copy;
        fn value<E: Float>(h: &ValueHistogram<E>) -> ValueHistogram<E> {
            ValueHistogram { hist: copy(&h.hist), edges: copy(&h.edges), ..*h }
        }
        fn abs<E: Float>(h: &AbsHistogram<E>) -> AbsHistogram<E> {
            AbsHistogram { hist: copy(&h.hist), edges: copy(&h.edges), ..*h }
        }
        let histogram = match &self.histogram {
            Histogram::Value(Typed::F16(h)) => Histogram::Value(Typed::F16(value(h))),
            Histogram::Value(Typed::F32(h)) => Histogram::Value(Typed::F32(value(h))),
            Histogram::Value(Typed::F64(h)) => Histogram::Value(Typed::F64(value(h))),
            Histogram::Abs(Typed::F16(h)) => Histogram::Abs(Typed::F16(abs(h))),
            Histogram::Abs(Typed::F32(h)) => Histogram::Abs(Typed::F32(abs(h))),
            Histogram::Abs(Typed::F64(h)) => Histogram::Abs(Typed::F64(abs(h))),
        };
        TensorState { dtype: self.dtype, histogram, binning: TypedBinning::Nothing, counts: self.counts }
    }
}

#[derive(Debug, PartialEq)]
pub enum CollectError {
    DtypeChanged { before: &'static str, now: &'static str },
    Histogram(HistError),
}

impl std::fmt::Display for CollectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CollectError::DtypeChanged { before, now } => {
                write!(f, "earlier batches were {before} but this one is {now}; a tensor's dtype must not change")
            }
            CollectError::Histogram(e) => write!(f, "{e}"),
        }
    }
}

impl From<HistError> for CollectError {
    fn from(e: HistError) -> Self {
        CollectError::Histogram(e)
    }
}

/// The combined scan of one collect's batches, in the data's type.
#[derive(Clone, Copy, Debug)]
pub enum Scans {
    F16(Scan<f16>),
    F32(Scan<f32>),
    F64(Scan<f64>),
}

impl Scans {
    pub fn of(batches: &Batches<'_>) -> Self {
        match batches {
            Batches::F16(v) => Scans::F16(scan_all(v)),
            Batches::F32(v) => Scans::F32(scan_all(v)),
            Batches::F64(v) => Scans::F64(scan_all(v)),
        }
    }

    /// `Scans::of(batches)`, adding each batch to `stream` with its scan on the way (one scan
    /// serves both).
    pub fn of_streamed(
        batches: &Batches<'_>,
        stream: &mut StreamHistogram,
        mut observe: Option<BatchObserver<'_>>,
    ) -> Self {
        fn each<D: Float>(
            views: &[View<'_, D>],
            h: &mut StreamHistogram,
            observe: &mut Option<BatchObserver<'_>>,
        ) -> Scan<D> {
            let mut all = Scan::empty();
            for v in views {
                let s = scan(v);
                match observe {
                    Some(o) => h.add_scanned_observed(v, &s, Some(&mut **o)),
                    None => h.add_scanned(v, &s),
                }
                all = all.merge(s);
            }
            all
        }
        match batches {
            Batches::F16(v) => Scans::F16(each(v, stream, &mut observe)),
            Batches::F32(v) => Scans::F32(each(v, stream, &mut observe)),
            Batches::F64(v) => Scans::F64(each(v, stream, &mut observe)),
        }
    }

    pub fn dtype(&self) -> &'static str {
        match self {
            Scans::F16(_) => "float16",
            Scans::F32(_) => "float32",
            Scans::F64(_) => "float64",
        }
    }

    /// The scan as plain values: `(dtype, [finite_min, finite_max, finite_abs_min,
    /// finite_abs_max], [finite, nan, posinf, neginf])`, each extreme exactly its f64 value.
    pub fn to_parts(&self) -> (&'static str, [Option<f64>; 4], [u64; 4]) {
        fn parts<T: Float>(s: &Scan<T>) -> ([Option<f64>; 4], [u64; 4]) {
            let f = |x: Option<T>| x.map(|v| v.to_f64());
            (
                [f(s.finite_min), f(s.finite_max), f(s.finite_abs_min), f(s.finite_abs_max)],
                [s.n_finite, s.n_nan, s.n_posinf, s.n_neginf],
            )
        }
        let (extremes, counts) = match self {
            Scans::F16(s) => parts(s),
            Scans::F32(s) => parts(s),
            Scans::F64(s) => parts(s),
        };
        (self.dtype(), extremes, counts)
    }

    /// The scan `to_parts` gave (untrusted: from another process), or why the parts are not one:
    /// extremes finite, values of `dtype`, present exactly when there are finite values, ordered
    /// (min <= max, 0 <= |x| min <= |x| max, |x| max = max(|min|, |max|)).
    pub fn from_parts(dtype: &str, extremes: [Option<f64>; 4], counts: [u64; 4]) -> Result<Scans, String> {
        fn build<T: Float>(extremes: [Option<f64>; 4], counts: [u64; 4]) -> Result<Scan<T>, String> {
            let mut typed = [None; 4];
            for (slot, x) in typed.iter_mut().zip(extremes) {
                if let Some(x) = x {
                    let v = T::from_f64(x);
                    if !x.is_finite() || v.to_f64().to_bits() != x.to_bits() {
                        return Err(format!("scan extreme {x} is not a finite {} value", T::NAME));
                    }
                    *slot = Some(v);
                }
            }
            let [n_finite, n_nan, n_posinf, n_neginf] = counts;
            if typed.iter().any(|x| x.is_some() != (n_finite > 0)) {
                return Err("scan extremes must be given exactly when there are finite values".into());
            }
            if let [Some(lo), Some(hi), Some(alo), Some(ahi)] = extremes {
                if !(lo <= hi && 0.0 <= alo && alo <= ahi && ahi == lo.abs().max(hi.abs())) {
                    return Err("scan extremes are inconsistent".into());
                }
            }
            let [finite_min, finite_max, finite_abs_min, finite_abs_max] = typed;
            Ok(Scan { finite_min, finite_max, finite_abs_min, finite_abs_max, n_finite, n_nan, n_posinf, n_neginf })
        }
        match dtype {
            "float16" => build(extremes, counts).map(Scans::F16),
            "float32" => build(extremes, counts).map(Scans::F32),
            "float64" => build(extremes, counts).map(Scans::F64),
            _ => Err(format!("unsupported dtype {dtype:?}")),
        }
    }

    /// Both scans' data together; an error if their dtypes differ.
    pub fn merge(self, o: Scans) -> Result<Scans, CollectError> {
        match (self, o) {
            (Scans::F16(a), Scans::F16(b)) => Ok(Scans::F16(a.merge(b))),
            (Scans::F32(a), Scans::F32(b)) => Ok(Scans::F32(a.merge(b))),
            (Scans::F64(a), Scans::F64(b)) => Ok(Scans::F64(a.merge(b))),
            (a, b) => Err(CollectError::DtypeChanged { before: a.dtype(), now: b.dtype() }),
        }
    }
}

fn plan_typed<D: Chain>(
    state: &mut Option<TensorState>,
    kind: Kind,
    scan: &Scan<D>,
    n_batches: u64,
    n_bins: usize,
) -> Result<(), CollectError> {
    let add_counts = |c: &mut Counts| {
        c.finite += scan.n_finite;
        c.nan += scan.n_nan;
        c.posinf += scan.n_posinf;
        c.neginf += scan.n_neginf;
        c.batches += n_batches;
    };
    match state {
        None => {
            let (histogram, binning) = match kind {
                Kind::Value => D::first(scan, n_bins).map(|(h, b)| (Histogram::Value(h), b))?,
                Kind::Abs => D::first(scan, n_bins).map(|(h, b)| (Histogram::Abs(h), b))?,
            };
            let mut counts = Counts::default();
            add_counts(&mut counts);
            *state = Some(TensorState { dtype: D::NAME, histogram, binning, counts });
        }
        Some(st) => {
            if st.dtype != D::NAME {
                return Err(CollectError::DtypeChanged { before: st.dtype, now: D::NAME });
            }
            st.binning = match &mut st.histogram {
                Histogram::Value(h) => D::merge(h, scan)?,
                Histogram::Abs(h) => D::merge(h, scan)?,
            };
            add_counts(&mut st.counts);
        }
    }
    Ok(())
}

/// Start one collect (ORT's `collect` call) from the combined scan of all its batches: create
/// or grow the histogram and fix how the batches are counted. On error the state is unchanged.
pub fn plan(
    state: &mut Option<TensorState>,
    kind: Kind,
    scans: &Scans,
    n_batches: u64,
    n_bins: usize,
) -> Result<(), CollectError> {
    match scans {
        Scans::F16(s) => plan_typed(state, kind, s, n_batches, n_bins),
        Scans::F32(s) => plan_typed(state, kind, s, n_batches, n_bins),
        Scans::F64(s) => plan_typed(state, kind, s, n_batches, n_bins),
    }
}

fn count_typed<D: Chain>(st: &mut TensorState, views: &[View<'_, D>]) -> Result<(), CollectError> {
    if st.dtype != D::NAME {
        return Err(CollectError::DtypeChanged { before: st.dtype, now: D::NAME });
    }
    for v in views {
        match &mut st.histogram {
            Histogram::Value(h) => D::count(h, &st.binning, v),
            Histogram::Abs(h) => D::count(h, &st.binning, v),
        }
    }
    Ok(())
}

/// Count batches of the collect `plan` started. Every batch that was scanned for the plan
/// must be counted exactly once (in any order and grouping) to get ORT's histogram.
pub fn count(st: &mut TensorState, batches: &Batches<'_>) -> Result<(), CollectError> {
    match batches {
        Batches::F16(v) => count_typed(st, v),
        Batches::F32(v) => count_typed(st, v),
        Batches::F64(v) => count_typed(st, v),
    }
}

/// Collect one tensor's batches into `state` (created on the first call): `plan` and `count`
/// in one step. On error the state is unchanged.
pub fn collect(
    state: &mut Option<TensorState>,
    kind: Kind,
    batches: &Batches<'_>,
    n_bins: usize,
) -> Result<(), CollectError> {
    plan(state, kind, &Scans::of(batches), batches.len() as u64, n_bins)?;
    count(state.as_mut().expect("planned above"), batches)
}

macro_rules! typed_from {
    ($E:ty, $V:ident) => {
        impl From<ValueHistogram<$E>> for Typed<ValueFamily> {
            fn from(h: ValueHistogram<$E>) -> Self {
                Typed::$V(h)
            }
        }
        impl From<AbsHistogram<$E>> for Typed<AbsFamily> {
            fn from(h: AbsHistogram<$E>) -> Self {
                Typed::$V(h)
            }
        }
    };
}
typed_from!(f16, F16);
typed_from!(f32, F32);
typed_from!(f64, F64);

/// An ORT-shaped histogram of `kind` from its exported parts (untrusted: a state file), in the
/// edges' type `E`, with that type's name; or why the parts are inconsistent: edges one more
/// than the bins (finite and increasing for value histograms, as `abs_histogram` checks them
/// for |x| ones), and extremes and threshold that are values of `E`.
pub fn histogram_from_parts<E: Float>(
    kind: Kind,
    hist: Vec<i64>,
    edges: &[E],
    min: (f64, bool),
    max: (f64, bool),
    threshold: Option<(f64, bool)>,
) -> Result<(Histogram, &'static str), String>
where
    Typed<ValueFamily>: From<crate::ort::value_histogram::ValueHistogram<E>>,
    Typed<AbsFamily>: From<crate::ort::abs_histogram::AbsHistogram<E>>,
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
        Kind::Abs => crate::ort::abs_histogram::check_edges(edges, &hist)?,
    }
    let held = |(v, a): (f64, bool)| {
        let x = E::from_f64(v);
        if v.is_nan() || x.to_f64() != v {
            Err(format!("{v} is not a {} value", E::NAME))
        } else {
            Ok(crate::ort::value_histogram::Held { value: x, is_array: a })
        }
    };
    let (mn, mx) = (held(min)?, held(max)?);
    let edges = crate::numeric::fallible::copy(edges);
    Ok(match kind {
        Kind::Value => {
            let t = held(threshold.expect("checked above"))?;
            (
                Histogram::Value(
                    crate::ort::value_histogram::ValueHistogram { hist, edges, min: mn, max: mx, threshold: t }.into(),
                ),
                E::NAME,
            )
        }
        Kind::Abs => {
            (Histogram::Abs(crate::ort::abs_histogram::AbsHistogram { hist, edges, min: mn, max: mx }.into()), E::NAME)
        }
    })
}

/// ORT-shaped histogram of a streaming one, in the data's type or, where numpy would fail
/// ("Too many bins"), the next wider one.
pub fn ort_shaped(dtype: &str, h: &StreamHistogram, kind: Kind, n: usize) -> Result<Histogram, HistError> {
    fn value<E: Float>(
        h: &StreamHistogram,
        n: usize,
    ) -> Result<crate::ort::value_histogram::ValueHistogram<E>, HistError> {
        h.to_value::<E>(n)
    }
    fn abs<E: Float>(h: &StreamHistogram, n: usize) -> Result<crate::ort::abs_histogram::AbsHistogram<E>, HistError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_scan_serves_the_pending_scan_and_the_streaming_histogram() {
        let a: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let b: Vec<f32> = vec![0.0, -0.0, f32::NAN, 40.0, -1e-30];
        let batches = Batches::F32(vec![View::from_slice(&a), View::from_slice(&b)]);
        let mut streamed = StreamHistogram::new(6);
        let scans = Scans::of_streamed(&batches, &mut streamed, None);
        let mut direct = StreamHistogram::new(6);
        direct.add(&View::from_slice(&a));
        direct.add(&View::from_slice(&b));
        assert_eq!(streamed, direct);
        match (scans, Scans::of(&batches)) {
            (Scans::F32(x), Scans::F32(y)) => assert_eq!(x, y),
            _ => unreachable!(),
        }
    }

    #[test]
    fn scans_round_trip_through_their_parts_and_bad_parts_are_refused() {
        let a: Vec<f16> =
            [0.1f32, -3.5, 65504.0, f32::NAN, f32::INFINITY, -0.0].iter().map(|&x| f16::from_f32(x)).collect();
        let scans = Scans::of(&Batches::F16(vec![View::from_slice(&a)]));
        let (dtype, extremes, counts) = scans.to_parts();
        match (Scans::from_parts(dtype, extremes, counts).unwrap(), scans) {
            (Scans::F16(x), Scans::F16(y)) => assert_eq!(x, y),
            _ => unreachable!(),
        }
        let empty = Scans::F32(Scan::empty()).to_parts();
        assert!(Scans::from_parts(empty.0, empty.1, empty.2).is_ok());
        // 0.1 is not a float16 value; extremes without finite values; min above max
        assert!(Scans::from_parts("float16", [Some(0.1), Some(1.0), Some(0.1), Some(1.0)], [2, 0, 0, 0]).is_err());
        assert!(Scans::from_parts("float32", [Some(1.0), Some(1.0), Some(1.0), Some(1.0)], [0, 1, 0, 0]).is_err());
        assert!(Scans::from_parts("float32", [Some(2.0), Some(1.0), Some(1.0), Some(2.0)], [2, 0, 0, 0]).is_err());
        assert!(Scans::from_parts("int8", [None; 4], [0; 4]).is_err());
    }

    #[test]
    fn a_merge_refused_in_every_type_leaves_the_histogram_as_it_was() {
        // |x| extensions from [1, 1] in 512 bins: to 20000 fits; to 40000 passes MAX_BINS in
        // float32 and in float64, and the float32 histogram must not come back as float64.
        let scan_of = |x: &[f32]| scan(&View::from_slice(x));
        let (mut h, _) = <f32 as Chain>::first::<AbsFamily>(&scan_of(&[1.0, 1.0]), 512).unwrap();
        <f32 as Chain>::merge(&mut h, &scan_of(&[20000.0])).unwrap();
        let before = h.clone();
        assert!(<f32 as Chain>::merge(&mut h, &scan_of(&[40000.0])).is_err());
        assert!(matches!(h, Typed::F32(_)));
        assert_eq!(h, before);
    }
}
