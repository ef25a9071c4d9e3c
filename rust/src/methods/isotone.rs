//! isotone: the order-preserving scale of PPQ's isotone observer, from an exact summary of each
//! row's two largest values.
//!
//! **Rows.** The last axis of a tensor is its class axis; every position of the other axes is one
//! row (a tensor of rank 0 or 1 is one row). A row's summary is its largest value `l1` and its
//! second largest `l2`, counted with multiplicity (a maximum that occurs twice gives `l1 == l2`).
//! A row with fewer than two values, or with a value that is NaN or infinite, is not summarised:
//! it is counted in `skipped`. `-0.0` is stored as `0.0` (the two compare equal, and the scale
//! arithmetic below does not tell them apart except by the sign of a zero scale).
//!
//! **Summary** ([`TopPairs`]): the distinct `(l1, l2)` pairs, each with the number of rows that
//! had it, sorted by `(l1, l2)`, plus `skipped`. It is the multiset of the rows' pairs, so it does
//! not depend on how rows were split into batches or on their order, and merging two summaries
//! (adding the counts of equal pairs) gives exactly the summary of all their rows. Its size is
//! the number of distinct pairs, at most the number of rows. [`MAX_PAIRS`] bounds it: a summary
//! whose rows have more distinct pairs drops them and is marked `overflowed` (it can give no
//! scale). Whether that happens depends only on the rows, not on batches, order or merging (the
//! union of pairs only grows), so the mark is as exact as the pairs.
//! The values are the tensor's own (float16, float32 or float64), held exactly as f64.
//!
//! **Scale** ([`isotone_scale`]), for a quantization whose largest level above the zero point is
//! `q` (see [`positive_levels`]); all arithmetic in f64. Per pair, with `(a, b) = (l1, l2)`, or
//! `(|l1|, |l2|)` when symmetric:
//!
//! * `lo = max(b, 0) / (q - 0.51)`: the smallest scale at which `b` rounds at least one level
//!   below the clipping level (`round(b / s) <= q - 1`);
//! * `hi = 2 * (a - max(b, 0))`: scales below it keep the gap `a - b` wider than half a level;
//! * the pair can be separated iff `hi > lo` and `a > 0`; then it is satisfied by every scale
//!   `s` with `lo <= s < hi`.
//!
//! The scale is the smallest `lo` among separable pairs that maximises the number of satisfied
//! rows (each pair weighted by its count). This is PPQ's sweep over the sorted candidates
//! `(lo, "min")` and `(hi, "max")` (at equal values `"max"` sorts first, so a row whose `hi`
//! equals `s` does not count for `s`), keeping the first candidate whose running count strictly
//! exceeds the best so far. With no separable pair there is no scale ([`IsotoneChoice::None`]).
//!
//! PPQ's condition `s < 2 (l1 - l2)` is necessary for `round(l1 / s) > round(l2 / s)`, not
//! sufficient (`l1 - l2 > s` is); histocal keeps PPQ's definition.

use crate::methods::qerror::QType;
use crate::numeric::fallible;
use crate::numeric::float::Float;
use std::cmp::Ordering;

/// Distinct pairs a tensor's summary may hold (24 bytes each: 24 MiB).
pub const MAX_PAIRS: usize = 1 << 20;

/// The exact multiset of rows' `(l1, l2)` pairs (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopPairs {
    /// `(l1, l2, rows)`, sorted by `(l1, l2)`, distinct, `rows > 0`, finite, `l1 >= l2`.
    pub pairs: Vec<(f64, f64, u64)>,
    /// Rows left out: fewer than two values, or a NaN or infinite value.
    pub skipped: u64,
    /// The rows had more than [`MAX_PAIRS`] distinct pairs; `pairs` is then empty.
    pub overflowed: bool,
}

fn by_pair(x: &(f64, f64, u64), y: &(f64, f64, u64)) -> Ordering {
    x.0.total_cmp(&y.0).then(x.1.total_cmp(&y.1))
}

/// `-0.0` becomes `0.0`; other values are unchanged.
fn unsigned_zero(x: f64) -> f64 {
    x + 0.0
}

