//! The GEMM of the fast path, written once over the backend's vectors, for `f32` and `f64`:
//! `C = init + A · B` with `A` (a weight, `rows x depth`) packed once and reused, and `B`
//! (a column tile, `depth x len`) packed per product or once ([`PackedB`]).
//!
//! Two engines behind this one interface, chosen by the backend ([`Backend::OWN_GEMM`]):
//! - ours, on AVX-512 and AVX2 (`f32` and `f64`). Why: matrixmultiply repacks `A` on every call, and
//!   the forward calls the GEMM once per tile, so on the ResNet res5 layer (a 9.4 MB weight,
//!   49 pixels per image) it spent most of its time packing. Here the weight is packed once
//!   and shared by every tile and thread. Measured against matrixmultiply in one run
//!   (`isa_probe`, Intel Xeon, 2 threads, medians of 3): `f64` W4 forward 194 -> 128 ms,
//!   dense forward 160 -> 104 ms, full backward 366 -> 300 ms.
//! - matrixmultiply's on portable and scalar, where it could not be compared (see each
//!   backend's `OWN_GEMM`): "packing" is then a plain row-major copy (`mr = 0`) and each
//!   product one matrixmultiply call. matrixmultiply picks its kernels by its own CPU
//!   detection, whatever `DEFORMCONV_ISA` says: on an AVX-512 machine it runs AVX-512 code
//!   under every cap. Our kernel is still instantiated and tested on every backend
//!   (`tests.rs`), so a backend switches with one constant.
//!
//! Blocking: depth in blocks of [`KC`]; for each block the tile's `B` rows are packed into
//! panels of `NR = GEMM_VECTORS * N` columns (`[panel][k][NR]`, zero padded), then every
//! `MR x NR` block of `C` is updated by the register kernel ([`kernel`]): panel by panel of
//! `B`, each `B` panel (`KC x NR`) staying in L1 or L2 while every `A` micro-panel (`KC x MR`)
//! of the depth block streams past it, from L2 when the block of `A` (`rows x KC`) fits there.
//! Packed panels start on a cache line, so the kernel's vector loads of `B` never straddle two. (W2's
//! `f64` GEMM runs at a third of the `f32` rate on AMD Zen 5, not half; halving `KC` for `f64`,
//! so that W2's block of `A` is 512 KiB instead of the whole 1 MiB L2, did not change it.)
//! `MR` and `NR` are the
//! backend's ([`Lanes::GEMM_ROWS`], [`Lanes::GEMM_VECTORS`]): 8 x 48 for `f32` on AVX-512
//! (8 x 24 for `f64`), 6 x 16 on AVX2, 6 x 8 on `wide`, 4 x 4 scalar.
//!
//! Arithmetic: every `C` element is one chain, `c = bias` (or 0, or `C`), then
//! `c = mul_add(a[o, r], b[r, q], c)` for `r = 0, 1, .., depth - 1` in order, with the
//! backend's [`Lanes::mul_add`] (a block boundary stores and reloads `c` exactly). It does not
//! depend on the tile, the panel or the lane an element falls in, so the result is independent
//! of how the work is split.

mod kernel;
mod pack;
#[cfg(test)]
mod tests;
mod tile;

pub(crate) use pack::{PackedA, PackedB};
pub(crate) use tile::{GemmScratch, TileGemm};

use super::backend::{dispatch, Backend, Element, Lanes, WithBackend};
use crate::float::Float;

/// Depth per block. An `f32` AVX-512 `B` panel of `KC x NR` is then 48 KiB, an L1 of some
/// cores; 128 measured no faster in the register kernel alone and slower on the layers (dense
/// forward, Intel Xeon, 2 threads, best of 15 in 2 alternating rounds: R50-DCN-c5 19.7-22.5 ->
/// 24.4-24.7 ms, W2 18.7-19.0 -> 19.9-20.2, W4 41.1-41.7 -> 42.0-42.9, CenterNet-16 and
/// R50-DCN-c3 level).
const KC: usize = 256;

