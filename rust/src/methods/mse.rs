//! The mse method: the range with the least quantization error ([`crate::methods::qerror`]) among a
//! fixed grid of candidates, the first in grid order on ties.
//!
//! With `lo = min(min, 0)`, `hi = max(max, 0)`, `a = max(|lo|, |hi|)`: symmetric candidates
//! are `(-t, t)`, `t = a k / 1024` for k = 1..=1024; asymmetric ones `(lo i / 128, hi j / 128)`
//! for i = 0..=128 (outer), j = 0..=128 (inner), without the range (0, 0), and only i = 0
//! when lo == 0, only j = 0 when hi == 0.
//!
//! The result is the one evaluating every candidate gives, found with far fewer evaluations:
//! a coarse sub-grid first sets a good bound; then each row of the grid (fixed i, or the
//! symmetric t's) is walked from its widest candidate down, and stops at the first candidate
//! whose clipping error alone exceeds the bound, since narrower ones clip more; the other
//! candidates' error sums stop as soon as they exceed the bound.
//!
//! Cost: at most the 129 x 129 candidates, each at most linear in the number of levels (or of
//! bins, where there are fewer), so linear in the histogram; the search stops early when its
//! stop flag is set ([`crate::numeric::cancel`]).

use crate::methods::qerror::{ErrorTable, OrtScale, QType, ScaleRule};
use crate::numeric::cancel::{self, Cancelled};
use std::sync::atomic::AtomicBool;

const SYMMETRIC_STEPS: usize = 1024;
const SIDE_STEPS: usize = 128;
/// The coarse sub-grid: every PROBE_STRIDE-th candidate of each row and column.
const PROBE_STRIDE: usize = 8;

/// The mse range of `table`'s histogram: (0, 0) when it is empty or all its values are 0.
///
/// Errors follow ORT's scale `rule` for the range type. A candidate beyond the range type
/// (infinite error) never wins; when every one is (float64 data beyond float32), the result is
/// the whole range: `(-a, a)` or `(lo, hi)`. Stops with `Cancelled` once `stop` is set.
pub fn mse_range(
    table: &ErrorTable<'_>,
    qtype: QType,
    symmetric: bool,
    rule: ScaleRule,
    stop: &AtomicBool,
) -> Result<(f64, f64), Cancelled> {
    let h = table.hist();
    let (lo, hi) = (h.min.min(0.0), h.max.max(0.0));
    let a = lo.abs().max(hi.abs());
    if h.total == 0 || a == 0.0 {
        return Ok((0.0, 0.0));
    }
    if symmetric {
        let range = |_: usize, k: usize| {
            let t = a * (k + 1) as f64 / SYMMETRIC_STEPS as f64;
            Some((-t, t))
        };
        Ok(least_error(table, qtype, true, rule, (1, SYMMETRIC_STEPS), range, stop)?.unwrap_or((-a, a)))
    } else {
        let i_steps = if lo == 0.0 { 0 } else { SIDE_STEPS };
        let j_steps = if hi == 0.0 { 0 } else { SIDE_STEPS };
        let range = |i: usize, j: usize| {
            let r = (lo * i as f64 / SIDE_STEPS as f64, hi * j as f64 / SIDE_STEPS as f64);
            (r != (0.0, 0.0)).then_some(r)
        };
        Ok(least_error(table, qtype, false, rule, (i_steps + 1, j_steps + 1), range, stop)?.unwrap_or((lo, hi)))
    }
}

