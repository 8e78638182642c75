//! Offset and mask channel layouts of other deformable-convolution implementations, converted
//! to and from ours (torchvision's).
//!
//! Every implementation agrees on the shape `[N, 2 * G * K, H_out, W_out]` of the offsets
//! (`G` offset groups, `K = kh * kw` taps, tap `k = i * kw + j`) but not on which channel holds
//! which number. Ours, with `d = 0` for `dy` (rows) and `d = 1` for `dx` (columns):
//!
//! ```text
//! offset[n, 2 (g K + k) + d, y, x]          mask[n, g K + k, y, x]
//! ```
//!
//! Who uses which (checked in each project's source):
//! - [`OffsetLayout::InterleavedYx`], ours: torchvision `deform_conv2d`; ONNX `DeformConv` (its
//!   reference implementation views the offsets as `[N, G, kh, kw, 2, H_out, W_out]` with
//!   `[.., 0, ..]` the row offset); mmcv `DeformConv2d` / `ModulatedDeformConv2d` and the
//!   MSRA Deformable-ConvNets / DCNv2 kernels they descend from (row offset of tap `k` at
//!   channel `2 k` of the group's block of `2 K`); the `DeformableConv2D` proposed for
//!   TensorFlow Addons (Licht-T's branch).
//! - [`OffsetLayout::InterleavedXy`]: `(dx, dy)` pairs, the `(x, y)` order of grid-sampling
//!   APIs (ONNX's reference flips its `(h, w)` sample positions to `(x, y)` before calling
//!   `GridSample`). For offsets produced in that order.
//! - [`OffsetLayout::PlanarYx`]: per group, the `K` row offsets then the `K` column offsets.
//!   No implementation we checked uses it; it is what concatenating a `dy` head and a `dx`
//!   head per group gives.
//! - [`OffsetLayout::BlocksXy`]: all `G K` column offsets, then all `G K` row offsets, each block
//!   indexed `g K + k`: the offset part of MindSpore's and Ascend's packed tensor (see
//!   [`PackedLayout::XyMaskBlocks`]); mmcv's NPU path builds it from ours by taking the odd
//!   channels, then the even ones.
//!
//! Gradients with respect to offsets and masks have the layout of what they differentiate, so
//! the same functions move them.
//!
//! Offsets packed with the mask in one tensor of `3 G K` channels ([`PackedLayout`]):
//! - [`PackedLayout::MmcvChunks`]: mmcv `ModulatedDeformConv2dPack` (registered as `DCNv2`)
//!   computes `conv_offset(x)` with `3 G K` channels, splits it with `torch.chunk(out, 3, dim=1)`
//!   into `o1, o2, mask`, and passes `cat(o1, o2)` as offsets (our layout) and `sigmoid(mask)`
//!   as the mask. So the first `2 G K` channels are our offsets and the last `G K` the mask
//!   *before* its sigmoid: [`unpack_offset_mask`] only splits, apply the sigmoid yourself when
//!   reproducing that layer from its raw `conv_offset` output.
//! - [`PackedLayout::XyMaskBlocks`]: MindSpore `ops.deformable_conv2d` documents its `offsets`
//!   as `[N, 3 G K, H_out, W_out]` ordered `(offset_x, offset_y, mask)`; its CPU
//!   `DeformableOffsets` kernel reads, for group `g` and tap `k`, the column offset at channel
//!   `g K + k`, the row offset `G K` channels later and the mask `2 G K` channels later. These
//!   are three blocks, not per-tap triples. Ascend's `DeformableConv2D` / `torch_npu`'s
//!   `npu_deformable_conv2d` take the same order (mmcv's and Huawei's NPU adapters build it as
//!   `cat(odd channels, even channels, mask)`).

use ndarray::{s, Array4, ArrayView4};

use crate::error::{Error, Result};

