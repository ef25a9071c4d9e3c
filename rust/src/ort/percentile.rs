//! ORT's `compute_percentile`: the left edge of the bin where the cumulative distribution
//! first reaches the target, clipped to the data's min/max by the caller.

/// `np.searchsorted(np.cumsum(hist / hist.sum()), v, side='left')`: the first index whose
/// cumulative value (f64 division, sequential f64 prefix sum, all NaN if empty) is not below
/// `v`, `hist.len()` if none. The prefix sums never decrease (each adds a term >= 0), so the
/// first one not below `v` is where numpy's binary search lands, and NaN sorts last (an empty
/// histogram gives 0). Computed on the fly: no array of `hist.len()` values.
pub fn searchsorted_cdf(hist: &[i64], v: f64) -> usize {
    let total = hist.iter().sum::<i64>() as f64;
    let mut acc = 0.0f64;
    for (i, &h) in hist.iter().enumerate() {
        let x = h as f64 / total;
        acc = if i == 0 { x } else { acc + x };
        // not below v (NaN included: it sorts last)
        if acc.partial_cmp(&v) != Some(std::cmp::Ordering::Less) {
            return i;
        }
    }
    hist.len()
}

/// Edge indices `(low, high)` ORT picks for `percentile` (already validated to [0, 100]).
/// Symmetric (|x| histogram): both are the same index, the low threshold being its negation.
pub fn percentile_indices(hist: &[i64], percentile: f64, symmetric: bool) -> (usize, usize) {
    if symmetric {
        let i = searchsorted_cdf(hist, percentile / 100.0);
        (i, i)
    } else {
        let cut = (100.0 - percentile) / 200.0;
        (searchsorted_cdf(hist, cut), searchsorted_cdf(hist, 1.0 - cut))
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

    /// The materialised cdf and numpy's binary search, as ORT runs them.
    fn reference(hist: &[i64], v: f64) -> usize {
        let total = hist.iter().sum::<i64>() as f64;
        let mut acc = 0.0;
        let cdf: Vec<f64> = hist
            .iter()
            .enumerate()
            .map(|(i, &h)| {
                acc = if i == 0 { h as f64 / total } else { acc + h as f64 / total };
                acc
            })
            .collect();
        cdf.partition_point(|&c| c < v)
    }

    #[test]
    fn on_the_fly_search_equals_the_materialised_cdf() {
        let mut seed = 7u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..300 {
            let n = 1 + (next() % 300) as usize;
            let hist: Vec<i64> = (0..n).map(|_| if next() % 3 == 0 { 0 } else { (next() % 1000) as i64 }).collect();
            for v in [0.0, 1e-9, 0.0005, 0.25, 0.5, 0.999, 0.99999, 1.0, 1.0 + 1e-12, f64::NAN] {
                assert_eq!(searchsorted_cdf(&hist, v), reference(&hist, v), "{hist:?} {v}");
            }
        }
        assert_eq!(searchsorted_cdf(&[0, 0], 0.5), reference(&[0, 0], 0.5));
    }

    #[test]
    fn empty_histogram_gives_index_zero() {
        assert_eq!(percentile_indices(&[0, 0, 0], 99.0, false), (0, 0));
    }
}
