use super::*;
use half::f16;

/// The scalar algorithm the vectorised kernel replaced, kept as the reference: each value
/// widened to f64, scaled by `2^k`, floored, clamped.
fn reference_bins<D: Float>(data: &[D], log_half: u32, level: i32) -> Vec<u64> {
    let scale = pow2(log_half as i32 - level);
    let h = 1i64 << log_half;
    let mut counts = vec![0u64; 2 * h as usize];
    for &x in data {
        let v = x.to_f64();
        if v.is_finite() {
            let f = (v * scale).floor();
            // a negative value whose scaled form underflowed to -0 belongs below zero
            let s = if f == 0.0 && v < 0.0 { -1 } else { f as i64 };
            counts[(s.clamp(-h, h - 1) + h) as usize] += 1;
        }
    }
    counts
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Values that sit on or next to the bin edges `j * 2^(level - log_half)` of `level`, the
/// powers of two, the ends of the type's range, signed zeros and subnormals.
fn edge_values(log_half: u32, level: i32, rng: &mut Rng) -> Vec<f64> {
    let w = pow2(level - log_half as i32);
    let h = 1i64 << log_half;
    let mut v = Vec::new();
    for _ in 0..2000 {
        let j = rng.below(2 * h as u64 + 3) as i64 - h - 1;
        v.push(j as f64 * w);
    }
    for e in -1080..1030 {
        v.push(pow2(e));
    }
    v.extend([
        0.0,
        f64::MIN_POSITIVE,
        5e-324,
        f64::MAX,
        f32::MAX as f64,
        f32::MIN_POSITIVE as f64,
        1e-45,
        65504.0,
        6e-8,
    ]);
    let pos: Vec<f64> = v.clone();
    for x in pos {
        v.extend([-x, f64::from_bits(x.to_bits() + 1), f64::from_bits(x.to_bits().saturating_sub(1))]);
    }
    v
}

/// `batch_bins` as all `2H` bins.
fn dense_bins<D: Float>(data: &[D], log_half: u32, level: i32) -> Vec<u64> {
    let v = View::from_slice(data);
    let mut bins = vec![0; 2 << log_half];
    batch_bins(&v, &scan(&v), log_half, level).add_to(&mut bins);
    bins
}

/// `batch_bins` against the reference for data of type `D` at `level`, at every SIMD tier,
/// contiguous and strided.
fn check<D: Float>(data: &[D], log_half: u32, level: i32) {
    let want = reference_bins(data, log_half, level);
    for tier in [0u8, 1, 2] {
        crate::numeric::simd::set_max_tier(tier);
        assert!(dense_bins(data, log_half, level) == want, "{} tier {tier} log_half {log_half} level {level}", D::NAME);
    }
    crate::numeric::simd::set_max_tier(2);
    if data.len() >= 2 {
        // every other element: the gathered-block path
        let odd = data.len() / 2;
        let v = unsafe { View::from_raw(data.as_ptr(), &[odd], &[2]) };
        let every_other: Vec<D> = data.iter().step_by(2).take(odd).copied().collect();
        let mut got = vec![0; 2 << log_half];
        batch_bins(&v, &scan(&v), log_half, level).add_to(&mut got);
        assert!(got == reference_bins(&every_other, log_half, level), "strided");
    }
}

#[test]
fn f16_bins_match_the_reference_for_every_value_and_level() {
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for log_half in [2, 13] {
        for level in (MIN_LEVEL..=40).chain([127, 128, 129, 300, 1100]) {
            check(&all, log_half, level);
        }
    }
}

#[test]
fn f32_bins_match_the_reference() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for log_half in [2, 3, 8, 13] {
        for level in (MIN_LEVEL..=140).chain([200, 1024, 1100]) {
            let mut data: Vec<f32> = (0..3000).map(|_| f32::from_bits(rng.next() as u32)).collect();
            data.extend(edge_values(log_half, level, &mut rng).iter().map(|&x| x as f32));
            check(&data, log_half, level);
        }
    }
}

