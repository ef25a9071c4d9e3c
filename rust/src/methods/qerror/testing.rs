/// splitmix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// A histogram the way the streaming histogram holds data: `2 * half` bins over
/// `[-2^level, 2^level)`, bin of v = floor(v / width), with the exact extremes.
pub struct Binned {
    pub counts: Vec<u64>,
    pub left: f64,
    pub width: f64,
    pub min: f64,
    pub max: f64,
}

impl Binned {
    pub fn of(values: &[f64], half: usize) -> Binned {
        let mut counts = vec![0u64; 2 * half];
        if values.is_empty() {
            return Binned { counts, left: -1.0, width: 1.0 / half as f64, min: 0.0, max: 0.0 };
        }
        let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let m = min.abs().max(max.abs());
        let mut top = 2f64.powi(-140);
        while top <= m {
            top *= 2.0;
        }
        let width = top / half as f64;
        for &v in values {
            let s = ((v / width).floor() as i64).clamp(-(half as i64), half as i64 - 1);
            counts[(s + half as i64) as usize] += 1;
        }
        Binned { counts, left: -top, width, min, max }
    }

    pub fn hist(&self) -> super::UniformHistogram<'_> {
        super::UniformHistogram::new(&self.counts, self.left, self.width, self.min, self.max).unwrap()
    }
}

/// The definition of the error: every bin's value dequantized on its own, O(bins).
pub fn direct_error(h: &super::UniformHistogram<'_>, q: &super::Quantizer) -> f64 {
    let (mut sum, mut n) = (0.0, 0.0);
    for (i, &c) in h.counts.iter().enumerate() {
        if c != 0 {
            let x = h.value(i);
            let e = x - q.dequantize(x);
            sum += c as f64 * e * e;
            n += c as f64;
        }
    }
    if n == 0.0 {
        0.0
    } else {
        sum / n
    }
}

/// Data sets covering the edge cases every method must handle.
pub fn edge_case_data(rng: &mut Rng) -> Vec<(&'static str, Vec<f64>)> {
    let normal: Vec<f64> = (0..20_000).map(|_| rng.normal()).collect();
    let mut outlier = normal.clone();
    outlier.push(250.0);
    vec![
        ("empty", vec![]),
        ("one value", vec![0.37]),
        ("one negative value", vec![-3.0]),
        ("constant", vec![1.5; 100]),
        ("zeros", vec![0.0; 10]),
        ("normal", normal.clone()),
        ("all negative", normal.iter().map(|x| -x.abs() - 0.1).collect()),
        ("relu", normal.iter().map(|x| x.max(0.0)).collect()),
        ("huge", normal.iter().map(|x| x * 1e30).collect()),
        ("tiny", normal.iter().map(|x| x * 1e-30).collect()),
        ("one outlier", outlier),
        ("skewed", normal.iter().map(|x| (x * 0.7).exp() - 0.5).collect()),
    ]
}
