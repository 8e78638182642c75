//! The fast forward path against the f64 reference oracle: random problems (f64 within 1e-12
//! of the largest magnitude, f32 within the per-element bound of DESIGN.md §5), every golden
//! case, dense conv, memory layouts of inputs and outputs, and error cases.

mod support;

use deformconv::compare::Output;
use deformconv::{conv2d, conv2d_into, deform_conv2d, deform_conv2d_into, reference, ConvParams};
use ndarray::{s, Array4, ShapeBuilder};
use proptest::prelude::*;
use support::{assert_rel_close, golden_cases};
use support::{cases, same_bits, to_f32, to_f32_1, wide_cases, Bound, Case, Tensors};

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn deform_f64_matches_reference(case in cases()) {
        f64_matches_reference(&case);
    }

    #[test]
    fn deform_f32_within_per_element_bound(case in cases()) {
        f32_within_per_element_bound(&case);
    }

    /// Offset groups of 16+ channels: both column-tile layouts of the forward's plan.
    #[test]
    fn wide_offset_groups_match_reference(case in wide_cases()) {
        f64_matches_reference(&case);
        f32_within_per_element_bound(&case);
    }

    #[test]
    fn conv2d_matches_reference(case in cases()) {
        let t = case.tensors();
        let p = &case.params;
        let bias = t.bias.as_ref().map(|b| b.view());
        let fast = conv2d(t.input.view(), t.weight.view(), bias, p).unwrap();
        let exact = reference::conv2d(t.input.view(), t.weight.view(), bias, p).unwrap();
        assert_rel_close(&format!("{case:?}"), "out", &fast.view(), &exact.view(), 1e-12);
        // f32: dense im2col copies pixels exactly, so only the sum rounds.
        let (input, weight) = (to_f32(&t.input), to_f32(&t.weight));
        let b32 = t.bias.as_ref().map(to_f32_1);
        let fast32 = conv2d(input.view(), weight.view(), b32.as_ref().map(|b| b.view()), p).unwrap();
        let exact32 = reference::conv2d(input.view(), weight.view(), b32.as_ref().map(|b| b.view()), p).unwrap();
        let dense = Tensors { offset: Array4::zeros(t.offset.raw_dim()), mask: None, ..t };
        Bound::new::<f32>(format!("{case:?}"), &dense, None, p).check(Output::Out, fast32.view(), exact32.view());
    }
}

/// The `f64` forward of `case` within 1e-12 of the oracle's largest magnitude.
fn f64_matches_reference(case: &Case) {
    let t = case.tensors();
    let p = &case.params;
    let mask = t.mask.as_ref().map(|m| m.view());
    let bias = t.bias.as_ref().map(|b| b.view());
    let (x, off, w) = (t.input.view(), t.offset.view(), t.weight.view());
    let fast = deform_conv2d(x, off, mask, w, bias, p).unwrap();
    let exact = reference::deform_conv2d(x, off, mask, w, bias, p).unwrap();
    assert_rel_close(
        &format!("{case:?}"),
        "out",
        &fast.view(),
        &exact.view(),
        1e-12,
    );
}

/// The `f32` forward of `case` within the per-element bound of the oracle.
fn f32_within_per_element_bound(case: &Case) {
    let t = case.tensors();
    let p = &case.params;
    let (input, offset, weight) = (to_f32(&t.input), to_f32(&t.offset), to_f32(&t.weight));
    let mask = t.mask.as_ref().map(to_f32);
    let bias = t.bias.as_ref().map(to_f32_1);
    let (mask, bias) = (
        mask.as_ref().map(|m| m.view()),
        bias.as_ref().map(|b| b.view()),
    );
    let (x, off, w) = (input.view(), offset.view(), weight.view());
    let fast = deform_conv2d(x, off, mask, w, bias, p).unwrap();
    let exact = reference::deform_conv2d(x, off, mask, w, bias, p).unwrap();
    Bound::new::<f32>(format!("{case:?}"), &t, None, p).check(
        Output::Out,
        fast.view(),
        exact.view(),
    );
}

#[test]
fn every_golden_case_through_the_fast_path() {
    let cases = golden_cases();
    assert!(cases.len() >= 50, "found only {} golden cases", cases.len());
    for case in &cases {
        let bias = case
            .arrays
            .get("bias")
            .map(|b| b.view().into_dimensionality::<ndarray::Ix1>().unwrap());
        let out = deform_conv2d(
            case.get4("input"),
            case.get4("offset"),
            case.opt4("mask"),
            case.get4("weight"),
            bias,
            &case.params,
        )
        .unwrap();
        assert_rel_close(&case.name, "out", &out.view(), &case.get4("out"), 1e-10);
    }
}

