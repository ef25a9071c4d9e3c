//! TensorRT/MXNet-style entropy calibration: the symmetric threshold whose quantized |x|
//! distribution has the least KL divergence from the data's, in float64.
//!
//! 1. |x| histogram: `num_bins` bins over `[0, A]`, `A = max(|min|, |max|)`; each bin's count
//!    goes to abs-bin `floor(|x| / A * num_bins)` (at most `num_bins - 1`), x its value.
//! 2. For each candidate i in `num_quantized_bins..=num_bins`: the reference `p` is the first i
//!    bins with the rest folded into the last; `q` merges the first i bins into
//!    `num_quantized_bins` groups and spreads each group's count evenly over its bins where p
//!    is not zero; both are smoothed (zeros get eps, the others lose what that adds) and the
//!    divergence is scipy's `entropy(p, q)`.
//! 3. The threshold is `A i / num_bins` for the least divergence (the smallest i on ties).
//!
//! A candidate's divergence costs a few dozen logarithms instead of O(i). q is one value per
//! group, so `sum P ln Q` has one log per group; the groups but the last are the same for
//! every candidate with the same `i / num_quantized_bins` and their q is at least 1, so their
//! part comes from per-group sums made once for those candidates and the series of
//! `ln(q - e)` in `e / q`. `sum P ln P` over the smoothed counts `P = p - e` comes from running
//! sums as i grows: exactly per distinct count below [`SMALL`], and from the series of
//! `(h - e) ln(h - e)` in `e / h` above it (and below it too for the usual tiny offsets).
//! Where a series would not serve (smoothing offsets of the order of the counts, only possible
//! with far more bins than 2048) the candidate takes the per-group logs, or the literal
//! per-element sum, which is also the tests' reference.
//!
//! Cost: the series screen a candidate in O(1) to O(num_quantized_bins), but a candidate they
//! cannot serve, and every candidate within the screening's tolerance of the least, takes the
//! literal O(i) sum, so the worst case is quadratic in `num_bins`. [`search_work`] bounds the
//! whole search by that worst case, and the search stops early when its stop flag is set
//! ([`crate::numeric::cancel`]).

use crate::methods::qerror::UniformHistogram;
use crate::numeric::cancel::{self, Cancelled};
use crate::numeric::fallible;
use crate::ort::histogram::MAX_BINS;
use std::sync::atomic::AtomicBool;

/// The smoothing constant.
const EPS: f64 = 1e-4;
/// Counts below this are summed exactly, one logarithm per distinct count.
const SMALL: usize = 32;
/// Series terms n = 2..=TERMS + 1 of
/// `(h - e) ln(h - e) = h ln h - e (ln h + 1) + sum_n e^n / (n (n - 1) h^(n - 1))`.
const TERMS: usize = 6;
/// Largest smoothing offset the series serves: `e / h <= 1/128`, so the first dropped term is
/// below 1e-15 of `h` for every `h >= SMALL`.
const MAX_SERIES_OFFSET: f64 = 0.25;
/// Largest smoothing offset the series serves for counts below SMALL too (e / h <= 1e-3: the
/// first dropped term is below 1e-25).
const MAX_SMALL_SERIES_OFFSET: f64 = 1e-3;
/// Terms n = 1..=GROUP_TERMS of `ln(q - e) = ln q - sum_n (e / q)^n / n` for the groups' q >= 1.
const GROUP_TERMS: usize = 8;
/// Largest q smoothing offset that series serves: the first dropped term is below 1e-18.
const MAX_GROUP_OFFSET: f64 = 0.01;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KlError {
    NoQuantizedBins,
    TooFewBins {
        num_bins: usize,
        num_quantized_bins: usize,
    },
    /// The stop flag was set before the search finished.
    Cancelled,
    TooManyBins {
        num_bins: usize,
    },
}

impl std::fmt::Display for KlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KlError::NoQuantizedBins => write!(f, "num_quantized_bins must be >= 1"),
            KlError::TooFewBins { num_bins, num_quantized_bins } => {
                write!(f, "num_bins must be >= num_quantized_bins (num_bins={num_bins}, num_quantized_bins={num_quantized_bins})")
            }
            KlError::Cancelled => write!(f, "kl search {Cancelled}"),
            KlError::TooManyBins { num_bins } => write!(f, "num_bins must be <= {MAX_BINS}, got {num_bins}"),
        }
    }
}

