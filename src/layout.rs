//! Weight and tensor layouts of other frameworks, converted to and from ours.
//!
//! This crate computes on **OIHW** weights `[C_out, C_in / groups, kh, kw]` applied as a
//! cross-correlation, and **NCHW** tensors. Other frameworks store the same numbers in other
//! orders, and some store the kernel rotated by 180 degrees because they apply it as a true
//! convolution. The functions here convert, so that nobody swaps axes by hand:
//!
//! | framework, layer                                           | [`WeightLayout`] | [`Flip`]  |
//! |------------------------------------------------------------|------------------|-----------|
//! | PyTorch `nn.Conv2d`, torchvision `deform_conv2d`, ONNX `Conv`/`DeformConv`, MindSpore `deformable_conv2d`, mmcv | `Oihw` | `None` |
//! | Theano `conv2d(filter_flip=False)`                         | `Oihw`           | `None`    |
//! | Theano `conv2d` default (`filter_flip=True`)               | `Oihw`           | `Spatial` |
//! | Lasagne `Conv2DLayer` default (`flip_filters=True`)        | `Oihw`           | `Spatial` |
//! | Lasagne `DilatedConv2DLayer` (always `flip_filters=False`) | `Iohw`           | `None`    |
//! | TensorFlow `tf.nn.conv2d`, Keras `Conv2D`                  | `Hwio`           | `None`    |
//! | TensorFlow Lite `CONV_2D`                                  | `Ohwi`           | `None`    |
//!
//! Activations: TensorFlow (and Keras with `channels_last`) holds **NHWC** tensors; use
//! [`nhwc_to_nchw`] and [`nchw_to_nhwc`]. The same two functions move offsets and masks of
//! NHWC deformable implementations to and from NCHW; what their channels then mean is the
//! business of [`crate::offset_layout`]:
//! - the TensorFlow deformable ops built on the MSRA CUDA kernels (Zardinality's
//!   `TF-deformable-conv`) and the `DeformableConv2D` op proposed for TensorFlow Addons
//!   (Licht-T's branch) accept NCHW only (`channels_last` is rejected), with torchvision's
//!   offset layout and OIHW filters, so they need no conversion at all;
//! - the pure-TensorFlow Keras layer `DeformableConvLayer` (DHZS `tf-deformable-conv-layer`)
//!   holds offsets as NHWC `[N, H_out, W_out, 2 * kh * kw * G]`, `(dy, dx)` pairs, pair index
//!   `k * G + g`; with one deformable group that is torchvision's channel order after
//!   [`nhwc_to_nchw`]. Its groups split *output* channels (one per output channel by default)
//!   and it clamps sample positions into the image, so with more than one group, or near the
//!   border, it computes something else than torchvision: no adapter is offered;
//! - Ascend (`torch_npu.npu_deformable_conv2d`, CANN `DeformableOffsets`) documents its offsets
//!   as NHWC `[N, H_out, W_out, 3 * G * kh * kw]` packed with the mask; in NCHW their channels
//!   are [`crate::offset_layout::PackedLayout::XyMaskBlocks`].

use ndarray::{Array4, ArrayView4, Axis};

use crate::error::{Error, Result};
use crate::geometry::checked_elements;

/// The order in which a framework stores the four axes of a 2-D convolution weight.
///
/// Letters: `O` output channels, `I` input channels (per group), `H` kernel rows, `W` kernel
/// columns; the first letter is the slowest axis. With groups, every layout here holds
/// `C_in / groups` along `I` and all `C_out` along `O`, output channel `o` belonging to group
/// `o / (C_out / groups)`, so the conversion is the same axis permutation for any group count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// `[C_out, C_in / groups, kh, kw]`: ours, and PyTorch `nn.Conv2d.weight`, torchvision
    /// `deform_conv2d`, ONNX `Conv` / `DeformConv` `W`, MindSpore `ops.deformable_conv2d`,
    /// mmcv, Theano `conv2d` and Lasagne `Conv2DLayer` (the last two flip by default: see
    /// [`Flip`]).
    Oihw,
    /// `[C_in, C_out, kh, kw]`: Lasagne `DilatedConv2DLayer`, whose `get_W_shape` swaps the
    /// first two axes because the layer computes its output as the weight gradient of a strided
    /// convolution (the filters play the output gradient, whose batch axis is the input
    /// channels). That layer has no groups: use `Iohw` only for `groups = 1`. PyTorch
    /// `ConvTranspose2d` also stores `[C_in, C_out / groups, kh, kw]`, but it is the weight of a
    /// transposed convolution, a different operation, and converting it here would not make it
    /// one.
    Iohw,
    /// `[kh, kw, C_in / groups, C_out]`: TensorFlow `tf.nn.conv2d` `filters`
    /// (`output[b, i, j, k] = sum_{di, dj, q} input[b, s*i + di, s*j + dj, q] * filter[di, dj, q, k]`)
    /// and Keras `Conv2D.kernel` (`kernel_size + (C_in // groups, filters)`).
    Hwio,
    /// `[C_out, kh, kw, C_in / groups]`: TensorFlow Lite `CONV_2D` filters (its kernels read
    /// output depth from dimension 0, filter height and width from 1 and 2, and the per-group
    /// input depth from 3).
    Ohwi,
}

