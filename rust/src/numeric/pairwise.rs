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
#[inline]
pub fn sum_f32(a: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::numeric::simd::has_avx2_fma() {
        // SAFETY: the CPU features were just detected.
        return 0.0 + unsafe { pairwise_f32_avx2(a) };
    }
    0.0 + pairwise_f32_dispatch(a)
}

/// numpy's pairwise order over a slice, recursing inside one AVX2 function (no dispatch per
/// level): the 8 accumulators of a block of at most 128 are one register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn pairwise_f32_avx2(a: &[f32]) -> f32 {
    unsafe {
        use std::arch::x86_64::*;
        let n = a.len();
        if n < 8 {
            let mut res = -0.0f32;
            for &x in a {
                res += x;
            }
            res
        } else if n <= BLOCK {
            let full = n - n % 8;
            let p = a.as_ptr();
            let mut r = _mm256_loadu_ps(p);
            let mut i = 8;
            while i < full {
                r = _mm256_add_ps(r, _mm256_loadu_ps(p.add(i)));
                i += 8;
            }
            let mut l = [0.0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), r);
            let mut res = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
            for &x in &a[full..] {
                res += x;
            }
            res
        } else {
            let mut n2 = n / 2;
            n2 -= n2 % 8;
            pairwise_f32_avx2(&a[..n2]) + pairwise_f32_avx2(&a[n2..])
        }
    }
}

/// numpy's 8 accumulators over a multiple-of-8 run: lane j sums a[j], a[j+8], a[j+16], ...
#[inline(always)]
fn lanes8(a: &[f32]) -> [f32; 8] {
    #[cfg(target_arch = "x86_64")]
    if crate::numeric::simd::has_avx2_fma() {
        use std::arch::x86_64::*;
        // SAFETY: AVX is available (implied by AVX2); loads stay inside `a` (len % 8 == 0).
        unsafe {
            let mut r = _mm256_loadu_ps(a.as_ptr());
            let mut i = 8;
            while i < a.len() {
                r = _mm256_add_ps(r, _mm256_loadu_ps(a.as_ptr().add(i)));
                i += 8;
            }
            let mut out = [0.0f32; 8];
            _mm256_storeu_ps(out.as_mut_ptr(), r);
            return out;
        }
    }
    let mut r = [0.0f32; 8];
    r.copy_from_slice(&a[..8]);
    for c in a[8..].chunks_exact(8) {
        for j in 0..8 {
            r[j] += c[j];
        }
    }
    r
}

crate::numeric::simd::dispatch_avx2!(fn pairwise_f32_dispatch(a: &[f32]) -> f32 => pairwise_f32_slice);

/// The same association order as `pairwise`, over a slice, in a form LLVM vectorises
/// (the 8 accumulators are one SIMD register). The recursion only splits blocks > 128, so the
/// inlined copy below the dispatcher recurses through the dispatcher's own variant.
#[inline(always)]
fn pairwise_f32_slice(a: &[f32]) -> f32 {
    let n = a.len();
    if n < 8 {
        let mut res = -0.0f32;
        for &x in a {
            res += x;
        }
        res
    } else if n <= BLOCK {
        let full = n - n % 8;
        let r = lanes8(&a[..full]);
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[full..] {
            res += x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_f32_dispatch(&a[..n2]) + pairwise_f32_dispatch(&a[n2..])
    }
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
    fn slice_and_closure_forms_agree() {
        let a: Vec<f32> =
            (0..5000).map(|i| ((i * 7919) % 1013) as f32 * 1.37e-3 + 1e4 * ((i % 97 == 0) as i32 as f32)).collect();
        for n in [0, 3, 8, 100, 128, 129, 1000, 5000] {
            assert_eq!(sum_f32(&a[..n]).to_bits(), sum_f32_by(n, |i| a[i]).to_bits());
        }
    }

    #[test]
    fn slice_forms_agree_for_all_lengths() {
        let a: Vec<f32> =
            (0..3000).map(|i| ((i * 7919) % 1013) as f32 * 1.37e-3 + 1e5 * ((i % 89 == 0) as i32 as f32)).collect();
        for n in 0..3000 {
            assert_eq!(sum_f32(&a[..n]).to_bits(), sum_f32_by(n, |i| a[i]).to_bits(), "n={n}");
            assert_eq!((0.0 + pairwise_f32_dispatch(&a[..n])).to_bits(), sum_f32_by(n, |i| a[i]).to_bits(), "n={n}");
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
