//! The sampling rule's tests, and the coordinate derivatives stated as a definition on plain
//! planes, which the kernel tests pin the padded-plane kernels to.

use super::*;

// The coordinate derivatives as a definition, for the tests: the kernels compute them on
// padded planes (`kernels::channel_backward`; `kernels::taps`' tests pin them), pinned to these bit for
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

/// A row-major `h x w` plane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plane<'a, T> {
    /// The `h * w` values.
    pub values: &'a [T],
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
}

/// `(Wy, Wx)`: the derivatives of the bilinear value with respect to the sample's row and
/// column, torchvision's one-sided rule (see the module docs). NaN offsets give NaN; positions
/// with no corner in the plane (far away or infinite) give 0.
fn coordinate_weights<T: Float>(
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    plane: Plane<'_, T>,
) -> (T, T) {
    if dy.is_nan() || dx.is_nan() {
        let nan = T::from_f64(f64::NAN);
        return (nan, nan);
    }
    let c = corners(base_y, dy, base_x, dx, plane.h, plane.w);
    // An infinite offset leaves a NaN fraction (inf - inf) but then no corner is valid.
    if !c.valid.iter().any(|&v| v) {
        return (T::ZERO, T::ZERO);
    }
    derivatives(&c, plane.values)
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
pub(crate) fn coordinate_weights_in<T: Float>(
    conv: Convention,
    base_y: isize,
    dy: T,
    base_x: isize,
    dx: T,
    plane: Plane<'_, T>,
) -> (T, T) {
    if conv == Convention::Torchvision {
        return coordinate_weights(base_y, dy, base_x, dx, plane);
    }
    match locate_in(conv, base_y, dy, base_x, dx, plane.h, plane.w) {
        Sample::Nan => {
            let nan = T::from_f64(f64::NAN);
            (nan, nan)
        }
        Sample::Outside => (T::ZERO, T::ZERO),
        Sample::Inside(c) => derivatives(&c, plane.values),
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
    let grid = Plane {
        values: &plane,
        h: 3,
        w: 4,
    };
    let Sample::Inside(c) = locate(1, 0.25, 3, -0.5, 3, 4) else {
        panic!("inside")
    };
    assert!((interpolate(&c, &plane) - 15.0).abs() < 1e-12);
    let (wy, wx) = coordinate_weights(1, 0.25, 3, -0.5, grid);
    assert_eq!((wy, wx), (10.0, 1.0));
}

#[test]
fn coordinate_weight_at_minus_one_is_right_hand() {
    // At py = -1 exactly: y0 = -1 (reads 0), y1 = 0, so Wy = v(0, x).
    let plane = [5.0f64, 7.0];
    let grid = Plane {
        values: &plane,
        h: 1,
        w: 2,
    };
    let (wy, _) = coordinate_weights(0, -1.0, 0, 0.0, grid);
    assert_eq!(wy, 5.0);
    let far = coordinate_weights(0, f64::NEG_INFINITY, 0, 0.0, grid);
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
    let grid = Plane {
        values: &plane,
        h,
        w,
    };
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
                let (wy, wx) = coordinate_weights_in(conv, by, dy, bx, dx, grid);
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
    let grid = Plane {
        values: &plane,
        h: 3,
        w: 4,
    };
    for &py in &border_positions(3) {
        for &px in &border_positions(4) {
            let conv = Convention::Torchvision;
            assert_eq!(
                locate_in(conv, 0, py, 0, px, 3, 4),
                locate(0, py, 0, px, 3, 4)
            );
            assert_eq!(
                coordinate_weights_in(conv, 0, py, 0, px, grid),
                coordinate_weights(0, py, 0, px, grid)
            );
        }
    }
}

#[test]
fn dcn_v1_collapses_the_last_row_and_column() {
    // 2 x 3 plane, sample at (1.5, 2.25): both axes in their last band.
    let plane = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
    let grid = Plane {
        values: &plane,
        h: 2,
        w: 3,
    };
    let Sample::Inside(c) = locate_in(Convention::DcnV1, 1, 0.5, 2, 0.25, 2, 3) else {
        panic!("inside")
    };
    assert_eq!((c.y0, c.x0, c.ly, c.lx), (1, 2, 0.0, 0.0));
    assert_eq!(c.index, [5, 5, 5, 5]);
    assert_eq!(interpolate(&c, &plane), 6.0);
    let cw = |dy: f64, dx: f64| coordinate_weights_in(Convention::DcnV1, 0, dy, 0, dx, grid);
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
    let grid = Plane {
        values: &plane,
        h: 2,
        w: 2,
    };
    for conv in Convention::ALL {
        assert_eq!(locate_in(conv, 0, f64::NAN, 0, 0.0, 2, 2), Sample::Nan);
        let (wy, wx) = coordinate_weights_in(conv, 0, 0.0, 0, f64::NAN, grid);
        assert!(wy.is_nan() && wx.is_nan());
        for bad in [f64::INFINITY, f64::NEG_INFINITY, 1e300, -1e300] {
            assert_eq!(locate_in(conv, 0, bad, 0, 0.0, 2, 2), Sample::Outside);
            assert_eq!(
                locate_in(conv, 0, 0.5, 0, bad as f32, 2, 2),
                Sample::Outside
            );
            let cw = coordinate_weights_in(conv, 0, bad, 0, 0.5, grid);
            assert_eq!(cw, (0.0, 0.0), "{conv:?} {bad}");
        }
    }
}
