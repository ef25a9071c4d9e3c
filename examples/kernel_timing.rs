//! Per-value cost of the binning kernels on activation-sized tensors (1 and 4 MB; N(0,1) and
//! its ReLU, half zeros), single-threaded: the streaming `add` (16384 bins), the exact mode's
//! `scan` and its `count` (ORT's value histogram in the data's type: 2048 bins, Percentile's
//! default, for f32; 128, Entropy's, for f16, where 2048 bins over N(0,1) do not fit), for f32
//! and f16 data.
//! `cargo run --release --example kernel_timing` (REPS=repeats, default 41); prints the median
//! ns per value of each kernel, the repeats of all kernels interleaved.
use half::f16;
use histocal::numeric::float::{Float, Widen};
use histocal::numeric::scan::scan;
use histocal::numeric::view::View;
use histocal::ort::value_histogram::ValueHistogram;
use histocal::stream::stream_histogram::StreamHistogram;
use std::time::Instant;

#[path = "support/timing.rs"]
mod timing;
use timing::median;

fn normal_data(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed;
    let mut u = || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n).map(|_| ((-2.0 * u().ln()).sqrt() * (2.0 * std::f64::consts::PI * u()).cos()) as f32).collect()
}

fn time(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// The three kernels on one tensor, repeats interleaved; median ns per value of each.
fn kernels<D: Float + Widen<D>>(data: &[D], reps: usize) -> [f64; 3] {
    let v = View::from_slice(data);
    let sc = scan(&v);
    let (mut hist, binning) = ValueHistogram::<D>::first(&sc, if D::NAME == "float16" { 128 } else { 2048 }).unwrap();
    let mut stream = StreamHistogram::new(13);
    let mut add = || {
        stream.add(&v);
        std::hint::black_box(&stream);
    };
    let mut scan_ = || {
        std::hint::black_box(scan(&v));
    };
    let mut count = || {
        binning.count(&v, &mut hist.hist);
        std::hint::black_box(&hist.hist);
    };
    let mut fs: [&mut dyn FnMut(); 3] = [&mut add, &mut scan_, &mut count];
    let mut times = [vec![], vec![], vec![]];
    for r in 0..reps + 2 {
        for (t, f) in times.iter_mut().zip(fs.iter_mut()) {
            let s = time(*f);
            if r >= 2 {
                t.push(s); // the first two rounds warm caches and the scratch
            }
        }
    }
    times.map(|t| median(t) * 1e9 / data.len() as f64)
}

fn main() {
    let reps: usize = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(41);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    println!("{:<24} {:>8} {:>8} {:>8}   (ns per value, median of {reps})", "data", "add", "scan", "count");
    pool.install(|| {
        for mb in [1usize, 4] {
            let normal = normal_data(mb << 18, mb as u64);
            let relu: Vec<f32> = normal.iter().map(|&x| x.max(0.0)).collect();
            for (name, d) in [("normal", &normal), ("relu", &relu)] {
                let r = kernels(d, reps);
                println!("{:<24} {:>8.3} {:>8.3} {:>8.3}", format!("f32 {name} {mb} MB"), r[0], r[1], r[2]);
                let h: Vec<f16> = d.iter().map(|&x| f16::from_f32(x)).collect();
                let r = kernels(&h, reps);
                println!(
                    "{:<24} {:>8.3} {:>8.3} {:>8.3}",
                    format!("f16 {name} {}Ki values", mb << 8),
                    r[0],
                    r[1],
                    r[2]
                );
            }
        }
    });
}
