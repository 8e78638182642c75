//! The forward: deformable convolution and its dense special case.

use ndarray::{Array4, ArrayView1, ArrayView4};
use rayon::prelude::*;

use super::parallel::{pixel_tasks, prepare, scatter_pixels};
use super::sampling::{pixel, tap_base};
use super::{deform_geometry, dims};
use crate::error::Result;
use crate::float::Float;
use crate::geometry::{try_zeros, Geometry};
use crate::params::ConvParams;

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
    let blocks: Vec<Vec<f64>> = crate::pool::on_pool(|| {
        tasks
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
            .collect()
    });
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
    crate::pool::on_pool(|| {
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
    });
    Ok(out)
}
