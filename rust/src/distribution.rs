//! ORT's `compute_distribution` moments (`_avg_std`) over histogram bin midpoints.

use crate::float::Float;
use crate::libm::{pow, powf};
use crate::pairwise::sum_f64_by;

/// Which transform ORT applies to the midpoints before taking moments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// power 1
    Same,
    /// power 1/3, sign kept
    P3,
}

/// `(avg, std)` in f64, exactly as ORT computes them before rounding to the edge type.
pub fn avg_std<E: Float>(hist: &[i64], edges: &[E], scenario: Scenario) -> (f64, f64) {
    let n = hist.len();
    let half = E::from_f64(0.5);
    let mut values: Vec<E> = (0..n).map(|i| edges[i].add(edges[i + 1]).mul(half)).collect();
    if scenario == Scenario::P3 {
        // numpy: |v| ** E(1/3) (the Python float is cast to the array's type, even f16),
        // times the sign |v|/v with NaN/inf replaced by 1.
        let p = E::from_f64(1.0 / 3.0);
        for v in values.iter_mut() {
            let a = v.abs();
            let fact = a.div(*v);
            let fact = if fact.is_finite() { fact } else { E::from_f64(1.0) };
            *v = pow_elem(a, p).mul(fact);
        }
    }
    let total = hist.iter().sum::<i64>() as f64;
    let avg = sum_f64_by(n, |i| hist[i] as f64 * values[i].to_f64()) / total;
    let sq = sum_f64_by(n, |i| hist[i] as f64 * values[i].mul(values[i]).to_f64()) / total;
    let std = pow(sq - pow(avg, 2.0), 0.5);
    (avg, std)
}

/// numpy's `E ** E` power loop: f32 (and f16, via f32) call libm `powf`; f64 calls `pow`.
fn pow_elem<E: Float>(a: E, p: E) -> E {
    if E::NAME == "float64" {
        E::from_f64(pow(a.to_f64(), p.to_f64()))
    } else {
        E::from_f32(powf(a.to_f32(), p.to_f32()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_scenario_on_a_simple_histogram() {
        let edges = [-2.0f32, -1.0, 0.0, 1.0, 2.0];
        let (avg, std) = avg_std(&[0, 1, 1, 0], &edges, Scenario::Same);
        assert_eq!(avg, 0.0);
        assert_eq!(std, 0.5);
    }

    #[test]
    fn empty_histogram_is_nan() {
        let (avg, std) = avg_std(&[0, 0], &[0.0f32, 1.0, 2.0], Scenario::Same);
        assert!(avg.is_nan() && std.is_nan());
    }
}
