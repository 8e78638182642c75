//! The reference oracle: forward and every gradient as plain loops straight from the formulas,
//! accumulating in `f64` whatever the input type.
//!
//! This module is what the fast path, and other projects' kernels, are judged against. It shares
//! nothing with the fast path except shape validation ([`Geometry`]): no im2col, no GEMM, no
//! tiling, no SIMD. It is slow on purpose, and meant to be read.
//!
//! Notation (torchvision's): image `n`, output channel `o`, input channel `c` with index
//! `c' = c mod (C_in / groups)` inside its group, kernel tap `k = i * kw + j`, output pixel
//! `(y, x)`, offset group `g(c) = c / (C_in / G_off)`. The sample of tap `k` at `(y, x)` sits at
//!
//! ```text
//! py = y * stride_h - pad_top  + i * dil_h + offset[n, 2 (g K + k),     y, x]
//! px = x * stride_w - pad_left + j * dil_w + offset[n, 2 (g K + k) + 1, y, x]
//! ```
//!
//! and is weighted by `m = mask[n, g K + k, y, x]` (1 without a mask). Positions are exact:
//! the integer part `y * stride_h - pad_top + i * dil_h` is formed in `i128` and the offset is
//! split into `floor(offset)` and its fraction, so `py` is never rounded (`Coord`).
//!
//! Bilinear sampling `B(v, py, px)` under the default [`Convention::Torchvision`]: 0 unless
//! `-1 < py < H` and `-1 < px < W`; otherwise with `y0 = floor(py)`, `x0 = floor(px)`,
//! `ly = py - y0`, `lx = px - x0`,
//! `B = (1-ly)(1-lx) v[y0,x0] + (1-ly) lx v[y0,x0+1] + ly (1-lx) v[y0+1,x0] + ly lx v[y0+1,x0+1]`,
//! where pixels outside the image read 0. A NaN position gives `B = NaN` and touches no pixel.
//!
//! `params.convention` selects another border rule ([`Convention::Mmcv`],
//! [`Convention::DcnV1`]); every function here follows it, forward and backward, and the
//! three private rules `counts`, `cell` and `coordinate_weights` are where they differ.

use std::ops::Range;

use ndarray::{Array1, Array4, ArrayView1, ArrayView4, ShapeBuilder};
use rayon::prelude::*;

use crate::convention::Convention;
use crate::error::Result;
use crate::float::Float;
use crate::geometry::{try_zeros, Geometry};
use crate::params::ConvParams;

fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// Validates the operands of a deformable convolution and returns its geometry.
fn deform_geometry<T: Float>(
    input_shape: [usize; 4],
    weight_shape: [usize; 4],
    offset: &ArrayView4<'_, T>,
    mask: Option<&ArrayView4<'_, T>>,
    params: &ConvParams,
) -> Result<Geometry> {
    let g = Geometry::new(input_shape, weight_shape, params)?;
    g.check_offset(offset.shape())?;
    if let Some(m) = mask {
        g.check_mask(m.shape())?;
    }
    Ok(g)
}

/// A sample coordinate along one axis, kept exactly as `whole + frac`: `whole` is the tap's
/// integer position `out * stride - pad + tap * dilation` plus `floor(offset)`, and
/// `frac = offset - floor(offset)` in `[0, 1]`. Forming `base + offset` in floating point would
/// round (e.g. `2 + (1 - 2^-53)` becomes `3`, which moves the corners); the split does not.
/// A NaN offset gives a NaN `whole`; an infinite one an infinite `whole` with `frac = 0`.
/// `comp = (floor(offset) + 1) - offset` is `1 - frac` computed without cancellation (for an
/// offset just below an integer, `frac` rounds to 1 but `comp` keeps its few ulps).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Coord {
    whole: f64,
    frac: f64,
    comp: f64,
}

impl Coord {
    /// The coordinate `base + d`.
    pub(crate) fn new(base: i128, d: f64) -> Coord {
        let f = d.floor();
        let (frac, comp) = if d.is_infinite() {
            (0.0, 1.0)
        } else {
            (d - f, (f + 1.0) - d)
        };
        Coord {
            whole: base as f64 + f,
            frac,
            comp,
        }
    }

    fn is_nan(self) -> bool {
        self.whole.is_nan()
    }

    fn is_infinite(self) -> bool {
        self.whole.is_infinite()
    }
}

