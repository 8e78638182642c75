//! The sample of one tap and how a convention reads it: the exact coordinate ([`Coord`]), the
//! window ([`counts`]), the cell of four corners, the bilinear value ([`bilinear`]) and its
//! derivatives ([`coordinate_weights`]).

use ndarray::ArrayView4;

use crate::convention::Convention;
use crate::float::Float;
use crate::geometry::Geometry;

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
pub(super) struct Tap {
    pub(super) py: Coord,
    pub(super) px: Coord,
    pub(super) m: f64,
}

pub(super) fn tap<T: Float>(
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
pub(super) fn tap_base(out: usize, stride: usize, pad: usize, tap: usize, dil: usize) -> i128 {
    out as i128 * stride as i128 - pad as i128 + tap as i128 * dil as i128
}

/// Pixel `(r, s)` of plane `(n, c)`, or 0 outside the image. `r`, `s` are whole numbers held
/// in `f64` so that far-away positions are compared before any cast.
pub(super) fn pixel<T: Float>(
    input: &ArrayView4<'_, T>,
    n: usize,
    c: usize,
    r: f64,
    s: f64,
) -> f64 {
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

/// `(Ay, Ax)` of [`SampleSum::OffsetMagnitude`](super::SampleSum::OffsetMagnitude) for one
/// channel (values already absolute): NaN for a NaN position, 0 for an infinite one, no window
/// cut-off.
pub(super) fn corner_magnitudes(
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
