//! The sampling table's entries against the sampling rule, and the plane layouts.

use super::*;

/// A torchvision table `[k][tile]` of `images` planes with interior, border, outside,
/// far-away, NaN and infinite samples and masks in `[-0.5, 1.5)`, from the stream `next`:
/// the common input of the kernels' bitwise and cross-kernel tests.
pub(crate) fn hostile_table(
    layout: PlaneLayout,
    k_taps: usize,
    tile: usize,
    images: usize,
    next: &mut impl FnMut() -> f32,
) -> Vec<Tap<f32>> {
    let specials = [f32::NAN, -1.0, 5.0, 40.0, -0.999, 4.999, f32::INFINITY, 0.0];
    (0..k_taps * tile)
        .map(|e| {
            let dy = if e % 5 == 0 {
                specials[e / 5 % 8]
            } else {
                6.0 * next() - 3.0
            };
            let dx = if e % 7 == 0 {
                specials[e / 7 % 8]
            } else {
                6.0 * next() - 3.0
            };
            let plane0 = (e % images) * layout.len();
            let (at_y, at_x) = (((e % 5) as isize, dy), ((e % 7) as isize, dx));
            Tap::new(layout, plane0, at_y, at_x, next() * 2.0 - 0.5)
        })
        .collect()
}

fn same<T: Float>(a: &Tap<T>, b: &Tap<T>) -> bool {
    let eq = |x: T, y: T| x.to_f64().to_bits() == y.to_f64().to_bits();
    a.gather == b.gather
        && a.scatter == b.scatter
        && a.inside == b.inside
        && eq(a.ly, b.ly)
        && eq(a.lx, b.lx)
        && eq(a.m, b.m)
        && (0..4).all(|c| eq(a.weights[c], b.weights[c]))
}

/// Under rule `R`, the straight-line table entry equals the one built from
/// `sample::locate_in` / `corners`, on border, integer, near-integer, small negative and far
/// positions, in f32 and f64.
fn fast_entry_equals_the_rule_for<R: Rule>() {
    let l = PlaneLayout::for_convention(R::CONVENTION, 4, 3);
    let ds = [
        -3.5, -2.0, -1.5, -1.0, -0.999, -0.5, -1e-7, 0.0, 1e-7, 0.25, 0.999, 1.0, 2.0, 2.5, 2.999,
        3.0, 3.25, 4.0, 4.5, 7.0,
    ];
    for by in -2..6isize {
        for bx in -2..5isize {
            for &dy in &ds {
                for &dx in &ds {
                    let a = Tap::with_rule::<R>(l, 7, (by, dy), (bx, dx), 0.5f64);
                    let b = Tap::by_rule::<R>(l, 7, (by, dy), (bx, dx), 0.5f64);
                    assert!(same(&a, &b), "f64 ({by}+{dy}, {bx}+{dx})");
                    let (fy, fx) = (dy as f32, dx as f32);
                    let a = Tap::with_rule::<R>(l, 7, (by, fy), (bx, fx), 0.5f32);
                    let b = Tap::by_rule::<R>(l, 7, (by, fy), (bx, fx), 0.5f32);
                    assert!(same(&a, &b), "f32 ({by}+{dy}, {bx}+{dx})");
                }
            }
        }
    }
}

/// The dense backward's cell is the torchvision entry's with zero offsets and a unit mask:
/// its scatter base, and its gather base wherever that reads anything but zeros.
#[test]
fn dense_cell_is_the_torchvision_entry_with_zero_offsets() {
    for (h, w) in [(4usize, 3usize), (1, 1), (0, 2)] {
        let l = PlaneLayout::zero_bordered(h, w);
        for by in -4..7isize {
            for bx in -4..6isize {
                let cell = crate::kernels::dense_backward::cell(l, 5, by, bx);
                let t = Tap::new(l, 5, (by, 0.0f32), (bx, 0.0), 1.0);
                assert_eq!(cell, t.scatter, "({by}, {bx}) in {h}x{w}");
                assert_eq!(t.weights, [t.inside as u8 as f32, 0.0, 0.0, 0.0]);
                assert_eq!((t.m, t.ly, t.lx), (1.0, 0.0, 0.0));
                if t.inside {
                    assert_eq!(cell, t.gather);
                }
            }
        }
    }
}

