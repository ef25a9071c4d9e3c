//! ORT's scale and zero point for a range (`compute_scale_zp`), exactly: the quantized types
//! ([`QType`]), the rule of the installed onnxruntime ([`ScaleRule`]: 1.32 changed it for
//! float16), the scale computed in the tensor's float type ([`OrtScale`]) and the quantizer it
//! gives ([`Quantizer`]), with round-half-to-even as numpy's `rint`. The error model of
//! `qerror` quantizes with these, so that a range's error is the error of ORT's own quantizer.

/// `x.round_ties_even()` without a libm call (baseline x86-64 has no rounding instruction):
/// adding and removing 2^52 rounds |x| < 2^52 to an integer in the default rounding mode,
/// ties to even; larger floats are integers already.
#[inline(always)]
pub fn round_half_even(x: f64) -> f64 {
    const TWO_52: f64 = 4503599627370496.0;
    let a = x.abs();
    if a < TWO_52 {
        ((a + TWO_52) - TWO_52).copysign(x)
    } else {
        x
    }
}

/// `x.ceil()` without a libm call.
#[inline(always)]
pub(crate) fn ceil(x: f64) -> f64 {
    let r = round_half_even(x);
    if r < x {
        r + 1.0
    } else {
        r
    }
}

/// `x.floor()` without a libm call.
#[inline(always)]
pub(crate) fn floor(x: f64) -> f64 {
    let r = round_half_even(x);
    if r > x {
        r - 1.0
    } else {
        r
    }
}

/// ORT's integer target types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QType {
    Int8,
    UInt8,
    Int16,
    UInt16,
}

impl QType {
    pub const NAMES: &'static str = "'int8', 'uint8', 'int16', 'uint16'";

    pub fn parse(name: &str) -> Option<QType> {
        match name {
            "int8" => Some(QType::Int8),
            "uint8" => Some(QType::UInt8),
            "int16" => Some(QType::Int16),
            "uint16" => Some(QType::UInt16),
            _ => None,
        }
    }

    /// ORT's `get_qmin_qmax_for_qType(qtype, reduce_range=False, symmetric)`: symmetric
    /// ranges exist for the signed types only.
    pub fn qmin_qmax(self, symmetric: bool) -> (i32, i32) {
        match (self, symmetric) {
            (QType::Int8, false) => (-128, 127),
            (QType::Int8, true) => (-127, 127),
            (QType::UInt8, _) => (0, 255),
            (QType::Int16, false) => (-32768, 32767),
            (QType::Int16, true) => (-32767, 32767),
            (QType::UInt16, _) => (0, 65535),
        }
    }
}

/// Which onnxruntime's `compute_scale_zp` to follow. 1.31 (and before) and 1.32 differ for
/// float16 ranges only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrtRule {
    V1_31,
    V1_32,
}

impl OrtRule {
    pub const NAMES: &'static str = "'1.31', '1.32'";

    pub fn parse(name: &str) -> Option<OrtRule> {
        match name {
            "1.31" => Some(OrtRule::V1_31),
            "1.32" => Some(OrtRule::V1_32),
            _ => None,
        }
    }
}

/// ORT's scale rule for one range type. ORT quantizes with the range as TensorData holds it,
/// in the tensor's type (float16 or float32): it computes the scale in float64 from that range
/// and stores it in the same type. A scale below a threshold (degenerate: the range is all but
/// empty) becomes 1, with zero point 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleRule {
    /// float32 ranges, every version: degenerate when the float64 scale is below float32's
    /// smallest normal (`finfo(float32).tiny`).
    Float32,
    /// float16 ranges, ORT 1.31: degenerate when the float64 scale is below float16's
    /// smallest normal, 2^-14.
    Float16Normal,
    /// float16 ranges, ORT 1.32: degenerate when the scale rounded to float16 is below
    /// float16's smallest subnormal, 2^-24 (i.e. rounds to 0): subnormal scales are kept.
    Float16Subnormal,
}

impl ScaleRule {
    /// The rule of `ort` for ranges of float16 (`half`) or float32 type.
    pub fn new(ort: OrtRule, half: bool) -> ScaleRule {
        match (half, ort) {
            (false, _) => ScaleRule::Float32,
            (true, OrtRule::V1_31) => ScaleRule::Float16Normal,
            (true, OrtRule::V1_32) => ScaleRule::Float16Subnormal,
        }
    }

    /// `x` rounded to the range type (to nearest, ties to even; infinite beyond its largest
    /// finite value), as numpy's `astype` does.
    #[inline]
    pub fn round(self, x: f64) -> f64 {
        match self {
            ScaleRule::Float32 => x as f32 as f64,
            ScaleRule::Float16Normal | ScaleRule::Float16Subnormal => round_to_f16(x),
        }
    }

    /// Whether ORT replaces the float64 `scale` (`stored`: rounded to the range type) by 1.
    #[inline]
    fn is_degenerate(self, scale: f64, stored: f64) -> bool {
        match self {
            ScaleRule::Float32 => !(scale >= f32::MIN_POSITIVE as f64),
            ScaleRule::Float16Normal => !(scale >= F16_MIN_POSITIVE),
            ScaleRule::Float16Subnormal => !(stored >= F16_MIN_SUBNORMAL),
        }
    }

