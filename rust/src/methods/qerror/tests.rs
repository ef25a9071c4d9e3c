use super::testing::*;
use super::*;

fn assert_close(got: f64, want: f64, tol: f64, what: &str) {
    let ok = got == want || (got - want).abs() <= tol * want.abs().max(got.abs());
    assert!(ok, "{what}: got {got:e}, want {want:e}");
}

const QTYPES: [QType; 4] = [QType::Int8, QType::UInt8, QType::Int16, QType::UInt16];

#[test]
fn qmin_qmax_and_scale_follow_ort() {
    assert_eq!(QType::Int8.qmin_qmax(true), (-127, 127));
    assert_eq!(QType::UInt16.qmin_qmax(true), (0, 65535));
    // ORT: compute_scale_zp(-1, 3, -128, 127): scale 4/255, zp round(-128 + 63.75) = -64
    let q = Quantizer::for_range(-1.0, 3.0, QType::Int8, false, ScaleRule::Float32);
    assert_eq!(q.scale, (4.0f64 / 255.0) as f32 as f64);
    assert_eq!(q.zero_point, -64.0);
    // the range always holds 0
    let q = Quantizer::for_range(2.0, 3.0, QType::UInt8, false, ScaleRule::Float32);
    assert_eq!((q.scale, q.zero_point), ((3.0f64 / 255.0) as f32 as f64, 0.0));
    // symmetric uint8 keeps (0, 255), zero point round_half_even(127.5) = 128
    assert_eq!(Quantizer::for_range(-1.0, 1.0, QType::UInt8, true, ScaleRule::Float32).zero_point, 128.0);
    // -1/(2/255) = -127.5 in f64 exactly: -128 + 127.5 = -0.5 rounds to even 0
    assert_eq!(Quantizer::for_range(-1.0, 1.0, QType::Int8, false, ScaleRule::Float32).zero_point, 0.0);
    // a scale below float32's tiny: 1 and 0
    let q = Quantizer::for_range(-1e-40, 1e-40, QType::Int8, false, ScaleRule::Float32);
    assert_eq!((q.scale, q.zero_point), (1.0, 0.0));
    assert_eq!(Quantizer::for_range(0.0, 0.0, QType::Int8, false, ScaleRule::Float32).scale, 1.0);
    // beyond float32: an infinite scale
    assert_eq!(Quantizer::for_range(-1e300, 1e300, QType::Int8, false, ScaleRule::Float32).scale, f64::INFINITY);
}

#[test]
fn float16_rounding_is_numpys() {
    let mut rng = Rng(7);
    let halves = (0..=u16::MAX).map(|b| half::f16::from_bits(b).to_f64()).filter(|x| x.is_finite());
    // every float16, the midpoints around it and random values of every magnitude
    let near = halves.flat_map(|x| [x, x * (1.0 + 2f64.powi(-11)), x * (1.0 - 2f64.powi(-12)), x + 2f64.powi(-25)]);
    let random = (0..100_000).map(|_| (rng.uniform() - 0.5) * 2f64.powf(rng.uniform() * 50.0 - 34.0));
    for x in near.chain(random).chain([65519.99, 65520.0, -65520.0, 1e300, 2f64.powi(-25), 3.0 * 2f64.powi(-26)]) {
        let want = half::f16::from_bits(crate::numeric::float::f64_to_f16_bits(x)).to_f64();
        assert_eq!(round_to_f16(x).to_bits(), want.to_bits(), "{x:e}");
    }
}

#[test]
fn float16_scales_follow_each_version() {
    let sub = ScaleRule::Float16Subnormal;
    let normal = ScaleRule::Float16Normal;
    let scale_zp = |low: f64, high: f64, qtype: QType, rule: ScaleRule| {
        let p = OrtScale::of(low, high, qtype, false, rule);
        (p.quantizer.scale, p.quantizer.zero_point, p.degenerate)
    };
    // scale 2^-14 (float16's smallest normal): kept by both
    let high = 255.0 * 2f64.powi(-14);
    assert_eq!(scale_zp(0.0, high, QType::UInt8, normal), (2f64.powi(-14), 0.0, false));
    assert_eq!(scale_zp(0.0, high, QType::UInt8, sub), (2f64.powi(-14), 0.0, false));
    // scale 2^-20: 1.31 replaces it by 1, 1.32 keeps the float16 subnormal
    let high = 255.0 * 2f64.powi(-20);
    assert_eq!(scale_zp(0.0, high, QType::UInt8, normal), (1.0, 0.0, true));
    assert_eq!(scale_zp(0.0, high, QType::UInt8, sub), (2f64.powi(-20), 0.0, false));
    assert_eq!(scale_zp(0.0, high, QType::UInt8, ScaleRule::Float32), (2f64.powi(-20), 0.0, false));
    // 1.32 tests the scale rounded to float16: 2^-14 / 65535 (~2^-30) rounds to 0, while
    // 2^-17 / 255, just above 2^-25 (the tie), rounds up to 2^-24
    assert_eq!(scale_zp(-2f64.powi(-14), 0.0, QType::UInt16, sub), (1.0, 0.0, true));
    assert_eq!(scale_zp(0.0, 2f64.powi(-17), QType::UInt8, sub), (2f64.powi(-24), 0.0, false));
    assert_eq!(scale_zp(0.0, 2f64.powi(-17), QType::UInt8, normal), (1.0, 0.0, true));
    let low = -(2f64.powi(-14) + 2f64.powi(-24)) * 1024.0; // int8 scale (2^-4 + 2^-14) / 255 ~ 2^-12
    let (scale, zp, degenerate) = scale_zp(low, 0.0, QType::Int8, sub);
    assert_eq!((scale, zp, degenerate), (round_to_f16(-low / 255.0), 127.0, false));
    // the range itself is rounded to float16 first: 1 + 2^-12 is 1
    assert_eq!(scale_zp(-1.0 - 2f64.powi(-12), 0.0, QType::UInt8, sub).0, round_to_f16(1.0 / 255.0));
    // beyond float16 (65504): an infinite scale in both
    assert_eq!(scale_zp(0.0, 70000.0, QType::UInt8, normal).0, f64::INFINITY);
    assert_eq!(scale_zp(0.0, 70000.0, QType::UInt8, sub).0, f64::INFINITY);
}

