use super::*;
use crate::methods::qerror::testing::*;

/// A stop flag that is never set.
static GO: AtomicBool = AtomicBool::new(false);

#[test]
fn search_work_bounds_two_literal_sums_per_candidate() {
    for (nb, nq) in [(1usize, 1usize), (7, 3), (130, 128), (2048, 128)] {
        let literal: u64 = (nq..=nb).map(|i| i as u64).sum();
        assert_eq!(search_work(nb, nq), 2 * literal * LITERAL_BIN_COST + nb as u64, "{nb}/{nq}");
    }
    assert_eq!(search_work(100, 128), 0);
}

#[test]
fn a_set_stop_flag_cancels_the_search() {
    let counts: Vec<u64> = (0..4096).map(|k| k % 5).collect();
    let h = UniformHistogram::new(&counts, -2048.0, 1.0, -2047.5, 2047.5).unwrap();
    assert_eq!(kl_range(&h, 2048, 128, &AtomicBool::new(true)), Err(KlError::Cancelled));
    assert!(kl_range(&h, 2048, 128, &GO).is_ok());
}

fn scratch() -> (Vec<f64>, Vec<f64>) {
    (vec![], vec![])
}

/// Every candidate's fast divergence against the literal one, and the chosen candidate
/// against the literal argmin. Returns how many candidates the fast path served.
fn check(abs: &[u64], nq: usize, what: &str) -> usize {
    let mut served = 0;
    let search = Search::new(abs, nq);
    let mut plain = CountSums::new();
    abs[..nq - 1].iter().for_each(|&h| plain.add(h));
    let mut direct = vec![];
    for i in nq..=abs.len() {
        let want = divergence(abs, i, nq, &mut scratch());
        if let Some(got) = search.fast_divergence(i, &plain, &GroupSums::new(&search, i / nq)) {
            served += 1;
            let ok = got == want || (got - want).abs() <= 1e-10 * want.abs() + 1e-13;
            assert!(ok, "{what}: candidate {i}: fast {got:e}, direct {want:e}");
        }
        direct.push(want);
        plain.add(abs[i - 1]);
    }
    let mut want = (f64::INFINITY, nq);
    for (k, &d) in direct.iter().enumerate() {
        if d < want.0 {
            want = (d, nq + k);
        }
    }
    assert_eq!(best_candidate(abs, nq, &GO), Ok(want.1), "{what}");
    served
}

#[test]
fn fast_divergence_matches_the_literal_sum_on_edge_cases() {
    let mut rng = Rng(30);
    for (name, data) in edge_case_data(&mut rng) {
        let b = Binned::of(&data, 8192);
        for (nb, nq) in [(2048, 128), (256, 16), (130, 128), (7, 3)] {
            if let Some((abs, _)) = abs_histogram(&b.hist(), nb) {
                let served = check(&abs, nq, &format!("{name} {nb}/{nq}"));
                // the series serves every candidate of these bin counts
                assert_eq!(served, nb - nq + 1, "{name} {nb}/{nq}");
            }
        }
    }
}

#[test]
fn fast_divergence_matches_the_literal_sum_on_random_histograms() {
    let mut rng = Rng(31);
    // dense to very sparse: smoothing offsets from 0 to beyond each series' reach
    for (cases, max_bins, one_in) in [(150, 300, 1), (100, 300, 4), (20, 1500, 40), (20, 2500, 150)] {
        for case in 0..cases {
            let nq = 1 + rng.below(40) as usize;
            let nb = nq + rng.below(max_bins) as usize;
            let scale = [3, 40, 1 << 20][rng.below(3) as usize];
            let abs: Vec<u64> = (0..nb).map(|_| if rng.below(one_in) == 0 { rng.below(scale) } else { 0 }).collect();
            if abs.iter().all(|&h| h == 0) {
                continue;
            }
            check(&abs, nq, &format!("case {case} {nb}/{nq} 1/{one_in}"));
        }
    }
}

#[test]
fn outliers_alone_in_the_last_group() {
    // the last group of early candidates is empty but for the folded outliers: q is zero
    // where p is not
    let mut abs = vec![0u64; 64];
    abs[0] = 10;
    abs[63] = 3;
    check(&abs, 4, "outliers");
}

#[test]
fn large_smoothing_offsets_take_the_literal_sum() {
    // 12000 bins, three non-zero: offsets up to 0.4, beyond the series
    let mut abs = vec![0u64; 12_000];
    abs[5] = 1;
    abs[100] = 7;
    abs[11_000] = 2;
    let served = check(&abs, 128, "large offsets");
    assert!(served < 12_000 - 128 + 1);
}

#[test]
fn settings_and_trivial_histograms() {
    let counts = [1u64, 2, 3, 4];
    let h = UniformHistogram::new(&counts, -2.0, 1.0, -1.5, 1.5).unwrap();
    assert_eq!(kl_range(&h, 2048, 0, &GO), Err(KlError::NoQuantizedBins));
    assert_eq!(kl_range(&h, 100, 128, &GO), Err(KlError::TooFewBins { num_bins: 100, num_quantized_bins: 128 }));
    assert_eq!(kl_range(&h, MAX_BINS + 1, 128, &GO), Err(KlError::TooManyBins { num_bins: MAX_BINS + 1 }));
    let empty = [0u64; 4];
    let h0 = UniformHistogram::new(&empty, -2.0, 1.0, 0.0, 0.0).unwrap();
    assert_eq!(kl_range(&h0, 2048, 128, &GO), Ok((0.0, 0.0)));
    let zeros = [0u64, 0, 5, 0];
    let hz = UniformHistogram::new(&zeros, -2.0, 1.0, 0.0, 0.0).unwrap();
    assert_eq!(kl_range(&hz, 2048, 128, &GO), Ok((0.0, 0.0)));
    // one value: every bin but the last is empty, A is that value; num_bins == nq has the
    // single candidate i = num_bins, the full range (its low end at 0: the data's min is 0.7)
    let one = [0u64, 0, 3, 0];
    let h1 = UniformHistogram::new(&one, -2.0, 1.0, 0.7, 0.7).unwrap();
    assert_eq!(kl_range(&h1, 128, 128, &GO), Ok((0.0, 0.7)));
    let h2 = UniformHistogram::new(&one, -2.0, 1.0, -0.7, -0.7).unwrap();
    assert_eq!(kl_range(&h2, 128, 128, &GO), Ok((-0.7, 0.7)));
    let (abs, a) = abs_histogram(&h1, 16).unwrap();
    assert_eq!((abs[15], a), (3, 0.7));
}

#[test]
fn thresholds_of_a_normal_distribution() {
    let mut rng = Rng(32);
    let data: Vec<f64> = (0..200_000).map(|_| rng.normal()).collect();
    let b = Binned::of(&data, 8192);
    let (low, high) = kl_range(&b.hist(), 2048, 128, &GO).unwrap();
    assert_eq!(low, -high);
    // TensorRT's calibration of a standard normal lands around 2.5-4 sigma
    assert!((2.0..4.5).contains(&high), "{high}");
}
