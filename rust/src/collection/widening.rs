//! The arithmetic types a histogram is held in, and the widening chain between them: a histogram
//! starts in its data's own type (f16, f32 or f64), exactly as ORT computes it, and where numpy
//! would raise instead (f16 "Too many bins", non-finite growth ranges, f32 subnormal ranges) it
//! is widened exactly (f16 -> f32 -> f64: every value of a narrower type is one of the wider) and
//! that step is redone in the wider type ([`Chain`]). [`Family`] is ORT's value or |x|
//! histogram, generic over the type; [`Typed`] one histogram in whichever type it reached.

use crate::numeric::float::{Float, Widen};
use crate::numeric::scan::Scan;
use crate::numeric::view::View;
use crate::ort::abs_histogram::AbsHistogram;
use crate::ort::binning::Binning;
use crate::ort::histogram::HistError;
use crate::ort::value_histogram::ValueHistogram;
use half::f16;

/// A histogram family (ORT's value or |x| histogram), generic over its arithmetic type.
pub trait Family {
    type H<E: Float>: Clone + std::fmt::Debug + PartialEq;
    fn first<E: Float, D: Float + Widen<E>>(
        scan: &Scan<D>,
        n_bins: usize,
    ) -> Result<(Self::H<E>, Binning<E>), HistError>;
    /// Must leave `h` unchanged on error.
    fn merge<E: Float, D: Float + Widen<E>>(h: &mut Self::H<E>, scan: &Scan<D>) -> Result<Binning<E>, HistError>;
    fn widen<E: Float, F: Float>(h: &Self::H<E>) -> Self::H<F>;
    fn hist_mut<E: Float>(h: &mut Self::H<E>) -> &mut [i64];
}

