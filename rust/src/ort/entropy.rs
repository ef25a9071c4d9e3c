//! ORT's KL-divergence threshold search (`get_entropy_threshold`), bit for bit.
//!
//! Everything up to the KL value is integer or f32 arithmetic in ORT's exact order: the
//! reference `p` (outliers folded into the end bins), the expanded quantized `q` (truncating
//! f64 division, non-zero where `p` is zero), `smooth_distribution` and the f32 `entropy` with
//! numpy's pairwise sums and numpy's f32 `log`. The KL is then rounded to the edge type (f16
//! for f16 tensors, which creates ties) and the first minimum wins.
//!
//! Candidates are independent, so they are evaluated in parallel; the result does not depend
//! on the thread count.
//!
//! Cost: candidate i evaluates a slice of about `2 i + 1` bins, so the whole search is
//! quadratic in the bin count ([`search_work`]): about `n^2 / 4` bin evaluations for n bins.
//! It cannot be made sub-quadratic without changing results: every candidate's KL is a float32
//! pairwise sum of terms that depend on that candidate's own normalisation and smoothing, and
//! ORT's threshold depends on those sums' last bits. Callers bound it before starting (see the
//! bindings' limit), and it stops early when its stop flag is set ([`crate::numeric::cancel`]).

use crate::numeric::cancel::{self, Cancelled};
use crate::numeric::fallible;
use crate::numeric::float::Float;
use crate::numeric::numpy_log::log_lane;
use crate::numeric::pairwise::sum_f32;
use rayon::prelude::*;
use std::sync::atomic::AtomicBool;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntropyError {
    /// `num_bins // 2 < num_quantized_bins // 2`: there is no candidate (ORT: numpy errors).
    NoCandidates { n_bins: usize, n_quantized: usize },
    /// The stop flag was set before the search finished.
    Cancelled,
}

impl std::fmt::Display for EntropyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntropyError::NoCandidates { n_bins, n_quantized } => write!(
                f,
                "entropy needs num_bins >= num_quantized_bins (histogram has {n_bins} bins, num_quantized_bins={n_quantized})"
            ),
            EntropyError::Cancelled => write!(f, "entropy search {Cancelled}"),
        }
    }
}

/// The chosen candidate: threshold `(edges[start], edges[end])`, before clipping to min/max.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntropyChoice {
    pub start: usize,
    pub end: usize,
}

/// Scratch buffers reused across candidates on one thread.
#[derive(Default)]
struct Scratch {
    ps: Vec<f32>,
    qs: Vec<f32>,
    /// The smoothed quantized distribution's value per group (q is constant on each group),
    /// then `EPS` for the leftover tail.
    group_q: Vec<f32>,
    group_values: Vec<i64>,
    /// `q / sum(q)` per group.
    group_qk: Vec<f32>,
    group_qb: Vec<i64>,
    group_norm: Vec<i64>,
    /// `qk = q / sum(q)`, element by element.
    qk: Vec<f32>,
    r: Vec<f32>,
}

const EPS: f32 = 1e-4f64 as f32;

impl Scratch {
    /// Room for a candidate of `len` bins and `nq` groups, so that nothing below allocates
    /// (`fallible`: no abort when memory runs out).
    fn grow(&mut self, len: usize, nq: usize) {
        for v in [&mut self.ps, &mut self.qs, &mut self.qk, &mut self.r] {
            fallible::grow(v, len + 16);
        }
        fallible::grow(&mut self.group_q, nq + 1);
        fallible::grow(&mut self.group_qk, nq + 1);
        for v in [&mut self.group_values, &mut self.group_qb, &mut self.group_norm] {
            fallible::grow(v, nq);
        }
    }
}

/// Per-histogram tables shared by all candidates.
struct Tables<'a> {
    hist: &'a [i64],
    /// `hist` as f32 (what `p.astype(float32)` gives for the unfolded bins).
    hf: Vec<f32>,
    /// `prefix[k]` = sum of `hist[..k]`.
    prefix: Vec<i64>,
    /// `zeros[k]` = number of zero bins in `hist[..k]`.
    zeros: Vec<u64>,
}

