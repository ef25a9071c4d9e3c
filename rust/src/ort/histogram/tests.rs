use super::*;

#[test]
fn counting_without_memory_for_the_chunk_counters_reports_it_and_adds_nothing() {
    // more counters than can exist: every chunk's allocation fails
    let counted = count_chunks(3 * PAR_CHUNK, usize::MAX / 4, |_, _| Some(()));
    assert!(matches!(counted, Some(None)));
    let mut counts = vec![1i64, 2];
    assert!(!add_counted(counted, &mut counts));
    assert_eq!(counts, vec![1, 2]);
    assert!(add_counted(count_chunks(0, 2, |_, _| Some(())), &mut counts));
    assert!(add_counted(
        count_chunks(5, 2, |_, c| {
            c[1] += 5;
            Some(())
        }),
        &mut counts
    ));
    assert_eq!(counts, vec![1, 7]);
    // a chunk whose own scratch fails fails the whole count
    assert!(matches!(count_chunks(3 * PAR_CHUNK, 2, |r, _| (r.start != PAR_CHUNK).then_some(())), Some(None)));
}
use half::f16;

fn hist_of(x: &[f32], n: usize, t: f32) -> (Vec<i64>, Vec<f32>) {
    let b = UniformBins::new(-t, t, n).unwrap();
    let mut c = vec![0; n];
    b.count(&View::from_slice(x), false, &mut c);
    (c, b.edges)
}

#[test]
fn orts_worked_example() {
    let (c, e) = hist_of(&[-1.0, 0.5, 2.0], 8, 2.0);
    assert_eq!(c, vec![0, 0, 1, 0, 0, 1, 0, 1]);
    assert_eq!(e, vec![-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0]);
}

#[test]
#[allow(clippy::approx_constant)] // 0.7071: any irrational-looking step
fn fast_f32_path_equals_the_literal_algorithm() {
    let mut x: Vec<f32> = (0..200_000).map(|i| ((i as f32) * 0.7071).sin() * 3.0).collect();
    x.extend([f32::NAN, f32::INFINITY, -f32::INFINITY, 5.0, -5.0, 0.0, -0.0]);
    for &(t, n) in &[(3.0f32, 2048usize), (2.9f32, 1000), (0.3, 7), (3.0, 1)] {
        let b = UniformBins::new(-t, t, n).unwrap();
        x.extend(
            b.edges
                .iter()
                .flat_map(|&e| [e, f32::from_bits(e.to_bits() + 1), f32::from_bits(e.to_bits().wrapping_sub(1))]),
        );
        for abs in [false, true] {
            let mut fast = vec![0; n];
            b.count(&View::from_slice(&x), abs, &mut fast);
            let mut slow = vec![0; n];
            b.count_block(&x, abs, &mut slow);
            assert_eq!(fast, slow, "t={t} n={n} abs={abs}");
            // The edge-table variant (used when the edges are not linspace's formula).
            let mut table = b.fast_f32::<f32>().unwrap();
            assert!(table.arith);
            table.arith = false;
            let mut sub = SubHist::new(n).unwrap();
            table.count(&x, abs, &mut sub);
            let mut tab = vec![0; n];
            sub.add_to(&mut tab);
            assert_eq!(tab, slow, "table path t={t} n={n} abs={abs}");
        }
    }
}

#[test]
fn fast_f32_path_random_ranges() {
    // Asymmetric and odd ranges, bin counts up to a few thousand, values on and around
    // every edge.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    for _ in 0..60 {
        let a = ((rnd() - 0.5) * 10f64.powf(rnd() * 8.0 - 4.0)) as f32;
        let w = (10f64.powf(rnd() * 8.0 - 5.0)) as f32;
        let n = 1 + (rnd() * 4000.0) as usize;
        let Ok(b) = UniformBins::new(a, a + w, n) else { continue };
        let mut x: Vec<f32> = (0..20_000).map(|_| (a as f64 + (rnd() * 1.2 - 0.1) * w as f64) as f32).collect();
        x.extend(
            b.edges
                .iter()
                .flat_map(|&e| [e, f32::from_bits(e.to_bits() + 1), f32::from_bits(e.to_bits().wrapping_sub(1)), -e]),
        );
        for abs in [false, true] {
            let mut fast = vec![0; n];
            b.count(&View::from_slice(&x), abs, &mut fast);
            let mut slow = vec![0; n];
            b.count_block(&x, abs, &mut slow);
            assert_eq!(fast, slow, "a={a} w={w} n={n} abs={abs}");
        }
    }
}

#[test]
fn every_dispatch_tier_gives_the_same_counts() {
    // One test runs all tiers in turn (the tier is process-wide; other tests running at the
    // same time stay correct, they only may use a lower tier).
    for tier in [0u8, 1, 2] {
        crate::numeric::simd::set_max_tier(tier);
        fast_f32_path_equals_the_literal_algorithm();
        fast_f32_path_random_ranges();
        crate::ort::explicit_edges::tests::explicit_f32_path_matches_f64_comparisons();
        f16_path_equals_the_literal_algorithm_on_every_f16();
    }
    crate::numeric::simd::set_max_tier(2);
}

#[test]
fn equal_range_expands_by_half() {
    let (c, e) = hist_of(&[0.0; 5], 8, 0.0);
    assert_eq!(c, vec![0, 0, 0, 0, 5, 0, 0, 0]);
    assert_eq!(e[0], -0.5);
    assert_eq!(e[8], 0.5);
}