/// A [`Family`] marker for one of ORT's histogram types: both delegate to the histogram's own
/// `first`, `merge` and `widen` (so each family's arithmetic is its histogram's, see `crate::ort`).
macro_rules! family {
    ($(#[$doc:meta])* $family:ident => $hist:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $family;

        impl Family for $family {
            type H<E: Float> = $hist<E>;
            fn first<E: Float, D: Float + Widen<E>>(
                s: &Scan<D>,
                n: usize,
            ) -> Result<(Self::H<E>, Binning<E>), HistError> {
                $hist::first(s, n)
            }
            fn merge<E: Float, D: Float + Widen<E>>(h: &mut Self::H<E>, s: &Scan<D>) -> Result<Binning<E>, HistError> {
                h.merge(s)
            }
            fn widen<E: Float, F: Float>(h: &Self::H<E>) -> Self::H<F> {
                h.widen()
            }
            fn hist_mut<E: Float>(h: &mut Self::H<E>) -> &mut [i64] {
                &mut h.hist
            }
        }
    };
}

family!(
    /// ORT's `collect_value` histogram (Entropy, Distribution, non-symmetric Percentile).
    ValueFamily => ValueHistogram
);
family!(
    /// ORT's `collect_absolute_value` histogram of |x| (symmetric Percentile).
    AbsFamily => AbsHistogram
);

/// A histogram in one of the three arithmetic types.
#[derive(Clone, Debug, PartialEq)]
pub enum Typed<Fm: Family> {
    F16(Fm::H<f16>),
    F32(Fm::H<f32>),
    F64(Fm::H<f64>),
}

/// The binning of the collect in progress, in the histogram's arithmetic type.
#[derive(Clone, Debug, Default)]
pub enum TypedBinning {
    #[default]
    Nothing,
    F16(Binning<f16>),
    F32(Binning<f32>),
    F64(Binning<f64>),
}

/// The widening chain each data type starts from: f16 -> f32 -> f64, f32 -> f64, f64.
/// Planning (creating or growing the histogram) may fail in a narrow type and is then redone
/// in the next; counting uses whatever type planning ended in. A merge that fails in every
/// type leaves the histogram unchanged, its type included.
pub trait Chain: Float {
    fn first<Fm: Family>(scan: &Scan<Self>, n_bins: usize) -> Result<(Typed<Fm>, TypedBinning), HistError>;
    fn merge<Fm: Family>(h: &mut Typed<Fm>, scan: &Scan<Self>) -> Result<TypedBinning, HistError>;
    fn count<Fm: Family>(h: &mut Typed<Fm>, b: &TypedBinning, view: &View<'_, Self>);
}

/// The last resort of a merge refused in a narrower type: `wide`, the histogram in float64,
/// replaces `h` only if the merge succeeds there, so a refused merge leaves `h` as it was.
fn merge_in_f64<Fm: Family, D: Float + Widen<f64>>(
    h: &mut Typed<Fm>,
    mut wide: Fm::H<f64>,
    s: &Scan<D>,
) -> Result<TypedBinning, HistError> {
    let b = Fm::merge(&mut wide, s)?;
    *h = Typed::F64(wide);
    Ok(TypedBinning::F64(b))
}

fn mismatch() -> ! {
    unreachable!("a histogram is counted in the arithmetic type it was planned in")
}

impl Chain for f16 {
    fn first<Fm: Family>(s: &Scan<f16>, n: usize) -> Result<(Typed<Fm>, TypedBinning), HistError> {
        Fm::first::<f16, f16>(s, n)
            .map(|(h, b)| (Typed::F16(h), TypedBinning::F16(b)))
            .or_else(|_| Fm::first::<f32, f16>(s, n).map(|(h, b)| (Typed::F32(h), TypedBinning::F32(b))))
            .or_else(|_| Fm::first::<f64, f16>(s, n).map(|(h, b)| (Typed::F64(h), TypedBinning::F64(b))))
    }
    fn merge<Fm: Family>(h: &mut Typed<Fm>, s: &Scan<f16>) -> Result<TypedBinning, HistError> {
        match h {
            Typed::F16(x) => {
                if let Ok(b) = Fm::merge(x, s) {
                    return Ok(TypedBinning::F16(b));
                }
                let mut wide = Fm::widen(x);
                if let Ok(b) = Fm::merge(&mut wide, s) {
                    *h = Typed::F32(wide);
                    return Ok(TypedBinning::F32(b));
                }
                let wider = Fm::widen(&wide);
                drop(wide);
                merge_in_f64(h, wider, s)
            }
            Typed::F32(x) => match Fm::merge(x, s) {
                Ok(b) => Ok(TypedBinning::F32(b)),
                Err(_) => {
                    let wide = Fm::widen(x);
                    merge_in_f64(h, wide, s)
                }
            },
            Typed::F64(x) => Fm::merge(x, s).map(TypedBinning::F64),
        }
    }
    fn count<Fm: Family>(h: &mut Typed<Fm>, b: &TypedBinning, v: &View<'_, f16>) {
        match (h, b) {
            (_, TypedBinning::Nothing) => {}
            (Typed::F16(x), TypedBinning::F16(b)) => b.count(v, Fm::hist_mut(x)),
            (Typed::F32(x), TypedBinning::F32(b)) => b.count(v, Fm::hist_mut(x)),
            (Typed::F64(x), TypedBinning::F64(b)) => b.count(v, Fm::hist_mut(x)),
            _ => mismatch(),
        }
    }
}

impl Chain for f32 {
    fn first<Fm: Family>(s: &Scan<f32>, n: usize) -> Result<(Typed<Fm>, TypedBinning), HistError> {
        Fm::first::<f32, f32>(s, n)
            .map(|(h, b)| (Typed::F32(h), TypedBinning::F32(b)))
            .or_else(|_| Fm::first::<f64, f32>(s, n).map(|(h, b)| (Typed::F64(h), TypedBinning::F64(b))))
    }
    fn merge<Fm: Family>(h: &mut Typed<Fm>, s: &Scan<f32>) -> Result<TypedBinning, HistError> {
        match h {
            Typed::F32(x) => match Fm::merge(x, s) {
                Ok(b) => Ok(TypedBinning::F32(b)),
                Err(_) => {
                    let wide = Fm::widen(x);
                    merge_in_f64(h, wide, s)
                }
            },
            Typed::F64(x) => Fm::merge(x, s).map(TypedBinning::F64),
            Typed::F16(_) => unreachable!("float32 data never has a float16 histogram"),
        }
    }
    fn count<Fm: Family>(h: &mut Typed<Fm>, b: &TypedBinning, v: &View<'_, f32>) {
        match (h, b) {
            (_, TypedBinning::Nothing) => {}
            (Typed::F32(x), TypedBinning::F32(b)) => b.count(v, Fm::hist_mut(x)),
            (Typed::F64(x), TypedBinning::F64(b)) => b.count(v, Fm::hist_mut(x)),
            _ => mismatch(),
        }
    }
}

impl Chain for f64 {
    fn first<Fm: Family>(s: &Scan<f64>, n: usize) -> Result<(Typed<Fm>, TypedBinning), HistError> {
        Fm::first::<f64, f64>(s, n).map(|(h, b)| (Typed::F64(h), TypedBinning::F64(b)))
    }
    fn merge<Fm: Family>(h: &mut Typed<Fm>, s: &Scan<f64>) -> Result<TypedBinning, HistError> {
        match h {
            Typed::F64(x) => Fm::merge(x, s).map(TypedBinning::F64),
            _ => unreachable!("float64 data only ever has a float64 histogram"),
        }
    }
    fn count<Fm: Family>(h: &mut Typed<Fm>, b: &TypedBinning, v: &View<'_, f64>) {
        match (h, b) {
            (_, TypedBinning::Nothing) => {}
            (Typed::F64(x), TypedBinning::F64(b)) => b.count(v, Fm::hist_mut(x)),
            _ => mismatch(),
        }
    }
}
