//! [`ExactCollection`]: per-tensor ORT histograms of one kind, and the two-pass collect (scan
//! every batch, plan each tensor's binning from the combined scan, count every batch) that
//! gives ORT's histogram of one collect call however the batches are split.

use super::stream::{data_dtype, StreamCollection, StreamState};
use super::tensor_set::{on_tensor, par_try_each, TensorError, TensorSet};
use crate::collection::tensor::{
    collect, count, histogram_from_parts, plan, AbsFamily, Batches, CollectError, Counts, Kind, Scans, TensorState,
    Typed, TypedBinning, ValueFamily,
};
use crate::numeric::fallible;
use crate::numeric::float::Float;
use crate::ort::histogram::MAX_BINS;
use std::collections::HashMap;

/// A pending scan in its stored form: `(name, dtype, (finite_min, finite_max, finite_abs_min,
/// finite_abs_max), (finite, nan, posinf, neginf), batches)`.
pub type ScanParts<Dtype> = (String, Dtype, [Option<f64>; 4], [u64; 4], u64);

/// One tensor's pass-1 work: its batches, its streaming state if streamed, and its scan once done.
type ScanWork<'w, 'a> = (&'w (&'a str, Batches<'a>), &'w mut Option<StreamState>, Option<(Scans, u64)>);

/// Per-tensor ORT histograms of one kind and bin count, in first-collected order.
#[derive(Debug)]
pub struct ExactCollection {
    kind: Kind,
    num_bins: usize,
    tensors: TensorSet<TensorState>,
    /// Two-pass collects: the combined scan and batch count of the collect being scanned.
    pending: HashMap<String, (Scans, u64)>,
}

