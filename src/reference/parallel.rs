//! Running the sums in parallel.
//!
//! Every result element of the oracle is one sum, accumulated term after term in exactly the
//! order its formula reads (the order of the serial loops this module started as). What runs in
//! parallel is *which elements* a task computes, never the terms of one element: a task owns
//! whole elements (a run of output pixels of one image, one input plane, a block of weight
//! entries), so every element is bitwise the same for any number of threads. Where it pays,
//! a task first computes the values several sums share (the column values `m * B`, the column
//! gradients `gcol`) into a small buffer, and then advances several independent sums side by
//! side, each still in its own order.

use std::ops::Range;

use ndarray::{Array4, ArrayView4};

use super::sampling::{tap, Tap};
use super::{bilinear, dims};
use crate::convention::Convention;
use crate::error::Result;
use crate::float::Float;
use crate::geometry::{try_zeros, Geometry};
use crate::params::ConvParams;

/// Output pixels (of one image) handled by one task.
const PIXELS_PER_TASK: usize = 32;

/// Largest column buffer of a `grad_weight` task, in `f64` values (16 MiB).
pub(super) const WEIGHT_TASK_VALUES: usize = 1 << 21;

/// A copy of `a` in `f64`, standard layout (so that rows are slices).
fn owned<T: Float>(what: &str, a: &ArrayView4<'_, T>) -> Result<Array4<f64>> {
    let mut out = try_zeros(what, dims(a.shape()), 0.0)?;
    out.zip_mut_with(a, |o, &v| *o = v.to_f64());
    Ok(out)
}

/// The operands of one problem in `f64`, standard layout, with its geometry.
pub(super) struct Prepared {
    pub(super) g: Geometry,
    pub(super) conv: Convention,
    input: Option<Array4<f64>>,
    offset: Array4<f64>,
    mask: Option<Array4<f64>>,
    /// `[C_out, C_in / groups * kh * kw]`: row `o` holds `weight[o, c', i, j]` at
    /// `c' * K + i * kw + j`.
    weight: Array4<f64>,
    grad_out: Option<Array4<f64>>,
}

