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
    /// Distance between the planes of consecutive channels: a channel's padded planes of every
    /// image of the group are contiguous, `[channel][image][cell]`, and each tap's base already
    /// includes its image's plane offset.
    pub channel_stride: usize,
    /// Row pitch of a padded plane.
    pub pitch: usize,
    /// Columns (pixels) of the tile.
    pub tile: usize,
    /// Kernel taps `K`.
    pub taps: usize,
    /// Dense convolution (zero offsets, no mask): every sample sits exactly on one cell (its
    /// top-left corner, a border cell in the padding) with weight 1, so only that cell is
    /// touched.
    pub dense: bool,
}

/// Scatters the rows of `gcol` (`[(c - channels.start) * K + k][tile]`) of the local channels
/// `channels` into `planes` (channel `c` at `c * channel_stride`, plus each tap's own base), with the
/// table `taps` (`[k][tile]`).
#[inline(never)]
pub(crate) fn scatter<T: Float>(
    planes: &mut [T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
) {
    use crate::kernels::backend::isa;
    #[cfg(target_arch = "x86_64")]
    use crate::kernels::backend::Isa;
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2 and FMA (or AVX-512, a superset here) were detected.
        Isa::Avx2 | Isa::Avx512 => unsafe { scatter_avx2(planes, shape, taps, gcol, channels) },
        _ => scatter_body(planes, shape, taps, gcol, channels),
    }
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scatter_avx2<T: Float>(
    planes: &mut [T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
) {
    scatter_body(planes, shape, taps, gcol, channels)
}

/// [`scatter`]'s loops, compiled for the best instruction set by the wrapper (same IEEE
/// operations, bitwise the same results).
#[inline(always)]
fn scatter_body<T: Float>(
    planes: &mut [T],
    shape: TileShape,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
) {
    let TileShape {
        channel_stride,
        pitch,
        tile,
        taps: k_taps,
        dense,
    } = shape;
    if dense {
        return scatter_dense(planes, channel_stride, tile, k_taps, taps, gcol, channels);
    }
    debug_assert_eq!(taps.len(), k_taps * tile);
    debug_assert!(gcol.len() >= channels.len() * k_taps * tile);
    // One pass over the table (1 / channels of the work) proves every access in bounds.
    let max_base = taps.iter().map(|t| t.scatter).max().unwrap_or(0);
    let reach = max_base + pitch + 2;
    if channels.is_empty() {
        return;
    }
    assert!(
        (channels.end - 1) * channel_stride + reach <= planes.len(),
        "planes too short"
    );
    let first = channels.start;
    let count = channels.len();
    // Four channels at a time: consecutive pixels of one plane often hit the same cells, and a
    // read-modify-write waiting on the previous store is the bottleneck of a one-channel loop;
    // four independent planes interleaved hide that latency and share each table entry.
    // Measured on W4 grad_input (1 thread): scatter 45 ms -> see commit message.
    let mut ci = 0;
    while ci + LANES <= count {
        let base = &mut planes[(first + ci) * channel_stride..];
        let (p0, rest) = base.split_at_mut(channel_stride);
        let (p1, rest) = rest.split_at_mut(channel_stride);
        let (p2, rest) = rest.split_at_mut(channel_stride);
        let p3 = &mut rest[..reach];
        let mut lanes = [&mut p0[..reach], &mut p1[..reach], &mut p2[..reach], p3];
        for k in 0..k_taps {
            let rows: [&[T]; LANES] =
                std::array::from_fn(|l| &gcol[((ci + l) * k_taps + k) * tile..][..tile]);
            let tk = &taps[k * tile..][..tile];
            for (q, e) in tk.iter().enumerate() {
                let b = e.scatter;
                for (plane, row) in lanes.iter_mut().zip(rows) {
                    let gm = row[q] * e.m;
                    add_corners(plane, b, pitch, gm, &e.weights);
                }
            }
        }
        ci += LANES;
    }
    for ci in ci..count {
        let plane = &mut planes[(first + ci) * channel_stride..][..reach];
        for k in 0..k_taps {
            let row = &gcol[(ci * k_taps + k) * tile..][..tile];
            let tk = &taps[k * tile..][..tile];
            for (e, &g) in tk.iter().zip(row) {
                add_corners(plane, e.scatter, pitch, g * e.m, &e.weights);
            }
        }
    }
}

/// The dense case: `plane[b] += g` (the sample's weight is exactly 1 and its mask 1; the
/// three other corners have weight 0 and are skipped).
#[inline(always)]
fn scatter_dense<T: Float>(
    planes: &mut [T],
    channel_stride: usize,
    tile: usize,
    k_taps: usize,
    taps: &[Tap<T>],
    gcol: &[T],
    channels: Range<usize>,
) {
    let reach = taps.iter().map(|t| t.scatter).max().unwrap_or(0) + 1;
    if channels.is_empty() {
        return;
    }
    assert!(
        (channels.end - 1) * channel_stride + reach <= planes.len(),
        "planes too short"
    );
    // Table entries in chunks, their cells copied out once and reused by every channel (the
    // table rows are 12 times wider than the cells). Each plane still receives its additions
    // in entry order. Measured on W1 dense forward + backward (1 thread), with the same
    // change in `coord`: 2.06 -> 1.95 ms.
    let mut cells = [0usize; CHUNK];
    for k in 0..k_taps {
        for q0 in (0..tile).step_by(CHUNK) {
            let n = CHUNK.min(tile - q0);
            for (d, e) in cells.iter_mut().zip(&taps[k * tile + q0..][..n]) {
                *d = e.scatter;
            }
            for (ci, c) in channels.clone().enumerate() {
                let plane = &mut planes[c * channel_stride..][..reach];
                let row = &gcol[(ci * k_taps + k) * tile + q0..][..n];
                for (&b, &g) in cells[..n].iter().zip(row) {
                    debug_assert!(b < reach);
                    // SAFETY: b <= max scatter base = reach - 1 < plane.len().
                    unsafe { *plane.get_unchecked_mut(b) += g };
                }
            }
        }
    }
}

/// Table entries per chunk of the dense loops. 32 and 128 measured level
/// (`isa_probe W1 W2 W4`, 2 threads, AMD Zen 4, 5 alternating rounds each the best of 20, `f64` 6; medians of the rounds: `f64` W2/W4 full backward 90.5/262.6 ms at 64,
/// 90.3/252.9 at 32, 96.0/255.3 at 128).
pub(crate) const CHUNK: usize = 64;

/// Channels scattered together.
const LANES: usize = 4;
/// `plane[b + {0, 1, pitch, pitch + 1}] += gm * weights`.
#[inline(always)]
fn add_corners<T: Float>(plane: &mut [T], b: usize, pitch: usize, gm: T, weights: &[T; 4]) {
    debug_assert!(b + pitch + 1 < plane.len());
    // SAFETY: every plane slice handed here is at least `reach = max_base + pitch + 2` long and
    // b <= max_base (the largest scatter base of the table), so b + pitch + 1 < plane.len().
    unsafe {
        *plane.get_unchecked_mut(b) += gm * weights[0];
        *plane.get_unchecked_mut(b + 1) += gm * weights[1];
        *plane.get_unchecked_mut(b + pitch) += gm * weights[2];
        *plane.get_unchecked_mut(b + pitch + 1) += gm * weights[3];
    }
}