/// The KL threshold range `(-t, t)` of `hist`, its low end raised to `min(data min, 0)` (a Relu
/// output gets `(0, t)`: ORT's QDQ quantizer removes Relu and lets the range do its clipping);
/// (0, 0) when it is empty or all its values are 0. Stops with `Cancelled` once `stop` is set.
pub fn kl_range(
    hist: &UniformHistogram<'_>,
    num_bins: usize,
    num_quantized_bins: usize,
    stop: &AtomicBool,
) -> Result<(f64, f64), KlError> {
    check_settings(num_bins, num_quantized_bins)?;
    let Some((abs, a)) = abs_histogram(hist, num_bins) else { return Ok((0.0, 0.0)) };
    let i = best_candidate(&abs, num_quantized_bins, stop).map_err(|Cancelled| KlError::Cancelled)?;
    let t = a * i as f64 / num_bins as f64;
    Ok(((-t).max(hist.min.min(0.0)), t))
}

/// What one literal divergence costs per bin, in the bin evaluations of ORT's float32 entropy
/// search ([`crate::ort::entropy::search_work`]): a float64 logarithm per bin on one thread against
/// numpy's vectorised float32 one (measured ~10 ns against ~1.3 ns).
pub const LITERAL_BIN_COST: u64 = 8;

/// The search's worst-case work for `num_bins` bins, in the units of
/// [`crate::ort::entropy::search_work`]: every candidate i taking the literal O(i) sum twice (once
/// to screen, once to decide), plus the linear passes.
pub fn search_work(num_bins: usize, num_quantized_bins: usize) -> u64 {
    let (n, nq) = (num_bins as u128, num_quantized_bins.max(1) as u128);
    if n < nq {
        return 0;
    }
    // sum of i for i in nq..=n
    let literal = (n * (n + 1) - nq * (nq - 1)) / 2;
    u64::try_from(2 * literal * LITERAL_BIN_COST as u128 + n).unwrap_or(u64::MAX)
}

/// At least one quantized bin, at least as many bins, and at most `MAX_BINS`.
pub fn check_settings(num_bins: usize, num_quantized_bins: usize) -> Result<(), KlError> {
    if num_quantized_bins == 0 {
        return Err(KlError::NoQuantizedBins);
    }
    if num_bins < num_quantized_bins {
        return Err(KlError::TooFewBins { num_bins, num_quantized_bins });
    }
    if num_bins > MAX_BINS {
        return Err(KlError::TooManyBins { num_bins });
    }
    Ok(())
}

/// The |x| histogram of step 1 and its range A; None when there is no non-zero value.
pub fn abs_histogram(hist: &UniformHistogram<'_>, num_bins: usize) -> Option<(Vec<u64>, f64)> {
    let a = hist.min.abs().max(hist.max.abs());
    if hist.total == 0 || a == 0.0 || num_bins == 0 {
        return None;
    }
    let mut abs = fallible::zeroed::<u64>(num_bins);
    for (i, &c) in hist.counts.iter().enumerate() {
        if c != 0 {
            let j = (hist.value(i).abs() / a * num_bins as f64).floor();
            abs[(j as usize).min(num_bins - 1)] += c;
        }
    }
    Some((abs, a))
}

/// Neumaier's compensated sum: the divergence is a small difference of large sums.
#[derive(Clone, Copy, Default)]
struct Compensated {
    sum: f64,
    correction: f64,
}

impl Compensated {
    #[inline]
    fn add(&mut self, x: f64) {
        let t = self.sum + x;
        self.correction += if self.sum.abs() >= x.abs() { (self.sum - t) + x } else { (x - t) + self.sum };
        self.sum = t;
    }

    fn value(&self) -> f64 {
        self.sum + self.correction
    }
}

/// `sum h ln h`, `sum (ln h + 1)` and `sum h^-n` (n = 1..=TERMS) over counts h, from which
/// the series gives `sum (h - e) ln(h - e)`.
#[derive(Default)]
struct SeriesSums {
    h_ln_h: Compensated,
    ln_h_plus_1: Compensated,
    inverse_powers: [f64; TERMS],
}

