//! ORT's own collectors and methods, reproduced exactly: numpy-identical histograms (value and
//! absolute), the edges ORT computes, and the entropy, percentile, distribution and minmax
//! ranges over them. Depends on `numeric` only.

pub mod abs_histogram;
pub mod binning;
pub mod distribution;
pub mod entropy;
pub mod explicit_edges;
pub mod histogram;
pub mod minmax;
pub mod percentile;
pub mod value_histogram;
