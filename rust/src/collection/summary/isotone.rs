//! isotone's per-row top-two pairs ([`TopPairs`], see `methods::isotone`) as a collected summary.

use super::{column, same_kind, scalar, Column, Parts, ReadParts, RowBatch, Rows, Summary};
use crate::methods::isotone::{top_pairs, TopPairs};
use crate::numeric::fallible;
use crate::numeric::float::Float;
use std::any::Any;

pub fn empty() -> Box<dyn Summary> {
    Box::new(TopPairs::default())
}

fn add<D: Float>(t: &mut TopPairs, batches: &[Rows<'_, D>]) {
    for rows in batches {
        t.merge(&top_pairs(&rows.values(), rows.row_len()));
    }
}

impl Summary for TopPairs {
    fn name(&self) -> &'static str {
        "isotone"
    }

    fn reads_rows(&self) -> bool {
        true
    }

    fn add_rows(&mut self, rows: &RowBatch<'_>) {
        match rows {
            RowBatch::F16(v) => add(self, v),
            RowBatch::F32(v) => add(self, v),
            RowBatch::F64(v) => add(self, v),
        }
    }

    fn merge(&mut self, other: &dyn Summary) {
        TopPairs::merge(self, same_kind::<Self>(self, other))
    }

    /// Columns `l1`, `l2`, `rows` (the distinct pairs, sorted), `skipped` and `overflowed` (0 or 1).
    fn export(&self) -> Parts {
        vec![
            ("l1", Column::F64(fallible::collect(self.pairs.iter().map(|p| p.0)))),
            ("l2", Column::F64(fallible::collect(self.pairs.iter().map(|p| p.1)))),
            ("rows", Column::U64(fallible::collect(self.pairs.iter().map(|p| p.2)))),
            ("skipped", Column::U64(vec![self.skipped])),
            ("overflowed", Column::U64(vec![self.overflowed as u64])),
        ]
    }

    /// Rows are not batches: only the pairs themselves are checked ([`TopPairs::from_parts`]).
    fn restore(&self, parts: ReadParts, _batches: u64) -> Result<Box<dyn Summary>, String> {
        let (l1, l2) = (column(&parts, "l1", Column::f64)?, column(&parts, "l2", Column::f64)?);
        let rows = column(&parts, "rows", Column::u64)?;
        if l1.len() != l2.len() || l1.len() != rows.len() {
            return Err("isotone l1, l2 and rows differ in length".into());
        }
        let overflowed = match scalar(&parts, "overflowed", Column::u64)? {
            0 => false,
            1 => true,
            other => return Err(format!("isotone's overflow mark must be 0 or 1, not {other}")),
        };
        let pairs = fallible::collect(l1.iter().zip(l2).zip(rows).map(|((&a, &b), &n)| (a, b, n)));
        Ok(Box::new(TopPairs::from_parts(pairs, scalar(&parts, "skipped", Column::u64)?, overflowed)?))
    }

    fn copied(&self) -> Box<dyn Summary> {
        Box::new(TopPairs { pairs: fallible::copy(&self.pairs), ..*self })
    }

    fn same(&self, other: &dyn Summary) -> bool {
        other.as_any().downcast_ref::<Self>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn held_bytes(&self) -> usize {
        std::mem::size_of::<(f64, f64, u64)>() * self.pairs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_merge_and_the_stored_form_round_trips() {
        let data = [3.0f32, 1.0, 2.0, 5.0, 5.0, 0.0, f32::NAN, 1.0, 2.0];
        let mut t = TopPairs::default();
        t.add_rows(&RowBatch::F32(vec![Rows::from_slice(&data, 3)]));
        assert_eq!(t, top_pairs(&data, 3));
        let read: ReadParts = t.export().into_iter().map(|(n, c)| (n.to_string(), c)).collect();
        assert!(t.restore(read.clone(), 0).unwrap().same(&t));
        let mut bad = read;
        bad[4].1 = Column::U64(vec![2]);
        assert!(t.restore(bad, 0).unwrap_err().contains("overflow mark"));
        assert_eq!(t.copied().held_bytes(), 24 * t.pairs.len());
    }
}