fn layout_case() -> Case {
    Case {
        n: 2,
        c_in: 4,
        c_out: 6,
        h: 7,
        w: 9,
        kh: 3,
        kw: 2,
        params: ConvParams::default()
            .stride(2, 1)
            .padding(1, 2)
            .dilation(1, 2)
            .groups(2)
            .offset_groups(2),
        mask: true,
        bias: true,
        seed: 17,
    }
}

/// `a` copied into Fortran (column-major) order: the same logical array, another layout.
fn fortran(a: &Array4<f64>) -> Array4<f64> {
    let mut f = Array4::zeros(a.raw_dim().f());
    f.assign(a);
    f
}

#[test]
fn non_contiguous_views_give_the_same_bits_as_contiguous() {
    let case = layout_case();
    let t = case.tensors();
    let p = &case.params;
    let want = deform_conv2d(
        t.input.view(),
        t.offset.view(),
        t.mask.as_ref().map(|m| m.view()),
        t.weight.view(),
        t.bias.as_ref().map(|b| b.view()),
        p,
    )
    .unwrap();

    // Fortran-ordered copies.
    let (fi, fo, fm, fw) = (
        fortran(&t.input),
        fortran(&t.offset),
        fortran(t.mask.as_ref().unwrap()),
        fortran(&t.weight),
    );
    let got = deform_conv2d(
        fi.view(),
        fo.view(),
        Some(fm.view()),
        fw.view(),
        t.bias.as_ref().map(|b| b.view()),
        p,
    )
    .unwrap();
    assert!(same_bits(&got, &want), "Fortran-order operands");

    // Negative strides: store each tensor reversed along axes 2 and 3, view it reversed back.
    let rev = |a: &Array4<f64>| a.slice(s![.., .., ..;-1, ..;-1]).to_owned();
    let (ri, ro, rm, rw) = (
        rev(&t.input),
        rev(&t.offset),
        rev(t.mask.as_ref().unwrap()),
        rev(&t.weight),
    );
    let back = |a: &Array4<f64>| a.slice(s![.., .., ..;-1, ..;-1]).to_owned();
    assert_eq!(back(&ri), t.input);
    let bias_rev: ndarray::Array1<f64> = t.bias.as_ref().unwrap().slice(s![..;-1]).to_owned();
    let got = deform_conv2d(
        ri.slice(s![.., .., ..;-1, ..;-1]),
        ro.slice(s![.., .., ..;-1, ..;-1]),
        Some(rm.slice(s![.., .., ..;-1, ..;-1])),
        rw.slice(s![.., .., ..;-1, ..;-1]),
        Some(bias_rev.slice(s![..;-1])),
        p,
    )
    .unwrap();
    assert!(same_bits(&got, &want), "negative-stride operands");

    // Transposed storage (axes swapped in memory, swapped back in the view) and a strided
    // sub-view of a larger array.
    let mut big = Array4::<f64>::from_elem((2, 8, 7, 18), f64::NAN);
    big.slice_mut(s![.., ..;2, .., ..;2]).assign(&t.input);
    let mut tr = t.offset.clone();
    tr.swap_axes(2, 3);
    let tr = tr.as_standard_layout().to_owned();
    let mut tr_view = tr.view();
    tr_view.swap_axes(2, 3);
    let got = deform_conv2d(
        big.slice(s![.., ..;2, .., ..;2]),
        tr_view,
        t.mask.as_ref().map(|m| m.view()),
        t.weight.view(),
        t.bias.as_ref().map(|b| b.view()),
        p,
    )
    .unwrap();
    assert!(same_bits(&got, &want), "strided input, transposed offset");

    // Dense conv through the same layouts.
    let want = conv2d(t.input.view(), t.weight.view(), None, p).unwrap();
    let got = conv2d(ri.slice(s![.., .., ..;-1, ..;-1]), fw.view(), None, p).unwrap();
    assert!(same_bits(&got, &want), "dense conv, negative strides");
}

