//! A throwaway summary, compiled into tests only: how many rows each tensor's batches held. It
//! shows what a third summary takes (this file, its `REGISTERED` line and its `mod` line) and that
//! collection, copies, merges and restores then carry it with no other change.

use super::{same_kind, scalar, Column, Parts, ReadParts, RowBatch, Summary};
use std::any::Any;

/// The rows seen so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowCount {
    pub rows: u64,
}

pub fn empty() -> Box<dyn Summary> {
    Box::new(RowCount::default())
}

impl Summary for RowCount {
    fn name(&self) -> &'static str {
        "row_count"
    }

    fn reads_rows(&self) -> bool {
        true
    }

    fn add_rows(&mut self, rows: &RowBatch<'_>) {
        let n: usize = match rows {
            RowBatch::F16(v) => v.iter().map(|r| r.len() / r.row_len().max(1)).sum(),
            RowBatch::F32(v) => v.iter().map(|r| r.len() / r.row_len().max(1)).sum(),
            RowBatch::F64(v) => v.iter().map(|r| r.len() / r.row_len().max(1)).sum(),
        };
        self.rows += n as u64;
    }

    fn merge(&mut self, other: &dyn Summary) {
        self.rows += same_kind::<Self>(self, other).rows;
    }

    /// One column, `rows`.
    fn export(&self) -> Parts {
        vec![("rows", Column::U64(vec![self.rows]))]
    }

    fn restore(&self, parts: ReadParts, _batches: u64) -> Result<Box<dyn Summary>, String> {
        Ok(Box::new(RowCount { rows: scalar(&parts, "rows", Column::u64)? }))
    }

    fn copied(&self) -> Box<dyn Summary> {
        Box::new(self.clone())
    }

    fn same(&self, other: &dyn Summary) -> bool {
        other.as_any().downcast_ref::<Self>() == Some(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use crate::collection::summary::{Column, RowBatch, Rows};
    use crate::collection::tensor::Batches;
    use crate::collection::StreamCollection;
    use crate::numeric::view::View;

    fn collect(s: &mut StreamCollection, data: &[f32]) {
        let batches = [("x", Batches::F32(vec![View::from_slice(data)]))];
        s.collect(&batches, &[("x", RowBatch::F32(vec![Rows::from_slice(data, 10)]))]).unwrap();
    }

    /// Registered beside the others, it is collected, copied, merged and restored by the
    /// collection code as they are, and leaves them as they were.
    #[test]
    fn a_third_summary_needs_only_its_file_and_its_registered_line() {
        let all = ["pow2_votes", "isotone", "row_count"];
        let data: Vec<f32> = (0..500).map(|i| (i % 37) as f32 - 18.0).collect();
        let mut s = StreamCollection::new(256, &["row_count", "isotone", "pow2_votes"]).unwrap();
        assert_eq!(s.summary_names(), all);
        collect(&mut s, &data);
        collect(&mut s, &data[..200]);
        let rows = |s: &StreamCollection| s.export_summary("x", "row_count").unwrap().unwrap();
        assert_eq!(rows(&s), vec![("rows", Column::U64(vec![70]))]);
        // a merge adds, a copy is equal
        let mut other = StreamCollection::new(256, &all).unwrap();
        collect(&mut other, &data[..100]);
        let mut merged = s.copied();
        assert_eq!(rows(&merged), rows(&s));
        merged.merge(&other).unwrap();
        assert_eq!(rows(&merged), vec![("rows", Column::U64(vec![80]))]);
        // restored from its stored form; the other summaries are as without it
        let mut fresh = StreamCollection::new(256, &all).unwrap();
        collect(&mut fresh, &data[..10]);
        let stored = rows(&s).into_iter().map(|(n, c)| (n.to_string(), c)).collect();
        fresh.restore_summary("x", "row_count", stored).unwrap();
        assert_eq!(rows(&fresh), rows(&s));
        let mut two = StreamCollection::new(256, &["pow2_votes", "isotone"]).unwrap();
        collect(&mut two, &data);
        collect(&mut two, &data[..200]);
        for kind in ["pow2_votes", "isotone"] {
            assert_eq!(s.export_summary("x", kind).unwrap(), two.export_summary("x", kind).unwrap());
        }
    }
}
