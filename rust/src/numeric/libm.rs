//! The platform libm's `pow`, called through FFI so LLVM cannot rewrite it (`pow(x, 2.0)`
//! into `x * x`, which differs from glibc in ~0.07% of cases). numpy's f64 scalar `**` calls
//! exactly this.

extern "C" {
    #[link_name = "pow"]
    fn c_pow(x: f64, y: f64) -> f64;
}

pub fn pow(x: f64, y: f64) -> f64 {
    // SAFETY: a pure C math function.
    unsafe { c_pow(x, std::hint::black_box(y)) }
}
