//! The collections without Python: copies, merges, two-pass collects and untrusted state.

use super::summary::{Column, RowBatch, Rows};
use super::*;
use crate::collection::tensor::{Batches, Kind};
use crate::methods::isotone::{top_pairs, TopPairs};
use crate::numeric::view::View;

fn f32s(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 % 1013) as f32 - 500.0) * scale).collect()
}

fn one<'a>(name: &'a str, data: &'a [f32]) -> Vec<(&'a str, Batches<'a>)> {
    vec![(name, Batches::F32(vec![View::from_slice(data)]))]
}

fn rows<'a>(name: &'a str, data: &'a [f32]) -> Vec<(&'a str, RowBatch<'a>)> {
    vec![(name, RowBatch::F32(vec![Rows::from_slice(data, 10)]))]
}

fn collect(s: &mut StreamCollection, name: &str, data: &[f32]) {
    s.collect(&one(name, data), &rows(name, data)).unwrap();
}

/// Equal histograms and summaries.
fn same(a: &StreamState, b: &StreamState) -> bool {
    a.dtype == b.dtype
        && a.histogram == b.histogram
        && a.summaries.len() == b.summaries.len()
        && a.summaries.iter().zip(&b.summaries).all(|(x, y)| x.same(y.as_ref()))
}

fn tops(s: &StreamCollection, name: &str) -> Option<TopPairs> {
    s.summary(name, "isotone").unwrap().map(|t| t.as_any().downcast_ref::<TopPairs>().unwrap().clone())
}

#[test]
fn a_stream_copy_is_independent_and_equal_and_merges_like_one_collect() {
    let (a, b) = (f32s(3000, 0.37), f32s(2000, 1e-3));
    let mut s = StreamCollection::new(1024, &["isotone", "pow2_votes"]).unwrap();
    assert_eq!(s.summary_names(), ["pow2_votes", "isotone"]);
    collect(&mut s, "x", &a);
    let copy = s.copied();
    assert!(same(copy.tensors().get("x").unwrap(), s.tensors().get("x").unwrap()));
    collect(&mut s, "x", &b);
    assert_eq!(copy.tensors().get("x").unwrap().histogram.batches, 1);
    assert_eq!(tops(&copy, "x"), Some(top_pairs(&a, 10)));
    assert_eq!(s.tensors().get("x").unwrap().histogram.batches, 2);
    // merging the copy with the rest equals collecting both
    let mut rest = StreamCollection::new(1024, &["pow2_votes", "isotone"]).unwrap();
    collect(&mut rest, "x", &b);
    let mut merged = copy.copied();
    merged.merge(&rest).unwrap();
    assert!(same(merged.tensors().get("x").unwrap(), s.tensors().get("x").unwrap()));
}

#[test]
fn a_summary_survives_a_merge_only_when_both_sides_collected_it() {
    let a = f32s(1000, 0.1);
    let mut with = StreamCollection::new(64, &["pow2_votes", "isotone"]).unwrap();
    collect(&mut with, "x", &a);
    let mut votes_only = StreamCollection::new(64, &["pow2_votes"]).unwrap();
    collect(&mut votes_only, "x", &a);
    collect(&mut votes_only, "y", &a);
    let mut m = with.copied();
    m.merge(&votes_only).unwrap();
    assert_eq!(m.summary_names(), ["pow2_votes"]);
    assert!(tops(&m, "x").is_none() && tops(&m, "y").is_none());
    let votes = |s: &StreamCollection, n: &str| s.export_summary(n, "pow2_votes").unwrap().unwrap();
    let doubled = match &votes(&with, "x")[2].1 {
        Column::U64(v) => v.iter().map(|n| 2 * n).collect::<Vec<_>>(),
        _ => unreachable!(),
    };
    assert_eq!(votes(&m, "x")[2].1, Column::U64(doubled));
    assert_eq!(votes(&m, "y"), votes(&with, "x"));
    // a dtype change or another bin count is refused before anything changes
    let other = StreamCollection::new(128, &[]).unwrap();
    assert!(m.merge(&other).unwrap_err().to_string().contains("cannot merge streaming histograms of 64 and 128"));
    let d = vec![1.0f64; 4];
    let mut f64s = StreamCollection::new(64, &[]).unwrap();
    f64s.collect(&[("x", Batches::F64(vec![View::from_slice(&d)]))], &[]).unwrap();
    let before = m.tensors().get("x").unwrap().histogram.batches;
    assert!(m.merge(&f64s).unwrap_err().to_string().starts_with("tensor \"x\""));
    assert_eq!(m.tensors().get("x").unwrap().histogram.batches, before);
}

