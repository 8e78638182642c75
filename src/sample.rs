//! Bilinear sampling with zero padding, torchvision's rule, for the fast path: the one place
//! where the fast kernels learn which corners a sample reads and with what weights.
//!
//! For a sample at `(py, px)` in an `H x W` plane:
//! - it *counts* iff `-1 < py < H` and `-1 < px < W`; otherwise its value is 0 and it sends no
//!   gradient to the input;
//! - corners are `y0 = floor(py)`, `x0 = floor(px)`, `y1 = y0 + 1`, `x1 = x0 + 1` with fractions
//!   `ly = py - y0`, `lx = px - x0`, and weights `(1-ly)(1-lx), (1-ly)lx, ly(1-lx), ly lx`;
//!   a corner outside the plane reads 0;
//! - a NaN coordinate gives a NaN sample (NaN in, NaN out) that touches no pixel.
//!
//! The coordinate derivatives (for `grad_offset`) use the same corners with no `-1 < p < H`
//! cut-off: `Wy = lx (v11 - v01) + (1-lx)(v10 - v00)`, `Wx = ly (v11 - v10) + (1-ly)(v01 - v00)`,
//! so at an exactly integer position they are the one-sided forward difference. The kernels
//! evaluate them on padded planes (`kernels::channel_backward`); the tests
//! state them once more on plain planes (`tests::coordinate_weights_in`) and pin the two.
//!
//! Other conventions ([`Convention`]) go through [`locate_in`]; for
//! [`Convention::Torchvision`] it is exactly [`locate`]. Both tables, the forward's and the
//! backward's, are built from these by `kernels::taps::Tap::with_rule` (and its vector form
//! in `kernels::locate`).

use crate::convention::Convention;
use crate::float::Float;

/// Where a sample falls, decided once per (tap, output pixel) and reused for every channel of
/// its offset group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Sample<T> {
    /// Outside the `-1 < p < size` window (or an infinite coordinate): value 0, no gradient
    /// to the input.
    Outside,
    /// A NaN coordinate: value NaN, no pixel touched.
    Nan,
    /// Inside the window: the top-left corner and the fractional parts.
    Inside(Corners<T>),
}

/// The four corners of a sample inside the window, with their validity and weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Corners<T> {
    /// `floor(py)`, in `-1 ..= H - 1`.
    pub y0: isize,
    /// `floor(px)`, in `-1 ..= W - 1`.
    pub x0: isize,
    /// `py - y0`, in `[0, 1)`.
    pub ly: T,
    /// `px - x0`, in `[0, 1)`.
    pub lx: T,
    /// `1 - ly`, computed as `(floor(dy) + 1) - dy` so that it keeps full relative precision
    /// when `ly` is close to 1 (a small negative offset), where `1 - ly` would not.
    pub hy: T,
    /// `1 - lx`, computed like [`Corners::hy`].
    pub hx: T,
    /// Row-major offsets `r * W + s` of the corners `(y0,x0), (y0,x1), (y1,x0), (y1,x1)`,
    /// meaningful only where `valid` is true.
    pub index: [usize; 4],
    /// Whether each corner lies inside the plane.
    pub valid: [bool; 4],
}

impl<T: Float> Corners<T> {
    /// Bilinear weights of the corners, in the order of [`Corners::index`].
    #[inline]
    pub fn weights(&self) -> [T; 4] {
        let (ly, lx, hy, hx) = (self.ly, self.lx, self.hy, self.hx);
        [hy * hx, hy * lx, ly * hx, ly * lx]
    }
}

/// Splits an offset `d` into `floor(d)` as an integer (clamped to `±2^30`, far beyond any
/// plane, so huge or infinite offsets cannot overflow), the fraction `d - floor(d)` and its
/// complement `(floor(d) + 1) - d`.
///
/// Working from the integer base position plus this split, instead of forming `base + d` in `T`,
/// keeps the fraction as accurate in `f32` as the offset itself however far the output pixel is
/// from the origin. Each of the fraction and its complement is exact or within half an ulp of
/// itself (for `|d| >= 1` both are exact; for `0 <= d < 1` the fraction is exact, for
/// `-1 < d < 0` the complement `-d` is), so both bilinear weights of an axis keep full relative
/// precision, which `1 - fraction` would lose for a small negative offset.
#[inline]
fn split_with_complement<T: Float>(d: T) -> (isize, T, T) {
    let (whole, frac) = split(d);
    let f = d.floor();
    (whole, frac, (f + T::ONE) - d)
}

/// [`split_with_complement`] without the complement.
#[inline]
fn split<T: Float>(d: T) -> (isize, T) {
    let f = d.floor();
    let limit = T::from_usize(1 << 30);
    let whole = if f < -limit {
        -(1isize << 30)
    } else if f > limit {
        1isize << 30
    } else {
        f.to_f64() as isize
    };
    (whole, d - f)
}

