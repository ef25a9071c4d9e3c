//! Numeric ground floor: float types and their widening, numpy-identical logarithm and pairwise
//! sums, SIMD dispatch, strided views, one-pass scans, fallible allocation and cancellation.
//! Depends on nothing else in the crate.

pub mod cancel;
pub mod fallible;
pub mod float;
pub(crate) mod lanes;
pub(crate) mod libm;
pub mod numpy_log;
pub mod pairwise;
pub mod scan;
pub(crate) mod simd;
pub mod view;