#[test]
fn restored_summaries_are_checked_and_name_the_tensor() {
    let a = f32s(500, 0.2);
    let mut s = StreamCollection::new(64, &["pow2_votes", "isotone"]).unwrap();
    collect(&mut s, "x", &a);
    let parts = |p: summary::Parts| p.into_iter().map(|(n, c)| (n.to_string(), c)).collect::<Vec<_>>();
    let exported = s.export_summary("x", "isotone").unwrap().unwrap();
    let mut fresh = StreamCollection::new(64, &["isotone", "pow2_votes"]).unwrap();
    collect(&mut fresh, "x", &a[..10]);
    fresh.restore_summary("x", "isotone", parts(exported.clone())).unwrap();
    assert_eq!(tops(&fresh, "x"), tops(&s, "x"));
    // more votes than the histogram's batches
    let votes = s.export_summary("x", "pow2_votes").unwrap().unwrap();
    let mut doubled = parts(votes);
    doubled[2].1 = Column::U64(vec![
        5;
        match &doubled[2].1 {
            Column::U64(v) => v.len(),
            _ => unreachable!(),
        }
    ]);
    let e = fresh.restore_summary("x", "pow2_votes", doubled).unwrap_err();
    assert_eq!(e.to_string(), "tensor \"x\": more pow2 votes than batches");
    let plain = StreamCollection::new(64, &[]).unwrap();
    assert!(plain.summary("x", "isotone").is_err()); // no such tensor
    let mut plain = plain;
    collect(&mut plain, "x", &a);
    assert!(plain.summary("x", "isotone").unwrap().is_none());
    let e = plain.restore_summary("x", "isotone", parts(exported)).unwrap_err();
    assert_eq!(e.to_string(), "tensor \"x\": this collection holds no isotone summaries");
    assert!(StreamCollection::new(64, &["nope"]).unwrap_err().contains("unknown summary \"nope\""));
}

#[test]
fn a_scan_that_also_streams_equals_a_stream_collect_votes_included() {
    let (a, b) = (f32s(3000, 0.37), f32s(2000, 1e-3));
    let mut direct = StreamCollection::new(256, &["pow2_votes"]).unwrap();
    direct.collect(&one("x", &a), &[]).unwrap();
    direct.collect(&one("x", &b), &[]).unwrap();
    let mut streamed = StreamCollection::new(256, &["pow2_votes"]).unwrap();
    let mut exact = ExactCollection::new(Kind::Value, 128).unwrap();
    exact.scan(&one("x", &a), Some(&mut streamed)).unwrap();
    exact.scan(&one("x", &b), Some(&mut streamed)).unwrap();
    assert!(same(direct.tensors().get("x").unwrap(), streamed.tensors().get("x").unwrap()));
    // and the exact histograms' two passes equal one collect call, a copy included
    exact.plan().unwrap();
    exact.count(&one("x", &a)).unwrap();
    exact.count(&one("x", &b)).unwrap();
    let mut once = ExactCollection::new(Kind::Value, 128).unwrap();
    once.collect(&[("x", Batches::F32(vec![View::from_slice(&a), View::from_slice(&b)]))]).unwrap();
    let copy = exact.copied();
    assert_eq!(copy.tensors().get("x").unwrap().histogram, once.tensors().get("x").unwrap().histogram);
    assert_eq!(copy.tensors().names(), ["x"]);
}

