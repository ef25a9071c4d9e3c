//! Counting into explicit edges (`np.histogram(x, bins=edges)`, the symmetric-percentile
//! merges): exact membership, compared in f64, interior bins half-open and the last closed.
//! f32 data takes a vectorised path whose thresholds are the f32 images of the edges, so that
//! every comparison is unchanged.

use crate::numeric::fallible;
use crate::numeric::float::Float;
use crate::numeric::view::View;
use crate::ort::histogram::{add_counted, count_chunks, SubHist, FAST_BLOCK};

/// Count the absolute values of `view` into explicit, non-decreasing f64 `edges` (numpy's `searchsorted` rule):
/// bin i holds `edges[i] <= v < edges[i+1]`, the last bin also `v == edges[n]`.
///
/// The edges may end in `+inf` (ORT's stored f16 edges past 65504): then the bin ending at the
/// first `inf` holds every finite `v` from the edge before it, the `[inf, inf)` bins stay empty
/// and `v == inf` goes to the last bin, as numpy's searchsorted puts it.
pub fn count_abs_explicit<D: Float>(view: &View<'_, D>, edges: &[f64], counts: &mut [i64]) {
    let n = edges.len() - 1;
    assert_eq!(counts.len(), n);
    let fast = ExplicitF32::new::<D>(edges);
    let (lo, hi) = (edges[0], edges[n]);
    // Bins are close to uniform up to the last finite edge: estimate from their mean width, then
    // walk to the exact bin (a finite v never walks into the infinite edges).
    let top = edges.iter().rposition(|e| e.is_finite()).unwrap_or(0);
    let width = if top > 0 { (edges[top] - lo) / top as f64 } else { 0.0 };
    let bin_of = |v: f64| -> Option<usize> {
        if !(v >= lo && v <= hi) {
            return None;
        }
        if v == f64::INFINITY {
            return Some(n - 1); // only in range when hi is inf: the closed last bin
        }
        let mut i = if width > 0.0 { (((v - lo) / width) as usize).min(top).min(n - 1) } else { 0 };
        while i > 0 && v < edges[i] {
            i -= 1;
        }
        while i < n - 1 && v >= edges[i + 1] {
            i += 1;
        }
        Some(i)
    };
    let count_scalar = |b: &[D], local: &mut [i64]| {
        for &d in b {
            if let Some(i) = bin_of(d.to_f64().abs()) {
                local[i] += 1;
            }
        }
    };
    let len = view.len();
    let counted = count_chunks(len, n, |range, local| {
        if let Some(f) = &fast {
            let mut sub = SubHist::new(n)?;
            // SAFETY: `ExplicitF32::new` is Some only when D is f32.
            view.for_each_block(range, |b| f.count(unsafe { std::mem::transmute::<&[D], &[f32]>(b) }, &mut sub));
            sub.add_to(local);
        } else {
            view.for_each_block(range, |b| count_scalar(b, local));
        }
        Some(())
    });
    if !add_counted(counted, counts) {
        view.for_each_block(0..len, |b| count_scalar(b, counts));
    }
}

/// The smallest f32 >= x (+inf above f32::MAX); x finite.
fn f32_at_or_above(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) < x {
        f32_next_up(f)
    } else {
        f
    }
}

/// The largest f32 <= x (-inf below -f32::MAX); x finite.
fn f32_at_or_below(x: f64) -> f32 {
    -f32_at_or_above(-x)
}

/// The largest f32 below `f` (f finite or +inf).
fn f32_next_down(f: f32) -> f32 {
    -f32_next_up(-f)
}

fn f32_next_up(f: f32) -> f32 {
    // f is finite or -inf, never NaN or +inf here.
    if f == 0.0 {
        f32::from_bits(1)
    } else if f > 0.0 {
        f32::from_bits(f.to_bits() + 1)
    } else {
        f32::from_bits(f.to_bits() - 1)
    }
}

/// `count_abs_explicit` for f32 data. For an f32 `v`, `v >= e` (compared in f64) is exactly
/// `v >= e32` with `e32` the smallest f32 at or above `e`, and `v <= e` is `v <= ` the
/// largest f32 at or below `e`; so the f64 edges become f32 thresholds without changing any
/// comparison. A vectorised pass estimates each bin from the mean width; the scalar pass
/// corrects it one step each way, checks the result, and walks in the (rare) remaining cases.
pub(crate) struct ExplicitF32 {
    lo: f32,
    hi: f32,
    scale: f32,
    n: usize,
    /// Thresholds 0..n, then -inf and NaN so the dummy bin n never moves.
    t: Vec<f32>,
    /// True when the biased estimate of every in-range value is its bin or the next one
    /// (checked at setup), so one compare gives the bin.
    one_step: bool,
}

