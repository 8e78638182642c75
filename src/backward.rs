//! The fast backward pass: one function per gradient, and a combined backward that computes any
//! chosen subset in one pass, sharing the column gradient and the sampling between them.
//!
//! With `G = grad_out`, `gcol[c, k, n, y, x] = sum_{o in group(c)} weight[o, c', k] * G[n, o, y, x]`
//! and the sample of tap `k` at `(y, x)` at position `(py, px)` with mask `m` (`../DESIGN.md` §3):
//!
//! ```text
//! grad_input[n, c, r, s]        = sum_{k, y, x} gcol * m * dB/dv(r, s)
//! grad_offset[n, 2(gK+k), y, x] = sum_{c in g} gcol * m * Wy        (+1: Wx)
//! grad_mask[n, gK+k, y, x]      = sum_{c in g} gcol * B(input[n, c], py, px)
//! grad_weight[o, c', k]         = sum_{n, y, x} G[n, o, y, x] * m * B(input[n, c], py, px)
//! grad_bias[o]                  = sum_{n, y, x} G[n, o, y, x]
//! ```
//!
//! `B`, `Wy`, `Wx` and which samples count follow `params.convention` ([`Convention`]): by default
//! torchvision's (`Wy`, `Wx` the one-sided derivatives, forward difference at integer positions,
//! no window cut-off); mmcv's cuts `Wy`, `Wx` off outside the window; DCN v1's has the window
//! `0 <= p < size` and collapses the corners of the last row and column (the collapsed pixel
//! receives the full weight in `grad_input`). The dense backward ignores the convention: it
//! samples integer positions only, where all of them agree.
//!
//! **Determinism.** The work is split by a partition that depends only on the shapes (see
//! `driver`): every output element has one owner task, sums over channels run in a fixed order
//! inside that task (ascending; on the deformable, pixel-major path one running sum per vector
//! lane, reduced by a fixed tree per backend), and `grad_weight` is a fixed number of partials added in fixed order.
//! Results are bitwise identical for any rayon thread count, and the combined backward returns
//! bitwise the same tensors as the separate functions.
//!
//! **Non-finite values.** A NaN offset makes its sample NaN: NaN in the `grad_offset`,
//! `grad_mask` and `grad_weight` entries it contributes to, nothing sent to `grad_input`.
//! Infinite or huge offsets put the sample outside the image (contributing 0). NaN or infinity
//! in the other tensors propagates by ordinary arithmetic into the outputs they feed.
//!
//! **Workspace.** Per running task: the offset group's padded input and `grad_input` planes of
//! one image group, a column tile and a column-gradient tile of at most 512 pixels (on the
//! deformable path as many pixels as 512 KiB of `f32` hold), a packed `grad_out` tile and the tile's sampling
//! table; plus, for `grad_weight`, at most `R - 1 <= 3` weight-sized partials (one more if the
//! caller's `grad_weight` view is not row-major; `R` partials and a packed tap-major copy of the
//! weight on the deformable path). None of it grows with the batch size
//! (`examples/workspace_probe.rs` measures the peak).
//!
//! **Kept between calls.** To spare the page faults of fresh multi-megabyte buffers, each
//! thread keeps up to 32 MiB of scratch (tiles, planes, packed weights; the forward's too) for
//! the next call (W4, 2 threads: about 36 MiB in all; W2: 26-30 MiB); [`release_cached_scratch`]
//! frees it.
//!
//! **Limits.** The deformable backward refuses input planes of more than `2^30 - 1` cells with
//! their border, `(H + 2) * (W + 3)`, with [`Error::TooLarge`]: a task addresses its planes with
//! `i32` indices (the forward likewise refuses planes past `2^31 - 1` pixels).
//!
//! Threads come from the caller's rayon pool (`ThreadPool::install`), else from the crate's own
//! pool, which survives `fork` (`crate::pool`).

mod driver;
mod gemms;
mod operands;
use crate::plan::backward as plan;
mod planes;
mod problem;
mod tables;
mod task;
mod weights;

