//! The bounded-memory streaming histogram: power-of-two bins that coarsen as the range grows,
//! convertible to ORT-shaped histograms. Depends on `numeric`, `ort` and `methods`.

pub mod channel_rows;
pub mod levels;
pub mod narrow;
pub mod stream_bins;
pub mod stream_histogram;