/// Whether the stored kernel is applied as stored (cross-correlation) or rotated by 180
/// degrees (true convolution).
///
/// `Spatial` weights are converted by reversing both kernel axes:
/// `ours[o, c, i, j] = stored[o, c, kh - 1 - i, kw - 1 - j]`, so that our cross-correlation
/// computes the framework's convolution
/// `out[n, o, y, x] = sum_{c, i, j} w[o, c, i, j] * in[n, c, y*s + (kh-1-i)*d, x*s + (kw-1-j)*d]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Flip {
    /// Applied as stored: cross-correlation. PyTorch, torchvision, TensorFlow, TensorFlow Lite,
    /// ONNX, MindSpore, mmcv; Theano `conv2d(filter_flip=False)`; Lasagne layers with
    /// `flip_filters=False`, which `DilatedConv2DLayer` requires.
    #[default]
    None,
    /// Rows and columns of the kernel flipped before sliding it over the input: true
    /// convolution. Theano `conv2d` by default (`filter_flip=True`) and Lasagne `Conv2DLayer` by
    /// default (`flip_filters=True`).
    Spatial,
}

/// Our axis (0 = O, 1 = I, 2 = H, 3 = W) stored at each position of `layout`.
const fn stored_axes(layout: WeightLayout) -> [usize; 4] {
    match layout {
        WeightLayout::Oihw => [0, 1, 2, 3],
        WeightLayout::Iohw => [1, 0, 2, 3],
        WeightLayout::Hwio => [2, 3, 1, 0],
        WeightLayout::Ohwi => [0, 2, 3, 1],
    }
}

/// Position in `layout` of each of our axes O, I, H, W (the inverse of [`stored_axes`]).
fn positions(layout: WeightLayout) -> [usize; 4] {
    let axes = stored_axes(layout);
    let mut pos = [0; 4];
    for (p, &a) in axes.iter().enumerate() {
        pos[a] = p;
    }
    pos
}

/// The OIHW shape `[C_out, C_in / groups, kh, kw]` of a weight stored in `layout` with shape
/// `stored_shape`.
///
/// ```
/// use deformconv::layout::{oihw_shape, WeightLayout};
/// // A TensorFlow 3x3 kernel from 30 to 64 channels.
/// assert_eq!(oihw_shape([3, 3, 30, 64], WeightLayout::Hwio), [64, 30, 3, 3]);
/// ```
pub fn oihw_shape(stored_shape: [usize; 4], layout: WeightLayout) -> [usize; 4] {
    let pos = positions(layout);
    pos.map(|p| stored_shape[p])
}

/// Reverses the kernel rows and columns of `view` if `flip` asks for it; `h_axis`, `w_axis`
/// are where those axes sit in `view`.
fn apply_flip<T>(
    mut view: ArrayView4<'_, T>,
    flip: Flip,
    h_axis: usize,
    w_axis: usize,
) -> ArrayView4<'_, T> {
    if flip == Flip::Spatial {
        view.invert_axis(Axis(h_axis));
        view.invert_axis(Axis(w_axis));
    }
    view
}

/// Converts a weight stored in another framework's `layout` (and [`Flip`]) to ours: an owned,
/// standard-layout (row-major) OIHW array.
///
/// `ours[o, c, i, j] = stored[<o, c, i', j' in layout order>]` with `i' = i`, `j' = j`, or with
/// `Flip::Spatial` `i' = kh - 1 - i`, `j' = kw - 1 - j`. Never fails: every 4-D tensor is a
/// valid weight in every layout; the shape is checked when the weight is used.
///
/// ```
/// use deformconv::layout::{to_oihw, Flip, WeightLayout};
/// use ndarray::Array4;
/// // Lasagne DilatedConv2DLayer: W has shape (C_in, C_out, kh, kw).
/// let lasagne = Array4::from_shape_fn((2, 5, 3, 3), |(c, o, i, j)| (c * 1000 + o * 100 + i * 10 + j) as f32);
/// let ours = to_oihw(lasagne.view(), WeightLayout::Iohw, Flip::None);
/// assert_eq!(ours.shape(), &[5, 2, 3, 3]);
/// assert_eq!(ours[[4, 1, 2, 0]], 1420.0);
/// ```
pub fn to_oihw<T: Clone>(
    weights: ArrayView4<'_, T>,
    layout: WeightLayout,
    flip: Flip,
) -> Array4<T> {
    let oihw = weights.permuted_axes(positions(layout));
    apply_flip(oihw, flip, 2, 3)
        .as_standard_layout()
        .into_owned()
}

