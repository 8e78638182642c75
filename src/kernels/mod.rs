//! The compute kernels of the fast path: column gathers (dense im2col; the deformable bilinear
//! gather in `gather`, a vector of channels at a time from pixel-major images (`pixel_major`):
//! written once over the backend's vectors in `channel_lanes`, with a paired AVX-512 `f32` form
//! for at most 8 channels in `channel_gather`), the GEMM (`gemm`), the sampling table of a tile
//! for both passes (`tile_table`: its entry `taps`, its column form `columns`, built a vector
//! of pixels at a time by `locate`), the backward's fused pass for every deformable problem
//! (col2im with the offset and mask gradients and the columns, on pixel-major planes a vector
//! of channels at a time: `channel_backward`) and the dense convolution's per-channel loops
//! (`dense_backward`).
//!
//! # The column tile
//!
//! Both gathers fill the same matrix, for one image `n`, one convolution group `g` and one
//! range of output pixels `start .. start + len` (row-major `p = y * W_out + x`):
//!
//! ```text
//! cols[(c' * K + k) * len + q] = m * B(input[n, g * C_in/groups + c'], py, px)
//!     c' < C_in / groups        (channel inside the conv group)
//!     k  = i * kw + j < K       (kernel tap, K = kh * kw)
//!     q  < len                  (pixel start + q of the tile)
//! ```
//!
//! with `py`, `px`, `m`, `B` as in `reference` (for dense conv, `m = 1` and zero offsets, so
//! `B` is the pixel itself or 0 in the padding). Rows are `(c', k)` in the order of the
//! weight's `[C_out, C_in/groups, kh, kw]` layout, so the group's weight block
//! `weight[g * C_out/groups ..][.., ..]` is a row-major `(C_out/groups) x (C_in/groups * K)`
//! matrix and the tile's output is `weight_g · cols` (see [`gemm`]). The backward pass reuses
//! this tile for `grad_weight = G_tile · colsᵀ`.
//!
//! The deformable forward may fill the same matrix transposed, a row per pixel with its depth
//! reordered ([`TileLayout::PixelMajor`]).
//!
//! The buffer holds `C_in/groups * K * len` elements; [`crate::plan`] chooses `len` so that it
//! stays near 1 MiB, independent of the batch size.

pub(crate) mod backend;
pub(crate) mod channel_backward;
pub(crate) mod channel_gather;
pub(crate) mod channel_lanes;
pub(crate) mod columns;
pub(crate) mod dense_backward;
pub(crate) mod gather;
pub(crate) mod gemm;
pub(crate) mod im2col;
pub(crate) mod locate;
pub(crate) mod pixel_lanes;
pub(crate) mod pixel_major;
pub(crate) mod taps;
pub(crate) mod tile_table;
#[cfg(target_arch = "x86_64")]
pub(crate) mod transpose;

use crate::convention::Convention;
use crate::geometry::Geometry;

/// A deterministic stream of `f32` in `[0, 1)` (a 64-bit LCG's top 24 bits), for the
/// kernels' unit tests.
#[cfg(test)]
pub(crate) fn test_stream(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32) / ((1u64 << 24) as f32)
    }
}

/// The memory order of an input batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImageOrder {
    /// `[N, C, H, W]`, what every kernel reads.
    Nchw,
    /// `[N, H, W, C]` (channels_last): only the deformable gather's pixel-major copy
    /// ([`pixel_major::PixelMajor::fill`]) reads it, and it reads it row by row as it is.
    Nhwc,
}

/// How a forward column tile is laid out in its buffer (row stride `ld`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TileLayout {
    /// A row per `(channel, tap)`, `cols[(c' * K + k) * ld + q]` (the module docs' layout):
    /// the GEMM packs its rows straight. Dense im2col, and deformable gathers whose offset
    /// groups fill whole vectors.
    ChannelMajor,
    /// A row per pixel, by segment (the channels `s .. e` of one offset group inside the conv
    /// group), then tap, then channel: `cols[q * ld + (s - first) * K + k * (e - s) + (c - s)]`.
    /// The deformable gather stores each sample's vector of channels as it is
    /// ([`pixel_lanes`]), a segment's taps side by side; the GEMM packs the tile transposed,
    /// against the weight with its depth reordered to match.
    PixelMajor,
}

/// The operands of one convolution as flat standard-layout (C-order) slices.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a, T> {
    /// The checked problem.
    pub geo: &'a Geometry,
    /// The sampling convention of the deformable gather (the dense im2col ignores it: an
    /// integer position reads its pixel in every convention).
    pub convention: Convention,
    /// `[N, C_in, H, W]`, in `input_order`.
    pub input: &'a [T],
    /// How `input` is ordered: [`ImageOrder::Nhwc`] only for the deformable gather.
    pub input_order: ImageOrder,
    /// `[N, 2 * G_off * K, H_out, W_out]`, or `None` for a dense convolution.
    pub offset: Option<&'a [T]>,
    /// `[N, G_off * K, H_out, W_out]`, or `None` for a unit mask.
    pub mask: Option<&'a [T]>,
}

/// Which column tile: one image, one convolution group, output pixels `start .. start + len`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TileSpan {
    /// The image of the batch.
    pub image: usize,
    /// The convolution group.
    pub group: usize,
    /// The first output pixel (row-major `y * W_out + x`).
    pub start: usize,
    /// How many output pixels.
    pub len: usize,
}

/// Where the rows of a column tile go: row `r` at `cols[r * ld ..]`.
#[derive(Debug)]
pub(crate) struct TileRows<'a, T> {
    /// The buffer.
    pub cols: &'a mut [T],
    /// The row stride, at least the tile's length.
    pub ld: usize,
}

/// Fills the column tile of `span` into `out` in `layout`: channel-major, row `r` at
/// `out.cols[r * out.ld ..][..len]` (`out.ld >= len`; see the module docs for the layout,
/// which is the case `ld = len`), or pixel-major (deformable only), pixel `q` at
/// `out.cols[q * out.ld ..]` ([`TileLayout`]); by the deformable gather when `src` has
/// offsets and by the dense im2col otherwise. A forward tile spanning several images fills
/// one such block per image, side by side in a buffer of row stride `ld` (one after the other
/// when pixel-major). `images` holds `span.image` pixel-major; the deformable gather reads it
/// (the dense im2col ignores it).
///
/// # Panics
/// If `src` has offsets and `images` is `None`, or the dense im2col is asked for a
/// pixel-major tile.
#[inline]
pub(crate) fn fill_columns<T: crate::Float>(
    src: &Source<'_, T>,
    span: TileSpan,
    (layout, out): (TileLayout, TileRows<'_, T>),
    scratch: &mut gather::SampleTable<T>,
    images: Option<&pixel_major::PixelMajor<T>>,
) {
    match src.offset {
        Some(offset) => {
            let images = images.expect("the deformable gather reads pixel-major images");
            gather::gather_columns(src, offset, span, (layout, out), scratch, images)
        }
        None => {
            assert_eq!(
                layout,
                TileLayout::ChannelMajor,
                "im2col fills rows per channel"
            );
            im2col::im2col_columns(src, span, out)
        }
    }
}
