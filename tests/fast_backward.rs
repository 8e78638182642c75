//! The fast backward against the reference oracle: random problems (f64 within 1e-12 of each
//! tensor's largest magnitude, f32 within a per-element bound), every golden case in f64, finite
//! differences of the fast f64 path, the combined backward equal to the separate functions bit
//! for bit, dense conv2d backward, non-finite offsets and errors.

mod support;

use deformconv::compare::Output;
use deformconv::{
    conv2d_backward, conv2d_grad_input, conv2d_grad_weight, deform_conv2d, deform_conv2d_backward,
    deform_conv2d_backward_into, deform_conv2d_grad_bias, deform_conv2d_grad_input,
    deform_conv2d_grad_input_into, deform_conv2d_grad_mask, deform_conv2d_grad_offset,
    deform_conv2d_grad_weight, reference, ConvParams, Convention, Float, Grads, GradsMut, Want,
};
use ndarray::{s, Array1, Array4, ArrayView4, Ix1};
use proptest::prelude::*;
use support::{assert_rel_close, golden_cases};
use support::{border_offsets, cases, same_bits, to_f32, Bound, Case, Rng, Tensors};

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

fn grad_out_for(case: &Case, seed: u64) -> Array4<f64> {
    let mut r = Rng::new(seed ^ 0x9e37_79b9);
    Array4::from_shape_fn(case.geometry().out_shape(), |_| r.value())
}

/// The reference gradients `(input, offset, mask, weight, bias)`.
fn reference_grads(t: &Tensors, g_out: ArrayView4<'_, f64>, p: &ConvParams) -> [Array4<f64>; 4] {
    let mask = t.mask.as_ref().map(|m| m.view());
    let shape = shape4(t.input.shape());
    let ws = shape4(t.weight.shape());
    [
        reference::grad_input(g_out, t.offset.view(), mask, t.weight.view(), shape, p).unwrap(),
        reference::grad_offset(
            g_out,
            t.input.view(),
            t.offset.view(),
            mask,
            t.weight.view(),
            p,
        )
        .unwrap(),
        reference::grad_mask(g_out, t.input.view(), t.offset.view(), t.weight.view(), p).unwrap(),
        reference::grad_weight(g_out, t.input.view(), t.offset.view(), mask, ws, p).unwrap(),
    ]
}

/// Runs the combined backward (all gradients) and every separate function, asserts they agree
/// bit for bit, and returns the combined result.
fn all_and_separate<T: Float>(
    g_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    p: &ConvParams,
) -> Grads<T> {
    let all = deform_conv2d_backward(g_out, input, offset, mask, weight, p, Want::ALL).unwrap();
    let gi = deform_conv2d_grad_input(g_out, offset, mask, weight, shape4(input.shape()), p);
    let go = deform_conv2d_grad_offset(g_out, input, offset, mask, weight, p);
    let gm = deform_conv2d_grad_mask(g_out, input, offset, weight, p);
    let gw = deform_conv2d_grad_weight(g_out, input, offset, mask, shape4(weight.shape()), p);
    let gb = deform_conv2d_grad_bias(g_out).unwrap();
    let bits = |a: &Array4<T>, b: &Array4<T>| {
        a.shape() == b.shape()
            && a.iter()
                .zip(b.iter())
                .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
    };
    assert!(
        bits(all.input.as_ref().unwrap(), &gi.unwrap()),
        "grad_input"
    );
    assert!(
        bits(all.offset.as_ref().unwrap(), &go.unwrap()),
        "grad_offset"
    );
    assert!(bits(all.mask.as_ref().unwrap(), &gm.unwrap()), "grad_mask");
    assert!(
        bits(all.weight.as_ref().unwrap(), &gw.unwrap()),
        "grad_weight"
    );
    let gb_all = all.bias.as_ref().unwrap();
    assert!(gb_all
        .iter()
        .zip(&gb)
        .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits()));
    // Pairs share work differently but give the same bits.
    let pair = deform_conv2d_backward(
        g_out,
        input,
        offset,
        mask,
        weight,
        p,
        Want::NONE.input().weight(),
    )
    .unwrap();
    assert!(
        bits(all.input.as_ref().unwrap(), &pair.input.unwrap()),
        "input of a pair"
    );
    assert!(
        bits(all.weight.as_ref().unwrap(), &pair.weight.unwrap()),
        "weight of a pair"
    );
    assert!(pair.offset.is_none() && pair.mask.is_none() && pair.bias.is_none());
    all
}

