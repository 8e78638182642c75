//! NHWC entry points (TensorFlow's default `data_format`, Keras `channels_last`): the forward
//! and every gradient, for activations stored `[N, H, W, C]` and weights in any
//! [`WeightLayout`] (TensorFlow and Keras: [`WeightLayout::Hwio`]).
//!
//! Each function is a conversion around the NCHW fast path: the operands are transposed to
//! NCHW / OIHW ([`nhwc_to_nchw`], [`to_oihw`]), the crate-root function of the same name runs,
//! and its results are transposed back ([`nchw_to_nhwc`], [`from_oihw`]). The numbers are
//! therefore bitwise those of the NCHW path on the transposed tensors (same determinism, same
//! non-finite behaviour, same errors); the price is one copy of each operand and result
//! (measured by `benches/layout.rs`).
//!
//! # Layouts
//!
//! With `K = kh * kw` taps, tap `k = i * kw + j`, offset group `g`, and `d = 0` for the row
//! offset `dy`, `d = 1` for the column offset `dx`:
//!
//! | tensor                | shape                            | element                                   |
//! |-----------------------|----------------------------------|-------------------------------------------|
//! | input, `grad_input`   | `[N, H, W, C_in]`                | `input[n, r, s, c]`                       |
//! | offset, `grad_offset` | `[N, H_out, W_out, 2 G_off K]`   | `offset[n, y, x, 2 (g K + k) + d]`        |
//! | mask, `grad_mask`     | `[N, H_out, W_out, G_off K]`     | `mask[n, y, x, g K + k]`                  |
//! | output, `grad_out`    | `[N, H_out, W_out, C_out]`       | `out[n, y, x, o]`                         |
//! | weight, `grad_weight` | the given [`WeightLayout`]       | e.g. `Hwio`: `weight[i, j, c', o]`        |
//! | bias, `grad_bias`     | `[C_out]`                        | `bias[o]`                                 |
//!
//! So the last axis of the offsets and mask holds torchvision's channels
//! ([`crate::offset_layout::OffsetLayout::InterleavedYx`]): `nhwc_to_nchw(offset)` is exactly
//! the NCHW offset tensor of [`crate::deform_conv2d`]. What TensorFlow-side deformable
//! implementations use (see [`crate::layout`] and [`crate::offset_layout`] for the sources):
//! - the ops built on the MSRA CUDA kernels (Zardinality's `TF-deformable-conv`) and the
//!   `DeformableConv2D` proposed for TensorFlow Addons accept NCHW only: call the crate-root
//!   functions directly;
//! - the Keras `DeformableConvLayer` of DHZS `tf-deformable-conv-layer` keeps NHWC offsets
//!   `[N, H_out, W_out, 2 K G]` as `(dy, dx)` pairs at pair index `k G + g`; with one offset
//!   group that is the order above and its tensor can be passed as is (with more groups, or
//!   near the border, that layer computes something else: it splits output channels and
//!   clamps positions);
//! - Ascend (`torch_npu.npu_deformable_conv2d`) packs offsets and mask in NHWC
//!   `[N, H_out, W_out, 3 G K]`: convert with [`nhwc_to_nchw`], split with
//!   [`crate::offset_layout::unpack_offset_mask`] (`XyMaskBlocks`), then use the NCHW functions.
//!
//! Weights stored flipped (Theano, Lasagne `Conv2DLayer`) are converted once with
//! [`to_oihw`] and passed as [`WeightLayout::Oihw`]. `grad_weight` comes back in the layout
//! the weight was given in; `input_shape` and `weight_shape` arguments are in the caller's
//! layouts too.
//!
//! ```
//! use deformconv::layout::WeightLayout;
//! use deformconv::{nhwc, ConvParams};
//! use ndarray::Array4;
//! // A Keras 3x3 conv from 2 to 4 channels on one 5x5 NHWC image, padding 1 ("same").
//! let input = Array4::from_elem((1, 5, 5, 2), 1.0f32);
//! let kernel = Array4::from_elem((3, 3, 2, 4), 0.5f32); // HWIO
//! let params = ConvParams::default().padding(1, 1);
//! let out = nhwc::conv2d(input.view(), kernel.view(), WeightLayout::Hwio, None, &params).unwrap();
//! assert_eq!(out.shape(), &[1, 5, 5, 4]);
//! assert_eq!(out[[0, 2, 2, 3]], 9.0); // 3 * 3 taps * 2 channels * 0.5
//! assert_eq!(out[[0, 0, 0, 0]], 4.0); // a corner sees 2 * 2 taps
//! ```

use ndarray::{Array1, Array4, ArrayView1, ArrayView4, CowArray, Ix4};

use crate::backward::{Grads, Want};
use crate::error::{Error, Result};
use crate::float::Float;
use crate::layout::{
    from_oihw, nchw_to_nhwc, nhwc_to_nchw, oihw_shape, to_oihw, Flip, WeightLayout,
};
use crate::params::ConvParams;

/// `[N, H, W, C]` to `[N, C, H, W]`.
const fn nchw_shape([n, h, w, c]: [usize; 4]) -> [usize; 4] {
    [n, c, h, w]
}

