//! The fast forward path under each sampling convention ([`Convention`]): against the f64
//! reference (f64 within 1e-12 relative, f32 within the per-element bound of DESIGN.md §5) on
//! random problems whose samples sit exactly on and around the image borders and on integer
//! positions; a hand-worked case per convention; bitwise thread-count independence for DCN v1.

mod support;

use deformconv::compare::Output;
use deformconv::{deform_conv2d, reference, ConvParams, Convention, Float};
use ndarray::{Array1, Array4};
use proptest::prelude::*;
use support::assert_rel_close;
use support::{border_offsets, cases, same_bits, to_f32, to_f32_1, Bound, Case, Tensors};

/// The fast forward in `T` and the reference on the same (converted) operands.
struct Run<T> {
    fast: Array4<T>,
    exact: Array4<f64>,
}

#[allow(clippy::type_complexity)]
fn run_both<T: Float>(
    input: &Array4<T>,
    offset: &Array4<T>,
    mask: Option<&Array4<T>>,
    weight: &Array4<T>,
    bias: Option<&Array1<T>>,
    params: &ConvParams,
) -> Run<T> {
    let (mask, bias) = (mask.map(|m| m.view()), bias.map(|b| b.view()));
    let fast = deform_conv2d(
        input.view(),
        offset.view(),
        mask,
        weight.view(),
        bias,
        params,
    )
    .unwrap();
    let exact = reference::deform_conv2d(
        input.view(),
        offset.view(),
        mask,
        weight.view(),
        bias,
        params,
    )
    .unwrap();
    Run { fast, exact }
}

