//! Per-tensor states in first-collected order, and errors that name their tensor.

use crate::numeric::fallible::{self, OutOfMemory};
use rayon::prelude::*;
use std::collections::HashMap;

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

/// Per-tensor states, in the order tensors were first added.
#[derive(Debug)]
pub struct TensorSet<S> {
    order: Vec<String>,
    states: HashMap<String, S>,
}

impl<S> Default for TensorSet<S> {
    fn default() -> Self {
        TensorSet { order: Vec::new(), states: HashMap::new() }
    }
}

impl<S> TensorSet<S> {
    /// An empty set with room for `n` tensors, unwinding with `OutOfMemory` (as `fallible`'s
    /// helpers do) when the memory is not there: for copies.
    pub fn with_capacity(n: usize) -> Self {
        let mut states = HashMap::new();
        if states.try_reserve(n).is_err() {
            fallible::fail::<(String, S)>(n);
        }
        TensorSet { order: fallible::with_capacity(n), states }
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
        self.states.contains_key(name)
    }

    pub fn get(&self, name: &str) -> Result<&S, TensorError> {
        self.states.get(name).ok_or_else(|| TensorError::Missing { name: name.to_string() })
    }

    pub fn get_mut(&mut self, name: &str) -> Result<&mut S, TensorError> {
        self.states.get_mut(name).ok_or_else(|| TensorError::Missing { name: name.to_string() })
    }

    /// The states of `names`, each borrowed mutably at once (one lookup per name, nothing moved:
    /// per-channel collections pass a hundred thousand names a batch); an error for a name not
    /// held or named twice.
    pub fn get_disjoint_mut(&mut self, names: &[&str]) -> Result<Vec<&mut S>, TensorError> {
        let mut pointers: Vec<*mut S> = Vec::with_capacity(names.len());
        for &name in names {
            pointers.push(self.get_mut(name)? as *mut S);
        }
        let mut sorted: Vec<usize> = pointers.iter().map(|&p| p as usize).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            let name = names[pointers.iter().position(|&p| p as usize == w[0]).unwrap_or(0)];
            return Err(TensorError::invalid(name, "named twice"));
        }
        // SAFETY: the pointers are to distinct entries of `self.states` (checked above), which
        // stays borrowed mutably, so unchanged, while the references live.
        Ok(pointers.into_iter().map(|p| unsafe { &mut *p }).collect())
    }

    /// The state of `name`, if held (no error).
    pub fn find(&self, name: &str) -> Option<&S> {
        self.states.get(name)
    }

    /// Every state, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&String, &S)> + '_ {
        self.order.iter().map(|n| (n, &self.states[n]))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut S> + '_ {
        self.states.values_mut()
    }

    /// The states of `names` (default: all, in order); an error for a tensor not held.
    pub fn selected(&self, names: Option<Vec<String>>) -> Result<Vec<(String, &S)>, TensorError> {
        match names {
            None => Ok(self.order.iter().map(|n| (n.clone(), &self.states[n])).collect()),
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
        self.states.remove(name)
    }

    /// Put back a state taken out, or add a new tensor at the end of the order. Adding a new
    /// tensor searches the order (O(tensors)): use [`TensorSet::push_new`] where the caller
    /// knows it is new.
    pub fn put(&mut self, name: &str, state: S) {
        if !self.states.contains_key(name) && !self.order.iter().any(|o| o == name) {
            self.order.push(name.to_string());
        }
        self.states.insert(name.to_string(), state);
    }

    /// Put back a state that `take` took out (the tensor is in the order already).
    pub fn put_back(&mut self, name: &str, state: S) {
        debug_assert!(self.order.iter().any(|o| o == name));
        self.states.insert(name.to_string(), state);
    }

    /// Add a new tensor to the order whose state is out being worked on (`put_back` puts it in).
    pub fn push_taken(&mut self, name: &str) {
        self.order.push(name.to_string());
    }

    /// Add a tensor not held yet (the caller knows it is new: no search of the order).
    pub fn push_new(&mut self, name: &str, state: S) {
        self.order.push(name.to_string());
        self.states.insert(name.to_string(), state);
    }

    /// Add or replace a state, with its name known to be in the order exactly when it is in
    /// the map (true between calls: a replaced state keeps its place).
    pub fn insert(&mut self, name: &str, state: S) {
        if self.states.insert(name.to_string(), state).is_none() {
            self.order.push(name.to_string());
        }
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
