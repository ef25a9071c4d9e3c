//! The per-tensor collections the Python classes hold, and the rules over them: one tensor's
//! exact state, whichever collector built it ([`tensor`]), in the arithmetic type it could be
//! held in ([`widening`]), which tensors
//! are held and in what order ([`TensorSet`]), ORT's exact histograms with their two-pass
//! collects ([`ExactCollection`]), and the streaming histograms with the summaries collected
//! beside them ([`StreamCollection`], [`summary`]). Plain Rust: the bindings borrow the arrays,
//! call these, and build the records.
//!
//! Work over several tensors runs in parallel on the current rayon pool (the bindings install
//! histocal's); an error names its tensor ([`TensorError`]). Copies (`copied`) allocate through
//! `numeric::fallible`, so that running out of memory is an error, not an abort.

pub mod exact;
pub mod exact_ranges;
pub mod stream;
pub mod stream_ranges;
pub mod summary;
pub mod tensor;
pub mod tensor_set;
pub mod widening;

pub use exact::ExactCollection;
pub use exact_ranges::{EdgesRef, HistogramView};
pub use stream::{StreamCollection, StreamState};
pub use summary::Summary;
pub use tensor_set::{on_tensor, par_map, par_try_each, TensorError, TensorSet};

#[cfg(test)]
mod tests {
    /// The bindings borrow, call and build records: parallel work over tensors is the core's
    /// (`par_map`, `par_try_each`, the collections), and only `threads.rs` (histocal's pool)
    /// names rayon.
    #[test]
    fn bindings_leave_parallel_work_to_the_core() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/src/python");
        let mut offenders = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("rust/src/python") {
            let path = entry.expect("a directory entry").path();
            if path.file_name().is_some_and(|n| n == "threads.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            for (i, line) in text.lines().enumerate() {
                if line.contains("rayon") || line.contains("par_iter") || line.contains("par_bridge") {
                    offenders.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
                }
            }
        }
        assert!(offenders.is_empty(), "parallel work in the bindings (move it to the core):\n{}", offenders.join("\n"));
    }
}

#[cfg(test)]
mod collection_tests;
