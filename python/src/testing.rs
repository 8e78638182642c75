//! The crate's problem generator (`deformconv::testing`), for `deformconv.testing`.

use deformconv::testing::{Problem, ProblemShape};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args::{conv_params, value_error};
use crate::operands::{opt_out, out, Elem};

fn problem_dict<'py, T: Elem>(
    py: Python<'py>,
    shape: &ProblemShape,
    seed: u64,
) -> PyResult<Bound<'py, PyDict>> {
    let pr = Problem::<T>::random(shape, seed).map_err(value_error)?;
    let d = PyDict::new(py);
    d.set_item("input", out(py, pr.input))?;
    d.set_item("offset", out(py, pr.offset))?;
    d.set_item("mask", opt_out(py, pr.mask))?;
    d.set_item("weight", out(py, pr.weight))?;
    d.set_item("bias", opt_out(py, pr.bias))?;
    d.set_item("grad_out", out(py, pr.grad_out))?;
    Ok(d)
}

/// The operands of `deformconv::testing::Problem::random` for the given shape and seed (the
/// crate's value distributions: offsets on and around the borders, integers, half-integers,
/// far outside; masks with zeros, negatives and values over 1).
#[pyfunction]
#[pyo3(signature = (input, weight, params, mask, bias, seed, float32))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn random_problem<'py>(
    py: Python<'py>,
    input: [usize; 4],
    weight: [usize; 4],
    params: &Bound<'py, PyAny>,
    mask: bool,
    bias: bool,
    seed: u64,
    float32: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let shape = ProblemShape {
        input,
        weight,
        params: conv_params(params)?,
        mask,
        bias,
    };
    if float32 {
        problem_dict::<f32>(py, &shape, seed)
    } else {
        problem_dict::<f64>(py, &shape, seed)
    }
}
