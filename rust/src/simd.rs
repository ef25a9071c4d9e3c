//! Runtime dispatch to AVX2+FMA code paths.
//!
//! The wheel targets baseline x86-64, so hot loops are compiled twice: once as is, once with
//! AVX2+FMA enabled (LLVM then vectorises them 8 wide), and the CPU picks at run time. FMA
//! being enabled does not change results: Rust never contracts `a * b + c` on its own.

/// True when the AVX2+FMA variants may run (cached by std after the first call).
#[inline]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Defines `$name` calling `$body_fn` (an `#[inline(always)]` function) either compiled with
/// AVX2+FMA or as is, depending on the CPU.
macro_rules! dispatch_avx2 {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? ($($arg:ident : $t:ty),* $(,)?) -> $ret:ty => $body_fn:ident) => {
        $(#[$m])*
        $vis fn $name $(<$($g: $b),*>)? ($($arg: $t),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2 $(<$($g: $b),*>)? ($($arg: $t),*) -> $ret {
                    $body_fn $(::<$($g),*>)? ($($arg),*)
                }
                if $crate::simd::has_avx2_fma() {
                    // SAFETY: the CPU features were just detected.
                    return unsafe { avx2 $(::<$($g),*>)? ($($arg),*) };
                }
            }
            $body_fn $(::<$($g),*>)? ($($arg),*)
        }
    };
}
pub(crate) use dispatch_avx2;
