//! Zero offsets with a unit mask (or no mask) are exactly a dense cross-correlation
//! (DESIGN.md §2, last line), and so is `reference::conv2d`.
//!
//! The dense convolution is written here again, independently of the crate, as plain loops
//! over signed pixel coordinates. Operands are small integers, so every product and partial
//! sum is an exactly representable integer: the results must be *equal*, whatever order
//! either side sums in.

mod support;

use deformconv::{reference, Padding};
use ndarray::{Array1, Array4};
use support::{Case, Rng};

/// `out[n, o, y, x] = bias[o] + sum_{c', i, j} weight[o, c', i, j] * input[n, c, r, s]` with
/// `c = (o / (C_out/groups)) * (C_in/groups) + c'`, `r = y*sh - pad_top + i*dh`,
/// `s = x*sw - pad_left + j*dw`, and pixels outside the image reading 0.
fn dense_conv(
    spec: &Case,
    input: &Array4<f64>,
    weight: &Array4<f64>,
    bias: Option<&Array1<f64>>,
) -> Array4<f64> {
    let [n_img, _, h, w] = spec.input_shape();
    let [c_out, cin_pg, kh, kw] = spec.weight_shape();
    let p = spec.padding();
    // H_out = (H + top + bottom - (dh (kh - 1) + 1)) / sh + 1, written out again here.
    let h_out = (h + p.top + p.bottom - spec.dilation().0 * (kh - 1) - 1) / spec.stride().0 + 1;
    let w_out = (w + p.left + p.right - spec.dilation().1 * (kw - 1) - 1) / spec.stride().1 + 1;
    let cout_pg = c_out / spec.groups();
    let mut out = Array4::zeros((n_img, c_out, h_out, w_out));
    for n in 0..n_img {
        for o in 0..c_out {
            let group = o / cout_pg;
            for y in 0..h_out {
                for x in 0..w_out {
                    let mut acc = bias.map_or(0.0, |b| b[o]);
                    for ci in 0..cin_pg {
                        let c = group * cin_pg + ci;
                        for i in 0..kh {
                            for j in 0..kw {
                                let r = (y * spec.stride().0 + i * spec.dilation().0) as isize
                                    - p.top as isize;
                                let s = (x * spec.stride().1 + j * spec.dilation().1) as isize
                                    - p.left as isize;
                                if r >= 0 && s >= 0 && (r as usize) < h && (s as usize) < w {
                                    acc += weight[[o, ci, i, j]]
                                        * input[[n, c, r as usize, s as usize]];
                                }
                            }
                        }
                    }
                    out[[n, o, y, x]] = acc;
                }
            }
        }
    }
    out
}

fn pad(top: usize, bottom: usize, left: usize, right: usize) -> Padding {
    Padding {
        top,
        bottom,
        left,
        right,
    }
}

/// Hand-picked configurations: each stride, dilation, padding shape (none, symmetric,
/// asymmetric, one-sided) and grouping (plain, grouped, depthwise) at least once, square and
/// non-square kernels, several offset groups (irrelevant with zero offsets, but validated).
fn listed_specs() -> Vec<Case> {
    type Row = (
        usize,
        usize,
        usize,
        usize,
        (usize, usize),
        (usize, usize),
        (usize, usize),
        Padding,
        (usize, usize),
    );
    let rows: [Row; 14] = [
        // groups, cin/g, cout/g, og_pick, kernel, stride, dilation, padding, extra
        (1, 1, 1, 0, (3, 3), (1, 1), (1, 1), pad(0, 0, 0, 0), (2, 2)),
        (1, 3, 2, 1, (3, 3), (1, 1), (1, 1), pad(1, 1, 1, 1), (0, 1)),
        (1, 2, 2, 0, (3, 3), (2, 2), (1, 1), pad(1, 1, 1, 1), (3, 2)),
        (1, 2, 3, 1, (3, 3), (3, 2), (1, 1), pad(0, 0, 0, 0), (5, 4)),
        (1, 2, 2, 0, (3, 3), (1, 1), (2, 2), pad(2, 2, 2, 2), (1, 1)),
        (1, 1, 2, 0, (2, 3), (1, 2), (3, 1), pad(0, 0, 1, 1), (2, 3)),
        (2, 2, 3, 1, (3, 3), (1, 1), (1, 1), pad(1, 1, 1, 1), (1, 1)),
        (3, 1, 2, 2, (3, 1), (2, 1), (1, 2), pad(1, 0, 0, 2), (2, 2)),
        (4, 1, 1, 2, (3, 3), (1, 1), (1, 1), pad(1, 1, 1, 1), (2, 0)), // depthwise
        (1, 2, 1, 1, (1, 3), (1, 1), (1, 1), pad(2, 0, 0, 1), (0, 0)),
        (1, 1, 1, 0, (1, 1), (2, 3), (1, 1), pad(0, 1, 2, 0), (4, 5)),
        (2, 1, 2, 0, (2, 2), (2, 2), (2, 3), pad(0, 3, 3, 0), (0, 0)),
        (1, 2, 2, 1, (4, 2), (1, 1), (1, 1), pad(0, 0, 0, 0), (0, 0)), // kernel = whole image
        (2, 2, 1, 3, (3, 2), (3, 3), (2, 2), pad(3, 3, 2, 2), (1, 2)), // mostly padding
    ];
    rows.iter()
        .enumerate()
        .map(
            |(k, &(g, cin, cout, og, kernel, stride, dil, padding, extra))| {
                Case::from_knobs(
                    1 + k % 2,
                    g,
                    cin,
                    cout,
                    og,
                    kernel,
                    stride,
                    dil,
                    padding,
                    extra,
                )
            },
        )
        .collect()
}