/// Our OIHW weight, borrowed when `layout` already is OIHW.
fn oihw<'a, T: Float>(weight: ArrayView4<'a, T>, layout: WeightLayout) -> CowArray<'a, T, Ix4> {
    match layout {
        WeightLayout::Oihw => CowArray::from(weight),
        _ => CowArray::from(to_oihw(weight, layout, Flip::None)),
    }
}

/// A weight in `layout` from our OIHW one.
fn weight_back<T: Float>(weight: Array4<T>, layout: WeightLayout) -> Array4<T> {
    match layout {
        WeightLayout::Oihw => weight,
        _ => from_oihw(weight.view(), layout, Flip::None),
    }
}

/// The name of our OIHW weight axis `axis` (0 = O, 1 = I, 2 = H, 3 = W) in `layout`, with its
/// position there, for error messages.
fn weight_axis_name(layout: WeightLayout, axis: usize) -> &'static str {
    const NAMES: [[&str; 4]; 4] = [
        [
            "output channels (axis 0)",
            "output channels (axis 1)",
            "output channels (axis 2)",
            "output channels (axis 3)",
        ],
        [
            "input channels per group (axis 0)",
            "input channels per group (axis 1)",
            "input channels per group (axis 2)",
            "input channels per group (axis 3)",
        ],
        [
            "kernel rows (axis 0)",
            "kernel rows (axis 1)",
            "kernel rows (axis 2)",
            "kernel rows (axis 3)",
        ],
        [
            "kernel columns (axis 0)",
            "kernel columns (axis 1)",
            "kernel columns (axis 2)",
            "kernel columns (axis 3)",
        ],
    ];
    // Where each of our axes sits in `layout`: the OIHW shape of a weight whose extents are
    // its own axis numbers.
    let position = oihw_shape([0, 1, 2, 3], layout);
    NAMES[axis & 3][position[axis & 3]]
}

/// Rewrites a weight shape error of the NCHW path so that its axis is named as in `layout`.
fn in_layout(err: Error, layout: WeightLayout) -> Error {
    const OURS: [&str; 4] = [
        "output channels (axis 0)",
        "input channels per group (axis 1)",
        "kernel rows (axis 2)",
        "kernel columns (axis 3)",
    ];
    match err {
        Error::Shape {
            tensor: tensor @ "weight",
            axis,
            expected,
            got,
        } => {
            let axis = match OURS.iter().position(|&a| a == axis) {
                Some(i) => weight_axis_name(layout, i),
                None => axis,
            };
            Error::Shape {
                tensor,
                axis,
                expected,
                got,
            }
        }
        other => other,
    }
}

/// NHWC results of an NCHW backward: activations transposed, `grad_weight` into `layout`.
fn grads_back<T: Float>(g: Grads<T>, layout: WeightLayout) -> Grads<T> {
    let nhwc = |a: Array4<T>| nchw_to_nhwc(a.view());
    Grads {
        input: g.input.map(nhwc),
        offset: g.offset.map(nhwc),
        mask: g.mask.map(nhwc),
        weight: g.weight.map(|w| weight_back(w, layout)),
        bias: g.bias,
    }
}

