use histocal::ort::entropy::kl_values;
use std::time::Instant;
fn main() {
    // ReLU-normal-ish histogram over (-t, t), 2048 bins: left half empty.
    let n = 2048;
    let mut hist = vec![0i64; n];
    let mut x: u64 = 12345;
    for _ in 0..100000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let u = ((x >> 11) as f64) / (1u64 << 53) as f64;
        let v = (-2.0 * (u.max(1e-12)).ln()).sqrt() * 0.5; // rayleigh-ish, >=0
        let b = (n / 2 + (v / 4.0 * (n / 2) as f64) as usize).min(n - 1);
        hist[b] += 1;
    }
    hist[n / 2] += 50000;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    pool.install(|| {
        let t = Instant::now();
        for _ in 0..20 {
            std::hint::black_box(kl_values::<f32>(&hist, 128, &Default::default()).unwrap());
        }
        println!("kl_values 2048/128: {:.3} ms", t.elapsed().as_secs_f64() * 1000.0 / 20.0);
    });
    let mut r = vec![0f32; 1 << 20];
    let inp: Vec<f32> = (0..(1 << 20)).map(|i| 0.5 + i as f32 * 1e-6).collect();
    let t = Instant::now();
    for _ in 0..20 {
        histocal::numeric::numpy_log::log_f32_slice(&inp, &mut r);
    }
    println!("log 1M: {:.3} ms", t.elapsed().as_secs_f64() * 1000.0 / 20.0);
    let t = Instant::now();
    for _ in 0..20 {
        std::hint::black_box(histocal::numeric::pairwise::sum_f32(&inp));
    }
    println!("sum 1M: {:.3} ms", t.elapsed().as_secs_f64() * 1000.0 / 20.0);
}
