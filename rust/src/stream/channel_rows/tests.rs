//! `add_channels` against the per-channel strided path it replaces (each channel's strided view
//! added with `StreamHistogram::add`): the same histograms, bit for bit, for short and long runs,
//! every float type, NaN and ±Inf, zeros and -0, empty tensors, levels raised by later batches,
//! channels gathered in chunks, and tensors split into parallel channel groups.
use super::{add_channels, channel_view, ChannelLayout};
use crate::numeric::float::Float;
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

/// `n` values at `scale`, some channels all NaN or all zero (by position), now and then ±Inf, -0.
fn values(rng: &mut Rng, n: usize, scale: f64, special: bool) -> Vec<f64> {
    (0..n)
        .map(|_| match if special { rng.below(40) } else { 40 } {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => f64::NEG_INFINITY,
            3 => -0.0,
            4..=9 => 0.0,
            10..=13 => 0.75 * scale,
            14 => 1e-30 * rng.unit(),
            _ => (rng.unit() + rng.unit() + rng.unit() - 1.5) * scale,
        })
        .collect()
}

fn fresh(channels: usize, log_half: u32) -> Vec<StreamHistogram> {
    (0..channels).map(|_| StreamHistogram::new(log_half)).collect()
}

/// Add every batch (shape, axis) both ways; compare after each batch.
fn check<D: Float>(rng: &mut Rng, shapes: &[Vec<usize>], axis: usize, log_half: u32) {
    let channels = shapes[0][axis];
    let (mut rows, mut strided) = (fresh(channels, log_half), fresh(channels, log_half));
    // the direct kernel, whose level rises merge all 2H bins: the reference for the narrow
    // kernel's rises over the extremes' bins only
    let mut direct = fresh(channels, log_half);
    for (b, shape) in shapes.iter().enumerate() {
        let layout = ChannelLayout::new(shape, axis);
        let scale = [1e-3, 1.0, 300.0, 1e6][rng.below(4) as usize];
        let mut data: Vec<D> = values(rng, layout.len(), scale, b % 2 == 0).into_iter().map(D::from_f64).collect();
        if !layout.is_empty() && rng.below(3) == 0 {
            // one channel all NaN, another all zeros
            for o in 0..layout.outer {
                for i in 0..layout.inner {
                    data[(o * channels) * layout.inner + i] = D::from_f64(f64::NAN);
                    data[(o * channels + channels - 1) * layout.inner + i] = D::ZERO;
                }
            }
        }
        let mut refs: Vec<&mut StreamHistogram> = rows.iter_mut().collect();
        add_channels(&data, layout, &mut refs);
        for (c, h) in strided.iter_mut().enumerate() {
            h.add(&channel_view(&data, layout, c));
            direct[c].add_unbuffered(&channel_view(&data, layout, c));
        }
        for c in 0..channels {
            assert!(rows[c] == strided[c], "{} shape {shape:?} axis {axis} batch {b} channel {c}", D::NAME);
            assert!(rows[c] == direct[c], "direct: {} shape {shape:?} axis {axis} batch {b} channel {c}", D::NAME);
        }
    }
}

fn all_types(seed: u64, shapes: &[Vec<usize>], axis: usize, log_half: u32) {
    let mut rng = Rng(seed);
    check::<f32>(&mut rng, shapes, axis, log_half);
    check::<f64>(&mut rng, shapes, axis, log_half);
    check::<f16>(&mut rng, shapes, axis, log_half);
}

#[test]
fn short_runs_match_the_strided_path() {
    // inner 1 (the last axis), 2, 15: value by value
    all_types(1, &[vec![4, 7, 33], vec![2, 7, 33], vec![9, 7, 33]], 2, 7);
    all_types(2, &[vec![3, 5, 2], vec![1, 5, 2], vec![6, 5, 2]], 1, 9);
    all_types(3, &[vec![2, 300, 15], vec![5, 300, 15]], 1, 10);
    all_types(4, &[vec![1500, 4], vec![700, 4]], 1, 6); // several position chunks
}

#[test]
fn long_runs_match_the_strided_path() {
    all_types(5, &[vec![2, 3, 8, 8], vec![1, 3, 8, 8], vec![4, 3, 8, 8]], 1, 8);
    all_types(6, &[vec![3, 4, 2500], vec![1, 4, 2500]], 1, 11); // runs longer than a block
    all_types(7, &[vec![5, 16], vec![5, 16]], 0, 4);
}

#[test]
fn channels_gathered_in_chunks_match() {
    // 4000 values a channel: chunks of 16 channels, the last one partial
    all_types(14, &[vec![40, 50, 100], vec![20, 50, 100]], 1, 8);
    all_types(15, &[vec![40, 50, 100]], 1, 8);
    // 90000 values a channel, more than a chunk holds: one channel a chunk
    all_types(16, &[vec![3, 2, 30000], vec![1, 2, 30000]], 1, 9);
    all_types(17, &[vec![70000, 3], vec![2, 3]], 1, 9);
}

#[test]
fn empty_tensors_and_single_channels_count_a_batch() {
    all_types(8, &[vec![0, 3, 4], vec![2, 3, 4], vec![0, 3, 4]], 1, 5);
    all_types(9, &[vec![2, 3, 0], vec![2, 3, 5]], 1, 5);
    all_types(10, &[vec![1, 1], vec![1, 1]], 0, 5); // a scalar as (1, 1)
    all_types(11, &[vec![1, 37], vec![1, 20]], 0, 5); // a 1-D tensor whole, as one channel
}

#[test]
fn tensors_split_into_channel_groups_match() {
    // over PAR_CHUNK values: channel groups counted in parallel, short and long runs
    let mut rng = Rng(13);
    check::<f32>(&mut rng, &[vec![2, 600, 1000], vec![1, 600, 1000]], 1, 8);
    check::<f32>(&mut rng, &[vec![1100, 1000], vec![1100, 1000]], 1, 8);
}

#[test]
fn level_rises_in_later_batches_match_the_direct_kernel() {
    // one-signed channels (ReLU-like, and their negatives) whose scale grows batch after batch:
    // levels rise in most channels, the counts lying on one side of zero only
    for (seed, sign) in [(21u64, 1.0), (22, -1.0)] {
        let mut rng = Rng(seed);
        let layout = ChannelLayout::new(&[1, 40, 300], 1);
        let (mut rows, mut direct) = (fresh(40, 7), fresh(40, 7));
        for b in 0..6 {
            let data: Vec<f32> = (0..layout.len())
                .map(|i| match i % 7 {
                    0 => 0.0,
                    _ => (sign * rng.unit() * 3f64.powi(b + (i / 300 % 5) as i32)) as f32,
                })
                .collect();
            let mut refs: Vec<&mut StreamHistogram> = rows.iter_mut().collect();
            add_channels(&data, layout, &mut refs);
            for (c, h) in direct.iter_mut().enumerate() {
                h.add_unbuffered(&channel_view(&data, layout, c));
            }
            for c in 0..40 {
                assert!(rows[c] == direct[c], "sign {sign} batch {b} channel {c}");
            }
        }
    }
}
