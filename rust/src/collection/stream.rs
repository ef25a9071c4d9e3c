//! [`StreamCollection`]: per-tensor streaming histograms (batch-invariant), each with the
//! summaries (see [`super::summary`]) the collection was made to collect.

use super::exact::ExactCollection;
use super::summary::{empty_summary, Parts, ReadParts, RowBatch, Summary, REGISTERED};
use super::tensor_set::{on_tensor, par_map, TensorError, TensorSet};
use crate::collection::tensor::{ort_shaped, Batches, CollectError, Counts, Kind, TensorState, TypedBinning};
use crate::methods::qerror::UniformHistogram;
use crate::numeric::fallible;
use crate::stream::channel_rows::{add_channels, channel_view, ChannelLayout};
use crate::stream::stream_histogram::{BatchObserver, StreamHistogram};
use half::f16;
use rayon::prelude::*;
use std::borrow::Cow;
use std::collections::HashSet;

/// One tensor's streaming histogram, its data dtype, and its summaries (one per kind the
/// collection collects, in the collection's order).
#[derive(Debug)]
pub struct StreamState {
    pub dtype: &'static str,
    pub histogram: StreamHistogram,
    pub summaries: Vec<Box<dyn Summary>>,
}

impl StreamState {
    /// A copy allocated by `fallible` (settled bins).
    pub fn copied(&self) -> StreamState {
        let mut summaries = fallible::with_capacity(self.summaries.len());
        summaries.extend(self.summaries.iter().map(|s| s.copied()));
        StreamState { dtype: self.dtype, histogram: self.histogram.copied(), summaries }
    }

    /// Add each batch to the histogram, showing it to the summaries that watch batches.
    fn add(&mut self, batches: &Batches<'_>) {
        let observers: Vec<usize> =
            (0..self.summaries.len()).filter(|&i| self.summaries[i].observes_batches()).collect();
        let (h, summaries) = (&mut self.histogram, &mut self.summaries);
        let mut observe = |hist: &UniformHistogram<'_>, dtype_max: f64| {
            for &i in &observers {
                summaries[i].add_batch_histogram(hist, dtype_max);
            }
        };
        let watched = !observers.is_empty();
        macro_rules! each {
            ($v:expr) => {
                for view in $v {
                    if watched {
                        h.add_observed(view, Some(&mut observe as BatchObserver<'_>));
                    } else {
                        h.add(view);
                    }
                }
            };
        }
        match batches {
            Batches::F16(v) => each!(v),
            Batches::F32(v) => each!(v),
            Batches::F64(v) => each!(v),
        }
    }

    /// `Scans::of_streamed` for this state: the batches' scans, the batches added as [`StreamState::add`] does.
    pub fn scan_and_add(&mut self, batches: &Batches<'_>) -> crate::collection::tensor::Scans {
        let observers: Vec<usize> =
            (0..self.summaries.len()).filter(|&i| self.summaries[i].observes_batches()).collect();
        let summaries = &mut self.summaries;
        let mut observe = |hist: &UniformHistogram<'_>, dtype_max: f64| {
            for &i in &observers {
                summaries[i].add_batch_histogram(hist, dtype_max);
            }
        };
        let watched = !observers.is_empty();
        crate::collection::tensor::Scans::of_streamed(
            batches,
            &mut self.histogram,
            watched.then_some(&mut observe as BatchObserver<'_>),
        )
    }
}

/// Per-tensor streaming histograms in first-collected order, with the summaries of the kinds
/// it was made with.
#[derive(Debug)]
pub struct StreamCollection {
    log_half: u32,
    /// The kinds collected, as empty summaries, in [`REGISTERED`] order.
    kinds: Vec<Box<dyn Summary>>,
    tensors: TensorSet<StreamState>,
}

impl StreamCollection {
    /// `summaries`: the names of the summary kinds to collect (see [`REGISTERED`]).
    pub fn new(num_bins: usize, summaries: &[&str]) -> Result<Self, String> {
        if !num_bins.is_power_of_two() || !(8..=(1 << 25)).contains(&num_bins) {
            return Err(format!("streaming num_bins must be a power of two in [8, 2^25], got {num_bins}"));
        }
        if let Some(unknown) = summaries.iter().find(|n| empty_summary(n).is_none()) {
            let known: Vec<&str> = REGISTERED.iter().map(|(n, _)| *n).collect();
            return Err(format!("unknown summary {unknown:?} (expected one of {known:?})"));
        }
        let kinds = REGISTERED.iter().filter(|(n, _)| summaries.contains(n)).map(|(_, make)| make()).collect();
        Ok(StreamCollection { log_half: num_bins.trailing_zeros() - 1, kinds, tensors: TensorSet::default() })
    }

