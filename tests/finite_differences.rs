//! Every reference gradient against central finite differences of the reference forward.
//!
//! The scalar checked is `L = <grad_out, forward(...)>`, whose derivative with respect to any
//! operand element is exactly what the gradient functions return. Each element of each operand
//! is perturbed by `±H` and `(L(+) - L(-)) / (2H)` is compared with the analytic value.
//!
//! Sample positions are kept at least 0.1 from integer rows and columns (offsets with
//! fractional parts in `[0.1, 0.9]`; the undeformed grid is integer), so a `±1e-6` step never
//! crosses a bilinear cell boundary, the `<= -1` / `>= H` window edges, or a kink of the
//! derivative. Inside one cell the forward is *linear* in each single operand element (input,
//! weight, mask, bias, and one offset coordinate: `B` is linear in `ly` for fixed `lx`), so the
//! central difference has no truncation error at all; only rounding remains.

mod support;

use deformconv::reference;
use ndarray::Array4;
use support::{dot, dot_abs, Case, Offsets, Problem, Rng};

const SEEDS: u64 = 24;
const H: f64 = 1e-6;

/// Rounding bound for one central difference. `L` is a sum of at most a few thousand terms
/// whose absolute values add up to `A = <|grad_out|, forward(|input|, |mask|, |weight|, |bias|)>`;
/// each evaluation of `L` is off by at most `n * eps * A` in the worst case and by about
/// `sqrt(n) * eps * A` in practice, and the difference divides by `2H`. With `n <= 10^4`,
/// `100 * eps * A / H` (about `2e-8 * A`) sits between the two: far above what rounding gives
/// (measured worst over these seeds: `0.17 * eps * A / H`), far below any real error (a wrong term shows as
/// a missing `grad_out * weight * mask * pixel`, of order 0.01 to 1 here).
fn tolerance(p: &Problem, mask: bool, bias: bool) -> f64 {
    let a = dot_abs(&p.grad_out, &p.forward_abs(mask, bias));
    100.0 * f64::EPSILON * a.max(1.0) / H
}

fn loss(p: &Problem, mask: bool) -> f64 {
    dot(&p.grad_out, &p.forward(mask, true))
}

/// Central difference of `loss` in element `idx` of the operand `select` picks, with the
/// step actually taken (`(x + H) - (x - H)` rounded) as the divisor.
fn central_difference(
    p: &mut Problem,
    select: fn(&mut Problem) -> &mut Array4<f64>,
    idx: (usize, usize, usize, usize),
    mask: bool,
) -> f64 {
    let orig = select(p)[idx];
    let (up, down) = (orig + H, orig - H);
    select(p)[idx] = up;
    let plus = loss(p, mask);
    select(p)[idx] = down;
    let minus = loss(p, mask);
    select(p)[idx] = orig;
    (plus - minus) / (up - down)
}

/// Compares every element of `analytic` with the central difference of the operand
/// `select` picks, and returns the largest analytic magnitude seen (so that callers can check
/// the test was not vacuous).
fn check_every_element(
    what: &str,
    p: &mut Problem,
    analytic: &Array4<f64>,
    select: fn(&mut Problem) -> &mut Array4<f64>,
    mask: bool,
) -> f64 {
    let tol = tolerance(p, mask, true);
    assert_eq!(analytic.shape(), select(p).shape(), "{what}: shape");
    let mut largest = 0.0f64;
    for (idx, &want) in analytic.indexed_iter() {
        let fd = central_difference(p, select, idx, mask);
        assert!(
            (fd - want).abs() <= tol,
            "{what} at {idx:?}: analytic {want:e}, central difference {fd:e} (tol {tol:e}), spec {:?}",
            p.spec
        );
        largest = largest.max(want.abs());
    }
    largest
}

/// Runs `check` on the problem of every seed, with and without a mask when `both_masks`.
fn for_each_problem(both_masks: bool, mut check: impl FnMut(&mut Problem, bool, u64) -> f64) {
    let mut largest = 0.0f64;
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let spec = Case::random(&mut rng);
        let mut p = Problem::random(spec, Offsets::AwayFromIntegers, &mut rng);
        for mask in [true, false] {
            if mask || both_masks {
                largest = largest.max(check(&mut p, mask, seed));
            }
        }
    }
    assert!(
        largest > 0.1,
        "gradients were all (near) zero: vacuous test"
    );
}