/// The f32 gradients `(input, offset, mask, weight)` of `fast` within the published
/// per-element bound ([`Bound`]) of the `exact` ones; returns the worst ratio of error to bound.
fn check_f32(
    label: &str,
    t: &Tensors,
    g_out: &Array4<f64>,
    p: &ConvParams,
    fast: &Grads<f32>,
    exact: &[Array4<f64>; 4],
) -> f64 {
    let bound = Bound::new::<f32>(label, t, Some(g_out), p);
    let outputs = [
        Output::GradInput,
        Output::GradOffset,
        Output::GradMask,
        Output::GradWeight,
    ];
    let fast = [&fast.input, &fast.offset, &fast.mask, &fast.weight];
    let mut worst = 0.0f64;
    for ((&output, f), e) in outputs.iter().zip(fast).zip(exact) {
        if let Some(f) = f {
            worst = worst.max(bound.check(output, f.view(), e.view()));
        }
    }
    worst
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    /// Every gradient in f64 within 1e-12 of each tensor's largest magnitude, and the combined
    /// backward bitwise equal to the separate functions.
    #[test]
    fn f64_gradients_match_reference(case in cases()) {
        let t = case.tensors();
        let p = &case.params;
        let g_out = grad_out_for(&case, case.seed);
        let mask = t.mask.as_ref().map(|m| m.view());
        let all = all_and_separate(g_out.view(), t.input.view(), t.offset.view(), mask, t.weight.view(), p);
        let [gi, go, gm, gw] = reference_grads(&t, g_out.view(), p);
        let tol = 1e-12;
        assert_rel_close("random", "grad_input", &all.input.unwrap().view(), &gi.view(), tol);
        assert_rel_close("random", "grad_offset", &all.offset.unwrap().view(), &go.view(), tol);
        assert_rel_close("random", "grad_mask", &all.mask.unwrap().view(), &gm.view(), tol);
        assert_rel_close("random", "grad_weight", &all.weight.unwrap().view(), &gw.view(), tol);
        let gb = reference::grad_bias(g_out.view()).unwrap();
        assert_rel_close("random", "grad_bias", &all.bias.unwrap().view(), &gb.view(), tol);
    }

    /// f32 against the exact f64 gradients of the same (f32-representable) data, element by
    /// element, within the published DESIGN §5 bound (`deformconv::compare`): `|fast - exact|
    /// <= 4 eps (L * sum|terms| + P)`, `L` the accumulations behind the element.
    #[test]
    fn f32_gradients_within_per_element_bound(case in cases()) {
        let t = case.tensors();
        let p = &case.params;
        let g_out = grad_out_for(&case, case.seed);
        let mask32 = t.mask.as_ref().map(to_f32);
        let all = all_and_separate(
            to_f32(&g_out).view(), to_f32(&t.input).view(), to_f32(&t.offset).view(),
            mask32.as_ref().map(|m| m.view()), to_f32(&t.weight).view(), p,
        );
        let exact = reference_grads(&t, g_out.view(), p);
        check_f32(&format!("{case:?}"), &t, &g_out, p, &all, &exact);
    }

    /// Dense conv2d backward equals the reference gradients with zero offsets and no mask.
    #[test]
    fn dense_backward_matches_reference_with_zero_offsets(case in cases()) {
        let t = case.tensors();
        let p = &case.params;
        let g_out = grad_out_for(&case, case.seed);
        let zeros = Array4::<f64>::zeros(t.offset.raw_dim());
        let dense = conv2d_backward(g_out.view(), t.input.view(), t.weight.view(), p, Want::ALL).unwrap();
        assert!(dense.offset.is_none() && dense.mask.is_none());
        let shape = shape4(t.input.shape());
        let ws = shape4(t.weight.shape());
        let gi = reference::grad_input(g_out.view(), zeros.view(), None, t.weight.view(), shape, p).unwrap();
        let gw = reference::grad_weight(g_out.view(), t.input.view(), zeros.view(), None, ws, p).unwrap();
        let fi = dense.input.unwrap();
        let fw = dense.weight.unwrap();
        assert_rel_close("dense", "grad_input", &fi.view(), &gi.view(), 1e-12);
        assert_rel_close("dense", "grad_weight", &fw.view(), &gw.view(), 1e-12);
        let si = conv2d_grad_input(g_out.view(), t.weight.view(), shape, p).unwrap();
        let sw = conv2d_grad_weight(g_out.view(), t.input.view(), ws, p).unwrap();
        prop_assert!(same_bits(&si, &fi) && same_bits(&sw, &fw));
    }
}

