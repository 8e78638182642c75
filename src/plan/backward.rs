//! The backward's fixed decomposition of a problem into tasks that each own their outputs.
//!
//! **Partition** (depends only on the problem's shape, never on the thread count or on which
//! gradients are wanted):
//! - images are cut into *image groups*: an image with at least `P` output pixels is a group of
//!   its own, cut into near-equal pixel tiles of at most `P`; smaller images are packed, whole,
//!   a near-equal number per group, into one tile of at most `P` columns (so the GEMMs see wide
//!   enough matrices). `P` is [`TILE_PIXELS`], or on the pixel-major path the width whose
//!   column gradient is about [`PIXEL_MAJOR_TILE_BYTES`] (64 to 512 pixels);
//! - groups are dealt round-robin to `R` *slots*, `R = clamp(ceil(MIN_TASKS / G_off), 1, groups)`;
//! - a *task* is a (slot, offset group) pair and walks its slot's groups in order.
//!
//! **Ownership**: a task is the only writer of `grad_input[n, c]` and of `grad_offset` /
//! `grad_mask[n, channels of its offset group]` for the images of its slot, so it writes them
//! without atomics; it sums over the channels of its offset group itself, in a fixed order.
//! `grad_weight` columns of an offset group's channels are summed by the task over its slot's
//! groups in order: slot 0 straight into the output, the other slots into private partials,
//! which are added to the output in slot order at the end (pixel-major path: every slot into
//! a partial, gathered in slot order).
//!
//! **Workspace** (elements of `T`, `t = min(threads, tasks)` tasks running at once, `P` the
//! tile width, `Cs` = channels of the largest segment, `I` = images per group (1 when
//! `H_out W_out >= P`, else at most `P / (H_out W_out)`), `Pl = (H+2)(W+2)`, `(H+2)(W+3)` for
//! DCN v1's replicated planes):
//! `t * [2 I (C_in/G_off) Pl + 2 Cs K P + (C_out/groups) P + 3 K P + ~12 K P (taps)] + (R - 1) |weight|`
//! (`+ |weight|` when the caller's `grad_weight` is not row-major; pixel-major: `R |weight|`
//! partials plus the packed tap-major weight, about `1.1 |weight|`); nothing grows with the
//! batch size `N` (`R <= MIN_TASKS`). W4 in f32 with 2 threads: about 29 MiB pixel-major. The planes, column
//! buffers and packed `grad_out` come from, and go back to, a per-thread cache kept between
//! calls (at most 32 MiB per thread, see [`crate::scratch`]).

use std::ops::Range;

use crate::geometry::Geometry;
use crate::kernels::columns::MAX_CELLS;
use crate::kernels::taps::PlaneLayout;

/// Most output pixels in one tile (GEMM width); the whole tile of the dense (channel-major) path. 512 rather than 256:
/// matrixmultiply repacks `weightᵀ` for every tile, and on W4 packing was 12% of the backward
/// at 256 (1 thread; the machine was too contended to resolve 512 vs 1024).
pub(crate) const TILE_PIXELS: usize = 512;

/// Bytes of `f32` column gradient per tile the deformable (pixel-major) path aims for (its tile is at most
/// [`TILE_PIXELS`] and at least [`MIN_TILE_PIXELS`] wide), so that the fused pass streams
/// `gcol` and `cols` while they are still in L2. Measured on W4 (`f32`, 1 thread, one run):
/// backward 123 ms at 512 pixels (4.5 MiB), 112 at 256, 100 at 128, 104 at 64; W2 (2 threads)
/// 23.7 ms at 5 images per tile, 21.8 at 2 and 1. Alternating 2-thread runs of 512 KiB (W4 64
/// pixels, W2 2 images) and 1 MiB did not separate them beyond the machine's noise.
pub(crate) const PIXEL_MAJOR_TILE_BYTES: usize = 512 << 10;

/// The narrowest pixel-major tile (the GEMMs lose efficiency below). 32 and 128 measured
/// level within the noise (`isa_probe W1 W2 W4`, f32, 2 threads, AMD Zen 4, 6 alternating
/// rounds, each the best of 20; median of the rounds: W1/W2/W4 full backward 1.02/40.03/100.5 ms
/// at 64, 1.09/40.31/100.3 at 32, 1.08/41.58/101.4 at 128).
pub(crate) const MIN_TILE_PIXELS: usize = 64;

/// Tasks the partition aims for, independent of the thread count: enough to balance 2-4
/// threads, few enough that W2 (4 offset groups) needs no weight partials. Same run as
/// [`MIN_TILE_PIXELS`]: W1/W2 full backward 1.02/40.03 ms at 4, 1.11/41.97 at 2,
/// 1.17/42.36 at 8 (best rounds 1.01/39.73, 1.00/39.64, 1.10/40.71).
pub(crate) const MIN_TASKS: usize = 4;

pub(crate) use super::Piece;