/// Everything about one (image, tap, output pixel, offset group): where it samples and how
/// much the mask weighs it.
struct Tap {
    py: Coord,
    px: Coord,
    m: f64,
}

fn tap<T: Float>(
    g: &Geometry,
    offset: &ArrayView4<'_, T>,
    mask: Option<&ArrayView4<'_, T>>,
    (n, og, i, j, y, x): (usize, usize, usize, usize, usize, usize),
) -> Tap {
    let k = i * g.kw + j;
    let ch = og * g.taps() + k;
    let dy = offset[[n, 2 * ch, y, x]].to_f64();
    let dx = offset[[n, 2 * ch + 1, y, x]].to_f64();
    let py = Coord::new(tap_base(y, g.stride_h, g.pad_top, i, g.dil_h), dy);
    let px = Coord::new(tap_base(x, g.stride_w, g.pad_left, j, g.dil_w), dx);
    let m = mask.map_or(1.0, |m| m[[n, ch, y, x]].to_f64());
    Tap { py, px, m }
}

/// The undeformed position `out * stride - pad + tap * dil`, exactly (in `i128`).
fn tap_base(out: usize, stride: usize, pad: usize, tap: usize, dil: usize) -> i128 {
    out as i128 * stride as i128 - pad as i128 + tap as i128 * dil as i128
}

/// Pixel `(r, s)` of plane `(n, c)`, or 0 outside the image. `r`, `s` are whole numbers held
/// in `f64` so that far-away positions are compared before any cast.
fn pixel<T: Float>(input: &ArrayView4<'_, T>, n: usize, c: usize, r: f64, s: f64) -> f64 {
    let (h, w) = (input.shape()[2] as f64, input.shape()[3] as f64);
    if r >= 0.0 && r < h && s >= 0.0 && s < w {
        input[[n, c, r as usize, s as usize]].to_f64()
    } else {
        0.0
    }
}

/// Whether the sample at `(py, px)` counts (has a value and sends gradient to the input):
/// the convention's window. NaN positions never count.
///
/// - torchvision, mmcv: `-1 < py < H` and `-1 < px < W`;
/// - DCN v1: `0 <= py < H` and `0 <= px < W`.
pub(crate) fn counts(conv: Convention, h: usize, w: usize, py: Coord, px: Coord) -> bool {
    // With p = whole + frac, frac in [0, 1]:  p > -1  <=>  whole >= 0 or (whole = -1, frac > 0);
    // p >= 0  <=>  whole >= 0;  p < size  <=>  whole < size.
    let above_minus_one = |c: Coord| c.whole >= 0.0 || (c.whole == -1.0 && c.frac > 0.0);
    let below = |c: Coord, size: usize| c.whole < size as f64;
    match conv {
        Convention::Torchvision | Convention::Mmcv => {
            above_minus_one(py) && above_minus_one(px) && below(py, h) && below(px, w)
        }
        Convention::DcnV1 => py.whole >= 0.0 && px.whole >= 0.0 && below(py, h) && below(px, w),
    }
}

/// The corner rows `y0, y1`, columns `x0, x1` and fractions `ly, lx` the sample at `(py, px)`
/// interpolates between, with no window test.
struct Cell {
    y0: f64,
    y1: f64,
    x0: f64,
    x1: f64,
    ly: f64,
    lx: f64,
    /// `1 - ly`, `1 - lx` (see [`Coord`]).
    hy: f64,
    hx: f64,
}

/// The cell of a sample:
///
/// - torchvision, mmcv: `y0 = floor(py)`, `y1 = y0 + 1`, `ly = py - y0` (likewise x);
/// - DCN v1: the same, except that when `floor(py) >= H - 1` the corners collapse onto the
///   last row, `y0 = y1 = H - 1`, and `ly = 0` (likewise x with `W`).
fn cell(conv: Convention, h: usize, w: usize, py: Coord, px: Coord) -> Cell {
    let axis = |p: Coord, size: usize| {
        let last = size as f64 - 1.0;
        match conv {
            Convention::DcnV1 if p.whole >= last => (last, last, 0.0, 1.0),
            _ => (p.whole, p.whole + 1.0, p.frac, p.comp),
        }
    };
    let (y0, y1, ly, hy) = axis(py, h);
    let (x0, x1, lx, hx) = axis(px, w);
    Cell {
        y0,
        y1,
        x0,
        x1,
        ly,
        lx,
        hy,
        hx,
    }
}