impl ExplicitF32 {
    fn new<D: 'static>(edges: &[f64]) -> Option<Self> {
        let n = edges.len() - 1;
        if std::any::TypeId::of::<D>() != std::any::TypeId::of::<f32>()
            || n == 0
            || n > 1 << 24
            || !edges.iter().all(|e| e.is_finite())
        {
            return None;
        }
        // no room for the thresholds: the scalar path needs none
        let mut t: Vec<f32> = fallible::try_zeroed(n + 2)?;
        t.iter_mut().zip(&edges[..n]).for_each(|(o, &e)| *o = f32_at_or_above(e));
        t.truncate(n);
        t.push(f32::NEG_INFINITY);
        t.push(f32::NAN);
        let (lo, hi) = (t[0], f32_at_or_below(edges[n]));
        // Any finite scale is correct (the scalar pass fixes the estimate); this one is close.
        let scale = if hi > lo { n as f32 / (hi - lo) } else { 0.0 };
        let scale = if scale.is_finite() { scale } else { 0.0 };
        // The biased estimate is monotone in v, so it is enough to check each bin's smallest
        // and largest value.
        let top = (n - 1) as f32;
        let one_step = (0..n).all(|i| {
            let a = t[i];
            let b = if i + 1 < n { f32_next_down(t[i + 1]).min(hi) } else { hi };
            a > b
                || (biased_estimate(a, lo, scale, top) >= i as i32
                    && biased_estimate(b, lo, scale, top) <= i as i32 + 1)
        });
        Some(ExplicitF32 { lo, hi, scale, n, t, one_step })
    }

    fn count(&self, data: &[f32], sub: &mut SubHist) {
        let mut idx = [0u32; FAST_BLOCK];
        let t = &self.t[..];
        let last_bin = self.n - 1;
        assert!(t.len() == self.n + 2);
        for block in data.chunks(FAST_BLOCK) {
            let idx = &mut idx[..block.len()];
            if self.one_step {
                explicit_one_step(self, block, idx);
                sub.add(idx);
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if crate::numeric::simd::has_avx512() {
                // SAFETY: the CPU features were just detected.
                if unsafe { self.bins_avx512(block, idx) } {
                    sub.add(idx);
                    continue;
                }
                // Some lane needed more than one step: redo the block with the scalar pass.
            }
            explicit_estimate(self, block, idx);
            for (o, &x) in idx.iter_mut().zip(block) {
                let v = x.abs();
                let mut i = *o as usize;
                // SAFETY: i <= n. An in-range v satisfies t[0] <= v, so no step goes below 0,
                // and the dummy bin n never moves (t[n] = -inf, t[n + 1] = NaN): every index
                // read is < n + 2.
                unsafe {
                    i -= (v < *t.get_unchecked(i)) as usize;
                    i += ((v >= *t.get_unchecked(i + 1)) & (i != last_bin)) as usize;
                    if v < *t.get_unchecked(i) || (i != last_bin && v >= *t.get_unchecked(i + 1)) {
                        while v < *t.get_unchecked(i) {
                            i -= 1;
                        }
                        while i != last_bin && v >= *t.get_unchecked(i + 1) {
                            i += 1;
                        }
                    }
                }
                *o = i as u32;
            }
            sub.add(idx);
        }
    }
}

