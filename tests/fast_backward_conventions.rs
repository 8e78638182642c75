//! The fast backward under each sampling convention ([`Convention`]): every gradient (input,
//! offset, mask, weight; combined and separate) against the f64 reference on random problems
//! whose samples sit exactly on and around the image borders and on integer positions (f64
//! within 1e-12 of each tensor's largest magnitude, f32 within the published per-element
//! bound of `deformconv::compare`), a hand-worked case per convention, far and NaN offsets, bitwise
//! thread-count independence for mmcv and DCN v1, and the dense backward (which no convention
//! changes).

mod support;

use deformconv::compare::Output;
use deformconv::{
    conv2d_backward, deform_conv2d_backward, deform_conv2d_grad_bias, deform_conv2d_grad_input,
    deform_conv2d_grad_mask, deform_conv2d_grad_offset, deform_conv2d_grad_weight, reference,
    ConvParams, Convention, Float, Grads, Want,
};
use ndarray::{Array4, ArrayView4};
use proptest::prelude::*;
use support::assert_rel_close;
use support::{border_offsets, cases, to_f32, Bound, Case, Rng, Tensors};

fn shape4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

fn grad_out_for(case: &Case, seed: u64) -> Array4<f64> {
    let mut r = Rng::new(seed ^ 0x5eed_0ff5_e7b0_4de2);
    Array4::from_shape_fn(case.geometry().out_shape(), |_| r.value())
}

/// `case` under `conv`, its tensors with [`border_offsets`] (a few replaced by far-away
/// finite or infinite offsets, which take the table's slow path), and a `grad_out`.
fn border_problem(case: &Case, conv: Convention) -> (Case, Tensors, Array4<f64>) {
    let case = Case {
        params: case.params.convention(conv),
        ..*case
    };
    let mut t = case.tensors();
    t.offset = border_offsets(&case, case.seed);
    let mut r = Rng::new(case.seed ^ 0xfa12);
    let far = [5e6, -5e6, 1e30, f64::INFINITY, f64::NEG_INFINITY];
    for v in t.offset.iter_mut() {
        if r.unit() < 0.03 {
            *v = far[(r.unit() * far.len() as f64) as usize % far.len()];
        }
    }
    let g_out = grad_out_for(&case, case.seed);
    (case, t, g_out)
}

fn bits<T: Float>(a: &Array4<T>, b: &Array4<T>) -> bool {
    a.shape() == b.shape()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_f64().to_bits() == y.to_f64().to_bits())
}

/// The combined backward (every gradient), asserted bitwise equal to every separate function
/// and to a pair computed together.
fn combined_and_separate<T: Float>(
    g_out: ArrayView4<'_, T>,
    input: ArrayView4<'_, T>,
    offset: ArrayView4<'_, T>,
    mask: Option<ArrayView4<'_, T>>,
    weight: ArrayView4<'_, T>,
    p: &ConvParams,
) -> Grads<T> {
    let all = deform_conv2d_backward(g_out, input, offset, mask, weight, p, Want::ALL).unwrap();
    let is = shape4(input.shape());
    let ws = shape4(weight.shape());
    let gi = deform_conv2d_grad_input(g_out, offset, mask, weight, is, p).unwrap();
    let go = deform_conv2d_grad_offset(g_out, input, offset, mask, weight, p).unwrap();
    let gm = deform_conv2d_grad_mask(g_out, input, offset, weight, p).unwrap();
    let gw = deform_conv2d_grad_weight(g_out, input, offset, mask, ws, p).unwrap();
    assert!(bits(all.input.as_ref().unwrap(), &gi), "grad_input");
    assert!(bits(all.offset.as_ref().unwrap(), &go), "grad_offset");
    assert!(bits(all.mask.as_ref().unwrap(), &gm), "grad_mask");
    assert!(bits(all.weight.as_ref().unwrap(), &gw), "grad_weight");
    let gb = deform_conv2d_grad_bias(g_out).unwrap();
    let gb_all = all.bias.as_ref().unwrap();
    assert!(gb.iter().zip(gb_all).all(|(a, b)| a.to_f64() == b.to_f64()));
    let want = Want::NONE.input().offset();
    let pair = deform_conv2d_backward(g_out, input, offset, mask, weight, p, want).unwrap();
    assert!(bits(all.input.as_ref().unwrap(), &pair.input.unwrap()));
    assert!(bits(all.offset.as_ref().unwrap(), &pair.offset.unwrap()));
    all
}

