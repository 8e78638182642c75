//! The NHWC entry points (`deformconv::nhwc`): bitwise the NCHW fast path on the transposed
//! tensors, for every function, every weight layout, f32 and f64; equal to the reference; and
//! the documented NHWC offset layout checked by a loop that reads it directly.
//!
//! The NHWC tensors and the weights in each layout are built here by index formulas, not by the
//! crate's conversions.

mod support;

use deformconv::layout::WeightLayout;
use deformconv::{nhwc, reference, ConvParams, Error, Float, Grads, Want};
use ndarray::{Array1, Array4, ArrayView4};
use proptest::prelude::*;
use support::{cases, Case, Rng, Tensors};

const LAYOUTS: [WeightLayout; 4] = [
    WeightLayout::Oihw,
    WeightLayout::Iohw,
    WeightLayout::Hwio,
    WeightLayout::Ohwi,
];

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// `nhwc[n, y, x, c] = a[n, c, y, x]`.
fn to_nhwc<T: Copy>(a: &Array4<T>) -> Array4<T> {
    let [n, c, h, w] = shape4(a.shape());
    Array4::from_shape_fn((n, h, w, c), |(b, y, x, ch)| a[[b, ch, y, x]])
}

/// `a[n, c, y, x] = nhwc[n, y, x, c]`.
fn from_nhwc<T: Copy>(a: &Array4<T>) -> Array4<T> {
    let [n, h, w, c] = shape4(a.shape());
    Array4::from_shape_fn((n, c, h, w), |(b, ch, y, x)| a[[b, y, x, ch]])
}

/// Where our weight element `[o, c, i, j]` sits in `layout`.
fn stored_index(layout: WeightLayout, [o, c, i, j]: [usize; 4]) -> [usize; 4] {
    match layout {
        WeightLayout::Oihw => [o, c, i, j],
        WeightLayout::Iohw => [c, o, i, j],
        WeightLayout::Hwio => [i, j, c, o],
        WeightLayout::Ohwi => [o, i, j, c],
    }
}

fn weight_in<T: Copy>(layout: WeightLayout, w: &Array4<T>) -> Array4<T> {
    let s = stored_index(layout, shape4(w.shape()));
    let mut out = Array4::from_elem(s, w[[0, 0, 0, 0]]);
    for ((o, c, i, j), &v) in w.indexed_iter() {
        out[stored_index(layout, [o, c, i, j])] = v;
    }
    out
}

fn weight_from<T: Copy>(layout: WeightLayout, stored: &Array4<T>, oihw: [usize; 4]) -> Array4<T> {
    Array4::from_shape_fn(oihw, |(o, c, i, j)| {
        stored[stored_index(layout, [o, c, i, j])]
    })
}

