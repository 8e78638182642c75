//! `L * sum |terms| + P` per result element, from the operands (see the module docs of
//! [`compare`](super)).

use std::collections::BTreeMap;

use ndarray::{Array4, ArrayD, ArrayView1, ArrayView4, ArrayViewD};

use super::Output;
use crate::error::Result;
use crate::geometry::Geometry;
use crate::params::ConvParams;
use crate::reference;

/// The operands of one problem, in `f64` (exact for `f32` data), for [`error_scales`].
#[derive(Debug, Clone, Copy)]
pub struct Operands<'a> {
    /// `[N, C_in, H, W]`.
    pub input: ArrayView4<'a, f64>,
    /// `[N, 2 * G_off * kh * kw, H_out, W_out]`.
    pub offset: ArrayView4<'a, f64>,
    /// `[N, G_off * kh * kw, H_out, W_out]`, or `None` (DCN v1).
    pub mask: Option<ArrayView4<'a, f64>>,
    /// `[C_out, C_in / groups, kh, kw]`.
    pub weight: ArrayView4<'a, f64>,
    /// `[C_out]`, or `None`.
    pub bias: Option<ArrayView1<'a, f64>>,
    /// `[N, C_out, H_out, W_out]`, or `None` when only the forward is compared.
    pub grad_out: Option<ArrayView4<'a, f64>>,
    /// The convolution parameters.
    pub params: ConvParams,
}

/// `L * sum |terms| + P` for every element of every result the operands define (see the module
/// docs): multiply by `c * eps` to get the allowed error.
#[derive(Debug, Clone, Default)]
pub struct Scales {
    scales: BTreeMap<Output, ArrayD<f64>>,
}

impl Scales {
    /// The scale array of `output`, shaped like it, if the operands define that result.
    pub fn get(&self, output: Output) -> Option<ArrayViewD<'_, f64>> {
        self.scales.get(&output).map(|a| a.view())
    }

    /// The results with a scale, in report order.
    pub fn outputs(&self) -> impl Iterator<Item = Output> + '_ {
        self.scales.keys().copied()
    }
}

/// Added to `L` for every result made of products: the roundings inside one term (bilinear
/// weights, corner sum, mask and weight products) weigh like two more accumulations once
/// multiplied by `c`.
const IN_TERM: usize = 2;

fn abs4(a: &ArrayView4<'_, f64>) -> Array4<f64> {
    a.mapv(f64::abs)
}

fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// The scales `L * sum |terms| + P` of every result defined by `ops` (see the module docs of
/// [`compare`](super)): `out` always, the gradients when `grad_out` is given (`grad_mask` only
/// with a mask, `grad_bias` only with a bias).
///
/// Validates the operands like every entry point and returns the same errors.
pub fn error_scales(ops: &Operands<'_>) -> Result<Scales> {
    let p = &ops.params;
    let g = Geometry::new(dims(ops.input.shape()), dims(ops.weight.shape()), p)?;
    g.check_offset(ops.offset.shape())?;
    if let Some(m) = &ops.mask {
        g.check_mask(m.shape())?;
    }
    if let Some(b) = &ops.bias {
        g.check_bias(b.len())?;
    }
    if let Some(go) = &ops.grad_out {
        g.check_out("grad_out", go.shape())?;
    }

    let input = abs4(&ops.input);
    let weight = abs4(&ops.weight);
    let mask = ops.mask.as_ref().map(abs4);
    let bias = ops.bias.map(|b| b.mapv(f64::abs));
    let offset = ops.offset;
    let mv = mask.as_ref().map(|m| m.view());
    let cells = CellCentres::new(&g, &offset, mv.as_ref());
    let (off_c, mask_c) = (cells.offset.view(), cells.mask.view());
    let mut scales = BTreeMap::new();

    let l_out = (g.c_in_per_group() * g.taps() + usize::from(bias.is_some()) + IN_TERM) as f64;
    let bv = bias.as_ref().map(|b| b.view());
    let out = reference::deform_conv2d(input.view(), offset, mv, weight.view(), bv, p)?;
    let out_pos =
        reference::deform_conv2d(input.view(), off_c, Some(mask_c), weight.view(), None, p)?;
    scales.insert(Output::Out, (out * l_out + out_pos).into_dyn());

    let Some(grad_out) = &ops.grad_out else {
        return Ok(Scales { scales });
    };
    let grad_out = abs4(grad_out);
    let gv = grad_out.view();

    let mut gi = reference::grad_input(gv, offset, mv, weight.view(), g.input_shape(), p)?;
    let counts = samples_per_pixel(&g, &offset);
    for ((n, c, r, s), v) in gi.indexed_iter_mut() {
        let og = c / g.c_per_offset_group();
        *v *= (g.c_out_per_group() * counts[[n, og, r, s]] + IN_TERM) as f64;
    }
    gi += &reference::grad_input(gv, off_c, Some(mask_c), weight.view(), g.input_shape(), p)?;
    scales.insert(Output::GradInput, gi.into_dyn());

    // Per sample: sum_c |gcol| * (sum of the four corners |v|) / 4.
    let corner_sums = reference::grad_mask(gv, input.view(), off_c, weight.view(), p)?;
    let l_group = (g.c_per_offset_group() * g.c_out_per_group() + IN_TERM) as f64;
    let mut go = offset_magnitudes(&g, &input, &offset, mv.as_ref(), &weight, &grad_out) * l_group;
    for ((n, ch, y, x), v) in go.indexed_iter_mut() {
        let sample = [n, ch / 2, y, x];
        let m = mv.as_ref().map_or(1.0, |m| m[sample]);
        // A rounding of px moves Wy, one of py moves Wx, by at most the corner sum.
        let moved = if ch % 2 == 0 {
            cells.abs_px[sample]
        } else {
            cells.abs_py[sample]
        };
        *v += 4.0 * m * moved * corner_sums[sample];
    }
    scales.insert(Output::GradOffset, go.into_dyn());

    if mask.is_some() {
        let mut gm = reference::grad_mask(gv, input.view(), offset, weight.view(), p)? * l_group;
        for ((n, k, y, x), v) in gm.indexed_iter_mut() {
            let sample = [n, k, y, x];
            *v += 4.0 * (cells.abs_py[sample] + cells.abs_px[sample]) * corner_sums[sample];
        }
        scales.insert(Output::GradMask, gm.into_dyn());
    }

    let l_batch = (g.n * g.out_pixels()) as f64;
    let l_weight = l_batch + IN_TERM as f64;
    let ws = g.weight_shape();
    let gw = reference::grad_weight(gv, input.view(), offset, mv, ws, p)? * l_weight
        + reference::grad_weight(gv, input.view(), off_c, Some(mask_c), ws, p)?;
    scales.insert(Output::GradWeight, gw.into_dyn());
    if bias.is_some() {
        let gb = reference::grad_bias(gv)?;
        scales.insert(Output::GradBias, (gb * l_batch).into_dyn());
    }
    Ok(Scales { scales })
}

