//! The streaming `add` on one batch of a real model's outputs (a file of `u64 count` then per
//! tensor `u64 len` + f32 data), every tensor in turn as a calibration collects them:
//! single-threaded thread CPU ns per value by size class, for the scan alone and the whole add.
//! `cargo run --release --example real_batch -- FILE` (REPS=rounds, default 7). FILE from one
//! batch's outputs `outs` (`session.run` of a calibrator's augmented model, its fetch names):
//! `np.array([len(outs)], np.uint64).tofile(f)`, then per output
//! `np.array([a.size], np.uint64).tofile(f); np.ascontiguousarray(a, np.float32).tofile(f)`.
use histocal::numeric::scan::scan;
use histocal::numeric::view::View;
use histocal::stream::stream_histogram::StreamHistogram;

#[path = "support/timing.rs"]
mod timing;
use timing::{median, thread_cpu};

fn main() {
    let path = std::env::args().nth(1).expect("a batch file");
    let reps = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(7);
    let bytes = std::fs::read(path).expect("read");
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let (count, mut at) = (u64_at(0), 8);
    let mut tensors: Vec<Vec<f32>> = Vec::new();
    for _ in 0..count {
        let n = u64_at(at);
        at += 8;
        tensors
            .push(bytes[at..at + 4 * n].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect());
        at += 4 * n;
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let classes = [(0usize, 32768usize), (32768, usize::MAX), (0, usize::MAX)];
    pool.install(|| {
        for (lo, hi) in classes {
            let sel: Vec<&Vec<f32>> = tensors.iter().filter(|t| t.len() >= lo && t.len() < hi).collect();
            let values: usize = sel.iter().map(|t| t.len()).sum();
            let mut hs: Vec<StreamHistogram> = sel.iter().map(|_| StreamHistogram::new(13)).collect();
            let (mut ts, mut ta) = (vec![], vec![]);
            for r in 0..reps + 1 {
                let s = thread_cpu();
                for t in &sel {
                    std::hint::black_box(scan(&View::from_slice(t)));
                }
                let m = thread_cpu();
                for (h, t) in hs.iter_mut().zip(&sel) {
                    h.add(&View::from_slice(t));
                }
                let e = thread_cpu();
                if r > 0 {
                    ts.push((m - s) * 1e9 / values as f64);
                    ta.push((e - m) * 1e9 / values as f64);
                }
            }
            println!(
                "sizes [{lo}, {hi}): {} tensors, {values} values: scan {:.3} ns/value, add {:.3} ns/value",
                sel.len(),
                median(ts),
                median(ta)
            );
        }
    });
}
