//! AMD Quark's power-of-two MinMSE error sums on the values (histocal.quark's mode All with
//! `num_bins=0`): every candidate scale's squared error in one pass over a batch.

use rayon::prelude::*;

/// Values per parallel chunk: the per-chunk sums are added in chunk order, so the result does
/// not depend on the number of threads.
const CHUNK: usize = 1 << 16;

/// For each scale `s` of `scales` (finite, non-zero powers of two, as f32), the sum over `values`
/// (finite) of Quark's squared error `((clip(round(x / s) + zp, qmin, qmax) - zp) * s - x)^2`,
/// every operation in f32 as numpy does it (`round`: half to even), each term added in f64.
pub fn error_sums(values: &[f32], scales: &[f32], zero_point: f32, qmin: f32, qmax: f32) -> Vec<f64> {
    let per_chunk: Vec<Vec<f64>> = values
        .par_chunks(CHUNK)
        .map(|chunk| scales.iter().map(|&s| chunk_sum(chunk, s, zero_point, qmin, qmax)).collect())
        .collect();
    let mut total = vec![0.0; scales.len()];
    for sums in per_chunk {
        for (t, s) in total.iter_mut().zip(sums) {
            *t += s;
        }
    }
    total
}

/// 1.5 * 2^23: adding and subtracting it rounds an f32 of magnitude below 2^22 to an integer,
/// half to even (the default rounding mode), without a call to `roundevenf`.
const ROUNDER: f32 = 12_582_912.0;

/// The chunk's sum for one scale, in 8 lanes (a fixed order: the result does not depend on
/// the machine), then the lanes in order. With AVX2 the same code runs 8 values at a time (the
/// same IEEE operations: Rust never fuses or reorders them).
fn chunk_sum(chunk: &[f32], s: f32, zero_point: f32, qmin: f32, qmax: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above)
            return unsafe { chunk_sum_avx2(chunk, s, zero_point, qmin, qmax) };
        }
    }
    chunk_sum_lanes(chunk, s, zero_point, qmin, qmax)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn chunk_sum_avx2(chunk: &[f32], s: f32, zero_point: f32, qmin: f32, qmax: f32) -> f64 {
    chunk_sum_lanes(chunk, s, zero_point, qmin, qmax)
}

#[inline(always)]
fn chunk_sum_lanes(chunk: &[f32], s: f32, zero_point: f32, qmin: f32, qmax: f32) -> f64 {
    // 1 / s where it is a power of two too (s normal, its inverse finite and normal): x * 2^p
    // is x / 2^-p exactly (both the correctly rounded value of the same real number)
    let inv = 1.0 / s;
    if inv.is_normal() && s.is_normal() && inv * s == 1.0 {
        lanes_sum(chunk, |x| x * inv, s, zero_point, qmin, qmax)
    } else {
        lanes_sum(chunk, |x| x / s, s, zero_point, qmin, qmax)
    }
}

#[inline(always)]
fn lanes_sum(chunk: &[f32], scaled: impl Fn(f32) -> f32, s: f32, zero_point: f32, qmin: f32, qmax: f32) -> f64 {
    // clip(round(v) + z, qmin, qmax) == clip(round(w) + z, qmin, qmax) for w = v clamped to
    // [qmin - z - 1, qmax - z + 1] (integer bounds), which keeps |w| far below 2^22
    let (lo, hi) = (qmin - zero_point - 1.0, qmax - zero_point + 1.0);
    let term = |x: f32| {
        let w = scaled(x).max(lo).min(hi);
        let q = (((w + ROUNDER) - ROUNDER) + zero_point).max(qmin).min(qmax);
        let d = (q - zero_point) * s - x;
        d * d
    };
    let mut lanes = [0.0f64; 8];
    let mut blocks = chunk.chunks_exact(8);
    for block in &mut blocks {
        for (lane, &x) in lanes.iter_mut().zip(block) {
            *lane += f64::from(term(x));
        }
    }
    let rest: f64 = blocks.remainder().iter().map(|&x| f64::from(term(x))).sum();
    lanes.iter().sum::<f64>() + rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_of_a_few_values() {
        // scale 1/2, int8 symmetric: 0.3 -> round(0.6)=1 -> 0.5, error 0.2^2; 100 -> clip 127 -> 63.5
        let e = error_sums(&[0.3, 100.0], &[0.5], 0.0, -127.0, 127.0);
        let want = f64::from((0.5f32 - 0.3) * (0.5f32 - 0.3)) + f64::from((63.5f32 - 100.0) * (63.5f32 - 100.0));
        assert_eq!(e, vec![want]);
    }

    #[test]
    fn half_rounds_to_even_and_sums_are_deterministic() {
        let e = error_sums(&[0.5, 1.5, 2.5, -0.5, -2.5, 1e30, -1e30], &[1.0], 0.0, -127.0, 127.0);
        let far = f64::from((127.0f32 - 1e30) * (127.0f32 - 1e30));
        assert_eq!(e, vec![0.25 * 5.0 + 2.0 * far]);
        let many: Vec<f32> = (0..(3 * CHUNK + 7)).map(|i| (i % 1000) as f32 * 0.013).collect();
        let whole = error_sums(&many, &[0.25, 0.125], 0.0, -127.0, 127.0);
        let sequential: f64 = many
            .iter()
            .map(|&x| {
                let d = ((x / 0.25).round_ties_even().clamp(-127.0, 127.0)) * 0.25 - x;
                f64::from(d * d)
            })
            .sum();
        assert!((whole[0] - sequential).abs() <= 1e-9 * sequential);
        assert_eq!(whole, error_sums(&many, &[0.25, 0.125], 0.0, -127.0, 127.0));
    }
}
