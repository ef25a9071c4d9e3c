//! The Rust kernels timed on their own (no Python, no onnxruntime), one JSON record per line for
//! `python -m benches kernels` (benches/kernels.py), which runs `cargo bench --bench kernels`:
//! - the streaming histogram's `add` (16384 bins) on many tensors of one size, one batch of each
//!   in turn, as a calibration collects them (the histograms' counts leave the caches between);
//! - onnxruntime's histogram counting (`UniformBins::count`, values and |x|, 2048 bins);
//! - the entropy search's KL values (2048 bins into 128) per histogram.
//!
//! Single-threaded figures are this thread's CPU time (time descheduled on a shared machine is
//! not counted); `--quick` (or QUICK=1) uses fewer values. Medians of the repeats.
use histocal::numeric::view::View;
use histocal::ort::entropy::kl_values;
use histocal::ort::histogram::UniformBins;
use histocal::stream::stream_histogram::StreamHistogram;
use std::time::Instant;

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, t: *mut Timespec) -> i32;
}

/// This thread's CPU seconds.
fn thread_cpu() -> f64 {
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid pointer; 3 is CLOCK_THREAD_CPUTIME_ID on Linux.
    unsafe { clock_gettime(3, &mut t) };
    t.sec as f64 + t.nsec as f64 * 1e-9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// N(0, 1) values from a 64-bit LCG (Box-Muller): the same data on every run.
fn normal_data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    let mut u = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n).map(|_| ((-2.0 * u().ln()).sqrt() * (2.0 * std::f64::consts::PI * u()).cos()) as f32).collect()
}

fn record(kernel: &str, case: &str, value: f64, unit: &str, threads: usize) {
    println!(
        r#"{{"kernel": "{kernel}", "case": "{case}", "value": {value:.4}, "unit": "{unit}", "threads": {threads}}}"#
    );
}

fn stream_add(reps: usize, total: usize) {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    pool.install(|| {
        for n in [1024usize, 16384, 262144] {
            let tensors = (total / n).clamp(1, 673);
            let data: Vec<Vec<f32>> = (0..tensors).map(|i| normal_data(n, i as u64 + 1)).collect();
            let mut hists: Vec<StreamHistogram> = (0..tensors).map(|_| StreamHistogram::new(13)).collect();
            let mut times = vec![];
            for r in 0..reps + 1 {
                let start = thread_cpu();
                for (h, d) in hists.iter_mut().zip(&data) {
                    h.add(&View::from_slice(d));
                }
                if r > 0 {
                    times.push((thread_cpu() - start) * 1e9 / (tensors * n) as f64);
                }
            }
            record("stream add", &format!("{tensors} tensors x {n} values, 16384 bins"), median(times), "ns/value", 1);
        }
    });
}

fn ort_count(reps: usize, n: usize) {
    let data = normal_data(n, 1);
    let view = View::from_slice(&data);
    let top = data.iter().fold(0f32, |m, x| m.max(x.abs()));
    for threads in [1usize, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            for abs in [false, true] {
                let bins = UniformBins::new(if abs { 0.0 } else { -top }, top, 2048).unwrap();
                let times = (0..reps)
                    .map(|_| {
                        let mut counts = vec![0i64; 2048];
                        let start = Instant::now();
                        bins.count(&view, abs, &mut counts);
                        std::hint::black_box(&counts);
                        start.elapsed().as_secs_f64()
                    })
                    .collect();
                let what = if abs { "absolute values" } else { "values" };
                let gb = (n * 4) as f64 / 1e9;
                record(
                    "ort histogram count",
                    &format!("{n} float32 {what}, 2048 bins"),
                    gb / median(times),
                    "GB/s",
                    threads,
                );
            }
        });
    }
}

fn entropy_search(reps: usize) {
    let data = normal_data(1 << 20, 7);
    let bins = UniformBins::new(-5.0f32, 5.0, 2048).unwrap();
    let mut hist = vec![0i64; 2048];
    bins.count(&View::from_slice(&data), false, &mut hist);
    let stop = Default::default();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    pool.install(|| {
        let times = (0..reps)
            .map(|_| {
                let start = thread_cpu();
                std::hint::black_box(kl_values::<f32>(&hist, 128, &stop).unwrap());
                (thread_cpu() - start) * 1e3
            })
            .collect();
        record("entropy search", "one 2048-bin histogram into 128", median(times), "ms", 1);
    });
}

fn main() {
    // cargo bench passes `--bench`; anything else after `--` is ours.
    let quick = std::env::args().any(|a| a == "--quick") || std::env::var("QUICK").is_ok();
    let (reps, values) = if quick { (3, 1usize << 22) } else { (9, 1usize << 26) };
    stream_add(reps, values);
    ort_count(reps, values);
    entropy_search(reps);
}