impl SeriesSums {
    fn add(&mut self, h: u64) {
        let (hf, ln) = (h as f64, (h as f64).ln());
        self.h_ln_h.add(hf * ln);
        self.ln_h_plus_1.add(ln + 1.0);
        let inverse = 1.0 / hf;
        let mut power = inverse;
        for p in &mut self.inverse_powers {
            *p += power;
            power *= inverse;
        }
    }

    fn add_x_ln_x(&self, e: f64, s: &mut Compensated) {
        s.add(self.h_ln_h.value());
        s.add(-e * self.ln_h_plus_1.value());
        let mut e_n = e;
        for (k, p) in self.inverse_powers.iter().enumerate() {
            let n = (k + 2) as f64;
            e_n *= e;
            s.add(e_n / (n * (n - 1.0)) * p);
        }
    }
}

/// Sums over a growing set of non-zero counts h from which `sum (h - e) ln(h - e)` follows for
/// any small offset e.
struct CountSums {
    /// How many counts equal v, for v < SMALL.
    small: [u64; SMALL],
    small_series: SeriesSums,
    large_series: SeriesSums,
    min: u64,
}

impl CountSums {
    fn new() -> Self {
        CountSums {
            small: [0; SMALL],
            small_series: SeriesSums::default(),
            large_series: SeriesSums::default(),
            min: u64::MAX,
        }
    }

    fn add(&mut self, h: u64) {
        if h == 0 {
            return;
        }
        self.min = self.min.min(h);
        if (h as usize) < SMALL {
            self.small[h as usize] += 1;
            self.small_series.add(h);
        } else {
            self.large_series.add(h);
        }
    }

    /// `sum (h - e) ln(h - e)`, for `0 <= e <= MAX_SERIES_OFFSET` and e below every count.
    fn x_ln_x(&self, e: f64) -> f64 {
        let mut s = Compensated::default();
        self.large_series.add_x_ln_x(e, &mut s);
        if e <= MAX_SMALL_SERIES_OFFSET {
            self.small_series.add_x_ln_x(e, &mut s);
        } else {
            for (v, &count) in self.small.iter().enumerate().skip(1) {
                if count != 0 {
                    let x = v as f64 - e;
                    s.add(count as f64 * (x * x.ln()));
                }
            }
        }
        s.value()
    }
}

/// Sums over the groups before the last one, for the candidates of one `merged = i / nq`:
/// with `m` the group's p mass, `k` its non-zero bins and `q = m / k >= 1`,
/// `sum m ln q`, `sum k ln q`, and `sum m q^-n`, `sum k q^-n` for n = 1..=GROUP_TERMS.
struct GroupSums {
    merged: usize,
    m_ln_q: Compensated,
    k_ln_q: Compensated,
    m_inverse_powers: [f64; GROUP_TERMS],
    k_inverse_powers: [f64; GROUP_TERMS],
}

impl GroupSums {
    fn new(search: &Search<'_>, merged: usize) -> Self {
        let mut g = GroupSums {
            merged,
            m_ln_q: Compensated::default(),
            k_ln_q: Compensated::default(),
            m_inverse_powers: [0.0; GROUP_TERMS],
            k_inverse_powers: [0.0; GROUP_TERMS],
        };
        for j in 0..search.nq - 1 {
            let (start, stop) = (j * merged, (j + 1) * merged);
            let (m, k) =
                (search.cumulative[stop] - search.cumulative[start], search.nonzero[stop] - search.nonzero[start]);
            if k == 0 {
                continue;
            }
            let (m, k) = (m as f64, k as f64);
            let q = m / k;
            let ln_q = q.ln();
            g.m_ln_q.add(m * ln_q);
            g.k_ln_q.add(k * ln_q);
            let mut power = 1.0;
            for n in 0..GROUP_TERMS {
                power /= q;
                g.m_inverse_powers[n] += m * power;
                g.k_inverse_powers[n] += k * power;
            }
        }
        g
    }

    /// `sum (m - p_offset k) ln(q - q_offset)` over the groups, for `q_offset <= MAX_GROUP_OFFSET`.
    fn p_ln_q(&self, p_offset: f64, q_offset: f64) -> f64 {
        let mut s = Compensated::default();
        s.add(self.m_ln_q.value());
        s.add(-p_offset * self.k_ln_q.value());
        let mut e_n = 1.0;
        for n in 0..GROUP_TERMS {
            e_n *= q_offset;
            s.add(-e_n / (n + 1) as f64 * (self.m_inverse_powers[n] - p_offset * self.k_inverse_powers[n]));
        }
        s.value()
    }
}

