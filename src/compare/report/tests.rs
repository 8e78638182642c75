//! Unit tests of the comparison and its report.

use super::*;
use ndarray::{arr1, Array1};

fn report(expected: &[f64], actual: &[f64], scale: Option<&[f64]>) -> TensorReport {
    let (e, a) = (arr1(expected).into_dyn(), arr1(actual).into_dyn());
    let s = scale.map(|s| arr1(s).into_dyn());
    let tol = Tolerance::bound::<f32>();
    let tol = if s.is_some() {
        tol
    } else {
        tol.allclose(1e-6, 0.0)
    };
    compare_tensor(
        Output::Out,
        e.view(),
        a.view(),
        s.as_ref().map(|s| s.view()),
        &tol,
    )
    .unwrap()
}

#[test]
fn nan_and_infinities() {
    let inf = f64::INFINITY;
    // NaN/NaN and equal infinities agree; NaN against a number does not.
    let r = report(&[f64::NAN, inf, -inf], &[f64::NAN, inf, -inf], None);
    assert!(r.passed() && r.max_abs_err == 0.0);
    let r = report(&[1.0, 2.0], &[1.0, f64::NAN], None);
    assert_eq!((r.over_tolerance, r.max_abs_err), (1, inf));
    assert_eq!(r.worst.unwrap().index, vec![1]);
    // A NaN scale allows nothing but exact agreement.
    let r = report(&[1.0, 2.0], &[1.0, 2.5], Some(&[f64::NAN, f64::NAN]));
    assert_eq!(r.over_tolerance, 1);
}

#[test]
fn bound_ratio_and_worst_element() {
    let eps = f64::from(f32::EPSILON) / 2.0;
    // Allowed errors: 4 * eps * scale = 4 eps, 40 eps, 400 eps.
    let r = report(
        &[0.0, 0.0, 0.0],
        &[2.0 * eps, 60.0 * eps, 100.0 * eps],
        Some(&[1.0, 10.0, 100.0]),
    );
    assert_eq!(r.over_tolerance, 1);
    assert_eq!(r.worst.as_ref().unwrap().index, vec![1]);
    assert!((r.max_bound_ratio.unwrap() - 1.5).abs() < 1e-12);
    assert_eq!(r.max_rel_err, f64::INFINITY);
    assert!(!r.passed());
}

#[test]
fn empty_tensors_pass_and_mismatches_are_errors() {
    let r = report(&[], &[], Some(&[]));
    assert!(r.passed() && r.worst.is_none() && r.elements() == 0);
    let e = Array1::<f64>::zeros(2).into_dyn();
    let a = Array1::<f64>::zeros(3).into_dyn();
    let tol = Tolerance::bound::<f64>().allclose(0.0, 0.0);
    assert!(compare_tensor(Output::Out, e.view(), a.view(), None, &tol).is_err());
    let tol = Tolerance::bound::<f64>();
    assert!(compare_tensor(Output::Out, e.view(), e.view(), None, &tol).is_err());
}