/// Channel counts that fill several AVX-512 vectors with a ragged tail (37 and 40 channels per
/// offset group), segments that start inside an offset group's channels (conv groups splitting
/// it), several slots' weight partials, samples on and around the borders, under every
/// convention: the f32 gradients (the pixel-major path on AVX-512) within the per-element
/// bound, combined equal to separate.
#[test]
fn wide_channel_segments_in_f32_within_bound() {
    let configs = [
        // (c_in, groups, offset_groups, c_out, n, h = w): 37 channels, one segment of 37; six
        // 24 x 24 images, each a group of two tiles, dealt to four slots (weight partials
        // gathered from every slot).
        (37, 1, 1, 5, 6, 24),
        // 40 channels in 2 offset groups of 20, 4 conv groups of 10: segments 0..10, 10..20.
        (40, 4, 2, 8, 3, 9),
        // 64 channels, 2 offset groups of 32 (two full vectors), 2 conv groups.
        (64, 2, 2, 6, 3, 9),
    ];
    let conventions = [Convention::Torchvision, Convention::Mmcv, Convention::DcnV1];
    for (i, &(c_in, groups, offset_groups, c_out, n, hw)) in configs.iter().enumerate() {
        for (j, &conv) in conventions.iter().enumerate() {
            let case = Case {
                n,
                c_in,
                c_out,
                h: hw,
                w: hw + 2,
                kh: 3,
                kw: 3,
                params: ConvParams::default()
                    .padding(1, 1)
                    .groups(groups)
                    .offset_groups(offset_groups)
                    .convention(conv),
                mask: i != 1,
                bias: false,
                seed: 40 + (3 * i + j) as u64,
            };
            let mut t = case.tensors();
            t.offset = border_offsets(&case, case.seed);
            let p = &case.params;
            let g_out = grad_out_for(&case, case.seed);
            let mask32 = t.mask.as_ref().map(to_f32);
            let all = all_and_separate(
                to_f32(&g_out).view(),
                to_f32(&t.input).view(),
                to_f32(&t.offset).view(),
                mask32.as_ref().map(|m| m.view()),
                to_f32(&t.weight).view(),
                p,
            );
            let exact = reference_grads(&t, g_out.view(), p);
            check_f32(&format!("{c_in}ch {conv:?}"), &t, &g_out, p, &all, &exact);
        }
    }
}

/// Images larger than one pixel tile (several tiles scatter into the same planes) and many
/// small images packed into one tile, against the reference.
#[test]
fn multi_tile_images_and_packed_images_match_reference() {
    let big = Case {
        n: 2,
        c_in: 4,
        c_out: 3,
        h: 26,
        w: 27,
        kh: 3,
        kw: 2,
        params: ConvParams::default().padding(1, 1).offset_groups(2),
        mask: true,
        bias: false,
        seed: 11,
    };
    let packed = Case {
        n: 45,
        h: 4,
        w: 5,
        seed: 12,
        ..big
    };
    for case in [big, packed] {
        let t = case.tensors();
        let p = &case.params;
        let g_out = grad_out_for(&case, case.seed);
        let mask = t.mask.as_ref().map(|m| m.view());
        let all = all_and_separate(
            g_out.view(),
            t.input.view(),
            t.offset.view(),
            mask,
            t.weight.view(),
            p,
        );
        let [gi, go, gm, gw] = reference_grads(&t, g_out.view(), p);
        assert_rel_close(
            "tiles",
            "grad_input",
            &all.input.unwrap().view(),
            &gi.view(),
            1e-12,
        );
        assert_rel_close(
            "tiles",
            "grad_offset",
            &all.offset.unwrap().view(),
            &go.view(),
            1e-12,
        );
        assert_rel_close(
            "tiles",
            "grad_mask",
            &all.mask.unwrap().view(),
            &gm.view(),
            1e-12,
        );
        assert_rel_close(
            "tiles",
            "grad_weight",
            &all.weight.unwrap().view(),
            &gw.view(),
            1e-12,
        );
    }
}