/// The candidate i with the least divergence (the smallest on ties) for the |x| histogram
/// `abs` (at least `nq >= 1` bins, not all empty).
///
/// The fast divergences agree with the literal sums to ~1e-10 (less where the divergence is
/// tiny: it is a small difference of large sums), so they only screen: the candidates within
/// 1e-8 of the least are decided by the literal sum, which makes the choice the literal one.
/// Stops with `Cancelled` once `stop` is set.
pub fn best_candidate(abs: &[u64], nq: usize, stop: &AtomicBool) -> Result<usize, Cancelled> {
    let search = Search::new(abs, nq);
    let mut plain = CountSums::new();
    abs[..nq - 1].iter().for_each(|&h| plain.add(h));
    let mut groups = GroupSums::new(&search, 1);
    let mut scratch = (fallible::with_capacity(abs.len()), fallible::with_capacity(abs.len()));
    let mut screened = fallible::with_capacity(abs.len() - nq + 1);
    for i in nq..=abs.len() {
        cancel::check(stop)?;
        if groups.merged != i / nq {
            groups = GroupSums::new(&search, i / nq);
        }
        screened
            .push(search.fast_divergence(i, &plain, &groups).unwrap_or_else(|| divergence(abs, i, nq, &mut scratch)));
        // candidate i + 1 no longer folds anything into bin i - 1
        plain.add(abs[i - 1]);
    }
    let least = screened.iter().copied().fold(f64::INFINITY, f64::min);
    if least == f64::INFINITY {
        return Ok(nq);
    }
    let close = least + least * 1e-8 + 1e-12;
    let mut best = (f64::INFINITY, nq);
    for (k, _) in screened.iter().enumerate().filter(|(_, &d)| d <= close) {
        cancel::check(stop)?;
        let d = divergence(abs, nq + k, nq, &mut scratch);
        if d < best.0 {
            best = (d, nq + k);
        }
    }
    Ok(best.1)
}

/// Prefix tables of the |x| histogram shared by all candidates.
struct Search<'a> {
    abs: &'a [u64],
    nq: usize,
    /// `cumulative[k]`: sum of `abs[..k]`.
    cumulative: Vec<u64>,
    /// `nonzero[k]`: number of non-zero bins in `abs[..k]`.
    nonzero: Vec<usize>,
}

impl<'a> Search<'a> {
    fn new(abs: &'a [u64], nq: usize) -> Self {
        let mut cumulative = fallible::with_capacity(abs.len() + 1);
        let mut nonzero = fallible::with_capacity(abs.len() + 1);
        let (mut c, mut z) = (0u64, 0usize);
        cumulative.push(0);
        nonzero.push(0);
        for &h in abs {
            c += h;
            z += (h != 0) as usize;
            cumulative.push(c);
            nonzero.push(z);
        }
        Search { abs, nq, cumulative, nonzero }
    }

