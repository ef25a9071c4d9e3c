//! Streaming histogram throughput (`StreamHistogram::add`: scan + batch histogram + add) and
//! its parts, on 64Mi-value batches (N(0,1); ReLU of it; f16 and f64 copies), 16384 bins, at 1
//! and 2 threads. `cargo run --release --example stream_bench` (N=values, REPS=repeats).
use half::f16;
use histocal::numeric::scan::scan;
use histocal::numeric::view::View;
use histocal::stream::stream_bins::batch_bins;
use histocal::stream::stream_histogram::StreamHistogram;
use std::time::Instant;

fn normal_data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    let mut u = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n).map(|_| ((-2.0 * u().ln()).sqrt() * (2.0 * std::f64::consts::PI * u()).cos()) as f32).collect()
}

/// Best of `reps` wall times (the machine is shared; the minimum is the least disturbed run).
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn run<D: histocal::numeric::float::Float>(name: &str, data: &[D], reps: usize) {
    let v = View::from_slice(data);
    let gb = std::mem::size_of_val(data) as f64 / 1e9;
    let ns = 1e9 / data.len() as f64;
    let t_add = best(reps, || {
        let mut h = StreamHistogram::new(13);
        h.add(&v);
        std::hint::black_box(&h);
    });
    let t_scan = best(reps, || {
        std::hint::black_box(scan(&v));
    });
    let mut h = StreamHistogram::new(13);
    h.add(&v);
    let level = h.level.unwrap();
    let sc = histocal::numeric::scan::scan(&v);
    let t_bins = best(reps, || {
        std::hint::black_box(batch_bins(&v, &sc, 13, level));
    });
    println!(
        "  {name:<11} add {:6.1} ms {:5.2} GB/s {:5.2} ns/value | scan {:5.1} ms {:5.2} GB/s | batch_bins {:6.1} ms {:5.2} GB/s",
        t_add * 1e3, gb / t_add, t_add * ns, t_scan * 1e3, gb / t_scan, t_bins * 1e3, gb / t_bins
    );
}

fn main() {
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(64usize << 20);
    let reps: usize = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let normal = normal_data(n, 1);
    let relu: Vec<f32> = normal.iter().map(|&x| x.max(0.0)).collect();
    let half: Vec<f16> = normal.iter().map(|&x| f16::from_f32(x)).collect();
    let wide: Vec<f64> = normal.iter().map(|&x| x as f64).collect();
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        println!("{threads} thread(s), {n} values, 16384 bins:");
        pool.install(|| {
            run("normal f32", &normal, reps);
            run("relu f32", &relu, reps);
            run("normal f16", &half, reps);
            run("normal f64", &wide, reps);
        });
    }
}