impl<'a> Tables<'a> {
    fn new(hist: &'a [i64]) -> Self {
        let mut prefix = fallible::with_capacity(hist.len() + 1);
        let mut zeros = fallible::with_capacity(hist.len() + 1);
        let (mut s, mut z) = (0i64, 0u64);
        prefix.push(0);
        zeros.push(0);
        for &h in hist {
            s += h;
            z += (h == 0) as u64;
            prefix.push(s);
            zeros.push(z);
        }
        Tables { hist, hf: fallible::collect(hist.iter().map(|&h| h as f32)), prefix, zeros }
    }
}

/// `smooth_distribution`'s offset for the non-zero entries, `f32(-eps1)`, for a distribution of
/// `len` entries of which `n_zero` are zero; None where ORT returns None (all zeros) or where
/// its `eps1 < 1` assertion would fail (histocal then rules the candidate out).
#[inline(always)]
fn smoothing_offset(len: usize, n_zero: usize, is_zero: impl Fn(usize) -> bool) -> Option<f32> {
    // numpy sums the f32 zero indicator pairwise: exact while the count stays below 2^24.
    let n_zero: f32 = if len < (1 << 24) {
        n_zero as f32
    } else {
        crate::numeric::pairwise::sum_f32_by(len, |i| is_zero(i) as i32 as f32)
    };
    let n_nonzero: f32 = (len as f32) - n_zero;
    if n_nonzero == 0.0 {
        return None;
    }
    let eps1 = 1e-4 * (n_zero as f64) / (n_nonzero as f64);
    (eps1 < 1.0).then_some((-eps1) as f32)
}

/// ORT's float32 `entropy(pk, qk)` (relative entropy, natural log, pairwise sums) for the
/// smoothed `ps` and `qs`, where `qs` is `m`-long runs of `group_q[j]` followed by `EPS`.
/// Per element this is exactly ORT's `pk = p / sum(p)`, `qk = q / sum(q)`,
/// `pk * log(pk / qk)` (numpy's f32 log), but `qk` is divided once per group, not per element,
/// and the terms are computed in one vectorised pass.
#[inline(always)]
fn kl_f32(
    ps: &[f32],
    qs: &[f32],
    group_q: &[f32],
    m: usize,
    group_qk: &mut Vec<f32>,
    qk: &mut Vec<f32>,
    r: &mut Vec<f32>,
) -> f32 {
    let n = ps.len();
    let sp = sum_f32(ps);
    let sq = sum_f32(qs);
    group_qk.clear();
    group_qk.extend(group_q.iter().map(|&q| q / sq));
    fill_runs(qk, n, group_qk, m);
    r.resize(n, 0.0);
    kl_terms(ps, sp, &qk[..n], &mut r[..n]);
    sum_f32(&r[..n])
}

/// `out[..n]` as `m`-long runs of `values[j]`, then `values[nq]` (the tail) up to n, for
/// `nq = values.len() - 1` groups. `out` is resized to `n + 16`: the vectorised variant
/// writes whole 16-lane vectors, each run overwriting the previous run's overhang.
#[inline(always)]
fn fill_runs(out: &mut Vec<f32>, n: usize, values: &[f32], m: usize) {
    let nq = values.len() - 1;
    assert!(nq * m <= n);
    out.resize(n + 16, 0.0);
    #[cfg(target_arch = "x86_64")]
    if crate::numeric::simd::has_avx512() {
        // SAFETY: features detected; every store starts below n and out has n + 16 elements.
        unsafe { fill_runs_avx512(out, n, values, m) };
        return;
    }
    fill_runs_scalar(&mut out[..n], values, m);
}