#[test]
fn f64_bins_match_the_reference() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    for log_half in [2, 3, 8, 13] {
        let levels: Vec<i32> = (MIN_LEVEL..=140)
            .step_by(7)
            .chain([-1, 0, 1, 960, 1021, 1022, 1023, 1024, 1025, 1074, 1076, 1100])
            .collect();
        for level in levels {
            let mut data: Vec<f64> = (0..3000).map(|_| f64::from_bits(rng.next())).collect();
            data.extend(edge_values(log_half, level, &mut rng));
            check(&data, log_half, level);
        }
    }
}

#[test]
fn large_batches_and_streams_match_the_reference() {
    // Several parallel chunks, ReLU-like data (half exact zeros), runs of one value longer
    // than a u16 counter holds, and whole streams of batches through `add` (levels raised
    // by the data as it comes).
    let mut rng = Rng(7);
    let mut data: Vec<f32> =
        (0..(3 << 20) + 5).map(|i| if i % 2 == 0 { 0.0 } else { (rng.below(1 << 20) as f32 - 4e5) * 1e-3 }).collect();
    data[..200_000].fill(0.25);
    data[200_000..800_000].fill(0.0);
    check(&data, 13, 10);
    let batches: Vec<&[f32]> = data.chunks(1 << 19).collect();
    let mut h = StreamHistogram::new(13);
    let mut want = StreamHistogram::new(13);
    for (i, b) in batches.iter().enumerate() {
        let scaled: Vec<f32> = b.iter().map(|&x| x * (i + 1) as f32).collect();
        h.add(&View::from_slice(&scaled));
        let level = h.level.unwrap();
        want.raise(level);
        want.bins.iter_mut().zip(reference_bins(&scaled, 13, level)).for_each(|(a, b)| *a += b);
        assert!(h.bins() == want.bins, "batch {i}");
    }
}

/// Activation-like batches for the direct kernel (32K values and more): about one value in
/// four repeats one of the last eight (neighbouring values in one bin, which the direct kernel
/// spreads over copies of its counters), a fifth are exact zeros, some sit on or next to bin
/// edges, with NaN, ±Inf and -0.0; lengths not a multiple of the copies, beyond a u16 counter's
/// reach between flushes, magnitudes growing from batch to batch and inside batches.
fn activation_batches(log_half: u32, rng: &mut Rng) -> Vec<Vec<f64>> {
    let mut batches = Vec::new();
    for (b, &n) in [32768usize, 70001, 40003, 131075].iter().enumerate() {
        let scale = pow2(3 * b as i32);
        let w = pow2(level_for(scale) - log_half as i32);
        let mut recent = [0.0f64; 8];
        let mut v: Vec<f64> = (0..n)
            .map(|i| {
                let x = match rng.below(20) {
                    0..=4 => recent[rng.below(8) as usize],
                    5..=8 => 0.0,
                    9 => {
                        // a bin edge, or the float next to it
                        let e = (rng.below(2 << log_half) as f64 - (1 << log_half) as f64) * w;
                        let e = e as f32;
                        f32::from_bits((e.to_bits() as i64 + rng.below(3) as i64 - 1).max(0) as u32) as f64
                    }
                    // the second half of a batch twice as large as its first
                    _ => (rng.below(2001) as f64 - 1000.0) * 1e-3 * scale * if 2 * i > n { 2.0 } else { 1.0 },
                };
                recent[i % 8] = x;
                x
            })
            .collect();
        for (i, x) in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0].into_iter().enumerate() {
            v[7 + 1000 * i] = x;
        }
        batches.push(v);
    }
    batches
}