/// Bounds on the extreme levels `(qmin - zp) S` and `(qmax - zp) S` of ORT's parameters for
/// a range (`S` the stored scale, `s` the float64 one), or None where there are no such bounds
/// (a degenerate scale: the levels are those of scale 1, not near the range; or an infinite
/// one). The zero point is `qmin - rmin / s` rounded, or its symmetric equivalent, so the
/// levels lie within `S/2 + (qmax - qmin) |S - s|` of `rmin` and `rmax` (the range's float64
/// scale steps are `s`, its levels' are `S`), plus float64 rounding. The bounds never narrow
/// as the range widens (S and the rounding bound grow with it), which the row walk relies on.
fn extreme_level_bounds(p: &OrtScale, qtype: QType, symmetric: bool, rule: ScaleRule) -> Option<(f64, f64)> {
    let s = p.quantizer.scale;
    if p.degenerate || !s.is_finite() {
        return None;
    }
    let (qmin, qmax) = qtype.qmin_qmax(symmetric);
    let margin = s / 2.0 + (qmax - qmin) as f64 * rule.rounding_bound(s);
    let slack = (p.rmin.abs().max(p.rmax) + margin) * F64_SLACK;
    Some((p.rmin - margin - slack, p.rmax + margin + slack))
}

/// Relative float64 rounding allowed for in level bounds (a few hundred ulps).
const F64_SLACK: f64 = 1.0 / (1u64 << 44) as f64;

