//! Range methods beyond ORT's: quantization error over a histogram (`qerror`), the mse and
//! TensorRT-KL searches, power-of-two scales, and the method choice by name (`range_method`).
//! Depends on `numeric` and `ort`.

pub mod isotone;
pub mod kl_tensorrt;
pub mod mse;
pub mod ort_scale;
pub mod pow2;
pub mod qerror;
pub mod quark_pow2;
pub mod range_method;
