//! Element-by-element comparison of a result with the exact one, and its report.

use std::fmt;

use ndarray::{ArrayViewD, Dimension};

use super::{
    Output, Precision, DEFAULT_BOUND_FACTOR, DEFAULT_STATISTICAL_LIMIT, STATISTICAL_MIN_ELEMENTS,
};
use crate::error::{Error, Result};
use crate::float::Float;

/// The pass rule for one element with error `err = |actual - expected|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Criterion {
    /// DESIGN §5: `err <= c * eps * scale`, `scale = L * sum |terms| + P` from
    /// [`error_scales`](super::error_scales).
    Bound,
    /// `numpy.allclose`: `err <= atol + rtol * |expected|`.
    AllClose {
        /// Relative tolerance.
        rtol: f64,
        /// Absolute tolerance.
        atol: f64,
    },
}

/// What counts as close: the criterion, and the bound's `c` and `eps` (used by
/// [`Criterion::Bound`] and, whatever the criterion, for the reported ratio to the bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// The pass rule.
    pub criterion: Criterion,
    /// `c` of the bound.
    pub bound_factor: f64,
    /// Unit round-off of the precision the compared result was computed in.
    pub eps: f64,
    /// The statistical check's limit on the RMS of `error / (eps * rms scale)` over a tensor
    /// ([`TensorReport::statistic`]); `None` turns the check off.
    pub statistical_limit: Option<f64>,
}

impl Tolerance {
    /// The DESIGN §5 bound for results computed in `T`, with `c = DEFAULT_BOUND_FACTOR`.
    pub fn bound<T: Float>() -> Self {
        Self::bound_eps(T::EPSILON)
    }

    /// The DESIGN §5 bound for unit round-off `eps`, with `c = DEFAULT_BOUND_FACTOR`.
    pub fn bound_eps(eps: f64) -> Self {
        Tolerance {
            criterion: Criterion::Bound,
            bound_factor: DEFAULT_BOUND_FACTOR,
            eps,
            statistical_limit: Some(DEFAULT_STATISTICAL_LIMIT),
        }
    }

    /// The DESIGN §5 bound and the statistical check for results computed in `precision`
    /// (`eps` = its unit round-off, see [`Precision`]).
    pub fn precision(precision: Precision) -> Self {
        Self::bound_eps(precision.unit_roundoff())
    }

    /// The same rule with the statistical check's limit set (`None`: no statistical check).
    pub fn statistical_limit(self, limit: Option<f64>) -> Self {
        Tolerance {
            statistical_limit: limit,
            ..self
        }
    }

    /// The same `c` and `eps` (for the reported bound ratio) but `numpy.allclose`'s rule,
    /// without the statistical check (its figure is still reported when scales are given).
    pub fn allclose(self, rtol: f64, atol: f64) -> Self {
        Tolerance {
            criterion: Criterion::AllClose { rtol, atol },
            statistical_limit: None,
            ..self
        }
    }

    /// The same rule with `c = bound_factor`.
    pub fn bound_factor(self, bound_factor: f64) -> Self {
        Tolerance {
            bound_factor,
            ..self
        }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.criterion {
            Criterion::Bound => write!(
                f,
                "|actual - expected| <= {} * {} * (L * sum|terms| + P) (DESIGN §5 bound)",
                self.bound_factor,
                eps_name(self.eps)
            ),
            Criterion::AllClose { rtol, atol } => {
                write!(f, "|actual - expected| <= {atol:e} + {rtol:e} * |expected|")
            }
        }
    }
}

fn eps_name(eps: f64) -> String {
    match Precision::ALL
        .into_iter()
        .find(|p| p.unit_roundoff() == eps)
    {
        Some(p) => format!("2^-{}", p.significand_bits()),
        None => format!("{eps:e}"),
    }
}

/// The element that is furthest over (or nearest to) its allowed error.
#[derive(Debug, Clone, PartialEq)]
pub struct Worst {
    /// Its index.
    pub index: Vec<usize>,
    /// The exact value.
    pub expected: f64,
    /// The compared value.
    pub actual: f64,
    /// The error the criterion allows there.
    pub allowed: f64,
}