/// The top-two summary of `values`, a C-ordered tensor whose last axis has `row_len` entries
/// (`values.len()` a multiple of it; `row_len == 0` means no rows).
pub fn top_pairs<D: Float>(values: &[D], row_len: usize) -> TopPairs {
    let mut out = TopPairs::default();
    if row_len == 0 {
        return out;
    }
    let rows = values.len() / row_len;
    if row_len < 2 {
        out.skipped = rows as u64;
        return out;
    }
    let mut pairs: Vec<(f64, f64, u64)> = fallible::with_capacity(rows);
    for row in values.chunks_exact(row_len) {
        let (mut l1, mut l2) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
        let mut finite = true;
        for &v in row {
            let x = v.to_f64();
            if !x.is_finite() {
                finite = false;
                break;
            }
            if x > l1 {
                l2 = l1;
                l1 = x;
            } else if x > l2 {
                l2 = x;
            }
        }
        if finite {
            pairs.push((unsigned_zero(l1), unsigned_zero(l2), 1));
        } else {
            out.skipped += 1;
        }
    }
    pairs.sort_unstable_by(by_pair);
    out.pairs = collapse(pairs);
    if out.pairs.len() > MAX_PAIRS {
        out.pairs = Vec::new();
        out.overflowed = true;
    }
    out
}

/// Sorted pairs with equal pairs' counts added.
fn collapse(sorted: Vec<(f64, f64, u64)>) -> Vec<(f64, f64, u64)> {
    let mut out: Vec<(f64, f64, u64)> = fallible::with_capacity(sorted.len());
    for p in sorted {
        match out.last_mut() {
            Some(last) if by_pair(last, &p) == Ordering::Equal => last.2 += p.2,
            _ => out.push(p),
        }
    }
    out
}

impl TopPairs {
    /// Add `other`'s rows: the summary of both sets of rows.
    pub fn merge(&mut self, other: &TopPairs) {
        self.skipped += other.skipped;
        self.overflowed |= other.overflowed;
        if self.overflowed {
            self.pairs = Vec::new();
            return;
        }
        let mut all: Vec<(f64, f64, u64)> = fallible::with_capacity(self.pairs.len() + other.pairs.len());
        let (mut i, mut j) = (0, 0);
        let (a, b) = (&self.pairs, &other.pairs);
        while i < a.len() || j < b.len() {
            let take_a = j == b.len() || (i < a.len() && by_pair(&a[i], &b[j]) != Ordering::Greater);
            if take_a {
                all.push(a[i]);
                i += 1;
            } else {
                all.push(b[j]);
                j += 1;
            }
        }
        self.pairs = collapse(all);
        if self.pairs.len() > MAX_PAIRS {
            self.pairs = Vec::new();
            self.overflowed = true;
        }
    }

    /// The number of rows summarised (not counting skipped ones).
    pub fn rows(&self) -> u128 {
        self.pairs.iter().map(|p| p.2 as u128).sum()
    }

    /// A summary from stored parts, checked: what [`TopPairs::pairs`] promises.
    pub fn from_parts(pairs: Vec<(f64, f64, u64)>, skipped: u64, overflowed: bool) -> Result<TopPairs, String> {
        if overflowed && !pairs.is_empty() {
            return Err("an overflowed isotone summary holds pairs".into());
        }
        for (k, p) in pairs.iter().enumerate() {
            if !(p.0.is_finite() && p.1.is_finite()) || p.0 < p.1 || p.2 == 0 {
                return Err(format!(
                    "isotone pair {k} ({}, {}, {} rows) is not a finite l1 >= l2 with rows",
                    p.0, p.1, p.2
                ));
            }
            if p.0.to_bits() == (-0.0f64).to_bits() || p.1.to_bits() == (-0.0f64).to_bits() {
                return Err(format!("isotone pair {k} holds -0.0"));
            }
            if k > 0 && by_pair(&pairs[k - 1], p) != Ordering::Less {
                return Err(format!("isotone pairs are not sorted and distinct at pair {k}"));
            }
        }
        if pairs.len() > MAX_PAIRS {
            return Err(format!("{} isotone pairs, more than the limit of {MAX_PAIRS}", pairs.len()));
        }
        Ok(TopPairs { pairs, skipped, overflowed })
    }
}

