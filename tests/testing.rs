//! The `testing` feature: strategies generate only valid problems and shrink to small ones; the
//! DESIGN §5 comparison accepts correct f32 results and catches wrong ones.
#![cfg(feature = "testing")]

use deformconv::compare::{error_scales, Operands, Output, Tolerance};
use deformconv::testing::{
    assert_close, problem_shapes, problems, problems_with, Limits, Presence, Problem,
};
use deformconv::{ConvParams, Geometry};
use ndarray::{arr1, Array4};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestError, TestRunner};

/// The downstream example of the module docs, as a real `#[test]`: the fast f32 forward
/// against the oracle under the per-element bound.
fn my_forward(p: &Problem<f32>) -> Array4<f32> {
    let mask = p.mask.as_ref().map(|m| m.view());
    let bias = p.bias.as_ref().map(|b| b.view());
    let (x, off, w) = (p.input.view(), p.offset.view(), p.weight.view());
    deformconv::deform_conv2d(x, off, mask, w, bias, &p.params).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn fast_forward_f32_is_within_the_bound(p in problems::<f32>()) {
        assert_close(&p, Output::Out, my_forward(&p).view());
    }

    #[test]
    fn generated_problems_are_valid(p in problems::<f64>()) {
        let g = Geometry::new(dim4(p.input.shape()), dim4(p.weight.shape()), &p.params).unwrap();
        g.check_offset(p.offset.shape()).unwrap();
        if let Some(m) = &p.mask {
            g.check_mask(m.shape()).unwrap();
        }
        if let Some(b) = &p.bias {
            g.check_bias(b.len()).unwrap();
        }
        g.check_out("grad_out", p.grad_out.shape()).unwrap();
        prop_assert!(p.geometry().is_ok());
        // Every defined result can be computed and compared with itself.
        let outputs = p.outputs();
        let exact: Vec<_> = outputs.iter().map(|&o| p.exact(o).unwrap()).collect();
        let pairs: Vec<_> = outputs.iter().zip(&exact).map(|(&o, e)| (o, e.view())).collect();
        let report = p.report(&pairs).unwrap();
        prop_assert!(report.passed(), "{}", report);
    }

    #[test]
    fn generated_shapes_respect_the_limits(s in problem_shapes(Limits::default())) {
        let l = Limits::default();
        prop_assert!((l.min_batch..=l.max_batch).contains(&s.input[0]));
        prop_assert!(s.weight[2] <= l.max_kernel && s.weight[3] <= l.max_kernel);
        prop_assert!(s.params.groups <= l.max_groups);
        prop_assert!(s.params.offset_groups <= l.max_offset_groups);
        let p = s.params.padding;
        prop_assert!(p.top.max(p.bottom).max(p.left).max(p.right) <= l.max_padding);
    }
}