fn all_specs() -> Vec<Case> {
    let mut rng = Rng::new(0xde75e);
    let mut specs = listed_specs();
    specs.extend((0..60).map(|_| Case::random(&mut rng)));
    specs
}

#[test]
fn zero_offsets_with_unit_or_no_mask_equal_dense_convolution() {
    let mut rng = Rng::new(1);
    for spec in all_specs() {
        let input = rng.int_array4(spec.input_shape(), -4, 4);
        let weight = rng.int_array4(spec.weight_shape(), -3, 3);
        let bias = Array1::from_shape_simple_fn(spec.c_out, || rng.int(-5, 5) as f64);
        let offset = Array4::<f64>::zeros(spec.offset_shape());
        let ones = Array4::<f64>::ones(spec.mask_shape());
        let p = spec.params;
        for b in [None, Some(&bias)] {
            let want = dense_conv(&spec, &input, &weight, b);
            let bv = b.map(|b| b.view());
            let deform_unit = reference::deform_conv2d(
                input.view(),
                offset.view(),
                Some(ones.view()),
                weight.view(),
                bv,
                &p,
            )
            .unwrap();
            assert_eq!(deform_unit, want, "deform, unit mask, {spec:?}");
            let deform_none =
                reference::deform_conv2d(input.view(), offset.view(), None, weight.view(), bv, &p)
                    .unwrap();
            assert_eq!(deform_none, want, "deform, no mask, {spec:?}");
            let dense = reference::conv2d(input.view(), weight.view(), bv, &p).unwrap();
            assert_eq!(dense, want, "conv2d, {spec:?}");
        }
    }
}

/// Small integers are exact in `f32` too, and the oracle widens to `f64` before any
/// arithmetic, so `f32` operands give the same (exact) result.
#[test]
fn f32_operands_give_the_same_dense_result() {
    let mut rng = Rng::new(2);
    for spec in all_specs() {
        let input = rng.int_array4(spec.input_shape(), -4, 4);
        let weight = rng.int_array4(spec.weight_shape(), -3, 3);
        let want = dense_conv(&spec, &input, &weight, None);
        let (input32, weight32) = (input.mapv(|v| v as f32), weight.mapv(|v| v as f32));
        let offset32 = Array4::<f32>::zeros(spec.offset_shape());
        let p = spec.params;
        let deform = reference::deform_conv2d(
            input32.view(),
            offset32.view(),
            None,
            weight32.view(),
            None,
            &p,
        )
        .unwrap();
        assert_eq!(deform, want, "deform f32, {spec:?}");
        let dense = reference::conv2d(input32.view(), weight32.view(), None, &p).unwrap();
        assert_eq!(dense, want, "conv2d f32, {spec:?}");
    }
}

/// Integer offsets move every sample onto another grid point: the deformable result is then
/// the dense one of a shifted image (here a uniform shift `(dy, dx)` of the whole grid equals
/// extra padding `pad_top - dy`, `pad_left - dx`).
#[test]
fn uniform_integer_offsets_equal_shifted_dense_convolution() {
    let mut rng = Rng::new(3);
    let mut checked = 0;
    for (dy, dx) in [(1i64, 0i64), (0, -1), (-2, 1), (1, 2)] {
        for mut spec in all_specs() {
            // Shifting by (dy, dx) is padding (top - dy, left - dx) if those stay >= 0; keep
            // bottom/right adjusted so the output extent is unchanged.
            let (top, left) = (
                spec.padding().top as i64 - dy,
                spec.padding().left as i64 - dx,
            );
            let (bottom, right) = (
                spec.padding().bottom as i64 + dy,
                spec.padding().right as i64 + dx,
            );
            if top < 0 || left < 0 || bottom < 0 || right < 0 {
                continue;
            }
            let input = rng.int_array4(spec.input_shape(), -4, 4);
            let weight = rng.int_array4(spec.weight_shape(), -3, 3);
            let mut offset = Array4::<f64>::zeros(spec.offset_shape());
            for ((_, ch, _, _), v) in offset.indexed_iter_mut() {
                *v = if ch % 2 == 0 { dy as f64 } else { dx as f64 };
            }
            let got = reference::deform_conv2d(
                input.view(),
                offset.view(),
                None,
                weight.view(),
                None,
                &spec.params,
            )
            .unwrap();
            spec.params.padding = pad(top as usize, bottom as usize, left as usize, right as usize);
            let want = dense_conv(&spec, &input, &weight, None);
            assert_eq!(got, want, "shift ({dy}, {dx}), shifted spec {spec:?}");
            checked += 1;
        }
    }
    assert!(checked >= 50, "only {checked} shifted cases ran");
}