/// The four corners `(r, s)` of a sample and their bilinear weights, or `None` if the sample
/// does not count (outside the convention's window, or NaN).
pub(crate) fn corners(
    conv: Convention,
    h: usize,
    w: usize,
    py: Coord,
    px: Coord,
) -> Option<[(f64, f64, f64); 4]> {
    if !counts(conv, h, w, py, px) {
        return None;
    }
    let Cell {
        y0,
        y1,
        x0,
        x1,
        ly,
        lx,
        hy,
        hx,
    } = cell(conv, h, w, py, px);
    // (1 - ly)(1 - lx), (1 - ly) lx, ly (1 - lx), ly lx.
    Some([
        (y0, x0, hy * hx),
        (y0, x1, hy * lx),
        (y1, x0, ly * hx),
        (y1, x1, ly * lx),
    ])
}

/// `B(input[n, c], py, px)`: bilinear sampling by the convention, pixels outside the image
/// reading 0.
pub(crate) fn bilinear<T: Float>(
    conv: Convention,
    input: &ArrayView4<'_, T>,
    n: usize,
    c: usize,
    py: Coord,
    px: Coord,
) -> f64 {
    if py.is_nan() || px.is_nan() {
        return f64::NAN;
    }
    let (h, w) = (input.shape()[2], input.shape()[3]);
    match corners(conv, h, w, py, px) {
        None => 0.0,
        Some(cs) => cs
            .iter()
            .map(|&(r, s, wt)| wt * pixel(input, n, c, r, s))
            .sum(),
    }
}

/// `(dB/dpy, dB/dpx)` as the convention computes them, on the corners of [`cell`]:
///
/// ```text
/// Wy = lx (v[y1,x1] - v[y0,x1]) + (1-lx)(v[y1,x0] - v[y0,x0])
/// Wx = ly (v[y1,x1] - v[y1,x0]) + (1-ly)(v[y0,x1] - v[y0,x0])
/// ```
///
/// corners outside the image reading 0. torchvision applies no window cut-off (so at an
/// integer position, `py = -1` included, this is the forward difference); mmcv and DCN v1
/// give 0 outside their window. Under DCN v1 a collapsed axis (`y0 = y1`) gives 0 along it.
/// NaN positions give NaN, infinite ones 0.
pub(crate) fn coordinate_weights<T: Float>(
    conv: Convention,
    input: &ArrayView4<'_, T>,
    n: usize,
    c: usize,
    py: Coord,
    px: Coord,
) -> (f64, f64) {
    if py.is_nan() || px.is_nan() {
        return (f64::NAN, f64::NAN);
    }
    let (h, w) = (input.shape()[2], input.shape()[3]);
    let cut_off = match conv {
        Convention::Torchvision => py.is_infinite() || px.is_infinite(),
        Convention::Mmcv | Convention::DcnV1 => !counts(conv, h, w, py, px),
    };
    if cut_off {
        return (0.0, 0.0);
    }
    let Cell {
        y0,
        y1,
        x0,
        x1,
        ly,
        lx,
        hy,
        hx,
    } = cell(conv, h, w, py, px);
    let v = |r: f64, s: f64| pixel(input, n, c, r, s);
    let (v00, v01) = (v(y0, x0), v(y0, x1));
    let (v10, v11) = (v(y1, x0), v(y1, x1));
    // hx = 1 - lx, hy = 1 - ly.
    let wy = lx * (v11 - v01) + hx * (v10 - v00);
    let wx = ly * (v11 - v10) + hy * (v01 - v00);
    (wy, wx)
}
// ---------------------------------------------------------------------------------------------
// Running the sums in parallel.
//
// Every result element below is one sum, accumulated term after term in exactly the order the
// formulas above read (the order of the serial loops this module started as). What runs in
// parallel is *which elements* a task computes, never the terms of one element: a task owns
// whole elements (a run of output pixels of one image, one input plane, a block of weight
// entries), so every element is bitwise the same for any number of threads. Where it pays,
// a task first computes the values several sums share (the column values `m * B`, the column
// gradients `gcol`) into a small buffer, and then advances several independent sums side by
// side, each still in its own order.
// ---------------------------------------------------------------------------------------------

/// Output pixels (of one image) handled by one task.
const PIXELS_PER_TASK: usize = 32;

