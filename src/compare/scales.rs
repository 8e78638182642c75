//! `L * sum |terms| + P` per result element, from the operands (see the module docs of
//! [`compare`](super)).

use std::collections::BTreeMap;

use ndarray::{Array4, ArrayD, ArrayView1, ArrayView4, ArrayViewD};

use super::{Output, Precision};
use crate::error::Result;
use crate::geometry::Geometry;
use crate::params::ConvParams;
use crate::reference::{self, Coord, SampleSum};

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
/// docs): multiply by `c * eps` to get the allowed error. Also the statistical scale
/// `sqrt(L * sum terms^2 + P2)` of each element ([`Scales::rms`]).
#[derive(Debug, Clone, Default)]
pub struct Scales {
    scales: BTreeMap<Output, ArrayD<f64>>,
    rms: BTreeMap<Output, ArrayD<f64>>,
}

impl Scales {
    /// The scale array of `output`, shaped like it, if the operands define that result.
    pub fn get(&self, output: Output) -> Option<ArrayViewD<'_, f64>> {
        self.scales.get(&output).map(|a| a.view())
    }

    /// The statistical (random-walk) scale of `output`, shaped like it:
    /// `sqrt(L * sum_t term_t^2 + P2)`, with `sum term_t^2` and `P2` the squared
    /// counterparts of `sum |term_t|` and `P` (see the module docs of [`compare`](super)).
    pub fn rms(&self, output: Output) -> Option<ArrayViewD<'_, f64>> {
        self.rms.get(&output).map(|a| a.view())
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

/// What forming a bilinear weight from its position can cost, in units of `eps` per
/// coordinate, where the kernel's fractions are inexact ([`fraction_exact`]): kernels compute
/// `l = p - floor(p)` and `1 - l` (torchvision's col2im: `1 - |p - corner|`), each rounded
/// relative to 1 (at most `eps / 2` each), so a weight near 0 carries an absolute error of up
/// to about `eps`, not `eps` times itself.
const FRACTION_ROUNDING: f64 = 1.0;

/// Whether a kernel of `precision` forms the fractions `l = q - floor(q)` and `1 - l` of the
/// position `q` (as it formed it) exactly: in `f64` for `F64`, in `f32` for `F32` and `Tf32`,
/// and (conservatively) in the storage type for `Bf16` and `F16`. Then `1 - |q - corner|`,
/// torchvision's col2im form, is exact too (it is `1 - l` or `l`). Without a precision: exact
/// only for `|q| >= 1` (whose fraction every format forms exactly from the formed position),
/// integers and half-integers. Non-finite positions weigh nothing.
fn fraction_exact(precision: Option<Precision>, q: f64) -> bool {
    if !q.is_finite() {
        return true;
    }
    let f = q.floor();
    match precision {
        None => q.abs() >= 1.0 || (2.0 * q).fract() == 0.0,
        Some(Precision::F64) => {
            let l = q - f;
            diff_exact(q, f, l) && diff_exact(1.0, l, 1.0 - l)
        }
        Some(prec) => {
            // q is a value of the precision's format, so l and 1 - l are exact in f64.
            let l = q - f;
            let round = |x: f64| match prec {
                Precision::F32 | Precision::Tf32 => x as f32 as f64,
                _ => prec.round(x),
            };
            round(l) == l && round(1.0 - l) == 1.0 - l
        }
    }
}

/// Whether the `f64` difference `a - b`, rounded to `d`, is exact (Knuth's TwoSum error is 0).
fn diff_exact(a: f64, b: f64, d: f64) -> bool {
    let nb = -b;
    let bv = d - a;
    let av = d - bv;
    (a - av) + (nb - bv) == 0.0
}

/// How the operands enter a scale: as magnitudes (the worst-case bound) or squared (the
/// statistical scale).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Power {
    Abs,
    Square,
}

impl Power {
    fn apply(self, v: f64) -> f64 {
        match self {
            Power::Abs => v.abs(),
            Power::Square => v * v,
        }
    }

    fn map4(self, a: &ArrayView4<'_, f64>) -> Array4<f64> {
        a.mapv(|v| self.apply(v))
    }
}

fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// The scales `L * sum |terms| + P` of every result defined by `ops` (see the module docs of
/// [`compare`](super)): `out` always, the gradients when `grad_out` is given (`grad_mask` only
/// with a mask, `grad_bias` only with a bias); and their statistical counterparts
/// `sqrt(L * sum terms^2 + P2)`.
///
/// Runs in parallel (the [`reference`](mod@crate::reference) oracle's sums), bitwise the same
/// for any number of threads. Validates the operands like every entry point and returns the
/// same errors.
pub fn error_scales(ops: &Operands<'_>) -> Result<Scales> {
    scales_with(ops, None)
}

