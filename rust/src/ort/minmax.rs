//! The reductions ORT's `MinMaxCalibrater` applies to per-batch minima and maxima.
//!
//! ORT computes each batch's min/max with ReduceMin/ReduceMax, stacks them and takes
//! `nanmin`/`nanmax` or, with `moving_average`, `nanmean` — whose summation order differs
//! between the per-tensor `(B, 1)` case (pairwise) and the per-channel `(B, C)` case
//! (sequential down each column). Across `collect_data` calls it merges with an EMA in `T`.

use crate::numeric::float::Float;
use crate::numeric::pairwise::{sum_f32_by, sum_f64_by};

/// `np.nanmean` over a contiguous run of per-batch values (the per-tensor `(B, 1)` case):
/// NaN -> 0, numpy pairwise sum (f32 accumulator for f16/f32, f64 for f64) rounded to `T`,
/// then `T(f64(sum) / count)`. NaN when every value is NaN (or there are none).
pub fn nanmean_pairwise<T: Float>(values: &[T]) -> T {
    let count = values.iter().filter(|v| !v.is_nan()).count();
    let clean = |i: usize| if values[i].is_nan() { T::ZERO } else { values[i] };
    let sum: T = if T::NAME == "float64" {
        T::from_f64(sum_f64_by(values.len(), |i| clean(i).to_f64()))
    } else {
        T::from_f32(sum_f32_by(values.len(), |i| clean(i).to_f32()))
    };
    T::from_f64(sum.to_f64() / count as f64)
}

/// `np.nanmean(axis=0)` of one column of a `(B, C)` stack: sequential sum rounded to `T`.
pub fn nanmean_sequential<T: Float>(values: &[T]) -> T {
    let mut count = 0usize;
    let mut sum = T::ZERO;
    for &v in values {
        if !v.is_nan() {
            sum = sum.add(v);
            count += 1;
        }
    }
    T::from_f64(sum.to_f64() / count as f64)
}

/// ORT's `merge_range` with `moving_average`: `old + T(c) * (new - old)` in `T`.
pub fn moving_average<T: Float>(old: T, new: T, averaging_constant: f64) -> T {
    old.add(T::from_f64(averaging_constant).mul(new.sub(old)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ema_is_rounded_in_the_element_type() {
        // ORT's moving average across calls is computed in the element type:
        // 2 + f32(0.1) * 13 = 3.3000002 in f32.
        assert_eq!(moving_average(2.0f32, 15.0, 0.1), 3.3000002f32);
    }

    #[test]
    fn nanmean_ignores_nan() {
        assert_eq!(nanmean_pairwise(&[1.0f32, f32::NAN, 3.0]), 2.0);
        assert_eq!(nanmean_sequential(&[1.0f32, f32::NAN, 3.0]), 2.0);
        assert!(nanmean_pairwise::<f32>(&[f32::NAN]).is_nan());
    }
}
