//! Power-of-two scales (Quark style): zero point 0, scale `2^k`, range `(qmin 2^k, qmax 2^k)`,
//! which ORT's asymmetric scale rule maps back to exactly scale `2^k` and zero point 0 for the
//! exponents of [`exponent_bounds`] (those of a normal scale in range in float32; float16
//! ranges hold fewer, and ORT 1.31 and 1.32 differ on the smallest).
//!
//! - NonOverflow: the smallest k whose range holds `[min, max]`, clamped to the bounds.
//! - MinMSE, mode All: the k in `[k0 - 30, k0]` (k0 the NonOverflow k) within the bounds with
//!   the least error `E(k)` on the whole histogram, the larger k on ties (larger scales only
//!   add rounding error, so none is searched).
//! - MinMSE, mode MostCommon: each batch votes for its own MinMSE-All k (within float64's
//!   exponents: a batch does not know the range type's bounds); each vote is clamped to the
//!   bounds, then the most votes win, the larger k on ties.
//!
//! k is limited to the exponents of float64 (2^k from 2^-1074 to 2^1023), and MinMSE's k to
//! [`max_exponent`] of the tensor's type: a range the type cannot hold (e.g. int8 at scale
//! 2^121 is +-2^128, past float32) cannot reach ORT, which reads ranges in that type. A
//! NonOverflow k beyond it has no such range at all (the caller reports it).

use crate::methods::qerror::{ErrorTable, QType, Quantizer, ScaleRule, UniformHistogram};
use std::sync::OnceLock;

/// The integer types power-of-two scales are computed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pow2Type {
    Int8,
    UInt8,
    Int16,
}

impl Pow2Type {
    /// The types [`batch_votes`] votes for, in its order.
    pub const ALL: [Pow2Type; 3] = [Pow2Type::Int8, Pow2Type::UInt8, Pow2Type::Int16];
    pub const NAMES: &'static str = "'int8', 'uint8', 'int16'";

    pub fn parse(name: &str) -> Option<Pow2Type> {
        match name {
            "int8" => Some(Pow2Type::Int8),
            "uint8" => Some(Pow2Type::UInt8),
            "int16" => Some(Pow2Type::Int16),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pow2Type::Int8 => "int8",
            Pow2Type::UInt8 => "uint8",
            Pow2Type::Int16 => "int16",
        }
    }

    pub fn qtype(self) -> QType {
        match self {
            Pow2Type::Int8 => QType::Int8,
            Pow2Type::UInt8 => QType::UInt8,
            Pow2Type::Int16 => QType::Int16,
        }
    }

    /// The full (not symmetric) integer range.
    pub fn qmin_qmax(self) -> (f64, f64) {
        match self {
            Pow2Type::Int8 => (-128.0, 127.0),
            Pow2Type::UInt8 => (0.0, 255.0),
            Pow2Type::Int16 => (-32768.0, 32767.0),
        }
    }
}

/// Largest power-of-two search window below the NonOverflow exponent.
const MIN_MSE_WINDOW: i32 = 30;
pub const MIN_EXPONENT: i32 = -1074;
pub const MAX_EXPONENT: i32 = 1023;