/// The levels above the zero point that onnxruntime's scale rule gives `qtype`: `qmax` when
/// asymmetric (isotone's ranges have zero point 0), `qmax - round_half_even((qmin + qmax) / 2)`
/// when symmetric (127 for int8 and uint8, 32767 for int16 and uint16).
pub fn positive_levels(qtype: QType, symmetric: bool) -> f64 {
    let (qmin, qmax) = qtype.qmin_qmax(symmetric);
    if symmetric {
        let mid = (qmin as f64 + qmax as f64) / 2.0;
        qmax as f64 - mid.round_ties_even()
    } else {
        qmax as f64
    }
}

/// What isotone chose for a tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum IsotoneChoice {
    /// The scale (module documentation) and the weighted number of rows it satisfies.
    Scale(f64, u128),
    /// No separable row: the largest `a` (`l1`, or `|l1|` when symmetric) over all pairs, if any.
    None(Option<f64>),
}

/// The isotone scale of `tops` for `q` levels above the zero point (module documentation).
pub fn isotone_scale(tops: &TopPairs, q: f64, symmetric: bool) -> IsotoneChoice {
    // (value, is_min, rows): "max" events (is_min false) sort before "min" ones at equal values.
    let mut events: Vec<(f64, bool, u64)> = fallible::with_capacity(2 * tops.pairs.len());
    let mut largest: Option<f64> = None;
    for &(l1, l2, rows) in &tops.pairs {
        let (a, b) = if symmetric { (l1.abs(), l2.abs()) } else { (l1, l2) };
        largest = Some(largest.map_or(a, |m: f64| m.max(a)));
        let b_pos = b.max(0.0);
        let lo = b_pos / (q - 0.51);
        let hi = 2.0 * (a - b_pos);
        if hi > lo && a > 0.0 {
            events.push((lo, true, rows));
            events.push((hi, false, rows));
        }
    }
    if events.is_empty() {
        return IsotoneChoice::None(largest);
    }
    events.sort_unstable_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
    let (mut satisfied, mut best, mut scale) = (0i128, 0i128, f64::NAN);
    for (value, is_min, rows) in events {
        if is_min {
            satisfied += rows as i128;
        } else {
            satisfied -= rows as i128;
        }
        if satisfied > best {
            best = satisfied;
            scale = value;
        }
    }
    IsotoneChoice::Scale(scale, best as u128)
}