#[test]
fn grad_input_matches_central_differences() {
    for_each_problem(true, |p, mask, seed| {
        let g = reference::grad_input(
            p.grad_out.view(),
            p.offset.view(),
            mask.then(|| p.mask.view()),
            p.weight.view(),
            p.spec.input_shape(),
            &p.spec.params,
        )
        .unwrap();
        let what = format!("seed {seed} mask {mask}: grad_input");
        check_every_element(&what, p, &g, |p| &mut p.input, mask)
    });
}

#[test]
fn grad_offset_matches_central_differences() {
    for_each_problem(true, |p, mask, seed| {
        let g = reference::grad_offset(
            p.grad_out.view(),
            p.input.view(),
            p.offset.view(),
            mask.then(|| p.mask.view()),
            p.weight.view(),
            &p.spec.params,
        )
        .unwrap();
        let what = format!("seed {seed} mask {mask}: grad_offset");
        check_every_element(&what, p, &g, |p| &mut p.offset, mask)
    });
}

#[test]
fn grad_mask_matches_central_differences() {
    for_each_problem(false, |p, _, seed| {
        let g = reference::grad_mask(
            p.grad_out.view(),
            p.input.view(),
            p.offset.view(),
            p.weight.view(),
            &p.spec.params,
        )
        .unwrap();
        let what = format!("seed {seed}: grad_mask");
        check_every_element(&what, p, &g, |p| &mut p.mask, true)
    });
}

#[test]
fn grad_weight_matches_central_differences() {
    for_each_problem(true, |p, mask, seed| {
        let g = reference::grad_weight(
            p.grad_out.view(),
            p.input.view(),
            p.offset.view(),
            mask.then(|| p.mask.view()),
            p.spec.weight_shape(),
            &p.spec.params,
        )
        .unwrap();
        let what = format!("seed {seed} mask {mask}: grad_weight");
        check_every_element(&what, p, &g, |p| &mut p.weight, mask)
    });
}

#[test]
fn grad_bias_matches_central_differences() {
    for_each_problem(true, |p, mask, seed| {
        let g = reference::grad_bias(p.grad_out.view()).unwrap();
        let tol = tolerance(p, mask, true);
        let mut largest = 0.0f64;
        for o in 0..g.len() {
            let orig = p.bias[o];
            let (up, down) = (orig + H, orig - H);
            p.bias[o] = up;
            let plus = loss(p, mask);
            p.bias[o] = down;
            let minus = loss(p, mask);
            p.bias[o] = orig;
            let fd = (plus - minus) / (up - down);
            assert!(
                (fd - g[o]).abs() <= tol,
                "seed {seed} mask {mask}: grad_bias[{o}] analytic {:e}, central difference {fd:e}",
                g[o]
            );
            largest = largest.max(g[o].abs());
        }
        largest
    });
}

/// The problems above are only a meaningful check of the window rule if some samples straddle
/// the image border (partly outside: a corner reads 0) and some are entirely outside.
#[test]
fn problems_cover_samples_partly_and_fully_outside() {
    let (mut inside, mut partly, mut outside) = (0, 0, 0);
    for seed in 0..SEEDS {
        let mut rng = Rng::new(seed);
        let spec = Case::random(&mut rng);
        let p = Problem::random(spec, Offsets::AwayFromIntegers, &mut rng);
        let (h, w) = (spec.h as f64, spec.w as f64);
        for (py, px) in p.sample_positions() {
            let near = (py - py.round()).abs().min((px - px.round()).abs());
            assert!(
                near >= 0.1 - 1e-12,
                "sample ({py}, {px}) too close to an integer"
            );
            if py <= -1.0 || py >= h || px <= -1.0 || px >= w {
                outside += 1;
            } else if py < 0.0 || py > h - 1.0 || px < 0.0 || px > w - 1.0 {
                partly += 1;
            } else {
                inside += 1;
            }
        }
    }
    assert!(
        inside > 100 && partly > 100 && outside > 100,
        "inside {inside}, partly outside {partly}, outside {outside}"
    );
}