#[test]
fn software_rounding_is_exact() {
    let mut rng = Rng(4);
    let specials = [0.5, 1.5, 2.5, -0.5, -2.5, -0.4, 4503599627370495.5, 4503599627370497.0, 1e300, -1e-300, 0.0, -0.0];
    let random = (0..100_000).map(|_| (rng.uniform() - 0.5) * 10f64.powf(rng.uniform() * 40.0 - 20.0));
    for x in specials.into_iter().chain(random) {
        assert_eq!(round_half_even(x).to_bits(), x.round_ties_even().to_bits(), "{x}");
        assert_eq!(ceil(x), x.ceil(), "{x}");
        assert_eq!(floor(x), x.floor(), "{x}");
    }
    assert!(round_half_even(f64::NAN).is_nan());
}

#[test]
fn dequantize_rounds_half_to_even_and_clips() {
    let q = Quantizer { scale: 1.0, zero_point: 0.0, qmin: -128.0, qmax: 127.0 };
    assert_eq!(q.dequantize(2.5), 2.0);
    assert_eq!(q.dequantize(3.5), 4.0);
    assert_eq!(q.dequantize(1000.0), 127.0);
    assert_eq!(q.dequantize(-1000.0), -128.0);
}

#[test]
fn invalid_histograms_are_rejected() {
    let c = [1u64, 2];
    assert!(UniformHistogram::new(&c, 0.0, 0.0, 0.0, 1.0).is_err());
    assert!(UniformHistogram::new(&c, f64::NAN, 1.0, 0.0, 1.0).is_err());
    assert!(UniformHistogram::new(&c, 0.0, 1.0, 1.0, 0.0).is_err());
    assert!(UniformHistogram::new(&c, 0.0, 1.0, 0.0, f64::INFINITY).is_err());
    assert!(UniformHistogram::new(&[u64::MAX, 1], 0.0, 1.0, 0.0, 1.0).is_err());
    assert!(UniformHistogram::new(&c, 0.0, 1.0, 0.5, 0.5).is_ok());
}

/// Ranges around, inside and beyond the data, in every type, both modes.
fn check_against_direct(h: &UniformHistogram<'_>, rng: &mut Rng, what: &str) {
    let table = ErrorTable::new(*h);
    let (lo, hi) = (h.min.min(0.0), h.max.max(0.0));
    let a = lo.abs().max(hi.abs()).max(h.width);
    let mut ranges = vec![(lo, hi), (h.min, h.max), (0.0, 0.0), (-a, a), (lo * 0.5, hi * 0.25), (-a * 10.0, a * 3.0)];
    for _ in 0..20 {
        ranges.push((-a * rng.uniform() * 1.2, a * rng.uniform() * 1.2));
    }
    for &(low, high) in &ranges {
        for qt in QTYPES {
            for sym in [false, true] {
                for rule in [ScaleRule::Float32, ScaleRule::Float16Normal, ScaleRule::Float16Subnormal] {
                    let q = Quantizer::for_range(low, high, qt, sym, rule);
                    if q.scale == f64::INFINITY {
                        continue; // a range beyond float16: ErrorTable's own case
                    }
                    let want = direct_error(h, &q);
                    let got = table.mean_squared_error(&q);
                    assert_close(got, want, 1e-10, &format!("{what} ({low}, {high}) {qt:?} sym={sym} {rule:?}"));
                }
            }
        }
    }
}

#[test]
fn fast_error_matches_the_direct_sum_on_edge_cases() {
    let mut rng = Rng(1);
    for (name, data) in edge_case_data(&mut rng) {
        for half in [4, 64, 8192] {
            let b = Binned::of(&data, half);
            check_against_direct(&b.hist(), &mut rng, &format!("{name}, {} bins", 2 * half));
        }
    }
}