#[test]
fn direct_kernel_with_copies_matches_the_reference() {
    let mut rng = Rng(0xC0FF_EE12_3456_789B);
    // 2^14 bins: four copies of the counters; 2^17: one
    for log_half in [13, 16] {
        let batches = activation_batches(log_half, &mut rng);
        let as_type = |f: fn(f64) -> f64| -> Vec<Vec<f64>> {
            batches.iter().map(|b| b.iter().map(|&x| f(x)).collect()).collect()
        };
        let typed =
            |t: &Vec<Vec<f64>>| -> Vec<Vec<f32>> { t.iter().map(|b| b.iter().map(|&x| x as f32).collect()).collect() };
        check_stream::<f32>(&typed(&as_type(|x| x)), log_half);
        let wide: Vec<Vec<f64>> = as_type(|x| x * (1.0 + 1e-9));
        check_stream::<f64>(&wide, log_half);
        let halves: Vec<Vec<f16>> =
            batches.iter().map(|b| b.iter().map(|&x| f16::from_f64(x / 64.0)).collect()).collect();
        check_stream::<f16>(&halves, log_half);
        // a constant batch, then one all zeros, then empty
        check_stream::<f32>(&[vec![0.75; 40000], vec![-0.0; 33333], vec![]], log_half);
    }
}

fn hist_of(batches: &[Vec<f32>], log_half: u32) -> StreamHistogram {
    let mut h = StreamHistogram::new(log_half);
    for b in batches {
        h.add(&View::from_slice(b));
    }
    h
}

#[test]
fn level_is_the_first_power_of_two_above() {
    assert_eq!(level_for(1.0), 1);
    assert_eq!(level_for(0.99), 0);
    assert_eq!(level_for(3.0), 2);
    assert_eq!(level_for(4.0), 3);
    assert_eq!(level_for(0.0), MIN_LEVEL);
}

#[test]
fn bins_are_half_open_and_exact() {
    let h = hist_of(&[vec![-1.0, -0.25, 0.0, 0.25, 0.999]], 2);
    // level 1: [-2, 2) in 8 bins of 0.5
    assert_eq!(h.level, Some(1));
    assert_eq!(h.bins(), vec![0, 0, 1, 1, 2, 1, 0, 0]);
}

/// Batches through `add` (one read, levels raised mid-batch as blocks bring larger values)
/// against the reference binning of all values at the final level, at every SIMD tier,
/// contiguous and strided; totals and extremes against a plain count.
fn check_stream<D: Float>(batches: &[Vec<D>], log_half: u32) {
    let all: Vec<D> = batches.concat();
    let finite: Vec<f64> = all.iter().map(|x| x.to_f64()).filter(|x| x.is_finite()).collect();
    let top = finite.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let level = (!finite.is_empty()).then(|| level_for(top));
    for tier in [0u8, 1, 2] {
        crate::numeric::simd::set_max_tier(tier);
        let mut h = StreamHistogram::new(log_half);
        let mut strided = StreamHistogram::new(log_half);
        for b in batches {
            h.add(&View::from_slice(b));
            // the same values, every other element of a buffer twice as long
            let doubled: Vec<D> = b.iter().flat_map(|&x| [x, D::ZERO]).collect();
            strided.add(&unsafe { View::from_raw(doubled.as_ptr(), &[b.len()], &[2]) });
        }
        assert_eq!(h.level, level, "{} tier {tier}", D::NAME);
        let want = level.map_or(vec![0; 2 << log_half], |l| reference_bins(&all, log_half, l));
        assert!(h.bins() == want, "{} tier {tier} log_half {log_half}", D::NAME);
        assert_eq!(strided, h, "{} strided, tier {tier}", D::NAME);
        assert_eq!(h.n_finite as usize, finite.len());
        assert_eq!(h.n_nan as usize, all.iter().filter(|x| x.to_f64().is_nan()).count());
        assert_eq!(h.finite_min, finite.iter().copied().reduce(f64::min).map(|m| m + 0.0));
        assert_eq!(h.finite_max, finite.iter().copied().reduce(f64::max).map(|m| m + 0.0));
    }
    crate::numeric::simd::set_max_tier(2);
}

/// Mixed-magnitude batches: small values first (a low level), then larger ones mid-batch.
fn growing<D: Float>(values: &[f64], n_batches: usize) -> Vec<Vec<D>> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
    let per = sorted.len().div_ceil(n_batches);
    sorted.chunks(per).map(|c| c.iter().map(|&x| D::from_f64(x)).collect()).collect()
}

