//! `deformconv run CASE.npz -o OUT.npz [--exact]`.
//!
//! OUT.npz is a complete case in the golden format: the operands copied from CASE.npz, then
//! `out` and, when CASE.npz has `grad_out`, `grad_input`, `grad_offset`, `grad_mask` (with a
//! mask), `grad_weight` and `grad_bias` (with a bias). OUT.json holds the parameters, so that
//! `compare` can compute the error bound from OUT alone.

use deformconv::compare::Output;
use deformconv::{reference, Want};
use ndarray::ArrayD;

use crate::args::RunArgs;
use crate::case::{self, AnyCase, Case};
use crate::failure::{Failure, Outcome};
use crate::npz::{self, Element};
use crate::output;

/// Results of one case, named.
pub type Results<R> = Vec<(Output, ArrayD<R>)>;

fn failed(case: &std::path::Path, e: deformconv::Error) -> Failure {
    Failure::bad(format!("{}: {e}", case.display()))
}

/// The fast path in the case's own element type.
pub fn fast<T: Element>(c: &Case<T>) -> deformconv::Result<Results<T>> {
    let mask = c.mask.as_ref().map(|m| m.view());
    let bias = c.bias.as_ref().map(|b| b.view());
    let (x, off, w, p) = (c.input.view(), c.offset.view(), c.weight.view(), &c.params);
    let mut results = vec![(
        Output::Out,
        deformconv::deform_conv2d(x, off, mask, w, bias, p)?.into_dyn(),
    )];
    if let Some(go) = &c.grad_out {
        let want = Want {
            mask: mask.is_some(),
            bias: bias.is_some(),
            ..Want::ALL
        };
        let grads = deformconv::deform_conv2d_backward(go.view(), x, off, mask, w, p, want)?;
        let named = [
            (Output::GradInput, grads.input),
            (Output::GradOffset, grads.offset),
            (Output::GradMask, grads.mask),
            (Output::GradWeight, grads.weight),
        ];
        results.extend(
            named
                .into_iter()
                .filter_map(|(o, g)| g.map(|g| (o, g.into_dyn()))),
        );
        if let Some(gb) = grads.bias {
            results.push((Output::GradBias, gb.into_dyn()));
        }
    }
    Ok(results)
}

/// The f64 reference oracle.
pub fn exact<T: Element>(c: &Case<T>) -> deformconv::Result<Results<f64>> {
    let mask = c.mask.as_ref().map(|m| m.view());
    let bias = c.bias.as_ref().map(|b| b.view());
    let (x, off, w, p) = (c.input.view(), c.offset.view(), c.weight.view(), &c.params);
    let mut results = vec![(
        Output::Out,
        reference::deform_conv2d(x, off, mask, w, bias, p)?.into_dyn(),
    )];
    if let Some(go) = &c.grad_out {
        let go = go.view();
        let g = &c.geometry;
        results.push((
            Output::GradInput,
            reference::grad_input(go, off, mask, w, g.input_shape(), p)?.into_dyn(),
        ));
        results.push((
            Output::GradOffset,
            reference::grad_offset(go, x, off, mask, w, p)?.into_dyn(),
        ));
        if mask.is_some() {
            results.push((
                Output::GradMask,
                reference::grad_mask(go, x, off, w, p)?.into_dyn(),
            ));
        }
        results.push((
            Output::GradWeight,
            reference::grad_weight(go, x, off, mask, g.weight_shape(), p)?.into_dyn(),
        ));
        if bias.is_some() {
            results.push((Output::GradBias, reference::grad_bias(go)?.into_dyn()));
        }
    }
    Ok(results)
}

fn write_case<T: Element, R: Element>(
    args: &RunArgs,
    c: &Case<T>,
    results: &Results<R>,
    how: &str,
) -> Outcome<()> {
    let mut arrays = c.operand_refs();
    for (o, a) in results {
        arrays.push((o.name(), R::array_ref(a.view())));
    }
    let npz = npz::to_bytes(&arrays)
        .map_err(|e| Failure::bad(format!("{}: cannot write: {e}", args.out.display())))?;
    let json = case::params_json(c);
    let json_path = case::sidecar(&args.out);
    output::write_all_or_nothing(&[
        (&args.out, &npz),
        (&json_path, format!("{json}\n").as_bytes()),
    ])?;
    let listed: Vec<String> = results
        .iter()
        .map(|(o, a)| format!("{o} {:?}", a.shape()))
        .collect();
    output::say(format_args!(
        "{}: {} ({how}, {}); parameters in {}",
        args.out.display(),
        listed.join(", "),
        R::DTYPE,
        json_path.display()
    ));
    Ok(())
}

/// Refuses an output whose sidecar would be the output itself (`-o res.json`, also the case's
/// own sidecar), the case's npz, or the case's sidecar: the pair written must not destroy the
/// other half of a pair. Writing over the case itself is allowed (the
/// results file holds the operands too, and the writes are atomic).
fn check_output_names(args: &RunArgs) -> Outcome<()> {
    let (out, out_json) = (&args.out, case::sidecar(&args.out));
    let case_json = case::sidecar(&args.case);
    let clash = if output::same_file(out, &out_json) {
        Some("its parameters sidecar would be the same file")
    } else if output::same_file(&out_json, &args.case) {
        Some("its parameters sidecar would overwrite the case")
    } else if output::same_file(&out_json, &case_json) && !output::same_file(out, &args.case) {
        Some("its parameters sidecar would overwrite the case's")
    } else {
        None
    };
    match clash {
        Some(why) => Err(Failure::bad(format!(
            "-o {}: {why}; name the output OUT.npz (its sidecar is OUT.json)",
            out.display()
        ))),
        None => Ok(()),
    }
}

fn run_typed<T: Element>(args: &RunArgs, c: &Case<T>) -> Outcome<()> {
    if args.exact {
        let results = exact(c).map_err(|e| failed(&args.case, e))?;
        write_case(args, c, &results, "f64 reference")
    } else {
        let results = fast(c).map_err(|e| failed(&args.case, e))?;
        write_case(args, c, &results, "fast path")
    }
}

/// Runs the command.
pub fn run(args: &RunArgs) -> Outcome<()> {
    check_output_names(args)?;
    match case::read(&args.case)? {
        AnyCase::F32(c) => run_typed(args, &c),
        AnyCase::F64(c) => run_typed(args, &c),
    }
}