use ndarray::{Array1, Array4, ArrayView4, ArrayViewMut1, ArrayViewMut4};

use crate::error::{Error, Result};
use crate::float::Float;
use crate::geometry::Geometry;
use crate::params::ConvParams;

use crate::row_major::row_major;
use problem::{dims, grad_bias_into, Operand, Problem, Tensors};

/// Which gradients a combined backward computes.
///
/// ```
/// use deformconv::Want;
/// let w = Want::NONE.input().weight();
/// assert!(w.input && w.weight && !w.offset);
/// assert_eq!(Want::ALL, Want::NONE.input().offset().mask().weight().bias());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Want {
    /// `grad_input`.
    pub input: bool,
    /// `grad_offset` (ignored by the dense backward).
    pub offset: bool,
    /// `grad_mask` (ignored by the dense backward).
    pub mask: bool,
    /// `grad_weight`.
    pub weight: bool,
    /// `grad_bias`.
    pub bias: bool,
}

impl Want {
    /// No gradient.
    pub const NONE: Want = Want {
        input: false,
        offset: false,
        mask: false,
        weight: false,
        bias: false,
    };
    /// Every gradient.
    pub const ALL: Want = Want {
        input: true,
        offset: true,
        mask: true,
        weight: true,
        bias: true,
    };
    /// Also `grad_input`.
    pub const fn input(mut self) -> Want {
        self.input = true;
        self
    }
    /// Also `grad_offset`.
    pub const fn offset(mut self) -> Want {
        self.offset = true;
        self
    }
    /// Also `grad_mask`.
    pub const fn mask(mut self) -> Want {
        self.mask = true;
        self
    }
    /// Also `grad_weight`.
    pub const fn weight(mut self) -> Want {
        self.weight = true;
        self
    }
    /// Also `grad_bias`.
    pub const fn bias(mut self) -> Want {
        self.bias = true;
        self
    }
}

/// The gradients a backward computed; `None` for those not asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads<T> {
    /// `grad_input`, `[N, C_in, H, W]`.
    pub input: Option<Array4<T>>,
    /// `grad_offset`, `[N, 2 G_off K, H_out, W_out]`.
    pub offset: Option<Array4<T>>,
    /// `grad_mask`, `[N, G_off K, H_out, W_out]`.
    pub mask: Option<Array4<T>>,
    /// `grad_weight`, `[C_out, C_in / groups, kh, kw]`.
    pub weight: Option<Array4<T>>,
    /// `grad_bias`, `[C_out]`.
    pub bias: Option<Array1<T>>,
}

/// Caller-provided outputs of a combined backward: the gradients whose view is `Some` are
/// computed, each view (any strides) fully overwritten.
#[derive(Debug, Default)]
pub struct GradsMut<'a, T> {
    /// `grad_input`, `[N, C_in, H, W]`.
    pub input: Option<ArrayViewMut4<'a, T>>,
    /// `grad_offset`, `[N, 2 G_off K, H_out, W_out]`.
    pub offset: Option<ArrayViewMut4<'a, T>>,
    /// `grad_mask`, `[N, G_off K, H_out, W_out]`.
    pub mask: Option<ArrayViewMut4<'a, T>>,
    /// `grad_weight`, `[C_out, C_in / groups, kh, kw]`.
    pub weight: Option<ArrayViewMut4<'a, T>>,
    /// `grad_bias`, `[C_out]`.
    pub bias: Option<ArrayViewMut1<'a, T>>,
}

/// Every gradient of the deformable convolution selected by `want`, in one pass that shares the
/// column gradient `weightᵀ · grad_out` and the sampling between them (see the module docs for
/// the formulas). Gradients not wanted are `None` and are neither computed nor allocated;
/// `want.mask` without a `mask` gives the gradient with respect to a unit mask.
pub fn deform_conv2d_backward<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    want: Want,
) -> Result<Grads<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask,
            weight: Operand::View(weight),
        },
        params,
    )?;
    p.solve(want)
}

