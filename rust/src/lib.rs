//! histocal's Rust core: ORT-identical calibration statistics over numpy buffers.
//!
//! Kernels are plain Rust over slices and strided views; `bindings` (feature `python`) is the
//! only PyO3 code.

pub mod abs_histogram;
pub mod binning;
pub mod cancel;
pub mod distribution;
pub mod entropy;
pub mod fallible;
pub mod float;
pub mod histogram;
pub mod kl_tensorrt;
mod lanes;
mod libm;
pub mod minmax;
pub mod mse;
pub mod numpy_log;
pub mod pairwise;
pub mod percentile;
pub mod pow2;
pub mod qerror;
pub mod scan;
mod simd;
pub mod stream_bins;
pub mod state;
pub mod stream_histogram;
pub mod value_histogram;
pub mod view;

#[cfg(feature = "python")]
mod bindings;
