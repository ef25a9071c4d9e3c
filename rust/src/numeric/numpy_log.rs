//! Bit-exact re-implementation of numpy's float32 `np.log`.
//!
//! ORT's calibration code calls `np.log` on float32 arrays, and numpy does not
//! use libm for that: on x86-64 it dispatches to a hand-written SIMD kernel,
//! `simd_log_FLOAT` in `numpy/_core/src/umath/loops_exponent_log.dispatch.c.src`
//! (entry point `FLOAT_log`). This module reproduces the **AVX2 + FMA3**
//! instantiation of that kernel (the one numpy 2.4.x selects on a CPU whose
//! best dispatch target is `X86_V3`, i.e. AVX2/FMA3 without AVX-512), which
//! works like this:
//!
//! 1. negative inputs are replaced by 0 (their result is overwritten later);
//! 2. subnormals are scaled by 2^100 so the exponent/mantissa split below sees
//!    a normal number, and 100 is taken back off the exponent;
//! 3. `x = m * 2^e` with `m` in [0.5, 1) taken straight from the bits; if
//!    `m <= 1/sqrt(2)` then `m *= 2, e -= 1`, so `m` lies in (0.707, 1.414];
//! 4. `log(m)` is a rational minimax approximation in `t = m - 1`: degree-5
//!    numerator over degree-5 denominator, each evaluated by Horner's rule with
//!    fused multiply-adds, then one (correctly rounded) division;
//! 5. result = `fma(e, ln2_f32, log(m))`;
//! 6. special lanes are overwritten: NaN -> +qNaN (0x7fc00000), x < 0
//!    (incl. -inf) -> -qNaN (0xffc00000), +-0 -> -inf, +inf -> +inf.
//!
//! Every step is an IEEE-754 single-precision operation with round-to-nearest,
//! so doing the same operations in the same order (with `f32::mul_add` exactly
//! where the kernel uses `_mm256_fmadd_ps`) yields the same bits.
//!
//! Verified bit-exact against numpy 2.4.6 on an AMD EPYC (`show_runtime`:
//! baseline X86_V2, found X86_V3, no AVX-512): every float32 bit pattern from
//! +0 to +inf (2,139,095,041 inputs), every NaN with the sign bit clear, all
//! -inf/negative-NaN patterns, and a stride-97/101 sample of the negatives,
//! with zero mismatches; the scalar and vectorised paths agree on all of them.
//!
//! **Caveat:** numpy picks the kernel at run time. On a CPU with AVX-512F/SKX
//! it uses the AVX-512 instantiation of this kernel (getexp/getmant instead of
//! the bit split), and on CPUs/builds without AVX2+FMA3 it falls back to the
//! C library's `logf`. On such machines numpy's results may differ from this
//! function by a few ulps.

// The coefficients are written exactly as numpy's header spells them (more
// digits than f32 holds); Rust, like the C compiler, rounds each literal once
// to the nearest f32. `constants_have_expected_bits` pins the results.
#![allow(clippy::excessive_precision)]

/// Numerator coefficients of the log(1+t) rational approximation (p0..p5).
const P0: f32 = 0.000000000000000000000e+00;
const P1: f32 = 9.999999999999998702752e-01;
const P2: f32 = 2.112677543073053063722e+00;
const P3: f32 = 1.480000633576506585156e+00;
const P4: f32 = 3.808837741388407920751e-01;
const P5: f32 = 2.589979117907922693523e-02;
/// Denominator coefficients (q0..q5).
const Q0: f32 = 1.000000000000000000000e+00;
const Q1: f32 = 2.612677543073109236779e+00;
const Q2: f32 = 2.453006071784736363091e+00;
const Q3: f32 = 9.864942958519418960339e-01;
const Q4: f32 = 1.546476374983906719538e-01;
const Q5: f32 = 5.875095403124574342950e-03;
/// ln(2) and 1/sqrt(2) rounded to f32 (numpy's NPY_LOGE2f / NPY_SQRT1_2f are
/// the same long literals, so the same f32 values).
const LN2: f32 = std::f32::consts::LN_2;
const SQRT1_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 2^100: multiplying a subnormal by this makes it normal, exactly.
const TWO_POW_100_BITS: u32 = 0x7180_0000;
/// The NaNs the kernel writes: +qNaN for NaN input, -qNaN for negative input.
const POS_QNAN_BITS: u32 = 0x7fc0_0000;
const NEG_QNAN_BITS: u32 = 0xffc0_0000;

