//! A histogram range method chosen by name: mse, TensorRT's KL, or power-of-two scales (with
//! pow2's `NonOverflow`, MinMSE over all data, or MinMSE's most common per-batch choice), its
//! options validated once, and the range it finds on one uniform histogram.
//!
//! Also the names the bindings accept for quantized types, ORT's scale rule and data types.
//! Errors are messages for the caller to name the tensor or argument in.

use crate::methods::kl_tensorrt;
use crate::methods::mse::mse_range;
use crate::methods::pow2::{self, Pow2Type};
use crate::methods::qerror::{ErrorTable, OrtRule, QType, ScaleRule, UniformHistogram};
use crate::numeric::float::Float;
use half::f16;
use std::sync::atomic::AtomicBool;

/// The largest finite value of a data dtype (a histogram's `"float16"`, `"float32"` or `"float64"`).
pub fn largest_finite(dtype: &str) -> f64 {
    match dtype {
        "float16" => <f16 as Float>::MAX,
        "float32" => <f32 as Float>::MAX,
        _ => <f64 as Float>::MAX,
    }
}

pub fn parse_qtype(qtype: &str) -> Result<QType, String> {
    QType::parse(qtype).ok_or_else(|| format!("unknown qtype {qtype:?}: expected one of {}", QType::NAMES))
}

pub fn parse_ort_rule(scale_rule: &str) -> Result<OrtRule, String> {
    OrtRule::parse(scale_rule)
        .ok_or_else(|| format!("unknown scale_rule {scale_rule:?}: expected one of {}", OrtRule::NAMES))
}

/// ORT's scale rule for the ranges of a `dtype` tensor. ORT's TensorData holds float16 and
/// float32 ranges only; float64 tensors' ranges are taken as float32 ones.
pub fn range_rule(ort: OrtRule, dtype: &str) -> ScaleRule {
    ScaleRule::new(ort, dtype == "float16")
}

/// `scale_rule` and a range `dtype` given by name.
pub fn parse_scale_rule(scale_rule: &str, dtype: &str) -> Result<ScaleRule, String> {
    let ort = parse_ort_rule(scale_rule)?;
    match dtype {
        "float16" | "float32" => Ok(range_rule(ort, dtype)),
        _ => Err(format!("unknown range dtype {dtype:?}: expected 'float16' or 'float32'")),
    }
}

pub fn parse_pow2_type(qtype: &str) -> Result<Pow2Type, String> {
    Pow2Type::parse(qtype)
        .ok_or_else(|| format!("qtype {qtype:?} is not supported by pow2: expected one of {}", Pow2Type::NAMES))
}

/// How pow2 picks its exponent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pow2Choice {
    /// The smallest scale whose range holds the data (`pow2_method="NonOverflow"`).
    NonOverflow,
    /// The least quantization error over all data (`"MinMSE"`, `minmse_mode="All"`).
    MinMseAll,
    /// The exponent most batches chose by MinMSE (`"MinMSE"`, `minmse_mode="MostCommon"`).
    MostCommon,
}

impl Pow2Choice {
    /// The choice named by pow2's `pow2_method` and `minmse_mode`.
    pub fn parse(pow2_method: &str, minmse_mode: &str) -> Result<Self, String> {
        match (pow2_method, minmse_mode) {
            (_, m) if m != "All" && m != "MostCommon" => {
                Err(format!("unknown minmse_mode {m:?}: expected 'All' or 'MostCommon'"))
            }
            ("NonOverflow", _) => Ok(Pow2Choice::NonOverflow),
            ("MinMSE", "All") => Ok(Pow2Choice::MinMseAll),
            ("MinMSE", _) => Ok(Pow2Choice::MostCommon),
            (p, _) => Err(format!("unknown pow2_method {p:?}: expected 'NonOverflow' or 'MinMSE'")),
        }
    }
}

/// The options of the range methods, named as histocal's method table names them. Each method
/// reads its own; the defaults are the table's.
#[derive(Clone, Debug, PartialEq)]
pub struct MethodOptions {
    pub qtype: String,
    pub symmetric: bool,
    pub num_bins: i64,
    pub num_quantized_bins: i64,
    pub pow2_method: String,
    pub minmse_mode: String,
}

impl Default for MethodOptions {
    fn default() -> Self {
        MethodOptions {
            qtype: "int8".into(),
            symmetric: false,
            num_bins: 2048,
            num_quantized_bins: 128,
            pow2_method: "MinMSE".into(),
            minmse_mode: "All".into(),
        }
    }
}

