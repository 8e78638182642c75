//! `deformconv compare EXPECTED.npz ACTUAL.npz [--rtol R] [--atol A] [--bound-factor C]`.
//!
//! Compares every result (`out`, `grad_*`) of EXPECTED (or those named by `--only`); one
//! missing from ACTUAL fails the comparison (exit 1) with its name. The criterion per tensor:
//! - `--rtol`/`--atol` given: `|actual - expected| <= atol + rtol * |expected|` (a missing one
//!   is 0);
//! - otherwise, when the operands and sidecar JSON of EXPECTED (or else ACTUAL) are available:
//!   the DESIGN §5 bound `c * L * eps * sum|terms|`, `eps` of the less precise of the two
//!   dtypes;
//! - otherwise `|actual - expected| <= rtol * max|expected|` with `rtol` 1e-4 (float32) or
//!   1e-10 (float64), relative to the tensor's largest magnitude.

use deformconv::compare::{
    compare_tensor, error_scales, Operands, Output, Report, Scales, Tolerance,
};

use crate::args::CompareArgs;
use crate::case::{self, AnyCase, Case};
use crate::failure::{Failure, Outcome};
use crate::npz::{AnyArray, Npz};
use crate::output::say;

/// The error scales of the operands held by `npz`, if it has them and its sidecar.
fn scales_from(npz: &mut Npz) -> Outcome<Option<Scales>> {
    if !case::has_operands(npz) || !case::sidecar(npz.path()).is_file() {
        return Ok(None);
    }
    let c: Case<f64> = match case::read_from(npz)? {
        AnyCase::F32(c) => c.to_f64(),
        AnyCase::F64(c) => c,
    };
    let ops = Operands {
        input: c.input.view(),
        offset: c.offset.view(),
        mask: c.mask.as_ref().map(|m| m.view()),
        weight: c.weight.view(),
        bias: c.bias.as_ref().map(|b| b.view()),
        grad_out: c.grad_out.as_ref().map(|g| g.view()),
        params: c.params,
    };
    let scales =
        error_scales(&ops).map_err(|e| Failure::bad(format!("{}: {e}", npz.path().display())))?;
    Ok(Some(scales))
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

    // The bound's scales: needed by the default rule; with --rtol/--atol only for the
    // err/bound column, so a file that cannot give them is a note there, not a failure.
    let allclose = args.rtol.is_some() || args.atol.is_some();
    let mut scales = None;
    for (npz, name) in [(&mut expected, &e_name), (&mut actual, &a_name)] {
        match scales_from(npz) {
            Ok(Some(s)) => {
                notes.push(format!("error bound from the operands of {name}"));
                scales = Some(s);
                break;
            }
            Ok(None) => {}
            Err(e) if allclose => notes.push(format!("no error bound from {name}: {}", e.message)),
            Err(e) => return Err(e),
        }
    }
    if scales.is_none() {
        notes.push(
            "no error bound: neither file has input, offset, weight and a JSON sidecar".into(),
        );
    }

    let mut report = Report::default();
    for (o, e, a) in &pairs {
        let eps = e.eps().max(a.eps());
        let mut tol = Tolerance::bound_eps(eps);
        if let Some(c) = args.bound_factor {
            tol = tol.bound_factor(c);
        }
        let (e64, a64) = (e.to_f64(), a.to_f64());
        let scale = scales.as_ref().and_then(|s| s.get(*o));
        if args.rtol.is_some() || args.atol.is_some() {
            tol = tol.allclose(args.rtol.unwrap_or(0.0), args.atol.unwrap_or(0.0));
        } else if scale.is_none() {
            let rtol = if eps > 1e-10 { 1e-4 } else { 1e-10 };
            let max = e64.iter().fold(
                0.0f64,
                |m, v| if v.is_finite() { m.max(v.abs()) } else { m },
            );
            tol = tol.allclose(0.0, rtol * max);
        }
        let t = compare_tensor(*o, e64.view(), a64.view(), scale, &tol)
            .map_err(|err| Failure::bad(format!("{a_name}: {err}")))?;
        report.tensors.push(t);
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
    Ok(report.passed() && missing.is_empty())
}
