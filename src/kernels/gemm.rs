//! The one GEMM call site of the forward pass: `out_tile = weight_g · cols + bias`.
//!
//! Engine: matrixmultiply (its AVX-512/AVX2/FMA kernels are chosen at run time). A
//! hand-written AVX-512F `f32` kernel (12 pixels x 32 channels of `outᵀ` in registers, reading
//! the column tile in place, weights packed once per call) was measured against it on this
//! crate's workloads and was not materially faster (W2 +3..6%, W4 -5..+5%, dense W3 3x3 25%
//! slower, CPU-time medians on a shared 2-core machine), so it was not kept.

use crate::float::Float;

/// `out[o * rs + q] = bias[o] + sum_r a[o * depth + r] * cols[r * len + q]` for `o < rows`,
/// `q < len`: the tile's output for one conv group, with the bias fused by initialising the
/// output with it and accumulating into it (`beta = 1`); without bias the output is simply
/// overwritten (`beta = 0`, so stale or NaN contents are never read).
///
/// # Safety
/// `out` must address `rows` rows of `len` writable elements at row stride `rs` (elements),
/// exclusively owned by the caller for the duration of the call and disjoint from `a`, `cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn multiply_tile<T: Float>(
    a: &[T],
    rows: usize,
    depth: usize,
    cols: &[T],
    len: usize,
    bias: Option<&[T]>,
    out: *mut T,
    rs: usize,
) {
    debug_assert!(a.len() >= rows * depth);
    debug_assert!(cols.len() >= depth * len);
    let beta = match bias {
        Some(b) => {
            debug_assert!(b.len() >= rows);
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
    // SAFETY: `a` is rows x depth row-major, `cols` depth x len row-major (both checked
    // above), and `out` is rows x len at row stride `rs`, owned exclusively (caller contract).
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
            len as isize,
            1,
            beta,
            out,
            rs as isize,
            1,
        )
    }
}