fn bits<T: Float>(a: &Array4<T>, b: &Array4<T>) -> bool {
    a.shape() == b.shape()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

fn bits1<T: Float>(a: &Array1<T>, b: &Array1<T>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

/// One problem in `T`, NCHW, plus a `grad_out`.
struct Ops<T> {
    input: Array4<T>,
    offset: Array4<T>,
    mask: Option<Array4<T>>,
    weight: Array4<T>,
    bias: Option<Array1<T>>,
    grad_out: Array4<T>,
}

fn ops<T: Float>(case: &Case) -> Ops<T> {
    let t: Tensors = case.tensors();
    let c = |a: &Array4<f64>| a.mapv(T::from_f64);
    let mut r = Rng::new(case.seed ^ 0x5eed);
    let grad_out = Array4::from_shape_fn(case.geometry().out_shape(), |_| r.value());
    Ops {
        input: c(&t.input),
        offset: c(&t.offset),
        mask: t.mask.as_ref().map(c),
        weight: c(&t.weight),
        bias: t.bias.as_ref().map(|b| b.mapv(T::from_f64)),
        grad_out: c(&grad_out),
    }
}

/// Compares the combined-backward gradients of the two paths (NHWC ones brought back).
fn same_grads<T: Float>(nhwc: &Grads<T>, nchw: &Grads<T>, layout: WeightLayout, ws: [usize; 4]) {
    let act = |a: &Option<Array4<T>>| a.as_ref().map(from_nhwc);
    for (name, got, want) in [
        ("input", act(&nhwc.input), &nchw.input),
        ("offset", act(&nhwc.offset), &nchw.offset),
        ("mask", act(&nhwc.mask), &nchw.mask),
        (
            "weight",
            nhwc.weight.as_ref().map(|w| weight_from(layout, w, ws)),
            &nchw.weight,
        ),
    ] {
        match (got, want) {
            (Some(g), Some(w)) => assert!(bits(&g, w), "{name}"),
            (None, None) => {}
            _ => panic!("{name}: one side missing"),
        }
    }
    match (&nhwc.bias, &nchw.bias) {
        (Some(a), Some(b)) => assert!(bits1(a, b), "bias"),
        (None, None) => {}
        _ => panic!("bias: one side missing"),
    }
}

/// Every NHWC function equals the NCHW fast path on the same numbers, bit for bit.
fn nhwc_equals_nchw<T: Float>(case: &Case, layout: WeightLayout) {
    let o = ops::<T>(case);
    let p = &case.params;
    let (input, offset, grad_out) = (to_nhwc(&o.input), to_nhwc(&o.offset), to_nhwc(&o.grad_out));
    let mask = o.mask.as_ref().map(to_nhwc);
    let weight = weight_in(layout, &o.weight);
    let ws = shape4(o.weight.shape());
    let nm = o.mask.as_ref().map(|m| m.view());
    let hm = mask.as_ref().map(|m| m.view());
    let bias = o.bias.as_ref().map(|b| b.view());
    let (iv, ov, wv, gv) = (
        o.input.view(),
        o.offset.view(),
        o.weight.view(),
        o.grad_out.view(),
    );
    let (hi, ho, hw, hg) = (input.view(), offset.view(), weight.view(), grad_out.view());

    let want = deformconv::deform_conv2d(iv, ov, nm, wv, bias, p).unwrap();
    let got = nhwc::deform_conv2d(hi, ho, hm, hw, layout, bias, p).unwrap();
    assert!(bits(&from_nhwc(&got), &want), "deform_conv2d");
    let want = deformconv::conv2d(iv, wv, bias, p).unwrap();
    let got = nhwc::conv2d(hi, hw, layout, bias, p).unwrap();
    assert!(bits(&from_nhwc(&got), &want), "conv2d");

    let want = deformconv::deform_conv2d_backward(gv, iv, ov, nm, wv, p, Want::ALL).unwrap();
    let got = nhwc::deform_conv2d_backward(hg, hi, ho, hm, hw, layout, p, Want::ALL).unwrap();
    same_grads(&got, &want, layout, ws);
    let some = Want::NONE.input().weight();
    let want = deformconv::deform_conv2d_backward(gv, iv, ov, nm, wv, p, some).unwrap();
    let got = nhwc::deform_conv2d_backward(hg, hi, ho, hm, hw, layout, p, some).unwrap();
    same_grads(&got, &want, layout, ws);

    let is = shape4(input.shape());
    let got = nhwc::deform_conv2d_grad_input(hg, ho, hm, hw, layout, is, p).unwrap();
    let want = deformconv::deform_conv2d_grad_input(gv, ov, nm, wv, shape4(iv.shape()), p);
    assert!(bits(&from_nhwc(&got), &want.unwrap()), "grad_input");
    let got = nhwc::deform_conv2d_grad_offset(hg, hi, ho, hm, hw, layout, p).unwrap();
    let want = deformconv::deform_conv2d_grad_offset(gv, iv, ov, nm, wv, p).unwrap();
    assert!(bits(&from_nhwc(&got), &want), "grad_offset");
    let got = nhwc::deform_conv2d_grad_mask(hg, hi, ho, hw, layout, p).unwrap();
    let want = deformconv::deform_conv2d_grad_mask(gv, iv, ov, wv, p).unwrap();
    assert!(bits(&from_nhwc(&got), &want), "grad_mask");
    let stored = shape4(weight.shape());
    let got = nhwc::deform_conv2d_grad_weight(hg, hi, ho, hm, stored, layout, p).unwrap();
    let want = deformconv::deform_conv2d_grad_weight(gv, iv, ov, nm, ws, p).unwrap();
    assert_eq!(got.shape(), &stored[..]);
    assert!(bits(&weight_from(layout, &got, ws), &want), "grad_weight");
    let got = nhwc::deform_conv2d_grad_bias(hg).unwrap();
    let want = deformconv::deform_conv2d_grad_bias(gv).unwrap();
    assert!(bits1(&got, &want), "grad_bias");

    let want = deformconv::conv2d_backward(gv, iv, wv, p, Want::ALL).unwrap();
    let got = nhwc::conv2d_backward(hg, hi, hw, layout, p, Want::ALL).unwrap();
    assert!(got.offset.is_none() && got.mask.is_none());
    same_grads(&got, &want, layout, ws);
    let got = nhwc::conv2d_grad_input(hg, hw, layout, is, p).unwrap();
    let want = deformconv::conv2d_grad_input(gv, wv, shape4(iv.shape()), p).unwrap();
    assert!(bits(&from_nhwc(&got), &want), "conv2d_grad_input");
    let got = nhwc::conv2d_grad_weight(hg, hi, stored, layout, p).unwrap();
    let want = deformconv::conv2d_grad_weight(gv, iv, ws, p).unwrap();
    assert!(
        bits(&weight_from(layout, &got, ws), &want),
        "conv2d_grad_weight"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn nhwc_is_bitwise_the_nchw_fast_path_f64(case in cases(), l in 0usize..4) {
        nhwc_equals_nchw::<f64>(&case, LAYOUTS[l]);
    }

    #[test]
    fn nhwc_is_bitwise_the_nchw_fast_path_f32(case in cases(), l in 0usize..4) {
        nhwc_equals_nchw::<f32>(&case, LAYOUTS[l]);
    }

    /// Against the oracle (f64, within 1e-12 of each tensor's largest magnitude).
    #[test]
    fn nhwc_equals_the_reference(case in cases(), l in 0usize..4) {
        let layout = LAYOUTS[l];
        let o = ops::<f64>(&case);
        let p = &case.params;
        let (input, offset, grad_out) = (to_nhwc(&o.input), to_nhwc(&o.offset), to_nhwc(&o.grad_out));
        let mask = o.mask.as_ref().map(to_nhwc);
        let weight = weight_in(layout, &o.weight);
        let ws = shape4(o.weight.shape());
        let (nm, hm) = (o.mask.as_ref().map(|m| m.view()), mask.as_ref().map(|m| m.view()));
        let bias = o.bias.as_ref().map(|b| b.view());
        let name = format!("{case:?} {layout:?}");
        let close = |t: &str, got: &Array4<f64>, want: &Array4<f64>| {
            support::assert_rel_close(&name, t, &got.view(), &want.view(), 1e-12)
        };

        let got = nhwc::deform_conv2d(input.view(), offset.view(), hm, weight.view(), layout, bias, p).unwrap();
        let want = reference::deform_conv2d(o.input.view(), o.offset.view(), nm, o.weight.view(), bias, p).unwrap();
        close("out", &from_nhwc(&got), &want);
        let got = nhwc::conv2d(input.view(), weight.view(), layout, bias, p).unwrap();
        let want = reference::conv2d(o.input.view(), o.weight.view(), bias, p).unwrap();
        close("conv2d out", &from_nhwc(&got), &want);

        let g = nhwc::deform_conv2d_backward(grad_out.view(), input.view(), offset.view(), hm,
            weight.view(), layout, p, Want::ALL).unwrap();
        let gv = o.grad_out.view();
        let is = shape4(o.input.shape());
        close("grad_input", &from_nhwc(g.input.as_ref().unwrap()),
            &reference::grad_input(gv, o.offset.view(), nm, o.weight.view(), is, p).unwrap());
        close("grad_offset", &from_nhwc(g.offset.as_ref().unwrap()),
            &reference::grad_offset(gv, o.input.view(), o.offset.view(), nm, o.weight.view(), p).unwrap());
        close("grad_mask", &from_nhwc(g.mask.as_ref().unwrap()),
            &reference::grad_mask(gv, o.input.view(), o.offset.view(), o.weight.view(), p).unwrap());
        close("grad_weight", &weight_from(layout, g.weight.as_ref().unwrap(), ws),
            &reference::grad_weight(gv, o.input.view(), o.offset.view(), nm, ws, p).unwrap());
        let gb = reference::grad_bias(gv).unwrap();
        support::assert_rel_close(&name, "grad_bias", &g.bias.as_ref().unwrap().view(), &gb.view(), 1e-12);
    }
}

/// Bilinear sampling of an NHWC image at `(py, px)`, channel `c`, zeros outside (written here
/// from DESIGN.md §2).
fn bilinear_nhwc(input: &Array4<f64>, n: usize, c: usize, py: f64, px: f64) -> f64 {
    let (h, w) = (input.shape()[1] as f64, input.shape()[2] as f64);
    if py <= -1.0 || py >= h || px <= -1.0 || px >= w {
        return 0.0;
    }
    let (y0, x0) = (py.floor(), px.floor());
    let (ly, lx) = (py - y0, px - x0);
    let v = |r: f64, s: f64| {
        if r >= 0.0 && r < h && s >= 0.0 && s < w {
            input[[n, r as usize, s as usize, c]]
        } else {
            0.0
        }
    };
    (1.0 - ly) * (1.0 - lx) * v(y0, x0)
        + (1.0 - ly) * lx * v(y0, x0 + 1.0)
        + ly * (1.0 - lx) * v(y0 + 1.0, x0)
        + ly * lx * v(y0 + 1.0, x0 + 1.0)
}

/// The documented layout, read directly: NHWC input, HWIO filters, offsets
/// `offset[n, y, x, 2 (g K + k) + d]` and mask `mask[n, y, x, g K + k]`, with groups, offset
/// groups, stride, padding and dilation all at work.
#[test]
fn nhwc_offsets_hold_torchvision_channels_in_the_last_axis() {
    let (n, h, w, c_in, c_out) = (2, 7, 6, 4, 6);
    let (kh, kw, groups, og) = (3, 2, 2, 2);
    let (stride, pad, dil) = ((2, 1), (1, 2), (1, 2));
    let k_taps = kh * kw;
    let h_out = (h + 2 * pad.0 - dil.0 * (kh - 1) - 1) / stride.0 + 1;
    let w_out = (w + 2 * pad.1 - dil.1 * (kw - 1) - 1) / stride.1 + 1;
    let mut r = Rng::new(99);
    let input = Array4::from_shape_simple_fn((n, h, w, c_in), || r.value());
    let filters = Array4::from_shape_simple_fn((kh, kw, c_in / groups, c_out), || r.value());
    let offset =
        Array4::from_shape_simple_fn((n, h_out, w_out, 2 * og * k_taps), || 3.0 * r.value());
    let mask = Array4::from_shape_simple_fn((n, h_out, w_out, og * k_taps), || r.value());
    let cg = c_in / groups;
    let mut want = Array4::<f64>::zeros((n, h_out, w_out, c_out));
    for ((b, y, x, o), slot) in want.indexed_iter_mut() {
        let grp = o / (c_out / groups);
        for ci in 0..cg {
            let c = grp * cg + ci;
            let g = c / (c_in / og);
            for i in 0..kh {
                for j in 0..kw {
                    let k = i * kw + j;
                    let dy = offset[[b, y, x, 2 * (g * k_taps + k)]];
                    let dx = offset[[b, y, x, 2 * (g * k_taps + k) + 1]];
                    let m = mask[[b, y, x, g * k_taps + k]];
                    let py = (y * stride.0 + i * dil.0) as f64 - pad.0 as f64 + dy;
                    let px = (x * stride.1 + j * dil.1) as f64 - pad.1 as f64 + dx;
                    *slot += filters[[i, j, ci, o]] * m * bilinear_nhwc(&input, b, c, py, px);
                }
            }
        }
    }
    let params = ConvParams::default()
        .stride(stride.0, stride.1)
        .padding(pad.0, pad.1)
        .dilation(dil.0, dil.1)
        .groups(groups)
        .offset_groups(og);
    let got = nhwc::deform_conv2d(
        input.view(),
        offset.view(),
        Some(mask.view()),
        filters.view(),
        WeightLayout::Hwio,
        None,
        &params,
    )
    .unwrap();
    support::assert_rel_close("hand loop", "out", &got.view(), &want.view(), 1e-12);
}

/// Errors name the weight axis where the caller's layout has it; activation errors name the
/// axis in words, as for NCHW.
#[test]
fn errors_name_axes_in_the_callers_layouts() {
    let input = Array4::<f32>::zeros((1, 5, 5, 4)); // NHWC, 4 channels
    let hwio = Array4::<f32>::zeros((3, 3, 3, 8)); // 3 input channels: wrong
    let p = ConvParams::default();
    let err = nhwc::conv2d(input.view(), hwio.view(), WeightLayout::Hwio, None, &p).unwrap_err();
    assert_eq!(
        err,
        Error::Shape {
            tensor: "weight",
            axis: "input channels per group (axis 2)",
            expected: "input channels(4) / groups(1) = 4".into(),
            got: 3,
        }
    );
    let ohwi = Array4::<f32>::zeros((8, 3, 3, 3));
    let err = nhwc::conv2d(input.view(), ohwi.view(), WeightLayout::Ohwi, None, &p).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                axis: "input channels per group (axis 3)",
                ..
            }
        ),
        "{err}"
    );
    let iohw = Array4::<f32>::zeros((3, 8, 3, 3));
    let err = nhwc::conv2d(input.view(), iohw.view(), WeightLayout::Iohw, None, &p).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                axis: "input channels per group (axis 0)",
                ..
            }
        ),
        "{err}"
    );
    // A grad_out with the wrong channel count (last axis): named "channels".
    let good = Array4::<f32>::zeros((3, 3, 4, 8));
    let g_out = Array4::<f32>::zeros((1, 3, 3, 7));
    let err = nhwc::conv2d_grad_input(
        g_out.view(),
        good.view(),
        WeightLayout::Hwio,
        [1, 5, 5, 4],
        &p,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                tensor: "grad_out",
                axis: "channels",
                got: 7,
                ..
            }
        ),
        "{err}"
    );
    // Kernel larger than the image, in an HWIO weight.
    let big = Array4::<f32>::zeros((7, 1, 4, 8));
    let err = nhwc::conv2d(input.view(), big.view(), WeightLayout::Hwio, None, &p).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Param {
                name: "padding",
                ..
            }
        ),
        "{err}"
    );
    // Overflowing input_shape through the NHWC grad_input: TooLarge, not a panic.
    let err = nhwc::conv2d_grad_input(
        g_out.view(),
        good.view(),
        WeightLayout::Hwio,
        [1, 1 << 40, 1 << 40, 4],
        &p,
    )
    .unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

