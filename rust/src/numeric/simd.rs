//! Runtime dispatch to AVX2+FMA code paths.
//!
//! The wheel targets baseline x86-64, so hot loops are compiled twice: once as is, once with
//! AVX2+FMA enabled (LLVM then vectorises them 8 wide), and the CPU picks at run time. FMA
//! being enabled does not change results: Rust never contracts `a * b + c` on its own.

use std::sync::atomic::{AtomicU8, Ordering};

/// Highest tier the dispatchers may use: 2 = AVX-512, 1 = AVX2+FMA, 0 = baseline. Lowered only
/// by tests, to run every tier on one machine (every tier gives the same results).
static MAX_TIER: AtomicU8 = AtomicU8::new(2);

/// Limit the dispatch tier (tests only).
#[cfg(test)]
pub(crate) fn set_max_tier(tier: u8) {
    MAX_TIER.store(tier, Ordering::Relaxed);
}

/// True when the AVX2+FMA variants may run (cached by std after the first call).
#[inline]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        MAX_TIER.load(Ordering::Relaxed) >= 1
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
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
                if $crate::numeric::simd::has_avx2_fma() {
                    // SAFETY: the CPU features were just detected.
                    return unsafe { avx2 $(::<$($g),*>)? ($($arg),*) };
                }
            }
            $body_fn $(::<$($g),*>)? ($($arg),*)
        }
    };
}
pub(crate) use dispatch_avx2;

/// True when the AVX-512 variants may run (AVX-512 F/VL/BW/DQ plus AVX2+FMA).
#[inline]
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        MAX_TIER.load(Ordering::Relaxed) >= 2
            && has_avx2_fma()
            && std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512dq")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Like `dispatch_avx2!`, with a first tier compiled for AVX-512 (LLVM then vectorises 16
/// wide). Only for loops of plain IEEE operations, whose results do not depend on the width.
macro_rules! dispatch_avx512 {
    ($(#[$m:meta])* $vis:vis fn $name:ident $(<$($g:ident : $b:path),*>)? ($($arg:ident : $t:ty),* $(,)?) -> $ret:ty => $body_fn:ident) => {
        $(#[$m])*
        $vis fn $name $(<$($g: $b),*>)? ($($arg: $t),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
                unsafe fn avx512 $(<$($g: $b),*>)? ($($arg: $t),*) -> $ret {
                    $body_fn $(::<$($g),*>)? ($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2 $(<$($g: $b),*>)? ($($arg: $t),*) -> $ret {
                    $body_fn $(::<$($g),*>)? ($($arg),*)
                }
                if $crate::numeric::simd::has_avx512() {
                    // SAFETY: the CPU features were just detected.
                    return unsafe { avx512 $(::<$($g),*>)? ($($arg),*) };
                }
                if $crate::numeric::simd::has_avx2_fma() {
                    // SAFETY: the CPU features were just detected.
                    return unsafe { avx2 $(::<$($g),*>)? ($($arg),*) };
                }
            }
            $body_fn $(::<$($g),*>)? ($($arg),*)
        }
    };
}
pub(crate) use dispatch_avx512;
