//! The gradients: with respect to the input, the offsets, the mask, the weight and the bias.

use std::ops::Range;

use ndarray::{Array1, Array4, ArrayView4, ShapeBuilder};
use rayon::prelude::*;

use super::parallel::{pixel_tasks, prepare, scatter_pixels, WEIGHT_TASK_VALUES};
use super::sampling::corner_magnitudes;
use super::{bilinear, coordinate_weights, corners, deform_geometry, dims};
use crate::error::Result;
use crate::float::Float;
use crate::geometry::try_zeros;
use crate::params::ConvParams;

/// Gradient with respect to the input: each sample hands its column gradient, times the mask,
/// to the four corners it read, with the forward's bilinear weights:
///
/// ```text
/// grad_input[n, c, r, s] = sum_{i, j, y, x} gcol[c, k, n, y, x] * m * dB/dv[r, s]
/// gcol[c, k, n, y, x]    = sum_{o in group(c)} weight[o, c', i, j] * grad_out[n, o, y, x]
/// ```
///
/// `input_shape` is `[N, C_in, H, W]`; samples outside the convention's window (or NaN) send
/// nothing. Under [`Convention::DcnV1`](crate::Convention::DcnV1) a sample on the last row or
/// column gives that row or column the full weight (its corners collapse). Each pixel's sum runs
/// over `i, j, y, x` in that order (the corners `(y0, x0)`, `(y0, x1)`, `(y1, x0)`, `(y1, x1)` in
/// turn).
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
    let blocks: Vec<Vec<f64>> = crate::pool::on_pool(|| {
        tasks
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
                                            row[c * kk + k]
                                                * bilinear(pr.conv, &x, n, c, t.py, t.px)
                                        })
                                        .sum();
                                    res.push(s);
                                }
                                SampleSum::OffsetMagnitude => {
                                    let (mut sy, mut sx) = (0.0, 0.0);
                                    for c in channels {
                                        let (ay, ax) =
                                            corner_magnitudes(pr.conv, &x, n, c, t.py, t.px);
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
            .collect()
    });
    scatter_pixels(&mut grad, &tasks, &blocks);
    Ok(grad)
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
/// read 0; mmcv and DCN v1 cut off outside their window, see [`Convention`](crate::Convention)).
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
    let blocks: Vec<Vec<f64>> = crate::pool::on_pool(|| {
        tasks
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
                        for (&go, row) in
                            pr.grad_out_plane(n, o).iter().zip(cols.chunks_exact(width))
                        {
                            for (a, &col) in acc.iter_mut().zip(row) {
                                *a += go * col;
                            }
                        }
                    }
                }
                res
            })
            .collect()
    });
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