#[test]
fn every_golden_case_through_the_fast_path_in_f64() {
    let cases = golden_cases();
    assert!(cases.len() >= 50);
    for case in &cases {
        let name = case.name.as_str();
        let p = &case.params;
        let (input, offset, mask) = (case.get4("input"), case.get4("offset"), case.opt4("mask"));
        let (weight, grad_out) = (case.get4("weight"), case.get4("grad_out"));
        let tol = 1e-10;
        let all = all_and_separate(grad_out, input, offset, mask, weight, p);
        let check =
            |t: &str, got: &Array4<f64>| assert_rel_close(name, t, &got.view(), &case.get4(t), tol);
        check("grad_input", all.input.as_ref().unwrap());
        check("grad_offset", all.offset.as_ref().unwrap());
        check("grad_weight", all.weight.as_ref().unwrap());
        if case.has_mask {
            check("grad_mask", all.mask.as_ref().unwrap());
        }
        if let Some(want) = case.arrays.get("grad_bias") {
            let want = want.view().into_dimensionality::<Ix1>().unwrap();
            assert_rel_close(name, "grad_bias", &all.bias.unwrap().view(), &want, tol);
        }
    }
}

/// `L = sum grad_out * deform_conv2d(...)` by the fast forward, differentiated numerically
/// (central differences) and compared with the fast f64 backward. Offsets are kept at least
/// 0.2 away from integers so that `L` is smooth in them.
#[test]
fn finite_differences_of_the_fast_path() {
    let configs = [
        (
            ConvParams::default().padding(1, 1).offset_groups(2),
            2,
            4,
            3,
            (5, 6),
            (3, 3),
            true,
        ),
        (
            ConvParams::default().stride(2, 1).dilation(1, 2).groups(2),
            1,
            4,
            4,
            (7, 6),
            (2, 3),
            false,
        ),
        (
            ConvParams::default().padding(2, 0),
            2,
            3,
            2,
            (4, 5),
            (3, 1),
            true,
        ),
    ];
    for (ci, (p, n, c_in, c_out, (h, w), (kh, kw), with_mask)) in configs.into_iter().enumerate() {
        let g = deformconv::Geometry::new([n, c_in, h, w], [c_out, c_in / p.groups, kh, kw], &p)
            .unwrap();
        let mut r = Rng::new(1000 + ci as u64);
        let mut input = Array4::from_shape_fn(g.input_shape(), |_| r.value());
        let mut offset = Array4::from_shape_fn(g.offset_shape(), |_| {
            let whole = (5.0 * r.unit()).floor() - 2.0;
            whole + 0.2 + 0.6 * r.unit()
        });
        let mut mask =
            with_mask.then(|| Array4::from_shape_fn(g.mask_shape(), |_| r.value() * 1.5));
        let mut weight = Array4::from_shape_fn(g.weight_shape(), |_| r.value());
        let g_out = Array4::from_shape_fn(g.out_shape(), |_| r.value());
        let loss = |i: &Array4<f64>, o: &Array4<f64>, m: &Option<Array4<f64>>, wt: &Array4<f64>| {
            let out = deform_conv2d(
                i.view(),
                o.view(),
                m.as_ref().map(|m| m.view()),
                wt.view(),
                None,
                &p,
            )
            .unwrap();
            (&out * &g_out).sum()
        };
        let grads = deform_conv2d_backward(
            g_out.view(),
            input.view(),
            offset.view(),
            mask.as_ref().map(|m| m.view()),
            weight.view(),
            &p,
            Want::ALL,
        )
        .unwrap();
        let hstep = 1e-6;
        let fd_tol = |analytic: f64, numeric: f64| {
            (analytic - numeric).abs() <= 1e-6 * (1.0 + analytic.abs())
        };
        for trial in 0..12 {
            let pick = |len: usize, r: &mut Rng| ((r.unit() * len as f64) as usize).min(len - 1);
            // Input.
            let idx = pick(input.len(), &mut r);
            let (a, num) = {
                let slot = input.as_slice_mut().unwrap();
                let keep = slot[idx];
                slot[idx] = keep + hstep;
                let up = loss(&input, &offset, &mask, &weight);
                input.as_slice_mut().unwrap()[idx] = keep - hstep;
                let down = loss(&input, &offset, &mask, &weight);
                input.as_slice_mut().unwrap()[idx] = keep;
                (
                    grads.input.as_ref().unwrap().as_slice().unwrap()[idx],
                    (up - down) / (2.0 * hstep),
                )
            };
            assert!(
                fd_tol(a, num),
                "case {ci} trial {trial}: grad_input[{idx}] {a} vs {num}"
            );
            // Offset.
            let idx = pick(offset.len(), &mut r);
            let keep = offset.as_slice().unwrap()[idx];
            offset.as_slice_mut().unwrap()[idx] = keep + hstep;
            let up = loss(&input, &offset, &mask, &weight);
            offset.as_slice_mut().unwrap()[idx] = keep - hstep;
            let down = loss(&input, &offset, &mask, &weight);
            offset.as_slice_mut().unwrap()[idx] = keep;
            let a = grads.offset.as_ref().unwrap().as_slice().unwrap()[idx];
            let num = (up - down) / (2.0 * hstep);
            assert!(
                fd_tol(a, num),
                "case {ci} trial {trial}: grad_offset[{idx}] {a} vs {num}"
            );
            // Mask.
            if let Some(m) = mask.as_mut() {
                let idx = pick(m.len(), &mut r);
                let keep = m.as_slice().unwrap()[idx];
                m.as_slice_mut().unwrap()[idx] = keep + hstep;
                let m_up = mask.clone();
                let up = loss(&input, &offset, &m_up, &weight);
                let m = mask.as_mut().unwrap();
                m.as_slice_mut().unwrap()[idx] = keep - hstep;
                let m_down = mask.clone();
                let down = loss(&input, &offset, &m_down, &weight);
                mask.as_mut().unwrap().as_slice_mut().unwrap()[idx] = keep;
                let a = grads.mask.as_ref().unwrap().as_slice().unwrap()[idx];
                let num = (up - down) / (2.0 * hstep);
                assert!(
                    fd_tol(a, num),
                    "case {ci} trial {trial}: grad_mask[{idx}] {a} vs {num}"
                );
            }
            // Weight.
            let idx = pick(weight.len(), &mut r);
            let keep = weight.as_slice().unwrap()[idx];
            weight.as_slice_mut().unwrap()[idx] = keep + hstep;
            let up = loss(&input, &offset, &mask, &weight);
            weight.as_slice_mut().unwrap()[idx] = keep - hstep;
            let down = loss(&input, &offset, &mask, &weight);
            weight.as_slice_mut().unwrap()[idx] = keep;
            let a = grads.weight.as_ref().unwrap().as_slice().unwrap()[idx];
            let num = (up - down) / (2.0 * hstep);
            assert!(
                fd_tol(a, num),
                "case {ci} trial {trial}: grad_weight[{idx}] {a} vs {num}"
            );
        }
    }
}