impl ExplicitF32 {
    /// The exact bins of a block, 16 values at a time: the estimate, one correction step
    /// (gathering the two thresholds around it) and a check (one more gather) that the
    /// corrected bin holds the value. Returns false, leaving `idx` partly written, if any
    /// value is further than one bin from its estimate.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
    unsafe fn bins_avx512(&self, block: &[f32], idx: &mut [u32]) -> bool {
        unsafe {
            use std::arch::x86_64::*;
            let t = self.t.as_ptr();
            let lo = _mm512_set1_ps(self.lo);
            let hi = _mm512_set1_ps(self.hi);
            let scale = _mm512_set1_ps(self.scale);
            let zero = _mm512_setzero_ps();
            let top = _mm512_set1_ps((self.n - 1) as f32);
            let one = _mm512_set1_epi32(1);
            let last = _mm512_set1_epi32((self.n - 1) as i32);
            let dummy = _mm512_set1_epi32(self.n as i32);
            let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
            let mut ok = true;
            let mut k = 0;
            while k + 16 <= block.len() {
                let x = _mm512_loadu_ps(block.as_ptr().add(k));
                let v = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), abs_mask));
                // The same estimate as `explicit_estimate_impl` (max/min order: NaN -> 0).
                let f = _mm512_mul_ps(_mm512_sub_ps(v, lo), scale);
                let f = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_GT_OQ>(f, zero), zero, f);
                let f = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(f, top), top, f);
                let i = _mm512_cvttps_epi32(f);
                let in_range = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, lo) & _mm512_cmp_ps_mask::<_CMP_LE_OQ>(v, hi);
                // i in [0, n-1]: t[i] and t[i + 1] are inside the padded table.
                let t_i = _mm512_i32gather_ps::<4>(i, t);
                let t_j = _mm512_i32gather_ps::<4>(_mm512_add_epi32(i, one), t);
                let down = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, t_i);
                let not_last = _mm512_cmpneq_epi32_mask(i, last);
                let up = !down & _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, t_j) & not_last;
                let moved = (down | up) & in_range;
                let i = _mm512_mask_sub_epi32(i, down, i, one);
                let i = _mm512_mask_add_epi32(i, up, i, one);
                if moved != 0 {
                    // Down to i: needs t[i] <= v. Up to i: needs i == n-1 or v < t[i + 1].
                    let probe = _mm512_mask_add_epi32(i, up, i, one);
                    let g = _mm512_mask_i32gather_ps::<4>(zero, moved, probe, t);
                    let good_down = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, g);
                    let good_up = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, g) | _mm512_cmpeq_epi32_mask(i, last);
                    let bad = moved & ((down & !good_down) | (up & !good_up));
                    if bad != 0 {
                        ok = false;
                        break;
                    }
                }
                let i = _mm512_mask_blend_epi32(in_range, dummy, i);
                _mm512_storeu_si512(idx.as_mut_ptr().add(k) as *mut _, i);
                k += 16;
            }
            if ok && k < block.len() {
                // Tail: scalar, same rule.
                let (b, o) = (&block[k..], &mut idx[k..]);
                explicit_estimate_impl(self, b, o);
                ok = self.correct_checked(b, o);
            }
            ok
        }
    }

    /// One correction step each way from the estimates in `idx`; false if a value needs more.
    fn correct_checked(&self, block: &[f32], idx: &mut [u32]) -> bool {
        let t = &self.t[..];
        let last_bin = self.n - 1;
        for (o, &x) in idx.iter_mut().zip(block) {
            let v = x.abs();
            let mut i = *o as usize;
            i -= (v < t[i]) as usize;
            i += ((v >= t[i + 1]) & (i != last_bin)) as usize;
            if v < t[i] || (i != last_bin && v >= t[i + 1]) {
                return false;
            }
            *o = i as u32;
        }
        true
    }
}

/// `trunc(f32(f32(f32(v - lo) * scale) + 0.5))` clamped to `[0, n-1]` (NaN -> 0): about half a
/// bin above the position, so for nearly uniform thresholds it is the bin or the next one.
#[inline(always)]
fn biased_estimate(v: f32, lo: f32, scale: f32, top: f32) -> i32 {
    let f = (v - lo) * scale + 0.5;
    let f = if f > 0.0 { f } else { 0.0 };
    let f = if f < top { f } else { top };
    // SAFETY: f is finite and in [0, n-1].
    unsafe { f.to_int_unchecked::<i32>() }
}

/// Exact bins when `one_step` holds: the biased estimate, minus one if below its threshold.
#[inline(always)]
fn explicit_one_step_impl(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) {
    let (lo, hi, scale) = (e.lo, e.hi, e.scale);
    let top = (e.n - 1) as f32;
    let dummy = e.n as i32;
    let t = &e.t[..];
    assert!(t.len() == e.n + 2);
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = x.abs();
        let i = biased_estimate(v, lo, scale, top);
        // SAFETY: 0 <= i <= n-1 (clamped); an in-range v never goes below 0 (t[0] = lo <= v).
        let i = i - (v < unsafe { *t.get_unchecked(i as usize) }) as i32;
        *o = (if v >= lo && v <= hi { i } else { dummy }) as u32;
    }
}

crate::numeric::simd::dispatch_avx512!(fn explicit_one_step(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) -> () => explicit_one_step_impl);

/// Estimated bin of |x| in `[0, n-1]`, or the dummy bin n when |x| is outside `[lo, hi]`
/// (NaN and infinities included: lo and hi are finite).
#[inline(always)]
fn explicit_estimate_impl(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) {
    let (lo, hi, scale) = (e.lo, e.hi, e.scale);
    let top = (e.n - 1) as f32;
    let dummy = e.n as u32;
    for (o, &x) in idx.iter_mut().zip(block) {
        let v = x.abs();
        let f = (v - lo) * scale;
        let f = if f > 0.0 { f } else { 0.0 };
        let f = if f < top { f } else { top };
        // SAFETY: f is finite and in [0, n-1].
        let i = unsafe { f.to_int_unchecked::<i32>() } as u32;
        *o = if v >= lo && v <= hi { i } else { dummy };
    }
}

