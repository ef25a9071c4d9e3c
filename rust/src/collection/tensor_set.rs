//! Per-tensor states in first-collected order, and errors that name their tensor.

use crate::numeric::fallible::{self, OutOfMemory};
use rayon::prelude::*;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};

/// A failure on one tensor: the tensor is named in every message.
#[derive(Debug, PartialEq)]
pub enum TensorError {
    /// Bad input or a state that cannot take it.
    Invalid { name: String, message: String },
    /// An allocation sized by the data or settings failed.
    OutOfMemory { name: String, oom: OutOfMemory },
    /// The collection holds no histogram of that name.
    Missing { name: String },
    /// An error about the collection as a whole (no one tensor).
    Collection(String),
}

impl TensorError {
    pub fn invalid(name: &str, message: impl std::fmt::Display) -> Self {
        TensorError::Invalid { name: name.to_string(), message: message.to_string() }
    }
}

impl std::fmt::Display for TensorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TensorError::Invalid { name, message } => write!(f, "tensor {name:?}: {message}"),
            TensorError::OutOfMemory { name, oom } => write!(f, "tensor {name:?}: {oom}"),
            TensorError::Missing { name } => write!(f, "no histogram for tensor {name:?}"),
            TensorError::Collection(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for TensorError {}

/// `f`'s work on tensor `name`: its error, or running out of memory (`fallible`'s unwind), as
/// a [`TensorError`] naming the tensor.
pub fn on_tensor<T, E: std::fmt::Display>(name: &str, f: impl FnOnce() -> Result<T, E>) -> Result<T, TensorError> {
    match fallible::catch(f) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(TensorError::invalid(name, e)),
        Err(oom) => Err(TensorError::OutOfMemory { name: name.to_string(), oom }),
    }
}

/// Run `f` on every item in parallel (each item is worked on whatever the others do) and
/// return the first error in item order.
pub fn par_try_each<T: Send, E: Send>(items: &mut [T], f: impl Fn(&mut T) -> Result<(), E> + Sync) -> Result<(), E> {
    let results: Vec<Result<(), E>> = items.par_iter_mut().map(&f).collect();
    results.into_iter().collect()
}

/// `f` of every item, in parallel, in item order (the result vector is allocated by
/// `fallible`).
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut out = fallible::with_capacity(items.len());
    items.par_iter().map(&f).collect_into_vec(&mut out);
    out
}

/// The names' hash: a multiply-rotate over 8-byte words with a per-set random seed and a final
/// mix (std's SipHash costs several times as much on the 20-100-byte names of per-channel
/// histograms, looked up a hundred thousand times a batch).
#[derive(Clone, Debug)]
pub struct NameHash {
    seed: u64,
}

impl Default for NameHash {
    fn default() -> Self {
        NameHash { seed: RandomState::new().hash_one(0u64) }
    }
}

impl BuildHasher for NameHash {
    type Hasher = NameHasher;
    fn build_hasher(&self) -> NameHasher {
        NameHasher(self.seed)
    }
}

pub struct NameHasher(u64);

