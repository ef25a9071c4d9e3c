//! The quantization error of a range, the error model of the mse, pow2 and auto methods: ORT's
//! scale and zero-point rule, applied to a uniform signed histogram whose bins stand for their
//! centres clamped into the data's `[min, max]`, as a mean squared error. The scale and zero
//! point are ORT's for the range in the tensor's float type, under the installed ORT's rule
//! ([`ScaleRule`]: 1.32 changed it for float16).
//!
//! Evaluating one range walks quantization levels, not bins: exact integer prefix moments of
//! the bins give the squared error of all bins that round to one level in O(1), so a range
//! costs O(min(levels, bins)) after an O(bins) table ([`ErrorTable`]).

use super::ort_scale::{ceil, floor};
pub use super::ort_scale::{round_half_even, round_to_f16, OrtRule, OrtScale, QType, Quantizer, ScaleRule};

/// A histogram of `counts` over bins of equal `width` from `left`, of data whose finite
/// extremes are `min <= max`. Bin i stands for its centre clamped into `[min, max]`.
#[derive(Clone, Copy, Debug)]
pub struct UniformHistogram<'a> {
    pub counts: &'a [u64],
    pub left: f64,
    pub width: f64,
    pub min: f64,
    pub max: f64,
    /// Sum of the counts.
    pub total: u64,
}

impl<'a> UniformHistogram<'a> {
    /// Check the histogram is one the kernels can evaluate: finite edges, a positive width,
    /// finite `min <= max`, and counts whose sum fits in 64 bits.
    pub fn new(counts: &'a [u64], left: f64, width: f64, min: f64, max: f64) -> Result<Self, String> {
        if !(left.is_finite() && width.is_finite() && width > 0.0 && (left + counts.len() as f64 * width).is_finite()) {
            return Err(format!("bins must have finite edges and a positive width (left={left}, width={width})"));
        }
        if !(min.is_finite() && max.is_finite() && min <= max) {
            return Err(format!("min and max must be finite with min <= max (min={min}, max={max})"));
        }
        let total =
            counts.iter().try_fold(0u64, |s, &c| s.checked_add(c)).ok_or("the counts add up to more than 2^64 - 1")?;
        Ok(UniformHistogram { counts, left, width, min, max, total })
    }

    #[inline]
    pub fn centre(&self, i: usize) -> f64 {
        self.left + (i as f64 + 0.5) * self.width
    }

    /// The value bin `i` stands for: its centre clamped into `[min, max]`.
    #[inline]
    pub fn value(&self, i: usize) -> f64 {
        self.centre(i).clamp(self.min, self.max)
    }
}

/// Wrapping integer arithmetic for the prefix moments: differences of wrapped prefix sums are
/// exact whenever the true difference fits, which [`ErrorTable::new`] guarantees by choosing
/// the width.
trait Moment: Copy + PartialEq {
    fn of(x: u64) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// The value of a non-negative moment, known to be below 2^63 (u64) or 2^127 (u128).
    fn small_f64(self) -> f64;
    fn signed_f64(self) -> f64;
}

/// `Moment` for an unsigned width and its signed twin (whose conversion to f64 is one
/// instruction, unlike the unsigned one, and also reads a wrapped difference as signed).
macro_rules! moment {
    ($u:ty, $i:ty) => {
        impl Moment for $u {
            #[inline(always)]
            fn of(x: u64) -> Self {
                x as $u
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn small_f64(self) -> f64 {
                self as $i as f64
            }
            #[inline(always)]
            fn signed_f64(self) -> f64 {
                self as $i as f64
            }
        }
    };
}
moment!(u64, i64);
moment!(u128, i128);

/// `[sum c, sum c k, sum c k^2]` over the interior bins before local index k.
enum Moments {
    Narrow(Vec<[u64; 3]>),
    Wide(Vec<[u128; 3]>),
}

fn prefix_moments<T: Moment>(counts: &[u64]) -> Vec<[T; 3]> {
    let mut out = crate::numeric::fallible::with_capacity(counts.len() + 1);
    let mut acc = [T::of(0); 3];
    out.push(acc);
    for (k, &c) in counts.iter().enumerate() {
        let (c, k) = (T::of(c), T::of(k as u64));
        let ck = c.mul(k);
        acc = [acc[0].add(c), acc[1].add(ck), acc[2].add(ck.mul(k))];
        out.push(acc);
    }
    out
}

/// A histogram prepared for evaluating the quantization error of many ranges.
///
/// Positions inside the table are in local bin units: interior bin k (global bin
/// `first + k`) is at k, so the squared error of a bin at k rounding to a level at t is
/// `count * (k - t)^2` in units of `width^2`.
pub struct ErrorTable<'a> {
    hist: UniformHistogram<'a>,
    /// Bins `[first, first + n)` have their centre inside `[min, max]`; bins before them stand
    /// for `min`, bins after them for `max`.
    first: usize,
    n: usize,
    below: u64,
    above: u64,
    /// Position of the value 0.
    zero: f64,
    /// The interior bin holding the median of the interior values.
    median: usize,
    moments: Moments,
}

