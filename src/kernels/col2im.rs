//! Atomic-free col2im: the column gradient of a tile scattered into the task's own padded
//! `grad_input` planes with each sample's bilinear corner weights,
//! `grad[c, corner] += (gcol[c, k, p] * m[k, p]) * w_corner[k, p]`.
//!
//! The caller owns the planes of every channel it passes (one task per (images, offset group)),
//! so no two threads ever add into the same cell and no atomics are needed. Samples that send no
//! gradient (outside the window, NaN) point at the discarded border cell, so the loop is
//! branch-free.

use std::ops::Range;

use crate::float::Float;
use crate::kernels::taps::Tap;

/// Geometry of one scatter: the padded planes' cell count and row pitch, the tile width and the
/// number of taps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TileShape {
    /// Cells per padded plane.
    pub plane_len: usize,
    /// Row pitch of a padded plane.
    pub pitch: usize,
    /// Columns (pixels) of the tile.
    pub tile: usize,
    /// Kernel taps `K`.
    pub taps: usize,
}

/// Scatters the rows of `gcol` (`[(c - channels.start) * K + k][tile]`) of the local channels
/// `channels` into `planes` (channel `c` at `c * plane_len`, plus each tap's own base), with the
/// table `taps` (`[k][tile]`).
pub(crate) fn scatter<T: Float>(
    planes: &mut [T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
) {
    let TileShape {
        plane_len,
        pitch,
        tile,
        taps: k_taps,
    } = shape;
    debug_assert_eq!(taps.len(), k_taps * tile);
    debug_assert!(gcol.len() >= channels.len() * k_taps * tile);
    for (ci, c) in channels.enumerate() {
        let off = c * plane_len;
        for k in 0..k_taps {
            let row = &gcol[(ci * k_taps + k) * tile..][..tile];
            let tk = &taps[k * tile..][..tile];
            for (e, &g) in tk.iter().zip(row) {
                let gm = g * e.m;
                let b = off + e.scatter;
                let cell = &mut planes[b..b + pitch + 2];
                cell[0] += gm * e.weights[0];
                cell[1] += gm * e.weights[1];
                cell[pitch] += gm * e.weights[2];
                cell[pitch + 1] += gm * e.weights[3];
            }
        }
    }
}