/// The range onnxruntime's scale rule turns into `scale` with isotone's zero point: asymmetric
/// `(qmin * scale, qmax * scale)` (zero point 0), symmetric `(-a, a)` with
/// `a = scale * (qmax - qmin) / 2` (ORT's symmetric zero point).
pub fn isotone_range(scale: f64, qtype: QType, symmetric: bool) -> (f64, f64) {
    let (qmin, qmax) = qtype.qmin_qmax(symmetric);
    if symmetric {
        let a = scale * (qmax as f64 - qmin as f64) / 2.0;
        (-a, a)
    } else {
        (qmin as f64 * scale, qmax as f64 * scale)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The literal definition: every row's interval, every `lo` tried as the scale.
    fn literal(rows: &[(f64, f64)], q: f64, symmetric: bool) -> Option<f64> {
        let mut intervals = Vec::new();
        for &(l1, l2) in rows {
            let (a, b) = if symmetric { (l1.abs(), l2.abs()) } else { (l1, l2) };
            let lo = b.max(0.0) / (q - 0.51);
            let hi = 2.0 * (a - b.max(0.0));
            if hi > lo && a > 0.0 {
                intervals.push((lo, hi));
            }
        }
        let mut best: Option<(usize, f64)> = None;
        for &(s, _) in &intervals {
            let n = intervals.iter().filter(|&&(lo, hi)| lo <= s && s < hi).count();
            if best.is_none_or(|(m, t)| n > m || (n == m && s < t)) {
                best = Some((n, s));
            }
        }
        best.map(|b| b.1)
    }

    fn rows_of(values: &[f32], row_len: usize) -> Vec<(f64, f64)> {
        values
            .chunks_exact(row_len)
            .map(|r| {
                let mut v: Vec<f64> = r.iter().map(|&x| x as f64).collect();
                v.sort_by(|a, b| b.total_cmp(a));
                (v[0], v[1])
            })
            .collect()
    }

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // few distinct values, so that ties and repeated pairs are common
        ((*seed >> 40) % 41) as f32 / 8.0 - 2.0
    }

    #[test]
    fn matches_the_literal_definition_and_is_batch_invariant() {
        let mut seed = 7u64;
        for case in 0..200 {
            let row_len = 2 + case % 5;
            let n_rows = 1 + case % 23;
            let values: Vec<f32> = (0..row_len * n_rows).map(|_| lcg(&mut seed)).collect();
            let tops = top_pairs(&values, row_len);
            assert_eq!(tops.rows(), n_rows as u128);
            let mut split = top_pairs(&values[..row_len * (n_rows / 2)], row_len);
            split.merge(&top_pairs(&values[row_len * (n_rows / 2)..], row_len));
            assert_eq!(split, tops);
            for (qtype, symmetric) in [(QType::Int8, false), (QType::Int8, true), (QType::UInt8, false)] {
                let q = positive_levels(qtype, symmetric);
                let want = literal(&rows_of(&values, row_len), q, symmetric);
                match isotone_scale(&tops, q, symmetric) {
                    IsotoneChoice::Scale(s, _) => assert_eq!(Some(s), want, "case {case}"),
                    IsotoneChoice::None(_) => assert_eq!(want, None, "case {case}"),
                }
            }
        }
    }

    #[test]
    fn skips_non_finite_rows_and_short_rows() {
        let tops = top_pairs(&[1.0f32, f32::NAN, 2.0, 0.5, f32::INFINITY, 0.0], 2);
        assert_eq!(tops.pairs, vec![(2.0, 0.5, 1)]);
        assert_eq!(tops.skipped, 2);
        assert_eq!(top_pairs(&[1.0f32, 2.0], 1).skipped, 2);
        assert_eq!(top_pairs(&[-0.0f32, -0.0], 2).pairs, vec![(0.0, 0.0, 1)]);
    }

    #[test]
    fn overflow_depends_only_on_the_rows() {
        let rows: Vec<f32> = (0..=MAX_PAIRS).flat_map(|i| [i as f32, 0.0]).collect();
        let whole = top_pairs(&rows, 2);
        assert!(whole.overflowed && whole.pairs.is_empty());
        let mut halves = top_pairs(&rows[..MAX_PAIRS], 2);
        assert!(!halves.overflowed);
        halves.merge(&top_pairs(&rows[MAX_PAIRS..], 2));
        assert_eq!(halves, whole);
        // repeated rows add counts, not pairs (the slices are half the rows: two values a row)
        let mut again = top_pairs(&rows[..MAX_PAIRS], 2);
        again.merge(&top_pairs(&rows[..MAX_PAIRS], 2));
        assert!(!again.overflowed && again.rows() == MAX_PAIRS as u128);
    }

    #[test]
    fn levels_and_ranges() {
        assert_eq!(positive_levels(QType::Int8, false), 127.0);
        assert_eq!(positive_levels(QType::UInt8, true), 127.0);
        assert_eq!(positive_levels(QType::UInt16, true), 32767.0);
        assert_eq!(isotone_range(0.5, QType::Int8, false), (-64.0, 63.5));
        assert_eq!(isotone_range(0.5, QType::Int8, true), (-63.5, 63.5));
    }

    #[test]
    fn a_row_whose_hi_equals_the_scale_does_not_count() {
        // row 1: [0, 2); row 2: [2, 4) after q - 0.51 = 1 (q = 1.51)
        let tops = TopPairs { pairs: vec![(1.0, 0.0, 1), (4.0, 2.0, 1)], skipped: 0, overflowed: false };
        assert_eq!(isotone_scale(&tops, 1.51, false), IsotoneChoice::Scale(0.0, 1));
    }
}
