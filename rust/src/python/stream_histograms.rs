//! `StreamHistograms`: per-tensor streaming histograms and the range methods over them.

use super::arrays::*;
use super::classes::{Histograms, StreamHistograms};
use super::errors::*;
use super::functions::method_options;
use super::records::{IsotonePairs, IsotoneRange, StreamExport, StreamSummary, TensorCounts};
use super::threads::*;
use crate::methods::isotone::{self, IsotoneChoice, TopPairs};
use crate::methods::pow2::{self, Pow2Type};
use crate::methods::qerror::{ErrorTable, Quantizer};
use crate::methods::range_method::*;
use crate::numeric::fallible::{self};
use crate::state::{ort_shaped, Batches, CollectError, Counts, TensorState, TypedBinning};
use crate::stream::channel_rows::{add_channels, ChannelLayout};
use crate::stream::stream_histogram::as_uniform;
use crate::stream::stream_histogram::StreamHistogram;
use numpy::ndarray::{ArrayViewD, Axis};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rayon::prelude::*;
use std::collections::HashMap;

#[pymethods]
impl StreamHistograms {
    /// `pow2_votes`: also collect the per-batch votes of pow2 MinMSE's most-common choice (costs one pow2
    /// search per batch and tensor). `isotone`: also collect isotone's per-row top-two summaries.
    #[new]
    #[pyo3(signature = (num_bins, pow2_votes=false, isotone=false))]
    fn new(num_bins: usize, pow2_votes: bool, isotone: bool) -> PyResult<Self> {
        guard(|| {
            if !num_bins.is_power_of_two() || !(8..=(1 << 25)).contains(&num_bins) {
                return Err(PyValueError::new_err(format!(
                    "streaming num_bins must be a power of two in [8, 2^25], got {num_bins}"
                )));
            }
            Ok(StreamHistograms {
                log_half: num_bins.trailing_zeros() - 1,
                pow2_votes,
                order: Vec::new(),
                states: HashMap::new(),
                isotone: isotone.then(HashMap::new),
            })
        })
    }

    #[getter]
    fn pow2_votes(&self) -> bool {
        self.pow2_votes
    }

    #[getter]
    fn isotone(&self) -> bool {
        self.isotone.is_some()
    }

    /// The distinct top-two pairs all isotone summaries hold together (0 without isotone): what
    /// their memory grows with (24 bytes a pair).
    fn isotone_pair_count(&self) -> usize {
        self.isotone.as_ref().map_or(0, |held| held.values().map(|t| t.pairs.len()).sum())
    }

    /// A tensor's isotone summary `(l1, l2, rows, skipped)` (float64, float64, uint64 arrays of its
    /// distinct top-two pairs, sorted), or None when it was not collected.
    fn isotone_pairs(&self, py: Python<'_>, name: &str) -> PyResult<Option<IsotonePairs>> {
        guard(|| {
            if !self.states.contains_key(name) {
                return Err(PyValueError::new_err(format!("no histogram for tensor {name:?}")));
            }
            Ok(self.isotone.as_ref().map(|held| {
                let t = held.get(name).cloned().unwrap_or_default();
                let l1: Vec<f64> = t.pairs.iter().map(|p| p.0).collect();
                let l2: Vec<f64> = t.pairs.iter().map(|p| p.1).collect();
                let rows: Vec<u64> = t.pairs.iter().map(|p| p.2).collect();
                IsotonePairs {
                    l1: array(py, &l1).into_any().unbind(),
                    l2: array(py, &l2).into_any().unbind(),
                    rows: array(py, &rows).into_any().unbind(),
                    skipped: t.skipped,
                    overflowed: t.overflowed,
                }
            }))
        })
    }

    /// Put back what `isotone_pairs` gave, after checking it (the collection must be an isotone one).
    fn restore_isotone(
        &mut self,
        name: &str,
        l1: Vec<f64>,
        l2: Vec<f64>,
        rows: Vec<u64>,
        skipped: u64,
        overflowed: bool,
    ) -> PyResult<()> {
        guard(|| {
            let bad = |why: String| PyValueError::new_err(format!("tensor {name:?}: {why}"));
            if !self.states.contains_key(name) {
                return Err(PyValueError::new_err(format!("no histogram for tensor {name:?}")));
            }
            let Some(held) = self.isotone.as_mut() else {
                return Err(bad("this collection holds no isotone summaries".into()));
            };
            if l1.len() != l2.len() || l1.len() != rows.len() {
                return Err(bad("isotone l1, l2 and rows differ in length".into()));
            }
            let pairs = l1.into_iter().zip(l2).zip(rows).map(|((a, b), n)| (a, b, n)).collect();
            held.insert(name.to_string(), TopPairs::from_parts(pairs, skipped, overflowed).map_err(bad)?);
            Ok(())
        })
    }

