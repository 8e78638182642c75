//! Algebraic properties of the reference oracle over random valid shapes and parameters
//! (stride, asymmetric padding, dilation, groups, offset groups, non-square kernels).
//!
//! Offsets are `Offsets::Mixed`: many samples sit exactly on grid points and on the `-1` / `H`
//! window edges, where the linear identities must hold too.
//!
//! Tolerances are rounding bounds, not guesses: a sum of `n` floating-point terms is off by at
//! most `n * eps * sum |terms|` (Higham's `gamma_n`), and the sum of `|terms|` of every output
//! is the forward of the absolute values, `Problem::forward_abs` (bilinear weights are >= 0).
//! A wrong or missing term shows as an error of the size of one term, orders of magnitude
//! above these bounds.

mod support;

use deformconv::reference;
use ndarray::{Array1, Array4, Zip};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use support::{dot, dot_abs, Case, Offsets, Problem, Rng};

const EPS: f64 = f64::EPSILON;

fn config() -> Config {
    Config {
        cases: 64,
        // Fixed so that CI is reproducible; change it locally to explore further.
        rng_seed: RngSeed::Fixed(0xdc0f_2024),
        ..Config::default()
    }
}

prop_compose! {
    fn spec()(
        n in 1usize..=2,
        groups in 1usize..=3,
        cin_per_group in 1usize..=2,
        cout_per_group in 1usize..=2,
        og_pick in 0usize..4,
        kernel in (1usize..=3, 1usize..=3),
        stride in (1usize..=3, 1usize..=3),
        dilation in (1usize..=2, 1usize..=2),
        (top, bottom, left, right) in (0usize..=2, 0usize..=2, 0usize..=2, 0usize..=2),
        extra in (0usize..=3, 0usize..=3),
    ) -> Case {
        let padding = deformconv::Padding { top, bottom, left, right };
        Case::from_knobs(n, groups, cin_per_group, cout_per_group, og_pick, kernel, stride,
                         dilation, padding, extra)
    }
}

/// Terms of one output element: `C_in/groups * K` products, each a 4-corner bilinear sum.
fn terms_per_output(s: &Case) -> f64 {
    (s.cin_per_group() * s.taps() * 4 + 1) as f64
}

/// Every term of `<grad_out, forward>` (and of each gradient's contraction) plus the lengths
/// of the final dot products: the `n` of the `gamma_n` bound for the adjoint identities.
fn terms_total(s: &Case) -> f64 {
    let outputs = s.out_shape().iter().product::<usize>() as f64;
    let operand: usize = [s.input_shape(), s.weight_shape(), s.mask_shape()]
        .iter()
        .map(|sh| sh.iter().product::<usize>())
        .sum();
    outputs * terms_per_output(s) + outputs + operand as f64
}

/// Asserts `|got - want| <= factor * eps * bound` elementwise.
fn assert_within(
    what: &str,
    got: &Array4<f64>,
    want: &Array4<f64>,
    bound: &Array4<f64>,
    factor: f64,
) -> Result<(), TestCaseError> {
    let mut result = Ok(());
    Zip::indexed(got)
        .and(want)
        .and(bound)
        .for_each(|idx, &g, &w, &b| {
            let tol = factor * EPS * b + f64::MIN_POSITIVE;
            if result.is_ok() && (g - w).abs() > tol {
                result = Err(TestCaseError::fail(format!(
                    "{what} at {idx:?}: {g:e} vs {w:e} (tol {tol:e})"
                )));
            }
        });
    result
}

fn assert_scalar_within(what: &str, lhs: f64, rhs: f64, tol: f64) -> Result<(), TestCaseError> {
    prop_assert!(
        (lhs - rhs).abs() <= tol,
        "{}: {:e} vs {:e} (difference {:e}, tol {:e})",
        what,
        lhs,
        rhs,
        (lhs - rhs).abs(),
        tol
    );
    Ok(())
}

fn grad_input(p: &Problem, mask: bool) -> Array4<f64> {
    reference::grad_input(
        p.grad_out.view(),
        p.offset.view(),
        mask.then(|| p.mask.view()),
        p.weight.view(),
        p.spec.input_shape(),
        &p.spec.params,
    )
    .unwrap()
}

fn grad_offset(p: &Problem, mask: bool) -> Array4<f64> {
    reference::grad_offset(
        p.grad_out.view(),
        p.input.view(),
        p.offset.view(),
        mask.then(|| p.mask.view()),
        p.weight.view(),
        &p.spec.params,
    )
    .unwrap()
}

fn grad_mask(p: &Problem) -> Array4<f64> {
    reference::grad_mask(
        p.grad_out.view(),
        p.input.view(),
        p.offset.view(),
        p.weight.view(),
        &p.spec.params,
    )
    .unwrap()
}

