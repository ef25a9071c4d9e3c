//! The narrow kernel against the direct one (`add_unbuffered`): the same histograms, bit for bit,
//! on random data of every type, with NaN and ±Inf, zeros, empty batches, levels raised mid-batch,
//! bytes that wrap many times, strided views, and the scanned path (`add_scanned`).
use crate::numeric::float::Float;
use crate::numeric::scan::scan;
use crate::numeric::view::View;
use crate::stream::levels::{raise_bins, raise_bins_window};
use crate::stream::stream_histogram::StreamHistogram;
use half::f16;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 11
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() as f64 + 0.5) / (1u64 << 53) as f64
    }
}

/// A batch of `n` values: mostly N(0, scale)-like, with zeros, repeated values (bytes that wrap),
/// tiny values, and now and then NaN, ±Inf, -0.0.
fn batch(rng: &mut Rng, n: usize, scale: f64) -> Vec<f64> {
    (0..n)
        .map(|_| match rng.below(40) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => -0.0,
            4..=11 => 0.0,
            12..=15 => 0.75 * scale, // one bin, wrapping its byte
            16 => 1e-30 * rng.unit(),
            _ => (rng.unit() + rng.unit() + rng.unit() - 1.5) * scale,
        })
        .collect()
}

fn check<D: Float>(batches: &[Vec<f64>], log_half: u32, what: &str) {
    let data: Vec<Vec<D>> = batches.iter().map(|b| b.iter().map(|&x| D::from_f64(x)).collect()).collect();
    for tier in [0u8, 1, 2] {
        crate::numeric::simd::set_max_tier(tier);
        let (mut narrow, mut direct, mut scanned, mut strided) = (
            StreamHistogram::new(log_half),
            StreamHistogram::new(log_half),
            StreamHistogram::new(log_half),
            StreamHistogram::new(log_half),
        );
        for (i, b) in data.iter().enumerate() {
            let v = View::from_slice(b);
            narrow.add(&v);
            direct.add_unbuffered(&v);
            scanned.add_scanned(&v, &scan(&v));
            let doubled: Vec<D> = b.iter().flat_map(|&x| [x, D::ZERO]).collect();
            // SAFETY: b.len() elements, every other one of `doubled`.
            strided.add(&unsafe { View::from_raw(doubled.as_ptr(), &[b.len()], &[2]) });
            let ctx = format!("{} {what} tier {tier} log_half {log_half} batch {i}", D::NAME);
            assert!(narrow.bins() == direct.bins(), "{ctx}");
            assert!(narrow == direct, "{ctx}");
            assert!(scanned == direct, "scanned {ctx}");
            assert!(strided == direct, "strided {ctx}");
        }
        // settling changes the place of the counts, not the histogram
        let before = narrow.clone();
        narrow.settle();
        assert!(narrow == before && narrow.bins() == direct.bins());
    }
    crate::numeric::simd::set_max_tier(2);
}

fn check_all(batches: &[Vec<f64>], log_half: u32, what: &str) {
    check::<f32>(batches, log_half, what);
    check::<f16>(batches, log_half, what);
    check::<f64>(batches, log_half, what);
}

#[test]
fn narrow_counts_equal_the_direct_kernel() {
    let mut rng = Rng(11);
    for log_half in [2u32, 5, 13] {
        // growing batches: the level rises between and inside batches (blocks of 2048)
        let growing: Vec<Vec<f64>> =
            (0..6).map(|i| batch(&mut rng, [0, 1, 3000, 5000, 17, 9000][i], 0.01 * 8f64.powi(i as i32))).collect();
        check_all(&growing, log_half, "growing");
        // many batches of one scale: bytes wrap many times over (256 counts each)
        let steady: Vec<Vec<f64>> = (0..40).map(|_| batch(&mut rng, 4096, 3.0)).collect();
        check_all(&steady, log_half, "steady");
    }
}