/// Checks one random border problem under `conv` in f64 and f32.
fn check_convention(case: &Case, conv: Convention) {
    let case = Case {
        params: case.params.convention(conv),
        ..*case
    };
    let t = case.tensors();
    let offset = border_offsets(&case, case.seed);
    let p = &case.params;

    let r = run_both(
        &t.input,
        &offset,
        t.mask.as_ref(),
        &t.weight,
        t.bias.as_ref(),
        p,
    );
    assert_rel_close(
        &format!("{case:?}"),
        "out",
        &r.fast.view(),
        &r.exact.view(),
        1e-12,
    );

    let (input, offset, weight) = (to_f32(&t.input), to_f32(&offset), to_f32(&t.weight));
    let mask = t.mask.as_ref().map(to_f32);
    let bias = t.bias.as_ref().map(to_f32_1);
    let r = run_both(&input, &offset, mask.as_ref(), &weight, bias.as_ref(), p);
    let t = Tensors {
        offset: offset.mapv(f64::from),
        ..t
    };
    Bound::new::<f32>(format!("{case:?}"), &t, None, p).check(
        Output::Out,
        r.fast.view(),
        r.exact.view(),
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn torchvision_fast_matches_reference_on_borders(case in cases()) {
        check_convention(&case, Convention::Torchvision);
    }

    #[test]
    fn mmcv_fast_matches_reference_on_borders(case in cases()) {
        check_convention(&case, Convention::Mmcv);
    }

    #[test]
    fn dcn_v1_fast_matches_reference_on_borders(case in cases()) {
        check_convention(&case, Convention::DcnV1);
    }
}

/// A 1x1 kernel over the 2 x 3 plane `[[1, 2, 3], [4, 5, 6]]` with unit weight, one offset
/// per output pixel; returns the six outputs in row-major order.
fn hand_case(conv: Convention) -> Vec<f64> {
    let input = Array4::from_shape_vec((1, 1, 2, 3), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let weight = Array4::from_elem((1, 1, 1, 1), 1.0);
    // (dy, dx) for output pixels (0,0) (0,1) (0,2) (1,0) (1,1) (1,2).
    let d = [
        (-0.5, 0.0),
        (0.25, 0.5),
        (0.0, 0.5),
        (0.0, 0.0),
        (-1.5, 0.0),
        (0.5, 0.25),
    ];
    let mut offset = Array4::zeros((1, 2, 2, 3));
    for (p, &(dy, dx)) in d.iter().enumerate() {
        offset[[0, 0, p / 3, p % 3]] = dy;
        offset[[0, 1, p / 3, p % 3]] = dx;
    }
    let params = ConvParams::default().convention(conv);
    let fast = deform_conv2d(
        input.view(),
        offset.view(),
        None,
        weight.view(),
        None,
        &params,
    )
    .unwrap();
    fast.iter().copied().collect()
}

#[test]
fn hand_worked_case_per_convention() {
    // Samples (py, px) = pixel + offset:
    // (0,0) at (-0.5, 0): torchvision/mmcv y0 = -1, ly = 0.5: 0.5 * v(0,0) = 0.5;
    //                     DCN v1: py < 0 is outside: 0.
    // (0,1) at (0.25, 1.5): inside for all, away from the last row/column:
    //       0.75*0.5*2 + 0.75*0.5*3 + 0.25*0.5*5 + 0.25*0.5*6 = 0.75 + 1.125 + 0.625 + 0.75 = 3.25.
    // (0,2) at (0, 2.5): torchvision/mmcv x0 = 2, lx = 0.5, v(0,3) outside: 0.5 * 3 = 1.5;
    //                    DCN v1: x0 = W-1 collapses, lx = 0: v(0,2) = 3.
    // (1,0) at (1, 0): an integer position on the last row: v(1,0) = 4 in every convention.
    // (1,1) at (-0.5, 1): torchvision/mmcv 0.5 * v(0,1) = 1; DCN v1 0.
    // (1,2) at (1.5, 2.25): torchvision/mmcv y0 = 1, ly = 0.5, x0 = 2, lx = 0.25, only
    //       v(1,2) inside: 0.5 * 0.75 * 6 = 2.25; DCN v1: both axes collapse: v(1,2) = 6.
    let torchvision = vec![0.5, 3.25, 1.5, 4.0, 1.0, 2.25];
    assert_eq!(hand_case(Convention::Torchvision), torchvision);
    assert_eq!(hand_case(Convention::Mmcv), torchvision);
    assert_eq!(
        hand_case(Convention::DcnV1),
        vec![0.0, 3.25, 3.0, 4.0, 0.0, 6.0]
    );
}

fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(f)
}

/// Several tiles per image (576 column rows x 1024 pixels), border offsets, DCN v1.
fn dcn_v1_multi_tile<T: Float>(convert: impl Fn(f64) -> T) -> impl Fn() -> Array4<T> {
    let case = Case {
        n: 2,
        c_in: 64,
        c_out: 16,
        h: 32,
        w: 32,
        kh: 3,
        kw: 3,
        params: ConvParams::default()
            .padding(1, 1)
            .offset_groups(2)
            .convention(Convention::DcnV1),
        mask: true,
        bias: true,
        seed: 31,
    };
    let t = case.tensors();
    let offset = border_offsets(&case, case.seed).mapv(&convert);
    let input = t.input.mapv(&convert);
    let mask = t.mask.as_ref().map(|m| m.mapv(&convert));
    let weight = t.weight.mapv(&convert);
    let bias = t.bias.as_ref().map(|b| b.mapv(&convert));
    move || {
        deform_conv2d(
            input.view(),
            offset.view(),
            mask.as_ref().map(|m| m.view()),
            weight.view(),
            bias.as_ref().map(|b| b.view()),
            &case.params,
        )
        .unwrap()
    }
}

fn check_dcn_v1_thread_counts<T: Float + Into<f64>>(convert: impl Fn(f64) -> T) {
    let run = dcn_v1_multi_tile(convert);
    let one = in_pool(1, &run);
    for threads in [2, 3, 8] {
        let many = in_pool(threads, &run);
        assert!(
            same_bits(&one, &many),
            "{}: {threads} threads differ from 1",
            T::NAME
        );
    }
}

#[test]
fn dcn_v1_f32_is_bitwise_identical_for_1_2_3_8_threads() {
    check_dcn_v1_thread_counts(|v| v as f32);
}

#[test]
fn dcn_v1_f64_is_bitwise_identical_for_1_2_3_8_threads() {
    check_dcn_v1_thread_counts(|v| v);
}
