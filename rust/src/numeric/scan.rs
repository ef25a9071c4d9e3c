//! One pass over a tensor: min/max (NaN-ignoring and finite-only), min |x|, and counts of
//! finite, NaN, +Inf and -Inf values. Parallel over fixed-size chunks; the result does not
//! depend on the thread count because every reduction here is order-independent.

use crate::numeric::float::Float;
use crate::numeric::lanes::{widen_f16, Lane};
use crate::numeric::view::View;
use half::f16;
use rayon::prelude::*;
use std::any::TypeId;

/// Chunk size for splitting one tensor across threads (fixed, never derived from the pool).
pub const PAR_CHUNK: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scan<T> {
    /// Min/max over finite values (None when there are none).
    pub finite_min: Option<T>,
    pub finite_max: Option<T>,
    /// Smallest and largest |x| over finite values.
    pub finite_abs_min: Option<T>,
    pub finite_abs_max: Option<T>,
    pub n_finite: u64,
    pub n_nan: u64,
    pub n_posinf: u64,
    pub n_neginf: u64,
}

impl<T: Float> Scan<T> {
    pub fn empty() -> Self {
        Scan {
            finite_min: None,
            finite_max: None,
            finite_abs_min: None,
            finite_abs_max: None,
            n_finite: 0,
            n_nan: 0,
            n_posinf: 0,
            n_neginf: 0,
        }
    }

