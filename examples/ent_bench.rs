//! Entropy KL search timing on real histograms, plus a digest of every candidate's KL bits
//! (so a change can be checked for bit-identical results).
//! HISTS=file of (i64 len, len x i64 counts) records, e.g. dumped from the benchmark's CNN;
//! without it, synthetic 2048- and 2900-bin histograms are used.
use histocal::ort::entropy::kl_values;
use std::time::Instant;

fn synthetic() -> Vec<Vec<i64>> {
    let mut out = Vec::new();
    let mut x: u64 = 12345;
    for (n, relu) in [(2048usize, true), (2048, false), (2900, true), (2900, false)] {
        let mut hist = vec![0i64; n];
        for _ in 0..65536 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u1 = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u2 = ((x >> 11) as f64) / (1u64 << 53) as f64;
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            let z = if relu { z.max(0.0) } else { z };
            let b = ((z / 5.0 + 1.0) * (n / 2) as f64) as usize;
            hist[b.min(n - 1)] += 1;
        }
        out.push(hist);
    }
    out
}

fn main() {
    let hists: Vec<Vec<i64>> = match std::env::var("HISTS") {
        Ok(p) => {
            let b = std::fs::read(p).expect("HISTS file");
            let mut v = Vec::new();
            let mut o = 0;
            let rd = |o: usize| i64::from_le_bytes(b[o..o + 8].try_into().unwrap());
            while o < b.len() {
                let n = rd(o) as usize;
                o += 8;
                v.push((0..n).map(|i| rd(o + 8 * i)).collect());
                o += 8 * n;
            }
            v
        }
        Err(_) => synthetic(),
    };
    let reps: usize = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let threads: usize = std::env::var("THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
        for h in &hists {
            for k in kl_values::<f32>(h, 128, &Default::default()).unwrap() {
                digest = (digest ^ k.to_bits()).wrapping_mul(0x100_0000_01b3);
            }
        }
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t = Instant::now();
            for h in &hists {
                std::hint::black_box(kl_values::<f32>(h, 128, &Default::default()).unwrap());
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let bins: usize = hists.iter().map(|h| h.len()).sum();
        println!(
            "{} histograms (mean {} bins), {threads} thread(s): best of {reps} {:.3} ms per histogram; KL digest {digest:016x}",
            hists.len(),
            bins / hists.len(),
            best * 1e3 / hists.len() as f64
        );
    });
}