/// How the `2 G K` offset channels are ordered (see the module docs for who uses which).
///
/// Channel of the row (`d = 0`, `dy`) or column (`d = 1`, `dx`) offset of group `g`, tap `k`:
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OffsetLayout {
    /// Ours and torchvision's: `2 (g K + k) + d`.
    #[default]
    InterleavedYx,
    /// `(dx, dy)` pairs: `2 (g K + k) + (1 - d)`.
    InterleavedXy,
    /// Per group, all rows then all columns: `2 g K + d K + k`.
    PlanarYx,
    /// All columns of every group, then all rows (MindSpore / Ascend): `(1 - d) G K + g K + k`.
    BlocksXy,
}

/// How offsets and mask share one tensor of `3 G K` channels (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackedLayout {
    /// mmcv `ModulatedDeformConv2dPack` / DCNv2: channels `[0, 2 G K)` are offsets in our
    /// layout, `[2 G K, 3 G K)` the mask (pre-sigmoid in mmcv), mask channel `2 G K + g K + k`.
    MmcvChunks,
    /// MindSpore `deformable_conv2d`, Ascend `DeformableConv2D`: column offsets at `g K + k`,
    /// row offsets at `G K + g K + k`, mask at `2 G K + g K + k`.
    XyMaskBlocks,
}

impl PackedLayout {
    /// The layout of the first `2 G K` channels, the offsets.
    pub const fn offset_layout(self) -> OffsetLayout {
        match self {
            PackedLayout::MmcvChunks => OffsetLayout::InterleavedYx,
            PackedLayout::XyMaskBlocks => OffsetLayout::BlocksXy,
        }
    }
}

/// Channel of the offset of group `g`, tap `k`, direction `d` (0 rows, 1 columns) in `layout`.
const fn offset_channel(
    layout: OffsetLayout,
    groups: usize,
    taps: usize,
    g: usize,
    k: usize,
    d: usize,
) -> usize {
    match layout {
        OffsetLayout::InterleavedYx => 2 * (g * taps + k) + d,
        OffsetLayout::InterleavedXy => 2 * (g * taps + k) + (1 - d),
        OffsetLayout::PlanarYx => 2 * g * taps + d * taps + k,
        OffsetLayout::BlocksXy => (1 - d) * groups * taps + g * taps + k,
    }
}

/// Checks `offset_groups >= 1` and that `channels` is `per_tap * G * K` for some `K`; returns `K`.
fn taps_of(
    tensor: &'static str,
    channels: usize,
    per_tap: usize,
    offset_groups: usize,
) -> Result<usize> {
    if offset_groups == 0 {
        return Err(Error::Param {
            name: "offset_groups",
            rule: "must be at least 1 (got 0)".to_string(),
        });
    }
    let per_group = per_tap * offset_groups;
    if !channels.is_multiple_of(per_group) {
        return Err(Error::Shape {
            tensor,
            axis: "channels",
            expected: format!(
                "a multiple of {per_tap} * offset_groups({offset_groups}) = {per_group}"
            ),
            got: channels,
        });
    }
    Ok(channels / per_group)
}

/// Rebuilds `offset` (whose `2 G K` channels are in `from`) with its channels in `to`:
/// `out[n, ch_to(g, k, d), y, x] = offset[n, ch_from(g, k, d), y, x]`, as an owned
/// standard-layout array. `offset_groups` is `G`; `K` is inferred from the channel count.
///
/// Errors if `offset_groups` is 0 or the channel count is not a multiple of `2 G`.
///
/// ```
/// use deformconv::offset_layout::{convert_offset, OffsetLayout};
/// use ndarray::Array4;
/// // One group, two taps, stored planar: [dy0, dy1, dx0, dx1].
/// let planar = Array4::from_shape_vec((1, 4, 1, 1), vec![1.0, 2.0, 10.0, 20.0]).unwrap();
/// let ours = convert_offset(planar.view(), OffsetLayout::PlanarYx, OffsetLayout::InterleavedYx, 1).unwrap();
/// assert_eq!(ours.as_slice().unwrap(), &[1.0, 10.0, 2.0, 20.0]);
/// ```
pub fn convert_offset<T: Clone>(
    offset: ArrayView4<'_, T>,
    from: OffsetLayout,
    to: OffsetLayout,
    offset_groups: usize,
) -> Result<Array4<T>> {
    let channels = offset.shape()[1];
    let taps = taps_of("offset", channels, 2, offset_groups)?;
    // source[c] = the channel of `offset` that lands in channel `c` of the result.
    let mut source = vec![0; channels];
    for g in 0..offset_groups {
        for k in 0..taps {
            for d in 0..2 {
                source[offset_channel(to, offset_groups, taps, g, k, d)] =
                    offset_channel(from, offset_groups, taps, g, k, d);
            }
        }
    }
    let shape = offset.raw_dim();
    Ok(Array4::from_shape_fn(shape, |(n, c, y, x)| {
        offset[[n, source[c], y, x]].clone()
    }))
}