/// Under rule `R`, the coordinate weights on the padded plane read through the table entry,
/// `Wy = lx (v11 - v01) + (1 - lx)(v10 - v00)` and `Wx = ly (v11 - v10) + (1 - ly)(v01 - v00)`
/// (what the fused backward pass computes), equal `sample::tests::coordinate_weights_in` bit
/// for bit, and the bilinear value `sample::locate_in`'s, including integer positions on the
/// border, outside positions and NaN.
fn coordinate_weights_match_for<R: Rule>() {
    use crate::sample;
    let conv = R::CONVENTION;
    let (h, w) = (3usize, 4usize);
    let l = PlaneLayout::for_convention(conv, h, w);
    let image: Vec<f64> = (0..h * w).map(|i| ((i * 7919) % 13) as f64 - 6.5).collect();
    let plane = sample::tests::Plane {
        values: &image,
        h,
        w,
    };
    let mut padded = vec![0.0; l.len()];
    for r in 0..h {
        for s in 0..w {
            padded[l.index(r as isize, s as isize)] = image[r * w + s];
        }
    }
    l.replicate_border(&mut padded, 1);
    let offsets = [
        -2.5, -1.5, -1.0, -0.999, -0.5, 0.0, 0.25, 1.0, 2.0, 2.5, 2.999, 3.0, 3.5, 4.0, 9.0,
    ];
    let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for &dy in &offsets {
        for &dx in offsets.iter().chain([f64::NAN, f64::INFINITY, 1e30].iter()) {
            let t = Tap::with_rule::<R>(l, 0, (0, dy), (0, dx), 1.0);
            let cell = &padded[t.gather..];
            let [v00, v01, v10, v11] = [cell[0], cell[1], cell[l.pitch()], cell[l.pitch() + 1]];
            let wy = t.lx * (v11 - v01) + (1.0 - t.lx) * (v10 - v00);
            let wx = t.ly * (v11 - v10) + (1.0 - t.ly) * (v01 - v00);
            let want = sample::tests::coordinate_weights_in(conv, 0, dy, 0, dx, plane);
            assert!(
                same(wy, want.0) && same(wx, want.1),
                "{conv:?} ({dy}, {dx}): {:?} vs {want:?}",
                (wy, wx)
            );
            let bil = if t.inside {
                t.weights[0] * v00 + t.weights[1] * v01 + t.weights[2] * v10 + t.weights[3] * v11
            } else {
                0.0
            };
            let want_b = match sample::locate_in(conv, 0, dy, 0, dx, h, w) {
                sample::Sample::Inside(c) => sample::tests::interpolate(&c, &image),
                sample::Sample::Outside => 0.0,
                sample::Sample::Nan => f64::NAN,
            };
            assert!(
                same(bil, want_b),
                "{conv:?} B({dy}, {dx}): {bil} vs {want_b}"
            );
        }
    }
}

#[test]
fn coordinate_weights_match_the_sampling_rule() {
    coordinate_weights_match_for::<TorchvisionRule>();
    coordinate_weights_match_for::<MmcvRule>();
    coordinate_weights_match_for::<DcnV1Rule>();
}

#[test]
fn fast_entry_equals_the_rule() {
    fast_entry_equals_the_rule_for::<TorchvisionRule>();
    fast_entry_equals_the_rule_for::<MmcvRule>();
    fast_entry_equals_the_rule_for::<DcnV1Rule>();
}

