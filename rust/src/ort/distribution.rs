//! ORT's `compute_distribution` moments (`_avg_std`) over histogram bin midpoints, scenario
//! "same" (scenario "p3" runs numpy's own float power, in the Python collector).

use crate::numeric::float::Float;
use crate::numeric::libm::pow;
use crate::numeric::pairwise::sum_f64_by;

/// `(avg, std)` in f64, exactly as ORT computes them before rounding to the edge type.
pub fn avg_std<E: Float>(hist: &[i64], edges: &[E]) -> (f64, f64) {
    let n = hist.len();
    let half = E::from_f64(0.5);
    // the bin midpoints, recomputed where needed rather than stored (no allocation)
    let value = |i: usize| edges[i].add(edges[i + 1]).mul(half);
    let total = hist.iter().sum::<i64>() as f64;
    let avg = sum_f64_by(n, |i| hist[i] as f64 * value(i).to_f64()) / total;
    let sq = sum_f64_by(n, |i| hist[i] as f64 * value(i).mul(value(i)).to_f64()) / total;
    let std = pow(sq - pow(avg, 2.0), 0.5);
    (avg, std)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_scenario_on_a_simple_histogram() {
        let edges = [-2.0f32, -1.0, 0.0, 1.0, 2.0];
        let (avg, std) = avg_std(&[0, 1, 1, 0], &edges);
        assert_eq!(avg, 0.0);
        assert_eq!(std, 0.5);
    }

    #[test]
    fn empty_histogram_is_nan() {
        let (avg, std) = avg_std(&[0, 0], &[0.0f32, 1.0, 2.0]);
        assert!(avg.is_nan() && std.is_nan());
    }
}