impl ExactCollection {
    pub fn new(kind: Kind, num_bins: usize) -> Result<Self, String> {
        if !(1..=MAX_BINS).contains(&num_bins) {
            return Err(format!("num_bins must be in [1, {MAX_BINS}], got {num_bins}"));
        }
        Ok(ExactCollection { kind, num_bins, tensors: TensorSet::default(), pending: HashMap::new() })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn num_bins(&self) -> usize {
        self.num_bins
    }

    pub fn tensors(&self) -> &TensorSet<TensorState> {
        &self.tensors
    }

    /// A copy of the collected histograms, allocated by `fallible` (running out of memory unwinds
    /// rather than aborting the process); no two-pass collect is in progress in the copy.
    pub fn copied(&self) -> ExactCollection {
        let mut tensors = TensorSet::with_capacity(self.tensors.len());
        for (name, st) in self.tensors.iter() {
            tensors.push_new(name, st.copied());
        }
        ExactCollection { kind: self.kind, num_bins: self.num_bins, tensors, pending: HashMap::new() }
    }

    /// Add a tensor not held yet (the caller knows it is new).
    pub(crate) fn push_new(&mut self, name: &str, state: TensorState) {
        self.tensors.push_new(name, state);
    }

    /// One ORT collect call per tensor, in parallel: each tensor's batches together.
    pub fn collect(&mut self, batches: &[(&str, Batches<'_>)]) -> Result<(), TensorError> {
        let mut work: Vec<(&str, &Batches<'_>, Option<TensorState>)> =
            batches.iter().map(|(n, b)| (*n, b, self.tensors.take(n))).collect();
        let (kind, n_bins) = (self.kind, self.num_bins);
        let result = par_try_each(&mut work, |(name, b, state)| on_tensor(name, || collect(state, kind, b, n_bins)));
        for (name, _, state) in work {
            if let Some(s) = state {
                self.tensors.put(name, s);
            }
        }
        result
    }

    /// Two-pass collect, pass 1: add batches to each tensor's pending scan (nothing is binned
    /// here). With `stream`, the batches also go into those streaming histograms, reusing the
    /// scans. Every dtype is checked before anything changes.
    pub fn scan(
        &mut self,
        batches: &[(&str, Batches<'_>)],
        mut stream: Option<&mut StreamCollection>,
    ) -> Result<(), TensorError> {
        for (name, b) in batches {
            if let Some((p, _)) = self.pending.get(*name) {
                if p.dtype() != b.dtype() {
                    return Err(TensorError::invalid(
                        name,
                        CollectError::DtypeChanged { before: p.dtype(), now: b.dtype() },
                    ));
                }
            }
        }
        let mut streams: Vec<Option<StreamState>> = match stream.as_deref_mut() {
            Some(s) => s.take(batches)?.into_iter().map(Some).collect(),
            None => batches.iter().map(|_| None).collect(),
        };
        let mut work: Vec<ScanWork<'_, '_>> =
            batches.iter().zip(streams.iter_mut()).map(|(b, st)| (b, st, None)).collect();
        let result = par_try_each(&mut work, |((name, b), st, out)| {
            on_tensor(name, || {
                let scan = match st {
                    Some(st) => st.scan_and_add(b),
                    None => Scans::of(b),
                };
                *out = Some((scan, b.len() as u64));
                Ok::<_, CollectError>(())
            })
        });
        let scans: Vec<(Scans, u64)> = work.into_iter().filter_map(|(_, _, out)| out).collect();
        if let Some(s) = stream {
            s.put(batches, streams.into_iter().flatten().collect());
        }
        result?;
        for ((name, _), (scan, n)) in batches.iter().zip(scans) {
            let merged = match self.pending.remove(*name) {
                None => (scan, n),
                Some((old, m)) => (old.merge(scan).map_err(|e| TensorError::invalid(name, e))?, m + n),
            };
            self.pending.insert(name.to_string(), merged);
        }
        Ok(())
    }

    /// The pending scans of the collect in progress (what `scan` gathered), by name.
    pub fn pending_scans(&self) -> Vec<ScanParts<&'static str>> {
        let mut out: Vec<_> = self
            .pending
            .iter()
            .map(|(name, (scan, n))| {
                let (dtype, extremes, counts) = scan.to_parts();
                (name.clone(), dtype, extremes, counts, *n)
            })
            .collect();
        out.sort_by(|x, y| x.0.cmp(&y.0));
        out
    }

    /// Add scans `pending_scans` exported elsewhere (another process's pass 1) to the pending
    /// scans, as if their batches had been scanned here. Every record is checked (see
    /// `Scans::from_parts`) before anything changes.
    pub fn add_scans(&mut self, scans: Vec<ScanParts<String>>) -> Result<(), TensorError> {
        let mut merged: HashMap<String, (Scans, u64)> = HashMap::new();
        for (name, dtype, extremes, counts, n) in scans {
            let scan = Scans::from_parts(&dtype, extremes, counts).map_err(|why| TensorError::invalid(&name, why))?;
            let before = merged.remove(&name).or_else(|| self.pending.get(&name).copied());
            let next = match before {
                None => (scan, n),
                Some((old, m)) => (old.merge(scan).map_err(|e| TensorError::invalid(&name, e))?, m + n),
            };
            merged.insert(name, next);
        }
        self.pending.extend(merged);
        Ok(())
    }

    /// Two-pass collect, between the passes: start each scanned tensor's collect from its
    /// combined scan (ORT's ranges for the whole call). Pass 2 then `count`s every batch.
    pub fn plan(&mut self) -> Result<(), TensorError> {
        let mut work: Vec<(String, (Scans, u64), Option<TensorState>)> = self
            .pending
            .drain()
            .map(|(n, p)| {
                let st = self.tensors.take(&n);
                (n, p, st)
            })
            .collect();
        work.sort_by(|a, b| a.0.cmp(&b.0));
        let (kind, n_bins) = (self.kind, self.num_bins);
        let result =
            par_try_each(&mut work, |(name, (scan, n), state)| on_tensor(name, || plan(state, kind, scan, *n, n_bins)));
        for (name, _, state) in work {
            if let Some(s) = state {
                self.tensors.put(&name, s);
            }
        }
        result
    }

    /// Two-pass collect, pass 2: count batches with the binning `plan` fixed.
    pub fn count(&mut self, batches: &[(&str, Batches<'_>)]) -> Result<(), TensorError> {
        if let Some((n, _)) = batches.iter().find(|(n, _)| !self.tensors.contains(n)) {
            return Err(TensorError::invalid(n, "counted before it was planned"));
        }
        let mut work: Vec<(&str, &Batches<'_>, TensorState)> =
            batches.iter().map(|(n, b)| (*n, b, self.tensors.take(n).expect("checked above"))).collect();
        // counting never runs out of memory (it falls back to counting without scratch)
        let result = par_try_each(&mut work, |(name, b, st)| on_tensor(name, || count(st, b)));
        for (name, _, state) in work {
            self.tensors.put_back(name, state);
        }
        result
    }

    /// Put back an exported state (untrusted: a state file), after checking it is one histocal
    /// could have built; `edges` in the histogram's arithmetic type. Replaces any state of that
    /// name.
    #[allow(clippy::too_many_arguments)]
    pub fn restore<E: Float>(
        &mut self,
        name: &str,
        dtype: &str,
        hist: &[i64],
        edges: &[E],
        min: (f64, bool),
        max: (f64, bool),
        threshold: Option<(f64, bool)>,
        counts: Counts,
    ) -> Result<(), TensorError>
    where
        Typed<ValueFamily>: From<crate::ort::value_histogram::ValueHistogram<E>>,
        Typed<AbsFamily>: From<crate::ort::abs_histogram::AbsHistogram<E>>,
    {
        let bad = |why: String| TensorError::invalid(name, why);
        let dtype = data_dtype(dtype).ok_or_else(|| bad(format!("unsupported dtype {dtype:?}")))?;
        let hist = fallible::copy(hist);
        if hist.is_empty() || hist.iter().any(|&c| c < 0) {
            return Err(bad("hist must be non-empty with counts >= 0".into()));
        }
        // An |x| histogram with an open top also bins infinities (see abs_histogram).
        let binnable = if self.kind == Kind::Abs {
            counts.finite as u128 + counts.posinf as u128 + counts.neginf as u128
        } else {
            counts.finite as u128
        };
        if hist.iter().map(|&c| c as u128).sum::<u128>() > binnable {
            return Err(bad("hist holds more values than were collected".into()));
        }
        if (self.kind == Kind::Value) != threshold.is_some() {
            return Err(bad("threshold must be given for value histograms only".into()));
        }
        let (histogram, edge_dtype) = histogram_from_parts(self.kind, hist, edges, min, max, threshold).map_err(bad)?;
        let rank = |d: &str| ["float16", "float32", "float64"].iter().position(|x| *x == d);
        if rank(edge_dtype) < rank(dtype) {
            return Err(bad(format!("{edge_dtype} edges cannot hold {dtype} data")));
        }
        self.tensors.take(name);
        self.tensors.put(name, TensorState { dtype, histogram, binning: TypedBinning::Nothing, counts });
        Ok(())
    }
}