/// [`error_scales`] for a kernel of `precision`: `P` (and `P2`) count the position's
/// rounding `|p|` only for the coordinates that `precision` cannot form exactly
/// (`precision.position(base, d) != base + d`), since an exactly formed position moves
/// nothing; the rounding of the fractions `p - floor(p)` and `1 - l` (1 per coordinate, in
/// units of `eps`) counts where the precision cannot form them exactly (positions in `(-1, 1)`
/// with more fraction bits than the format holds below 1; never integers or half-integers).
pub fn error_scales_for(ops: &Operands<'_>, precision: Precision) -> Result<Scales> {
    scales_with(ops, Some(precision))
}

fn scales_with(ops: &Operands<'_>, precision: Option<Precision>) -> Result<Scales> {
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
    let scales = scale_sums(ops, &g, Power::Abs, precision)?;
    let rms = scale_sums(ops, &g, Power::Square, precision)?
        .into_iter()
        .map(|(o, a)| (o, a.mapv(f64::sqrt)))
        .collect();
    Ok(Scales { scales, rms })
}

/// `L * S + P` per element, with `S` the sum of the terms' `power` (magnitudes or squares)
/// and `P` the position-rounding part on the same power.
fn scale_sums(
    ops: &Operands<'_>,
    g: &Geometry,
    power: Power,
    precision: Option<Precision>,
) -> Result<BTreeMap<Output, ArrayD<f64>>> {
    let p = &ops.params;
    let input = power.map4(&ops.input);
    let weight = power.map4(&ops.weight);
    let mask = ops.mask.as_ref().map(|m| power.map4(m));
    let bias = ops.bias.map(|b| b.mapv(|v| power.apply(v)));
    let offset = ops.offset;
    let mv = mask.as_ref().map(|m| m.view());
    let cells = CellCentres::new(g, &offset, ops.mask.as_ref(), power, precision);
    let (off_c, mask_c) = (cells.offset.view(), cells.mask.view());
    let mut scales = BTreeMap::new();

    let l_out = (g.c_in_per_group() * g.taps() + usize::from(bias.is_some()) + IN_TERM) as f64;
    let bv = bias.as_ref().map(|b| b.view());
    let out = reference::deform_conv2d(input.view(), offset, mv, weight.view(), bv, p)?;
    let out_pos =
        reference::deform_conv2d(input.view(), off_c, Some(mask_c), weight.view(), None, p)?;
    scales.insert(Output::Out, (out * l_out + out_pos).into_dyn());

    let Some(grad_out) = &ops.grad_out else {
        return Ok(scales);
    };
    let grad_out = power.map4(grad_out);
    let gv = grad_out.view();

    let mut gi = reference::grad_input(gv, offset, mv, weight.view(), g.input_shape(), p)?;
    let counts = samples_per_pixel(g, &offset, p.convention);
    for ((n, c, r, s), v) in gi.indexed_iter_mut() {
        let og = c / g.c_per_offset_group();
        *v *= (g.c_out_per_group() * counts[[n, og, r, s]] + IN_TERM) as f64;
    }
    gi += &reference::grad_input(gv, off_c, Some(mask_c), weight.view(), g.input_shape(), p)?;
    scales.insert(Output::GradInput, gi.into_dyn());

    // Per sample: sum_c gcol * (sum of the four corners) / 4, on the powered operands.
    let corner_sums = reference::grad_mask(gv, input.view(), off_c, weight.view(), p)?;
    let l_group = (g.c_per_offset_group() * g.c_out_per_group() + IN_TERM) as f64;
    let mut go = reference::sample_sums(
        SampleSum::OffsetMagnitude,
        gv,
        input.view(),
        offset,
        mv,
        weight.view(),
        p,
    )? * l_group;
    for ((n, ch, y, x), v) in go.indexed_iter_mut() {
        let sample = [n, ch / 2, y, x];
        let m = ops.mask.as_ref().map_or(1.0, |m| m[sample].abs());
        // A rounding of px moves Wy, one of py moves Wx, by at most the corner sum.
        let moved = if ch % 2 == 0 {
            cells.abs_px[sample]
        } else {
            cells.abs_py[sample]
        };
        *v += power.apply(4.0 * m * moved) * corner_sums[sample];
    }
    scales.insert(Output::GradOffset, go.into_dyn());

    if mask.is_some() {
        let mut gm = reference::grad_mask(gv, input.view(), offset, weight.view(), p)? * l_group;
        for ((n, k, y, x), v) in gm.indexed_iter_mut() {
            let sample = [n, k, y, x];
            let moved = cells.abs_py[sample] + cells.abs_px[sample];
            *v += power.apply(4.0 * moved) * corner_sums[sample];
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
    Ok(scales)
}

/// Every sample moved to the centre of its bilinear cell, `(floor(py) + 1/2, floor(px) + 1/2)`,
/// where each of its four corners weighs exactly 1/4, with a mask `power(4 |m| (|py| + |px|))`:
/// the oracle run on these operands sums `|m| (|py| + |px|) * (sum of the corners' |v|)` (or
/// its squared counterpart), the change a rounding of the sample position by
/// `eps (|py| + |px|)` can make, over the terms.
struct CellCentres {
    /// Offsets that put each sample at its cell centre (NaN stays NaN, infinities stay).
    offset: Array4<f64>,
    /// `power(4 |m| (|py| + |px|))` per sample.
    mask: Array4<f64>,
    /// The absolute error of the weights along `py` per sample, in units of `eps`: `|py|`
    /// (0 where the precision forms `py` exactly) plus 1 where it cannot form the fractions
    /// exactly ([`fraction_exact`]), mask-shaped.
    abs_py: Array4<f64>,
    /// `|px|` likewise.
    abs_px: Array4<f64>,
}

impl CellCentres {
    fn new(
        g: &Geometry,
        offset: &ArrayView4<'_, f64>,
        mask: Option<&ArrayView4<'_, f64>>,
        power: Power,
        precision: Option<Precision>,
    ) -> Self {
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
                                // The absolute error of a bilinear weight along p, in
                                // units of eps: |p| from forming p (0 where the precision
                                // forms p exactly), plus 1 where the precision cannot form
                                // the fractions `p - floor(p)` and `1 - l` (or
                                // `1 - |p - corner|`) exactly: they round relative to 1,
                                // not to the weight.
                                let moved = |p: f64, base: usize, pad: usize, d: f64| {
                                    let base = base as f64 - pad as f64;
                                    let formed = precision.map(|prec| prec.position(base, d));
                                    let position = match formed {
                                        Some(q) if q - base == d => 0.0,
                                        _ => p.abs(),
                                    };
                                    let fraction = if fraction_exact(precision, formed.unwrap_or(p))
                                    {
                                        0.0
                                    } else {
                                        FRACTION_ROUNDING
                                    };
                                    position + fraction
                                };
                                let (by, bx) =
                                    (y * g.stride_h + i * g.dil_h, x * g.stride_w + j * g.dil_w);
                                let (my, mx) = (
                                    moved(py, by, g.pad_top, offset[[n, dy, y, x]]),
                                    moved(px, bx, g.pad_left, offset[[n, dx, y, x]]),
                                );
                                centred[[n, dy, y, x]] = centre(py, offset[[n, dy, y, x]]);
                                centred[[n, dx, y, x]] = centre(px, offset[[n, dx, y, x]]);
                                let m = mask.map_or(1.0, |m| m[[n, ch, y, x]].abs());
                                let sample = [n, ch, y, x];
                                abs_py[sample] = my;
                                abs_px[sample] = mx;
                                cell_mask[sample] = power.apply(4.0 * m * (my + mx));
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

/// Sample position `(py, px)` of tap `(i, j)` of offset group `og` at output `(y, x)`, in `f64`
/// (for the scales only: rounding here moves a bound by a relative `2^-53`).
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

/// For every `(n, offset group, r, s)`: how many corner reads (taps times output pixels times
/// corners) of samples of that group land on pixel `(r, s)`, by the convention's window and
/// corners (exact positions).
fn samples_per_pixel(
    g: &Geometry,
    offset: &ArrayView4<'_, f64>,
    conv: crate::Convention,
) -> Array4<usize> {
    let mut counts = Array4::<usize>::zeros((g.n, g.offset_groups, g.h, g.w));
    let (h, w) = (g.h as f64, g.w as f64);
    let base = |out: usize, stride: usize, pad: usize, tap: usize, dil: usize| {
        out as i128 * stride as i128 - pad as i128 + tap as i128 * dil as i128
    };
    for n in 0..g.n {
        for og in 0..g.offset_groups {
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let ch = og * g.taps() + i * g.kw + j;
                    for y in 0..g.h_out {
                        for x in 0..g.w_out {
                            let py = Coord::new(
                                base(y, g.stride_h, g.pad_top, i, g.dil_h),
                                offset[[n, 2 * ch, y, x]],
                            );
                            let px = Coord::new(
                                base(x, g.stride_w, g.pad_left, j, g.dil_w),
                                offset[[n, 2 * ch + 1, y, x]],
                            );
                            let Some(cs) = reference::corners(conv, g.h, g.w, py, px) else {
                                continue;
                            };
                            for (r, s, _) in cs {
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
    counts
}