impl Prepared {
    pub(super) fn input(&self) -> ArrayView4<'_, f64> {
        self.input.as_ref().expect("input prepared").view()
    }

    fn mask(&self) -> Option<ArrayView4<'_, f64>> {
        self.mask.as_ref().map(|m| m.view())
    }

    pub(super) fn tap(&self, n: usize, og: usize, k: usize, pixel: usize) -> Tap {
        let g = &self.g;
        let (i, j) = (k / g.kw, k % g.kw);
        let (y, x) = (pixel / g.w_out, pixel % g.w_out);
        tap(
            g,
            &self.offset.view(),
            self.mask().as_ref(),
            (n, og, i, j, y, x),
        )
    }

    /// `grad_out[n, o]` as a slice of `H_out * W_out` values.
    pub(super) fn grad_out_plane(&self, n: usize, o: usize) -> &[f64] {
        let go = self.grad_out.as_ref().expect("grad_out prepared");
        let hw = self.g.out_pixels();
        let start = (n * self.g.c_out + o) * hw;
        &go.as_slice().expect("standard layout")[start..start + hw]
    }

    /// Row `o` of the weight: `C_in / groups * K` values.
    pub(super) fn weight_row(&self, o: usize) -> &[f64] {
        let len = self.g.c_in_per_group() * self.g.taps();
        &self.weight.as_slice().expect("standard layout")[o * len..(o + 1) * len]
    }

    /// Column values `m * B(input[n, c], py, px)` for `pixels` of image `n` and input channels
    /// `channels`, pixel-major: `[pixel][(c - channels.start) * K + k]`.
    pub(super) fn columns(
        &self,
        n: usize,
        pixels: Range<usize>,
        channels: Range<usize>,
    ) -> Vec<f64> {
        let g = &self.g;
        let (kk, input) = (g.taps(), self.input());
        let mut cols = Vec::with_capacity(pixels.len() * channels.len() * kk);
        let mut taps = Vec::with_capacity(g.offset_groups * kk);
        for p in pixels {
            taps.clear();
            taps.extend((0..g.offset_groups * kk).map(|t| self.tap(n, t / kk, t % kk, p)));
            for c in channels.clone() {
                let og = c / g.c_per_offset_group();
                for t in &taps[og * kk..(og + 1) * kk] {
                    // The column value m * B first, as the fast path and torchvision form it.
                    cols.push(t.m * bilinear(self.conv, &input, n, c, t.py, t.px));
                }
            }
        }
        cols
    }

    /// Column gradients `gcol[c, k, n, y, x]` for `pixels` of image `n`, pixel-major:
    /// `[pixel][c * K + k]`, each the sum over `o in group(c)` in increasing `o`, from `-0.0`
    /// (the start of `Iterator::sum` for floats).
    pub(super) fn column_gradients(&self, n: usize, pixels: Range<usize>) -> Vec<f64> {
        let g = &self.g;
        let row_len = g.c_in * g.taps();
        let group_len = g.c_in_per_group() * g.taps();
        let mut gcol = vec![-0.0; pixels.len() * row_len];
        // o outermost so that each weight row serves every pixel of the run; each sum still
        // adds its terms in increasing o.
        for grp in 0..g.groups {
            for o in grp * g.c_out_per_group()..(grp + 1) * g.c_out_per_group() {
                let (wrow, plane) = (self.weight_row(o), self.grad_out_plane(n, o));
                for (row, p) in gcol.chunks_exact_mut(row_len.max(1)).zip(pixels.clone()) {
                    let go = plane[p];
                    let acc = &mut row[grp * group_len..(grp + 1) * group_len];
                    for (a, &w) in acc.iter_mut().zip(wrow) {
                        *a += w * go;
                    }
                }
            }
        }
        gcol
    }
}

/// Prepares operands: validates like every entry point, then copies to `f64`.
pub(super) fn prepare<T: Float>(
    g: Geometry,
    params: &ConvParams,
    input: Option<&ArrayView4<'_, T>>,
    offset: &ArrayView4<'_, T>,
    mask: Option<&ArrayView4<'_, T>>,
    weight: &ArrayView4<'_, T>,
    grad_out: Option<&ArrayView4<'_, T>>,
) -> Result<Prepared> {
    Ok(Prepared {
        g,
        conv: params.convention,
        input: input.map(|x| owned("input", x)).transpose()?,
        offset: owned("offset", offset)?,
        mask: mask.map(|m| owned("mask", m)).transpose()?,
        weight: owned("weight", weight)?,
        grad_out: grad_out.map(|go| owned("grad_out", go)).transpose()?,
    })
}

/// The pixel runs of every image, one per task: `(n, first pixel .. end)`.
pub(super) fn pixel_tasks(g: &Geometry) -> Vec<(usize, Range<usize>)> {
    let hw = g.out_pixels();
    (0..g.n)
        .flat_map(|n| {
            (0..hw)
                .step_by(PIXELS_PER_TASK)
                .map(move |p| (n, p..(p + PIXELS_PER_TASK).min(hw)))
        })
        .collect()
}

/// Writes pixel-major task results (`[pixel][channel]`, `channels` per pixel) into the NCHW
/// array `dst`.
pub(super) fn scatter_pixels(
    dst: &mut Array4<f64>,
    tasks: &[(usize, Range<usize>)],
    blocks: &[Vec<f64>],
) {
    let (channels, hw) = (dst.shape()[1], dst.shape()[2] * dst.shape()[3]);
    let dst = dst.as_slice_mut().expect("standard layout");
    for ((n, pixels), block) in tasks.iter().zip(blocks) {
        for (row, p) in block.chunks_exact(channels.max(1)).zip(pixels.clone()) {
            for (ch, &v) in row.iter().enumerate() {
                dst[(n * channels + ch) * hw + p] = v;
            }
        }
    }
}
