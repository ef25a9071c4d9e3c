//! The streaming histogram's levels: the range `[-2^level, 2^level)` a level covers, the level
//! that holds a value, and the exact merge of bins when the level rises. Shared by the
//! histogram (`stream_histogram`) and its batch binning (`stream_bins`).

/// The lowest level: every |x| below `2^MIN_LEVEL` shares the two centre bins.
pub const MIN_LEVEL: i32 = -140;

/// The smallest level whose range holds `m` (`m < 2^level`), at least `MIN_LEVEL`.
pub fn level_for(m: f64) -> i32 {
    if !(m > 0.0) {
        return MIN_LEVEL;
    }
    let bits = m.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    // m = 1.f * 2^(exp - 1023) for normal m, so 2^(exp - 1022) is the first power above it.
    let level = if exp == 0 { -1022 } else { exp - 1022 };
    level.max(MIN_LEVEL)
}

/// Merge `2H` bins (bin `s` at index `s + H`) up by `shift` levels in place: bin `s` goes to
/// `s >> shift`. Bins `s >= 0` move down (to `s >> shift <= s`) and negative ones up, so
/// walking each side away from zero only writes to bins already visited.
pub fn raise_bins(bins: &mut [u64], shift: u32) {
    let h = bins.len() / 2;
    let k = shift.min(62);
    for i in (h..bins.len()).chain((0..h).rev()) {
        let c = std::mem::take(&mut bins[i]);
        if c != 0 {
            bins[(((i as i64 - h as i64) >> k) + h as i64) as usize] += c;
        }
    }
}

/// `raise_bins` of bins that are zero outside indices `lo..=hi` (`lo <= H <= hi`): the same
/// result, touching only that window (a level rise of a histogram whose values span a few of its
/// bins' lines no longer reads and writes all `2H`).
pub fn raise_bins_window(bins: &mut [u64], shift: u32, lo: usize, hi: usize) {
    let h = bins.len() / 2;
    assert!(lo <= h && h <= hi && hi < bins.len(), "a window holding bin 0");
    let k = shift.min(62);
    // the same walk as `raise_bins`, each side from zero to the window's end: every target lies
    // between zero and its source, so inside the window
    for i in (h..=hi).chain((lo..h).rev()) {
        let c = std::mem::take(&mut bins[i]);
        if c != 0 {
            bins[(((i as i64 - h as i64) >> k) + h as i64) as usize] += c;
        }
    }
}
