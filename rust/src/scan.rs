//! One pass over a tensor: min/max (NaN-ignoring and finite-only), min |x|, and counts of
//! finite, NaN, +Inf and -Inf values. Parallel over fixed-size chunks; the result does not
//! depend on the thread count because every reduction here is order-independent.

use crate::float::Float;
use crate::view::View;
use rayon::prelude::*;

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

/// Scan one contiguous block (f32 has a vectorised path; f16 and f64 go through f64).
fn scan_block<D: Float>(block: &[D]) -> Scan<D> {
    let mut mn = f64::INFINITY;
    let mut mx = f64::NEG_INFINITY;
    let mut amn = f64::INFINITY;
    let mut amx = f64::NEG_INFINITY;
    let (mut n_fin, mut n_nan, mut n_pinf, mut n_ninf) = (0u64, 0u64, 0u64, 0u64);
    if std::any::TypeId::of::<D>() == std::any::TypeId::of::<f32>() {
        // SAFETY: D is f32 (checked above).
        let b: &[f32] = unsafe { std::slice::from_raw_parts(block.as_ptr() as *const f32, block.len()) };
        let r = scan_f32(b);
        return Scan {
            finite_min: r.finite_min.map(|v| D::from_f32(v)),
            finite_max: r.finite_max.map(|v| D::from_f32(v)),
            finite_abs_min: r.finite_abs_min.map(|v| D::from_f32(v)),
            finite_abs_max: r.finite_abs_max.map(|v| D::from_f32(v)),
            n_finite: r.n_finite,
            n_nan: r.n_nan,
            n_posinf: r.n_posinf,
            n_neginf: r.n_neginf,
        };
    }
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

crate::simd::dispatch_avx2!(fn scan_f32(b: &[f32]) -> Scan<f32> => scan_f32_impl);

/// The f32 hot path, written branch-free in 8 lanes so LLVM vectorises it.
#[inline(always)]
fn scan_f32_impl(b: &[f32]) -> Scan<f32> {
    const L: usize = 8;
    let mut mn = [f32::INFINITY; L];
    let mut mx = [f32::NEG_INFINITY; L];
    let mut amn = [f32::INFINITY; L];
    let mut amx = [f32::NEG_INFINITY; L];
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
                let a = v.abs();
                let fin = a < f32::INFINITY; // false for NaN and ±Inf
                let vf = if fin { v } else { f32::INFINITY };
                let vg = if fin { v } else { f32::NEG_INFINITY };
                let af = if fin { a } else { f32::INFINITY };
                let ag = if fin { a } else { f32::NEG_INFINITY };
                mn[j] = if vf < mn[j] { vf } else { mn[j] };
                mx[j] = if vg > mx[j] { vg } else { mx[j] };
                amn[j] = if af < amn[j] { af } else { amn[j] };
                amx[j] = if ag > amx[j] { ag } else { amx[j] };
                n_nan[j] += (v != v) as u32;
                n_pinf[j] += (v == f32::INFINITY) as u32;
                n_ninf[j] += (v == f32::NEG_INFINITY) as u32;
            }
        }
        for (j, &v) in rest.iter().enumerate() {
            let a = v.abs();
            let fin = a < f32::INFINITY;
            if fin {
                mn[j] = mn[j].min(v);
                mx[j] = mx[j].max(v);
                amn[j] = amn[j].min(a);
                amx[j] = amx[j].max(a);
            }
            n_nan[j] += (v != v) as u32;
            n_pinf[j] += (v == f32::INFINITY) as u32;
            n_ninf[j] += (v == f32::NEG_INFINITY) as u32;
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
    let red = |a: [f32; L], f: fn(f32, f32) -> f32| a.iter().copied().fold(a[0], f);
    let some = |v: f32| if n_fin > 0 { Some(v) } else { None };
    Scan {
        finite_min: some(red(mn, f32::min)),
        finite_max: some(red(mx, f32::max)),
        finite_abs_min: some(red(amn, f32::min)),
        finite_abs_max: some(red(amx, f32::max)),
        n_finite: n_fin,
        n_nan: tot_nan,
        n_posinf: tot_pinf,
        n_neginf: tot_ninf,
    }
}

/// Scan a whole view, in parallel over fixed chunks.
pub fn scan<D: Float>(view: &View<D>) -> Scan<D> {
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
pub fn scan_all<D: Float>(views: &[View<D>]) -> Scan<D> {
    views.iter().map(scan).fold(Scan::empty(), Scan::merge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

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
