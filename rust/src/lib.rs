//! histocal's Rust core: ORT-identical calibration statistics over numpy buffers.
//!
//! Layers, each importing only those above it in this list:
//! - [`numeric`]: float types, numpy-identical arithmetic, SIMD, views, scans, allocation;
//! - [`ort`]: ORT's histograms and its entropy / percentile / distribution / minmax methods;
//! - [`methods`]: quantization error, mse, TensorRT KL, power-of-two scales, method choice;
//! - [`stream`]: the bounded-memory streaming histogram;
//! - [`collection`]: one tensor's collected state, whichever collector built it
//!   (`collection::tensor`), the per-tensor collections the Python classes hold (order, two-pass
//!   collects, merges, copies, untrusted state) and the summaries collected beside a histogram;
//! - `python` (feature `python`): the PyO3 bindings, which only convert.
//!
//! Kernels are plain Rust over slices and strided views; `python` is the only PyO3 code.

pub mod collection;
pub mod methods;
pub mod numeric;
pub mod ort;
pub mod stream;

#[cfg(feature = "python")]
mod python;