#[test]
fn a_single_float64_value_past_numpys_half_widens_relatively() {
    // +-0.5 still holds 2048 float64 bins at 2^40, not at 2^42 (numpy: "Too many bins"),
    // nor anywhere once it vanishes (1e20, float32's largest): then +-|c| 2^-24.
    let ok = UniformBins::<f64>::new(2f64.powi(40), 2f64.powi(40), 2048).unwrap();
    assert_eq!((ok.first, ok.last), (2f64.powi(40) - 0.5, 2f64.powi(40) + 0.5));
    for (c, ns) in [
        (2f64.powi(42), &[2048, MAX_BINS][..]),
        (-1e20, &[1, 7, 2048, MAX_BINS]),
        (f32::MAX as f64, &[1, 2048]),
        (f32::MIN as f64, &[7, 2048]),
    ] {
        for &n in ns {
            let b = UniformBins::<f64>::new(c, c, n).unwrap();
            let h = c.abs() * 2f64.powi(-24);
            assert_eq!((b.first, b.last), (c - h, c + h), "c={c} n={n}");
            assert_eq!(b.bin_of(c), Some(n / 2), "c={c} n={n}");
        }
        // float32 and float16 keep numpy's refusal (histocal then widens the type)
        assert!(UniformBins::<f32>::new(c as f32, c as f32, 2048).is_err());
    }
}

#[test]
fn linspace_is_evaluated_in_the_element_type() {
    // t = 3.7f, n = 2048: index 142 is -3.186914 in f32 arithmetic (not f32(f64 linspace)).
    let b = UniformBins::<f32>::new(-3.7, 3.7, 2048).unwrap();
    assert_eq!(b.edges[142], -3.186914f32);
}

#[test]
fn f16_runs_out_of_bins_like_numpy() {
    let t = f16::from_f32(1.5);
    assert_eq!(UniformBins::new(-t, t, 2048).unwrap_err(), HistError::TooManyBins(2048));
    let t = f16::from_f32(1.0);
    assert!(UniformBins::new(-t, t, 2048).is_ok());
}

#[test]
fn arange_matches_numpy_example() {
    // edges up to 1.0 with width 0.125 and amax 2.2: ext = [1.125 .. 2.25]
    let e = arange_f64(1.125f32, 2.2f32 + 0.125, 0.125).unwrap();
    assert_eq!(e.first(), Some(&1.125));
    assert_eq!(e.last(), Some(&2.25));
    assert_eq!(e.len(), 10);
    // start == stop after rounding: empty.
    assert!(arange_f64(17.5f32, 17.5f32, 3.5).unwrap().is_empty());
    // f16 overflow and lengths beyond MAX_BINS are errors, not allocations.
    let inf = half::f16::INFINITY;
    assert!(arange_f64(inf, inf, half::f16::from_f32(8.0)).is_err());
    assert!(arange_f64(0.0f32, 1e9, 1e-3).is_err());
}

#[test]
fn rounding_to_f16_in_f32_lanes_is_the_half_crates() {
    // every 4099th f32 bit pattern (both signs, every exponent), and every f32 within a few
    // ulps of an f16 value or of a midpoint between two (where rounding decides)
    let mut xs: Vec<f32> = (0..=u32::MAX / 4099).map(|i| f32::from_bits(i * 4099)).collect();
    for h in 0..=u16::MAX {
        let v = f16::from_bits(h).to_f32();
        let next = f16::from_bits(h.wrapping_add(1)).to_f32();
        for base in [v, (v + next) / 2.0] {
            for d in 0..4u32 {
                xs.extend([
                    f32::from_bits(base.to_bits().wrapping_add(d)),
                    f32::from_bits(base.to_bits().wrapping_sub(d)),
                ]);
            }
        }
    }
    xs.extend([65519.99, 65520.0, 65536.0, -65520.0, f32::MAX, f32::MIN_POSITIVE, 1e-45, -1e-45, 2.980_232_2e-8]);
    for x in xs {
        let want = f16::from_f32(x).to_f32();
        let got = round_to_f16(x);
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{x:e} ({:#x})", x.to_bits());
    }
}

/// Every f16 value (NaN, infinities, signed zeros, subnormals), on and around edges, counted by
/// the f16 kernel and by the literal algorithm, value and |x| histograms, over ranges where the
/// estimate's f16 roundings decide bins and where they do not.
#[test]
fn f16_path_equals_the_literal_algorithm_on_every_f16() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let h = f16::from_f32;
    let ranges = [
        (h(-1.0), h(1.0), 2048),
        (h(-4.0), h(4.0), 128),
        (h(-3.3), h(3.3), 129),
        (h(-0.001), h(0.002), 100),
        (h(0.0), h(65504.0), 128),
        (h(-30000.0), h(30000.0), 7),
        (h(6e-8), h(1e-4), 3),
        (h(2.5), h(2.5), 1),
        (h(-5.0), h(3.0), 1000),
        // where an f32 estimate (one rounding instead of three) would differ after correction
        (h(-0.000_783_920_3), h(0.000_783_920_3), 485),
        (h(-0.027_114_868), h(0.033_050_537), 952),
        (h(1.195_312_5), h(1.195_312_5), 548),
        (h(-13.054_687_5), h(13.054_687_5), 1395),
        (h(-4.218_75), h(-4.218_75), 132),
    ];
    for (lo, hi, n) in ranges {
        let b = UniformBins::new(lo, hi, n).unwrap();
        assert!(b.fast_f32::<f16>().is_some_and(|f| f.half));
        for abs in [false, true] {
            let mut fast = vec![0; n];
            b.count(&View::from_slice(&all), abs, &mut fast);
            let mut slow = vec![0; n];
            b.count_block(&all, abs, &mut slow);
            assert_eq!(fast, slow, "[{lo}, {hi}] n={n} abs={abs}");
            assert!(abs || slow.iter().sum::<i64>() > 0, "the range holds values");
        }
    }
}
