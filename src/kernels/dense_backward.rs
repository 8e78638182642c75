//! The dense convolution's backward loops on channel-major padded planes (`[channel][cell]`,
//! zero-bordered, see [`PlaneLayout`]): every sample of a dense convolution sits exactly on one
//! cell with weight 1, so a tile's sampling table is one cell per (tap, pixel) and the two
//! per-channel loops are plain copies and additions:
//!
//! ```text
//! cell[k, p]     = the sample's pixel, or a zero border cell when it lies in the padding
//! cols[c, k, p]  = plane_c[cell[k, p]]                    (im2col, for grad_weight)
//! plane_c[cell] += gcol[c, k, p]   for k, p ascending     (col2im, grad_input)
//! ```
//!
//! A padding sample's additions land in the border, which is never copied out. The deformable
//! backward runs pixel-major instead ([`super::channel_backward`]). The dense one stays
//! channel-major because pixel-major lost, measured on an AMD Zen 3 (`isa_probe PARTS=dbwd`,
//! 2 threads, `f32`, min of 2-3 alternating rounds, channel-major -> pixel-major, ms):
//! - through the deformable fused pass: AVX2 W1 1.29 -> 1.41, W2 63.8 -> 68.6; portable W1
//!   1.38 -> 1.71, W2 59.4 -> 82.1; scalar W2 63.1 -> 82.8;
//! - with these two loops written pixel-major (a copy or add of a cell's channels per sample):
//!   AVX2 W1 1.59 -> 1.52, W2 81.1 -> 79.6, W4 149 -> 161; portable W1 1.38 -> 1.57, W2 66.5
//!   -> 89.8, W4 165 -> 186.

use std::ops::Range;

use crate::float::Float;
use crate::kernels::taps::PlaneLayout;

/// Where a tile's channels live: channel `c`'s planes at `planes[c * channel_stride ..]`, and
/// the tile's `taps x tile` cell table `[k][tile column]`, whose cells already include each
/// image's plane offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DenseTile<'a> {
    /// Distance between the planes of consecutive channels (`[channel][image][cell]`).
    pub channel_stride: usize,
    /// Columns (pixels) of the tile.
    pub tile: usize,
    /// Kernel taps `K`.
    pub taps: usize,
    /// `cell[k * tile + q]`.
    pub cells: &'a [usize],
}

impl DenseTile<'_> {
    /// One past the largest cell: each channel's planes are sliced to this length (a bounds
    /// check per channel), so the loops over the cells need none.
    fn reach(&self) -> usize {
        debug_assert_eq!(self.cells.len(), self.taps * self.tile);
        self.cells.iter().max().map_or(0, |&c| c + 1)
    }
}

/// The cell of the sample at the integer position `(y, x)` of image plane `plane0`: the pixel
/// inside the image, else [`PlaneLayout::zero_base`] (zero to read, discarded to write).
#[inline(always)]
pub(crate) fn cell(layout: PlaneLayout, plane0: usize, y: isize, x: isize) -> usize {
    debug_assert!(!layout.is_replicated());
    let inside = y >= 0 && y < layout.h as isize && x >= 0 && x < layout.w as isize;
    plane0
        + if inside {
            layout.index(y, x)
        } else {
            layout.zero_base()
        }
}

/// `cols[(c - channels.start) * K + k][q] = plane_c[cell[k, q]]` for the local channels
/// `channels`.
pub(crate) fn gather<T: Float>(
    planes: &[T],
    t: DenseTile<'_>,
    cols: &mut [T],
    channels: Range<usize>,
) {
    let reach = t.reach();
    for (ci, c) in channels.enumerate() {
        let plane = &planes[c * t.channel_stride..][..reach];
        let rows = &mut cols[ci * t.taps * t.tile..][..t.taps * t.tile];
        for (d, &cell) in rows.iter_mut().zip(t.cells) {
            debug_assert!(cell < plane.len());
            // SAFETY: `cell < reach = plane.len()` (`reach` is one past the largest cell).
            *d = unsafe { *plane.get_unchecked(cell) };
        }
    }
}

/// `plane_c[cell[k, q]] += gcol[(c - channels.start) * K + k][q]` for the local channels
/// `channels`, in ascending `(k, q)` order per plane.
pub(crate) fn scatter<T: Float>(
    planes: &mut [T],
    t: DenseTile<'_>,
    gcol: &[T],
    channels: Range<usize>,
) {
    let reach = t.reach();
    for (ci, c) in channels.enumerate() {
        let plane = &mut planes[c * t.channel_stride..][..reach];
        let rows = &gcol[ci * t.taps * t.tile..][..t.taps * t.tile];
        for (&g, &cell) in rows.iter().zip(t.cells) {
            debug_assert!(cell < plane.len());
            // SAFETY: `cell < reach = plane.len()` (`reach` is one past the largest cell).
            unsafe { *plane.get_unchecked_mut(cell) += g };
        }
    }
}
