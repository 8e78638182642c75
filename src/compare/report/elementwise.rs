//! Comparing a result with the exact one element by element, into a [`TensorReport`].

use ndarray::{ArrayViewD, Dimension};

use super::{Criterion, TensorReport, Tolerance, Worst};
use crate::compare::Output;
use crate::error::{Error, Result};

/// `|a - e|`, with NaN/NaN and equal infinities counting as 0 and NaN against a number as
/// infinite.
fn element_error(a: f64, e: f64) -> f64 {
    if a == e || (a.is_nan() && e.is_nan()) {
        0.0
    } else {
        let d = (a - e).abs();
        if d.is_nan() {
            f64::INFINITY
        } else {
            d
        }
    }
}

/// `err / allowed`, 0 for no error, infinite when nothing (or NaN) is allowed.
fn ratio(err: f64, allowed: f64) -> f64 {
    if err == 0.0 {
        0.0
    } else if allowed > 0.0 {
        err / allowed
    } else {
        f64::INFINITY
    }
}

/// One side of a comparison: exact values and, optionally, their scales.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// The exact values.
    pub values: ArrayViewD<'a, f64>,
    /// `L * sum |terms| + P` ([`Scales::get`](crate::compare::Scales::get)).
    pub scale: Option<ArrayViewD<'a, f64>>,
    /// `sqrt(L * sum terms^2 + P2)` ([`Scales::rms`](crate::compare::Scales::rms)), for the
    /// statistical check.
    pub rms_scale: Option<ArrayViewD<'a, f64>>,
}

/// Compares `actual` with `expected` element by element under `tol`.
///
/// `scale` (`L * sum |terms| + P`, from [`error_scales`](crate::compare::error_scales)) is
/// required by [`Criterion::Bound`] and optional otherwise (it then only feeds
/// `max_bound_ratio`). Errors when the shapes differ or the bound has no scale. No statistical
/// check (see [`compare_tensor_within`] for it).
///
/// ```
/// use deformconv::compare::{compare_tensor, Output, Tolerance};
/// use ndarray::arr1;
/// let exact = arr1(&[1.0, 2.0, 3.0]).into_dyn();
/// let mine = arr1(&[1.0, 2.0 + 1e-3, 3.0]).into_dyn();
/// let tol = Tolerance::bound::<f32>().allclose(1e-5, 1e-8);
/// let r = compare_tensor(Output::Out, exact.view(), mine.view(), None, &tol).unwrap();
/// assert!(!r.passed());
/// assert_eq!(r.worst.unwrap().index, vec![1]);
/// ```
pub fn compare_tensor(
    output: Output,
    expected: ArrayViewD<'_, f64>,
    actual: ArrayViewD<'_, f64>,
    scale: Option<ArrayViewD<'_, f64>>,
    tol: &Tolerance,
) -> Result<TensorReport> {
    let expected = Expected {
        values: expected,
        scale,
        rms_scale: None,
    };
    compare_tensor_within(output, expected, None, actual, tol)
}