#[test]
fn one_read_add_matches_the_reference() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    // every f16, in batches of growing magnitude (NaN and Inf among them)
    let halves: Vec<f64> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f64()).collect();
    for log_half in [2, 13] {
        check_stream::<f16>(&growing(&halves, 5), log_half);
    }
    for log_half in [3, 13] {
        let mut v: Vec<f64> = (0..20_000).map(|_| f32::from_bits(rng.next() as u32) as f64).collect();
        for level in [-140, -20, 0, 3, 40, 127] {
            v.extend(edge_values(log_half, level, &mut rng).iter().map(|&x| x as f32 as f64));
        }
        check_stream::<f32>(&growing(&v, 7), log_half);
        // the same values shuffled: levels rise inside blocks
        let mut shuffled = v.clone();
        for i in (1..shuffled.len()).rev() {
            shuffled.swap(i, rng.below(i as u64 + 1) as usize);
        }
        check_stream::<f32>(&growing(&shuffled[..5000], 1), log_half);
        let mut w: Vec<f64> = (0..20_000).map(|_| f64::from_bits(rng.next())).collect();
        for level in [-140, 0, 40, 1022, 1024] {
            w.extend(edge_values(log_half, level, &mut rng));
        }
        check_stream::<f64>(&growing(&w, 7), log_half);
    }
    // empty batches, all-NaN batches, all zeros (with -0), then data
    let nan = f32::NAN;
    check_stream::<f32>(&[vec![], vec![nan, f32::INFINITY], vec![-0.0, 0.0, -0.0], vec![1.5, -3.0, nan]], 13);
}

/// to_value/to_abs (galloping over runs of source bins) against one lookup per source bin.
fn check_rebin<E: Float>(h: &StreamHistogram, nb: usize) {
    let Ok(v) = h.to_value::<E>(nb) else {
        return; // no such histogram in E (f16 out of range): nothing to re-bin
    };
    let bins = UniformBins::new(v.edges[0], v.edges[nb], nb).unwrap();
    assert_eq!(bins.edges, v.edges);
    let c = h.signed_centre();
    // (a single value goes to its own bin instead: constant_tensors_get_orts_histograms)
    if h.finite_min != h.finite_max {
        assert_eq!(
            v.hist,
            rebin(&bins, (0..h.bins().len()).map(|i| (c(i), h.bins()[i]))),
            "{} value, {nb} bins",
            E::NAME
        );
    }
    let single_abs = h.abs_min == h.finite_min.zip(h.finite_max).map(|(a, b)| a.abs().max(b.abs()));
    if let (true, false, Ok(a)) = (h.n_finite > 0, single_abs, h.to_abs::<E>(nb)) {
        let bins = UniformBins::new(a.edges[0], a.edges[nb], nb).unwrap();
        let w = h.width().unwrap();
        assert_eq!(
            a.hist,
            rebin(&bins, (0..h.half()).map(|j| ((j as f64 + 0.5) * w, h.abs_count(j)))),
            "{} abs, {nb} bins",
            E::NAME
        );
    }
}

#[test]
fn galloping_rebin_equals_one_lookup_per_bin() {
    let mut rng = Rng(0xC0FF_EE00_1234_5678);
    for case in 0..300 {
        let log_half = [3u32, 8, 13][case % 3];
        let scale = pow2(rng.below(80) as i32 - 40);
        let n = 1 + rng.below(6000) as usize;
        let data: Vec<f32> = (0..n)
            .map(|i| {
                let u = (rng.below(1 << 24) as f64 / (1 << 23) as f64 - 1.0) * scale;
                match case % 5 {
                    0 => u as f32,          // uniform, both signs
                    1 => u.max(0.0) as f32, // ReLU
                    2 => {
                        if i % 997 == 0 {
                            (u * 300.0) as f32
                        } else {
                            u as f32
                        }
                    } // outliers
                    3 => (scale * 0.75) as f32, // constant
                    _ => (u * u / scale + scale) as f32, // skewed, positive
                }
            })
            .collect();
        let mut h = StreamHistogram::new(log_half);
        h.add(&View::from_slice(&data));
        for nb in [1usize, 7, 128, 1000, 2048] {
            check_rebin::<f32>(&h, nb);
            check_rebin::<f64>(&h, nb);
            check_rebin::<half::f16>(&h, nb.min(64));
        }
    }
}

