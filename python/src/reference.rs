//! The f64 oracle (`deformconv::reference`): plain loops straight from the formulas, forward
//! and each gradient, for the Python package's `deformconv.reference`.

use deformconv::{reference, ConvParams, Float, Want};
use ndarray::{Array4, ArrayD, ArrayView4};
use pyo3::prelude::*;

use crate::args::{self, conv_params, value_error, want, Needs};
use crate::operands::{by_dtype, grad_tuple, out, Args, Borrowed, Elem, GradTuple, Views};
use crate::threads::compute;

fn dims(s: &[usize]) -> [usize; 4] {
    [s[0], s[1], s[2], s[3]]
}

/// A dense problem as the oracle computes it: zero offsets, one offset group.
pub(crate) fn dense_offset<T: Float>(
    x: ArrayView4<'_, T>,
    w: ArrayView4<'_, T>,
    p: &ConvParams,
) -> deformconv::Result<(Array4<T>, ConvParams)> {
    let p = p.offset_groups(1);
    let geo = deformconv::Geometry::new(dims(x.shape()), dims(w.shape()), &p)?;
    Ok((Array4::from_elem(geo.offset_shape(), T::ZERO), p))
}

fn ref_fwd<T: Elem>(py: Python<'_>, a: &Args<'_, '_>, p: &ConvParams) -> PyResult<Py<PyAny>> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let r = compute(py, false, || match v.offset {
        Some(off) => reference::deform_conv2d(v.input, off, v.mask, v.weight, v.bias, p),
        None => reference::conv2d(v.input, v.weight, v.bias, p),
    })
    .map_err(value_error)?;
    Ok(out(py, r))
}

/// The oracle's forward, in f64: deformable, or dense when `offset` is `None`.
#[pyfunction]
#[pyo3(signature = (input, offset, mask, weight, bias, params))]
pub(crate) fn ref_forward(
    py: Python<'_>,
    input: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    params: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let p = conv_params(params)?;
    let a = Args {
        grad_out: None,
        input,
        offset,
        mask,
        weight,
        bias,
    };
    by_dtype!(input, ref_fwd(py, &a, &p))
}

/// Every reference gradient `want` selects; the dense gradients are the deformable ones at
/// zero offsets (one offset group).
fn ref_grads<T: Float>(
    v: &Views<'_, T>,
    p: &ConvParams,
    want: Want,
) -> deformconv::Result<[Option<ArrayD<f64>>; 5]> {
    let g = v.grad_out()?;
    let (x, m, w) = (v.input, v.mask, v.weight);
    let (xs, ws) = (dims(x.shape()), dims(w.shape()));
    let dense;
    let (off, p) = match v.offset {
        Some(off) => (off, p),
        None => {
            dense = dense_offset(x, w, p)?;
            (dense.0.view(), &dense.1)
        }
    };
    let gi = want
        .input
        .then(|| reference::grad_input(g, off, m, w, xs, p))
        .transpose()?;
    let go = want
        .offset
        .then(|| reference::grad_offset(g, x, off, m, w, p))
        .transpose()?;
    let gm = want
        .mask
        .then(|| reference::grad_mask(g, x, off, w, p))
        .transpose()?;
    let gw = want
        .weight
        .then(|| reference::grad_weight(g, x, off, m, ws, p))
        .transpose()?;
    let gb = if want.bias {
        // Validates the problem as the other gradients do before summing.
        reference::grad_weight(g, x, off, m, ws, p)?;
        Some(reference::grad_bias(g)?.into_dyn())
    } else {
        None
    };
    Ok([
        gi.map(|a| a.into_dyn()),
        go.map(|a| a.into_dyn()),
        gm.map(|a| a.into_dyn()),
        gw.map(|a| a.into_dyn()),
        gb,
    ])
}

fn ref_bwd<T: Elem>(
    py: Python<'_>,
    a: &Args<'_, '_>,
    p: &ConvParams,
    needs: Needs,
) -> PyResult<GradTuple> {
    let ops = Borrowed::<T>::new(a)?;
    let v = ops.views();
    let want = want(needs, v.offset.is_none());
    let r = compute(py, false, || ref_grads(&v, p, want)).map_err(value_error)?;
    Ok(grad_tuple(py, r))
}

/// The oracle's gradients (f64) selected by `needs`; dense when `offset` is `None`.
#[pyfunction]
#[pyo3(signature = (grad_out, input, offset, mask, weight, params, needs))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn ref_backward(
    py: Python<'_>,
    grad_out: &Bound<'_, PyAny>,
    input: &Bound<'_, PyAny>,
    offset: Option<&Bound<'_, PyAny>>,
    mask: Option<&Bound<'_, PyAny>>,
    weight: &Bound<'_, PyAny>,
    params: &Bound<'_, PyAny>,
    needs: &Bound<'_, PyAny>,
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
    by_dtype!(input, ref_bwd(py, &a, &p, needs))
}