/// The `B` operand: `depth x len` with element `(r, q)` at `data[r * rs + q * cs]` (a column
/// tile has `cs = 1`; the transposed tile of the weight gradient has `rs = 1`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatB<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

/// A writable `C` block: element `(o, q)` at `ptr.add(o * rs + q)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatC<T> {
    /// Element `(0, 0)`.
    pub ptr: *mut T,
    /// The row stride.
    pub rs: usize,
}

/// What the sums start from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Init<'a, T> {
    /// `bias[o]` for row `o` (`C` is only written).
    Bias(&'a [T]),
    /// Zero (`C` is only written).
    Zero,
    /// The values already in `C` (`C += A · B`).
    Accumulate,
}

impl<T: Float> Init<'_, T> {
    /// `Zero` for `beta = 0`, `Accumulate` otherwise (`beta` is 0 or 1).
    pub(crate) fn beta(beta: T) -> Self {
        debug_assert!(beta == T::ZERO || beta == T::ONE);
        if beta == T::ZERO {
            Init::Zero
        } else {
            Init::Accumulate
        }
    }
}

/// The register block `(MR, NR)` of backend `B` for `T`.
fn block_shape<T: Element, B: Backend>() -> (usize, usize) {
    (
        <T::V<B> as Lanes<T, B>>::GEMM_ROWS,
        <T::V<B> as Lanes<T, B>>::GEMM_VECTORS * <T::V<B> as Lanes<T, B>>::N,
    )
}

/// The register block `(MR, NR)` of the process's backend for `T`, or `(0, 0)` where
/// matrixmultiply runs the products (plain row-major operands).
pub(crate) fn shape<T: Float>() -> (usize, usize) {
    struct Shape<T>(std::marker::PhantomData<T>);
    impl<T: Float> WithBackend for Shape<T> {
        type Output = (usize, usize);
        #[inline(always)]
        fn run<B: Backend>(self, _: B) -> (usize, usize) {
            if B::OWN_GEMM {
                block_shape::<T, B>()
            } else {
                (0, 0)
            }
        }
    }
    dispatch(Shape::<T>(std::marker::PhantomData))
}

/// Whether the process's backend multiplies by matrixmultiply, which packs both operands
/// again on every product (so the forward's tiles are longer there, see `plan::forward`).
pub(crate) fn repacks_weight<T: Float>() -> bool {
    shape::<T>() == (0, 0)
}

/// `c[o * ldc + q] = init[o, q] + sum_r a[o, r] * b[r, q]` for `o < rows`, `q < len`, with
/// `init` the bias, zero (then `c` is never read) or `c` itself. `bp` is the caller's
/// reusable buffer for the packed `B` block.
///
/// # Safety
/// `b` holds `a`'s depth rows of `len` columns (checked in debug builds); `c` addresses
/// `rows` rows of `len` writable elements at stride `ldc`, owned by the caller for the
/// duration of the call and disjoint from `b` and the bias.
pub(crate) unsafe fn multiply<T: Float>(
    a: &PackedA<T>,
    b: MatB<'_, T>,
    len: usize,
    init: Init<'_, T>,
    c: *mut T,
    ldc: usize,
    bp: &mut Vec<T>,
) {
    debug_assert!(
        len == 0 || a.depth == 0 || b.data.len() > (a.depth - 1) * b.rs + (len - 1) * b.cs
    );
    let out = kernel::Out { c, ldc, len, init };
    dispatch(kernel::Product {
        a,
        b: kernel::Operand::Unpacked(b, bp),
        out,
    })
}

/// [`multiply`] with a [`PackedB`] (`len` = its columns, no packing per call).
///
/// # Safety
/// As [`multiply`]; `b` has `a`'s depth.
pub(crate) unsafe fn multiply_packed<T: Float>(
    a: &PackedA<T>,
    b: &PackedB<T>,
    init: Init<'_, T>,
    c: *mut T,
    ldc: usize,
) {
    assert_eq!(a.depth, b.depth, "A and B depths differ");
    let out = kernel::Out {
        c,
        ldc,
        len: b.len,
        init,
    };
    dispatch(kernel::Product {
        a,
        b: kernel::Operand::Packed(b),
        out,
    })
}
