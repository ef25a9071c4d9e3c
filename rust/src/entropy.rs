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

use crate::float::Float;
use crate::numpy_log::log_f32_slice;
use crate::pairwise::sum_f32;
use rayon::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntropyError {
    /// `num_bins // 2 < num_quantized_bins // 2`: there is no candidate (ORT: numpy errors).
    NoCandidates { n_bins: usize, n_quantized: usize },
}

impl std::fmt::Display for EntropyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EntropyError::NoCandidates { n_bins, n_quantized } => write!(
                f,
                "entropy needs num_bins >= num_quantized_bins (histogram has {n_bins} bins, num_quantized_bins={n_quantized})"
            ),
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
    p: Vec<i64>,
    q: Vec<i64>,
    ps: Vec<f32>,
    qs: Vec<f32>,
    work: Vec<f32>,
    logs: Vec<f32>,
}

/// ORT's `smooth_distribution` into `out`; false where ORT returns None (all zeros) or where
/// its assertions would fail (histocal then rules the candidate out instead of crashing).
fn smooth(x: &[i64], out: &mut Vec<f32>) -> bool {
    let n_zero_exact = x.iter().filter(|&&v| v == 0).count();
    // numpy sums the f32 indicator pairwise; exact while the count stays below 2^24.
    let n_zero: f32 = if x.len() < (1 << 24) {
        n_zero_exact as f32
    } else {
        crate::pairwise::sum_f32_by(x.len(), |i| (x[i] == 0) as i32 as f32)
    };
    let n_nonzero: f32 = (x.len() as f32) - n_zero;
    if n_nonzero == 0.0 {
        return false;
    }
    let eps1 = 1e-4 * (n_zero as f64) / (n_nonzero as f64);
    if !(eps1 < 1.0) {
        return false;
    }
    let eps = 1e-4f64 as f32;
    let neg_eps1 = (-eps1) as f32;
    out.clear();
    out.extend(x.iter().map(|&v| if v == 0 { eps } else { (v as f32) + neg_eps1 }));
    !out.iter().any(|&h| h <= 0.0)
}

/// ORT's float32 `entropy(pk, qk)` (relative entropy, natural log, pairwise sums).
fn kl_f32(ps: &[f32], qs: &[f32], work: &mut Vec<f32>, logs: &mut Vec<f32>) -> f32 {
    let sp = sum_f32(ps);
    let sq = sum_f32(qs);
    work.clear();
    work.extend(ps.iter().zip(qs).map(|(&p, &q)| (p / sp) / (q / sq)));
    logs.resize(work.len(), 0.0);
    log_f32_slice(work, logs);
    for (i, (&p, &q)) in ps.iter().zip(qs).enumerate() {
        let pk = p / sp;
        let qk = q / sq;
        let mut r = pk * logs[i];
        if pk == 0.0 && qk >= 0.0 {
            r = 0.0;
        }
        if !(pk > 0.0 && qk > 0.0) {
            r = f32::INFINITY;
        }
        work[i] = r;
    }
    sum_f32(work)
}

/// KL divergence of candidate `i` (half-width in bins), as f32 before rounding to the edge type;
/// +inf where ORT's smoothing yields None.
fn candidate_kl(hist: &[i64], prefix: &[i64], nq: usize, i: usize, s: &mut Scratch) -> f32 {
    let n = hist.len();
    let zb = n / 2;
    let start = zb - i;
    let end = (zb + i + 1).min(n);
    let len = end - start;
    let sl = &hist[start..end];
    s.p.clear();
    s.p.extend_from_slice(sl);
    s.p[0] += prefix[start];
    s.p[len - 1] += prefix[n] - prefix[end];
    let m = len / nq;
    s.q.clear();
    s.q.resize(len, 0);
    for j in 0..nq {
        let (a, b) = (j * m, j * m + m);
        let mut qb = prefix[start + b] - prefix[start + a];
        if j == nq - 1 {
            qb += prefix[end] - prefix[start + nq * m];
        }
        let norm = s.p[a..b].iter().filter(|&&v| v != 0).count();
        if norm != 0 {
            let v = (qb as f64 / norm as f64) as i64;
            s.q[a..b].iter_mut().for_each(|x| *x = v);
        }
    }
    let Scratch { p, q, ps, qs, work, logs } = s;
    if !smooth(p, ps) || !smooth(q, qs) {
        return f32::INFINITY;
    }
    kl_f32(ps, qs, work, logs)
}

/// All candidates' KL values as ORT stores them (rounded to `E`, then widened to f64).
pub fn kl_values<E: Float>(hist: &[i64], nq: usize) -> Result<Vec<f64>, EntropyError> {
    let n = hist.len();
    let (zb, hq) = (n / 2, nq / 2);
    if nq == 0 || zb < hq {
        return Err(EntropyError::NoCandidates { n_bins: n, n_quantized: nq });
    }
    let mut prefix = Vec::with_capacity(n + 1);
    prefix.push(0i64);
    for &h in hist {
        prefix.push(prefix.last().unwrap() + h);
    }
    Ok((hq..=zb)
        .into_par_iter()
        .map_init(Scratch::default, |s, i| E::from_f32(candidate_kl(hist, &prefix, nq, i, s)).to_f64())
        .collect())
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

/// ORT's entropy threshold choice for one histogram.
pub fn entropy_threshold<E: Float>(hist: &[i64], nq: usize) -> Result<EntropyChoice, EntropyError> {
    let kl = kl_values::<E>(hist, nq)?;
    let i = argmin(&kl) + nq / 2;
    let n = hist.len();
    Ok(EntropyChoice { start: n / 2 - i, end: (n / 2 + i + 1).min(n) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_settings_have_one_candidate_the_full_range() {
        let hist = vec![1i64; 128];
        let c = entropy_threshold::<f32>(&hist, 128).unwrap();
        assert_eq!((c.start, c.end), (0, 128));
    }

    #[test]
    fn too_few_bins_is_an_error_not_a_panic() {
        assert!(entropy_threshold::<f32>(&[1; 126], 128).is_err());
        assert!(entropy_threshold::<f32>(&[1; 100], 128).is_err());
        assert!(entropy_threshold::<f32>(&[1; 100], 0).is_err());
    }

    #[test]
    fn all_zero_histogram_picks_the_first_candidate() {
        let c = entropy_threshold::<f32>(&[0; 16], 4).unwrap();
        assert_eq!((c.start, c.end), (6, 11));
    }

    #[test]
    fn huge_sparse_histogram_does_not_assert() {
        // ORT: AssertionError n_zeros=20001.0 ... ; histocal rules those candidates out.
        let mut hist = vec![0i64; 20480];
        hist[10240] = 1000;
        hist[20479] = 1;
        assert!(entropy_threshold::<f32>(&hist, 128).is_ok());
    }
}
