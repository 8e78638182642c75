//! How a call's work is cut into independent pieces: the one place where tile sizes are
//! chosen, for the forward ([`forward`]) and the backward ([`backward`]).
//!
//! Both partitions follow one rule: **they depend only on the problem's geometry** (shapes,
//! parameters, element size), never on the number of threads, on which gradients are wanted or
//! on the batch size beyond its images, and every output element is written by exactly one
//! piece in a fixed order. That is what makes every result bitwise identical for any rayon pool
//! and for an image computed alone or inside a batch.
//!
//! They differ in what a piece must own:
//! - a forward tile is any flat range of output pixels over the batch (its outputs are its
//!   own whatever the range), so small images are batched into one GEMM-wide tile;
//! - a backward task owns whole images' `grad_input` (a scatter reaches any input cell of its
//!   images) and an offset group's share of `grad_weight`, so whole images are dealt to a fixed
//!   number of slots and summed in slot order.
//!
//! Every tile constant carries the measurement behind it: the forward's column budget, lane
//! multiple and tile count in [`forward`], the backward's tile widths and task count in
//! [`backward`]; the kernels' own blockings (GEMM depth and columns, pixel-major copy
//! budget, gather stage, scatter chunk) sit beside the kernels they shape.

pub(crate) mod backward;
pub(crate) mod forward;

use std::ops::Range;

/// One contiguous run of output pixels of one image inside a tile: a backward tile holds
/// pieces of several images, a forward table one (`kernels::tile_table`).
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    /// Image index `n`.
    pub(crate) image: usize,
    /// Pixel range `p0..p1` (row-major `y * W_out + x`).
    pub(crate) pixels: Range<usize>,
    /// Column of `p0` in the tile.
    pub(crate) col0: usize,
}