impl<'a> ErrorTable<'a> {
    pub fn new(hist: UniformHistogram<'a>) -> Self {
        let nb = hist.counts.len();
        let first = (0..nb).position(|i| hist.centre(i) >= hist.min).unwrap_or(nb);
        let end = (first..nb).position(|i| hist.centre(i) > hist.max).map_or(nb, |p| first + p);
        let interior = &hist.counts[first..end];
        let below: u64 = hist.counts[..first].iter().sum();
        let above: u64 = hist.counts[end..].iter().sum();
        // u64 moments are exact when every segment's sums of c, c (k - r) and c (k - r)^2 are
        // below 2^63.
        let span = interior.len().saturating_sub(1) as u64;
        let interior_total: u64 = interior.iter().sum();
        let narrow = interior_total <= i64::MAX as u64
            && span.checked_mul(span).and_then(|s| s.checked_mul(interior_total)).is_some_and(|v| v <= i64::MAX as u64);
        let mut cumulative = 0;
        let median = interior.iter().position(|&c| {
            cumulative += c;
            2 * (cumulative as u128) >= interior_total as u128
        });
        let moments =
            if narrow { Moments::Narrow(prefix_moments(interior)) } else { Moments::Wide(prefix_moments(interior)) };
        let zero = -hist.left / hist.width - 0.5 - first as f64;
        ErrorTable { hist, first, n: interior.len(), below, above, zero, median: median.unwrap_or(0), moments }
    }

    pub fn hist(&self) -> &UniformHistogram<'a> {
        &self.hist
    }

    /// The mean squared error `sum c (x - dequantize(x))^2 / sum c` over the bins' values
    /// (0 for an empty histogram, infinite for an infinite scale).
    pub fn mean_squared_error(&self, q: &Quantizer) -> f64 {
        if self.hist.total == 0 {
            return 0.0;
        }
        let sum = self.squared_error_sum(q, f64::INFINITY).expect("an infinite bound is never exceeded");
        sum / self.hist.total as f64 * self.hist.width * self.hist.width
    }

    /// `sum c (x - dequantize(x))^2` in units of `width^2` (so that comparisons between ranges
    /// neither overflow nor underflow), or None as soon as a partial sum exceeds `bound`:
    /// the terms are non-negative, so that range cannot beat one whose sum is `bound`.
    /// The result does not depend on `bound` when it is Some.
    pub fn squared_error_sum(&self, q: &Quantizer, bound: f64) -> Option<f64> {
        if q.scale == f64::INFINITY {
            let sum = if self.hist.total == 0 { 0.0 } else { f64::INFINITY };
            return (sum <= bound).then_some(sum);
        }
        match &self.moments {
            Moments::Narrow(m) => self.sum_with(m, q, bound),
            Moments::Wide(m) => self.sum_with(m, q, bound),
        }
    }

    fn sum_with<T: Moment>(&self, m: &[[T; 3]], q: &Quantizer, bound: f64) -> Option<f64> {
        let h = &self.hist;
        let point = |x: f64| {
            let e = (x - q.dequantize(x)) / h.width;
            e * e
        };
        let mut acc = 0.0;
        if self.below > 0 {
            acc += self.below as f64 * point(h.min);
        }
        if self.above > 0 {
            acc += self.above as f64 * point(h.max);
        }
        if acc > bound {
            return None;
        }
        let n = self.n;
        if n == 0 {
            return Some(acc);
        }
        let sigma = q.scale / h.width;
        let (mlo, mhi) = (q.qmin - q.zero_point, q.qmax - q.zero_point);
        let zero = self.zero;
        if !(sigma.is_finite() && sigma > 0.0 && (zero + mlo * sigma).is_finite() && (zero + mhi * sigma).is_finite()) {
            return self.per_bin(0, n, q, acc, bound);
        }
        // First bin at or above the rounding boundary between levels m and m + 1 (a bin exactly
        // on a boundary has the same error on either side).
        let edge = |m: f64| ceil(zero + (m + 0.5) * sigma).clamp(0.0, n as f64) as usize;
        let level = |m: f64| zero + m * sigma;
        // Everything rounding to the end levels or beyond is clipped to them.
        let low_end = edge(mlo);
        let high_start = edge(mhi - 1.0).max(low_end);
        acc += segment(m[0], m[low_end], 0, low_end, level(mlo));
        acc += segment(m[high_start], m[n], high_start, n, level(mhi));
        if acc > bound {
            return None;
        }
        if low_end == high_start {
            return Some(acc);
        }
        if sigma < 1.0 {
            // more levels than bins: each bin's own level is cheaper
            return self.per_bin(low_end, high_start, q, acc, bound);
        }
        // Levels mlo + 1 ..= mhi - 1 hold bins [low_end, high_start). They are summed from the
        // level of the interior's median bin outwards, alternately up and down, so that the
        // levels holding most of the data come first and a range beyond `bound` stops early.
        let (first_level, last_level) = (mlo + 1.0, mhi - 1.0);
        // the level of bin k: the m with edge(m - 1) <= k < edge(m)
        let level_of = |k: usize| {
            let mut l = round_half_even((k as f64 - zero) / sigma).clamp(first_level, last_level);
            while l > first_level && edge(l - 1.0) > k {
                l -= 1.0;
            }
            while l < last_level && edge(l) <= k {
                l += 1.0;
            }
            l
        };
        let mut up = level_of(self.median.clamp(low_end, high_start - 1));
        let mut down = up - 1.0;
        let split = if up > first_level { edge(up - 1.0).clamp(low_end, high_start) } else { low_end };
        let (mut up_start, mut up_moments) = (split, m[split]);
        let (mut down_end, mut down_moments) = (split, m[split]);
        while up_start < high_start || down_end > low_end {
            if up_start < high_start {
                let end = if up >= last_level { high_start } else { edge(up).min(high_start) };
                let next = m[end];
                acc += segment(up_moments, next, up_start, end, level(up));
                (up_start, up_moments, up) = (end, next, up + 1.0);
            }
            if down_end > low_end {
                let start = if down <= first_level { low_end } else { edge(down - 1.0).max(low_end) };
                let next = m[start];
                acc += segment(next, down_moments, start, down_end, level(down));
                (down_end, down_moments, down) = (start, next, down - 1.0);
            }
            if acc > bound {
                return None;
            }
        }
        Some(acc)
    }

    /// `sum c (low - x)^2` over the values `x <= low` plus `sum c (x - high)^2` over the values
    /// `x >= high` (`low < high`), in units of `width^2`: the error of clipping alone, at most
    /// the error of any quantizer whose extreme levels lie inside `[low, high]`.
    pub fn clipping_error_sum(&self, low: f64, high: f64) -> f64 {
        match &self.moments {
            Moments::Narrow(m) => self.clipping_with(m, low, high),
            Moments::Wide(m) => self.clipping_with(m, low, high),
        }
    }

    fn clipping_with<T: Moment>(&self, m: &[[T; 3]], low: f64, high: f64) -> f64 {
        let h = &self.hist;
        let point = |x: f64, count: u64| {
            let d = if x <= low {
                (low - x) / h.width
            } else if x >= high {
                (x - high) / h.width
            } else {
                0.0
            };
            count as f64 * (d * d)
        };
        let mut acc = point(h.min, self.below) + point(h.max, self.above);
        if self.n > 0 {
            let n = self.n as f64;
            let position = |x: f64| (x - h.left) / h.width - 0.5 - self.first as f64;
            let (pl, ph) = (position(low), position(high));
            let low_end = (floor(pl) + 1.0).clamp(0.0, n);
            let high_start = ceil(ph).clamp(0.0, n);
            let (low_end, high_start) = (low_end as usize, high_start as usize);
            acc +=
                segment(m[0], m[low_end], 0, low_end, pl) + segment(m[high_start], m[self.n], high_start, self.n, ph);
        }
        acc
    }

    /// Interior bins `[a, b)` one by one, with the quantizer's own rounding.
    fn per_bin(&self, a: usize, b: usize, q: &Quantizer, mut acc: f64, bound: f64) -> Option<f64> {
        let h = &self.hist;
        for (k, &c) in h.counts[self.first + a..self.first + b].iter().enumerate() {
            if c != 0 {
                let x = h.centre(self.first + a + k);
                let e = (x - q.dequantize(x)) / h.width;
                acc += c as f64 * (e * e);
                if acc > bound {
                    return None;
                }
            }
        }
        Some(acc)
    }
}