    /// Candidate i's divergence from group sums, with `plain` holding `abs[..i - 1]` and
    /// `groups` made for `i / nq`; None
    /// where the smoothing offset is out of the series' reach or not below every count (some
    /// smoothed p would not be positive), for the literal sum to decide.
    ///
    /// With P, Q the smoothed p, q, `N = sum P` (all the data) and `S = sum Q` (the data below
    /// the threshold): `D = (sum P ln P - sum P ln Q) / N + ln(S / N)`. Where p is zero,
    /// `P = Q = eps`: those terms cancel.
    fn fast_divergence(&self, i: usize, plain: &CountSums, groups: &GroupSums) -> Option<f64> {
        let (nq, cum, nz) = (self.nq, &self.cumulative, &self.nonzero);
        let total = cum[self.abs.len()];
        let outliers = total - cum[i];
        let p_last = self.abs[i - 1] + outliers;
        let p_nonzero = nz[i - 1] + (p_last != 0) as usize;
        let p_offset = EPS * (i - p_nonzero) as f64 / p_nonzero as f64;
        let min_p = if p_last != 0 { plain.min.min(p_last) } else { plain.min };
        if !(p_offset <= MAX_SERIES_OFFSET && (min_p as f64) > p_offset) {
            return None;
        }
        let merged = i / nq;
        let last_start = (nq - 1) * merged;
        let last_quantized = cum[i] - cum[last_start];
        let last_norm = nz[i - 1] - nz[last_start] + (p_last != 0) as usize;
        // q is zero where p is, and over the last group too when only folded outliers fill it
        let q_zero = (i - p_nonzero) + if last_quantized == 0 { last_norm } else { 0 };
        if q_zero == i {
            return Some(f64::INFINITY);
        }
        let q_offset = EPS * q_zero as f64 / (i - q_zero) as f64;
        let mut p_ln_q = Compensated::default();
        // the groups before the last: q >= 1 (each non-zero bin holds at least 1), Q > 0
        let series = q_offset <= MAX_GROUP_OFFSET;
        if series {
            p_ln_q.add(groups.p_ln_q(p_offset, q_offset));
        }
        for j in if series { nq - 1..nq } else { 0..nq } {
            let start = j * merged;
            let (quantized, norm, mass) = if j + 1 < nq {
                let stop = start + merged;
                let quantized = cum[stop] - cum[start];
                (quantized, nz[stop] - nz[start], quantized)
            } else {
                (last_quantized, last_norm, last_quantized + outliers)
            };
            if norm == 0 {
                continue;
            }
            let q = if quantized != 0 { quantized as f64 / norm as f64 - q_offset } else { EPS };
            if !(q > 0.0) {
                // a positive P against a non-positive Q
                return Some(f64::INFINITY);
            }
            p_ln_q.add(q.ln() * (mass as f64 - p_offset * norm as f64));
        }
        let mut p_ln_p = plain.x_ln_x(p_offset);
        if p_last != 0 {
            let x = p_last as f64 - p_offset;
            p_ln_p += x * x.ln();
        }
        let n = total as f64;
        // a divergence is never negative; where p == q the cancellation leaves ~1e-16 either way
        Some(((p_ln_p - p_ln_q.value()) / n + (cum[i] as f64 / n).ln()).max(0.0))
    }
}

/// Candidate i's divergence, element by element as the method defines it (scipy's
/// `entropy(p, q)`: `sum rel_entr(p / sum p, q / sum q)`), with scratch buffers for p and q.
pub fn divergence(abs: &[u64], i: usize, nq: usize, (p, q): &mut (Vec<f64>, Vec<f64>)) -> f64 {
    p.clear();
    p.extend(abs[..i].iter().map(|&h| h as f64));
    p[i - 1] += abs[i..].iter().sum::<u64>() as f64;
    q.clear();
    q.resize(i, 0.0);
    let merged = i / nq;
    for j in 0..nq {
        let start = j * merged;
        let stop = if j + 1 == nq { i } else { start + merged };
        let quantized = abs[start..stop].iter().sum::<u64>() as f64;
        let norm = p[start..stop].iter().filter(|&&x| x != 0.0).count();
        if norm != 0 {
            for k in start..stop {
                if p[k] != 0.0 {
                    q[k] = quantized / norm as f64;
                }
            }
        }
    }
    if !smooth(p) || !smooth(q) {
        return f64::INFINITY;
    }
    let (sp, sq): (f64, f64) = (p.iter().sum(), q.iter().sum());
    p.iter().zip(q.iter()).map(|(&x, &y)| rel_entr(x / sp, y / sq)).sum()
}

/// Zeros become `EPS`, the others lose `EPS * zeros / nonzeros`; false when all are zero.
fn smooth(x: &mut [f64]) -> bool {
    let zeros = x.iter().filter(|&&v| v == 0.0).count();
    if zeros == x.len() {
        return false;
    }
    let offset = EPS * zeros as f64 / (x.len() - zeros) as f64;
    x.iter_mut().for_each(|v| *v = if *v == 0.0 { EPS } else { *v - offset });
    true
}

/// scipy's `rel_entr`.
fn rel_entr(x: f64, y: f64) -> f64 {
    if x > 0.0 && y > 0.0 {
        x * (x / y).ln()
    } else if x == 0.0 && y >= 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

#[cfg(test)]
mod tests;