fn dim4(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// Runs `predicate` as a property over `strategy` until it fails, returning the shrunk input.
fn minimal_failure<S: Strategy>(strategy: S, predicate: fn(&S::Value) -> bool) -> S::Value
where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(Config {
        cases: 512,
        failure_persistence: None,
        ..Config::default()
    });
    match runner.run(&strategy, |v| {
        prop_assert!(predicate(&v));
        Ok(())
    }) {
        Err(TestError::Fail(_, v)) => v,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn failures_shrink_to_the_smallest_problem() {
    // Fails for any problem with two convolution groups or more: it must shrink to exactly
    // 2 groups with every other extent at its minimum.
    let p = minimal_failure(problems::<f32>(), |p| p.params.groups < 2);
    assert_eq!(p.params.groups, 2);
    assert_eq!(p.input.shape(), &[1, 2, 1, 1]);
    assert_eq!(p.weight.shape(), &[2, 1, 1, 1]);
    assert_eq!(p.params, ConvParams::default().groups(2));
    assert!(p.mask.is_none() && p.bias.is_none());
}

#[test]
fn failures_shrink_towards_small_images() {
    // Fails for a large enough input: the shrunk problem is just large enough.
    let p = minimal_failure(problems::<f64>(), |p| p.input.len() < 40);
    assert!(p.input.len() >= 40);
    assert!(
        p.input.len() <= 80,
        "shrunk to {:?}, weight {:?}",
        p.input.shape(),
        p.weight.shape()
    );
}

#[test]
fn the_same_shape_and_seed_give_the_same_problem() {
    let mut runner = TestRunner::deterministic();
    let shape = problem_shapes(Limits::default())
        .new_tree(&mut runner)
        .unwrap()
        .current();
    let a = Problem::<f32>::random(&shape, 7).unwrap();
    let b = Problem::<f32>::random(&shape, 7).unwrap();
    assert_eq!(a, b);
}

#[test]
fn limits_control_the_optional_operands() {
    let limits = Limits {
        mask: Presence::Always,
        bias: Presence::Never,
        min_batch: 0,
        ..Limits::default()
    };
    let mut runner = TestRunner::deterministic();
    for _ in 0..20 {
        let p = problems_with::<f64>(limits)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        assert!(p.mask.is_some() && p.bias.is_none());
        assert!(p.outputs().contains(&Output::GradMask));
        assert!(!p.outputs().contains(&Output::GradBias));
    }
}

#[test]
fn offsets_cover_integer_half_and_border_positions() {
    // Over a few problems, the generated sample positions include every special kind.
    let mut runner = TestRunner::deterministic();
    let (mut int, mut half, mut at_minus_one, mut at_size, mut far) = (0, 0, 0, 0, 0);
    for _ in 0..30 {
        let p = problems::<f64>().new_tree(&mut runner).unwrap().current();
        let g = p.geometry().unwrap();
        for ((_, ch, y, _), &d) in p.offset.indexed_iter() {
            if ch % 2 == 1 {
                continue;
            }
            let i = ((ch / 2) % g.taps()) / g.kw;
            let py = (y * g.stride_h + i * g.dil_h) as f64 - g.pad_top as f64 + d;
            int += usize::from(d.fract() == 0.0);
            half += usize::from(d.fract().abs() == 0.5);
            at_minus_one += usize::from(py == -1.0);
            at_size += usize::from(py == g.h as f64 || py == g.h as f64 - 1.0);
            far += usize::from(py > g.h as f64 + 2.0 || py < -3.0);
        }
    }
    for (what, n) in [
        ("integer", int),
        ("half-integer", half),
        ("at -1", at_minus_one),
        ("at H-1 or H", at_size),
        ("far outside", far),
    ] {
        assert!(n > 0, "no {what} offsets generated");
    }
}

#[test]
fn a_wrong_result_is_caught_at_its_index() {
    let mut runner = TestRunner::deterministic();
    let p = problems::<f32>().new_tree(&mut runner).unwrap().current();
    let mut out = my_forward(&p);
    let idx = [0, 0, 0, 0];
    out[idx] += 0.01;
    let report = p.report(&[(Output::Out, out.view().into_dyn())]).unwrap();
    let t = report.get(Output::Out).unwrap();
    assert!(!report.passed(), "{report}");
    assert_eq!(t.over_tolerance, 1);
    assert_eq!(t.worst.as_ref().unwrap().index, idx.to_vec());
    assert!(t.max_bound_ratio.unwrap() > 1.0);
    let panicked = std::panic::catch_unwind(|| assert_close(&p, Output::Out, out.view()));
    assert!(panicked.is_err());
}

/// One 1x1 tap, `w = -0.5`, over a 2x1 image `[1, -3]`; the first sample sits at `(0.5, 0)`,
/// halfway between the two pixels, the second at `(1, 0)`. Scales are `L * sum|terms| + P`
/// with `P = sum |w| |g| |m| (|py| + |px|) * (corner sum of |v|)` (see `compare`'s docs).
#[test]
fn error_scale_of_a_hand_worked_case() {
    let input = Array4::from_shape_vec((1, 1, 2, 1), vec![1.0, -3.0]).unwrap();
    let weight = Array4::from_elem((1, 1, 1, 1), -0.5);
    let mut offset = Array4::zeros((1, 2, 2, 1));
    offset[[0, 0, 0, 0]] = 0.5;
    let bias = arr1(&[-0.25]);
    let grad_out = Array4::from_elem((1, 1, 2, 1), 2.0);
    let ops = Operands {
        input: input.view(),
        offset: offset.view(),
        mask: None,
        weight: weight.view(),
        bias: Some(bias.view()),
        grad_out: Some(grad_out.view()),
        params: ConvParams::default(),
    };
    let scales = error_scales(&ops).unwrap();
    // out[0]: sum|terms| = 0.5 * (0.5 * 1 + 0.5 * 3) + 0.25 = 1.25, L = 1 + 1 (bias) + 2;
    // P = 0.5 * (0.5 + 0) * (1 + 3) = 1.
    let out = scales.get(Output::Out).unwrap();
    assert_eq!(out[[0, 0, 0, 0]], 4.0 * 1.25 + 1.0);
    // grad_input[0, 0]: one sample reads it with weight 0.5: |w||g| * 0.5 = 0.5, L = 1 + 2;
    // P = |w||g| * (0.5 + 0) = 0.5.
    let gi = scales.get(Output::GradInput).unwrap();
    assert_eq!(gi[[0, 0, 0, 0]], 3.0 * 0.5 + 0.5);
    // grad_input[1, 0]: both samples (weights 0.5 and 1): sum 1.5, L = 2 + 2; P = 0.5 + 1.
    assert_eq!(gi[[0, 0, 1, 0]], 4.0 * 1.5 + 1.5);
    // grad_bias: two terms of |2|, L = 2.
    assert_eq!(scales.get(Output::GradBias).unwrap()[[0]], 2.0 * 4.0);
    // grad_offset, first sample: dy: |w||g| (1 - lx)(|v10| + |v00|) = 4, L = 1 + 2, and P = 0
    // (px = 0); dx: ly (|v11| + |v10|) + (1 - ly)(|v01| + |v00|) = 2, L = 3,
    // P = 4 * |py| * (corner sum / 4) = 4 * 0.5 * 1 = 2.
    let go = scales.get(Output::GradOffset).unwrap();
    assert_eq!(go[[0, 0, 0, 0]], 3.0 * 4.0);
    assert_eq!(go[[0, 1, 0, 0]], 3.0 * 2.0 + 2.0);
    assert!(scales.get(Output::GradMask).is_none());

    // The bound is c * eps * scale.
    let tol = Tolerance::bound::<f32>();
    assert_eq!(tol.eps, (f32::EPSILON / 2.0) as f64);
}

// ---- The API as a downstream crate uses it (issue 17) ----

use deformconv::testing::Placement;

/// `Limits` builds with struct update syntax from another crate, and with builder methods.
#[test]
fn limits_build_from_another_crate() {
    let a = Limits {
        mask: Presence::Never,
        symmetric_padding_only: true,
        ..Limits::default()
    };
    let b = Limits::default().mask(Presence::Never).symmetric_padding();
    assert_eq!(a, b);
    assert_eq!(
        Limits::default().placement(Placement::Interior).placement,
        Placement::Interior
    );
}

#[test]
fn symmetric_padding_only_gives_symmetric_padding() {
    let mut runner = TestRunner::deterministic();
    let limits = Limits::default().symmetric_padding();
    let (mut asymmetric_default, mut padded) = (0, 0);
    for _ in 0..200 {
        let s = problem_shapes(limits)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let p = s.params.padding;
        assert!(p.top == p.bottom && p.left == p.right, "{p:?}");
        padded += usize::from(p.top + p.left > 0);
        let d = problem_shapes(Limits::default())
            .new_tree(&mut runner)
            .unwrap()
            .current()
            .params
            .padding;
        asymmetric_default += usize::from(d.top != d.bottom || d.left != d.right);
    }
    assert!(padded > 0 && asymmetric_default > 0);
}

/// Every sample position of `p` (rows then columns), with the image extent of its axis.
fn positions(p: &Problem<f64>) -> Vec<(f64, f64)> {
    let g = p.geometry().unwrap();
    p.offset
        .indexed_iter()
        .map(|((_, ch, y, x), &d)| {
            let k = (ch / 2) % g.taps();
            let (i, j) = (k / g.kw, k % g.kw);
            if ch % 2 == 0 {
                let base = (y * g.stride_h + i * g.dil_h) as f64 - g.pad_top as f64;
                (base + d, g.h as f64)
            } else {
                let base = (x * g.stride_w + j * g.dil_w) as f64 - g.pad_left as f64;
                (base + d, g.w as f64)
            }
        })
        .collect()
}

#[test]
fn placement_targets_where_samples_land() {
    let mut runner = TestRunner::deterministic();
    let eps = 1.0 / 1024.0;
    for placement in [
        Placement::Interior,
        Placement::Borders,
        Placement::Integers,
        Placement::FarOutside,
    ] {
        let limits = Limits::default().placement(placement);
        let mut seen = 0;
        for _ in 0..40 {
            let p = problems_with::<f64>(limits)
                .new_tree(&mut runner)
                .unwrap()
                .current();
            for ((pos, size), &d) in positions(&p).into_iter().zip(p.offset.iter()) {
                seen += 1;
                let ok = match placement {
                    Placement::Interior => {
                        size < 2.0
                            || (pos > 0.0
                                && pos < size - 1.0
                                && pos.fract() >= 0.04
                                && pos.fract() <= 0.96)
                    }
                    Placement::Borders => [-1.0, 0.0, size - 1.0, size]
                        .iter()
                        .any(|&b| (pos - b).abs() <= eps),
                    Placement::Integers => d.fract() == 0.0 && d.abs() <= 2.0,
                    Placement::FarOutside => pos <= -3.0 || pos >= size + 3.0,
                    Placement::Mixed => true,
                };
                assert!(ok, "{placement:?}: position {pos} on an axis of {size}");
            }
        }
        assert!(seen > 100, "{placement:?}: only {seen} samples");
    }
}

/// Our fast path, forward and every gradient, as a downstream kernel under test.
fn fast_all(p: &Problem<f32>) -> (Array4<f32>, deformconv::Grads<f32>) {
    let m = p.mask.as_ref().map(|m| m.view());
    let b = p.bias.as_ref().map(|b| b.view());
    let out = deformconv::deform_conv2d(
        p.input.view(),
        p.offset.view(),
        m,
        p.weight.view(),
        b,
        &p.params,
    )
    .unwrap();
    let mut want = deformconv::Want::ALL;
    want.mask = p.mask.is_some();
    want.bias = p.bias.is_some();
    let grads = deformconv::deform_conv2d_backward(
        p.grad_out.view(),
        p.input.view(),
        p.offset.view(),
        m,
        p.weight.view(),
        &p.params,
        want,
    )
    .unwrap();
    (out, grads)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The multi-output check takes owned arrays and a `Grads`, and composes with `?`.
    #[test]
    fn check_takes_owned_results_and_grads(p in problems::<f32>()) {
        let (out, grads) = fast_all(&p);
        p.check([(Output::Out, out)])?;
        p.check_grads(&grads)?;
    }

    #[test]
    fn symmetric_interior_problems_pass_too(
        p in problems_with::<f32>(Limits::default().symmetric_padding().placement(Placement::Interior))
    ) {
        let (out, grads) = fast_all(&p);
        p.check([(Output::Out, out)])?;
        p.check_grads(&grads)?;
    }
}

#[test]
fn check_fails_with_the_report_on_a_wrong_gradient() {
    let mut runner = TestRunner::deterministic();
    let p = problems_with::<f32>(Limits::default().mask(Presence::Always))
        .new_tree(&mut runner)
        .unwrap()
        .current();
    let (_, mut grads) = fast_all(&p);
    grads.mask.as_mut().unwrap()[[0, 0, 0, 0]] += 0.25;
    match p.check_grads(&grads) {
        Err(proptest::test_runner::TestCaseError::Fail(msg)) => {
            let msg = msg.message().to_string();
            assert!(msg.contains("grad_mask"), "{msg}");
            assert!(msg.contains("FAIL"), "{msg}");
        }
        other => panic!("expected a failure, got {other:?}"),
    }
}

/// The re-exported `ndarray` is the one the API takes.
#[test]
fn ndarray_is_reexported() {
    let a: deformconv::ndarray::Array4<f32> = deformconv::ndarray::Array4::zeros((1, 1, 2, 2));
    let w = deformconv::ndarray::Array4::<f32>::ones((1, 1, 1, 1));
    let off = deformconv::ndarray::Array4::<f32>::zeros((1, 2, 2, 2));
    let out = deformconv::deform_conv2d(
        a.view(),
        off.view(),
        None,
        w.view(),
        None,
        &ConvParams::default(),
    )
    .unwrap();
    assert_eq!(out.shape(), &[1, 1, 2, 2]);
}
