//! The portable backend: the `wide` crate's 256-bit vectors (`f32x8`, `f64x4`), which compile to
//! the target's baseline SIMD (NEON on aarch64, SSE2 on plain x86_64). `wide` picks its
//! instructions when the crate is compiled, so this backend needs no run-time features; its
//! gather reads lane by lane.

use super::{Backend, Isa, Lanes, WithBackend};
use wide::{f32x8, f64x4};

/// The portable backend's token (always available).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Portable(());

impl Portable {
    /// The token; every CPU has what it needs.
    pub(crate) fn new() -> Self {
        Portable(())
    }
}

impl Backend for Portable {
    const ISA: Isa = Isa::Portable;
    type F32 = f32x8;
    type F64 = f64x4;

    #[inline(always)]
    fn vectorize<O: WithBackend>(self, op: O) -> O::Output {
        op.run(self)
    }
}

macro_rules! wide_lanes {
    ($v:ty, $t:ty, $n:literal) => {
        impl Lanes<$t, Portable> for $v {
            const N: usize = $n;

            #[inline(always)]
            fn splat(_: Portable, v: $t) -> Self {
                <$v>::splat(v)
            }
            #[inline(always)]
            fn load(_: Portable, src: &[$t]) -> Self {
                let a: [$t; $n] = src[..$n].try_into().unwrap();
                <$v>::new(a)
            }
            #[inline(always)]
            fn load_partial(_: Portable, src: &[$t]) -> Self {
                debug_assert!(src.len() < $n);
                let mut a = [0.0; $n];
                a[..src.len()].copy_from_slice(src);
                <$v>::new(a)
            }
            #[inline(always)]
            fn store(self, dst: &mut [$t]) {
                dst[..$n].copy_from_slice(&self.to_array());
            }
            #[inline(always)]
            fn store_partial(self, dst: &mut [$t]) {
                debug_assert!(dst.len() < $n);
                let n = dst.len();
                dst.copy_from_slice(&self.to_array()[..n]);
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            unsafe fn gather(_: Portable, base: &[$t], idx: &[i32]) -> Self {
                let idx: &[i32; $n] = idx[..$n].try_into().unwrap();
                <$v>::new(idx.map(|i| {
                    debug_assert!(i < 0 || (i as usize) < base.len());
                    // SAFETY: a non-negative index is below base.len() (the caller's contract).
                    if i >= 0 {
                        unsafe { *base.get_unchecked(i as usize) }
                    } else {
                        0.0
                    }
                }))
            }
            #[inline(always)]
            unsafe fn gather_partial(_: Portable, base: &[$t], idx: &[i32]) -> Self {
                debug_assert!(idx.len() < $n);
                let mut a = [0.0; $n];
                for (v, &i) in a.iter_mut().zip(idx) {
                    debug_assert!(i < 0 || (i as usize) < base.len());
                    // SAFETY: a non-negative index is below base.len() (the caller's contract).
                    *v = if i >= 0 {
                        unsafe { *base.get_unchecked(i as usize) }
                    } else {
                        0.0
                    };
                }
                <$v>::new(a)
            }
        }
    };
}

wide_lanes!(f32x8, f32, 8);
wide_lanes!(f64x4, f64, 4);
