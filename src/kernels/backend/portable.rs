//! The portable backend: the `wide` crate's 256-bit vectors (`f32x8`, `f64x4`), which compile to
//! the target's baseline SIMD (NEON on aarch64, SSE2 on plain x86_64). `wide` picks its
//! instructions when the crate is compiled, so this backend needs no run-time features.

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
    /// matrixmultiply's SSE2 and NEON kernels, tuned per target: our kernel on `wide` could
    /// not be compared with them on this project's machines (matrixmultiply detects the CPU
    /// itself and runs its AVX-512 or AVX2 kernels there, whatever the cap).
    const OWN_GEMM: bool = false;
    type F32 = f32x8;
    type F64 = f64x4;

    #[inline(always)]
    fn vectorize<O: WithBackend>(self, op: O) -> O::Output {
        op.run(self)
    }
}

/// `floor` per lane. `wide`'s own is one instruction on NEON and SSE4.1, but a libm call per
/// lane on x86 without SSE4.1 (this backend's build): `floorf` was 35% of the portable W1
/// forward there. So on such x86 builds: `t = round(|x|)` by adding and subtracting
/// `2^(mantissa bits)` (exact for `|x|` below it, in the default round-to-nearest mode), the
/// sign of `x` put back (so `-0.0` stays `-0.0`), and 1 taken off where `t > x`; lanes with
/// `|x|` at or over `2^(mantissa bits)` are integers already, or infinite or NaN, and stay.
#[cfg(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    not(target_feature = "sse4.1")
))]
macro_rules! floor_wide {
    ($v:ty, $t:ty, $x:expr) => {{
        let x: $v = $x;
        let magic = <$v>::splat((1u64 << (<$t>::MANTISSA_DIGITS - 1)) as $t);
        let a = x.abs();
        let t = ((a + magic) - magic) | (x & <$v>::splat(-0.0));
        let t = t - (wide::CmpGt::cmp_gt(t, x) & <$v>::splat(1.0));
        wide::CmpLt::cmp_lt(a, magic).blend(t, x)
    }};
}
#[cfg(not(all(
    any(target_arch = "x86", target_arch = "x86_64"),
    not(target_feature = "sse4.1")
)))]
macro_rules! floor_wide {
    ($v:ty, $t:ty, $x:expr) => {
        <$v>::floor($x)
    };
}

/// The lanes truncated to `i32`, for [`Lanes::store_i32`] (whose lanes are integers below
/// `2^31` in magnitude).
trait TruncateLanes<const N: usize> {
    fn truncate(self) -> [i32; N];
}

/// One conversion instruction (`cvttps2dq` on SSE2) instead of Rust's saturating `as i32`
/// per lane, a compare-and-select chain per lane. With the element-wise store below, W1 `f32`
/// portable (x86 SSE2, Zen 4, 2 threads, min of 6 alternating rounds): forward 0.79 -> 0.71
/// ms, full backward 1.88 -> 1.82.
impl TruncateLanes<8> for f32x8 {
    #[inline(always)]
    fn truncate(self) -> [i32; 8] {
        self.fast_trunc_int().to_array()
    }
}

/// `wide` has no `f64` to `i32` lane conversion.
impl TruncateLanes<4> for f64x4 {
    #[inline(always)]
    fn truncate(self) -> [i32; 4] {
        self.to_array().map(|v| v as i32)
    }
}

macro_rules! wide_lanes {
    ($v:ty, $t:ty, $n:literal, $transpose:expr) => {
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
            fn mul_add(self, m: Self, a: Self) -> Self {
                <$v>::mul_add(self, m, a)
            }
            #[inline(always)]
            fn floor(self) -> Self {
                floor_wide!($v, $t, self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$v>::abs(self)
            }
            #[inline(always)]
            fn lt_select(self, o: Self, yes: Self, no: Self) -> Self {
                wide::CmpLt::cmp_lt(self, o).blend(yes, no)
            }
            #[inline(always)]
            fn store_i32(self, dst: &mut [i32]) {
                assert!(dst.len() <= $n);
                let ints = TruncateLanes::truncate(self);
                // Element by element: a copy of variable length is a `memmove` call.
                for (d, v) in dst.iter_mut().zip(ints) {
                    *d = v;
                }
            }
            const GEMM_ROWS: usize = 6;
            const GEMM_VECTORS: usize = 1;
            #[inline(always)]
            fn transpose(_: Portable, rows: &mut [Self]) {
                let r: &mut [Self; $n] = rows.try_into().expect("N rows");
                *r = $transpose(*r);
            }
        }
    };
}

wide_lanes!(f32x8, f32, 8, f32x8::transpose);
wide_lanes!(f64x4, f64, 4, transpose_f64x4);

/// The 4 x 4 transpose of `f64x4` rows, through their arrays (`wide` has no `f64x4`
/// transpose).
#[inline(always)]
fn transpose_f64x4(rows: [f64x4; 4]) -> [f64x4; 4] {
    let a = rows.map(|r| r.to_array());
    std::array::from_fn(|j| f64x4::new([a[0][j], a[1][j], a[2][j], a[3][j]]))
}
