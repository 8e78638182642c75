//! `deformconv compare EXPECTED.npz ACTUAL.npz [options]`.
//!
//! Compares every result (`out`, `grad_*`) of EXPECTED (or those named by `--only`); one
//! missing from ACTUAL fails the comparison (exit 1) with its name. The criterion per tensor:
//! - `--rtol`/`--atol` given: `|actual - expected| <= atol + rtol * |expected|` (a missing one
//!   is 0);
//! - otherwise, when the operands and sidecar JSON of EXPECTED (or else ACTUAL) are available:
//!   the [`Oracle`]: every element within the DESIGN §5 bound of the declared precision
//!   (`--precision`, else the sidecar's `"precision"`, else ACTUAL's dtype), either side
//!   accepted where that precision rounds a sample position across an integer or window edge
//!   (unless `--strict-positions`), and the statistical check of the error profile (unless
//!   `--no-statistical`);
//! - otherwise `|actual - expected| <= rtol * max|expected|` with `rtol` 1e-4 (float32) or
//!   1e-10 (float64), relative to the tensor's largest magnitude.

use std::path::Path;

use deformconv::compare::{
    compare_tensor, error_scales_for, Operands, Options, Oracle, Output, Precision, Report,
    TensorReport, Tolerance,
};
use serde_json::{json, Value};

use crate::args::CompareArgs;
use crate::case::{self, AnyCase, Case};
use crate::failure::{Failure, Outcome};
use crate::npz::{AnyArray, Npz};
use crate::output::{self, say};

/// The operands held by `npz` in f64, if it has them and its sidecar.
fn case_from(npz: &mut Npz) -> Outcome<Option<Case<f64>>> {
    if !case::has_operands(npz) || !case::sidecar(npz.path()).is_file() {
        return Ok(None);
    }
    Ok(Some(match case::read_from(npz)? {
        AnyCase::F32(c) => c.to_f64(),
        AnyCase::F64(c) => c,
    }))
}

fn operands(c: &Case<f64>) -> Operands<'_> {
    Operands {
        input: c.input.view(),
        offset: c.offset.view(),
        mask: c.mask.as_ref().map(|m| m.view()),
        weight: c.weight.view(),
        bias: c.bias.as_ref().map(|b| b.view()),
        grad_out: c.grad_out.as_ref().map(|g| g.view()),
        params: c.params,
    }
}

/// The precision of a dtype's own rounding.
fn precision_of(a: &AnyArray) -> Precision {
    match a {
        AnyArray::F32(_) => Precision::F32,
        AnyArray::F64(_) => Precision::F64,
    }
}

/// The report as JSON: every figure of the table, per tensor, and the verdicts.
fn report_json(
    report: &Report,
    precision: Option<Precision>,
    passed: bool,
    missing: &[Output],
) -> Value {
    let finite = |v: f64| {
        if v.is_finite() {
            json!(v)
        } else {
            json!(v.to_string())
        }
    };
    let tensor = |t: &TensorReport| {
        json!({
            "name": t.output.name(),
            "shape": t.shape,
            "max_abs_err": finite(t.max_abs_err),
            "max_rel_err": finite(t.max_rel_err),
            "worst": t.worst.as_ref().map(|w| json!({
                "index": w.index,
                "expected": finite(w.expected),
                "actual": finite(w.actual),
                "allowed": finite(w.allowed),
            })),
            "over_tolerance": t.over_tolerance,
            "elements": t.elements(),
            "err_over_bound": t.max_bound_ratio.map(finite),
            "accepted_by_rounding": t.accepted_by_rounding,
            "statistic": t.statistic.map(finite),
            "bound_passed": t.bound_passed(),
            "statistical_passed": t.statistical_passed(),
            "passed": t.passed(),
            "criterion": t.tolerance.to_string(),
        })
    };
    json!({
        "deformconv": env!("CARGO_PKG_VERSION"),
        "passed": passed,
        "bound_passed": report.bound_passed(),
        "statistical_passed": report.statistical_passed(),
        "precision": precision.map(Precision::name),
        "ambiguous_samples": report.ambiguous_samples,
        "missing": missing.iter().map(|o| o.name()).collect::<Vec<_>>(),
        "tensors": report.tensors.iter().map(tensor).collect::<Vec<_>>(),
    })
}