/// The reference gradients `(input, offset, mask, weight)` of `t` (mask as given).
fn reference_grads(t: &Tensors, g_out: ArrayView4<'_, f64>, p: &ConvParams) -> [Array4<f64>; 4] {
    let mask = t.mask.as_ref().map(|m| m.view());
    let (is, ws) = (shape4(t.input.shape()), shape4(t.weight.shape()));
    let (input, offset, weight) = (t.input.view(), t.offset.view(), t.weight.view());
    [
        reference::grad_input(g_out, offset, mask, weight, is, p).unwrap(),
        reference::grad_offset(g_out, input, offset, mask, weight, p).unwrap(),
        reference::grad_mask(g_out, input, offset, weight, p).unwrap(),
        reference::grad_weight(g_out, input, offset, mask, ws, p).unwrap(),
    ]
}

/// Every fast gradient of one border problem under `conv` against the reference, in f64 and
/// f32, the combined backward bitwise equal to the separate functions in both.
fn check_convention(case: &Case, conv: Convention) {
    let (case, t, g_out) = border_problem(case, conv);
    let p = &case.params;
    let exact = reference_grads(&t, g_out.view(), p);
    let names = ["grad_input", "grad_offset", "grad_mask", "grad_weight"];

    let mask = t.mask.as_ref().map(|m| m.view());
    let all = combined_and_separate(
        g_out.view(),
        t.input.view(),
        t.offset.view(),
        mask,
        t.weight.view(),
        p,
    );
    let fast = [all.input, all.offset, all.mask, all.weight].map(Option::unwrap);
    for ((name, f), e) in names.iter().zip(&fast).zip(&exact) {
        assert_rel_close(&format!("{case:?}"), name, &f.view(), &e.view(), 1e-12);
    }

    let mask32 = t.mask.as_ref().map(to_f32);
    let all = combined_and_separate(
        to_f32(&g_out).view(),
        to_f32(&t.input).view(),
        to_f32(&t.offset).view(),
        mask32.as_ref().map(|m| m.view()),
        to_f32(&t.weight).view(),
        p,
    );
    let bound = Bound::new::<f32>(format!("{case:?}"), &t, Some(&g_out), p);
    let outputs = [
        Output::GradInput,
        Output::GradOffset,
        Output::GradMask,
        Output::GradWeight,
    ];
    let fast = [all.input, all.offset, all.mask, all.weight].map(Option::unwrap);
    for ((&output, f), e) in outputs.iter().zip(&fast).zip(&exact) {
        bound.check(output, f.view(), e.view());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn torchvision_backward_matches_reference_on_borders(case in cases()) {
        check_convention(&case, Convention::Torchvision);
    }

    #[test]
    fn mmcv_backward_matches_reference_on_borders(case in cases()) {
        check_convention(&case, Convention::Mmcv);
    }

    #[test]
    fn dcn_v1_backward_matches_reference_on_borders(case in cases()) {
        check_convention(&case, Convention::DcnV1);
    }
}

/// A 1x1 kernel of weight 1 over the 2 x 3 plane `[[1, 2, 3], [4, 5, 6]]`, `grad_out = 1`, one
/// offset per output pixel; returns `grad_input` (row-major) and `grad_offset` as `(dy, dx)`
/// per output pixel, fast path in f64.
fn hand_case(conv: Convention) -> (Vec<f64>, Vec<(f64, f64)>) {
    let input = Array4::from_shape_vec((1, 1, 2, 3), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let weight = Array4::from_elem((1, 1, 1, 1), 1.0);
    let g_out = Array4::from_elem((1, 1, 2, 3), 1.0);
    // (dy, dx) for output pixels (0,0) (0,1) (0,2) (1,0) (1,1) (1,2).
    let d = [
        (-0.5, 0.0),
        (0.25, 0.5),
        (0.0, 0.5),
        (0.0, 0.0),
        (-2.0, 0.5),
        (0.5, 0.25),
    ];
    let mut offset = Array4::zeros((1, 2, 2, 3));
    for (p, &(dy, dx)) in d.iter().enumerate() {
        offset[[0, 0, p / 3, p % 3]] = dy;
        offset[[0, 1, p / 3, p % 3]] = dx;
    }
    let params = ConvParams::default().convention(conv);
    let g = deform_conv2d_backward(
        g_out.view(),
        input.view(),
        offset.view(),
        None,
        weight.view(),
        &params,
        Want::ALL,
    )
    .unwrap();
    let gi = g.input.unwrap().iter().copied().collect();
    let go = g.offset.unwrap();
    let go = (0..6)
        .map(|p| (go[[0, 0, p / 3, p % 3]], go[[0, 1, p / 3, p % 3]]))
        .collect();
    (gi, go)
}

#[test]
fn hand_worked_case_per_convention() {
    // Wy = lx (v11 - v01) + (1-lx)(v10 - v00), Wx = ly (v11 - v10) + (1-ly)(v01 - v00) on the
    // convention's corners; v = 0 outside the image. Samples (py, px) = pixel + offset:
    // (0,0) at (-0.5, 0):  tv/mmcv y0 = -1, ly = 0.5, lx = 0: grad_input(0,0) += 0.5;
    //                      v00 = v01 = 0, v10 = 1, v11 = 2: Wy = 1, Wx = 0.5(2-1) = 0.5.
    //                      DCN v1: py < 0 is outside: nothing, (0, 0).
    // (0,1) at (0.25, 1.5): all alike: (0,1), (0,2) += 0.75*0.5 = 0.375, (1,1), (1,2) += 0.125;
    //                      Wy = 0.5(6-3) + 0.5(5-2) = 3, Wx = 0.25(6-5) + 0.75(3-2) = 1.
    // (0,2) at (0, 2.5):   tv/mmcv x0 = 2, lx = 0.5, v01 = v11 = 0: grad_input(0,2) += 0.5;
    //                      Wy = 0.5*0 + 0.5(6-3) = 1.5, Wx = 1*(0-3) = -3.
    //                      DCN v1: x0 = W-1 collapses (lx = 0, x1 = x0): (0,2) += 1;
    //                      Wy = 6-3 = 3, Wx = 3-3 = 0.
    // (1,0) at (1, 0):     integer on the last row: grad_input(1,0) += 1 in every convention;
    //                      tv/mmcv Wy = 0-4 = -4, Wx = 5-4 = 1; DCN v1 y collapses: Wy = 4-4 = 0, Wx = 1.
    // (1,1) at (-1, 1.5):  py = -1 exactly: outside for the value in every convention, nothing
    //                      to grad_input; tv Wy = 0.5(3-0) + 0.5(2-0) = 2.5, Wx = 1*(0-0) = 0;
    //                      mmcv and DCN v1 cut off: (0, 0).
    // (1,2) at (1.5, 2.25): tv/mmcv y0 = 1, ly = 0.5, x0 = 2, lx = 0.25, only v00 = 6 inside:
    //                      grad_input(1,2) += 0.5*0.75 = 0.375; Wy = 0.75(0-6) = -4.5,
    //                      Wx = 0.5(0-6) = -3. DCN v1 both collapse: (1,2) += 1, (0, 0).
    let (gi, go) = hand_case(Convention::Torchvision);
    assert_eq!(gi, vec![0.5, 0.375, 0.875, 1.0, 0.125, 0.5]);
    let tv_offset = vec![
        (1.0, 0.5),
        (3.0, 1.0),
        (1.5, -3.0),
        (-4.0, 1.0),
        (2.5, 0.0),
        (-4.5, -3.0),
    ];
    assert_eq!(go, tv_offset);
    let (gi, go) = hand_case(Convention::Mmcv);
    assert_eq!(gi, vec![0.5, 0.375, 0.875, 1.0, 0.125, 0.5]);
    let mut mmcv_offset = tv_offset;
    mmcv_offset[4] = (0.0, 0.0);
    assert_eq!(go, mmcv_offset);
    let (gi, go) = hand_case(Convention::DcnV1);
    assert_eq!(gi, vec![0.0, 0.375, 1.375, 1.0, 0.125, 1.125]);
    assert_eq!(
        go,
        vec![
            (0.0, 0.0),
            (3.0, 1.0),
            (3.0, 0.0),
            (0.0, 1.0),
            (0.0, 0.0),
            (0.0, 0.0)
        ]
    );
}

/// NaN, infinite and huge offsets (the table's slow path) under every convention, in f64:
/// against the reference (NaN where it has NaN), the combined backward equal to the separate
/// functions.
#[test]
fn far_and_nan_offsets_in_every_convention() {
    let base = Case {
        n: 2,
        c_in: 4,
        c_out: 3,
        h: 5,
        w: 6,
        kh: 3,
        kw: 3,
        params: ConvParams::default().padding(1, 1).offset_groups(2),
        mask: true,
        bias: false,
        seed: 77,
    };
    for conv in Convention::ALL {
        let (case, mut t, g_out) = border_problem(&base, conv);
        let specials = [f64::NAN, 1e30, -1e30, 4.5e6, -4.5e6, f64::INFINITY];
        for (i, v) in t.offset.iter_mut().enumerate() {
            if i % 53 == 7 {
                *v = specials[(i / 53) % specials.len()];
            }
        }
        let p = &case.params;
        let all = combined_and_separate(
            g_out.view(),
            t.input.view(),
            t.offset.view(),
            t.mask.as_ref().map(|m| m.view()),
            t.weight.view(),
            p,
        );
        let exact = reference_grads(&t, g_out.view(), p);
        let fast = [all.input, all.offset, all.mask, all.weight].map(Option::unwrap);
        for (f, e) in fast.iter().zip(&exact) {
            assert!(
                f.iter().zip(e).all(|(a, b)| a.is_nan() == b.is_nan()),
                "{conv:?}: NaN pattern"
            );
            let clean = |a: &Array4<f64>| a.mapv(|v| if v.is_nan() { 0.0 } else { v });
            assert_rel_close(
                &format!("{conv:?}"),
                "far",
                &clean(f).view(),
                &clean(e).view(),
                1e-12,
            );
        }
    }
}

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// Two tiles per image (576 pixels), two slots, two offset groups, border offsets.
fn multi_tile(conv: Convention) -> (Case, Tensors, Array4<f64>) {
    let case = Case {
        n: 3,
        c_in: 8,
        c_out: 6,
        h: 24,
        w: 24,
        kh: 3,
        kw: 3,
        params: ConvParams::default().padding(1, 1).offset_groups(2),
        mask: true,
        bias: false,
        seed: 5,
    };
    border_problem(&case, conv)
}

fn grads_bits<T: Float>(a: &Grads<T>, b: &Grads<T>) -> bool {
    let four = |g: &Grads<T>| [&g.input, &g.offset, &g.mask, &g.weight].map(|x| x.clone().unwrap());
    four(a).iter().zip(four(b).iter()).all(|(x, y)| bits(x, y))
}

fn check_thread_counts<T: Float>(conv: Convention, convert: impl Fn(f64) -> T) {
    let (case, t, g_out) = multi_tile(conv);
    let c = |a: &Array4<f64>| a.mapv(&convert);
    let (g_out, input, offset, weight) = (c(&g_out), c(&t.input), c(&t.offset), c(&t.weight));
    let mask = t.mask.as_ref().map(c);
    let run = || {
        deform_conv2d_backward(
            g_out.view(),
            input.view(),
            offset.view(),
            mask.as_ref().map(|m| m.view()),
            weight.view(),
            &case.params,
            Want::ALL,
        )
        .unwrap()
    };
    let one = in_pool(1, run);
    for threads in [2, 3, 8] {
        assert!(
            grads_bits(&one, &in_pool(threads, run)),
            "{conv:?} {}: {threads} threads differ from 1",
            T::NAME
        );
    }
}

#[test]
fn mmcv_and_dcn_v1_are_bitwise_identical_for_1_2_3_8_threads() {
    for conv in [Convention::Mmcv, Convention::DcnV1] {
        check_thread_counts(conv, |v| v as f32);
        check_thread_counts(conv, |v| v);
    }
}

/// The multi-tile problem (several tiles scattering into the same planes, several images per
/// task) against the reference under each convention.
#[test]
fn multi_tile_problem_matches_reference_in_every_convention() {
    for conv in Convention::ALL {
        let (case, t, g_out) = multi_tile(conv);
        let p = &case.params;
        let g = deform_conv2d_backward(
            g_out.view(),
            t.input.view(),
            t.offset.view(),
            t.mask.as_ref().map(|m| m.view()),
            t.weight.view(),
            p,
            Want::ALL,
        )
        .unwrap();
        let fast = [g.input, g.offset, g.mask, g.weight].map(Option::unwrap);
        let exact = reference_grads(&t, g_out.view(), p);
        for (f, e) in fast.iter().zip(&exact) {
            assert_rel_close(
                &format!("{conv:?}"),
                "multi-tile",
                &f.view(),
                &e.view(),
                1e-12,
            );
        }
    }
}

/// The dense backward samples integer positions only, where every convention agrees: the
/// convention changes no bit.
#[test]
fn dense_backward_ignores_the_convention() {
    let case = Case {
        n: 2,
        c_in: 4,
        c_out: 4,
        h: 7,
        w: 6,
        kh: 3,
        kw: 2,
        params: ConvParams::default().padding(1, 2).groups(2),
        mask: false,
        bias: true,
        seed: 9,
    };
    let t = case.tensors();
    let g_out = grad_out_for(&case, 3);
    let run = |conv: Convention| {
        let p = case.params.convention(conv);
        conv2d_backward(g_out.view(), t.input.view(), t.weight.view(), &p, Want::ALL).unwrap()
    };
    let tv = run(Convention::Torchvision);
    for conv in [Convention::Mmcv, Convention::DcnV1] {
        let other = run(conv);
        assert!(bits(
            tv.input.as_ref().unwrap(),
            other.input.as_ref().unwrap()
        ));
        assert!(bits(
            tv.weight.as_ref().unwrap(),
            other.weight.as_ref().unwrap()
        ));
    }
    // And it is the deformable backward with zero offsets in each convention.
    let zeros = Array4::<f64>::zeros(case.geometry().offset_shape());
    for conv in Convention::ALL {
        let p = case.params.convention(conv);
        let (is, ws) = (shape4(t.input.shape()), shape4(t.weight.shape()));
        let gi = reference::grad_input(g_out.view(), zeros.view(), None, t.weight.view(), is, &p)
            .unwrap();
        let gw = reference::grad_weight(g_out.view(), t.input.view(), zeros.view(), None, ws, &p)
            .unwrap();
        assert_rel_close(
            "dense",
            "grad_input",
            &tv.input.as_ref().unwrap().view(),
            &gi.view(),
            1e-12,
        );
        assert_rel_close(
            "dense",
            "grad_weight",
            &tv.weight.as_ref().unwrap().view(),
            &gw.view(),
            1e-12,
        );
    }
}

/// Empty images (`H = 0` or `W = 0`) whose padding still gives output pixels: every sample is
/// outside, in every convention, and the fast backward agrees with the reference (it used to
/// index past its padded planes).
#[test]
fn empty_images_with_padding_in_every_convention() {
    for (h, w) in [(0usize, 3usize), (3, 0), (0, 0)] {
        for conv in Convention::ALL {
            let p = ConvParams::default().padding(1, 1).convention(conv);
            let g = deformconv::Geometry::new([2, 2, h, w], [3, 2, 1, 1], &p).unwrap();
            let mut r = Rng::new(h as u64 * 10 + w as u64);
            let input = Array4::<f64>::zeros(g.input_shape());
            let offset = Array4::from_shape_fn(g.offset_shape(), |_| r.value());
            let weight = Array4::from_shape_fn(g.weight_shape(), |_| r.value());
            let g_out = Array4::from_shape_fn(g.out_shape(), |_| r.value());
            let t = Tensors {
                input,
                offset,
                mask: None,
                weight,
                bias: None,
            };
            let all = combined_and_separate(
                g_out.view(),
                t.input.view(),
                t.offset.view(),
                None,
                t.weight.view(),
                &p,
            );
            let fast = [all.input, all.offset, all.mask, all.weight].map(Option::unwrap);
            let exact = reference_grads(&t, g_out.view(), &p);
            for (f, e) in fast.iter().zip(&exact) {
                assert_rel_close(
                    &format!("{h}x{w} {conv:?}"),
                    "empty",
                    &f.view(),
                    &e.view(),
                    0.0,
                );
            }
        }
    }
}
