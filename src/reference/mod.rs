//! The reference oracle: forward and every gradient as plain loops straight from the formulas,
//! accumulating in `f64` whatever the input type.
//!
//! This module is what the fast path, and other projects' kernels, are judged against. It shares
//! nothing with the fast path except shape validation ([`Geometry`]): no im2col, no GEMM, no
//! tiling, no SIMD. It is slow on purpose, and meant to be read.
//!
//! Notation (torchvision's): image `n`, output channel `o`, input channel `c` with index
//! `c' = c mod (C_in / groups)` inside its group, kernel tap `k = i * kw + j`, output pixel
//! `(y, x)`, offset group `g(c) = c / (C_in / G_off)`. The sample of tap `k` at `(y, x)` sits at
//!
//! ```text
//! py = y * stride_h - pad_top  + i * dil_h + offset[n, 2 (g K + k),     y, x]
//! px = x * stride_w - pad_left + j * dil_w + offset[n, 2 (g K + k) + 1, y, x]
//! ```
//!
//! and is weighted by `m = mask[n, g K + k, y, x]` (1 without a mask). Positions are exact:
//! the integer part `y * stride_h - pad_top + i * dil_h` is formed in `i128` and the offset is
//! split into `floor(offset)` and its fraction, so `py` is never rounded (`Coord`).
//!
//! Bilinear sampling `B(v, py, px)` under the default
//! [`Convention::Torchvision`](crate::Convention::Torchvision): 0 unless `-1 < py < H` and
//! `-1 < px < W`; otherwise with `y0 = floor(py)`, `x0 = floor(px)`, `ly = py - y0`,
//! `lx = px - x0`,
//! `B = (1-ly)(1-lx) v[y0,x0] + (1-ly) lx v[y0,x0+1] + ly (1-lx) v[y0+1,x0] + ly lx v[y0+1,x0+1]`,
//! where pixels outside the image read 0. A NaN position gives `B = NaN` and touches no pixel.
//!
//! `params.convention` selects another border rule ([`Convention::Mmcv`](crate::Convention::Mmcv),
//! [`Convention::DcnV1`](crate::Convention::DcnV1)); every function here follows it, forward and
//! backward, and the three private rules `counts`, `cell` and `coordinate_weights` are where
//! they differ.

use ndarray::ArrayView4;

use crate::error::Result;
use crate::float::Float;
use crate::geometry::Geometry;
use crate::params::ConvParams;

// The sample of one tap and the conventions' rules for reading it (`sampling`); the operands in
// `f64` and the split of the sums into parallel tasks (`parallel`); the forward (`forward`) and
// the gradients (`backward`) written on them.
mod backward;
mod forward;
mod parallel;
mod sampling;

pub use backward::{grad_bias, grad_input, grad_mask, grad_offset, grad_weight};
pub(crate) use backward::{sample_sums, SampleSum};
pub use forward::{conv2d, deform_conv2d};
pub(crate) use sampling::{bilinear, coordinate_weights, corners, Coord};

fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// Validates the operands of a deformable convolution and returns its geometry.
fn deform_geometry<T: Float>(
    input_shape: [usize; 4],
    weight_shape: [usize; 4],
    offset: &ArrayView4<'_, T>,
    mask: Option<&ArrayView4<'_, T>>,
    params: &ConvParams,
) -> Result<Geometry> {
    let g = Geometry::new(input_shape, weight_shape, params)?;
    g.check_offset(offset.shape())?;
    if let Some(m) = mask {
        g.check_mask(m.shape())?;
    }
    Ok(g)
}