#[test]
fn fast_error_matches_the_direct_sum_on_random_histograms() {
    let mut rng = Rng(2);
    for case in 0..300 {
        let nb = 1 + rng.below(3000) as usize;
        let sparse = rng.below(3) == 0;
        let big = rng.below(4) == 0;
        let counts: Vec<u64> = (0..nb)
            .map(|_| {
                if sparse && rng.below(10) != 0 {
                    0
                } else if big {
                    rng.below(1 << 50)
                } else {
                    rng.below(1000)
                }
            })
            .collect();
        let width = 10f64.powf(rng.uniform() * 8.0 - 4.0);
        let left = -(rng.uniform() * 1.2) * nb as f64 * width;
        let right = left + nb as f64 * width;
        // extremes inside the first/last bins, sometimes exactly on centres
        let (a, b) = (left + rng.uniform() * width, right - rng.uniform() * width);
        let (mut min, mut max) = (a.min(b), a.max(b));
        if rng.below(5) == 0 && nb > 1 {
            (min, max) = (left + 0.5 * width, right - 0.5 * width);
        }
        let h = UniformHistogram::new(&counts, left, width, min, max).unwrap();
        check_against_direct(&h, &mut rng, &format!("random case {case}"));
    }
}

#[test]
fn wide_moments_stay_exact() {
    // counts near 2^60 force the 128-bit moments; the error of a range whose levels sit on
    // bin centres is 0 exactly in the interior.
    let counts = vec![1u64 << 60; 9];
    let h = UniformHistogram::new(&counts, -4.5, 1.0, -4.0, 4.0).unwrap();
    let t = ErrorTable::new(h);
    assert!(matches!(t.moments, Moments::Wide(_)));
    let q = Quantizer { scale: 1.0, zero_point: 0.0, qmin: -128.0, qmax: 127.0 };
    assert_eq!(t.mean_squared_error(&q), 0.0);
    let q = Quantizer { scale: 2.0, zero_point: 0.0, qmin: -1.0, qmax: 1.0 };
    assert_close(t.mean_squared_error(&q), direct_error(&h, &q), 1e-12, "wide");
}

#[test]
fn clamped_bins_stand_for_the_extremes() {
    // one value 0.3 in bin [0, 1): its centre 0.5 is clamped to 0.3
    let counts = [0u64, 5, 0];
    let h = UniformHistogram::new(&counts, -1.0, 1.0, 0.3, 0.3).unwrap();
    // 0.3 rounds (or clips) to the top level 255 * scale, the scale from the float32 range
    let top_error = |high: f64| (0.3f64 - 255.0 * (high as f32 as f64 / 255.0) as f32 as f64).powi(2);
    assert_eq!(range_error(h, 0.0, 0.3, QType::UInt8, false, ScaleRule::Float32), top_error(0.3));
    assert_eq!(range_error(h, 0.0, 0.15, QType::UInt8, false, ScaleRule::Float32), top_error(0.15));
}

#[test]
fn empty_histogram_has_no_error_and_infinite_scale_infinite_error() {
    let counts = [0u64; 4];
    let h = UniformHistogram::new(&counts, -2.0, 1.0, 0.0, 0.0).unwrap();
    assert_eq!(range_error(h, -1.0, 1.0, QType::Int8, false, ScaleRule::Float32), 0.0);
    let counts = [1u64, 0, 0, 1];
    let h = UniformHistogram::new(&counts, -2e300, 1e300, -1.5e300, 1.5e300).unwrap();
    assert_eq!(range_error(h, -1.5e300, 1.5e300, QType::Int8, false, ScaleRule::Float32), f64::INFINITY);
}

#[test]
fn clipping_error_is_the_clipped_values_error() {
    let mut rng = Rng(5);
    for (name, data) in edge_case_data(&mut rng) {
        let b = Binned::of(&data, 512);
        let h = b.hist();
        let t = ErrorTable::new(h);
        for _ in 0..50 {
            let (low, high) = (h.min * rng.uniform() * 1.1, h.max * rng.uniform() * 1.1 + 1e-300);
            let mut want = 0.0;
            for (i, &c) in h.counts.iter().enumerate() {
                let x = h.value(i);
                let d = if x <= low {
                    low - x
                } else if x >= high {
                    x - high
                } else {
                    0.0
                };
                want += c as f64 * (d / h.width).powi(2);
            }
            assert_close(t.clipping_error_sum(low, high), want, 1e-10, name);
        }
    }
}

#[test]
fn bounded_sums_stop_early_but_never_change_the_value() {
    let mut rng = Rng(3);
    let data: Vec<f64> = (0..5000).map(|_| rng.normal()).collect();
    let b = Binned::of(&data, 1024);
    let t = ErrorTable::new(b.hist());
    for (low, high) in [(-1.0, 1.0), (-3.0, 4.0), (-0.1, 0.1)] {
        let q = Quantizer::for_range(low, high, QType::Int8, false, ScaleRule::Float32);
        let full = t.squared_error_sum(&q, f64::INFINITY).unwrap();
        assert_eq!(t.squared_error_sum(&q, full), Some(full));
        assert_eq!(t.squared_error_sum(&q, full * 0.5), None);
    }
}