    /// isotone's ranges for `names` (default: all): `(low, high, satisfied rows, summarised rows,
    /// skipped rows, fell_back)` per tensor; see `methods::isotone`. Without a separable row the
    /// range is `(0, max(largest top value, 0))` (`fell_back`), and `(0, 0)` without any row.
    #[pyo3(signature = (names=None, *, qtype="int8", symmetric=false))]
    fn isotone_ranges(
        &self,
        py: Python<'_>,
        names: Option<Vec<String>>,
        qtype: &str,
        symmetric: bool,
    ) -> PyResult<Vec<IsotoneRange>> {
        guard(|| {
            let qtype = parse_qtype(qtype).map_err(PyValueError::new_err)?;
            let selected = self.selected(names)?;
            let Some(held) = self.isotone.as_ref() else {
                let name = selected.first().map(|s| s.0.clone()).unwrap_or_default();
                return Err(PyValueError::new_err(format!(
                    "tensor {name:?}: isotone needs per-row top-two summaries, which this collection did not record \
                     (collect with the isotone method, or StreamHistograms(..., isotone=True))"
                )));
            };
            let empty = TopPairs::default();
            let q = isotone::positive_levels(qtype, symmetric);
            let out: Vec<PyResult<IsotoneRange>> = run(py, || {
                selected
                    .par_iter()
                    .map(|(name, _)| {
                        let t = held.get(name).unwrap_or(&empty);
                        if t.overflowed {
                            return Err(PyValueError::new_err(format!(
                                "tensor {name:?}: its rows had more than {} distinct top-two pairs, more than isotone's \
                                 summary holds (isotone is meant for classification outputs: calibrate only those with it)",
                                isotone::MAX_PAIRS
                            )));
                        }
                        let choose = || match isotone::isotone_scale(t, q, symmetric) {
                            IsotoneChoice::Scale(s, n) => {
                                let (low, high) = isotone::isotone_range(s, qtype, symmetric);
                                let (rows, skipped) = (t.rows(), t.skipped);
                                IsotoneRange { low, high, satisfied: n, rows, skipped, fell_back: false }
                            }
                            IsotoneChoice::None(m) => IsotoneRange {
                                low: 0.0,
                                high: m.unwrap_or(0.0).max(0.0),
                                satisfied: 0,
                                rows: t.rows(),
                                skipped: t.skipped,
                                fell_back: m.is_some(),
                            },
                        };
                        fallible::catch(choose).map_err(|oom| out_of_memory(name, oom))
                    })
                    .collect()
            });
            out.into_iter().collect()
        })
    }

