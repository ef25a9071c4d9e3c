//! Allocations sized by data or settings (bins, tensors, channels), which must not abort the
//! process when memory runs out, as Rust's ordinary allocations do.
//!
//! Each helper reserves with `try_reserve_exact` (or `alloc_zeroed`, which keeps the lazily
//! zeroed pages of `vec![0; n]`) and, when that fails, unwinds with an [`OutOfMemory`] payload
//! through `resume_unwind` (no panic hook runs, nothing is printed). Unwinding rather than a
//! `Result` on every kernel: the failure can come from any kernel, several calls deep or inside
//! a rayon worker (rayon re-raises a worker's unwind in the thread that waits for it), and no
//! kernel can do anything about it but stop. The bindings catch it ([`catch`]) and raise
//! Python's `MemoryError`, naming the tensor where there is one. Kernels that change a state
//! allocate before they change it, so that an unwind leaves the state as it was.
//!
//! Fixed-size scratch (a block's indices, a few counters) and vectors of one entry per tensor
//! still use the ordinary allocator.

use std::alloc::{alloc_zeroed, Layout};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// An allocation of `bytes` bytes failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfMemory {
    pub bytes: usize,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "out of memory (an allocation of {} bytes failed)", self.bytes)
    }
}

/// Unwind with an [`OutOfMemory`] payload for `n` elements of `T`.
#[cold]
pub fn fail<T>(n: usize) -> ! {
    resume_unwind(Box::new(OutOfMemory { bytes: n.saturating_mul(std::mem::size_of::<T>()) }))
}

/// Types whose all-zero bit pattern is the value zero.
pub trait Zeroed: Copy {}
impl Zeroed for u8 {}
impl Zeroed for u16 {}
impl Zeroed for u32 {}
impl Zeroed for u64 {}
impl Zeroed for i32 {}
impl Zeroed for i64 {}
impl Zeroed for usize {}
impl Zeroed for f32 {}
impl Zeroed for f64 {}
impl Zeroed for half::f16 {}

/// `vec![0; n]`, or None when the memory is not there.
pub fn try_zeroed<T: Zeroed>(n: usize) -> Option<Vec<T>> {
    if n == 0 || std::mem::size_of::<T>() == 0 {
        return Some(Vec::new());
    }
    let layout = Layout::array::<T>(n).ok()?;
    // SAFETY: the layout has a non-zero size; the memory is zeroed, and all-zero bits are a
    // valid `T` (`Zeroed`); the pointer comes from the global allocator with the layout of a
    // `Vec<T>` of capacity n, which is what `from_raw_parts` requires.
    unsafe {
        let ptr = alloc_zeroed(layout) as *mut T;
        (!ptr.is_null()).then(|| Vec::from_raw_parts(ptr, n, n))
    }
}

/// `vec![0; n]`, unwinding with [`OutOfMemory`] when the memory is not there.
pub fn zeroed<T: Zeroed>(n: usize) -> Vec<T> {
    try_zeroed(n).unwrap_or_else(|| fail::<T>(n))
}

/// `Vec::with_capacity(n)`, unwinding with [`OutOfMemory`].
pub fn with_capacity<T>(n: usize) -> Vec<T> {
    let mut v = Vec::new();
    reserve(&mut v, n);
    v
}

/// Room for `additional` more elements, unwinding with [`OutOfMemory`].
pub fn reserve<T>(v: &mut Vec<T>, additional: usize) {
    if v.try_reserve_exact(additional).is_err() {
        fail::<T>(v.len().saturating_add(additional));
    }
}

/// Capacity for at least `n` elements, grown like `Vec`'s own growth (amortised), unwinding
/// with [`OutOfMemory`]: for scratch buffers that grow a little at a time.
pub fn grow<T>(v: &mut Vec<T>, n: usize) {
    if n > v.capacity() && v.try_reserve(n - v.len()).is_err() {
        fail::<T>(n);
    }
}

/// `v.resize(n, value)`, unwinding with [`OutOfMemory`] (before changing `v`).
pub fn resize<T: Clone>(v: &mut Vec<T>, n: usize, value: T) {
    reserve(v, n.saturating_sub(v.len()));
    v.resize(n, value);
}

/// `v.extend(items)` for an iterator that knows its length, unwinding with [`OutOfMemory`]
/// (before changing `v`).
pub fn extend<T>(v: &mut Vec<T>, items: impl IntoIterator<Item = T, IntoIter: ExactSizeIterator>) {
    let items = items.into_iter();
    reserve(v, items.len());
    v.extend(items);
}

/// `items.collect::<Vec<_>>()` for an iterator that knows its length, unwinding with
/// [`OutOfMemory`].
pub fn collect<T>(items: impl IntoIterator<Item = T, IntoIter: ExactSizeIterator>) -> Vec<T> {
    let mut v = Vec::new();
    extend(&mut v, items);
    v
}

/// `s.to_vec()`, unwinding with [`OutOfMemory`].
pub fn copy<T: Clone>(s: &[T]) -> Vec<T> {
    let mut v = with_capacity(s.len());
    v.extend_from_slice(s);
    v
}

/// Run `f`; an [`OutOfMemory`] unwind from it (or from the rayon jobs it waits for) becomes
/// `Err`. Any other panic continues unwinding.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, OutOfMemory> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| match payload.downcast::<OutOfMemory>() {
        Ok(oom) => *oom,
        Err(other) => resume_unwind(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_match_the_infallible_forms() {
        assert_eq!(zeroed::<i64>(5), vec![0i64; 5]);
        assert_eq!(zeroed::<f32>(0), Vec::<f32>::new());
        assert_eq!(try_zeroed::<half::f16>(3), Some(vec![half::f16::ZERO; 3]));
        assert_eq!(collect((0..4).map(|i| i * 2)), vec![0, 2, 4, 6]);
        assert_eq!(copy(&[1u8, 2, 3]), vec![1, 2, 3]);
        let mut v = vec![1.0f64];
        resize(&mut v, 3, 7.0);
        extend(&mut v, [8.0]);
        assert_eq!(v, vec![1.0, 7.0, 7.0, 8.0]);
        assert!(with_capacity::<u64>(10).capacity() >= 10);
        grow(&mut v, 100);
        assert!(v.capacity() >= 100 && v.len() == 4);
    }

    #[test]
    fn an_impossible_allocation_unwinds_with_its_size_and_is_caught() {
        assert_eq!(try_zeroed::<u64>(usize::MAX / 4), None);
        assert_eq!(catch(|| zeroed::<u64>(usize::MAX / 16)), Err(OutOfMemory { bytes: usize::MAX / 16 * 8 }));
        assert_eq!(catch(|| with_capacity::<u32>(usize::MAX / 8)).unwrap_err().bytes, usize::MAX / 8 * 4);
        assert_eq!(catch(|| 7), Ok(7));
    }

    #[test]
    fn unwinds_from_rayon_workers_are_caught_in_the_caller() {
        use rayon::prelude::*;
        // black_box: an allocation only measured could be optimised away
        let r = catch(|| {
            (0..64usize)
                .into_par_iter()
                .map(|i| if i == 40 { std::hint::black_box(zeroed::<u64>(usize::MAX / 16)).len() } else { i })
                .sum::<usize>()
        });
        assert!(r.is_err());
    }

    #[test]
    fn other_panics_keep_unwinding() {
        let r = std::panic::catch_unwind(|| catch(|| resume_unwind(Box::new("a bug"))));
        assert!(r.is_err());
    }
}
