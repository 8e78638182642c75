//! Positions within rounding, and the [`Oracle`] that judges a kernel's results with them.

use std::collections::BTreeMap;

use ndarray::{Array4, ArrayD, ArrayViewD};

use super::report::{compare_tensor_within, Expected, Report, TensorReport, Tolerance};
use super::{error_scales_for, Operands, Output, Precision, Scales, DEFAULT_BOUND_FACTOR};
use crate::error::{Error, Result};
use crate::geometry::Geometry;
use crate::reference;

/// How an [`Oracle`] judges.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// The precision the kernel under test computes in (default `F32`).
    pub precision: Precision,
    /// Keep the exact positions everywhere: no alternative at rounded positions.
    pub strict_positions: bool,
    /// `c` of the bound (default [`DEFAULT_BOUND_FACTOR`]).
    pub bound_factor: f64,
    /// The statistical check's limit (default
    /// [`DEFAULT_STATISTICAL_LIMIT`](super::DEFAULT_STATISTICAL_LIMIT)); `None` turns it off.
    pub statistical_limit: Option<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            precision: Precision::F32,
            strict_positions: false,
            bound_factor: DEFAULT_BOUND_FACTOR,
            statistical_limit: Some(super::DEFAULT_STATISTICAL_LIMIT),
        }
    }
}

impl Options {
    /// The default options for `precision`.
    pub fn precision(precision: Precision) -> Self {
        Options {
            precision,
            ..Options::default()
        }
    }

    /// The same options with `strict_positions` set.
    pub fn strict_positions(self, strict: bool) -> Self {
        Options {
            strict_positions: strict,
            ..self
        }
    }

    /// The tolerance these options give.
    pub fn tolerance(&self) -> Tolerance {
        Tolerance::precision(self.precision)
            .bound_factor(self.bound_factor)
            .statistical_limit(self.statistical_limit)
    }
}

/// The sample positions as a kernel of `precision` forms them, where that matters.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundedPositions {
    /// The offsets with every *ambiguous* coordinate replaced by `position - base`, where
    /// `position` = [`Precision::position`]`(base, d)`; every other coordinate unchanged.
    pub offset: Array4<f64>,
    /// Samples with at least one ambiguous coordinate.
    pub samples: usize,
}

/// The coordinates (`base + d`, `base = out * stride - pad + tap * dil`) whose exact value `p`
/// and rounded value `q = precision.position(base, d)` are on different sides of an integer,
/// or of which one is an integer and the other not: `floor(p) != floor(q)` or
/// `(p is an integer) != (q is an integer)`. Every window edge of every convention (`-1`, `0`,
/// `H - 1`, `H`) is an integer, so this covers them all. NaN and infinite positions are never
/// ambiguous. Returns `None` when no coordinate is.
///
/// `p` is handled exactly (as the reference does: `base + floor(d)` and the fraction of `d`);
/// `q - base` is exact in `f64` for every position a kernel can address.
pub fn rounded_positions(
    ops: &Operands<'_>,
    precision: Precision,
) -> Result<Option<RoundedPositions>> {
    let g = Geometry::new(
        dims(ops.input.shape()),
        dims(ops.weight.shape()),
        &ops.params,
    )?;
    g.check_offset(ops.offset.shape())?;
    let mut offset = ops.offset.to_owned();
    let mut samples = 0;
    let ambiguous = |base: i128, d: f64| -> Option<f64> {
        if !d.is_finite() {
            return None;
        }
        let (whole, d_int) = (base as f64 + d.floor(), d.fract() == 0.0);
        let q = precision.position(base as f64, d);
        if !q.is_finite() {
            return None;
        }
        let differs = whole != q.floor() || d_int != (q.fract() == 0.0);
        differs.then_some(q - base as f64)
    };
    for n in 0..g.n {
        for s in 0..g.offset_groups * g.taps() {
            let k = s % g.taps();
            let (i, j) = (k / g.kw, k % g.kw);
            for y in 0..g.h_out {
                for x in 0..g.w_out {
                    let by = y as i128 * g.stride_h as i128 - g.pad_top as i128
                        + i as i128 * g.dil_h as i128;
                    let bx = x as i128 * g.stride_w as i128 - g.pad_left as i128
                        + j as i128 * g.dil_w as i128;
                    let (iy, ix) = ([n, 2 * s, y, x], [n, 2 * s + 1, y, x]);
                    let ay = ambiguous(by, offset[iy]);
                    let ax = ambiguous(bx, offset[ix]);
                    if let Some(d) = ay {
                        offset[iy] = d;
                    }
                    if let Some(d) = ax {
                        offset[ix] = d;
                    }
                    samples += usize::from(ay.is_some() || ax.is_some());
                }
            }
        }
    }
    Ok((samples > 0).then_some(RoundedPositions { offset, samples }))
}