/// Largest column buffer of a `grad_weight` task, in `f64` values (16 MiB).
const WEIGHT_TASK_VALUES: usize = 1 << 21;

/// A copy of `a` in `f64`, standard layout (so that rows are slices).
fn owned<T: Float>(what: &str, a: &ArrayView4<'_, T>) -> Result<Array4<f64>> {
    let mut out = try_zeros(what, dims(a.shape()), 0.0)?;
    out.zip_mut_with(a, |o, &v| *o = v.to_f64());
    Ok(out)
}

/// The operands of one problem in `f64`, standard layout, with its geometry.
struct Prepared {
    g: Geometry,
    conv: Convention,
    input: Option<Array4<f64>>,
    offset: Array4<f64>,
    mask: Option<Array4<f64>>,
    /// `[C_out, C_in / groups * kh * kw]`: row `o` holds `weight[o, c', i, j]` at
    /// `c' * K + i * kw + j`.
    weight: Array4<f64>,
    grad_out: Option<Array4<f64>>,
}

impl Prepared {
    fn input(&self) -> ArrayView4<'_, f64> {
        self.input.as_ref().expect("input prepared").view()
    }

    fn mask(&self) -> Option<ArrayView4<'_, f64>> {
        self.mask.as_ref().map(|m| m.view())
    }

    fn tap(&self, n: usize, og: usize, k: usize, pixel: usize) -> Tap {
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
    fn grad_out_plane(&self, n: usize, o: usize) -> &[f64] {
        let go = self.grad_out.as_ref().expect("grad_out prepared");
        let hw = self.g.out_pixels();
        let start = (n * self.g.c_out + o) * hw;
        &go.as_slice().expect("standard layout")[start..start + hw]
    }

    /// Row `o` of the weight: `C_in / groups * K` values.
    fn weight_row(&self, o: usize) -> &[f64] {
        let len = self.g.c_in_per_group() * self.g.taps();
        &self.weight.as_slice().expect("standard layout")[o * len..(o + 1) * len]
    }

    /// Column values `m * B(input[n, c], py, px)` for `pixels` of image `n` and input channels
    /// `channels`, pixel-major: `[pixel][(c - channels.start) * K + k]`.
    fn columns(&self, n: usize, pixels: Range<usize>, channels: Range<usize>) -> Vec<f64> {
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
    fn column_gradients(&self, n: usize, pixels: Range<usize>) -> Vec<f64> {
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
fn prepare<T: Float>(
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
fn pixel_tasks(g: &Geometry) -> Vec<(usize, Range<usize>)> {
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
fn scatter_pixels(dst: &mut Array4<f64>, tasks: &[(usize, Range<usize>)], blocks: &[Vec<f64>]) {
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

/// Forward deformable convolution (DCN v1 without `mask`, v2 with):
///
/// ```text
/// out[n, o, y, x] = bias[o] + sum_{c' < C_in/groups} sum_{i, j} weight[o, c', i, j] * m * B(input[n, c], py, px)
/// ```
///
/// with `c = group(o) * C_in/groups + c'` and `py`, `px`, `m`, `B` as in the module docs; the
/// sum starts from `bias[o]` (or 0) and adds the terms in the order `c', i, j`.
///
/// ```
/// use deformconv::{reference, ConvParams};
/// use ndarray::Array4;
/// // A 1x1 kernel with offset (0.5, 0) averages each pixel with the one below it.
/// let input = Array4::from_shape_vec((1, 1, 2, 1), vec![1.0f64, 3.0]).unwrap();
/// let weight = Array4::from_elem((1, 1, 1, 1), 1.0);
/// let mut offset = Array4::zeros((1, 2, 2, 1));
/// offset[[0, 0, 0, 0]] = 0.5;
/// let out = reference::deform_conv2d(input.view(), offset.view(), None, weight.view(), None,
///                                    &ConvParams::default()).unwrap();
/// assert_eq!(out[[0, 0, 0, 0]], 2.0);
/// assert_eq!(out[[0, 0, 1, 0]], 3.0);
/// ```
pub fn deform_conv2d<T: Float>(
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Array4<f64>> {
    let g = deform_geometry(
        dims(input.shape()),
        dims(weight.shape()),
        &offset,
        mask.as_ref(),
        params,
    )?;
    if let Some(b) = &bias {
        g.check_bias(b.len())?;
    }
    let mut out = try_zeros("output", g.out_shape(), 0.0)?;
    let bias: Option<Vec<f64>> = bias.map(|b| b.iter().map(|v| v.to_f64()).collect());
    let pr = prepare(
        g,
        params,
        Some(&input),
        &offset,
        mask.as_ref(),
        &weight,
        None,
    )?;
    let g = &pr.g;
    let (cig, cog, kk) = (g.c_in_per_group(), g.c_out_per_group(), g.taps());
    // weight by column: `by_column[(group * cig * K + e) * cog + o']` = weight[group * cog + o', e].
    let mut by_column = vec![0.0; g.c_out * cig * kk];
    for o in 0..g.c_out {
        let (grp, ol) = (o / cog, o % cog);
        for (e, &w) in pr.weight_row(o).iter().enumerate() {
            by_column[(grp * cig * kk + e) * cog + ol] = w;
        }
    }
    let tasks = pixel_tasks(g);
    let blocks: Vec<Vec<f64>> = tasks
        .par_iter()
        .map(|(n, pixels)| {
            let cols = pr.columns(*n, pixels.clone(), 0..g.c_in);
            let mut res = vec![0.0; pixels.len() * g.c_out];
            let row_len = g.c_in * kk;
            for (ol, a) in res.iter_mut().enumerate() {
                *a = bias.as_ref().map_or(0.0, |b| b[ol % g.c_out.max(1)]);
            }
            // Term e outermost so that each weight column serves every pixel of the run; each
            // sum still adds its terms in increasing e = c' * K + k after the bias.
            for grp in 0..g.groups {
                for e in 0..cig * kk {
                    let ws = &by_column[(grp * cig * kk + e) * cog..][..cog];
                    for (p, outs) in res.chunks_exact_mut(g.c_out.max(1)).enumerate() {
                        let col = cols[p * row_len + grp * cig * kk + e];
                        let acc = &mut outs[grp * cog..(grp + 1) * cog];
                        for (a, &w) in acc.iter_mut().zip(ws) {
                            *a += w * col;
                        }
                    }
                }
            }
            res
        })
        .collect();
    scatter_pixels(&mut out, &tasks, &blocks);
    Ok(out)
}

/// Dense (strided, dilated, grouped) cross-correlation, written directly with no sampling:
///
/// ```text
/// out[n, o, y, x] = bias[o] + sum_{c', i, j} weight[o, c', i, j] * input[n, c, y*sh - pad_top + i*dh, x*sw - pad_left + j*dw]
/// ```
///
/// with pixels outside the image reading 0. Equal to [`deform_conv2d`] with zero offsets and no mask.
pub fn conv2d<T: Float>(
    input: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    bias: Option<ArrayView1<'_, T>>,
    params: &ConvParams,
) -> Result<Array4<f64>> {
    let g = Geometry::new(dims(input.shape()), dims(weight.shape()), params)?;
    if let Some(b) = &bias {
        g.check_bias(b.len())?;
    }
    let mut out = try_zeros("output", g.out_shape(), 0.0)?;
    let [_, c_out, h_out, w_out] = g.out_shape();
    let slots = out.as_slice_mut().expect("standard layout");
    slots.par_iter_mut().enumerate().for_each(|(flat, slot)| {
        let (x, rest) = (flat % w_out, flat / w_out);
        let (y, rest) = (rest % h_out, rest / h_out);
        let (o, n) = (rest % c_out, rest / c_out);
        let group = o / g.c_out_per_group();
        let mut acc = bias.as_ref().map_or(0.0, |b| b[o].to_f64());
        for ci in 0..g.c_in_per_group() {
            let c = group * g.c_in_per_group() + ci;
            for i in 0..g.kh {
                for j in 0..g.kw {
                    // Exact in i128; past 2^53 the f64 rounding stays far outside the image.
                    let r = tap_base(y, g.stride_h, g.pad_top, i, g.dil_h) as f64;
                    let s = tap_base(x, g.stride_w, g.pad_left, j, g.dil_w) as f64;
                    acc += weight[[o, ci, i, j]].to_f64() * pixel(&input, n, c, r, s);
                }
            }
        }
        *slot = acc;
    });
    Ok(out)
}

/// Gradient with respect to the input: each sample hands its column gradient, times the mask,
/// to the four corners it read, with the forward's bilinear weights:
///
/// ```text
/// grad_input[n, c, r, s] = sum_{i, j, y, x} gcol[c, k, n, y, x] * m * dB/dv[r, s]
/// gcol[c, k, n, y, x]    = sum_{o in group(c)} weight[o, c', i, j] * grad_out[n, o, y, x]
/// ```
///
/// `input_shape` is `[N, C_in, H, W]`; samples outside the convention's window (or NaN) send
/// nothing. Under [`Convention::DcnV1`] a sample on the last row or column gives that row or
/// column the full weight (its corners collapse). Each pixel's sum runs over `i, j, y, x` in
/// that order (the corners `(y0, x0)`, `(y0, x1)`, `(y1, x0)`, `(y1, x1)` in turn).
pub fn grad_input<T: Float>(
    grad_out: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    input_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<f64>> {
    let g = deform_geometry(
        input_shape,
        dims(weight.shape()),
        &offset,
        mask.as_ref(),
        params,
    )?;
    g.check_out("grad_out", grad_out.shape())?;
    let mut grad = try_zeros("grad_input", input_shape, 0.0)?;
    let pr = prepare(
        g,
        params,
        None,
        &offset,
        mask.as_ref(),
        &weight,
        Some(&grad_out),
    )?;
    let g = &pr.g;
    let (hw, plane) = (g.out_pixels(), g.h * g.w);
    let (cig, kk) = (g.c_in_per_group(), g.taps());
    let planes = grad.as_slice_mut().expect("standard layout");
    planes
        .par_chunks_mut(plane.max(1))
        .enumerate()
        .for_each(|(nc, dst)| {
            let (n, c) = (nc / g.c_in, nc % g.c_in);
            let (og, grp, ci) = (c / g.c_per_offset_group(), c / cig, c % cig);
            // gcol[c, k, n, ., .] for every tap and output pixel, each sum in increasing o
            // (every tap at once, so that each grad_out plane is read once per channel).
            let mut gcols = vec![-0.0; kk * hw];
            for o in grp * g.c_out_per_group()..(grp + 1) * g.c_out_per_group() {
                let (wrow, plane) = (pr.weight_row(o), pr.grad_out_plane(n, o));
                for (k, gcol) in gcols.chunks_exact_mut(hw.max(1)).enumerate() {
                    let w = wrow[ci * kk + k];
                    for (a, &go) in gcol.iter_mut().zip(plane) {
                        *a += w * go;
                    }
                }
            }
            for (k, gcol) in gcols.chunks_exact(hw.max(1)).enumerate() {
                for (p, &gc) in gcol.iter().enumerate() {
                    let t = pr.tap(n, og, k, p);
                    let Some(cs) = corners(pr.conv, g.h, g.w, t.py, t.px) else {
                        continue;
                    };
                    for (r, s, wt) in cs {
                        if r >= 0.0 && r < g.h as f64 && s >= 0.0 && s < g.w as f64 {
                            dst[r as usize * g.w + s as usize] += gc * t.m * wt;
                        }
                    }
                }
            }
        });
    Ok(grad)
}

/// What [`sample_sums`] adds up per sample, over the channels `c` of its offset group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SampleSum {
    /// `grad_offset`: `(sum_c gcol * m * Wy, sum_c gcol * m * Wx)`.
    Offset,
    /// `grad_mask`: `sum_c gcol * B`.
    Mask,
    /// The magnitudes of `grad_offset`'s terms (operands already absolute, no window cut-off):
    /// `(m * sum_c gcol * Ay, m * sum_c gcol * Ax)` with
    /// `Ay = lx (v11 + v01) + (1 - lx)(v10 + v00)`, `Ax = ly (v11 + v10) + (1 - ly)(v01 + v00)`
    /// on the convention's cell.
    OffsetMagnitude,
}

/// The per-sample sums of `grad_offset`, `grad_mask` (see [`SampleSum`]), shaped like the
/// offsets (two values per sample) or like the mask (one).
pub(crate) fn sample_sums<T: Float>(
    kind: SampleSum,
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
) -> Result<Array4<f64>> {
    let g = deform_geometry(
        dims(input.shape()),
        dims(weight.shape()),
        &offset,
        mask.as_ref(),
        params,
    )?;
    g.check_out("grad_out", grad_out.shape())?;
    let (what, shape, per_sample) = match kind {
        SampleSum::Mask => ("grad_mask", g.mask_shape(), 1),
        _ => ("grad_offset", g.offset_shape(), 2),
    };
    let mut grad = try_zeros(what, shape, 0.0)?;
    let pr = prepare(
        g,
        params,
        Some(&input),
        &offset,
        mask.as_ref(),
        &weight,
        Some(&grad_out),
    )?;
    let g = &pr.g;
    let (kk, row_len) = (g.taps(), g.c_in * g.taps());
    let x = pr.input();
    let tasks = pixel_tasks(g);
    let blocks: Vec<Vec<f64>> = tasks
        .par_iter()
        .map(|(n, pixels)| {
            let n = *n;
            let gcol = pr.column_gradients(n, pixels.clone());
            let mut res = Vec::with_capacity(pixels.len() * shape[1]);
            for (p, row) in pixels.clone().zip(gcol.chunks_exact(row_len.max(1))) {
                for og in 0..g.offset_groups {
                    for k in 0..kk {
                        let t = pr.tap(n, og, k, p);
                        let channels =
                            og * g.c_per_offset_group()..(og + 1) * g.c_per_offset_group();
                        match kind {
                            SampleSum::Offset => {
                                let (mut sy, mut sx) = (0.0, 0.0);
                                for c in channels {
                                    let gc = row[c * kk + k];
                                    let (wy, wx) =
                                        coordinate_weights(pr.conv, &x, n, c, t.py, t.px);
                                    sy += gc * t.m * wy;
                                    sx += gc * t.m * wx;
                                }
                                res.extend([sy, sx]);
                            }
                            SampleSum::Mask => {
                                let s: f64 = channels
                                    .map(|c| {
                                        row[c * kk + k] * bilinear(pr.conv, &x, n, c, t.py, t.px)
                                    })
                                    .sum();
                                res.push(s);
                            }
                            SampleSum::OffsetMagnitude => {
                                let (mut sy, mut sx) = (0.0, 0.0);
                                for c in channels {
                                    let (ay, ax) = corner_magnitudes(pr.conv, &x, n, c, t.py, t.px);
                                    sy += row[c * kk + k] * ay;
                                    sx += row[c * kk + k] * ax;
                                }
                                res.extend([t.m * sy, t.m * sx]);
                            }
                        }
                    }
                }
            }
            debug_assert_eq!(res.len(), pixels.len() * g.offset_groups * kk * per_sample);
            res
        })
        .collect();
    scatter_pixels(&mut grad, &tasks, &blocks);
    Ok(grad)
}

/// `(Ay, Ax)` of [`SampleSum::OffsetMagnitude`] for one channel (values already absolute):
/// NaN for a NaN position, 0 for an infinite one, no window cut-off.
fn corner_magnitudes(
    conv: Convention,
    input: &ArrayView4<'_, f64>,
    n: usize,
    c: usize,
    py: Coord,
    px: Coord,
) -> (f64, f64) {
    if py.is_nan() || px.is_nan() {
        return (f64::NAN, f64::NAN);
    }
    if py.is_infinite() || px.is_infinite() {
        return (0.0, 0.0);
    }
    let (h, w) = (input.shape()[2], input.shape()[3]);
    let Cell {
        y0,
        y1,
        x0,
        x1,
        ly,
        lx,
        hy,
        hx,
    } = cell(conv, h, w, py, px);
    let v = |r: f64, s: f64| pixel(input, n, c, r, s);
    let (v00, v01) = (v(y0, x0), v(y0, x1));
    let (v10, v11) = (v(y1, x0), v(y1, x1));
    (
        lx * (v11 + v01) + hx * (v10 + v00),
        ly * (v11 + v10) + hy * (v01 + v00),
    )
}

/// Gradient with respect to the offsets:
///
/// ```text
/// grad_offset[n, 2 (g K + k),     y, x] = sum_{c in g} gcol[c, k, n, y, x] * m * Wy(input[n, c], py, px)
/// grad_offset[n, 2 (g K + k) + 1, y, x] = sum_{c in g} gcol[c, k, n, y, x] * m * Wx(input[n, c], py, px)
/// ```
///
/// with `Wy`, `Wx` the one-sided bilinear derivatives of `params.convention` (torchvision's
/// default: at an integer position the forward difference; no window cut-off, corners outside
/// read 0; mmcv and DCN v1 cut off outside their window, see [`Convention`]).
pub fn grad_offset<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
) -> Result<Array4<f64>> {
    sample_sums(
        SampleSum::Offset,
        grad_out,
        input,
        offset,
        mask,
        weight,
        params,
    )
}

/// Gradient with respect to the mask:
///
/// ```text
/// grad_mask[n, g K + k, y, x] = sum_{c in g} gcol[c, k, n, y, x] * B(input[n, c], py, px)
/// ```
///
/// It does not depend on the mask itself, so none is taken.
pub fn grad_mask<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    weight: ArrayView4<'_, T>,
    params: &ConvParams,
) -> Result<Array4<f64>> {
    sample_sums(
        SampleSum::Mask,
        grad_out,
        input,
        offset,
        None,
        weight,
        params,
    )
}

/// Gradient with respect to the weight, `weight_shape = [C_out, C_in/groups, kh, kw]`:
///
/// ```text
/// grad_weight[o, c', i, j] = sum_{n, y, x} grad_out[n, o, y, x] * m * B(input[n, c], py, px)
/// ```
///
/// each sum in the order `n, y, x`.
pub fn grad_weight<T: Float>(
    grad_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight_shape: [usize; 4],
    params: &ConvParams,
) -> Result<Array4<f64>> {
    let g = deform_geometry(
        dims(input.shape()),
        weight_shape,
        &offset,
        mask.as_ref(),
        params,
    )?;
    g.check_out("grad_out", grad_out.shape())?;
    let mut grad = try_zeros("grad_weight", weight_shape, 0.0)?;
    // Only the weight's shape matters here; a zero-strided view stands in for it.
    let zero = T::ZERO;
    let weight = ArrayView4::from_shape(
        weight_shape.strides([0, 0, 0, 0]),
        std::slice::from_ref(&zero),
    )
    .expect("a broadcast of one element");
    let pr = prepare(
        g,
        params,
        Some(&input),
        &offset,
        mask.as_ref(),
        &weight,
        Some(&grad_out),
    )?;
    let g = &pr.g;
    let (cig, cog, kk, hw) = (
        g.c_in_per_group(),
        g.c_out_per_group(),
        g.taps(),
        g.out_pixels(),
    );
    // Tasks: a block of input channels of one group; each computes its columns over every image
    // and pixel once, then every weight entry of those channels, one sum per entry.
    let per_channel = (g.n * hw * kk).max(1);
    let block = (WEIGHT_TASK_VALUES / per_channel).clamp(1, cig.div_ceil(4).max(1));
    let tasks: Vec<(usize, Range<usize>)> = (0..g.groups)
        .flat_map(|grp| {
            (0..cig)
                .step_by(block)
                .map(move |c0| (grp, c0..(c0 + block).min(cig)))
        })
        .collect();
    let blocks: Vec<Vec<f64>> = tasks
        .par_iter()
        .map(|(grp, cis)| {
            let channels = grp * cig + cis.start..grp * cig + cis.end;
            let width = cis.len() * kk;
            let cols: Vec<Vec<f64>> = (0..g.n)
                .map(|n| pr.columns(n, 0..hw, channels.clone()))
                .collect();
            // [o'][(c' - start) * K + k]
            let mut res = vec![0.0; cog * width];
            for (ol, acc) in res.chunks_exact_mut(width.max(1)).enumerate() {
                let o = grp * cog + ol;
                for (n, cols) in cols.iter().enumerate() {
                    for (&go, row) in pr.grad_out_plane(n, o).iter().zip(cols.chunks_exact(width)) {
                        for (a, &col) in acc.iter_mut().zip(row) {
                            *a += go * col;
                        }
                    }
                }
            }
            res
        })
        .collect();
    let dst = grad.as_slice_mut().expect("standard layout");
    for ((grp, cis), block) in tasks.iter().zip(&blocks) {
        let width = cis.len() * kk;
        for (ol, acc) in block.chunks_exact(width.max(1)).enumerate() {
            let o = grp * cog + ol;
            dst[o * cig * kk + cis.start * kk..][..width].copy_from_slice(acc);
        }
    }
    Ok(grad)
}

/// Gradient with respect to the bias: `grad_bias[o] = sum_{n, y, x} grad_out[n, o, y, x]`.
pub fn grad_bias<T: Float>(grad_out: ArrayView4<'_, T>) -> Result<Array1<f64>> {
    let c_out = grad_out.shape()[1];
    let mut grad = Array1::<f64>::zeros(c_out);
    for ((_, o, _, _), v) in grad_out.indexed_iter() {
        grad[o] += v.to_f64();
    }
    Ok(grad)
}