/// Runs the command; `Ok(true)` when every element is within tolerance.
pub fn compare(args: &CompareArgs) -> Outcome<bool> {
    let mut expected = Npz::open(&args.expected)?;
    let mut actual = Npz::open(&args.actual)?;
    let (e_name, a_name) = (
        args.expected.display().to_string(),
        args.actual.display().to_string(),
    );

    let mut pairs: Vec<(Output, AnyArray, AnyArray)> = Vec::new();
    let mut notes = Vec::new();
    let mut missing = Vec::new();
    for o in Output::ALL {
        if args.only.as_ref().is_some_and(|only| !only.contains(&o)) {
            continue;
        }
        match (expected.get(o.name())?, actual.get(o.name())?) {
            (Some(e), Some(a)) => {
                if e.shape() != a.shape() {
                    return Err(Failure::bad(format!(
                        "{a_name}: {o} has shape {:?} but {e_name} has {:?}",
                        a.shape(),
                        e.shape()
                    )));
                }
                pairs.push((o, e, a));
            }
            (Some(_), None) => missing.push(o),
            (None, Some(_)) => notes.push(format!("{o}: only in {a_name}, not compared")),
            (None, None) => {}
        }
    }
    if let Some(only) = &args.only {
        for o in only {
            if !expected.has(o.name()) {
                return Err(Failure::bad(format!(
                    "--only {o}: {e_name} has no {o} to compare with"
                )));
            }
        }
    }
    if pairs.is_empty() && missing.is_empty() {
        return Err(Failure::bad(format!(
            "{e_name} and {a_name} have no result array in common (out, grad_input, grad_offset, grad_mask, grad_weight, grad_bias)"
        )));
    }

    // The operands, from EXPECTED or else ACTUAL: needed by the default rule; with
    // --rtol/--atol only for the err/bound column, so a file that cannot give them is a
    // note there, not a failure.
    let allclose = args.rtol.is_some() || args.atol.is_some();
    let mut source = None;
    for (npz, name) in [(&mut expected, &e_name), (&mut actual, &a_name)] {
        match case_from(npz) {
            Ok(Some(c)) => {
                source = Some((c, name.clone()));
                break;
            }
            Ok(None) => {}
            Err(e) if allclose => notes.push(format!("no error bound from {name}: {}", e.message)),
            Err(e) => return Err(e),
        }
    }
    // The precision the kernel computed in: the flag, the sidecar, or ACTUAL's dtype.
    let declared = args
        .precision
        .or_else(|| source.as_ref().and_then(|(c, _)| c.precision));
    let dtype_precision = pairs.first().map(|(_, _, a)| precision_of(a));
    let precision = declared.or(dtype_precision);

    let mut report = Report::default();
    match (&source, allclose) {
        (Some((c, name)), false) => {
            let precision = precision.unwrap_or(Precision::F32);
            let mut options = Options::precision(precision).strict_positions(args.strict_positions);
            if let Some(f) = args.bound_factor {
                options.bound_factor = f;
            }
            if args.no_statistical {
                options.statistical_limit = None;
            }
            let oracle = Oracle::new(&operands(c), &options)
                .map_err(|e| Failure::bad(format!("{name}: {e}")))?;
            for (o, e, a) in &pairs {
                let t = oracle
                    .compare(*o, e.to_f64().view(), a.to_f64().view())
                    .map_err(|err| Failure::bad(format!("{a_name}: {err}")))?;
                report.tensors.push(t);
            }
            report.ambiguous_samples = oracle.ambiguous_samples();
            notes.push(format!(
                "operands and parameters from {name}; precision {precision}{}",
                if declared.is_some() {
                    " (declared)"
                } else {
                    " (the dtype of the actual file)"
                }
            ));
        }
        _ => {
            let scales = match &source {
                Some((c, _)) => {
                    let p = precision.unwrap_or(Precision::F32);
                    Some(
                        error_scales_for(&operands(c), p)
                            .map_err(|e| Failure::bad(e.to_string()))?,
                    )
                }
                None => {
                    notes.push(
                        "no error bound: neither file has input, offset, weight and a JSON sidecar"
                            .into(),
                    );
                    None
                }
            };
            for (o, e, a) in &pairs {
                let eps = precision.map_or(e.eps().max(a.eps()), Precision::unit_roundoff);
                let mut tol = Tolerance::bound_eps(eps).statistical_limit(None);
                if let Some(c) = args.bound_factor {
                    tol = tol.bound_factor(c);
                }
                let (e64, a64) = (e.to_f64(), a.to_f64());
                let scale = scales.as_ref().and_then(|s| s.get(*o));
                if allclose {
                    tol = tol.allclose(args.rtol.unwrap_or(0.0), args.atol.unwrap_or(0.0));
                } else {
                    let rtol = if eps > 1e-10 { 1e-4 } else { 1e-10 };
                    let max =
                        e64.iter().fold(
                            0.0f64,
                            |m, v| if v.is_finite() { m.max(v.abs()) } else { m },
                        );
                    tol = tol.allclose(0.0, rtol * max);
                }
                let t = compare_tensor(*o, e64.view(), a64.view(), scale, &tol)
                    .map_err(|err| Failure::bad(format!("{a_name}: {err}")))?;
                report.tensors.push(t);
            }
        }
    }
    let passed = report.passed() && missing.is_empty();
    if let Some(path) = &args.json {
        let text = format!("{:#}\n", report_json(&report, precision, passed, &missing));
        output::write_all_or_nothing(&[(Path::new(path), text.as_bytes())])?;
    }
    say(format_args!("expected: {e_name}\nactual:   {a_name}"));
    say(format_args!("{report}"));
    for o in &missing {
        say(format_args!(
            "MISSING {o}: in {e_name} but not in {a_name} (--only names what to compare)"
        ));
    }
    for n in notes {
        say(format_args!("note: {n}"));
    }
    Ok(passed)
}