fn grad_weight(p: &Problem, mask: bool) -> Array4<f64> {
    reference::grad_weight(
        p.grad_out.view(),
        p.input.view(),
        p.offset.view(),
        mask.then(|| p.mask.view()),
        p.spec.weight_shape(),
        &p.spec.params,
    )
    .unwrap()
}

proptest! {
    #![proptest_config(config())]

    /// `F(a x1 + b x2) = a F(x1) + b F(x2)` (no bias), with the bound
    /// `4 (n + 4) eps (|a| F_abs(x1) + |b| F_abs(x2))`: each forward is within `n eps` of its
    /// `|terms|`, and forming `a x1 + b x2` adds a rounding of the same scale.
    #[test]
    fn forward_is_linear_in_input(spec in spec(), seed in any::<u64>(), mask in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let mut p = Problem::random(spec, Offsets::Mixed, &mut rng);
        let (a, b) = (rng.uniform(-2.0, 2.0), rng.uniform(-2.0, 2.0));
        let x1 = p.input.clone();
        let x2 = rng.array4(spec.input_shape(), -1.0, 1.0);
        let (f1, s1) = (p.forward(mask, false), p.forward_abs(mask, false));
        p.input = x2.clone();
        let (f2, s2) = (p.forward(mask, false), p.forward_abs(mask, false));
        p.input = &x1 * a + &x2 * b;
        let f12 = p.forward(mask, false);
        let want = &f1 * a + &f2 * b;
        let bound = &s1 * a.abs() + &s2 * b.abs();
        assert_within("linearity in input", &f12, &want, &bound, 4.0 * (terms_per_output(&spec) + 4.0))?;
    }

    /// `F(a W1 + b W2) = a F(W1) + b F(W2)` (no bias), same bound as for the input.
    #[test]
    fn forward_is_linear_in_weight(spec in spec(), seed in any::<u64>(), mask in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let mut p = Problem::random(spec, Offsets::Mixed, &mut rng);
        let (a, b) = (rng.uniform(-2.0, 2.0), rng.uniform(-2.0, 2.0));
        let w1 = p.weight.clone();
        let w2 = rng.array4(spec.weight_shape(), -1.0, 1.0);
        let (f1, s1) = (p.forward(mask, false), p.forward_abs(mask, false));
        p.weight = w2.clone();
        let (f2, s2) = (p.forward(mask, false), p.forward_abs(mask, false));
        p.weight = &w1 * a + &w2 * b;
        let f12 = p.forward(mask, false);
        let want = &f1 * a + &f2 * b;
        let bound = &s1 * a.abs() + &s2 * b.abs();
        assert_within("linearity in weight", &f12, &want, &bound, 4.0 * (terms_per_output(&spec) + 4.0))?;
    }

    /// `grad_bias[o] = sum_{n, y, x} grad_out[n, o, y, x]`, summed here independently; the
    /// bound is `2 (N H_out W_out) eps sum |grad_out|`.
    #[test]
    fn grad_bias_is_the_sum_of_grad_out(spec in spec(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let p = Problem::random(spec, Offsets::Mixed, &mut rng);
        let got = reference::grad_bias(p.grad_out.view()).unwrap();
        let [n_img, c_out, ho, wo] = spec.out_shape();
        prop_assert_eq!(got.len(), c_out);
        for o in 0..c_out {
            let (mut sum, mut abs) = (0.0, 0.0);
            for n in 0..n_img {
                for y in 0..ho {
                    for x in 0..wo {
                        sum += p.grad_out[[n, o, y, x]];
                        abs += p.grad_out[[n, o, y, x]].abs();
                    }
                }
            }
            let tol = 2.0 * (n_img * ho * wo) as f64 * EPS * abs;
            assert_scalar_within(&format!("grad_bias[{o}]"), got[o], sum, tol)?;
        }
    }

    /// `<grad_out, F(x)> = <grad_input(grad_out), x>` (no bias; fixed offsets and mask): both
    /// sides sum the same terms `G * w * m * corner weight * x` in different orders, so they
    /// agree within `2 n_total eps <|G|, F_abs>`.
    #[test]
    fn grad_input_is_the_adjoint_of_the_forward(spec in spec(), seed in any::<u64>(), mask in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let p = Problem::random(spec, Offsets::Mixed, &mut rng);
        let lhs = dot(&p.grad_out, &p.forward(mask, false));
        let rhs = dot(&grad_input(&p, mask), &p.input);
        let tol = 2.0 * terms_total(&spec) * EPS * dot_abs(&p.grad_out, &p.forward_abs(mask, false));
        assert_scalar_within("input adjoint", lhs, rhs, tol)?;
    }

    /// `<grad_out, F_W(W)> = <grad_weight(grad_out), W>` (no bias), same bound.
    #[test]
    fn grad_weight_is_the_adjoint_of_the_forward(spec in spec(), seed in any::<u64>(), mask in any::<bool>()) {
        let mut rng = Rng::new(seed);
        let p = Problem::random(spec, Offsets::Mixed, &mut rng);
        let lhs = dot(&p.grad_out, &p.forward(mask, false));
        let rhs = dot(&grad_weight(&p, mask), &p.weight);
        let tol = 2.0 * terms_total(&spec) * EPS * dot_abs(&p.grad_out, &p.forward_abs(mask, false));
        assert_scalar_within("weight adjoint", lhs, rhs, tol)?;
    }

    /// The forward is linear in the mask too: `<grad_out, F(mask)> = <grad_mask(grad_out), mask>`
    /// (no bias), same bound.
    #[test]
    fn grad_mask_is_the_adjoint_of_the_forward(spec in spec(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let p = Problem::random(spec, Offsets::Mixed, &mut rng);
        let lhs = dot(&p.grad_out, &p.forward(true, false));
        let rhs = dot(&grad_mask(&p), &p.mask);
        let tol = 2.0 * terms_total(&spec) * EPS * dot_abs(&p.grad_out, &p.forward_abs(true, false));
        assert_scalar_within("mask adjoint", lhs, rhs, tol)?;
    }

    /// No mask is exactly a mask of ones (DCN v1 = DCN v2 with `m = 1`), bit for bit, for
    /// every function that takes a mask.
    #[test]
    fn no_mask_equals_a_mask_of_ones(spec in spec(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let mut p = Problem::random(spec, Offsets::Mixed, &mut rng);
        let none = (p.forward(false, true), grad_input(&p, false), grad_offset(&p, false), grad_weight(&p, false));
        p.mask = Array4::ones(spec.mask_shape());
        prop_assert_eq!(&none.0, &p.forward(true, true));
        prop_assert_eq!(&none.1, &grad_input(&p, true));
        prop_assert_eq!(&none.2, &grad_offset(&p, true));
        prop_assert_eq!(&none.3, &grad_weight(&p, true));
    }

    /// The oracle widens `f32` operands exactly and computes in `f64`: `f32` operands give bit
    /// for bit the result of the same values held in `f64`, for every function.
    #[test]
    fn f32_operands_are_widened_exactly(spec in spec(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let p64 = Problem::random(spec, Offsets::Mixed, &mut rng);
        let to32 = |a: &Array4<f64>| a.mapv(|v| v as f32);
        let (x, o, m, w, g) = (to32(&p64.input), to32(&p64.offset), to32(&p64.mask), to32(&p64.weight), to32(&p64.grad_out));
        let b: Array1<f32> = p64.bias.mapv(|v| v as f32);
        let wide = |a: &Array4<f32>| a.mapv(f64::from);
        let (xw, ow, mw, ww, gw) = (wide(&x), wide(&o), wide(&m), wide(&w), wide(&g));
        let bw = b.mapv(f64::from);
        let prm = spec.params;
        prop_assert_eq!(
            reference::deform_conv2d(x.view(), o.view(), Some(m.view()), w.view(), Some(b.view()), &prm).unwrap(),
            reference::deform_conv2d(xw.view(), ow.view(), Some(mw.view()), ww.view(), Some(bw.view()), &prm).unwrap()
        );
        prop_assert_eq!(
            reference::conv2d(x.view(), w.view(), Some(b.view()), &prm).unwrap(),
            reference::conv2d(xw.view(), ww.view(), Some(bw.view()), &prm).unwrap()
        );
        prop_assert_eq!(
            reference::grad_input(g.view(), o.view(), Some(m.view()), w.view(), spec.input_shape(), &prm).unwrap(),
            reference::grad_input(gw.view(), ow.view(), Some(mw.view()), ww.view(), spec.input_shape(), &prm).unwrap()
        );
        prop_assert_eq!(
            reference::grad_offset(g.view(), x.view(), o.view(), Some(m.view()), w.view(), &prm).unwrap(),
            reference::grad_offset(gw.view(), xw.view(), ow.view(), Some(mw.view()), ww.view(), &prm).unwrap()
        );
        prop_assert_eq!(
            reference::grad_mask(g.view(), x.view(), o.view(), w.view(), &prm).unwrap(),
            reference::grad_mask(gw.view(), xw.view(), ow.view(), ww.view(), &prm).unwrap()
        );
        prop_assert_eq!(
            reference::grad_weight(g.view(), x.view(), o.view(), Some(m.view()), spec.weight_shape(), &prm).unwrap(),
            reference::grad_weight(gw.view(), xw.view(), ow.view(), Some(mw.view()), spec.weight_shape(), &prm).unwrap()
        );
        prop_assert_eq!(reference::grad_bias(g.view()).unwrap(), reference::grad_bias(gw.view()).unwrap());
    }
}
