//! numpy's pairwise summation (`np.sum` / `add.reduce` over a contiguous run).
//!
//! The exact association order matters: ORT's KL sums (f32), Distribution moments (f64) and
//! MinMax's per-tensor `nanmean` all go through it, and a different order changes low bits.

use std::ops::Add;

const BLOCK: usize = 128;

/// Sum `n` values read through `get` in numpy's pairwise order, accumulating in `A`.
#[inline]
fn pairwise<A, F>(get: &F, start: usize, n: usize) -> A
where
    A: Copy + Add<Output = A> + NegZero,
    F: Fn(usize) -> A,
{
    if n < 8 {
        let mut res = A::NEG_ZERO;
        for i in 0..n {
            res = res + get(start + i);
        }
        res
    } else if n <= BLOCK {
        let mut r = [A::NEG_ZERO; 8];
        for (j, rj) in r.iter_mut().enumerate() {
            *rj = get(start + j);
        }
        let mut i = 8;
        while i < n - (n % 8) {
            for (j, rj) in r.iter_mut().enumerate() {
                *rj = *rj + get(start + i + j);
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res = res + get(start + i);
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise(get, start, n2) + pairwise(get, start + n2, n - n2)
    }
}

/// Accumulator types: numpy starts short sums from -0.0.
pub trait NegZero {
    const NEG_ZERO: Self;
}
impl NegZero for f32 {
    const NEG_ZERO: Self = -0.0;
}
impl NegZero for f64 {
    const NEG_ZERO: Self = -0.0;
}

/// `np.sum(a)` for an f32 array (the reduction starts from the identity +0.0).
pub fn sum_f32(a: &[f32]) -> f32 {
    0.0 + pairwise(&|i| a[i], 0, a.len())
}

/// `np.sum(a)` for an f64 array.
pub fn sum_f64(a: &[f64]) -> f64 {
    0.0 + pairwise(&|i| a[i], 0, a.len())
}

/// `np.sum` of `n` f64 values produced by `get(i)` (e.g. products computed on the fly).
pub fn sum_f64_by<F: Fn(usize) -> f64>(n: usize, get: F) -> f64 {
    0.0 + pairwise(&get, 0, n)
}

/// `np.sum` of `n` f32 values produced by `get(i)`.
pub fn sum_f32_by<F: Fn(usize) -> f32>(n: usize, get: F) -> f32 {
    0.0 + pairwise(&get, 0, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_blocked_sums_are_exact_for_integers() {
        for n in [0usize, 1, 7, 8, 9, 127, 128, 129, 1000, 70001] {
            let a: Vec<f64> = (0..n).map(|i| i as f64).collect();
            assert_eq!(sum_f64(&a), (n * n.saturating_sub(1) / 2) as f64);
        }
    }

    #[test]
    fn association_order_is_numpys() {
        // 8 accumulators: 1e8 + 1 + ... in f32 loses the ones sequentially but keeps them when
        // they are grouped in their own accumulator lanes.
        let mut a = vec![1.0f32; 16];
        a[0] = 1e8;
        // lanes: r0 = 1e8 + 1 (rounds to 1e8), r1..r7 = 2; numpy gives 1.0000001e+08.
        assert_eq!(sum_f32(&a), 1.0000001e8);
    }
}
