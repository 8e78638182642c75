//! The one GEMM call site of the forward pass: `out_tile = weight_g · cols + bias`.
//!
//! Engines, chosen once per call by [`TileGemm::new`]:
//! - `f32` on a CPU with AVX-512F: our own kernel ([`super::sgemm`]), the weight packed once per
//!   call and shared by every tile. On this crate's workloads it is 1.5–2.5x matrixmultiply's
//!   sgemm on the same tiles (matrixmultiply repacks the weight per call; see the issue notes).
//! - otherwise (`f64`, or no AVX-512): matrixmultiply, which picks its own AVX2/FMA kernels.
//!
//! Both fuse the bias: the sum starts from it, there is no second pass over the output.

use std::any::TypeId;

use crate::float::Float;
use crate::kernels::lanes::{isa, Isa};

#[cfg(target_arch = "x86_64")]
use super::sgemm;

/// The weight of a call, ready for the tiles: `groups` blocks of `rows x depth` (row-major).
pub(crate) struct TileGemm<'a, T> {
    weight: &'a [T],
    rows: usize,
    depth: usize,
    /// Per group, the packed weight when the AVX-512 `f32` kernel is used.
    #[cfg(target_arch = "x86_64")]
    packed: Option<Vec<sgemm::PackedA>>,
}

/// Per-thread scratch of [`TileGemm::multiply_tile`].
#[derive(Debug, Default)]
pub(crate) struct GemmScratch {
    packed_b: Vec<f32>,
}

impl<'a, T: Float> TileGemm<'a, T> {
    /// Prepares `weight` (`groups * rows * depth` elements): packs it for the AVX-512 kernel
    /// when that kernel applies.
    pub(crate) fn new(weight: &'a [T], groups: usize, rows: usize, depth: usize) -> Self {
        debug_assert!(weight.len() >= groups * rows * depth);
        #[cfg(target_arch = "x86_64")]
        let packed =
            (TypeId::of::<T>() == TypeId::of::<f32>() && isa() == Isa::Avx512).then(|| {
                // SAFETY: T is f32 (checked just above), so the slice is the same memory as f32.
                let w = unsafe {
                    std::slice::from_raw_parts(weight.as_ptr() as *const f32, weight.len())
                };
                (0..groups)
                    .map(|g| {
                        sgemm::PackedA::pack(&w[g * rows * depth..][..rows * depth], rows, depth)
                    })
                    .collect()
            });
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (TypeId::of::<T>(), isa(), Isa::Scalar);
        TileGemm {
            weight,
            rows,
            depth,
            #[cfg(target_arch = "x86_64")]
            packed,
        }
    }

    /// `out[o * rs + q] = bias[o] + sum_r weight_g[o, r] * cols[r * ld + q]` for
    /// `o < rows`, `q < len`: the tile's output for conv group `group`. Without bias the output
    /// is overwritten without being read (stale or NaN contents never leak in).
    ///
    /// # Safety
    /// `cols` holds `depth` rows of `len` elements at stride `ld`; `out` addresses `rows` rows
    /// of `len` writable elements at row stride `rs`, exclusively owned by the caller for the
    /// duration of the call and disjoint from the weight, `cols` and `bias`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn multiply_tile(
        &self,
        group: usize,
        cols: &[T],
        ld: usize,
        len: usize,
        bias: Option<&[T]>,
        out: *mut T,
        rs: usize,
        scratch: &mut GemmScratch,
    ) {
        let (rows, depth) = (self.rows, self.depth);
        debug_assert!(len == 0 || cols.len() >= (depth.max(1) - 1) * ld + len);
        debug_assert!(bias.is_none_or(|b| b.len() >= rows));
        #[cfg(target_arch = "x86_64")]
        if let Some(packed) = &self.packed {
            let cast = |s: &[T]| {
                // SAFETY: `packed` exists only when T is f32, so the memory is f32.
                unsafe { std::slice::from_raw_parts(s.as_ptr() as *const f32, s.len()) }
            };
            // SAFETY: AVX-512F was detected when `packed` was made; regions per the contract.
            unsafe {
                sgemm::multiply(
                    &packed[group],
                    sgemm::MatB {
                        data: cast(cols),
                        rs: ld,
                        cs: 1,
                    },
                    len,
                    bias.map(cast).map_or(sgemm::Init::Zero, sgemm::Init::Bias),
                    out as *mut f32,
                    rs,
                    &mut scratch.packed_b,
                )
            };
            return;
        }
        let _ = &scratch;
        let a = &self.weight[group * rows * depth..][..rows * depth];
        let beta = match bias {
            Some(b) => {
                for (o, &bo) in b.iter().enumerate().take(rows) {
                    for q in 0..len {
                        // SAFETY: o < rows and q < len, inside the region the caller owns.
                        unsafe { *out.add(o * rs + q) = bo };
                    }
                }
                T::ONE
            }
            None => T::ZERO,
        };
        // SAFETY: `a` is rows x depth row-major, `cols` depth x len at row stride `ld`, and
        // `out` rows x len at row stride `rs`, owned exclusively (caller contract).
        unsafe {
            T::gemm(
                rows,
                depth,
                len,
                T::ONE,
                a.as_ptr(),
                depth as isize,
                1,
                cols.as_ptr(),
                ld as isize,
                1,
                beta,
                out,
                rs as isize,
                1,
            )
        }
    }
}