#[test]
fn empty_non_finite_and_zero_batches() {
    let cases: Vec<(&str, Vec<Vec<f64>>)> = vec![
        ("empty", vec![vec![], vec![]]),
        ("non-finite only", vec![vec![f64::NAN, f64::INFINITY], vec![f64::NEG_INFINITY; 600]]),
        // runs of zeros (and -0.0) past what the eight zero-slot bytes hold, then a level raise
        ("zeros", vec![vec![0.0; 70_000], vec![-0.0; 3000], vec![0.0, 1e6, 0.0], vec![0.0; 5000]]),
        ("one value", vec![vec![2.5; 70_001], vec![-2.5; 300]]),
        ("tiny then huge", vec![vec![1e-40, -1e-42, 0.0], vec![1e30, -3e38, 1e-30]]),
    ];
    for (what, batches) in &cases {
        check_all(batches, 13, what);
        check_all(batches, 3, what);
    }
}

#[test]
fn merged_and_copied_histograms_read_the_narrow_counts() {
    let mut rng = Rng(5);
    let a: Vec<Vec<f32>> =
        (0..5).map(|i| batch(&mut rng, 3000, 1.0 + i as f64).iter().map(|&x| x as f32).collect()).collect();
    let (mut narrow, mut direct) = (StreamHistogram::new(8), StreamHistogram::new(8));
    let (mut other, mut other_direct) = (StreamHistogram::new(8), StreamHistogram::new(8));
    for (i, b) in a.iter().enumerate() {
        let v = View::from_slice(b);
        if i % 2 == 0 {
            narrow.add(&v);
            direct.add_unbuffered(&v);
        } else {
            other.add(&v);
            other_direct.add_unbuffered(&v);
        }
    }
    assert!(narrow.copied() == direct);
    narrow.merge(&other).unwrap();
    direct.merge(&other_direct).unwrap();
    assert!(narrow == direct);
    assert_eq!(narrow.to_value::<f32>(2048).unwrap().hist, direct.to_value::<f32>(2048).unwrap().hist);
    assert_eq!(narrow.to_abs::<f32>(2048).unwrap().hist, direct.to_abs::<f32>(2048).unwrap().hist);
}

#[test]
fn raising_a_window_equals_raising_every_bin() {
    let mut rng = Rng(31);
    for log_half in [2u32, 4, 9] {
        let h = 1usize << log_half;
        for _ in 0..200 {
            let lo = rng.below(h as u64 + 1) as usize;
            let hi = h + rng.below(h as u64) as usize;
            let mut bins = vec![0u64; 2 * h];
            for b in &mut bins[lo..=hi] {
                *b = rng.below(3) * rng.below(1000);
            }
            for shift in [1u32, 2, 5, 40, 62, 100] {
                let (mut whole, mut window) = (bins.clone(), bins.clone());
                raise_bins(&mut whole, shift);
                raise_bins_window(&mut window, shift, lo, hi);
                assert_eq!(whole, window, "log_half {log_half} window {lo}..={hi} shift {shift}");
            }
        }
    }
}

#[test]
fn restored_counts_outside_the_extremes_still_merge_on_a_rise() {
    // a state whose bins hold counts beyond its extremes' bins (not what collection writes, but a
    // file may say so): a level rise must still merge every bin
    let log_half = 6;
    let mut bins = vec![0u64; 128];
    bins[64] = 5; // bin 0, as the extremes say
    bins[1] = 3; // far below the extremes' bins
    bins[127] = 2; // far above
    let restored =
        StreamHistogram::from_parts(log_half, Some(0), &bins, Some(0.0), Some(0.01), Some(0.0), (10, 0, 0, 0, 1))
            .expect("a consistent state");
    // a rise by one level whose batch lies near zero: the window misses bins 1 and 127
    let batch: Vec<f32> = vec![0.5, 1.5, -0.25, 0.0, 0.25];
    let v = View::from_slice(&batch);
    let (mut narrow, mut direct) = (restored.clone(), restored.clone());
    narrow.add(&v);
    direct.add_unbuffered(&v);
    assert!(narrow == direct);
    let mut each = restored.clone();
    StreamHistogram::add_each(&mut [&mut each], |_| &batch[..], |_, _| {});
    assert!(each == direct);
    // merged into a histogram whose counts lie inside its extremes, the same
    let mut fresh = StreamHistogram::new(log_half);
    fresh.add(&View::from_slice(&[0.001f32]));
    fresh.merge(&restored).unwrap();
    let mut fresh_direct = fresh.clone();
    fresh.add(&v);
    fresh_direct.add_unbuffered(&v);
    assert!(fresh == fresh_direct);
}