/// Locates the sample at `(base_y + dy, base_x + dx)` in an `h x w` plane under torchvision's
/// rule, where `base_*` is the undeformed tap position `out * stride - pad + tap * dilation`.
#[inline]
pub(crate) fn locate<T: Float>(
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    h: usize,
    w: usize,
) -> Sample<T> {
    if dy.is_nan() || dx.is_nan() {
        return Sample::Nan;
    }
    let c = corners(base_y, dy, base_x, dx, h, w);
    // p > -1  <=>  floor(p) >= 0, or floor(p) == -1 with a nonzero fraction;  p < size  <=>  floor(p) < size.
    let above_minus_one = |p0: isize, frac: T| p0 >= 0 || (p0 == -1 && frac > T::ZERO);
    let inside = above_minus_one(c.y0, c.ly)
        && above_minus_one(c.x0, c.lx)
        && c.y0 < h as isize
        && c.x0 < w as isize;
    if inside {
        Sample::Inside(c)
    } else {
        Sample::Outside
    }
}

/// Corners of the sample at `(base_y + dy, base_x + dx)` with no window cut-off (used directly
/// by the coordinate gradient). Far-away or infinite positions give all-invalid corners.
#[inline]
pub(crate) fn corners<T: Float>(
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    h: usize,
    w: usize,
) -> Corners<T> {
    let (wy, ly, hy) = split_with_complement(dy);
    let (wx, lx, hx) = split_with_complement(dx);
    let (y0, x0) = (base_y + wy, base_x + wx);
    let (hi, wi) = (h as isize, w as isize);
    let ok = |r: isize, s: isize| r >= 0 && r < hi && s >= 0 && s < wi;
    let idx = |r: isize, s: isize| {
        if ok(r, s) {
            r as usize * w + s as usize
        } else {
            0
        }
    };
    let pts = [(y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)];
    Corners {
        y0,
        x0,
        ly,
        lx,
        hy,
        hx,
        index: pts.map(|(r, s)| idx(r, s)),
        valid: pts.map(|(r, s)| ok(r, s)),
    }
}

/// Locates the sample at `(base_y + dy, base_x + dx)` under `conv`'s rule.
///
/// - [`Convention::Torchvision`], [`Convention::Mmcv`]: exactly [`locate`].
/// - [`Convention::DcnV1`]: inside iff `0 <= p < size` on both axes; on an axis where
///   `floor(p) == size - 1` the corners collapse onto the last row (column): `ly = 0` (`lx = 0`)
///   and the second corner *is* the first, so `index[2..4] == index[0..2]` (`index[1] ==
///   index[0]`, `index[3] == index[2]`). All four corners are valid. Kernels must therefore
///   read and scatter through `index`/`valid`, never rebuild corners as `y0 + 1`; the zero
///   fraction gives the duplicate corner weight 0, so the sums are those of the clamped rule.
#[inline]
pub(crate) fn locate_in<T: Float>(
    conv: Convention,
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    h: usize,
    w: usize,
) -> Sample<T> {
    match conv {
        Convention::Torchvision | Convention::Mmcv => locate(base_y, dy, base_x, dx, h, w),
        Convention::DcnV1 => locate_clamped(base_y, dy, base_x, dx, h, w),
    }
}

/// DCN v1's rule: window `0 <= p < size`, corners collapsed onto the last row and column.
#[inline]
fn locate_clamped<T: Float>(
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    h: usize,
    w: usize,
) -> Sample<T> {
    if dy.is_nan() || dx.is_nan() {
        return Sample::Nan;
    }
    let (wy, ly, hy) = split_with_complement(dy);
    let (wx, lx, hx) = split_with_complement(dx);
    let (y0, x0) = (base_y + wy, base_x + wx);
    let (hi, wi) = (h as isize, w as isize);
    // p >= 0  <=>  floor(p) >= 0;  p < size  <=>  floor(p) < size. Infinite offsets split into
    // a +-2^30 floor, far outside.
    if !(y0 >= 0 && y0 < hi && x0 >= 0 && x0 < wi) {
        return Sample::Outside;
    }
    // Here h, w >= 1, so `size - 1` is a valid row/column.
    let (y1, ly, hy) = if y0 == hi - 1 {
        (y0, T::ZERO, T::ONE)
    } else {
        (y0 + 1, ly, hy)
    };
    let (x1, lx, hx) = if x0 == wi - 1 {
        (x0, T::ZERO, T::ONE)
    } else {
        (x0 + 1, lx, hx)
    };
    let idx = |r: isize, s: isize| {
        debug_assert!((0..hi).contains(&r) && (0..wi).contains(&s));
        r as usize * w + s as usize
    };
    Sample::Inside(Corners {
        y0,
        x0,
        ly,
        lx,
        hy,
        hx,
        index: [idx(y0, x0), idx(y0, x1), idx(y1, x0), idx(y1, x1)],
        valid: [true; 4],
    })
}

#[cfg(test)]
pub(crate) mod tests;