/// The fast DCN v1 entry reads (through the replicated plane) and weighs exactly the corners
/// of `sample::locate_in` for DCN v1.
#[test]
fn dcn_v1_entry_reads_the_clamped_corners() {
    let (h, w) = (4usize, 3usize);
    let l = PlaneLayout::replicated(h, w);
    let image: Vec<f64> = (0..h * w).map(|i| (i * i) as f64 + 1.0).collect();
    let mut plane = vec![0.0; l.len()];
    for r in 0..h {
        for s in 0..w {
            plane[l.index(r as isize, s as isize)] = image[r * w + s];
        }
    }
    l.replicate_border(&mut plane, 1);
    let ds = [-1.0, -0.5, 0.0, 0.25, 1.0, 1.5, 2.0, 2.75, 3.0, 3.5, 4.0];
    for &py in &ds {
        for &px in &ds {
            let t = Tap::with_rule::<DcnV1Rule>(l, 0, (0, py), (0, px), 1.0);
            let conv = crate::convention::Convention::DcnV1;
            let (index, weight) = match crate::sample::locate_in(conv, 0, py, 0, px, h, w) {
                crate::sample::Sample::Inside(c) => (c.index.map(|i| i as isize), c.weights()),
                _ => ([-1; 4], [0.0; 4]),
            };
            let cells = [
                t.gather,
                t.gather + 1,
                t.gather + l.pitch(),
                t.gather + l.pitch() + 1,
            ];
            for c in 0..4 {
                let want = if index[c] < 0 {
                    0.0
                } else {
                    image[index[c] as usize]
                };
                let got = plane[cells[c]];
                // Collapsed corners read their pixel again, outside samples zeros.
                assert_eq!(got, want, "({py}, {px}) corner {c}");
                assert_eq!(t.weights[c], weight[c], "({py}, {px}) weight {c}");
            }
        }
    }
}

#[test]
fn zero_base_cells_are_all_zero_border() {
    for (h, w) in [(0, 3), (1, 1), (1, 3), (4, 2), (7, 7)] {
        for l in [
            PlaneLayout::zero_bordered(h, w),
            PlaneLayout::replicated(h, w),
        ] {
            // Fill the image with ones and replicate: the zero base must still read zeros.
            let mut plane = vec![0.0f64; l.len()];
            for r in 0..h as isize {
                for s in 0..w as isize {
                    plane[l.index(r, s)] = 1.0;
                }
            }
            l.replicate_border(&mut plane, 1);
            let b = l.zero_base();
            for cell in [b, b + 1, b + l.pitch(), b + l.pitch() + 1] {
                assert!(cell < l.len());
                assert_eq!(plane[cell], 0.0, "{l:?}: {cell}");
            }
        }
    }
}

#[test]
fn replicated_border_copies_the_last_row_and_column() {
    let l = PlaneLayout::replicated(2, 3);
    let mut plane = vec![0.0f64; l.len()];
    for r in 0..2isize {
        for s in 0..3isize {
            plane[l.index(r, s)] = (10 * r + s + 1) as f64;
        }
    }
    l.replicate_border(&mut plane, 1);
    // Rows -1..=2, columns -1..=4; row 2 = row 1, column 3 = column 2, column 4 zero.
    let want = [
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 2.0, 3.0, 3.0, 0.0],
        [0.0, 11.0, 12.0, 13.0, 13.0, 0.0],
        [0.0, 11.0, 12.0, 13.0, 13.0, 0.0],
    ];
    for (r, row) in want.iter().enumerate() {
        assert_eq!(&plane[r * l.pitch()..][..l.pitch()], row, "row {r}");
    }
}

#[test]
fn outside_sample_with_a_corner_in_the_image_reads_it_but_sends_nothing() {
    let l = PlaneLayout::zero_bordered(3, 3);
    // py = -1 exactly: outside the window, but corner (0, 1) is in the image.
    let t = Tap::new(l, 0, (0, -1.0f64), (1, 0.0), 1.0);
    assert!(!t.inside);
    assert_eq!(t.gather, l.index(-1, 1));
    assert_eq!(t.scatter, l.zero_base());
    let far = Tap::new(l, 0, (0, f64::INFINITY), (1, 0.0), 1.0);
    assert_eq!((far.gather, far.ly, far.lx), (l.zero_base(), 0.0, 0.0));
    // mmcv cuts it off: the zero cells, no fractions.
    let t = Tap::with_rule::<MmcvRule>(l, 0, (0, -1.0f64), (1, 0.0), 1.0);
    assert_eq!(
        (t.gather, t.ly, t.lx, t.inside),
        (l.zero_base(), 0.0, 0.0, false)
    );
}