impl NameHasher {
    fn word(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for NameHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.word(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, b: u8) {
        self.word(b as u64);
    }

    fn finish(&self) -> u64 {
        // murmur3's finaliser: every input bit reaches the low bits (the table's bucket) and the
        // top 7 (its tags)
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// Per-tensor states, in the order tensors were first added: held in that order (a tensor's
/// channels, added one after another, lie side by side), found through an index by name.
#[derive(Debug)]
pub struct TensorSet<S> {
    /// Distinct names (a name is pushed only where the index does not hold it).
    order: Vec<String>,
    /// `order[i]`'s state at `states[i]`; None while taken out (`take`).
    states: Vec<Option<S>>,
    index: HashMap<String, usize, NameHash>,
}

impl<S> Default for TensorSet<S> {
    fn default() -> Self {
        TensorSet { order: Vec::new(), states: Vec::new(), index: HashMap::default() }
    }
}

impl<S> TensorSet<S> {
    /// An empty set with room for `n` tensors, unwinding with `OutOfMemory` (as `fallible`'s
    /// helpers do) when the memory is not there: for copies.
    pub fn with_capacity(n: usize) -> Self {
        let mut index = HashMap::default();
        if index.try_reserve(n).is_err() {
            fallible::fail::<(String, usize)>(n);
        }
        TensorSet { order: fallible::with_capacity(n), states: fallible::with_capacity(n), index }
    }

    /// The tensors, in first-added order.
    pub fn names(&self) -> &[String] {
        &self.order
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    pub fn get(&self, name: &str) -> Result<&S, TensorError> {
        self.find(name).ok_or_else(|| TensorError::Missing { name: name.to_string() })
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut S, TensorError> {
        match self.index.get(name) {
            Some(&i) => self.states[i].as_mut(),
            None => None,
        }
        .ok_or_else(|| TensorError::Missing { name: name.to_string() })
    }

    /// The states of `names`, each borrowed mutably at once (nothing moved); an error for a name
    /// not held or named twice. Per-channel collections pass a hundred thousand names a batch,
    /// a tensor's channels in the order they were added: a name is first compared with the name
    /// after the one before it (a read in order), and looked up only where it differs (a lookup
    /// is a chain of misses once the index has left the caches).
    pub fn get_disjoint_mut(&mut self, names: &[&str]) -> Result<Vec<&mut S>, TensorError> {
        let mut at: Vec<usize> = Vec::with_capacity(names.len());
        let mut seen = vec![false; self.states.len()];
        let mut next = usize::MAX;
        for &name in names {
            let found = match self.order.get(next) {
                Some(n) if n == name => Some(next), // the names are distinct: its index
                _ => self.index.get(name).copied(),
            };
            let i = match found {
                Some(i) if self.states[i].is_some() => i,
                _ => return Err(TensorError::Missing { name: name.to_string() }),
            };
            next = i + 1;
            if std::mem::replace(&mut seen[i], true) {
                return Err(TensorError::invalid(name, "named twice"));
            }
            at.push(i);
        }
        let base = self.states.as_mut_ptr();
        // SAFETY: the indices are distinct (checked above) and in bounds, their states held;
        // `self.states` stays borrowed mutably, so unchanged, while the references live.
        Ok(at.into_iter().map(|i| unsafe { (*base.add(i)).as_mut().expect("held") }).collect())
    }

    /// The state of `name`, if held (no error).
    pub fn find(&self, name: &str) -> Option<&S> {
        self.index.get(name).and_then(|&i| self.states[i].as_ref())
    }

    /// Every state, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&String, &S)> + '_ {
        self.order.iter().zip(&self.states).map(|(n, s)| (n, s.as_ref().expect("every state is put back")))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut S> + '_ {
        self.states.iter_mut().flatten()
    }

    /// The states of `names` (default: all, in order); an error for a tensor not held.
    pub fn selected(&self, names: Option<Vec<String>>) -> Result<Vec<(String, &S)>, TensorError> {
        match names {
            None => Ok(self.iter().map(|(n, s)| (n.clone(), s)).collect()),
            Some(names) => names
                .into_iter()
                .map(|n| {
                    let s = self.get(&n)?;
                    Ok((n, s))
                })
                .collect(),
        }
    }

    /// Take a state out to work on (its place in the order is kept: `put` it back).
    pub fn take(&mut self, name: &str) -> Option<S> {
        let &i = self.index.get(name)?;
        self.states[i].take()
    }

    /// Put back a state taken out, or add a new tensor at the end of the order.
    pub fn put(&mut self, name: &str, state: S) {
        match self.index.get(name) {
            Some(&i) => self.states[i] = Some(state),
            None => self.push(name, Some(state)),
        }
    }

    /// Put back a state that `take` took out (the tensor is in the order already).
    pub fn put_back(&mut self, name: &str, state: S) {
        debug_assert!(self.index.contains_key(name));
        self.put(name, state);
    }

    /// Add a new tensor to the order whose state is out being worked on (`put_back` puts it in).
    pub fn push_taken(&mut self, name: &str) {
        self.push(name, None);
    }

    /// Add a tensor not held yet (the caller knows it is new).
    pub fn push_new(&mut self, name: &str, state: S) {
        self.push(name, Some(state));
    }

    /// Add or replace a state (a replaced state keeps its place).
    pub fn insert(&mut self, name: &str, state: S) {
        self.put(name, state);
    }

    fn push(&mut self, name: &str, state: Option<S>) {
        self.index.insert(name.to_string(), self.order.len());
        self.order.push(name.to_string());
        self.states.push(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_first_added_order_and_names_missing_tensors() {
        let mut s = TensorSet::default();
        s.insert("b", 1);
        s.insert("a", 2);
        s.insert("b", 3);
        assert_eq!(s.names(), ["b", "a"]);
        assert_eq!(s.get("b"), Ok(&3));
        assert_eq!(s.get("c").unwrap_err().to_string(), "no histogram for tensor \"c\"");
        let taken = s.take("b").unwrap();
        s.put("b", taken + 1);
        assert_eq!(s.names(), ["b", "a"]);
        let sel = s.selected(Some(vec!["a".into(), "b".into()])).unwrap();
        assert_eq!(sel, vec![("a".to_string(), &2), ("b".to_string(), &4)]);
        assert!(s.selected(Some(vec!["z".into()])).is_err());
    }

    #[test]
    fn get_disjoint_mut_borrows_each_named_state_once() {
        let mut set = TensorSet::default();
        for (n, v) in [("a", 1), ("b", 2), ("c", 3)] {
            set.push_new(n, v);
        }
        for s in set.get_disjoint_mut(&["c", "a"]).unwrap() {
            *s *= 10;
        }
        assert_eq!(set.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [10, 2, 30]);
        assert!(matches!(set.get_disjoint_mut(&["a", "b", "a"]), Err(TensorError::Invalid { .. })));
        assert!(matches!(set.get_disjoint_mut(&["a", "z"]), Err(TensorError::Missing { .. })));
        // in order, out of order, a name taken out
        for names in [&["a", "b", "c"][..], &["b", "c", "a"], &["c", "b"], &["a", "c", "b"]] {
            let got: Vec<i32> = set.get_disjoint_mut(names).unwrap().into_iter().map(|s| *s).collect();
            let want: Vec<i32> = names.iter().map(|n| *set.get(n).unwrap()).collect();
            assert_eq!(got, want, "{names:?}");
        }
        assert!(matches!(set.get_disjoint_mut(&["b", "c", "b"]), Err(TensorError::Invalid { .. })));
        let b = set.take("b").unwrap();
        assert!(matches!(set.get_disjoint_mut(&["a", "b"]), Err(TensorError::Missing { .. })));
        assert!(!set.contains("b") && set.names().len() == 3);
        set.put_back("b", b);
        assert_eq!(set.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [10, 2, 30]);
    }

    #[test]
    fn par_try_each_runs_every_item_and_returns_the_first_error() {
        let mut items: Vec<(usize, u32)> = (0..64).map(|i| (i, 0)).collect();
        let r = par_try_each(&mut items, |(i, done)| {
            *done = 1;
            if *i % 10 == 7 {
                Err(*i)
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err(7));
        assert!(items.iter().all(|(_, d)| *d == 1));
    }

    #[test]
    fn on_tensor_names_the_tensor() {
        let e = on_tensor("x", || Err::<(), _>("bad")).unwrap_err();
        assert_eq!(e.to_string(), "tensor \"x\": bad");
        let e = on_tensor("y", || -> Result<(), String> { fallible::fail::<u64>(1 << 20) }).unwrap_err();
        assert!(matches!(e, TensorError::OutOfMemory { ref name, .. } if name == "y"));
    }
}