/// One lane of the kernel. Written with selects only (no early returns) so
/// the slice loop below can be vectorised.
#[inline(always)]
pub(crate) fn log_lane(x_in: f32) -> f32 {
    // Lane classification on the *original* input (ordered compares, so NaN
    // is in none of the first three classes).
    let is_neg = x_in < 0.0;
    let is_zero = x_in == 0.0;
    let is_inf = x_in == f32::INFINITY;
    #[allow(clippy::eq_op)]
    let is_nan = x_in != x_in;

    // Negative lanes are computed as if the input were 0; overwritten below.
    let x = if is_neg { 0.0 } else { x_in };

    // Subnormals (and zero): scale into the normal range, remember the shift.
    let is_denorm = x < f32::MIN_POSITIVE;
    let x = if is_denorm { x * f32::from_bits(TWO_POW_100_BITS) } else { x };
    let bits = x.to_bits();

    // Exponent such that x = m * 2^e with m in [0.5, 1): biased exponent - 126.
    let e = ((bits >> 23) as i32 - 126) as f32;
    let e = if is_denorm { e - 100.0 } else { e };
    // Mantissa with the exponent field forced to 126 -> value in [0.5, 1).
    let m = f32::from_bits((bits & 0x007f_ffff) | (126 << 23));

    // Centre the reduced argument around 1 so |t| stays small.
    let small = m <= SQRT1_2;
    let m = if small { m + m } else { m };
    let e = if small { e - 1.0 } else { e };
    let t = m - 1.0;

    // Rational approximation of log(1 + t): Horner with FMAs, one division.
    let num = P5.mul_add(t, P4);
    let num = num.mul_add(t, P3);
    let num = num.mul_add(t, P2);
    let num = num.mul_add(t, P1);
    let num = num.mul_add(t, P0);
    let den = Q5.mul_add(t, Q4);
    let den = den.mul_add(t, Q3);
    let den = den.mul_add(t, Q2);
    let den = den.mul_add(t, Q1);
    let den = den.mul_add(t, Q0);
    let poly = num / den;
    let r = e.mul_add(LN2, poly);

    // Special lanes, same precedence as the kernel (the classes are disjoint).
    let r = if is_nan { f32::from_bits(POS_QNAN_BITS) } else { r };
    let r = if is_neg { f32::from_bits(NEG_QNAN_BITS) } else { r };
    let r = if is_zero { f32::NEG_INFINITY } else { r };
    if is_inf {
        f32::INFINITY
    } else {
        r
    }
}

/// numpy's float32 `np.log` (AVX2/FMA3 kernel), bit for bit.
///
/// `log_f32(x).to_bits() == np.log(np.float32(x)).view(np.uint32)` on a
/// numpy that dispatches `FLOAT_log` to the AVX2/FMA3 kernel.
#[inline]
pub fn log_f32(x: f32) -> f32 {
    log_lane(x)
}

/// Element-wise [`log_f32`]: `out[i] = log_f32(input[i])`.
///
/// Uses an AVX2+FMA build of the same loop when the CPU supports it
/// (identical bits: hardware FMA and `fmaf` are both exactly rounded), and a
/// portable loop otherwise.
///
/// # Panics
/// If `input.len() != out.len()`.
pub fn log_f32_slice(input: &[f32], out: &mut [f32]) {
    assert_eq!(input.len(), out.len(), "log_f32_slice: input and output lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the required CPU features were just detected.
            unsafe { log_slice_avx2_fma(input, out) };
            return;
        }
    }
    log_slice_portable(input, out);
}

/// Portable loop. Without a hardware FMA target feature, `mul_add` becomes a
/// call to libm `fmaf` per element, so this does not vectorise, but it gives
/// the same bits.
#[inline(always)]
fn log_slice_portable(input: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(input.iter()) {
        *o = log_lane(x);
    }
}

/// The same loop compiled with AVX2+FMA enabled: `mul_add` lowers to
/// `vfmadd*ps`, and LLVM vectorises the select-only body to 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn log_slice_avx2_fma(input: &[f32], out: &mut [f32]) {
    log_slice_portable(input, out);
}