/// Converts one of our OIHW weights to another framework's `layout` (and [`Flip`]): the
/// inverse of [`to_oihw`], as an owned standard-layout array in that layout's axis order.
///
/// ```
/// use deformconv::layout::{from_oihw, to_oihw, Flip, WeightLayout};
/// use ndarray::Array4;
/// let ours = Array4::from_shape_fn((4, 3, 2, 5), |(o, c, i, j)| (o * 1000 + c * 100 + i * 10 + j) as f64);
/// let theano = from_oihw(ours.view(), WeightLayout::Oihw, Flip::Spatial);
/// assert_eq!(theano[[0, 0, 1, 4]], ours[[0, 0, 0, 0]]);
/// assert_eq!(to_oihw(theano.view(), WeightLayout::Oihw, Flip::Spatial), ours);
/// ```
pub fn from_oihw<T: Clone>(
    weights: ArrayView4<'_, T>,
    layout: WeightLayout,
    flip: Flip,
) -> Array4<T> {
    let flipped = apply_flip(weights, flip, 2, 3);
    flipped
        .permuted_axes(stored_axes(layout))
        .as_standard_layout()
        .into_owned()
}

/// Loads a weight from a flat row-major buffer (an `.npy` payload, a `state_dict` tensor's
/// data, a TensorFlow checkpoint variable) of shape `stored_shape` in `layout`, as our OIHW.
///
/// Errors if `data.len()` is not the product of `stored_shape`, or that product overflows.
///
/// ```
/// use deformconv::layout::{load_weight, Flip, WeightLayout};
/// // A Keras 1x2 kernel from 1 to 2 channels: kernel[0, j, 0, o] = 10 * j + o.
/// let keras = [0.0f32, 1.0, 10.0, 11.0];
/// let w = load_weight(&keras, [1, 2, 1, 2], WeightLayout::Hwio, Flip::None).unwrap();
/// assert_eq!(w.shape(), &[2, 1, 1, 2]);
/// assert_eq!(w.as_slice().unwrap(), &[0.0, 10.0, 1.0, 11.0]);
/// ```
pub fn load_weight<T: Clone>(
    data: &[T],
    stored_shape: [usize; 4],
    layout: WeightLayout,
    flip: Flip,
) -> Result<Array4<T>> {
    let count = checked_elements("weight", &stored_shape, std::mem::size_of::<T>())?;
    if data.len() != count {
        let [a, b, c, d] = stored_shape;
        return Err(Error::Shape {
            tensor: "weight",
            axis: "elements",
            expected: format!(
                "{a} * {b} * {c} * {d} = {count} for a {layout:?} weight of shape {stored_shape:?}"
            ),
            got: data.len(),
        });
    }
    let view = ArrayView4::from_shape(stored_shape, data).map_err(|e| Error::Shape {
        tensor: "weight",
        axis: "elements",
        expected: format!("a buffer viewable as {stored_shape:?} ({e})"),
        got: data.len(),
    })?;
    Ok(to_oihw(view, layout, flip))
}

/// NHWC (TensorFlow's default `data_format`, Keras `channels_last`) to NCHW (ours), as an
/// owned standard-layout array: `nchw[n, c, y, x] = nhwc[n, y, x, c]`.
///
/// Use it for inputs, output gradients, offsets and masks; see the module docs for what the
/// channels of NHWC offsets mean in each framework.
pub fn nhwc_to_nchw<T: Clone>(tensor: ArrayView4<'_, T>) -> Array4<T> {
    tensor
        .permuted_axes([0, 3, 1, 2])
        .as_standard_layout()
        .into_owned()
}

/// NCHW (ours) to NHWC (TensorFlow), as an owned standard-layout array:
/// `nhwc[n, y, x, c] = nchw[n, c, y, x]`. The inverse of [`nhwc_to_nchw`].
pub fn nchw_to_nhwc<T: Clone>(tensor: ArrayView4<'_, T>) -> Array4<T> {
    tensor
        .permuted_axes([0, 2, 3, 1])
        .as_standard_layout()
        .into_owned()
}