fn small_case() -> Case {
    Case {
        n: 2,
        c_in: 4,
        c_out: 6,
        h: 5,
        w: 6,
        kh: 3,
        kw: 3,
        params: ConvParams::default()
            .padding(1, 1)
            .offset_groups(2)
            .groups(2),
        mask: true,
        bias: false,
        seed: 77,
    }
}

/// A NaN offset gives NaN exactly where the reference has NaN (grad_offset, grad_mask,
/// grad_weight) and sends nothing to grad_input; infinite and huge offsets contribute 0.
#[test]
fn nan_and_infinite_offsets_follow_the_reference() {
    let case = small_case();
    let mut t = case.tensors();
    t.offset[[0, 0, 1, 1]] = f64::NAN;
    t.offset[[1, 3, 0, 2]] = f64::INFINITY;
    t.offset[[1, 4, 2, 0]] = f64::NEG_INFINITY;
    t.offset[[0, 7, 0, 0]] = 1e30;
    let p = &case.params;
    let g_out = grad_out_for(&case, 5);
    let mask = t.mask.as_ref().map(|m| m.view());
    let all = all_and_separate(
        g_out.view(),
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        p,
    );
    let exact = reference_grads(&t, g_out.view(), p);
    let fast = [&all.input, &all.offset, &all.mask, &all.weight].map(|a| a.clone().unwrap());
    for (name, (f, e)) in ["grad_input", "grad_offset", "grad_mask", "grad_weight"]
        .iter()
        .zip(fast.iter().zip(exact.iter()))
    {
        assert_rel_close("non-finite offsets", name, &f.view(), &e.view(), 1e-12);
    }
    assert!(
        fast[0].iter().all(|v| v.is_finite()),
        "grad_input stays finite"
    );
    assert!(fast[1].iter().any(|v| v.is_nan()) && fast[3].iter().any(|v| v.is_nan()));
    // f32: NaN in the same places.
    let m32 = t.mask.as_ref().map(to_f32);
    let all32 = all_and_separate(
        to_f32(&g_out).view(),
        to_f32(&t.input).view(),
        to_f32(&t.offset).view(),
        m32.as_ref().map(|m| m.view()),
        to_f32(&t.weight).view(),
        p,
    );
    let f32s =
        [&all32.input, &all32.offset, &all32.mask, &all32.weight].map(|a| a.clone().unwrap());
    for (f, e) in f32s.iter().zip(exact.iter()) {
        let nf: Vec<bool> = f.iter().map(|v| v.is_nan()).collect();
        let ne: Vec<bool> = e.iter().map(|v| v.is_nan()).collect();
        assert_eq!(nf, ne);
    }
}

