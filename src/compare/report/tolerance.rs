//! The pass rule for an element: [`Criterion`] and [`Tolerance`].

use std::fmt;

use crate::compare::{Precision, DEFAULT_BOUND_FACTOR, DEFAULT_STATISTICAL_LIMIT};
use crate::float::Float;

/// The pass rule for one element with error `err = |actual - expected|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Criterion {
    /// DESIGN §5: `err <= c * eps * scale`, `scale = L * sum |terms| + P` from
    /// [`error_scales`](crate::compare::error_scales).
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
    /// ([`TensorReport::statistic`](super::TensorReport::statistic)); `None` turns the check off.
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