/// How one result tensor compares with the exact one.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorReport {
    /// Which result.
    pub output: Output,
    /// Its shape.
    pub shape: Vec<usize>,
    /// `max |actual - expected|` (NaN against a number counts as infinite; NaN against NaN
    /// and equal infinities as 0).
    pub max_abs_err: f64,
    /// `max |actual - expected| / |expected|` (infinite where `expected == 0 != actual`).
    pub max_rel_err: f64,
    /// The element with the largest `error / allowed`; `None` for an empty tensor.
    pub worst: Option<Worst>,
    /// Elements whose error exceeds what the criterion allows.
    pub over_tolerance: usize,
    /// `max error / (c * eps * scale)`, when scales were given: at most 1 means every element
    /// is within the DESIGN §5 bound.
    pub max_bound_ratio: Option<f64>,
    /// The rule applied.
    pub tolerance: Tolerance,
    /// Elements over tolerance against the exact value but within it against the value at the
    /// sample positions as a kernel of the declared precision rounds them (a sample on the
    /// other side of an integer or window edge): accepted, see [`Oracle`](super::Oracle).
    pub accepted_by_rounding: usize,
    /// The statistical check: the root mean square, over the elements with a finite ratio, of
    /// `error / (eps * rms scale)` ([`Scales::rms`](super::Scales::rms)); `None` without rms
    /// scales or elements.
    pub statistic: Option<f64>,
}

impl TensorReport {
    /// Whether every element is within tolerance and the statistical check passes.
    pub fn passed(&self) -> bool {
        self.bound_passed() && self.statistical_passed()
    }

    /// Whether every element is within tolerance (the per-element rule alone).
    pub fn bound_passed(&self) -> bool {
        self.over_tolerance == 0
    }

    /// Whether the statistical check passes: true when it does not apply (no limit, no rms
    /// scale, or fewer than [`STATISTICAL_MIN_ELEMENTS`](super::STATISTICAL_MIN_ELEMENTS)
    /// elements), else `statistic <= limit`.
    pub fn statistical_passed(&self) -> bool {
        match (self.statistic, self.tolerance.statistical_limit) {
            (Some(s), Some(limit)) if self.elements() >= STATISTICAL_MIN_ELEMENTS => s <= limit,
            _ => true,
        }
    }

    /// Elements compared.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

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
    /// `L * sum |terms| + P` ([`Scales::get`](super::Scales::get)).
    pub scale: Option<ArrayViewD<'a, f64>>,
    /// `sqrt(L * sum terms^2 + P2)` ([`Scales::rms`](super::Scales::rms)), for the statistical
    /// check.
    pub rms_scale: Option<ArrayViewD<'a, f64>>,
}

/// Compares `actual` with `expected` element by element under `tol`.
///
/// `scale` (`L * sum |terms| + P`, from [`error_scales`](super::error_scales)) is required by
/// [`Criterion::Bound`] and optional otherwise (it then only feeds `max_bound_ratio`). Errors
/// when the shapes differ or the bound has no scale. No statistical check (see
/// [`compare_tensor_within`] for it).
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
/// as the kernel's precision rounds them, see [`Oracle`](super::Oracle)); such elements are
/// counted in [`TensorReport::accepted_by_rounding`]. Each element is judged, and enters the
/// report's figures, on the side where its `error / allowed` is smaller (the exact side on a
/// tie).
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

/// The comparison of every result tensor of one problem.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// One entry per compared result, in report order.
    pub tensors: Vec<TensorReport>,
    /// Samples whose exact position and the position as the declared precision forms it lie
    /// on different sides of an integer or window edge (see [`Oracle`](super::Oracle)); 0 when
    /// not looked at.
    pub ambiguous_samples: usize,
}

impl Report {
    /// The overall verdict: every element of every tensor within tolerance
    /// ([`bound_passed`](Self::bound_passed)) and every tensor's statistical check passed
    /// ([`statistical_passed`](Self::statistical_passed)).
    pub fn passed(&self) -> bool {
        self.tensors.iter().all(TensorReport::passed)
    }

    /// Whether every element of every tensor is within tolerance.
    pub fn bound_passed(&self) -> bool {
        self.tensors.iter().all(TensorReport::bound_passed)
    }

    /// Whether every tensor passes the statistical check.
    pub fn statistical_passed(&self) -> bool {
        self.tensors.iter().all(TensorReport::statistical_passed)
    }

