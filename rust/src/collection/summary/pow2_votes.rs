//! pow2 MinMSE's most-common choice: each batch votes, per pow2 type, for the exponent MinMSE
//! picks on the batch's own histogram.

use super::{column, same_kind, Column, Parts, ReadParts, Summary};
use crate::methods::pow2::{self, Pow2Type, MAX_EXPONENT, MIN_EXPONENT};
use crate::methods::qerror::UniformHistogram;
use crate::numeric::fallible;
use std::any::Any;
use std::collections::BTreeMap;

/// `(type index in Pow2Type::ALL, exponent) -> batches that chose it`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pow2Votes {
    pub votes: BTreeMap<(u8, i32), u64>,
}

pub fn empty() -> Box<dyn Summary> {
    Box::new(Pow2Votes::default())
}

impl Pow2Votes {
    /// The votes of one type: `[(exponent, batches)]`, by exponent.
    pub fn of_type(&self, qtype: Pow2Type) -> Vec<(i32, u64)> {
        let t = Pow2Type::ALL.iter().position(|x| *x == qtype).expect("a pow2 type") as u8;
        self.votes.iter().filter(|((vt, _), _)| *vt == t).map(|(&(_, k), &n)| (k, n)).collect()
    }
}

impl Summary for Pow2Votes {
    fn name(&self) -> &'static str {
        "pow2_votes"
    }

    fn observes_batches(&self) -> bool {
        true
    }

    fn add_batch_histogram(&mut self, hist: &UniformHistogram<'_>, dtype_max: f64) {
        for (t, k) in pow2::batch_votes(*hist, dtype_max).into_iter().enumerate() {
            if let Some(k) = k {
                *self.votes.entry((t as u8, k)).or_insert(0) += 1;
            }
        }
    }

    fn merge(&mut self, other: &dyn Summary) {
        for (key, n) in &same_kind::<Self>(self, other).votes {
            *self.votes.entry(*key).or_insert(0) += n;
        }
    }

    /// Columns `type` (index in int8, uint8, int16), `exponent` and `batches`, by type and exponent.
    fn export(&self) -> Parts {
        vec![
            ("type", Column::I64(fallible::collect(self.votes.keys().map(|&(t, _)| t as i64)))),
            ("exponent", Column::I64(fallible::collect(self.votes.keys().map(|&(_, k)| k as i64)))),
            ("batches", Column::U64(fallible::collect(self.votes.values().copied()))),
        ]
    }

    /// Checks each vote's type and exponent, that none repeats, and that no type has more votes
    /// than there were batches (a batch votes once per type).
    fn restore(&self, parts: ReadParts, batches: u64) -> Result<Box<dyn Summary>, String> {
        let types = column(&parts, "type", Column::i64)?;
        let exponents = column(&parts, "exponent", Column::i64)?;
        let counts = column(&parts, "batches", Column::u64)?;
        if types.len() != exponents.len() || types.len() != counts.len() {
            return Err("pow2 vote columns differ in length".into());
        }
        let mut votes = BTreeMap::new();
        let mut per_type = [0u128; Pow2Type::ALL.len()];
        for ((&t, &k), &n) in types.iter().zip(exponents).zip(counts) {
            let known = (0..Pow2Type::ALL.len() as i64).contains(&t)
                && (MIN_EXPONENT as i64..=MAX_EXPONENT as i64).contains(&k);
            if !known || votes.insert((t as u8, k as i32), n).is_some() {
                return Err(format!("bad or repeated pow2 vote ({t}, {k}, {n})"));
            }
            per_type[t as usize] += n as u128;
        }
        if per_type.iter().any(|&n| n > batches as u128) {
            return Err("more pow2 votes than batches".into());
        }
        Ok(Box::new(Pow2Votes { votes }))
    }

    fn copied(&self) -> Box<dyn Summary> {
        // a vote map holds at most a few hundred entries (types x exponents)
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
    use super::*;

    fn parts(votes: &[(i64, i64, u64)]) -> ReadParts {
        vec![
            ("type".into(), Column::I64(votes.iter().map(|v| v.0).collect())),
            ("exponent".into(), Column::I64(votes.iter().map(|v| v.1).collect())),
            ("batches".into(), Column::U64(votes.iter().map(|v| v.2).collect())),
        ]
    }

    fn read(p: Parts) -> ReadParts {
        p.into_iter().map(|(n, c)| (n.to_string(), c)).collect()
    }

    #[test]
    fn restore_round_trips_and_rejects_what_no_collect_builds() {
        let mut v = Pow2Votes::default();
        v.votes.insert((0, -3), 2);
        v.votes.insert((1, -2), 1);
        v.votes.insert((2, -10), 2);
        let back = v.restore(read(v.export()), 2).unwrap();
        assert!(back.same(&v));
        assert_eq!(v.of_type(Pow2Type::Int8), vec![(-3, 2)]);
        assert_eq!(v.restore(read(v.export()), 1).unwrap_err(), "more pow2 votes than batches");
        for bad in [
            vec![(3, 0, 1)],
            vec![(-1, 0, 1)],
            vec![(0, MAX_EXPONENT as i64 + 1, 1)],
            vec![(0, MIN_EXPONENT as i64 - 1, 1)],
            vec![(1, 4, 1), (1, 4, 1)],
        ] {
            assert!(v.restore(parts(&bad), 10).unwrap_err().starts_with("bad or repeated pow2 vote"));
        }
        // a u64 sum that would wrap is still caught
        assert!(v.restore(parts(&[(0, 1, u64::MAX), (0, 2, u64::MAX)]), u64::MAX).is_err());
        assert_eq!(v.restore(vec![], 1).unwrap_err(), "missing column \"type\"");
    }

    #[test]
    fn merge_adds_votes() {
        let mut a = Pow2Votes::default();
        a.votes.insert((0, 1), 1);
        let mut b = Pow2Votes::default();
        b.votes.insert((0, 1), 1);
        b.votes.insert((1, 5), 1);
        a.merge(&b);
        assert_eq!(a.votes.into_iter().collect::<Vec<_>>(), vec![((0, 1), 2), ((1, 5), 1)]);
    }
}
