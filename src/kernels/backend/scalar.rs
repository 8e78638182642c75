//! The one-lane backend: plain code, any CPU.

use super::{Backend, Isa, Lanes, WithBackend};

/// The scalar backend's token (always available).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scalar(());

impl Scalar {
    /// The token; every CPU has what it needs.
    pub(crate) fn new() -> Self {
        Scalar(())
    }
}

/// One value as a one-lane vector.
#[derive(Debug, Clone, Copy)]
pub(crate) struct One<T>(T);

impl Backend for Scalar {
    const ISA: Isa = Isa::Scalar;
    /// matrixmultiply's: our kernel with one lane made every GEMM-bound call 3-6x slower
    /// (`isa_probe`, W2 and W4).
    const OWN_GEMM: bool = false;
    type F32 = One<f32>;
    type F64 = One<f64>;

    #[inline(always)]
    fn vectorize<O: WithBackend>(self, op: O) -> O::Output {
        op.run(self)
    }
}

macro_rules! one_lane {
    ($t:ty) => {
        impl Lanes<$t, Scalar> for One<$t> {
            const N: usize = 1;

            #[inline(always)]
            fn splat(_: Scalar, v: $t) -> Self {
                One(v)
            }
            #[inline(always)]
            fn load(_: Scalar, src: &[$t]) -> Self {
                One(src[0])
            }
            #[inline(always)]
            fn load_partial(_: Scalar, src: &[$t]) -> Self {
                debug_assert!(src.is_empty());
                One(0.0)
            }
            #[inline(always)]
            fn store(self, dst: &mut [$t]) {
                dst[0] = self.0;
            }
            #[inline(always)]
            fn store_partial(self, dst: &mut [$t]) {
                debug_assert!(dst.is_empty());
            }
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                One(self.0 + o.0)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                One(self.0 - o.0)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                One(self.0 * o.0)
            }
            /// Two roundings: a fused `mul_add` without FMA in the build is a library call.
            #[inline(always)]
            fn mul_add(self, m: Self, a: Self) -> Self {
                One(self.0 * m.0 + a.0)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                One(self.0.floor())
            }
            #[inline(always)]
            fn abs(self) -> Self {
                One(self.0.abs())
            }
            #[inline(always)]
            fn lt_select(self, o: Self, yes: Self, no: Self) -> Self {
                if self.0 < o.0 {
                    yes
                } else {
                    no
                }
            }
            #[inline(always)]
            fn store_i32(self, dst: &mut [i32]) {
                assert!(dst.len() <= 1);
                if let Some(d) = dst.first_mut() {
                    *d = self.0 as i32;
                }
            }
            const GEMM_ROWS: usize = 4;
            const GEMM_VECTORS: usize = 4;
            /// A 1 x 1 block is its own transpose.
            #[inline(always)]
            fn transpose(_: Scalar, rows: &mut [Self]) {
                assert_eq!(rows.len(), 1);
            }
        }
    };
}

one_lane!(f32);
one_lane!(f64);