#[test]
fn raise_in_place_equals_merging_bins() {
    let mut rng = Rng(99);
    for log_half in [2u32, 5, 13] {
        let h = 1i64 << log_half;
        let bins: Vec<u64> = (0..2 * h).map(|_| if rng.below(3) == 0 { 0 } else { rng.below(1000) }).collect();
        for shift in [1u32, 2, 3, 7, 30, 62, 100] {
            let mut want = vec![0u64; bins.len()];
            for (i, &c) in bins.iter().enumerate() {
                want[(((i as i64 - h) >> shift.min(62)) + h) as usize] += c;
            }
            let mut got = bins.clone();
            raise_bins(&mut got, shift);
            assert_eq!(got, want, "log_half {log_half} shift {shift}");
        }
    }
}

#[test]
fn result_does_not_depend_on_split_or_order() {
    let data: Vec<f32> =
        (0..20_000).map(|i| ((i * 7919 % 10007) as f32 - 5000.0) * 1e-3 * (1 + i % 7) as f32).collect();
    let whole = hist_of(std::slice::from_ref(&data), 8);
    let mut parts: Vec<Vec<f32>> = data.chunks(777).map(|c| c.to_vec()).collect();
    parts.reverse();
    let split = hist_of(&parts, 8);
    assert_eq!(whole.bins(), split.bins());
    assert_eq!(whole.level, split.level);
    // a small batch first, then the large ones: the level grows by merging
    let mut grow = vec![vec![1e-6f32, -2e-7]];
    grow.extend(parts);
    let mut direct = vec![vec![1e-6f32, -2e-7]];
    direct.push(data);
    assert_eq!(hist_of(&grow, 8).bins(), hist_of(&direct, 8).bins());
}

#[test]
fn observing_batches_does_not_change_the_histogram_and_sees_each_batch_alone() {
    use crate::methods::pow2::batch_votes;
    let big: Vec<f32> = (0..3000).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * 0.37).collect();
    let small: Vec<f32> = (0..3000).map(|i| ((i * 31 % 997) as f32 - 498.0) * 1e-3).collect();
    let votes_of = |batches: &[&Vec<f32>]| {
        let mut votes = Vec::new();
        let mut h = StreamHistogram::new(10);
        for b in batches {
            let mut observe = |hist: &UniformHistogram<'_>, largest: f64| votes.push(batch_votes(*hist, largest));
            h.add_observed(&View::from_slice(b), Some(&mut observe as BatchObserver<'_>));
        }
        (h, votes)
    };
    for order in [[&big, &small], [&small, &big]] {
        let (observed, votes) = votes_of(&order);
        let mut plain = StreamHistogram::new(10);
        for b in order {
            plain.add(&View::from_slice(b));
        }
        assert_eq!(observed, plain);
        // each batch is seen as it would be alone
        let alone: Vec<_> = order.iter().map(|b| votes_of(&[b]).1[0]).collect();
        assert_eq!(votes, alone);
    }
}

#[test]
fn merge_equals_one_pass() {
    let a: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01 - 3.0).collect();
    let b: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 100.0).collect();
    let mut ha = hist_of(std::slice::from_ref(&a), 6);
    ha.merge(&hist_of(std::slice::from_ref(&b), 6)).unwrap();
    assert_eq!(ha, hist_of(&[a, b], 6));
}

#[test]
fn non_finite_values_are_counted_not_binned() {
    let h = hist_of(&[vec![f32::NAN, f32::INFINITY, -1.0, f32::NEG_INFINITY]], 3);
    assert_eq!((h.n_finite, h.n_nan, h.n_posinf, h.n_neginf), (1, 1, 1, 1));
    assert_eq!(h.bins().iter().sum::<u64>(), 1);
}

