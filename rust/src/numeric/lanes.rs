//! f32 and f64 as the lanes of vectorised kernels: the few operations the kernels share, and
//! f16 data widened to f32 for them.

use half::f16;

/// A float type a kernel computes in, lane by lane.
pub trait Lane: Copy + PartialOrd + std::ops::Mul<Output = Self> + 'static {
    const ZERO: Self;
    const INFINITY: Self;
    const NEG_INFINITY: Self;
    /// The largest exponent of a finite number.
    const MAX_EXP: i32;
    fn abs(self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn of_i32(i: i32) -> Self;
    /// `trunc(self)`.
    /// # Safety
    /// `self` must be finite and inside the i32 range.
    unsafe fn trunc_i32(self) -> i32;
    /// `2^k` (`k <= MAX_EXP`), exact down to the smallest subnormal, 0 below it.
    fn pow2(k: i32) -> Self;
}

macro_rules! lane {
    ($t:ty, $bits:ty, $mant:expr, $max_exp:expr) => {
        impl Lane for $t {
            const ZERO: Self = 0.0;
            const INFINITY: Self = <$t>::INFINITY;
            const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
            const MAX_EXP: i32 = $max_exp;
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                <$t>::min(self, o)
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                <$t>::max(self, o)
            }
            #[inline(always)]
            fn of_i32(i: i32) -> Self {
                i as $t
            }
            #[inline(always)]
            unsafe fn trunc_i32(self) -> i32 {
                unsafe { self.to_int_unchecked() }
            }
            fn pow2(k: i32) -> Self {
                assert!(k <= $max_exp);
                let min_normal = 1 - $max_exp;
                if k >= min_normal {
                    <$t>::from_bits(((k + $max_exp) as $bits) << $mant)
                } else if k >= min_normal - $mant {
                    <$t>::from_bits(1 << (k - min_normal + $mant))
                } else {
                    0.0
                }
            }
        }
    };
}
lane!(f32, u32, 23, 127);
lane!(f64, u64, 52, 1023);

/// f16 to f32 (exact), branch-free so it vectorises: normal numbers re-biased, subnormals
/// scaled from their integer mantissa, infinities and NaNs kept (NaN payloads may differ).
#[inline(always)]
fn widen_f16_impl(src: &[f16], dst: &mut [f32]) {
    for (o, h) in dst.iter_mut().zip(src) {
        let h = h.to_bits() as u32;
        let em = h & 0x7fff;
        let normal = (em << 13) + (112 << 23);
        let subnormal = (em as f32 * f32::from_bits(103 << 23)).to_bits(); // em * 2^-24
        let special = (em << 13) | 0x7f80_0000;
        let bits = if em < 0x400 {
            subnormal
        } else if em < 0x7c00 {
            normal
        } else {
            special
        };
        *o = f32::from_bits(bits | (h & 0x8000) << 16);
    }
}

crate::numeric::simd::dispatch_avx512!(pub fn widen_f16(src: &[f16], dst: &mut [f32]) -> () => widen_f16_impl);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_f16_widens_exactly() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for tier in [0u8, 1, 2] {
            crate::numeric::simd::set_max_tier(tier);
            let mut w = vec![0f32; all.len()];
            widen_f16(&all, &mut w);
            for (h, x) in all.iter().zip(&w) {
                let want = h.to_f32();
                assert!(
                    x.to_bits() == want.to_bits() || (x.is_nan() && want.is_nan()),
                    "{:#06x} tier {tier}",
                    h.to_bits()
                );
            }
        }
        crate::numeric::simd::set_max_tier(2);
    }
}
