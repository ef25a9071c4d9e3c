//! Timing helpers shared by the kernel examples (`#[path]`-included: not an example itself).
#![allow(dead_code)] // each example uses its part

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}
extern "C" {
    fn clock_gettime(clock: i32, t: *mut Timespec) -> i32;
}

/// This thread's CPU seconds (time descheduled on a shared machine is not counted).
pub fn thread_cpu() -> f64 {
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid pointer; 3 is CLOCK_THREAD_CPUTIME_ID on Linux.
    unsafe { clock_gettime(3, &mut t) };
    t.sec as f64 + t.nsec as f64 * 1e-9
}

/// The median of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}
