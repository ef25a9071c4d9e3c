//! The element types histocal computes in (f32, f16, f64) and numpy's rounding rules for them.
//!
//! numpy evaluates f16 `+ - * /` in f32 and rounds once to f16; for these four operations that
//! equals a correctly rounded f16 operation, so every `T(a op b)` below is exact numpy behaviour.

use half::f16;
use std::fmt::Debug;

/// A float element type, with each arithmetic operation rounded to the type as numpy does.
pub trait Float: Copy + PartialOrd + PartialEq + Send + Sync + Debug + Default + 'static {
    /// numpy's dtype name.
    const NAME: &'static str;
    const ZERO: Self;
    /// The largest finite value.
    const MAX: f64;
    /// Round an f64 to this type directly (round to nearest even; f16 is NOT rounded via f32).
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    /// Round an f32 to this type.
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    /// numpy's float `floor_divide` (npy_divmod) in this type; f16 computes in f32 and rounds once.
    fn floor_divide(self, o: Self) -> Self;
    fn abs(self) -> Self;
    fn neg(self) -> Self;
    fn is_nan(self) -> bool;
    fn is_finite(self) -> bool;
    /// `T(i)`: an integer rounded to this type (f16 rounds above 2048).
    #[inline]
    fn from_usize(i: usize) -> Self {
        Self::from_f64(i as f64)
    }
}

/// numpy's `npy_divmodf` floor division, in f32 or f64 arithmetic.
macro_rules! floor_divide_impl {
    ($a:expr, $b:expr, $t:ty) => {{
        let (a, b): ($t, $t) = ($a, $b);
        if b == 0.0 {
            a / b
        } else {
            let mut m = a % b;
            let mut div = (a - m) / b;
            if m != 0.0 {
                if (b < 0.0) != (m < 0.0) {
                    m += b;
                    div -= 1.0;
                }
            }
            let _ = m;
            if div != 0.0 {
                let mut fl = div.floor();
                if div - fl > 0.5 {
                    fl += 1.0;
                }
                fl
            } else {
                (0.0 as $t).copysign(a / b)
            }
        }
    }};
}

