//! ORT's `compute_percentile`: the left edge of the bin where the cumulative distribution
//! first reaches the target, clipped to the data's min/max by the caller.

/// `np.cumsum(hist / hist.sum())`: f64 division, sequential f64 prefix sum (all NaN if empty).
pub fn cdf(hist: &[i64]) -> Vec<f64> {
    let total = hist.iter().sum::<i64>() as f64;
    let mut acc = 0.0f64;
    hist.iter()
        .enumerate()
        .map(|(i, &h)| {
            let x = h as f64 / total;
            acc = if i == 0 { x } else { acc + x };
            acc
        })
        .collect()
}

/// `np.searchsorted(cdf, v, side='left')`: the first index whose value is not below `v`
/// (NaN sorts last, so an all-NaN cdf gives 0).
pub fn searchsorted_left(cdf: &[f64], v: f64) -> usize {
    cdf.partition_point(|&c| c < v)
}

/// Edge indices `(low, high)` ORT picks for `percentile` (already validated to [0, 100]).
/// Symmetric (|x| histogram): both are the same index, the low threshold being its negation.
pub fn percentile_indices(hist: &[i64], percentile: f64, symmetric: bool) -> (usize, usize) {
    let c = cdf(hist);
    if symmetric {
        let i = searchsorted_left(&c, percentile / 100.0);
        (i, i)
    } else {
        let cut = (100.0 - percentile) / 200.0;
        (searchsorted_left(&c, cut), searchsorted_left(&c, 1.0 - cut))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orts_worked_examples() {
        assert_eq!(percentile_indices(&[3, 1, 0, 0, 0, 0, 0, 2], 50.0, true), (0, 0));
        assert_eq!(percentile_indices(&[1, 0, 0, 0, 3, 1, 0, 1], 50.0, false), (4, 5));
    }

    #[test]
    fn p100_depends_on_the_last_cdf_bits() {
        // 3 equal bins: cdf[-1] == 1.0 -> index 2; 10 equal bins: 0.9999999999999999 -> 10.
        assert_eq!(percentile_indices(&[1, 1, 1], 100.0, true).0, 2);
        assert_eq!(percentile_indices(&[1; 10], 100.0, true).0, 10);
    }

    #[test]
    fn empty_histogram_gives_index_zero() {
        assert_eq!(percentile_indices(&[0, 0, 0], 99.0, false), (0, 0));
    }
}