/// `2^k` exactly, for k in `MIN_EXPONENT..=MAX_EXPONENT`.
pub fn pow2(k: i32) -> f64 {
    assert!((MIN_EXPONENT..=MAX_EXPONENT).contains(&k), "2^{k} is not a float64");
    if k >= -1022 {
        f64::from_bits(((k + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (k - MIN_EXPONENT))
    }
}

/// The quantizer of scale `2^k`, zero point 0.
pub fn quantizer(k: i32, t: Pow2Type) -> Quantizer {
    let (qmin, qmax) = t.qmin_qmax();
    Quantizer { scale: pow2(k), zero_point: 0.0, qmin, qmax }
}

/// The range `(qmin 2^k, qmax 2^k)`.
pub fn range(k: i32, t: Pow2Type) -> (f64, f64) {
    let (qmin, qmax) = t.qmin_qmax();
    let s = pow2(k);
    (qmin * s, qmax * s)
}

/// The largest k whose range `(qmin 2^k, qmax 2^k)` a type with largest finite value `largest`
/// holds (float32: 120 for int8 and uint8, 112 for int16).
pub fn max_exponent(t: Pow2Type, largest: f64) -> i32 {
    let (qmin, qmax) = t.qmin_qmax();
    let q = qmin.abs().max(qmax);
    let mut k = MAX_EXPONENT;
    while k > MIN_EXPONENT && !(q * pow2(k) <= largest) {
        k -= 1;
    }
    k
}

/// Whether ORT's asymmetric rule maps the range of 2^k back to scale 2^k and zero point 0.
pub fn maps_back(k: i32, t: Pow2Type, rule: ScaleRule) -> bool {
    let (low, high) = range(k, t);
    let q = Quantizer::for_range(low, high, t.qtype(), false, rule);
    (q.scale, q.zero_point) == (pow2(k), 0.0)
}

/// The smallest and largest k that [`maps_back`]. Every k between them does too.
pub fn exponent_bounds(t: Pow2Type, rule: ScaleRule) -> (i32, i32) {
    const RULES: [ScaleRule; 3] = [ScaleRule::Float32, ScaleRule::Float16Normal, ScaleRule::Float16Subnormal];
    // a few thousand evaluations per pair: found once
    static BOUNDS: OnceLock<[[(i32, i32); 3]; 3]> = OnceLock::new();
    let table = BOUNDS.get_or_init(|| {
        RULES.map(|rule| {
            Pow2Type::ALL.map(|t| {
                let lo = (MIN_EXPONENT..=MAX_EXPONENT).find(|&k| maps_back(k, t, rule)).expect("2^0 maps back");
                let hi = (MIN_EXPONENT..=MAX_EXPONENT).rev().find(|&k| maps_back(k, t, rule)).expect("2^0 maps back");
                (lo, hi)
            })
        })
    });
    let r = RULES.iter().position(|&x| x == rule).expect("every rule");
    let i = Pow2Type::ALL.iter().position(|&x| x == t).expect("every type");
    table[r][i]
}

/// The smallest k with `max <= qmax 2^k` and `min >= qmin 2^k` (uint8: the max condition
/// only, negative values clip to 0 anyway); None when there is nothing to hold: no data, all
/// values 0, or (uint8) no positive value. Clamped to float64's exponents.
pub fn non_overflow_exponent(hist: &UniformHistogram<'_>, t: Pow2Type) -> Option<i32> {
    let (min, max) = (hist.min, hist.max);
    if hist.total == 0 || min.abs().max(max.abs()) == 0.0 || (t == Pow2Type::UInt8 && max <= 0.0) {
        return None;
    }
    let (qmin, qmax) = t.qmin_qmax();
    // q 2^k is exact for |q| <= 2^15 wherever it does not overflow
    let holds = |k: i32| {
        let s = pow2(k);
        max <= qmax * s && (t == Pow2Type::UInt8 || min >= qmin * s)
    };
    let need = (max / qmax).max(if t == Pow2Type::UInt8 { 0.0 } else { min / qmin });
    let mut k = (need.log2().ceil() as i32).clamp(MIN_EXPONENT, MAX_EXPONENT);
    while k > MIN_EXPONENT && holds(k - 1) {
        k -= 1;
    }
    while k < MAX_EXPONENT && !holds(k) {
        k += 1;
    }
    Some(k)
}

/// Errors closer than this (relative) count as equal: the sums round at about 1e-15 per term.
const TIE_TOLERANCE: f64 = 1e-12;

/// `E(k)`: the mean squared error of scale `2^k`, zero point 0.
pub fn error(table: &ErrorTable<'_>, k: i32, t: Pow2Type) -> f64 {
    table.mean_squared_error(&quantizer(k, t))
}

/// The MinMSE exponent on the whole histogram (mode All), within `(lo, hi)`.
pub fn min_mse_exponent(table: &ErrorTable<'_>, t: Pow2Type, (lo, hi): (i32, i32)) -> Option<i32> {
    let k0 = non_overflow_exponent(table.hist(), t)?.clamp(lo, hi);
    let mut best = (f64::INFINITY, k0);
    // From the top, replacing only on a clearly smaller error: the larger k wins ties, also
    // exact ties that rounding in the error sums would break either way.
    for k in ((k0 - MIN_MSE_WINDOW).max(lo)..=k0).rev() {
        if let Some(e) = table.squared_error_sum(&quantizer(k, t), best.0) {
            if e < best.0 * (1.0 - TIE_TOLERANCE) {
                best = (e, k);
            }
        }
    }
    Some(best.1)
}

/// The exponent with the most votes (`(exponent, count)` pairs, repeats add up; each exponent
/// clamped to `(lo, hi)` first), the larger on ties; None without votes.
pub fn most_common(votes: &[(i32, u64)], (lo, hi): (i32, i32)) -> Option<i32> {
    let mut totals: Vec<(i32, u128)> = Vec::new();
    for &(k, n) in votes {
        let k = k.clamp(lo, hi);
        match totals.iter_mut().find(|(e, _)| *e == k) {
            Some((_, total)) => *total += n as u128,
            None => totals.push((k, n as u128)),
        }
    }
    totals.into_iter().filter(|&(_, n)| n > 0).max_by_key(|&(k, n)| (n, k)).map(|(k, _)| k)
}

/// Every float64 exponent.
pub const ALL_EXPONENTS: (i32, i32) = (MIN_EXPONENT, MAX_EXPONENT);

/// One batch's votes for MostCommon: its MinMSE-All exponent for each of [`Pow2Type::ALL`]
/// (None where it has nothing to vote on), among [`ALL_EXPONENTS`] up to the largest whose
/// range the data's type (largest finite value `largest`) holds. One error table serves all
/// three types.
pub fn batch_votes(hist: UniformHistogram<'_>, largest: f64) -> [Option<i32>; 3] {
    let table = ErrorTable::new(hist);
    Pow2Type::ALL.map(|t| min_mse_exponent(&table, t, (ALL_EXPONENTS.0, ALL_EXPONENTS.1.min(max_exponent(t, largest)))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::qerror::testing::*;

    #[test]
    fn pow2_is_exact_down_to_subnormals() {
        assert_eq!(pow2(0), 1.0);
        assert_eq!(pow2(-1), 0.5);
        assert_eq!(pow2(10), 1024.0);
        assert_eq!(pow2(1023), 2f64.powi(1023));
        assert_eq!(pow2(-1022), f64::MIN_POSITIVE);
        assert_eq!(pow2(-1074), f64::from_bits(1));
        assert_eq!(pow2(-1030) * 2f64.powi(56), 2f64.powi(-974));
    }

    const RULES: [ScaleRule; 3] = [ScaleRule::Float32, ScaleRule::Float16Normal, ScaleRule::Float16Subnormal];

    #[test]
    fn ort_maps_the_range_back_to_the_scale() {
        for t in Pow2Type::ALL {
            for k in [-20, -3, 0, 5] {
                assert!(maps_back(k, t, ScaleRule::Float32), "{t:?} {k}");
            }
        }
    }

    #[test]
    fn exponent_bounds_are_an_interval_of_orts_scales() {
        // float32: normal scales, ranges below float32's overflow
        assert_eq!(exponent_bounds(Pow2Type::Int8, ScaleRule::Float32), (-126, 120));
        assert_eq!(exponent_bounds(Pow2Type::UInt8, ScaleRule::Float32), (-126, 120));
        assert_eq!(exponent_bounds(Pow2Type::Int16, ScaleRule::Float32), (-126, 112));
        // float16: ORT 1.31 keeps normal scales only (2^-14), 1.32 subnormal ones (2^-24);
        // -128 2^8 = -32768 is the last range in float16 (2^9 128 overflows)
        assert_eq!(exponent_bounds(Pow2Type::Int8, ScaleRule::Float16Normal), (-14, 8));
        assert_eq!(exponent_bounds(Pow2Type::Int8, ScaleRule::Float16Subnormal), (-24, 8));
        assert_eq!(exponent_bounds(Pow2Type::UInt8, ScaleRule::Float16Subnormal), (-24, 8));
        // int16's 32767 2^k rounds up to 2^(k+15) in float16, which still maps back
        assert_eq!(exponent_bounds(Pow2Type::Int16, ScaleRule::Float16Subnormal), (-24, 0));
        for t in Pow2Type::ALL {
            for rule in RULES {
                let (lo, hi) = exponent_bounds(t, rule);
                assert!((lo..=hi).all(|k| maps_back(k, t, rule)), "{t:?} {rule:?}");
            }
        }
    }

    #[test]
    fn non_overflow_is_the_smallest_holding_exponent() {
        let counts = [1u64, 1];
        let h = |min: f64, max: f64| UniformHistogram::new(&counts, -1e3, 1e3, min, max).unwrap();
        // 127 * 2^-6 = 1.98 holds 1.0; 127 * 2^-7 = 0.99 does not
        assert_eq!(non_overflow_exponent(&h(-0.5, 1.0), Pow2Type::Int8), Some(-6));
        // exactly on the limit: 127 * 2^-7 holds itself
        assert_eq!(non_overflow_exponent(&h(0.0, 127.0 / 128.0), Pow2Type::Int8), Some(-7));
        // the negative side: -128 * 2^-7 = -1 holds -1 exactly
        assert_eq!(non_overflow_exponent(&h(-1.0, 0.1), Pow2Type::Int8), Some(-7));
        assert_eq!(non_overflow_exponent(&h(-1.0, 0.1), Pow2Type::UInt8), Some(-11));
        assert_eq!(non_overflow_exponent(&h(-1.0, -0.1), Pow2Type::UInt8), None);
        assert_eq!(non_overflow_exponent(&h(-1.0, -0.1), Pow2Type::Int16), Some(-15));
        assert_eq!(non_overflow_exponent(&h(0.0, 0.0), Pow2Type::Int8), None);
        assert_eq!(non_overflow_exponent(&h(-3e300, 1e-300), Pow2Type::Int8), Some(992));
        assert_eq!(non_overflow_exponent(&h(0.0, f64::from_bits(1)), Pow2Type::Int8), Some(MIN_EXPONENT));
        let empty = [0u64; 2];
        let h0 = UniformHistogram::new(&empty, -1.0, 1.0, -1.0, 1.0).unwrap();
        assert_eq!(non_overflow_exponent(&h0, Pow2Type::Int8), None);
    }

    /// The definition: every k of the window, E(k) summed bin by bin, the larger k on ties.
    fn brute_force_min_mse(h: &UniformHistogram<'_>, t: Pow2Type, (lo, hi): (i32, i32)) -> Option<i32> {
        let k0 = non_overflow_exponent(h, t)?.clamp(lo, hi);
        let mut best = (f64::INFINITY, k0);
        for k in ((k0 - 30).max(lo)..=k0).rev() {
            let e = direct_error(h, &quantizer(k, t));
            if e < best.0 {
                best = (e, k);
            }
        }
        Some(best.1)
    }

    #[test]
    fn min_mse_equals_brute_force_on_edge_cases() {
        let mut rng = Rng(20);
        for (name, data) in edge_case_data(&mut rng) {
            for half in [16, 2048] {
                let b = Binned::of(&data, half);
                let h = b.hist();
                let votes = batch_votes(h, f64::MAX);
                for (i, t) in Pow2Type::ALL.into_iter().enumerate() {
                    for bounds in [
                        ALL_EXPONENTS,
                        exponent_bounds(t, ScaleRule::Float32),
                        exponent_bounds(t, ScaleRule::Float16Normal),
                    ] {
                        let got = min_mse_exponent(&ErrorTable::new(h), t, bounds);
                        let want = brute_force_min_mse(&h, t, bounds);
                        if got != want {
                            let e = |k: Option<i32>| direct_error(&h, &quantizer(k.unwrap(), t));
                            assert!(
                                e(got) <= e(want) * (1.0 + 1e-9),
                                "{name} {t:?} {bounds:?}: got {got:?}, want {want:?}"
                            );
                        }
                    }
                    let got = min_mse_exponent(&ErrorTable::new(h), t, ALL_EXPONENTS);
                    assert_eq!(votes[i], got, "{name} {t:?}");
                    if let Some(k) = got {
                        let direct = direct_error(&h, &quantizer(k, t));
                        let fast = error(&ErrorTable::new(h), k, t);
                        assert!((fast - direct).abs() <= 1e-10 * direct, "{name} {t:?} E({k}): {fast} vs {direct}");
                    }
                }
            }
        }
    }

    #[test]
    fn smaller_scales_that_clip_lose() {
        // multiples of 2^-3 in [-2.5, 1.875]: the NonOverflow k = -5 already rounds every bin
        // to its value; every smaller k clips -2.5
        let data: Vec<f64> = (-20..=15).map(|i| i as f64 / 8.0).collect();
        let b = Binned::of(&data, 4096);
        let t = ErrorTable::new(b.hist());
        assert_eq!(non_overflow_exponent(t.hist(), Pow2Type::Int8), Some(-5));
        assert_eq!(min_mse_exponent(&t, Pow2Type::Int8, ALL_EXPONENTS), Some(-5));
        // under bounds that exclude it, the nearest exponent inside
        assert_eq!(min_mse_exponent(&t, Pow2Type::Int8, (-3, 10)), Some(-3));
        assert_eq!(min_mse_exponent(&t, Pow2Type::Int8, (-40, -8)), Some(-8));
        assert_eq!(range(-5, Pow2Type::Int8), (-4.0, 127.0 / 32.0));
    }

    #[test]
    fn most_common_counts_votes_and_prefers_larger_exponents() {
        let all = ALL_EXPONENTS;
        assert_eq!(most_common(&[], all), None);
        assert_eq!(most_common(&[(3, 0)], all), None);
        assert_eq!(most_common(&[(-5, 2), (-4, 1), (-4, 1)], all), Some(-4));
        assert_eq!(most_common(&[(-5, 3), (-4, 1), (-4, 1)], all), Some(-5));
        assert_eq!(most_common(&[(-5, u64::MAX), (-6, u64::MAX), (-6, 1)], all), Some(-6));
        // votes are clamped before they are counted
        assert_eq!(most_common(&[(-20, 2), (-16, 1), (-5, 2)], (-14, 8)), Some(-14));
        assert_eq!(most_common(&[(-20, 2), (-16, 1), (-5, 2)], (-16, 8)), Some(-16));
    }

    #[test]
    fn scales_stop_where_the_type_cannot_hold_the_range() {
        use half::f16;
        for (largest, t, k) in [
            (f32::MAX as f64, Pow2Type::Int8, 120),
            (f32::MAX as f64, Pow2Type::UInt8, 120),
            (f32::MAX as f64, Pow2Type::Int16, 112),
            (65504.0, Pow2Type::Int8, 8),
            (65504.0, Pow2Type::Int16, 0),
            (f64::MAX, Pow2Type::Int8, 1016),
        ] {
            assert_eq!(max_exponent(t, largest), k, "{largest} {t:?}");
            let (lo, hi) = range(k, t);
            let (lo1, hi1) = range(k + 1, t);
            if largest == f32::MAX as f64 {
                assert!((lo as f32).is_finite() && (hi as f32).is_finite());
                assert!(!((lo1 as f32).is_finite() && (hi1 as f32).is_finite()));
            } else if largest == 65504.0 {
                assert!(f16::from_f64(lo).is_finite() && f16::from_f64(hi).is_finite());
                assert!(!(f16::from_f64(lo1).is_finite() && f16::from_f64(hi1).is_finite()));
            }
        }
        // float32 data up to its largest value: NonOverflow needs 2^122, MinMSE stays at <= 2^120
        let counts = [5u64, 5];
        let h = UniformHistogram::new(&counts, -f32::MAX as f64, f32::MAX as f64, f32::MIN as f64, f32::MAX as f64)
            .unwrap();
        assert_eq!(non_overflow_exponent(&h, Pow2Type::Int8), Some(122));
        assert_eq!(min_mse_exponent(&ErrorTable::new(h), Pow2Type::Int8, (MIN_EXPONENT, 120)), Some(120));
        assert_eq!(batch_votes(h, f32::MAX as f64), [Some(120), Some(120), Some(112)]);
    }
}