/// A histogram range method with validated options.
#[derive(Clone, Copy, Debug)]
pub enum RangeMethod {
    Mse { qtype: QType, symmetric: bool },
    Kl { num_bins: usize, num_quantized_bins: usize },
    Pow2 { qtype: Pow2Type, choice: Pow2Choice },
}

impl RangeMethod {
    /// The method named `method` ("mse", "kl" or "pow2") with its options. The names (qtype,
    /// pow2_method, minmse_mode) are checked whatever the method, since a typo is an error
    /// either way; the bin counts only for kl, which uses them.
    pub fn parse(method: &str, options: &MethodOptions) -> Result<Self, String> {
        let choice = Pow2Choice::parse(&options.pow2_method, &options.minmse_mode)?;
        let q = parse_qtype(&options.qtype)?;
        match method {
            "mse" => Ok(RangeMethod::Mse { qtype: q, symmetric: options.symmetric }),
            "kl" => {
                let count =
                    |name: &str, v: i64| usize::try_from(v).map_err(|_| format!("{name} must be >= 1, got {v}"));
                let (num_bins, num_quantized_bins) =
                    (count("num_bins", options.num_bins)?, count("num_quantized_bins", options.num_quantized_bins)?);
                kl_tensorrt::check_settings(num_bins, num_quantized_bins).map_err(|e| e.to_string())?;
                Ok(RangeMethod::Kl { num_bins, num_quantized_bins })
            }
            "pow2" => Ok(RangeMethod::Pow2 { qtype: parse_pow2_type(&options.qtype)?, choice }),
            _ => Err(format!("unknown method {method:?}: expected {}", Self::NAMES)),
        }
    }

    /// The method names `parse` accepts, for messages.
    pub const NAMES: &'static str = "'mse', 'kl' or 'pow2'";

    /// Whether the range needs pow2 MostCommon's per-batch votes.
    pub fn needs_votes(&self) -> bool {
        matches!(self, RangeMethod::Pow2 { choice: Pow2Choice::MostCommon, .. })
    }

    /// One histogram's search work where it can exceed a work limit, with what it is called in
    /// an error. Only kl's grows faster than linearly (with `num_bins`, whatever the
    /// histogram); mse and pow2 try a fixed number of candidates, each at most linear in the
    /// histogram's bins.
    pub fn search_work(&self) -> Option<(String, u64)> {
        match *self {
            RangeMethod::Kl { num_bins, num_quantized_bins } => Some((
                format!("kl with num_bins={num_bins}: the search"),
                kl_tensorrt::search_work(num_bins, num_quantized_bins),
            )),
            _ => None,
        }
    }

    /// The range of one histogram of data whose type's largest value is `largest`, for ranges
    /// under ORT's scale `rule`; `votes` (exponent, count) serve MostCommon only. Stops early
    /// once `stop` is set.
    pub fn range(
        &self,
        hist: UniformHistogram<'_>,
        votes: &[(i32, u64)],
        largest: f64,
        rule: ScaleRule,
        stop: &AtomicBool,
    ) -> Result<(f64, f64), String> {
        crate::numeric::cancel::check(stop).map_err(|e| e.to_string())?;
        Ok(match *self {
            RangeMethod::Mse { qtype, symmetric } => mse_range(&ErrorTable::new(hist), qtype, symmetric, rule, stop)
                .map_err(|e| format!("mse search {e}"))?,
            RangeMethod::Kl { num_bins, num_quantized_bins } => {
                kl_tensorrt::kl_range(&hist, num_bins, num_quantized_bins, stop).map_err(|e| e.to_string())?
            }
            RangeMethod::Pow2 { qtype, choice } => {
                let (lo, hi) = pow2::exponent_bounds(qtype, rule);
                // scales stop where the tensor's type can no longer hold the range
                let max_k = pow2::max_exponent(qtype, largest);
                let bounds = (lo.min(max_k), hi.min(max_k));
                let k = match choice {
                    Pow2Choice::NonOverflow => match pow2::non_overflow_exponent(&hist, qtype) {
                        Some(k) if k > max_k => {
                            return Err(format!(
                                "pow2 NonOverflow needs scale 2^{k}, whose {} range the tensor's type cannot hold \
                                 (its largest is 2^{max_k}); pow2_method='MinMSE' chooses among the scales it holds",
                                qtype.name()
                            ))
                        }
                        k => k.map(|k| k.clamp(bounds.0, bounds.1)),
                    },
                    Pow2Choice::MinMseAll => pow2::min_mse_exponent(&ErrorTable::new(hist), qtype, bounds),
                    // votes are cast within the data type's scales; others are brought inside
                    Pow2Choice::MostCommon => pow2::most_common(votes, bounds),
                };
                k.map_or((0.0, 0.0), |k| pow2::range(k, qtype))
            }
        })
    }
}