    pub fn len(&self) -> u64 {
        self.n_finite + self.n_nan + self.n_posinf + self.n_neginf
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `np.nanmin`: the minimum ignoring NaN (±Inf included); None when all values are NaN.
    pub fn nan_min(&self) -> Option<T> {
        if self.n_neginf > 0 {
            Some(T::from_f64(f64::NEG_INFINITY))
        } else if self.finite_min.is_some() {
            self.finite_min
        } else if self.n_posinf > 0 {
            Some(T::from_f64(f64::INFINITY))
        } else {
            None
        }
    }

    /// `np.nanmax`: the maximum ignoring NaN; None when all values are NaN.
    pub fn nan_max(&self) -> Option<T> {
        if self.n_posinf > 0 {
            Some(T::from_f64(f64::INFINITY))
        } else if self.finite_max.is_some() {
            self.finite_max
        } else if self.n_neginf > 0 {
            Some(T::from_f64(f64::NEG_INFINITY))
        } else {
            None
        }
    }

    pub fn merge(self, o: Self) -> Self {
        fn pick<T: Float>(a: Option<T>, b: Option<T>, take_b: fn(T, T) -> bool) -> Option<T> {
            match (a, b) {
                (Some(x), Some(y)) => Some(if take_b(x, y) { y } else { x }),
                (x, None) => x,
                (None, y) => y,
            }
        }
        Scan {
            finite_min: pick(self.finite_min, o.finite_min, |x, y| y < x),
            finite_max: pick(self.finite_max, o.finite_max, |x, y| y > x),
            finite_abs_min: pick(self.finite_abs_min, o.finite_abs_min, |x, y| y < x),
            finite_abs_max: pick(self.finite_abs_max, o.finite_abs_max, |x, y| y > x),
            n_finite: self.n_finite + o.n_finite,
            n_nan: self.n_nan + o.n_nan,
            n_posinf: self.n_posinf + o.n_posinf,
            n_neginf: self.n_neginf + o.n_neginf,
        }
    }
}

/// `block` as a slice of `T` when `D` is `T`.
fn cast<D: 'static, T: 'static>(block: &[D]) -> Option<&[T]> {
    // SAFETY: D and T are the same type.
    (TypeId::of::<D>() == TypeId::of::<T>())
        .then(|| unsafe { std::slice::from_raw_parts(block.as_ptr() as *const T, block.len()) })
}

/// The same scan in another type holding the same values (f32 <-> f16 data, f64).
pub(crate) fn retype<T: Float, D: Float>(s: Scan<T>) -> Scan<D> {
    let r = |v: Option<T>| v.map(|x| D::from_f64(x.to_f64()));
    Scan {
        finite_min: r(s.finite_min),
        finite_max: r(s.finite_max),
        finite_abs_min: r(s.finite_abs_min),
        finite_abs_max: r(s.finite_abs_max),
        n_finite: s.n_finite,
        n_nan: s.n_nan,
        n_posinf: s.n_posinf,
        n_neginf: s.n_neginf,
    }
}

/// Values of f16 data widened per kernel call.
const WIDEN_BLOCK: usize = 4096;

/// Scan one contiguous block with a lane kernel: f32 and f64 as they are, f16 widened to f32
/// (exactly). For f16 and f64, when the minimum or maximum is zero, its sign is the block's
/// first zero's: a tie between -0 and +0 goes to the first, as in the plain loop these types
/// had (the f32 kernel keeps its own lane order).
fn scan_block<D: Float>(block: &[D]) -> Scan<D> {
    if let Some(b) = cast::<D, f32>(block) {
        return retype(scan_f32(b));
    }
    let mut s: Scan<D> = if let Some(b) = cast::<D, f64>(block) {
        retype(scan_f64(b))
    } else {
        let halves = cast::<D, f16>(block).expect("data is f16, f32 or f64");
        let mut wide = vec![0f32; WIDEN_BLOCK.min(block.len())];
        let mut acc = Scan::empty();
        for piece in halves.chunks(WIDEN_BLOCK) {
            let w = &mut wide[..piece.len()];
            widen_f16(piece, w);
            acc = acc.merge(retype(scan_f32(w)));
        }
        acc
    };
    let first_zero = || block.iter().copied().find(|&x| x == D::ZERO);
    if s.finite_min == Some(D::ZERO) {
        s.finite_min = first_zero();
    }
    if s.finite_max == Some(D::ZERO) {
        s.finite_max = first_zero();
    }
    s
}

/// Scan a block of lanes (f32 or f64) with its vectorised kernel (no zero-sign rule).
pub(crate) fn scan_lanes_block<T: Lane + Float>(b: &[T]) -> Scan<T> {
    match (cast::<T, f32>(b), cast::<T, f64>(b)) {
        (Some(b), _) => retype(scan_f32(b)),
        (_, Some(b)) => retype(scan_f64(b)),
        _ => unreachable!("lanes are f32 or f64"),
    }
}

crate::numeric::simd::dispatch_avx2!(fn scan_f32(b: &[f32]) -> Scan<f32> => scan_f32_impl);
crate::numeric::simd::dispatch_avx512!(fn scan_f64(b: &[f64]) -> Scan<f64> => scan_f64_impl);

#[inline(always)]
fn scan_f32_impl(b: &[f32]) -> Scan<f32> {
    scan_lanes(b)
}

#[inline(always)]
fn scan_f64_impl(b: &[f64]) -> Scan<f64> {
    scan_lanes(b)
}

/// The hot path, written branch-free in 8 lanes so LLVM vectorises it.
#[inline(always)]
#[allow(clippy::eq_op)] // `v != v` is the NaN test, in a form that vectorises
fn scan_lanes<T: Lane + Float>(b: &[T]) -> Scan<T> {
    const L: usize = 8;
    let mut mn = [T::INFINITY; L];
    let mut mx = [T::NEG_INFINITY; L];
    let mut amn = [T::INFINITY; L];
    let mut amx = [T::NEG_INFINITY; L];
    let mut n_nan = [0u32; L];
    let mut n_pinf = [0u32; L];
    let mut n_ninf = [0u32; L];
    let (mut tot_nan, mut tot_pinf, mut tot_ninf) = (0u64, 0u64, 0u64);
    // Counters are u32 per lane: flush every 2^20 chunks of 8 to avoid overflow.
    for big in b.chunks(L << 20) {
        let chunks = big.chunks_exact(L);
        let rest = chunks.remainder();
        for c in chunks {
            for j in 0..L {
                let v = c[j];
                let a = Lane::abs(v);
                let fin = a < T::INFINITY; // false for NaN and ±Inf
                let vf = if fin { v } else { T::INFINITY };
                let vg = if fin { v } else { T::NEG_INFINITY };
                let af = if fin { a } else { T::INFINITY };
                let ag = if fin { a } else { T::NEG_INFINITY };
                mn[j] = if vf < mn[j] { vf } else { mn[j] };
                mx[j] = if vg > mx[j] { vg } else { mx[j] };
                amn[j] = if af < amn[j] { af } else { amn[j] };
                amx[j] = if ag > amx[j] { ag } else { amx[j] };
                n_nan[j] += (v != v) as u32;
                n_pinf[j] += (v == T::INFINITY) as u32;
                n_ninf[j] += (v == T::NEG_INFINITY) as u32;
            }
        }
        for (j, &v) in rest.iter().enumerate() {
            let a = Lane::abs(v);
            let fin = a < T::INFINITY;
            if fin {
                mn[j] = Lane::min(mn[j], v);
                mx[j] = Lane::max(mx[j], v);
                amn[j] = Lane::min(amn[j], a);
                amx[j] = Lane::max(amx[j], a);
            }
            n_nan[j] += (v != v) as u32;
            n_pinf[j] += (v == T::INFINITY) as u32;
            n_ninf[j] += (v == T::NEG_INFINITY) as u32;
        }
        for j in 0..L {
            tot_nan += n_nan[j] as u64;
            tot_pinf += n_pinf[j] as u64;
            tot_ninf += n_ninf[j] as u64;
            n_nan[j] = 0;
            n_pinf[j] = 0;
            n_ninf[j] = 0;
        }
    }
    let n_fin = b.len() as u64 - tot_nan - tot_pinf - tot_ninf;
    let red = |a: [T; L], f: fn(T, T) -> T| a.iter().copied().fold(a[0], f);
    let some = |v: T| if n_fin > 0 { Some(v) } else { None };
    Scan {
        finite_min: some(red(mn, Lane::min)),
        finite_max: some(red(mx, Lane::max)),
        finite_abs_min: some(red(amn, Lane::min)),
        finite_abs_max: some(red(amx, Lane::max)),
        n_finite: n_fin,
        n_nan: tot_nan,
        n_posinf: tot_pinf,
        n_neginf: tot_ninf,
    }
}

/// Scan a whole view, in parallel over fixed chunks.
pub fn scan<D: Float>(view: &View<'_, D>) -> Scan<D> {
    let n = view.len();
    let chunks = n.div_ceil(PAR_CHUNK).max(1);
    (0..chunks)
        .into_par_iter()
        .map(|c| {
            let mut acc = Scan::empty();
            view.for_each_block(c * PAR_CHUNK..((c + 1) * PAR_CHUNK).min(n), |b| acc = acc.merge(scan_block(b)));
            acc
        })
        .reduce(Scan::empty, Scan::merge)
}

/// Scan several views (the batches of one collect) as one.
pub fn scan_all<D: Float>(views: &[View<'_, D>]) -> Scan<D> {
    views.iter().map(scan).fold(Scan::empty(), Scan::merge)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain loop f16 and f64 blocks were scanned with before their lane kernels (the
    /// reference): widen to f64, fold in order.
    fn reference<D: Float>(block: &[D]) -> Scan<D> {
        let mut mn = f64::INFINITY;
        let mut mx = f64::NEG_INFINITY;
        let mut amn = f64::INFINITY;
        let mut amx = f64::NEG_INFINITY;
        let (mut n_fin, mut n_nan, mut n_pinf, mut n_ninf) = (0u64, 0u64, 0u64, 0u64);
        for &d in block {
            let v = d.to_f64();
            if v.is_finite() {
                n_fin += 1;
                mn = mn.min(v);
                mx = mx.max(v);
                amn = amn.min(v.abs());
                amx = amx.max(v.abs());
            } else if v.is_nan() {
                n_nan += 1;
            } else if v > 0.0 {
                n_pinf += 1;
            } else {
                n_ninf += 1;
            }
        }
        let some = |v: f64| if n_fin > 0 { Some(D::from_f64(v)) } else { None };
        Scan {
            finite_min: some(mn),
            finite_max: some(mx),
            finite_abs_min: some(amn),
            finite_abs_max: some(amx),
            n_finite: n_fin,
            n_nan,
            n_posinf: n_pinf,
            n_neginf: n_ninf,
        }
    }

    /// A scan's values as bits (so that -0 and +0 differ) and its counts.
    fn bits<D: Float>(s: &Scan<D>) -> ([Option<u64>; 4], [u64; 4]) {
        let b = |v: Option<D>| v.map(|x| x.to_f64().to_bits());
        (
            [b(s.finite_min), b(s.finite_max), b(s.finite_abs_min), b(s.finite_abs_max)],
            [s.n_finite, s.n_nan, s.n_posinf, s.n_neginf],
        )
    }

    /// `scan` of `data` (contiguous, and every other element) against the reference, at every
    /// dispatch tier.
    fn check<D: Float>(data: &[D], what: &str) {
        for tier in [0u8, 1, 2] {
            crate::numeric::simd::set_max_tier(tier);
            assert_eq!(
                bits(&scan(&View::from_slice(data))),
                bits(&reference(data)),
                "{what} ({}, tier {tier})",
                D::NAME
            );
            let odd = data.len() / 2;
            let v = unsafe { View::from_raw(data.as_ptr(), &[odd], &[2]) };
            let every_other: Vec<D> = data.iter().step_by(2).take(odd).copied().collect();
            assert_eq!(bits(&scan(&v)), bits(&reference(&every_other)), "{what} strided ({}, tier {tier})", D::NAME);
        }
        crate::numeric::simd::set_max_tier(2);
    }

    /// Signed zeros placed so that the first zero, and the zero each lane sees first, differ;
    /// with and without values on either side.
    fn zero_patterns() -> Vec<(String, Vec<f64>)> {
        let mut out = Vec::new();
        for n in [1usize, 7, 9, 17, 100, 5000] {
            for first_neg in [false, true] {
                for pos in [0usize, 1, 8, n / 2, n.saturating_sub(1)] {
                    for side in [0.0f64, 1.5, -1.5] {
                        let mut v: Vec<f64> = (0..n)
                            .map(|i| {
                                if i % 3 == 0 {
                                    0.0
                                } else if side == 0.0 {
                                    -0.0
                                } else {
                                    side * (1.0 + i as f64)
                                }
                            })
                            .collect();
                        let p = pos.min(n - 1);
                        v[p] = if first_neg { -0.0 } else { 0.0 };
                        for x in v[..p].iter_mut() {
                            if *x == 0.0 {
                                *x = if side < 0.0 { -2.0 } else { 2.0 }; // no zero before p
                            }
                        }
                        out.push((format!("n {n} first zero at {p} negative {first_neg} side {side}"), v));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn f16_and_f64_match_the_plain_loop() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let all_f16: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        check(&all_f16, "every f16");
        let mut shuffled = all_f16.clone();
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, next() as usize % (i + 1));
        }
        check(&shuffled, "every f16, shuffled");
        let wide: Vec<f64> = (0..100_000)
            .map(|_| f64::from_bits(next()))
            .chain([f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MAX, -f64::MAX, 5e-324, -5e-324])
            .collect();
        check(&wide, "random f64 bits");
        for (what, v) in zero_patterns() {
            check(&v, &what);
            let h: Vec<f16> = v.iter().map(|&x| f16::from_f64(x)).collect();
            check(&h, &what);
        }
    }

    #[test]
    fn counts_and_extremes_ignore_non_finite() {
        let v = [1.0f32, f32::NAN, -3.0, f32::INFINITY, 2.0, f32::NEG_INFINITY, -0.5, f32::NAN, 7.0];
        let s = scan(&View::from_slice(&v));
        assert_eq!(s.finite_min, Some(-3.0));
        assert_eq!(s.finite_max, Some(7.0));
        assert_eq!(s.finite_abs_min, Some(0.5));
        assert_eq!((s.n_finite, s.n_nan, s.n_posinf, s.n_neginf), (5, 2, 1, 1));
        assert_eq!(s.nan_min(), Some(f32::NEG_INFINITY));
        assert_eq!(s.nan_max(), Some(f32::INFINITY));
    }

    #[test]
    fn all_nan_and_empty() {
        let s = scan(&View::from_slice(&[f32::NAN; 3]));
        assert_eq!(s.finite_min, None);
        assert_eq!(s.nan_min(), None);
        let e: [f32; 0] = [];
        assert_eq!(scan(&View::from_slice(&e)).len(), 0);
    }

    #[test]
    fn f16_and_large_inputs_match_a_plain_loop() {
        let v: Vec<f16> = (0..5000).map(|i| f16::from_f32(((i * 37) % 1001) as f32 - 500.0)).collect();
        let s = scan(&View::from_slice(&v));
        assert_eq!(s.finite_min.unwrap().to_f32(), -500.0);
        assert_eq!(s.finite_max.unwrap().to_f32(), 500.0);
        let big: Vec<f32> = (0..3_000_001i64).map(|i| ((i * 7919) % 100_003) as f32 - 50_000.0).collect();
        let s = scan(&View::from_slice(&big));
        assert_eq!(s.finite_min, Some(-50000.0));
        assert_eq!(s.finite_max, Some(50002.0));
        assert_eq!(s.n_finite, 3_000_001);
    }
}