#[test]
fn into_overwrites_strided_and_nan_prefilled_outputs_only_where_it_should() {
    let case = layout_case();
    let t = case.tensors();
    let p = &case.params;
    let g = case.geometry();
    let mask = t.mask.as_ref().map(|m| m.view());
    let bias = t.bias.as_ref().map(|b| b.view());
    let want = deform_conv2d(
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        bias,
        p,
    )
    .unwrap();

    // Contiguous, NaN-prefilled.
    let mut out = Array4::<f64>::from_elem(g.out_shape(), f64::NAN);
    deform_conv2d_into(
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        bias,
        p,
        out.view_mut(),
    )
    .unwrap();
    assert!(same_bits(&out, &want));

    // Every other channel and column of a larger NaN array; the gaps must stay untouched.
    let [n, c, h, w] = g.out_shape();
    let sentinel = -12345.5;
    let mut big = Array4::<f64>::from_elem((n, 2 * c, h, 2 * w), sentinel);
    big.slice_mut(s![.., ..;2, .., ..;2]).fill(f64::NAN);
    deform_conv2d_into(
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        bias,
        p,
        big.slice_mut(s![.., ..;2, .., ..;2]),
    )
    .unwrap();
    assert!(same_bits(
        &big.slice(s![.., ..;2, .., ..;2]).to_owned(),
        &want
    ));
    assert!(big
        .slice(s![.., 1..;2, .., ..])
        .iter()
        .all(|&v| v == sentinel));
    assert!(big
        .slice(s![.., .., .., 1..;2])
        .iter()
        .all(|&v| v == sentinel));

    // Transposed (H, W swapped in memory) output for dense conv.
    let want = conv2d(t.input.view(), t.weight.view(), bias, p).unwrap();
    let mut tr = Array4::<f64>::from_elem((n, c, w, h), f64::NAN);
    let mut view = tr.view_mut();
    view.swap_axes(2, 3);
    conv2d_into(t.input.view(), t.weight.view(), bias, p, view).unwrap();
    let mut back = tr.view();
    back.swap_axes(2, 3);
    assert!(same_bits(&back.to_owned(), &want));
}

#[test]
fn nan_and_infinite_offsets_follow_the_reference() {
    let case = layout_case();
    let mut t = case.tensors();
    t.offset[[0, 0, 1, 1]] = f64::NAN;
    t.offset[[1, 3, 0, 2]] = f64::INFINITY;
    t.offset[[1, 4, 2, 0]] = f64::NEG_INFINITY;
    t.offset[[0, 7, 0, 0]] = 1e30;
    let p = &case.params;
    let mask = t.mask.as_ref().map(|m| m.view());
    let bias = t.bias.as_ref().map(|b| b.view());
    let fast = deform_conv2d(
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        bias,
        p,
    )
    .unwrap();
    let exact = reference::deform_conv2d(
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        bias,
        p,
    )
    .unwrap();
    assert!(
        fast.iter().any(|v| v.is_nan()),
        "the NaN offset must reach some output"
    );
    assert_rel_close(
        "non-finite offsets",
        "out",
        &fast.view(),
        &exact.view(),
        1e-12,
    );
    let fast32 = deform_conv2d(
        to_f32(&t.input).view(),
        to_f32(&t.offset).view(),
        t.mask.as_ref().map(to_f32).as_ref().map(|m| m.view()),
        to_f32(&t.weight).view(),
        None,
        p,
    )
    .unwrap();
    let nan_fast: Vec<bool> = fast32.iter().map(|v| v.is_nan()).collect();
    let nan_exact: Vec<bool> = exact.iter().map(|v| v.is_nan()).collect();
    assert_eq!(nan_fast, nan_exact, "NaN outputs in the same places (f32)");
}

#[test]
fn empty_batch_and_shape_errors() {
    let case = Case {
        n: 0,
        ..layout_case()
    };
    let t = case.tensors();
    let p = &case.params;
    let out = deform_conv2d(
        t.input.view(),
        t.offset.view(),
        None,
        t.weight.view(),
        None,
        p,
    )
    .unwrap();
    assert_eq!(out.shape()[0], 0);
    let out = conv2d(t.input.view(), t.weight.view(), None, p).unwrap();
    assert_eq!(out.shape()[0], 0);

    let t = layout_case().tensors();
    let bad_offset = t.offset.slice(s![.., 1.., .., ..]);
    assert!(deform_conv2d(t.input.view(), bad_offset, None, t.weight.view(), None, p).is_err());
    let bad_mask = t.mask.as_ref().unwrap().slice(s![.., .., 1.., ..]);
    assert!(deform_conv2d(
        t.input.view(),
        t.offset.view(),
        Some(bad_mask),
        t.weight.view(),
        None,
        p
    )
    .is_err());
    let bad_bias = t.bias.as_ref().unwrap().slice(s![1..]);
    assert!(conv2d(t.input.view(), t.weight.view(), Some(bad_bias), p).is_err());
    let g = layout_case().geometry();
    let mut wrong = Array4::<f64>::zeros((g.n, g.c_out, g.h_out + 1, g.w_out));
    assert!(conv2d_into(t.input.view(), t.weight.view(), None, p, wrong.view_mut()).is_err());
    assert!(deform_conv2d_into(
        t.input.view(),
        t.offset.view(),
        None,
        t.weight.view(),
        None,
        p,
        wrong.view_mut()
    )
    .is_err());
    let zero_stride = ConvParams::default().stride(0, 1);
    assert!(conv2d(t.input.view(), t.weight.view(), None, &zero_stride).is_err());
}
