//! The reference oracle as it was before it ran in parallel (serial loops, one element at a
//! time): the parallel one must give bitwise the same results.
#![allow(dead_code)]

use ndarray::{Array1, Array4, ArrayView1, ArrayView4};

use deformconv::{ConvParams, Convention, Float, Geometry, Result};

fn try_zeros(_what: &str, shape: [usize; 4], zero: f64) -> Result<Array4<f64>> {
    Ok(Array4::from_elem(shape, zero))
}

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
struct Coord {
    whole: f64,
    frac: f64,
    comp: f64,
}

impl Coord {
    /// The coordinate `base + d`.
    fn new(base: i128, d: f64) -> Coord {
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
fn counts(conv: Convention, h: usize, w: usize, py: Coord, px: Coord) -> bool {
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
fn corners(
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
fn bilinear<T: Float>(
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
fn coordinate_weights<T: Float>(
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

/// `gcol[c, k, n, y, x] = sum_{o in group(c)} weight[o, c', i, j] * grad_out[n, o, y, x]`.
fn column_gradient<T: Float>(
    g: &Geometry,
    weight: &ArrayView4<'_, T>,
    grad_out: &ArrayView4<'_, T>,
    (n, c, i, j, y, x): (usize, usize, usize, usize, usize, usize),
) -> f64 {
    let group = c / g.c_in_per_group();
    let ci = c % g.c_in_per_group();
    let outs = group * g.c_out_per_group()..(group + 1) * g.c_out_per_group();
    outs.map(|o| weight[[o, ci, i, j]].to_f64() * grad_out[[n, o, y, x]].to_f64())
        .sum()
}

/// Forward deformable convolution (DCN v1 without `mask`, v2 with):
///
/// ```text
/// out[n, o, y, x] = bias[o] + sum_{c' < C_in/groups} sum_{i, j} weight[o, c', i, j] * m * B(input[n, c], py, px)
/// ```
///
/// with `c = group(o) * C_in/groups + c'` and `py`, `px`, `m`, `B` as in the module docs.
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
    for ((n, o, y, x), slot) in out.indexed_iter_mut() {
        let group = o / g.c_out_per_group();
        let mut acc = bias.as_ref().map_or(0.0, |b| b[o].to_f64());
        for ci in 0..g.c_in_per_group() {
            let c = group * g.c_in_per_group() + ci;
            let og = c / g.c_per_offset_group();
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let t = tap(&g, &offset, mask.as_ref(), (n, og, i, j, y, x));
                    let b = bilinear(params.convention, &input, n, c, t.py, t.px);
                    // The column value m * B first, as the fast path and torchvision form it.
                    acc += weight[[o, ci, i, j]].to_f64() * (t.m * b);
                }
            }
        }
        *slot = acc;
    }
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
    for ((n, o, y, x), slot) in out.indexed_iter_mut() {
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
    }
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
/// column the full weight (its corners collapse).
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
    for n in 0..g.n {
        for c in 0..g.c_in {
            let og = c / g.c_per_offset_group();
            for i in 0..g.kh {
                for j in 0..g.kw {
                    for y in 0..g.h_out {
                        for x in 0..g.w_out {
                            let t = tap(&g, &offset, mask.as_ref(), (n, og, i, j, y, x));
                            let Some(cs) = corners(params.convention, g.h, g.w, t.py, t.px) else {
                                continue;
                            };
                            let gc = column_gradient(&g, &weight, &grad_out, (n, c, i, j, y, x));
                            for (r, s, wt) in cs {
                                let inside =
                                    r >= 0.0 && r < g.h as f64 && s >= 0.0 && s < g.w as f64;
                                if inside {
                                    grad[[n, c, r as usize, s as usize]] += gc * t.m * wt;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
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
/// read 0; mmcv and DCN v1 cut off outside their window, see [`Convention`]).
pub fn grad_offset<T: Float>(
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
    let mut grad = try_zeros("grad_offset", g.offset_shape(), 0.0)?;
    for n in 0..g.n {
        for og in 0..g.offset_groups {
            for i in 0..g.kh {
                for j in 0..g.kw {
                    let ch = og * g.taps() + i * g.kw + j;
                    for y in 0..g.h_out {
                        for x in 0..g.w_out {
                            let t = tap(&g, &offset, mask.as_ref(), (n, og, i, j, y, x));
                            let (mut sy, mut sx) = (0.0, 0.0);
                            let channels =
                                og * g.c_per_offset_group()..(og + 1) * g.c_per_offset_group();
                            for c in channels {
                                let gc =
                                    column_gradient(&g, &weight, &grad_out, (n, c, i, j, y, x));
                                let (wy, wx) =
                                    coordinate_weights(params.convention, &input, n, c, t.py, t.px);
                                sy += gc * t.m * wy;
                                sx += gc * t.m * wx;
                            }
                            grad[[n, 2 * ch, y, x]] = sy;
                            grad[[n, 2 * ch + 1, y, x]] = sx;
                        }
                    }
                }
            }
        }
    }
    Ok(grad)
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
    let g = deform_geometry(
        dims(input.shape()),
        dims(weight.shape()),
        &offset,
        None,
        params,
    )?;
    g.check_out("grad_out", grad_out.shape())?;
    let mut grad = try_zeros("grad_mask", g.mask_shape(), 0.0)?;
    for ((n, ch, y, x), slot) in grad.indexed_iter_mut() {
        let (og, k) = (ch / g.taps(), ch % g.taps());
        let (i, j) = (k / g.kw, k % g.kw);
        let t = tap(&g, &offset, None, (n, og, i, j, y, x));
        let channels = og * g.c_per_offset_group()..(og + 1) * g.c_per_offset_group();
        *slot = channels
            .map(|c| {
                let gc = column_gradient(&g, &weight, &grad_out, (n, c, i, j, y, x));
                gc * bilinear(params.convention, &input, n, c, t.py, t.px)
            })
            .sum();
    }
    Ok(grad)
}

/// Gradient with respect to the weight, `weight_shape = [C_out, C_in/groups, kh, kw]`:
///
/// ```text
/// grad_weight[o, c', i, j] = sum_{n, y, x} grad_out[n, o, y, x] * m * B(input[n, c], py, px)
/// ```
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
    for ((o, ci, i, j), slot) in grad.indexed_iter_mut() {
        let c = (o / g.c_out_per_group()) * g.c_in_per_group() + ci;
        let og = c / g.c_per_offset_group();
        let mut acc = 0.0;
        for n in 0..g.n {
            for y in 0..g.h_out {
                for x in 0..g.w_out {
                    let t = tap(&g, &offset, mask.as_ref(), (n, og, i, j, y, x));
                    let b = bilinear(params.convention, &input, n, c, t.py, t.px);
                    acc += grad_out[[n, o, y, x]].to_f64() * (t.m * b);
                }
            }
        }
        *slot = acc;
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