#[test]
fn ranges_read_the_votes_of_their_type_and_isotone_its_pairs() {
    use crate::methods::qerror::{OrtRule, QType};
    use crate::methods::range_method::{MethodOptions, RangeMethod};
    let a = f32s(3000, 0.37);
    let mut s = StreamCollection::new(1024, &["pow2_votes", "isotone"]).unwrap();
    collect(&mut s, "x", &a);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let options = MethodOptions { minmse_mode: "MostCommon".into(), ..MethodOptions::default() };
    let method = RangeMethod::parse("pow2", &options).unwrap();
    assert!(method.needs_votes());
    let r = s.ranges(&method, None, OrtRule::V1_31, &stop).unwrap();
    let mut plain = StreamCollection::new(1024, &[]).unwrap();
    collect(&mut plain, "x", &a);
    let e = plain.ranges(&method, None, OrtRule::V1_31, &stop).unwrap_err().to_string();
    assert!(e.starts_with("tensor \"x\": pow2 MinMSE's most-common choice needs per-batch votes"), "{e}");
    assert_eq!(r.len(), 1);
    let iso = s.isotone_ranges(None, QType::Int8, false).unwrap();
    assert_eq!(iso[0], stream_ranges::isotone_result(&top_pairs(&a, 10), QType::Int8, false).unwrap());
    assert!(plain.isotone_ranges(None, QType::Int8, false).is_err());
}

#[test]
fn collect_channels_equals_collecting_each_channels_view() {
    use crate::stream::channel_rows::{channel_view, ChannelLayout};
    use std::borrow::Cow;
    // [outer 3, channels 4, inner 50], axis 1; with and without a summary that watches batches
    let data = f32s(600, 0.21);
    let layout = ChannelLayout::new(&[3, 4, 50], 1);
    let keys: Vec<String> = (0..4).map(|c| format!("t[{c}]")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for summaries in [&[][..], &["pow2_votes"][..]] {
        let mut rows = StreamCollection::new(512, summaries).unwrap();
        let mut strided = StreamCollection::new(512, summaries).unwrap();
        for _ in 0..2 {
            let batches = stream::ChannelBatches::F32(vec![(layout, Cow::Borrowed(&data[..]))]);
            rows.collect_channels(&[(&keys[..], batches)], &[]).unwrap();
            let views: Vec<(&str, Batches<'_>)> =
                (0..4).map(|c| (keys[c], Batches::F32(vec![channel_view(&data, layout, c)]))).collect();
            strided.collect(&views, &[]).unwrap();
        }
        assert_eq!(rows.tensors().names(), strided.tensors().names());
        for &k in &keys {
            assert!(same(rows.tensors().get(k).unwrap(), strided.tensors().get(k).unwrap()), "{k} {summaries:?}");
        }
    }
    // a batch with the wrong channel count changes nothing
    let mut s = StreamCollection::new(64, &[]).unwrap();
    let bad = stream::ChannelBatches::F32(vec![(layout, Cow::Borrowed(&data[..]))]);
    assert!(s.collect_channels(&[(&keys[..3], bad)], &[]).is_err());
    assert!(s.tensors().is_empty());
}

#[test]
fn binned_totals_count_what_the_histograms_hold_and_see_an_open_top() {
    let a = f32s(1000, 0.5);
    let mut exact = ExactCollection::new(Kind::Value, 64).unwrap();
    exact.collect(&one("x", &a)).unwrap();
    assert_eq!(exact.binned_totals(), [("x".to_string(), 1000, false)]);
    assert_eq!(Kind::parse(Kind::Abs.name()), Ok(Kind::Abs));
    assert!(Kind::parse("values").is_err());
    // float16 |x| data past 65504 grows ORT's edges to +inf: later infinities go in the last bin
    let big = [half::f16::from_f32(1.0), half::f16::MAX, half::f16::INFINITY];
    let mut abs = ExactCollection::new(Kind::Abs, 8).unwrap();
    abs.collect(&[("h", Batches::F16(vec![View::from_slice(&big[..2])]))]).unwrap();
    abs.collect(&[("h", Batches::F16(vec![View::from_slice(&big)]))]).unwrap();
    let (_, binned, open_top) = abs.binned_totals().remove(0);
    let counts = abs.tensors().get("h").unwrap().counts;
    assert_eq!(binned, counts.finite + if open_top { counts.posinf } else { 0 });
}