    pub fn num_bins(&self) -> usize {
        2 << self.log_half
    }

    /// Whether the summary called `kind` is collected.
    pub fn collects(&self, kind: &str) -> bool {
        self.kinds.iter().any(|k| k.name() == kind)
    }

    /// The names of the summaries collected, in [`REGISTERED`] order.
    pub fn summary_names(&self) -> Vec<&'static str> {
        self.kinds.iter().map(|k| k.name()).collect()
    }

    pub fn tensors(&self) -> &TensorSet<StreamState> {
        &self.tensors
    }

    /// A tensor's summary called `kind`, or None when that kind is not collected.
    pub fn summary(&self, name: &str, kind: &str) -> Result<Option<&dyn Summary>, TensorError> {
        let st = self.tensors.get(name)?;
        Ok(self.kinds.iter().position(|k| k.name() == kind).map(|i| st.summaries[i].as_ref()))
    }

    /// Where the summaries called `kind` are in each state's `summaries` (None: not collected).
    pub fn summary_index(&self, kind: &str) -> Option<usize> {
        self.kinds.iter().position(|k| k.name() == kind)
    }

    /// What the summaries called `kind` hold together, in bytes (0 when not collected).
    pub fn summary_bytes(&self, kind: &str) -> usize {
        let Some(i) = self.kinds.iter().position(|k| k.name() == kind) else { return 0 };
        self.tensors.iter().map(|(_, st)| st.summaries[i].held_bytes()).sum()
    }

    /// A tensor's summary called `kind` in its stored form, or None when not collected.
    pub fn export_summary(&self, name: &str, kind: &str) -> Result<Option<Parts>, TensorError> {
        Ok(self.summary(name, kind)?.map(|s| s.export()))
    }

    /// Put back what `export_summary` gave, after checking it (the collection must collect `kind`).
    pub fn restore_summary(&mut self, name: &str, kind: &str, parts: ReadParts) -> Result<(), TensorError> {
        let i = self.kinds.iter().position(|k| k.name() == kind);
        let st = self.tensors.get_mut(name)?;
        let Some(i) = i else {
            return Err(TensorError::invalid(name, format!("this collection holds no {kind} summaries")));
        };
        let restored =
            st.summaries[i].restore(parts, st.histogram.batches).map_err(|e| TensorError::invalid(name, e))?;
        st.summaries[i] = restored;
        Ok(())
    }

    /// An empty summary of each kind collected.
    fn empty_summaries(&self) -> Vec<Box<dyn Summary>> {
        let mut summaries = fallible::with_capacity(self.kinds.len());
        summaries.extend(self.kinds.iter().map(|k| k.copied()));
        summaries
    }

    fn new_state(&self, dtype: &'static str) -> StreamState {
        StreamState { dtype, histogram: StreamHistogram::new(self.log_half), summaries: self.empty_summaries() }
    }