/// The candidate `range(row, col)` (None: not a candidate) with the least finite error, the
/// first in (row, col) order on ties. Within a row, a smaller col must mean a range inside
/// the larger col's range on both sides (so that its clipping error is at least as large).
///
/// Each row is walked from its widest candidate down. Once a candidate's clipping error alone
/// exceeds the best error, the narrower ones clip more and lose too, except degenerate ones
/// (scale 1, whose levels are not near their range): those are the row's narrowest, and are
/// still evaluated.
fn least_error(
    table: &ErrorTable<'_>,
    qtype: QType,
    symmetric: bool,
    rule: ScaleRule,
    (rows, cols): (usize, usize),
    range: impl Fn(usize, usize) -> Option<(f64, f64)>,
    stop: &AtomicBool,
) -> Result<Option<(f64, f64)>, Cancelled> {
    let params =
        |at: (usize, usize)| range(at.0, at.1).map(|(low, high)| OrtScale::of(low, high, qtype, symmetric, rule));
    let offer = |best: &mut Option<(f64, (usize, usize))>, at: (usize, usize), p: &OrtScale| {
        let bound = best.map_or(f64::INFINITY, |(e, _)| e);
        let Some(e) = table.squared_error_sum(&p.quantizer, bound) else { return };
        if e.is_finite() && best.is_none_or(|(be, b_at)| e < be || (e == be && at < b_at)) {
            *best = Some((e, at));
        }
    };
    let mut best = None;
    for row in (0..rows).step_by(PROBE_STRIDE) {
        for col in (0..cols).step_by(PROBE_STRIDE) {
            cancel::check(stop)?;
            if let Some(p) = params((row, col)) {
                offer(&mut best, (row, col), &p);
            }
        }
    }
    for row in 0..rows {
        let mut clipped_at = None;
        for col in (0..cols).rev() {
            cancel::check(stop)?;
            let Some(p) = params((row, col)) else { continue };
            if let (Some((be, _)), Some((l, h))) = (best, extreme_level_bounds(&p, qtype, symmetric, rule)) {
                // with a margin for rounding, so that only clear losers are skipped
                if table.clipping_error_sum(l, h) * (1.0 - 1e-9) > be {
                    clipped_at = Some(col);
                    break;
                }
            }
            offer(&mut best, (row, col), &p);
        }
        // the degenerate candidates narrower than the clear loser, from the narrowest up
        for col in 0..clipped_at.unwrap_or(0) {
            let Some(p) = params((row, col)) else { continue };
            if !p.degenerate {
                break;
            }
            offer(&mut best, (row, col), &p);
        }
    }
    Ok(best.and_then(|(_, (row, col))| range(row, col)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::qerror::testing::*;
    use crate::methods::qerror::{Quantizer, UniformHistogram};

    const RULES: [ScaleRule; 3] = [ScaleRule::Float32, ScaleRule::Float16Normal, ScaleRule::Float16Subnormal];

    /// A stop flag that is never set.
    static GO: AtomicBool = AtomicBool::new(false);

    #[test]
    fn a_set_stop_flag_cancels_the_search() {
        let counts = [1u64, 5, 2, 0, 7];
        let h = UniformHistogram::new(&counts, -2.5, 1.0, -2.0, 2.0).unwrap();
        for symmetric in [false, true] {
            assert_eq!(
                mse_range(&ErrorTable::new(h), QType::Int8, symmetric, ScaleRule::Float32, &AtomicBool::new(true)),
                Err(Cancelled)
            );
            assert!(mse_range(&ErrorTable::new(h), QType::Int8, symmetric, ScaleRule::Float32, &GO).is_ok());
        }
    }

    /// The definition: every candidate's direct O(bins) error, the first minimum.
    fn brute_force(h: &UniformHistogram<'_>, qtype: QType, symmetric: bool, rule: ScaleRule) -> (f64, f64) {
        let (lo, hi) = (h.min.min(0.0), h.max.max(0.0));
        let a = lo.abs().max(hi.abs());
        if h.total == 0 || a == 0.0 {
            return (0.0, 0.0);
        }
        let mut candidates = vec![];
        if symmetric {
            for k in 1..=1024 {
                let t = a * k as f64 / 1024.0;
                candidates.push((-t, t));
            }
        } else {
            for i in 0..=if lo == 0.0 { 0 } else { 128 } {
                for j in 0..=if hi == 0.0 { 0 } else { 128 } {
                    let r = (lo * i as f64 / 128.0, hi * j as f64 / 128.0);
                    if r != (0.0, 0.0) {
                        candidates.push(r);
                    }
                }
            }
        }
        // every candidate beyond the range type: the whole range
        let mut best = (f64::INFINITY, if symmetric { (-a, a) } else { (lo, hi) });
        for r in candidates {
            let e = direct_error(h, &Quantizer::for_range(r.0, r.1, qtype, symmetric, rule));
            if e < best.0 {
                best = (e, r);
            }
        }
        best.1
    }

    /// Equal to the brute force, or (where two candidates' errors differ by rounding only)
    /// as good.
    fn check(h: &UniformHistogram<'_>, qtype: QType, symmetric: bool, rule: ScaleRule, what: &str) {
        let got = mse_range(&ErrorTable::new(*h), qtype, symmetric, rule, &GO).unwrap();
        let want = brute_force(h, qtype, symmetric, rule);
        if got != want {
            let e = |r: (f64, f64)| direct_error(h, &Quantizer::for_range(r.0, r.1, qtype, symmetric, rule));
            let (eg, ew) = (e(got), e(want));
            assert!(
                eg <= ew * (1.0 + 1e-9),
                "{what} {qtype:?} sym={symmetric} {rule:?}: got {got:?} ({eg:e}), want {want:?} ({ew:e})"
            );
        }
    }

    #[test]
    fn grid_search_equals_brute_force_on_edge_cases() {
        let mut rng = Rng(10);
        for (name, data) in edge_case_data(&mut rng) {
            let b = Binned::of(&data, 256);
            for qtype in [QType::Int8, QType::UInt8, QType::Int16, QType::UInt16] {
                for symmetric in [false, true] {
                    for rule in RULES {
                        check(&b.hist(), qtype, symmetric, rule, name);
                    }
                }
            }
        }
    }

    #[test]
    fn grid_search_equals_brute_force_on_random_histograms() {
        let mut rng = Rng(11);
        for case in 0..20 {
            let nb = 1 + rng.below(600) as usize;
            let counts: Vec<u64> = (0..nb).map(|_| if rng.below(3) == 0 { 0 } else { rng.below(500) }).collect();
            let width = 0.01 + rng.uniform();
            let left = -rng.uniform() * nb as f64 * width;
            let (min, max) = (left + 0.3 * width, left + (nb as f64 - 0.2) * width);
            let h = UniformHistogram::new(&counts, left, width, min, max).unwrap();
            for rule in RULES {
                check(&h, QType::Int8, false, rule, &format!("case {case}"));
                check(&h, QType::UInt8, true, rule, &format!("case {case}"));
            }
        }
    }

    #[test]
    fn trivial_histograms() {
        let counts = [0u64, 3, 0];
        // all values 0
        let h = UniformHistogram::new(&counts, -1.5, 1.0, 0.0, 0.0).unwrap();
        assert_eq!(mse_range(&ErrorTable::new(h), QType::Int8, false, ScaleRule::Float32, &GO).unwrap(), (0.0, 0.0));
        // empty
        let empty = [0u64; 3];
        let h = UniformHistogram::new(&empty, -1.5, 1.0, -1.0, 1.0).unwrap();
        assert_eq!(mse_range(&ErrorTable::new(h), QType::Int8, true, ScaleRule::Float32, &GO).unwrap(), (0.0, 0.0));
        // one positive value: asymmetric candidates (0, hi j / 128); j = 128 is exact
        let h = UniformHistogram::new(&counts, -1.5, 1.0, 0.25, 0.25).unwrap();
        assert_eq!(mse_range(&ErrorTable::new(h), QType::Int8, false, ScaleRule::Float32, &GO).unwrap(), (0.0, 0.25));
        // one negative value: candidates (lo i / 128, 0)
        let h = UniformHistogram::new(&counts, -1.5, 1.0, -0.25, -0.25).unwrap();
        assert_eq!(mse_range(&ErrorTable::new(h), QType::Int8, false, ScaleRule::Float32, &GO).unwrap(), (-0.25, 0.0));
    }

    #[test]
    fn scales_beyond_float32_fall_back_to_the_whole_range() {
        let counts = [1u64, 0, 0, 1];
        let h = UniformHistogram::new(&counts, -2e300, 1e300, -1.5e300, 1.5e300).unwrap();
        assert_eq!(
            mse_range(&ErrorTable::new(h), QType::Int8, false, ScaleRule::Float32, &GO).unwrap(),
            (-1.5e300, 1.5e300)
        );
        assert_eq!(
            mse_range(&ErrorTable::new(h), QType::Int8, true, ScaleRule::Float32, &GO).unwrap(),
            (-1.5e300, 1.5e300)
        );
    }

    #[test]
    fn degenerate_candidates_narrower_than_a_clear_loser_still_count() {
        // Integer data and one tiny negative value, float16 under ORT 1.31: candidates
        // (lo i / 128, 0) have a scale below 2^-14, so ORT quantizes with scale 1, which
        // represents the integers exactly. They come last in their rows, after candidates
        // whose clipping error alone already loses.
        // bins centred on -1 (standing for the minimum, -0.001), 0, 1, ..., 100
        let counts = vec![1u64; 102];
        let h = UniformHistogram::new(&counts, -1.5, 1.0, -0.001, 100.0).unwrap();
        let got = mse_range(&ErrorTable::new(h), QType::Int8, false, ScaleRule::Float16Normal, &GO).unwrap();
        assert_eq!(got, brute_force(&h, QType::Int8, false, ScaleRule::Float16Normal));
        assert!(OrtScale::of(got.0, got.1, QType::Int8, false, ScaleRule::Float16Normal).degenerate, "{got:?}");
        // ORT 1.32 keeps those scales (subnormal float16): no degenerate candidate wins
        let got = mse_range(&ErrorTable::new(h), QType::Int8, false, ScaleRule::Float16Subnormal, &GO).unwrap();
        assert_eq!(got, brute_force(&h, QType::Int8, false, ScaleRule::Float16Subnormal));
        assert!(!OrtScale::of(got.0, got.1, QType::Int8, false, ScaleRule::Float16Subnormal).degenerate, "{got:?}");
    }
}