/// A set of whole images processed by one task, as a list of tiles.
#[derive(Debug, Clone)]
pub(crate) struct ImageGroup {
    pub(crate) images: Range<usize>,
    pub(crate) tiles: Vec<Vec<Piece>>,
}

/// Channels `c_lo..c_hi` (global) of one offset group inside one conv group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Segment {
    pub(crate) conv_group: usize,
    pub(crate) c_lo: usize,
    pub(crate) c_hi: usize,
    /// Start of this segment's block in the task's weight partial.
    pub(crate) part_offset: usize,
}

/// The fixed decomposition of one problem.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Planned for the pixel-major path of deformable problems (narrower tiles, tap-major
    /// weight partials).
    pub(crate) pixel_major: bool,
    pub(crate) groups: Vec<ImageGroup>,
    pub(crate) slots: usize,
    pub(crate) max_tile: usize,
    pub(crate) max_images: usize,
}

impl Plan {
    /// The partition of the module docs for `g`, whose planes have `layout`. A pixel-major
    /// plan packs at most [`MAX_CELLS`] plane cells into one image group, so that the column
    /// table's `i32` bases reach every cell (validation refuses larger single planes).
    pub(crate) fn new(g: &Geometry, layout: PlaneLayout, pixel_major: bool) -> Plan {
        let hw = g.out_pixels();
        let tile_pixels = if pixel_major {
            // One pixel's column gradient: K taps of the widest segment (<= C_in/G_off), f32.
            let per_pixel = (g.taps() * g.c_per_offset_group() * 4).max(1);
            (PIXEL_MAJOR_TILE_BYTES / per_pixel)
                .next_multiple_of(16)
                .clamp(MIN_TILE_PIXELS, TILE_PIXELS)
        } else {
            TILE_PIXELS
        };
        let mut groups = Vec::new();
        if hw >= tile_pixels {
            let n_tiles = hw.div_ceil(tile_pixels);
            let width = hw.div_ceil(n_tiles);
            for n in 0..g.n {
                let tiles = (0..hw)
                    .step_by(width)
                    .map(|p0| {
                        vec![Piece {
                            image: n,
                            pixels: p0..(p0 + width).min(hw),
                            col0: 0,
                        }]
                    })
                    .collect();
                groups.push(ImageGroup {
                    images: n..n + 1,
                    tiles,
                });
            }
        } else if g.n > 0 {
            let mut per_group = (tile_pixels / hw).max(1);
            if pixel_major {
                per_group = per_group.min((MAX_CELLS / layout.len()).max(1));
            }
            let n_groups = g.n.div_ceil(per_group);
            let per_group = g.n.div_ceil(n_groups);
            for first in (0..g.n).step_by(per_group) {
                let images = first..(first + per_group).min(g.n);
                let tile = images
                    .clone()
                    .enumerate()
                    .map(|(i, n)| Piece {
                        image: n,
                        pixels: 0..hw,
                        col0: i * hw,
                    })
                    .collect();
                groups.push(ImageGroup {
                    images,
                    tiles: vec![tile],
                });
            }
        }
        let slots = MIN_TASKS
            .div_ceil(g.offset_groups)
            .clamp(1, groups.len().max(1));
        let max_tile = groups
            .iter()
            .flat_map(|gr| gr.tiles.iter())
            .map(|t| t.iter().map(|p| p.pixels.len()).sum::<usize>())
            .max()
            .unwrap_or(0);
        let max_images = groups.iter().map(|gr| gr.images.len()).max().unwrap_or(0);
        Plan {
            groups,
            slots,
            max_tile,
            max_images,
            pixel_major,
        }
    }

    /// Number of tasks, `slots * G_off` (0 for an empty batch).
    pub(crate) fn tasks(&self, g: &Geometry) -> usize {
        if self.groups.is_empty() {
            0
        } else {
            self.slots * g.offset_groups
        }
    }

    /// Most images in one image group.
    #[cfg(test)]
    pub(crate) fn max_images(&self) -> usize {
        self.max_images
    }

    /// Slot of image `n`.
    pub(crate) fn slot_of_image(&self, n: usize) -> usize {
        // Groups are in image order; find the group of n.
        let gi = self
            .groups
            .partition_point(|gr| gr.images.end <= n)
            .min(self.groups.len().saturating_sub(1));
        gi % self.slots
    }
}

/// The segments of offset group `og`, with their offsets in the task's weight partial.
pub(crate) fn segments(g: &Geometry, og: usize) -> Vec<Segment> {
    let cpo = g.c_per_offset_group();
    let cig = g.c_in_per_group();
    let (lo, hi) = (og * cpo, (og + 1) * cpo);
    let mut out = Vec::new();
    let mut c = lo;
    let mut part_offset = 0;
    while c < hi {
        let conv_group = c / cig;
        let c_hi = hi.min((conv_group + 1) * cig);
        out.push(Segment {
            conv_group,
            c_lo: c,
            c_hi,
            part_offset,
        });
        part_offset += g.c_out_per_group() * (c_hi - c) * g.taps();
        c = c_hi;
    }
    out
}