/// Splits a packed offset-and-mask tensor `[N, 3 G K, H_out, W_out]` into our offsets
/// `[N, 2 G K, H_out, W_out]` and mask `[N, G K, H_out, W_out]`, both owned and standard-layout.
///
/// The mask is returned as stored: mmcv's `ModulatedDeformConv2dPack` applies a sigmoid to
/// it before use, MindSpore and Ascend take it as is.
///
/// ```
/// use deformconv::offset_layout::{unpack_offset_mask, PackedLayout};
/// use ndarray::Array4;
/// // MindSpore, one group, one tap: (offset_x, offset_y, mask).
/// let packed = Array4::from_shape_vec((1, 3, 1, 1), vec![0.25, -0.5, 0.75]).unwrap();
/// let (offset, mask) = unpack_offset_mask(packed.view(), PackedLayout::XyMaskBlocks, 1).unwrap();
/// assert_eq!(offset.as_slice().unwrap(), &[-0.5, 0.25]); // (dy, dx)
/// assert_eq!(mask.as_slice().unwrap(), &[0.75]);
/// ```
pub fn unpack_offset_mask<T: Clone>(
    packed: ArrayView4<'_, T>,
    layout: PackedLayout,
    offset_groups: usize,
) -> Result<(Array4<T>, Array4<T>)> {
    let taps = taps_of(
        "packed offset and mask",
        packed.shape()[1],
        3,
        offset_groups,
    )?;
    let split = 2 * offset_groups * taps;
    let offset = convert_offset(
        packed.slice(s![.., ..split, .., ..]),
        layout.offset_layout(),
        OffsetLayout::InterleavedYx,
        offset_groups,
    )?;
    let mask = packed
        .slice(s![.., split.., .., ..])
        .as_standard_layout()
        .into_owned();
    Ok((offset, mask))
}

/// Packs our offsets `[N, 2 G K, H_out, W_out]` and mask `[N, G K, H_out, W_out]` into one
/// tensor of `3 G K` channels in `layout`: the inverse of [`unpack_offset_mask`].
///
/// Errors if the two tensors disagree on images, rows, columns or `G K`.
pub fn pack_offset_mask<T: Clone>(
    offset: ArrayView4<'_, T>,
    mask: ArrayView4<'_, T>,
    layout: PackedLayout,
    offset_groups: usize,
) -> Result<Array4<T>> {
    let taps = taps_of("offset", offset.shape()[1], 2, offset_groups)?;
    let (o, m) = (offset.shape(), mask.shape());
    let checks = [
        (0, "images", o[0]),
        (1, "channels", offset_groups * taps),
        (2, "rows", o[2]),
        (3, "columns", o[3]),
    ];
    for (axis, name, want) in checks {
        if m[axis] != want {
            return Err(Error::Shape {
                tensor: "mask",
                axis: name,
                expected: if axis == 1 {
                    format!("offset channels({}) / 2 = {want}", o[1])
                } else {
                    format!("{want}, as the offset")
                },
                got: m[axis],
            });
        }
    }
    let moved = convert_offset(
        offset,
        OffsetLayout::InterleavedYx,
        layout.offset_layout(),
        offset_groups,
    )?;
    let split = o[1];
    let shape = (o[0], split + m[1], o[2], o[3]);
    Ok(Array4::from_shape_fn(shape, |(n, c, y, x)| {
        if c < split {
            moved[[n, c, y, x]].clone()
        } else {
            mask[[n, c - split, y, x]].clone()
        }
    }))
}
