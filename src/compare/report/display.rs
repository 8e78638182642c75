//! The reports as text: one table row per tensor, then the criteria and the verdict.

use std::fmt;

use super::{Report, TensorReport};
use crate::compare::STATISTICAL_MIN_ELEMENTS;

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
