//! A batch as rows: its values in logical (C) order, the last axis a row. Unlike
//! `numeric::view::View`, which normalises its layout to memory order (what order-free
//! statistics want), this keeps the array's own axes.

use crate::numeric::fallible;
use half::f16;
use std::borrow::Cow;
use std::marker::PhantomData;

/// An n-dimensional array of any strides, in its logical axis order.
#[derive(Clone, Debug)]
pub struct Rows<'a, D> {
    ptr: *const D,
    shape: Vec<usize>,
    strides: Vec<isize>,
    _data: PhantomData<&'a [D]>,
}

// SAFETY: a shared borrow of immutable data, as `View` is.
unsafe impl<D: Sync> Send for Rows<'_, D> {}
unsafe impl<D: Sync> Sync for Rows<'_, D> {}

impl<'a, D: Copy> Rows<'a, D> {
    /// # Safety
    /// `ptr` with `shape` and `strides` (in elements, any sign) must describe valid, initialised
    /// elements that stay alive and unmodified for `'a`.
    pub unsafe fn from_raw(ptr: *const D, shape: &[usize], strides: &[isize]) -> Self {
        Rows { ptr, shape: shape.to_vec(), strides: strides.to_vec(), _data: PhantomData }
    }

    pub fn from_slice(values: &'a [D], row_len: usize) -> Self {
        let rows = values.len().checked_div(row_len).unwrap_or(0);
        Rows {
            ptr: values.as_ptr(),
            shape: vec![rows, row_len],
            strides: vec![row_len as isize, 1],
            _data: PhantomData,
        }
    }

    /// The values in a row (the last axis; 1 for rank 0).
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values in logical order: borrowed when they lie so in memory, else gathered (allocated
    /// by `fallible`).
    pub fn values(&self) -> Cow<'a, [D]> {
        let n = self.len();
        if n == 0 {
            return Cow::Borrowed(&[]);
        }
        let mut expected = 1isize;
        let mut standard = true;
        for (&len, &stride) in self.shape.iter().zip(&self.strides).rev() {
            if len != 1 && stride != expected {
                standard = false;
                break;
            }
            expected *= len as isize;
        }
        if standard {
            // SAFETY: the elements lie contiguously in logical order from `ptr` (checked above).
            return Cow::Borrowed(unsafe { std::slice::from_raw_parts(self.ptr, n) });
        }
        let mut out = fallible::with_capacity(n);
        let mut index = vec![0usize; self.shape.len()];
        for _ in 0..n {
            let offset: isize = index.iter().zip(&self.strides).map(|(&i, &s)| i as isize * s).sum();
            // SAFETY: the index is inside the shape, so the element is inside the borrowed array.
            out.push(unsafe { *self.ptr.offset(offset) });
            for axis in (0..index.len()).rev() {
                index[axis] += 1;
                if index[axis] < self.shape[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
        Cow::Owned(out)
    }
}

/// One tensor's batches as rows, in the data's dtype.
#[derive(Clone, Debug)]
pub enum RowBatch<'a> {
    F16(Vec<Rows<'a, f16>>),
    F32(Vec<Rows<'a, f32>>),
    F64(Vec<Rows<'a, f64>>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_logical_order_whatever_the_strides() {
        let data: Vec<f32> = (0..6).map(|x| x as f32).collect();
        // a 2x3 array and its transpose (3x2, strides (1, 3))
        let plain = unsafe { Rows::from_raw(data.as_ptr(), &[2, 3], &[3, 1]) };
        assert!(matches!(plain.values(), Cow::Borrowed(_)));
        assert_eq!(plain.row_len(), 3);
        let t = unsafe { Rows::from_raw(data.as_ptr(), &[3, 2], &[1, 3]) };
        assert_eq!(&*t.values(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        // reversed rows
        let rev = unsafe { Rows::from_raw(data.as_ptr().add(3), &[2, 3], &[-3, 1]) };
        assert_eq!(&*rev.values(), &[3.0, 4.0, 5.0, 0.0, 1.0, 2.0]);
        let scalar = unsafe { Rows::from_raw(data.as_ptr(), &[], &[]) };
        assert_eq!((scalar.row_len(), &*scalar.values()), (1, &[0.0f32][..]));
    }
}