/// Every sample moved to the centre of its bilinear cell, `(floor(py) + 1/2, floor(px) + 1/2)`,
/// where each of its four corners weighs exactly 1/4, with a mask `4 |m| (|py| + |px|)`: the
/// oracle run on these operands sums `|m| (|py| + |px|) * (sum of the corners' |v|)`, the
/// change a rounding of the sample position by `eps (|py| + |px|)` can make, over the terms.
struct CellCentres {
    /// Offsets that put each sample at its cell centre (NaN stays NaN, infinities stay).
    offset: Array4<f64>,
    /// `4 |m| (|py| + |px|)` per sample.
    mask: Array4<f64>,
    /// `|py|` per sample, mask-shaped.
    abs_py: Array4<f64>,
    /// `|px|` per sample, mask-shaped.
    abs_px: Array4<f64>,
}

impl CellCentres {
    fn new(g: &Geometry, offset: &ArrayView4<'_, f64>, mask: Option<&ArrayView4<'_, f64>>) -> Self {
        let mut centred = offset.to_owned();
        let mut cell_mask = Array4::<f64>::zeros(g.mask_shape());
        let mut abs_py = Array4::<f64>::zeros(g.mask_shape());
        let mut abs_px = Array4::<f64>::zeros(g.mask_shape());
        let centre = |p: f64, d: f64| {
            if p.is_finite() {
                d + (p.floor() + 0.5 - p)
            } else {
                d
            }
        };
        for n in 0..g.n {
            for og in 0..g.offset_groups {
                for i in 0..g.kh {
                    for j in 0..g.kw {
                        let ch = og * g.taps() + i * g.kw + j;
                        for y in 0..g.h_out {
                            for x in 0..g.w_out {
                                let (py, px) = position(g, offset, (n, og, i, j, y, x));
                                let (dy, dx) = (2 * ch, 2 * ch + 1);
                                centred[[n, dy, y, x]] = centre(py, offset[[n, dy, y, x]]);
                                centred[[n, dx, y, x]] = centre(px, offset[[n, dx, y, x]]);
                                let m = mask.map_or(1.0, |m| m[[n, ch, y, x]]);
                                let sample = [n, ch, y, x];
                                abs_py[sample] = py.abs();
                                abs_px[sample] = px.abs();
                                cell_mask[sample] = 4.0 * m * (py.abs() + px.abs());
                            }
                        }
                    }
                }
            }
        }
        CellCentres {
            offset: centred,
            mask: cell_mask,
            abs_py,
            abs_px,
        }
    }
}

/// Sample position `(py, px)` of tap `(i, j)` of offset group `og` at output `(y, x)`.
fn position(
    g: &Geometry,
    offset: &ArrayView4<'_, f64>,
    (n, og, i, j, y, x): (usize, usize, usize, usize, usize, usize),
) -> (f64, f64) {
    let ch = og * g.taps() + i * g.kw + j;
    let py = (y * g.stride_h + i * g.dil_h) as f64 - g.pad_top as f64 + offset[[n, 2 * ch, y, x]];
    let px =
        (x * g.stride_w + j * g.dil_w) as f64 - g.pad_left as f64 + offset[[n, 2 * ch + 1, y, x]];
    (py, px)
}

