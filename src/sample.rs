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
//! evaluate them on padded planes (`kernels::coord`, `kernels::channel_backward`); the tests
//! state them once more on plain planes (`tests::coordinate_weights_in`) and pin the two.
//!
//! Other conventions ([`Convention`]) go through [`locate_in`]; for
//! [`Convention::Torchvision`] it is exactly [`locate`]. The forward gather's flat forms are [`locate_flat`] (torchvision, mmcv) and
//! [`locate_flat_clamped`] (DCN v1).

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

/// [`locate`] in the flat form the gather table stores: corner offsets `row * W + col` in the
/// order of [`Corners::index`] (`-1` for a corner outside the plane) and the corner weights.
/// An outside sample gives no corners and zero weights, a NaN sample no corners and NaN
/// weights. Same rule and same values as [`locate`] (tested below), but with no enum and few
/// branches, so that it compiles to straight-line code in the gather's hot loop; offsets of
/// magnitude `2^22` or more (and NaN) take [`locate`] itself.
#[inline(always)]
pub(crate) fn locate_flat<T: Float>(
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    h: usize,
    w: usize,
) -> ([isize; 4], [T; 4]) {
    let limit = T::from_usize(1 << 22);
    if !(dy.abs() < limit && dx.abs() < limit) {
        return match locate(base_y, dy, base_x, dx, h, w) {
            Sample::Inside(c) => (
                [0, 1, 2, 3].map(|t| if c.valid[t] { c.index[t] as isize } else { -1 }),
                c.weights(),
            ),
            Sample::Outside => ([-1; 4], [T::ZERO; 4]),
            Sample::Nan => ([-1; 4], [T::from_f64(f64::NAN); 4]),
        };
    }
    // |d| < 2^22: `split` would not clamp, so this is the same split, inline.
    let (fy, fx) = (dy.floor(), dx.floor());
    let (ly, lx) = (dy - fy, dx - fx);
    let (hy, hx) = ((fy + T::ONE) - dy, (fx + T::ONE) - dx);
    let y0 = base_y + fy.to_f64() as isize;
    let x0 = base_x + fx.to_f64() as isize;
    let (hi, wi) = (h as isize, w as isize);
    let inside = (y0 >= 0 || (y0 == -1 && ly > T::ZERO))
        && (x0 >= 0 || (x0 == -1 && lx > T::ZERO))
        && y0 < hi
        && x0 < wi;
    if !inside {
        return ([-1; 4], [T::ZERO; 4]);
    }
    let (vy0, vy1, vx0, vx1) = (y0 >= 0, y0 + 1 < hi, x0 >= 0, x0 + 1 < wi);
    let at = |ok: bool, i: isize| if ok { i } else { -1 };
    let base = y0 * wi + x0;
    (
        [
            at(vy0 && vx0, base),
            at(vy0 && vx1, base + 1),
            at(vy1 && vx0, base + wi),
            at(vy1 && vx1, base + wi + 1),
        ],
        [hy * hx, hy * lx, ly * hx, ly * lx],
    )
}