/// `_into` writes strided and NaN-prefilled outputs completely, equal to the owned results.
#[test]
fn into_variants_overwrite_strided_outputs() {
    let case = small_case();
    let t = case.tensors();
    let p = &case.params;
    let g_out = grad_out_for(&case, 9);
    let mask = t.mask.as_ref().map(|m| m.view());
    let owned = deform_conv2d_backward(
        g_out.view(),
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        p,
        Want::ALL,
    )
    .unwrap();
    let g = case.geometry();
    let big = |s: [usize; 4]| Array4::<f64>::from_elem((s[0], s[1], s[2] * 2, s[3]), f64::NAN);
    let (mut bi, mut bo, mut bm, mut bw) = (
        big(g.input_shape()),
        big(g.offset_shape()),
        big(g.mask_shape()),
        big(g.weight_shape()),
    );
    let mut bb = Array1::<f64>::from_elem(2 * g.c_out, f64::NAN);
    let mut tr = Array4::<f64>::from_elem(g.input_shape(), f64::NAN);
    {
        let mut tv = tr.view_mut();
        tv.invert_axis(ndarray::Axis(3));
        let out = GradsMut {
            input: Some(bi.slice_mut(s![.., .., ..;2, ..])),
            offset: Some(bo.slice_mut(s![.., .., ..;2, ..])),
            mask: Some(bm.slice_mut(s![.., .., 1..;2, ..])),
            weight: Some(bw.slice_mut(s![.., .., ..;2, ..])),
            bias: Some(bb.slice_mut(s![..;2])),
        };
        deform_conv2d_backward_into(
            g_out.view(),
            t.input.view(),
            t.offset.view(),
            mask,
            t.weight.view(),
            p,
            out,
        )
        .unwrap();
        deform_conv2d_grad_input_into(g_out.view(), t.offset.view(), mask, t.weight.view(), p, tv)
            .unwrap();
    }
    assert!(same_bits(
        &bi.slice(s![.., .., ..;2, ..]).to_owned(),
        owned.input.as_ref().unwrap()
    ));
    assert!(
        bi.slice(s![.., .., 1..;2, ..]).iter().all(|v| v.is_nan()),
        "untouched rows"
    );
    assert!(same_bits(
        &bo.slice(s![.., .., ..;2, ..]).to_owned(),
        owned.offset.as_ref().unwrap()
    ));
    assert!(same_bits(
        &bm.slice(s![.., .., 1..;2, ..]).to_owned(),
        owned.mask.as_ref().unwrap()
    ));
    assert!(same_bits(
        &bw.slice(s![.., .., ..;2, ..]).to_owned(),
        owned.weight.as_ref().unwrap()
    ));
    assert_eq!(&bb.slice(s![..;2]).to_owned(), owned.bias.as_ref().unwrap());
    let mut back = tr.view();
    back.invert_axis(ndarray::Axis(3));
    assert!(same_bits(&back.to_owned(), owned.input.as_ref().unwrap()));
    // Non-contiguous operands give the same bits.
    let mut input_t = Array4::<f64>::zeros(t.input.raw_dim().f());
    input_t.assign(&t.input);
    let gout_rev = {
        let mut v = g_out.clone();
        v.invert_axis(ndarray::Axis(2));
        let mut o = Array4::<f64>::zeros(g_out.raw_dim());
        o.assign(&v);
        o
    };
    let mut gv = gout_rev.view();
    gv.invert_axis(ndarray::Axis(2));
    let again = deform_conv2d_backward(
        gv,
        input_t.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        p,
        Want::ALL,
    )
    .unwrap();
    assert_eq!(again, owned);
}