    /// A tensor's pow2 votes (for the most-common choice), `[(type index (int8, uint8, int16), exponent,
    /// batches)]`, or None when they were not collected.
    fn votes(&self, name: &str) -> PyResult<Option<Vec<(u8, i32, u64)>>> {
        guard(|| {
            let (_, h) = self
                .states
                .get(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            Ok(h.pow2_votes.as_ref().map(|v| v.iter().map(|(&(t, k), &n)| (t, k, n)).collect()))
        })
    }

    /// Put back what `votes` gave (None: not collected).
    fn restore_votes(&mut self, name: &str, votes: Option<Vec<(u8, i32, u64)>>) -> PyResult<()> {
        guard(|| {
            let (_, h) = self
                .states
                .get_mut(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            h.pow2_votes = match votes {
                None => None,
                Some(v) => {
                    let mut map = std::collections::BTreeMap::new();
                    let mut per_type = [0u128; 3];
                    for (t, k, n) in v {
                        if t > 2
                            || !(pow2::MIN_EXPONENT..=pow2::MAX_EXPONENT).contains(&k)
                            || map.insert((t, k), n).is_some()
                        {
                            return Err(PyValueError::new_err(format!(
                                "tensor {name:?}: bad or repeated pow2 vote ({t}, {k}, {n})"
                            )));
                        }
                        per_type[t as usize] += n as u128;
                    }
                    if per_type.iter().any(|&n| n > h.batches as u128) {
                        return Err(PyValueError::new_err(format!("tensor {name:?}: more pow2 votes than batches")));
                    }
                    Some(map)
                }
            };
            Ok(())
        })
    }

    #[getter]
    fn num_bins(&self) -> usize {
        2 << self.log_half
    }

    /// Add `[(name, [batch arrays...]), ...]`; how data is split into calls and batches, and
    /// their order, never changes the result.
    fn collect(&mut self, py: Python<'_>, items: Vec<(String, Vec<Bound<'_, PyAny>>)>) -> PyResult<()> {
        guard(|| {
            let borrowed = borrow_items(&items)?;
            // isotone's summaries first, into copies: an error (out of memory) changes nothing
            let tops = match &self.isotone {
                Some(held) => {
                    let inputs = borrowed.iter().map(|(n, b)| (n.as_str(), tops_input(b, None))).collect();
                    Some(isotone_collect(py, held, inputs)?)
                }
                None => None,
            };
            let batches: Vec<(&str, Batches<'_>)> = borrowed.iter().map(|(n, b)| (n.as_str(), batches_of(b))).collect();
            self.add(py, batches)?;
            if let (Some(held), Some(tops)) = (self.isotone.as_mut(), tops) {
                held.extend(tops);
            }
            Ok(())
        })
    }

    /// Add batches channel by channel: `[(keys, [batch arrays...]), ...]`, where channel `c` along
    /// `axis` of every array of an item is a batch of the histogram named `keys[c]`, as `collect`
    /// would add it. Each array is read in memory order, all its channels at once
    /// (`stream::channel_rows`; a non-C-order array is copied first). Every array of an item must
    /// have `len(keys)` channels along `axis`. With isotone on, channel `c`'s slice (the array
    /// without `axis`, its last axis the class axis) adds its rows to the isotone summary of
    /// `keys[c]`, as `collect` would add the slice.
    fn collect_channels(
        &mut self,
        py: Python<'_>,
        items: Vec<(Vec<String>, Vec<Bound<'_, PyAny>>)>,
        axis: usize,
    ) -> PyResult<()> {
        guard(|| {
            let mut borrowed = Vec::with_capacity(items.len());
            for (keys, arrays) in &items {
                let name = keys.first().map_or("", String::as_str);
                let b = borrow_all(name, arrays)?;
                check_channels(name, &b, axis, keys.len())?;
                borrowed.push((keys, name, b));
            }
            // the shapes are checked: isotone's summaries, into copies, then the histograms
            let tops = match &self.isotone {
                Some(held) => {
                    let mut inputs = Vec::new();
                    for (keys, _, b) in &borrowed {
                        for (c, key) in keys.iter().enumerate() {
                            inputs.push((key.as_str(), tops_input(b, Some((axis, c)))));
                        }
                    }
                    Some(isotone_collect(py, held, inputs)?)
                }
                None => None,
            };
            let channels: Vec<(&[String], &str, TopsInput<'_>)> =
                borrowed.iter().map(|(keys, name, b)| (keys.as_slice(), *name, tops_input(b, None))).collect();
            self.add_channels(py, channels, axis)?;
            if let (Some(held), Some(tops)) = (self.isotone.as_mut(), tops) {
                held.extend(tops);
            }
            Ok(())
        })
    }

    fn names(&self) -> Vec<String> {
        self.order.clone()
    }

    /// ORT-shaped histograms (what one collect over all the data gives) for ORT's methods, of
    /// every tensor or of `names` (in that order): callers convert a few at a time, so that
    /// only those tensors' histograms of `num_bins` bins are alive at once.
    #[pyo3(signature = (kind, num_bins, names=None))]
    fn to_histograms(
        &self,
        py: Python<'_>,
        kind: &str,
        num_bins: usize,
        names: Option<Vec<String>>,
    ) -> PyResult<Histograms> {
        guard(|| {
            let mut out = Histograms::new(kind, num_bins)?;
            let kind = out.kind;
            let states = self.selected(names)?;
            let mut seen = std::collections::HashSet::with_capacity(states.len());
            if let Some((name, _)) = states.iter().find(|(name, _)| !seen.insert(name.as_str())) {
                return Err(PyValueError::new_err(format!("tensor {name:?} is named twice")));
            }
            let built: Vec<PyResult<TensorState>> = run(py, || {
                states
                    .par_iter()
                    .map(|(name, (dtype, h))| {
                        let histogram = for_tensor(name, || ort_shaped(dtype, h, kind, num_bins))?;
                        let counts = Counts {
                            finite: h.n_finite,
                            nan: h.n_nan,
                            posinf: h.n_posinf,
                            neginf: h.n_neginf,
                            batches: h.batches,
                        };
                        Ok(TensorState { dtype, histogram, binning: TypedBinning::Nothing, counts })
                    })
                    .collect()
            });
            for ((name, _), st) in states.iter().zip(built) {
                out.insert_new(name, st?); // no repeats (checked above)
            }
            Ok(out)
        })
    }

    /// `(dtype, level or None, bins (uint64), finite_min, finite_max, abs_min, counts)`.
    fn export(&self, py: Python<'_>, name: &str) -> PyResult<StreamExport> {
        guard(|| {
            let (d, h) = self
                .states
                .get(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            Ok(StreamExport {
                dtype: d.to_string(),
                level: h.level,
                bins: array(py, &h.bins()).into_any().unbind(),
                finite_min: h.finite_min,
                finite_max: h.finite_max,
                abs_min: h.abs_min,
                counts: (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches),
            })
        })
    }

    /// `export` without the bins: `(dtype, level or None, finite_min, finite_max, abs_min, counts)`.
    fn summary(&self, name: &str) -> PyResult<StreamSummary> {
        guard(|| {
            let (d, h) = self
                .states
                .get(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            Ok(StreamSummary {
                dtype: d.to_string(),
                level: h.level,
                finite_min: h.finite_min,
                finite_max: h.finite_max,
                abs_min: h.abs_min,
                counts: (h.n_finite, h.n_nan, h.n_posinf, h.n_neginf, h.batches),
            })
        })
    }

    /// Put back what `export` gave, after checking it is consistent.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (name, dtype, level, bins, finite_min, finite_max, abs_min, counts))]
    fn restore(
        &mut self,
        name: &str,
        dtype: &str,
        level: Option<i32>,
        bins: numpy::PyReadonlyArray1<'_, u64>,
        finite_min: Option<f64>,
        finite_max: Option<f64>,
        abs_min: Option<f64>,
        counts: (u64, u64, u64, u64, u64),
    ) -> PyResult<()> {
        guard(|| {
            let bad = |why: &str| PyValueError::new_err(format!("tensor {name:?}: {why}"));
            let dtype: &'static str = match dtype {
                "float16" => "float16",
                "float32" => "float32",
                "float64" => "float64",
                _ => return Err(bad("unsupported dtype")),
            };
            let bins = bins.as_slice().map_err(|_| bad("bins must be contiguous"))?;
            let h = StreamHistogram::from_parts(self.log_half, level, bins, finite_min, finite_max, abs_min, counts)
                .map_err(|why| bad(&why))?;
            // `order` holds exactly the tensors of `states` (between calls)
            if self.states.insert(name.to_string(), (dtype, h)).is_none() {
                self.order.push(name.to_string());
            }
            Ok(())
        })
    }

    /// Add another run's histograms (same num_bins): the result equals one run over both
    /// data sets, whatever the order of merging.
    fn merge(&mut self, other: &StreamHistograms) -> PyResult<()> {
        guard(|| {
            if other.log_half != self.log_half {
                return Err(PyValueError::new_err(format!(
                    "cannot merge streaming histograms of {} and {} bins",
                    2usize << self.log_half,
                    2usize << other.log_half
                )));
            }
            for name in &other.order {
                let (d, _) = &other.states[name];
                if let Some((d0, _)) = self.states.get(name) {
                    if d0 != d {
                        return Err(named(name, CollectError::DtypeChanged { before: d0, now: d }));
                    }
                }
            }
            for name in &other.order {
                let (d, h) = &other.states[name];
                match self.states.get_mut(name) {
                    Some((_, mine)) => mine.merge(h).map_err(PyValueError::new_err)?,
                    None => {
                        self.order.push(name.clone());
                        self.states.insert(name.clone(), (d, h.copied()));
                    }
                }
            }
            // isotone's summaries, like pow2 votes, stay only when both sides collected them
            self.isotone = match (self.isotone.take(), &other.isotone) {
                (Some(mut mine), Some(theirs)) => {
                    for (name, t) in theirs {
                        mine.entry(name.clone()).or_default().merge(t);
                    }
                    Some(mine)
                }
                _ => None,
            };
            // pow2 votes stay only when both sides collected them (else some batches never voted)
            self.pow2_votes &= other.pow2_votes;
            if !self.pow2_votes {
                self.states.values_mut().for_each(|(_, h)| h.pow2_votes = None);
            }
            Ok(())
        })
    }

    /// `(low, high)` of `method` (options as for `histogram_range`) for each tensor of `names`
    /// (default: all, in `names()` order), computed in parallel; (0, 0) for a tensor without
    /// finite values. `scale_rule`: as for `histogram_range`, the range type being each tensor's.
    #[pyo3(signature = (method, names=None, *, scale_rule, **options))]
    fn ranges(
        &self,
        py: Python<'_>,
        method: &str,
        names: Option<Vec<String>>,
        scale_rule: &str,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Vec<(f64, f64)>> {
        guard(|| {
            let method = RangeMethod::parse(method, &method_options(options)?).map_err(PyValueError::new_err)?;
            let ort = parse_ort_rule(scale_rule).map_err(PyValueError::new_err)?;
            let selected = self.selected(names)?;
            check_method_work(&method)?;
            let out: Vec<PyResult<(f64, f64)>> = run_stoppable(py, |stop| {
                selected
                .par_iter()
                .map(|(name, (dtype, h))| {
                        // the errors name the tensor already
                        let range = || -> Result<(f64, f64), String> {
                    let counts = h.bins();
                    let Some(hist) = as_uniform(h, &counts).map_err(|e| format!("tensor {name:?}: {e}"))? else { return Ok((0.0, 0.0)) };
                    let votes = match (&method, &h.pow2_votes) {
                        (RangeMethod::Pow2 { qtype, .. }, Some(v)) if method.needs_votes() => {
                            let t = Pow2Type::ALL.iter().position(|x| x == qtype).expect("a pow2 type") as u8;
                            v.iter().filter(|((vt, _), _)| *vt == t).map(|(&(_, k), &n)| (k, n)).collect()
                        }
                        (_, None) if method.needs_votes() => {
                            return Err(format!(
                                "tensor {name:?}: pow2 MinMSE's most-common choice needs per-batch votes, which this collection did not \
                                 record (collect with the pow2 method and its most-common minmse_mode, or \
                                 StreamHistograms(..., pow2_votes=True))"
                            ))
                        }
                        _ => Vec::new(),
                    };
                    method.range(hist, &votes, largest_finite(dtype), range_rule(ort, dtype), stop).map_err(|e| format!("tensor {name:?}: {e}"))
                        };
                        fallible::catch(range).map_err(|oom| out_of_memory(name, oom))?.map_err(PyValueError::new_err)
                    })
                    .collect()
            })?;
            out.into_iter().collect()
        })
    }

    /// The mean squared quantization error of `ranges[k]` on tensor `names[k]`, in parallel
    /// (0.0 for a tensor without finite values). `scale_rule`: as for `histogram_qerror`, the
    /// range type being each tensor's.
    #[pyo3(signature = (names, ranges, *, scale_rule, qtype="int8", symmetric=false))]
    fn qerrors(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        ranges: Vec<(f64, f64)>,
        scale_rule: &str,
        qtype: &str,
        symmetric: bool,
    ) -> PyResult<Vec<f64>> {
        guard(|| {
            if names.len() != ranges.len() {
                return Err(PyValueError::new_err(format!("{} names but {} ranges", names.len(), ranges.len())));
            }
            let qtype = parse_qtype(qtype).map_err(PyValueError::new_err)?;
            let ort = parse_ort_rule(scale_rule).map_err(PyValueError::new_err)?;
            for (name, &(low, high)) in names.iter().zip(&ranges) {
                if !(low.is_finite() && high.is_finite()) {
                    return Err(PyValueError::new_err(format!("tensor {name:?}: range ({low}, {high}) is not finite")));
                }
            }
            let selected = self.selected(Some(names))?;
            let out: Vec<PyResult<f64>> = run(py, || {
                selected
                    .par_iter()
                    .zip(&ranges)
                    .map(|((name, (dtype, h)), &(low, high))| {
                        let error = || -> Result<f64, String> {
                            let q = Quantizer::for_range(low, high, qtype, symmetric, range_rule(ort, dtype));
                            let counts = h.bins();
                            Ok(as_uniform(h, &counts)
                                .map_err(|e| format!("tensor {name:?}: {e}"))?
                                .map_or(0.0, |hist| ErrorTable::new(hist).mean_squared_error(&q)))
                        };
                        fallible::catch(error).map_err(|oom| out_of_memory(name, oom))?.map_err(PyValueError::new_err)
                    })
                    .collect()
            });
            out.into_iter().collect()
        })
    }

    /// `(finite, nan, posinf, neginf, batches)`.
    fn counts(&self, name: &str) -> PyResult<TensorCounts> {
        guard(|| {
            let (_, h) = self
                .states
                .get(name)
                .ok_or_else(|| PyValueError::new_err(format!("no histogram for tensor {name:?}")))?;
            Ok(TensorCounts {
                n_finite: h.n_finite,
                n_nan: h.n_nan,
                n_posinf: h.n_posinf,
                n_neginf: h.n_neginf,
                batches: h.batches,
            })
        })
    }
}

impl StreamHistograms {
    /// Add each histogram's batches (see `collect`).
    fn add(&mut self, py: Python<'_>, batches: Vec<(&str, Batches<'_>)>) -> PyResult<()> {
        let mut states = self.take(&batches)?;
        // Out of memory: the batches added before it stay added (each batch is added whole
        // or not at all), and the error names the tensor.
        let results: Vec<PyResult<()>> = run(py, || {
            batches
                .par_iter()
                .zip(states.par_iter_mut())
                .map(|((name, batches), (_, h))| {
                    for_tensor(name, || {
                        match batches {
                            Batches::F16(v) => v.iter().for_each(|x| h.add(x)),
                            Batches::F32(v) => v.iter().for_each(|x| h.add(x)),
                            Batches::F64(v) => v.iter().for_each(|x| h.add(x)),
                        }
                        Ok::<_, CollectError>(())
                    })
                })
                .collect()
        });
        self.put(&batches, states);
        results.into_iter().collect()
    }
}

impl StreamHistograms {
    /// Add each item's arrays, channel `c` to the histogram `keys[c]` (see `collect_channels`),
    /// items in parallel. The histograms are changed in place: each key is looked up once.
    fn add_channels(
        &mut self,
        py: Python<'_>,
        items: Vec<(&[String], &str, TopsInput<'_>)>,
        axis: usize,
    ) -> PyResult<()> {
        // One pointer per key, dtypes checked (an error changes nothing); new keys' histograms inserted
        // first where there are any (inserting moves the entries: the pointers are then taken again).
        let mut pointers: Vec<*mut StreamHistogram> = Vec::new();
        for attempt in 0..2 {
            let mut missing = Vec::new();
            pointers.clear();
            for (keys, _, input) in &items {
                let now = input.dtype();
                for key in keys.iter() {
                    match self.states.get_mut(key) {
                        Some((before, _)) if *before != now => {
                            return Err(named(key, CollectError::DtypeChanged { before, now }))
                        }
                        Some((_, h)) => pointers.push(h),
                        None => missing.push((key.as_str(), now)),
                    }
                }
            }
            if missing.is_empty() {
                break;
            }
            assert_eq!(attempt, 0, "the new histograms were inserted");
            let mut seen = std::collections::HashSet::with_capacity(missing.len());
            if let Some((key, _)) = missing.iter().find(|(k, _)| !seen.insert(*k)) {
                return Err(PyValueError::new_err(format!("tensor {key:?} is named twice")));
            }
            let fresh: Vec<StreamHistogram> = missing.iter().map(|_| self.new_histogram()).collect();
            for ((key, dtype), h) in missing.into_iter().zip(fresh) {
                self.order.push(key.to_string());
                self.states.insert(key.to_string(), (dtype, h));
            }
        }
        let mut sorted: Vec<usize> = pointers.iter().map(|&p| p as usize).collect();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(PyValueError::new_err("a channel key is named twice"));
        }
        // SAFETY: the pointers are to distinct entries of `self.states` (checked above), which is
        // not touched while these references are alive.
        let mut all = pointers.into_iter().map(|p| unsafe { &mut *p });
        let mut work: Vec<(&str, TopsInput<'_>, Vec<&mut StreamHistogram>)> = Vec::with_capacity(items.len());
        for (keys, name, input) in items {
            work.push((name, input, all.by_ref().take(keys.len()).collect()));
        }
        let results: Vec<PyResult<()>> = run(py, || {
            work.par_iter_mut()
                .map(|(name, input, hists)| {
                    for_tensor(name, || {
                        match input {
                            TopsInput::F16(v) => add_channel_views(v, axis, hists),
                            TopsInput::F32(v) => add_channel_views(v, axis, hists),
                            TopsInput::F64(v) => add_channel_views(v, axis, hists),
                        }
                        Ok::<_, CollectError>(())
                    })
                })
                .collect()
        });
        results.into_iter().collect()
    }
}

/// Add every array's channels along `axis` to `hists` (one batch per array and channel).
fn add_channel_views<T: crate::numeric::float::Float>(
    views: &[ArrayViewD<'_, T>],
    axis: usize,
    hists: &mut [&mut StreamHistogram],
) {
    for v in views {
        let layout = ChannelLayout::new(v.shape(), axis);
        let data = match v.as_slice() {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(fallible::collect(v.iter().copied())), // C order
        };
        add_channels(&data, layout, hists);
    }
}

/// One tensor's batches as ndarray views (shareable between threads, unlike the borrows).
enum TopsInput<'a> {
    F16(Vec<ArrayViewD<'a, half::f16>>),
    F32(Vec<ArrayViewD<'a, f32>>),
    F64(Vec<ArrayViewD<'a, f64>>),
}

impl TopsInput<'_> {
    fn dtype(&self) -> &'static str {
        match self {
            TopsInput::F16(_) => "float16",
            TopsInput::F32(_) => "float32",
            TopsInput::F64(_) => "float64",
        }
    }
}

/// One tensor's batches for isotone: each borrowed array's view, or with `channel = Some((axis, c))`
/// channel `c`'s slice along `axis` (the view without that axis).
fn tops_input<'a>(b: &'a super::arrays::Borrowed<'_>, channel: Option<(usize, usize)>) -> TopsInput<'a> {
    use super::arrays::Borrowed as B;
    fn part<'a, T: numpy::Element>(
        arrays: &'a [numpy::PyReadonlyArrayDyn<'_, T>],
        channel: Option<(usize, usize)>,
    ) -> Vec<ArrayViewD<'a, T>> {
        let view = |a: &'a numpy::PyReadonlyArrayDyn<'_, T>| match channel {
            None => a.as_array(),
            Some((axis, c)) => a.as_array().index_axis_move(Axis(axis), c),
        };
        arrays.iter().map(view).collect()
    }
    match b {
        B::F16(v) => TopsInput::F16(part(v, channel)),
        B::F32(v) => TopsInput::F32(part(v, channel)),
        B::F64(v) => TopsInput::F64(part(v, channel)),
    }
}

/// The summaries `held` with `inputs`' batches added, for the keys in `inputs` (copies: `held` is
/// unchanged), computed in parallel.
fn isotone_collect(
    py: Python<'_>,
    held: &HashMap<String, TopPairs>,
    inputs: Vec<(&str, TopsInput<'_>)>,
) -> PyResult<Vec<(String, TopPairs)>> {
    fn add<T: crate::numeric::float::Float>(t: &mut TopPairs, arrays: &[numpy::ndarray::ArrayViewD<'_, T>]) {
        for v in arrays {
            // rank 0: one value, no row of two
            let row_len = v.shape().last().copied().unwrap_or(1);
            let contiguous = v.as_standard_layout();
            t.merge(&isotone::top_pairs(contiguous.as_slice().expect("standard layout"), row_len));
        }
    }
    let out: Vec<PyResult<(String, TopPairs)>> = run(py, || {
        inputs
            .par_iter()
            .map(|(name, input)| {
                let mut t = held.get(*name).cloned().unwrap_or_default();
                let work = || match input {
                    TopsInput::F16(v) => add(&mut t, v),
                    TopsInput::F32(v) => add(&mut t, v),
                    TopsInput::F64(v) => add(&mut t, v),
                };
                fallible::catch(work).map_err(|oom| out_of_memory(name, oom))?;
                Ok((name.to_string(), t))
            })
            .collect()
    });
    out.into_iter().collect()
}
