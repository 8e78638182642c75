//! Non-finite values in the reference (DESIGN.md §3): never a panic; a NaN sample position
//! gives a NaN sample touching no pixel; an infinite or huge position is outside (samples 0).

mod support;

use deformconv::reference;
use ndarray::Array4;
use support::{Case, Offsets, Problem, Rng};

fn all_gradients(p: &Problem) -> [Array4<f64>; 4] {
    let prm = p.spec.params;
    let m = Some(p.mask.view());
    [
        reference::grad_input(
            p.grad_out.view(),
            p.offset.view(),
            m,
            p.weight.view(),
            p.spec.input_shape(),
            &prm,
        )
        .unwrap(),
        reference::grad_offset(
            p.grad_out.view(),
            p.input.view(),
            p.offset.view(),
            m,
            p.weight.view(),
            &prm,
        )
        .unwrap(),
        reference::grad_mask(
            p.grad_out.view(),
            p.input.view(),
            p.offset.view(),
            p.weight.view(),
            &prm,
        )
        .unwrap(),
        reference::grad_weight(
            p.grad_out.view(),
            p.input.view(),
            p.offset.view(),
            m,
            p.spec.weight_shape(),
            &prm,
        )
        .unwrap(),
    ]
}

/// Non-finite and huge values sprinkled over every operand: every function returns `Ok`.
#[test]
fn non_finite_operands_never_panic() {
    let specials = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        -f64::MAX,
        1e300,
        -1e19,
        f64::MIN_POSITIVE,
    ];
    for seed in 0..40 {
        let mut rng = Rng::new(seed);
        let spec = Case::random(&mut rng);
        let mut p = Problem::random(spec, Offsets::Mixed, &mut rng);
        for a in [
            &mut p.input,
            &mut p.offset,
            &mut p.mask,
            &mut p.weight,
            &mut p.grad_out,
        ] {
            for v in a.iter_mut() {
                if rng.int(0, 3) == 0 {
                    *v = specials[rng.size(0, specials.len() - 1)];
                }
            }
        }
        p.forward(true, true);
        p.forward(false, false);
        all_gradients(&p);
        reference::grad_bias(p.grad_out.view()).unwrap();
    }
}

/// One tap of one output pixel gets offset `(dy, dx)`; the problem is otherwise finite.
fn with_one_offset(dy: f64, dx: f64) -> (Problem, Problem) {
    let mut rng = Rng::new(7);
    let spec = Case::from_knobs(
        1,
        1,
        2,
        2,
        0,
        (2, 2),
        (1, 1),
        (1, 1),
        deformconv::Padding::symmetric(1, 1),
        (2, 2),
    );
    let mut p = Problem::random(spec, Offsets::Any, &mut rng);
    let mut masked = Problem {
        spec,
        input: p.input.clone(),
        offset: p.offset.clone(),
        mask: p.mask.clone(),
        weight: p.weight.clone(),
        bias: p.bias.clone(),
        grad_out: p.grad_out.clone(),
    };
    // Tap k = 1 (channels 2, 3 of the offset, 1 of the mask) at output pixel (1, 2).
    p.offset[[0, 2, 1, 2]] = dy;
    p.offset[[0, 3, 1, 2]] = dx;
    masked.mask[[0, 1, 1, 2]] = 0.0;
    (p, masked)
}

/// An infinite or huge position is outside: the tap contributes exactly what a zero mask
/// would, and its offset gradient is 0.
#[test]
fn infinite_or_huge_offsets_sample_zero() {
    for (dy, dx) in [
        (f64::INFINITY, 0.3),
        (0.3, f64::NEG_INFINITY),
        (1e300, 0.0),
        (-1e300, -1e300),
        (f64::MAX, f64::MAX),
        (-1e19, 0.5),
    ] {
        let (p, masked) = with_one_offset(dy, dx);
        assert_eq!(
            p.forward(true, true),
            masked.forward(true, true),
            "({dy}, {dx})"
        );
        let [gi, go, gm, gw] = all_gradients(&p);
        let [mgi, _, _, mgw] = all_gradients(&masked);
        assert_eq!(gi, mgi, "grad_input ({dy}, {dx})");
        assert_eq!(gw, mgw, "grad_weight ({dy}, {dx})");
        assert_eq!(go[[0, 2, 1, 2]], 0.0, "grad_offset dy ({dy}, {dx})");
        assert_eq!(go[[0, 3, 1, 2]], 0.0, "grad_offset dx ({dy}, {dx})");
        assert_eq!(gm[[0, 1, 1, 2]], 0.0, "grad_mask ({dy}, {dx})");
        assert!(go.iter().chain(gm.iter()).all(|v| v.is_finite()));
    }
}

/// A NaN position: the affected output and the tap's offset and mask gradients are NaN, the
/// weight gradient of that tap is NaN, and the input gradient is untouched (the NaN sample
/// touches no pixel), i.e. equal to the zero-mask problem's.
#[test]
fn nan_offsets_give_nan_samples_touching_no_pixel() {
    for (dy, dx) in [(f64::NAN, 0.5), (0.5, f64::NAN), (f64::NAN, f64::INFINITY)] {
        let (p, masked) = with_one_offset(dy, dx);
        let out = p.forward(true, true);
        for ((_, o, y, x), v) in out.indexed_iter() {
            assert_eq!(v.is_nan(), (y, x) == (1, 2), "out[{o}, {y}, {x}] = {v}");
        }
        let [gi, go, gm, gw] = all_gradients(&p);
        let [mgi, _, _, _] = all_gradients(&masked);
        assert_eq!(gi, mgi, "grad_input ({dy}, {dx})");
        assert!(go[[0, 2, 1, 2]].is_nan() && go[[0, 3, 1, 2]].is_nan());
        assert!(gm[[0, 1, 1, 2]].is_nan());
        for ((_, _, i, j), v) in gw.indexed_iter() {
            assert_eq!(
                v.is_nan(),
                (i, j) == (0, 1),
                "grad_weight tap ({i}, {j}) = {v}"
            );
        }
    }
}