/// An empty batch gives empty NHWC results of the right shapes.
#[test]
fn empty_batch_in_nhwc() {
    let p = ConvParams::default().padding(1, 1);
    let input = Array4::<f64>::zeros((0, 5, 4, 2));
    let w = Array4::<f64>::zeros((3, 3, 2, 3));
    let offset = Array4::<f64>::zeros((0, 5, 4, 18));
    let out: Array4<f64> = nhwc::deform_conv2d(
        input.view(),
        offset.view(),
        None,
        w.view(),
        WeightLayout::Hwio,
        None,
        &p,
    )
    .unwrap();
    assert_eq!(out.shape(), &[0, 5, 4, 3]);
    let g_out: ArrayView4<'_, f64> = out.view();
    let g = nhwc::deform_conv2d_backward(
        g_out,
        input.view(),
        offset.view(),
        None,
        w.view(),
        WeightLayout::Hwio,
        &p,
        Want::ALL,
    )
    .unwrap();
    assert_eq!(g.input.unwrap().shape(), &[0, 5, 4, 2]);
    assert_eq!(g.offset.unwrap().shape(), &[0, 5, 4, 18]);
    assert_eq!(g.mask.unwrap().shape(), &[0, 5, 4, 9]);
    let gw = g.weight.unwrap();
    assert_eq!(gw.shape(), &[3, 3, 2, 3]);
    assert!(gw.iter().all(|&v| v == 0.0));
    assert_eq!(g.bias.unwrap(), Array1::<f64>::zeros(3));
}