/// [`deform_conv2d_backward`] into caller-provided outputs: the gradients whose view is `Some`.
pub fn deform_conv2d_backward_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: GradsMut<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask,
            weight: Operand::View(weight),
        },
        params,
    )?;
    p.solve_checked(out).map(|_| ())
}

/// `grad_input[n, c, r, s] = sum_{k, y, x} gcol[c, k, n, y, x] * m * dB/dv(r, s)`: each sample
/// hands its column gradient, times the mask, to the corners it read with the forward's
/// bilinear weights. `input_shape = [N, C_in, H, W]`.
pub fn deform_conv2d_grad_input<T: Float>(
    grad_out: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    input_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::Shape(input_shape),
            offset: Some(offset),
            mask,
            weight: Operand::View(weight),
        },
        params,
    )?;
    Ok(p.solve(Want::NONE.input())?.input.unwrap_or_default())
}

/// [`deform_conv2d_grad_input`] into `out` (`[N, C_in, H, W]`, any strides).
pub fn deform_conv2d_grad_input_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::Shape(dims(out.shape())),
            offset: Some(offset),
            mask,
            weight: Operand::View(weight),
        },
        params,
    )?;
    let out = GradsMut {
        input: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_offset[n, 2(gK+k), y, x] = sum_{c in g} gcol * m * Wy` and `[.., 2(gK+k)+1, ..]` with
/// `Wx`: the bilinear derivatives of `params.convention` (by default torchvision's one-sided
/// ones, no window cut-off, corners outside the image reading 0; see [`Convention`](crate::Convention)).
pub fn deform_conv2d_grad_offset<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask,
            weight: Operand::View(weight),
        },
        params,
    )?;
    Ok(p.solve(Want::NONE.offset())?.offset.unwrap_or_default())
}

/// [`deform_conv2d_grad_offset`] into `out` (`[N, 2 G_off K, H_out, W_out]`, any strides).
pub fn deform_conv2d_grad_offset_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask,
            weight: Operand::View(weight),
        },
        params,
    )?;
    let out = GradsMut {
        offset: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_mask[n, gK+k, y, x] = sum_{c in g} gcol[c, k, n, y, x] * B(input[n, c], py, px)`. It does
/// not depend on the mask, so none is taken.
pub fn deform_conv2d_grad_mask<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask: None,
            weight: Operand::View(weight),
        },
        params,
    )?;
    Ok(p.solve(Want::NONE.mask())?.mask.unwrap_or_default())
}

/// [`deform_conv2d_grad_mask`] into `out` (`[N, G_off K, H_out, W_out]`, any strides).
pub fn deform_conv2d_grad_mask_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask: None,
            weight: Operand::View(weight),
        },
        params,
    )?;
    let out = GradsMut {
        mask: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_weight[o, c', i, j] = sum_{n, y, x} grad_out[n, o, y, x] * m * B(input[n, c], py, px)`,
/// i.e. `grad_out · colsᵀ`; `weight_shape = [C_out, C_in / groups, kh, kw]`.
pub fn deform_conv2d_grad_weight<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask,
            weight: Operand::Shape(weight_shape),
        },
        params,
    )?;
    Ok(p.solve(Want::NONE.weight())?.weight.unwrap_or_default())
}

