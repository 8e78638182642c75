//! The fast path: the crate's forward and backward, deformable or dense.

use deformconv::ConvParams;
use pyo3::prelude::*;

use crate::args::{self, conv_params, value_error, want, Needs};
use crate::operands::{by_dtype, grad_tuple, out, Args, Borrowed, Elem, GradTuple};
use crate::threads::compute;

fn fast_forward<T: Elem>(
    py: Python<'_>,
    a: &Args<'_, '_>,
    p: &ConvParams,
    openmp: bool,
) -> PyResult<Py<PyAny>> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let r = compute(py, openmp, || match v.offset {
        Some(off) => deformconv::deform_conv2d(v.input, off, v.mask, v.weight, v.bias, p),
        None => deformconv::conv2d(v.input, v.weight, v.bias, p),
    })
    .map_err(value_error)?;
    Ok(out(py, r))
}

/// Deformable convolution, forward (`deformconv::deform_conv2d`).
#[pyfunction]
#[pyo3(signature = (input, offset, mask, weight, bias, params, openmp = false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn deform_conv2d(
    py: Python<'_>,
    input: &Bound<'_, PyAny>,
    offset: &Bound<'_, PyAny>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    params: &Bound<'_, PyAny>,
    openmp: bool,
) -> PyResult<Py<PyAny>> {
    let p = conv_params(params)?;
    let a = Args {
        grad_out: None,
        input,
        offset: Some(offset),
        mask,
        weight,
        bias,
    };
    by_dtype!(input, fast_forward(py, &a, &p, openmp))
}

/// Dense convolution, forward (`deformconv::conv2d`).
#[pyfunction]
#[pyo3(signature = (input, weight, bias, params))]
pub(crate) fn conv2d(
    py: Python<'_>,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    params: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let p = conv_params(params)?;
    let a = Args {
        grad_out: None,
        input,
        offset: None,
        mask: None,
        weight,
        bias,
    };
    by_dtype!(input, fast_forward(py, &a, &p, false))
}

fn fast_backward<T: Elem>(
    py: Python<'_>,
    a: &Args<'_, '_>,
    p: &ConvParams,
    needs: Needs,
    openmp: bool,
) -> PyResult<GradTuple> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let want = want(needs, v.offset.is_none());
    let r = compute(py, openmp, || {
        let g = v.grad_out()?;
        match v.offset {
            Some(off) => {
                deformconv::deform_conv2d_backward(g, v.input, off, v.mask, v.weight, p, want)
            }
            None => deformconv::conv2d_backward(g, v.input, v.weight, p, want),
        }
    })
    .map_err(value_error)?;
    let r = [
        r.input.map(|a| a.into_dyn()),
        r.offset.map(|a| a.into_dyn()),
        r.mask.map(|a| a.into_dyn()),
        r.weight.map(|a| a.into_dyn()),
        r.bias.map(|a| a.into_dyn()),
    ];
    Ok(grad_tuple(py, r))
}

/// The gradients selected by `needs` (`(input, offset, mask, weight, bias)`), the others
/// `None`; dense when `offset` is `None` (then no offset or mask gradient).
#[pyfunction]
#[pyo3(signature = (grad_out, input, offset, mask, weight, params, needs, openmp = false))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    py: Python<'_>,
    grad_out: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    params: &Bound<'_, PyAny>,
    needs: &Bound<'_, PyAny>,
    openmp: bool,
) -> PyResult<GradTuple> {
    let p = conv_params(params)?;
    let needs = args::needs(needs)?;
    let a = Args {
        grad_out: Some(grad_out),
        input,
        offset,
        mask,
        weight,
        bias: None,
    };
    by_dtype!(input, fast_backward(py, &a, &p, needs, openmp))
}