#[test]
fn ort_shaped_histograms_hold_every_value() {
    let data: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let h = hist_of(&[data], 13);
    let v = h.to_value::<f32>(2048).unwrap();
    assert_eq!(v.hist.iter().sum::<i64>(), 5000);
    let a = h.to_abs::<f32>(2048).unwrap();
    assert_eq!(a.hist.iter().sum::<i64>(), 5000);
}

/// numpy's histogram of `x` (or `|x|`) over `[first, last]`, counted in `E`.
fn numpy_hist<E: Float>(x: &[f32], first: E, last: E, n: usize, abs: bool) -> (Vec<i64>, Vec<E>)
where
    f32: crate::numeric::float::Widen<E>,
{
    let bins = UniformBins::new(first, last, n).unwrap();
    let mut c = vec![0; n];
    bins.count(&View::from_slice(x), abs, &mut c);
    (c, bins.edges)
}

#[test]
fn constant_tensors_get_orts_histograms() {
    // Bin centres sit up to half a streaming bin from the value: where min == max the
    // counts go to the value's own bin, as ORT counts them.
    for c in [0.0f32, -0.0, 1.0, -2.5, 3.7, 1e-30, -7.0, 1e20, f32::MAX, f32::MIN, 3e38] {
        let data = vec![c; 37];
        let h = hist_of(&[data[..20].to_vec(), data[20..].to_vec()], 13);
        for n in [7, 128, 2048] {
            let v = h.to_value::<f32>(n);
            let t = c.abs();
            match UniformBins::new(-t, t, n) {
                Ok(_) => {
                    let v = v.unwrap();
                    assert_eq!((v.hist, v.edges), numpy_hist(&data, -t, t, n, false), "value c={c} n={n}");
                }
                Err(_) => {
                    let v = h.to_value::<f64>(n).unwrap();
                    assert_eq!(
                        (v.hist, v.edges),
                        numpy_hist(&data, -(t as f64), t as f64, n, false),
                        "value f64 c={c} n={n}"
                    );
                }
            }
            match h.to_abs::<f32>(n) {
                Ok(a) => assert_eq!((a.hist, a.edges), numpy_hist(&data, t, t, n, true), "abs c={c} n={n}"),
                Err(_) => {
                    let a = h.to_abs::<f64>(n).unwrap();
                    assert_eq!(
                        (a.hist, a.edges),
                        numpy_hist(&data, t as f64, t as f64, n, true),
                        "abs f64 c={c} n={n}"
                    );
                }
            }
        }
    }
}

#[test]
fn from_parts_takes_back_what_it_was_built_from_and_refuses_inconsistent_parts() {
    let data: Vec<f32> = vec![-3.0, 0.25, 1.5, f32::NAN];
    let h = hist_of(std::slice::from_ref(&data), 4);
    let counts = (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches);
    let back =
        StreamHistogram::from_parts(4, h.level, &h.bins(), h.finite_min, h.finite_max, h.abs_min, counts).unwrap();
    assert_eq!(back, h);
    let short = StreamHistogram::from_parts(4, h.level, &h.bins()[1..], h.finite_min, h.finite_max, h.abs_min, counts);
    assert!(short.unwrap_err().contains("bins, expected"));
    let more = (counts.0 + 1, counts.1, counts.2, counts.3, counts.4);
    assert!(StreamHistogram::from_parts(4, h.level, &h.bins(), h.finite_min, h.finite_max, h.abs_min, more).is_err());
    let low = h.level.map(|l| l - 2);
    assert!(StreamHistogram::from_parts(4, low, &h.bins(), h.finite_min, h.finite_max, h.abs_min, counts).is_err());
    assert!(StreamHistogram::from_parts(4, None, &h.bins(), h.finite_min, h.finite_max, h.abs_min, counts).is_err());
}
