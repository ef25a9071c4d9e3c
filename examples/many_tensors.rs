//! The streaming `add` on many mid-sized tensors, one batch of each in turn (as a calibration
//! collects them: hundreds of histograms, whose counts leave the caches between their batches):
//! per-value ns of the narrow kernel (`add`) and of the direct one (`add_unbuffered`, the kernel
//! before it), single-threaded thread CPU time, rounds of the two interleaved; medians.
//! `cargo run --release --example many_tensors` (REPS=rounds, default 9; TENSORS, default 673)
use histocal::numeric::view::View;
use histocal::stream::stream_histogram::StreamHistogram;

#[path = "support/timing.rs"]
mod timing;
use timing::{median, thread_cpu};

fn normal_data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    let mut u = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n).map(|_| ((-2.0 * u().ln()).sqrt() * (2.0 * std::f64::consts::PI * u()).cos()) as f32).collect()
}

fn main() {
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (reps, tensors) = (env("REPS", 9), env("TENSORS", 673));
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    println!(
        "{:>8} {:>7} {:>10} {:>10} {:>7}   (thread CPU ns per value, median of {reps} rounds)",
        "values", "tensors", "direct", "narrow", "ratio"
    );
    pool.install(|| {
        for n in [1024usize, 4096, 16384, 65536, 262144] {
            // distinct data per tensor (at most 256 MiB in all), read from memory as a calibration's is
            let t = tensors.min((64 << 20) / n).max(1);
            // SHARED=1: one array for every tensor (data in cache: only the histograms' memory is cold)
            let distinct = if env("SHARED", 0) == 1 { 1 } else { t };
            let data: Vec<Vec<f32>> = (0..distinct).map(|i| normal_data(n, i as u64 + 1)).collect();
            let mut sets: [Vec<StreamHistogram>; 2] =
                std::array::from_fn(|_| (0..t).map(|_| StreamHistogram::new(13)).collect());
            let mut times = [vec![], vec![]];
            for r in 0..reps + 2 {
                for (k, set) in sets.iter_mut().enumerate() {
                    let start = thread_cpu();
                    for (h, d) in set.iter_mut().zip(data.iter().cycle()) {
                        let v = View::from_slice(d);
                        if k == 0 {
                            h.add_unbuffered(&v)
                        } else {
                            h.add(&v)
                        }
                    }
                    if r >= 2 {
                        times[k].push((thread_cpu() - start) * 1e9 / (t * n) as f64);
                    }
                }
            }
            assert!(sets[0] == sets[1]);
            let [d, w] = times.map(median);
            println!("{n:>8} {t:>7} {d:>10.3} {w:>10.3} {:>7.2}", d / w);
        }
    });
}
