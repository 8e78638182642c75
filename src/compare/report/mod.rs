//! Element-by-element comparison of a result with the exact one, and its report.

use crate::compare::{Output, STATISTICAL_MIN_ELEMENTS};

// The pass rule (`tolerance`); the element-by-element comparison that fills a `TensorReport`
// (`elementwise`); the reports themselves (here) and their text table (`display`).
mod display;
mod elementwise;
mod tolerance;

#[cfg(test)]
mod tests;

pub use elementwise::{compare_tensor, compare_tensor_within, Expected};
pub use tolerance::{Criterion, Tolerance};

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
    /// other side of an integer or window edge): accepted, see
    /// [`Oracle`](crate::compare::Oracle).
    pub accepted_by_rounding: usize,
    /// The statistical check: the root mean square, over the elements with a finite ratio, of
    /// `error / (eps * rms scale)` ([`Scales::rms`](crate::compare::Scales::rms)); `None` without
    /// rms scales or elements.
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
    /// scale, or fewer than [`STATISTICAL_MIN_ELEMENTS`] elements), else `statistic <= limit`.
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

/// The comparison of every result tensor of one problem.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// One entry per compared result, in report order.
    pub tensors: Vec<TensorReport>,
    /// Samples whose exact position and the position as the declared precision forms it lie
    /// on different sides of an integer or window edge (see [`Oracle`](crate::compare::Oracle));
    /// 0 when not looked at.
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