/// For every `(n, offset group, r, s)`: how many samples (taps times output pixels) of that
/// group read pixel `(r, s)` as one of their four corners. Samples outside the
/// `-1 < p < size` window (or NaN) read nothing.
fn samples_per_pixel(g: &Geometry, offset: &ArrayView4<'_, f64>) -> Array4<usize> {
    let mut counts = Array4::<usize>::zeros((g.n, g.offset_groups, g.h, g.w));
    let (h, w) = (g.h as f64, g.w as f64);
    for n in 0..g.n {
        for og in 0..g.offset_groups {
            for i in 0..g.kh {
                for j in 0..g.kw {
                    for y in 0..g.h_out {
                        for x in 0..g.w_out {
                            let (py, px) = position(g, offset, (n, og, i, j, y, x));
                            // NaN fails every comparison, so it is outside too.
                            if !(py > -1.0 && py < h && px > -1.0 && px < w) {
                                continue;
                            }
                            let (y0, x0) = (py.floor(), px.floor());
                            for r in [y0, y0 + 1.0] {
                                for s in [x0, x0 + 1.0] {
                                    if r >= 0.0 && r < h && s >= 0.0 && s < w {
                                        counts[[n, og, r as usize, s as usize]] += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    counts
}

/// `sum_{c in g} sum_{o in group(c)} |weight| |grad_out| |m| A(c)` for both offset channels of
/// every sample, with `A_y = lx (|v11| + |v01|) + (1 - lx)(|v10| + |v00|)` and
/// `A_x = ly (|v11| + |v10|) + (1 - ly)(|v01| + |v00|)` (corners outside the image read 0;
/// no window cut-off, like the gradient itself). Operands are already absolute values.
fn offset_magnitudes(
    g: &Geometry,
    input: &Array4<f64>,
    offset: &ArrayView4<'_, f64>,
    mask: Option<&ArrayView4<'_, f64>>,
    weight: &Array4<f64>,
    grad_out: &Array4<f64>,
) -> Array4<f64> {
    let mut mags = Array4::<f64>::zeros(g.offset_shape());
    let (h, w) = (g.h as f64, g.w as f64);
    let pixel = |n: usize, c: usize, r: f64, s: f64| {
        if r >= 0.0 && r < h && s >= 0.0 && s < w {
            input[[n, c, r as usize, s as usize]]
        } else {
            0.0
        }
    };
    for n in 0..g.n {
        for og in 0..g.offset_groups {
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let ch = og * g.taps() + i * g.kw + j;
                    for y in 0..g.h_out {
                        for x in 0..g.w_out {
                            let (py, px) = position(g, offset, (n, og, i, j, y, x));
                            let m = mask.map_or(1.0, |m| m[[n, ch, y, x]]);
                            let (ay, ax) = if py.is_nan() || px.is_nan() {
                                (f64::NAN, f64::NAN)
                            } else if py.is_infinite() || px.is_infinite() {
                                (0.0, 0.0)
                            } else {
                                let (y0, x0) = (py.floor(), px.floor());
                                let (ly, lx) = (py - y0, px - x0);
                                let channels =
                                    og * g.c_per_offset_group()..(og + 1) * g.c_per_offset_group();
                                let (mut sy, mut sx) = (0.0, 0.0);
                                for c in channels {
                                    let v00 = pixel(n, c, y0, x0);
                                    let v01 = pixel(n, c, y0, x0 + 1.0);
                                    let v10 = pixel(n, c, y0 + 1.0, x0);
                                    let v11 = pixel(n, c, y0 + 1.0, x0 + 1.0);
                                    let gc =
                                        column_magnitude(g, weight, grad_out, (n, c, i, j, y, x));
                                    sy += gc * (lx * (v11 + v01) + (1.0 - lx) * (v10 + v00));
                                    sx += gc * (ly * (v11 + v10) + (1.0 - ly) * (v01 + v00));
                                }
                                (sy, sx)
                            };
                            mags[[n, 2 * ch, y, x]] = m * ay;
                            mags[[n, 2 * ch + 1, y, x]] = m * ax;
                        }
                    }
                }
            }
        }
    }
    mags
}

/// `sum_{o in group(c)} |weight[o, c', i, j]| |grad_out[n, o, y, x]|` (operands already absolute).
fn column_magnitude(
    g: &Geometry,
    weight: &Array4<f64>,
    grad_out: &Array4<f64>,
    (n, c, i, j, y, x): (usize, usize, usize, usize, usize, usize),
) -> f64 {
    let group = c / g.c_in_per_group();
    let ci = c % g.c_in_per_group();
    (group * g.c_out_per_group()..(group + 1) * g.c_out_per_group())
        .map(|o| weight[[o, ci, i, j]] * grad_out[[n, o, y, x]])
        .sum()
}
