//! The array operands: the element types, the dispatch on the dtype Python passed, the arrays
//! borrowed as `ndarray` views for the crate (no copy, any strides), and results back as numpy
//! arrays.

use deformconv::Float;
use ndarray::{ArrayView1, ArrayView4};
use numpy::{
    Element, IntoPyArray, PyArrayDescrMethods, PyReadonlyArray1, PyReadonlyArray4, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// An element type the crate computes in, that numpy can hold.
pub(crate) trait Elem: Float + Element {}
impl Elem for f32 {}
impl Elem for f64 {}

/// What `a` is, for messages: its dimensions and dtype if it is an array, else its type.
fn described(a: &Bound<'_, PyAny>) -> String {
    match a.cast::<PyUntypedArray>() {
        Ok(arr) => format!("a {}-dimensional {} array", arr.ndim(), arr.dtype()),
        Err(_) => match a.get_type().name() {
            Ok(name) => format!("{name}"),
            Err(_) => "an object of unknown type".into(),
        },
    }
}

/// Whether the operand `name` is a float32 array (the Python layer has already checked that
/// every operand of a call is a float32 or float64 array of the same dtype as the first).
pub(crate) fn is_f32(name: &str, a: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = a.py();
    if let Ok(arr) = a.cast::<PyUntypedArray>() {
        if arr.dtype().is_equiv_to(&numpy::dtype::<f32>(py)) {
            return Ok(true);
        }
        if arr.dtype().is_equiv_to(&numpy::dtype::<f64>(py)) {
            return Ok(false);
        }
    }
    Err(PyTypeError::new_err(format!(
        "{name}: expected a float32 or float64 array, got {}",
        described(a)
    )))
}

/// Runs a generic helper for the dtype of the first operand (`f32` or `f64`), which names it in
/// the error when it is neither.
macro_rules! by_dtype {
    ($first:ident, $f:ident ( $($arg:expr),* $(,)? )) => {
        if $crate::operands::is_f32(stringify!($first), $first)? {
            $f::<f32>($($arg),*)
        } else {
            $f::<f64>($($arg),*)
        }
    };
}
pub(crate) use by_dtype;

pub(crate) type Arr4<'py, T> = PyReadonlyArray4<'py, T>;

/// The operand `name` borrowed as a 4-dimensional array of `T`.
pub(crate) fn arr4<'py, T: Elem>(name: &str, a: &Bound<'py, PyAny>) -> PyResult<Arr4<'py, T>> {
    a.extract().map_err(|_| array_error::<T>(name, 4, a))
}

fn opt4<'py, T: Elem>(name: &str, a: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Arr4<'py, T>>> {
    a.map(|a| arr4(name, a)).transpose()
}

fn arr1<'py, T: Elem>(name: &str, a: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray1<'py, T>> {
    a.extract().map_err(|_| array_error::<T>(name, 1, a))
}

fn array_error<T: Elem>(name: &str, ndim: usize, a: &Bound<'_, PyAny>) -> PyErr {
    let dtype = numpy::dtype::<T>(a.py());
    PyTypeError::new_err(format!(
        "{name}: expected a {ndim}-dimensional {dtype} array, got {}",
        described(a)
    ))
}

/// A result as a numpy array (no copy).
pub(crate) fn out<T: Elem, D: ndarray::Dimension>(
    py: Python<'_>,
    a: ndarray::Array<T, D>,
) -> Py<PyAny> {
    a.into_pyarray(py).into_any().unbind()
}

pub(crate) fn opt_out<T: Elem, D: ndarray::Dimension>(
    py: Python<'_>,
    a: Option<ndarray::Array<T, D>>,
) -> Option<Py<PyAny>> {
    a.map(|a| out(py, a))
}

/// `(input, offset, mask, weight, bias)` gradients, `None` where not computed.
pub(crate) type GradTuple = (
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
    Option<Py<PyAny>>,
);

pub(crate) fn grad_tuple<T: Elem, D: ndarray::Dimension>(
    py: Python<'_>,
    [a, b, c, d, e]: [Option<ndarray::Array<T, D>>; 5],
) -> GradTuple {
    (
        opt_out(py, a),
        opt_out(py, b),
        opt_out(py, c),
        opt_out(py, d),
        opt_out(py, e),
    )
}

/// A call's tensors as Python passed them; `offset = None` is a dense convolution.
#[derive(Clone, Copy)]
pub(crate) struct Args<'a, 'py> {
    pub grad_out: Option<&'a Bound<'py, PyAny>>,
    pub input: &'a Bound<'py, PyAny>,
    pub offset: Option<&'a Bound<'py, PyAny>>,
    pub mask: Option<&'a Bound<'py, PyAny>>,
    pub weight: &'a Bound<'py, PyAny>,
    pub bias: Option<&'a Bound<'py, PyAny>>,
}

/// [`Args`] borrowed as numpy arrays of `T` (no copy).
pub(crate) struct Borrowed<'py, T: Elem> {
    grad_out: Option<Arr4<'py, T>>,
    input: Arr4<'py, T>,
    offset: Option<Arr4<'py, T>>,
    mask: Option<Arr4<'py, T>>,
    weight: Arr4<'py, T>,
    bias: Option<PyReadonlyArray1<'py, T>>,
}

/// The borrowed tensors as `ndarray` views, for the crate.
pub(crate) struct Views<'a, T> {
    pub grad_out: Option<ArrayView4<'a, T>>,
    pub input: ArrayView4<'a, T>,
    pub offset: Option<ArrayView4<'a, T>>,
    pub mask: Option<ArrayView4<'a, T>>,
    pub weight: ArrayView4<'a, T>,
    pub bias: Option<ArrayView1<'a, T>>,
}

impl<'py, T: Elem> Borrowed<'py, T> {
    pub(crate) fn new(a: &Args<'_, 'py>) -> PyResult<Self> {
        Ok(Borrowed {
            grad_out: opt4("grad_out", a.grad_out)?,
            input: arr4("input", a.input)?,
            offset: opt4("offset", a.offset)?,
            mask: opt4("mask", a.mask)?,
            weight: arr4("weight", a.weight)?,
            bias: a.bias.map(|b| arr1("bias", b)).transpose()?,
        })
    }

    pub(crate) fn views(&self) -> Views<'_, T> {
        Views {
            grad_out: self.grad_out.as_ref().map(|a| a.as_array()),
            input: self.input.as_array(),
            offset: self.offset.as_ref().map(|a| a.as_array()),
            mask: self.mask.as_ref().map(|a| a.as_array()),
            weight: self.weight.as_array(),
            bias: self.bias.as_ref().map(|a| a.as_array()),
        }
    }
}

impl<T: Float> Views<'_, T> {
    /// `grad_out`, which every backward call passes.
    pub(crate) fn grad_out(&self) -> deformconv::Result<ArrayView4<'_, T>> {
        self.grad_out.ok_or_else(|| deformconv::Error::Param {
            name: "grad_out",
            rule: "missing".into(),
        })
    }
}
