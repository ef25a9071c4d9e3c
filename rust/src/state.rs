//! One tensor's collected state: its histogram in whichever arithmetic type numpy could
//! carry, its data dtype and its value counts. Collection writes it; methods read it.
//!
//! The histogram starts in the data's own type, exactly as ORT computes it. Where numpy would
//! raise instead (f16 "Too many bins", non-finite growth ranges, f32 subnormal ranges), the
//! state is widened exactly (f16 -> f32 -> f64) and that step is redone in the wider type.

use crate::abs_histogram::AbsHistogram;
use crate::float::{Float, Widen};
use crate::histogram::HistError;
use crate::scan::{scan_all, Scan};
use crate::value_histogram::ValueHistogram;
use crate::view::View;
use half::f16;

/// The batches of one collect, all of one dtype.
pub enum Batches<'a> {
    F16(Vec<View<'a, f16>>),
    F32(Vec<View<'a, f32>>),
    F64(Vec<View<'a, f64>>),
}

impl Batches<'_> {
    pub fn dtype(&self) -> &'static str {
        match self {
            Batches::F16(_) => "float16",
            Batches::F32(_) => "float32",
            Batches::F64(_) => "float64",
        }
    }
}

/// A histogram family (ORT's value or |x| histogram), generic over its arithmetic type.
pub trait Family {
    type H<E: Float>: Clone + std::fmt::Debug + PartialEq;
    fn first<E: Float, D: Float + Widen<E>>(views: &[View<D>], scan: &Scan<D>, n_bins: usize) -> Result<Self::H<E>, HistError>;
    /// Must leave `h` unchanged on error.
    fn merge<E: Float, D: Float + Widen<E>>(h: &mut Self::H<E>, views: &[View<D>], scan: &Scan<D>) -> Result<(), HistError>;
    fn widen<E: Float, F: Float>(h: &Self::H<E>) -> Self::H<F>;
}

#[derive(Clone, Debug, PartialEq)]
pub struct ValueFamily;
#[derive(Clone, Debug, PartialEq)]
pub struct AbsFamily;

impl Family for ValueFamily {
    type H<E: Float> = ValueHistogram<E>;
    fn first<E: Float, D: Float + Widen<E>>(v: &[View<D>], s: &Scan<D>, n: usize) -> Result<Self::H<E>, HistError> {
        ValueHistogram::first(v, s, n)
    }
    fn merge<E: Float, D: Float + Widen<E>>(h: &mut Self::H<E>, v: &[View<D>], s: &Scan<D>) -> Result<(), HistError> {
        h.merge(v, s)
    }
    fn widen<E: Float, F: Float>(h: &Self::H<E>) -> Self::H<F> {
        h.widen()
    }
}

impl Family for AbsFamily {
    type H<E: Float> = AbsHistogram<E>;
    fn first<E: Float, D: Float + Widen<E>>(v: &[View<D>], s: &Scan<D>, n: usize) -> Result<Self::H<E>, HistError> {
        AbsHistogram::first(v, s, n)
    }
    fn merge<E: Float, D: Float + Widen<E>>(h: &mut Self::H<E>, v: &[View<D>], s: &Scan<D>) -> Result<(), HistError> {
        h.merge(v, s)
    }
    fn widen<E: Float, F: Float>(h: &Self::H<E>) -> Self::H<F> {
        h.widen()
    }
}

/// A histogram in one of the three arithmetic types.
#[derive(Clone, Debug, PartialEq)]
pub enum Typed<Fm: Family> {
    F16(Fm::H<f16>),
    F32(Fm::H<f32>),
    F64(Fm::H<f64>),
}

/// The widening chain each data type starts from: f16 -> f32 -> f64, f32 -> f64, f64.
pub trait Chain: Float {
    fn first<Fm: Family>(views: &[View<Self>], scan: &Scan<Self>, n_bins: usize) -> Result<Typed<Fm>, HistError>;
    fn merge<Fm: Family>(h: &mut Typed<Fm>, views: &[View<Self>], scan: &Scan<Self>) -> Result<(), HistError>;
}