    /// The report of `output`, if it was compared.
    pub fn get(&self, output: Output) -> Option<&TensorReport> {
        self.tensors.iter().find(|t| t.output == output)
    }
}

const HEADER: [&str; 11] = [
    "tensor",
    "shape",
    "max abs err",
    "max rel err",
    "worst index",
    "expected",
    "actual",
    "over tol",
    "err/bound",
    "by rounding",
    "rms stat",
];

fn row(t: &TensorReport) -> [String; 11] {
    let (index, expected, actual) = match &t.worst {
        Some(w) => (
            format!("{:?}", w.index),
            format!("{:.9e}", w.expected),
            format!("{:.9e}", w.actual),
        ),
        None => ("-".into(), "-".into(), "-".into()),
    };
    [
        t.output.name().into(),
        format!("{:?}", t.shape),
        format!("{:.3e}", t.max_abs_err),
        format!("{:.3e}", t.max_rel_err),
        index,
        expected,
        actual,
        format!("{}/{}", t.over_tolerance, t.elements()),
        t.max_bound_ratio
            .map_or("n/a".into(), |r| format!("{r:.3e}")),
        t.accepted_by_rounding.to_string(),
        match (t.statistic, t.statistical_passed()) {
            (None, _) => "n/a".into(),
            (Some(s), true) => format!("{s:.3e}"),
            (Some(s), false) => format!("{s:.3e} FAIL"),
        },
    ]
}

fn write_table(f: &mut fmt::Formatter<'_>, tensors: &[TensorReport]) -> fmt::Result {
    let rows: Vec<[String; 11]> = tensors.iter().map(row).collect();
    let mut widths = HEADER.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |f: &mut fmt::Formatter<'_>, cells: &[&str]| -> fmt::Result {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            text.push_str(&format!("{cell:<w$}"));
        }
        writeln!(f, "{}", text.trim_end())
    };
    line(f, &HEADER)?;
    for r in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        line(f, &cells)?;
    }
    Ok(())
}

impl fmt::Display for TensorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_table(f, std::slice::from_ref(self))?;
        write!(f, "criterion: {}", self.tolerance)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_table(f, &self.tensors)?;
        let mut rules: Vec<String> = self
            .tensors
            .iter()
            .map(|t| t.tolerance.to_string())
            .collect();
        rules.dedup();
        for rule in rules {
            writeln!(f, "criterion: {rule}")?;
        }
        let limits: Vec<f64> = self
            .tensors
            .iter()
            .filter_map(|t| t.tolerance.statistical_limit)
            .collect();
        if let Some(limit) = limits.first() {
            writeln!(
                f,
                "statistical check: rms of error / (eps * sqrt(L * sum terms^2 + P2)) <= {limit} (tensors of {STATISTICAL_MIN_ELEMENTS}+ elements)"
            )?;
        }
        let accepted: usize = self.tensors.iter().map(|t| t.accepted_by_rounding).sum();
        if self.ambiguous_samples > 0 || accepted > 0 {
            writeln!(
                f,
                "positions within rounding: {} sample(s) on either side of an integer or edge; {accepted} element(s) accepted at the rounded positions",
                self.ambiguous_samples
            )?;
        }
        let stat_failed: Vec<&str> = self
            .tensors
            .iter()
            .filter(|t| t.bound_passed() && !t.statistical_passed())
            .map(|t| t.output.name())
            .collect();
        let failed: Vec<&str> = self
            .tensors
            .iter()
            .filter(|t| !t.bound_passed())
            .map(|t| t.output.name())
            .collect();
        if failed.is_empty() && !stat_failed.is_empty() {
            write!(
                f,
                "FAIL (statistical): every element within tolerance, but the error profile of {} is beyond a correctly rounded kernel of this precision",
                stat_failed.join(", ")
            )
        } else if failed.is_empty() {
            write!(
                f,
                "PASS: every element of {} tensor(s) within tolerance",
                self.tensors.len()
            )
        } else {
            let over: usize = self.tensors.iter().map(|t| t.over_tolerance).sum();
            write!(
                f,
                "FAIL: {over} element(s) over tolerance in {} of {} tensor(s): {}",
                failed.len(),
                self.tensors.len(),
                failed.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
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
}