/// Compares `actual` with `expected` element by element under `tol`, accepting an element
/// also when it is within tolerance of `alternative` (the exact values at the sample positions
/// as the kernel's precision rounds them, see [`Oracle`](crate::compare::Oracle)); such
/// elements are counted in [`TensorReport::accepted_by_rounding`]. Each element is judged, and
/// enters the report's figures, on the side where its `error / allowed` is smaller (the exact
/// side on a tie).
///
/// The statistical figure is computed when `expected` has an rms scale: the root mean square
/// of `error / (eps * rms scale)` over the elements where it is finite (an element with an
/// error and a zero or NaN scale is left to the per-element rule).
pub fn compare_tensor_within<'a>(
    output: Output,
    expected: Expected<'a>,
    alternative: Option<Expected<'a>>,
    actual: ArrayViewD<'_, f64>,
    tol: &Tolerance,
) -> Result<TensorReport> {
    for side in std::iter::once(&expected).chain(alternative.as_ref()) {
        check_same_shape(output, "actual", actual.shape(), side.values.shape())?;
        for (what, s) in [("error scale", &side.scale), ("rms scale", &side.rms_scale)] {
            if let Some(s) = s {
                check_same_shape(output, what, s.shape(), side.values.shape())?;
            }
        }
        if tol.criterion == Criterion::Bound && side.scale.is_none() {
            return Err(Error::Param {
                name: "tolerance",
                rule: format!(
                    "the DESIGN §5 bound needs the operands (error scales) to judge {output}"
                ),
            });
        }
    }
    let bound_of = |s: f64| tol.bound_factor * tol.eps * s;
    let allowed_of = |side: &Expected<'_>, idx: &ndarray::IxDyn, e: f64| match tol.criterion {
        Criterion::Bound => bound_of(side.scale.as_ref().map_or(f64::NAN, |s| s[idx])),
        Criterion::AllClose { rtol, atol } => atol + rtol * e.abs(),
    };
    // `err` is never NaN; a NaN allowance admits only exact agreement.
    let fails = |err: f64, allowed: f64| err > 0.0 && (err > allowed || allowed.is_nan());

    let mut report = TensorReport {
        output,
        shape: expected.values.shape().to_vec(),
        max_abs_err: 0.0,
        max_rel_err: 0.0,
        worst: None,
        over_tolerance: 0,
        max_bound_ratio: expected.scale.as_ref().map(|_| 0.0),
        tolerance: *tol,
        accepted_by_rounding: 0,
        statistic: None,
    };
    let (mut sum_sq, mut counted) = (0.0f64, 0usize);
    let mut worst_key = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    for ((idx, &e0), &a) in expected.values.indexed_iter().zip(actual.iter()) {
        let err0 = element_error(a, e0);
        let allowed0 = allowed_of(&expected, &idx, e0);
        let mut side = &expected;
        let (mut e, mut err, mut allowed) = (e0, err0, allowed0);
        if let Some(alt) = &alternative {
            let e1 = alt.values[&idx];
            let err1 = element_error(a, e1);
            let allowed1 = allowed_of(alt, &idx, e1);
            if ratio(err1, allowed1) < ratio(err0, allowed0) {
                if fails(err0, allowed0) && !fails(err1, allowed1) {
                    report.accepted_by_rounding += 1;
                }
                (side, e, err, allowed) = (alt, e1, err1, allowed1);
            }
        }
        report.max_abs_err = report.max_abs_err.max(err);
        let rel = if err == 0.0 { 0.0 } else { err / e.abs() };
        report.max_rel_err = report
            .max_rel_err
            .max(if rel.is_nan() { f64::INFINITY } else { rel });
        if fails(err, allowed) {
            report.over_tolerance += 1;
        }
        if let (Some(best), Some(s)) = (report.max_bound_ratio.as_mut(), &side.scale) {
            *best = best.max(ratio(err, bound_of(s[&idx])));
        }
        if let Some(rms) = &side.rms_scale {
            let r = ratio(err, tol.eps * rms[&idx]);
            if r.is_finite() {
                sum_sq += r * r;
                counted += 1;
            }
        }
        let key = (ratio(err, allowed), err);
        if key > worst_key {
            worst_key = key;
            report.worst = Some(Worst {
                index: idx.slice().to_vec(),
                expected: e,
                actual: a,
                allowed,
            });
        }
    }
    if expected.rms_scale.is_some() && counted > 0 {
        report.statistic = Some((sum_sq / counted as f64).sqrt());
    }
    Ok(report)
}

fn check_same_shape(output: Output, what: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got == expected {
        return Ok(());
    }
    Err(Error::Param {
        name: output.name(),
        rule: format!("{what} has shape {got:?} but the expected result has shape {expected:?}"),
    })
}