/// [`locate_in`] for [`Convention::DcnV1`] in the flat form of [`locate_flat`]: window
/// `0 <= p < size` on both axes; on an axis whose `floor(p)` is the last row (column) the
/// second corner repeats the first (`index[2..4] == index[0..2]`, resp. `index[1] == index[0]`,
/// `index[3] == index[2]`) with fraction 0, so its weight is 0. Every corner of a counting
/// sample is inside the plane (no `-1`). Same values as [`locate_in`] bit for bit (tested
/// below); offsets of magnitude `2^22` or more (and NaN) take [`locate_in`] itself.
#[inline(always)]
pub(crate) fn locate_flat_clamped<T: Float>(
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    h: usize,
    w: usize,
) -> ([isize; 4], [T; 4]) {
    let limit = T::from_usize(1 << 22);
    if !(dy.abs() < limit && dx.abs() < limit) {
        return match locate_clamped(base_y, dy, base_x, dx, h, w) {
            Sample::Inside(c) => (c.index.map(|i| i as isize), c.weights()),
            Sample::Outside => ([-1; 4], [T::ZERO; 4]),
            Sample::Nan => ([-1; 4], [T::from_f64(f64::NAN); 4]),
        };
    }
    // |d| < 2^22: `split` would not clamp, so this is the same split, inline.
    let (fy, fx) = (dy.floor(), dx.floor());
    let y0 = base_y + fy.to_f64() as isize;
    let x0 = base_x + fx.to_f64() as isize;
    let (hi, wi) = (h as isize, w as isize);
    // p >= 0  <=>  floor(p) >= 0;  p < size  <=>  floor(p) < size.
    if !(y0 >= 0 && y0 < hi && x0 >= 0 && x0 < wi) {
        return ([-1; 4], [T::ZERO; 4]);
    }
    // On the last row (column) the fraction becomes 0, its complement 1 and the second
    // corner steps by 0 instead of one row (column).
    let (ly, hy, step_y) = if y0 == hi - 1 {
        (T::ZERO, T::ONE, 0)
    } else {
        (dy - fy, (fy + T::ONE) - dy, wi)
    };
    let (lx, hx, step_x) = if x0 == wi - 1 {
        (T::ZERO, T::ONE, 0)
    } else {
        (dx - fx, (fx + T::ONE) - dx, 1)
    };
    let base = y0 * wi + x0;
    (
        [base, base + step_x, base + step_y, base + step_y + step_x],
        [hy * hx, hy * lx, ly * hx, ly * lx],
    )
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
pub(crate) mod tests {
    use super::*;

    // The coordinate derivatives as a definition, for the tests: the kernels compute them on
    // padded planes (`kernels::coord`, `kernels::channel_backward`), pinned to these bit for
    // bit, and these are checked against the reference below.

    /// The four corner values, 0 for corners outside the plane.
    fn values<T: Float>(c: &Corners<T>, plane: &[T]) -> [T; 4] {
        std::array::from_fn(|t| {
            if c.valid[t] {
                plane[c.index[t]]
            } else {
                T::ZERO
            }
        })
    }

    /// The bilinear value over `plane` (row-major `H x W`), invalid corners reading 0.
    pub(crate) fn interpolate<T: Float>(c: &Corners<T>, plane: &[T]) -> T {
        let (v, wt) = (values(c, plane), c.weights());
        wt[0] * v[0] + wt[1] * v[1] + wt[2] * v[2] + wt[3] * v[3]
    }

    /// `(Wy, Wx)`: the derivatives of the bilinear value with respect to the sample's row and
    /// column, torchvision's one-sided rule (see the module docs). NaN offsets give NaN; positions
    /// with no corner in the plane (far away or infinite) give 0.
    fn coordinate_weights<T: Float>(
        base_y: isize,
        dy: T,
        base_x: isize,
        dx: T,
        plane: &[T],
        h: usize,
        w: usize,
    ) -> (T, T) {
        if dy.is_nan() || dx.is_nan() {
            let nan = T::from_f64(f64::NAN);
            return (nan, nan);
        }
        let c = corners(base_y, dy, base_x, dx, h, w);
        // An infinite offset leaves a NaN fraction (inf - inf) but then no corner is valid.
        if !c.valid.iter().any(|&v| v) {
            return (T::ZERO, T::ZERO);
        }
        derivatives(&c, plane)
    }

    /// `(Wy, Wx)` on already located corners (invalid corners reading 0).
    fn derivatives<T: Float>(c: &Corners<T>, plane: &[T]) -> (T, T) {
        let [v00, v01, v10, v11] = values(c, plane);
        let (ly, lx) = (c.ly, c.lx);
        let wy = lx * (v11 - v01) + (T::ONE - lx) * (v10 - v00);
        let wx = ly * (v11 - v10) + (T::ONE - ly) * (v01 - v00);
        (wy, wx)
    }

    /// `(Wy, Wx)` under `conv`'s rule (see [`Convention`]):
    ///
    /// - [`Convention::Torchvision`]: exactly [`coordinate_weights`] (no window cut-off);
    /// - [`Convention::Mmcv`]: 0 where [`locate`] says `Outside`, else the same formulas;
    /// - [`Convention::DcnV1`]: 0 where [`locate_in`] says `Outside`, else the formulas on the
    ///   collapsed corners (so 0 along an axis whose sample sits on the last row/column band).
    ///
    /// NaN offsets give NaN in every convention.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn coordinate_weights_in<T: Float>(
        conv: Convention,
        base_y: isize,
        dy: T,
        base_x: isize,
        dx: T,
        plane: &[T],
        h: usize,
        w: usize,
    ) -> (T, T) {
        if conv == Convention::Torchvision {
            return coordinate_weights(base_y, dy, base_x, dx, plane, h, w);
        }
        match locate_in(conv, base_y, dy, base_x, dx, h, w) {
            Sample::Nan => {
                let nan = T::from_f64(f64::NAN);
                (nan, nan)
            }
            Sample::Outside => (T::ZERO, T::ZERO),
            Sample::Inside(c) => derivatives(&c, plane),
        }
    }

    #[test]
    fn window_is_open_at_minus_one_and_size() {
        assert_eq!(locate(0, -1.0f64, 0, 0.0, 3, 3), Sample::Outside);
        assert_eq!(locate(0, 0.0f64, 2, 1.0, 3, 3), Sample::Outside);
        assert!(matches!(
            locate(0, -0.999f64, 2, 0.999, 3, 3),
            Sample::Inside(_)
        ));
        assert!(matches!(
            locate(-1, 1e-3f64, 0, 0.0, 3, 3),
            Sample::Inside(_)
        ));
        assert_eq!(locate(0, f64::NAN, 0, 0.0, 3, 3), Sample::Nan);
        assert_eq!(locate(0, f64::INFINITY, 0, 0.0, 3, 3), Sample::Outside);
        assert_eq!(locate(0, 1e300f64, 0, -1e300, 3, 3), Sample::Outside);
        assert_eq!(locate(0, f32::MAX, 0, f32::MIN, 3, 3), Sample::Outside);
    }

    #[test]
    fn interpolation_of_a_ramp_is_exact() {
        // v(r, s) = 10 r + s is bilinear, so interpolation reproduces it exactly inside.
        let plane: Vec<f64> = (0..12).map(|i| (10 * (i / 4) + i % 4) as f64).collect();
        let Sample::Inside(c) = locate(1, 0.25, 3, -0.5, 3, 4) else {
            panic!("inside")
        };
        assert!((interpolate(&c, &plane) - 15.0).abs() < 1e-12);
        let (wy, wx) = coordinate_weights(1, 0.25, 3, -0.5, &plane, 3, 4);
        assert_eq!((wy, wx), (10.0, 1.0));
    }

    #[test]
    fn flat_form_agrees_with_locate() {
        let offsets = [
            0.0f32,
            0.25,
            -0.25,
            -1.0,
            1.0,
            -0.0033831,
            0.999_999_9,
            -0.999_999_9,
            2.0,
            -2.5,
            3.75,
            -3.0,
            7.0,
            -8.0,
            1e7,
            -1e7,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        let (h, w) = (5usize, 7usize);
        for base_y in -3isize..8 {
            for base_x in [-2isize, -1, 0, 3, 6, 7, 9] {
                for &dy in &offsets {
                    for &dx in &offsets {
                        let (index, weight) = locate_flat(base_y, dy, base_x, dx, h, w);
                        let (want_index, want_weight) = match locate(base_y, dy, base_x, dx, h, w) {
                            Sample::Inside(c) => (
                                [0, 1, 2, 3]
                                    .map(|t| if c.valid[t] { c.index[t] as isize } else { -1 }),
                                c.weights(),
                            ),
                            Sample::Outside => ([-1; 4], [0.0; 4]),
                            Sample::Nan => ([-1; 4], [f32::NAN; 4]),
                        };
                        assert_eq!(index, want_index, "{base_y} {dy} {base_x} {dx}");
                        assert_eq!(weight.map(f32::to_bits), want_weight.map(f32::to_bits));
                    }
                }
            }
        }
    }

    #[test]
    fn flat_clamped_form_agrees_with_locate_in() {
        let offsets = [
            0.0f32,
            0.25,
            -0.25,
            -1.0,
            1.0,
            -0.0033831,
            0.999_999_9,
            -0.999_999_9,
            1e-3,
            -1e-3,
            2.0,
            -2.5,
            3.75,
            -3.0,
            7.0,
            -8.0,
            1e7,
            -1e7,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ];
        for (h, w) in [(5usize, 7usize), (1, 1), (1, 3), (0, 2)] {
            for base_y in -3isize..8 {
                for base_x in [-2isize, -1, 0, 1, 3, 6, 7, 9] {
                    for &dy in &offsets {
                        for &dx in &offsets {
                            let (index, weight) = locate_flat_clamped(base_y, dy, base_x, dx, h, w);
                            let conv = Convention::DcnV1;
                            let (want_index, want_weight) =
                                match locate_in(conv, base_y, dy, base_x, dx, h, w) {
                                    Sample::Inside(c) => {
                                        assert_eq!(c.valid, [true; 4]);
                                        (c.index.map(|i| i as isize), c.weights())
                                    }
                                    Sample::Outside => ([-1; 4], [0.0; 4]),
                                    Sample::Nan => ([-1; 4], [f32::NAN; 4]),
                                };
                            let at = format!("{h}x{w}: {base_y} {dy} {base_x} {dx}");
                            assert_eq!(index, want_index, "{at}");
                            assert_eq!(
                                weight.map(f32::to_bits),
                                want_weight.map(f32::to_bits),
                                "{at}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn coordinate_weight_at_minus_one_is_right_hand() {
        // At py = -1 exactly: y0 = -1 (reads 0), y1 = 0, so Wy = v(0, x).
        let plane = [5.0f64, 7.0];
        let (wy, _) = coordinate_weights(0, -1.0, 0, 0.0, &plane, 1, 2);
        assert_eq!(wy, 5.0);
        let far = coordinate_weights(0, f64::NEG_INFINITY, 0, 0.0, &plane, 1, 2);
        assert_eq!(far, (0.0, 0.0));
    }

    /// Positions on and around both borders of an axis of `size` pixels, and integers.
    fn border_positions(size: usize) -> Vec<f64> {
        let s = size as f64;
        vec![
            -2.0,
            -1.5,
            -1.0 - 1e-3,
            -1.0,
            -1.0 + 1e-3,
            -0.5,
            0.0,
            1e-3,
            0.25,
            1.0,
            s - 1.0 - 1e-3,
            s - 1.0,
            s - 1.0 + 1e-3,
            s - 0.5,
            s - 1e-3,
            s,
            s + 1e-3,
            s + 0.5,
        ]
    }

    #[test]
    fn every_convention_follows_the_reference_rule() {
        use crate::reference;
        let (h, w) = (3usize, 4usize);
        let plane: Vec<f64> = (0..h * w)
            .map(|i| ((i * 7 + 3) % 11) as f64 - 5.0 + 0.25 * i as f64)
            .collect();
        let input = ndarray::Array4::from_shape_vec((1, 1, h, w), plane.clone()).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs());
        // Kernels form positions as an integer base plus the offset: do the same.
        let (by, bx) = (1isize, 2isize);
        let mut inside_seen = [0usize; 3];
        for (ci, conv) in Convention::ALL.into_iter().enumerate() {
            for &py in &border_positions(h) {
                for &px in &border_positions(w) {
                    let (dy, dx) = (py - by as f64, px - bx as f64);
                    let (ry, rx) = (
                        reference::Coord::new(by as i128, dy),
                        reference::Coord::new(bx as i128, dx),
                    );
                    let at = format!("{conv:?} at ({py}, {px})");
                    match (
                        locate_in(conv, by, dy, bx, dx, h, w),
                        reference::corners(conv, h, w, ry, rx),
                    ) {
                        (Sample::Outside, None) => {}
                        (Sample::Inside(c), Some(cs)) => {
                            inside_seen[ci] += 1;
                            let b = reference::bilinear(conv, &input.view(), 0, 0, ry, rx);
                            assert!(close(interpolate(&c, &plane), b), "{at}: value");
                            // The input-gradient footprint: weights summed per pixel.
                            let (mut fast, mut slow) = (vec![0.0; h * w], vec![0.0; h * w]);
                            for (k, wt) in c.weights().into_iter().enumerate() {
                                if c.valid[k] {
                                    fast[c.index[k]] += wt;
                                }
                            }
                            for (r, s, wt) in cs {
                                if r >= 0.0 && r < h as f64 && s >= 0.0 && s < w as f64 {
                                    slow[r as usize * w + s as usize] += wt;
                                }
                            }
                            for (f, r) in fast.iter().zip(&slow) {
                                assert!(close(*f, *r), "{at}: footprint {fast:?} vs {slow:?}");
                            }
                        }
                        (got, want) => panic!("{at}: located {got:?}, reference {want:?}"),
                    }
                    let (wy, wx) = coordinate_weights_in(conv, by, dy, bx, dx, &plane, h, w);
                    let (gy, gx) = reference::coordinate_weights(conv, &input.view(), 0, 0, ry, rx);
                    assert!(
                        close(wy, gy) && close(wx, gx),
                        "{at}: ({wy}, {wx}) vs ({gy}, {gx})"
                    );
                }
            }
        }
        // Torchvision and mmcv share the window; DCN v1's is smaller.
        assert_eq!(inside_seen[0], inside_seen[1]);
        assert!(inside_seen[2] > 0 && inside_seen[2] < inside_seen[0]);
    }

    #[test]
    fn torchvision_convention_is_the_default_path() {
        let plane: Vec<f64> = (0..12).map(|i| (i * i) as f64).collect();
        for &py in &border_positions(3) {
            for &px in &border_positions(4) {
                let conv = Convention::Torchvision;
                assert_eq!(
                    locate_in(conv, 0, py, 0, px, 3, 4),
                    locate(0, py, 0, px, 3, 4)
                );
                assert_eq!(
                    coordinate_weights_in(conv, 0, py, 0, px, &plane, 3, 4),
                    coordinate_weights(0, py, 0, px, &plane, 3, 4)
                );
            }
        }
    }

    #[test]
    fn dcn_v1_collapses_the_last_row_and_column() {
        // 2 x 3 plane, sample at (1.5, 2.25): both axes in their last band.
        let plane = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
        let Sample::Inside(c) = locate_in(Convention::DcnV1, 1, 0.5, 2, 0.25, 2, 3) else {
            panic!("inside")
        };
        assert_eq!((c.y0, c.x0, c.ly, c.lx), (1, 2, 0.0, 0.0));
        assert_eq!(c.index, [5, 5, 5, 5]);
        assert_eq!(interpolate(&c, &plane), 6.0);
        let cw =
            |dy: f64, dx: f64| coordinate_weights_in(Convention::DcnV1, 0, dy, 0, dx, &plane, 2, 3);
        assert_eq!(cw(1.5, 2.25), (0.0, 0.0));
        // (0, 0.5): Wy = v(1,·) - v(0,·) = 3, Wx = v(0,1) - v(0,0) = 1.
        assert_eq!(cw(0.0, 0.5), (3.0, 1.0));
        // Outside the window: (-0.5, 0) and (0, 3).
        assert_eq!(cw(-0.5, 0.0), (0.0, 0.0));
        assert_eq!(
            locate_in(Convention::DcnV1, 0, -0.5, 0, 0.0, 2, 3),
            Sample::Outside
        );
        assert_eq!(
            locate_in(Convention::DcnV1, 0, 0.0, 0, 3.0, 2, 3),
            Sample::Outside
        );
        // Empty planes (H = 0 with padding) have no window at all.
        assert_eq!(
            locate_in(Convention::DcnV1, 0, 0.0f64, 0, 0.0, 0, 3),
            Sample::Outside
        );
    }

    #[test]
    fn non_finite_offsets_in_every_convention() {
        let plane = [1.0f64, 2.0, 3.0, 4.0];
        for conv in Convention::ALL {
            assert_eq!(locate_in(conv, 0, f64::NAN, 0, 0.0, 2, 2), Sample::Nan);
            let (wy, wx) = coordinate_weights_in(conv, 0, 0.0, 0, f64::NAN, &plane, 2, 2);
            assert!(wy.is_nan() && wx.is_nan());
            for bad in [f64::INFINITY, f64::NEG_INFINITY, 1e300, -1e300] {
                assert_eq!(locate_in(conv, 0, bad, 0, 0.0, 2, 2), Sample::Outside);
                assert_eq!(
                    locate_in(conv, 0, 0.5, 0, bad as f32, 2, 2),
                    Sample::Outside
                );
                let cw = coordinate_weights_in(conv, 0, bad, 0, 0.5, &plane, 2, 2);
                assert_eq!(cw, (0.0, 0.0), "{conv:?} {bad}");
            }
        }
    }
}