fn dims(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// The exact (reference) value of every result the operands define: `out`, and with
/// `grad_out` every gradient (`grad_mask` with a mask, `grad_bias` with a bias).
pub fn exact_results(ops: &Operands<'_>) -> Result<BTreeMap<Output, ArrayD<f64>>> {
    let mut out = BTreeMap::new();
    for output in Output::ALL {
        if let Some(value) = exact_result(ops, output)? {
            out.insert(output, value);
        }
    }
    Ok(out)
}

/// The exact (reference) value of `output`, or `None` where the operands do not define it (a
/// gradient without `grad_out`, `grad_mask` without a mask, `grad_bias` without a bias).
pub fn exact_result(ops: &Operands<'_>, output: Output) -> Result<Option<ArrayD<f64>>> {
    let p = &ops.params;
    let (x, off, m, w) = (ops.input, ops.offset, ops.mask, ops.weight);
    let go = match (output, ops.grad_out) {
        (Output::Out, _) => {
            return Ok(Some(
                reference::deform_conv2d(x, off, m, w, ops.bias, p)?.into_dyn(),
            ))
        }
        (_, None) => return Ok(None),
        (_, Some(go)) => go,
    };
    let (is, ws) = (dims(x.shape()), dims(w.shape()));
    Ok(Some(match output {
        Output::GradInput => reference::grad_input(go, off, m, w, is, p)?.into_dyn(),
        Output::GradOffset => reference::grad_offset(go, x, off, m, w, p)?.into_dyn(),
        Output::GradMask if m.is_some() => reference::grad_mask(go, x, off, w, p)?.into_dyn(),
        Output::GradWeight => reference::grad_weight(go, x, off, m, ws, p)?.into_dyn(),
        Output::GradBias if ops.bias.is_some() => reference::grad_bias(go)?.into_dyn(),
        _ => return Ok(None),
    }))
}

/// The values and scales at the rounded positions.
#[derive(Debug, Clone)]
struct Alternative {
    exact: BTreeMap<Output, ArrayD<f64>>,
    scales: Scales,
    samples: usize,
}

/// Judges a kernel's results for one problem: the per-element DESIGN §5 bound with positions
/// within rounding, and the statistical check, for a declared [`Precision`].
///
/// **Positions within rounding.** A kernel of precision `P` forms each sample position
/// `base + d` rounded ([`Precision::position`]). Where the exact position and the rounded one
/// fall on different sides of an integer or a window edge, or one is on it and the other not
/// ([`rounded_positions`]), the results jump (`grad_offset`'s one-sided derivative at every
/// integer; under mmcv and DCN v1 also values at their window edges): neither side is wrong,
/// the position is only known to `P`'s rounding. The oracle then also computes every result
/// with those coordinates at their rounded value (the reference on the
/// [`RoundedPositions::offset`]) and its scales, and accepts an element within tolerance of
/// either (it is judged on the side where `error / allowed` is smaller). Why not widen the
/// bound by the jump instead: a widened bound would also accept values *between* the two
/// sides, and a kernel taking a wrong, third value there; the either-side rule accepts only
/// what some rounding of the position produces. Positions exactly on an integer in both keep
/// the contract's one-sided rule (the golden cases pin it), and clearly non-integer positions
/// are never ambiguous, so a kernel taking the wrong side there still fails.
/// [`Options::strict_positions`] keeps the exact positions everywhere.
pub struct Oracle {
    tol: Tolerance,
    scales: Scales,
    alternative: Option<Alternative>,
}

impl Oracle {
    /// Computes the scales (and, unless `strict_positions`, the values and scales at the
    /// rounded positions when some sample is ambiguous) for `ops`.
    pub fn new(ops: &Operands<'_>, options: &Options) -> Result<Oracle> {
        let scales = error_scales_for(ops, options.precision)?;
        let alternative = if options.strict_positions {
            None
        } else {
            match rounded_positions(ops, options.precision)? {
                None => None,
                Some(r) => {
                    let alt_ops = Operands {
                        offset: r.offset.view(),
                        ..*ops
                    };
                    Some(Alternative {
                        exact: exact_results(&alt_ops)?,
                        scales: error_scales_for(&alt_ops, options.precision)?,
                        samples: r.samples,
                    })
                }
            }
        };
        Ok(Oracle {
            tol: options.tolerance(),
            scales,
            alternative,
        })
    }

    /// The rule applied.
    pub fn tolerance(&self) -> &Tolerance {
        &self.tol
    }

    /// The scales at the exact positions.
    pub fn scales(&self) -> &Scales {
        &self.scales
    }

    /// Samples with a coordinate on the other side of an integer or edge once rounded.
    pub fn ambiguous_samples(&self) -> usize {
        self.alternative.as_ref().map_or(0, |a| a.samples)
    }

    /// The exact value of `output` at the rounded positions, when some sample is ambiguous.
    pub fn rounded_value(&self, output: Output) -> Option<ArrayViewD<'_, f64>> {
        self.alternative
            .as_ref()
            .and_then(|a| a.exact.get(&output))
            .map(|a| a.view())
    }

    /// Compares `actual` with `expected` (the exact `output`, e.g. from [`exact_results`] or
    /// a file written by `deformconv run --exact`).
    pub fn compare(
        &self,
        output: Output,
        expected: ArrayViewD<'_, f64>,
        actual: ArrayViewD<'_, f64>,
    ) -> Result<TensorReport> {
        let missing = || Error::Param {
            name: output.name(),
            rule: "is not defined by the operands (no grad_out, mask or bias)".into(),
        };
        let exact = Expected {
            values: expected,
            scale: Some(self.scales.get(output).ok_or_else(missing)?),
            rms_scale: self.scales.rms(output),
        };
        let alternative = match &self.alternative {
            None => None,
            Some(a) => Some(Expected {
                values: a.exact.get(&output).ok_or_else(missing)?.view(),
                scale: a.scales.get(output),
                rms_scale: a.scales.rms(output),
            }),
        };
        compare_tensor_within(output, exact, alternative, actual, &self.tol)
    }

    /// Compares every `(output, expected, actual)` triple into one report.
    pub fn report(
        &self,
        results: &[(Output, ArrayViewD<'_, f64>, ArrayViewD<'_, f64>)],
    ) -> Result<Report> {
        let mut report = Report {
            ambiguous_samples: self.ambiguous_samples(),
            ..Report::default()
        };
        for (output, expected, actual) in results {
            report
                .tensors
                .push(self.compare(*output, expected.view(), actual.view())?);
        }
        Ok(report)
    }
}