    /// Take out the states of these tensors (new ones for tensors not seen yet) to add batches
    /// to; an error, changing nothing, if a tensor's dtype changed. `put` puts them back.
    pub fn take(&mut self, batches: &[(&str, Batches<'_>)]) -> Result<Vec<StreamState>, TensorError> {
        let named: Vec<(&str, &'static str)> = batches.iter().map(|(n, b)| (*n, b.dtype())).collect();
        self.take_named(&named)
    }

    /// `take` for tensors given as (name, dtype of their batches).
    fn take_named(&mut self, batches: &[(&str, &'static str)]) -> Result<Vec<StreamState>, TensorError> {
        for &(n, dtype) in batches {
            if let Some(st) = self.tensors.find(n) {
                if st.dtype != dtype {
                    let e = CollectError::DtypeChanged { before: st.dtype, now: dtype };
                    return Err(TensorError::invalid(n, e));
                }
            }
        }
        // the new states first: running out of memory then changes nothing
        let fresh: Vec<Option<StreamState>> =
            batches.iter().map(|&(n, dtype)| (!self.tensors.contains(n)).then(|| self.new_state(dtype))).collect();
        // New tensors join the order here, where they are known to be new (`put` then only puts
        // the states back): searching the order would cost O(tensors) per tensor, which
        // per-channel collections (a histogram per channel) cannot afford.
        let mut added = HashSet::new();
        let mut out = Vec::with_capacity(batches.len());
        for (&(n, dtype), new) in batches.iter().zip(fresh) {
            let state = match self.tensors.take(n) {
                Some(old) => old,
                None => {
                    if new.is_some() && added.insert(n) {
                        self.tensors.push_taken(n);
                    }
                    new.unwrap_or_else(|| self.new_state(dtype))
                }
            };
            out.push(state);
        }
        Ok(out)
    }

    /// Put back what `take` gave.
    pub fn put(&mut self, batches: &[(&str, Batches<'_>)], states: Vec<StreamState>) {
        for ((n, _), st) in batches.iter().zip(states) {
            self.tensors.put_back(n, st);
        }
    }

    /// Put in the summaries `with_rows` updated, once the batch has been added without error.
    fn put_row_summaries(&mut self, updated: Vec<RowSummaries>) -> Result<(), TensorError> {
        for (name, summaries) in updated {
            let st = self.tensors.get_mut(&name)?;
            for (i, s) in summaries {
                st.summaries[i] = s;
            }
        }
        Ok(())
    }

    /// The summaries that read rows, of `rows`' tensors, with those rows added (copies: nothing
    /// changes here), computed in parallel: `(tensor, [(summary index, summary)])`.
    fn with_rows(&self, rows: &[(&str, RowBatch<'_>)]) -> Result<Vec<RowSummaries>, TensorError> {
        let readers: Vec<usize> = (0..self.kinds.len()).filter(|&i| self.kinds[i].reads_rows()).collect();
        if readers.is_empty() {
            return Ok(Vec::new());
        }
        let out = par_map(rows, |(name, batch)| {
            on_tensor(name, || {
                let held = self.tensors.find(name).map(|st| &st.summaries);
                let mut updated = fallible::with_capacity(readers.len());
                for &i in &readers {
                    let mut s = match held {
                        Some(summaries) => summaries[i].copied(),
                        None => self.kinds[i].copied(),
                    };
                    s.add_rows(batch);
                    updated.push((i, s));
                }
                Ok::<_, String>((name.to_string(), updated))
            })
        });
        out.into_iter().collect()
    }

    /// Add each tensor's batches (in parallel over tensors) to its histogram and the summaries
    /// that watch batches; with summaries that read rows, `rows` gives each tensor's batches as
    /// rows (a tensor may appear in `batches` only, then its row summaries are unchanged). The
    /// row summaries are computed first, into copies: an error there changes nothing. Out of
    /// memory in the histograms: the batches added before it stay added (each batch whole or
    /// not at all), and the error names the tensor.
    pub fn collect(
        &mut self,
        batches: &[(&str, Batches<'_>)],
        rows: &[(&str, RowBatch<'_>)],
    ) -> Result<(), TensorError> {
        let updated = self.with_rows(rows)?;
        let mut states = self.take(batches)?;
        let results: Vec<Result<(), TensorError>> = batches
            .par_iter()
            .zip(states.par_iter_mut())
            .map(|((name, batches), st)| {
                on_tensor(name, || {
                    st.add(batches);
                    Ok::<_, CollectError>(())
                })
            })
            .collect();
        self.put(batches, states);
        results.into_iter().collect::<Result<(), _>>()?;
        self.put_row_summaries(updated)
    }

    /// Add batches channel by channel: channel `c` of every batch of an item is a batch of the
    /// tensor `keys[c]`, as `collect` would add it (an error, changing nothing, unless every batch
    /// of an item has `keys.len()` channels). Each batch is read in memory order, all its
    /// channels at once (`stream::channel_rows`), items in parallel; the states are changed in
    /// place (one lookup per key, nothing moved). Summaries that watch batches see each
    /// channel's strided view, as `collect` shows them; `rows` and errors as in `collect`.
    pub fn collect_channels(
        &mut self,
        items: &[(&[&str], ChannelBatches<'_>)],
        rows: &[(&str, RowBatch<'_>)],
    ) -> Result<(), TensorError> {
        for (keys, batches) in items {
            if let Some(layout) = batches.layouts().find(|l| l.channels != keys.len()) {
                let name = keys.first().copied().unwrap_or("");
                let e = format!("expected {} channels, got a batch with {}", keys.len(), layout.channels);
                return Err(TensorError::invalid(name, e));
            }
        }
        let updated = self.with_rows(rows)?;
        let named: Vec<(&str, &'static str)> =
            items.iter().flat_map(|(keys, b)| keys.iter().map(move |&k| (k, b.dtype()))).collect();
        let names: Vec<&str> = named.iter().map(|&(n, _)| n).collect();
        // After the first batch every channel is held: one lookup per key (a hundred thousand keys
        // a batch, each lookup a miss or two in a table far beyond the caches), dtypes checked on
        // what it found before anything changes. New channels: their states made first.
        let mut states = match self.tensors.get_disjoint_mut(&names) {
            Err(TensorError::Missing { .. }) => {
                self.add_new_channels(&named)?;
                self.tensors.get_disjoint_mut(&names)?
            }
            found => found?,
        };
        if let Some((st, &(n, dtype))) = states.iter().zip(&named).find(|(st, &(_, d))| st.dtype != d) {
            return Err(TensorError::invalid(n, CollectError::DtypeChanged { before: st.dtype, now: dtype }));
        }
        let watched = self.kinds.iter().any(|k| k.observes_batches());
        let mut groups = Vec::with_capacity(items.len());
        let mut rest = states.as_mut_slice();
        for item in items {
            let (head, tail) = rest.split_at_mut(item.0.len());
            groups.push((item, head));
            rest = tail;
        }
        let results: Vec<Result<(), TensorError>> = groups
            .into_par_iter()
            .map(|((keys, batches), states)| {
                on_tensor(keys.first().copied().unwrap_or(""), || {
                    add_channel_batches(batches, states, watched);
                    Ok::<_, CollectError>(())
                })
            })
            .collect();
        drop(states);
        results.into_iter().collect::<Result<(), _>>()?;
        self.put_row_summaries(updated)
    }

    /// The states of `named`'s channels not held yet (`collect_channels`), after checking the
    /// dtypes of those held: an error, changing nothing, for a changed dtype or a new name given twice.
    fn add_new_channels(&mut self, named: &[(&str, &'static str)]) -> Result<(), TensorError> {
        let mut fresh = Vec::new();
        let mut new_names = HashSet::new();
        for &(n, dtype) in named {
            match self.tensors.find(n) {
                Some(st) if st.dtype != dtype => {
                    return Err(TensorError::invalid(n, CollectError::DtypeChanged { before: st.dtype, now: dtype }))
                }
                Some(_) => {}
                None if !new_names.insert(n) => return Err(TensorError::invalid(n, "named twice")),
                None => fresh.push((n, self.new_state(dtype))),
            }
        }
        for (n, st) in fresh {
            self.tensors.push_new(n, st);
        }
        Ok(())
    }

    /// Whether any collected summary reads rows (the bindings then pass them to `collect`).
    pub fn reads_rows(&self) -> bool {
        self.kinds.iter().any(|k| k.reads_rows())
    }

    /// Put back an exported histogram (replacing any of that name), after checking it; its
    /// summaries start empty (`restore_summary` puts them back).
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        &mut self,
        name: &str,
        dtype: &str,
        level: Option<i32>,
        bins: &[u64],
        finite_min: Option<f64>,
        finite_max: Option<f64>,
        abs_min: Option<f64>,
        counts: (u64, u64, u64, u64, u64),
    ) -> Result<(), TensorError> {
        let dtype = data_dtype(dtype).ok_or_else(|| TensorError::invalid(name, "unsupported dtype"))?;
        let h = StreamHistogram::from_parts(self.log_half, level, bins, finite_min, finite_max, abs_min, counts)
            .map_err(|why| TensorError::invalid(name, why))?;
        let state = StreamState { dtype, histogram: h, summaries: self.empty_summaries() };
        self.tensors.insert(name, state);
        Ok(())
    }

    /// A copy, allocated by `fallible`: running out of memory unwinds (the bindings raise
    /// `MemoryError`) rather than aborting the process.
    pub fn copied(&self) -> StreamCollection {
        let mut tensors = TensorSet::with_capacity(self.tensors.len());
        for (name, st) in self.tensors.iter() {
            tensors.push_new(name, st.copied());
        }
        let kinds = self.kinds.iter().map(|k| k.copied()).collect();
        StreamCollection { log_half: self.log_half, kinds, tensors }
    }

    /// Add another collection's histograms (same num_bins): the result equals one collection
    /// over both data sets, whatever the order of merging. A summary stays only when both sides
    /// collected it (else some batches were never summarised). Checked before anything changes.
    pub fn merge(&mut self, other: &StreamCollection) -> Result<(), TensorError> {
        if other.log_half != self.log_half {
            return Err(TensorError::Collection(format!(
                "cannot merge streaming histograms of {} and {} bins",
                self.num_bins(),
                other.num_bins()
            )));
        }
        for (name, st) in other.tensors.iter() {
            if let Some(mine) = self.tensors.find(name) {
                if mine.dtype != st.dtype {
                    let e = CollectError::DtypeChanged { before: mine.dtype, now: st.dtype };
                    return Err(TensorError::invalid(name, e));
                }
            }
        }
        // the kinds both collect: (index here, index there)
        let both: Vec<(usize, usize)> = (0..self.kinds.len())
            .filter_map(|i| other.kinds.iter().position(|k| k.name() == self.kinds[i].name()).map(|j| (i, j)))
            .collect();
        let keep = |summaries: &mut Vec<Box<dyn Summary>>| {
            let kept: Vec<Box<dyn Summary>> = std::mem::take(summaries)
                .into_iter()
                .enumerate()
                .filter(|(i, _)| both.iter().any(|(b, _)| b == i))
                .map(|(_, s)| s)
                .collect();
            *summaries = kept;
        };
        for (name, theirs) in other.tensors.iter() {
            match self.tensors.get_mut(name) {
                Ok(mine) => {
                    mine.histogram.merge(&theirs.histogram).map_err(TensorError::Collection)?;
                    for &(i, j) in &both {
                        mine.summaries[i].merge(theirs.summaries[j].as_ref());
                    }
                }
                Err(_) => {
                    let mut summaries = fallible::with_capacity(self.kinds.len());
                    for i in 0..self.kinds.len() {
                        summaries.push(match both.iter().find(|(b, _)| *b == i) {
                            Some(&(_, j)) => theirs.summaries[j].copied(),
                            None => self.kinds[i].copied(), // dropped below
                        });
                    }
                    let st = StreamState { dtype: theirs.dtype, histogram: theirs.histogram.copied(), summaries };
                    self.tensors.push_new(name, st);
                }
            }
        }
        if both.len() < self.kinds.len() {
            self.tensors.values_mut().for_each(|st| keep(&mut st.summaries));
            keep(&mut self.kinds);
        }
        Ok(())
    }

    /// ORT-shaped histograms (what one collect over all the data gives) of `names` (default:
    /// all, in order), built in parallel.
    pub fn to_exact(
        &self,
        kind: Kind,
        num_bins: usize,
        names: Option<Vec<String>>,
    ) -> Result<ExactCollection, TensorError> {
        let mut out = ExactCollection::new(kind, num_bins).map_err(TensorError::Collection)?;
        let states = self.tensors.selected(names)?;
        let mut seen = HashSet::with_capacity(states.len());
        if let Some((name, _)) = states.iter().find(|(name, _)| !seen.insert(name.as_str())) {
            return Err(TensorError::Collection(format!("tensor {name:?} is named twice")));
        }
        let built = par_map(&states, |(name, st)| {
            let h = &st.histogram;
            let histogram = on_tensor(name, || ort_shaped(st.dtype, h, kind, num_bins))?;
            let counts =
                Counts { finite: h.n_finite, nan: h.n_nan, posinf: h.n_posinf, neginf: h.n_neginf, batches: h.batches };
            Ok(TensorState { dtype: st.dtype, histogram, binning: TypedBinning::Nothing, counts })
        });
        for ((name, _), st) in states.iter().zip(built) {
            out.push_new(name, st?); // no repeats (checked above)
        }
        Ok(out)
    }
}

/// A data dtype's name as a static string (the dtypes histocal collects).
pub fn data_dtype(dtype: &str) -> Option<&'static str> {
    ["float16", "float32", "float64"].into_iter().find(|d| *d == dtype)
}

/// One tensor's row-reading summaries with a collect's rows added: `(tensor, [(index, summary)])`.
type RowSummaries = (String, Vec<(usize, Box<dyn Summary>)>);

/// One tensor's batches for [`StreamCollection::collect_channels`]: each batch's values in C
/// order, laid out around its channel axis.
pub enum ChannelBatches<'a> {
    F16(Vec<(ChannelLayout, Cow<'a, [f16]>)>),
    F32(Vec<(ChannelLayout, Cow<'a, [f32]>)>),
    F64(Vec<(ChannelLayout, Cow<'a, [f64]>)>),
}

impl ChannelBatches<'_> {
    pub fn dtype(&self) -> &'static str {
        match self {
            ChannelBatches::F16(_) => "float16",
            ChannelBatches::F32(_) => "float32",
            ChannelBatches::F64(_) => "float64",
        }
    }

    fn layouts(&self) -> Box<dyn Iterator<Item = ChannelLayout> + '_> {
        match self {
            ChannelBatches::F16(v) => Box::new(v.iter().map(|(l, _)| *l)),
            ChannelBatches::F32(v) => Box::new(v.iter().map(|(l, _)| *l)),
            ChannelBatches::F64(v) => Box::new(v.iter().map(|(l, _)| *l)),
        }
    }
}

/// Add every batch's channels to `states` (one batch per array and channel): all channels in one
/// read of the batch, or, with summaries watching batches, channel by channel as
/// `StreamState::add` shows them.
fn add_channel_batches(batches: &ChannelBatches<'_>, states: &mut [&mut StreamState], watched: bool) {
    macro_rules! each {
        ($v:expr, $variant:path) => {
            for (layout, data) in $v {
                if watched {
                    for (c, st) in states.iter_mut().enumerate() {
                        st.add(&$variant(vec![channel_view(data, *layout, c)]));
                    }
                } else {
                    let mut hists: Vec<&mut StreamHistogram> = states.iter_mut().map(|st| &mut st.histogram).collect();
                    add_channels(data, *layout, &mut hists);
                }
            }
        };
    }
    match batches {
        ChannelBatches::F16(v) => each!(v, Batches::F16),
        ChannelBatches::F32(v) => each!(v, Batches::F32),
        ChannelBatches::F64(v) => each!(v, Batches::F64),
    }
}