    /// An upper bound on how far rounding moves a scale that rounds to `stored` (half the
    /// type's spacing there), non-decreasing in `stored`.
    #[inline]
    pub fn rounding_bound(self, stored: f64) -> f64 {
        match self {
            ScaleRule::Float32 => (stored * TWO_M24).max(f64::from(f32::from_bits(1)) / 2.0),
            ScaleRule::Float16Normal | ScaleRule::Float16Subnormal => (stored * TWO_M11).max(F16_MIN_SUBNORMAL / 2.0),
        }
    }
}

const TWO_M11: f64 = 1.0 / 2048.0;
const TWO_M24: f64 = 1.0 / 16777216.0;
/// float16's smallest normal and smallest subnormal numbers.
const F16_MIN_POSITIVE: f64 = 1.0 / 16384.0;
const F16_MIN_SUBNORMAL: f64 = 1.0 / 16777216.0;

/// `x` rounded to the nearest float16 (ties to even) as a float64: the float16 spacing at |x|
/// is 2^(e - 10) for 2^e <= |x| (e >= -14), 2^-24 below, and |x| / spacing < 2048 is
/// rounded to an integer exactly. At and past 65520 (halfway to 2^16): infinite.
#[inline]
pub fn round_to_f16(x: f64) -> f64 {
    let a = x.abs();
    if !(a < 65520.0) {
        return if a.is_nan() { x } else { f64::INFINITY.copysign(x) };
    }
    let e = (((a.to_bits() >> 52) as i32) - 1023).max(-14);
    let spacing = f64::from_bits(((e - 10 + 1023) as u64) << 52);
    (round_half_even(a / spacing) * spacing).copysign(x)
}

/// ORT's quantization parameters of a range, and the range they were computed from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OrtScale {
    pub quantizer: Quantizer,
    /// The range ORT's rule works on: the requested one in the range type, widened to hold 0,
    /// symmetrized when symmetric.
    pub rmin: f64,
    pub rmax: f64,
    /// The scale was degenerate (the quantizer has scale 1, zero point 0).
    pub degenerate: bool,
}

impl OrtScale {
    /// ORT's `compute_scale_zp(T(low), T(high), qmin, qmax, symmetric)` for `qtype`, `T` the
    /// range type of `rule`, with the range first widened to hold 0 as ORT does.
    ///
    /// As in ORT's code, the zero point comes from the float64 scale before it is rounded to
    /// the range type, and (except for [`ScaleRule::Float16Subnormal`]) so does the
    /// degenerate-scale test. A range beyond the range type (infinite in it) gives an infinite
    /// scale, which [`ErrorTable`] reports as an infinite error: no scale of that type can
    /// quantize it.
    pub fn of(low: f64, high: f64, qtype: QType, symmetric: bool, rule: ScaleRule) -> OrtScale {
        let (qmin, qmax) = qtype.qmin_qmax(symmetric);
        let (qmin, qmax) = (qmin as f64, qmax as f64);
        let (mut rmin, mut rmax) = (rule.round(low).min(0.0), rule.round(high).max(0.0));
        if symmetric {
            let a = rmin.abs().max(rmax.abs());
            (rmin, rmax) = (-a, a);
        }
        let params = |scale: f64, zero_point: f64, degenerate: bool| OrtScale {
            quantizer: Quantizer { scale, zero_point, qmin, qmax },
            rmin,
            rmax,
            degenerate,
        };
        let scale = (rmax - rmin) / (qmax - qmin);
        if !scale.is_finite() {
            return params(f64::INFINITY, 0.0, false);
        }
        let stored = rule.round(scale);
        if rule.is_degenerate(scale, stored) {
            return params(1.0, 0.0, true);
        }
        let zero_point = round_half_even(if symmetric { (qmin + qmax) / 2.0 } else { qmin - rmin / scale });
        params(stored, zero_point.clamp(qmin, qmax), false)
    }
}

/// Affine quantization to integers in `[qmin, qmax]` and back:
/// `dequantize(x) = (clamp(round_half_even(x / scale) + zero_point, qmin, qmax) - zero_point) * scale`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Quantizer {
    pub scale: f64,
    pub zero_point: f64,
    pub qmin: f64,
    pub qmax: f64,
}

impl Quantizer {
    /// ORT's quantizer for the range `(low, high)` ([`OrtScale::of`]).
    pub fn for_range(low: f64, high: f64, qtype: QType, symmetric: bool, rule: ScaleRule) -> Quantizer {
        OrtScale::of(low, high, qtype, symmetric, rule).quantizer
    }

    #[inline]
    pub fn dequantize(&self, x: f64) -> f64 {
        let q = (round_half_even(x / self.scale) + self.zero_point).clamp(self.qmin, self.qmax);
        (q - self.zero_point) * self.scale
    }
}