fn fill_runs_scalar(out: &mut [f32], values: &[f32], m: usize) {
    let nq = values.len() - 1;
    if m > 0 {
        for (run, &x) in out[..nq * m].chunks_exact_mut(m).zip(values) {
            run.fill(x);
        }
    }
    out[nq * m..].fill(values[nq]);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
unsafe fn fill_runs_avx512(out: &mut [f32], n: usize, values: &[f32], m: usize) {
    unsafe {
        use std::arch::x86_64::*;
        let nq = values.len() - 1;
        let p = out.as_mut_ptr();
        let put = |from: usize, to: usize, x: f32| {
            let v = _mm512_set1_ps(x);
            let mut k = from;
            while k < to {
                _mm512_storeu_ps(p.add(k), v);
                k += 16;
            }
        };
        if m > 0 {
            for (j, &x) in values[..nq].iter().enumerate() {
                put(j * m, j * m + m, x);
            }
        }
        put(nq * m, n, values[nq]);
    }
}

/// `r = pk * log(pk / qk)` for `pk = p / sp`, with ORT's special cases (`pk == 0`: 0, then
/// anything not `pk > 0 && qk > 0`: inf).
#[inline(always)]
fn kl_terms(ps: &[f32], sp: f32, qks: &[f32], r: &mut [f32]) {
    for ((o, &p), &qk) in r.iter_mut().zip(ps).zip(qks) {
        let pk = p / sp;
        let t = pk * log_lane(pk / qk);
        let t = if pk == 0.0 && qk >= 0.0 { 0.0 } else { t };
        *o = if pk > 0.0 && qk > 0.0 { t } else { f32::INFINITY };
    }
}

crate::numeric::simd::dispatch_avx512!(
    fn candidate_kl(t: &Tables<'_>, nq: usize, i: usize, s: &mut Scratch) -> f32
        => candidate_kl_impl
);

/// KL divergence of candidate `i` (half-width in bins), as f32 before rounding to the edge type;
/// +inf where ORT's smoothing yields None.
#[inline(always)]
fn candidate_kl_impl(t: &Tables<'_>, nq: usize, i: usize, s: &mut Scratch) -> f32 {
    let Tables { hist, hf, prefix, zeros } = t;
    let n = hist.len();
    let zb = n / 2;
    let start = zb - i;
    let end = (zb + i + 1).min(n);
    let len = end - start;
    s.grow(len, nq);
    let Scratch { ps, qs, group_q, group_values, group_qk, group_qb, group_norm, qk, r } = s;
    // Reference p: the slice with the outliers folded into its end bins (only the two end
    // values differ from `hist`, so p is never materialised).
    let (left, right) = (prefix[start], prefix[n] - prefix[end]);
    let (p_first, p_last) = if len == 1 {
        (hist[start] + left + right, hist[start] + left + right)
    } else {
        (hist[start] + left, hist[end - 1] + right)
    };
    let p_at = |k: usize| {
        if k == 0 {
            p_first
        } else if k == len - 1 {
            p_last
        } else {
            hist[start + k]
        }
    };
    // Zero counts come from the zero-prefix table, corrected at the two folded end bins.
    let fix_first = (p_first == 0) as i64 - (hist[start] == 0) as i64;
    let fix_last = if len > 1 { (p_last == 0) as i64 - (hist[end - 1] == 0) as i64 } else { 0 };
    let p_zeros = ((zeros[end] - zeros[start]) as i64 + fix_first + fix_last) as usize;
    let Some(off_p) = smoothing_offset(len, p_zeros, |k| p_at(k) == 0) else {
        return f32::INFINITY;
    };
    ps.resize(len, 0.0);
    for (o, &h) in ps[..len].iter_mut().zip(&hf[start..end]) {
        // hf is 0.0 exactly where the count is 0
        *o = if h == 0.0 { EPS } else { h + off_p };
    }
    for (k, v) in [(0, p_first), (len - 1, p_last)] {
        ps[k] = if v == 0 { EPS } else { v as f32 + off_p };
    }
    // Non-zero counts are >= 1, so they stay positive unless the offset rounds to -1.
    if 1.0 + off_p <= 0.0 && ps.iter().any(|&h| h <= 0.0) {
        return f32::INFINITY;
    }
    // Candidate q: the slice (without outliers) merged into nq bins, spread back evenly over
    // the bins where p is non-zero, then written into *every* bin of the group, as ORT does.
    let m = len / nq;
    // Group holding the last bin (if any group does): its zero count gets `fix_last`.
    let last_group = (len - 1).checked_div(m).unwrap_or(usize::MAX);
    // Per group: the sum of the slice's counts (the leftover bins go to the last group) and
    // the number of non-zero p bins, then q's integer value, in vectorisable passes.
    group_qb.clear();
    group_norm.clear();
    for j in 0..nq {
        let a = start + j * m;
        group_qb.push(prefix[a + m] - prefix[a]);
        group_norm.push(m as i64 - (zeros[a + m] - zeros[a]) as i64);
    }
    group_qb[nq - 1] += prefix[end] - prefix[start + nq * m];
    if m > 0 {
        group_norm[0] -= fix_first;
    }
    if len > 1 && last_group < nq {
        group_norm[last_group] -= fix_last;
    }
    group_values.resize(nq, 0);
    for ((v, &qb), &norm) in group_values.iter_mut().zip(group_qb.iter()).zip(group_norm.iter()) {
        *v = if norm != 0 { (qb as f64 / norm as f64) as i64 } else { 0 };
    }
    let q_zeros = len - nq * m + m * group_values.iter().filter(|&&v| v == 0).count();
    let is_q_zero = |k: usize| if k < nq * m { group_values[k / m] == 0 } else { true };
    let Some(off_q) = smoothing_offset(len, q_zeros, is_q_zero) else {
        return f32::INFINITY;
    };
    group_q.clear();
    group_q.extend(group_values.iter().map(|&v| if v == 0 { EPS } else { v as f32 + off_q }));
    if group_q.iter().any(|&x| x <= 0.0) {
        return f32::INFINITY;
    }
    group_q.push(EPS); // the leftover tail's value (group id nq)
    fill_runs(qs, len, group_q, m);
    kl_f32(&ps[..len], &qs[..len], group_q, m, group_qk, qk, r)
}

/// The search's work for `n_bins` bins: the number of bins all candidates' slices hold
/// together (each candidate costs time in proportion to its slice); 0 without candidates.
pub fn search_work(n_bins: usize, nq: usize) -> u64 {
    let (zb, hq) = ((n_bins / 2) as u128, (nq / 2) as u128);
    if nq == 0 || zb < hq {
        return 0;
    }
    // candidate i's slice holds 2 i + 1 bins, but the last one of an even count holds n_bins
    let work = (zb + 1) * (zb + 1) - hq * hq - n_bins.is_multiple_of(2) as u128;
    u64::try_from(work).unwrap_or(u64::MAX)
}

/// All candidates' KL values as ORT stores them (rounded to `E`, then widened to f64); every
/// worker stops at its next candidate once `stop` is set.
pub fn kl_values<E: Float>(hist: &[i64], nq: usize, stop: &AtomicBool) -> Result<Vec<f64>, EntropyError> {
    let n = hist.len();
    let (zb, hq) = (n / 2, nq / 2);
    if nq == 0 || zb < hq {
        return Err(EntropyError::NoCandidates { n_bins: n, n_quantized: nq });
    }
    let tables = Tables::new(hist);
    let mut kl = fallible::with_capacity(zb - hq + 1);
    (hq..zb + 1)
        .into_par_iter()
        // once stopped, the remaining candidates are skipped (NaN) and the whole result dropped
        .map_init(Scratch::default, |s, i| match cancel::check(stop) {
            Ok(()) => E::from_f32(candidate_kl(&tables, nq, i, s)).to_f64(),
            Err(Cancelled) => f64::NAN,
        })
        .collect_into_vec(&mut kl);
    cancel::check(stop).map_err(|Cancelled| EntropyError::Cancelled)?;
    Ok(kl)
}

/// `np.argmin`: the first minimum, a NaN winning outright.
pub fn argmin(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x.is_nan() {
            return i;
        }
        if x < v[best] {
            best = i;
        }
    }
    best
}

/// ORT's entropy threshold choice for one histogram (see [`kl_values`] for `stop`).
pub fn entropy_threshold<E: Float>(hist: &[i64], nq: usize, stop: &AtomicBool) -> Result<EntropyChoice, EntropyError> {
    let kl = kl_values::<E>(hist, nq, stop)?;
    let i = argmin(&kl) + nq / 2;
    let n = hist.len();
    Ok(EntropyChoice { start: n / 2 - i, end: (n / 2 + i + 1).min(n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stop flag that is never set.
    static GO: AtomicBool = AtomicBool::new(false);

    #[test]
    fn search_work_is_the_candidates_slice_lengths() {
        for n in [1usize, 2, 3, 7, 8, 128, 129, 130, 1001, 2048] {
            for nq in [1usize, 2, 3, 4, 127, 128] {
                let (zb, hq) = (n / 2, nq / 2);
                let want: u64 =
                    if zb < hq { 0 } else { (hq..=zb).map(|i| ((zb + i + 1).min(n) - (zb - i)) as u64).sum() };
                assert_eq!(search_work(n, nq), want, "n={n} nq={nq}");
            }
        }
        assert_eq!(search_work(100, 0), 0);
        // the float16 outlier case: about 1.2e12 bin evaluations
        assert_eq!(search_work(2_149_660, 128), 1_074_831 * 1_074_831 - 64 * 64 - 1);
    }

    #[test]
    fn a_set_stop_flag_cancels_the_search() {
        let stop = AtomicBool::new(true);
        let hist: Vec<i64> = (0..4096).map(|k| k % 7).collect();
        assert_eq!(kl_values::<f32>(&hist, 128, &stop), Err(EntropyError::Cancelled));
        assert_eq!(entropy_threshold::<f32>(&hist, 128, &stop), Err(EntropyError::Cancelled));
        assert!(entropy_threshold::<f32>(&hist, 128, &GO).is_ok());
    }

    #[test]
    fn default_settings_have_one_candidate_the_full_range() {
        let hist = vec![1i64; 128];
        let c = entropy_threshold::<f32>(&hist, 128, &GO).unwrap();
        assert_eq!((c.start, c.end), (0, 128));
    }

    #[test]
    fn too_few_bins_is_an_error_not_a_panic() {
        assert!(entropy_threshold::<f32>(&[1; 126], 128, &GO).is_err());
        assert!(entropy_threshold::<f32>(&[1; 100], 128, &GO).is_err());
        assert!(entropy_threshold::<f32>(&[1; 100], 0, &GO).is_err());
    }

    #[test]
    fn all_zero_histogram_picks_the_first_candidate() {
        let c = entropy_threshold::<f32>(&[0; 16], 4, &GO).unwrap();
        assert_eq!((c.start, c.end), (6, 11));
    }

    #[test]
    fn fill_runs_variants_agree() {
        for nq in [1usize, 3, 128] {
            let values: Vec<f32> = (0..=nq).map(|j| j as f32 + 0.5).collect();
            for m in [0usize, 1, 5, 16, 17, 40] {
                for extra in [0usize, 1, 15, 16, 33] {
                    let n = nq * m + extra;
                    let mut a = Vec::new();
                    fill_runs(&mut a, n, &values, m);
                    let mut b = vec![0.0; n];
                    fill_runs_scalar(&mut b, &values, m);
                    assert_eq!(&a[..n], &b[..], "nq={nq} m={m} extra={extra}");
                }
            }
        }
    }

    #[test]
    fn every_dispatch_tier_gives_the_same_kl_bits() {
        let mut hists: Vec<Vec<i64>> = Vec::new();
        let mut x: u64 = 99;
        for (n, relu) in [(300usize, true), (1001, false), (2900, true), (129, false)] {
            let mut h = vec![0i64; n];
            for _ in 0..20_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let w = ((x >> 11) as f64) / (1u64 << 53) as f64;
                let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * w).cos();
                let z = if relu { z.max(0.0) } else { z };
                h[(((z / 5.0 + 1.0) * (n / 2) as f64) as usize).min(n - 1)] += 1;
            }
            hists.push(h);
        }
        let run = || -> Vec<u64> {
            hists.iter().flat_map(|h| kl_values::<f32>(h, 128, &GO).unwrap()).map(f64::to_bits).collect()
        };
        let best = run();
        for tier in [0u8, 1] {
            crate::numeric::simd::set_max_tier(tier);
            assert!(run() == best, "tier {tier}");
        }
        crate::numeric::simd::set_max_tier(2);
    }

    #[test]
    fn huge_sparse_histogram_does_not_assert() {
        // ORT: AssertionError n_zeros=20001.0 ... ; histocal rules those candidates out.
        let mut hist = vec![0i64; 20480];
        hist[10240] = 1000;
        hist[20479] = 1;
        assert!(entropy_threshold::<f32>(&hist, 128, &GO).is_ok());
    }
}
