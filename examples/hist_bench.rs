//! Histogram counting throughput on bench-like data (N(0,1), 0.1% 3x outliers):
//! `UniformBins::count` (value and |x|) and `count_abs_explicit`, at 1 and 2 threads.
//! `cargo run --release --example hist_bench` (N=values, default 64Mi).
use histocal::numeric::view::View;
use histocal::ort::explicit_edges::count_abs_explicit;
use histocal::ort::histogram::UniformBins;
use std::time::Instant;

fn normal_data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    let mut u = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|i| {
            let z = (-2.0 * u().ln()).sqrt() * (2.0 * std::f64::consts::PI * u()).cos();
            (if i % 1000 == 7 { 3.0 * z } else { z }) as f32
        })
        .collect()
}

/// Best of the repeats (the machine is shared; the minimum is the least disturbed run).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[0]
}

/// Seconds this thread has spent on a CPU (Linux schedstat).
fn thread_cpu() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<f64>().ok()))
        .map_or(f64::NAN, |ns| ns * 1e-9)
}

fn main() {
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(64usize << 20);
    let reps: usize = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let data = normal_data(n, 1);
    let gb = (n * 4) as f64 / 1e9;
    let v = View::from_slice(&data);
    let t = data.iter().fold(0f32, |m, x| m.max(x.abs()));
    let amin = data.iter().fold(f32::INFINITY, |m, x| m.min(x.abs()));
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            for bins in [2048usize, 3090] {
                let b = UniformBins::new(-t * 1.5, t * 1.5, bins).unwrap();
                let ba = UniformBins::new(amin, t, bins).unwrap();
                let explicit: Vec<f64> = ba.edges.iter().map(|&e| e as f64).chain((1..=bins / 2).map(|i| ba.edges[bins] as f64 + i as f64 * ((t - amin) / bins as f32) as f64)).collect();
                let time = |f: &dyn Fn(&mut Vec<i64>), nb: usize| {
                    median((0..reps).map(|_| {
                        let mut c = vec![0i64; nb];
                        let (s, cpu) = (Instant::now(), thread_cpu());
                        f(&mut c);
                        // CPU=1: 1-thread figures are on-CPU time of this thread (Linux accounts it in
                        // scheduler ticks, so use large N); otherwise wall time.
                        let e = if threads == 1 && std::env::var("CPU").is_ok() { thread_cpu() - cpu } else { s.elapsed().as_secs_f64() };
                        std::hint::black_box(&c);
                        e
                    }).collect())
                };
                let tv = time(&|c| b.count(&v, false, c), bins);
                let ta = time(&|c| ba.count(&v, true, c), bins);
                let te = time(&|c| count_abs_explicit(&v, &explicit, c), explicit.len() - 1);
                println!(
                    "threads={threads}{} bins={bins}: value {:.1} ms {:.2} GB/s | abs {:.1} ms {:.2} GB/s | abs explicit {:.1} ms {:.2} GB/s",
                    if threads == 1 && std::env::var("CPU").is_ok() { " (cpu time)" } else { "" }, tv * 1e3, gb / tv, ta * 1e3, gb / ta, te * 1e3, gb / te
                );
            }
        });
    }
}
