//! A read-only view of an n-dimensional array of any strides, read in contiguous blocks.
//!
//! Every statistic histocal computes (min/max, counts, histograms) is independent of element
//! order, so a view is normalised to its memory layout first: a transposed or flipped array
//! whose elements fill one memory block is read as that block, without a copy. Only truly
//! strided arrays are gathered, one small block at a time.

use std::marker::PhantomData;

/// Elements gathered per block for strided views (fits in L1/L2 alongside the histogram).
pub const GATHER_BLOCK: usize = 4096;

#[derive(Clone, Debug)]
pub struct View<'a, D> {
    ptr: *const D,
    /// Normalised layout: dims of size > 1, strides (in elements) positive and decreasing.
    shape: Vec<usize>,
    strides: Vec<isize>,
    len: usize,
    _data: PhantomData<&'a [D]>,
}

// SAFETY: a View is a shared borrow of immutable data; sending it between threads is as safe
// as sending a `&[D]`.
unsafe impl<D: Sync> Send for View<'_, D> {}
unsafe impl<D: Sync> Sync for View<'_, D> {}

impl<'a, D: Copy> View<'a, D> {
    pub fn from_slice(s: &'a [D]) -> Self {
        View { ptr: s.as_ptr(), shape: vec![s.len()], strides: vec![1], len: s.len(), _data: PhantomData }
    }

    /// # Safety
    /// `ptr` with `shape` and `strides` (in elements) must describe valid, initialised elements
    /// that stay alive and unmodified for `'a`.
    pub unsafe fn from_raw(ptr: *const D, shape: &[usize], strides: &[isize]) -> Self {
        unsafe {
            let len: usize = shape.iter().product();
            let mut ptr = ptr;
            let mut dims: Vec<(usize, isize)> = Vec::with_capacity(shape.len());
            if len > 0 {
                for (&n, &s) in shape.iter().zip(strides) {
                    if n == 1 {
                        continue;
                    }
                    let mut s = s;
                    if s < 0 {
                        // Read this axis backwards: start at its last element.
                        ptr = ptr.offset(s * (n as isize - 1));
                        s = -s;
                    }
                    dims.push((n, s));
                }
                dims.sort_by_key(|d| std::cmp::Reverse(d.1));
                // Merge axes that are contiguous with the next (inner) axis.
                let mut merged: Vec<(usize, isize)> = Vec::with_capacity(dims.len());
                for (n, s) in dims.into_iter().rev() {
                    match merged.last_mut() {
                        Some(last) if last.1 * last.0 as isize == s => last.0 *= n,
                        _ => merged.push((n, s)),
                    }
                }
                merged.reverse();
                dims = merged;
            }
            if dims.is_empty() {
                dims.push((len.min(1), 1));
            }
            View {
                ptr,
                shape: dims.iter().map(|d| d.0).collect(),
                strides: dims.iter().map(|d| d.1).collect(),
                len,
                _data: PhantomData,
            }
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements as one slice, in memory order, when they fill one memory block.
    pub fn as_slice(&self) -> Option<&'a [D]> {
        if self.len == 0 {
            return Some(&[]);
        }
        if self.shape.len() == 1 && self.strides[0] == 1 {
            // SAFETY: contiguous, guaranteed valid by the constructor's contract.
            Some(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
        } else {
            None
        }
    }

    /// Calls `f` on consecutive blocks covering the flat (layout-order) index range `range`.
    pub fn for_each_block(&self, range: std::ops::Range<usize>, mut f: impl FnMut(&[D])) {
        if range.is_empty() {
            return;
        }
        if let Some(s) = self.as_slice() {
            f(&s[range]);
            return;
        }
        let ndim = self.shape.len();
        let inner_n = self.shape[ndim - 1];
        let inner_s = self.strides[ndim - 1];
        let mut buf: Vec<D> = Vec::with_capacity(GATHER_BLOCK);
        // Multi-index of range.start over the outer axes, and position in the inner axis.
        let mut outer_idx = vec![0usize; ndim - 1];
        let mut rem = range.start / inner_n;
        for ax in (0..ndim - 1).rev() {
            outer_idx[ax] = rem % self.shape[ax];
            rem /= self.shape[ax];
        }
        let mut inner = range.start % inner_n;
        let mut left = range.len();
        while left > 0 {
            let base: isize = outer_idx.iter().zip(&self.strides).map(|(&i, &s)| i as isize * s).sum();
            let take = (inner_n - inner).min(left);
            let mut done = 0;
            while done < take {
                let chunk = (take - done).min(GATHER_BLOCK - buf.len());
                for k in 0..chunk {
                    let off = base + (inner + done + k) as isize * inner_s;
                    // SAFETY: the offset addresses an element inside the described array.
                    buf.push(unsafe { *self.ptr.offset(off) });
                }
                done += chunk;
                if buf.len() == GATHER_BLOCK {
                    f(&buf);
                    buf.clear();
                }
            }
            left -= take;
            inner = 0;
            // Advance the outer multi-index.
            for ax in (0..ndim - 1).rev() {
                outer_idx[ax] += 1;
                if outer_idx[ax] < self.shape[ax] {
                    break;
                }
                outer_idx[ax] = 0;
            }
        }
        if !buf.is_empty() {
            f(&buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect<D: Copy>(v: &View<'_, D>, r: std::ops::Range<usize>) -> Vec<D> {
        let mut out = Vec::new();
        v.for_each_block(r, |b| out.extend_from_slice(b));
        out
    }

    #[test]
    fn transposed_and_flipped_arrays_are_read_as_one_block() {
        let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
        // 3x4 C array viewed transposed: shape (4,3), strides (1,4).
        let v = unsafe { View::from_raw(data.as_ptr(), &[4, 3], &[1, 4]) };
        assert!(v.as_slice().is_some());
        // Reversed 1-D.
        let v = unsafe { View::from_raw(data.as_ptr().add(11), &[12], &[-1]) };
        assert_eq!(v.as_slice().unwrap().len(), 12);
    }

    #[test]
    fn strided_views_are_gathered_in_blocks() {
        let data: Vec<f32> = (0..10000).map(|i| i as f32).collect();
        // Every other element of a (50, 200) array: shape (50,100), strides (200,2).
        let v = unsafe { View::from_raw(data.as_ptr(), &[50, 100], &[200, 2]) };
        assert!(v.as_slice().is_none());
        let all = collect(&v, 0..v.len());
        assert_eq!(all.len(), 5000);
        assert!(all.iter().all(|x| (*x as usize).is_multiple_of(2)));
        let part = collect(&v, 150..4321);
        assert_eq!(part, all[150..4321].to_vec());
    }

    #[test]
    fn empty_and_scalar_views() {
        let data = [7.0f32];
        let v = unsafe { View::from_raw(data.as_ptr(), &[], &[]) };
        assert_eq!(collect(&v, 0..1), vec![7.0]);
        let v = unsafe { View::from_raw(data.as_ptr(), &[0, 3], &[3, 1]) };
        assert!(v.is_empty());
    }
}