impl Chain for f16 {
    fn first<Fm: Family>(v: &[View<f16>], s: &Scan<f16>, n: usize) -> Result<Typed<Fm>, HistError> {
        Fm::first::<f16, f16>(v, s, n)
            .map(Typed::F16)
            .or_else(|_| Fm::first::<f32, f16>(v, s, n).map(Typed::F32))
            .or_else(|_| Fm::first::<f64, f16>(v, s, n).map(Typed::F64))
    }
    fn merge<Fm: Family>(h: &mut Typed<Fm>, v: &[View<f16>], s: &Scan<f16>) -> Result<(), HistError> {
        if let Typed::F16(x) = h {
            if Fm::merge(x, v, s).is_ok() {
                return Ok(());
            }
            *h = Typed::F32(Fm::widen(x));
        }
        if let Typed::F32(x) = h {
            if Fm::merge(x, v, s).is_ok() {
                return Ok(());
            }
            *h = Typed::F64(Fm::widen(x));
        }
        match h {
            Typed::F64(x) => Fm::merge(x, v, s),
            _ => unreachable!("widened above"),
        }
    }
}

impl Chain for f32 {
    fn first<Fm: Family>(v: &[View<f32>], s: &Scan<f32>, n: usize) -> Result<Typed<Fm>, HistError> {
        Fm::first::<f32, f32>(v, s, n)
            .map(Typed::F32)
            .or_else(|_| Fm::first::<f64, f32>(v, s, n).map(Typed::F64))
    }
    fn merge<Fm: Family>(h: &mut Typed<Fm>, v: &[View<f32>], s: &Scan<f32>) -> Result<(), HistError> {
        if let Typed::F32(x) = h {
            if Fm::merge(x, v, s).is_ok() {
                return Ok(());
            }
            *h = Typed::F64(Fm::widen(x));
        }
        match h {
            Typed::F64(x) => Fm::merge(x, v, s),
            _ => unreachable!("float32 data never has a float16 histogram"),
        }
    }
}

impl Chain for f64 {
    fn first<Fm: Family>(v: &[View<f64>], s: &Scan<f64>, n: usize) -> Result<Typed<Fm>, HistError> {
        Fm::first::<f64, f64>(v, s, n).map(Typed::F64)
    }
    fn merge<Fm: Family>(h: &mut Typed<Fm>, v: &[View<f64>], s: &Scan<f64>) -> Result<(), HistError> {
        match h {
            Typed::F64(x) => Fm::merge(x, v, s),
            _ => unreachable!("float64 data only ever has a float64 histogram"),
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

#[derive(Clone, Debug, PartialEq)]
pub enum Histogram {
    Value(Typed<ValueFamily>),
    Abs(Typed<AbsFamily>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TensorState {
    pub dtype: &'static str,
    pub histogram: Histogram,
    pub counts: Counts,
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

fn step<D>(state: Option<&mut TensorState>, kind: Kind, views: &[View<D>], n_bins: usize) -> Result<Option<TensorState>, CollectError>
where
    D: Chain,
{
    let scan = scan_all(views);
    let add_counts = |c: &mut Counts| {
        c.finite += scan.n_finite;
        c.nan += scan.n_nan;
        c.posinf += scan.n_posinf;
        c.neginf += scan.n_neginf;
        c.batches += views.len() as u64;
    };
    match state {
        None => {
            let histogram = match kind {
                Kind::Value => Histogram::Value(D::first(views, &scan, n_bins)?),
                Kind::Abs => Histogram::Abs(D::first(views, &scan, n_bins)?),
            };
            let mut counts = Counts::default();
            add_counts(&mut counts);
            Ok(Some(TensorState { dtype: D::NAME, histogram, counts }))
        }
        Some(st) => {
            if st.dtype != D::NAME {
                return Err(CollectError::DtypeChanged { before: st.dtype, now: D::NAME });
            }
            match &mut st.histogram {
                Histogram::Value(h) => D::merge(h, views, &scan)?,
                Histogram::Abs(h) => D::merge(h, views, &scan)?,
            }
            add_counts(&mut st.counts);
            Ok(None)
        }
    }
}

/// Collect one tensor's batches into `state` (created on the first call).
/// On error the state is unchanged.
pub fn collect(state: &mut Option<TensorState>, kind: Kind, batches: &Batches, n_bins: usize) -> Result<(), CollectError> {
    let created = match batches {
        Batches::F16(v) => step(state.as_mut(), kind, v, n_bins)?,
        Batches::F32(v) => step(state.as_mut(), kind, v, n_bins)?,
        Batches::F64(v) => step(state.as_mut(), kind, v, n_bins)?,
    };
    if let Some(s) = created {
        *state = Some(s);
    }
    Ok(())
}