/// [`deform_conv2d_grad_weight`] into `out` (`[C_out, C_in / groups, kh, kw]`, any strides).
pub fn deform_conv2d_grad_weight_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: Some(offset),
            mask,
            weight: Operand::Shape(dims(out.shape())),
        },
        params,
    )?;
    let out = GradsMut {
        weight: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// `grad_bias[o] = sum_{n, y, x} grad_out[n, o, y, x]` (the same for the dense convolution).
pub fn deform_conv2d_grad_bias<T: Float>(grad_out: ArrayView4<'_, T>) -> Result<Array1<T>> {
    let mut out = Array1::from_elem(grad_out.shape()[1], T::ZERO);
    deform_conv2d_grad_bias_into(grad_out, out.view_mut())?;
    Ok(out)
}

/// [`deform_conv2d_grad_bias`] into `out` (`[C_out]`, any stride).
pub fn deform_conv2d_grad_bias_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    out: ArrayViewMut1<'_, T>,
) -> Result<()> {
    let s = dims(grad_out.shape());
    if out.len() != s[1] {
        return Err(Error::Shape {
            tensor: "grad_bias",
            axis: "elements",
            expected: format!("grad_out channels = {}", s[1]),
            got: out.len(),
        });
    }
    let g = Geometry {
        n: s[0],
        c_out: s[1],
        h_out: s[2],
        w_out: s[3],
        ..Geometry::new([1, 1, 1, 1], [1, 1, 1, 1], &ConvParams::default())?
    };
    grad_bias_into(&g, &row_major(&grad_out), out);
    Ok(())
}

/// The gradients of the dense (strided, dilated, grouped) convolution selected by `want`
/// (`want.offset` and `want.mask` are ignored and their fields are `None`): the deformable
/// formulas with zero offsets and a unit mask.
pub fn conv2d_backward<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    want: Want,
) -> Result<Grads<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: None,
            mask: None,
            weight: Operand::View(weight),
        },
        params,
    )?;
    p.solve(want)
}

/// [`conv2d_backward`] into caller-provided outputs (`offset` and `mask` must be `None`).
pub fn conv2d_backward_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: GradsMut<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: None,
            mask: None,
            weight: Operand::View(weight),
        },
        params,
    )?;
    p.solve_checked(out).map(|_| ())
}

/// Dense `grad_input[n, c, r, s] = sum_{o, i, j : r = y sh - pad_top + i dh, s = x sw - pad_left + j dw}
/// weight[o, c', i, j] * grad_out[n, o, y, x]` (col2im of `weightᵀ · grad_out`).
pub fn conv2d_grad_input<T: Float>(
    grad_out: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    input_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::Shape(input_shape),
            offset: None,
            mask: None,
            weight: Operand::View(weight),
        },
        params,
    )?;
    Ok(p.solve(Want::NONE.input())?.input.unwrap_or_default())
}

/// [`conv2d_grad_input`] into `out` (`[N, C_in, H, W]`, any strides).
pub fn conv2d_grad_input_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::Shape(dims(out.shape())),
            offset: None,
            mask: None,
            weight: Operand::View(weight),
        },
        params,
    )?;
    let out = GradsMut {
        input: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// Dense `grad_weight[o, c', i, j] = sum_{n, y, x} grad_out[n, o, y, x] * input[n, c, y sh - pad_top + i dh, x sw - pad_left + j dw]`
/// (`grad_out · im2colᵀ`; pixels outside the image read 0).
pub fn conv2d_grad_weight<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: None,
            mask: None,
            weight: Operand::Shape(weight_shape),
        },
        params,
    )?;
    Ok(p.solve(Want::NONE.weight())?.weight.unwrap_or_default())
}

/// [`conv2d_grad_weight`] into `out` (`[C_out, C_in / groups, kh, kw]`, any strides).
pub fn conv2d_grad_weight_into<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    params: &ConvParams,
    out: ArrayViewMut4<'_, T>,
) -> Result<()> {
    let p = Problem::new(
        Tensors {
            grad_out,
            input: Operand::View(input),
            offset: None,
            mask: None,
            weight: Operand::Shape(dims(out.shape())),
        },
        params,
    )?;
    let out = GradsMut {
        weight: Some(out),
        ..GradsMut::default()
    };
    p.solve_checked(out).map(|_| ())
}

/// Frees the scratch buffers the backward keeps between calls (at most 32 MiB per thread) on
/// every thread of the pool the crate computes on and on the calling thread. Call it from inside
/// `ThreadPool::install` for a pool of your own. The next backward allocates them again.
pub fn release_cached_scratch() {
    crate::scratch::clear_all();
}

#[cfg(test)]
mod tests;
