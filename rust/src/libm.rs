//! The platform libm's `pow`/`powf`, called through FFI so LLVM cannot rewrite them
//! (`pow(x, 2.0)` into `x * x`, which differs from glibc in ~0.07% of cases). numpy's f64
//! scalar `**` and its scalar f32 `power` loop call exactly these.

extern "C" {
    #[link_name = "pow"]
    fn c_pow(x: f64, y: f64) -> f64;
    #[link_name = "powf"]
    fn c_powf(x: f32, y: f32) -> f32;
}

pub fn pow(x: f64, y: f64) -> f64 {
    // SAFETY: pure C math functions.
    unsafe { c_pow(x, std::hint::black_box(y)) }
}

pub fn powf(x: f32, y: f32) -> f32 {
    // SAFETY: pure C math functions.
    unsafe { c_powf(x, std::hint::black_box(y)) }
}