/// `sum c (k - t)^2` over local bins `[a, b)`, from the prefix moments at a and b. With r the
/// bin nearest t (within `[a, b)`) and `d = r - t`, this is `A + 2 d B + d^2 C` for the exact
/// integers `A = sum c (k - r)^2`, `B = sum c (k - r)`, `C = sum c`: either |d| <= 1/2 or every
/// k - r has the sign of d, so the terms do not cancel.
#[inline(always)]
fn segment<T: Moment>(lo: [T; 3], hi: [T; 3], a: usize, b: usize, t: f64) -> f64 {
    let c = hi[0].sub(lo[0]);
    if a >= b || c == T::of(0) {
        return 0.0;
    }
    let (s1, s2) = (hi[1].sub(lo[1]), hi[2].sub(lo[2]));
    let r = round_half_even(t).clamp(a as f64, (b - 1) as f64);
    let ri = T::of(r as u64);
    let bsum = s1.sub(ri.mul(c));
    let asum = s2.sub(ri.mul(s1.add(bsum)));
    let d = r - t;
    (asum.small_f64() + d * (2.0 * bsum.signed_f64() + d * c.small_f64())).max(0.0)
}

/// The mean squared quantization error of the range `(low, high)` on `hist`.
pub fn range_error(
    hist: UniformHistogram<'_>,
    low: f64,
    high: f64,
    qtype: QType,
    symmetric: bool,
    rule: ScaleRule,
) -> f64 {
    ErrorTable::new(hist).mean_squared_error(&Quantizer::for_range(low, high, qtype, symmetric, rule))
}

/// Histograms and a small deterministic generator for the kernels' tests.
#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;