/// [`crate::deform_conv2d`] on NHWC tensors: input `[N, H, W, C_in]`, offset
/// `[N, H_out, W_out, 2 G_off K]`, mask `[N, H_out, W_out, G_off K]`, weight in `layout`;
/// returns `[N, H_out, W_out, C_out]`:
///
/// ```text
/// out[n, y, x, o] = bias[o] + sum_{c', i, j} w[o, c', i, j] * mask[n, y, x, gK + k] * B(input[n, ., ., c], py, px)
/// py = y * stride_h - pad_top + i * dil_h + offset[n, y, x, 2 (gK + k)],  px likewise with + 1
/// ```
pub fn deform_conv2d<T: Float>(
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let mask = mask.map(nhwc_to_nchw);
    let out = crate::forward::deform_conv2d(
        nhwc_to_nchw(input).view(),
        nhwc_to_nchw(offset).view(),
        mask.as_ref().map(|m| m.view()),
        oihw(weight, layout).view(),
        bias,
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(nchw_to_nhwc(out.view()))
}

/// [`crate::conv2d`] on NHWC tensors: input `[N, H, W, C_in]`, weight in `layout` (TensorFlow
/// `tf.nn.conv2d` with [`WeightLayout::Hwio`] filters); returns `[N, H_out, W_out, C_out]`.
pub fn conv2d<T: Float>(
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let out = crate::forward::conv2d(
        nhwc_to_nchw(input).view(),
        oihw(weight, layout).view(),
        bias,
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(nchw_to_nhwc(out.view()))
}

/// [`crate::deform_conv2d_backward`] on NHWC tensors: the gradients selected by `want`, each in
/// its operand's layout (activations, offsets and mask NHWC, `grad_weight` in `layout`).
#[allow(clippy::too_many_arguments)]
pub fn deform_conv2d_backward<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    params: &ConvParams,
    want: Want,
) -> Result<Grads<T>> {
    let mask = mask.map(nhwc_to_nchw);
    let g = crate::backward::deform_conv2d_backward(
        nhwc_to_nchw(grad_out).view(),
        nhwc_to_nchw(input).view(),
        nhwc_to_nchw(offset).view(),
        mask.as_ref().map(|m| m.view()),
        oihw(weight, layout).view(),
        params,
        want,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(grads_back(g, layout))
}

/// [`crate::deform_conv2d_grad_input`] on NHWC tensors; `input_shape = [N, H, W, C_in]`,
/// returns `[N, H, W, C_in]`.
pub fn deform_conv2d_grad_input<T: Float>(
    grad_out: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    input_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let mask = mask.map(nhwc_to_nchw);
    let g = crate::backward::deform_conv2d_grad_input(
        nhwc_to_nchw(grad_out).view(),
        nhwc_to_nchw(offset).view(),
        mask.as_ref().map(|m| m.view()),
        oihw(weight, layout).view(),
        nchw_shape(input_shape),
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(nchw_to_nhwc(g.view()))
}

/// [`crate::deform_conv2d_grad_offset`] on NHWC tensors; returns `[N, H_out, W_out, 2 G_off K]`
/// (the offsets' layout).
pub fn deform_conv2d_grad_offset<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let mask = mask.map(nhwc_to_nchw);
    let g = crate::backward::deform_conv2d_grad_offset(
        nhwc_to_nchw(grad_out).view(),
        nhwc_to_nchw(input).view(),
        nhwc_to_nchw(offset).view(),
        mask.as_ref().map(|m| m.view()),
        oihw(weight, layout).view(),
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(nchw_to_nhwc(g.view()))
}

/// [`crate::deform_conv2d_grad_mask`] on NHWC tensors; returns `[N, H_out, W_out, G_off K]`.
pub fn deform_conv2d_grad_mask<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let g = crate::backward::deform_conv2d_grad_mask(
        nhwc_to_nchw(grad_out).view(),
        nhwc_to_nchw(input).view(),
        nhwc_to_nchw(offset).view(),
        oihw(weight, layout).view(),
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(nchw_to_nhwc(g.view()))
}

/// [`crate::deform_conv2d_grad_weight`] on NHWC tensors; `weight_shape` is the weight's shape
/// in `layout` (e.g. `[kh, kw, C_in / groups, C_out]` for `Hwio`), and so is the result.
pub fn deform_conv2d_grad_weight<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight_shape: [usize; 4],
    layout: WeightLayout,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let mask = mask.map(nhwc_to_nchw);
    let g = crate::backward::deform_conv2d_grad_weight(
        nhwc_to_nchw(grad_out).view(),
        nhwc_to_nchw(input).view(),
        nhwc_to_nchw(offset).view(),
        mask.as_ref().map(|m| m.view()),
        oihw_shape(weight_shape, layout),
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(weight_back(g, layout))
}

/// `grad_bias[o] = sum_{n, y, x} grad_out[n, y, x, o]` for an NHWC `grad_out`, summed in the
/// same order as [`crate::deform_conv2d_grad_bias`] (bitwise its result on the transposed
/// tensor). The same for the dense convolution.
pub fn deform_conv2d_grad_bias<T: Float>(grad_out: ArrayView4<'_, T>) -> Result<Array1<T>> {
    crate::backward::deform_conv2d_grad_bias(nhwc_to_nchw(grad_out).view())
}

/// [`crate::conv2d_backward`] on NHWC tensors: the gradients selected by `want` (offset and
/// mask gradients are `None`), `grad_input` NHWC and `grad_weight` in `layout`.
pub fn conv2d_backward<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    params: &ConvParams,
    want: Want,
) -> Result<Grads<T>> {
    let g = crate::backward::conv2d_backward(
        nhwc_to_nchw(grad_out).view(),
        nhwc_to_nchw(input).view(),
        oihw(weight, layout).view(),
        params,
        want,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(grads_back(g, layout))
}

/// [`crate::conv2d_grad_input`] on NHWC tensors; `input_shape = [N, H, W, C_in]`, returns
/// `[N, H, W, C_in]`.
pub fn conv2d_grad_input<T: Float>(
    grad_out: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    layout: WeightLayout,
    input_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<T>> {
    let g = crate::backward::conv2d_grad_input(
        nhwc_to_nchw(grad_out).view(),
        oihw(weight, layout).view(),
        nchw_shape(input_shape),
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(nchw_to_nhwc(g.view()))
}

/// [`crate::conv2d_grad_weight`] on NHWC tensors; `weight_shape` and the result are in `layout`.
pub fn conv2d_grad_weight<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    weight_shape: [usize; 4],
    layout: WeightLayout,
    params: &ConvParams,
) -> Result<Array4<T>> {
    let g = crate::backward::conv2d_grad_weight(
        nhwc_to_nchw(grad_out).view(),
        nhwc_to_nchw(input).view(),
        oihw_shape(weight_shape, layout),
        params,
    )
    .map_err(|e| in_layout(e, layout))?;
    Ok(weight_back(g, layout))
}