/// `Float` for a native type (f32, f64): each operation is the type's own IEEE operation, which
/// is numpy's for that dtype (one rounding per operation); `floor_divide` is numpy's `npy_divmod`
/// in the type itself. The conversions are given per type (`as` rounds to nearest even).
macro_rules! native_float {
    (
        $t:ident, $name:literal, max: $max:expr,
        from_f64: |$a:ident| $from_f64:expr, to_f64: |$b:ident| $to_f64:expr,
        from_f32: |$c:ident| $from_f32:expr, to_f32: |$d:ident| $to_f32:expr $(,)?
    ) => {
        impl Float for $t {
            const NAME: &'static str = $name;
            const ZERO: Self = 0.0;
            const MAX: f64 = $max;
            #[inline(always)]
            fn from_f64($a: f64) -> Self {
                $from_f64
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                let $b = self;
                $to_f64
            }
            #[inline(always)]
            fn from_f32($c: f32) -> Self {
                $from_f32
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                let $d = self;
                $to_f32
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            fn floor_divide(self, o: Self) -> Self {
                floor_divide_impl!(self, o, $t)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                $t::abs(self)
            }
            #[inline(always)]
            fn neg(self) -> Self {
                -self
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
            #[inline(always)]
            fn is_finite(self) -> bool {
                $t::is_finite(self)
            }
        }
    };
}

native_float!(f32, "float32", max: f32::MAX as f64,
    from_f64: |x| x as f32, to_f64: |x| x as f64, from_f32: |x| x, to_f32: |x| x);
native_float!(f64, "float64", max: f64::MAX,
    from_f64: |x| x, to_f64: |x| x, from_f32: |x| x as f64, to_f32: |x| x as f32);

/// f16: numpy computes `+ - * /` in f32 and rounds once to f16 (exact, see the module documentation);
/// conversions from f64 round once (`f64_to_f16_bits`), never through f32.
impl Float for f16 {
    const NAME: &'static str = "float16";
    const ZERO: Self = f16::ZERO;
    const MAX: f64 = 65504.0;
    #[inline(always)]
    fn from_f64(x: f64) -> Self {
        f16::from_bits(f64_to_f16_bits(x))
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        f16::from_f32(self.to_f32() + o.to_f32())
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        f16::from_f32(self.to_f32() - o.to_f32())
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        f16::from_f32(self.to_f32() * o.to_f32())
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        f16::from_f32(self.to_f32() / o.to_f32())
    }
    fn floor_divide(self, o: Self) -> Self {
        f16::from_f32(floor_divide_impl!(self.to_f32(), o.to_f32(), f32))
    }
    #[inline(always)]
    fn abs(self) -> Self {
        f16::from_bits(self.to_bits() & 0x7fff)
    }
    #[inline(always)]
    fn neg(self) -> Self {
        -self
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        f16::is_nan(self)
    }
    #[inline(always)]
    fn is_finite(self) -> bool {
        f16::is_finite(self)
    }
}

/// f64 -> f16 with one round-to-nearest-even step, as numpy's `astype` does (the `half`
/// crate's conversion can round twice, through f32).
pub fn f64_to_f16_bits(x: f64) -> u16 {
    let sign: u16 = if x.is_sign_negative() { 0x8000 } else { 0 };
    if x.is_nan() {
        return sign | 0x7e00;
    }
    let a = x.abs();
    if a >= 65520.0 {
        return sign | 0x7c00; // rounds past the largest f16 (65504)
    }
    if a < 2f64.powi(-14) {
        // Subnormal (or zero): units of 2^-24, rounded once; 1024 carries into the exponent.
        return sign | (a * 2f64.powi(24)).round_ties_even() as u16;
    }
    let e = a.log2().floor() as i32;
    // log2 can be off by one near powers of two: fix so that 2^e <= a < 2^(e+1).
    let e = if 2f64.powi(e) > a {
        e - 1
    } else if 2f64.powi(e + 1) <= a {
        e + 1
    } else {
        e
    };
    let m = (a * 2f64.powi(10 - e)).round_ties_even() as u32; // in [1024, 2048]
    let (e, m) = if m == 2048 { (e + 1, 1024) } else { (e, m) };
    sign | (((e + 15) as u16) << 10) | (m - 1024) as u16
}

/// Python's `min(a, b)`: `b` if `b < a`, else `a` (a NaN on the left sticks).
#[inline]
pub fn py_min<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if b < a {
        b
    } else {
        a
    }
}

/// Python's `max(a, b)`: `b` if `b > a`, else `a`.
#[inline]
pub fn py_max<T: PartialOrd + Copy>(a: T, b: T) -> T {
    if b > a {
        b
    } else {
        a
    }
}

/// Exact widening of a data element `Self` into the histogram's arithmetic type `E`
/// (identity, or f16 -> f32/f64, f32 -> f64).
pub trait Widen<E>: Copy {
    fn widen(self) -> E;
}
impl Widen<f32> for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}
impl Widen<f64> for f64 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
}
impl Widen<f16> for f16 {
    #[inline(always)]
    fn widen(self) -> f16 {
        self
    }
}
impl Widen<f64> for f32 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self as f64
    }
}
impl Widen<f32> for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}
impl Widen<f64> for f16 {
    #[inline(always)]
    fn widen(self) -> f64 {
        self.to_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_to_f16_rounds_directly() {
        // 1 + 2^-11 + 2^-40 rounds up to the next f16 after 1.0; via f32 it would tie to 1.0.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(<f16 as Float>::from_f64(x).to_bits(), 0x3c01);
    }

    #[test]
    fn f64_to_f16_edge_cases() {
        let b = |x: f64| <f16 as Float>::from_f64(x).to_bits();
        assert_eq!(b(65519.99), 0x7bff);
        assert_eq!(b(65520.0), 0x7c00);
        assert_eq!(b(2.9802322387695312e-08), 0x0); // half of the smallest subnormal: ties to 0
        assert_eq!(b(8.940696716308594e-08), 0x2);
        assert_eq!(b(-0.0), 0x8000);
        assert_eq!(b(6.1e-5), 0x3ff);
        for i in 0..=0x7bffu16 {
            // every finite f16 round-trips
            assert_eq!(b(f16::from_bits(i).to_f64()), i);
        }
    }

    #[test]
    fn floor_divide_matches_numpy_examples() {
        // ORT's growth rule example: (3.3 - 2) // 0.5 = 2, (4.5 - 2) // 0.5 ... in f32.
        assert_eq!(Float::floor_divide(1.3f32, 0.5f32), 2.0);
        assert_eq!(Float::floor_divide(1.0f32, 0.5f32), 2.0);
        assert_eq!(Float::floor_divide(7.0f32, 2.0f32), 3.0);
        assert_eq!(Float::floor_divide(0.0f32, 2.0f32), 0.0);
        assert!(Float::floor_divide(f32::INFINITY, 2.0f32).is_nan());
    }

    #[test]
    fn python_min_max_semantics() {
        assert!(py_min(f32::NAN, 1.0).is_nan());
        assert_eq!(py_min(1.0, f32::NAN), 1.0);
        assert!(py_max(f32::NAN, 1.0).is_nan());
        assert_eq!(py_max(1.0f32, f32::NAN), 1.0);
    }
}
