use histocal::numeric::scan::scan;
use histocal::numeric::view::View;
use histocal::ort::histogram::UniformBins;
use std::time::Instant;
fn main() {
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(64usize << 20);
    let mut x: u64 = 1;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = ((x >> 40) as f32) / (1u64 << 24) as f32;
            (u - 0.3).max(0.0) * 4.0
        })
        .collect();
    let v = View::from_slice(&data);
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let t = Instant::now();
            let s = scan(&v);
            let ts = t.elapsed().as_secs_f64();
            let b = UniformBins::new(-3.0f32, 3.0, 2048).unwrap();
            let mut c = vec![0i64; 2048];
            let t = Instant::now();
            b.count(&v, false, &mut c);
            let tc = t.elapsed().as_secs_f64();
            println!(
                "{threads} threads: scan {:.1} ms ({:.1} GB/s), count {:.1} ms ({:.1} GB/s), n_finite {}",
                ts * 1e3,
                0.268 / ts,
                tc * 1e3,
                0.268 / tc,
                s.n_finite
            );
        });
    }
}
