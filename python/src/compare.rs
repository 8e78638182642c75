//! Comparison of a kernel's results with the oracle's (DESIGN §5), for `deformconv.compare`.

use deformconv::compare::{
    compare_tensor, error_scales_for, exact_result, Operands, Options, Oracle, Output, Precision,
    Report, Tolerance,
};
use numpy::{PyReadonlyArray1, PyReadonlyArray4, PyReadonlyArrayDyn};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{conv_params, value_error};
use crate::reference::dense_offset;
use crate::threads::compute;

fn output_named(name: &str) -> PyResult<Output> {
    Output::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown result {name:?}; expected one of out, grad_input, grad_offset, grad_mask, grad_weight, grad_bias"
        ))
    })
}

fn precision_named(name: &str) -> PyResult<Precision> {
    Precision::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "precision: unknown profile {name:?}; expected one of f64, f32, tf32, bf16, f16"
        ))
    })
}

/// Compares `actual` results (`(name, array as f64, precision name)`) with the oracle's exact
/// ones (or with `expected` ones where given) through [`Oracle`], as `deformconv compare`
/// does: the DESIGN §5 bound of each result's declared precision, either side accepted where
/// that precision rounds a sample position across an integer or window edge (unless
/// `strict_positions`), and the statistical check (unless `statistical` is false). One oracle
/// per distinct precision. `allclose = (rtol, atol)` switches the pass rule to numpy's (no
/// positions within rounding, no statistical check), keeping the reported bound ratio. The
/// operands are f64 (exact copies of f32 data); `offset = None` is a dense problem. Returns
/// the per-tensor figures, the samples with an ambiguous position and the report's text.
#[pyfunction]
#[pyo3(signature = (actual, expected, input, offset, mask, weight, bias, grad_out, params, bound_factor, allclose, strict_positions, statistical))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn compare<'py>(
    py: Python<'py>,
    actual: Vec<(String, PyReadonlyArrayDyn<'py, f64>, String)>,
    expected: Vec<(String, PyReadonlyArrayDyn<'py, f64>)>,
    input: PyReadonlyArray4<'py, f64>,
    offset: Option<PyReadonlyArray4<'py, f64>>,
    mask: Option<PyReadonlyArray4<'py, f64>>,
    weight: PyReadonlyArray4<'py, f64>,
    bias: Option<PyReadonlyArray1<'py, f64>>,
    grad_out: Option<PyReadonlyArray4<'py, f64>>,
    params: &Bound<'py, PyAny>,
    bound_factor: f64,
    allclose: Option<(f64, f64)>,
    strict_positions: bool,
    statistical: bool,
) -> PyResult<(Vec<Bound<'py, PyDict>>, usize, String)> {
    let mut p = conv_params(params)?;
    let outputs: Vec<Output> = actual
        .iter()
        .map(|(n, _, _)| output_named(n))
        .collect::<PyResult<_>>()?;
    let precisions: Vec<Precision> = actual
        .iter()
        .map(|(_, _, pr)| precision_named(pr))
        .collect::<PyResult<_>>()?;
    let given: Vec<Output> = expected
        .iter()
        .map(|(n, _)| output_named(n))
        .collect::<PyResult<_>>()?;
    let (x, w) = (input.as_array(), weight.as_array());
    let m = mask.as_ref().map(|m| m.as_array());
    let b = bias.as_ref().map(|b| b.as_array());
    let go = grad_out.as_ref().map(|g| g.as_array());
    let dense_offset = match &offset {
        Some(_) => None,
        None => {
            let (zeros, dense_p) = dense_offset(x, w, &p).map_err(value_error)?;
            p = dense_p;
            Some(zeros)
        }
    };
    let off = match (&offset, &dense_offset) {
        (Some(o), _) => o.as_array(),
        (None, Some(z)) => z.view(),
        (None, None) => unreachable!("a dense problem has zero offsets"),
    };
    let actual_views: Vec<_> = actual.iter().map(|(_, a, _)| a.as_array()).collect();
    let expected_views: Vec<_> = expected.iter().map(|(_, a)| a.as_array()).collect();
    let report = compute(py, false, || -> deformconv::Result<Report> {
        let needs_grads = outputs.iter().any(|o| *o != Output::Out);
        if needs_grads && go.is_none() {
            return Err(deformconv::Error::Param {
                name: "grad_out",
                rule: "is required to compare gradients".into(),
            });
        }
        let ops = Operands {
            input: x,
            offset: off,
            mask: m,
            weight: w,
            bias: b,
            grad_out: if needs_grads { go } else { None },
            params: p,
        };
        let undefined = |output: Output| deformconv::Error::Param {
            name: output.name(),
            rule: match output {
                Output::GradMask => "is only defined for a problem with a mask".into(),
                Output::GradBias => "is only defined for a problem with a bias".into(),
                _ => "cannot be compared for this problem".into(),
            },
        };
        for &output in &outputs {
            if (output == Output::GradMask && m.is_none())
                || (output == Output::GradBias && b.is_none())
            {
                return Err(undefined(output));
            }
        }
        let mut options = Options::default().strict_positions(strict_positions);
        options.bound_factor = bound_factor;
        if !statistical {
            options.statistical_limit = None;
        }
        let mut oracles: Vec<(Precision, Oracle)> = Vec::new();
        let mut report = Report::default();
        for ((&output, got), &precision) in outputs.iter().zip(&actual_views).zip(&precisions) {
            let exact = match given.iter().position(|&o| o == output) {
                Some(i) => expected_views[i].to_owned(),
                None => exact_result(&ops, output)?.ok_or_else(|| undefined(output))?,
            };
            let t = match allclose {
                Some((rtol, atol)) => {
                    let scales = error_scales_for(&ops, precision)?;
                    let scale = scales.get(output).ok_or_else(|| undefined(output))?;
                    let tol = Tolerance::precision(precision)
                        .bound_factor(bound_factor)
                        .allclose(rtol, atol);
                    compare_tensor(output, exact.view(), got.view(), Some(scale), &tol)?
                }
                None => {
                    let i = match oracles.iter().position(|(pr, _)| *pr == precision) {
                        Some(i) => i,
                        None => {
                            options.precision = precision;
                            oracles.push((precision, Oracle::new(&ops, &options)?));
                            oracles.len() - 1
                        }
                    };
                    let oracle = &oracles[i].1;
                    report.ambiguous_samples =
                        report.ambiguous_samples.max(oracle.ambiguous_samples());
                    oracle.compare(output, exact.view(), got.view())?
                }
            };
            report.tensors.push(t);
        }
        Ok(report)
    })
    .map_err(value_error)?;
    let mut rows = Vec::new();
    for t in &report.tensors {
        let d = PyDict::new(py);
        d.set_item("name", t.output.name())?;
        d.set_item("shape", t.shape.clone())?;
        d.set_item("max_abs_err", t.max_abs_err)?;
        d.set_item("max_rel_err", t.max_rel_err)?;
        d.set_item("over_tolerance", t.over_tolerance)?;
        d.set_item("elements", t.elements())?;
        d.set_item("max_bound_ratio", t.max_bound_ratio)?;
        d.set_item("accepted_by_rounding", t.accepted_by_rounding)?;
        d.set_item("statistic", t.statistic)?;
        d.set_item("bound_passed", t.bound_passed())?;
        d.set_item("statistical_passed", t.statistical_passed())?;
        d.set_item("passed", t.passed())?;
        d.set_item("criterion", t.tolerance.to_string())?;
        if let Some(wst) = &t.worst {
            d.set_item("worst_index", wst.index.clone())?;
            d.set_item("worst_expected", wst.expected)?;
            d.set_item("worst_actual", wst.actual)?;
            d.set_item("worst_allowed", wst.allowed)?;
        }
        rows.push(d);
    }
    Ok((rows, report.ambiguous_samples, report.to_string()))
}