crate::numeric::simd::dispatch_avx512!(fn explicit_estimate(e: &ExplicitF32, block: &[f32], idx: &mut [u32]) -> () => explicit_estimate_impl);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ort::histogram::{arange_f64, UniformBins};
    use half::f16;

    #[test]
    fn explicit_edges_last_bin_closed() {
        let edges = [0.0, 1.0, 2.0, 3.0];
        let mut c = vec![0; 3];
        count_abs_explicit(&View::from_slice(&[0.0f32, 1.0, 2.999, 3.0, 3.5, -1.0]), &edges, &mut c);
        // |x| is counted: -1.0 -> 1.0
        assert_eq!(c, vec![1, 2, 2]);
    }

    #[test]
    fn explicit_edges_ending_in_infinity_follow_searchsorted() {
        // numpy: [0, 65472, 65504, inf, inf] puts 65504 in [65504, inf), nothing in [inf, inf)
        // and inf in the closed last bin; with one inf edge, 65504 and inf share the last bin.
        let inf = f64::INFINITY;
        let x: Vec<f16> =
            [0.0, 65472.0, 65504.0, inf, -inf, 60000.0, f64::NAN, -65504.0].iter().map(|&v| f16::from_f64(v)).collect();
        for (edges, want) in [
            (vec![0.0, 65472.0, 65504.0, inf, inf], vec![2, 1, 2, 2]),
            (vec![0.0, 65472.0, 65504.0, inf], vec![2, 1, 4]),
            (vec![0.0, 65472.0, inf, inf], vec![2, 3, 2]),
            (vec![0.0, 65472.0, 65504.0], vec![2, 3]),
        ] {
            let mut c = vec![0; edges.len() - 1];
            count_abs_explicit(&View::from_slice(&x), &edges, &mut c);
            assert_eq!(c, want, "{edges:?}");
        }
        // f32 data takes the scalar path with infinite edges.
        let mut c = vec![0; 3];
        count_abs_explicit(&View::from_slice(&[1.0f32, 1e30, f32::INFINITY, 0.5]), &[0.0, 1.0, inf, inf], &mut c);
        assert_eq!(c, vec![1, 2, 1]);
    }

    #[test]
    pub(crate) fn explicit_f32_path_matches_f64_comparisons() {
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        };
        let mut one_step_cases = 0;
        for case in 0..40 {
            let n0 = 1 + (rnd() * 3000.0) as usize;
            let lo = (rnd() * 10f64.powf(rnd() * 6.0 - 3.0)) as f32;
            let hi = lo + (10f64.powf(rnd() * 6.0 - 4.0)) as f32;
            let Ok(b) = UniformBins::new(lo, hi, n0) else { continue };
            // ORT's extension: f32 edges, then an f64 arange of the same width (or, in some
            // cases, duplicate and irregular edges).
            let w = b.edges[1] - b.edges[0];
            let mut edges: Vec<f64> = b.edges.iter().map(|&e| e as f64).collect();
            let ext = arange_f64(b.edges[n0] + w, b.edges[n0] + w * (1.0 + (rnd() * 500.0) as f32), w).unwrap();
            edges.extend(ext);
            if case % 5 == 0 {
                let k = edges.len() / 2;
                edges[k] = edges[k - 1]; // an empty bin
                edges[k + 1] = (edges[k + 1] + edges[k + 2]) / 2.0; // a narrow one
            }
            let top = *edges.last().unwrap();
            let mut x: Vec<f32> = (0..20_000)
                .map(|_| ((rnd() * 1.3 - 0.1) * top) as f32 * if rnd() < 0.5 { -1.0 } else { 1.0 })
                .collect();
            for &e in &edges {
                let f = e as f32;
                x.extend([f, -f, f32::from_bits(f.to_bits() + 1), f32::from_bits(f.to_bits().wrapping_sub(1))]);
            }
            x.extend([f32::NAN, f32::INFINITY, -f32::INFINITY, 0.0, -0.0]);
            let n = edges.len() - 1;
            let mut fast = vec![0; n];
            count_abs_explicit(&View::from_slice(&x), &edges, &mut fast);
            // Also the general path (estimate, one step each way, check, walk).
            let mut general = ExplicitF32::new::<f32>(&edges).unwrap();
            one_step_cases += general.one_step as usize;
            general.one_step = false;
            let mut sub = SubHist::new(n).unwrap();
            general.count(&x, &mut sub);
            let mut gen = vec![0; n];
            sub.add_to(&mut gen);
            // Literal rule, in f64.
            let mut slow = vec![0i64; n];
            for &d in &x {
                let v = (d as f64).abs();
                if !(v.is_finite() && v >= edges[0] && v <= edges[n]) {
                    continue;
                }
                let i = (0..n).rev().find(|&i| edges[i] <= v).unwrap();
                slow[i] += 1;
            }
            assert_eq!(fast, slow, "case {case} n={n}");
            assert_eq!(gen, slow, "general path, case {case} n={n}");
        }
        assert!(one_step_cases > 20, "{one_step_cases}");
    }
}