/// Test-only access to the portable loop, so it can be compared with the
/// dispatched one on AVX2 machines.
#[cfg(test)]
fn log_f32_slice_portable(input: &[f32], out: &mut [f32]) {
    assert_eq!(input.len(), out.len());
    log_slice_portable(input, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (input bits, numpy 2.4.6 `np.log` output bits), taken from numpy on an
    /// AVX2/FMA3 (X86_V3) machine. Several are *not* the correctly rounded
    /// logf (e.g. 0x3f486945 is 4 ulp off, 0x3f7fffff and 0x3f3504f4 1 ulp),
    /// so these pin the kernel, not just "a good log".
    const CASES: &[(u32, u32)] = &[
        // around 1 and the sqrt(1/2) / sqrt(2) reduction boundary
        (0x3f80_0000, 0x0000_0000), // 1.0
        (0x3f80_0001, 0x33ff_fffe), // 1.0000001
        (0x3f7f_ffff, 0xb380_0001), // 0.99999994
        (0x3f48_6945, 0xbe7a_ae7a), // 0.7828563 (kernel's worst case, 4 ulp)
        (0x3f35_04f3, 0xbeb1_7218), // 0.70710677 (<= sqrt(1/2): doubled)
        (0x3f35_04f4, 0xbeb1_7215), // 0.7071068 (> sqrt(1/2))
        (0x3fb5_04f3, 0x3eb1_7218), // 1.4142135
        (0x4000_0000, 0x3f31_7218), // 2.0
        (0x3f00_0000, 0xbf31_7218), // 0.5
        (0x4049_0fdb, 0x3f92_8683), // pi
        // subnormals and the normal/subnormal boundary
        (0x0000_0001, 0xc2ce_8ed0), // 1e-45 (smallest subnormal)
        (0x0000_0002, 0xc2cd_2bec), // 3e-45
        (0x0001_2345, 0xc2b8_1e77), // 1.04488e-40
        (0x007f_ffff, 0xc2ae_ac50), // largest subnormal
        (0x0080_0000, 0xc2ae_ac50), // f32::MIN_POSITIVE
        (0x0080_0001, 0xc2ae_ac50),
        // small and large normals
        (0x3a83_126f, 0xc0dd_0c55), // 0.001
        (0x2edb_e6ff, 0xc1b8_34f1), // 1e-10
        (0x447a_0000, 0x40dd_0c55), // 1000.0
        (0x4b18_9680, 0x4180_f1dc), // 1e7
        (0x7149_f2ca, 0x428a_27b5), // 1e30
        (0x7f7f_ffff, 0x42b1_7218), // f32::MAX
        // special values
        (0x0000_0000, 0xff80_0000), // +0 -> -inf
        (0x8000_0000, 0xff80_0000), // -0 -> -inf
        (0x7f80_0000, 0x7f80_0000), // +inf -> +inf
        (0xff80_0000, 0xffc0_0000), // -inf -> -NaN
        (0x7fc0_0000, 0x7fc0_0000), // NaN -> +NaN
        (0xffc0_0000, 0x7fc0_0000), // -NaN -> +NaN
        (0x7f80_0001, 0x7fc0_0000), // signalling NaN -> +qNaN
        (0xbf80_0000, 0xffc0_0000), // -1.0 -> -NaN
        (0x8000_0001, 0xffc0_0000), // negative subnormal -> -NaN
    ];

    #[test]
    fn matches_numpy_reference_bits() {
        for &(xb, yb) in CASES {
            let got = log_f32(f32::from_bits(xb)).to_bits();
            assert_eq!(got, yb, "log_f32({xb:#010x}) = {got:#010x}, numpy {yb:#010x}");
        }
    }

    #[test]
    fn slice_matches_scalar() {
        let input: Vec<f32> = CASES
            .iter()
            .map(|&(xb, _)| f32::from_bits(xb))
            .chain((0..1000u32).map(|i| f32::from_bits(i.wrapping_mul(0x9E37_79B9))))
            .collect();
        let mut out = vec![0.0f32; input.len()];
        let mut out_portable = vec![0.0f32; input.len()];
        log_f32_slice(&input, &mut out);
        log_f32_slice_portable(&input, &mut out_portable);
        for i in 0..input.len() {
            let s = log_f32(input[i]).to_bits();
            assert_eq!(out[i].to_bits(), s, "dispatched slice, input {:#010x}", input[i].to_bits());
            assert_eq!(out_portable[i].to_bits(), s, "portable slice, input {:#010x}", input[i].to_bits());
        }
    }

    #[test]
    fn constants_have_expected_bits() {
        let got = [P0, P1, P2, P3, P4, P5, Q0, Q1, Q2, Q3, Q4, Q5, LN2, SQRT1_2].map(f32::to_bits);
        let want = [
            0x0000_0000,
            0x3f80_0000,
            0x4007_361c,
            0x3fbd_70a9,
            0x3ec3_0333,
            0x3cd4_2bcd,
            0x3f80_0000,
            0x4027_361c,
            0x401c_fe0d,
            0x3f7c_8ae4,
            0x3e1e_5bf3,
            0x3bc0_83df,
            0x3f31_7218,
            0x3f35_04f3,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn special_values() {
        assert_eq!(log_f32(f32::NAN).to_bits(), POS_QNAN_BITS);
        assert_eq!(log_f32(-f32::NAN).to_bits(), POS_QNAN_BITS);
        assert_eq!(log_f32(-1.0).to_bits(), NEG_QNAN_BITS);
        assert_eq!(log_f32(f32::NEG_INFINITY).to_bits(), NEG_QNAN_BITS);
        assert_eq!(log_f32(0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(-0.0), f32::NEG_INFINITY);
        assert_eq!(log_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(log_f32(1.0).to_bits(), 0);
    }
}