use ndarray::ShapeBuilder;

#[test]
fn empty_batch_and_shape_errors() {
    let case = Case {
        n: 0,
        ..small_case()
    };
    let t = case.tensors();
    let p = &case.params;
    let g_out = Array4::<f64>::zeros(case.geometry().out_shape());
    let mask = t.mask.as_ref().map(|m| m.view());
    let all = deform_conv2d_backward(
        g_out.view(),
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        p,
        Want::ALL,
    )
    .unwrap();
    assert_eq!(all.input.unwrap().shape()[0], 0);
    assert_eq!(
        all.weight.unwrap(),
        Array4::<f64>::zeros(t.weight.raw_dim())
    );
    assert_eq!(all.bias.unwrap(), Array1::<f64>::zeros(case.c_out));

    let case = small_case();
    let t = case.tensors();
    let g_out = grad_out_for(&case, 1);
    let mask = t.mask.as_ref().map(|m| m.view());
    let bad = g_out.slice(s![.., 1.., .., ..]);
    assert!(deform_conv2d_backward(
        bad,
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        p,
        Want::ALL
    )
    .is_err());
    let bad_off = t.offset.slice(s![.., 1.., .., ..]);
    assert!(deform_conv2d_grad_offset(
        g_out.view(),
        t.input.view(),
        bad_off,
        mask,
        t.weight.view(),
        p
    )
    .is_err());
    let bad_mask = t.mask.as_ref().unwrap().slice(s![.., .., 1.., ..]);
    assert!(deform_conv2d_grad_weight(
        g_out.view(),
        t.input.view(),
        t.offset.view(),
        Some(bad_mask),
        shape4(t.weight.shape()),
        p
    )
    .is_err());
    let mut wrong = Array4::<f64>::zeros((2, 4, 5, 7));
    assert!(deform_conv2d_grad_input_into(
        g_out.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        p,
        wrong.view_mut()
    )
    .is_err());
    let mut wb = Array1::<f64>::zeros(5);
    assert!(deformconv::deform_conv2d_grad_bias_into(g_out.view(), wb.view_mut()).is_err());
    let mut go = Array4::<f64>::zeros(case.geometry().offset_shape());
    let dense_with_offset = GradsMut {
        offset: Some(go.view_mut()),
        ..GradsMut::default()
    };
    assert!(deformconv::conv2d_backward_into(
        g_out.view(),
        t.input.view(),
        t.weight.view(),
        p,
        dense_with_offset
    )
    .is_err());
    assert!(conv2d_backward(
        g_out.view(),
        t.input.view(),
        t.weight.view(),
        &ConvParams::default().stride(0, 1),
        Want::ALL
    )
    .is_err());
}
